-- mayura.sandbox.fly when the service misbehaves, on the Fly Machines stand-in
-- (support/fly_service.lua) over real local sandboxes: a refused token, a machine that vanished
-- or was destroyed behind the pool's back, 429 with Retry-After, an exec that never answers, a
-- create that never answers. Each ends as a SandboxError with the right reason and none of the
-- service's text or the token.
local sandbox = require('mayura.sandbox')
local fly = require('mayura.sandbox.fly')
local stand_in = require('support.stand_in')
local fly_service = require('support.fly_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local TOKEN = 'fm2_fault0123456789abcdefTOKEN'
local APP = 'mayura-faults'
local check = faults.checker({ TOKEN, 'WRONG' }, { 'is not valid', 'not found', 'stand-in', 'try later', 'timed out' })

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the Fly provider when the service misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state

  local function make_pool(extra, pool_options)
    local o = { token = TOKEN, app = APP, base_url = svc:url(''), retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    local po = { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } }
    for k, v in pairs(pool_options or {}) do po[k] = v end
    return sandbox.create_sandboxes(fly.fly_sandboxes(o), po)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = fly_service.install(svc, backing, { token = TOKEN, app = APP })
  end)

  teardown(function()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  after_each(function() svc:clear() end)

  it('401: a wrong token is authentication, and neither token shows', function()
    local pool = make_pool({ token = 'fm2_WRONG_token_0123456789' })
    check('authentication', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    assert.are.equal(0, pool:count())
    pool:close()
    pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    svc:fault('POST', '/v1/apps/{app}/machines/{id}/exec', { status = 401, json = {
      error = 'token ' .. TOKEN .. ' is not valid', status = 'unauthenticated' } })
    check('authentication', sb.exec, sb, { 'true' })
    svc:clear()
    sb:release()
    pool:close()
  end)

  it('a vanished machine (404) and one destroyed behind the pool are gone for every call', function()
    local pool = make_pool(nil, { max_sandboxes = 3 })
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
    svc:vanish(sb._backend.machine_id)
    for _, call in ipairs(calls(sb)) do check('gone', call) end
    svc:clear()
    local other = pool:create({ lifetime_ms = 60000, network = 'all' })
    other:write_file('x.txt', 'x')
    backing:release(state.machines[other._backend.machine_id].backing_id)
    for _, call in ipairs(calls(other)) do check('gone', call) end
    -- a machine that answers 412 (stopped) is checked, and found down
    local third = pool:create({ lifetime_ms = 60000, network = 'all' })
    state.machines[third._backend.machine_id].state = 'stopped'
    check('gone', third.exec, third, { 'true' })
    sb:release()
    other:release()
    third:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    local before = #svc:calls('POST', '/v1/apps/{app}/machines/{id}/exec')
    svc:fault('POST', '/v1/apps/{app}/machines/{id}/exec', stand_in.rate_limited(1), 1)
    assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
    local execs = svc:calls('POST', '/v1/apps/{app}/machines/{id}/exec')
    local waited = execs[before + 2].at_ms - execs[before + 1].at_ms
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    svc:fault('POST', '/v1/apps/{app}/machines/{id}/exec', stand_in.rate_limited(60), 1)
    local err = check('rate_limited', sb.read_file, sb, 'x')
    assert.are.equal(60000, err.retry_after_ms)
    svc:clear()
    sb:release()
    pool:close()
  end)

  it('an exec that never answers is timeout within the call timeout, and the sandbox goes on', function()
    local pool = make_pool(nil, { call_timeout_ms = 1500 })
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    svc:fault('POST', '/v1/apps/{app}/machines/{id}/exec', stand_in.stall(), 1)
    check('timeout', sb.exec, sb, { 'echo', 'lost' })
    svc:clear()
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers ends at the call timeout, and the service sees the client leave', function()
    local pool = make_pool(nil, { call_timeout_ms = 500 })
    svc:fault('POST', '/v1/apps/{app}/machines', stand_in.stall(), 1)
    check('timeout', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    local creates = svc:calls('POST', '/v1/apps/{app}/machines')
    local stalled = creates[#creates]
    assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
    assert.are.equal(0, pool:count())
    -- it looked for the machine by its name, to destroy it
    assert.is_truthy(util.eventually(function() return #svc:calls('GET', '/v1/apps/{app}/machines') > 0 end, 5000))
    local sb = pool:create({ lifetime_ms = 60000, network = 'all' })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)
end)
