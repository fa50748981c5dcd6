-- A loopback HTTP/1.1 test server on luv, run on the loop the core shares.
-- One request per connection (every answer says Connection: close).
--
--   local server = require('support.http_server')
--   local srv = server.tcp()          -- or server.unix(path)
--   local srv = server.tcp(handler)   -- handler(srv, client, req) answers instead of the routes below,
--                                     -- with srv:respond(client, status, {{name, value}...}, body)
--                                     -- (support/model_server.lua and support/stand_in.lua do)
--   srv:url('/echo')                  -- http://127.0.0.1:<port>/echo
--   srv:close()                       -- closes the listener and every connection
--
-- Routes:
--   /echo          plain text: "METHOD TARGET\n", "name: value\n" per header
--                  (names lower-cased, in order), "\n", then the body as received
--   /big?n=N       N bytes of server.pattern(N)
--   /stall         reads the request, never answers
--   /reset         reads the request, closes with a TCP reset
--   /slow          five chunks, one every 30 ms (Content-Length known)
--   /status/NNN    status NNN, Retry-After: 7, X-Multi twice (a, b)
--   /chunked       Transfer-Encoding: chunked, body 'hello, chunked world'
--   /trailers      the same body, chunked, then the trailers Grpc-Status: 7 and X-Trail: yes
-- A request body may come with Content-Length or chunked. A request with Expect: 100-continue gets an interim
-- "100 Continue" (with an X-Interim header) before its body is read.
-- A request is { method, target, headers = { {name, value}..., name = value },
-- body, at_ms (when its head arrived, on the loop's clock) }.
local uv = require('luv')

local M = {}

local REASONS = {
    [200] = 'OK', [201] = 'Created', [204] = 'No Content', [400] = 'Bad Request',
    [401] = 'Unauthorized', [403] = 'Forbidden', [404] = 'Not Found', [408] = 'Request Timeout',
    [409] = 'Conflict', [413] = 'Payload Too Large', [418] = "I'm a teapot", [429] = 'Too Many Requests',
    [500] = 'Internal Server Error', [502] = 'Bad Gateway', [503] = 'Service Unavailable',
    [504] = 'Gateway Timeout', [529] = 'Overloaded',
}

local pattern_cache = {}

-- n deterministic bytes: numbered 16-byte lines, so any reordering shows.
function M.pattern(n)
    local cached = pattern_cache[n]
    if cached then return cached end
    local parts, lines = {}, math.floor(n / 16) + 1
    for i = 1, lines do parts[i] = string.format('%015d\n', i) end
    local s = table.concat(parts):sub(1, n)
    pattern_cache[n] = s
    return s
end

M.SLOW_CHUNKS = { 'slow-1;', 'slow-2;', 'slow-3;', 'slow-4;', 'slow-5.' }
M.CHUNKED_BODY = 'hello, chunked world'

-- Parses the /echo answer back into { method, target, headers = {{name, value}...}, body }.
function M.parse_echo(text)
    local head_end = text:find('\n\n', 1, true)
    assert(head_end, 'not an echo answer')
    local head, body = text:sub(1, head_end - 1), text:sub(head_end + 2)
    local out = { headers = {}, body = body }
    local first = true
    for line in (head .. '\n'):gmatch('(.-)\n') do
        if first then
            out.method, out.target = line:match('^(%S+) (%S+)$')
            first = false
        else
            local name, value = line:match('^([^:]+): ?(.*)$')
            out.headers[#out.headers + 1] = { name, value }
            out.headers[name] = out.headers[name] and (out.headers[name] .. ', ' .. value) or value
        end
    end
    return out
end

local Server = {}
Server.__index = Server

function Server:url(path)
    if self.port then return string.format('http://127.0.0.1:%d%s', self.port, path) end
    return 'http://localhost' .. path
end

function Server:forget(client)
    self.clients[client] = nil
    if not client:is_closing() then client:close() end
end

-- Writes a whole response and closes the connection once it is sent.
function Server:respond(client, status, headers, body)
    body = body or ''
    local lines = { string.format('HTTP/1.1 %d %s', status, REASONS[status] or 'Status') }
    for _, h in ipairs(headers or {}) do lines[#lines + 1] = h[1] .. ': ' .. h[2] end
    lines[#lines + 1] = 'Content-Length: ' .. #body
    lines[#lines + 1] = 'Connection: close'
    local data = table.concat(lines, '\r\n') .. '\r\n\r\n' .. body
    if client:is_closing() then return end
    client:write(data, function() self:forget(client) end)
end

function Server:route(client, req)
    if type(req.target) ~= 'string' then return self:respond(client, 400, {}, 'bad request line') end
    local path, query = req.target:match('^([^?]*)%??(.*)$')
    self.requests[#self.requests + 1] = req
    if path == '/echo' then
        local out = { req.method .. ' ' .. req.target }
        for _, h in ipairs(req.headers) do out[#out + 1] = h[1] .. ': ' .. h[2] end
        self:respond(client, 200, { { 'Content-Type', 'text/plain' } },
            table.concat(out, '\n') .. '\n\n' .. req.body)
    elseif path == '/big' then
        local n = tonumber(query:match('n=(%d+)')) or 0
        self:respond(client, 200, { { 'Content-Type', 'application/octet-stream' } }, M.pattern(n))
    elseif path == '/stall' then
        -- keep the connection open and silent; the reader notices when the client goes
        client:read_start(function(err, data)
            if err or not data then self:forget(client) end
        end)
    elseif path == '/reset' then
        self.clients[client] = nil
        if client.close_reset then client:close_reset() else client:close() end
    elseif path == '/slow' then
        local total = table.concat(M.SLOW_CHUNKS)
        client:write('HTTP/1.1 200 OK\r\nContent-Length: ' .. #total .. '\r\nConnection: close\r\n\r\n')
        local timer = uv.new_timer()
        self.timers[timer] = true
        local i = 0
        timer:start(30, 30, function()
            i = i + 1
            if client:is_closing() then
                i = #M.SLOW_CHUNKS
            else
                client:write(M.SLOW_CHUNKS[i])
            end
            if i >= #M.SLOW_CHUNKS then
                timer:stop()
                timer:close()
                self.timers[timer] = nil
                if not client:is_closing() then
                    client:shutdown(function() self:forget(client) end)
                end
            end
        end)
    elseif path:match('^/status/%d%d%d$') then
        local status = tonumber(path:sub(-3))
        local body = (status == 204 or status == 304) and '' or ('status ' .. status)
        self:respond(client, status, { { 'Retry-After', '7' }, { 'X-Multi', 'a' }, { 'X-Multi', 'b' } }, body)
    elseif path == '/chunked' or path == '/trailers' then
        local b = M.CHUNKED_BODY
        local pieces = { b:sub(1, 5), b:sub(6, 13), b:sub(14) }
        local out = { 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n' }
        for _, p in ipairs(pieces) do out[#out + 1] = string.format('%x\r\n%s\r\n', #p, p) end
        out[#out + 1] = path == '/trailers' and '0\r\nGrpc-Status: 7\r\nX-Trail: yes\r\n\r\n' or '0\r\n\r\n'
        client:write(table.concat(out), function() self:forget(client) end)
    else
        self:respond(client, 404, {}, 'no route ' .. path)
    end
end

-- The body of a chunked request once its last chunk is in `buf` (nil before).
local function dechunk(buf)
    local out, pos = {}, 1
    while true do
        local line_end = buf:find('\r\n', pos, true)
        if not line_end then return nil end
        local size = tonumber(buf:sub(pos, line_end - 1):match('^(%x+)'), 16)
        if not size then return '' end   -- not chunked after all: an empty body
        if size == 0 then return table.concat(out) end
        if #buf < line_end + 1 + size + 2 then return nil end
        out[#out + 1] = buf:sub(line_end + 2, line_end + 1 + size)
        pos = line_end + 2 + size + 2
    end
end

-- Reads one request: head, then Content-Length bytes of body (or a chunked body).
function Server:serve(client)
    self.clients[client] = true
    local head_buf, req, parts, have = '', nil, nil, 0
    client:read_start(function(err, data)
        if err or not data then
            self:forget(client)
            return
        end
        if not req then
            head_buf = head_buf .. data
            local i = head_buf:find('\r\n\r\n', 1, true)
            if not i then return end
            local head, rest = head_buf:sub(1, i - 1), head_buf:sub(i + 4)
            local first = true
            req = { headers = {}, at_ms = uv.hrtime() / 1e6 }
            for line in (head .. '\r\n'):gmatch('(.-)\r\n') do
                if first then
                    req.method, req.target = line:match('^(%S+) (%S+) HTTP/1%.%d$')
                    first = false
                else
                    local name, value = line:match('^([^:]+):%s*(.-)%s*$')
                    if name then
                        name = name:lower()
                        req.headers[#req.headers + 1] = { name, value }
                        req.headers[name] = value
                    end
                end
            end
            req.length = tonumber(req.headers['content-length'] or '0') or 0
            parts, have = { rest }, #rest
            if (req.headers['expect'] or ''):lower() == '100-continue' and have < req.length then
                client:write('HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n')
            end
        else
            parts[#parts + 1] = data
            have = have + #data
        end
        local chunked = (req.headers['transfer-encoding'] or ''):lower():find('chunked', 1, true)
        local body
        if chunked then
            body = dechunk(table.concat(parts))
            parts, have = { body or table.concat(parts) }, 0
        elseif have >= req.length then
            body = table.concat(parts):sub(1, req.length)
        end
        if body then
            client:read_stop()
            req.body = body
            if self.handler then self.handler(self, client, req) else self:route(client, req) end
        end
    end)
end

local function listen(self, handle, new_client)
    self.listener = handle
    assert(handle:listen(512, function(err)
        assert(not err, err)
        local client = new_client()
        handle:accept(client)
        self:serve(client)
    end))
    return self
end

local function new(fields)
    fields.clients, fields.timers, fields.requests = {}, {}, {}
    return setmetatable(fields, Server)
end

-- A TCP server on 127.0.0.1 and a free port.
function M.tcp(handler)
    local self = new({ handler = handler })
    local tcp = uv.new_tcp()
    assert(tcp:bind('127.0.0.1', 0))
    self.port = tcp:getsockname().port
    return listen(self, tcp, function() return uv.new_tcp() end)
end

-- A server on a unix socket at path (removed again by close).
function M.unix(path)
    local self = new({ path = path })
    local pipe = uv.new_pipe(false)
    os.remove(path)
    assert(pipe:bind(path))
    return listen(self, pipe, function() return uv.new_pipe(false) end)
end

-- A port on 127.0.0.1 where nothing listens.
function M.closed_port()
    local tcp = uv.new_tcp()
    assert(tcp:bind('127.0.0.1', 0))
    local port = tcp:getsockname().port
    tcp:close()
    return port
end

function Server:close()
    for timer in pairs(self.timers) do
        if not timer:is_closing() then timer:close() end
    end
    for client in pairs(self.clients) do
        if not client:is_closing() then client:close() end
    end
    self.timers, self.clients = {}, {}
    if self.listener and not self.listener:is_closing() then self.listener:close() end
    if self.path then os.remove(self.path) end
end

return M
