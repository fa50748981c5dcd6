-- mayura.sandbox.agentcore when the service misbehaves, on the AgentCore Code Interpreter stand-in
-- (support/agentcore_service.lua) over real local sandboxes: a wrong secret (the stand-in checks
-- every SigV4 signature) and a 401, a session that ended behind the pool's back, 429 with
-- Retry-After, exception events inside the stream, a stream that stalls (a background command's
-- start and a command the invoke waits for), a start that never
-- answers. Each ends as a SandboxError with the right reason and none of AWS's text or any
-- credential.
local core = require('mayura.core')
local agentcore = require('mayura.sandbox.agentcore')
local stand_in = require('support.stand_in')
local agentcore_service = require('support.agentcore_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local KEY_ID, SECRET = 'AKIAMAYURAFAULTKEYID', 'fault/Secret+0123456789abcdefSECRET'
local TOKEN = 'IQoJb3JpZ2luFaultSessionTOKEN0123'
local INVOKE, START = '/code-interpreters/{ci}/tools/invoke', '/code-interpreters/{ci}/sessions/start'

faults.hosted_suite({
  title = 'the AgentCore provider when the service misbehaves',
  provider = agentcore.agentcore_sandboxes,
  options = function(svc)
    return { region = 'us-east-1', endpoint = svc:url(''), retry_base_ms = 20,
      credentials = { access_key_id = KEY_ID, secret_access_key = SECRET, session_token = TOKEN } }
  end,
  pool = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } },
  install = function(svc, backing)
    return agentcore_service.install(svc, backing, { access_key_id = KEY_ID, secret_access_key = SECRET,
      session_token = TOKEN, region = 'us-east-1' })
  end,
  expected_failures = { agentcore_service.STALLED },
  reset = function(env) env.state.stall_streams, env.state.exception_next = 0, nil end,
  secrets = { KEY_ID, SECRET, TOKEN, 'WRONG' },
  words = { 'signature we calculated', 'not found', 'stand-in', 'try later', 'only executeCommand' },
  cases = function(env)
    local check, CREATE = env.check, env.CREATE

    it('a command its invoke waits for may take longer than call_timeout_ms', env.direct_outlasts_call_timeout)

    it('a wrong secret (403 from the signature check) and a 401 are authentication; no credential shows', function()
      local pool = env.make_pool({ credentials = { access_key_id = KEY_ID, secret_access_key = 'WRONG' .. SECRET,
        session_token = TOKEN } })
      check('authentication', pool.create, pool, CREATE)
      assert.are.equal('the signature does not match', env.state.last_refusal)
      pool:close()
      local sb
      pool, sb = env.open()
      env.svc:fault('POST', INVOKE, { status = 401, headers = {
        ['x-amzn-ErrorType'] = 'UnrecognizedClientException' }, json = { message = 'key ' .. KEY_ID .. ' stand-in' } })
      check('authentication', sb.exec, sb, { 'true' })
      env.svc:clear()
      env.state.exception_next = 'accessDeniedException'
      check('authentication', sb.exec, sb, { 'true' })
      sb:release()
      pool:close()
    end)

    it('a session that ended behind the pool (404, or an exception event) is gone for every call', function()
      local pool, sb = env.open()
      sb:write_file('x.txt', 'x')
      env.backing:release(env.state.sessions[sb._backend.session_id].backing_id)
      env.all_fail('gone', sb)
      local other = pool:create(CREATE)
      env.state.exception_next = 'resourceNotFoundException'
      check('gone', other.exec, other, { 'true' })
      sb:release()
      other:release()
      assert.are.equal(0, pool:count())
      pool:close()
    end)

    it('429: waits the Retry-After it was given, then goes on; throttling inside the stream is rate_limited', function()
      env.retry_after_on('POST', INVOKE, function(sb)
        env.state.exception_next = 'throttlingException'
        check('rate_limited', sb.exec, sb, { 'true' })
      end)
    end)

    it('an invoke stream that stalls is timeout after idle_timeout_ms, and the session goes on', function()
      local pool, sb = env.open({ idle_timeout_ms = 300 })
      -- a command past 60 s starts in the background: its start's stream may be silent 300 ms
      env.state.stall_streams = 1
      local t0 = core.hrtime_ms()
      env.check('timeout', sb.exec, sb, { 'echo', 'lost' }, { timeout_ms = 90000 })
      assert.is_true(core.hrtime_ms() - t0 < 60000)
      -- a shorter one is one invoke that waits for it: silent for its timeout and 300 ms more
      env.exec_times_out(sb, function() env.state.stall_streams = 1 end, { timeout_ms = 1000 })
      sb:release()
      pool:close()
    end)

    it('a start that never answers ends at the call timeout; a start retried after a cut makes one session', function()
      local pool = env.make_pool(nil, { call_timeout_ms = 500 })
      env.svc:fault('PUT', START, stand_in.stall(), 1)
      check('timeout', pool.create, pool, CREATE)
      local starts = env.svc:calls('PUT', START)
      assert.is_truthy(util.eventually(function() return starts[#starts].signal.cancelled end, 5000))
      assert.are.equal(0, pool:count())
      pool:close()
      pool = env.make_pool()
      env.svc:fault('PUT', START, { delay_ms = 50, reset = true }, 1)
      local sb = pool:create(CREATE)
      starts = env.svc:calls('PUT', START)
      assert.are.equal(starts[#starts - 1].json.clientToken, starts[#starts].json.clientToken)
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end)
  end,
})
