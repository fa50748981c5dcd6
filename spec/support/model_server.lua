--- A loopback stand-in for model APIs: the server of support/http_server.lua
-- (which reads the requests) answering with scripted answers, in order.
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
local http_server = require('support.http_server')

local M = {}

local Server = {}
Server.__index = Server

--- The URL of `path` on this server.
function Server:url(path)
  return self.http:url(path or '')
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

-- Writes `answer` (headers in name order, JSON unless it says otherwise) and closes the connection.
local function send(http, client, answer)
  local body = answer.body or ''
  if type(body) == 'table' then body = json.encode(body) end
  local given = answer.headers or {}
  local names, headers, has_type = {}, {}, false
  for name in pairs(given) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    headers[#headers + 1] = { name, given[name] }
    if name:lower() == 'content-type' then has_type = true end
  end
  if not has_type then headers[#headers + 1] = { 'Content-Type', 'application/json' } end
  http:respond(client, answer.status or 200, headers, body)
end

function Server:answer(client, req)
  local http = self.http
  req.path, req.header_list = req.target, {}
  for i, h in ipairs(req.headers) do req.header_list[i] = h end
  local ok, v = pcall(json.decode, req.body)
  req.json = ok and v or nil
  self.requests[#self.requests + 1] = req
  local answer = table.remove(self.queue, 1)
  if type(answer) == 'function' then answer = answer(req) end
  if answer == nil then
    answer = { status = 500, body = '{"error":{"message":"the stand-in has no answer left","type":"stand_in"}}' }
  end
  if answer.stall then
    -- stay silent; the client's going away closes the connection
    client:read_start(function(err, data)
      if err or not data then http:forget(client) end
    end)
    return
  end
  if answer.delay_ms then
    local timer = uv.new_timer()
    http.timers[timer] = true
    timer:start(answer.delay_ms, 0, function()
      http.timers[timer] = nil
      timer:close()
      send(http, client, answer)
    end)
    return
  end
  send(http, client, answer)
end

--- A new stand-in on 127.0.0.1 and a port of its own.
function M.new()
  local self = setmetatable({ queue = {}, requests = {} }, Server)
  self.http = http_server.tcp(function(_, client, req) self:answer(client, req) end)
  self.port = self.http.port
  return self
end

--- Closes the listener, every connection and timer.
function Server:close()
  self.http:close()
end

--- A port on 127.0.0.1 where nothing listens.
M.closed_port = http_server.closed_port

return M
