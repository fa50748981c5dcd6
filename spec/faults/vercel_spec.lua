-- mayura.sandbox.vercel when the service misbehaves, on the Vercel stand-in (support/vercel_service.lua)
-- over real local sandboxes: a refused token, a sandbox that vanished or stopped behind the
-- pool's back, 429 with Retry-After, a command stream cut while the command runs, a create that
-- never answers. Each ends as a SandboxError with the right reason and none of the service's text
-- or the token; and a command past its timeout is killed by its id and by its tag.
local vercel = require('mayura.sandbox.vercel')
local stand_in = require('support.stand_in')
local vercel_service = require('support.vercel_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local TOKEN = 'vcp_fault0123456789abcdefTOKEN'
local TEAM, PROJECT = 'team_faults', 'prj_faults'

faults.hosted_suite({
  title = 'the Vercel provider when the service misbehaves',
  provider = vercel.vercel_sandboxes,
  options = function(svc)
    return { token = TOKEN, team_id = TEAM, project_id = PROJECT, base_url = svc:url('/api'), workdir = '/workspace',
      retry_base_ms = 20 }
  end,
  pool = { max_sandboxes = 2, max_lifetime_ms = 600000 },
  create = { lifetime_ms = 60000 },
  install = function(svc, backing)
    return vercel_service.install(svc, backing, { token = TOKEN, team_id = TEAM, project_id = PROJECT })
  end,
  -- the streams the spec asked to be cut are the stand-in's only failures
  expected_failures = { vercel_service.CUT },
  reset = function(env) env.state.cut_streams = 0 end,
  secrets = { TOKEN, 'WRONG' },
  words = { 'is not valid', 'Sandbox is stopped', 'Session not found', 'try later', 'stand-in' },
  cases = function(env)
    local check, CREATE = env.check, env.CREATE
    local make_pool = env.make_pool

    it('401: a wrong token is authentication, and neither token shows', function()
      env.refused({ token = 'vcp_WRONG_token_0123456789' })
      -- a token revoked while a sandbox lives: every call says so
      local pool = make_pool()
      local sb = pool:create(CREATE)
      env.svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/cmd', { status = 401, json = { error = {
        code = 'unauthorized', message = 'The token ' .. TOKEN .. ' is not valid' } } })
      check('authentication', sb.exec, sb, { 'true' })
      check('authentication', sb.list_files, sb, '.')
      env.svc:clear()
      pool:close()
    end)

    it('404 on a vanished session, and 410 on a stopped one, are gone for every call', function()
      local pool, sb = env.open()
      sb:write_file('x.txt', 'x')
      local calls = {
        function() return sb:exec({ 'true' }) end,
        function() return sb:read_file('x.txt') end,
        function() return sb:read_file('no-such-file') end,
        function() return sb:write_file('x.txt', 'y') end,
        function() return sb:list_files('.') end,
        function() return sb:remove_file('x.txt') end,
      }
      env.svc:vanish(sb._backend.session_id)
      for _, call in ipairs(calls) do check('gone', call) end
      env.svc:clear()
      -- stopped behind the pool's back (the service's own timeout, a console): 410 sandbox_stopped
      local other = pool:create(CREATE)
      other:write_file('x.txt', 'x')
      local s = env.state.sessions[other._backend.session_id]
      env.backing:release(s.backing_id)
      for _, call in ipairs({
        function() return other:exec({ 'true' }) end,
        function() return other:read_file('x.txt') end,
        function() return other:write_file('x.txt', 'y') end,
        function() return other:list_files('.') end,
      }) do
        check('gone', call)
      end
      sb:release()
      other:release()
      assert.are.equal(0, pool:count())
      pool:close()
    end)

    it('429: waits the Retry-After it was given, then goes on; a wait too long is rate_limited at once', function()
      local pool, sb = env.open()
      env.svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/cmd', stand_in.rate_limited(1), 1)
      local before = #env.svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')
      assert.are.equal('after the wait\n', sb:exec({ 'echo', 'after the wait' }).stdout)
      local cmds = env.svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')
      assert.are.equal(before + 2, #cmds)
      -- a second, less what the loop's cached clock can lag behind the arrival times (a few ms)
      local waited = cmds[#cmds].at_ms - cmds[#cmds - 1].at_ms
      assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
      -- the service asks for more than the provider waits (20 s by default, as the SDK)
      env.svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/fs/read', stand_in.rate_limited(60), 1)
      local err = check('rate_limited', sb.read_file, sb, 'x')
      assert.are.equal(60000, err.retry_after_ms)
      sb:release()
      pool:close()
    end)

    it('a stream cut while the command runs is taken up again from its logs', function()
      local pool, sb = env.open()
      env.state.cut_streams = 1
      local r = sb:exec({ 'sh', '-c', 'sleep 0.3; echo done; echo warn >&2; exit 5' })
      assert.are.equal(5, r.exit_code)
      assert.are.equal('done\n', r.stdout)
      assert.are.equal('warn\n', r.stderr)
      assert.are.equal(1, #env.svc:calls('GET', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}/logs'))
      assert.are.equal(1, #env.svc:calls('GET', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}'))
      -- cut, and the logs cannot be had: unavailable, without the service's words
      env.state.cut_streams = 1
      env.svc:fault('GET', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}/logs', stand_in.reset())
      check('unavailable', sb.exec, sb, { 'sh', '-c', 'sleep 0.2; echo lost' })
      env.svc:clear()
      assert.are.equal('still here\n', sb:exec({ 'echo', 'still here' }).stdout)
      sb:release()
      pool:close()
    end)

    it('a create that never answers ends at the call timeout, and the service sees the client leave', function()
      local pool = make_pool(nil, { call_timeout_ms = 500 })
      env.svc:fault('POST', '/api/v3/sandboxes', stand_in.stall(), 1)
      check('timeout', pool.create, pool, CREATE)
      local creates = env.svc:calls('POST', '/api/v3/sandboxes')
      local stalled = creates[#creates]
      assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
      assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
      -- and the pool goes on
      env.goes_on(pool)
    end)

    it('kills a command past its timeout by its id and by its tag', function()
      local pool, sb = env.open()
      local r = sb:exec({ 'sh', '-c', 'setsid sleep 66 >/dev/null 2>&1 </dev/null & sleep 67' }, { timeout_ms = 400 })
      assert.is_true(r.timed_out)
      assert.is_nil(r.exit_code)
      local kills = env.svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd/{cid}/kill')
      assert.are.equal(9, kills[#kills].json.signal)
      local by_tag = false
      for _, req in ipairs(env.svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')) do
        local args = req.json and req.json.args
        if type(args) == 'table' and type(args[2]) == 'string' and args[2]:find('MAYURA_EXEC=v', 1, true) then
          by_tag = true
        end
      end
      assert.is_true(by_tag, 'no command killed the tag')
      -- the service's own timeout is a backstop a little after ours
      local cmds = env.svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/cmd')
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
  end,
})
