-- mayura.ws and core.ws_connect (libwebsockets on the core's loop) against a real WebSocket
-- server, spec/npm/ws_echo.mjs on Node's `ws` package: the handshake with headers and a
-- subprotocol, text and binary messages byte for byte (a 2 MiB one too), a refused handshake
-- with its HTTP status, a server's close code, a dropped connection, a message above
-- max_message_bytes, a handshake that never ends, and no connection at all.
local ws = require('mayura.ws')
local task = require('mayura._task')
local process = require('mayura.process')
local util = require('support.util')

local function node_ws_available()
  local f = io.open('spec/npm/node_modules/ws/package.json')
  if f then f:close() end
  return f ~= nil
end

describe('mayura.ws', function()
  if not node_ws_available() then
    pending('the ws package is not installed (sh scripts/setup.sh installs spec/npm)')
    return
  end
  local dir, server, url

  setup(function()
    dir = util.tmpdir()
    local portfile = dir .. '/port'
    server = task.spawn(function()
      return process.run({ 'node', 'spec/npm/ws_echo.mjs', portfile }, { timeout_ms = 120000 })
    end)
    local port = util.eventually(function()
      local f = io.open(portfile)
      local p = f and f:read('a')
      if f then f:close() end
      return p ~= nil and p ~= '' and p
    end, 10000)
    url = 'ws://127.0.0.1:' .. assert(port)
  end)

  teardown(function()
    local conn = ws.connect({ url = url .. '/' })
    conn:receive()
    conn:send('quit')
    local r = server:wait()
    assert.are.equal(0, r.exit_code, r.stderr)
    util.rmdir(dir)
  end)

  it('does the handshake with headers and a subprotocol, and moves text and binary byte for byte', function()
    local conn = ws.connect({ url = url .. '/exec?x=1', headers = { Authorization = 'Bearer abc' },
      protocols = 'railway-shell, eyJ.jwt' })
    assert.are.equal('railway-shell', conn.protocol)
    local hello = require('mayura.core').json.decode((conn:receive({ timeout_ms = 5000 })))
    assert.are.same({ auth = 'Bearer abc', protocol = 'railway-shell', path = '/exec?x=1' }, hello)
    conn:send('hello text')
    local msg, binary = conn:receive({ timeout_ms = 5000 })
    assert.are.equal('hello text', msg)
    assert.is_false(binary)
    local bytes = {}
    for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
    local all = table.concat(bytes):rep(300)
    conn:send(all, true)
    msg, binary = conn:receive({ timeout_ms = 5000 })
    assert.is_true(msg == all)
    assert.is_true(binary)
    conn:send('big')
    msg = conn:receive({ timeout_ms = 10000 })
    assert.are.equal(2 * 1024 * 1024, #msg)
    assert.are.equal(string.rep('\7', 64), msg:sub(1, 64))
    conn:close()
    assert.is_nil(conn:receive({ timeout_ms = 5000 }))
    assert.is_true(conn.closed)
    assert.is_nil(conn.failure)
    assert.raises_code('NETWORK_ERROR', conn.send, conn, 'late')
  end)

  it('reports the server\'s close code, a dropped connection, and a message too large', function()
    local conn = ws.connect({ url = url .. '/' })
    conn:receive({ timeout_ms = 5000 })
    conn:send('close-4001')
    assert.is_nil(conn:receive({ timeout_ms = 5000 }))
    assert.are.equal(4001, conn.close_code)
    conn = ws.connect({ url = url .. '/' })
    conn:receive({ timeout_ms = 5000 })
    conn:send('drop')
    assert.is_nil(conn:receive({ timeout_ms = 5000 }))
    assert.is_nil(conn.close_code)
    assert.are.equal('NETWORK_ERROR', conn.failure)
    conn = ws.connect({ url = url .. '/', max_message_bytes = 1024 })
    conn:receive({ timeout_ms = 5000 })
    conn:send('big')
    assert.is_nil(conn:receive({ timeout_ms = 5000 }))
    assert.are.equal('LIMIT_EXCEEDED', conn.failure)
  end)

  it('raises CONNECT_FAILED with the status of a refused handshake, TIMEOUT for one that never ends', function()
    local err = assert.raises_code('CONNECT_FAILED', ws.connect, { url = url .. '/refuse',
      headers = { Authorization = 'Bearer SECRET-in-header' } })
    assert.are.equal(401, err.status)
    assert.is_falsy(tostring(err):find('SECRET', 1, true))
    assert.raises_code('TIMEOUT', ws.connect, { url = url .. '/hang', timeout_ms = 300 })
    -- nothing listens on port 1
    assert.raises_code('CONNECT_FAILED', ws.connect, { url = 'ws://127.0.0.1:1/' })
    -- a receive that times out leaves the connection open
    local conn = ws.connect({ url = url .. '/' })
    conn:receive({ timeout_ms = 5000 })
    assert.raises_code('TIMEOUT', conn.receive, conn, { timeout_ms = 50 })
    conn:send('still')
    assert.are.equal('still', conn:receive({ timeout_ms = 5000 }))
    conn:close()
  end)

  it('refuses URLs, headers and protocols that are not valid before connecting', function()
    assert.raises_code('INVALID_INPUT', ws.connect, { url = 'http://127.0.0.1/' })
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', headers = { ['Bad Name'] = 'x' } })
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', headers = { A = 'x\r\nB: y' } })
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', protocols = 'a\nb' })
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', nope = true })
  end)

  it('lets a plain interpreter that used a WebSocket end normally (the context handles leave the loop first)',
    function()
      local compat = require('support.compat')
      local code = "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path\n"
        .. "package.cpath = '" .. compat.cpath .. ";' .. package.cpath\n"
        .. "local core = require('mayura.core')\n"
        .. "local c, done\n"
        .. "c = core.ws_connect({ url = '" .. url .. "/' }, function(kind)\n"
        .. "  if kind == 'open' then c:close() elseif kind == 'close' then done = true end\n"
        .. "end)\n"
        .. "while not done do core.run_once() end\n"
        .. "print('ended')\n"
      local r = process.run({ compat.lua, '-e', code }, { timeout_ms = 30000 })
      assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
      assert.are.equal('ended\n', r.stdout)
    end)
end)

describe('mayura.ws over TLS', function()
  if not node_ws_available() then
    pending('the ws package is not installed (sh scripts/setup.sh installs spec/npm)')
    return
  end
  local dir, server, url

  -- A test authority, the server's certificate for 127.0.0.1, and a client certificate of it.
  local function make_certs(d)
    local function run(args)
      local r = process.run(args, { timeout_ms = 60000, cwd = d })
      assert(r.exit_code == 0, r.stderr)
    end
    run({ 'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca-key.pem', '-out', 'ca.pem',
      '-days', '2', '-subj', '/CN=mayura test authority' })
    for _, who in ipairs({ 'server', 'client' }) do
      run({ 'openssl', 'req', '-newkey', 'rsa:2048', '-nodes', '-keyout', who .. '-key.pem', '-out', who .. '.csr',
        '-subj', '/CN=' .. who })
      local ext = d .. '/' .. who .. '.ext'
      local f = assert(io.open(ext, 'w'))
      f:write(who == 'server' and 'subjectAltName=IP:127.0.0.1\n' or 'extendedKeyUsage=clientAuth\n')
      f:close()
      run({ 'openssl', 'x509', '-req', '-in', who .. '.csr', '-CA', 'ca.pem', '-CAkey', 'ca-key.pem',
        '-CAcreateserial', '-out', who .. '.pem', '-days', '2', '-extfile', ext })
    end
  end

  setup(function()
    dir = util.tmpdir()
    make_certs(dir)
    local portfile = dir .. '/port'
    server = task.spawn(function()
      return process.run({ 'node', 'spec/npm/ws_echo.mjs', portfile, dir }, { timeout_ms = 120000 })
    end)
    local port = util.eventually(function()
      local f = io.open(portfile)
      local p = f and f:read('a')
      if f then f:close() end
      return p ~= nil and p ~= '' and p
    end, 10000)
    url = 'wss://127.0.0.1:' .. assert(port)
  end)

  teardown(function()
    local conn = ws.connect({ url = url .. '/', ca_file = dir .. '/ca.pem' })
    conn:receive()
    conn:send('quit')
    server:wait()
    util.rmdir(dir)
  end)

  it('trusts the authority of ca_file, not the system\'s alone, and presents a client certificate', function()
    local json = require('mayura.core').json
    -- the system's authorities do not know the test one
    assert.raises_code('CONNECT_FAILED', ws.connect, { url = url .. '/', timeout_ms = 10000 })
    local conn = ws.connect({ url = url .. '/a', ca_file = dir .. '/ca.pem' })
    local hello = json.decode((conn:receive({ timeout_ms = 5000 })))
    assert.are.equal('/a', hello.path)
    assert.are.equal(json.null, hello.client)
    conn:send('over tls')
    assert.are.equal('over tls', conn:receive({ timeout_ms = 5000 }))
    conn:close()
    conn = ws.connect({ url = url .. '/b', ca_file = dir .. '/ca.pem', client_cert = dir .. '/client.pem',
      client_key = dir .. '/client-key.pem' })
    hello = json.decode((conn:receive({ timeout_ms = 5000 })))
    assert.are.equal('client', hello.client)
    conn:close()
    -- the authority as PEM text
    local f = assert(io.open(dir .. '/ca.pem'))
    local pem = f:read('a')
    f:close()
    conn = ws.connect({ url = url .. '/c', ca_pem = pem })
    assert.are.equal('/c', json.decode((conn:receive({ timeout_ms = 5000 }))).path)
    conn:close()
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', ca_pem = pem, ca_file = dir .. '/ca.pem' })
    -- text that holds no authority trusts none: the server is not believed
    assert.raises_code('CONNECT_FAILED', ws.connect, { url = url .. '/', ca_pem = 'not a certificate', timeout_ms = 10000 })
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', client_cert = dir .. '/client.pem' })
    assert.raises_code('INVALID_INPUT', ws.connect, { url = url .. '/', ca_file = '' })
  end)
end)
