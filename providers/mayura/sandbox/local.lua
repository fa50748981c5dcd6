--- mayura.sandbox.local: daemonless Linux sandboxes from namespaces (bubblewrap).
--
-- `local_sandboxes(options)` is a provider for `create_sandboxes`. Each sandbox
-- is a set of new user, mount, pid, net, ipc and uts namespaces made by
-- bubblewrap, with the in-sandbox agent (build/mayura-agent) as its PID 1:
--
--   * the root is read-only: the host's /usr (and its library links) with a
--     synthesized /etc (passwd, group, hosts, an empty resolv.conf), or a root
--     file system directory given as `image`; never the host's /home, /root,
--     /var, /run, /tmp or the secrets of its /etc;
--   * /workspace and /tmp are tmpfs with size caps; the user is uid 1000 with
--     no capabilities and no_new_privs;
--   * every sandbox has a network namespace of its own: with 'none' it holds
--     only a loopback; with 'all' (offered when run as root with slirp4netns,
--     nft and nsenter here) bubblewrap waits before the agent starts while the
--     host connects it (see "The network of a sandbox with 'all'"):
--       - a firewall in the sandbox's namespace, loaded from the host (root
--         entering that namespace alone, nft): nothing leaves but by its own
--         loopback or the stack, and nothing goes to the host's loopback
--         (127.0.0.0/8; ::1 and all IPv6: the stack carries IPv4 only), to
--         an address of any host interface (every local and broadcast route of
--         the host's namespace at create time: an address the host gets later
--         is not in a running sandbox's list), link-local (169.254.0.0/16,
--         fe80::/10), multicast, or the stack's own addresses (10.0.2.0/24, its
--         gateway and its resolver, which the stack maps to the host), but DNS
--         (port 53) to its resolver; the sandbox's processes hold no capability
--         in that namespace, so cannot lift it;
--       - slirp4netns (kept per sandbox, as root, in a sandbox of its own:
--         --enable-sandbox, --enable-seccomp) carries everything else to the
--         outside; --disable-host-loopback keeps its gateway off the host's
--         loopback; it ends when the host's end of its exit socket closes
--         (release, the sandbox's end, the host killed with SIGKILL);
--       - /etc/resolv.conf names the stack's resolver (10.0.2.3, relaying to
--         the host's resolvers), never the host's file;
--       - each of `ports` is forwarded from a host port of 127.0.0.1 that the
--         stack alone listens on, given by url(port), to the sandbox's address
--         10.0.2.100 (a server there listens on 0.0.0.0, not 127.0.0.1); the
--         stack's API socket (root's, 0700) is removed once they are set up;
--     run as another user the host cannot enter the namespace bubblewrap
--     makes, so `features.network` is { 'none' } and ports are not served;
--   * run as root, each sandbox runs under a host uid of its own (no host
--     root behind the sandbox's user), and `cpus`, `memory_mib` and `pids` are
--     enforced with cgroups (v1 or v2); run as another user, the host's
--     limits apply and `provider.enforced` says so;
--   * commands and file calls go to the agent over a socket pair, so
--     environment values never appear on a host command line, and file calls
--     happen in the sandbox's own view of its files;
--   * the lifetime is enforced by the agent: it exits at the end of it, and as
--     PID 1 its exit ends every process of the sandbox. It also exits when the
--     host end of its socket closes, so a host killed with SIGKILL leaves no
--     sandbox behind; the launcher then removes the sandbox's cgroups.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local agent_backend = require('mayura.sandbox._agent_backend')
local host = require('mayura.sandbox._host')

local M = {}

local MIB = 1048576
local SANDBOX_UID = 1000
local HOST_UID_BASE = 1200000     -- host uids for sandboxes when run as root: [base, base + 65536)
local WORKDIR = '/workspace'
local AGENT_PATH = '/.mayura/agent'
-- The stack's network (slirp4netns's defaults): the sandbox is 10.0.2.100; every other address of it
-- is the stack itself, which takes 10.0.2.3 to the host's resolver (whatever the port) and the rest
-- to the host's loopback unless --disable-host-loopback
local NET_STACK = '10.0.2.0/24'
local NET_DNS = '10.0.2.3'
local NET_RESOLV = 'nameserver ' .. NET_DNS .. '\n'
-- descriptors bubblewrap gets for a sandbox with 'all' (3 is the agent's socket)
local INFO_FD, BLOCK_FD = 4, 5

-- {======================================================
-- Host helpers
-- =======================================================

local await_cb, exists, read_plain, write_plain = host.await, host.exists, host.read_plain, host.write_plain
local absolute, find_in_path, find_agent, random_hex =
  host.absolute, host.find_in_path, host.find_agent, host.random_hex

local function is_dir(path)
  local st = await_cb(function(cb) core.fs.stat(path, cb) end)
  return st ~= nil and st.type == 'directory'
end

local function readlink_type(path)
  local st = await_cb(function(cb) core.fs.stat(path, cb) end)
  return st and st.type
end

-- The type of `path` itself (a symbolic link is 'link'), or nil.
local function lstat_type(path)
  local st = require('luv').fs_lstat(path)
  return st and st.type
end

local function is_root()
  return host.uid() == 0
end

-- }======================================================

-- {======================================================
-- The synthesized /etc
-- =======================================================

local ETC = {
  passwd = 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n' ..
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n',
  group = 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n',
  hosts = '127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n',
  ['resolv.conf'] = '',
  ['nsswitch.conf'] = 'passwd: files\ngroup: files\nhosts: files dns\n',
}

-- Parts of the host's /etc that hold no secrets and that programs need.
local ETC_HOST = { 'alternatives', 'ld.so.cache', 'localtime', 'ssl/certs', 'ca-certificates' }

-- Where the provider keeps what every sandbox binds read-only: root's /run, else the user's runtime dir.
local function runtime_base()
  if is_root() then return '/run/mayura' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  return (rt and rt ~= '') and (rt .. '/mayura') or ('/tmp/mayura-' .. (os.getenv('USER') or 'user'))
end

-- Writes `files` (name -> content) with `mode` into base/name, rewriting only what differs, readable
-- by the sandboxes' own host uids whatever the umask and the checkout's directory modes are.
local function install(base, name, files, mode, what)
  local dir = base .. '/' .. name
  local ok, err = await_cb(function(cb) core.fs.mkdir(dir, { mode = 493 }, cb) end)
  if not ok then errors.raise('INVALID_CONFIG', 'cannot make ' .. what .. ': ' .. tostring(err and err.errno)) end
  require('mayura.process').run({ 'chmod', '0755', base, dir })
  for file, content in pairs(files) do
    if read_plain(dir .. '/' .. file) ~= content then
      local w, werr = await_cb(function(cb) core.fs.write(dir .. '/' .. file, content, { mode = mode }, cb) end)
      if not w then errors.raise('INVALID_CONFIG', 'cannot write ' .. what .. ': ' .. tostring(werr and werr.errno)) end
    end
  end
  return dir
end

-- }======================================================

-- {======================================================
-- cgroups
-- =======================================================

-- Which cgroup version can be used here, as root: 'v2', 'v1' or nil.
local function cgroup_mode()
  if not is_root() then return nil end
  if exists('/sys/fs/cgroup/cgroup.controllers') then return 'v2' end
  if exists('/sys/fs/cgroup/memory/memory.limit_in_bytes') and exists('/sys/fs/cgroup/pids/cgroup.procs') then
    return 'v1'
  end
  return nil
end

-- Makes the sandbox's cgroups; returns the directories (whose cgroup.procs the launcher joins).
local function make_cgroups(mode, id, limits)
  local dirs = {}
  local function mk(path)
    local ok = await_cb(function(cb) core.fs.mkdir(path, nil, cb) end)
    if not ok then error(errors.sandbox('unavailable', 'cannot make a cgroup')) end
    dirs[#dirs + 1] = path
    return path
  end
  local function set(path, value, optional)
    if not write_plain(path, value) and not optional then
      error(errors.sandbox('unavailable', 'cannot set a cgroup limit'))
    end
  end
  local bytes = tostring(limits.memory_mib * MIB)
  local quota = math.floor(limits.cpus * 100000 + 0.5)
  if mode == 'v1' then
    local mem = mk('/sys/fs/cgroup/memory/mayura/' .. id)
    set(mem .. '/memory.limit_in_bytes', bytes)
    set(mem .. '/memory.memsw.limit_in_bytes', bytes, true)
    set(mem .. '/memory.swappiness', '0', true)
    local pids = mk('/sys/fs/cgroup/pids/mayura/' .. id)
    set(pids .. '/pids.max', tostring(limits.pids))
    if exists('/sys/fs/cgroup/cpu/cpu.cfs_quota_us') then
      local cpu = mk('/sys/fs/cgroup/cpu/mayura/' .. id)
      set(cpu .. '/cpu.cfs_period_us', '100000')
      set(cpu .. '/cpu.cfs_quota_us', tostring(quota))
    end
  else
    write_plain('/sys/fs/cgroup/cgroup.subtree_control', '+memory +pids +cpu')
    mk('/sys/fs/cgroup/mayura')
    dirs = {}
    write_plain('/sys/fs/cgroup/mayura/cgroup.subtree_control', '+memory +pids +cpu')
    local cg = mk('/sys/fs/cgroup/mayura/' .. id)
    set(cg .. '/memory.max', bytes)
    set(cg .. '/memory.swap.max', '0', true)
    set(cg .. '/pids.max', tostring(limits.pids))
    set(cg .. '/cpu.max', quota .. ' 100000', true)
  end
  return dirs
end

local function remove_cgroups(dirs)
  for i = #dirs, 1, -1 do os.remove(dirs[i]) end
end

-- How many times the sandbox's memory cgroup has killed a process for memory.
local function oom_kills(mode, dirs)
  if mode == 'v1' then
    local s = read_plain(dirs[1] .. '/memory.oom_control') or ''
    return tonumber(s:match('oom_kill (%d+)')) or 0
  elseif mode == 'v2' then
    local s = read_plain(dirs[1] .. '/memory.events') or ''
    return tonumber(s:match('oom_kill (%d+)')) or 0
  end
  return 0
end

-- }======================================================

-- {======================================================
-- The launcher
-- =======================================================

-- Runs bubblewrap in the cgroups, then removes them. The launcher itself
-- stays outside them: were it inside, the sandbox's own memory limit could
-- have it killed (an OOM in the sandbox), and nothing would remove them.
-- Arguments: the number of cgroup directories, the directories, the command.
local LAUNCHER = [[
n=$1; shift; dirs=; i=$n
for d; do
  [ "$i" -gt 0 ] || break
  dirs="$d $dirs"; i=$((i - 1))
done
/bin/sh -c '
n=$1; shift
while [ "$n" -gt 0 ]; do
  echo $$ > "$1/cgroup.procs" || exit 125
  shift; n=$((n - 1))
done
echo -1000 > /proc/self/oom_score_adj 2>/dev/null
exec "$@"' mayura-join "$n" "$@"
rc=$?
# bubblewrap may end first (killed for memory, say): the rest of the sandbox ends soon after
# (the agent at its lifetime at the latest), and only an empty cgroup can be removed
for d in $dirs; do
  while [ -n "$(cat "$d/cgroup.procs" 2>/dev/null)" ]; do sleep 0.05; done
  rmdir "$d" 2>/dev/null
done
exit $rc
]]

local function bwrap_argv(p, spec, sb_id)
  local a = { p.bwrap,
    '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try',
    '--uid', tostring(SANDBOX_UID), '--gid', tostring(SANDBOX_UID),
    '--hostname', 'sandbox',
    '--new-session', '--as-pid-1', '--disable-userns', '--clearenv', '--cap-drop', 'ALL',
  }
  local function add(...) for _, x in ipairs({ ... }) do a[#a + 1] = x end end
  -- a network namespace of its own, always; with 'all' the host connects it (connect_network)
  -- while bubblewrap waits, before the agent starts
  add('--unshare-net')
  if spec.network == 'all' then add('--info-fd', tostring(INFO_FD), '--block-fd', tostring(BLOCK_FD)) end
  local image = spec.image or p.image
  if image then
    add('--ro-bind', image, '/')
  else
    add('--ro-bind', '/usr', '/usr')
    for _, d in ipairs({ 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32' }) do
      local t = p.root_links[d]
      if t == 'symlink' then add('--symlink', 'usr/' .. d, '/' .. d)
      elseif t == 'directory' then add('--ro-bind', '/' .. d, '/' .. d) end
    end
    add('--dir', '/etc')
    for name in pairs(ETC) do add('--ro-bind', p.etc .. '/' .. name, '/etc/' .. name) end
    for _, name in ipairs(ETC_HOST) do
      if p.etc_host[name] then add('--ro-bind', '/etc/' .. name, '/etc/' .. name) end
    end
  end
  -- with 'all', the stack's resolver; an image gets it only over a resolv.conf file of its own
  if spec.network == 'all' and (not image or lstat_type(image .. '/etc/resolv.conf') == 'file') then
    add('--ro-bind', p.net_etc .. '/resolv.conf', '/etc/resolv.conf')
  end
  add('--proc', '/proc', '--dev', '/dev')
  -- /dev/shm is as small as /tmp: a tmpfs without a cap fills the sandbox's memory instead
  add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/dev/shm')
  add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/tmp')
  add('--size', tostring(p.workspace_mib * MIB), '--perms', '0755', '--tmpfs', WORKDIR)
  add('--ro-bind', p.agent, AGENT_PATH)
  -- the root (bubblewrap's tmpfs, with no cap) and /dev hold no writable place of their own
  add('--remount-ro', '/dev', '--remount-ro', '/')
  add('--chdir', '/')
  add(AGENT_PATH, '--fd', '3', '--lifetime-ms', tostring(spec.lifetime_ms), '--workdir', WORKDIR)
  local _ = sb_id
  return a
end

-- }======================================================

-- {======================================================
-- The network of a sandbox with 'all'
-- =======================================================

--- The IPv4 destinations no sandbox reaches: the host's loopback, its own addresses (every local
-- route of the host's network namespace now, from /proc/net/fib_trie, broadcast ones too),
-- link-local, multicast, "this network", and the stack's own addresses (but DNS, see net_rules).
local function blocked_ipv4()
  local out = { '0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '255.255.255.255', NET_STACK }
  local seen, last = {}, nil
  for line in (read_plain('/proc/net/fib_trie') or ''):gmatch('[^\n]+') do
    local addr = line:match('^[%s|]*|%-%- (%d+%.%d+%.%d+%.%d+)%s*$')
    if addr then
      last = addr
    elseif last then
      local bits, kind = line:match('^%s*/(%d+) %a+ (%u+)')
      if kind == 'LOCAL' or kind == 'BROADCAST' then
        local cidr = bits == '32' and last or (last .. '/' .. bits)
        if not seen[cidr] then
          seen[cidr] = true
          out[#out + 1] = cidr
        end
      end
    end
  end
  return out
end

--- The sandbox's firewall, loaded into its network namespace from the host before anything in it
-- runs: its own loopback is free, and so are the answers to connections made to it (a forwarded
-- port's come from the stack's gateway), and DNS to the stack's resolver (port 53 alone: the stack
-- sends any port of that address to the host's resolver, which may be on the host's loopback);
-- otherwise IPv6 leaves by no other way (the stack carries IPv4 only), nor does anything to
-- `blocked` (a set that merges the overlapping entries).
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
-- stack must not race) and then waits on BLOCK_FD. False when it ended instead.
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

--- For a sandbox with 'all', the socket pairs of bubblewrap's INFO_FD and BLOCK_FD (host and child
-- ends), or nil.
local function network_fds(spec)
  if spec.network ~= 'all' then return nil end
  local t = {}
  t.info_host, t.info_child = core.socketpair()
  t.block_host, t.block_child = core.socketpair()
  if not t.info_host or not t.block_host then
    for _, k in ipairs({ 'info_host', 'info_child', 'block_host', 'block_child' }) do
      if t[k] then core.close_fd(t[k]) end
    end
    error(errors.sandbox('unavailable', 'cannot make a socket pair'), 0)
  end
  return t
end

--- Stops the sandbox's stack: closing our end of its exit socket ends it. Its API socket goes too.
local function stop_network(backend)
  local net = backend.net
  if not net then return end
  if net.pipe and not net.pipe:is_closing() then net.pipe:close() end
  if net.api then os.remove(net.api) end
end

--- Connects a sandbox with 'all' that bubblewrap holds before its agent starts: learns its pid
-- (`info`, bubblewrap's --info-fd), loads its firewall, starts its stack and waits for the stack
-- to say its side is configured, and forwards `spec.ports`; the caller then lets bubblewrap go on
-- (its --block-fd). Raises on any failure; `backend.net` holds the stack.
local function connect_network(p, backend, spec, info)
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
  -- the firewall (root, in the namespace only), while bubblewrap sets the namespace up and the
  -- stack starts; bubblewrap goes on only once both are done
  local rules = start_process({
    argv = { p.nsenter, '--net=/proc/self/fd/3', '--', p.nft, '-f', '-' }, fds = { ns_fd },
    stdin = net_rules(blocked_ipv4()), timeout_ms = 10000, max_output_bytes = 4096,
    env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' },
  })
  -- the stack brings the loopback up too: not before bubblewrap has set it up
  if not wait_setup_done(pid, 10000) then uv.fs_close(ns_fd); fail('bubblewrap did not get ready') end
  local api = nil
  if spec.ports and #spec.ports > 0 then
    api = p.net_dir .. '/' .. backend.id .. '.sock'
    os.remove(api)
    net.api = api
  end
  -- the stack: fd 3 ends it when our end closes, fd 4 says it is ready, fd 5 is the namespace
  local mine, its = core.socketpair()
  if not mine then uv.fs_close(ns_fd); fail('no socket pair') end
  local argv = { p.slirp4netns, '--configure', '--mtu=65520', '--disable-host-loopback',
    '--enable-sandbox', '--enable-seccomp', '--exit-fd=3', '--ready-fd=4', '--netns-type=path' }
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

-- }======================================================

-- {======================================================
-- A sandbox backend over the agent
-- =======================================================

-- exec, files and the error mapping are shared with the Docker provider
local Backend = agent_backend.class()

-- How many processes the sandbox's memory cgroup has killed (0 without cgroups).
function Backend:oom_kills()
  if not self.cg_mode then return 0 end
  return oom_kills(self.cg_mode, self.cg_dirs)
end

-- The host port of 127.0.0.1 that the sandbox's stack forwards to `port` (one of spec.ports).
function Backend:url(port)
  if self.network ~= 'all' then
    errors.raise('INVALID_INPUT', 'a sandbox serves ports only with network all', nil, 0)
  end
  local host_port = self.net and self.net.ports[port]
  if not host_port then
    errors.raise('INVALID_INPUT', 'port ' .. tostring(port) .. ' is not one of the ports the sandbox was created with',
      nil, 0)
  end
  return 'http://127.0.0.1:' .. host_port
end

function Backend:release()
  if self.released then return end
  self.released = true
  -- its network stack ends as soon as our end of its exit socket closes, meanwhile the rest does
  stop_network(self)
  if not self.closed then
    -- ask the agent to end everything; closing our end ends it too
    pcall(self.ch.call, self.ch, { op = 'shutdown' }, function() end)
    self.closed = true
    self.ch:close()
  end
  -- wait for the launcher (and so bubblewrap and the cgroups) to be gone, a few seconds at most
  if not self.exited then
    local uv = require('luv')
    task.await(function(done)
      local timer = uv.new_timer()
      local fired = false
      local function finish()
        if fired then return end
        fired = true
        if not timer:is_closing() then timer:stop(); timer:close() end
        done()
      end
      self.on_exit = finish
      timer:start(5000, 0, function()
        if self.proc then self.proc:cancel() end
        finish()
      end)
    end)
  end
  -- then wait for the stack too
  local net = self.net
  if net and net.proc and not net.exited then
    local uv = require('luv')
    task.await(function(done)
      local timer = uv.new_timer()
      local fired = false
      local function finish()
        if fired then return end
        fired = true
        if not timer:is_closing() then timer:stop(); timer:close() end
        done()
      end
      net.on_exit = finish
      timer:start(2000, 0, function()
        net.proc:cancel()
        finish()
      end)
    end)
  end
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local option_keys = {
  image = true, workdir = true, workspace_mib = true, tmp_mib = true, cpus = true, memory_mib = true,
  pids = true, max_lifetime_ms = true, bwrap = true, agent = true,
}

--- A provider of local namespace sandboxes. Options: `image` (a root file
-- system directory; the host's /usr by default), `workspace_mib` (1024),
-- `tmp_mib` (256), `cpus` (1), `memory_mib` (1024), `pids` (256),
-- `max_lifetime_ms` (24 hours), `bwrap` (path of bubblewrap), `agent` (path of
-- the agent binary).
function M.local_sandboxes(options)
  options = options or {}
  check.keys(options, option_keys, 'local_sandboxes options', 'INVALID_CONFIG', 3)
  local C = 'INVALID_CONFIG'
  if options.workdir ~= nil and options.workdir ~= WORKDIR then
    errors.raise(C, 'the local provider\'s workdir is ' .. WORKDIR, nil, 2)
  end
  local p = {
    id = 'local',
    workdir = WORKDIR,
    workspace_mib = check.int(options.workspace_mib, 'workspace_mib', 1, 1048576, C, 3, 1024),
    tmp_mib = check.int(options.tmp_mib, 'tmp_mib', 1, 1048576, C, 3, 256),
    memory_mib = check.int(options.memory_mib, 'memory_mib', 16, 16 * 1048576, C, 3, 1024),
    pids = check.int(options.pids, 'pids', 8, 4194304, C, 3, 256),
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, nil, C, 3, 86400000),
  }
  local cpus = options.cpus or 1
  if type(cpus) ~= 'number' or cpus ~= cpus or cpus <= 0 or cpus > 1024 then
    errors.raise(C, 'cpus must be a number above 0', nil, 2)
  end
  p.cpus = cpus
  if options.image ~= nil then
    if type(options.image) ~= 'string' or options.image:sub(1, 1) ~= '/' or not is_dir(options.image) then
      errors.raise(C, 'image must be the absolute path of a root file system directory', nil, 2)
    end
    p.image = options.image
  end
  p.bwrap = find_in_path(options.bwrap or 'bwrap')
  if not p.bwrap then errors.raise(C, 'bubblewrap (bwrap) is not installed', nil, 2) end
  p.agent = options.agent and absolute(options.agent) or find_agent()
  if not p.agent or not exists(p.agent) then errors.raise(C, 'the sandbox agent is not built (make)', nil, 2) end
  p.cg_mode = cgroup_mode()
  p.root = is_root()
  -- 'all' is a namespace of its own behind a user-mode stack; joining that namespace (for the stack
  -- and the firewall) needs root here, so run as another user, or without the programs, there is no 'all'
  p.slirp4netns = find_in_path('slirp4netns')
  p.nft = find_in_path('nft') or find_in_path('/usr/sbin/nft') or find_in_path('/sbin/nft')
  p.nsenter = find_in_path('nsenter') or find_in_path('/usr/bin/nsenter')
  local can_connect = p.root and p.slirp4netns ~= nil and p.nft ~= nil and p.nsenter ~= nil
  p.features = {
    stdin = true, ports = can_connect, desktop = false, network = can_connect and { 'none', 'all' } or { 'none' },
  }
  -- what holds where: cgroups need root here; without them the host's limits apply
  p.enforced = {
    memory = p.cg_mode ~= nil, pids = p.cg_mode ~= nil, cpus = p.cg_mode ~= nil,
    workspace_mib = true, tmp_mib = true, lifetime = true, network = true,
  }
  p.root_links = {}
  for _, d in ipairs({ 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32' }) do
    p.root_links[d] = readlink_type('/' .. d)
  end
  p.etc_host = {}
  for _, name in ipairs(ETC_HOST) do p.etc_host[name] = readlink_type('/etc/' .. name) ~= nil end
  local base = runtime_base()
  p.etc = install(base, 'etc-1', ETC, 420, 'the sandbox /etc')
  if can_connect then
    p.net_etc = install(base, 'net-1', { ['resolv.conf'] = NET_RESOLV }, 420, 'the sandbox resolv.conf')
    -- the stacks' API sockets, for root alone, each there only while its ports are added
    p.net_dir = base .. '/net-api'
    await_cb(function(cb) core.fs.mkdir(p.net_dir, { mode = 448 }, cb) end)
    require('mayura.process').run({ 'chmod', '0700', p.net_dir })
  end
  -- a copy of the agent beside it: the checkout it was built in may be closed to other uids
  local agent_bytes = read_plain(p.agent)
  if not agent_bytes then errors.raise(C, 'the sandbox agent cannot be read', nil, 2) end
  -- named by its content, so two checkouts (or builds) never replace each other's agent
  local sum = require('mayura.process').run({ 'sha256sum' }, { stdin = agent_bytes }).stdout:match('^(%x+)')
  if not sum then errors.raise(C, 'the sandbox agent cannot be read', nil, 2) end
  p.agent = install(base, 'agent-' .. sum:sub(1, 16), { ['mayura-agent'] = agent_bytes }, 493, 'the sandbox agent') ..
    '/mayura-agent'
  local counter = 0

  function p.create(self, spec)
    if spec.network == 'all' and not self.net_dir then
      errors.raise('INVALID_INPUT', 'network all needs root, slirp4netns, nft and nsenter here', nil, 0)
    end
    if spec.ports and #spec.ports > 0 and spec.network ~= 'all' then
      errors.raise('INVALID_INPUT', 'ports are served only with network all', nil, 0)
    end
    if spec.image ~= nil and (spec.image:sub(1, 1) ~= '/' or not is_dir(spec.image)) then
      errors.raise('INVALID_CONFIG', 'image must be the absolute path of a root file system directory', nil, 0)
    end
    counter = counter + 1
    local id = 'local-' .. random_hex(6)
    local limits = {
      memory_mib = math.min(spec.memory_mib or self.memory_mib, self.memory_mib),
      cpus = math.min(spec.cpus or self.cpus, self.cpus),
      pids = self.pids,
    }
    local cg_dirs = {}
    if self.cg_mode then cg_dirs = make_cgroups(self.cg_mode, id, limits) end
    local argv = { '/bin/sh', '-c', LAUNCHER, 'mayura-launch', tostring(#cg_dirs) }
    for _, d in ipairs(cg_dirs) do argv[#argv + 1] = d end
    if self.root then
      local uid = tostring(HOST_UID_BASE + (tonumber(random_hex(2), 16) or counter))
      for _, x in ipairs({ 'setpriv', '--reuid', uid, '--regid', uid, '--clear-groups', '--' }) do
        argv[#argv + 1] = x
      end
    end
    for _, x in ipairs(bwrap_argv(self, spec, id)) do argv[#argv + 1] = x end

    local a, b = core.socketpair()
    if not a then
      remove_cgroups(cg_dirs)
      error(errors.sandbox('unavailable', 'cannot make a socket pair'), 0)
    end
    local backend = setmetatable({
      id = id, network = spec.network, cg_mode = self.cg_mode, cg_dirs = cg_dirs,
      closed = false, released = false, exited = false,
    }, Backend)
    -- with 'all', bubblewrap says its pid (INFO_FD) and waits (BLOCK_FD) while the host connects it
    local fds, fds_ok, net_fds = { b }, pcall(network_fds, spec)
    if not fds_ok then
      core.close_fd(a)
      core.close_fd(b)
      remove_cgroups(cg_dirs)
      error(net_fds, 0)
    end
    if net_fds then fds[INFO_FD - 2], fds[BLOCK_FD - 2] = net_fds.info_child, net_fds.block_child end
    local proc, err = core.spawn({
      argv = argv, fds = fds, max_output_bytes = 65536,
      env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' },
    }, function(res)
      backend.exited = true
      backend.launcher_result = res
      if not backend.closed then
        backend.closed = true
        pcall(backend.ch.close, backend.ch)
      end
      stop_network(backend)
      if backend.on_exit then backend.on_exit() end
    end)
    core.close_fd(b)
    if net_fds then core.close_fd(net_fds.info_child); core.close_fd(net_fds.block_child) end
    if not proc then
      core.close_fd(a)
      if net_fds then core.close_fd(net_fds.info_host); core.close_fd(net_fds.block_host) end
      remove_cgroups(cg_dirs)
      local _ = err
      error(errors.sandbox('unavailable', 'cannot start the sandbox'), 0)
    end
    backend.proc = proc
    backend.ch = core.channel(a, {
      max_frame_bytes = agent_backend.MAX_FRAME_BYTES,
      on_close = function() backend.closed = true end,
    })
    if net_fds then
      local nok, nerr = pcall(connect_network, self, backend, spec, net_fds.info_host)
      if not nok then
        -- the agent must never serve: its socket closes before bubblewrap goes on, so it ends at once
        backend.closed = true
        pcall(backend.ch.close, backend.ch)
      end
      -- bubblewrap goes on when its BLOCK_FD is readable, at EOF too
      core.close_fd(net_fds.block_host)
      if not nok then agent_backend.start_failed(backend, nerr) end
    end
    -- the agent answers once the namespaces are up; then it gets the env, never on a command line
    local ok, cerr = pcall(agent_backend.handshake, backend, spec.env, WORKDIR)
    if not ok then agent_backend.start_failed(backend, cerr) end
    return backend
  end
  return p
end

-- }======================================================

return M
