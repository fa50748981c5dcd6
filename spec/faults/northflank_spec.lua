-- mayura.sandbox.northflank when the service misbehaves, on the Northflank stand-in
-- (support/northflank_service.lua) over real local sandboxes: a refused token (REST 401, and an
-- exec whose init is refused), a service deleted behind the pool's back, 429 with Retry-After, an
-- exec answer cut before its completion or stalled, a create that never answers or whose
-- deployment never completes. Each ends as a SandboxError with the right reason and none of the
-- service's text or the token.
local sandbox = require('mayura.sandbox')
local northflank = require('mayura.sandbox.northflank')
local stand_in = require('support.stand_in')
local northflank_service = require('support.northflank_service')
local util = require('support.util')

local TOKEN = 'nf_fault0123456789abcdefTOKEN'
local PROJECT = 'faults'
local SERVICE_WORDS = { 'Unauthorized', 'Invalid token', 'Service not found', 'stand-in-error', 'try later' }

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

describe('the Northflank provider when the service misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state, service_opts
  local CREATE, GET, EXEC = 'POST /v1/projects/{p}/services/deployment', '/v1/projects/{p}/services/{s}', '/exec'

  local function make_pool(extra, pool_options)
    local o = { token = TOKEN, project_id = PROJECT, api_url = svc:url(''), exec_url = svc:url(''), retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    local po = { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } }
    for k, v in pairs(pool_options or {}) do po[k] = v end
    return sandbox.create_sandboxes(northflank.northflank_sandboxes(o), po)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    service_opts = { token = TOKEN, project_id = PROJECT }
    state = northflank_service.install(svc, backing, service_opts)
  end)

  teardown(function()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  after_each(function()
    svc:clear()
    state.pending_polls, state.cut_exec = 0, 0
    service_opts.token = TOKEN
  end)

  it('401: a wrong token is authentication, also when it is revoked while a sandbox lives', function()
    local pool = make_pool({ token = 'nf_WRONG_token_0123456789' })
    sandbox_error('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal(0, pool:count())
    pool:close()
    pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    service_opts.token = 'nf_other_token'   -- the stand-in now refuses ours: exec init and REST alike
    sandbox_error('authentication', sb.exec, sb, { 'true' })
    sandbox_error('authentication', sb.list_files, sb, '.')
    service_opts.token = TOKEN
    sb:release()
    pool:close()
  end)

  it('a service deleted behind the pool\'s back is gone for every call', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    sb:write_file('x.txt', 'x')
    backing:release(state.services[sb._backend.id].backing_id)
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

  it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local before = #svc:calls('POST', EXEC)
    svc:fault('POST', EXEC, stand_in.rate_limited(1), 1)
    assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
    local calls = svc:calls('POST', EXEC)
    local waited = calls[before + 2].at_ms - calls[before + 1].at_ms
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    svc:fault('GET', GET, stand_in.rate_limited(60), 1)
    svc:fault('POST', EXEC, stand_in.rate_limited(60), 1)
    local err = sandbox_error('rate_limited', sb.read_file, sb, 'x')
    assert.are.equal(60000, err.retry_after_ms)
    svc:clear()
    sb:release()
    pool:close()
  end)

  it('an exec answer cut before its completion is failed; one that stalls ends at the call timeout', function()
    local pool = make_pool(nil, { call_timeout_ms = 1000 })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    state.cut_exec = 1
    sandbox_error('failed', sb.list_files, sb, '.')
    svc:fault('POST', EXEC, stand_in.stall_body(''), 1)
    sandbox_error('timeout', sb.list_files, sb, '.')
    local calls = svc:calls('POST', EXEC)
    local stalled = calls[#calls]
    assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers, or whose deployment never completes, ends at the call timeout', function()
    local pool = make_pool(nil, { call_timeout_ms = 600 })
    svc:fault('POST', CREATE:sub(6), stand_in.stall(), 1)
    sandbox_error('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
    state.pending_polls = 1000
    local n = #svc:calls('POST', CREATE:sub(6))
    sandbox_error('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    state.pending_polls = 0
    local name = svc:calls('POST', CREATE:sub(6))[n + 1].json.name
    assert.is_truthy(util.eventually(function() return state.services[name].deleted end, 5000))
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)
end)
