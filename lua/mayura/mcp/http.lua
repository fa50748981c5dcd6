--- mayura.mcp.http: the MCP Streamable HTTP transport on loopback, over luv TCP.
--
--   local http = require('mayura.mcp.http')
--   local listener = http.listen(server, { host = '127.0.0.1', port = 0, token = 'secret...',
--     path = '/mcp', allow_remote = false, origins = { 'http://localhost:3000' } })
--   listener.port; listener:close()
--
-- The core's HTTP is a client only, so this is a small HTTP/1.1 server with a
-- strict request parser (`M.parser`): request line `METHOD target HTTP/1.1`,
-- CRLF line ends, header names that are tokens, no folded lines, one
-- Content-Length of digits (no Transfer-Encoding: 501), a head of at most
-- `max_head_bytes` (16 KiB, 100 fields) and a body of at most
-- `max_message_bytes` (1 MiB: 413). A body is gathered in pieces and joined once.
--
-- Every request must come from an allowed Origin when it has one (the
-- listener's own http://127.0.0.1:port and http://localhost:port, and
-- `origins`: else 403) and carry `Authorization: Bearer <token>` (else 401);
-- the token is compared in constant time, from the head alone: a refused
-- request's body is never held (what the client still sends is dropped unread
-- for `linger_ms`, 1 s, then the connection closes). A connection that has not
-- shown the token must bring a whole head within `head_ms` (10 s, not put off
-- by trickling: else 408); one that has is kept alive, one request at a time,
-- until idle for `idle_ms` (2 minutes). At most `max_connections` (256) are
-- open, and at most `max_unauthenticated` (64) of them without the token: a new
-- connection past either closes the oldest one without the token, and is
-- refused only when every place holds a client that showed it, so a flood of
-- clients without the token never locks out the one with it. It listens on
-- loopback only unless `allow_remote` is set. At `path`:
--   POST    one JSON-RPC message (a batch where the revision allows): an
--           initialize without Mcp-Session-Id opens a session and answers
--           with its id; other messages need a known Mcp-Session-Id (404 once
--           the session has ended) and a supported MCP-Protocol-Version when
--           one is sent (else 400). Notifications and responses get 202; a
--           request gets its answer as JSON, or a tools/call as an SSE stream
--           (progress notifications, then the answer) when the client
--           accepts one. A client that drops such a stream cancels the call.
--   GET     405: this server has no stream of its own to offer.
--   DELETE  ends the session (its sandbox is released).
-- Sessions idle for `session_idle_ms` (30 minutes) end too.
local uv = require('luv')
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local mcp = require('mayura.mcp')

local json = core.json

local M = {}

local REASONS = {
  [200] = 'OK', [202] = 'Accepted', [204] = 'No Content', [400] = 'Bad Request', [401] = 'Unauthorized',
  [403] = 'Forbidden', [404] = 'Not Found', [405] = 'Method Not Allowed', [406] = 'Not Acceptable',
  [408] = 'Request Timeout', [413] = 'Payload Too Large', [415] = 'Unsupported Media Type',
  [431] = 'Request Header Fields Too Large', [500] = 'Internal Server Error', [501] = 'Not Implemented',
  [503] = 'Service Unavailable', [505] = 'HTTP Version Not Supported',
}

-- {======================================================
-- Parser
-- =======================================================

local TOKEN = "^[!#$%%&'*+%-.^_`|~%w]+$"

--- An incremental request parser. `p:feed(bytes)` adds bytes; `p:next()` gives the next whole
-- request `{ method, target, headers = { name = value }, body }`, or nil while one is incomplete,
-- or nil, status, message for a request that can never be valid (the connection must then close).
function M.parser(limits)
  limits = limits or {}
  local max_head = limits.max_head_bytes or 16384
  local max_fields = limits.max_fields or 100
  local max_body = limits.max_body_bytes or 1048576
  -- the head is gathered in buf (at most one read past max_head); a body in parts, joined once whole
  local p = { buf = '', failed = nil, parts = {}, size = 0 }
  function p.feed(_, data)
    if p.head then
      p.parts[#p.parts + 1] = data
      p.size = p.size + #data
    else
      p.buf = p.buf .. data
    end
  end
  --- Bytes held: what a connection costs while its request is incomplete.
  function p.held() return #p.buf + p.size end
  local function fail(status, message)
    p.failed = { status, message }
    return nil, status, message
  end
  function p.next()
    if p.failed then return nil, p.failed[1], p.failed[2] end
    local buf = p.buf
    if p.head == nil then
      -- blank lines before a request line are allowed (RFC 9112 2.2)
      while buf:sub(1, 2) == '\r\n' do buf = buf:sub(3) end
      p.buf = buf
      local stop = buf:find('\r\n\r\n', 1, true)
      if not stop then
        if #buf > max_head then return fail(431, 'the request head is over ' .. max_head .. ' bytes') end
        return nil
      end
      if stop + 3 > max_head then return fail(431, 'the request head is over ' .. max_head .. ' bytes') end
      local head = buf:sub(1, stop - 1)
      if head:find('[%z\1-\8\11\12\14-\31\127]') or head:find('\r[^\n]') or head:find('[^\r]\n')
        or head:sub(1, 1) == '\n' then
        return fail(400, 'bad characters or line ends in the request head')
      end
      local lines = {}
      for line in (head .. '\r\n'):gmatch('(.-)\r\n') do lines[#lines + 1] = line end
      local method, target, version = lines[1]:match('^(%S+) (%S+) (HTTP/%d%.%d)$')
      if not method or not method:match(TOKEN) then return fail(400, 'a bad request line') end
      if version ~= 'HTTP/1.1' then return fail(505, 'only HTTP/1.1 is spoken') end
      if target:sub(1, 1) ~= '/' or #target > 2048 then return fail(400, 'a bad request target') end
      if #lines - 1 > max_fields then return fail(431, 'more than ' .. max_fields .. ' header fields') end
      local headers = {}
      for i = 2, #lines do
        local name, value = lines[i]:match('^([^:]+):[ \t]*(.-)[ \t]*$')
        if not name or not name:match(TOKEN) then return fail(400, 'a bad header field') end
        name = name:lower()
        if headers[name] ~= nil then
          if name == 'content-length' or name == 'host' or name == 'authorization' or name == 'mcp-session-id'
            or name == 'origin' or name == 'content-type' or name == 'mcp-protocol-version' then
            if headers[name] ~= value then return fail(400, 'conflicting ' .. name .. ' fields') end
          else
            headers[name] = headers[name] .. ', ' .. value
          end
        else
          headers[name] = value
        end
      end
      if headers['transfer-encoding'] then
        return fail(501, 'Transfer-Encoding is not accepted; send Content-Length')
      end
      local length = 0
      if headers['content-length'] then
        if not headers['content-length']:match('^%d+$') or #headers['content-length'] > 12 then
          return fail(400, 'a bad Content-Length')
        end
        length = tonumber(headers['content-length'])
      end
      if length > max_body then return fail(413, 'the body is over ' .. max_body .. ' bytes') end
      p.head = { method = method, target = target, headers = headers, length = length }
      local rest = buf:sub(stop + 4)
      p.buf, p.parts, p.size = '', { rest }, #rest
    end
    local req = p.head
    if p.size < req.length then return nil end
    local body = #p.parts == 1 and p.parts[1] or table.concat(p.parts)
    req.body = body:sub(1, req.length)
    p.buf = body:sub(req.length + 1)
    p.parts, p.size = {}, 0
    p.head = nil
    req.length = nil
    return req
  end
  return p
end

-- {======================================================
-- Connections
-- =======================================================

local function is_loopback(host)
  return host == 'localhost' or host == '::1' or (type(host) == 'string' and host:match('^127%.%d+%.%d+%.%d+$') ~= nil)
end
M.is_loopback = is_loopback

-- Constant-time comparison of two strings.
local function same(a, b)
  if type(a) ~= 'string' or type(b) ~= 'string' then return false end
  local diff = #a == #b and 0 or 1
  for i = 1, #b do
    if (a:byte(i) or 0) ~= b:byte(i) then diff = 1 end
  end
  return diff == 0
end
M.same = same

local function write_head(conn, status, headers, length)
  local lines = { string.format('HTTP/1.1 %d %s', status, REASONS[status] or 'Status') }
  for _, h in ipairs(headers) do lines[#lines + 1] = h[1] .. ': ' .. h[2] end
  if length then lines[#lines + 1] = 'Content-Length: ' .. length end
  if conn.closing_after then lines[#lines + 1] = 'Connection: close' end
  return table.concat(lines, '\r\n') .. '\r\n\r\n'
end

local function send(conn, data)
  if conn.handle:is_closing() then return false end
  conn.handle:write(data)
  return true
end

local function close_conn(conn)
  if conn.closed then return end
  conn.closed = true
  if conn.idle then conn.idle.cancel() end
  conn.listener.conns[conn] = nil
  if not conn.authenticated then conn.listener.unauthenticated = conn.listener.unauthenticated - 1 end
  conn.parser = nil
  if not conn.handle:is_closing() then conn.handle:close() end
  if conn.on_close then conn.on_close() end
end

-- A whole answer; the connection then reads the next request (or closes).
local function respond(conn, status, headers, body)
  if conn.closed then return end
  body = body or ''
  send(conn, write_head(conn, status, headers, #body) .. body)
  conn.busy = false
  if conn.closing_after then
    -- a refused one lingers (refuse_head), so that what the client still sends cannot reset the answer
    conn.handle:shutdown(function() if not conn.rejected then close_conn(conn) end end)
  else
    conn.listener:deadline(conn)
    conn.listener:pump(conn)
  end
end

local function json_answer(conn, status, msg, extra)
  local headers = { { 'Content-Type', 'application/json' } }
  for _, h in ipairs(extra or {}) do headers[#headers + 1] = h end
  respond(conn, status, headers, json.encode(msg))
end

local function protocol_error(conn, status, code, message, extra)
  conn.listener.server:log({ event = 'http_refused', status = status, message = message })
  json_answer(conn, status, mcp.error_response(nil, code, message), extra)
end

local function accepts(headers, kind)
  local a = headers['accept']
  if a == nil then return false end
  return a:find(kind, 1, true) ~= nil or a:find('*/*', 1, true) ~= nil
end

local Listener = {}
Listener.__index = Listener

function Listener:touch(session)
  local entry = self.sessions[session.id]
  if not entry then return end
  if entry.idle then entry.idle.cancel() end
  entry.idle = task.after(self.session_idle_ms, function()
    task.spawn(function() self:end_session(session.id, 'idle') end)
  end, true)
end

function Listener:end_session(id, reason)
  local entry = self.sessions[id]
  if not entry then return end
  self.sessions[id] = nil
  if entry.idle then entry.idle.cancel() end
  entry.session:close(reason)
end

-- Answers a POST: one message (or a batch) for a session.
function Listener:post(conn, req)
  local h = req.headers
  local ctype = (h['content-type'] or ''):lower()
  if not ctype:match('^application/json') then
    return protocol_error(conn, 415, mcp.INVALID_REQUEST, 'Content-Type must be application/json')
  end
  if not (accepts(h, 'application/json') and accepts(h, 'text/event-stream')) then
    return protocol_error(conn, 406, mcp.INVALID_REQUEST, 'Accept must list application/json and text/event-stream')
  end
  local sid = h['mcp-session-id']
  local entry = sid and self.sessions[sid]
  if sid and not entry then
    return protocol_error(conn, 404, mcp.INVALID_REQUEST, 'no such session (it may have ended): initialize again')
  end
  local session = entry and entry.session or self.server:session('http')
  local msg, bad = session:decode(req.body)
  if not msg then
    self.server:log({ event = 'bad_message', session = sid, message = bad.error.message })
    return json_answer(conn, 400, bad)
  end
  local initialize = type(msg) == 'table' and msg.method == 'initialize'
  if not entry and not initialize then
    return protocol_error(conn, 400, mcp.INVALID_REQUEST, 'Mcp-Session-Id is required (initialize first)')
  end
  if entry and h['mcp-protocol-version'] and h['mcp-protocol-version'] ~= session.version
    and not mcp.supported(h['mcp-protocol-version']) then
    return protocol_error(conn, 400, mcp.INVALID_REQUEST, 'unsupported MCP-Protocol-Version '
      .. h['mcp-protocol-version'])
  end
  if entry then self:touch(session) end
  if not mcp.has_request(msg) then
    session:handle(nil, { send = function() end, reply = function() end }, msg)
    return respond(conn, 202, {}, '')
  end
  local stream = accepts(h, 'text/event-stream') and not initialize
    and (msg.method == 'tools/call' or type(msg[1]) == 'table')
  local extra = {}
  if stream then
    local opened = false
    local function event(m)
      if conn.closed then return end
      if not opened then
        opened = true
        send(conn, write_head(conn, 200, { { 'Content-Type', 'text/event-stream' }, { 'Cache-Control', 'no-cache' },
          { 'Transfer-Encoding', 'chunked' } }))
      end
      local data = 'event: message\ndata: ' .. json.encode(m) .. '\n\n'
      send(conn, string.format('%x\r\n%s\r\n', #data, data))
    end
    local finished = false
    conn.on_close = function()
      -- the client dropped the stream: what it asked for is no longer wanted
      if finished or type(msg) ~= 'table' or msg.id == nil then return end
      session:handle(nil, { send = function() end, reply = function() end },
        { jsonrpc = '2.0', method = 'notifications/cancelled', params = { requestId = msg.id,
          reason = 'the client closed the stream' } })
    end
    session:handle(nil, {
      send = event,
      reply = function(answer)
        finished = true
        conn.on_close = nil
        if conn.closed then return end
        if answer == nil then
          if not opened then return respond(conn, 202, {}, '') end
        else
          event(answer)
        end
        send(conn, '0\r\n\r\n')
        conn.busy = false
        if conn.closing_after then conn.handle:shutdown(function() close_conn(conn) end)
        else
          self:deadline(conn)
          self:pump(conn)
        end
      end,
    }, msg)
    return
  end
  session:handle(nil, {
    send = function() end,
    reply = function(answer)
      if conn.closed then return end
      if initialize and answer and answer.result then
        self.sessions[session.id] = { session = session }
        self:touch(session)
        extra[#extra + 1] = { 'Mcp-Session-Id', session.id }
      end
      if answer == nil then return respond(conn, 202, {}, '') end
      json_answer(conn, 200, answer, extra)
    end,
  }, msg)
end

-- Refuses a request from its head alone: the answer goes out, the connection stops reading
-- (what the client still sends is dropped unread for a moment, so that it sees the answer) and closes.
local function refuse_head(conn, status, message, extra, code)
  conn.busy = true
  conn.closing_after = true
  conn.rejected = true
  conn.parser = nil   -- a body already read goes with it
  protocol_error(conn, status, code or mcp.INVALID_REQUEST, message, extra)
  if conn.idle then conn.idle.cancel() end
  conn.idle = task.after(conn.listener.linger_ms, function()
    conn.idle = nil
    close_conn(conn)
  end, true)
end

-- The checks of a request's head, made before any of its body is read: an allowed Origin, then the
-- bearer token. Returns true when the request may go on; else the connection has been answered.
function Listener:gate(conn, head)
  local h = head.headers
  local origin = h['origin']
  if origin ~= nil and not self.origins[origin] then
    refuse_head(conn, 403, 'Origin ' .. origin .. ' is not allowed')
    return false
  end
  local auth = h['authorization'] or ''
  local given = auth:match('^[Bb]earer +(%S+)$')
  if not same(given, self.token) then
    refuse_head(conn, 401, 'a bearer token is required', { { 'WWW-Authenticate', 'Bearer' } })
    return false
  end
  head.gated = true
  if not conn.authenticated then
    conn.authenticated = true
    self.unauthenticated = self.unauthenticated - 1
  end
  return true
end

function Listener:request(conn, req)
  local h = req.headers
  if not req.gated and not self:gate(conn, req) then return end
  local path = req.target:match('^([^?]*)')
  if path ~= self.path then
    return protocol_error(conn, 404, mcp.INVALID_REQUEST, 'no endpoint at ' .. path)
  end
  if req.method == 'POST' then return self:post(conn, req) end
  if req.method == 'DELETE' then
    local sid = h['mcp-session-id']
    if not sid or not self.sessions[sid] then
      return protocol_error(conn, 404, mcp.INVALID_REQUEST, 'no such session')
    end
    task.spawn(function()
      self:end_session(sid, 'deleted')
      respond(conn, 200, {}, '')
    end)
    return
  end
  return protocol_error(conn, 405, mcp.INVALID_REQUEST, req.method .. ' is not served here',
    { { 'Allow', 'POST, DELETE' } })
end

-- Takes the next whole request of `conn`, when it is not busy with one.
function Listener:pump(conn)
  if conn.busy or conn.closed then return end
  local req, status, message = conn.parser:next()
  local head = not req and not status and conn.parser.head
  if head and not head.gated then
    -- a whole head: checked before its body is read, so no body is held for a client without the token
    if not self:gate(conn, head) then return end
    self:deadline(conn)
  end
  if req then
    conn.busy = true
    if (req.headers['connection'] or ''):lower():find('close', 1, true) then conn.closing_after = true end
    local ok, err = pcall(self.request, self, conn, req)
    if not ok then
      core.report('mcp http: ' .. tostring(err))
      conn.closing_after = true
      if conn.busy then protocol_error(conn, 500, mcp.INTERNAL_ERROR, 'internal error') end
    end
  elseif status then
    refuse_head(conn, status, message, nil, status == 413 and mcp.INVALID_REQUEST or mcp.PARSE_ERROR)
  end
end

-- The connection's timer: until a client holding the token has been served on it, a whole request
-- head must come within head_ms of the connection opening (or of the last answer); after that an
-- idle or stalled connection closes after idle_ms.
function Listener:deadline(conn)
  if conn.idle then conn.idle.cancel() end
  local waiting_head = conn.parser and conn.parser.head == nil
  local ms = (conn.authenticated or not waiting_head) and self.idle_ms or self.head_ms
  conn.idle = task.after(ms, function()
    conn.idle = nil
    if conn.busy or conn.closed then return end
    if conn.authenticated then return close_conn(conn) end
    refuse_head(conn, 408, 'no whole request head in time')
  end, true)
end

-- Makes room for a new connection by closing the oldest connection that has not shown the token;
-- false when there is none (a token holder's connection is never closed for a newcomer).
function Listener:make_room()
  local oldest
  for c in pairs(self.conns) do
    if not c.authenticated and (not oldest or c.serial < oldest.serial) then oldest = c end
  end
  if not oldest then return false end
  close_conn(oldest)
  return true
end

function Listener:accept()
  local handle = uv.new_tcp()
  if not self.tcp:accept(handle) then handle:close() return end
  handle:nodelay(true)   -- an answer goes out in a few writes: no waiting on Nagle for the last one
  -- a flood of connections costs the oldest of the flood its place, never a token holder's
  local open = 0
  for _ in pairs(self.conns) do open = open + 1 end
  while open >= self.max_connections or self.unauthenticated >= self.max_unauthenticated do
    if not self:make_room() then
      handle:close()   -- every place holds a served client: refused before a byte is read
      return
    end
    open = open - 1
  end
  self.serial = self.serial + 1
  local conn = { handle = handle, listener = self, parser = M.parser(self.limits), serial = self.serial }
  self.conns[conn] = true
  self.unauthenticated = self.unauthenticated + 1
  self:deadline(conn)
  handle:read_start(function(err, data)
    if err or not data then
      close_conn(conn)
      return
    end
    if conn.rejected then return end   -- answered from its head: the rest is dropped unread
    local p = conn.parser
    if not p then return end
    if conn.authenticated then self:deadline(conn) end   -- a head's deadline is not put off by trickling
    if conn.busy and p.held() > self.limits.max_head_bytes + self.limits.max_body_bytes then
      close_conn(conn)   -- pipelining past what one request may hold: not a client we serve
      return
    end
    p:feed(data)
    self:pump(conn)
  end)
end

--- Listens for MCP clients (see above); returns the listener.
function M.listen(server, options)
  options = options or {}
  local host = options.host or '127.0.0.1'
  if not is_loopback(host) and not options.allow_remote then
    errors.raise('PERMISSION_DENIED', 'refusing to listen on ' .. host .. ': only loopback unless allow_remote is set',
      nil, 2)
  end
  if type(options.token) ~= 'string' or #options.token < 16 or options.token:find('%s') then
    errors.raise('INVALID_CONFIG', 'the HTTP transport needs a bearer token of at least 16 characters', nil, 2)
  end
  local self = setmetatable({
    server = server, token = options.token, path = options.path or '/mcp',
    sessions = {}, conns = {}, origins = {},
    session_idle_ms = options.session_idle_ms or 1800000,
    idle_ms = options.idle_ms or 120000,
    head_ms = options.head_ms or 10000,
    linger_ms = options.linger_ms or 1000,
    max_connections = options.max_connections or 256,
    max_unauthenticated = options.max_unauthenticated or 64,
    unauthenticated = 0, serial = 0,
    limits = { max_head_bytes = options.max_head_bytes or 16384,
      max_body_bytes = options.max_message_bytes or 1048576 },
  }, Listener)
  local tcp = uv.new_tcp()
  local ok, err = tcp:bind(host == 'localhost' and '127.0.0.1' or host, options.port or 0)
  if not ok then
    tcp:close()
    errors.raise('IO_ERROR', 'cannot listen on ' .. host .. ':' .. tostring(options.port) .. ': ' .. tostring(err))
  end
  self.tcp = tcp
  self.port = tcp:getsockname().port
  self.host = host
  for _, o in ipairs({ 'http://127.0.0.1:' .. self.port, 'http://localhost:' .. self.port,
    'http://[::1]:' .. self.port }) do self.origins[o] = true end
  for _, o in ipairs(options.origins or {}) do self.origins[o] = true end
  local lok, lerr = tcp:listen(128, function(e)
    if e then return end
    self:accept()
  end)
  if not lok then
    tcp:close()
    errors.raise('IO_ERROR', 'cannot listen: ' .. tostring(lerr))
  end
  return self
end

--- The URL of the endpoint.
function Listener:url()
  local h = self.host == '::1' and '[::1]' or self.host
  return 'http://' .. h .. ':' .. self.port .. self.path
end

--- Stops listening, drops every connection and ends every session (in a task).
function Listener:close()
  if not self.tcp:is_closing() then self.tcp:close() end
  local conns = {}
  for c in pairs(self.conns) do conns[#conns + 1] = c end
  for _, c in ipairs(conns) do close_conn(c) end
  local ids = {}
  for id in pairs(self.sessions) do ids[#ids + 1] = id end
  for _, id in ipairs(ids) do self:end_session(id, 'server closed') end
end

return M
