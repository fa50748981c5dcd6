-- mayura.sandbox.railway when the service misbehaves, on the Railway stand-in
-- (support/railway_service.lua) over real local sandboxes: a refused token (as a GraphQL error
-- at HTTP 200, and as HTTP 401), a sandbox destroyed behind the pool's back, 429 with
-- Retry-After and a GraphQL rate-limit error, a command whose answer stalls, a create that never
-- answers or never leaves CREATING (these through the GraphQL sandboxExec, exec = 'graphql');
-- then over the WebSocket exec bridge: a shell token the bridge refuses, a sandbox gone under a
-- command's connection, a command whose answer stalls. Each ends as a SandboxError with the
-- right reason and none of the service's text or the token; and a command past its timeout is
-- killed by its tag.
local sandbox = require('mayura.sandbox')
local railway = require('mayura.sandbox.railway')
local stand_in = require('support.stand_in')
local railway_service = require('support.railway_service')
local util = require('support.util')

local TOKEN = 'rw_fault0123456789abcdefTOKEN'
local ENV = 'env-faults'
local SERVICE_WORDS = { 'Not Authorized', 'Sandbox not found', 'UNAUTHENTICATED', 'NOT_FOUND', 'try later',
  'Rate limit exceeded' }

-- Whether `needle` appears anywhere in `v`: its tostring, its fields and their fields.
local function shows(v, needle, seen)
  seen = seen or {}
  if type(v) == 'string' then return v:find(needle, 1, true) ~= nil end
  if type(v) ~= 'table' or seen[v] then return false end
  seen[v] = true
  if tostring(v):find(needle, 1, true) then return true end
  for k, x in pairs(v) do
    if shows(k, needle, seen) or shows(x, needle, seen) then return true end
  end
  return false
end

-- A SANDBOX_ERROR of `reason` from fn(...), showing neither a token nor the service's words.
local function sandbox_error(reason, fn, ...)
  local err = assert.raises_code('SANDBOX_ERROR', fn, ...)
  assert.are.equal(reason, err.reason, tostring(err))
  assert.is_false(shows(err, TOKEN), 'the token shows in ' .. tostring(err))
  assert.is_false(shows(err, 'WRONG'), 'a token shows in ' .. tostring(err))
  for _, words in ipairs(SERVICE_WORDS) do
    assert.is_false(shows(err, words), 'the service\'s words show in ' .. tostring(err))
  end
  return err
end

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the Railway provider when the service misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state, dir, ws_url

  local function make_pool(extra, pool_options)
    local o = { token = TOKEN, environment_id = ENV, endpoint = svc:url(railway_service.PATH), retry_base_ms = 20,
      exec = 'graphql' }
    for k, v in pairs(extra or {}) do o[k] = v end
    local po = { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } }
    for k, v in pairs(pool_options or {}) do po[k] = v end
    return sandbox.create_sandboxes(railway.railway_sandboxes(o), po)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = railway_service.install(svc, backing, { token = TOKEN, environment_id = ENV })
    dir = util.tmpdir()
    ws_url = state:start_front(dir)
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
    state.faults = {}
    state.creating_polls = 0
  end)

  it('401: a wrong token is authentication (a GraphQL error or HTTP 401), and neither token shows', function()
    local pool = make_pool({ token = 'rw_WRONG_token_0123456789' })
    sandbox_error('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal(0, pool:count())
    pool:close()
    -- a project token goes in its own header
    pool = make_pool({ token_kind = 'project' })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local last = state.ops[#state.ops].req
    assert.are.equal(TOKEN, last.headers['project-access-token'])
    assert.is_nil(last.headers['authorization'])
    -- revoked while a sandbox lives: HTTP 401 with the token in the body
    state:fault('sandboxExec', { status = 401, json = { errors = { { message = 'Not Authorized ' .. TOKEN } } } })
    sandbox_error('authentication', sb.exec, sb, { 'true' })
    sandbox_error('authentication', sb.list_files, sb, '.')
    state.faults = {}
    sb:release()
    pool:close()
  end)

  it('a sandbox destroyed behind the pool\'s back is gone for every call', function()
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
      sandbox_error('gone', call)
    end
    sb:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('429: waits the Retry-After it was given; a wait too long, or a GraphQL rate limit, is rate_limited', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local before = #state:calls('sandboxExec')
    state:fault('sandboxExec', stand_in.rate_limited(1), 1)
    assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
    local calls = state:calls('sandboxExec')
    local waited = calls[before + 2].req.at_ms - calls[before + 1].req.at_ms
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    state:fault('sandboxExec', stand_in.rate_limited(60), 1)
    local err = sandbox_error('rate_limited', sb.read_file, sb, 'x')
    assert.are.equal(60000, err.retry_after_ms)
    state:fault('sandboxExec', { json = { errors = { { message = 'Rate limit exceeded', extensions = {
      code = 'RATE_LIMITED' } } }, data = railway_service.NULL } }, 1)
    sandbox_error('rate_limited', sb.list_files, sb, '.')
    assert.are.equal('fine\n', sb:exec({ 'echo', 'fine' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a command whose answer stalls ends at the call timeout, and the sandbox goes on', function()
    local pool = make_pool(nil, { call_timeout_ms = 800 })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    state:fault('sandboxExec', stand_in.stall(), 1)
    sandbox_error('timeout', sb.list_files, sb, '.')
    local calls = state:calls('sandboxExec')
    local stalled = calls[#calls].req
    assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers, or never leaves CREATING, ends at the call timeout; the latter is destroyed',
    function()
      local pool = make_pool(nil, { call_timeout_ms = 600 })
      state:fault('sandboxCreate', stand_in.stall(), 1)
      sandbox_error('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
      assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
      state.creating_polls = 1000
      local n = #state:calls('sandboxCreate')
      sandbox_error('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
      state.creating_polls = 0
      local id = state:calls('sandboxCreate')[n + 1].id
      assert.is_truthy(util.eventually(function()
        local rec = state.sandboxes[id]
        return rec and rec.status == 'DESTROYED'
      end, 5000))
      -- and the pool goes on
      local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end)

  it('kills a command past its timeout by its tag', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local r = sb:exec({ 'sh', '-c', 'setsid sleep 66 >/dev/null 2>&1 </dev/null & sleep 67' }, { timeout_ms = 400 })
    assert.is_true(r.timed_out)
    local ps = sb:exec({ 'sh', '-c', 'ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr "\\0" " "' })
    assert.is_falsy(ps.stdout:find('sleep 6[67]'), ps.stdout)
    sb:release()
    pool:close()
  end)

  describe('over the WebSocket exec bridge', function()
    local function ws_pool(pool_options)
      return make_pool({ exec = 'websocket', ws_url = ws_url }, pool_options)
    end

    it('a shell token the bridge refuses is authentication; a new one is asked for next time', function()
      local pool = ws_pool()
      local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
      local tokens = #state:calls('generateShellToken')
      svc:fault('GET', '/_bridge/check', { status = 401, json = { error = 'Not Authorized ' .. TOKEN } }, 1)
      sandbox_error('authentication', sb.exec, sb, { 'true' })
      assert.are.equal('back\n', sb:exec({ 'echo', 'back' }).stdout)
      assert.are.equal(tokens + 1, #state:calls('generateShellToken'))
      sb:release()
      pool:close()
    end)

    it('a sandbox gone under a command\'s connection is gone, also at the handshake', function()
      local pool = ws_pool()
      local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
      sb:write_file('x.txt', 'x')
      -- the bridge closes without an exit: the provider asks the API, which says it is gone
      svc:fault('POST', '/_bridge/exec', { status = 404, json = {} }, 1)
      state:vanish(sb._backend.id)
      sandbox_error('gone', sb.exec, sb, { 'true' })
      sandbox_error('gone', sb.read_file, sb, 'x.txt')
      sb:release()
      pool:close()
    end)

    it('a command whose answer stalls ends at the call timeout, and the next one runs', function()
      local pool = ws_pool({ call_timeout_ms = 1000 })
      local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
      svc:fault('POST', '/_bridge/exec', stand_in.stall(), 1)
      sandbox_error('timeout', sb.list_files, sb, '.')
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end)
  end)
end)
