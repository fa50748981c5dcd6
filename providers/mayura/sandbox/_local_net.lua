--- mayura.sandbox._local_net: the network of a local sandbox (mayura.sandbox.local).
--
-- Every sandbox has a network namespace of its own: with 'none' it holds
-- only a loopback; with 'all' (offered when run as root with slirp4netns,
-- nft, nsenter and setpriv here) the host connects it before the agent
-- gets its setup (M.connect):
--   - a firewall in the sandbox's namespace, loaded from the host (root
--     entering that namespace alone, nft): nothing leaves but by its own
--     loopback or the stack, no IPv6 (the stack carries IPv4 only), and
--     nothing to the IANA special-purpose ranges (mayura.sandbox._firewall:
--     private, loopback, link-local with the cloud metadata address,
--     multicast, ...; the stack's own 10.0.2.0/24 among them, its gateway
--     and its resolver, which the stack maps to the host), but DNS (port
--     53) to its resolver; the sandbox's processes hold no capability in
--     that namespace, so cannot lift it;
--   - slirp4netns (kept per sandbox, as root with a group of its own, in
--     a sandbox of its own: --enable-sandbox, --enable-seccomp) carries
--     everything else to the outside; the host's nft table `inet
--     mayura_all` (loaded by the provider) holds that group's sockets to
--     the internet: no address of the host (asked of the kernel per
--     packet, so one the host gains after the sandbox started too), no
--     special-purpose range (so no other sandbox or container), no IPv6,
--     but DNS to the host's resolvers; --disable-host-loopback keeps its
--     gateway off the host's loopback; it ends when the host's end of its
--     exit socket closes (release, the sandbox's end, the host killed with
--     SIGKILL);
--   - /etc/resolv.conf names the stack's resolver (10.0.2.3, relaying to
--     the host's resolvers), never the host's file;
--   - each of `ports` is forwarded from a host port of 127.0.0.1 that the
--     stack alone listens on, given by url(port), to the sandbox's address
--     10.0.2.100 (a server there listens on 0.0.0.0, not 127.0.0.1); the
--     stack's API socket (root's, 0700) is removed once they are set up;
-- with an allow-list (`{ allow = { ... } }`, offered as root), the
-- namespace keeps nothing but its loopback (no stack, no DNS): the host
-- opens on it 127.0.0.1:3128, the socket of an egress proxy that runs
-- here (mayura.sandbox._egress), before the agent gets its setup, and
-- commands get HTTP_PROXY / HTTPS_PROXY naming it; the listed names on
-- ports 80 and 443 are all the sandbox reaches, each refusal is a network
-- event (`sandbox:events()`, the pool's `on_event`), and each of `ports`
-- is forwarded by the proxy from a host port of 127.0.0.1 into the
-- namespace; the option `proxy_resolve` (tests only) names its hosts;
-- run as another user the host cannot enter the namespace bubblewrap
-- makes, so `features.network` is { 'none' } and ports are not served.
-- Private to the local provider.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local host = require('mayura.sandbox._host')
local egress = require('mayura.sandbox._egress')
local fw = require('mayura.sandbox._firewall')

local M = {}

local MODE_0700 = tonumber('700', 8)
local read_plain = host.read_plain
-- The stack's network (slirp4netns's defaults, inside 10.0.0.0/8 of fw.SPECIAL4): the sandbox is
-- 10.0.2.100; every other address of it is the stack itself, which takes 10.0.2.3 to the host's
-- resolver (whatever the port) and the rest to the host's loopback unless --disable-host-loopback
local NET_DNS = '10.0.2.3'
--- The sandbox's /etc/resolv.conf with 'all': the stack's resolver.
M.RESOLV = 'nameserver ' .. NET_DNS .. '\n'
--- The descriptor on which bubblewrap says the sandbox's pid, for a sandbox with 'all' or an
-- allow-list (0 is the agent's bytes, 3 its socket, 5..9 the /etc files).
M.INFO_FD = 4
-- where the stacks' API sockets are, for root alone, each only while its ports are added
local NET_DIR = '/run/mayura-net'

--- Whether the sandbox's namespace gets connected: 'all', or an allow-list (a table).
function M.online(spec)
  return spec.network == 'all' or type(spec.network) == 'table'
end

--- Makes NET_DIR, root's alone (0700, not a link, owned by root), or says it cannot.
function M.make_dir()
  local uv = require('luv')
  uv.fs_mkdir(NET_DIR, MODE_0700)
  local st = uv.fs_lstat(NET_DIR)
  if not st or st.type ~= 'directory' or st.uid ~= 0 then return false end
  if st.mode % 512 ~= MODE_0700 and not uv.fs_chmod(NET_DIR, MODE_0700) then return false end
  return true
end


--- The sandbox's firewall, loaded into its network namespace from the host before anything in it
-- runs: its own loopback is free, and so are the answers to connections made to it (a forwarded
-- port's come from the stack's gateway), and DNS to the stack's resolver (port 53 alone: the stack
-- sends any port of that address to the host's resolver, which may be on the host's loopback);
-- otherwise IPv6 leaves by no other way (the stack carries IPv4 only), nor does anything to the
-- special-purpose ranges (fw.SPECIAL4: the stack's own 10.0.2.0/24 among them). What the stack's
-- sockets reach on the host's side is held by the host's table (fw.stack_rules).
local function net_rules(blocked)
  return table.concat({
    'table inet mayura {',
    '  set blocked4 {',
    '    type ipv4_addr; flags interval; auto-merge;',
    '    elements = { ' .. table.concat(blocked, ', ') .. ' }',
    '  }',
    '  chain output {',
    '    type filter hook output priority 0; policy accept;',
    '    oif "lo" accept',
    '    ct state established,related accept',
    '    ip daddr ' .. NET_DNS .. ' udp dport 53 accept',
    '    ip daddr ' .. NET_DNS .. ' tcp dport 53 accept',
    '    meta nfproto ipv6 reject with icmpx type admin-prohibited',
    '    ip daddr @blocked4 reject with icmpx type admin-prohibited',
    '  }',
    '}',
    '',
  }, '\n')
end

--- A luv pipe over the descriptor `fd` (closing the pipe closes it).
local function fd_pipe(fd)
  local pipe = require('luv').new_pipe(false)
  pipe:open(fd)
  return pipe
end

--- Reads the luv `pipe` until `enough(text)` holds, the other end closes, or `ms` pass; returns
-- the text, nil when it did not come. The pipe stays open.
local function read_pipe(pipe, enough, ms)
  local uv = require('luv')
  local chunks = {}
  local text = task.await(function(done)
    local timer = uv.new_timer()
    local finished = false
    local function finish(ok)
      if finished then return end
      finished = true
      timer:stop()
      timer:close()
      pipe:read_stop()
      done(ok and table.concat(chunks) or nil)
    end
    timer:start(ms, 0, function() finish(false) end)
    pipe:read_start(function(err, chunk)
      if err or not chunk then return finish(false) end
      chunks[#chunks + 1] = chunk
      if #chunks > 64 then return finish(false) end
      if enough(table.concat(chunks)) then finish(true) end
    end)
  end)
  return text
end

--- One request to the stack's API socket; the decoded reply, or nil.
local function stack_api(path, request)
  local uv = require('luv')
  local pipe = uv.new_pipe(false)
  local out = task.await(function(done)
    local chunks, finished = {}, false
    local timer = uv.new_timer()
    local function finish(text)
      if finished then return end
      finished = true
      timer:stop()
      timer:close()
      if not pipe:is_closing() then pipe:close() end
      done(text)
    end
    timer:start(5000, 0, function() finish(nil) end)
    pipe:connect(path, function(err)
      if err then return finish(nil) end
      pipe:write(core.json.encode(request))
      pipe:read_start(function(rerr, chunk)
        if rerr then return finish(nil) end
        if not chunk then return finish(table.concat(chunks)) end
        chunks[#chunks + 1] = chunk
      end)
    end)
  end)
  local ok, reply = pcall(core.json.decode, out or '')
  return ok and type(reply) == 'table' and reply or nil
end

--- A TCP port of 127.0.0.1 free at this moment (the kernel's pick), or nil.
local function free_port()
  local uv = require('luv')
  local tcp = uv.new_tcp()
  local ok = tcp:bind('127.0.0.1', 0)
  local name = ok and tcp:getsockname()
  tcp:close()
  return name and name.port
end

--- Starts a host command (`core.spawn` options); returns a function that waits for its result
-- (a table with `error` when it did not start).
local function start_process(spec)
  local result, waiting
  local proc, err = core.spawn(spec, function(res)
    result = res
    if waiting then waiting(res) end
  end)
  if not proc then result = { error = err } end
  return function()
    if result then return result end
    return task.await(function(done) waiting = done end)
  end
end

--- Waits (up to `ms`) for bubblewrap's sandbox process `pid` to be done with its namespaces: it
-- drops its capabilities once every setup step is over (its own loopback among them, which the
-- stack must not race) before it becomes the agent. False when it ended instead.
local function wait_setup_done(pid, ms)
  local deadline = core.hrtime_ms() + ms
  while core.hrtime_ms() < deadline do
    local status = read_plain('/proc/' .. pid .. '/status')
    if not status then return false end
    if status:match('\nCapEff:%s*0+\n') then return true end
    task.sleep(1)
  end
  return false
end

--- For a sandbox with 'all' or an allow-list, the socket pair of bubblewrap's INFO_FD (host and
-- child ends), or nil.
function M.fds(spec)
  if not M.online(spec) then return nil end
  local t = {}
  t.info_host, t.info_child = core.socketpair()
  if not t.info_host then error(errors.sandbox('unavailable', 'cannot make a socket pair'), 0) end
  return t
end

--- Stops the sandbox's stack: closing our end of its exit socket ends it. Its API socket goes too.
function M.stop(backend)
  local net = backend.net
  if not net then return end
  if net.proxy then net.proxy:close() end
  if net.pipe and not net.pipe:is_closing() then net.pipe:close() end
  if net.api then os.remove(net.api) end
end

--- Connects a sandbox with 'all' before its agent gets its setup (so before any command can run):
-- learns its pid (`info`, bubblewrap's --info-fd), loads its firewall, starts its stack and waits
-- for the stack to say its side is configured, and forwards `spec.ports`. Raises on any failure;
-- `backend.net` holds the stack.
function M.connect(p, backend, spec, info)
  local uv = require('luv')
  local function fail(what)
    error(errors.sandbox('unavailable', 'cannot connect the sandbox\'s network: ' .. what), 0)
  end
  local info_pipe = fd_pipe(info)
  local text = read_pipe(info_pipe, function(s) return s:find('}', 1, true) ~= nil end, 10000)
  info_pipe:close()
  local pid = text and tonumber(text:match('"child%-pid"%s*:%s*(%d+)'))
  local ns_id = text and text:match('"net%-namespace"%s*:%s*(%d+)')
  if not pid or not ns_id then fail('bubblewrap did not start') end
  -- held open from here, so every step below acts on this namespace, never on one a reused pid has;
  -- and never on the host's own, whatever went wrong
  local ns_fd = uv.fs_open('/proc/' .. pid .. '/ns/net', 'r', 0)
  if not ns_fd then fail('the sandbox is gone') end
  local link = uv.fs_readlink('/proc/self/fd/' .. ns_fd)
  if link ~= 'net:[' .. ns_id .. ']' or link == uv.fs_readlink('/proc/self/ns/net') then
    uv.fs_close(ns_fd)
    fail('not the sandbox\'s namespace')
  end
  local net = { ports = {} }
  backend.net = net
  if type(spec.network) == 'table' then
    -- an allow-list: nothing but the loopback bubblewrap brings up, and the proxy's socket on it
    if not wait_setup_done(pid, 10000) then uv.fs_close(ns_fd); fail('bubblewrap did not get ready') end
    net.proxy = egress.start_sandbox(ns_fd, spec, p.proxy_resolve, net.ports)
    return
  end
  -- the host's table around the stacks' sockets (loaded again when 30 s have passed)
  local fok, ferr = pcall(fw.ensure_stack, p.nft)
  if not fok then uv.fs_close(ns_fd); fail(tostring(ferr)) end
  -- the firewall (root, in the namespace only), while bubblewrap sets the namespace up and the
  -- stack starts; bubblewrap goes on only once both are done
  local rules = start_process({
    argv = { p.nsenter, '--net=/proc/self/fd/3', '--', p.nft, '-f', '-' }, fds = { ns_fd },
    stdin = net_rules(fw.SPECIAL4), timeout_ms = 10000, max_output_bytes = 4096,
    env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' },
  })
  -- the stack brings the loopback up too: not before bubblewrap has set it up
  if not wait_setup_done(pid, 10000) then uv.fs_close(ns_fd); fail('bubblewrap did not get ready') end
  local api = nil
  if spec.ports and #spec.ports > 0 then
    api = NET_DIR .. '/' .. backend.id .. '.sock'
    os.remove(api)
    net.api = api
  end
  -- the stack: fd 3 ends it when our end closes, fd 4 says it is ready, fd 5 is the namespace
  local mine, its = core.socketpair()
  if not mine then uv.fs_close(ns_fd); fail('no socket pair') end
  -- with the group the host's table knows its sockets by, and no other
  local argv = { p.setpriv, '--regid', tostring(fw.STACK_GID), '--clear-groups', '--', p.slirp4netns,
    '--configure', '--mtu=65520', '--disable-host-loopback', '--enable-sandbox', '--enable-seccomp',
    '--exit-fd=3', '--ready-fd=4', '--netns-type=path' }
  if api then argv[#argv + 1] = '--api-socket=' .. api end
  argv[#argv + 1] = '/proc/self/fd/5'
  argv[#argv + 1] = 'tap0'
  local proc = core.spawn({
    argv = argv, fds = { its, its, ns_fd }, max_output_bytes = 4096,
    env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' },
  }, function()
    net.exited = true
    if net.on_exit then net.on_exit() end
  end)
  core.close_fd(its)
  net.pipe = fd_pipe(mine)
  uv.fs_close(ns_fd)
  if not proc then fail('slirp4netns did not start') end
  net.proc = proc
  net.pid = proc:pid()
  if rules().exit_code ~= 0 then fail('the firewall did not load') end
  if read_pipe(net.pipe, function(s) return #s > 0 end, 10000) ~= '1' then fail('slirp4netns did not get ready') end
  for _, port in ipairs(spec.ports or {}) do
    local reply
    for _ = 1, 8 do
      local host_port = free_port()
      reply = host_port and stack_api(api, { execute = 'add_hostfwd', arguments = {
        proto = 'tcp', host_addr = '127.0.0.1', host_port = host_port, guest_port = port } })
      if reply and reply['return'] then
        net.ports[port] = host_port
        break
      end
    end
    if not net.ports[port] then fail('cannot forward port ' .. port) end
  end
  -- nobody adds a forward later: the API socket goes once the ports are there
  if api then os.remove(api) end
  net.api = nil
end

return M
