--- mayura.sandbox._hosted_client: the HTTP client of one hosted service (`hosted.client`): its
-- options and credentials (kept in closures, scrubbed from every message), the retry loop with its
-- waits and one deadline per call, a non-2xx status or a failed transfer made our coded error, and
-- `call` and `json`; `stream` is mayura.sandbox._hosted_stream's. mayura.sandbox._hosted, which
-- re-exports it, says what a call promises.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local http = require('mayura.http')
local sandbox = require('mayura.sandbox')
local wire = require('mayura.sandbox._hosted_wire')
local stream = require('mayura.sandbox._hosted_stream')

local M = {}

local json = core.json
local MIB = 1048576
local decode, query, path_only = wire.decode, wire.query, wire.path_only
local MAX_ERROR_BODY, CONNECT_TIMEOUT_CAP = wire.MAX_ERROR_BODY, wire.CONNECT_TIMEOUT_CAP

--- What every request of a hosted provider says it is: mayura and its version.
M.USER_AGENT = 'mayura/' .. tostring(core.version or '0')

M.GONE_STATUSES = { 404, 410 }
M.RETRY_STATUSES = { 429, 502, 503, 504 }
local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true }

local function set_of(list)
  local s = {}
  for _, v in ipairs(list or {}) do s[v] = true end
  return s
end

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

function Client:_check_call(method, path, opts, keys)
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
  opts = self:_check_call(method, path, opts, call_keys)
  local allow = set_of(opts.allow)
  local url = self.base_url .. path .. query(opts.query)
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
      body = decode(res.body, 64)
    end
    return 'status', res.status, res.headers, body
  end)
end

--- A JSON call: `body` (a table, or nil) is sent as JSON; returns the
-- decoded answer (nil for an empty one) and `{ status, headers, body }`.
-- `opts` as for `call`.
function Client:json(method, path, body, opts)
  opts = self:_check_call(method, path, opts, call_keys)
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
  local v = decode(res.body)
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
  return stream.run(self, method, path, body, opts)
end

return M
