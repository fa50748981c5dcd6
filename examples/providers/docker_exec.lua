--- examples/providers/docker_exec.lua: a sandbox provider in one file, on command_sandbox_backend.
--
-- Each sandbox is a locked-down container that only sleeps: no network, uid 1000, no
-- capabilities, a read-only root with tmpfs /workspace and /tmp, limits on processes and memory,
-- ended by Docker itself at its lifetime. All the provider does with it is `docker exec`: one
-- short shell command in, its exit code and stdout out. That is the shape of a hosted service's
-- exec endpoint; command_sandbox_backend builds the rest on it (commands in the background,
-- polled, stopped by their tag; files as base64 in chunks; listings; removal). The command
-- travels on the exec's standard input (`sh -s`), so neither file contents nor environment
-- values ever appear on a host command line.
--
--   local docker_exec = dofile('examples/providers/docker_exec.lua')
--   local sandboxes = sandbox.create_sandboxes(docker_exec.docker_exec_sandboxes({ image = 'alpine:3' }),
--     { max_sandboxes = 2, max_lifetime_ms = 600000 })
local sandbox = require('mayura.sandbox')
local errors = require('mayura.errors')
local process = require('mayura.process')

local M = {}

local MIB = 1048576

-- Runs the docker CLI. Its failures become coded errors without docker's own text.
local function docker(argv, opts)
  local ok, r = pcall(process.run, argv, opts)
  if not ok then
    if errors.is(r, 'CANCELLED') then error(r, 0) end
    error(errors.sandbox('unavailable', 'the docker CLI could not be run'), 0)
  end
  if r.timed_out then error(errors.sandbox('timeout', 'docker did not answer in time'), 0) end
  return r
end

local function running(container)
  local r = docker({ 'docker', 'inspect', '-f', '{{.State.Running}}', container }, { timeout_ms = 30000 })
  return r.exit_code == 0 and r.stdout:match('^true') ~= nil
end

-- The transport: one `docker exec` per command, the command on its standard input.
local function transport(container, env)
  local t = { stdin = false, max_command_bytes = MIB, workdir = '/workspace', env = env }
  function t.run(_, command, o)
    local r = docker({ 'docker', 'exec', '-i', container, 'sh', '-s' },
      { stdin = command, signal = o.signal, timeout_ms = 60000, max_output_bytes = 4 * MIB })
    if r.exit_code ~= 0 and not running(container) then
      error(errors.sandbox('gone', 'the container is gone'), 0)
    end
    if r.truncated then error(errors.sandbox('failed', 'the command answered more than 4 MiB'), 0) end
    return { exit_code = r.exit_code or 128, stdout = r.stdout }
  end
  return t
end

--- The provider: `options.image` (default 'alpine:3'), never pulled.
function M.docker_exec_sandboxes(options)
  options = options or {}
  local image = options.image or 'alpine:3'
  local provider = {
    id = 'docker-exec',
    features = { stdin = true, ports = false, desktop = false, network = { 'none' } },
    workdir = '/workspace',
    max_lifetime_ms = 24 * 3600000,
  }

  function provider.create(_, spec)
    local argv = { 'docker', 'run', '-d', '--rm', '--init', '--pull', 'never', '--network', 'none',
      '--user', '1000:1000', '--cap-drop', 'ALL', '--security-opt', 'no-new-privileges', '--read-only',
      '--pids-limit', '256', '--memory', (spec.memory_mib or 512) .. 'm',
      '--tmpfs', '/tmp:rw,size=64m,mode=1777',
      '--tmpfs', '/workspace:rw,exec,size=256m,uid=1000,gid=1000,mode=0755', '--workdir', '/workspace',
      '--label', 'mayura.example=docker_exec' }
    if spec.cpus then
      argv[#argv + 1] = '--cpus'
      argv[#argv + 1] = tostring(spec.cpus)
    end
    argv[#argv + 1] = image
    argv[#argv + 1] = 'sleep'
    argv[#argv + 1] = tostring(math.ceil(spec.lifetime_ms / 1000))
    local r = docker(argv, { timeout_ms = 60000 })
    local id = r.exit_code == 0 and r.stdout:match('^(%x+)%s*$')
    if not id then error(errors.sandbox('unavailable', 'the container did not start'), 0) end
    local function release() docker({ 'docker', 'rm', '-f', id }, { timeout_ms = 30000 }) end
    local ok, backend = pcall(sandbox.command_sandbox_backend, 'docker-exec-' .. id:sub(1, 12),
      transport(id, spec.env), release)
    if not ok then
      pcall(release)
      error(backend, 0)
    end
    return backend
  end

  return provider
end

return M
