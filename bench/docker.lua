--- Benchmark of the Docker provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/docker.lua [N_EXEC] [N_CREATE]
--
-- Needs a Docker daemon and the test image (scripts/docker-setup.sh). Measures,
-- for both engines ('cli' and 'api'):
--   * create + release of a sandbox (a locked-down container with the agent), against
--     `docker run --rm` of `true` with the same lockdown from the CLI;
--   * exec of `true` in a sandbox (through the in-sandbox agent), against `docker exec`
--     from the CLI and a direct Engine API exec (create + start + inspect) made with
--     mayura.http over the daemon's unix socket, both into a running container.
local sandbox = require('mayura.sandbox')
local docker = require('mayura.sandbox.docker')
local process = require('mayura.process')
local http = require('mayura.http')
local core = require('mayura.core')

local N_EXEC = tonumber(arg and arg[1]) or 100
local N_CREATE = tonumber(arg and arg[2]) or 10
local IMAGE = 'mayura-test/busybox:1'
local SOCKET = '/var/run/docker.sock'
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')
local function measure(fn, n) return bench.measure(n, fn) end


local function cli(argv)
  local full = { 'docker' }
  for _, a in ipairs(argv) do full[#full + 1] = a end
  local r = process.run(full, { timeout_ms = 120000 })
  if r.exit_code ~= 0 then error('docker ' .. argv[1] .. ' failed: ' .. r.stderr, 0) end
  return r.stdout
end

if process.run({ 'docker', 'info' }, { timeout_ms = 30000 }).exit_code ~= 0 then
  error('no Docker daemon answers: run scripts/docker-setup.sh', 0)
end

local rows = {}
local function row(name, ms) rows[#rows + 1] = { name, ms } end

-- {======================================================
-- The provider, both engines
-- =======================================================

local m = {}
for _, engine in ipairs({ 'cli', 'api' }) do
  local pool = sandbox.create_sandboxes(docker.docker_sandboxes({ image = IMAGE, engine = engine }),
    { max_sandboxes = 4, max_lifetime_ms = 600000 })
  m['create_' .. engine] = measure(function() pool:create({ lifetime_ms = 60000 }):release() end, N_CREATE)
  row('mayura ' .. engine .. ': create + release', m['create_' .. engine])
  local sb = pool:create({ lifetime_ms = 600000 })
  m['agent_exec_' .. engine] = measure(function() assert(sb:exec({ 'true' }).exit_code == 0) end, N_EXEC)
  row('mayura ' .. engine .. ': exec true (agent)', m['agent_exec_' .. engine])
  pool:close()
end

-- }======================================================

-- {======================================================
-- Baselines straight from docker
-- =======================================================

local LOCKDOWN = { '--network', 'none', '--cap-drop', 'ALL', '--security-opt', 'no-new-privileges',
  '--user', '1000:1000', '--read-only', '--tmpfs', '/workspace:size=1073741824,uid=1000,gid=1000',
  '--tmpfs', '/tmp:size=268435456', '--memory', '1073741824', '--memory-swap', '1073741824', '--cpus', '1',
  '--pids-limit', '256', '--init=false', '--log-driver', 'none' }

local function run_args(extra)
  local a = { 'run', '--rm', '--pull', 'never' }
  for _, x in ipairs(LOCKDOWN) do a[#a + 1] = x end
  for _, x in ipairs(extra) do a[#a + 1] = x end
  return a
end

m.run_cli = measure(function() cli(run_args({ IMAGE, 'true' })) end, N_CREATE)
row('docker run --rm ... true (CLI)', m.run_cli)

local target = cli(run_args({ '--detach', IMAGE, 'sleep', '3600' })):match('(%x+)%s*$')
local ok, err = pcall(function()
  m.docker_exec_cli = measure(function() cli({ 'exec', target, 'true' }) end, math.min(N_EXEC, 50))
  row('docker exec true (CLI)', m.docker_exec_cli)

  local function api(method, path, body)
    local res = http.request({
      url = 'http://docker' .. path, method = method, unix_socket = SOCKET, timeout_ms = 60000,
      headers = body and { ['Content-Type'] = 'application/json' } or nil,
      body = body and core.json.encode(body) or nil,
    })
    return res.status, res.body
  end
  m.docker_exec_api = measure(function()
    local status, body = api('POST', '/containers/' .. target .. '/exec',
      { Cmd = { 'true' }, AttachStdout = true, AttachStderr = true })
    assert(status == 201, 'exec create: HTTP ' .. tostring(status))
    local id = core.json.decode(body).Id
    status = api('POST', '/exec/' .. id .. '/start', { Detach = false, Tty = false })
    assert(status == 200, 'exec start: HTTP ' .. tostring(status))
    status, body = api('GET', '/exec/' .. id .. '/json')
    assert(status == 200 and core.json.decode(body).ExitCode == 0, 'exec inspect')
  end, N_EXEC)
  row('Engine API exec true (create+start+inspect)', m.docker_exec_api)
end)
cli({ 'rm', '-f', target })
if not ok then error(err, 0) end

-- }======================================================

print(('%-46s %10s'):format('operation (median; exec n=' .. N_EXEC .. ', create n=' .. N_CREATE .. ')', 'ms'))
for _, r in ipairs(rows) do print(('%-46s %10.2f'):format(r[1], r[2])) end
print()
local function ratio(label, a, b) print(('%-46s %9.3fx'):format(label, a / b)) end
ratio('mayura cli create+release / docker run --rm', m.create_cli, m.run_cli)
ratio('mayura api create+release / docker run --rm', m.create_api, m.run_cli)
ratio('mayura cli exec / docker exec (CLI)', m.agent_exec_cli, m.docker_exec_cli)
ratio('mayura api exec / Engine API exec', m.agent_exec_api, m.docker_exec_api)
ratio('Engine API exec / docker exec (CLI)', m.docker_exec_api, m.docker_exec_cli)
