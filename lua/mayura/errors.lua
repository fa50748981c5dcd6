--- mayura.errors: coded error tables, the one error shape of the whole API.
--
-- An error is a table `{ code = 'LIMIT_EXCEEDED', message = '...' }` raised
-- with `error()`; a failure of a sandbox or its provider has
-- `code = 'SANDBOX_ERROR'` and a `reason` (`gone`, `timeout`, ...).
-- `tostring(err)` gives `CODE: message`. The metatable is shared with the C
-- core, so errors raised in C and in Lua look the same.
local core = require('mayura.core')

local M = {}

M.mt = core.error_mt

--- The codes of the public API (ARCHITECTURE.md, Errors). Reading an unknown one is an error, and so
-- is making an error with one, so a typo fails loudly where it is written.
M.codes = setmetatable({
  INVALID_INPUT = 'INVALID_INPUT',
  INVALID_CONFIG = 'INVALID_CONFIG',
  INVALID_OUTPUT = 'INVALID_OUTPUT',
  LIMIT_EXCEEDED = 'LIMIT_EXCEEDED',
  BUDGET_EXCEEDED = 'BUDGET_EXCEEDED',
  PERMISSION_DENIED = 'PERMISSION_DENIED',
  CANCELLED = 'CANCELLED',
  TIMEOUT = 'TIMEOUT',
  SANDBOX_ERROR = 'SANDBOX_ERROR',
  MODEL_ERROR = 'MODEL_ERROR',
  HOOK_FAILED = 'HOOK_FAILED',
  TOOL_ERROR = 'TOOL_ERROR',
  NOT_FOUND = 'NOT_FOUND',
  -- the C core's mechanism failures
  IO_ERROR = 'IO_ERROR',
  NETWORK_ERROR = 'NETWORK_ERROR',
  CONNECT_FAILED = 'CONNECT_FAILED',
  SPAWN_FAILED = 'SPAWN_FAILED',
  NO_MEMORY = 'NO_MEMORY',
  INTERNAL = 'INTERNAL',
}, { __index = function(_, k) error('unknown error code ' .. tostring(k), 2) end })

--- Makes an error table. `fields` (optional) adds fields such as `reason`; `cause` keeps what a
-- failure dropped (another error, a service's words) for logs, never for the message.
function M.new(code, message, fields)
  if type(code) ~= 'string' or rawget(M.codes, code) == nil then
    error('unknown error code ' .. tostring(code), 2)
  end
  local err = { code = code, message = message or code }
  if fields then
    for k, v in pairs(fields) do err[k] = v end
  end
  return setmetatable(err, M.mt)
end

--- Raises an error table at `level` (2 by default: the caller of the function that raises).
function M.raise(code, message, fields, level)
  if type(code) ~= 'string' or rawget(M.codes, code) == nil then
    error('unknown error code ' .. tostring(code), 2)
  end
  error(M.new(code, message, fields), level or 2)
end

--- A sandbox failure with its reason; `cause` (optional) is kept as the error's `cause`.
function M.sandbox(reason, message, cause)
  return M.new('SANDBOX_ERROR', message or reason, { reason = reason, cause = cause })
end

--- Whether `err` is a coded error, and of `code` when given.
function M.is(err, code)
  if type(err) ~= 'table' or type(err.code) ~= 'string' then return false end
  return code == nil or err.code == code
end

--- Turns anything raised into a coded error (a plain string becomes INTERNAL).
function M.wrap(err)
  if M.is(err) then
    if getmetatable(err) == nil then setmetatable(err, M.mt) end
    return err
  end
  return M.new('INTERNAL', tostring(err))
end

return M
