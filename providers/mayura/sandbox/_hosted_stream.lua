--- mayura.sandbox._hosted_stream: a hosted client's streamed answers (`client:stream`): the
-- request of one stream, then its bytes read as Connect envelopes, NDJSON, SSE or AWS
-- event-stream through `core.stream_parser` as they arrive, each message handed to `on_event`,
-- with the idle timeout, the message size cap and a Connect stream's end and error. An attempt
-- runs in the client's retry loop (`_run`); mayura.sandbox._hosted says what a stream promises.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local http = require('mayura.http')
local wire = require('mayura.sandbox._hosted_wire')

local M = {}

local json = core.json
local FORMATS = { connect = true, ndjson = true, sse = true, eventstream = true }

local stream_keys = {
  query = true, headers = true, timeout_ms = true, gone = true, idempotent = true, signal = true,
  retries = true, on_error = true, format = true, on_event = true, idle_timeout_ms = true,
}

--- `client:stream(method, path, body, opts)` (see _hosted_client's Client:stream).
function M.run(self, method, path, body, opts)
  opts = self:_check_call(method, path, opts, stream_keys)
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
    payload = wire.connect_envelope(payload or '{}')
    headers['Content-Type'] = 'application/connect+json'
    headers['Connect-Protocol-Version'] = headers['Connect-Protocol-Version'] or '1'
  else
    if payload and not (type(body) == 'string' and headers['Content-Type']) then
      headers['Content-Type'] = 'application/json'
    end
    headers.Accept = headers.Accept or (format == 'sse' and 'text/event-stream')
      or (format == 'eventstream' and 'application/vnd.amazon.eventstream') or 'application/x-ndjson'
  end
  local url = self.base_url .. path .. wire.query(opts.query)
  local what = method .. ' ' .. wire.path_only(path)
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
          local v = wire.decode(ev.data)
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
      timeout_ms = remaining, connect_timeout_ms = math.min(remaining, wire.CONNECT_TIMEOUT_CAP),
      signal = token, http_version = self.http_version,
      on_headers = function(st, h)
        status, res_headers = st, h
        arm()
      end,
      on_data = function(chunk)
        arm()
        if status == nil or status < 200 or status >= 300 then
          err_len = err_len + #chunk
          if err_len > wire.MAX_ERROR_BODY then return false end
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
      return 'status', status, res_headers, wire.decode(table.concat(err_body), 64)
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
        local st = wire.connect_status(type(code) == 'string' and code or nil)
        local e = self:_status_error(st, method, path, { code = code }, opts)
        e.connect_code = self:_safe_code(code)
        return 'error', e
      end
    end
    return 'ok', trailer
  end)
end

return M
