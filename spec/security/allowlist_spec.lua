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

-- A TLS 1.2 ClientHello (one record) that asks for `name`.
local function client_hello(name)
  local function u16(n) return string.char(math.floor(n / 256), n % 256) end
  local function u24(n) return string.char(math.floor(n / 65536), math.floor(n / 256) % 256, n % 256) end
  local entry = '\0' .. u16(#name) .. name
  local ext = u16(0) .. u16(#entry + 2) .. u16(#entry) .. entry
  local body = '\3\3' .. string.rep('\7', 32) .. '\0' .. u16(4) .. '\0\156\0\47' .. '\1\0' .. u16(#ext) .. ext
  local hs = '\1' .. u24(#body) .. body
  return '\22\3\1' .. u16(#hs) .. hs
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
        pending('the allow-list needs root on this machine (its proxy listens in the sandbox\'s namespace)')
      end)
      return
    end

    local web, tls, pool, a, b, pool_events
    local host_ip

    setup(function()
      web = http_server.tcp()
      tls = recorder()
      pool_events = {}
      pool = prov.make_pool({
        max_sandboxes = 2, network = { 'none', 'allowlist' },
        on_event = function(e) pool_events[#pool_events + 1] = e end,
        proxy_resolve = {
          ['packages.example.com'] = '127.0.0.1:' .. web.port,
          ['tls.example.com'] = '127.0.0.1:' .. tls.port,
          ['evil.github.com'] = '127.0.0.1:' .. web.port,
        },
      })
      local allow = { allow = { 'Packages.Example.com.', 'tls.example.com', '*.github.com' } }
      a = pool:create({ lifetime_ms = 300000, network = allow, ports = { 8000 } })
      b = pool:create({ lifetime_ms = 300000, network = allow, ports = { 8000 } })
      common.install(a)
      common.install(b)
      a:write_file('/tmp/hello-ok', 'CONNECT tls.example.com:443 HTTP/1.1\r\nHost: tls.example.com:443\r\n\r\n' ..
        client_hello('TLS.example.com'))
      a:write_file('/tmp/hello-other', 'CONNECT tls.example.com:443 HTTP/1.1\r\n\r\n' ..
        client_hello('other.example.com'))
      a:write_file('/tmp/connect-22', 'CONNECT packages.example.com:22 HTTP/1.1\r\n\r\n')
      for _, addrs in pairs(uv.interface_addresses()) do
        for _, x in ipairs(addrs) do
          if x.family == 'inet' and not x.internal then host_ip = host_ip or x.ip end
        end
      end
    end)
    teardown(function()
      if pool then pool:close() end
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
