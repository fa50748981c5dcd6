-- What a sandbox can see and reach of the host, on every provider here: /proc and /sys (no host
-- process, no host secret, no writable kernel knob), the network with network 'none' (DNS
-- included: nothing reaches a listener on the host, no address outside answers), terminal
-- injection (TIOCSTI) and ptrace of the in-sandbox agent (PID 1).
local providers = require('support.providers')
local common = require('security.common')
local core = require('mayura.core')
local uv = require('luv')

local sh = common.sh

local NONCE = ('mayura%08x'):format(math.random(0, 0x7fffffff))

-- Host names, programs and values that must never show inside a sandbox.
local HOST_MARKERS = { 'dockerd', 'containerd', 'busted', 'spec/runner.lua', 'lua5.4', 'luajit', 'process_api' }

-- The environment of this (host) process: { { name, value } }.
local function host_environ()
  local f = io.open('/proc/self/environ', 'rb')
  local s = f and f:read('a') or ''
  if f then f:close() end
  local out = {}
  for kv in s:gmatch('[^%z]+') do
    local k, v = kv:match('^([^=]+)=(.*)$')
    if k then out[#out + 1] = { k, v } end
  end
  return out
end

-- Listeners on every host address (UDP and TCP, IPv4 and IPv6) counting what reaches them.
local function host_listeners()
  local l = { received = 0, accepted = 0, handles = {} }
  local udp4 = uv.new_udp()
  assert(udp4:bind('0.0.0.0', 0))
  l.udp_port = udp4:getsockname().port
  local tcp4 = uv.new_tcp()
  assert(tcp4:bind('0.0.0.0', 0))
  l.tcp_port = tcp4:getsockname().port
  local udp6, tcp6 = uv.new_udp(), uv.new_tcp()
  local has6 = udp6:bind('::', l.udp_port, { ipv6only = true }) and tcp6:bind('::', l.tcp_port, { ipv6only = true })
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
  -- the host's own addresses, every interface
  l.addresses = {}
  for _, addrs in pairs(uv.interface_addresses()) do
    for _, a in ipairs(addrs) do
      local ip = a.ip
      if not ip:find('%%') and not ip:match('^fe80:') and (a.family == 'inet' or has6) then
        l.addresses[#l.addresses + 1] = ip
      end
    end
  end
  function l.close()
    for _, h in ipairs(l.handles) do if not h:is_closing() then h:close() end end
  end
  return l
end

local function is_loopback(ip)
  return ip:match('^127%.') ~= nil or ip == '::1'
end

for _, prov in ipairs(providers.list()) do
  describe('what a sandbox sees of the host (' .. prov.name .. ')', function()
    local pool, sb
    setup(function()
      pool = prov.make_pool({ max_sandboxes = 2 })
      sb = pool:create({ lifetime_ms = 300000, env = { SANDBOX_ONLY = 'inside-' .. NONCE } })
      common.install(sb)
    end)
    teardown(function()
      if sb then sb:release() end
      pool:close()
    end)

    it('sees under /proc only its own processes, and no host secret', function()
      -- a host process with a secret in its environment and on its command line
      local secret = 'host-secret-' .. NONCE
      local holder = core.spawn({ argv = { 'sh', '-c', 'sleep 30', secret }, env = { HOST_SECRET = secret } },
        function() end)
      local r = sh(sb, 'for p in /proc/[0-9]*; do echo "== $p"; tr "\\000" " " < $p/cmdline; echo; ' ..
        'tr "\\000" "\\n" < $p/environ; done 2>/dev/null; echo; env')
      holder:cancel()
      assert.are.equal(0, r.exit_code, r.stderr)
      local pids = 0
      for _ in r.stdout:gmatch('== /proc/%d+') do pids = pids + 1 end
      assert.is_true(pids >= 2 and pids < 10, 'the sandbox sees ' .. pids .. ' processes')
      assert.is_nil(r.stdout:find(secret, 1, true), 'a host secret is visible')
      for _, m in ipairs(HOST_MARKERS) do
        assert.is_nil(r.stdout:find(m, 1, true), 'a host process is visible: ' .. m)
      end
      -- no value of this host process's environment reached the sandbox's (short or common ones aside)
      local common_values = { ['/'] = true, ['C.UTF-8'] = true, ['/workspace'] = true, ['1'] = true }
      for _, kv in ipairs(host_environ()) do
        local name, value = kv[1], kv[2]
        if #value >= 6 and not common_values[value] and name ~= 'PATH' and name ~= 'LANG' and name ~= 'PWD'
          and name ~= 'HOME' and name ~= 'TERM' and name ~= 'OLDPWD' and name ~= 'SHLVL' then
          assert.is_nil(r.stdout:find(value, 1, true), 'the host variable ' .. name .. ' is visible inside')
        end
      end
      assert.matches('SANDBOX_ONLY=inside%-' .. NONCE, r.stdout)
    end)

    it('cannot read kernel memory, the kernel log or host keys, nor mount a new /proc', function()
      local r = sh(sb, 'head -c 16 /proc/kcore >/dev/null 2>&1 && echo kcore=read; ' ..
        'head -c 16 /proc/kmsg >/dev/null 2>&1 && echo kmsg=read; ' ..
        'echo keys=$(cat /proc/keys 2>/dev/null | wc -l); ' ..
        'ls /sys/firmware 2>/dev/null | head -1 | sed "s/^/firmware=/"; ' ..
        'mkdir -p /tmp/p && mount -t proc proc /tmp/p 2>/dev/null && echo mount=done; ' ..
        'grep -c . /proc/kallsyms >/dev/null 2>&1; grep -v "^0000000000000000 " /proc/kallsyms 2>/dev/null | ' ..
        'head -1 | sed "s/^/kallsyms=/"; true')
      local kv = common.kv(r.stdout)
      assert.is_nil(kv.kcore, 'kcore read')
      assert.is_nil(kv.kmsg, 'kmsg read')
      assert.are.equal('0', kv.keys, 'host keys listed')
      assert.is_nil(kv.mount, 'mounted a new proc')
      assert.is_nil(kv.kallsyms, 'kernel addresses visible: ' .. r.stdout)
      -- /sys is absent or read-only and shows no firmware tables
      assert.is_true(kv.firmware == nil or kv.firmware == '', 'firmware tables visible: ' .. r.stdout)
    end)

    it('cannot write a kernel knob under /proc/sys or /sys', function()
      local r = common.abuse(sb, { 'sysctl' })
      assert.are.equal(0, r.exit_code, r.stderr)
      local n = 0
      for knob, result in r.stdout:gmatch('([^\n=]+)=([^\n]+)') do
        n = n + 1
        -- under gVisor a process's own oom_score_adj is its kernel's, not the host's: the host's OOM
        -- killer sees the sandbox whole (provider.enforced.oom_protected is false there)
        if not (prov.gvisor and knob == '/proc/self/oom_score_adj') then
          assert.is_true(result ~= 'OPENED' and result ~= 'WRITTEN', knob .. ' is writable from the sandbox')
        end
      end
      assert.is_true(n >= 10, r.stdout)
      local before = io.open('/proc/sys/kernel/core_pattern'):read('a')
      sh(sb, 'echo "|/tmp/x" > /proc/sys/kernel/core_pattern; echo 1 > /proc/sysrq-trigger; true')
      assert.are.equal(before, io.open('/proc/sys/kernel/core_pattern'):read('a'))
    end)

    it("reaches no address with network 'none', DNS included, and nothing reaches the host", function()
      local l = host_listeners()
      local ok, err = pcall(function()
        local targets = {
          'tcp:1.1.1.1:80', 'tcp:8.8.8.8:53', 'udp:8.8.8.8:53', 'tcp:8.8.8.8:853', 'udp:9.9.9.9:53',
          'tcp:169.254.169.254:80', 'udp:169.254.169.254:53', 'tcp:172.17.0.1:2375', 'udp:172.17.0.1:53',
          'tcp:2606:4700:4700::1111:443', 'udp:2001:4860:4860::8888:53', 'raw:8.8.8.8',
        }
        local loopback = {}
        for _, ip in ipairs(l.addresses) do
          local list = is_loopback(ip) and loopback or targets
          list[#list + 1] = 'tcp:' .. ip .. ':' .. l.tcp_port
          list[#list + 1] = 'udp:' .. ip .. ':' .. l.udp_port
        end
        -- the resolvers the sandbox is told about
        local conf = sb:read_file('/etc/resolv.conf') or ''
        for ns in conf:gmatch('nameserver%s+(%S+)') do
          targets[#targets + 1] = 'udp:' .. ns .. ':53'
          targets[#targets + 1] = 'tcp:' .. ns .. ':53'
        end
        local argv = { 'net', NONCE .. '.mayura-test.invalid' }
        for _, t in ipairs(targets) do argv[#argv + 1] = t end
        for _, t in ipairs(loopback) do argv[#argv + 1] = t end
        local r = common.abuse(sb, argv, { timeout_ms = 30000 })
        assert.are.equal(0, r.exit_code, r.stderr)
        local got = {}
        for t, res in r.stdout:gmatch('([^\n]+)=([^\n=]+)') do got[t] = res end
        for _, t in ipairs(targets) do
          assert.is_not_nil(got[t], 'no answer for ' .. t .. ': ' .. r.stdout)
          assert.is_true(got[t] ~= 'CONNECTED' and got[t] ~= 'SENT' and got[t] ~= 'OPENED',
            t .. ' is reachable from the sandbox (' .. got[t] .. ')')
        end
        -- the name resolvers of the image, for a name nobody has
        local d = sh(sb, '(getent hosts ' .. NONCE .. '.example.com || nslookup ' .. NONCE .. '.example.com || ' ..
          'ping -c 1 -W 1 ' .. NONCE .. '.example.com) 2>&1; echo rc=$?', { timeout_ms = 20000 })
        assert.is_nil(d.stdout:match('Address:%s*%d+%.%d+%.%d+%.%d+%s*\n.*rc=0'), d.stdout)
        assert.is_nil(d.stdout:match('\n%d+%.%d+%.%d+%.%d+%s+' .. NONCE), d.stdout)
        common.sleep(300)
      end)
      l.close()
      if not ok then error(err, 0) end
      assert.are.equal(0, l.received, 'a datagram from the sandbox reached the host')
      assert.are.equal(0, l.accepted, 'a connection from the sandbox reached the host')
    end)

    it('has no terminal: TIOCSTI fails everywhere, commands lead a session of their own', function()
      local r = common.abuse(sb, { 'tiocsti' })
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.is_nil(r.stdout:find('INJECTED', 1, true), 'TIOCSTI pushed a character: ' .. r.stdout)
      local kv = common.kv(r.stdout)
      assert.are.equal('0', kv.ttys, 'a terminal is open in the sandbox')
      assert.is_true(kv['/dev/tty'] == nil or kv['/dev/tty'] ~= 'OPENED')
      assert.matches('open /dev/tty=E', r.stdout)
      local sid, pid = r.stdout:match('sid=(%d+) pgid=%d+ pid=(%d+)')
      assert.is_not_nil(sid, r.stdout)
      assert.are_not.equal('1', sid, 'the command shares the agent\'s session')
      -- the exec'd program is the leader of its own session (or its shell is)
      assert.is_true(tonumber(sid) <= tonumber(pid))
    end)

    it('cannot ptrace, read or signal away the agent (PID 1)', function()
      if prov.kind == 'kubernetes' then
        -- a container runtime makes the agent PID 1 of its Pod; the stand-in's pods have bubblewrap's init there
        return pending('the Kubernetes stand-in: PID 1 of its pods is bubblewrap\'s init, not the agent')
      end
      local ok_abuse, r = pcall(common.abuse, sb, { 'ptrace', '1' })
      if prov.gvisor and not ok_abuse then
        -- gVisor does not shield its PID 1 from its own namespace: the program's SIGKILL ends the agent,
        -- and the sandbox with it (gone); nothing of the host is reached
        assert.is_true(common.is_gone(r), tostring(r))
        return
      end
      if not ok_abuse then error(r, 0) end
      assert.are.equal(0, r.exit_code, r.stderr)
      local kv = common.kv(r.stdout)
      for _, k in ipairs({ 'attach', 'seize', 'mem', 'environ', 'vm_readv', 'getfd', 'fd_dir', 'root' }) do
        assert.is_not_nil(kv[k], k .. ' not tried: ' .. r.stdout)
        assert.matches('^E', kv[k], k .. ' of the agent succeeded: ' .. r.stdout)
      end
      -- a SIGKILL to PID 1 from inside its namespace does nothing: the agent still serves. gVisor does
      -- not shield its PID 1 from its namespace: there the agent ends, and the sandbox with it (gone)
      if prov.gvisor then
        local ok, e = pcall(sb.exec, sb, { 'echo', 'still' })
        assert.is_true(ok and e.stdout == 'still\n' or common.is_gone(e), tostring(e))
        if not ok then return end
      end
      assert.are.equal('still\n', sb:exec({ 'echo', 'still' }).stdout)
      r = sh(sb, 'cat /proc/1/environ >/dev/null 2>&1 && echo environ=read; ' ..
        'ls /proc/1/fd >/dev/null 2>&1 && echo fds=listed; ls /proc/1/root/ >/dev/null 2>&1 && echo root=listed; true')
      assert.are.equal('', r.stdout)
    end)
  end)
end

-- What a local sandbox can learn about its host from its mount table and its own ids: no path of
-- the checkout or of a runtime directory (its agent and /etc are copies, its tmpfs mounted under a
-- private name), and run as root no host uid (its tmpfs are owned by host root, not by its uid).
for _, prov in ipairs(providers.list()) do
  if prov.kind == 'local' then
    describe('what a local sandbox learns about its host', function()
      local pool, provider
      setup(function() pool, provider = prov.make_pool({}) end)
      teardown(function() pool:close() end)

      it('finds no checkout or runtime path in its mountinfo, status or id, and as root no host uid', function()
        local sb = pool:create({ lifetime_ms = 60000 })
        local r = sh(sb, 'cat /proc/self/mountinfo /proc/1/mountinfo /proc/self/status /proc/1/status ' ..
          '/proc/self/uid_map /proc/self/gid_map; id; ls -ln / /dev /workspace /.mayura')
        assert.are.equal(0, r.exit_code, r.stderr)
        local text = r.stdout
        local checkout = assert(os.getenv('PWD'))
        local needles = { checkout, '/run/mayura', '/tmp/mayura', 'build/mayura-agent', 'mayura-agent' }
        local rt = os.getenv('XDG_RUNTIME_DIR')
        if rt and rt ~= '' then needles[#needles + 1] = rt end
        for _, needle in ipairs(needles) do
          assert.is_nil(text:find(needle, 1, true), 'the sandbox sees ' .. needle .. ':\n' .. text)
        end
        if provider.enforced.inodes then   -- run as root: a host uid of its own
          local uid = sb._backend.host_uid
          assert.is_number(uid)
          assert.is_nil(text:find('%f[%d]' .. uid .. '%f[%D]'), 'the sandbox sees its host uid ' .. uid .. ':\n' .. text)
        end
        -- the root and the agent are read-only; /workspace is the sandbox user's
        assert.matches('uid=1000%(sandbox%)', text)
        assert.are_not.equal(0, sh(sb, 'touch /.mayura/agent /x /dev/x 2>/dev/null').exit_code)
        assert.are.equal(0, sh(sb, 'touch /workspace/x /tmp/x /dev/shm/x').exit_code)
        sb:release()
      end)
    end)
  end
end
