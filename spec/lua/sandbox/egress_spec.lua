-- The egress proxy's rules on their own (mayura.sandbox._egress, mayura.sandbox._egress_names): host names, the allow-list's
-- matching, which resolved addresses a wildcard name may reach, and the server name of a TLS
-- ClientHello. The proxy at work is spec/security/allowlist_spec.lua.
local egress = require('mayura.sandbox._egress')
local names = require('mayura.sandbox._egress_names')   -- its rules' own file: the ClientHello reader's step count

local function u16(n) return string.char(math.floor(n / 256), n % 256) end

-- A ClientHello record with the given extensions' bytes.
local function hello(exts)
  local body = '\3\3' .. string.rep('\1', 32) .. '\0' .. u16(2) .. '\0\47' .. '\1\0' .. u16(#exts) .. exts
  local hs = '\1' .. string.char(0, math.floor(#body / 256), #body % 256) .. body
  return '\22\3\1' .. u16(#hs) .. hs
end

local function sni(...)
  local list = ''
  for _, name in ipairs({ ... }) do list = list .. '\0' .. u16(#name) .. name end
  return u16(0) .. u16(#list + 2) .. u16(#list) .. list
end

describe('the egress proxy', function()
  it('takes domain names, normalised, and refuses every spelling of an address', function()
    assert.are.equal('packages.example.com', egress.normalise_host('Packages.Example.COM.'))
    for _, h in ipairs({ '127.0.0.1', '2130706433', '0x7f000001', '0x7f.1', '017700000001', '10.1', '[::1]',
      '::1', 'example.123' }) do
      local ok, why = egress.normalise_host(h)
      assert.is_nil(ok, h)
      assert.are.equal('ip_literal', why, h)
    end
    for _, h in ipairs({ '', 'a..b', '.a.com', 'a_b.com', '-a.com', 'a b.com', ('a'):rep(64) .. '.com' }) do
      assert.is_nil((egress.normalise_host(h)), h)
    end
  end)

  it('takes a resolver override of names to addresses, and nothing else', function()
    assert.are.same({ ['a.example.com'] = { '127.0.0.1:8080' }, ['b.example.com'] = { '10.0.0.1', '::1' } },
      egress.check_resolve({ ['A.example.com.'] = '127.0.0.1:8080', ['b.example.com'] = { '10.0.0.1', '::1' } }, 1))
    assert.is_nil(egress.check_resolve(nil, 1))
    for _, bad in ipairs({ 5, { 'x' }, { a = 5 }, { a = {} }, { a = '' } }) do
      assert.raises_code('INVALID_CONFIG', egress.check_resolve, bad, 1)
    end
  end)

  it('matches exact entries and wildcards below their name only, case-insensitively', function()
    local list = egress.compile({ 'Packages.Example.com.', '*.github.com', '.example.org' })
    assert.are.equal('exact', egress.match(list, 'packages.example.com'))
    assert.are.equal('wildcard', egress.match(list, 'api.github.com'))
    assert.are.equal('wildcard', egress.match(list, 'a.b.github.com'))
    assert.are.equal('wildcard', egress.match(list, 'www.example.org'))
    assert.is_nil(egress.match(list, 'github.com'))
    assert.is_nil(egress.match(list, 'evilgithub.com'))
    assert.is_nil(egress.match(list, 'x.packages.example.com'))
    assert.is_nil(egress.match(list, 'example.com'))
  end)

  it('lets a name reach public addresses only', function()
    for _, a in ipairs({ '93.184.216.34', '1.1.1.1', '2606:4700::1111', '::ffff:8.8.8.8', '64:ff9b::808:808',
      '2a00:1450:4001::200e', '192.0.1.1', '198.51.99.1', '203.0.114.1' }) do
      assert.is_true(egress.public_address(a), a)
    end
    for _, a in ipairs({ '127.0.0.1', '127.9.9.9', '0.0.0.0', '0.1.2.3', '10.0.2.3', '172.16.0.1', '172.31.255.255',
      '192.168.1.1', '100.64.0.1', '100.127.255.254', '169.254.169.254', '192.0.0.8', '192.0.2.1', '192.88.99.1',
      '198.18.0.1', '198.19.255.255', '198.51.100.7', '203.0.113.9', '224.0.0.1', '239.1.1.1', '240.0.0.1',
      '255.255.255.255', '256.1.1.1', '::', '::1', '::127.0.0.1', 'fe80::1', 'febf::1', 'fec0::1', 'fd00::1',
      'fc00::1', 'ff02::1', '::ffff:127.0.0.1', '::ffff:7f00:1', '::ffff:169.254.169.254', '::ffff:10.0.0.1',
      '64:ff9b::a00:1', '64:ff9b::a9fe:a9fe', '64:ff9b:1::808:808', '2002:a00:1::1', '2001::1', '2001:db8::1',
      '3fff::1', '100::1', '4000::1', 'fe80::1%eth0', '1:2:3:4:5:6:7:8:9', '12345::1', 'garbage' }) do
      assert.is_false(egress.public_address(a), a)
    end
  end)

  it('reads the one server name of a ClientHello, across records, and nothing else', function()
    local h = hello(u16(10) .. u16(2) .. '\0\0' .. sni('tls.example.com'))
    assert.are.equal('tls.example.com', egress.client_hello_sni(h))
    -- split in two records
    local hs = h:sub(6)
    local two = '\22\3\1' .. u16(10) .. hs:sub(1, 10) .. '\22\3\1' .. u16(#hs - 10) .. hs:sub(11)
    assert.are.equal('tls.example.com', egress.client_hello_sni(two))
    local name, why = egress.client_hello_sni(h:sub(1, 20))
    assert.are.same({ nil, 'more' }, { name, why })
    assert.are.same({ nil, 'bad' }, { egress.client_hello_sni(hello('')) })
    assert.are.same({ nil, 'bad' }, { egress.client_hello_sni(hello(sni('a.com', 'b.com'))) })
    assert.are.same({ nil, 'bad' }, { egress.client_hello_sni(hello(sni('a.com') .. sni('b.com'))) })
    assert.are.same({ nil, 'bad' }, { egress.client_hello_sni('GET / HTTP/1.1\r\n\r\n') })
  end)

  it('reads a ClientHello as it comes, a step per piece, and refuses one of too many records', function()
    local h = hello(u16(21) .. u16(3000) .. string.rep('\0', 3000) .. sni('tls.example.com'))
    -- fed a byte at a time: once at the end, the name
    local feed, steps = egress.hello_reader(), names.hello_steps
    local name, why
    for i = 1, #h do
      name, why = feed(h:sub(i, i))
      if i < #h then assert.are.same({ nil, 'more' }, { name, why }) end
    end
    assert.are.equal('tls.example.com', name)
    assert.is_true(names.hello_steps - steps <= #h)
    -- the handshake in records of a byte each: refused at the record past the cap, having looked
    -- at no more than those records
    local hs, records = h:sub(6), {}
    for i = 1, #hs do records[i] = '\22\3\1\0\1' .. hs:sub(i, i) end
    local trickled = table.concat(records)
    feed, steps = egress.hello_reader(), names.hello_steps
    for i = 1, #trickled, 600 do
      name, why = feed(trickled:sub(i, i + 599))
      if why == 'bad' then break end
    end
    assert.are.same({ nil, 'bad' }, { name, why })
    assert.is_true(names.hello_steps - steps <= 2 * (egress.MAX_HELLO_RECORDS + 1))
    -- and under the cap, records of a few bytes still make a name
    local few = {}
    for i = 1, #hs, 100 do few[#few + 1] = '\22\3\1' .. u16(#hs:sub(i, i + 99)) .. hs:sub(i, i + 99) end
    assert.are.equal('tls.example.com', egress.client_hello_sni(table.concat(few)))
  end)
end)

describe('the egress proxy at work (in this process\'s own namespace)', function()
  local uv = require('luv')
  local task = require('mayura._task')
  local http_server = require('support.http_server')
  local web, proxy, events

  setup(function()
    web = http_server.tcp()
    events = {}
    proxy = egress.start(uv.fs_open('/proc/self/ns/net', 'r', 0), {
      allow = { 'packages.example.com' }, port = 0,
      resolve = { ['packages.example.com'] = '127.0.0.1:' .. web.port },
      on_event = function(e) events[#events + 1] = e end,
    })
  end)
  teardown(function()
    proxy:close()
    web:close()
  end)

  -- Sends `data` to the proxy and reads until it closes (or `ms` pass); returns what came.
  local function ask(data, ms)
    local c = uv.new_tcp()
    local out = task.await(function(done)
      local chunks, finished = {}, false
      local function finish()
        if finished then return end
        finished = true
        done(table.concat(chunks))
      end
      task.after(ms or 5000, finish, true)
      c:connect('127.0.0.1', proxy.port, function(err)
        if err then return finish() end
        c:write(data)
        c:read_start(function(rerr, chunk)
          if rerr or not chunk then return finish() end
          chunks[#chunks + 1] = chunk
        end)
      end)
    end)
    c:close()
    return out
  end

  it('sends a plain request on in origin form, with its Host, without Proxy-* headers, one per connection',
    function()
      local got = ask('GET http://Packages.Example.com./echo?q=1 HTTP/1.1\r\nHost: elsewhere.example\r\n' ..
        'Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\n' ..
        'X-Kept: yes\r\n\r\n')
      assert.truthy(got:find('^HTTP/1.1 200'), got)
      local body = got:match('\r\n\r\n(.*)$'):lower()
      assert.truthy(body:find('^get /echo%?q=1\n'), body)
      assert.truthy(body:find('\nhost: packages.example.com.\n', 1, true), body)
      assert.truthy(body:find('\nx%-kept: yes\n'), body)
      assert.truthy(body:find('\nconnection: close\n', 1, true), body)
      assert.is_nil(body:find('proxy-', 1, true), body)
      assert.is_nil(body:find('elsewhere', 1, true), body)
    end)

  it('answers what is no proxy request with 400 or 405, and says why', function()
    local before = #events
    assert.truthy(ask('GET /echo HTTP/1.1\r\nHost: packages.example.com\r\n\r\n'):find('^HTTP/1.1 400'))
    assert.truthy(ask('GET https://packages.example.com/ HTTP/1.1\r\n\r\n'):find('^HTTP/1.1 405'))
    assert.truthy(ask('CONNECT packages.example.com HTTP/1.1\r\n\r\n'):find('^HTTP/1.1 400'))
    assert.truthy(ask('GET http://user@packages.example.com/ HTTP/1.1\r\n\r\n'):find('^HTTP/1.1 400'))
    assert.truthy(ask('CONNECT [::1]:443 HTTP/1.1\r\n\r\n'):find('^HTTP/1.1 403'))
    local reasons = {}
    for i = before + 1, #events do reasons[#reasons + 1] = events[i].reason end
    assert.are.same({ 'bad_request', 'method', 'bad_request', 'bad_request', 'ip_literal' }, reasons)
  end)

  it('resolves names with the host\'s resolver without an override, and refuses a listed name on loopback',
    function()
    local own = egress.start(uv.fs_open('/proc/self/ns/net', 'r', 0), { allow = { 'localhost' }, port = 0,
      on_event = function(e) events[#events + 1] = e end })
    local before = #events
    local c = uv.new_tcp()
    local got = task.await(function(done)
      local chunks = {}
      c:connect('127.0.0.1', own.port, function(err)
        if err then return done('') end
        c:write('GET http://localhost/ HTTP/1.1\r\n\r\n')
        c:read_start(function(_, chunk)
          if not chunk then return done(table.concat(chunks)) end
          chunks[#chunks + 1] = chunk
        end)
      end)
    end)
    c:close()
    own:close()
    -- resolved, and refused: a listed name reaches the internet only
    assert.truthy(got:find('^HTTP/1.1 403'), got)
    assert.are.same({ 'localhost', 'private_address' }, { events[#events].host, events[#events].reason })
    assert.are.equal(before + 1, #events)
  end)

  it('takes one request a connection: nothing past a plain request\'s body reaches the server', function()
    local before, seen = #events, #web.requests
    -- a second request right after the first head
    local got = ask('GET http://packages.example.com/echo?one HTTP/1.1\r\n\r\n' ..
      'GET http://packages.example.com/echo?two HTTP/1.1\r\n\r\n')
    assert.truthy(got:find('^HTTP/1.1 400'), got)
    -- after a body of the length given
    got = ask('POST http://packages.example.com/echo?three HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody' ..
      'GET /echo?four HTTP/1.1\r\n\r\n')
    assert.truthy(got:find('^HTTP/1.1 400'), got)
    -- a chunked body, whose end only the server would find
    got = ask('POST http://packages.example.com/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n')
    assert.truthy(got:find('^HTTP/1.1 400'), got)
    assert.are.equal(seen, #web.requests)
    local reasons = {}
    for i = before + 1, #events do reasons[#reasons + 1] = events[i].reason end
    assert.are.same({ 'bad_request', 'bad_request', 'bad_request' }, reasons)
    -- a body sent after the head, as long as it says, goes through; a byte more ends the connection
    got = ask('POST http://packages.example.com/echo?five HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody')
    assert.truthy(got:find('^HTTP/1.1 200'), got)
    assert.truthy(got:find('\nbody$'), got)
  end)

  it('holds at most 64 connections of a sandbox at once, its forwards\' included', function()
    local fwd = proxy:forward(web.port)
    local conns, closed = {}, 0
    task.await(function(done)
      local connected = 0
      for i = 1, 65 do
        local c = uv.new_tcp()
        conns[i] = c
        -- the last five through the forward: the cap is the sandbox's, whichever way in
        c:connect('127.0.0.1', i > 60 and fwd or proxy.port, function()
          connected = connected + 1
          c:read_start(function(_, chunk) if not chunk then closed = closed + 1 end end)
          if connected == 65 then task.after(300, done, true) end
        end)
      end
    end)
    assert.are.equal(1, closed)
    for _, c in ipairs(conns) do c:close() end
  end)
end)
