--- Benchmark of the gVisor tier, not a test: the Docker provider with `runtime = 'runsc'` against the
-- daemon's default runtime (runc), medians and ratios measured in one run.
--
--   build/mayura bench/gvisor.lua [N_EXEC] [N_CREATE]
--
-- Needs a Docker daemon with the runtime runsc registered and the test image (scripts/docker-setup.sh
-- does both). Measures, for the default runtime and for runsc, through the Engine API:
--   * create + release of a sandbox (the container, its agent and the hello);
--   * exec of `true` (a fork and exec under the sandbox's kernel, through the agent);
--   * exec of a shell loop of 2,000 `:` and a `cat` of a 1 MiB file (system calls in the sandbox);
--   * write_file + read_file of 1 MiB (the agent's file calls).
local sandbox = require('mayura.sandbox')
local docker = require('mayura.sandbox.docker')
local process = require('mayura.process')

local N_EXEC = tonumber(arg and arg[1]) or 50
local N_CREATE = tonumber(arg and arg[2]) or 8
local IMAGE = 'mayura-test/busybox:1'
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local info = process.run({ 'docker', 'info', '--format', '{{json .Runtimes}}' }, { timeout_ms = 30000 })
if info.exit_code ~= 0 then error('no Docker daemon answers: run scripts/docker-setup.sh', 0) end
if not info.stdout:find('"runsc"', 1, true) then
  error('the daemon has no runtime runsc: run scripts/docker-setup.sh (as root, with runsc installable)', 0)
end

local MIB = string.rep('x', 1048576)
local m = {}
for _, tier in ipairs({ { 'runc', nil }, { 'runsc', 'runsc' } }) do
  local name = tier[1]
  local pool = sandbox.create_sandboxes(docker.docker_sandboxes({ image = IMAGE, engine = 'api', runtime = tier[2] }),
    { max_sandboxes = 4, max_lifetime_ms = 600000 })
  m['create_' .. name] = bench.measure(N_CREATE, function() pool:create({ lifetime_ms = 60000 }):release() end)
  local sb = pool:create({ lifetime_ms = 600000 })
  m['exec_' .. name] = bench.measure(N_EXEC, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
  sb:write_file('/workspace/mib', MIB)
  m['loop_' .. name] = bench.measure(math.max(5, math.floor(N_EXEC / 5)), function()
    local r = sb:exec({ 'sh', '-c', 'i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; cat /workspace/mib >/dev/null' })
    assert(r.exit_code == 0, r.stderr)
  end)
  m['files_' .. name] = bench.measure(math.max(5, math.floor(N_EXEC / 5)), function()
    sb:write_file('/workspace/f', MIB)
    assert(#sb:read_file('/workspace/f') == #MIB)
  end)
  pool:close()
end

print(('%-44s %10s %10s %8s'):format('operation (median ms; exec n=' .. N_EXEC .. ', create n=' .. N_CREATE .. ')',
  'runc', 'runsc', 'ratio'))
for _, r in ipairs({ { 'create + release', 'create' }, { 'exec true', 'exec' },
  { 'exec sh loop of 2,000 + cat 1 MiB', 'loop' }, { 'write_file + read_file 1 MiB', 'files' } }) do
  local a, b = m[r[2] .. '_runc'], m[r[2] .. '_runsc']
  print(('%-44s %10.2f %10.2f %7.2fx'):format(r[1], a, b, b / a))
end
