--- A loopback stand-in for model APIs, on luv and the loop the core shares.
--
--   local model_server = require('support.model_server')
--   local srv = model_server.new()          -- 127.0.0.1, a free port
--   srv:push({ status = 200, body = '{"id":"resp_1", ...}' })
--   srv:push({ status = 429, headers = { ['retry-after'] = '1' }, body = '{"error":{...}}' })
--   srv:push({ stall = true })              -- reads the request, never answers
--   srv:push(function(req) return { status = 200, body = ... } end)
--   srv:url('/v1')                          -- http://127.0.0.1:<port>/v1
--   srv.requests[1]                         -- { method, path, headers, body, json }
--   srv:close()
--
-- Every request is recorded: `method`, `path` (the request target),
-- `headers` (lower-cased names -> value; `header_list` keeps them in order),
-- `body` (as received, by Content-Length) and `json` (the body decoded, or
-- nil). Each answer is the next scripted one, in order (a function is called
-- with the request and gives one); when none is left the answer is a 500
-- whose body says so. An answer: `{ status (200), headers = { name = value },
-- body = string or a table (encoded as JSON), stall = true, delay_ms = n }`.
-- Every answer closes its connection.
local uv = require('luv')
local json = require('mayura.core').json

local M = {}

local REASONS = {
  [200] = 'OK', [400] = 'Bad Request', [401] = 'Unauthorized', [403] = 'Forbidden', [404] = 'Not Found',
  [408] = 'Request Timeout', [409] = 'Conflict', [413] = 'Payload Too Large', [429] = 'Too Many Requests',
  [500] = 'Internal Server Error', [502] = 'Bad Gateway', [503] = 'Service Unavailable',
  [504] = 'Gateway Timeout', [529] = 'Overloaded',
}

local Server = {}
Server.__index = Server

--- The URL of `path` on this server.
function Server:url(path)
  return string.format('http://127.0.0.1:%d%s', self.port, path or '')
end

--- Queues answers, in order.
function Server:push(...)
  for i = 1, select('#', ...) do
    self.queue[#self.queue + 1] = select(i, ...)
  end
end

--- How many scripted answers are still queued.
function Server:pending()
  return #self.queue
end

function Server:drop(client)
  self.clients[client] = nil
  if not client:is_closing() then client:close() end
end

function Server:send(client, answer)
  local body = answer.body or ''
  if type(body) == 'table' then body = json.encode(body) end
  local status = answer.status or 200
  local lines = { string.format('HTTP/1.1 %d %s', status, REASONS[status] or 'Status') }
  local headers = answer.headers or {}
  local names = {}
  for name in pairs(headers) do names[#names + 1] = name end
  table.sort(names)
  local has_type = false
  for _, name in ipairs(names) do
    lines[#lines + 1] = name .. ': ' .. headers[name]
    if name:lower() == 'content-type' then has_type = true end
  end
  if not has_type then lines[#lines + 1] = 'Content-Type: application/json' end
  lines[#lines + 1] = 'Content-Length: ' .. #body
  lines[#lines + 1] = 'Connection: close'
  if client:is_closing() then return end
  client:write(table.concat(lines, '\r\n') .. '\r\n\r\n' .. body, function() self:drop(client) end)
end

function Server:answer(client, req)
  self.requests[#self.requests + 1] = req
  local answer = table.remove(self.queue, 1)
  if type(answer) == 'function' then answer = answer(req) end
  if answer == nil then
    answer = { status = 500, body = '{"error":{"message":"the stand-in has no answer left","type":"stand_in"}}' }
  end
  if answer.stall then
    -- stay silent; the client's going away closes the connection
    client:read_start(function(err, data)
      if err or not data then self:drop(client) end
    end)
    return
  end
  if answer.delay_ms then
    local timer = uv.new_timer()
    self.timers[timer] = true
    timer:start(answer.delay_ms, 0, function()
      self.timers[timer] = nil
      timer:close()
      self:send(client, answer)
    end)
    return
  end
  self:send(client, answer)
end

-- Reads one request: the request line and headers, then Content-Length bytes.
function Server:serve(client)
  self.clients[client] = true
  local buf, req, need = '', nil, 0
  client:read_start(function(err, data)
    if err or not data then
      self:drop(client)
      return
    end
    buf = buf .. data
    if not req then
      local stop = buf:find('\r\n\r\n', 1, true)
      if not stop then return end
      local head = buf:sub(1, stop - 1)
      buf = buf:sub(stop + 4)
      req = { headers = {}, header_list = {} }
      local first = true
      for line in (head .. '\r\n'):gmatch('(.-)\r\n') do
        if first then
          req.method, req.path = line:match('^(%u+) (%S+) HTTP/1%.[01]$')
          first = false
        else
          local name, value = line:match('^([^:]+):%s*(.-)%s*$')
          if name then
            name = name:lower()
            req.header_list[#req.header_list + 1] = { name, value }
            req.headers[name] = value
          end
        end
      end
      need = tonumber(req.headers['content-length'] or '0') or 0
      if (req.headers['expect'] or ''):lower() == '100-continue' and #buf < need then
        client:write('HTTP/1.1 100 Continue\r\n\r\n')
      end
    end
    if #buf >= need then
      client:read_stop()
      req.body = buf:sub(1, need)
      local ok, v = pcall(json.decode, req.body)
      req.json = ok and v or nil
      self:answer(client, req)
    end
  end)
end

--- A new stand-in on 127.0.0.1 and a port of its own.
function M.new()
  local self = setmetatable({ queue = {}, requests = {}, clients = {}, timers = {} }, Server)
  local tcp = uv.new_tcp()
  assert(tcp:bind('127.0.0.1', 0))
  self.port = tcp:getsockname().port
  self.listener = tcp
  assert(tcp:listen(128, function(err)
    assert(not err, err)
    local client = uv.new_tcp()
    tcp:accept(client)
    self:serve(client)
  end))
  return self
end

--- Closes the listener, every connection and timer.
function Server:close()
  for timer in pairs(self.timers) do
    if not timer:is_closing() then timer:close() end
  end
  for client in pairs(self.clients) do
    if not client:is_closing() then client:close() end
  end
  self.timers, self.clients = {}, {}
  if not self.listener:is_closing() then self.listener:close() end
end

--- A port on 127.0.0.1 where nothing listens.
function M.closed_port()
  local tcp = uv.new_tcp()
  assert(tcp:bind('127.0.0.1', 0))
  local port = tcp:getsockname().port
  tcp:close()
  return port
end

return M
