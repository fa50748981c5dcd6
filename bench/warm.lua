--- Benchmark of warm sandboxes, cold creates and scale, not a test: medians and ratios measured in
-- one run (each against a baseline taken in the same run).
--
--   build/mayura bench/warm.lua [N] [N_DOCKER] [MANY_LOCAL] [MANY_DOCKER]    (N_DOCKER 0: local only)
--
-- Local: cold create+release against a one-shot `bwrap --unshare-all true` (target <= 2x); a warm
-- create (`warm = 2`, a ready one handed out) against an exec of `true` in a sandbox (<= 2x);
-- MANY_LOCAL (100) sandboxes created at once against one cold create (<= 3x); per idle sandbox,
-- the host process's RSS (<= 64 KiB), the launcher's processes (host side, outside the sandbox)
-- and the sandbox's own memory: its processes (proportional set size; <= 1 MiB).
-- Docker (when a daemon answers; the test image of scripts/docker-setup.sh), engine 'api': cold
-- create+release against the Engine API's create+start+remove of a container made by this bench
-- over the daemon's socket (<= 0.7x); a warm create against `docker exec true` (<= 3x);
-- MANY_DOCKER (50) at once against one cold create.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local docker = require('mayura.sandbox.docker')
local process = require('mayura.process')
local http = require('mayura.http')
local core = require('mayura.core')
local task = require('mayura._task')

local N = tonumber(arg and arg[1]) or 50
local N_DOCKER = tonumber(arg and arg[2]) or 10
local MANY_LOCAL = tonumber(arg and arg[3]) or 100
local MANY_DOCKER = tonumber(arg and arg[4]) or 50
local IMAGE = 'mayura-test/busybox:1'
local SOCKET = '/var/run/docker.sock'
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local rows, ratios = {}, {}
local function row(name, value, unit) rows[#rows + 1] = { name, value, unit or 'ms' } end
local function ratio(name, a, b, target)
  ratios[#ratios + 1] = ('%-48s %8.2fx   (target %s)'):format(name, a / b, target)
end

-- Times `n` warm creates: each once the provider has one ready (the wait is not timed).
local function warm_creates(pool, provider, n)
  local xs = {}
  for i = 1, n + 2 do
    while provider:warm_ready() == 0 do task.sleep(2) end
    local t0 = core.hrtime_ms()
    local sb = pool:create({ lifetime_ms = 60000, env = { N = tostring(i) } })
    local ms = core.hrtime_ms() - t0
    if i > 2 then xs[#xs + 1] = ms end
    sb:release()
  end
  return bench.median(xs)
end

-- Creates `n` sandboxes at once (one task each); returns the wall time and the sandboxes.
local function many(pool, n)
  local t0 = core.hrtime_ms()
  local tasks, out = {}, {}
  for i = 1, n do tasks[i] = task.spawn(function() out[i] = pool:create({ lifetime_ms = 600000 }) end) end
  for _, t in ipairs(tasks) do t:wait() end
  return core.hrtime_ms() - t0, out
end

local function read(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('a')
  f:close()
  return s
end
local function kib(path, field)
  return tonumber((read(path) or ''):match(field .. ':%s*(%d+) kB')) or 0
end
local function rss_kib() return kib('/proc/self/status', 'VmRSS') end
local function pss_kib(pid) return kib('/proc/' .. pid .. '/smaps_rollup', 'Pss') end
-- the descendants of `pid` (from every process's parent)
local function descendants(pid)
  local parent = {}
  local ls = process.run({ 'ps', '-e', '-o', 'pid=,ppid=' })
  for a, b in ls.stdout:gmatch('(%d+)%s+(%d+)') do parent[tonumber(a)] = tonumber(b) end
  local out = {}
  for p in pairs(parent) do
    local q = parent[p]
    while q and q ~= pid and q > 1 do q = parent[q] end
    if q == pid then out[#out + 1] = p end
  end
  return out
end

-- {======================================================
-- Local
-- =======================================================

local provider = local_provider.local_sandboxes()
local pool = sandbox.create_sandboxes(provider, { max_sandboxes = MANY_LOCAL + 4, max_lifetime_ms = 600000 })
local bwrap = bench.measure(N, function()
  assert(process.run({ 'bwrap', '--ro-bind', '/', '/', '--unshare-all', '--die-with-parent', '/bin/true' })
    .exit_code == 0)
end)
row('bwrap --unshare-all true (one-shot)', bwrap)
local cold = bench.measure(N, function() pool:create({ lifetime_ms = 60000 }):release() end)
row('local cold create+release', cold)
local cold_create = bench.measure(math.min(N, 20), function()
  local sb = pool:create({ lifetime_ms = 60000 })
  task.spawn(function() sb:release() end)
end)
row('local cold create (release not timed)', cold_create)
local sb = pool:create({ lifetime_ms = 600000 })
local exec = bench.measure(N * 4, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
row('local exec true', exec)
sb:release()

local wp = local_provider.local_sandboxes({ warm = 2 })
local wpool = sandbox.create_sandboxes(wp, { max_sandboxes = 8, max_lifetime_ms = 600000 })
local warm = warm_creates(wpool, wp, N)
row('local warm create', warm)
wpool:close()

-- idle memory: the host's RSS before and after, the launchers' and the sandboxes' own processes
collectgarbage('collect')
local rss0 = rss_kib()
local wall, sbs = many(pool, MANY_LOCAL)
row(MANY_LOCAL .. ' local creates at once (wall)', wall)
collectgarbage('collect')
local rss1 = rss_kib()
local launcher_kib, own_kib, counted = 0, 0, 0
for i = 1, math.min(10, #sbs) do
  local b = sbs[i]._backend
  local cg = b.cg_dirs and b.cg_dirs[1]
  local inside = {}
  for p in (read((cg or '/nonexistent') .. '/cgroup.procs') or ''):gmatch('%d+') do
    inside[tonumber(p)] = true
    own_kib = own_kib + pss_kib(p)
  end
  for _, p in ipairs(descendants(b.proc:pid())) do
    if not inside[p] then launcher_kib = launcher_kib + pss_kib(p) end
  end
  launcher_kib = launcher_kib + pss_kib(b.proc:pid())
  if next(inside) then counted = counted + 1 end
end
local tasks = {}
for i, s in ipairs(sbs) do tasks[i] = task.spawn(function() s:release() end) end
for _, t in ipairs(tasks) do t:wait() end
pool:close()

row('host RSS per idle sandbox', (rss1 - rss0) / MANY_LOCAL, 'KiB')
if counted > 0 then
  row('launcher processes per idle sandbox (PSS)', launcher_kib / counted, 'KiB')
  row('sandbox processes per idle sandbox (PSS)', own_kib / counted, 'KiB')
end
ratio('local cold create+release / bwrap one-shot', cold, bwrap, '<= 2x')
ratio('local warm create / local exec true', warm, exec, '<= 2x')
ratio(MANY_LOCAL .. ' local at once / one cold create', wall, cold_create, '<= 3x')

-- }======================================================

-- {======================================================
-- Docker
-- =======================================================

-- (N_DOCKER 0: the local half alone)
local have_docker = N_DOCKER > 0 and
  process.run({ 'docker', 'image', 'inspect', IMAGE }, { timeout_ms = 30000 }).exit_code == 0
if have_docker then
  local function api(method, path, body)
    local res = http.request({
      url = 'http://docker' .. path, method = method, unix_socket = SOCKET, timeout_ms = 60000,
      headers = body and { ['Content-Type'] = 'application/json' } or nil,
      body = body and core.json.encode(body) or nil,
    })
    return res.status, res.body
  end
  -- what a client of the Engine API does for a container: create, start, remove (forced)
  local engine = bench.measure(N_DOCKER, function()
    local status, body = api('POST', '/containers/create', {
      Image = IMAGE, Cmd = { 'sleep', '60' }, Labels = { ['mayura.bench'] = '1' },
      HostConfig = { NetworkMode = 'none', AutoRemove = false },
    })
    assert(status == 201, 'create: HTTP ' .. tostring(status))
    local id = core.json.decode(body).Id
    status = api('POST', '/containers/' .. id .. '/start')
    assert(status == 204, 'start: HTTP ' .. tostring(status))
    status = api('DELETE', '/containers/' .. id .. '?force=true')
    assert(status == 204, 'remove: HTTP ' .. tostring(status))
  end)
  row('Engine API create+start+remove', engine)
  local dp = docker.docker_sandboxes({ image = IMAGE, engine = 'api' })
  local dpool = sandbox.create_sandboxes(dp, { max_sandboxes = MANY_DOCKER + 4, max_lifetime_ms = 600000 })
  local dcold = bench.measure(N_DOCKER, function() dpool:create({ lifetime_ms = 60000 }):release() end)
  row('docker cold create+release (api)', dcold)
  local dcold_create = bench.measure(N_DOCKER, function()
    local s = dpool:create({ lifetime_ms = 60000 })
    task.spawn(function() s:release() end)
  end)
  row('docker cold create (api, release not timed)', dcold_create)
  local target = dpool:create({ lifetime_ms = 600000 })
  local dexec = bench.measure(N_DOCKER * 2, function()
    assert(process.run({ 'docker', 'exec', target._backend.container, 'true' }).exit_code == 0)
  end)
  row('docker exec true (CLI)', dexec)
  target:release()
  local dwp = docker.docker_sandboxes({ image = IMAGE, engine = 'api', warm = 2 })
  local dwpool = sandbox.create_sandboxes(dwp, { max_sandboxes = 8, max_lifetime_ms = 600000 })
  local dwarm = warm_creates(dwpool, dwp, N_DOCKER)
  row('docker warm create (api)', dwarm)
  dwpool:close()
  local dwall, dsbs = many(dpool, MANY_DOCKER)
  row(MANY_DOCKER .. ' docker creates at once (api, wall)', dwall)
  local dtasks = {}
  for i, s in ipairs(dsbs) do dtasks[i] = task.spawn(function() s:release() end) end
  for _, t in ipairs(dtasks) do t:wait() end
  dpool:close()
  ratio('docker cold create+release / Engine API c+s+rm', dcold, engine, '<= 0.7x')
  ratio('docker warm create / docker exec true', dwarm, dexec, '<= 3x')
  ratio(MANY_DOCKER .. ' docker at once / one cold create', dwall, dcold_create, 'none set')
elseif N_DOCKER > 0 then
  print('(Docker not measured: no daemon or no ' .. IMAGE .. '; run scripts/docker-setup.sh)')
end

-- }======================================================

print(('%-48s %10s'):format('operation (median)', 'value'))
for _, r in ipairs(rows) do print(('%-48s %10.2f %s'):format(r[1], r[2], r[3])) end
print()
for _, r in ipairs(ratios) do print(r) end
