--- mayura._check: argument checks at the public boundary, and Lua 5.4/LuaJIT compat.
--
-- Every check raises a coded error (INVALID_INPUT unless told otherwise) at
-- the given level, so the error points at the caller's line.
local errors = require('mayura.errors')

local M = {}

M.unpack = table.unpack or unpack  -- luacheck: ignore 143

--- Whether `v` is an integer (a whole number within 2^53 on LuaJIT).
function M.is_int(v)
  if type(v) ~= 'number' then return false end
  if math.type then return math.type(v) == 'integer' or (v == math.floor(v) and v >= -2^53 and v <= 2^53) end
  return v == math.floor(v) and v >= -2^53 and v <= 2^53
end

--- Refuses keys of `t` not in `allowed` (a set).
function M.keys(t, allowed, what, code, level)
  if type(t) ~= 'table' then
    errors.raise(code or 'INVALID_INPUT', (what or 'options') .. ' must be a table', nil, (level or 2) + 1)
  end
  for k in pairs(t) do
    if not allowed[k] then
      errors.raise(code or 'INVALID_INPUT', 'unknown option ' .. tostring(k) .. ' in ' .. (what or 'options'), nil,
        (level or 2) + 1)
    end
  end
end

--- Checks an integer in [lo, hi] (either may be nil); returns it, or `default` when `v` is nil and one is given.
function M.int(v, name, lo, hi, code, level, default)
  if v == nil and default ~= nil then return default end
  code = code or 'INVALID_INPUT'
  level = (level or 2) + 1
  if not M.is_int(v) then errors.raise(code, name .. ' must be a whole number', nil, level) end
  if lo and v < lo then errors.raise(code, name .. ' must be at least ' .. lo, nil, level) end
  if hi and v > hi then errors.raise(code, name .. ' must be at most ' .. hi, nil, level) end
  return math.tointeger and math.tointeger(v) or v
end

--- Checks an optional word option: nil, or a string of 1 to 256 bytes matching `pattern` (returned);
-- anything else raises `message`.
function M.word(v, pattern, message, code, level)
  if v == nil then return nil end
  if type(v) ~= 'string' or v == '' or #v > 256 or not v:match(pattern) then
    errors.raise(code or 'INVALID_INPUT', message, nil, (level or 2) + 1)
  end
  return v
end

return M
