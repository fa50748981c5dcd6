-- `mayura serve --http` against clients without the token: the real program on loopback, its
-- memory read from /proc while 200 unauthenticated clients each send a 1 MiB body, and a client
-- holding the token served while 300 idle connections are open. The token is checked from a
-- request's head, before any body is read; connections that have not shown it are bounded in
-- number (the oldest goes first) and in time.
local uv = require('luv')
local core = require('mayura.core')
local task = require('mayura._task')

local json = core.json
local HOST = require('support.compat').host
local TOKEN = 'serve-spec-token-0123456789abcdef'

-- Starts `mayura serve --http 127.0.0.1:0` with the specs' policy; returns its pid, port and a stop.
local function start_server()
  local stderr = uv.new_pipe(false)
  local handle, pid = uv.spawn(HOST, {
    args = { 'serve', '--policy', 'spec/mcp/policy.lua', '--http', '127.0.0.1:0' },
    env = { 'MAYURA_MCP_TOKEN=' .. TOKEN, 'PATH=' .. (os.getenv('PATH') or '/usr/bin:/bin') },
    stdio = { nil, nil, stderr },
  }, function() end)
  assert(handle, tostring(pid))
  local text = ''
  local port = task.await(function(done)
    local timer = uv.new_timer()
    timer:start(30000, 0, function() timer:close() done(nil) end)
    stderr:read_start(function(_, data)
      if not data then return end
      text = text .. data
      local p = text:match('listening on http://127%.0%.0%.1:(%d+)/mcp')
      if p and not timer:is_closing() then
        timer:stop()
        timer:close()
        done(tonumber(p))
      end
    end)
  end)
  assert(port, 'the server did not listen: ' .. text)
  return {
    pid = pid, port = port,
    stop = function()
      uv.kill(pid, 'sigterm')
      task.sleep(300)
      if not handle:is_closing() then uv.kill(pid, 'sigkill') handle:close() end
      if not stderr:is_closing() then stderr:close() end
    end,
  }
end

local function rss_kib(pid)
  local f = assert(io.open('/proc/' .. pid .. '/status', 'r'))
  local text = f:read('a') or f:read('*a')
  f:close()
  return tonumber(text:match('VmRSS:%s*(%d+)'))
end

local function connect(port)
  return task.await(function(done)
    local tcp = uv.new_tcp()
    tcp:connect('127.0.0.1', port, function(err)
      if err then tcp:close() return done(nil, err) end
      done(tcp)
    end)
  end)
end

-- An initialize with the token on a new connection: the answer's status, or nil and why not.
local function token_holder_initialize(port)
  local body = json.encode({ jsonrpc = '2.0', id = 1, method = 'initialize', params = {
    protocolVersion = '2025-11-25', capabilities = {}, clientInfo = { name = 'spec', version = '1' } } })
  local raw = table.concat({ 'POST /mcp HTTP/1.1', 'Host: 127.0.0.1:' .. port, 'Connection: close',
    'Authorization: Bearer ' .. TOKEN, 'Content-Type: application/json',
    'Accept: application/json, text/event-stream', 'Content-Length: ' .. #body }, '\r\n') .. '\r\n\r\n' .. body
  return task.await(function(done)
    local tcp = uv.new_tcp()
    local chunks, finished = {}, false
    local timer = uv.new_timer()
    local function finish(a, b)
      if finished then return end
      finished = true
      timer:close()
      if not tcp:is_closing() then tcp:close() end
      done(a, b)
    end
    timer:start(10000, 0, function() finish(nil, 'no answer in 10 s') end)
    tcp:connect('127.0.0.1', port, function(err)
      if err then return finish(nil, err) end
      tcp:write(raw)
      tcp:read_start(function(rerr, data)
        if data then chunks[#chunks + 1] = data return end
        local text = table.concat(chunks)
        local status = tonumber(text:match('^HTTP/1%.1 (%d+)'))
        finish(status, status and text or (rerr or 'closed without an answer'))
      end)
    end)
  end)
end

describe('mayura serve --http against clients without the token', function()
  local server

  before_each(function() task.run(function() server = start_server() end) end)
  after_each(function() task.run(function() server.stop() end) end)

  it('holds no body of a client without the token: 200 clients sending 1 MiB each grow it little', function()
    task.run(function()
      task.sleep(200)
      local before = rss_kib(server.pid)
      local body = string.rep('x', 1048576)
      local head = table.concat({ 'POST /mcp HTTP/1.1', 'Host: x', 'Content-Type: application/json',
        'Accept: application/json, text/event-stream', 'Content-Length: ' .. #body }, '\r\n') .. '\r\n\r\n'
      local conns, statuses, peak = {}, {}, before
      for i = 1, 200 do
        local tcp = connect(server.port)
        if tcp then
          conns[#conns + 1] = tcp
          tcp:read_start(function(_, data)
            if data and not statuses[i] then statuses[i] = tonumber(data:match('^HTTP/1%.1 (%d+)')) end
          end)
          tcp:write(head)
          tcp:write(body)
        end
        if i % 20 == 0 then
          task.sleep(50)
          peak = math.max(peak, rss_kib(server.pid))
        end
      end
      for _ = 1, 20 do
        task.sleep(100)
        peak = math.max(peak, rss_kib(server.pid))
      end
      local answered = 0
      for _, s in pairs(statuses) do
        assert.are.equal(401, s)
        answered = answered + 1
      end
      for _, tcp in ipairs(conns) do if not tcp:is_closing() then tcp:close() end end
      assert.is_true(answered >= 50, 'only ' .. answered .. ' flood clients saw their 401')
      -- 200 MiB of bodies were sent: none of it is held
      local growth = (peak - before) / 1024
      assert.is_true(growth < 16, string.format('the server grew by %.0f MiB (from %.0f MiB)', growth, before / 1024))
      local status, text = token_holder_initialize(server.port)
      assert.are.equal(200, status, tostring(text))
    end)
  end)

  it('serves the token holder while 300 idle connections are open', function()
    task.run(function()
      local conns = {}
      for _ = 1, 300 do
        local tcp = connect(server.port)
        if tcp then
          conns[#conns + 1] = tcp
          tcp:read_start(function() end)
        end
      end
      task.sleep(200)
      for _ = 1, 3 do
        local status, text = token_holder_initialize(server.port)
        assert.are.equal(200, status, tostring(text))
      end
      -- and a client that trickles a head never holds its place past the head deadline: a
      -- connection is answered 408, or closed for a newer one, not kept
      for _, tcp in ipairs(conns) do if not tcp:is_closing() then tcp:close() end end
    end)
  end)
end)
