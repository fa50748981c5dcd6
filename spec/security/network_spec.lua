-- The network of a sandbox with network 'all', tried the way code in it would. On the local
-- provider, a namespace of its own behind a user-mode stack: the host's loopback, its abstract
-- unix sockets, its /proc/net, its ports and the other sandboxes are out of reach, and `url(port)`
-- answers from the host. On every provider (local, Docker cli and api): a public address is
-- reached (a network namespace this spec makes on one, routed to it alone, stands in for the
-- internet, which this machine cannot reach), names resolve, and nothing of the host is: none of
-- its addresses (Docker's bridge gateways and docker0's among them, and addresses it gains after
-- the sandbox started), no link-local or metadata address, no private, shared, benchmark or
-- multicast address however it is routed; a local and a Docker sandbox, and a container on
-- docker0, do not reach each other. All traffic stays on this machine: loopback, the host's own
-- addresses, its bridges and the spec's own namespace.
local providers = require('support.providers')
local common = require('security.common')
local util = require('support.util')
local core = require('mayura.core')
local process = require('mayura.process')
local uv = require('luv')

local sh = common.sh
local NONCE = ('%08x'):format(math.random(0, 0x7fffffff))

-- {======================================================
-- The host side
-- =======================================================

-- The abuse program as a host file, for the servers the spec runs on the host and in its namespace.
local host_abuse_dir, host_abuse
local function host_abuse_path()
  if host_abuse then return host_abuse end
  host_abuse_dir = util.tmpdir()
  host_abuse = host_abuse_dir .. '/abuse'
  local f = assert(io.open(host_abuse, 'wb'))
  f:write(common.abuse_binary())
  f:close()
  os.execute('chmod 755 ' .. host_abuse)
  return host_abuse
end

local function drop_host_abuse()
  if host_abuse_dir then util.rmdir(host_abuse_dir) end
  host_abuse_dir, host_abuse = nil, nil
end

local function run(argv)
  local r = process.run(argv, { timeout_ms = 20000 })
  assert(r.exit_code == 0, table.concat(argv, ' ') .. ': ' .. r.stderr)
  return r.stdout
end

-- TCP and UDP listeners on every host address (0.0.0.0, and :: when there is IPv6), counting what
-- reaches them; and the host's own addresses, every interface.
local function host_listeners()
  local l = { received = 0, accepted = 0, handles = {} }
  local udp4, tcp4 = uv.new_udp(), uv.new_tcp()
  assert(tcp4:bind('0.0.0.0', 0))
  l.tcp_port = tcp4:getsockname().port
  assert(udp4:bind('0.0.0.0', l.tcp_port))
  local udp6, tcp6 = uv.new_udp(), uv.new_tcp()
  local has6 = tcp6:bind('::', l.tcp_port, { ipv6only = true }) and udp6:bind('::', l.tcp_port, { ipv6only = true })
  for _, u in ipairs(has6 and { udp4, udp6 } or { udp4 }) do
    u:recv_start(function(err, data) if not err and data then l.received = l.received + 1 end end)
    l.handles[#l.handles + 1] = u
  end
  for _, t in ipairs(has6 and { tcp4, tcp6 } or { tcp4 }) do
    t:listen(16, function()
      l.accepted = l.accepted + 1
      local c = uv.new_tcp()
      t:accept(c)
      c:close()
    end)
    l.handles[#l.handles + 1] = t
  end
  if not has6 then udp6:close(); tcp6:close() end
  l.addresses = {}
  for _, addrs in pairs(uv.interface_addresses()) do
    for _, a in ipairs(addrs) do
      if not a.ip:find('%%') and not a.ip:match('^fe80:') and (a.family == 'inet' or has6) then
        l.addresses[#l.addresses + 1] = a.ip
      end
    end
  end
  function l.close()
    for _, h in ipairs(l.handles) do if not h:is_closing() then h:close() end end
  end
  return l
end

-- A host elsewhere: a network namespace of this spec's, linked to the host's by a veth pair and
-- routed from it, serving HTTP on port 8080 with `text` at `server_ip`, a public address (in
-- 11.0.0.0/8, the internet's stand-in: this machine cannot reach the internet, and the route of
-- that one address goes to this namespace alone, so nothing of it leaves the machine), and at
-- `special` addresses (private, shared and benchmark ranges) that 'all' must not reach however
-- they are routed. Its link addresses are the host's own while it exists (so a sandbox must not
-- reach them); `close()` removes it all.
local function internet_host(text)
  local n = math.random(1, 250)
  local h = {
    link_host = 'mynh' .. NONCE:sub(1, 6), link_peer = 'mynp' .. NONCE:sub(1, 6),
    host_ip = '10.213.' .. n .. '.1', peer_ip = '10.213.' .. n .. '.2', server_ip = '11.213.' .. n .. '.1',
    special = { '10.214.' .. n .. '.1', '100.64.' .. n .. '.1', '198.18.' .. n .. '.1' },
    pids = {},
  }
  h.served = { h.server_ip, h.special[1], h.special[2], h.special[3] }
  function h.close()
    for _, pid in ipairs(h.pids) do os.execute('kill -9 ' .. pid .. ' 2>/dev/null') end
    for _, ip in ipairs(h.served) do
      os.execute('ip route del ' .. ip .. '/32 via ' .. h.peer_ip .. ' 2>/dev/null')
    end
    if h.holder then os.execute('kill -9 ' .. h.holder .. ' 2>/dev/null') end
    os.execute('ip link del ' .. h.link_host .. ' 2>/dev/null')
  end
  local ok, err = pcall(function()
    -- the namespace is held by a process of its own (no name under /run/netns, which another
    -- user of the machine could unmount or remove)
    h.holder = tonumber(run({ 'sh', '-c', 'unshare --net sleep 900 >/dev/null 2>&1 & echo $!' }):match('%d+'))
    assert(h.holder, 'cannot make a network namespace')
    assert(common.eventually(function()
      local link = uv.fs_readlink('/proc/' .. h.holder .. '/ns/net')
      return link ~= nil and link ~= uv.fs_readlink('/proc/self/ns/net')
    end, 5000), 'the namespace did not come')
    local inside = { 'nsenter', '-t', tostring(h.holder), '-n', '--' }
    local function ns(...)
      local argv = {}
      for _, x in ipairs(inside) do argv[#argv + 1] = x end
      for _, x in ipairs({ ... }) do argv[#argv + 1] = x end
      return run(argv)
    end
    -- one a run that was killed may have left under this name goes first
    os.execute('ip link del ' .. h.link_host .. ' 2>/dev/null')
    run({ 'ip', 'link', 'add', h.link_host, 'type', 'veth', 'peer', 'name', h.link_peer })
    run({ 'ip', 'link', 'set', h.link_peer, 'netns', tostring(h.holder) })
    run({ 'ip', 'addr', 'add', h.host_ip .. '/30', 'dev', h.link_host })
    run({ 'ip', 'link', 'set', h.link_host, 'up' })
    ns('ip', 'link', 'set', 'lo', 'up')
    ns('ip', 'addr', 'add', h.peer_ip .. '/30', 'dev', h.link_peer)
    ns('ip', 'link', 'set', h.link_peer, 'up')
    ns('ip', 'route', 'add', 'default', 'via', h.host_ip)
    for _, ip in ipairs(h.served) do
      ns('ip', 'addr', 'add', ip .. '/32', 'dev', 'lo')
      run({ 'ip', 'route', 'add', ip .. '/32', 'via', h.peer_ip })
      local out = ns(host_abuse_path(), 'serve', 'tcp:' .. ip .. ':8080', '600000', text)
      local pid = tonumber(out:match('pid=(%d+)'))
      assert(pid, 'the server of the test host did not start: ' .. out)
      h.pids[#h.pids + 1] = pid
      -- the host itself reaches it
      local got = common.kv(run({ host_abuse_path(), 'get', ip .. ':8080' }))
      assert(got.body == text, 'the test host does not answer from the host at ' .. ip .. ': ' .. tostring(got.get))
    end
  end)
  if not ok then
    h.close()
    error(err, 0)
  end
  return h
end

-- The inodes of the host's TCP and UDP sockets (/proc/net of the host's namespace).
local function host_socket_inodes()
  local inodes = {}
  for _, f in ipairs({ 'tcp', 'tcp6', 'udp', 'udp6' }) do
    local fh = io.open('/proc/net/' .. f)
    for line in (fh and fh:read('a') or ''):gmatch('[^\n]+') do
      local inode = line:match('^%s*%d+:%s+%S+%s+%S+%s+%x+%s+%S+%s+%S+%s+%S+%s+%d+%s+%d+%s+(%d+)')
      if inode and inode ~= '0' then inodes[#inodes + 1] = inode end
    end
    if fh then fh:close() end
  end
  return inodes
end

-- A port of 127.0.0.1 free on the host now.
local function free_port()
  local t = uv.new_tcp()
  assert(t:bind('127.0.0.1', 0))
  local port = t:getsockname().port
  t:close()
  return port
end

-- Results of `abuse net` as { [target] = result }.
local function net_results(stdout)
  local got = {}
  for t, res in stdout:gmatch('([^\n]+)=([^\n=]+)') do got[t] = res end
  return got
end

-- }======================================================

local local_entry
for _, prov in ipairs(providers.list()) do
  if prov.kind == 'local' then local_entry = prov end
end

describe("the network of a local sandbox with 'all'", function()
  if not local_entry then
    it('cannot run here: no local provider (bubblewrap and the agent)', function()
      pending('the local provider is not available here')
    end)
    return
  end
  local provider = local_entry.make_provider({})
  if not provider.features.network[2] then
    it("cannot run here: network 'all' needs root, slirp4netns, nft and nsenter", function()
      assert.are.same({ 'none' }, provider.features.network)
      pending("network 'all' of the local provider needs root (the stack and the firewall join the sandbox's namespace)")
    end)
    return
  end

  local pool, a, b, inet, l
  local INET_TEXT = 'inet-' .. NONCE
  local A_TEXT, B_TEXT = 'sandbox-a-' .. NONCE, 'sandbox-b-' .. NONCE

  setup(function()
    -- the test host first: its link address is then one of the host's own when the sandboxes start
    inet = internet_host(INET_TEXT)
    l = host_listeners()
    pool = local_entry.make_pool({ max_sandboxes = 6, network = { 'none', 'all' } })
    a = pool:create({ lifetime_ms = 300000, network = 'all', ports = { 3000 } })
    b = pool:create({ lifetime_ms = 300000, network = 'all', ports = { 3000 } })
    common.install(a)
    common.install(b)
  end)
  teardown(function()
    if pool then pool:close() end
    if l then l.close() end
    if inet then inet.close() end
    drop_host_abuse()
  end)

  it("reaches none of the host's listeners: its loopback, its addresses on every interface, the stack's gateway",
    function()
      -- the stack's addresses stand for the host's loopback when the stack lets them
      local targets = { 'tcp:10.0.2.2:' .. l.tcp_port, 'udp:10.0.2.2:' .. l.tcp_port, 'tcp:10.0.2.2:22',
        'tcp:10.0.2.5:' .. l.tcp_port, 'tcp:10.0.2.255:' .. l.tcp_port }
      local own = {}     -- the sandbox's own loopback: whatever answers there, it is not the host
      for _, ip in ipairs(l.addresses) do
        local list = (ip:match('^127%.') or ip == '::1') and own or targets
        list[#list + 1] = 'tcp:' .. ip .. ':' .. l.tcp_port
        list[#list + 1] = 'udp:' .. ip .. ':' .. l.tcp_port
      end
      -- the test host's link address on the host's side is one of them
      local found = false
      for _, t in ipairs(targets) do found = found or t:find(inet.host_ip, 1, true) ~= nil end
      assert.is_true(found, 'the test link address is not among the host addresses')
      local argv = { 'net', NONCE .. '.mayura-test.invalid' }
      for _, t in ipairs(targets) do argv[#argv + 1] = t end
      for _, t in ipairs(own) do argv[#argv + 1] = t end
      local r = common.abuse(a, argv, { timeout_ms = 60000 })
      assert.are.equal(0, r.exit_code, r.stderr)
      local got = net_results(r.stdout)
      for _, t in ipairs(targets) do
        assert.is_not_nil(got[t], 'no answer for ' .. t .. ': ' .. r.stdout)
        assert.is_true(got[t] ~= 'CONNECTED' and got[t] ~= 'SENT', t .. ' is reachable from the sandbox (' .. got[t] .. ')')
      end
      common.sleep(300)
      assert.are.equal(0, l.accepted, 'a connection from the sandbox reached a host listener')
      assert.are.equal(0, l.received, 'a datagram from the sandbox reached a host listener')
    end)

  it("reaches the host's resolver through the stack on DNS alone", function()
    -- the stack sends any port of its resolver's address to the host's resolver: tried only where
    -- that resolver is on this machine, so nothing leaves it
    local conf = io.open('/etc/resolv.conf')
    local text = conf and conf:read('a') or ''
    if conf then conf:close() end
    local host_ips = {}
    for _, ip in ipairs(l.addresses) do host_ips[ip] = true end
    local servers, here = 0, true
    for ns in ('\n' .. text):gmatch('\nnameserver%s+(%S+)') do
      servers = servers + 1
      here = here and (ns:match('^127%.') ~= nil or ns == '::1' or host_ips[ns] == true)
    end
    if servers == 0 or not here then
      return pending("the host's resolver is not on this machine: trying it would send traffic off it")
    end
    local targets = { 'tcp:10.0.2.3:' .. l.tcp_port, 'udp:10.0.2.3:' .. l.tcp_port }
    local r = common.abuse(a, { 'net', 'x.invalid', targets[1], targets[2] })
    local got = net_results(r.stdout)
    for _, t in ipairs(targets) do
      assert.is_true(got[t] ~= 'CONNECTED' and got[t] ~= 'SENT', t .. ' is reachable (' .. tostring(got[t]) .. ')')
    end
    common.sleep(300)
    assert.are.equal(0, l.accepted)
    assert.are.equal(0, l.received)
  end)

  it('cannot lift its firewall or reconfigure its link, and a blocked address stays blocked', function()
    local r = sh(a, '/usr/sbin/nft flush ruleset; echo nft=$?; /usr/sbin/ip addr add 10.0.2.200/24 dev tap0; ' ..
      'echo ip=$?; /usr/sbin/ip link set tap0 down; echo down=$?; /usr/sbin/ip -br link show tap0')
    assert.matches('nft=[1-9]', r.stdout)
    assert.matches('ip=[1-9]', r.stdout)
    assert.matches('down=[1-9]', r.stdout)
    assert.matches('tap0%s+UNKNOWN', r.stdout)
    assert.matches('Operation not permitted', r.stderr)
    local _, kv = common.abuse(a, { 'net', 'x.invalid', 'tcp:10.0.2.2:' .. l.tcp_port })
    assert.are_not.equal('CONNECTED', kv['tcp:10.0.2.2:' .. l.tcp_port])
    assert.are.equal(0, l.accepted)
  end)

  it('reaches no abstract unix socket of the host', function()
    local name = '@mayura-abstract-' .. NONCE
    local out = run({ host_abuse_path(), 'serve', 'unix:' .. name, '60000', 'host' })
    local pid = tonumber(out:match('pid=(%d+)'))
    assert.is_not_nil(pid, out)
    local ok, err = pcall(function()
      -- the host reaches it, so the socket is there
      assert.matches('=CONNECTED', run({ host_abuse_path(), 'net', 'x', 'unix:' .. name }))
      -- and every other abstract socket the host listens on, as an attacker who knows their names
      local targets = { 'unix:' .. name }
      for path in io.open('/proc/net/unix'):read('a'):gmatch('\n[^\n]* 00010000 0001 01 +%d+ (@[^\n]+)') do
        if #targets < 20 and not path:find('[%s=]') then targets[#targets + 1] = 'unix:' .. path end
      end
      local argv = { 'net', 'x' }
      for _, t in ipairs(targets) do argv[#argv + 1] = t end
      local r = common.abuse(a, argv)
      local got = net_results(r.stdout)
      assert.are.equal('ECONNREFUSED', got['unix:' .. name], r.stdout)
      for _, t in ipairs(targets) do
        assert.are_not.equal('CONNECTED', got[t], t .. ' of the host is reachable from the sandbox')
      end
    end)
    os.execute('kill -9 ' .. pid)
    if not ok then error(err, 0) end
  end)

  it("sees none of the host's sockets in /proc/net", function()
    local inodes = host_socket_inodes()
    assert.is_true(#inodes > 0, 'the host has no socket to look for')
    local r = sh(a, 'cat /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6')
    assert.are.equal(0, r.exit_code, r.stderr)
    local seen = {}
    for line in r.stdout:gmatch('[^\n]+') do
      local inode = line:match('^%s*%d+:%s+%S+%s+%S+%s+%x+%s+%S+%s+%S+%s+%S+%s+%d+%s+%d+%s+(%d+)')
      if inode then seen[inode] = true end
    end
    for _, inode in ipairs(inodes) do assert.is_nil(seen[inode], 'the sandbox sees the host socket ' .. inode) end
    -- nor a socket of its own on the port of the host's listener
    for line in r.stdout:gmatch('[^\n]+') do
      local port = line:match('^%s*%d+:%s+%x+:(%x+)%s')
      assert.are_not.equal(l.tcp_port, port and tonumber(port, 16), line)
    end
  end)

  it("takes no port of the host's loopback by binding it in the sandbox", function()
    local port = free_port()
    local _, kv = common.abuse(a, { 'serve', 'tcp:0.0.0.0:' .. port, '60000', A_TEXT })
    assert.are.equal('LISTENING', kv.serve)
    -- nothing answers on the host's loopback at that port, and the host can still take it
    assert.are_not.equal('CONNECTED', common.kv(run({ host_abuse_path(), 'get', '127.0.0.1:' .. port })).get)
    local t = uv.new_tcp()
    local bound = t:bind('127.0.0.1', port)
    local listening = bound and t:listen(4, function() end)
    t:close()
    assert.is_truthy(listening, 'the host cannot take port ' .. port)
  end)

  it('cannot reach link-local addresses (the cloud metadata address)', function()
    local r = common.abuse(a, { 'net', NONCE .. '.mayura-test.invalid',
      'tcp:169.254.169.254:80', 'udp:169.254.169.254:53', 'tcp:169.254.0.1:80' }, { timeout_ms = 30000 })
    local got = net_results(r.stdout)
    for _, t in ipairs({ 'tcp:169.254.169.254:80', 'udp:169.254.169.254:53', 'tcp:169.254.0.1:80' }) do
      assert.is_not_nil(got[t], r.stdout)
      assert.is_true(got[t] ~= 'CONNECTED' and got[t] ~= 'SENT', t .. ' is reachable (' .. got[t] .. ')')
    end
  end)

  it('reaches a host elsewhere by IP, through its stack', function()
    local _, kv = common.abuse(a, { 'get', inet.server_ip .. ':8080' }, { timeout_ms = 30000 })
    assert.are.equal('CONNECTED', kv.get)
    assert.are.equal(INET_TEXT, kv.body)
  end)

  it('is told of the stack\'s resolver, in a resolv.conf of its own', function()
    assert.are.equal('nameserver 10.0.2.3\n', a:read_file('/etc/resolv.conf'))
    local host_conf = io.open('/etc/resolv.conf')
    if host_conf then
      assert.are_not.equal(host_conf:read('a'), a:read_file('/etc/resolv.conf'))
      host_conf:close()
    end
  end)

  it('serves url(port) from a 127.0.0.1 port of its own sandbox, and refuses a port it was not created with',
    function()
      assert.are.equal('LISTENING', select(2, common.abuse(a, { 'serve', 'tcp:0.0.0.0:3000', '120000', A_TEXT })).serve)
      assert.are.equal('LISTENING', select(2, common.abuse(b, { 'serve', 'tcp:0.0.0.0:3000', '120000', B_TEXT })).serve)
      local ua, ub = a:url(3000), b:url(3000)
      local pa, pb = ua:match('^http://127%.0%.0%.1:(%d+)$'), ub:match('^http://127%.0%.0%.1:(%d+)$')
      assert.is_not_nil(pa, ua)
      assert.is_not_nil(pb, ub)
      assert.are_not.equal(pa, pb)
      assert.are.equal(A_TEXT, common.kv(run({ host_abuse_path(), 'get', '127.0.0.1:' .. pa })).body)
      assert.are.equal(B_TEXT, common.kv(run({ host_abuse_path(), 'get', '127.0.0.1:' .. pb })).body)
      local r = process.run({ 'curl', '-s', '-m', '5', ua })
      assert.are.equal(A_TEXT .. '\n', r.stdout)
      -- on the host's loopback only, not on its other addresses
      local tcp = io.open('/proc/net/tcp'):read('a')
      assert.matches('0100007F:' .. ('%04X'):format(tonumber(pa)) .. ' 00000000:0000 0A', tcp)
      local err = assert.raises_code('INVALID_INPUT', a.url, a, 3001)
      assert.matches('3001', err.message)
      assert.raises_code('INVALID_INPUT', a._backend.url, a._backend, 3001)
    end)

  it("cannot reach another sandbox's servers, by any address", function()
    local ub = b:url(3000)
    local hb = ub:match(':(%d+)$')
    local targets = { '127.0.0.1:3000', '10.0.2.100:3000', '10.0.2.2:3000', '10.0.2.2:' .. hb, '127.0.0.1:' .. hb }
    for _, ip in ipairs(l.addresses) do
      if ip:match('^%d+%.%d+%.%d+%.%d+$') then targets[#targets + 1] = ip .. ':' .. hb end
    end
    for _, t in ipairs(targets) do
      local _, kv = common.abuse(a, { 'get', t }, { timeout_ms = 30000 })
      assert.are_not.equal(B_TEXT, kv.body, 'sandbox a reached sandbox b at ' .. t)
    end
    -- b still serves, to the host
    assert.are.equal(B_TEXT, common.kv(run({ host_abuse_path(), 'get', '127.0.0.1:' .. hb })).body)
  end)

  it("leaves a sandbox with 'none' as it was: no stack, no link, no resolver", function()
    local none = pool:create({ lifetime_ms = 60000 })
    assert.is_nil(none._backend.net)
    local r = sh(none, 'tail -n +3 /proc/net/dev | cut -d: -f1')
    assert.are.equal('lo', r.stdout:match('^%s*(.-)%s*$'))
    -- an empty resolver list (the copy of an empty file may hold a line end)
    assert.matches('^%s*$', none:read_file('/etc/resolv.conf'))
    none:release()
  end)

  it('ends its stack when released, and leaves nothing behind', function()
    local c = pool:create({ lifetime_ms = 60000, network = 'all', ports = { 8080 } })
    local pid = c._backend.net.pid
    -- the helper sees the stack while it runs; its API socket is gone once the ports are forwarded
    local running = table.concat(local_entry.leftovers(c), '\n')
    assert.matches('network stack ' .. pid, running, 1, true)
    assert.is_nil(running:find('API socket', 1, true), running)
    c:release()
    assert.is_true(common.eventually(function() return #local_entry.leftovers(c) == 0 end, 5000))
    assert.are.same({}, local_entry.leftovers(c))
    assert.is_nil(io.open('/proc/' .. pid .. '/cmdline'))
  end)

  it('ends its stack when its lifetime is over, before any release', function()
    local c = pool:create({ lifetime_ms = 1500, network = 'all', ports = { 8080 } })
    assert.matches('network stack', table.concat(local_entry.leftovers(c), '\n'))
    assert.is_true(common.eventually(function() return #local_entry.leftovers(c) == 0 end, 10000),
      table.concat(local_entry.leftovers(c), ', '))
    assert.is_true(common.is_gone(select(2, pcall(c.exec, c, { 'true' }))))
    c:release()
  end)
end)

describe('a host killed with SIGKILL while a local sandbox with all runs', function()
  local provider = local_entry and local_entry.make_provider({})
  if not provider or not provider.features.network[2] then
    it('cannot run here', function() pending("no local provider with network 'all' here") end)
    return
  end
  teardown(drop_host_abuse)

  it('leaves no network stack behind', function()
    local script, said = os.tmpname(), os.tmpname()
    local f = assert(io.open(script, 'w'))
    f:write(([[
local sandbox = require('mayura.sandbox')
local provider = require('mayura.sandbox.local').local_sandboxes()
local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'all' } })
local sb = pool:create({ lifetime_ms = 30000, network = 'all', ports = { 3000 } })
local out = io.open(%q, 'w')
out:write(sb.id, ' ', sb._backend.net.pid, ' ', sb:url(3000), '\n')
out:close()
require('mayura').sleep(60000)
]]):format(said))
    f:close()
    local host = core.spawn({ argv = { 'build/mayura', script } }, function() end)
    -- the sandbox is up (its id, its stack's pid, its URL) and its stack is a child of the host process
    local line
    assert.is_true(util.eventually(function()
      local g = io.open(said)
      line = g and g:read('l')
      if g then g:close() end
      return line ~= nil
    end, 15000), 'the sandbox did not start')
    local id, pid, url = line:match('^(local%-%x+) (%d+) (%S+)$')
    assert.is_not_nil(id, line)
    pid = tonumber(pid)
    local stat = io.open('/proc/' .. pid .. '/stat'):read('a')
    assert.are.equal(host:pid(), tonumber(stat:match('%) %a (%d+)')))
    os.execute('kill -9 ' .. host:pid())
    local fake = { id = id, _backend = { net = { pid = tonumber(pid) }, cg_dirs = {} } }
    for _, ctrl in ipairs({ 'memory', 'pids', 'cpu' }) do
      fake._backend.cg_dirs[#fake._backend.cg_dirs + 1] = '/sys/fs/cgroup/' .. ctrl .. '/mayura/' .. id
    end
    assert.is_true(common.eventually(function() return #local_entry.leftovers(fake) == 0 end, 10000))
    assert.are.same({}, local_entry.leftovers(fake))
    -- and its port is free again
    assert.are_not.equal('CONNECTED', common.kv(run({ host_abuse_path(), 'get', url:match('//(.*)$') })).get)
    os.remove(script)
    os.remove(said)
  end)
end)

-- Docker: two sandboxes with 'all' must not reach each other (inter-container traffic on the bridge).
-- (Under gVisor a sandbox has network 'none' alone.)
for _, prov in ipairs(providers.list()) do
  if prov.kind == 'docker' and not prov.gvisor then
    describe("two Docker sandboxes with 'all' (" .. prov.name .. ')', function()
      local pool
      setup(function() pool = prov.make_pool({ max_sandboxes = 2, network = { 'none', 'all' } }) end)
      teardown(function() if pool then pool:close() end end)

      it('cannot reach each other', function()
        local a = pool:create({ lifetime_ms = 120000, network = 'all' })
        local b = pool:create({ lifetime_ms = 120000, network = 'all' })
        common.install(a)
        common.install(b)
        local text = 'docker-b-' .. NONCE
        assert.are.equal('LISTENING', select(2, common.abuse(b, { 'serve', 'tcp:0.0.0.0:3000', '60000', text })).serve)
        local ip = providers.host("docker inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "
          .. b._backend.container):match('%d+%.%d+%.%d+%.%d+')
        assert.is_not_nil(ip, 'no address for the container of b')
        local _, kv = common.abuse(a, { 'get', ip .. ':3000' }, { timeout_ms = 30000 })
        a:release()
        b:release()
        assert.are_not.equal(text, kv.body, 'a reached b at ' .. ip .. ':3000')
        assert.are_not.equal('CONNECTED', kv.get)
      end)
    end)
  end
end

-- {======================================================
-- Every provider: 'all' reaches the internet and nothing of the host
-- =======================================================

-- Every address of the host's interfaces, up or down (docker0 without containers is down), but
-- IPv6 link-local ones (scoped to a link).
local function host_addresses()
  local out = {}
  for ip in run({ 'ip', '-o', 'addr', 'show' }):gmatch('%sinet6? ([%x%.:]+)/%d+') do
    if not ip:match('^fe80:') then out[#out + 1] = ip end
  end
  return out
end

-- `tcp:` and `udp:` targets for `abuse net` of the address `ip` (IPv6 too: the port is after the
-- last colon) at `port`, added to `list`.
local function targets_of(ip, port, list)
  list[#list + 1] = 'tcp:' .. ip .. ':' .. port
  list[#list + 1] = 'udp:' .. ip .. ':' .. port
  return list
end

-- Tries `targets` from the sandbox `sb` (`abuse net`): asserts no TCP one connects (a UDP send may
-- leave the sandbox and be dropped on the way: the listeners' counts say whether it arrived).
local function assert_unreached(sb, targets)
  local argv = { 'net', NONCE .. '.mayura-test.invalid' }
  for _, t in ipairs(targets) do argv[#argv + 1] = t end
  local r = common.abuse(sb, argv, { timeout_ms = 120000 })
  assert.are.equal(0, r.exit_code, r.stderr)
  local got = net_results(r.stdout)
  for _, t in ipairs(targets) do
    assert.is_not_nil(got[t], 'no answer for ' .. t .. ': ' .. r.stdout)
    assert.are_not.equal('CONNECTED', got[t], t .. ' is reachable from the sandbox')
  end
  return got
end

-- `abuse get` of each of `targets` from the sandbox `sb`, all at once (each connect waits its own
-- 1.5 s); their key=value answers, by target.
local function gets(sb, targets)
  local running = {}
  for i, t in ipairs(targets) do
    running[i] = common.spawn(function()
      local _, kv = common.abuse(sb, { 'get', t }, { timeout_ms = 30000 })
      return kv
    end)
  end
  local out = {}
  for i, t in ipairs(targets) do out[t] = running[i]:wait() end
  return out
end

-- The address of a Docker container on its network(s).
local function container_ip(id)
  return providers.host("docker inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' " .. id)
    :match('%d+%.%d+%.%d+%.%d+')
end

-- A container of this spec's on Docker's default bridge (docker0), not a sandbox: the abuse program
-- serving `text` on port 3000. Returns its id and address; remove it with `docker rm -f`.
local function default_bridge_container(text)
  local r = process.run({ 'docker', 'run', '-d', '--rm', '--network', 'bridge', '--label', 'mayura.spec=network-' .. NONCE,
    '-v', host_abuse_path() .. ':/abuse:ro', '--entrypoint', '/bin/sh', providers.BUSYBOX,
    '-c', '/abuse serve tcp:0.0.0.0:3000 300000 ' .. text .. '; sleep 300' }, { timeout_ms = 60000 })
  local id = r.exit_code == 0 and r.stdout:match('%x+')
  assert(id, 'cannot start a container on the default bridge: ' .. r.stderr)
  local ip
  assert(common.eventually(function()
    ip = container_ip(id)
    return ip ~= nil and common.kv(run({ host_abuse_path(), 'get', ip .. ':3000' })).body == text
  end, 15000), 'the container on the default bridge does not serve')
  return id, ip
end

local function offers_all(prov)
  local ok, provider = pcall(prov.make_provider, {})
  if not ok then return false end
  for _, n in ipairs(provider.features.network) do if n == 'all' then return true end end
  return false
end

for _, prov in ipairs(providers.list()) do
  describe("a sandbox with 'all' (" .. prov.name .. ')', function()
    if prov.kind == 'kubernetes' then
      -- its NetworkPolicy is the cluster's network plugin's to enforce (enforced.network says whether
      -- the caller knows it is); the stand-in stores policies and gives each pod a loopback alone
      it("cannot run here: the stand-in does not enforce NetworkPolicies", function()
        pending("Kubernetes: 'all' is a NetworkPolicy, which the API server stand-in stores without enforcing")
      end)
      return
    end
    if not offers_all(prov) then
      it("cannot run here: network 'all' is not offered", function()
        pending("network 'all' of " .. prov.name .. ' is not offered here (it takes root)')
      end)
      return
    end
    local TEXT = 'inet-all-' .. prov.name .. '-' .. NONCE
    local pool, provider, a, inet, l

    setup(function()
      inet = internet_host(TEXT)
      pool, provider = prov.make_pool({ max_sandboxes = 3, network = { 'none', 'all' } })
      a = pool:create({ lifetime_ms = 300000, network = 'all' })
      common.install(a)
      -- after the create: Docker's bridge of 'all' exists by now, and its gateway is one of the host's
      l = host_listeners()
    end)
    teardown(function()
      if pool then pool:close() end
      if l then l.close() end
      if inet then inet.close() end
      drop_host_abuse()
    end)

    it('says the host holds its network (enforced.network), with rules named mayura\'s, loaded once, ' ..
      'that match its own traffic alone', function()
      assert.is_true(provider.enforced.network)
      -- a second sandbox loads them again: still one hook each
      pool:create({ lifetime_ms = 60000, network = 'all' }):release()
      if prov.kind == 'docker' then
        local id = providers.host("docker network inspect --format '{{.Id}}' mayura-isolated"):match('%x+')
        local bridge = 'br-' .. id:sub(1, 12)
        for _, t in ipairs({ 'iptables', 'ip6tables' }) do
          local all = run({ t, '-w', '-S' })
          local _, hooks = all:gsub('\n%-A [%u%-]+ %-m comment %-%-comment "mayura: network all" %-j MAYURA%-ALL%-', '')
          assert.are.equal(2, hooks, t .. ': ' .. all)
          for _, chain in ipairs({ 'MAYURA-ALL-IN', 'MAYURA-ALL-FWD' }) do
            for line in run({ t, '-w', '-S', chain }):gmatch('[^\n]+') do
              if line:match('^%-A') then
                assert.is_truthy(line:find('-i ' .. bridge .. ' ', 1, true), line)
                assert.is_truthy(line:find('"mayura: network all"', 1, true), line)
              end
            end
          end
        end
      else
        local table_text = run({ 'nft', 'list', 'table', 'inet', 'mayura_all' })
        assert.matches('meta skgid 1199999 jump stack', table_text, 1, true)
        -- the stack's sockets carry that group, and it has no other
        local status = io.open('/proc/' .. a._backend.net.pid .. '/status'):read('a')
        assert.matches('\nGid:%s+1199999%s+1199999%s+1199999%s+1199999\n', status)
        assert.matches('\nGroups:%s*\n', status)
      end
    end)

    it('reaches a public address through the host (a namespace of the spec stands in for the internet, ' ..
      'which this machine cannot reach)', function()
      local _, kv = common.abuse(a, { 'get', inet.server_ip .. ':8080' }, { timeout_ms = 30000 })
      assert.are.equal('CONNECTED', kv.get)
      assert.are.equal(TEXT, kv.body)
    end)

    it("reaches none of the host's listeners on 0.0.0.0 and :: by any address of the host: " ..
      "every interface's, Docker's bridge gateways and docker0's among them", function()
      local targets, seen = {}, {}
      for _, ip in ipairs(host_addresses()) do
        if not ip:match('^127%.') and ip ~= '::1' then   -- the sandbox's own loopback has these
          seen[ip] = true
          targets_of(ip, l.tcp_port, targets)
        end
      end
      assert.is_true(seen[inet.host_ip], 'the test link address is not among the host addresses')
      local docker0 = run({ 'ip', '-o', '-4', 'addr', 'show' }):match('%sdocker0%s+inet ([%d%.]+)/')
      if docker0 then assert.is_true(seen[docker0]) end
      if prov.kind == 'docker' then
        local gw = providers.host("docker network inspect --format '{{range .IPAM.Config}}{{.Gateway}}{{end}}' " ..
          'mayura-isolated'):match('[%d%.]+')
        assert.is_true(gw ~= nil and seen[gw] == true, 'the gateway of the bridge of all is not tried')
      end
      assert_unreached(a, targets)
      common.sleep(500)
      assert.are.equal(0, l.accepted, 'a connection from the sandbox reached a host listener')
      assert.are.equal(0, l.received, 'a datagram from the sandbox reached a host listener')
    end)

    it('reaches none of the addresses the host gains after it started (public, test, private), ' ..
      'nor the cloud metadata address 169.254.169.254 served on the host', function()
      local dummy = 'mynd' .. NONCE:sub(1, 6)
      local n = math.random(1, 250)
      local late = { '11.214.' .. n .. '.7', '192.0.2.77', '10.215.' .. n .. '.7', '169.254.169.254' }
      local meta = uv.new_tcp()
      local meta_accepted = 0
      local ok, err = pcall(function()
        os.execute('ip link del ' .. dummy .. ' 2>/dev/null')
        -- a link of the host's (a veth pair: a kernel without the dummy driver has one too)
        run({ 'ip', 'link', 'add', dummy, 'type', 'veth', 'peer', 'name', 'mynq' .. NONCE:sub(1, 6) })
        run({ 'ip', 'link', 'set', dummy, 'up' })
        for _, ip in ipairs(late) do run({ 'ip', 'addr', 'add', ip .. '/32', 'dev', dummy }) end
        -- the metadata service: a listener of that address alone, on port 80 (or any, when 80 is taken)
        local meta_port = 80
        if not meta:bind('169.254.169.254', 80) then
          meta:close()
          meta = uv.new_tcp()
          assert(meta:bind('169.254.169.254', 0))
          meta_port = meta:getsockname().port
        end
        assert(meta:listen(8, function()
          meta_accepted = meta_accepted + 1
          local c = uv.new_tcp()
          meta:accept(c)
          c:close()
        end))
        -- the host reaches them
        assert.matches('=CONNECTED', run({ host_abuse_path(), 'net', 'x', 'tcp:' .. late[1] .. ':' .. l.tcp_port }))
        common.sleep(100)
        local before = l.accepted
        l.accepted = 0
        assert.is_true(before > 0)
        local targets = { 'tcp:169.254.169.254:' .. meta_port }
        for _, ip in ipairs(late) do targets_of(ip, l.tcp_port, targets) end
        assert_unreached(a, targets)
        local _, kv = common.abuse(a, { 'get', '169.254.169.254:' .. meta_port }, { timeout_ms = 30000 })
        assert.are_not.equal('CONNECTED', kv.get)
        common.sleep(500)
        assert.are.equal(0, meta_accepted, 'the sandbox reached the metadata address')
        assert.are.equal(0, l.accepted, 'a connection from the sandbox reached a host listener')
        assert.are.equal(0, l.received, 'a datagram from the sandbox reached a host listener')
      end)
      if not meta:is_closing() then meta:close() end
      os.execute('ip link del ' .. dummy .. ' 2>/dev/null')
      if not ok then error(err, 0) end
    end)

    it('reaches no special-purpose range however it is routed (private, shared and benchmark addresses ' ..
      'served by the test namespace), nor multicast', function()
      local targets = {}
      for _, ip in ipairs(inet.special) do targets[#targets + 1] = 'tcp:' .. ip .. ':8080' end
      targets[#targets + 1] = 'udp:224.0.0.1:' .. l.tcp_port
      targets[#targets + 1] = 'udp:239.255.0.1:' .. l.tcp_port
      assert_unreached(a, targets)
      local at = {}
      for i, ip in ipairs(inet.special) do at[i] = ip .. ':8080' end
      local got = gets(a, at)
      for i, ip in ipairs(inet.special) do
        assert.are_not.equal(TEXT, got[at[i]].body, 'the sandbox reached ' .. ip)
      end
      common.sleep(500)
      assert.are.equal(0, l.received, 'a multicast datagram from the sandbox reached a host listener')
    end)

    it('resolves names: its own (Docker) and others through the host\'s resolver, when that one answers', function()
      if prov.kind == 'docker' then
        -- Docker's embedded resolver (127.0.0.11 in the container's namespace) knows the container
        local r = common.sh(a, 'nslookup "$(hostname)" 127.0.0.11')
        local ip = container_ip(a._backend.container)
        assert.is_not_nil(ip)
        assert.matches('Address:? ' .. ip:gsub('%.', '%%.'), r.stdout)
      end
      -- a name of the outside: the host's resolver is asked (through the stack, or Docker's embedded
      -- resolver); where it answers the host, it answers the sandbox (an answer or NXDOMAIN, no time-out)
      local name = NONCE .. '.example.com'
      local py = "import socket,sys\ntry:\n socket.getaddrinfo(sys.argv[1], 80)\n print('answer=ADDR')\n" ..
        "except socket.gaierror as e:\n print('answer=' + ('NONAME' if e.errno == socket.EAI_NONAME else 'FAIL'))\n"
      local host_answer = common.kv(run({ 'python3', '-c', py, name })).answer
      if host_answer == 'FAIL' then
        return pending("the host's resolver does not answer here: nothing to relay")
      end
      local got
      if prov.kind == 'docker' then
        local r = common.sh(a, 'nslookup ' .. name .. ' 2>&1', { timeout_ms = 30000 })
        got = (r.stdout:find('NXDOMAIN', 1, true) and 'NONAME') or (r.stdout:find('Address', 1, true) and 'ADDR')
          or r.stdout
      else
        got = common.kv(a:exec({ 'python3', '-c', py, name }, { timeout_ms = 30000 }).stdout).answer
      end
      assert.are.equal(host_answer, got)
    end)
  end)
end

-- A local sandbox and a Docker sandbox, each with 'all', and a container on Docker's default bridge.
local docker_entry
for _, prov in ipairs(providers.list()) do
  if prov.kind == 'docker' and not docker_entry then docker_entry = prov end
end

describe("a local sandbox and a Docker sandbox with 'all', and a container on Docker's default bridge", function()
  if not (local_entry and docker_entry and offers_all(local_entry) and offers_all(docker_entry)) then
    it('cannot run here', function() pending("needs the local and the Docker provider, both offering 'all'") end)
    return
  end
  local lpool, dpool, la, da, other, other_ip, da_ip
  local LA, DA, OTHER = 'local-a-' .. NONCE, 'docker-a-' .. NONCE, 'docker0-' .. NONCE

  setup(function()
    lpool = local_entry.make_pool({ max_sandboxes = 2, network = { 'none', 'all' } })
    dpool = docker_entry.make_pool({ max_sandboxes = 2, network = { 'none', 'all' } })
    la = lpool:create({ lifetime_ms = 300000, network = 'all', ports = { 3000 } })
    da = dpool:create({ lifetime_ms = 300000, network = 'all', ports = { 3000 } })
    common.install(la)
    common.install(da)
    assert.are.equal('LISTENING', select(2, common.abuse(la, { 'serve', 'tcp:0.0.0.0:3000', '280000', LA })).serve)
    assert.are.equal('LISTENING', select(2, common.abuse(da, { 'serve', 'tcp:0.0.0.0:3000', '280000', DA })).serve)
    da_ip = container_ip(da._backend.container)
    other, other_ip = default_bridge_container(OTHER)
  end)
  teardown(function()
    if other then providers.host('docker rm -f ' .. other) end
    if lpool then lpool:close() end
    if dpool then dpool:close() end
    drop_host_abuse()
  end)

  it('both serve the host at url(3000)', function()
    assert.are.equal(LA, common.kv(run({ host_abuse_path(), 'get', la:url(3000):match('//(.*)$') })).body)
    assert.are.equal(DA, common.kv(run({ host_abuse_path(), 'get', da:url(3000):match('//(.*)$') })).body)
  end)

  it("the local one reaches neither the Docker one's listener nor the container on docker0", function()
    assert.is_not_nil(da_ip)
    for t, kv in pairs(gets(la, { da_ip .. ':3000', other_ip .. ':3000' })) do
      assert.are_not.equal('CONNECTED', kv.get, 'the local sandbox reached ' .. t)
    end
  end)

  it("the Docker one reaches neither the local one's (its stack's address, every host address at its " ..
    "url's port) nor the container on docker0", function()
    local port = la:url(3000):match(':(%d+)$')
    local targets = { '10.0.2.100:3000', other_ip .. ':3000' }
    for _, ip in ipairs(host_addresses()) do
      if ip:match('^%d+%.%d+%.%d+%.%d+$') then targets[#targets + 1] = ip .. ':' .. port end
    end
    local got = gets(da, targets)
    for _, t in ipairs(targets) do
      local kv = got[t]
      assert.are_not.equal(LA, kv.body, 'the Docker sandbox reached the local one at ' .. t)
      assert.are_not.equal(OTHER, kv.body, 'the Docker sandbox reached the container on docker0 at ' .. t)
    end
  end)
end)
