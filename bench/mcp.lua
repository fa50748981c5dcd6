--- Benchmark of `mayura serve`, not a test: medians measured in one run.
--
--   build/mayura bench/mcp.lua [N] [SESSIONS]
--
-- The round trip of tools/call `workspace.exec { command = 'true' }` over stdio
-- and over Streamable HTTP (each a `mayura serve` process of its own, the
-- HTTP one on a kept-alive loopback connection) against the same exec through
-- the Lua API (a policy session's call, in this process); then SESSIONS (50)
-- HTTP sessions at once, each on its own connection and sandbox, each running
-- N/10 commands: the wall time and the calls per second.
local uv = require('luv')
local core = require('mayura.core')
local task = require('mayura._task')
local policy_mod = require('mayura.policy')

local N = tonumber(arg and arg[1]) or 200
local SESSIONS = tonumber(arg and arg[2]) or 50
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')
local json = core.json

local HOST = arg and arg[-1] or 'build/mayura'
local TOKEN = 'bench-token-' .. string.format('%08x', math.random(0, 0x7fffffff))

local POLICY = string.format([[
pool 'workspace' { provider = 'local', max_sandboxes = %d, max_lifetime_ms = 600000,
  sandbox = { lifetime_ms = 300000 } }
tools 'workspace' { exec = true }
agent 'workspace' { tools = { 'workspace' }, allow = { 'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
  'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read' } }
serve { agent = 'workspace', max_sessions = %d }
]], SESSIONS + 2, SESSIONS + 2)

local policy_file = os.tmpname() .. '.lua'
do
  local f = assert(io.open(policy_file, 'w'))
  f:write(POLICY)
  f:close()
end

local INIT = { jsonrpc = '2.0', id = 0, method = 'initialize', params = { protocolVersion = '2025-11-25',
  capabilities = {}, clientInfo = { name = 'bench', version = '1' } } }
local function call_msg(id)
  return { jsonrpc = '2.0', id = id, method = 'tools/call', params = { name = 'workspace.exec',
    arguments = { command = 'true' } } }
end

-- A child process with pipes; `on_line(line)` for each stdout line.
local function spawn(args, env, on_line, on_err)
  local stdin, stdout, stderr = uv.new_pipe(false), uv.new_pipe(false), uv.new_pipe(false)
  local handle = uv.spawn(HOST, { args = args, stdio = { stdin, stdout, stderr }, env = env }, function()
    stdin:close()
    stdout:close()
    stderr:close()
  end)
  assert(handle, 'cannot start ' .. HOST)
  local buf = ''
  stdout:read_start(function(_, data)
    if not data then return end
    buf = buf .. data
    while true do
      local i = buf:find('\n', 1, true)
      if not i then break end
      local line = buf:sub(1, i - 1)
      buf = buf:sub(i + 1)
      on_line(line)
    end
  end)
  local ebuf = ''
  stderr:read_start(function(_, data)
    if data and on_err then
      ebuf = ebuf .. data
      on_err(ebuf)
    end
  end)
  return { handle = handle, stdin = stdin }
end

-- {======================================================
-- The Lua API
-- =======================================================

local function lua_api()
  local env = policy_mod.load_policy(policy_file):open()
  local s = env:session('bench')
  local ms = bench.measure(N, function()
    local r = s.call('workspace.exec', { command = 'true' })
    assert(r.exit_code == 0)
  end, 5)
  s.close()
  env:close()
  return ms
end

-- {======================================================
-- stdio
-- =======================================================

local function stdio()
  local waiting
  local p = spawn({ 'serve', '--policy', policy_file, '--log', '/dev/null' }, nil, function(line)
    local w = waiting
    waiting = nil
    if w then w(line) end
  end)
  local function rpc(msg)
    return task.await(function(done)
      waiting = done
      p.stdin:write(json.encode(msg) .. '\n')
    end)
  end
  rpc(INIT)
  local id = 0
  local ms = bench.measure(N, function()
    id = id + 1
    local answer = json.decode(rpc(call_msg(id)))
    assert(answer.result and not answer.result.isError, 'a call failed')
  end, 5)
  p.stdin:shutdown()
  task.await(function(done) task.after(200, done) end)
  return ms
end

-- {======================================================
-- HTTP
-- =======================================================

-- A kept-alive connection: `post(msg, session_id)` returns the answer's JSON-RPC message and headers.
local function connection(port)
  local tcp = uv.new_tcp()
  tcp:nodelay(true)
  task.await(function(done) tcp:connect('127.0.0.1', port, function(err) assert(not err, err) done() end) end)
  local buf, waiting = '', nil
  local function try()
    if not waiting then return end
    local head_end = buf:find('\r\n\r\n', 1, true)
    if not head_end then return end
    local head = buf:sub(1, head_end - 1)
    local body_start = head_end + 4
    local length = tonumber(head:match('\r\n[Cc]ontent%-[Ll]ength: (%d+)'))
    local body, rest
    if length then
      if #buf < body_start + length - 1 then return end
      body, rest = buf:sub(body_start, body_start + length - 1), buf:sub(body_start + length)
    else
      local stop = buf:find('\r\n0\r\n\r\n', body_start - 2, true)
      if not stop then return end
      local raw, plain, pos = buf:sub(body_start, stop + 2), {}, 1
      while true do
        local e = raw:find('\r\n', pos, true)
        local size = e and tonumber(raw:sub(pos, e - 1), 16)
        if not size or size == 0 then break end
        plain[#plain + 1] = raw:sub(e + 2, e + 1 + size)
        pos = e + 2 + size + 2
      end
      local last
      for data in table.concat(plain):gmatch('data: ([^\n]*)') do last = data end
      body, rest = last, buf:sub(stop + 7)
    end
    buf = rest
    local w = waiting
    waiting = nil
    w(head, body)
  end
  tcp:read_start(function(_, data)
    if data then
      buf = buf .. data
      try()
    end
  end)
  local c = {}
  function c.post(msg, sid)
    local body = json.encode(msg)
    local head = 'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ' .. TOKEN
      .. '\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n'
      .. (sid and ('Mcp-Session-Id: ' .. sid .. '\r\n') or '') .. 'Content-Length: ' .. #body .. '\r\n\r\n'
    local h, b = task.await(function(done)
      waiting = done
      tcp:write(head .. body)
    end)
    return json.decode(b), h
  end
  function c.close() tcp:close() end
  return c
end

local function start_http()
  local env = {}
  for _, k in ipairs({ 'PATH', 'HOME', 'LANG' }) do
    if os.getenv(k) then env[#env + 1] = k .. '=' .. os.getenv(k) end
  end
  env[#env + 1] = 'MAYURA_MCP_TOKEN=' .. TOKEN
  local port
  local p = spawn({ 'serve', '--policy', policy_file, '--http', '127.0.0.1:0', '--log', '/dev/null' }, env,
    function() end, function(text)
      port = port or tonumber(text:match('listening on http://127%.0%.0%.1:(%d+)'))
    end)
  for _ = 1, 500 do
    if port then break end
    task.await(function(done) task.after(10, done) end)
  end
  assert(port, 'the HTTP server did not start')
  return p, port
end

local function open_session(port)
  local c = connection(port)
  local _, head = c.post(INIT)
  local sid = head:match('\r\n[Mm]cp%-[Ss]ession%-[Ii]d: (%x+)')
  return c, sid
end

local function http_round_trip(port)
  local c, sid = open_session(port)
  local id = 0
  local ms = bench.measure(N, function()
    id = id + 1
    local answer = c.post(call_msg(id), sid)
    assert(answer.result and not answer.result.isError, 'a call failed')
  end, 5)
  c.close()
  return ms
end

local function concurrent(port)
  local per = math.max(1, math.floor(N / 10))
  local t0 = uv.hrtime()
  local workers = {}
  for i = 1, SESSIONS do
    workers[i] = task.spawn(function()
      local c, sid = open_session(port)
      for k = 1, per do
        local answer = c.post(call_msg(k), sid)
        assert(answer.result and not answer.result.isError, 'a call failed: ' .. json.encode(answer))
      end
      c.close()
    end)
  end
  for _, w in ipairs(workers) do w:wait() end
  local wall = (uv.hrtime() - t0) / 1e6
  return wall, SESSIONS * per
end

task.run(function()
  local api = lua_api()
  local over_stdio = stdio()
  local p, port = start_http()
  local over_http = http_round_trip(port)
  local wall, calls = concurrent(port)
  p.handle:kill('sigterm')
  os.remove(policy_file)
  print(string.format('tools/call exec true, median of %d:', N))
  print(string.format('  Lua API (policy session call)   %8.3f ms', api))
  print(string.format('  MCP over stdio                  %8.3f ms   (+%.3f ms, x%.2f)', over_stdio,
    over_stdio - api, over_stdio / api))
  print(string.format('  MCP over HTTP (kept alive)      %8.3f ms   (+%.3f ms, x%.2f)', over_http,
    over_http - api, over_http / api))
  print(string.format('%d concurrent HTTP sessions, %d calls each: %.0f ms wall, %.0f calls/s'
    .. ' (sandbox creation included)', SESSIONS, calls / SESSIONS, wall, calls / (wall / 1000)))
end)
