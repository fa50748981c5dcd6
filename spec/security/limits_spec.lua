-- Abuse of a sandbox's limits, on every provider here: fork and thread bombs, memory bombs (tmpfs
-- included), a CPU hog. Each is tried and must be contained: the sandbox's limits hold, the host and
-- a sibling sandbox are unharmed, and the next command works (or the sandbox is reported gone).
local providers = require('support.providers')
local common = require('security.common')

local PIDS = 64
local MEMORY_MIB = 128

local sh = common.sh

-- Waits until the sandbox runs a command again (a bomb's processes take a moment to be reaped).
local function works_again(sb, ms)
  local last
  local ok = common.eventually(function()
    local pok, r = pcall(sh, sb, 'echo again', { timeout_ms = 5000 })
    last = r
    return pok and r.stdout == 'again\n'
  end, ms or 5000)
  assert.is_true(ok, 'the sandbox did not run a command again: ' .. tostring(last and (last.stderr or last)))
end

-- A number from a file of the sandbox's pids cgroup ('pids.current', 'pids.peak'), or nil.
local function pids_file(sb, name)
  local dir = providers.cgroup_dir(sb, 'pids')
  local f = dir and io.open(dir .. '/' .. name)
  local n = f and tonumber(f:read('l'))
  if f then f:close() end
  return n
end

-- Runs `fn` while probing a sibling sandbox and the host (and the sandbox `sb`'s process count);
-- returns fn's result and what was seen.
local function while_probing(sibling, fn, sb)
  local seen = { worst_rtt = 0, peak_processes = common.host_processes(), sibling_failures = 0, peak_pids = 0 }
  local done = false
  local prober = common.spawn(function()
    while not done do
      local t = common.now()
      local ok, r = pcall(sibling.exec, sibling, { 'echo', 'sibling' }, { timeout_ms = 10000 })
      local rtt = common.now() - t
      if not ok or r.stdout ~= 'sibling\n' then seen.sibling_failures = seen.sibling_failures + 1 end
      if rtt > seen.worst_rtt then seen.worst_rtt = rtt end
      local n = common.host_processes()
      if n > seen.peak_processes then seen.peak_processes = n end
      local p = sb and pids_file(sb, 'pids.current')
      if p and p > seen.peak_pids then seen.peak_pids = p end
      common.sleep(150)
    end
  end)
  local ok, res = pcall(fn)
  done = true
  prober:wait()
  if not ok then error(res, 0) end
  return res, seen
end

for _, prov in ipairs(providers.list()) do
  describe('limits under abuse (' .. prov.name .. ')', function()
    local pool, provider, sb, sibling
    local made = {}
    local function fresh()
      if sb then pcall(sb.release, sb) end
      sb = pool:create({ lifetime_ms = 300000 })
      made[#made + 1] = sb
      common.install(sb)
    end
    setup(function()
      pool, provider = prov.make_pool({ memory_mib = MEMORY_MIB, pids = PIDS, max_sandboxes = 4 })
      fresh()
      sibling = pool:create({ lifetime_ms = 300000 })
      made[#made + 1] = sibling
    end)
    teardown(function() pool:close() end)

    it('stops fork bombs at pids: host headroom kept, sibling served, next command works', function()
      if provider.enforced and not provider.enforced.pids then
        return pending(prov.kind == 'kubernetes' and 'Kubernetes has no process limit per Pod (enforced.pids false)'
          or 'pids are not enforced by this provider here (not root)')
      end
      if prov.gvisor then
        -- gVisor holds the sandbox's processes to pids (RLIMIT_NPROC in its kernel), but a bomb's churn
        -- can take gVisor's own host threads to the host's cap first: the sandbox then ends whole (gone).
        -- The host and a sibling never notice, and a new sandbox is held to pids again
        local _, seen = while_probing(sibling, function()
          return pcall(sb.exec, sb, { common.ABUSE, 'bomb' }, { timeout_ms = 3000 })
        end)
        assert.are.equal(0, seen.sibling_failures, 'the sibling failed during the bomb')
        assert.is_true(seen.worst_rtt < 3000, 'the sibling took ' .. seen.worst_rtt .. ' ms during the bomb')
        assert.is_true(seen.peak_processes < common.pid_max() / 10, 'host pid headroom below 90%')
        local ok, r = pcall(sh, sb, 'echo again', { timeout_ms = 5000 })
        if not (ok and r.stdout == 'again\n') then
          assert.is_true(common.is_gone(r) or (ok and r.timed_out), tostring(r))
          fresh()
        end
        local _, kv = common.abuse(sb, { 'forks', '100000' }, { timeout_ms = 10000 })
        local forks = tonumber(kv.forks)
        assert.is_true(forks ~= nil and forks < PIDS and forks > 8, 'forks: ' .. tostring(kv.forks))
        assert.are.equal('EAGAIN', kv.err)
        return
      end
      local before = common.host_processes()
      -- the classic (its shells give up when a fork fails), then one that retries for ever
      local _, seen = while_probing(sibling, function()
        return sh(sb, 'b(){ b|b& }; b; exec sleep 1', { timeout_ms = 3000 })
      end)
      assert.are.equal(0, seen.sibling_failures, 'the sibling failed during the bomb')
      works_again(sb)
      local r
      r, seen = while_probing(sibling, function()
        return sb:exec({ common.ABUSE, 'bomb' }, { timeout_ms = 3000 })
      end, sb)
      assert.is_true(r.timed_out, 'the bomb ended before its timeout')
      assert.are.equal(0, seen.sibling_failures, 'the sibling failed during the bomb')
      assert.is_true(seen.worst_rtt < 3000, 'the sibling took ' .. seen.worst_rtt .. ' ms during the bomb')
      -- the sandbox's own count (its pids cgroup) ran into the limit and no further
      local peak = pids_file(sb, 'pids.peak') or seen.peak_pids
      assert.is_true(seen.peak_pids >= PIDS - 8, 'the bomb did not reach the limit: ' .. seen.peak_pids)
      assert.is_true(peak <= PIDS, 'the sandbox had ' .. peak .. ' processes with pids = ' .. PIDS)
      -- and the host kept its headroom (other work on this machine counts here too)
      assert.is_true(seen.peak_processes < common.pid_max() / 10, 'host pid headroom below 90%')
      works_again(sb)
      -- its processes are gone from the host
      assert.is_true(common.eventually(function()
        local now = pids_file(sb, 'pids.current')
        if now then return now <= 4 end
        return common.host_processes() <= before + 8
      end, 5000), 'the bomb left processes: ' .. tostring(pids_file(sb, 'pids.current')))
      -- and a new command is held to the same limit
      local _, kv = common.abuse(sb, { 'forks', '100000' }, { timeout_ms = 10000 })
      local forks = tonumber(kv.forks)
      assert.is_true(forks ~= nil and forks < PIDS and forks > 8, 'forks: ' .. tostring(kv.forks))
      assert.are.equal('EAGAIN', kv.err)
    end)

    it('stops a thread bomb at pids, threads counted', function()
      if provider.enforced and not provider.enforced.pids then
        return pending(prov.kind == 'kubernetes' and 'Kubernetes has no process limit per Pod (enforced.pids false)'
          or 'pids are not enforced by this provider here (not root)')
      end
      local r, seen = while_probing(sibling, function()
        return common.abuse(sb, { 'threads', '100000' }, { timeout_ms = 10000 })
      end)
      local kv = common.kv(r.stdout)
      local threads = tonumber(kv.threads)
      assert.is_true(threads ~= nil and threads < PIDS and threads > 8, 'threads: ' .. r.stdout .. r.stderr)
      assert.are.equal('EAGAIN', kv.err)
      assert.are.equal(0, seen.sibling_failures)
      works_again(sb)
    end)

    it('kills a memory bomb at memory_mib and reports oom_killed, directly and under a shell', function()
      if provider.enforced and not provider.enforced.memory then
        return pending('memory is not enforced by this provider here (not root)')
      end
      if prov.kind == 'kubernetes' then
        -- the agent reads a Pod's OOM kills from /sys/fs/cgroup, which the stand-in's pods lack
        return pending('the Kubernetes stand-in: its pods have no /sys/fs/cgroup to tell an OOM kill')
      end
      local avail = common.mem_available_kib()
      if prov.gvisor then
        -- the host's OOM killer sees a gVisor sandbox whole (enforced.oom_protected is false): the bomb
        -- is killed, or the sandbox ends with it (gone); the host never lends it more than its limit
        local res, seen = while_probing(sibling, function()
          return { pcall(sb.exec, sb, { common.ABUSE, 'mem', tostring(MEMORY_MIB * 4) }, { timeout_ms = 20000 }) }
        end)
        local ok, r = res[1], res[2]
        assert.is_true(ok and (r.signal == 9 or r.exit_code ~= 0) or (not ok and common.is_gone(r)), tostring(r))
        assert.are.equal(0, seen.sibling_failures)
        assert.is_true(avail - common.mem_available_kib() < (MEMORY_MIB + 256) * 1024)
        if not ok then fresh() end
        works_again(sb)
        return
      end
      local r, seen = while_probing(sibling, function()
        return sb:exec({ common.ABUSE, 'mem', tostring(MEMORY_MIB * 4) }, { timeout_ms = 20000 })
      end)
      assert.is_false(r.timed_out)
      assert.are.equal(9, r.signal, 'exit ' .. tostring(r.exit_code) .. ' ' .. r.stderr)
      assert.is_nil(r.exit_code)
      assert.is_true(r.oom_killed, 'an OOM kill not reported as one')
      assert.are.equal(0, seen.sibling_failures)
      -- the host never lent it more than its limit (and some slack for everything else running)
      assert.is_true(avail - common.mem_available_kib() < (MEMORY_MIB + 256) * 1024)
      works_again(sb)
      -- a shell that reports its child killed (exit 137) is marked the same
      r = sh(sb, common.ABUSE .. ' mem ' .. (MEMORY_MIB * 4) .. '; exit $?', { timeout_ms = 20000 })
      assert.is_true(r.exit_code == 137 or r.signal == 9, 'exit ' .. tostring(r.exit_code))
      assert.is_true(r.oom_killed, 'an OOM kill under a shell not reported as one')
      works_again(sb)
    end)

    it('holds a memory bomb in tmpfs (/dev/shm): no space left, or an OOM reported, or the sandbox gone', function()
      local want = MEMORY_MIB * 2 * 1048576
      local ok, r = pcall(sh, sb, 'head -c ' .. want .. ' /dev/zero > /dev/shm/fill; echo rc=$?; wc -c < /dev/shm/fill',
        { timeout_ms = 20000 })
      if ok then
        local rc, size = r.stdout:match('rc=(%d+)\n%s*(%d+)')
        local nospace = rc ~= nil and rc ~= '0' and tonumber(size) < MEMORY_MIB * 1048576
        assert.is_true(nospace or r.oom_killed == true, 'filling /dev/shm went unchecked: ' .. r.stdout .. r.stderr)
        local after_ok, after = pcall(sh, sb, 'rm -f /dev/shm/fill; echo again', { timeout_ms = 5000 })
        if after_ok then
          assert.are.equal('again\n', after.stdout)
        else
          assert.is_true(common.is_gone(after), tostring(after))
          fresh()
        end
      else
        assert.is_true(common.is_gone(r), tostring(r))
        fresh()
      end
      assert.are.equal('sibling\n', sibling:exec({ 'echo', 'sibling' }).stdout)
    end)

    it('holds a CPU hog to cpus (CPU time over wall time, over a second)', function()
      if provider.enforced and not provider.enforced.cpus then
        return pending('cpus are not enforced by this provider here (not root)')
      end
      local hog = pool:create({ lifetime_ms = 60000, cpus = 0.5 })
      made[#made + 1] = hog
      common.install(hog)
      -- gVisor's kernel counts its own CPU time: there the host's count (the container's cgroup) is read
      local acct = prov.gvisor and providers.cgroup_dir(hog, 'cpuacct')
      local function usage_ms()
        local f = acct and io.open(acct .. '/cpuacct.usage')
        local ns = f and tonumber(f:read('l'))
        if f then f:close() end
        return ns and ns / 1e6
      end
      local used0, t0 = usage_ms(), common.now()
      local r, seen = while_probing(sibling, function()
        return common.abuse(hog, { 'spin', '1000', '4' }, { timeout_ms = 10000 })
      end)
      local used1, t1 = usage_ms(), common.now()
      hog:release()
      local kv = common.kv(r.stdout)
      local cpu, wall = tonumber(kv.cpu_ms), tonumber(kv.wall_ms)
      if prov.gvisor then
        assert.is_true(used0 ~= nil and used1 ~= nil, 'no cpuacct cgroup of the gVisor sandbox')
        cpu, wall = used1 - used0, t1 - t0
      end
      assert.is_true(cpu ~= nil and wall ~= nil and wall >= 900, r.stdout .. r.stderr)
      local share = cpu / wall
      -- four busy threads on 0.5 CPU: at most about half a CPU (generously 0.8), and it did run
      assert.is_true(share <= 0.8, ('the hog used %.2f CPUs with cpus = 0.5'):format(share))
      assert.is_true(share >= 0.1, ('the hog hardly ran: %.2f CPUs'):format(share))
      assert.are.equal(0, seen.sibling_failures)
      assert.is_true(seen.worst_rtt < 1000, 'the sibling took ' .. seen.worst_rtt .. ' ms during the hog')
    end)

    it('leaves the pool usable (a new sandbox works) and, once released, nothing behind', function()
      local extra = pool:create({ lifetime_ms = 60000 })
      made[#made + 1] = extra
      assert.are.equal('new\n', extra:exec({ 'echo', 'new' }).stdout)
      local left = {}
      for _, s in ipairs(made) do
        s:release()
        common.eventually(function() return #prov.leftovers(s) == 0 end, 5000)
        for _, l in ipairs(prov.leftovers(s)) do left[#left + 1] = s.id .. ': ' .. l end
      end
      assert.are.same({}, left)
    end)
  end)
end
