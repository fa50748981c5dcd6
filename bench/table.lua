--- One benchmark table, not a test: provider x operation, medians, and ratios to baselines
-- measured in the same run.
--
--   build/mayura bench/table.lua [SCALE]
--
-- Providers: local, and Docker through both engines when a daemon answers (scripts/docker-setup.sh).
-- Baselines: a host fork+exec of `true` (core.spawn), a one-shot `bwrap ... true`, `docker exec`
-- from the CLI and a direct Engine API exec (create + start + inspect) over the daemon's socket.
-- Memory: RSS of this process holding 100 idle local sandboxes, and its RSS growth while a
-- command in a sandbox prints 1 GiB. SCALE (default 1) multiplies the repetitions.
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local process = require('mayura.process')
local http = require('mayura.http')
local core = require('mayura.core')

local SCALE = tonumber(arg and arg[1]) or 1
local MIB = 1048576
local IMAGE = 'mayura-test/busybox:1'
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')
local function measure(n, fn) return bench.measure(n * SCALE, fn, 1) end


local function rss_kib()
  local f = assert(io.open('/proc/self/status'))
  local s = f:read('a')
  f:close()
  return tonumber(s:match('VmRSS:%s*(%d+)'))
end

-- Runs fn(i) for i = 1..n as tasks at once and waits for all.
local function all_at_once(n, fn)
  local tasks = {}
  for i = 1, n do tasks[i] = mayura.run(function() return fn(i) end) end
  local out = {}
  for i = 1, n do out[i] = tasks[i]:wait() end
  return out
end

-- {======================================================
-- Providers
-- =======================================================

local docker_up = process.run({ 'docker', 'info' }, { timeout_ms = 30000 }).exit_code == 0
local providers = { { name = 'local', make = function() return local_provider.local_sandboxes() end, scale = 1 } }
if docker_up then
  local docker = require('mayura.sandbox.docker')
  for _, engine in ipairs({ 'cli', 'api' }) do
    providers[#providers + 1] = {
      name = 'docker ' .. engine, scale = 0.25,
      make = function() return docker.docker_sandboxes({ image = IMAGE, engine = engine }) end,
    }
  end
end

local OPS = {
  'create+release', 'exec true', 'exec, 1 MiB of output', 'write 1 MiB', 'read 1 MiB',
  'write 16 MiB', 'read 16 MiB', '32 concurrent execs (batch)', '50 sandboxes at once (batch)',
}

local results = {}
local one_mib, sixteen_mib = string.rep('m', MIB), string.rep('s', 16 * MIB)

for _, p in ipairs(providers) do
  local r = {}
  results[p.name] = r
  local pool = sandbox.create_sandboxes(p.make(), { max_sandboxes = 60, max_lifetime_ms = 3600000 })
  local k = p.scale
  r['create+release'] = measure(20 * k, function() pool:create({ lifetime_ms = 600000 }):release() end)
  local sb = pool:create({ lifetime_ms = 3600000 })
  r['exec true'] = measure(100 * k, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
  r['exec, 1 MiB of output'] = measure(20 * k, function()
    assert(#sb:exec({ 'head', '-c', tostring(MIB), '/dev/zero' }).stdout == MIB)
  end)
  r['write 1 MiB'] = measure(20 * k, function() sb:write_file('bench/one.bin', one_mib) end)
  r['read 1 MiB'] = measure(20 * k, function() assert(#sb:read_file('bench/one.bin') == MIB) end)
  r['write 16 MiB'] = measure(5 * k, function() sb:write_file('bench/sixteen.bin', sixteen_mib) end)
  r['read 16 MiB'] = measure(5 * k, function() assert(#sb:read_file('bench/sixteen.bin') == 16 * MIB) end)
  r['32 concurrent execs (batch)'] = measure(5 * k, function()
    all_at_once(32, function() return sb:exec({ 'true' }).exit_code end)
  end)
  sb:release()
  r['50 sandboxes at once (batch)'] = measure(1, function()
    local made = all_at_once(50, function() return pool:create({ lifetime_ms = 600000 }) end)
    all_at_once(50, function(i) made[i]:release() end)
  end)
  pool:close()
end

-- }======================================================

-- {======================================================
-- Baselines
-- =======================================================

local base = {}
base.fork = measure(100, function() assert(process.run({ '/bin/true' }).exit_code == 0) end)
base.bwrap = measure(50, function()
  assert(process.run({ 'bwrap', '--ro-bind', '/', '/', '--unshare-all', '--die-with-parent', '/bin/true' })
    .exit_code == 0)
end)
if docker_up then
  local started = process.run({ 'docker', 'run', '--rm', '--detach', '--pull', 'never', '--network', 'none',
    IMAGE, 'sleep', '3600' }, { timeout_ms = 120000 })
  local target = started.stdout:match('(%x+)%s*$')
  if target then
    base.docker_exec = measure(30, function() process.run({ 'docker', 'exec', target, 'true' }) end)
    local function api(method, path, body)
      local res = http.request({
        url = 'http://docker' .. path, method = method, unix_socket = '/var/run/docker.sock', timeout_ms = 60000,
        headers = body and { ['Content-Type'] = 'application/json' } or nil,
        body = body and core.json.encode(body) or nil,
      })
      return res.status, res.body
    end
    base.api_exec = measure(30, function()
      local _, body = api('POST', '/containers/' .. target .. '/exec', { Cmd = { 'true' }, AttachStdout = true })
      local id = core.json.decode(body).Id
      api('POST', '/exec/' .. id .. '/start', { Detach = false, Tty = false })
      api('GET', '/exec/' .. id .. '/json')
    end)
    process.run({ 'docker', 'rm', '-f', target })
  end
end

-- }======================================================

-- {======================================================
-- Memory
-- =======================================================

local mem = {}
do
  local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(),
    { max_sandboxes = 110, max_lifetime_ms = 600000 })
  collectgarbage()
  local before = rss_kib()
  local held = all_at_once(100, function() return pool:create({ lifetime_ms = 600000 }) end)
  collectgarbage()
  mem.idle100 = (rss_kib() - before) / 1024
  mem.total100 = rss_kib() / 1024
  local sb = held[1]
  before = rss_kib()
  local r = sb:exec({ 'head', '-c', tostring(1024 * MIB), '/dev/zero' })
  assert(r.truncated)
  mem.flood = (rss_kib() - before) / 1024
  pool:close()
end

-- }======================================================

local names = {}
for _, p in ipairs(providers) do names[#names + 1] = p.name end
local header = ('%-32s'):format('operation (median ms)')
for _, n in ipairs(names) do header = header .. ('%14s'):format(n) end
print(header)
for _, op in ipairs(OPS) do
  local line = ('%-32s'):format(op)
  for _, n in ipairs(names) do line = line .. ('%14.2f'):format(results[n][op]) end
  print(line)
end
print()
print(('%-44s %10.2f ms'):format('baseline: host fork+exec true', base.fork))
print(('%-44s %10.2f ms'):format('baseline: bwrap ... true (one-shot)', base.bwrap))
if base.docker_exec then print(('%-44s %10.2f ms'):format('baseline: docker exec true (CLI)', base.docker_exec)) end
if base.api_exec then print(('%-44s %10.2f ms'):format('baseline: Engine API exec true', base.api_exec)) end
print()
local function ratio(label, a, b) if a and b then print(('%-44s %10.3fx'):format(label, a / b)) end end
for _, n in ipairs(names) do
  ratio(n .. ' exec true / host fork+exec', results[n]['exec true'], base.fork)
  ratio(n .. ' exec true / bwrap one-shot', results[n]['exec true'], base.bwrap)
  ratio(n .. ' exec true / docker exec', results[n]['exec true'], base.docker_exec)
  ratio(n .. ' exec true / Engine API exec', results[n]['exec true'], base.api_exec)
end
print()
print(('%-44s %10.1f MiB (this process: %.1f MiB)'):format('RSS growth holding 100 idle local sandboxes',
  mem.idle100, mem.total100))
print(('%-44s %10.1f MiB'):format('RSS growth while a command prints 1 GiB', mem.flood))
