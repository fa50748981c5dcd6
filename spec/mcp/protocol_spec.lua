-- mayura.mcp's protocol and transports on bad input: JSON-RPC errors over stdio (the real
-- `mayura serve` program) and over loopback HTTP (mayura.mcp.http in this process, with sessions
-- of a Lua tool), revision negotiation and batches, max_sessions, and the HTTP request parser
-- under random splits and mutations. Each bad message gets the protocol's error and the server
-- goes on serving.
local uv = require('luv')
local core = require('mayura.core')
local task = require('mayura._task')
local process = require('mayura.process')
local z = require('mayura.z')
local mcp = require('mayura.mcp')
local http = require('mayura.mcp.http')

local json = core.json
local HOST = require('support.compat').host
local TOKEN = 'spec-token-0123456789abcdef'

local function lines_of(text)
  local out = {}
  for line in text:gmatch('[^\n]+') do out[#out + 1] = json.decode(line) end
  return out
end

local function req(id, method, params)
  return json.encode({ jsonrpc = '2.0', id = id, method = method, params = params })
end

local function init(id, version)
  return req(id, 'initialize', { protocolVersion = version or '2025-11-25', capabilities = {},
    clientInfo = { name = 'spec', version = '1' } })
end

describe('mayura serve over stdio on bad input', function()
  it('answers each bad message with its error and goes on serving', function()
    local big = req(9, 'ping', { pad = string.rep('x', 9000) })
    local input = table.concat({
      req(1, 'tools/list'),                                       -- before initialize
      init(2),
      '{"jsonrpc":"2.0","method":"notifications/initialized"}',
      '{not json',
      req(3, 'no/such/method'),
      big,
      '[' .. req(4, 'ping') .. ']',                               -- a batch: 2025-11-25 forbids them
      '{"jsonrpc":"1.0","id":5,"method":"ping"}',
      req(6, 'tools/call', { name = 'workspace.read' }),          -- no arguments: a tool error, not a crash
      req(7, 'ping'),
    }, '\n') .. '\n'
    local r = process.run({ HOST, 'serve', '--policy', 'spec/mcp/policy.lua', '--max-message-bytes', '4096' },
      { stdin = input, timeout_ms = 30000 })
    assert.are.equal(0, r.exit_code, r.stderr)
    local got = lines_of(r.stdout)
    assert.are.equal(9, #got, r.stdout)
    assert.are.equal(-32600, got[1].error.code)
    assert.are.equal(1, got[1].id)
    assert.are.equal('2025-11-25', got[2].result.protocolVersion)
    assert.are.equal(-32700, got[3].error.code)
    assert.are.equal(json.null, got[3].id)
    assert.are.equal(-32601, got[4].error.code)
    assert.are.equal(3, got[4].id)
    assert.are.equal(-32600, got[5].error.code)
    assert.truthy(got[5].error.message:find('size cap', 1, true))
    assert.are.equal(-32600, got[6].error.code)
    assert.truthy(got[6].error.message:find('batches are not allowed', 1, true))
    assert.are.equal(-32600, got[7].error.code)
    assert.is_true(got[8].result.isError)
    assert.truthy(got[8].result.content[1].text:find('^INVALID_INPUT'))
    assert.are.same({ jsonrpc = '2.0', id = 7, result = {} }, got[9])
    -- stderr holds the structured log, one JSON record per line; stdout nothing but messages
    local events = {}
    for _, rec in ipairs(lines_of(r.stderr:gsub('[^\n]*mayura: the kernel[^\n]*\n', ''))) do
      events[rec.event] = (events[rec.event] or 0) + 1
    end
    assert.are.equal(3, events.bad_message)
    assert.are.equal(1, events.session_closed)
  end)

  it('takes batches in revision 2025-03-26, negotiates an unknown revision to the current one', function()
    local input = table.concat({
      init(1, '2025-03-26'),
      '[' .. req(2, 'ping') .. ',{"jsonrpc":"2.0","method":"notifications/initialized"},' .. req(3, 'tools/list') .. ']',
      '[]',
    }, '\n') .. '\n'
    local r = process.run({ HOST, 'serve', '--policy', 'spec/mcp/policy.lua' }, { stdin = input, timeout_ms = 30000 })
    local got = lines_of(r.stdout)
    assert.are.equal('2025-03-26', got[1].result.protocolVersion)
    assert.are.equal(2, #got[2])
    assert.are.equal(2, got[2][1].id)
    assert.are.equal(3, got[2][2].id)
    assert.are.equal(4, #got[2][2].result.tools)   -- workspace.remove is not granted: not listed
    assert.are.equal(-32600, got[3].error.code)
    r = process.run({ HOST, 'serve', '--policy', 'spec/mcp/policy.lua' }, { stdin = init(1, '1999-01-01') .. '\n',
      timeout_ms = 30000 })
    assert.are.equal('2025-11-25', lines_of(r.stdout)[1].result.protocolVersion)
  end)

  it('never lets a session call past the agent\'s limits', function()
    local path = os.tmpname() .. '.lua'
    local f = assert(io.open(path, 'w'))
    f:write((assert(io.open('spec/mcp/policy.lua')):read('a'):gsub("tools = { 'workspace' },",
      "tools = { 'workspace' }, limits = { max_tool_calls = 2 },")))
    f:close()
    -- bad arguments count as calls, and are answered before stdin's end cancels what still runs
    local call = req(2, 'tools/call', { name = 'workspace.read', arguments = { offset = 1 } })
    local input = table.concat({ init(1), call, (call:gsub('"id":2', '"id":3')), (call:gsub('"id":2', '"id":4')) }, '\n')
    local r = process.run({ HOST, 'serve', '--policy', path }, { stdin = input .. '\n', timeout_ms = 30000 })
    os.remove(path)
    local got = lines_of(r.stdout)
    assert.are.equal(4, #got, r.stdout .. r.stderr)
    local texts = {}
    for i = 2, 4 do texts[got[i].id] = got[i].result.content[1].text end
    local limited = 0
    for _, t in pairs(texts) do
      if t:find('^LIMIT_EXCEEDED') then limited = limited + 1 else assert.truthy(t:find('^INVALID_INPUT'), t) end
    end
    assert.are.equal(1, limited)
  end)

  it('serves standard input that is a file or /dev/null, and ends after the answers are written', function()
    local file = os.tmpname()
    local f = assert(io.open(file, 'w'))
    f:write(table.concat({ init(1), '{"jsonrpc":"2.0","method":"notifications/initialized"}', req(2, 'tools/list'),
      req(3, 'tools/call', { name = 'workspace.exec', arguments = { command = 'echo from a file' } }), req(4, 'ping') },
      '\n') .. '\n')
    f:close()
    local r = process.run({ 'sh', '-c', 'exec "$0" serve --policy spec/mcp/policy.lua < "$1"', HOST, file },
      { timeout_ms = 60000 })
    os.remove(file)
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.is_nil(r.stderr:find('traceback', 1, true), r.stderr)
    local got = lines_of(r.stdout)
    assert.are.equal(4, #got, r.stdout)
    local by_id = {}
    for _, m in ipairs(got) do by_id[m.id] = m end
    assert.are.equal('2025-11-25', by_id[1].result.protocolVersion)
    assert.are.equal(4, #by_id[2].result.tools)
    assert.are.equal('from a file\n', by_id[3].result.structuredContent.stdout)
    assert.are.same({}, by_id[4].result)
    r = process.run({ 'sh', '-c', 'exec "$0" serve --policy spec/mcp/policy.lua < /dev/null', HOST }, { timeout_ms = 30000 })
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal('', r.stdout)
    assert.is_nil(r.stderr:find('traceback', 1, true), r.stderr)
  end)

  it('lists only the tools the session may call, and refuses a declared one that is not granted', function()
    local input = table.concat({ init(1), req(2, 'tools/list'),
      req(3, 'tools/call', { name = 'workspace.remove', arguments = { path = 'x' } }) }, '\n') .. '\n'
    local r = process.run({ HOST, 'serve', '--policy', 'spec/mcp/policy.lua' }, { stdin = input, timeout_ms = 30000 })
    local by_id = {}
    for _, m in ipairs(lines_of(r.stdout)) do by_id[m.id] = m end
    local names = {}
    for _, t in ipairs(by_id[2].result.tools) do names[#names + 1] = t.name end
    table.sort(names)
    assert.are.same({ 'workspace.exec', 'workspace.list', 'workspace.read', 'workspace.write' }, names)
    assert.is_true(by_id[3].result.isError)
    assert.are.equal('PERMISSION_DENIED: calling workspace.remove needs the grant tool:workspace.remove',
      by_id[3].result.content[1].text)
  end)

  it('refuses to start on a policy that does not pass its check, and names it', function()
    local r = process.run({ HOST, 'serve', '--policy', 'spec/mcp/no_such_policy.lua' }, { timeout_ms = 30000 })
    assert.are.equal(1, r.exit_code)
    assert.truthy(r.stderr:find('INVALID_CONFIG', 1, true))
    assert.truthy(r.stderr:find('no_such_policy.lua', 1, true))
    r = process.run({ HOST, 'serve' }, { timeout_ms = 30000 })
    assert.are.equal(2, r.exit_code)
  end)
end)

-- {======================================================
-- HTTP, in this process
-- =======================================================

-- One raw HTTP exchange on a new connection: the answer's status, headers and body.
local function exchange(port, raw)
  return task.await(function(done)
    local tcp = uv.new_tcp()
    local chunks = {}
    tcp:connect('127.0.0.1', port, function(err)
      if err then tcp:close() return done(nil, err) end
      tcp:write(raw)
      tcp:read_start(function(rerr, data)
        if data then chunks[#chunks + 1] = data return end
        tcp:close()
        local text = table.concat(chunks)
        local head, body = text:match('^(.-)\r\n\r\n(.*)$')
        if not head then return done(nil, rerr or 'no answer: ' .. text) end
        local status = tonumber(head:match('^HTTP/1%.1 (%d+)'))
        local headers = {}
        for name, value in head:gmatch('\r\n([^:]+): ([^\r]*)') do headers[name:lower()] = value end
        if headers['transfer-encoding'] == 'chunked' then
          local plain, pos = {}, 1
          while true do
            local size_end = body:find('\r\n', pos, true)
            local size = size_end and tonumber(body:sub(pos, size_end - 1), 16)
            if not size or size == 0 then break end
            plain[#plain + 1] = body:sub(size_end + 2, size_end + 1 + size)
            pos = size_end + 2 + size + 2
          end
          body = table.concat(plain)
        end
        done({ status = status, headers = headers, body = body })
      end)
    end)
  end)
end

local function post(port, body, headers)
  local lines = { 'POST /mcp HTTP/1.1', 'Host: 127.0.0.1:' .. port, 'Connection: close',
    'Content-Type: application/json', 'Accept: application/json, text/event-stream',
    'Content-Length: ' .. #body }
  for _, h in ipairs(headers or { 'Authorization: Bearer ' .. TOKEN }) do lines[#lines + 1] = h end
  return exchange(port, table.concat(lines, '\r\n') .. '\r\n\r\n' .. body)
end

-- The JSON-RPC message of an answer (plain JSON, or the last event of an SSE stream).
local function message_of(answer)
  if (answer.headers['content-type'] or ''):find('event-stream', 1, true) then
    local last
    for data in answer.body:gmatch('data: ([^\n]*)') do last = data end
    return json.decode(last)
  end
  return json.decode(answer.body)
end

describe('mayura.mcp.http on bad input', function()
  local server, listener, closed

  local function open_session()
    local echo = {
      id = 'echo', description = 'Echoes its text.', input = z.object({ text = z.string() }),
    }
    return {
      tools = { echo },
      call = function(_, input) return { text = input.text } end,
      close = function() closed = (closed or 0) + 1 end,
    }
  end

  before_each(function()
    closed = 0
    server = mcp.server({ open_session = open_session, max_sessions = 2 })
    listener = http.listen(server, { token = TOKEN, max_message_bytes = 4096, session_idle_ms = 60000 })
  end)

  after_each(function()
    task.run(function() listener:close() end)
  end)

  local function initialize()
    local a = post(listener.port, init(1))
    assert.are.equal(200, a.status, a.body)
    return a.headers['mcp-session-id'], json.decode(a.body)
  end

  it('opens a session, calls a tool and ends the session on DELETE', function()
    task.run(function()
      local sid, msg = initialize()
      assert.are.equal(32, #sid)
      assert.are.equal('2025-11-25', msg.result.protocolVersion)
      local auth = { 'Authorization: Bearer ' .. TOKEN, 'Mcp-Session-Id: ' .. sid, 'MCP-Protocol-Version: 2025-11-25' }
      local a = post(listener.port, '{"jsonrpc":"2.0","method":"notifications/initialized"}', auth)
      assert.are.equal(202, a.status)
      a = post(listener.port, req(2, 'tools/call', { name = 'echo', arguments = { text = 'hi' } }), auth)
      assert.are.equal(200, a.status)
      local m = message_of(a)
      assert.are.same({ text = 'hi' }, m.result.structuredContent)
      a = exchange(listener.port, 'DELETE /mcp HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer ' .. TOKEN
        .. '\r\nMcp-Session-Id: ' .. sid .. '\r\n\r\n')
      assert.are.equal(200, a.status)
      assert.are.equal(1, closed)
      a = post(listener.port, req(3, 'ping'), auth)
      assert.are.equal(404, a.status)
    end)
  end)

  it('refuses a request without the token, with a wrong one, or from a foreign origin', function()
    task.run(function()
      local a = post(listener.port, init(1), {})
      assert.are.equal(401, a.status)
      assert.are.equal('Bearer', a.headers['www-authenticate'])
      assert.are.equal(-32600, json.decode(a.body).error.code)
      a = post(listener.port, init(1), { 'Authorization: Bearer ' .. TOKEN .. 'x' })
      assert.are.equal(401, a.status)
      a = post(listener.port, init(1), { 'Authorization: Bearer ' .. TOKEN, 'Origin: http://evil.example' })
      assert.are.equal(403, a.status)
      a = post(listener.port, init(1), { 'Authorization: Bearer ' .. TOKEN,
        'Origin: http://127.0.0.1:' .. listener.port })
      assert.are.equal(200, a.status)
      assert.are.equal(1, server:active())
    end)
  end)

  it('answers malformed JSON, unknown methods, forbidden batches and oversize bodies, and keeps serving', function()
    task.run(function()
      local sid = initialize()
      local auth = { 'Authorization: Bearer ' .. TOKEN, 'Mcp-Session-Id: ' .. sid }
      local a = post(listener.port, '{oops', auth)
      assert.are.equal(400, a.status)
      assert.are.equal(-32700, json.decode(a.body).error.code)
      a = post(listener.port, req(2, 'resources/list'), auth)
      assert.are.equal(-32601, message_of(a).error.code)
      a = post(listener.port, '[' .. req(3, 'ping') .. ']', auth)
      assert.are.equal(400, a.status)
      assert.are.equal(-32600, json.decode(a.body).error.code)
      a = post(listener.port, req(4, 'ping', { pad = string.rep('y', 5000) }), auth)
      assert.are.equal(413, a.status)
      a = post(listener.port, req(5, 'ping'), { 'Authorization: Bearer ' .. TOKEN })
      assert.are.equal(400, a.status)   -- no session id
      a = post(listener.port, req(6, 'ping'), { 'Authorization: Bearer ' .. TOKEN, 'Mcp-Session-Id: ' .. sid,
        'MCP-Protocol-Version: 1999-01-01' })
      assert.are.equal(400, a.status)
      a = exchange(listener.port, 'GET /mcp HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer ' .. TOKEN
        .. '\r\nAccept: text/event-stream\r\n\r\n')
      assert.are.equal(405, a.status)
      a = exchange(listener.port, 'POST /mcp HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n')
      assert.are.equal(501, a.status)
      a = exchange(listener.port, 'garbage\r\n\r\n')
      assert.are.equal(400, a.status)
      a = post(listener.port, req(7, 'ping'), auth)
      assert.are.same({ jsonrpc = '2.0', id = 7, result = {} }, message_of(a))
    end)
  end)

  it('ends a session that stays idle past session_idle_ms', function()
    task.run(function()
      local idle = http.listen(server, { token = TOKEN, session_idle_ms = 50 })
      local a = post(idle.port, init(1))
      assert.are.equal(200, a.status)
      for _ = 1, 200 do
        if closed == 1 then break end
        task.sleep(10)
      end
      assert.are.equal(1, closed)
      a = post(idle.port, req(2, 'ping'), { 'Authorization: Bearer ' .. TOKEN,
        'Mcp-Session-Id: ' .. a.headers['mcp-session-id'] })
      assert.are.equal(404, a.status)
      idle:close()
    end)
  end)

  it('holds at most max_connections connections: a newcomer takes the place of the oldest without the token',
    function()
    task.run(function()
      local small = http.listen(server, { token = TOKEN, max_connections = 1 })
      -- a connection that has shown the token keeps its place
      local first = uv.new_tcp()
      local got = ''
      task.await(function(done) first:connect('127.0.0.1', small.port, function() done() end) end)
      first:read_start(function(_, data) if data then got = got .. data end end)
      first:write('GET /mcp HTTP/1.1\r\nAuthorization: Bearer ' .. TOKEN .. '\r\n\r\n')
      for _ = 1, 100 do
        if got:find('\r\n\r\n', 1, true) then break end
        task.sleep(10)
      end
      assert.truthy(got:find('^HTTP/1%.1 405'))
      local a, err = exchange(small.port, 'GET /mcp HTTP/1.1\r\nConnection: close\r\n\r\n')
      assert.is_nil(a)
      assert.truthy(tostring(err):find('no answer', 1, true))
      first:close()
      task.sleep(20)
      -- one that has not is closed for the next newcomer
      local idle = uv.new_tcp()
      local idle_gone = false
      task.await(function(done) idle:connect('127.0.0.1', small.port, function() done() end) end)
      idle:read_start(function(_, data) if not data then idle_gone = true end end)
      task.sleep(20)
      a = exchange(small.port, 'GET /mcp HTTP/1.1\r\nConnection: close\r\n\r\n')
      assert.are.equal(401, a.status)
      assert.is_true(idle_gone)
      idle:close()
      small:close()
    end)
  end)

  it('answers 401 from the head, before the body comes, and closes a head that does not come in time', function()
    task.run(function()
      local quick = http.listen(server, { token = TOKEN, head_ms = 100 })
      -- a head that promises a body the client never sends: answered at once
      local a = exchange(quick.port, 'POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\n'
        .. 'Content-Length: 4096\r\n\r\n')
      assert.are.equal(401, a.status)
      -- a head trickled a byte at a time is cut off at head_ms, however often bytes come
      local tcp = uv.new_tcp()
      local text, gone = '', false
      task.await(function(done) tcp:connect('127.0.0.1', quick.port, function() done() end) end)
      tcp:read_start(function(_, data) if data then text = text .. data else gone = true end end)
      local t0 = uv.now()
      for _ = 1, 40 do
        if gone then break end
        tcp:write('X')
        task.sleep(10)
      end
      assert.is_true(gone or text ~= '', 'still open after ' .. (uv.now() - t0) .. ' ms')
      assert.truthy(text:find('^HTTP/1%.1 408'))
      tcp:close()
      quick:close()
    end)
  end)

  it('opens at most max_sessions sessions', function()
    task.run(function()
      initialize()
      initialize()
      local a = post(listener.port, init(3))
      local m = json.decode(a.body)
      assert.are.equal(mcp.SERVER_BUSY, m.error.code)
      assert.truthy(m.error.message:find('max_sessions', 1, true))
    end)
  end)

  it('refuses to listen off loopback unless told, and to listen without a token', function()
    assert.raises_code('PERMISSION_DENIED', function() http.listen(server, { host = '0.0.0.0', token = TOKEN }) end)
    assert.raises_code('INVALID_CONFIG', function() http.listen(server, { token = 'short' }) end)
  end)
end)

describe('the log', function()
  it('redacts secret-like keys and the given secrets, and cuts long strings', function()
    local r = mcp.redact({ input = { command = 'curl -H "x: s3cr3t-value" host', api_key = 'k', env = { TOKEN = 'v' } },
      big = string.rep('a', 5000), n = 3 }, { 's3cr3t-value', '' })
    assert.are.equal('curl -H "x: [redacted]" host', r.input.command)
    assert.are.equal('[redacted]', r.input.api_key)
    assert.are.equal('[redacted]', r.input.env.TOKEN)
    assert.are.equal(string.rep('a', 2048) .. '...(5000 bytes)', r.big)
    assert.are.equal(3, r.n)
  end)
end)

describe('the HTTP request parser', function()
  local function parse_all(pieces, limits)
    local p = http.parser(limits)
    local out = {}
    for _, piece in ipairs(pieces) do
      p:feed(piece)
      while true do
        local r, status = p:next()
        if r then out[#out + 1] = r
        elseif status then out[#out + 1] = status break
        else break end
      end
      if type(out[#out]) == 'number' then break end
    end
    return out
  end

  local valid = 'POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello'
    .. 'DELETE /mcp HTTP/1.1\r\nMcp-Session-Id: abc\r\n\r\n'

  it('gives the same requests however the bytes are split', function()
    math.randomseed(7)
    local whole = parse_all({ valid })
    assert.are.equal(2, #whole)
    assert.are.equal('hello', whole[1].body)
    assert.are.equal('abc', whole[2].headers['mcp-session-id'])
    for _ = 1, 300 do
      local pieces, pos = {}, 1
      while pos <= #valid do
        local n = math.random(1, 12)
        pieces[#pieces + 1] = valid:sub(pos, pos + n - 1)
        pos = pos + n
      end
      assert.are.same(whole, parse_all(pieces))
    end
  end)

  it('never fails but with a status on random mutations, and holds to its caps', function()
    math.randomseed(11)
    local statuses = { [400] = true, [413] = true, [431] = true, [501] = true, [505] = true }
    for _ = 1, 2000 do
      local bytes = { valid:byte(1, -1) }
      for _ = 1, math.random(1, 4) do bytes[math.random(1, #bytes)] = math.random(0, 255) end
      local ok, out = pcall(parse_all, { string.char(table.unpack and table.unpack(bytes) or unpack(bytes)) })
      assert.is_true(ok, tostring(out))
      for _, r in ipairs(out) do
        assert.is_true(type(r) == 'table' or statuses[r] == true, tostring(r))
      end
    end
    assert.are.same({ 431 }, parse_all({ 'GET / HTTP/1.1\r\nX: ' .. string.rep('a', 20000) }))
    assert.are.same({ 413 }, parse_all({ 'POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n' }, { max_body_bytes = 10 }))
    assert.are.same({ 400 }, parse_all({ 'POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n' }))
    assert.are.same({ 400 }, parse_all({ 'GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n' }))
    assert.are.same({ 400 }, parse_all({ 'GET / HTTP/1.1\nX: a\n\n\r\n\r\n' }))
    assert.are.same({ 505 }, parse_all({ 'GET / HTTP/1.0\r\n\r\n' }))
    assert.are.same({ 400 }, parse_all({ 'POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n' }))
  end)
end)
