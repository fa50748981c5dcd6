-- mayura.sandbox.vercel when the service misbehaves, on the Vercel stand-in (support/vercel_service.lua)
-- over real local sandboxes: a refused token, a sandbox that vanished or stopped behind the
-- pool's back, 429 with Retry-After, a command stream cut while the command runs, a create that
-- never answers. Each ends as a SandboxError with the right reason and none of the service's text
-- or the token; and a command past its timeout is killed by its id and by its tag.
local sandbox = require('mayura.sandbox')
local vercel = require('mayura.sandbox.vercel')
local stand_in = require('support.stand_in')
local vercel_service = require('support.vercel_service')
local util = require('support.util')

local TOKEN = 'vcp_fault0123456789abcdefTOKEN'
local TEAM, PROJECT = 'team_faults', 'prj_faults'
local SERVICE_WORDS = { 'is not valid', 'Sandbox is stopped', 'Session not found', 'try later', 'stand-in' }

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

describe('the Vercel provider when the service misbehaves', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state

  local function provider(extra)
    local o = { token = TOKEN, team_id = TEAM, project_id = PROJECT, base_url = svc:url('/api'), workdir = '/workspace',
      retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return vercel.vercel_sandboxes(o)
  end

  local function make_pool(extra, pool_options)
    local o = { max_sandboxes = 2, max_lifetime_ms = 600000 }
    for k, v in pairs(pool_options or {}) do o[k] = v end
    return sandbox.create_sandboxes(provider(extra), o)
  end

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = vercel_service.install(svc, backing, { token = TOKEN, team_id = TEAM, project_id = PROJECT })
  end)

  teardown(function()
    backing:close()
    -- the streams the spec asked to be cut are the stand-in's only failures
    local others = {}
    for _, f in ipairs(svc.failures) do
      if f ~= vercel_service.CUT then others[#others + 1] = f end
    end
    assert.are.same({}, others)
    svc:close()
  end)

  after_each(function()
    svc:clear()
    state.cut_streams = 0
  end)

  it('401: a wrong token is authentication, and neither token shows', function()
    local pool = make_pool({ token = 'vcp_WRONG_token_0123456789' })
    sandbox_error('authentication', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(0, pool:count())
    pool:close()
    -- a token revoked while a sandbox lives: every call says so
    pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000 })
    svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/cmd', { status = 401, json = { error = {
      code = 'unauthorized', message = 'The token ' .. TOKEN .. ' is not valid' } } })
    sandbox_error('authentication', sb.exec, sb, { 'true' })
    sandbox_error('authentication', sb.list_files, sb, '.')
    svc:clear()
    pool:close()
  end)

  it('404 on a vanished session, and 410 on a stopped one, are gone for every call', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000 })
    sb:write_file('x.txt', 'x')
    local calls = {
      function() return sb:exec({ 'true' }) end,
      function() return sb:read_file('x.txt') end,
      function() return sb:read_file('no-such-file') end,
      function() return sb:write_file('x.txt', 'y') end,
      function() return sb:list_files('.') end,
      function() return sb:remove_file('x.txt') end,
    }
    svc:vanish(sb._backend.session_id)
    for _, call in ipairs(calls) do sandbox_error('gone', call) end
    svc:clear()
    -- stopped behind the pool's back (the service's own timeout, a console): 410 sandbox_stopped
    local other = pool:create({ lifetime_ms = 60000 })
    other:write_file('x.txt', 'x')
    local s = state.sessions[other._backend.session_id]
    backing:release(s.backing_id)
    for _, call in ipairs({
      function() return other:exec({ 'true' }) end,
      function() return other:read_file('x.txt') end,
      function() return other:write_file('x.txt', 'y') end,
      function() return other:list_files('.') end,
    }) do
      sandbox_error('gone', call)
    end
    sb:release()
    other:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000 })
    svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/cmd', stand_in.rate_limited(1), 1)
    local before = #svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')
    assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
    local cmds = svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')
    assert.are.equal(before + 2, #cmds)
    -- a second, less what the loop's cached clock can lag behind the arrival times (a few ms)
    local waited = cmds[#cmds].at_ms - cmds[#cmds - 1].at_ms
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    -- the service asks for more than the provider waits (20 s by default, as the SDK)
    svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/fs/read', stand_in.rate_limited(60), 1)
    local err = sandbox_error('rate_limited', sb.read_file, sb, 'x')
    assert.are.equal(60000, err.retry_after_ms)
    sb:release()
    pool:close()
  end)

  it('a stream cut while the command runs is taken up again from its logs', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000 })
    state.cut_streams = 1
    local r = sb:exec({ 'sh', '-c', 'sleep 0.3; echo done; echo warn >&2; exit 5' })
    assert.are.equal(5, r.exit_code)
    assert.are.equal('done\n', r.stdout)
    assert.are.equal('warn\n', r.stderr)
    assert.are.equal(1, #svc:calls('GET', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}/logs'))
    assert.are.equal(1, #svc:calls('GET', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}'))
    -- cut, and the logs cannot be had: unavailable, without the service's words
    state.cut_streams = 1
    svc:fault('GET', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}/logs', stand_in.reset())
    sandbox_error('unavailable', sb.exec, sb, { 'sh', '-c', 'sleep 0.2; echo lost' })
    svc:clear()
    assert.are.equal('still here\n', sb:exec({ 'echo', 'still here' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers ends at the call timeout, and the service sees the client leave', function()
    local pool = make_pool(nil, { call_timeout_ms = 500 })
    svc:fault('POST', '/api/v3/sandboxes', stand_in.stall(), 1)
    sandbox_error('timeout', pool.create, pool, { lifetime_ms = 60000 })
    local creates = svc:calls('POST', '/api/v3/sandboxes')
    local stalled = creates[#creates]
    assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
    assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
    -- and the pool goes on
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('kills a command past its timeout by its id and by its tag', function()
    local pool = make_pool()
    local sb = pool:create({ lifetime_ms = 60000 })
    local r = sb:exec({ 'sh', '-c', 'setsid sleep 66 >/dev/null 2>&1 </dev/null & sleep 67' }, { timeout_ms = 400 })
    assert.is_true(r.timed_out)
    assert.is_nil(r.exit_code)
    local kills = svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}/kill')
    assert.are.equal(9, kills[#kills].json.signal)
    local by_tag = false
    for _, req in ipairs(svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')) do
      local args = req.json and req.json.args
      if type(args) == 'table' and type(args[2]) == 'string' and args[2]:find('MAYURA_EXEC=v', 1, true) then
        by_tag = true
      end
    end
    assert.is_true(by_tag, 'no command killed the tag')
    -- the service's own timeout is a backstop a little after ours
    local cmds = svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')
    local sent
    for _, req in ipairs(cmds) do
      if req.json and req.json.command == 'sh' and req.json.args[2] and req.json.args[2]:find('sleep 67', 1, true) then
        sent = req.json
      end
    end
    assert.is_true(sent.timeout > 400)
    assert.are.equal('fine\n', sb:exec({ 'echo', 'fine' }).stdout)
    sb:release()
    pool:close()
  end)
end)
