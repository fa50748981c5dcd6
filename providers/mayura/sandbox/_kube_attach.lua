--- mayura.sandbox._kube_attach: the host's way to a sandbox's agent and ports through the
-- Kubernetes API server, over WebSockets (mayura.ws); no Pod address is needed. Private to
-- mayura.sandbox.kubernetes.
--
--   local ch, session = attach.agent(conn_opts, path, on_close)   -- a core.channel to the agent
--   session.close()                                                -- ends the attach
--   local fwd = attach.forward(conn_opts, path, port)              -- http://127.0.0.1:<p> to a port
--   fwd.url, fwd.close()
--
-- `agent` opens `.../attach?container=sandbox&stdin=true&stdout=true&stderr=true` with the
-- subprotocol `v5.channel.k8s.io` (or `v4.channel.k8s.io`): every binary message's first byte is
-- its channel (0 stdin, 1 stdout, 2 stderr, 3 the error status, 255 a close in v5). The agent
-- (`--stdio`) reads frames (core/wire.h) on its standard input and writes them on its output, so
-- stdin and stdout are bridged to one end of a core.socketpair() whose other end is the
-- core.channel of mayura.sandbox._agent_backend, unchanged. The attach's end (the Pod deleted or
-- evicted, the server gone) closes the pair, and the channel with it: the sandbox is then `gone`.
-- What the agent writes on stderr is dropped (its own words; code in the sandbox may write there).
--
-- `forward` serves a listener on 127.0.0.1 whose every connection is its own port-forward
-- (`.../portforward?ports=P`, subprotocol `v4.channel.k8s.io`): channel 0 carries its data,
-- channel 1 its errors, and the first message of each from the server is the port (2 bytes).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local ws = require('mayura.ws')
local agent_backend = require('mayura.sandbox._agent_backend')

local M = {}

local STDIN, STDOUT, ERROR, CLOSE = 0, 1, 3, 255
local MAX_MESSAGE = 16 * 1048576

-- A WebSocket to the server (`c`: ws_base, headers(), status_error(status, path) and the TLS
-- files): CONNECT_FAILED with a status is that status's SANDBOX_ERROR.
local function open(c, path, protocols, timeout_ms)
  local ok, conn = pcall(ws.connect, { url = c.ws_base .. path, headers = c.headers(), protocols = protocols,
    max_message_bytes = MAX_MESSAGE, timeout_ms = timeout_ms or 30000, ca_file = c.ca_file, ca_pem = c.ca_pem,
    client_cert = c.client_cert, client_key = c.client_key })
  if ok then return conn end
  if errors.is(conn, 'CONNECT_FAILED') and conn.status then
    local e = c.status_error(conn.status, path)
    error(e, 0)
  end
  if errors.is(conn, 'TIMEOUT') then
    error(errors.sandbox('timeout', 'kubernetes: the attach did not open in time'), 0)
  end
  error(errors.sandbox('unavailable', 'kubernetes: the API server could not be reached for an attach'), 0)
end

--- Attaches to the sandbox container of the Pod at `path` (/api/v1/namespaces/NS/pods/NAME):
-- returns the channel to its agent and `{ close }`. `on_close()` is told when the attach ends.
function M.agent(c, path, on_close)
  local uv = require('luv')
  local conn = open(c, path .. '/attach?container=sandbox&stdin=true&stdout=true&stderr=true',
    'v5.channel.k8s.io, v4.channel.k8s.io')
  local mine, its = core.socketpair()
  local pipe = uv.new_pipe(false)
  pipe:open(its)
  local session, ended = {}, false
  local ch
  -- the attach's end is the sandbox's: the pair closes, and the channel with it
  local function finish()
    if ended then return end
    ended = true
    pcall(pipe.read_stop, pipe)
    pcall(pipe.close, pipe)
    pcall(conn.close, conn)
    if on_close then on_close() end
  end
  session.close = finish
  ch = core.channel(mine, { max_frame_bytes = agent_backend.MAX_FRAME_BYTES, on_close = finish })
  -- the agent's frames out: stdin of the container
  local stdin = string.char(STDIN)
  pipe:read_start(function(err, data)
    if err or not data then
      finish()
      return
    end
    if not ended and not conn.closed then pcall(conn.send, conn, stdin .. data, true) end
  end)
  -- the container's output in: stdout to the channel, the rest dropped; its end ends it all
  task.spawn(function()
    while not ended do
      local ok, msg = pcall(conn.receive, conn)
      if ended or not ok or msg == nil or #msg == 0 then break end
      local which = msg:byte(1)
      if which == STDOUT and #msg > 1 then
        pipe:write(msg:sub(2))
      elseif which == ERROR or which == CLOSE then
        -- the status of the attach's end (the container ended), or the server closing a stream
        if which == ERROR then break end
      end
    end
    finish()
  end)
  return ch, session
end

-- Bridges one accepted TCP connection to a port-forward of `port`.
local function forward_one(c, path, port, client)
  local ok, conn = pcall(open, c, path .. '/portforward?ports=' .. port, 'v4.channel.k8s.io, portforward.k8s.io', 15000)
  if not ok then
    client:close()
    return
  end
  local done = false
  local function finish()
    if done then return end
    done = true
    pcall(client.close, client)
    pcall(conn.close, conn)
  end
  local data = string.char(0)
  client:read_start(function(err, chunk)
    if err or not chunk then return finish() end
    if not conn.closed then pcall(conn.send, conn, data .. chunk, true) end
  end)
  task.spawn(function()
    local seen = {}
    while not done do
      local rok, msg = pcall(conn.receive, conn)
      if done or not rok or msg == nil or #msg == 0 then break end
      local which = msg:byte(1)
      local body = msg:sub(2)
      -- the first message of each channel is its port
      if not seen[which] then
        seen[which] = true
        body = body:sub(3)
      end
      if which == 0 and #body > 0 then
        client:write(body)
      elseif which == 1 and #body > 0 then
        break   -- the server could not reach the port
      end
    end
    finish()
  end)
end

--- A listener on 127.0.0.1 forwarding each connection to `port` of the Pod at `path`:
-- `{ url, close }`.
function M.forward(c, path, port)
  local uv = require('luv')
  local server = uv.new_tcp()
  local ok = server:bind('127.0.0.1', 0)
  if not ok then
    server:close()
    error(errors.sandbox('unavailable', 'kubernetes: cannot listen on 127.0.0.1 for a port'), 0)
  end
  local conns = setmetatable({}, { __mode = 'k' })
  server:listen(64, function(err)
    if err then return end
    local client = uv.new_tcp()
    if not server:accept(client) then
      client:close()
      return
    end
    conns[client] = true
    task.spawn(function() forward_one(c, path, port, client) end)
  end)
  local addr = server:getsockname()
  local f = { url = 'http://127.0.0.1:' .. addr.port }
  local closed = false
  function f.close()
    if closed then return end
    closed = true
    server:close()
    for client in pairs(conns) do pcall(client.close, client) end
  end
  return f
end

return M
