--- mayura.sandbox._egress: the egress proxy of a sandbox with a network allow-list.
--
-- A sandbox created with `network = { allow = { 'packages.example.com', '*.github.com' } }` on the
-- local or Docker provider has a network namespace with nothing but its own loopback (no route, no
-- DNS, no other interface). `start(ns_fd, options)` opens, inside that namespace, a listening
-- socket on 127.0.0.1:3128 (`PORT`) that this process holds (core.netns_socket): the proxy runs
-- here, outside the sandbox, on the loop, and makes its connections from the host's namespace.
-- Commands get HTTP_PROXY / HTTPS_PROXY (and the lower-case names) pointing at it (`env`); software
-- that ignores them cannot connect anywhere.
--
-- The proxy admits an HTTP `CONNECT host:port` and a plain HTTP request with an absolute URI
-- (`GET http://host/path`), and nothing else, when:
--   * the host is a domain name (an IP literal, in any spelling inet_aton takes, is refused), and
--     matches the allow-list, case-insensitively, a trailing dot ignored: an entry `name` matches
--     that name, `*.name` (or `.name`) any name below it, not `name` itself;
--   * the port is 80 or 443;
--   * the proxy resolves the name itself (the sandbox has no resolver) to a public address
--     (`public_address`: not loopback, "this network", private, shared, link-local, multicast,
--     documentation, benchmarking, reserved or another IANA special-purpose block, IPv4 or IPv6,
--     nor an IPv4-mapped or NAT64 address of one), whether the entry is exact or a wildcard: a
--     listed name never leads to the host or its network; it connects to the address it checked,
--     so a name that changes its answer gains nothing;
--   * for CONNECT, the TLS ClientHello that follows names (SNI) the CONNECT host; anything else
--     (no TLS, no SNI, another name, more than MAX_HELLO_RECORDS records or 64 KiB) ends the
--     tunnel before a byte reaches the server.
-- One request a connection, so a second one cannot ride on the first's admission: a plain request
-- goes on with the origin-form target, `Host` set to the URI's authority, Proxy-* headers dropped
-- and `Connection: close`, and its body is what its Content-Length says (Transfer-Encoding is
-- refused): a byte past it, such as a pipelined second request, ends the connection before it
-- reaches the server. After CONNECT only a ClientHello may follow. Bytes then flow through
-- core.relay (C, no Lua per chunk).
--
-- Each refusal is answered with 403 (or 400, or, after CONNECT's 200, the end of the connection)
-- and told to `options.on_event` as `{ type = 'network_refused', host = ..., port = ..., reason =
-- ... }`, reason one of 'not_allowed', 'ip_literal', 'port', 'private_address', 'sni_mismatch',
-- 'unresolved', 'bad_request' (a pipelined request among them), 'method'. An upstream that
-- cannot be reached is a 502, not an event.
--
-- What a sandbox can make the host do is bounded, and counted per sandbox (per proxy): a request
-- head and a ClientHello are each read once, in at most 64 reads, their bytes looked at once
-- (work linear in what arrives); at most MAX_CONNS connections at once, the forwards' included;
-- connections that end without a relay (refused, cut short) draw on a bucket of MAX_CONNS
-- refilled at FAILS_PER_S, and new connections wait in the kernel's backlog while it is empty;
-- each relay holds at most about 1.5 MiB (core/net.c: fixed socket buffers, one pipe per
-- direction, nothing read from a side while the other does not take it), so a sandbox pins at
-- most about 96 MiB of host memory through its proxy however little it reads.
--
-- `options.resolve` (for tests only: a table name -> address, or list of addresses) replaces the
-- host's resolver: a name it does not hold does not resolve. An IPv4 address with ':port' is a
-- server of the test's own "internet" (on the host's loopback or in namespaces the spec makes),
-- reached at that port and taken as public; any other address is an answer as a resolver would
-- give it, checked as those are (so specs can see a name on 169.254.169.254 refused).
--
-- `proxy:forward(port)` serves the sandbox's `port` (a server listening on its loopback or on
-- 0.0.0.0) on a host port of 127.0.0.1, connecting into the namespace for each client: url(port).
-- `proxy:close()` ends the listener, the forwards and every connection, and closes `ns_fd`.
--
-- The checks of names and addresses (the allow-list, `public_address`, the ClientHello's name) are
-- mayura.sandbox._egress_names; this file is the proxy that holds a sandbox to them.
local core = require('mayura.core')
local task = require('mayura._task')
local errors = require('mayura.errors')
local names = require('mayura.sandbox._egress_names')

local M = {}

M.PORT = 3128
M.URL = 'http://127.0.0.1:' .. M.PORT

local MAX_HEAD = 16384          -- a request's head
local HEAD_MS = 10000           -- to send the head, and (CONNECT) the ClientHello
local CONNECT_MS = 10000        -- to reach the server
local MAX_LOOKUPS = 2            -- name lookups at once per sandbox
local MAX_CONNS = 64            -- connections at once per sandbox (each holds about 7 host descriptors)
local FAILS_PER_S = 50          -- connections a second that end unrelayed (refused), after MAX_CONNS
local MAX_READS = 64            -- reads a head, and then a ClientHello, may take

--- Checks a provider's `proxy_resolve` option (nil, or a table of names to an address or a list
-- of them); raises INVALID_CONFIG at `level`.
function M.check_resolve(v, level)
  if v == nil then return nil end
  local function bad()
    errors.raise('INVALID_CONFIG',
      'proxy_resolve must map host names to an address or a list of addresses', nil, level + 2)
  end
  if type(v) ~= 'table' then bad() end
  local copy = {}
  for name, a in pairs(v) do
    if type(name) ~= 'string' then bad() end
    local list = type(a) == 'table' and a or { a }
    if #list == 0 then bad() end
    for _, x in ipairs(list) do if type(x) ~= 'string' or x == '' then bad() end end
    copy[name:lower():gsub('%.$', '')] = list
  end
  return copy
end

--- The environment commands of an allow-listed sandbox get.
function M.env()
  local no = 'localhost,127.0.0.1,::1'
  return { HTTP_PROXY = M.URL, HTTPS_PROXY = M.URL, http_proxy = M.URL, https_proxy = M.URL,
    NO_PROXY = no, no_proxy = no }
end

-- {======================================================
-- Names and addresses (mayura.sandbox._egress_names)
-- =======================================================

M.compile, M.match, M.normalise_host = names.compile, names.match, names.normalise_host
M.public_address, M.hello_reader, M.client_hello_sni = names.public_address, names.hello_reader,
  names.client_hello_sni
M.MAX_HELLO_RECORDS = names.MAX_HELLO_RECORDS

-- }======================================================

-- {======================================================
-- The proxy
-- =======================================================

local Proxy = {}
Proxy.__index = Proxy

local function reply(status, text, reason)
  local body = 'mayura egress proxy: ' .. text .. '\n'
  return ('HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s'):format(
    status, #body, reason and ('X-Mayura-Refused: ' .. reason .. '\r\n') or '', body)
end

-- Closes a luv handle once.
local function close(h)
  if h and not h:is_closing() then h:close() end
end

function Proxy:_event(host, port, reason)
  if self.on_event then
    local ok, err = pcall(self.on_event, { type = 'network_refused', host = host, port = port, reason = reason })
    if not ok then core.report('network event handler: ' .. tostring(err)) end
  end
end

-- Reads chunks from `conn`, each passed to `take(chunk)` until it returns a value (true: enough,
-- false: stop), the peer ends, the deadline or MAX_READS reads; returns that value (false at an
-- end): a peer sending a byte at a time costs the host a bounded number of callbacks.
local function read_chunks(conn, buf, take)
  if conn:is_closing() then return false end
  local reads = 0
  return task.await(function(done)
    local finished = false
    local function finish(ok)
      if finished then return end
      finished = true
      if not conn:is_closing() then conn:read_stop() end
      done(ok)
    end
    buf.abort = function() finish(false) end
    conn:read_start(function(err, chunk)
      if err or not chunk then return finish(false) end
      reads = reads + 1
      local v = take(chunk)
      if v ~= nil then return finish(v) end
      if reads >= MAX_READS then return finish(false) end
    end)
  end)
end

-- Reads a request head: the head (through its blank line) and the bytes that came after it in
-- the same reads; nil when it does not come whole within MAX_HEAD. Each byte is searched once.
local function read_head(conn, buf)
  local pieces, total, tail, head_end = {}, 0, '', nil
  local ok = read_chunks(conn, buf, function(chunk)
    local window = tail .. chunk
    pieces[#pieces + 1] = chunk
    local i = window:find('\r\n\r\n', 1, true)
    if i then
      head_end = total - #tail + i + 3
      return head_end <= MAX_HEAD
    end
    total = total + #chunk
    if total > MAX_HEAD then return false end
    tail = window:sub(-3)
    return nil
  end)
  if not ok then return nil end
  local data = table.concat(pieces)
  return data:sub(1, head_end), data:sub(head_end + 1)
end

local function write_all(conn, data)
  if conn:is_closing() then return false end
  return task.await(function(done)
    local ok = pcall(conn.write, conn, data, function(err) done(err == nil) end)
    if not ok then done(false) end
  end)
end

-- The addresses of `host` (numeric strings), through the override when there is one.
function Proxy:_resolve(host)
  if self.resolve then
    local a = self.resolve[host]
    if type(a) == 'string' then return { a } end
    if type(a) == 'table' then return a end
    return {}
  end
  local uv = require('luv')
  -- lookups run on libuv's few worker threads, which the whole process shares: a sandbox asking
  -- for many names at once waits for its own turn rather than taking them all
  if self.lookups >= MAX_LOOKUPS then
    task.await(function(done) self.lookup_queue[#self.lookup_queue + 1] = done end)
  end
  self.lookups = self.lookups + 1
  local res = task.await(function(done)
    local ok = pcall(uv.getaddrinfo, host, nil, { socktype = 'stream' },
      function(err, r) done(not err and r or nil) end)
    if not ok then done(nil) end
  end)
  self.lookups = self.lookups - 1
  local nxt = table.remove(self.lookup_queue, 1)
  if nxt then nxt() end
  local out = {}
  for _, r in ipairs(res or {}) do
    if type(r.addr) == 'string' then out[#out + 1] = r.addr end
  end
  return out
end

-- A connected luv TCP handle to one of `addrs` at `port`, or nil. Each attempt is one of the
-- proxy's handles while it lasts, so closing the proxy ends it.
function Proxy:_connect_any(addrs, port, test)
  local uv = require('luv')
  for _, addr in ipairs(addrs) do
    -- a test's override may name the port of its server too
    local a, p = addr:match('^(%d+%.%d+%.%d+%.%d+):(%d+)$')
    if test and a then addr, port = a, tonumber(p) end
    if self.closed then return nil end
    local tcp = uv.new_tcp()
    self.handles[tcp] = true
    local ok = task.await(function(done)
      local answered = false
      local function answer(v)
        if answered then return end
        answered = true
        done(v)
      end
      local timer = task.after(CONNECT_MS, function() answer(false) end, true)
      local started = pcall(tcp.connect, tcp, addr, port, function(err)
        timer.cancel()
        answer(err == nil)
      end)
      if not started then
        timer.cancel()
        answer(false)
      end
    end)
    self.handles[tcp] = nil
    if ok and not tcp:is_closing() then return tcp end
    close(tcp)
  end
  return nil
end

-- Parses a request head: { method, host, port, target (origin form), version, headers (lines) },
-- or nil and a reason.
local function parse_head(head)
  local lines = {}
  for line in head:gmatch('([^\r\n]*)\r?\n') do lines[#lines + 1] = line end
  local method, target, version = (lines[1] or ''):match('^(%u+) (%S+) HTTP/(1%.[01])$')
  if not method then return nil, 'bad_request' end
  local req = { method = method, version = version, headers = {} }
  for i = 2, #lines do
    if lines[i] ~= '' then req.headers[#req.headers + 1] = lines[i] end
  end
  -- the length of a body, so that nothing after it reaches the server: Content-Length alone
  -- (a chunked body, or a length given twice unalike, leaves its end to the server's reading)
  req.length = 0
  local length
  for _, h in ipairs(req.headers) do
    local name, value = h:match('^([^:]*):[ \t]*(.-)[ \t]*$')
    name = (name or ''):lower()
    if name == 'transfer-encoding' then return nil, 'bad_request' end
    if name == 'content-length' then
      if not value:match('^%d+$') or #value > 15 or (length and length ~= value) then return nil, 'bad_request' end
      length = value
    end
  end
  if length and method ~= 'CONNECT' then req.length = tonumber(length) end
  local authority
  if method == 'CONNECT' then
    authority = target
    req.tls = true
  else
    local scheme, rest = target:match('^(%a[%w+.-]*)://(.*)$')
    if not scheme then return nil, 'bad_request' end
    if scheme:lower() ~= 'http' then return nil, 'method' end
    authority = rest:match('^([^/?#]*)')
    local path = rest:sub(#authority + 1)
    if path == '' or path:sub(1, 1) ~= '/' then path = '/' .. path end
    req.target = path:gsub('#.*$', '')
  end
  if authority:find('@', 1, true) then return nil, 'bad_request' end
  local host, port
  if authority:sub(1, 1) == '[' then
    req.host, req.port = authority, nil
    return req, 'ip_literal'
  end
  host, port = authority:match('^([^:]+):(%d+)$')
  if not host then
    host = authority:match('^([^:]+)$')
    if not host then return nil, 'bad_request' end
    if req.tls then return nil, 'bad_request' end
    port = '80'
  end
  req.host, req.port = host, tonumber(port)
  req.authority = authority
  return req
end

-- Serves one connection accepted from the sandbox.
function Proxy:_serve(conn)
  local buf = { data = '' }
  local deadline = task.after(HEAD_MS, function() if buf.abort then buf.abort() end; close(conn) end, true)
  local function finish() deadline.cancel(); close(conn) end
  local function refuse(host, port, reason, status)
    self:_event(host, port, reason)
    write_all(conn, reply(status or '403 Forbidden', reason .. (host and (': ' .. host) or ''), reason))
    finish()
  end
  local head, rest = read_head(conn, buf)
  if not head then return finish() end
  local req, why = parse_head(head)
  if not req then return refuse(nil, nil, why, why == 'method' and '405 Method Not Allowed' or '400 Bad Request') end
  if why then return refuse(req.host, req.port, why) end
  local host, reason = M.normalise_host(req.host)
  if not host then return refuse(req.host, req.port, reason) end
  if req.port ~= 80 and req.port ~= 443 then return refuse(host, req.port, 'port') end
  if not M.match(self.list, host) then return refuse(host, req.port, 'not_allowed') end
  local addrs = self:_resolve(host)
  if #addrs == 0 then return refuse(host, req.port, 'unresolved', '502 Bad Gateway') end
  local usable = {}
  for _, a in ipairs(addrs) do
    -- a test's server (an address with its port) is its internet; any other answer is checked
    local test_server = self.resolve and a:match('^%d+%.%d+%.%d+%.%d+:%d+$')
    if test_server or M.public_address(a) then usable[#usable + 1] = a end
  end
  if #usable == 0 then return refuse(host, req.port, 'private_address') end
  -- one request a connection: a plain request's body is all that may follow its head
  local body_left
  if not req.tls then
    body_left = req.length - #rest
    if body_left < 0 then return refuse(host, req.port, 'bad_request', '400 Bad Request') end
  end
  local up = self:_connect_any(usable, req.port, self.resolve ~= nil)
  if not up then
    write_all(conn, reply('502 Bad Gateway', 'cannot reach ' .. host))
    return finish()
  end
  local prefix
  if req.tls then
    if not write_all(conn, 'HTTP/1.1 200 Connection established\r\n\r\n') then close(up); return finish() end
    local feed, got = M.hello_reader(), { rest }
    local name, state = feed(rest)
    if not name and state == 'more' then
      read_chunks(conn, buf, function(chunk)
        got[#got + 1] = chunk
        name, state = feed(chunk)
        if name or state == 'bad' then return true end
        return nil
      end)
    end
    local sni = name and M.normalise_host(name)
    if sni ~= host then
      self:_event(host, req.port, 'sni_mismatch')
      close(up)
      return finish()
    end
    prefix = table.concat(got)
  else
    local lines = { req.method .. ' ' .. req.target .. ' HTTP/' .. req.version, 'Host: ' .. req.authority }
    for _, h in ipairs(req.headers) do
      local name = (h:match('^([^:]+):') or ''):lower()
      if name ~= 'host' and name ~= 'connection' and name ~= 'keep-alive' and name:sub(1, 6) ~= 'proxy-' then
        lines[#lines + 1] = h
      end
    end
    lines[#lines + 1] = 'Connection: close'
    prefix = table.concat(lines, '\r\n') .. '\r\n\r\n' .. rest
  end
  deadline.cancel()
  return self:_relay(conn, up, prefix, false, body_left, function()
    self:_event(host, req.port, 'bad_request')
  end)
end

-- Hands two connected luv handles (or a handle and a raw descriptor) to the core's relay; true
-- when it runs (the connection is then counted until it ends). With `max_from_a`, a byte of `a`
-- past that many ends the relay and calls `on_excess`.
function Proxy:_relay(a, b, prefix, connecting, max_from_a, on_excess)
  local function drop()
    close(a)
    if type(b) == 'number' then core.close_fd(b) else close(b) end
  end
  if a:is_closing() or (type(b) ~= 'number' and b:is_closing()) or self.closed then drop(); return false end
  local holder = {}
  local relay = core.relay(a:fileno(), type(b) == 'number' and b or b:fileno(),
    { to_b = prefix ~= '' and prefix or nil, connecting_b = connecting, max_from_a = max_from_a },
    function(_, _, err)
      if holder.relay then self.relays[holder.relay] = nil end
      self.conns = self.conns - 1
      if err == 'excess' and on_excess then on_excess() end
    end)
  drop()
  if not relay then return false end
  holder.relay = relay
  self.relays[relay] = true
  return true
end

-- Accepts on `server` with `fn(conn)` in a task of its own, within the connection cap. Each
-- connection that ends without a relay (refused, cut short, unreachable) takes a token of a
-- bucket of MAX_CONNS, FAILS_PER_S a second, shared by the proxy's listeners; while it is
-- empty, new connections wait in the kernel's backlog (libuv watches a listener again only once
-- the connection it holds is accepted): a sandbox opening connections only to have them refused
-- costs the host FAILS_PER_S of them a second, and a working client is never held back.
function Proxy:_accepting(server, fn)
  local uv = require('luv')
  local function accept_one()
    if self.closed or server:is_closing() then return end
    local now = uv.now()
    self.tokens = math.min(MAX_CONNS, self.tokens + (now - self.refilled) * FAILS_PER_S / 1000)
    self.refilled = now
    if self.tokens < 1 then
      task.after(math.ceil((1 - self.tokens) * 1000 / FAILS_PER_S), accept_one, true)
      return
    end
    local conn = uv.new_tcp()
    if not pcall(server.accept, server, conn) then close(conn); return end
    if self.conns >= MAX_CONNS then close(conn); return end
    self.conns = self.conns + 1
    self.handles[conn] = true
    task.spawn(function()
      local ok, handed = pcall(fn, conn)
      if not ok then core.report('egress proxy: ' .. tostring(handed)) end
      self.handles[conn] = nil
      if not (ok and handed) then
        close(conn)
        self.conns = self.conns - 1
        self.tokens = self.tokens - 1
      end
    end)
  end
  server:listen(128, function(err)
    if err or self.closed then return end
    accept_one()
  end)
end

--- Starts the proxy of a sandbox whose network namespace `ns_fd` names (an open descriptor of its
-- /proc/<pid>/ns/net, which the proxy now owns). options: `allow` (the checked list), `on_event`,
-- `resolve` (tests only), `port` (PORT; 0 for the kernel's pick, as the benchmark does in this
-- process's own namespace: `proxy.port` says it). Raises when it cannot listen there.
function M.start(ns_fd, options)
  local uv = require('luv')
  local fd, err = core.netns_socket(ns_fd, 'listen', options.port or M.PORT)
  if not fd then
    uv.fs_close(ns_fd)
    error(err, 0)
  end
  local self = setmetatable({
    ns_fd = ns_fd, list = M.compile(options.allow), on_event = options.on_event, resolve = options.resolve,
    conns = 0, lookups = 0, lookup_queue = {}, relays = {}, handles = {}, forwards = {}, closed = false,
    tokens = MAX_CONNS, refilled = uv.now(),
  }, Proxy)
  local server = uv.new_tcp()
  local ok, opened, oerr = pcall(server.open, server, fd)
  if not ok or not opened then
    close(server)
    core.close_fd(fd)
    uv.fs_close(ns_fd)
    error(tostring(ok and oerr or opened), 0)
  end
  self.server = server
  self.port = server:getsockname().port
  self:_accepting(server, function(conn) return self:_serve(conn) end)
  return self
end

--- The proxy of a sandbox created with an allow-list, as both providers start it: in the namespace
-- `ns_fd` (owned from here), with the create `spec`'s `network.allow` and `on_event`, `resolve`
-- (tests only), and a forward of each of `spec.ports`, put in `ports` (port -> host port). Returns
-- the proxy; a failure closes what it started and raises SANDBOX_ERROR reason `unavailable`.
function M.start_sandbox(ns_fd, spec, resolve, ports)
  local function fail(what)
    error(errors.sandbox('unavailable', 'cannot connect the sandbox\'s network: ' .. what), 0)
  end
  local ok, proxy = pcall(M.start, ns_fd, { allow = spec.network.allow, on_event = spec.on_event, resolve = resolve })
  if not ok then fail('the egress proxy cannot listen: ' .. tostring(proxy)) end
  for _, port in ipairs(spec.ports or {}) do
    ports[port] = proxy:forward(port)
    if not ports[port] then proxy:close(); fail('cannot forward port ' .. port) end
  end
  return proxy
end

--- Serves the sandbox's `port` on a host port of 127.0.0.1; returns that port.
function Proxy:forward(port)
  local uv = require('luv')
  local server = uv.new_tcp()
  if not server:bind('127.0.0.1', 0) then close(server); return nil end
  self.forwards[#self.forwards + 1] = server
  self:_accepting(server, function(conn)
    local fd = core.netns_socket(self.ns_fd, 'connect', port)
    if not fd then return false end
    return self:_relay(conn, fd, '', true)
  end)
  return server:getsockname().port
end

--- Ends the proxy: its listener, forwards, connections and relays; closes the namespace descriptor.
function Proxy:close()
  if self.closed then return end
  self.closed = true
  close(self.server)
  for _, s in ipairs(self.forwards) do close(s) end
  for h in pairs(self.handles) do close(h) end
  for r in pairs(self.relays) do r:close() end
  self.relays = {}
  require('luv').fs_close(self.ns_fd)
end

-- }======================================================

return M
