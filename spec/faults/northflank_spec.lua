-- mayura.sandbox.northflank when the service misbehaves, on the Northflank stand-in
-- (support/northflank_service.lua) over real local sandboxes: a refused token (REST 401, and an
-- exec whose init is refused), a service deleted behind the pool's back, 429 with Retry-After, an
-- exec answer cut before its completion or stalled, a create that never answers or whose
-- deployment never completes. Each ends as a SandboxError with the right reason and none of the
-- service's text or the token.
local northflank = require('mayura.sandbox.northflank')
local stand_in = require('support.stand_in')
local northflank_service = require('support.northflank_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local TOKEN = 'nf_fault0123456789abcdefTOKEN'
local PROJECT = 'faults'
local CREATE_PATH, GET, EXEC = '/v1/projects/{p}/services/deployment', '/v1/projects/{p}/services/{s}', '/exec'
local service_opts = { token = TOKEN, project_id = PROJECT }
local exec_url   -- the stand-in's HTTP/2 exec host (spec/npm/northflank_exec.mjs)

faults.hosted_suite({
  title = 'the Northflank provider when the service misbehaves',
  provider = northflank.northflank_sandboxes,
  options = function(svc)
    return { token = TOKEN, project_id = PROJECT, api_url = svc:url(''), exec_url = exec_url, retry_base_ms = 20 }
  end,
  install = function(svc, backing)
    local state = northflank_service.install_with_exec_host(svc, backing, service_opts)
    exec_url = state.exec_url
    return state
  end,
  teardown = function(env) env.state.close_all() end,
  reset = function(env)
    env.state.pending_polls, env.state.cut_exec = 0, 0
    service_opts.token = TOKEN
  end,
  secrets = { TOKEN, 'WRONG' },
  words = { 'Unauthorized', 'Invalid token', 'Service not found', 'stand-in-error', 'try later' },
  cases = function(env)
    local check, CREATE = env.check, env.CREATE

    it('401: a wrong token is authentication, also when it is revoked while a sandbox lives', function()
      env.refused({ token = 'nf_WRONG_token_0123456789' })
      local pool, sb = env.open()
      service_opts.token = 'nf_other_token'   -- the stand-in now refuses ours: exec init and REST alike
      check('authentication', sb.exec, sb, { 'true' })
      check('authentication', sb.list_files, sb, '.')
      service_opts.token = TOKEN
      sb:release()
      pool:close()
    end)

    it('a service deleted behind the pool\'s back is gone for every call', function()
      local pool, sb = env.open()
      sb:write_file('x.txt', 'x')
      env.backing:release(env.state.services[sb._backend.id].backing_id)
      env.all_fail('gone', sb)
      sb:release()
      assert.are.equal(0, pool:count())
      pool:close()
    end)

    it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
      local pool, sb = env.open()
      env.retry_after(sb, {
        calls = function() return env.svc:calls('POST', EXEC) end,
        fault = function(answer) env.svc:fault('POST', EXEC, answer, 1) end,
        fault_long = function(answer)
          env.svc:fault('GET', GET, answer, 1)
          env.svc:fault('POST', EXEC, answer, 1)
        end,
      })
      env.svc:clear()
      sb:release()
      pool:close()
    end)

    it('an exec answer cut before its completion is failed; one that stalls ends at the call timeout', function()
      local pool, sb = env.open(nil, { call_timeout_ms = 1000 })
      env.state.cut_exec = 1
      check('failed', sb.list_files, sb, '.')
      env.svc:fault('POST', EXEC, stand_in.stall_body(''), 1)
      check('timeout', sb.list_files, sb, '.')
      local calls = env.svc:calls('POST', EXEC)
      local stalled = calls[#calls]
      assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end)

    it('a create that never answers, or whose deployment never completes, ends at the call timeout', function()
      local pool = env.make_pool(nil, { call_timeout_ms = 600 })
      env.svc:fault('POST', CREATE_PATH, stand_in.stall(), 1)
      check('timeout', pool.create, pool, CREATE)
      assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
      env.state.pending_polls = 1000
      local n = #env.svc:calls('POST', CREATE_PATH)
      check('timeout', pool.create, pool, CREATE)
      env.state.pending_polls = 0
      local name = env.svc:calls('POST', CREATE_PATH)[n + 1].json.name
      assert.is_truthy(util.eventually(function() return env.state.services[name].deleted end, 5000))
      env.goes_on(pool)
    end)
  end,
})
