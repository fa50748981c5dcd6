--- Benchmark of snapshots and forks, not a test: `build/mayura bench/snapshot.lua [N] [N_DOCKER]`.
--
-- A workspace of 100 MiB in 1,000 files, each ratio against a baseline measured in the same run
-- (medians of N turns, taken turn by turn):
--   * local: a create from a snapshot of it (+ release) against a cold create plus writing the
--     1,000 files with write_file (+ release);
--   * local: the host memory that ten sandboxes made from one snapshot at once hold, against one,
--     each with the snapshot they need (the kernel's Shmem: tmpfs pages, a native snapshot's too;
--     a generic snapshot's archive in this process);
--   * Docker (api, when a daemon answers and the test image is there): a create from the snapshot
--     against a cold create (and both again with their releases).
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local core = require('mayura.core')
local task = require('mayura._task')
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local N = tonumber(arg and arg[1]) or 5
local N_DOCKER = tonumber(arg and arg[2]) or 3
local MIB = 1048576
local FILES, FILE_BYTES = 1000, math.floor(100 * MIB / 1000)
local SIZES = { memory_mib = 1024, workspace_mib = 160, tmp_mib = 160 }
local POOL = { max_sandboxes = 12, max_lifetime_ms = 600000, max_file_bytes = 16 * MIB, call_timeout_ms = 300000 }

-- The files, made on the host once: each its own bytes.
local files = {}
do
  local seed = {}
  for i = 1, 1024 do seed[i] = string.char((i * 7919) % 251) end
  local block = table.concat(seed)
  local body = block:rep(math.ceil(FILE_BYTES / #block)):sub(1, FILE_BYTES - 8)
  for i = 1, FILES do
    files[i] = { path = ('repo/d%02d/f%04d.bin'):format(i % 50, i), data = ('%08d'):format(i) .. body }
  end
end

local function shmem_kib()
  local f = assert(io.open('/proc/meminfo'))
  local text = f:read('a')
  f:close()
  return tonumber(text:match('Shmem:%s+(%d+)'))
end

local function row(what, x, base, unit, target)
  print(('%-58s %10.1f %s  vs %10.1f %s   ratio %.2fx%s'):format(what, x, unit, base, unit, x / base,
    target and ('  (target <= ' .. target .. ')') or ''))
end

local function prepared(pool)
  local base = pool:create({ lifetime_ms = 600000 })
  for _, f in ipairs(files) do base:write_file(f.path, f.data) end
  local snap = base:snapshot()
  base:release()
  return snap
end

-- {======================================================
-- Local
-- =======================================================

local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(SIZES), POOL)
local snap = prepared(pool)
local snap_kind = pool.provider.features.snapshots
print(('a snapshot of %d files, %.1f MiB (%s)'):format(FILES, snap.size_bytes / MIB, snap_kind))
local cold, forked = {}, {}
for turn = 0, N do
  local t0 = core.hrtime_ms()
  local sb = pool:create({ lifetime_ms = 600000 })
  for _, f in ipairs(files) do sb:write_file(f.path, f.data) end
  sb:release()
  local t1 = core.hrtime_ms()
  local fork = pool:create({ lifetime_ms = 600000, snapshot = snap })
  fork:release()
  local t2 = core.hrtime_ms()
  if turn > 0 then cold[#cold + 1], forked[#forked + 1] = t1 - t0, t2 - t1 end   -- turn 0 warms up
end
row('local create from a snapshot (' .. snap_kind .. ') / cold create + 1,000 write_file', bench.median(forked),
  bench.median(cold), 'ms', '0.33x')

-- memory: what the host holds for one fork, then for ten at once (three turns each, medians),
-- each counted from before their snapshot was made: the kernel's Shmem (tmpfs pages: the forks'
-- own and a native snapshot's) and, for a generic snapshot, its archive in this process's memory
local function fleet(n, before, held_kib)
  local tasks, list = {}, {}
  for i = 1, n do
    tasks[i] = task.spawn(function() list[i] = pool:create({ lifetime_ms = 600000, snapshot = snap }) end)
  end
  for _, t in ipairs(tasks) do t:wait() end
  local kib = shmem_kib() - before + held_kib
  for _, sb in ipairs(list) do sb:release() end
  return kib
end
snap:release()
local before = shmem_kib()
snap = prepared(pool)
local kind = pool:create({ lifetime_ms = 600000 })
local held_kib = kind.features.snapshots == 'native' and 0 or snap.size_bytes / 1024
kind:release()
local ones, tens = {}, {}
for turn = 1, 3 do
  ones[turn] = fleet(1, before, held_kib)
  tens[turn] = fleet(10, before, held_kib)
end
row('local host memory of 10 forks at once / of one (' .. kind.features.snapshots .. ')',
  bench.median(tens) / 1024, bench.median(ones) / 1024, 'MiB', '2x')
pool:close()

-- }======================================================

-- {======================================================
-- Docker
-- =======================================================

local function host_ok(cmd)
  local ok = os.execute(cmd .. ' >/dev/null 2>&1')
  return ok == true or ok == 0
end
if host_ok('docker image inspect mayura-test/busybox:1') then
  local docker = require('mayura.sandbox.docker')
  local dpool = sandbox.create_sandboxes(docker.docker_sandboxes({ image = 'mayura-test/busybox:1', engine = 'api',
    memory_mib = SIZES.memory_mib, workspace_mib = SIZES.workspace_mib, tmp_mib = SIZES.tmp_mib }), POOL)
  local dsnap = prepared(dpool)
  -- the create alone is the target's; with its release too, for what a rollout waits for in all
  local dcold, dfork, dcold_all, dfork_all = {}, {}, {}, {}
  for turn = 0, N_DOCKER do
    local t0 = core.hrtime_ms()
    local sb = dpool:create({ lifetime_ms = 600000 })
    local t1 = core.hrtime_ms()
    sb:release()
    local t2 = core.hrtime_ms()
    local fork = dpool:create({ lifetime_ms = 600000, snapshot = dsnap })
    local t3 = core.hrtime_ms()
    fork:release()
    local t4 = core.hrtime_ms()
    if turn > 0 then
      dcold[#dcold + 1], dfork[#dfork + 1] = t1 - t0, t3 - t2
      dcold_all[#dcold_all + 1], dfork_all[#dfork_all + 1] = t2 - t0, t4 - t2
    end
  end
  local dkind = dpool.provider.features.snapshots
  row('Docker (api) create from a snapshot (' .. dkind .. ') / cold create', bench.median(dfork), bench.median(dcold),
    'ms', '1.5x')
  row('Docker (api) the same, each with its release', bench.median(dfork_all), bench.median(dcold_all), 'ms')
  dpool:close()
else
  print('Docker: no daemon or no test image here, not measured')
end

-- }======================================================
