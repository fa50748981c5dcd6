-- mayura.sandbox.agentcore when the service misbehaves, on the AgentCore Code Interpreter stand-in
-- (support/agentcore_service.lua) over real local sandboxes: a wrong secret (the stand-in checks
-- every SigV4 signature) and a 401, a session that ended behind the pool's back, 429 with
-- Retry-After, exception events inside the stream, a stream that stalls, a start that never
-- answers. Each ends as a SandboxError with the right reason and none of AWS's text or any
-- credential.
local sandbox = require('mayura.sandbox')
local agentcore = require('mayura.sandbox.agentcore')
local stand_in = require('support.stand_in')
local agentcore_service = require('support.agentcore_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local KEY_ID, SECRET = 'AKIAMAYURAFAULTKEYID', 'fault/Secret+0123456789abcdefSECRET'
local TOKEN = 'IQoJb3JpZ2luFaultSessionTOKEN0123'
local check = faults.checker({ KEY_ID, SECRET, TOKEN, 'WRONG' },
  { 'signature we calculated', 'not found', 'stand-in', 'try later', 'only executeCommand' })

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the AgentCore provider when the service misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state

  local function make_pool(extra, pool_options)
    local o = { region = 'us-east-1', endpoint = svc:url(''), retry_base_ms = 20,
      credentials = { access_key_id = KEY_ID, secret_access_key = SECRET, session_token = TOKEN } }
    for k, v in pairs(extra or {}) do o[k] = v end
    local po = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } }
    for k, v in pairs(pool_options or {}) do po[k] = v end
    return sandbox.create_sandboxes(agentcore.agentcore_sandboxes(o), po)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = agentcore_service.install(svc, backing, { access_key_id = KEY_ID, secret_access_key = SECRET,
      session_token = TOKEN, region = 'us-east-1' })
  end)

  teardown(function()
    backing:close()
    local others = {}
    for _, f in ipairs(svc.failures) do
      if f ~= agentcore_service.STALLED then others[#others + 1] = f end
    end
    assert.are.same({}, others)
    svc:close()
  end)

  after_each(function()
    svc:clear()
    state.stall_streams, state.exception_next = 0, nil
  end)

  it('a wrong secret (403 from the signature check) and a 401 are authentication; no credential shows', function()
    local pool = make_pool({ credentials = { access_key_id = KEY_ID, secret_access_key = 'WRONG' .. SECRET,
      session_token = TOKEN } })
    check('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal('the signature does not match', state.last_refusal)
    pool:close()
    pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    svc:fault('POST', '/code-interpreters/{ci}/tools/invoke', { status = 401, headers = {
      ['x-amzn-ErrorType'] = 'UnrecognizedClientException' }, json = { message = 'key ' .. KEY_ID .. ' stand-in' } })
    check('authentication', sb.exec, sb, { 'true' })
    svc:clear()
    state.exception_next = 'accessDeniedException'
    check('authentication', sb.exec, sb, { 'true' })
    sb:release()
    pool:close()
  end)

  it('a session that ended behind the pool (404, or an exception event) is gone for every call', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    sb:write_file('x.txt', 'x')
    backing:release(state.sessions[sb._backend.session_id].backing_id)
    check('gone', sb.exec, sb, { 'true' })
    check('gone', sb.read_file, sb, 'x.txt')
    check('gone', sb.write_file, sb, 'x.txt', 'y')
    check('gone', sb.list_files, sb, '.')
    check('gone', sb.remove_file, sb, 'x.txt')
    local other = pool:create({ lifetime_ms = 60000, network = 'all' })
    state.exception_next = 'resourceNotFoundException'
    check('gone', other.exec, other, { 'true' })
    sb:release()
    other:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('429: waits the Retry-After it was given, then goes on; throttling inside the stream is rate_limited', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local before = #svc:calls('POST', '/code-interpreters/{ci}/tools/invoke')
    svc:fault('POST', '/code-interpreters/{ci}/tools/invoke', stand_in.rate_limited(1), 1)
    assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
    local calls = svc:calls('POST', '/code-interpreters/{ci}/tools/invoke')
    local waited = calls[before + 2].at_ms - calls[before + 1].at_ms
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    svc:fault('POST', '/code-interpreters/{ci}/tools/invoke', stand_in.rate_limited(60), 1)
    local err = check('rate_limited', sb.read_file, sb, 'x')
    assert.are.equal(60000, err.retry_after_ms)
    svc:clear()
    state.exception_next = 'throttlingException'
    check('rate_limited', sb.exec, sb, { 'true' })
    sb:release()
    pool:close()
  end)

  it('an invoke stream that stalls is timeout after idle_timeout_ms, and the session goes on', function()
    local pool = make_pool({ idle_timeout_ms = 300 })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    state.stall_streams = 1
    check('timeout', sb.exec, sb, { 'echo', 'lost' })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a start that never answers ends at the call timeout; a start retried after a cut makes one session', function()
    local pool = make_pool(nil, { call_timeout_ms = 500 })
    svc:fault('PUT', '/code-interpreters/{ci}/sessions/start', stand_in.stall(), 1)
    check('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    local starts = svc:calls('PUT', '/code-interpreters/{ci}/sessions/start')
    assert.is_truthy(util.eventually(function() return starts[#starts].signal.cancelled end, 5000))
    assert.are.equal(0, pool:count())
    pool:close()
    pool = make_pool()
    svc:fault('PUT', '/code-interpreters/{ci}/sessions/start', { delay_ms = 50, reset = true }, 1)
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    starts = svc:calls('PUT', '/code-interpreters/{ci}/sessions/start')
    assert.are.equal(starts[#starts - 1].json.clientToken, starts[#starts].json.clientToken)
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)
end)
