--- mayura.sandbox._hosted_wire: the pieces of a hosted provider's requests and answers that need
-- no client: untrusted JSON decoded, URL segments and queries, a lifetime in the service's unit,
-- labels as the service's metadata, Connect envelopes and the statuses of Connect's error codes,
-- and the caps of what is read of an answer. Re-exported by mayura.sandbox._hosted.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')

local M = {}

local json = core.json

M.MAX_ERROR_BODY = 65536        -- what is read of a failed answer, to find its code
M.CONNECT_TIMEOUT_CAP = 30000   -- the longest a request's connection may take

--- Decodes untrusted JSON: the value (json.null for `null`), or nil when it is not JSON.
function M.decode(text, max_depth)
  if type(text) ~= 'string' then return nil end
  local ok, v = pcall(json.decode, text, { max_depth = max_depth or 200 })
  if ok then return v end
  return nil
end

--- A path segment with every byte but `A-Z a-z 0-9 - . _ ~` percent-encoded,
-- so an id from a service cannot add segments (`..`, `/`) or a query.
function M.escape(s)
  if type(s) ~= 'string' and type(s) ~= 'number' then
    errors.raise('INVALID_INPUT', 'a URL segment must be a string', nil, 2)
  end
  s = tostring(s)
  if s == '' or s == '.' or s == '..' then
    errors.raise('INVALID_INPUT', 'a URL segment must not be empty, . or ..', nil, 2)
  end
  return (s:gsub('[^%w%-%._~]', function(c) return string.format('%%%02X', c:byte()) end))
end

--- `?k=v&...` from a table of strings, numbers and booleans (sorted by name;
-- a list value repeats its name), or '' when there is nothing.
function M.query(params)
  if params == nil then return '' end
  if type(params) ~= 'table' then errors.raise('INVALID_INPUT', 'query must be a table', nil, 2) end
  local names = {}
  for k in pairs(params) do
    if type(k) ~= 'string' or k == '' then errors.raise('INVALID_INPUT', 'query names must be strings', nil, 2) end
    names[#names + 1] = k
  end
  table.sort(names)
  local function enc(v)
    local t = type(v)
    if t ~= 'string' and t ~= 'number' and t ~= 'boolean' then
      errors.raise('INVALID_INPUT', 'query values must be strings, numbers or booleans', nil, 4)
    end
    return (tostring(v):gsub('[^%w%-%._~]', function(c) return string.format('%%%02X', c:byte()) end))
  end
  local parts = {}
  for _, k in ipairs(names) do
    local v = params[k]
    if type(v) == 'table' then
      for _, x in ipairs(v) do parts[#parts + 1] = enc(k) .. '=' .. enc(x) end
    else
      parts[#parts + 1] = enc(k) .. '=' .. enc(v)
    end
  end
  if #parts == 0 then return '' end
  return '?' .. table.concat(parts, '&')
end

local UNITS = { ms = 1, s = 1000, min = 60000 }

--- A lifetime in ms as the service counts it: `unit` 's' (default), 'ms' or
-- 'min', rounded up, at least `min` (1) and at most `max` (in that unit).
-- Returns the value and whether it was clamped to `max`.
function M.lifetime(lifetime_ms, opts)
  opts = opts or {}
  check.int(lifetime_ms, 'lifetime_ms', 1, nil, 'INVALID_INPUT', 2)
  local unit = opts.unit or 's'
  local per = UNITS[unit]
  if not per then errors.raise('INVALID_INPUT', "unit must be 'ms', 's' or 'min'", nil, 2) end
  local v = math.floor(lifetime_ms / per)
  if v * per < lifetime_ms then v = v + 1 end
  local lo = opts.min or 1
  if v < lo then v = lo end
  if opts.max and v > opts.max then return opts.max, true end
  return v, false
end

--- Labels as the service's metadata: a JSON object of strings. `limits` =
-- { max_keys, max_key_bytes, max_value_bytes, key_pattern, value_pattern }
-- (defaults 64, 63, 256, any, any). Labels that do not fit are refused with
-- INVALID_INPUT rather than dropped.
function M.metadata(labels, limits)
  limits = limits or {}
  local out = setmetatable({}, json.object_mt)
  if labels == nil then return out end
  if type(labels) ~= 'table' then errors.raise('INVALID_INPUT', 'labels must be a table of strings', nil, 2) end
  local max_keys = limits.max_keys or 64
  local max_key = limits.max_key_bytes or 63
  local max_value = limits.max_value_bytes or 256
  local n = 0
  for k, v in pairs(labels) do
    if type(k) ~= 'string' or type(v) ~= 'string' then
      errors.raise('INVALID_INPUT', 'labels must map strings to strings', nil, 2)
    end
    if k == '' or #k > max_key or (limits.key_pattern and not k:match(limits.key_pattern)) then
      errors.raise('INVALID_INPUT', 'the service does not take a label named ' .. string.format('%q', k:sub(1, 64)),
        nil, 2)
    end
    if #v > max_value or (limits.value_pattern and not v:match(limits.value_pattern)) then
      errors.raise('INVALID_INPUT', 'the service does not take the value of label ' .. string.format('%q', k), nil, 2)
    end
    n = n + 1
    out[k] = v
  end
  if n > max_keys then errors.raise('INVALID_INPUT', 'the service takes at most ' .. max_keys .. ' labels', nil, 2) end
  return out
end

--- One Connect envelope: flags (0, or 0x02 for the end of the stream), the
-- 4-byte big-endian length, then `text`.
function M.connect_envelope(text, end_stream)
  local n = #text
  local b = { end_stream and 2 or 0, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256 }
  return string.char(b[1], b[2], b[3], b[4], b[5]) .. text
end

local CONNECT_STATUS = {
  invalid_argument = 400, failed_precondition = 400, out_of_range = 400, unauthenticated = 401,
  permission_denied = 403, not_found = 404, already_exists = 409, aborted = 409, resource_exhausted = 429,
  canceled = 499, unknown = 500, internal = 500, data_loss = 500, unimplemented = 501, unavailable = 503,
  deadline_exceeded = 504,
}

--- The HTTP status of a Connect error code (500 for an unknown one).
function M.connect_status(code)
  return CONNECT_STATUS[code] or 500
end

--- A path without its query, to name a call in a message.
function M.path_only(path)
  return (path:match('^[^?]*'))
end

return M
