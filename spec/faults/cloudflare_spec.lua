-- mayura.sandbox.cloudflare when the bridge misbehaves, on the stand-in of Cloudflare's sandbox
-- bridge Worker (support/cloudflare_service.lua) over real local sandboxes: a refused key, a
-- container lost behind the pool's back (a sleep, a restart) or an id the bridge no longer knows,
-- 429 with Retry-After, an exec stream that stalls, a create that never answers. Each ends as a
-- SandboxError with the right reason and none of the bridge's text or the key.
local cloudflare = require('mayura.sandbox.cloudflare')
local stand_in = require('support.stand_in')
local cloudflare_service = require('support.cloudflare_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local KEY = 'cfsb_fault0123456789abcdefKEY'
local EXEC = '/v1/sandbox/{id}/exec'

faults.hosted_suite({
  title = 'the Cloudflare provider when the bridge misbehaves',
  provider = cloudflare.cloudflare_sandboxes,
  options = function(svc) return { worker_url = svc:url(''), api_key = KEY, retry_base_ms = 20 } end,
  pool = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } },
  install = function(svc, backing) return cloudflare_service.install(svc, backing, { api_key = KEY }) end,
  expected_failures = { cloudflare_service.STALLED },
  reset = function(env) env.state.stall_streams = 0 end,
  secrets = { KEY, 'WRONG' },
  words = { 'is not valid', 'try later', 'exec failed' },
  cases = function(env)
    local check, CREATE = env.check, env.CREATE

    it('401: a wrong key is authentication, and neither key shows', function()
      env.refused({ api_key = 'cfsb_WRONG_key_0123456789' })
      local pool, sb = env.open()
      env.svc:fault('POST', EXEC, { status = 401, json = { error = 'key ' .. KEY .. ' is not valid',
        code = 'unauthorized' } })
      check('authentication', sb.exec, sb, { 'true' })
      env.svc:clear()
      sb:release()
      pool:close()
    end)

    it('a container lost behind the pool, or an id the bridge answers 404, is gone for every call', function()
      local pool, sb = env.open()
      sb:write_file('x.txt', 'x')
      -- the Worker slept or restarted it: the same id now has a fresh container
      env.state.restart(sb._backend.sandbox_id)
      check('gone', sb.exec, sb, { 'true' })
      env.all_fail('gone', sb)
      local other = pool:create(CREATE)
      env.svc:vanish(other._backend.sandbox_id)
      env.all_fail('gone', other)
      env.svc:clear()
      sb:release()
      other:release()
      assert.are.equal(0, pool:count())
      pool:close()
    end)

    it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
      env.retry_after_on('POST', EXEC)
    end)

    it('an exec stream that stalls is timeout after idle_timeout_ms, and the sandbox goes on', function()
      local pool, sb = env.open({ idle_timeout_ms = 300 })
      env.exec_times_out(sb, function() env.state.stall_streams = 1 end)
      sb:release()
      pool:close()
    end)

    it('a create that never answers ends at the call timeout, and the bridge sees the client leave', function()
      local pool = env.make_pool(nil, { call_timeout_ms = 500 })
      env.svc:fault('POST', '/v1/sandbox', stand_in.stall(), 1)
      check('timeout', pool.create, pool, CREATE)
      local creates = env.svc:calls('POST', '/v1/sandbox')
      assert.is_truthy(util.eventually(function() return creates[#creates].signal.cancelled end, 5000))
      assert.are.equal(0, pool:count())
      env.goes_on(pool)
    end)
  end,
})
