--- mayura.process: run a command on the host and wait for it.
--
-- A thin waiting layer over `core.spawn`: an argv (never a shell), with
-- `cwd`, `env`, `stdin`, `timeout_ms`, `max_output_bytes` and a cancel token
-- as `signal`. At a timeout or a cancel every process the command started is
-- stopped; a cancel then raises CANCELLED.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

local allowed = {
  cwd = true, env = true, stdin = true, timeout_ms = true, max_output_bytes = true,
  kill_grace_ms = true, signal = true,
}

--- Runs `argv` and returns `{ exit_code, signal, stdout, stderr, truncated, timed_out, duration_ms }`.
-- `exit_code` is nil when the command timed out or was ended by a signal.
function M.run(argv, opts)
  opts = opts or {}
  if type(opts) ~= 'table' then errors.raise('INVALID_INPUT', 'options must be a table') end
  for k in pairs(opts) do
    if not allowed[k] then errors.raise('INVALID_INPUT', "unknown option '" .. tostring(k) .. "'") end
  end
  local token = opts.signal
  if token ~= nil and not task.is_token(token) then
    errors.raise('INVALID_INPUT', "option 'signal' must be a cancel token")
  end
  if token and token.cancelled then errors.raise('CANCELLED', 'cancelled before it started') end
  local spec = {
    argv = argv, cwd = opts.cwd, env = opts.env, stdin = opts.stdin,
    timeout_ms = opts.timeout_ms, max_output_bytes = opts.max_output_bytes,
    kill_grace_ms = opts.kill_grace_ms,
  }
  local remove
  local res, err = task.await(function(done)
    local proc, spawn_err = core.spawn(spec, done)
    if not proc then return done(nil, spawn_err) end
    if token then remove = token:on_cancel(function() proc:cancel() end) end
  end)
  if remove then remove() end
  if not res then error(err, 2) end
  if res.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 2) end
  return res
end

return M
