--- mayura.http: HTTP requests on the shared loop, for providers and model adapters.
--
-- `request(opts)` waits for `core.http.request` (libcurl's multi interface
-- driven by the loop) and returns `{ status, headers, trailers, body }`, or raises a
-- coded error: TIMEOUT, CANCELLED, CONNECT_FAILED, NETWORK_ERROR,
-- LIMIT_EXCEEDED or INVALID_INPUT. `opts.signal` takes a cancel token.
--
-- What every client that retries shares (the model adapters and the hosted
-- sandbox kit): `retry_after_ms(headers)` reads the wait a server asks for,
-- `backoff_ms(base, n, cap)` is the wait when it names none, and
-- `pause(ms, signal)` waits without blocking the loop, ending early when the
-- cancel token is cancelled. `plain_token(s, secret)` says whether a code
-- from an error body may be shown.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

--- Makes a request: `{ url, method, headers, body, timeout_ms, connect_timeout_ms,
-- unix_socket, on_data, on_headers, max_body_bytes, http_version ('1.1' or '2'), ca_file (or ca_pem,
-- the PEM text), client_cert, client_key, signal }`.
function M.request(opts)
  if type(opts) ~= 'table' then errors.raise('INVALID_INPUT', 'request expects an options table') end
  local token = opts.signal
  if token ~= nil and not task.is_token(token) then
    errors.raise('INVALID_INPUT', 'signal must be a cancel token')
  end
  if token and token.cancelled then errors.raise('CANCELLED', 'cancelled before it started') end
  local spec = {}
  for k, v in pairs(opts) do if k ~= 'signal' then spec[k] = v end end
  local remove
  local res, err = task.await(function(done)
    local handle = core.http.request(spec, done)
    if token then remove = token:on_cancel(function() handle:cancel() end) end
  end)
  if remove then remove() end
  if not res then error(err, 2) end
  return res
end

--- Whether `s` is a short plain token (a letter, then letters, digits, `_ . -`;
-- at most 48 bytes) that neither holds `secret` nor is a piece of it: a
-- service's error code that may be shown without showing the service's text.
function M.plain_token(s, secret)
  if type(s) ~= 'string' or #s > 48 or not s:match('^%a[%w_%.%-]*$') then return false end
  if type(secret) == 'string' and secret ~= '' then
    if s:find(secret, 1, true) or (#s >= 8 and secret:find(s, 1, true)) then return false end
  end
  return true
end

-- {======================================================
-- Waiting between attempts
-- =======================================================

local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6, Jul = 7, Aug = 8, Sep = 9, Oct = 10,
  Nov = 11, Dec = 12 }

--- Days from 1970-01-01 to the given date of the proleptic Gregorian calendar.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
M.days_from_civil = days_from_civil

--- Seconds since the epoch of an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`), or nil.
function M.http_date(s)
  if type(s) ~= 'string' then return nil end
  local d, mon, y, hh, mm, ss = s:match('^%a%a%a, (%d%d?) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$')
  local m = mon and MONTHS[mon]
  if not m then return nil end
  d, y, hh, mm, ss = tonumber(d), tonumber(y), tonumber(hh), tonumber(mm), tonumber(ss)
  if d < 1 or d > 31 or hh > 23 or mm > 59 or ss > 60 then return nil end
  return days_from_civil(y, m, d) * 86400 + hh * 3600 + mm * 60 + ss
end

--- The wait the server asks for, in ms: `retry-after-ms`, else `retry-after`
-- (seconds or an HTTP date, against `now_s`, the epoch seconds, os.time() by
-- default). Nil when neither is there or readable.
function M.retry_after_ms(headers, now_s)
  if type(headers) ~= 'table' then return nil end
  local ms = tonumber(headers['retry-after-ms'] or '')
  if ms and ms == ms and ms >= 0 and ms < math.huge then return math.floor(ms) end
  local v = headers['retry-after']
  if type(v) ~= 'string' then return nil end
  local s = v:match('^%s*(%d+%.?%d*)%s*$')
  if s then return math.floor(tonumber(s) * 1000) end
  local t = M.http_date(v:match('^%s*(.-)%s*$'))
  if t then return math.max(0, (t - (now_s or os.time())) * 1000) end
  return nil
end

--- The delay before attempt `n + 1` (n from 0) when the server named none:
-- `min(base * 2^n, cap)` (cap 8 s by default) times a jitter in [0.75, 1].
function M.backoff_ms(base, n, cap)
  local d = math.min(base * 2 ^ n, cap or 8000)
  return math.floor(d * (0.75 + 0.25 * math.random()))
end

--- Waits `ms` without blocking the loop; a cancelled `signal` (a cancel
-- token) ends the wait at once. Returns false when it was cancelled.
function M.pause(ms, signal)
  local ok, err = pcall(task.sleep, ms, signal)
  if ok then return true end
  if errors.is(err, 'CANCELLED') then return false end
  error(err, 0)
end

-- }======================================================

return M
