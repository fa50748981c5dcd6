-- How many calls a command costs on command_sandbox_backend, and that they keep the rate a
-- transport declares: through a local transport (dash and BusyBox sh) and through the hosted
-- providers on the backend, counted on their stand-ins' wire. A short command is one call where
-- the service can wait (a 1 s one too); a 1.25 s command over a transport waiting 500 ms a few,
-- never past `burst` + `per_second` a second. Each hosted transport declares its service's
-- documented rate (none where the service documents none), and a command polled call by call (as
-- where a service cannot wait) keeps it on the wire. The local transports declare faster rates
-- than the services' (the same bucket, in less wall time). Where the service's exec waits for its
-- command (direct_ms), a short one runs in the call's own shell and is stopped there at its timeout.
local sandbox = require('mayura.sandbox')
local core = require('mayura.core')
local transports = require('support.command_transports')
local suite = require('support.stand_in_suite')
local util = require('support.util')

local BUSYBOX = '/usr/bin/busybox'

-- Every run of calls at `times` (ms, in order) within the bucket: at most burst + per_second * t
-- calls in any t seconds (a few ms of slack for the clocks of two processes).
local function assert_within(times, rate)
  for i = 1, #times do
    for j = i, #times do
      local allowed = rate.burst + (times[j] - times[i] + 5) * rate.per_second / 1000
      assert(j - i + 1 <= allowed, ('%d calls in %.0f ms: more than the rate allows'):format(j - i + 1,
        times[j] - times[i]))
    end
  end
end

suite.describe('command_sandbox_backend: calls per command', function()
  for _, shell in ipairs({ { name = 'dash', argv = nil }, { name = 'BusyBox sh', argv = { BUSYBOX, 'sh' } } }) do
    describe('over ' .. shell.name, function()
      local inner, sb
      setup(function()
        inner = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes({ memory_mib = 256, pids = 128 }),
          { max_sandboxes = 2, max_lifetime_ms = 600000 })
        sb = inner:create({ lifetime_ms = 600000 })
      end)
      teardown(function() if inner then inner:close() end end)

      local function backend(opts)
        local t = transports.local_exec(sb, { stdin = true, shell = shell.argv, wait_ms = opts.wait_ms,
          rate = opts.rate })
        return sandbox.command_sandbox_backend('rates', t), t
      end

      it('runs a short command in one call, its output with it', function()
        local b, t = backend({ wait_ms = 20000 })
        for _ = 1, 3 do
          local before = t.calls
          local r = b:exec({ 'sh', '-c', 'echo out; echo err >&2; exit 3' }, {})
          assert.are.same({ 3, 'out\n', 'err\n' }, { r.exit_code, r.stdout, r.stderr })
          assert.are.equal(1, t.calls - before)
        end
        b:release()
      end)

      it('leaves no process behind a short command that left none, and ends what one left', function()
        local b = backend({ wait_ms = 20000 })
        local function procs()
          return sb:exec({ 'sh', '-c', 'for p in /proc/[0-9]*; do tr "\\000" " " <"$p/cmdline" 2>/dev/null; echo; done' })
            .stdout
        end
        for _ = 1, 3 do assert.are.equal(0, b:exec({ 'true' }, {}).exit_code) end
        -- no timer, no delayed kill: nothing of the backend's outlives the call
        assert.is_nil(procs():find('sleep'), procs())
        b:exec({ 'sh', '-c', 'sleep 31 </dev/null >/dev/null 2>&1 &' }, {})
        assert.is_truthy(procs():find('sleep 31'))
        local deadline = core.hrtime_ms() + 5000
        while procs():find('sleep 31') and core.hrtime_ms() < deadline do require('mayura._task').sleep(100) end
        assert.is_nil(procs():find('sleep 31'))
        b:release()
      end)

      it('keeps a 1.25 s command within 4 calls a second (bursts of 3), in a few calls', function()
        local rate = { per_second = 4, burst = 3 }
        local b, t = backend({ wait_ms = 500, rate = rate })
        local before = t.calls
        local t0 = core.hrtime_ms()
        local r = b:exec({ 'sh', '-c', 'sleep 1.25; echo done' }, {})
        assert.are.same({ 0, 'done\n' }, { r.exit_code, r.stdout })
        assert.is_true(core.hrtime_ms() - t0 < 4000)
        -- one call, then one every wait (500 ms): 3 or 4
        assert.is_true(t.calls - before <= 4, (t.calls - before) .. ' calls')
        assert_within(t.times, rate)
        b:release()
      end)

      it('spaces calls by the rate where the transport cannot wait, streaming too', function()
        local rate = { per_second = 8, burst = 3 }
        local b, t = backend({ wait_ms = 0, rate = rate })
        local seen = {}
        local r = b:exec({ 'sh', '-c', 'for i in 1 2 3; do echo $i; sleep 0.25; done' }, {
          on_output = function(_, bytes) seen[#seen + 1] = bytes end })
        assert.are.same({ 0, '1\n2\n3\n' }, { r.exit_code, r.stdout })
        assert.are.equal('1\n2\n3\n', table.concat(seen))
        assert_within(t.times, rate)
        -- a burst's worth of writes and reads at once: files keep the rate too
        for i = 1, 6 do b:write_file('/tmp/f' .. i, ('x'):rep(i)) end
        assert.are.equal('xxxxxx', b:read_file('/tmp/f6'))
        assert_within(t.times, rate)
        b:release()
      end)

      it('refuses a rate that is not one', function()
        for _, bad in ipairs({ { per_second = 0, burst = 3 }, { per_second = 1, burst = 0 },
          { per_second = 0 / 0, burst = 1 }, { per_second = 1, burst = 1.5 }, 'fast' }) do
          local t = transports.local_exec(sb, { stdin = true, shell = shell.argv })
          t.rate = bad
          assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', t)
        end
        local t = transports.local_exec(sb, { stdin = true, shell = shell.argv })
        t.wait_ms = -1
        assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', t)
      end)
    end)
  end
end)

-- The hosted providers on the backend, each against its stand-in: `route` is the exec call, `rate`
-- the rate its transport declares (the service's documented one; none where it documents none).
local RAILWAY_GRAPHQL_RATE = { per_second = 500 / 3600, burst = 9 }
local HOSTED = {
  {
    name = 'Fly', rate = { per_second = 1, burst = 3 }, route = { 'POST', '/v1/apps/{app}/machines/{id}/exec' },
    install = function(s, b)
      return require('support.fly_service').install(s, b, { token = 'fm2_0123456789abcdefTOKEN', app = 'mayura-r' })
    end,
    provider = function(s)
      return require('mayura.sandbox.fly').fly_sandboxes({ token = 'fm2_0123456789abcdefTOKEN', app = 'mayura-r',
        base_url = s:url(''), retry_base_ms = 20 })
    end,
  },
  {
    name = 'AgentCore', rate = { per_second = 15, burst = 15 }, direct = true,
    route = { 'POST', '/code-interpreters/{ci}/tools/invoke' },
    install = function(s, b)
      return require('support.agentcore_service').install(s, b, { access_key_id = 'AKIAMAYURASPEC0KEYID',
        secret_access_key = 'mayura/Spec+Secret0123456789abcdefSECRET', region = 'us-east-1' })
    end,
    provider = function(s)
      return require('mayura.sandbox.agentcore').agentcore_sandboxes({ region = 'us-east-1', endpoint = s:url(''),
        credentials = { access_key_id = 'AKIAMAYURASPEC0KEYID',
          secret_access_key = 'mayura/Spec+Secret0123456789abcdefSECRET' }, retry_base_ms = 20 })
    end,
  },
  {
    name = 'Northflank', rate = { per_second = 500 / 3600, burst = 500 },
    install = function(s, b)
      return require('support.northflank_service').install_with_exec_host(s, b, { token = 'nf_0123456789abcdefTOKEN',
        project_id = 'sandboxes', team_id = 'team-a' })
    end,
    provider = function(s, e)
      return require('mayura.sandbox.northflank').northflank_sandboxes({ token = 'nf_0123456789abcdefTOKEN',
        project_id = 'sandboxes', api_url = s:url(''), exec_url = e.state.exec_url, retry_base_ms = 20 })
    end,
    teardown = function(e) e.state.close_all() end,
  },
  {
    name = 'Railway', direct = true,
    install = function(s, b)
      return require('support.railway_service').install_with_front(s, b, { token = 'rw_0123456789abcdefTOKEN',
        environment_id = 'env-mayura-1' })
    end,
    provider = function(s, e)
      return require('mayura.sandbox.railway').railway_sandboxes({ token = 'rw_0123456789abcdefTOKEN',
        environment_id = 'env-mayura-1', endpoint = s:url(require('support.railway_service').PATH),
        ws_url = e.state.ws_url, retry_base_ms = 20 })
    end,
    teardown = function(e) e.state.close_all() end,
  },
  {
    name = 'Railway (GraphQL sandboxExec)', rate = RAILWAY_GRAPHQL_RATE, direct = true,
    wire = function(e)
      local times = {}
      for _, o in ipairs(e.state:calls('sandboxExec')) do times[#times + 1] = o.req.at end
      return times
    end,
    install = function(s, b)
      return require('support.railway_service').install_with_front(s, b, { token = 'rw_0123456789abcdefTOKEN',
        environment_id = 'env-mayura-1' })
    end,
    provider = function(s)
      return require('mayura.sandbox.railway').railway_sandboxes({ token = 'rw_0123456789abcdefTOKEN',
        environment_id = 'env-mayura-1', endpoint = s:url(require('support.railway_service').PATH), exec = 'graphql',
        retry_base_ms = 20 })
    end,
    teardown = function(e) e.state.close_all() end,
  },
  {
    name = 'CodeSandbox', direct = true,
    install = function(s, b)
      local state = require('support.codesandbox_service').install(s, b, { token = 'csb_0123456789abcdefTOKEN' })
      state.dir = util.tmpdir()
      state:start_front(state.dir)
      return state
    end,
    provider = function(s)
      return require('mayura.sandbox.codesandbox').codesandbox_sandboxes({ token = 'csb_0123456789abcdefTOKEN',
        base_url = s:url(''), workdir = require('support.codesandbox_service').WORKSPACE, retry_base_ms = 20 })
    end,
    teardown = function(e)
      e.state.close()
      util.rmdir(e.state.dir)
    end,
  },
  {
    name = 'Cloudflare', route = { 'POST', '/v1/sandbox/{id}/exec' },
    install = function(s, b)
      return require('support.cloudflare_service').install(s, b, { api_key = 'cfsb_0123456789abcdefKEY' })
    end,
    provider = function(s)
      return require('mayura.sandbox.cloudflare').cloudflare_sandboxes({ worker_url = s:url(''),
        api_key = 'cfsb_0123456789abcdefKEY', retry_base_ms = 20 })
    end,
  },
}

for _, h in ipairs(HOSTED) do
  if h.route and not h.wire then
    h.wire = function(e)
      local times = {}
      for _, req in ipairs(e.svc:calls(h.route[1], h.route[2])) do times[#times + 1] = req.at end
      return times
    end
  end
  suite.describe(h.name .. ': calls per command on its stand-in', function()
    local env, sb
    local calls, times = 0, {}
    suite.stand_in_pool({
      install = h.install, provider = h.provider, teardown = h.teardown,
      pool = { max_sandboxes = 1, max_lifetime_ms = 600000, network = { 'all' } },
      create = { lifetime_ms = 600000, network = 'all' },
      ready = function(e)
        env, sb = e, e.sb
        -- the backend's every call, counted at its transport (each is one request or message)
        local t = sb._backend._transport
        local run = t.run
        t.run = function(...)
          calls = calls + 1
          times[calls] = core.hrtime_ms()
          return run(...)
        end
      end,
    })

    -- what the transport made, checked on the wire where the stand-in records the exec calls
    local function execs()
      return calls, h.wire and #h.wire(env) or 0
    end
    local function one_more(c0, w0)
      local c1, w1 = execs()
      assert.are.equal(1, c1 - c0)
      if h.wire then assert.are.equal(1, w1 - w0) end
    end

    it('runs a short command in one call', function()
      for _ = 1, 3 do
        local c0, w0 = execs()
        local r = sb:exec({ 'sh', '-c', 'echo hi' })
        assert.are.same({ 0, 'hi\n' }, { r.exit_code, r.stdout })
        one_more(c0, w0)
      end
    end)

    -- `direct`: the transport declares direct_ms (its service's exec waits for the command)
    it((h.direct and 'runs a short command in the call\'s own shell and stops it there at its timeout'
      or 'starts every command in a session of its own'), function()
      local r = sb:exec({ 'sh', '-c', 'if tr "\\000" " " </proc/$PPID/cmdline | grep -q "echo [D]";then echo 1;' ..
        'else echo 0;fi' }, { timeout_ms = 10000 })
      assert.are.equal(h.direct and '1\n' or '0\n', r.stdout)
      local c0 = execs()
      r = sb:exec({ 'sh', '-c', 'echo early; sleep 93' }, { timeout_ms = 500 })
      assert.are.same({ true, 'early\n' }, { r.timed_out, r.stdout })
      if h.direct then assert.are.equal(2, calls - c0) end   -- the command's call and the stop's
      assert.is_truthy(util.eventually(function()
        return not sb:exec({ 'sh', '-c', 'for p in /proc/[0-9]*; do tr "\\000" " " <$p/cmdline; echo; done' })
          .stdout:find('sleep 93', 1, true)
      end, 5000))
    end)

    -- 1 s: ten polls or more of a client that does not wait, one call of one that does
    it('runs a 1 s command in one call' .. (h.rate and ', within the service\'s rate' or ''), function()
      local c0, w0 = execs()
      local r = sb:exec({ 'sh', '-c', 'sleep 1; echo done' }, { timeout_ms = 30000 })
      assert.are.same({ 0, 'done\n' }, { r.exit_code, r.stdout })
      one_more(c0, w0)
      if h.rate and h.wire then assert_within(h.wire(env), h.rate) end
    end)

    -- last: where the rate is slow, what is left of its burst paces this case
    it('declares ' .. (h.rate and 'the service\'s documented rate' or 'no rate (the service documents none)')
      .. ' and polls a command within it where the service cannot wait', function()
      assert.are.same(h.rate, sb._backend._transport.rate)
      local b = sb._backend
      local wait, direct = b._wait, b._direct_ms
      b._wait, b._direct_ms = 0, 0   -- every poll a call of its own, backing off on the host
      local c0, w0 = execs()
      local t0 = core.hrtime_ms()
      local ok, r = pcall(sb.exec, sb, { 'sh', '-c', 'sleep 1; echo done' }, { timeout_ms = 60000 })
      b._wait, b._direct_ms = wait, direct
      assert.is_true(ok, tostring(r))
      assert.are.same({ 0, 'done\n' }, { r.exit_code, r.stdout })
      local n, elapsed = calls - c0, core.hrtime_ms() - t0
      local mine = {}
      for i = c0 + 1, calls do mine[#mine + 1] = times[i] end
      if h.rate then
        assert_within(mine, h.rate)
        if h.wire then assert_within(h.wire(env), h.rate) end
      end
      -- polls back off from 2 ms to one every 250 ms: about ten in 1 s (fewer where the rate paces
      -- them, as Fly's 1 a second once its burst of 3 is spent), a few more than elapsed / 250 ms
      assert.is_true(n >= 2 and n <= 10 + elapsed / 250, n .. ' calls in ' .. math.floor(elapsed) .. ' ms')
      if h.wire then assert.are.equal(n, #h.wire(env) - w0) end
    end)
  end)
end
