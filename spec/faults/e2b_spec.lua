-- mayura.sandbox.e2b when E2B misbehaves, against the E2B stand-in (support/e2b_service.lua)
-- over real local sandboxes: a wrong key (401), a sandbox the service lost (404 from the control
-- plane, 502 from the sandbox's proxy: gone), 429 with Retry-After, a command's stream cut
-- midway, and a create slower than the call timeout (whose sandbox is then found and killed).
-- No error shows the key, the sandbox's access token or the service's own text.
local sandbox = require('mayura.sandbox')
local e2b = require('mayura.sandbox.e2b')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local KEY = 'e2b_fault_0123456789abcdef0123456789'
local SERVICE_WORDS = { 'Invalid API key', 'The sandbox was not found', 'not found', 'invalid access token',
  'rate_limited', 'try later' }

local can_run_local = pcall(function()
  local local_provider = require('mayura.sandbox.local')
  local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
  local sb = pool:create({ lifetime_ms = 60000 })
  sb:release()
  pool:close()
end)

describe('mayura.sandbox.e2b when E2B misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, service, pool

  local function provider(extra)
    local o = { api_key = KEY, api_url = svc:url(''), sandbox_url = svc:url(''), workdir = '/workspace',
      retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return e2b.e2b_sandboxes(o)
  end

  -- A SANDBOX_ERROR of `reason` that shows no secret anywhere, nor the service's words in its text
  -- (its fields may hold 'rate_limited': the reason itself).
  local function sandbox_error(reason, secrets, fn, ...)
    local err = faults.checker(secrets, {})(reason, fn, ...)
    for _, w in ipairs(SERVICE_WORDS) do assert.is_falsy(tostring(err):find(w, 1, true), tostring(err)) end
    return err
  end

  before_each(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
    service = e2b_service.install(svc, backing, { api_key = KEY })
    pool = sandbox.create_sandboxes(provider(), { max_sandboxes = 2, max_lifetime_ms = 600000 })
  end)

  after_each(function()
    pool:close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  it('401: a wrong key is authentication, and neither key shows, though the service echoes it', function()
    local wrong = 'e2b_wrong_0123456789abcdef'
    local p = sandbox.create_sandboxes(provider({ api_key = wrong }), { max_sandboxes = 1, max_lifetime_ms = 60000 })
    sandbox_error('authentication', { wrong, KEY }, p.create, p, { lifetime_ms = 60000 })
    assert.truthy(svc:calls('POST', '/v2/sandboxes')[1].headers['x-api-key'] == wrong)
    assert.are.equal(0, p:count())
    p:close()
    -- envd refusing the access token (and saying it back)
    local sb = pool:create({ lifetime_ms = 60000 })
    local token = service.sandboxes[sb.id].token
    svc:fault('POST', '/process.Process/Start',
      { status = 401, json = { code = 'unauthenticated', message = 'invalid access token ' .. token } }, 1)
    sandbox_error('authentication', { token, KEY }, sb.exec, sb, { 'true' })
  end)

  it('404 and 502: a sandbox the service lost is gone for every call, and release still works', function()
    local sb = pool:create({ lifetime_ms = 60000 })
    local token = service.sandboxes[sb.id].token
    sb:write_file('x.txt', 'x')
    svc:vanish(sb.id)
    for _, call in ipairs({
      function() return sb:exec({ 'true' }) end,
      function() return sb:exec({ 'cat' }, { stdin = 'in' }) end,
      function() return sb:read_file('x.txt') end,
      function() return sb:write_file('x.txt', 'y') end,
      function() return sb:list_files('.') end,
      function() return sb:remove_file('x.txt') end,
    }) do
      sandbox_error('gone', { KEY, token }, call)
    end
    -- gone is not tried again, even as 502
    local n = #svc:calls('GET', '/files')
    sandbox_error('gone', {}, sb.read_file, sb, 'x.txt')
    assert.are.equal(n + 1, #svc:calls('GET', '/files'))
    sb:release()   -- the service says 404: ended already, which is what release wants
    assert.are.equal(1, #svc:calls('DELETE', '/sandboxes/{id}'))
    svc:clear()
    -- one the service ended on its own, behind the provider's back
    local other = pool:create({ lifetime_ms = 60000 })
    backing:release(other.id)
    sandbox_error('gone', { KEY }, other.exec, other, { 'true' })
    other:release()
  end)

  it('429 with Retry-After: the create waits what the service asked, then succeeds', function()
    svc:fault('POST', '/v2/sandboxes', stand_in.rate_limited(1), 1)
    local sb = pool:create({ lifetime_ms = 60000 })
    local calls = svc:calls('POST', '/v2/sandboxes')
    assert.are.equal(2, #calls)
    assert.is_true(calls[2].at_ms - calls[1].at_ms >= 1000)
    -- envd's resource_exhausted on a command is retried too
    svc:fault('POST', '/process.Process/Start', stand_in.rate_limited(0), 1)
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    -- a wait longer than the kit takes (max_retry_after_ms, 30 s) is raised at once, with the wait
    svc:fault('POST', '/v2/sandboxes', stand_in.rate_limited(120), 1)
    local err = sandbox_error('rate_limited', { KEY }, pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(120000, err.retry_after_ms)
  end)

  it('a stream cut midway: unavailable, and the command is stopped by its tag', function()
    local sb = pool:create({ lifetime_ms = 60000 })
    svc:fault('POST', '/process.Process/Start', e2b_service.cut_stream(100), 1)
    local before = #svc:calls('POST', '/process.Process/Start')
    sandbox_error('unavailable', { KEY }, sb.exec, sb, { 'sleep', '30' })
    assert.are.same({ e2b_service.CUT }, svc.failures)
    svc.failures = {}
    -- the control plane was asked whether the sandbox is still there (it is)
    assert.are.equal(1, #svc:calls('GET', '/sandboxes/{id}'))
    -- after the cut, a SIGKILL to the pid and the kill script by the command's tag
    local starts = svc:calls('POST', '/process.Process/Start')
    assert.are.equal(before + 2, #starts)
    local cut = require('mayura.core').json.decode(starts[before + 1].body:sub(6))
    local kill = require('mayura.core').json.decode(starts[before + 2].body:sub(6))
    assert.are.equal('/bin/sh', kill.process.cmd)
    assert.truthy(kill.process.args[2]:find(cut.process.envs.MAYURA_EXEC, 1, true))
    assert.are.equal(1, #svc:calls('POST', '/process.Process/SendSignal'))
    assert.are.equal('fine\n', sb:exec({ 'echo', 'fine' }).stdout)
  end)

  it('a sandbox that ends during a command: gone (envd says unavailable, the control plane 404)', function()
    local sb = pool:create({ lifetime_ms = 60000 })
    local t = require('mayura._task').spawn(function() return pcall(sb.exec, sb, { 'sleep', '20' }) end)
    assert.truthy(util.eventually(function()
      return next(service.sandboxes[sb.id] and service.sandboxes[sb.id].processes or {}) ~= nil
    end, 5000))
    backing:release(sb.id)
    local ok, err = t:wait()
    assert.is_false(ok)
    assert.are.equal('SANDBOX_ERROR', err.code)
    assert.are.equal('gone', err.reason, tostring(err))
    assert.truthy(#svc:calls('GET', '/sandboxes/{id}') >= 1)
    sb:release()
  end)

  it('a create slower than the call timeout: timeout, and the sandbox it made is found and killed', function()
    service.create_delay_ms = 1500
    local p = sandbox.create_sandboxes(provider(), { max_sandboxes = 1, max_lifetime_ms = 60000, call_timeout_ms = 500 })
    sandbox_error('timeout', { KEY }, p.create, p, { lifetime_ms = 60000, labels = { who = 'slow' } })
    -- the create did make one; the provider looks it up by its label and kills it
    local made = svc:calls('POST', '/v2/sandboxes')[1]
    local tag = made.json.metadata['mayura.create']
    assert.truthy(util.eventually(function() return #svc:calls('DELETE', '/sandboxes/{id}') == 1 end, 10000))
    local listed = svc:calls('GET', '/v2/sandboxes')[1]
    assert.are.equal('mayura.create=' .. tag, listed.query.metadata)
    assert.truthy(util.eventually(function() return next(backing.by_id) == nil end, 10000))
    -- the pool's slot is free once that is done
    assert.truthy(util.eventually(function() return p:count() == 0 end, 10000))
    service.create_delay_ms = 0
    local sb = p:create({ lifetime_ms = 60000 })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    p:close()
  end)
end)
