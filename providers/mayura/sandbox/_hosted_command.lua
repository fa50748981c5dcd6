--- mayura.sandbox._hosted_command: what the hosted providers built on command_sandbox_backend
-- share: their `workdir` and rate options, a create spec's `env` as JSON, and how long one backend
-- command may wait in the sandbox. Re-exported by mayura.sandbox._hosted.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')

local M = {}

local json = core.json

--- The `workdir` option of provider `label` (give it with its default): an absolute path of at most
-- 256 bytes, without NUL, newline, or a `.` or `..` part; returned without trailing slashes.
-- Raises INVALID_CONFIG at the provider's caller.
function M.workdir_option(workdir, label)
  if type(workdir) ~= 'string' or workdir:sub(1, 1) ~= '/' or #workdir > 256 or workdir:find('[%z\n]')
    or workdir:find('/%.%.?/') or workdir:find('/%.%.?$') then
    errors.raise('INVALID_CONFIG', label .. ': workdir must be an absolute path', nil, 3)
  end
  if #workdir > 1 then workdir = workdir:gsub('/+$', '') end
  return workdir
end

--- A create spec's `env` as a JSON object, or nil when it has no variable.
function M.env_object(env)
  if not env or not next(env) then return nil end
  local out = {}
  for k, v in pairs(env) do out[k] = v end
  return setmetatable(out, json.object_mt)
end

--- How long one backend command may wait in the sandbox for a command to end (command_sandbox_backend's
-- `transport.wait_ms`): 20 s, less where `limit_ms` (the service's own limit on one exec, if any) or
-- half the call timeout `call_timeout_ms` is less; a long command then costs a call every 20 s.
function M.wait_ms(call_timeout_ms, limit_ms)
  local w = math.min(20000, math.floor(call_timeout_ms / 2))
  if limit_ms then w = math.min(w, limit_ms) end
  return math.max(0, w)
end

--- A provider's rate option (`label` names it in errors, `name` the option): `{ per_second, burst }`
-- (per_second above 0, at most 1000; burst an integer from 1 to 1000), or `default` when not given.
function M.rate_option(v, label, name, default)
  if v == nil then return default end
  local C = 'INVALID_CONFIG'
  if type(v) ~= 'table' then errors.raise(C, label .. ': ' .. name .. ' must be { per_second, burst }', nil, 3) end
  check.keys(v, { per_second = true, burst = true }, label .. ' ' .. name, C, 4)
  local ps = v.per_second
  if type(ps) ~= 'number' or ps ~= ps or ps <= 0 or ps > 1000 then
    errors.raise(C, label .. ': ' .. name .. '.per_second must be a number above 0, at most 1000', nil, 3)
  end
  return { per_second = ps, burst = check.int(v.burst, name .. '.burst', 1, 1000, C, 4, 1) }
end

return M
