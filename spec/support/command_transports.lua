--- Transports for mayura.sandbox.command built on the local provider: each command
-- runs as `<shell> -c command` through a local sandbox's exec, so the command
-- backend is tested against a real sandbox (namespaces, the agent as PID 1).
--
--   local t = transports.local_exec(sb, { stdin = true, max_command_bytes = 65536 })
--   local t = transports.local_exec(sb, { stdin = false, max_command_bytes = 4096,
--     shell = { '/usr/bin/busybox', 'sh' } })       -- BusyBox sh and its applets
--   local provider = transports.command_provider({ stdin = false, max_command_bytes = 4096 })
--
-- `opts.max_output_bytes` is declared to the backend (as transport.max_output_bytes); with
-- `opts.cut_at` every answer is cut at that many bytes, whatever was declared (a transport that
-- cuts silently). `opts.pool_options` are the options of the pool of local sandboxes under it
-- (default: max_output_bytes 4 MiB; `{}` gives the pool's defaults, 1 MiB of output).
--
-- `opts.wait_ms`, `opts.direct_ms` and `opts.rate` are declared as given (a call given `wait_ms`
-- may take that much longer). A transport keeps `calls` (and `times`, when
-- each call began), `longest` (the longest command it was given) and `longest_answer`, and
-- refuses a command longer than it declared or standard input it does not take
-- (with a plain error, which the backend turns into SANDBOX_ERROR `failed`). Setting
-- `transport.mangle = function(command) return result end` makes it answer that
-- instead of running anything (a sandbox that lies).
local core = require('mayura.core')
local errors = require('mayura.errors')
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')

local M = {}

local MIB = 1048576

function M.local_exec(sb, opts)
  local shell = opts.shell or { 'sh' }
  local t = { stdin = opts.stdin == true, max_command_bytes = opts.max_command_bytes or 65536, calls = 0,
    longest = 0, longest_answer = 0, max_output_bytes = opts.max_output_bytes, wait_ms = opts.wait_ms,
    direct_ms = opts.direct_ms, rate = opts.rate, times = {} }
  function t.run(self, command, o)
    self.calls = self.calls + 1
    self.times[#self.times + 1] = core.hrtime_ms()
    if #command > self.longest then self.longest = #command end
    if #command > self.max_command_bytes then error('the command is longer than the transport takes') end
    if o.stdin ~= nil and not self.stdin then error('this transport takes no standard input') end
    if self.mangle then return self.mangle(command) end
    local argv = {}
    for i, a in ipairs(shell) do argv[i] = a end
    argv[#argv + 1] = '-c'
    argv[#argv + 1] = command
    local r = sb:exec(argv, { stdin = o.stdin, signal = o.signal, timeout_ms = 30000 + (o.wait_ms or 0) })
    if r.timed_out then error(errors.sandbox('timeout', 'the transport\'s command timed out')) end
    local out = r.stdout
    if opts.cut_at and #out > opts.cut_at then out = out:sub(1, opts.cut_at) end
    if #out > self.longest_answer then self.longest_answer = #out end
    return { exit_code = r.exit_code, stdout = out }
  end
  return t
end

--- A provider whose sandboxes are command backends over local sandboxes; `opts` as for
-- local_exec, plus `local_options` for local_sandboxes. `provider.transports` lists the
-- transports made, in order.
function M.command_provider(opts)
  local inner = local_provider.local_sandboxes(opts.local_options or { memory_mib = 256, pids = 128 })
  local po = { max_sandboxes = 16, max_lifetime_ms = 3600000, max_output_bytes = 4 * MIB }
  if opts.pool_options then
    po.max_output_bytes = nil
    for k, v in pairs(opts.pool_options) do po[k] = v end
  end
  local pool = sandbox.create_sandboxes(inner, po)
  local provider = {
    id = 'command-local',
    features = { stdin = true, ports = false, desktop = false, network = { 'none' } },
    workdir = '/workspace',
    max_lifetime_ms = 3600000,
    transports = {},
    pool = pool,
  }
  function provider.create(_, spec)
    local sb = pool:create({ lifetime_ms = spec.lifetime_ms, env = spec.env })
    local t = M.local_exec(sb, opts)
    provider.transports[#provider.transports + 1] = t
    local ok, backend = pcall(sandbox.command_sandbox_backend, 'command-' .. sb.id, t, function() sb:release() end)
    if not ok then
      sb:release()
      error(backend, 0)
    end
    backend.inner = sb
    return backend
  end
  return provider
end

return M
