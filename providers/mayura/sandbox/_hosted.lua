--- mayura.sandbox._hosted: what the providers of hosted sandbox services share.
--
-- A provider for a hosted service (E2B, Daytona, Vercel, Fly, ...) talks
-- JSON over HTTPS to the service's API and reads its streamed answers. The
-- kit does that part once, through `mayura.http` (libcurl on the loop):
--
--   local hosted = require('mayura.sandbox._hosted')
--   local client = hosted.client({
--     label = 'e2b',                    -- names the service in our messages
--     base_url = 'https://api.e2b.app',
--     api_key = key,                    -- sent in a header, never in a URL or a message
--     auth_header = 'X-API-Key',        -- default 'Authorization' (with auth_prefix 'Bearer ')
--     call_timeout_ms = 120000,         -- a whole call, retries and waits included
--     retries = 2,
--   })
--
-- A service signed with AWS Signature V4 (AgentCore) gives `aws_sigv4 =
-- 'aws:amz:<region>:<service>'` and `aws_credentials = { access_key_id,
-- secret_access_key, session_token }` instead of `api_key`: libcurl signs
-- each request itself (CURLOPT_AWS_SIGV4), the session token travels in
-- X-Amz-Security-Token, and all three are secrets of the client.
-- `http_version = '2'` makes every request of the client HTTP/2 (with prior
-- knowledge to an http:// base URL, by ALPN over TLS), for a service that
-- speaks nothing else; '1.1' keeps it to HTTP/1.1. `ca_file` (a PEM file of the
-- authorities to trust instead of the system's) or `ca_pem` (that PEM text), and `client_cert` with
-- `client_key` (PEM files: TLS client authentication) are absolute paths.
--   local body, res = client:json('POST', '/sandboxes', { templateID = 'base' })
--   client:json('GET', '/sandboxes/' .. hosted.escape(id), nil, { gone = true })
--   client:stream('POST', '/process.Process/Start', msg, { format = 'connect', on_event = fn })
--
-- What a call promises:
--   * every request names mayura and its version (`User-Agent: mayura/<core.version>`,
--     `M.USER_AGENT`; a WebSocket handshake of a provider sends it too);
--   * the API key travels only in the auth header; no error message, field or
--     log line carries it (messages are ours; any secret is scrubbed from
--     them once more before they are raised);
--   * a service's own error text never reaches the caller: a non-2xx answer
--     is `sandbox_http_failure(status)` with our message naming the call, its
--     `status`, and `provider_code` when the body has a short plain code
--     (`error_code`, `code`, `error.code`, `type`) that is not the key;
--   * 429, 502, 503 and 504 are tried again up to `retries` times, as is a
--     connection that could not be made; a connection cut midway only for an
--     idempotent call (GET, HEAD, PUT, DELETE, OPTIONS, or `idempotent =
--     true`). The wait is the server's `retry-after` (seconds or an HTTP
--     date) or `retry-after-ms`, else `min(retry_base_ms * 2^n, 8 s)` with
--     jitter. A wait the server asks for that is above `max_retry_after_ms`,
--     or that would pass the call's deadline, is not waited: the error is
--     raised at once with `retry_after_ms` on it;
--   * every call ends within its `timeout_ms` (the client's
--     `call_timeout_ms` by default): the deadline covers every attempt and
--     every wait, and no answer in time is SANDBOX_ERROR `timeout`;
--   * `gone = true` says the call is about a sandbox that existed: then 404
--     and 410 mean SANDBOX_ERROR `gone` (a list of statuses may be given;
--     a status it names is never tried again, even 502 or 503);
--   * a 2xx body that is not JSON, a stream that breaks its format, or a
--     message above the size caps is SANDBOX_ERROR `failed`; no connection
--     is `unavailable`; a cancelled `signal` is CANCELLED.
--
-- Streams (`client:stream`) read Connect envelopes, NDJSON, SSE or AWS event-stream through
-- `core.stream_parser` as bytes arrive. `on_event(value)` gets each message
-- (the decoded JSON for 'connect' and 'ndjson', `{ event, data, id }` for
-- 'sse', `{ data, headers, message_type, event }` for 'eventstream'), is called
-- from the loop and must not wait; returning false ends
-- the stream early, raising ends it with that error. A Connect stream must
-- end with its end-of-stream envelope; an error in it is mapped like an HTTP
-- status (`connect_status`). A stream is retried only before its first byte.
--
-- Helpers: `lifetime(ms, { unit, min, max })` (a lifetime in the service's
-- unit, rounded up and clamped), `metadata(labels, limits)` (labels as the
-- service's string map), `escape(segment)` and `query(params)` for URLs,
-- `connect_envelope(text, end_stream)` and `connect_status(code)`.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local http = require('mayura.http')
local sandbox = require('mayura.sandbox')

local M = {}

local json = core.json
local MIB = 1048576

--- What every request of a hosted provider says it is: mayura and its version.
M.USER_AGENT = 'mayura/' .. tostring(core.version or '0')

M.GONE_STATUSES = { 404, 410 }
M.RETRY_STATUSES = { 429, 502, 503, 504 }
local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true }
local FORMATS = { connect = true, ndjson = true, sse = true, eventstream = true }
local MAX_ERROR_BODY = 65536        -- what is read of a failed answer, to find its code
local CONNECT_TIMEOUT_CAP = 30000

--- Decodes untrusted JSON: the value (json.null for `null`), or nil when it is not JSON.
function M.decode(text, max_depth)
  if type(text) ~= 'string' then return nil end
  local ok, v = pcall(json.decode, text, { max_depth = max_depth or 200 })
  if ok then return v end
  return nil
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list or {}) do s[v] = true end
  return s
end

-- {======================================================
-- Helpers
-- =======================================================

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

-- }======================================================

-- {======================================================
-- The client
-- =======================================================

local Client = {}
Client.__index = Client

local client_keys = {
  label = true, base_url = true, api_key = true, auth_header = true, auth_prefix = true, headers = true,
  call_timeout_ms = true, retries = true, retry_base_ms = true, max_retry_after_ms = true,
  max_response_bytes = true, max_message_bytes = true, secrets = true, aws_sigv4 = true, aws_credentials = true,
  http_version = true, ca_file = true, ca_pem = true, client_cert = true, client_key = true,
}

local function check_headers(h, what, level)
  if h == nil then return {} end
  if type(h) ~= 'table' then errors.raise('INVALID_CONFIG', what .. ' must be a table', nil, level) end
  local out = {}
  for k, v in pairs(h) do
    if type(k) ~= 'string' or not k:match('^[%w!#$%%&\'*+%-.^_`|~]+$') or type(v) ~= 'string' or v:find('[%c]') then
      errors.raise('INVALID_CONFIG', what .. ' must map header names to values without control characters', nil, level)
    end
    out[k] = v
  end
  return out
end

--- A client for one service: see the module header for the options.
function M.client(options)
  local C = 'INVALID_CONFIG'
  if type(options) ~= 'table' then errors.raise(C, 'the hosted client needs an options table', nil, 2) end
  check.keys(options, client_keys, 'hosted client options', C, 3)
  local label = options.label or 'hosted'
  if type(label) ~= 'string' or not label:match('^[%w_%.%-]+$') or #label > 64 then
    errors.raise(C, 'label must be a short name', nil, 2)
  end
  local base = options.base_url
  if type(base) ~= 'string' or not base:match('^https?://[^%s]+$') or base:find('%c') then
    errors.raise(C, label .. ': base_url must be an http:// or https:// URL', nil, 2)
  end
  -- credentials go in a header, never in the URL (where logs and errors would show them)
  if base:match('^https?://[^/]*@') then errors.raise(C, label .. ': base_url must not hold credentials', nil, 2) end
  base = base:gsub('/+$', '')
  local key = options.api_key
  if key ~= nil then
    if type(key) ~= 'string' or key == '' or #key > 4096 or key:find('[%c ]') then
      errors.raise(C, label .. ': api_key must be a non-empty string without spaces or control characters', nil, 2)
    end
  end
  local auth_header = options.auth_header or 'Authorization'
  if type(auth_header) ~= 'string' or not auth_header:match('^[%w%-_]+$') then
    errors.raise(C, label .. ': auth_header must be a header name', nil, 2)
  end
  local prefix = options.auth_prefix
  if prefix == nil then prefix = auth_header:lower() == 'authorization' and 'Bearer ' or '' end
  if type(prefix) ~= 'string' or prefix:find('%c') then
    errors.raise(C, label .. ': auth_prefix must be a string', nil, 2)
  end
  local secrets = {}
  if key then secrets[1] = key end
  local aws
  if options.aws_sigv4 ~= nil or options.aws_credentials ~= nil then
    local sig, cred = options.aws_sigv4, options.aws_credentials
    if key ~= nil then errors.raise(C, label .. ': api_key and AWS signing do not go together', nil, 2) end
    if type(sig) ~= 'string' or not sig:match('^aws:amz:[%w%-]+:[%w%-]+$') then
      errors.raise(C, label .. ": aws_sigv4 must be 'aws:amz:<region>:<service>'", nil, 2)
    end
    if type(cred) ~= 'table' then errors.raise(C, label .. ': aws_credentials must be a table', nil, 2) end
    check.keys(cred, { access_key_id = true, secret_access_key = true, session_token = true }, 'aws_credentials', C, 3)
    for _, name in ipairs({ 'access_key_id', 'secret_access_key', 'session_token' }) do
      local v = cred[name]
      if (v ~= nil or name ~= 'session_token') and (type(v) ~= 'string' or v == '' or #v > 4096
          or v:find('[%c ]') or (name == 'access_key_id' and v:find(':', 1, true))) then
        errors.raise(C, label .. ': aws_credentials.' .. name .. ' must be a non-empty string without spaces', nil, 2)
      end
      if v then secrets[#secrets + 1] = v end
    end
    aws = { sig = sig, id = cred.access_key_id, secret = cred.secret_access_key, token = cred.session_token }
  end
  if options.secrets ~= nil and type(options.secrets) ~= 'table' then
    errors.raise(C, label .. ': secrets must be a list of strings', nil, 2)
  end
  for _, s in ipairs(options.secrets or {}) do
    if type(s) == 'string' and s ~= '' then secrets[#secrets + 1] = s end
  end
  local self = setmetatable({
    label = label,
    base_url = base,
    headers = check_headers(options.headers, label .. ': headers', 3),
    call_timeout_ms = check.int(options.call_timeout_ms, 'call_timeout_ms', 1, nil, C, 3, 120000),
    retries = check.int(options.retries, 'retries', 0, 10, C, 3, 2),
    retry_base_ms = check.int(options.retry_base_ms, 'retry_base_ms', 0, 60000, C, 3, 200),
    max_retry_after_ms = check.int(options.max_retry_after_ms, 'max_retry_after_ms', 0, nil, C, 3, 30000),
    max_response_bytes = check.int(options.max_response_bytes, 'max_response_bytes', 1, 1024 * MIB, C, 3, 64 * MIB),
    max_message_bytes = check.int(options.max_message_bytes, 'max_message_bytes', 1, 1024 * MIB, C, 3, 16 * MIB),
    http_version = options.http_version,
  }, Client)
  for _, name in ipairs({ 'ca_file', 'client_cert', 'client_key' }) do
    local v = options[name]
    if v ~= nil and (type(v) ~= 'string' or v:sub(1, 1) ~= '/' or v:find('%z') or #v > 4095) then
      errors.raise(C, label .. ': ' .. name .. ' must be an absolute path', nil, 2)
    end
  end
  if (options.client_cert == nil) ~= (options.client_key == nil) then
    errors.raise(C, label .. ': client_cert and client_key go together', nil, 2)
  end
  local pem = options.ca_pem
  if pem ~= nil and (type(pem) ~= 'string' or not pem:find('-----BEGIN', 1, true) or #pem > 1048576
      or pem:find('%z') or options.ca_file ~= nil) then
    errors.raise(C, label .. ': ca_pem must be PEM text (and not with ca_file)', nil, 2)
  end
  -- the files' paths go to libcurl with each request
  self._tls = function(req)
    req.ca_file, req.ca_pem = options.ca_file, pem
    req.client_cert, req.client_key = options.client_cert, options.client_key
    return req
  end
  if self.http_version ~= nil and self.http_version ~= '1.1' and self.http_version ~= '2' then
    errors.raise(C, label .. ": http_version must be '1.1' or '2'", nil, 2)
  end
  -- the key lives in closures: printing the client shows neither it nor the header that holds it
  self._auth = function(h)
    if key then h[auth_header] = prefix .. key end
    if aws and aws.token then h['X-Amz-Security-Token'] = aws.token end
  end
  -- the signing options of a request (libcurl signs: the secret goes only there)
  self._sign = function(req)
    if aws then req.aws_sigv4, req.aws_key_id, req.aws_secret = aws.sig, aws.id, aws.secret end
    return req
  end
  self._secrets = function() return secrets end
  return self
end

--- A client like this one with some options changed: `base_url`, `headers`
-- (added to this one's), `call_timeout_ms`, `retries`, `secrets` (added).
function Client:with(changes)
  check.keys(changes, { base_url = true, headers = true, call_timeout_ms = true, retries = true, secrets = true },
    'with options', 'INVALID_CONFIG', 3)
  local c = setmetatable({}, Client)
  for k, v in pairs(self) do c[k] = v end
  if changes.base_url ~= nil then
    local b = changes.base_url
    if type(b) ~= 'string' or not b:match('^https?://[^%s@]+$') or b:find('%c') then
      errors.raise('INVALID_CONFIG', self.label .. ': base_url must be an http:// or https:// URL', nil, 2)
    end
    c.base_url = b:gsub('/+$', '')
  end
  if changes.headers ~= nil then
    local h = {}
    for k, v in pairs(self.headers) do h[k] = v end
    for k, v in pairs(check_headers(changes.headers, self.label .. ': headers', 3)) do h[k] = v end
    c.headers = h
  end
  c.call_timeout_ms = check.int(changes.call_timeout_ms, 'call_timeout_ms', 1, nil, 'INVALID_CONFIG', 3,
    self.call_timeout_ms)
  c.retries = check.int(changes.retries, 'retries', 0, 10, 'INVALID_CONFIG', 3, self.retries)
  if changes.secrets ~= nil then
    if type(changes.secrets) ~= 'table' then
      errors.raise('INVALID_CONFIG', 'secrets must be a list of strings', nil, 2)
    end
    local list = {}
    for _, s in ipairs(self._secrets()) do list[#list + 1] = s end
    for _, s in ipairs(changes.secrets) do
      if type(s) == 'string' and s ~= '' then list[#list + 1] = s end
    end
    c._secrets = function() return list end
  end
  return c
end

-- {------------------------------------------------------ errors

-- Drops every secret from an error's message (there should be none: the words are ours).
function Client:_clean(err)
  if type(err) == 'table' and type(err.message) == 'string' then
    for _, s in ipairs(self._secrets()) do
      local at = err.message:find(s, 1, true)
      while at do
        err.message = err.message:sub(1, at - 1) .. '[secret]' .. err.message:sub(at + #s)
        at = err.message:find(s, 1, true)
      end
    end
  end
  return err
end

function Client:_raise(err)
  error(self:_clean(err), 0)
end

--- SANDBOX_ERROR `failed`: the service answered something we cannot use.
function Client:bad_answer(what)
  return errors.sandbox('failed', self.label .. ': the service answered with ' .. what)
end

-- `c` when it is a plain token (mayura.http.plain_token) that is no secret and holds none.
function Client:_safe_code(c)
  if not http.plain_token(c) then return nil end
  for _, s in ipairs(self._secrets()) do
    if not http.plain_token(c, s) then return nil end
  end
  return c
end

-- The short code of an error body, when it is a plain token that is not a secret.
local function code_of(self, body)
  if type(body) ~= 'table' then return nil end
  local e = type(body.error) == 'table' and body.error or {}
  local candidates = { body.error_code, e.code, e.type, body.code, body.type, body.error }
  for i = 1, 6 do
    local c = self:_safe_code(candidates[i])
    if c then return c end
  end
  return nil
end

local function path_only(path)
  return (path:match('^[^?]*'))
end

-- The error for a non-2xx status of `method path`.
function Client:_status_error(status, method, path, body, opts)
  local code = code_of(self, body)
  if opts.on_error then
    local e = opts.on_error(status, code)
    if e ~= nil then
      if not errors.is(e) then e = errors.sandbox('failed', self.label .. ': the call failed') end
      if getmetatable(e) == nil then setmetatable(e, errors.mt) end
      e.status = e.status or status
      return e
    end
  end
  local what = method .. ' ' .. path_only(path)
  local gone = opts.gone
  if gone then
    local statuses = gone == true and M.GONE_STATUSES or gone
    for _, s in ipairs(statuses) do
      if s == status then
        local e = errors.sandbox('gone', self.label .. ': the sandbox is gone (HTTP ' .. status .. ' to '
          .. what .. ')')
        e.status, e.provider_code = status, code
        return e
      end
    end
  end
  local e = sandbox.sandbox_http_failure(status)
  e.message = self.label .. ': the service answered HTTP ' .. status .. ' to ' .. what
  e.provider_code = code
  return e
end

-- The error of a failed transfer (its text is curl's: not passed on), and whether to retry it.
function Client:_transport_error(err, method, path, idempotent, timeout_ms)
  local code = type(err) == 'table' and err.code or nil
  local what = method .. ' ' .. path_only(path)
  if code == 'CANCELLED' then
    return errors.new('CANCELLED', self.label .. ': ' .. what .. ' was cancelled'), false
  end
  if code == 'TIMEOUT' then
    local e = errors.sandbox('timeout', self.label .. ': no answer to ' .. what .. ' within ' .. timeout_ms .. ' ms')
    return e, false
  end
  if code == 'CONNECT_FAILED' then
    return errors.sandbox('unavailable', self.label .. ': the service could not be reached for ' .. what), true
  end
  if code == 'NETWORK_ERROR' then
    return errors.sandbox('unavailable', self.label .. ': the connection failed during ' .. what), idempotent
  end
  if code == 'LIMIT_EXCEEDED' then
    return errors.sandbox('failed', self.label .. ': the answer to ' .. what .. ' is larger than '
      .. self.max_response_bytes .. ' bytes'), false
  end
  return errors.sandbox('failed', self.label .. ': ' .. what .. ' could not be made'), false
end

-- }------------------------------------------------------

-- {------------------------------------------------------ the retry loop

local call_keys = {
  query = true, headers = true, body = true, content_type = true, timeout_ms = true, gone = true, allow = true,
  idempotent = true, signal = true, retries = true, on_error = true,
}
local stream_keys = {
  query = true, headers = true, timeout_ms = true, gone = true, idempotent = true, signal = true,
  retries = true, on_error = true, format = true, on_event = true, idle_timeout_ms = true,
}

local function check_call(self, method, path, opts, keys)
  if type(method) ~= 'string' or not method:match('^%u+$') then
    errors.raise('INVALID_INPUT', self.label .. ': method must be an HTTP method name', nil, 4)
  end
  if type(path) ~= 'string' or path:sub(1, 1) ~= '/' or path:find('[%s%c]') then
    errors.raise('INVALID_INPUT', self.label .. ': path must start with / and hold no blanks', nil, 4)
  end
  opts = opts or {}
  check.keys(opts, keys, 'call options', 'INVALID_INPUT', 4)
  return opts
end

-- Runs attempts until one is final. `attempt(remaining_ms)` returns 'ok',
-- results... | 'status', status, headers, decoded body | 'transport', err,
-- whether an answer had begun | 'error', err (final).
function Client:_run(method, path, opts, attempt)
  local timeout = opts.timeout_ms or self.call_timeout_ms
  check.int(timeout, 'timeout_ms', 1, nil, 'INVALID_INPUT', 4)
  local retries = check.int(opts.retries, 'retries', 0, 10, 'INVALID_INPUT', 4, self.retries)
  local idempotent = opts.idempotent
  if idempotent == nil then idempotent = IDEMPOTENT[method] == true end
  local retry_statuses = set_of(M.RETRY_STATUSES)
  local deadline = core.hrtime_ms() + timeout
  local n = 0
  while true do
    local remaining = math.ceil(deadline - core.hrtime_ms())
    if remaining <= 0 then
      self:_raise(errors.sandbox('timeout', self.label .. ': no answer to ' .. method .. ' ' .. path_only(path)
        .. ' within ' .. timeout .. ' ms'))
    end
    local kind, a, b, c = attempt(remaining)
    if kind == 'ok' then return a, b end
    local err, retry, wait
    if kind == 'status' then
      err = self:_status_error(a, method, path, c, opts)
      -- a sandbox that is gone stays gone (E2B's envd says so with 502): not tried again
      retry = retry_statuses[a] == true and err.reason ~= 'gone'
      wait = http.retry_after_ms(b)
      if wait then err.retry_after_ms = wait end
    elseif kind == 'transport' then
      err, retry = self:_transport_error(a, method, path, idempotent, timeout)
      if b then retry = false end   -- an answer had begun
    else
      err, retry = a, false
    end
    if not retry or n >= retries then self:_raise(err) end
    if wait and wait > self.max_retry_after_ms then self:_raise(err) end
    local delay = wait
    if not delay or delay <= 0 then delay = http.backoff_ms(self.retry_base_ms, n) end
    if delay >= deadline - core.hrtime_ms() then self:_raise(err) end
    n = n + 1
    if delay > 0 and not http.pause(delay, opts.signal) then
      self:_raise(errors.new('CANCELLED', self.label .. ': ' .. method .. ' ' .. path_only(path) .. ' was cancelled'))
    end
  end
end

function Client:_headers(extra)
  local h = {}
  for k, v in pairs(self.headers) do h[k] = v end
  for k, v in pairs(check_headers(extra, self.label .. ': headers', 5)) do h[k] = v end
  for k in pairs(h) do
    if k:lower() == 'user-agent' then h[k] = nil end
  end
  h['User-Agent'] = M.USER_AGENT
  self._auth(h)
  return h
end

-- }------------------------------------------------------

--- One call: `opts` = { query, headers, body (a string), content_type,
-- timeout_ms, gone, allow (statuses returned rather than raised), idempotent,
-- signal, retries, on_error(status, provider_code) -> error or nil }.
-- Returns `{ status, headers, body }` (the body as bytes).
function Client:call(method, path, opts)
  opts = check_call(self, method, path, opts, call_keys)
  local allow = set_of(opts.allow)
  local url = self.base_url .. path .. M.query(opts.query)
  local headers = self:_headers(opts.headers)
  if opts.body ~= nil then
    if type(opts.body) ~= 'string' then
      errors.raise('INVALID_INPUT', self.label .. ': body must be a string', nil, 2)
    end
    headers['Content-Type'] = opts.content_type or headers['Content-Type'] or 'application/octet-stream'
  end
  return self:_run(method, path, opts, function(remaining)
    local ok, res = pcall(http.request, self._tls(self._sign({
      url = url, method = method, headers = headers, body = opts.body,
      timeout_ms = remaining, connect_timeout_ms = math.min(remaining, CONNECT_TIMEOUT_CAP),
      max_body_bytes = self.max_response_bytes, signal = opts.signal, http_version = self.http_version,
    })))
    if not ok then return 'transport', res end
    if (res.status >= 200 and res.status < 300) or allow[res.status] then return 'ok', res end
    local body
    if #res.body <= MAX_ERROR_BODY then
      body = M.decode(res.body, 64)
    end
    return 'status', res.status, res.headers, body
  end)
end

--- A JSON call: `body` (a table, or nil) is sent as JSON; returns the
-- decoded answer (nil for an empty one) and `{ status, headers, body }`.
-- `opts` as for `call`.
function Client:json(method, path, body, opts)
  opts = check_call(self, method, path, opts, call_keys)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  if body ~= nil then
    local ok, text = pcall(json.encode, body)
    if not ok then errors.raise('INVALID_INPUT', self.label .. ': the request cannot be sent as JSON', nil, 2) end
    o.body, o.content_type = text, 'application/json'
  end
  o.headers = {}
  for k, v in pairs(opts.headers or {}) do o.headers[k] = v end
  if o.headers.Accept == nil then o.headers.Accept = 'application/json' end
  local res = self:call(method, path, o)
  if res.body == '' or not res.body:find('%S') then return nil, res end
  local v = M.decode(res.body)
  if v == nil and (res.status < 200 or res.status >= 300) then return nil, res end   -- an allowed status
  if v == nil then
    self:_raise(self:bad_answer('a body that is not JSON (HTTP ' .. res.status .. ' to ' .. method .. ' '
      .. path_only(path) .. ')'))
  end
  return v, res
end

--- A streamed answer: `opts.format` ('connect', 'ndjson', 'sse' or 'eventstream') and
-- `opts.on_event(value)`, with the options of `call` but `body`, `allow` and
-- `content_type`, and `idle_timeout_ms` (no byte for that long ends the
-- stream with SANDBOX_ERROR `timeout`). `body` is a table sent as JSON (for
-- 'connect', as one envelope), or a string sent as it is (a request of
-- several NDJSON lines; its type in `headers['Content-Type']`). Returns the
-- end-of-stream trailer for 'connect' (decoded), nothing otherwise.
function Client:stream(method, path, body, opts)
  opts = check_call(self, method, path, opts, stream_keys)
  local format = opts.format
  if not FORMATS[format] then
    errors.raise('INVALID_INPUT', "format must be 'connect', 'ndjson', 'sse' or 'eventstream'", nil, 2)
  end
  if type(opts.on_event) ~= 'function' then errors.raise('INVALID_INPUT', 'on_event must be a function', nil, 2) end
  local idle = opts.idle_timeout_ms
  if idle ~= nil then check.int(idle, 'idle_timeout_ms', 1, nil, 'INVALID_INPUT', 3) end
  local payload
  if type(body) == 'string' and format ~= 'connect' then
    payload = body
  elseif body ~= nil then
    local ok, text = pcall(json.encode, body)
    if not ok then errors.raise('INVALID_INPUT', self.label .. ': the request cannot be sent as JSON', nil, 2) end
    payload = text
  end
  local headers = self:_headers(opts.headers)
  if format == 'connect' then
    payload = M.connect_envelope(payload or '{}')
    headers['Content-Type'] = 'application/connect+json'
    headers['Connect-Protocol-Version'] = headers['Connect-Protocol-Version'] or '1'
  else
    if payload and not (type(body) == 'string' and headers['Content-Type']) then
      headers['Content-Type'] = 'application/json'
    end
    headers.Accept = headers.Accept or (format == 'sse' and 'text/event-stream')
      or (format == 'eventstream' and 'application/vnd.amazon.eventstream') or 'application/x-ndjson'
  end
  local url = self.base_url .. path .. M.query(opts.query)
  local what = method .. ' ' .. path_only(path)
  local label = self.label

  return self:_run(method, path, opts, function(remaining)
    local uv = require('luv')
    local trailer
    local token = require('mayura._task').cancel_token()
    local remove_user
    if opts.signal then remove_user = opts.signal:on_cancel(function() token:cancel('user') end) end
    local status, res_headers, err_body = nil, nil, {}
    local err_len = 0
    local failure          -- an error found while reading (format, size, on_event)
    local stopped = false  -- on_event asked to stop
    local parser = core.stream_parser(format, { max_bytes = self.max_message_bytes })
    local idle_timer
    local function arm()
      if not idle then return end
      if not idle_timer then idle_timer = uv.new_timer() end
      idle_timer:stop()
      idle_timer:start(idle, 0, function() token:cancel('idle') end)
    end
    local function deliver(events, perr)
      for _, ev in ipairs(events) do
        if failure or stopped then return end
        local value = ev
        if format ~= 'sse' and format ~= 'eventstream' then
          local v = M.decode(ev.data)
          if v == nil then
            failure = self:bad_answer('a streamed message that is not JSON (' .. what .. ')')
            return
          end
          value = v
        end
        if format == 'connect' and ev.end_stream then
          trailer = type(value) == 'table' and value or {}
        else
          local ok, r = pcall(opts.on_event, value)
          if not ok then
            failure = errors.is(r) and r
              or errors.sandbox('failed', label .. ': reading the stream of ' .. what .. ' failed')
            return
          end
          if r == false then stopped = true return end
        end
      end
      if perr then
        if perr.code == 'LIMIT_EXCEEDED' then
          failure = self:bad_answer('a streamed message larger than ' .. self.max_message_bytes .. ' bytes ('
            .. what .. ')')
        else
          failure = self:bad_answer('a stream that breaks its format (' .. what .. ')')
        end
      end
    end
    arm()
    local ok, res = pcall(http.request, self._tls(self._sign({
      url = url, method = method, headers = headers, body = payload,
      timeout_ms = remaining, connect_timeout_ms = math.min(remaining, CONNECT_TIMEOUT_CAP),
      signal = token, http_version = self.http_version,
      on_headers = function(st, h)
        status, res_headers = st, h
        arm()
      end,
      on_data = function(chunk)
        arm()
        if status == nil or status < 200 or status >= 300 then
          err_len = err_len + #chunk
          if err_len > MAX_ERROR_BODY then return false end
          err_body[#err_body + 1] = chunk
          return true
        end
        deliver(parser:feed(chunk))
        if failure or stopped then return false end
        return true
      end,
    })))
    if idle_timer then idle_timer:stop(); idle_timer:close() end
    if remove_user then remove_user() end
    local reason = token.reason
    if failure then return 'error', failure end
    if status and (status < 200 or status >= 300) then
      return 'status', status, res_headers, M.decode(table.concat(err_body), 64)
    end
    if stopped then return 'ok', trailer end
    if not ok then
      if reason == 'idle' then
        return 'error', errors.sandbox('timeout', label .. ': the stream of ' .. what .. ' was silent for '
          .. idle .. ' ms')
      end
      if reason == 'user' then return 'error', errors.new('CANCELLED', label .. ': ' .. what .. ' was cancelled') end
      return 'transport', res, status ~= nil
    end
    deliver(parser:finish())
    if failure then return 'error', failure end
    if format == 'connect' then
      if trailer == nil then return 'error', self:bad_answer('a stream without its end (' .. what .. ')') end
      if type(trailer.error) == 'table' then
        local code = trailer.error.code
        local st = M.connect_status(type(code) == 'string' and code or nil)
        local e = self:_status_error(st, method, path, { code = code }, opts)
        e.connect_code = self:_safe_code(code)
        return 'error', e
      end
    end
    return 'ok', trailer
  end)
end

-- }======================================================

-- {======================================================
-- Command sandboxes: what the providers on command_sandbox_backend share
-- =======================================================

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

--- The backend of a sandbox `id` the service has made, on command_sandbox_backend: `setup()`
-- (waiting until it runs, say) returns its transport, over which the backend's first call makes
-- the working directory `workdir` (its commands start there; one that cannot be made is
-- SANDBOX_ERROR `failed` then); `destroy()` ends the sandbox at release. Where `setup` fails the
-- sandbox is destroyed (a failure to do so is ignored) and the error goes on.
function M.command_backend(_label, id, workdir, destroy, setup)
  local backend
  local ok, err = pcall(function()
    local transport = setup()
    transport.workdir, transport.make_workdir = workdir, true   -- made with the backend's first command
    backend = sandbox.command_sandbox_backend(id, transport, function() destroy() end)
  end)
  if not ok then
    pcall(destroy)
    error(err, 0)
  end
  return backend
end

-- }======================================================

return M
