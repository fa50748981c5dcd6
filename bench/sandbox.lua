--- Benchmark of the local provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/sandbox.lua [N]
--
-- exec of `true` in a local sandbox against a C program's fork+exec+wait of `true`
-- (build/bench/forkexec, bench/forkexec.c, made by `make bench`: the target is 1.2x), against a
-- fork+exec of `true` on the host through core.spawn, against a one-shot `bwrap ... true`, and against `docker exec`
-- when a Docker daemon answers; create+release of a sandbox, with network 'none' and,
-- where the provider offers it, 'all' (its stack and firewall), without and with a port. What the
-- agent's syscall filter costs: exec of `true` in a sandbox of the agent against one of the agent
-- built without it (build/bench/mayura-agent-nofilter, made by `make bench`), turn by turn in the
-- same run.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local process = require('mayura.process')

local N = tonumber(arg and arg[1]) or 200
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')
local function measure(fn, n) return bench.measure(n or N, fn, 3) end


local provider = local_provider.local_sandboxes()
local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 600000 })
local sb = pool:create({ lifetime_ms = 600000 })

local results = {}
local function add(name, ms) results[#results + 1] = { name, ms } end

local host = measure(function() assert(process.run({ '/bin/true' }).exit_code == 0) end)
add('host fork+exec true (core.spawn)', host)
-- the C baseline and the sandbox's exec in turns of 50, so that both see the same machine
local FORKEXEC = 'build/bench/forkexec'
local c_ms, exec
do
  local fe = io.open(FORKEXEC, 'rb')
  if fe then fe:close() end
  local cs, es = {}, {}
  for _ = 1, math.max(1, math.floor(N / 50)) do
    if fe then cs[#cs + 1] = tonumber(process.run({ FORKEXEC, '50' }).stdout) end
    es[#es + 1] = measure(function() assert(sb:exec({ 'true' }).exit_code == 0) end, 50)
  end
  exec = bench.median(es)
  if fe then c_ms = bench.median(cs) end
end
if c_ms then add('C fork+exec+wait true (bench/forkexec.c)', c_ms) end
add('local sandbox exec true', exec)
local bwrap = measure(function()
  assert(process.run({ 'bwrap', '--ro-bind', '/', '/', '--unshare-all', '--die-with-parent', '/bin/true' })
    .exit_code == 0)
end, math.min(N, 100))
add('bwrap --unshare-all true (one-shot)', bwrap)
local cr = measure(function() pool:create({ lifetime_ms = 60000 }):release() end, math.min(N, 100))
add('local sandbox create+release', cr)
local cr_all, cr_port
if provider.features.network[2] == 'all' then
  local open = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000,
    network = { 'none', 'all' } })
  cr_all = measure(function() open:create({ lifetime_ms = 60000, network = 'all' }):release() end, math.min(N, 50))
  add("local sandbox create+release, network 'all'", cr_all)
  cr_port = measure(function()
    open:create({ lifetime_ms = 60000, network = 'all', ports = { 3000 } }):release()
  end, math.min(N, 50))
  add("local sandbox create+release, 'all' + 1 port", cr_port)
  open:close()
end

-- the syscall filter: the same exec with and without it, alternating, so both see the same machine
local filter_ratio, filter_p10
local NOFILTER = 'build/bench/mayura-agent-nofilter'
local nf = io.open(NOFILTER, 'rb')
if nf then
  nf:close()
  local uv = require('luv')
  local pool2 = sandbox.create_sandboxes(local_provider.local_sandboxes({ agent = NOFILTER }),
    { max_sandboxes = 1, max_lifetime_ms = 600000 })
  local plain = pool2:create({ lifetime_ms = 600000 })
  local with, without = {}, {}
  for i = 1, N + 3 do
    local t0 = uv.hrtime()
    assert(sb:exec({ 'true' }).exit_code == 0)
    local t1 = uv.hrtime()
    assert(plain:exec({ 'true' }).exit_code == 0)
    local t2 = uv.hrtime()
    if i > 3 then
      with[#with + 1] = (t1 - t0) / 1e6
      without[#without + 1] = (t2 - t1) / 1e6
    end
  end
  local w, wo = bench.median(with), bench.median(without)
  add('local sandbox exec true, syscall filter', w)
  add('local sandbox exec true, no syscall filter', wo)
  filter_ratio = w / wo
  -- the 10th percentiles too: less of what a loaded machine adds to either
  local k = math.max(1, math.floor(#with / 10))
  filter_p10 = with[k] / without[k]   -- bench.median sorted both
  plain:release()
  pool2:close()
end

local docker_ms
local probe = process.run({ 'sh', '-c', 'docker info >/dev/null 2>&1 && docker ps -q | head -1' })
local container = probe.exit_code == 0 and probe.stdout:match('%S+')
if container then
  docker_ms = measure(function() process.run({ 'docker', 'exec', container, 'true' }) end, math.min(N, 30))
  add('docker exec true (CLI, a running container)', docker_ms)
end
sb:release()
pool:close()

print(('%-46s %10s'):format('operation (median)', 'ms'))
for _, r in ipairs(results) do print(('%-46s %10.3f'):format(r[1], r[2])) end
print()
if c_ms then
  print(('sandbox exec / C fork+exec         %6.2fx   (target <= 1.2x)'):format(exec / c_ms))
else
  print('sandbox exec / C fork+exec         (not measured: ' .. FORKEXEC .. ' is missing, run make bench)')
end
print(('sandbox exec / host fork+exec      %6.2fx   (target <= 2x)'):format(exec / host))
print(('sandbox exec / bwrap one-shot      %6.3fx'):format(exec / bwrap))
if docker_ms then print(('sandbox exec / docker exec         %6.3fx'):format(exec / docker_ms)) end
print(('create+release median              %6.1f ms (target <= 30 ms)'):format(cr))
if cr_all then
  print(("create+release 'all' / 'none'       %6.2fx"):format(cr_all / cr))
  print(("create+release 'all'+port / 'none'  %6.2fx"):format(cr_port / cr))
end
if filter_ratio then
  print(('exec with / without syscall filter  %6.3fx   (target <= 1.05x; 10th percentiles %.3fx)')
    :format(filter_ratio, filter_p10))
else
  print('exec with / without syscall filter  (not measured: ' .. NOFILTER .. ' is missing, run make bench)')
end
