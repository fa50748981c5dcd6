-- mayura.sandbox.codesandbox when the service misbehaves, on the CodeSandbox stand-in
-- (support/codesandbox_service.lua, its pitcher behind spec/npm/codesandbox_front.mjs) over real
-- local sandboxes: a refused token (HTTP 401 from the API, and from the pitcher's handshake), a
-- sandbox deleted behind the pool's back, 429 with Retry-After, a command whose shell never
-- ends, a create that never answers. Each ends as a SandboxError with the right reason and none
-- of the service's text or the token.
local sandbox = require('mayura.sandbox')
local codesandbox = require('mayura.sandbox.codesandbox')
local stand_in = require('support.stand_in')
local util = require('support.util')
local codesandbox_service = require('support.codesandbox_service')
local fault_checks = require('support.fault_checks')

local TOKEN = 'csb_fault0123456789abcdefTOKEN'
local check = fault_checks.checker({ TOKEN, 'csb_WRONG' }, { 'not accepted', 'Sandbox not found', 'Slow down' })

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the CodeSandbox provider when the service misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state, dir

  local function make_pool(extra, pool_options)
    local o = { token = TOKEN, base_url = svc:url(''), workdir = codesandbox_service.WORKSPACE, retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    local po = { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } }
    for k, v in pairs(pool_options or {}) do po[k] = v end
    return sandbox.create_sandboxes(codesandbox.codesandbox_sandboxes(o), po)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = codesandbox_service.install(svc, backing, { token = TOKEN })
    dir = util.tmpdir()
    state:start_front(dir)
  end)

  teardown(function()
    state.close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
    util.rmdir(dir)
  end)

  after_each(function()
    svc:clear()
    state.stall_shells = 0
  end)


  it('a command its shell waits for may take longer than call_timeout_ms', function()
    local pool = make_pool(nil, { call_timeout_ms = 1000 })
    local sb = pool:create({ lifetime_ms = 600000, network = 'all' })
    local r = sb:exec({ 'sh', '-c', 'sleep 2; echo done' }, { timeout_ms = 10000 })
    assert.are.same({ 0, 'done\n' }, { r.exit_code, r.stdout })
    pool:close()
  end)
  it('401: a wrong token is authentication, from the API and from the pitcher, and no token shows', function()
    local pool = make_pool({ token = 'csb_WRONG_token_0123456789' })
    check('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal(0, pool:count())
    pool:close()
    -- the pitcher refuses its token at the handshake (with the token in its answer)
    pool = make_pool()
    svc:fault('GET', '/_pitcher/check', { status = 401, json = { errors = { 'not accepted ' .. TOKEN } } }, 1)
    check('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
    assert.are.same({}, state.sandboxes)   -- deleted again
    pool:close()
  end)

  it('a sandbox deleted behind the pool\'s back is gone for every call', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    sb:write_file('x.txt', 'x')
    state:vanish(sb._backend.id)
    for _, call in ipairs({
      function() return sb:exec({ 'true' }) end,
      function() return sb:read_file('x.txt') end,
      function() return sb:write_file('x.txt', 'y') end,
      function() return sb:list_files('.') end,
      function() return sb:remove_file('x.txt') end,
    }) do
      check('gone', call)
    end
    sb:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('429: waits the Retry-After it was given; a wait too long is rate_limited with it', function()
    local pool = make_pool()
    local n = #svc:calls('POST', '/sandbox/{template}/fork')
    svc:fault('POST', '/sandbox/{template}/fork', stand_in.rate_limited(1), 1)
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local forks = svc:calls('POST', '/sandbox/{template}/fork')
    assert.are.equal(n + 2, #forks)
    assert.is_true(forks[n + 2].at_ms - forks[n + 1].at_ms >= 950)
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    svc:fault('POST', '/sandbox/{template}/fork', { status = 429, headers = { ['Retry-After'] = '60' },
      json = { success = false, errors = { 'Slow down' } } }, 1)
    local err = check('rate_limited', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal(60000, err.retry_after_ms)
    pool:close()
  end)

  it('a command whose shell never ends is a timeout at the call timeout, and the sandbox goes on', function()
    local pool = make_pool(nil, { call_timeout_ms = 800 })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local n = #state.messages
    state.stall_shells = 1
    check('timeout', sb.list_files, sb, '.')
    assert.is_truthy(util.eventually(function()
      for i = n + 1, #state.messages do
        if state.messages[i].method == 'shell/terminate' then return true end
      end
      return false
    end, 5000))
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers, or a VM that never starts, ends at the call timeout; the sandbox is deleted',
    function()
      local pool = make_pool(nil, { call_timeout_ms = 600 })
      svc:fault('POST', '/sandbox/{template}/fork', stand_in.stall(), 1)
      check('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
      svc:fault('POST', '/vm/{id}/start', stand_in.stall(), 1)
      check('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
      local started = svc:calls('POST', '/vm/{id}/start')
      local id = started[#started].params.id
      assert.is_truthy(util.eventually(function() return pool:count() == 0 and state.sandboxes[id] == nil end, 5000))
      local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end)
end)
