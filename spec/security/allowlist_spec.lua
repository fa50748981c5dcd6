-- A sandbox with a network allow-list (`network = { allow = { ... } }`), on every provider here
-- that offers one, tried the way code in it would: its namespace holds its loopback and the egress
-- proxy's socket (127.0.0.1:3128) alone. A listed name is reached over plain HTTP and through
-- CONNECT with a ClientHello naming it; an unlisted name, an IP literal, a name matched by a
-- wildcard that resolves to 127.0.0.1, CONNECT to port 22 and a ClientHello naming another host
-- are refused, each as a network event of the sandbox and of the pool; raw TCP, UDP and DNS, the
-- host's loopback and addresses, and another sandbox are out of reach. "The internet" is servers
-- on the host's loopback, named through the proxy's resolver override for tests (proxy_resolve).
local providers = require('support.providers')
local common = require('security.common')
local http_server = require('support.http_server')
local util = require('support.util')
local process = require('mayura.process')
local core = require('mayura.core')
local compat = require('support.compat')
local uv = require('luv')

local sh = common.sh

local function u16(n) return string.char(math.floor(n / 256), n % 256) end

-- The handshake message of a TLS 1.2 ClientHello that asks for `name`, padded (extension 21) by
-- `pad` bytes when given.
local function hello_message(name, pad)
  local function u24(n) return string.char(math.floor(n / 65536), math.floor(n / 256) % 256, n % 256) end
  local entry = '\0' .. u16(#name) .. name
  local ext = u16(0) .. u16(#entry + 2) .. u16(#entry) .. entry
  if pad then ext = ext .. u16(21) .. u16(pad) .. string.rep('\0', pad) end
  local body = '\3\3' .. string.rep('\7', 32) .. '\0' .. u16(4) .. '\0\156\0\47' .. '\1\0' .. u16(#ext) .. ext
  return '\1' .. u24(#body) .. body
end

-- A ClientHello in one record.
local function client_hello(name)
  local hs = hello_message(name)
  return '\22\3\1' .. u16(#hs) .. hs
end

-- A padded ClientHello of about `size` bytes, a record for each of its bytes.
local function trickled_hello(name, size)
  local hs = hello_message(name, size)
  local out = {}
  for i = 1, #hs do out[i] = '\22\3\1\0\1' .. hs:sub(i, i) end
  return table.concat(out)
end

-- The bytes queued in the TCP sockets of /proc/net/tcp's text `text` that `pick(local_port,
-- remote_port)` chooses: what they hold to send (tx) and what they received unread (rx).
local function queued(text, pick)
  local tx, rx = 0, 0
  for lport, rport, txq, rxq in text:gmatch('%d+: %x+:(%x+) %x+:(%x+) %x+ (%x+):(%x+)') do
    if pick(tonumber(lport, 16), tonumber(rport, 16)) then
      tx, rx = tx + tonumber(txq, 16), rx + tonumber(rxq, 16)
    end
  end
  return tx, rx
end

local function read_file(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('a')
  f:close()
  return s
end

-- A stand-in for a TLS server: records what reaches it and answers TLS-SEEN.
local function recorder()
  local r = { data = '', tcp = uv.new_tcp(), clients = {} }
  assert(r.tcp:bind('127.0.0.1', 0))
  r.port = r.tcp:getsockname().port
  r.tcp:listen(16, function()
    local c = uv.new_tcp()
    r.tcp:accept(c)
    r.clients[#r.clients + 1] = c
    c:read_start(function(err, chunk)
      if err or not chunk then
        if not c:is_closing() then c:close() end
        return
      end
      r.data = r.data .. chunk
      c:write('TLS-SEEN\n', function() if not c:is_closing() then c:close() end end)
    end)
  end)
  function r.close()
    for _, c in ipairs(r.clients) do if not c:is_closing() then c:close() end end
    if not r.tcp:is_closing() then r.tcp:close() end
  end
  return r
end

local function has(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

-- The last event of `events` for `host` (nil when none).
local function event_for(events, host)
  for i = #events, 1, -1 do
    if events[i].host == host then return events[i] end
  end
  return nil
end

for _, prov in ipairs(providers.list()) do
  describe(prov.name .. ' sandbox with a network allow-list', function()
    local probe = prov.make_provider({})
    if not has(probe.features.network, 'allowlist') then
      it('cannot run here', function()
        pending(prov.kind == 'kubernetes' and 'Kubernetes refuses allow-lists (they would need an egress proxy in the Pod)'
          or 'the allow-list needs root on this machine (its proxy listens in the sandbox\'s namespace)')
      end)
      return
    end

    local web, tls, pool, a, b, pool_events, stall
    local host_ip

    setup(function()
      web = http_server.tcp()
      tls = recorder()
      -- a server that sends far more than anyone reads
      http_server.pattern(64 * 1048576)   -- made once, here, rather than while the spec measures
      stall = http_server.tcp(function(_, client)
        client:write('HTTP/1.1 200 OK\r\nContent-Length: ' .. 64 * 1048576 .. '\r\n\r\n')
        client:write(http_server.pattern(64 * 1048576))
      end)
      pool_events = {}
      pool = prov.make_pool({
        max_sandboxes = 2, network = { 'none', 'allowlist' },
        on_event = function(e) pool_events[#pool_events + 1] = e end,
        proxy_resolve = {
          ['packages.example.com'] = '127.0.0.1:' .. web.port,
          ['tls.example.com'] = '127.0.0.1:' .. tls.port,
          ['stall.example.com'] = '127.0.0.1:' .. stall.port,
          ['raw.example.com'] = '127.0.0.1:' .. tls.port,
          -- addresses without a port are answers of a resolver, checked as the real ones are
          ['evil.github.com'] = '127.0.0.1',
          ['metadata.example.com'] = '169.254.169.254',
          ['lan.example.com'] = { '10.1.2.3', '::ffff:127.0.0.1' },
          ['nat64.example.com'] = '64:ff9b::7f00:1',
          ['doc.example.com'] = '192.0.2.7',
          ['six.example.com'] = { 'fe80::1', 'ff02::1', '::1' },
          ['mixed.github.com'] = { '100.64.0.1', '198.18.0.1', '240.0.0.1', '0.0.0.0' },
        },
      })
      local allow = { allow = { 'Packages.Example.com.', 'tls.example.com', '*.github.com',
        'stall.example.com', 'raw.example.com', 'metadata.example.com', 'lan.example.com', 'nat64.example.com',
        'doc.example.com', 'six.example.com' } }
      a = pool:create({ lifetime_ms = 300000, network = allow, ports = { 8000 } })
      b = pool:create({ lifetime_ms = 300000, network = allow, ports = { 8000 } })
      common.install(a)
      common.install(b)
      a:write_file('/tmp/hello-ok', 'CONNECT tls.example.com:443 HTTP/1.1\r\nHost: tls.example.com:443\r\n\r\n' ..
        client_hello('TLS.example.com'))
      a:write_file('/tmp/hello-other', 'CONNECT tls.example.com:443 HTTP/1.1\r\n\r\n' ..
        client_hello('other.example.com'))
      a:write_file('/tmp/hello-trickle', 'CONNECT tls.example.com:443 HTTP/1.1\r\n\r\n' ..
        trickled_hello('tls.example.com', 16000))
      a:write_file('/tmp/pipelined', 'GET http://raw.example.com/one HTTP/1.1\r\n\r\n' ..
        'GET http://raw.example.com/two HTTP/1.1\r\n\r\n')
      a:write_file('/tmp/pipelined-connect', 'CONNECT tls.example.com:443 HTTP/1.1\r\n\r\n' ..
        'CONNECT other.example.com:443 HTTP/1.1\r\n\r\n' .. client_hello('other.example.com'))
      a:write_file('/tmp/get-stall', 'GET http://stall.example.com/ HTTP/1.1\r\n\r\n')
      a:write_file('/tmp/connect-22', 'CONNECT packages.example.com:22 HTTP/1.1\r\n\r\n')
      for _, addrs in pairs(uv.interface_addresses()) do
        for _, x in ipairs(addrs) do
          if x.family == 'inet' and not x.internal then host_ip = host_ip or x.ip end
        end
      end
    end)
    teardown(function()
      if pool then pool:close() end
      if stall then stall:close() end
      if web then web:close() end
      if tls then tls.close() end
    end)

    it('reaches a listed name over plain HTTP, through the proxy its commands are told of', function()
      local r = sh(a, 'echo "$HTTP_PROXY $https_proxy"; busybox wget -q -O - http://packages.example.com/echo?x=1')
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.truthy(r.stdout:find('http://127.0.0.1:3128 http://127.0.0.1:3128\n', 1, true))
      assert.truthy(r.stdout:find('GET /echo?x=1\n', 1, true), r.stdout)
      assert.truthy(r.stdout:lower():find('host: packages.example.com\n', 1, true), r.stdout)
      assert.truthy(r.stdout:lower():find('connection: close\n', 1, true), r.stdout)
      -- and a larger body arrives whole
      local n = 3 * 1048576 + 17
      a:write_file('/tmp/want', http_server.pattern(n))
      r = sh(a, 'busybox wget -q -O /tmp/got "http://packages.example.com/big?n=' .. n .. '" && cmp /tmp/got /tmp/want')
      assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    end)

    it('tunnels CONNECT to a listed name when the ClientHello names it, and nothing when it names another',
      function()
        local r = sh(a, 'busybox nc 127.0.0.1 3128 < /tmp/hello-ok')
        assert.truthy(r.stdout:find('HTTP/1.1 200', 1, true), r.stdout .. r.stderr)
        assert.truthy(r.stdout:find('TLS-SEEN', 1, true), r.stdout)
        assert.truthy(tls.data:find('TLS.example.com', 1, true))
        r = sh(a, 'busybox nc 127.0.0.1 3128 < /tmp/hello-other')
        assert.is_nil(r.stdout:find('TLS-SEEN', 1, true), r.stdout)
        assert.is_nil(tls.data:find('other.example.com', 1, true))
        local e = event_for(a:events(), 'tls.example.com')
        assert.are.same({ type = 'network_refused', sandbox = a.id, host = 'tls.example.com', port = 443,
          reason = 'sni_mismatch' }, e)
      end)

    it('refuses an unlisted name, an IP literal, a wildcard name resolving to 127.0.0.1 and port 22', function()
      local before = #web.requests
      local r = sh(a, 'busybox wget -q -O - http://unlisted.example.org/echo; echo "rc=$?"; ' ..
        'busybox wget -q -O - http://127.0.0.1:' .. web.port .. '/echo; echo "rc=$?"; ' ..
        'busybox wget -q -O - http://0x7f000001/echo; echo "rc=$?"; ' ..
        'busybox wget -q -O - http://evil.github.com/echo; echo "rc=$?"; ' ..
        'busybox wget -q -O - http://packages.example.com:' .. web.port .. '/echo; echo "rc=$?"; ' ..
        'busybox nc 127.0.0.1 3128 < /tmp/connect-22')
      assert.is_nil(r.stdout:find('rc=0', 1, true), r.stdout)
      assert.truthy(r.stdout:find('403', 1, true), r.stdout)
      assert.are.equal(before, #web.requests)
      local events = a:events()
      local function reason(host) local e = event_for(events, host); return e and e.reason end
      assert.are.equal('not_allowed', reason('unlisted.example.org'))
      assert.are.equal('ip_literal', reason('127.0.0.1'))
      assert.are.equal('ip_literal', reason('0x7f000001'))
      assert.are.equal('private_address', reason('evil.github.com'))
      local e22 = event_for(events, 'packages.example.com')
      assert.are.same({ 22, 'port' }, { e22.port, e22.reason })
      -- the pool heard each of them too, stamped with the sandbox's id
      local mine = 0
      for _, e in ipairs(pool_events) do
        if e.sandbox == a.id and e.type == 'network_refused' then mine = mine + 1 end
      end
      assert.is_true(mine >= 6)
    end)

    it('refuses a listed name, exact or wildcard, that resolves to the host, a private or a special address',
      function()
        local names = { 'evil.github.com', 'metadata.example.com', 'lan.example.com', 'nat64.example.com',
          'doc.example.com', 'six.example.com', 'mixed.github.com' }
        local script = {}
        for _, name in ipairs(names) do
          script[#script + 1] = 'busybox wget -q -O - http://' .. name .. '/echo; echo "rc=$?"'
        end
        local r = sh(a, table.concat(script, '; '))
        assert.is_nil(r.stdout:find('rc=0', 1, true), r.stdout)
        local events = a:events()
        for _, name in ipairs(names) do
          local e = event_for(events, name)
          assert.are.same({ name, 'private_address' }, { name, e and e.reason })
        end
      end)

    it('takes one request a connection: a pipelined second request or CONNECT reaches no server', function()
      tls.data = ''
      local r = sh(a, 'busybox nc 127.0.0.1 3128 < /tmp/pipelined')
      assert.truthy(r.stdout:find('HTTP/1.1 400', 1, true), r.stdout)
      assert.is_nil(tls.data:find('/two', 1, true), tls.data)
      assert.are.equal('bad_request', event_for(a:events(), 'raw.example.com').reason)
      r = sh(a, 'busybox nc 127.0.0.1 3128 < /tmp/pipelined-connect')
      assert.is_nil(r.stdout:find('TLS-SEEN', 1, true), r.stdout)
      assert.are.equal('', tls.data)
    end)

    it('has no route, no resolver and no raw socket: the host and its loopback are out of reach', function()
      local targets = { 'tcp:1.1.1.1:80', 'udp:1.1.1.1:53', 'tcp:127.0.0.1:' .. web.port, 'raw:1.1.1.1' }
      if host_ip then targets[#targets + 1] = 'tcp:' .. host_ip .. ':' .. web.port end
      local r = common.abuse(a, { 'net', 'packages.example.com', compat.table_unpack(targets) })
      for _, t in ipairs(targets) do
        local got = r.stdout:match(t:gsub('%p', '%%%0') .. '=(%S+)')
        assert.truthy(got, r.stdout)
        assert.is_true(got ~= 'CONNECTED' and got ~= 'SENT' and got ~= 'OPENED', t .. '=' .. got)
      end
      -- nor can it take the proxy's place
      for _, where in ipairs({ 'tcp:0.0.0.0:3128', 'tcp:127.0.0.1:3128' }) do
        r = common.abuse(a, { 'serve', where, '1000', 'fake-proxy' })
        assert.is_nil(r.stdout:find('LISTENING', 1, true), r.stdout)
      end
      r = sh(a, 'busybox nslookup packages.example.com; echo "rc=$?"; tail -n +3 /proc/net/dev | cut -d: -f1')
      assert.is_nil(r.stdout:find('rc=0', 1, true), r.stdout)
      assert.are.equal('lo', r.stdout:match('\n%s*(%S+)\n$'))
    end)

    it("serves url(port) from the host, and cannot reach another sandbox's server", function()
      local r = common.abuse(b, { 'serve', 'tcp:0.0.0.0:8000', '60000', 'from-b' })
      assert.truthy(r.stdout:find('LISTENING', 1, true), r.stdout)
      local got = process.run({ 'curl', '-s', '--max-time', '10', b:url(8000) .. '/' }, { timeout_ms = 15000 })
      assert.are.equal('from-b\n', got.stdout)
      r = common.abuse(a, { 'net', 'x', 'tcp:127.0.0.1:8000' })
      assert.is_nil(r.stdout:find('CONNECTED', 1, true), r.stdout)
      got = process.run({ 'curl', '-s', '--max-time', '10', a:url(8000) .. '/' }, { timeout_ms = 15000 })
      assert.are.equal('', got.stdout)
    end)

    it("keeps another sandbox's exec prompt while one sends ClientHellos a byte a record", function()
      local function exec_ms()
        local t0 = common.now()
        local r = b:exec({ 'true' })
        assert.are.equal(0, r.exit_code)
        return common.now() - t0
      end
      local idle = math.max(exec_ms(), exec_ms(), exec_ms())
      local before = #a:events()
      -- 48 connections, each a CONNECT and then a ClientHello of 16000 one-byte records, a record
      -- a write, the connections taking turns: the proxy gets a few bytes a read
      local sent = false
      local flood = common.spawn(function()
        local r, kv = common.abuse(a, { 'send', '127.0.0.1:3128', '/tmp/hello-trickle', '48', '6', '200', '0' },
          { timeout_ms = 120000 })
        sent = true
        return r, kv
      end)
      -- b's exec, again and again while a sends and for a second after (or until one stalls)
      local worst, t_end = 0, nil
      repeat
        worst = math.max(worst, exec_ms())
        if sent and not t_end then t_end = common.now() + 1000 end
        common.sleep(20)
      until worst >= 3000 or (t_end and common.now() > t_end)
      local _, kv = flood:wait()
      -- the figure is the benchmark's (bench/proxy.lua); this bound only tells a stalled loop (the
      -- proxy that parsed the records again on each read held it for tens of seconds)
      assert.is_true(worst < 3000, ('exec true took %.0f ms during the flood (idle: %.0f ms)'):format(worst, idle))
      -- each hello was refused once it had too many records, before the sender was done
      assert.are.equal('48', kv.conns)
      assert.are.equal('48', kv.ended)
      local refused = 0
      local events = a:events()
      for i = before + 1, #events do
        if events[i].host == 'tls.example.com' and events[i].reason == 'sni_mismatch' then refused = refused + 1 end
      end
      assert.are.equal(48, refused)
    end)

    it('holds a bounded number of bytes for connections the sandbox never reads', function()
      -- what the proxy's sockets hold: toward the sandbox (in its namespace, the proxy's end has
      -- port 3128) and from the server (in the host's, the proxy's end connects to its port)
      local function proxy_queues()
        local inside = sh(a, 'cat /proc/net/tcp').stdout
        local to_sandbox = queued(inside, function(l) return l == 3128 end)
        local _, from_server = queued(read_file('/proc/net/tcp'), function(_, r) return r == stall.port end)
        local _, established = inside:gsub(':0C38 %x+:%x+ 01 ', '')
        return to_sandbox, from_server, established
      end
      -- 64 connections held 6 s once their requests are out: the three seconds below and as many spare
      local flood = common.spawn(function()
        return common.abuse(a, { 'send', '127.0.0.1:3128', '/tmp/get-stall', '64', '4096', '0', '6000' },
          { timeout_ms = 120000 })
      end)
      -- the most they hold, over the three seconds after all 64 are there
      local most, seen, t_end = 0, 0, common.now() + 20000
      repeat
        local tx, rx, n = proxy_queues()
        if n >= 64 and seen < 64 then t_end = math.min(t_end, common.now() + 3000) end
        seen = math.max(seen, n)
        most = math.max(most, tx + rx)
        common.sleep(200)
      until common.now() > t_end
      local _, kv = flood:wait()
      assert.are.equal('64', kv.conns)
      assert.is_true(seen >= 64, seen)
      -- at most 1.5 MiB a connection (core/net.c's relay); the proxy that let the kernel size its
      -- buffers held 1.2 GiB here
      assert.is_true(most < 96 * 1048576, ('the proxy held %.1f MiB'):format(most / 1048576))
      -- and the proxy still serves once they are gone
      assert.is_true(util.eventually(function()
        local r = sh(a, 'busybox wget -q -O - http://packages.example.com/echo?again')
        return r.stdout:find('GET /echo?again', 1, true) ~= nil
      end, 10000))
    end)

    if prov.kind == 'local' then
      it('carries real TLS (curl through the proxy to an openssl server)', function()
        local dir = util.tmpdir()
        local key, cert = dir .. '/k.pem', dir .. '/c.pem'
        local made = process.run({ 'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
          '-subj', '/CN=tls.example.com', '-keyout', key, '-out', cert }, { timeout_ms = 20000 })
        assert.are.equal(0, made.exit_code, made.stderr)
        -- the recorder's port, taken over by a real TLS server for this test
        tls.close()
        local server = core.spawn({ argv = { 'openssl', 's_server', '-quiet', '-www', '-accept',
          '127.0.0.1:' .. tls.port, '-cert', cert, '-key', key }, max_output_bytes = 65536 }, function() end)
        local ok, err = pcall(function()
          local r
          for _ = 1, 50 do
            r = sh(a, 'curl -sk --max-time 5 -o /dev/null -w "%{http_code}" https://tls.example.com/')
            if r.stdout == '200' then break end
            common.sleep(100)
          end
          assert.are.equal('200', r.stdout, r.stderr)
        end)
        server:cancel()
        util.rmdir(dir)
        assert(ok, err)
      end)
    end

    it('ends its proxy and its forwards with the sandbox, and leaves nothing behind', function()
      local url = a:url(8000)
      a:release()
      local got = process.run({ 'curl', '-s', '--max-time', '5', '-o', '/dev/null', '-w', '%{http_code}', url },
        { timeout_ms = 10000 })
      assert.are.equal('000', got.stdout)
      assert.is_true(util.eventually(function() return #prov.leftovers(a) == 0 end, 10000),
        table.concat(prov.leftovers(a), ', '))
    end)
  end)
end
