-- mayura.sandbox.cloudflare when the bridge misbehaves, on the stand-in of Cloudflare's sandbox
-- bridge Worker (support/cloudflare_service.lua) over real local sandboxes: a refused key, a
-- container lost behind the pool's back (a sleep, a restart) or an id the bridge no longer knows,
-- 429 with Retry-After, an exec stream that stalls, a create that never answers. Each ends as a
-- SandboxError with the right reason and none of the bridge's text or the key.
local sandbox = require('mayura.sandbox')
local cloudflare = require('mayura.sandbox.cloudflare')
local stand_in = require('support.stand_in')
local cloudflare_service = require('support.cloudflare_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local KEY = 'cfsb_fault0123456789abcdefKEY'
local check = faults.checker({ KEY, 'WRONG' }, { 'is not valid', 'try later', 'exec failed' })

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the Cloudflare provider when the bridge misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state

  local function make_pool(extra, pool_options)
    local o = { worker_url = svc:url(''), api_key = KEY, retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    local po = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } }
    for k, v in pairs(pool_options or {}) do po[k] = v end
    return sandbox.create_sandboxes(cloudflare.cloudflare_sandboxes(o), po)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = cloudflare_service.install(svc, backing, { api_key = KEY })
  end)

  teardown(function()
    backing:close()
    local others = {}
    for _, f in ipairs(svc.failures) do
      if f ~= cloudflare_service.STALLED then others[#others + 1] = f end
    end
    assert.are.same({}, others)
    svc:close()
  end)

  after_each(function()
    svc:clear()
    state.stall_streams = 0
  end)

  it('401: a wrong key is authentication, and neither key shows', function()
    local pool = make_pool({ api_key = 'cfsb_WRONG_key_0123456789' })
    check('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal(0, pool:count())
    pool:close()
    pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    svc:fault('POST', '/v1/sandbox/{id}/exec', { status = 401, json = { error = 'key ' .. KEY .. ' is not valid',
      code = 'unauthorized' } })
    check('authentication', sb.exec, sb, { 'true' })
    svc:clear()
    sb:release()
    pool:close()
  end)

  it('a container lost behind the pool, or an id the bridge answers 404, is gone for every call', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    sb:write_file('x.txt', 'x')
    local function calls(s)
      return {
        function() return s:exec({ 'true' }) end,
        function() return s:read_file('x.txt') end,
        function() return s:write_file('x.txt', 'y') end,
        function() return s:list_files('.') end,
        function() return s:remove_file('x.txt') end,
      }
    end
    -- the Worker slept or restarted it: the same id now has a fresh container
    state.restart(sb._backend.sandbox_id)
    check('gone', sb.exec, sb, { 'true' })
    for _, call in ipairs(calls(sb)) do check('gone', call) end
    local other = pool:create({ lifetime_ms = 60000, network = 'all' })
    svc:vanish(other._backend.sandbox_id)
    for _, call in ipairs(calls(other)) do check('gone', call) end
    svc:clear()
    sb:release()
    other:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local before = #svc:calls('POST', '/v1/sandbox/{id}/exec')
    svc:fault('POST', '/v1/sandbox/{id}/exec', stand_in.rate_limited(1), 1)
    assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
    local execs = svc:calls('POST', '/v1/sandbox/{id}/exec')
    local waited = execs[before + 2].at_ms - execs[before + 1].at_ms
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    svc:fault('POST', '/v1/sandbox/{id}/exec', stand_in.rate_limited(60), 1)
    local err = check('rate_limited', sb.read_file, sb, 'x')
    assert.are.equal(60000, err.retry_after_ms)
    svc:clear()
    sb:release()
    pool:close()
  end)

  it('an exec stream that stalls is timeout after idle_timeout_ms, and the sandbox goes on', function()
    local pool = make_pool({ idle_timeout_ms = 300 })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    state.stall_streams = 1
    check('timeout', sb.exec, sb, { 'echo', 'lost' })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers ends at the call timeout, and the bridge sees the client leave', function()
    local pool = make_pool(nil, { call_timeout_ms = 500 })
    svc:fault('POST', '/v1/sandbox', stand_in.stall(), 1)
    check('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    local creates = svc:calls('POST', '/v1/sandbox')
    assert.is_truthy(util.eventually(function() return creates[#creates].signal.cancelled end, 5000))
    assert.are.equal(0, pool:count())
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)
end)
