--- mayura.ws: WebSocket client connections for tasks, over core.ws_connect
-- (libwebsockets on the core's loop).
--
--   local ws = require('mayura.ws')
--   local conn = ws.connect({ url = 'wss://host/path', headers = { Authorization = 'Bearer x' },
--     protocols = 'a, b', timeout_ms = 10000, signal = token })   -- waits for the handshake
--   conn:send(bytes, binary)                  -- queued; never waits
--   local msg, binary = conn:receive({ timeout_ms = 5000, signal = token })
--   conn:close()                              -- the close handshake; does not wait
--
-- A wss:// connection trusts the system's authorities, or those of `ca_file` (a PEM file) or
-- `ca_pem` (PEM text), and presents `client_cert` with `client_key` (PEM files) when given.
--
-- `connect` raises CONNECT_FAILED (with `status`, the HTTP status of a refused
-- handshake, when there was one), TIMEOUT, CANCELLED or INVALID_INPUT; its
-- errors never carry a header's value. `receive` returns the next whole
-- message, or nil once the connection is closed and its messages read (then
-- `conn.close_code` is the code the server sent, `conn.failure` an error code
-- when it ended by a failure: NETWORK_ERROR, LIMIT_EXCEEDED for a message above
-- `max_message_bytes`); it raises TIMEOUT or CANCELLED, leaving the connection
-- open. Messages are kept in order until read.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')

local M = {}

local Conn = {}
Conn.__index = Conn

function Conn:_wake()
  local w = self._waiter
  if w then
    self._waiter = nil
    w()
  end
end

function Conn:send(data, binary)
  if self.closed or self._closing then errors.raise('NETWORK_ERROR', 'the WebSocket is closed', nil, 2) end
  if type(data) ~= 'string' then errors.raise('INVALID_INPUT', 'a message must be a string', nil, 2) end
  self._handle:send(data, binary == true)
end

function Conn:close(code)
  if self.closed or self._closing then return end
  self._closing = true
  self._handle:close(code)
end

function Conn:receive(opts)
  opts = opts or {}
  local deadline = opts.timeout_ms and (core.hrtime_ms() + opts.timeout_ms) or nil
  while true do
    local m = table.remove(self._queue, 1)
    if m then return m[1], m[2] end
    if self.closed then return nil end
    if opts.signal and opts.signal.cancelled then errors.raise('CANCELLED', 'the receive was cancelled', nil, 2) end
    local remaining = deadline and math.ceil(deadline - core.hrtime_ms()) or nil
    if remaining and remaining <= 0 then errors.raise('TIMEOUT', 'no WebSocket message in time', nil, 2) end
    local timer, remove
    task.await(function(done)
      local fired = false
      local function once()
        if fired then return end
        fired = true
        done()
      end
      self._waiter = once
      if remaining then timer = task.after(remaining, once) end
      if opts.signal then remove = opts.signal:on_cancel(once) end
    end)
    self._waiter = nil
    if timer then timer.cancel() end
    if remove then remove() end
  end
end

local connect_keys = {
  url = true, headers = true, protocols = true, max_message_bytes = true, timeout_ms = true, signal = true,
  ca_file = true, ca_pem = true, client_cert = true, client_key = true,
}

function M.connect(opts)
  if type(opts) ~= 'table' then errors.raise('INVALID_INPUT', 'connect expects an options table', nil, 2) end
  for k in pairs(opts) do
    if not connect_keys[k] then errors.raise('INVALID_INPUT', 'unknown connect option ' .. tostring(k), nil, 2) end
  end
  local signal = opts.signal
  if signal ~= nil and not task.is_token(signal) then errors.raise('INVALID_INPUT', 'signal must be a cancel token') end
  if signal and signal.cancelled then errors.raise('CANCELLED', 'cancelled before it started', nil, 2) end
  local timeout = check.int(opts.timeout_ms, 'timeout_ms', 1, nil, 'INVALID_INPUT', 3, 30000)
  local self = setmetatable({ _queue = {}, closed = false, opened = false }, Conn)
  local function on_event(kind, a, b, c)
    if kind == 'open' then
      self.opened, self.protocol = true, a
    elseif kind == 'message' then
      self._queue[#self._queue + 1] = { a, b }
    elseif kind == 'close' then
      self.closed, self.close_code, self.failure, self.status = true, a, b, c
    end
    self:_wake()
  end
  self._handle = core.ws_connect({ url = opts.url, headers = opts.headers, protocols = opts.protocols,
    max_message_bytes = opts.max_message_bytes, ca_file = opts.ca_file, ca_pem = opts.ca_pem,
    client_cert = opts.client_cert, client_key = opts.client_key }, on_event)
  local deadline = core.hrtime_ms() + timeout
  local timed_out, cancelled = false, false
  while not self.opened and not self.closed do
    local remaining = math.ceil(deadline - core.hrtime_ms())
    if remaining <= 0 then timed_out = true break end
    local timer, remove
    task.await(function(done)
      local fired = false
      local function once()
        if fired then return end
        fired = true
        done()
      end
      self._waiter = once
      timer = task.after(remaining, once)
      if signal then remove = signal:on_cancel(function() cancelled = true once() end) end
    end)
    self._waiter = nil
    timer.cancel()
    if remove then remove() end
    if cancelled then break end
  end
  if not self.opened then
    self:close(1001)
    if cancelled then errors.raise('CANCELLED', 'the WebSocket connection was cancelled', nil, 2) end
    if timed_out then
      errors.raise('TIMEOUT', 'the WebSocket handshake did not end within ' .. timeout .. ' ms', nil, 2)
    end
    local err = errors.new('CONNECT_FAILED', self.status and ('the WebSocket handshake was refused with HTTP '
      .. self.status) or 'the WebSocket connection could not be made')
    err.status = self.status
    error(err, 2)
  end
  return self
end

return M
