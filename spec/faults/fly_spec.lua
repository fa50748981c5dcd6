-- mayura.sandbox.fly when the service misbehaves, on the Fly Machines stand-in
-- (support/fly_service.lua) over real local sandboxes: a refused token, a machine that vanished
-- or was destroyed behind the pool's back, 429 with Retry-After, an exec that never answers, a
-- create that never answers. Each ends as a SandboxError with the right reason and none of the
-- service's text or the token.
local fly = require('mayura.sandbox.fly')
local stand_in = require('support.stand_in')
local fly_service = require('support.fly_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local TOKEN = 'fm2_fault0123456789abcdefTOKEN'
local APP = 'mayura-faults'
local EXEC = '/v1/apps/{app}/machines/{id}/exec'

faults.hosted_suite({
  title = 'the Fly provider when the service misbehaves',
  provider = fly.fly_sandboxes,
  options = function(svc) return { token = TOKEN, app = APP, base_url = svc:url(''), retry_base_ms = 20 } end,
  install = function(svc, backing) return fly_service.install(svc, backing, { token = TOKEN, app = APP }) end,
  secrets = { TOKEN, 'WRONG' },
  words = { 'is not valid', 'not found', 'stand-in', 'try later', 'timed out' },
  cases = function(env)
    local check = env.check
    local CREATE = env.CREATE

    it('401: a wrong token is authentication, and neither token shows', function()
      env.refused({ token = 'fm2_WRONG_token_0123456789' })
      local pool, sb = env.open()
      env.svc:fault('POST', EXEC, { status = 401, json = {
        error = 'token ' .. TOKEN .. ' is not valid', status = 'unauthenticated' } })
      check('authentication', sb.exec, sb, { 'true' })
      env.svc:clear()
      sb:release()
      pool:close()
    end)

    it('a vanished machine (404) and one destroyed behind the pool are gone for every call', function()
      local pool, sb = env.open(nil, { max_sandboxes = 3 })
      sb:write_file('x.txt', 'x')
      env.svc:vanish(sb._backend.machine_id)
      env.all_fail('gone', sb)
      env.svc:clear()
      local other = pool:create(CREATE)
      other:write_file('x.txt', 'x')
      env.backing:release(env.state.machines[other._backend.machine_id].backing_id)
      env.all_fail('gone', other)
      -- a machine that answers 412 (stopped) is checked, and found down
      local third = pool:create(CREATE)
      env.state.machines[third._backend.machine_id].state = 'stopped'
      check('gone', third.exec, third, { 'true' })
      sb:release()
      other:release()
      third:release()
      assert.are.equal(0, pool:count())
      pool:close()
    end)

    it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
      env.retry_after_on('POST', EXEC)
    end)

    it('an exec that never answers is timeout within the call timeout, and the sandbox goes on', function()
      local pool, sb = env.open(nil, { call_timeout_ms = 1500 })
      env.exec_times_out(sb, function() env.svc:fault('POST', EXEC, stand_in.stall(), 1) end)
      sb:release()
      pool:close()
    end)

    it('a create that never answers ends at the call timeout, and the service sees the client leave', function()
      local pool = env.make_pool(nil, { call_timeout_ms = 500 })
      env.svc:fault('POST', '/v1/apps/{app}/machines', stand_in.stall(), 1)
      check('timeout', pool.create, pool, CREATE)
      local creates = env.svc:calls('POST', '/v1/apps/{app}/machines')
      local stalled = creates[#creates]
      assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
      assert.are.equal(0, pool:count())
      -- it looked for the machine by its name, to destroy it
      assert.is_truthy(util.eventually(function() return #env.svc:calls('GET', '/v1/apps/{app}/machines') > 0 end,
        5000))
      env.goes_on(pool)
    end)
  end,
})
