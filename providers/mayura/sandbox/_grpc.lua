--- mayura.sandbox._grpc: gRPC calls for the providers of services that speak gRPC (Modal).
--
-- A call is one HTTP/2 POST through `mayura.http` (libcurl: prior knowledge to an http://
-- loopback server, ALPN over TLS): the request is a protobuf message (`core.proto`, from the
-- project's .proto files) in one length-prefixed frame; the answer is frames of the response
-- message and the gRPC status in the trailers (or in the head, for an answer without a body).
--
--   local grpc = require('mayura.sandbox._grpc')
--   local c = grpc.client({ label = 'modal', base_url = 'https://api.modal.com',
--     metadata = { ['x-modal-token-id'] = id, ['x-modal-token-secret'] = secret },
--     secrets = { secret }, call_timeout_ms = 120000, retries = 2,
--     ca_file = nil })                      -- a PEM file of authorities to trust instead of the system's
--   local resp = c:call('/modal.client.ModalClient/AppGetOrCreate', { app_name = 'a' })
--   local list = c:call(method, req, { stream = true })  -- a server stream, read to its end
--
-- What a call promises, as the hosted kit does for JSON services:
--   * metadata (credentials) travel only in headers; the service's own text (`grpc-message`) and
--     every secret stay out of messages;
--   * a non-OK status is SANDBOX_ERROR with a reason from its code: UNAUTHENTICATED and
--     PERMISSION_DENIED `authentication`, RESOURCE_EXHAUSTED `rate_limited`, UNAVAILABLE
--     `unavailable`, DEADLINE_EXCEEDED `timeout`, NOT_FOUND `gone` for a call with `gone = true`
--     (else `not_found`), ALREADY_EXISTS `conflict`, anything else `failed`; `grpc_status` holds
--     the code;
--   * every call ends within its `timeout_ms` (the client's `call_timeout_ms` by default), and by
--     the client's `deadline_ms` (a time on core.hrtime_ms's clock) when it has one; what is left
--     is sent as `grpc-timeout`; UNAVAILABLE and a connection that could not be made are tried
--     again up to `retries` times (a connection cut midway only for `idempotent = true`);
--   * an answer that is not gRPC (no status, a compressed or cut frame, bytes that are not the
--     message) is SANDBOX_ERROR `failed`; a cancelled `signal` is CANCELLED.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local http = require('mayura.http')

local M = {}

local MIB = 1048576
local CONNECT_TIMEOUT_CAP = 30000

M.CODES = {
  [0] = 'OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND', 'ALREADY_EXISTS',
  'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE', 'UNIMPLEMENTED',
  'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED',
}

local REASONS = { [16] = 'authentication', [7] = 'authentication', [8] = 'rate_limited', [14] = 'unavailable',
  [4] = 'timeout', [5] = 'not_found', [6] = 'conflict' }

-- The gRPC status of an HTTP status that is not 200 (the gRPC over HTTP/2 mapping).
local HTTP_CODES = { [400] = 13, [401] = 16, [403] = 7, [404] = 12, [429] = 14, [502] = 14, [503] = 14, [504] = 14 }

--- One frame: the flag byte (0: not compressed), the 4-byte big-endian length, the message.
function M.frame(bytes)
  local n = #bytes
  return string.char(0, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256,
    n % 256) .. bytes
end

--- The messages of a body of frames, or nil and why.
function M.frames(body)
  local out, i, n = {}, 1, #body
  while i <= n do
    if i + 4 > n then return nil, 'a cut frame' end
    local f, b1, b2, b3, b4 = body:byte(i, i + 4)
    if f ~= 0 then return nil, 'a compressed frame' end
    local len = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    if i + 4 + len > n then return nil, 'a cut frame' end
    out[#out + 1] = body:sub(i + 5, i + 4 + len)
    i = i + 5 + len
  end
  return out
end

local function short(method)
  return method:match('/([^/]+)$') or method
end

--- The error for a gRPC status `code` (not 0) of `method`; `gone` says whether NOT_FOUND means the
-- sandbox is gone.
function M.status_error(label, method, code, gone)
  local reason = REASONS[code] or 'failed'
  if code == 5 and gone then reason = 'gone' end
  local name = M.CODES[code] or tostring(code)
  local e = errors.sandbox(reason, label .. ': ' .. short(method) .. ' failed with gRPC status ' .. name)
  e.grpc_status = code
  return e
end

local Client = {}
Client.__index = Client

local client_keys = {
  label = true, base_url = true, metadata = true, secrets = true, call_timeout_ms = true, retries = true,
  retry_base_ms = true, max_response_bytes = true, deadline_ms = true, ca_file = true,
}

--- A client for one service: see the module's comment.
function M.client(options)
  local C = 'INVALID_CONFIG'
  if type(options) ~= 'table' then errors.raise(C, 'the gRPC client needs an options table', nil, 2) end
  check.keys(options, client_keys, 'gRPC client options', C, 3)
  local label = options.label or 'grpc'
  local base = options.base_url
  if type(base) ~= 'string' or not base:match('^https?://[%w%.%-%[%]:]+/*$') then
    errors.raise(C, label .. ': base_url must be an http:// or https:// URL of a host and port', nil, 2)
  end
  local md = {}
  for k, v in pairs(options.metadata or {}) do
    if type(k) ~= 'string' or not k:match('^[%l%d%-_%.]+$') or type(v) ~= 'string' or v:find('%c') then
      errors.raise(C, label .. ': metadata must map lower-case names to values without control characters', nil, 2)
    end
    md[k] = v
  end
  return setmetatable({
    label = label, base_url = base:gsub('/+$', ''), metadata = md, secrets = options.secrets or {},
    call_timeout_ms = check.int(options.call_timeout_ms, 'call_timeout_ms', 1, nil, C, 3, 120000),
    retries = check.int(options.retries, 'retries', 0, 10, C, 3, 2),
    retry_base_ms = check.int(options.retry_base_ms, 'retry_base_ms', 0, 60000, C, 3, 250),
    max_response_bytes = check.int(options.max_response_bytes, 'max_response_bytes', 1024, nil, C, 3, 64 * MIB),
    deadline_ms = options.deadline_ms,
    ca_file = options.ca_file,
  }, Client)
end

--- The same client with other options (`metadata` is added to this one's).
function Client:with(o)
  local c = setmetatable({}, Client)
  for k, v in pairs(self) do c[k] = v end
  for k, v in pairs(o) do
    if k == 'metadata' then
      local md = {}
      for a, b in pairs(self.metadata) do md[a] = b end
      for a, b in pairs(v) do md[a] = b end
      c.metadata = md
    else
      c[k] = v
    end
  end
  return c
end

-- An error with every secret scrubbed from its message, raised.
function Client:_raise(err)
  if type(err) == 'table' and type(err.message) == 'string' then
    for _, s in ipairs(self.secrets) do
      if type(s) == 'string' and #s >= 4 then err.message = err.message:gsub(s:gsub('%p', '%%%0'), '***') end
    end
  end
  error(err, 0)
end

local call_keys = { timeout_ms = true, gone = true, signal = true, stream = true, idempotent = true, retries = true }

-- One attempt: 'ok', messages | 'status', code | 'transport', err, begun | 'error', err.
function Client:_attempt(method, body, o, remaining)
  local headers = {
    ['content-type'] = 'application/grpc', te = 'trailers', ['grpc-timeout'] = math.min(remaining, 99999999) .. 'm',
  }
  for k, v in pairs(self.metadata) do headers[k] = v end
  local ok, res = pcall(http.request, {
    url = self.base_url .. method, method = 'POST', headers = headers, body = body, http_version = '2',
    ca_file = self.ca_file,
    timeout_ms = remaining, connect_timeout_ms = math.min(remaining, CONNECT_TIMEOUT_CAP),
    max_body_bytes = self.max_response_bytes, signal = o.signal,
  })
  if not ok then return 'transport', res end
  if res.status ~= 200 then return 'status', HTTP_CODES[res.status] or 2 end
  local st = (res.trailers or {})['grpc-status'] or res.headers['grpc-status']
  local code = st and st:match('^%d+$') and tonumber(st)
  if not code then
    return 'error', errors.sandbox('failed', self.label .. ': the answer to ' .. short(method) .. ' is not gRPC')
  end
  if code ~= 0 then return 'status', code end
  if not (res.headers['content-type'] or ''):match('^application/grpc') then
    return 'error', errors.sandbox('failed', self.label .. ': the answer to ' .. short(method) .. ' is not gRPC')
  end
  local frames, why = M.frames(res.body)
  if not frames then
    return 'error', errors.sandbox('failed', self.label .. ': the answer to ' .. short(method) .. ' holds ' .. why)
  end
  local out = {}
  for i, f in ipairs(frames) do
    local v = core.proto.decode(method, 'response', f)
    if v == nil then
      return 'error', errors.sandbox('failed', self.label .. ': the answer to ' .. short(method)
        .. ' is not its message')
    end
    out[i] = v
  end
  return 'ok', out
end

--- Calls `method` with the request `req` (a table, see core.proto): returns the response, or with
-- `stream = true` the list of every message of the server's stream. `o` = { timeout_ms, gone,
-- signal, stream, idempotent, retries }.
function Client:call(method, req, o)
  o = o or {}
  check.keys(o, call_keys, 'call options', 'INVALID_INPUT', 3)
  local body = M.frame(core.proto.encode(method, 'request', req or {}))
  local timeout = check.int(o.timeout_ms, 'timeout_ms', 1, nil, 'INVALID_INPUT', 3, self.call_timeout_ms)
  local retries = check.int(o.retries, 'retries', 0, 10, 'INVALID_INPUT', 3, self.retries)
  local deadline = core.hrtime_ms() + timeout
  if self.deadline_ms and self.deadline_ms < deadline then
    deadline = self.deadline_ms
    timeout = math.max(0, math.ceil(deadline - core.hrtime_ms()))
  end
  local n = 0
  while true do
    local remaining = math.ceil(deadline - core.hrtime_ms())
    if remaining <= 0 then
      self:_raise(errors.sandbox('timeout', self.label .. ': no answer to ' .. short(method) .. ' within '
        .. timeout .. ' ms'))
    end
    local kind, a = self:_attempt(method, body, o, remaining)
    if kind == 'ok' then
      if o.stream then return a end
      if #a ~= 1 then
        self:_raise(errors.sandbox('failed', self.label .. ': the answer to ' .. short(method)
          .. ' is not one message'))
      end
      return a[1]
    end
    local err, retry
    if kind == 'status' then
      err = M.status_error(self.label, method, a, o.gone)
      retry = a == 14
    elseif kind == 'transport' then
      local code = type(a) == 'table' and a.code
      if code == 'CANCELLED' then
        err = errors.new('CANCELLED', self.label .. ': ' .. short(method) .. ' was cancelled')
      elseif code == 'TIMEOUT' then
        err = errors.sandbox('timeout', self.label .. ': no answer to ' .. short(method) .. ' within '
          .. timeout .. ' ms')
      elseif code == 'CONNECT_FAILED' then
        err, retry = errors.sandbox('unavailable', self.label .. ': the service could not be reached for '
          .. short(method)), true
      elseif code == 'NETWORK_ERROR' then
        err, retry = errors.sandbox('unavailable', self.label .. ': the connection failed during '
          .. short(method)), o.idempotent == true
      elseif code == 'LIMIT_EXCEEDED' then
        err = errors.sandbox('failed', self.label .. ': the answer to ' .. short(method) .. ' is too large')
      else
        err = errors.sandbox('failed', self.label .. ': ' .. short(method) .. ' could not be made')
      end
    else
      err = a
    end
    if not retry or n >= retries then self:_raise(err) end
    local delay = http.backoff_ms(self.retry_base_ms, n)
    if delay >= deadline - core.hrtime_ms() then self:_raise(err) end
    n = n + 1
    if delay > 0 and not http.pause(delay, o.signal) then
      self:_raise(errors.new('CANCELLED', self.label .. ': ' .. short(method) .. ' was cancelled'))
    end
  end
end

return M
