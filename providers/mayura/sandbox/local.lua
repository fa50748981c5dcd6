--- mayura.sandbox.local: daemonless Linux sandboxes from namespaces (bubblewrap).
--
-- `local_sandboxes(options)` is a provider for `create_sandboxes`. Each sandbox
-- is a set of new user, mount, pid, net, ipc and uts namespaces made by
-- bubblewrap, with the in-sandbox agent (build/mayura-agent) as its PID 1:
--
--   * the root is read-only: the host's /usr (and its library links) with a
--     synthesized /etc (passwd, group, hosts, an empty resolv.conf), or a root
--     file system directory given as `image`; never the host's /home, /root,
--     /var, /run, /tmp or the secrets of its /etc. An image is never / nor
--     one holding mayura's own tree, and run as root it is named without a
--     link, it and each directory above it root's and writable by nobody
--     else (INVALID_CONFIG otherwise), and the launcher finds each of its
--     entries beneath its directory, never through a link (check_image);
--   * /workspace, /tmp and /dev/shm are tmpfs with size caps; the user is uid
--     1000 with no capabilities and no_new_privs;
--   * every sandbox has a network namespace of its own: with 'none' it holds
--     only a loopback; with 'all' (offered when run as root with slirp4netns,
--     nft, nsenter and setpriv here) the host connects it before the agent
--     gets its setup (see "The network of a sandbox with 'all'"):
--       - a firewall in the sandbox's namespace, loaded from the host (root
--         entering that namespace alone, nft): nothing leaves but by its own
--         loopback or the stack, no IPv6 (the stack carries IPv4 only), and
--         nothing to the IANA special-purpose ranges (mayura.sandbox._firewall:
--         private, loopback, link-local with the cloud metadata address,
--         multicast, ...; the stack's own 10.0.2.0/24 among them, its gateway
--         and its resolver, which the stack maps to the host), but DNS (port
--         53) to its resolver; the sandbox's processes hold no capability in
--         that namespace, so cannot lift it;
--       - slirp4netns (kept per sandbox, as root with a group of its own, in
--         a sandbox of its own: --enable-sandbox, --enable-seccomp) carries
--         everything else to the outside; the host's nft table `inet
--         mayura_all` (loaded by the provider) holds that group's sockets to
--         the internet: no address of the host (asked of the kernel per
--         packet, so one the host gains after the sandbox started too), no
--         special-purpose range (so no other sandbox or container), no IPv6,
--         but DNS to the host's resolvers; --disable-host-loopback keeps its
--         gateway off the host's loopback; it ends when the host's end of its
--         exit socket closes (release, the sandbox's end, the host killed with
--         SIGKILL);
--       - /etc/resolv.conf names the stack's resolver (10.0.2.3, relaying to
--         the host's resolvers), never the host's file;
--       - each of `ports` is forwarded from a host port of 127.0.0.1 that the
--         stack alone listens on, given by url(port), to the sandbox's address
--         10.0.2.100 (a server there listens on 0.0.0.0, not 127.0.0.1); the
--         stack's API socket (root's, 0700) is removed once they are set up;
--     with an allow-list (`{ allow = { ... } }`, offered as root), the
--     namespace keeps nothing but its loopback (no stack, no DNS): the host
--     opens on it 127.0.0.1:3128, the socket of an egress proxy that runs
--     here (mayura.sandbox._egress), before the agent gets its setup, and
--     commands get HTTP_PROXY / HTTPS_PROXY naming it; the listed names on
--     ports 80 and 443 are all the sandbox reaches, each refusal is a network
--     event (`sandbox:events()`, the pool's `on_event`), and each of `ports`
--     is forwarded by the proxy from a host port of 127.0.0.1 into the
--     namespace; the option `proxy_resolve` (tests only) names its hosts;
--     run as another user the host cannot enter the namespace bubblewrap
--     makes, so `features.network` is { 'none' } and ports are not served;
--   * run as root, each sandbox runs under a host uid of its own (no host
--     root behind the sandbox's user), and `cpus`, `memory_mib` and `pids` are
--     enforced with cgroups (v1 or v2); run as another user, the host's
--     limits apply and `provider.enforced` says so;
--   * with `desktop = true` at create, an X server (Xvfb) of the sandbox's
--     own, driven with xdotool and seen with xwd and netpbm, from the host's
--     /usr (mayura.sandbox._desktop); `features.desktop` is true when the
--     programs are there (scripts/setup.sh installs them);
--   * commands and file calls go to the agent over a socket pair, so
--     environment values never appear on a host command line, and file calls
--     happen in the sandbox's own view of its files.
--
-- The host holds each sandbox's lifetime and its release, not the agent: code
-- in the sandbox runs as the agent's own user and can lower its priority or
-- starve it. A launcher process (build/mayura-launch, launcher/launch.c: one
-- static program; where it is not built, the shell LAUNCHER below; outside
-- the sandbox's cgroups and
-- out of the host process's own process tree) starts bubblewrap and keeps the
-- sandbox: at the end of the lifetime (plus a second of grace), when the host
-- releases the sandbox, or when the host process is gone (the end of a
-- control socket), it kills the sandbox's PID 1, and the kernel ends the whole
-- pid namespace with it (bubblewrap's --die-with-parent does the same should
-- the launcher itself be killed); as root it then kills whatever is left in
-- the sandbox's cgroups (v1: a freezer cgroup, frozen, every process killed,
-- thawed; v2: cgroup.kill) and removes them. `release()` returns once all of
-- that is done. The agent also exits at the lifetime on its own; the kill
-- from the host is what holds it.
--
-- What the sandbox is made of never comes from a directory on the host that
-- another user could reach or replace (there is no runtime directory): the
-- agent's bytes are read once by the provider and handed to each launcher on
-- a pipe, the /etc files travel in the launcher's environment, and bubblewrap
-- copies both in (--file, --ro-bind-data), never binding a host path. Without
-- an image the agent is build/mayura-agent-host, linked against the host's
-- libraries (the sandbox's /usr is the host's, read-only): a few dozen KiB per
-- sandbox instead of the static agent's copy, whose text each sandbox mapped
-- privately from its own tmpfs; with an image (any root) it is the static one. As root
-- (where it may mount: not in a container without CAP_SYS_ADMIN, say) the
-- launcher mounts the sandbox's file systems in a mount namespace of its own
-- (over /run/mayura there, never visible on the host, gone with the
-- sandbox; from a mount table handed to that launcher alone on a descriptor,
-- a sealed file in memory that no other process can name or change and
-- that leaves nothing behind, by the launcher's first process, which joins the cgroups,
-- mounts, gives the roots to the sandbox's uid, takes that uid and becomes
-- bubblewrap; the shell launcher does it with unshare(1), mount(8), chown(1)
-- and setpriv(1)): the root, /workspace, /tmp and /dev/shm are tmpfs with `size=`,
-- `nr_inodes=` (one inode per 4 KiB page, so only empty files, directories
-- and links can run out of inodes before bytes do) and `mode=`, owned by host
-- root (so their options name no host uid; the roots of the root and of
-- /workspace are given to the sandbox's uid), and /dev holds binds of the
-- usual device nodes and a devpts instance of its own. The sandbox's mount
-- table then names no host path but /usr and the shared parts of /etc, and no
-- host uid (its uid_map is bubblewrap's inner one, 1000 to 1000). Otherwise,
-- and as another user, bubblewrap makes the tmpfs and /dev: no inode cap
-- (`enforced.inodes` is false), and their options show the user's uid; so do
-- /dev and the agent's copy with an `image`, whose own path shows as the root.
--
-- The agent is shielded from the OOM killer (oom_score_adj -1000, set through
-- the legacy oom_adj knob so that its commands cannot take the shield back)
-- where the kernel allows it; `enforced.oom_protected` says whether it does,
-- and the provider says so on stderr once when it does not: the tmpfs caps
-- count toward `memory_mib` and may add up to more than it, and an agent left
-- unshielded may then be what the kernel kills.
--
-- Warm sandboxes (`warm = N`, mayura.sandbox._agent_backend's add_warm): the
-- provider keeps N sandboxes of its own shape (network 'none', its image and
-- limits, no ports, no desktop) started, their agents past hello but without
-- a setup, for the pool made over it (create_sandboxes; one pool at a time).
-- A create asking for no more than that shape, with a lifetime that fits in
-- what is left of the warm one's, gets one: its env (and desktop env) go in
-- the agent's one setup then, so nothing of one create is ever seen by
-- another; the set refills in the background. Warm sandboxes live the pool's
-- max_lifetime_ms (the launcher's and the agent's lifetime; a handed-out one
-- is ended at its own lifetime by the pool), take slots of the pool's
-- max_sandboxes, and are launchers like the others: the pool's close, or the
-- host's death (the end of the control socket), ends them.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local agent_backend = require('mayura.sandbox._agent_backend')
local host = require('mayura.sandbox._host')
local desktop = require('mayura.sandbox._desktop')
local egress = require('mayura.sandbox._egress')
local fw = require('mayura.sandbox._firewall')

local M = {}

local MIB = 1048576
local MODE_0700 = tonumber('700', 8)
local SANDBOX_UID = 1000
local HOST_UID_BASE = 1200000     -- host uids for sandboxes when run as root: [base, base + 65536)
local WORKDIR = '/workspace'
local AGENT_PATH = '/.mayura/agent'
-- The stack's network (slirp4netns's defaults, inside 10.0.0.0/8 of fw.SPECIAL4): the sandbox is
-- 10.0.2.100; every other address of it is the stack itself, which takes 10.0.2.3 to the host's
-- resolver (whatever the port) and the rest to the host's loopback unless --disable-host-loopback
local NET_DNS = '10.0.2.3'
local NET_RESOLV = 'nameserver ' .. NET_DNS .. '\n'
-- descriptors bubblewrap gets for a sandbox with 'all' (3 is the agent's socket)
-- the descriptor on which bubblewrap says the sandbox's pid, for a sandbox with 'all' (0 is the
-- agent's bytes, 3 its socket, 5..9 the /etc files)
local INFO_FD = 4
-- where the stacks' API sockets are, for root alone, each only while its ports are added
local NET_DIR = '/run/mayura-net'

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

-- The type of what `path` names, through symbolic links ('directory', 'file', ...), or nil.
local function target_type(path)
  local err, st = await_cb(function(cb) require('luv').fs_stat(path, cb) end)
  return not err and st and st.type or nil
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
-- Their order in the launcher's environment (MAYURA_ETC_1..5) and, run as another user, the
-- descriptors bubblewrap copies them from (5..9: START's here-documents).
local ETC_NAMES = { 'passwd', 'group', 'hosts', 'resolv.conf', 'nsswitch.conf' }

-- Parts of the host's /etc that hold no secrets and that programs need.
local ETC_HOST = { 'alternatives', 'ld.so.cache', 'localtime', 'ssl/certs', 'ca-certificates' }

-- The device nodes of the sandbox's /dev (binds of the host's, or like them), and its links.
local DEVICES = { 'null', 'zero', 'full', 'random', 'urandom', 'tty' }
local DEV_LINKS = { { '/proc/self/fd', 'fd' }, { '/proc/self/fd/0', 'stdin' }, { '/proc/self/fd/1', 'stdout' },
  { '/proc/self/fd/2', 'stderr' }, { 'pts/ptmx', 'ptmx' } }

-- Run as root, the launcher mounts the sandbox's file systems here, in a mount namespace of its
-- own: the host sees only an empty directory owned by root.
local STAGE = '/run/mayura'

local function lstat(path)
  local uv = require('luv')
  local err, st = await_cb(function(cb) uv.fs_lstat(path, cb) end)
  if err then return nil, err end
  return st
end

local function bit(n, b) return math.floor(n / b) % 2 == 1 end

-- Makes NET_DIR, root's alone (0700, not a link, owned by root), or says it cannot.
local function make_net_dir()
  local uv = require('luv')
  uv.fs_mkdir(NET_DIR, MODE_0700)
  local st = uv.fs_lstat(NET_DIR)
  if not st or st.type ~= 'directory' or st.uid ~= 0 then return false end
  if st.mode % 512 ~= MODE_0700 and not uv.fs_chmod(NET_DIR, MODE_0700) then return false end
  return true
end

-- Makes STAGE when it is missing; refuses it unless it is a directory (not a link) owned by root
-- that nobody else may write.
local function make_stage()
  local uv = require('luv')
  await_cb(function(cb) uv.fs_mkdir(STAGE, MODE_0700, cb) end)   -- already there is fine
  local st = lstat(STAGE)
  if not st or st.type ~= 'directory' or st.uid ~= 0 or bit(st.mode, 16) or bit(st.mode, 2) then
    errors.raise('INVALID_CONFIG', STAGE .. ' must be a directory owned by root that only root may write', nil, 3)
  end
  return true
end

-- tmpfs options: `bytes`, one inode per 4 KiB page (every file with data takes a page anyway, so
-- only empty files, directories and links can run out of inodes before the bytes run out), `mode`.
local function tmpfs_options(bytes, mode)
  return ('size=%d,nr_inodes=%d,mode=%s'):format(bytes, math.max(64, math.floor(bytes / 4096)), mode)
end

-- The mount table of the provider's sandboxes whose tree bubblewrap makes (from the launcher shell,
-- or with an image a table cannot name): their file systems under STAGE. mount(8) (and mayura-launch) read it whole
-- before the first line mounts a small tmpfs over STAGE (in which the others make their
-- directories), and so hide it. X-mayura.own: mayura-launch gives that root to the sandbox's uid
-- (mount(8) leaves X- options alone; the launcher shell chowns them itself).
local function fstab_lines(agent_bytes, workspace_mib, tmp_mib)
  return {
    ('mayura %s tmpfs size=65536,nr_inodes=16,mode=0755 0 0'):format(STAGE),
    ('mayura %s/root tmpfs %s,X-mount.mkdir,X-mayura.own 0 0'):format(STAGE, tmpfs_options(agent_bytes + MIB, '0755')),
    ('mayura %s/w tmpfs %s,X-mount.mkdir,X-mayura.own 0 0'):format(STAGE, tmpfs_options(workspace_mib * MIB, '0755')),
    ('mayura %s/t tmpfs %s,X-mount.mkdir 0 0'):format(STAGE, tmpfs_options(tmp_mib * MIB, '1777')),
    ('mayura %s/s tmpfs %s,X-mount.mkdir 0 0'):format(STAGE, tmpfs_options(tmp_mib * MIB, '1777')),
    ('devpts %s/pts devpts newinstance,ptmxmode=0666,mode=0620,X-mount.mkdir 0 0'):format(STAGE),
  }
end

-- The mount table with which mayura-launch builds the whole root of a sandbox (launcher/launch.c's
-- steps), for bubblewrap to bind as one: bubblewrap's own binds each read the mount table back
-- and remount what they bound, a cost that grows with every bind. Without an image, the same tree
-- bubblewrap would make: /usr and the host's /etc files bound read-only, copies of the /etc texts;
-- with one, each entry of the image's top directory bound read-only (its links made alike), so an
-- image needs no mount point of ours. Then the agent's copy, device nodes of its own, capped tmpfs
-- for /dev/shm, /tmp and the workspace; the root and /dev read-only. Mounts made in the host's user
-- namespace come into the sandbox's locked: it cannot make them writable, nor take them off.
-- `tree(add, R)` adds the steps of the root's own entries.
local function built_lines(agent_bytes, workspace_mib, tmp_mib, tree)
  local R = STAGE .. '/root'
  local lines = {
    ('mayura %s tmpfs size=65536,nr_inodes=16,mode=0755 0 0'):format(STAGE),
    ('mayura %s tmpfs %s,nosuid,nodev,X-mount.mkdir,X-mayura.own 0 0'):format(R,
      tmpfs_options(agent_bytes + MIB, '0755')),
  }
  local function add(...) lines[#lines + 1] = table.concat({ ... }, ' ') end
  tree(add, R)
  add('dir', R .. '/.mayura')
  add('agent', R .. AGENT_PATH)
  add('dir', R .. '/proc')
  add(('mayura %s/dev tmpfs size=65536,nr_inodes=64,mode=0755,nosuid,X-mount.mkdir 0 0'):format(R))
  for _, d in ipairs(DEVICES) do add('node', d, R .. '/dev/' .. d) end
  for _, l in ipairs(DEV_LINKS) do add('link', l[1], R .. '/dev/' .. l[2]) end
  add(('devpts %s/dev/pts devpts newinstance,ptmxmode=0666,mode=0620,nosuid,noexec,X-mount.mkdir 0 0'):format(R))
  add(('mayura %s/dev/shm tmpfs %s,nosuid,nodev,X-mount.mkdir 0 0'):format(R, tmpfs_options(tmp_mib * MIB, '1777')))
  add('ro', R .. '/dev', 'nosuid')
  add(('mayura %s/tmp tmpfs %s,nosuid,nodev,X-mount.mkdir 0 0'):format(R, tmpfs_options(tmp_mib * MIB, '1777')))
  add(('mayura %s%s tmpfs %s,nosuid,nodev,X-mount.mkdir,X-mayura.own 0 0'):format(R, WORKDIR,
    tmpfs_options(workspace_mib * MIB, '0755')))
  add('ro', R, 'nosuid,nodev')
  return lines
end

-- The directories of the host's root a sandbox without an image gets as the host has them: a link
-- into /usr, or a directory bound read-only.
local ROOT_DIRS = { 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32' }

-- The host's part of the tree of a sandbox without an image, one step each, for whichever makes the
-- tree (host_tree for mayura-launch, bwrap_argv for bubblewrap): { 'bind', SRC, PATH } read-only,
-- { 'link', TARGET, PATH }, { 'dir', PATH }, { 'file', N, PATH } (a copy of the /etc text N of
-- ETC_NAMES). /etc holds copies, never binds of host files, but for the parts named in ETC_HOST
-- (bound from the path each names, p.etc_host).
local function host_steps(p)
  local steps = { { 'bind', '/usr', '/usr' } }
  local function add(step) steps[#steps + 1] = step end
  for _, d in ipairs(ROOT_DIRS) do
    local t = p.root_links[d]
    if t == 'symlink' then add({ 'link', 'usr/' .. d, '/' .. d })
    elseif t == 'directory' then add({ 'bind', '/' .. d, '/' .. d }) end
  end
  add({ 'dir', '/etc' })
  for i, name in ipairs(ETC_NAMES) do add({ 'file', i, '/etc/' .. name }) end
  local made = {}
  for _, name in ipairs(ETC_HOST) do
    if p.etc_host[name] then
      local parent = name:match('^(.+)/[^/]+$')
      if parent and not made[parent] then
        made[parent] = true
        add({ 'dir', '/etc/' .. parent })
      end
      add({ 'bind', p.etc_host[name], '/etc/' .. name })
    end
  end
  return steps
end

-- The tree of a sandbox without an image, as mayura-launch's steps (host_steps under R).
local function host_tree(p)
  return function(add, R)
    for _, st in ipairs(host_steps(p)) do
      if st[1] == 'dir' then add('dir', R .. st[2])
      elseif st[1] == 'file' then add('file', R .. st[3], tostring(st[2]))
      else add(st[1], st[2], R .. st[3]) end
    end
  end
end

-- A name or link target a mount table line can hold (its fields are split at blanks).
local function table_word(s)
  return type(s) == 'string' and s ~= '' and not s:find('[%s%c]')
end

-- The entries of an image's top directory the sandbox gets, as { name, type, link target }, in
-- order; nil when the image cannot go into a mount table (a blank in its path). Only names and
-- link texts come from here: the launcher finds each entry again beneath the image's directory,
-- never through a link (launcher/launch.c's open_image). What the sandbox
-- has of its own (/dev, /proc, /tmp, the agent's directory, the workspace) is not taken from it,
-- nor what is neither a directory, a file nor a link, nor a name a table cannot hold.
local function image_entries(image)
  local uv = require('luv')
  if not table_word(image) then return nil end
  local own = { dev = true, proc = true, tmp = true, ['.mayura'] = true, [WORKDIR:sub(2)] = true }
  local dir = uv.fs_scandir(image)
  if not dir then return nil end
  local out = {}
  while true do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    if not own[name] and table_word(name) then
      local t = lstat_type(image .. '/' .. name)
      local target = t == 'link' and uv.fs_readlink(image .. '/' .. name) or nil
      if t == 'directory' or t == 'file' or (t == 'link' and table_word(target)) then
        out[#out + 1] = { name, t, target }
      end
    end
  end
  table.sort(out, function(a, b) return a[1] < b[1] end)
  return out
end

-- The tree of a sandbox with an image: the image's directory, opened once by the launcher, then its
-- top entries (image_entries), each bound by its name beneath that directory; with 'all', the
-- stack's resolver (MAYURA_ETC_4) over the image's resolv.conf when that is a file of a directory
-- /etc (the launcher checks both again, and follows no link to them).
local function image_tree(image, entries, network_all)
  return function(add, R)
    local etc_dir = false
    add('image', image)
    for _, e in ipairs(entries) do
      if e[2] == 'link' then add('link', e[3], R .. '/' .. e[1])
      else add('bind', e[1], R .. '/' .. e[1]) end
      if e[1] == 'etc' and e[2] == 'directory' then etc_dir = true end
    end
    if network_all and etc_dir and lstat_type(image .. '/etc/resolv.conf') == 'file' then
      add('file', STAGE .. '/resolv.conf', '4')
      add('over', STAGE .. '/resolv.conf', R .. '/etc/resolv.conf')
    end
  end
end

-- The bytes a mount table may have (launcher/launch.c's TABLE_MAX, less one).
local TABLE_MAX = 32767

-- A mount table's text, or nil past TABLE_MAX. It goes to each launcher on a descriptor of its own
-- (a sealed file in memory, core.sealed_fd: start), never through a file another create, or
-- anyone, could name, replace or leave behind.
local function table_text(lines)
  local text = table.concat(lines, '\n') .. '\n'
  return #text <= TABLE_MAX and text or nil
end

local stage_ok

-- Whether the launcher can mount tmpfs in a mount namespace of its own here (asked once).
local function stage_works()
  if stage_ok == nil then
    local ok, r = pcall(require('mayura.process').run,
      { 'unshare', '--mount', '--propagation', 'private', 'mount', '-t', 'tmpfs', '-o', 'size=4096,nr_inodes=16',
        'mayura', STAGE },
      { env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' } })
    stage_ok = ok and r.exit_code == 0
  end
  return stage_ok
end

-- Checks an image, the provider's or a create's, and returns it: the absolute path of a directory,
-- neither the host's root nor one that holds mayura's own files (p.own_files: the checkout or the
-- installed tree); run as root, also named without a link, `.` or `..` at any name, and it and
-- every directory above it owned by root and writable by nobody else (what sshd asks of the
-- directories of its keys): so nobody but root can point the path, or any name the launcher finds
-- beneath it, elsewhere while a sandbox starts. INVALID_CONFIG otherwise.
local function check_image(p, image, level)
  local uv = require('luv')
  local function refuse(why)
    errors.raise('INVALID_CONFIG', 'image ' .. why, nil, level > 0 and level + 1 or 0)
  end
  if type(image) ~= 'string' or image:sub(1, 1) ~= '/' or not is_dir(image) then
    refuse('must be the absolute path of a root file system directory')
  end
  if p.root then
    local path = ''
    local function check_dir(at)
      local st = uv.fs_lstat(at)
      if not st or st.type ~= 'directory' then
        refuse('must be named without a link: ' .. at .. ' is a link or no directory')
      end
      if st.uid ~= 0 or bit(st.mode, 16) or bit(st.mode, 2) then
        refuse('and every directory above it must be owned by root and writable by nobody else: ' .. at ..
          ' is not')
      end
    end
    check_dir('/')
    for name in image:gmatch('[^/]+') do
      if name == '.' or name == '..' then refuse('must be named without . or ..') end
      path = path .. '/' .. name
      check_dir(path)
    end
  end
  local real = uv.fs_realpath(image)
  if not real or real == '/' then refuse('must not be the host\'s root') end
  for _, f in pairs(p.own_files) do
    local rf = uv.fs_realpath(f)
    if rf and (rf == real or rf:sub(1, #real + 1) == real .. '/') then
      refuse('must not hold mayura\'s own files (' .. f .. ')')
    end
  end
  return image
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

local function remove_cgroups(dirs)
  for i = #dirs, 1, -1 do os.remove(dirs[i]) end
end

-- The sandbox's cgroups, planned: the directories (whose cgroup.procs the launcher joins, the memory
-- one first), how the launcher kills what is in them (`{ freezer = dir }` on v1, `{ v2 = dir }`),
-- and their settings, each `{ path, value, optional }`. Which controllers there are is the
-- provider's, looked at once (cgroup_parts).
local function plan_cgroups(parts, id, limits)
  local dirs, kill, set = {}, {}, {}
  local function dir(path) dirs[#dirs + 1] = path return path end
  local function put(path, value, optional) set[#set + 1] = { path, value, optional or false } end
  local bytes = tostring(limits.memory_mib * MIB)
  local quota = math.floor(limits.cpus * 100000 + 0.5)
  if parts.mode == 'v1' then
    local mem = dir('/sys/fs/cgroup/memory/mayura/' .. id)
    put(mem .. '/memory.limit_in_bytes', bytes)
    put(mem .. '/memory.memsw.limit_in_bytes', bytes, true)
    put(mem .. '/memory.swappiness', '0', true)
    local pids = dir('/sys/fs/cgroup/pids/mayura/' .. id)
    put(pids .. '/pids.max', tostring(limits.pids))
    if parts.cpu then
      local cpu = dir('/sys/fs/cgroup/cpu/mayura/' .. id)
      put(cpu .. '/cpu.cfs_period_us', '100000')
      put(cpu .. '/cpu.cfs_quota_us', tostring(quota))
    end
    -- what the launcher freezes to kill every process in it at once (a fork bomb too)
    if parts.freezer then kill.freezer = dir('/sys/fs/cgroup/freezer/mayura/' .. id) end
  else
    local cg = dir('/sys/fs/cgroup/mayura/' .. id)
    put(cg .. '/memory.max', bytes)
    put(cg .. '/memory.swap.max', '0', true)
    put(cg .. '/pids.max', tostring(limits.pids))
    put(cg .. '/cpu.max', quota .. ' 100000', true)
    kill.v2 = cg
  end
  return dirs, kill, set
end

-- What the provider's cgroups are made of, looked at once: `{ mode, cpu, freezer }`, or nil
-- without cgroups. On v2 the parent (/sys/fs/cgroup/mayura) and its controllers are set up here.
local function cgroup_parts(mode)
  if not mode then return nil end
  if mode == 'v2' then
    write_plain('/sys/fs/cgroup/cgroup.subtree_control', '+memory +pids +cpu')
    await_cb(function(cb) core.fs.mkdir('/sys/fs/cgroup/mayura', nil, cb) end)
    write_plain('/sys/fs/cgroup/mayura/cgroup.subtree_control', '+memory +pids +cpu')
  end
  return {
    mode = mode,
    cpu = mode == 'v1' and exists('/sys/fs/cgroup/cpu/cpu.cfs_quota_us'),
    freezer = mode == 'v1' and exists('/sys/fs/cgroup/freezer/cgroup.procs'),
  }
end

-- The settings as the launcher reads them (MAYURA_CG_SET): `PATH VALUE` a line, `?` before an
-- optional one.
local function cgroup_set_text(set)
  local lines = {}
  for i, s in ipairs(set) do lines[i] = (s[3] and '?' or '') .. s[1] .. ' ' .. s[2] end
  return table.concat(lines, '\n')
end

-- Makes the planned cgroups from here (for the launcher shell; mayura-launch makes them itself).
-- Nothing is left behind when one cannot be made.
local function make_cgroups(dirs, set)
  local made = {}
  local ok, err = pcall(function()
    for _, path in ipairs(dirs) do
      local done = await_cb(function(cb) core.fs.mkdir(path, nil, cb) end)
      if not done then error(errors.sandbox('unavailable', 'cannot make a cgroup'), 0) end
      made[#made + 1] = path
    end
    for _, s in ipairs(set) do
      if not write_plain(s[1], s[2]) and not s[3] then
        error(errors.sandbox('unavailable', 'cannot set a cgroup limit'), 0)
      end
    end
  end)
  if not ok then
    remove_cgroups(made)
    error(err, 0)
  end
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

-- How long past its lifetime the launcher gives the agent to end the sandbox by itself.
local GRACE_MS = 1000

-- The keeper of one sandbox; it runs outside the sandbox's cgroups (were it inside, the
-- sandbox's own memory limit could have it killed) and out of the host's process tree (setsid,
-- without the host's tree tag), so it outlives the host. It starts the sandbox (START, as a child
-- of a subshell that says when it has ended), then waits for the first of: the end of the
-- lifetime, the sandbox's own end, a word from the host or the end of the host's control socket.
-- Then it kills the sandbox's PID 1 (the kernel ends the pid namespace with it, and bubblewrap
-- exits once it is empty), as root everything in its cgroups too, waits until all of it is gone
-- and removes the cgroups.
-- Environment: MAYURA_LIFE (seconds), MAYURA_CG (the cgroup directories), MAYURA_FREEZER (v1) or
-- MAYURA_CGKILL (v2), MAYURA_START and what it reads. fd 0: the agent's bytes, 3: the agent's
-- socket, 4: the host's control socket, 5 with MAYURA_INFO bubblewrap's info descriptor, the one
-- MAYURA_MOUNT names (5 or 6) the mount table. Arguments: bubblewrap's command line.
local LAUNCHER = [=[
trap '' PIPE
# the children of a process, into $kids (without /proc/PID/task/TID/children here: from every PPid)
if [ -r "/proc/$$/task/$$/children" ]; then
  kids() { kids=; read -r kids 2>/dev/null < "/proc/$1/task/$1/children"; }
else
  kids() { kids=$(grep -l "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3); }
fi
held() { read -r _ 2>/dev/null < "$1/cgroup.procs"; }
kill_procs() { while read -r p; do kill -KILL "$p"; done 2>/dev/null < "$1/cgroup.procs"; }
# every process in the cgroups: frozen (no fork can race the kill), killed, thawed
kill_cgroups() {
  if [ -n "$MAYURA_CGKILL" ] && [ -e "$MAYURA_CGKILL/cgroup.kill" ]; then
    echo 1 2>/dev/null > "$MAYURA_CGKILL/cgroup.kill"
  elif [ -n "$MAYURA_FREEZER" ]; then
    echo FROZEN 2>/dev/null > "$MAYURA_FREEZER/freezer.state"
    i=0
    while read -r st 2>/dev/null < "$MAYURA_FREEZER/freezer.state" && [ "$st" = FREEZING ] && [ $i -lt 40 ]; do
      sleep 0.05
      i=$((i + 1))
    done
    kill_procs "$MAYURA_FREEZER"
    echo THAWED 2>/dev/null > "$MAYURA_FREEZER/freezer.state"
  else
    for d in $MAYURA_CG; do kill_procs "$d"; done
  fi
}
# PID 1 (the child of bubblewrap: its pid namespace ends with it), or whatever is still starting it
end_sandbox() {
  kids "$sb"
  for b in $kids; do
    c=
    read -r c 2>/dev/null < "/proc/$b/comm"
    kids "$b"
    if [ "$c" != bwrap ]; then kill -KILL "$b" $kids 2>/dev/null
    elif [ -n "$kids" ]; then kill -KILL $kids 2>/dev/null
    else kill -KILL "$b" 2>/dev/null; fi
  done
}
# the mount table's descriptor (5, or 6 after the info descriptor) kept on 8 until START reads it
case $MAYURA_MOUNT in 5) exec 8<&5 5<&- ;; 6) exec 8<&6 6<&- ;; '') ;; *) exit 125 ;; esac
# with 'all', bubblewrap's info descriptor comes on 5: kept on 7 until START puts it on 4
if [ -n "$MAYURA_INFO" ]; then exec 7<&5 5<&-; fi
exec 5<&0 </dev/null
# a notice ends the current wait at once, even one that comes before it: it kills the wait's timer
# (USR1: the host's word; USR2: the sandbox has ended)
tm=
ended=
trap '[ -z "$tm" ] || kill -KILL $tm 2>/dev/null' USR1
trap 'ended=1; [ -z "$tm" ] || kill -KILL $tm 2>/dev/null' USR2
sleep "$MAYURA_LIFE" &
tm=$!
(
  # as root, START runs in a mount namespace of its own, private: what MOUNT mounts there never shows
  ${MAYURA_MOUNT:+unshare --mount --propagation private} /bin/sh -c "$MAYURA_START" mayura-start "$@" &
  exec 3<&- 5<&- 7<&- 8<&-
  wait $!
  kill -USR2 $$
) 4<&- &
sb=$!
exec 3<&- 5<&- 7<&- 8<&-
( read -r _; kill -USR1 $$ ) <&4 &
rd=$!
exec 4<&-
# until the lifetime, the sandbox's own end or the host's word
wait $tm
wait $tm 2>/dev/null
tm=
kill -KILL $rd 2>/dev/null
wait $rd 2>/dev/null
# kill, then wait for the sandbox to end; every half second, again and the cgroups too
n=0
while [ -z "$ended" ] && read -r _ _ state _ 2>/dev/null < "/proc/$sb/stat" && [ "$state" != Z ]; do
  sleep 0.5 &
  tm=$!
  if [ -z "$ended" ]; then
    end_sandbox
    [ $n -eq 0 ] || kill_cgroups
    n=1
  else
    kill -KILL $tm 2>/dev/null
  fi
  wait $tm
  wait $tm 2>/dev/null
  tm=
done
wait $sb
# what is left in the cgroups (nothing, as a rule), for 10 s at most; then they go
for d in $MAYURA_CG; do
  i=0
  while held "$d" && [ $i -lt 200 ]; do kill_cgroups; sleep 0.05; i=$((i + 1)); done
done
[ -z "$MAYURA_CG" ] || rmdir $MAYURA_CG 2>/dev/null
exit 0
]=]

-- LAUNCHER and START are what mayura-launch (launcher/launch.c) does, for a checkout without it.
-- In the sandbox's cgroups: joins them, shields itself (and so the agent it becomes) from the OOM
-- killer through the legacy knob (which, unlike oom_score_adj, leaves the floor the agent's
-- commands may go down to at 0), as root mounts the sandbox's file systems (the launcher has
-- started it in a mount namespace of its own), then becomes bubblewrap under the sandbox's host
-- uid, with the agent's bytes on fd 0 and, without an
-- image, the /etc files on descriptors 5..9. fd 5: the agent's bytes.
local START = [=[
for d in $MAYURA_CG; do echo $$ > "$d/cgroup.procs" || exit 125; done
echo -17 > /proc/self/oom_adj 2>/dev/null
# as root, in the launcher's own mount namespace: the sandbox's file systems under MAYURA_STAGE, in
# one mount(8) from the provider's table (on 8, a sealed file in memory; tmpfs owned by host root,
# capped in bytes and inodes; a devpts instance of its own), the roots of the root and of the
# workspace given to the sandbox's host uid
if [ -n "$MAYURA_MOUNT" ]; then
  mount -a -T /proc/self/fd/8 && chown "$MAYURA_UID:$MAYURA_UID" "$MAYURA_STAGE/root" "$MAYURA_STAGE/w" && cd / \
    || exit 125
  exec 8<&-
fi
if [ -n "$MAYURA_UID" ]; then set -- setpriv --reuid "$MAYURA_UID" --regid "$MAYURA_UID" --clear-groups -- "$@"; fi
if [ -n "$MAYURA_INFO" ]; then exec 4<&7 7<&-; fi
if [ -z "$MAYURA_ETC_FDS" ] && [ -n "$MAYURA_RESOLV" ]; then exec "$@" 0<&5 5<<E1
$MAYURA_RESOLV
E1
fi
if [ -z "$MAYURA_ETC_FDS" ]; then exec "$@" 0<&5 5<&-; fi
exec "$@" 0<&5 5<<E1 6<<E2 7<<E3 8<<E4 9<<E5
$MAYURA_ETC_1
E1
$MAYURA_ETC_2
E2
$MAYURA_ETC_3
E3
$MAYURA_ETC_4
E4
$MAYURA_ETC_5
E5
]=]

-- Whether the sandbox's namespace gets connected: 'all', or an allow-list (a table).
local function online(spec)
  return spec.network == 'all' or type(spec.network) == 'table'
end

-- The mount table (its text) from which mayura-launch builds the sandbox's whole root
-- (built_lines), bubblewrap binding it as one; nil when bubblewrap makes the tree (not root here,
-- no mayura-launch, an image a table cannot name or hold).
local function built_table(p, spec)
  if not p.root_table then return nil end
  local image = spec.image or p.image
  if not image then return p.root_table end
  local entries = image_entries(image)
  if not entries then return nil end
  return table_text(built_lines(#p.agent_bytes, p.workspace_mib, p.tmp_mib,
    image_tree(image, entries, spec.network == 'all')))
end

-- bubblewrap's arguments; `built`: the table of a tree mayura-launch builds (built_table).
local function bwrap_argv(p, spec, built)
  local a = { p.bwrap,
    '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try',
    '--uid', tostring(SANDBOX_UID), '--gid', tostring(SANDBOX_UID),
    '--hostname', 'sandbox',
    '--new-session', '--as-pid-1', '--disable-userns', '--clearenv', '--cap-drop', 'ALL',
    '--die-with-parent',
  }
  local function add(...) for _, x in ipairs({ ... }) do a[#a + 1] = x end end
  -- a network namespace of its own, always; with 'all' the host connects it (connect_network)
  -- before the agent gets its setup
  add('--unshare-net')
  if online(spec) then add('--info-fd', tostring(INFO_FD)) end
  local image = spec.image or p.image
  local staged = p.staged    -- the launcher mounts the file systems under STAGE
  if built then
    -- read-only and locked already: bubblewrap adds /proc, in the sandbox's pid namespace
    add('--dev-bind', STAGE .. '/root', '/', '--proc', '/proc', '--chdir', '/')
    add(AGENT_PATH, '--fd', '3', '--lifetime-ms', tostring(spec.lifetime_ms), '--workdir', WORKDIR)
    return a
  end
  if image then
    add('--ro-bind', image, '/')
  else
    -- as root the root is the launcher's tmpfs (else bubblewrap's own), read-only once made
    if staged then add('--bind', STAGE .. '/root', '/') end
    -- the /etc texts come on descriptors 5..9
    for _, st in ipairs(host_steps(p)) do
      if st[1] == 'dir' then add('--dir', st[2])
      elseif st[1] == 'file' then add('--file', tostring(4 + st[2]), st[3])
      else add(st[1] == 'bind' and '--ro-bind' or '--symlink', st[2], st[3]) end
    end
  end
  -- with 'all' and an image, the stack's resolver over the image's own resolv.conf file (without an
  -- image it is one of the /etc copies)
  if spec.network == 'all' and image and lstat_type(image .. '/etc/resolv.conf') == 'file' then
    add('--ro-bind-data', '5', '/etc/resolv.conf')
  end
  add('--proc', '/proc')
  if staged and not image then
    -- bubblewrap's --dev would be a tmpfs naming the host uid
    add('--dir', '/dev')
    for _, d in ipairs(DEVICES) do add('--dev-bind', '/dev/' .. d, '/dev/' .. d) end
    for _, l in ipairs(DEV_LINKS) do add('--symlink', l[1], '/dev/' .. l[2]) end
    add('--dev-bind', STAGE .. '/pts', '/dev/pts')
  else
    add('--dev', '/dev')
  end
  if staged then
    add('--bind', STAGE .. '/s', '/dev/shm', '--bind', STAGE .. '/t', '/tmp', '--bind', STAGE .. '/w', WORKDIR)
  else
    -- /dev/shm is as small as /tmp: a tmpfs without a cap fills the sandbox's memory instead
    add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/dev/shm')
    add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/tmp')
    add('--size', tostring(p.workspace_mib * MIB), '--perms', '0755', '--tmpfs', WORKDIR)
  end
  -- the agent's bytes come on fd 0: a copy, never a bind of a host path
  if image then
    add('--perms', '0555', '--ro-bind-data', '0', AGENT_PATH)
    add('--remount-ro', '/dev')
  else
    add('--dir', '/.mayura', '--perms', '0555', '--file', '0', AGENT_PATH)
    -- the root and /dev (bubblewrap's tmpfs have no cap) hold no writable place of their own
    if not staged then add('--remount-ro', '/dev') end
    add('--remount-ro', '/')
  end
  add('--chdir', '/')
  add(AGENT_PATH, '--fd', '3', '--lifetime-ms', tostring(spec.lifetime_ms), '--workdir', WORKDIR)
  return a
end

-- The launcher's environment for one sandbox (`built`: as for bwrap_argv).
local function launcher_env(p, spec, cg_dirs, cg_kill, host_uid, cg_set, built)
  local life = spec.lifetime_ms + GRACE_MS
  local env = {
    PATH = '/usr/sbin:/usr/bin:/sbin:/bin',
    MAYURA_LIFE = ('%d.%03d'):format(math.floor(life / 1000), life % 1000),
    MAYURA_CG = table.concat(cg_dirs, ' '),
    MAYURA_FREEZER = cg_kill.freezer or '',
    MAYURA_CGKILL = cg_kill.v2 or '',
  }
  -- mayura-launch makes the cgroups itself, before the sandbox's first process joins them
  if cg_set then env.MAYURA_CG_SET = cgroup_set_text(cg_set) end
  -- the shell launcher's steps (mayura-launch, launcher/launch.c, takes them in one program)
  if not p.launch_bin then env.MAYURA_START = START end
  if not (spec.image or p.image) then
    -- on descriptors for bubblewrap's --file, unless the launcher writes them into the root
    if not built then env.MAYURA_ETC_FDS = '1' end
    -- a here-document ends its text with a newline of its own
    for i, name in ipairs(ETC_NAMES) do
      local text = ETC[name]
      if name == 'resolv.conf' and spec.network == 'all' then text = NET_RESOLV end
      env['MAYURA_ETC_' .. i] = (text:gsub('\n$', ''))
    end
  elseif spec.network == 'all' then
    -- for bubblewrap's --ro-bind-data, or the launcher's `file` step (image_tree)
    env[built and 'MAYURA_ETC_4' or 'MAYURA_RESOLV'] = (NET_RESOLV:gsub('\n$', ''))
  end
  if online(spec) then env.MAYURA_INFO = '1' end
  if p.root then env.MAYURA_UID = tostring(host_uid) end
  -- MAYURA_MOUNT: the descriptor of the mount table (start)
  if p.staged then env.MAYURA_STAGE = STAGE end
  return env
end

-- }======================================================

-- {======================================================
-- The agent's shield from the OOM killer
-- =======================================================

local shield_works, warned

-- Whether a process here can shield itself from the OOM killer the way START does (the kernel
-- refuses without CAP_SYS_RESOURCE, and some refuse root too). Asked once per process.
local function oom_shield_works()
  if shield_works == nil then
    local ok, r = pcall(require('mayura.process').run,
      { '/bin/sh', '-c', 'echo -17 > /proc/self/oom_adj; cat /proc/self/oom_score_adj' },
      { env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' } })
    shield_works = ok and r.stdout == '-1000\n'
  end
  return shield_works
end

-- Said once per process (core.report_once: a runner that reloads modules does not repeat it).
local function warn_unshielded()
  if warned then return end
  warned = true
  core.report_once('the kernel refuses to shield local sandbox agents from the OOM killer ' ..
    '(oom_score_adj -1000); a sandbox whose tmpfs fill its memory may lose its agent ' ..
    '(provider.enforced.oom_protected is false)')
end

-- }======================================================

-- {======================================================
-- The network of a sandbox with 'all'
-- =======================================================

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
local function network_fds(spec)
  if not online(spec) then return nil end
  local t = {}
  t.info_host, t.info_child = core.socketpair()
  if not t.info_host then error(errors.sandbox('unavailable', 'cannot make a socket pair'), 0) end
  return t
end

--- Stops the sandbox's stack: closing our end of its exit socket ends it. Its API socket goes too.
local function stop_network(backend)
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
  if type(spec.network) == 'table' then
    -- an allow-list: nothing but the loopback bubblewrap brings up, and the proxy's socket on it
    if not wait_setup_done(pid, 10000) then uv.fs_close(ns_fd); fail('bubblewrap did not get ready') end
    local ok, proxy = pcall(egress.start, ns_fd, { allow = spec.network.allow, on_event = spec.on_event,
      resolve = p.proxy_resolve })
    if not ok then fail('the egress proxy cannot listen: ' .. tostring(proxy)) end
    net.proxy = proxy
    for _, port in ipairs(spec.ports or {}) do
      net.ports[port] = proxy:forward(port)
      if not net.ports[port] then fail('cannot forward port ' .. port) end
    end
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

function Backend:url(port)
  if self.network ~= 'all' and self.network ~= 'allowlist' then
    errors.raise('INVALID_INPUT', 'a sandbox serves ports only with network all or an allow-list', nil, 0)
  end
  local host_port = self.net and self.net.ports[port]
  if not host_port then
    errors.raise('INVALID_INPUT', 'port ' .. tostring(port) .. ' is not one of the ports the sandbox was created with',
      nil, 0)
  end
  return 'http://127.0.0.1:' .. host_port
end

-- Ends the sandbox from the host: closing the control socket has the launcher kill it (or the
-- launcher is already ending it); returns once the launcher has exited, so once every process
-- of the sandbox has ended and its cgroups are removed.
function Backend:release()
  if not self.released then
    self.released = true
    -- its network stack ends as soon as our end of its exit socket closes, meanwhile the rest does
    stop_network(self)
    if not self.closed then
      self.closed = true
      self.ch:close()
    end
    self:_close_control()
  end
  if not self.exited then
    task.await(function(done)
      self.waiters = self.waiters or {}
      self.waiters[#self.waiters + 1] = done
    end)
  end
  -- then for the stack too
  local net = self.net
  if net and net.proc and not net.exited then
    local waited = task.await(function(done)
      net.on_exit = function() done(true) end
      task.after(2000, function() done(false) end)
    end)
    if not waited and not net.exited then net.proc:cancel() end
  end
end

function Backend:_close_control()
  if self.control then
    core.close_fd(self.control)
    self.control = nil
  end
end

-- The launcher has exited: the sandbox is over, and whoever waits in release() goes on.
function Backend:_exited(res)
  self.exited = true
  self.launcher_result = res
  if not self.closed then
    self.closed = true
    pcall(self.ch.close, self.ch)
  end
  self:_close_control()
  stop_network(self)
  local waiters = self.waiters or {}
  self.waiters = nil
  for _, done in ipairs(waiters) do done() end
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local option_keys = {
  image = true, workdir = true, workspace_mib = true, tmp_mib = true, cpus = true, memory_mib = true,
  pids = true, max_lifetime_ms = true, bwrap = true, agent = true, desktop = true, warm = true,
  proxy_resolve = true, isolation = true,
}

--- A provider of local namespace sandboxes. Options: `image` (a root file
-- system directory, as check_image allows; the host's /usr by default), `workspace_mib` (1024),
-- `tmp_mib` (256), `cpus` (1), `memory_mib` (1024), `pids` (256),
-- `max_lifetime_ms` (24 hours), `bwrap` (path of bubblewrap), `agent` (path of
-- the agent binary), `desktop` (the desktop of sandboxes created with
-- `desktop = true`: false for none, or `{ display = 0, width = 1024, height =
-- 768 }`; by default there is one when the root has its programs), `warm` (0: how many
-- sandboxes of the provider's own shape to keep started ahead for the pool that uses it; see
-- "Warm sandboxes" above), `proxy_resolve` (tests only: the allow-list proxy's names, see
-- mayura.sandbox._egress), `isolation` ('namespaces', the only one: 'gvisor' is refused with
-- INVALID_CONFIG, gVisor is the Docker provider's `runtime = 'runsc'`). With `mode = { check = true }`
-- the options are only checked: nothing is run, made or started (a policy's check).
function M.local_sandboxes(options, mode)
  options = options or {}
  local checking = type(mode) == 'table' and mode.check == true
  check.keys(options, option_keys, 'local_sandboxes options', 'INVALID_CONFIG', 3)
  local C = 'INVALID_CONFIG'
  if options.workdir ~= nil and options.workdir ~= WORKDIR then
    errors.raise(C, 'the local provider\'s workdir is ' .. WORKDIR, nil, 2)
  end
  if options.isolation == 'gvisor' then
    -- `runsc do`, gVisor without a daemon, shows its command the host's whole file system (read-only,
    -- under a tmpfs) and takes none of a sandbox's limits: not a sandbox of this provider's kind
    errors.raise(C, "isolation 'gvisor' is not offered by the local provider (gVisor's daemonless " ..
      "`runsc do` shows the host's whole file system and takes no limits): use the Docker provider " ..
      "with runtime = 'runsc'", nil, 2)
  elseif options.isolation ~= nil and options.isolation ~= 'namespaces' then
    errors.raise(C, "isolation must be 'namespaces' (the only one of the local provider)", nil, 2)
  end
  local p = {
    id = 'local',
    workdir = WORKDIR,
    workspace_mib = check.int(options.workspace_mib, 'workspace_mib', 1, 1048576, C, 3, 1024),
    tmp_mib = check.int(options.tmp_mib, 'tmp_mib', 1, 1048576, C, 3, 256),
    memory_mib = check.int(options.memory_mib, 'memory_mib', 16, 16 * 1048576, C, 3, 1024),
    pids = check.int(options.pids, 'pids', 8, 4194304, C, 3, 256),
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, nil, C, 3, 86400000),
    warm = check.int(options.warm, 'warm', 0, 10000, C, 3, 0),
  }
  local cpus = options.cpus or 1
  if type(cpus) ~= 'number' or cpus ~= cpus or cpus <= 0 or cpus > 1024 then
    errors.raise(C, 'cpus must be a number above 0', nil, 2)
  end
  p.cpus = cpus
  if options.image ~= nil and (type(options.image) ~= 'string' or options.image:sub(1, 1) ~= '/') then
    errors.raise(C, 'image must be the absolute path of a root file system directory', nil, 2)
  end
  p.bwrap = find_in_path(options.bwrap or 'bwrap')
  if not p.bwrap then errors.raise(C, 'bubblewrap (bwrap) is not installed', nil, 2) end
  p.agent = options.agent and absolute(options.agent) or find_agent()
  if not p.agent or not exists(p.agent) then errors.raise(C, 'the sandbox agent is not built (make)', nil, 2) end
  p.root = is_root()
  -- mayura's own files (this module, the agents, the launcher), which no image may hold
  p.own_files = { p.agent, find_agent(), (debug.getinfo(1, 'S').source:match('^@(.+)$')) }
  if p.own_files[2] then p.own_files[4] = p.own_files[2]:gsub('mayura%-agent$', 'mayura-launch') end
  if options.image ~= nil then p.image = check_image(p, options.image, 3) end
  p.cg_mode = cgroup_mode()
  p.cg_parts = cgroup_parts(p.cg_mode)
  -- 'all' is a namespace of its own behind a user-mode stack; joining that namespace (for the stack
  -- and the firewall) needs root here, so run as another user, or without the programs, there is no 'all'
  p.slirp4netns = find_in_path('slirp4netns')
  p.nft = find_in_path('nft') or find_in_path('/usr/sbin/nft') or find_in_path('/sbin/nft')
  p.nsenter = find_in_path('nsenter') or find_in_path('/usr/bin/nsenter')
  p.setpriv = find_in_path('setpriv') or find_in_path('/usr/bin/setpriv')
  local can_connect = p.root and p.slirp4netns ~= nil and p.nft ~= nil and p.nsenter ~= nil and p.setpriv ~= nil
    and make_net_dir()
  p.desktop = desktop.settings(options.desktop, p.image or '', 2)
  p.features = {
    stdin = true, ports = can_connect or p.root == true, desktop = p.desktop ~= nil,
    network = can_connect and { 'none', 'all', 'allowlist' } or p.root and { 'none', 'allowlist' }
      or { 'none' },
  }
  p.proxy_resolve = egress.check_resolve(options.proxy_resolve, 2)
  p.can_connect = can_connect
  p.root_links = {}
  for _, d in ipairs(ROOT_DIRS) do
    p.root_links[d] = readlink_type('/' .. d)
  end
  p.etc_host = {}
  -- each one there, by the path it names (mayura-launch binds no link: /etc/localtime is one)
  for _, name in ipairs(ETC_HOST) do
    p.etc_host[name] = target_type('/etc/' .. name) and (require('luv').fs_realpath('/etc/' .. name)) or nil
  end
  p.etc_host.resolv = exists('/etc/resolv.conf')
  -- as root, the launcher mounts the sandbox's tmpfs itself where it may (not in a container
  -- without CAP_SYS_ADMIN, say: then bubblewrap makes them, as for another user)
  p.staged = not checking and p.root and make_stage() and stage_works()
  -- the agent's bytes, read once: each launcher gets them on a pipe, so no sandbox ever reads
  -- them from a path (the checkout may be closed to the sandboxes' uids, a shared directory
  -- could be replaced by another user)
  -- the launcher as one program (launcher/launch.c), found where the agent is built or installed;
  -- without it, the shell LAUNCHER and START here
  local built = find_agent()
  local launch_bin = built and built:gsub('mayura%-agent$', 'mayura-launch')
  if launch_bin and launch_bin ~= built and exists(launch_bin) then p.launch_bin = launch_bin end
  p.agent_bytes = read_plain(p.agent)
  if not p.agent_bytes or #p.agent_bytes == 0 then errors.raise(C, 'the sandbox agent cannot be read', nil, 2) end
  -- without an image the sandbox's /usr is the host's: the agent built against the host's libraries
  -- (found next to the static one, unless `agent` names one) is all a sandbox copies, and the
  -- library pages it maps are shared by every sandbox
  if not options.agent then
    local dyn = p.agent:gsub('mayura%-agent$', 'mayura-agent-host')
    local bytes = dyn ~= p.agent and exists(dyn) and read_plain(dyn)
    if bytes and #bytes > 0 then p.agent_host_bytes = bytes end
  end
  -- prepared once: the launchers' mount tables (their texts; each launcher gets its own copy)
  if p.staged then
    local agent_size = #(p.agent_host_bytes or p.agent_bytes)
    p.fstab = table_text(fstab_lines(agent_size, p.workspace_mib, p.tmp_mib))
    p.staged = p.fstab ~= nil
    -- mayura-launch builds the whole root of a sandbox without an image
    if p.staged and p.launch_bin then
      p.root_table = table_text(built_lines(agent_size, p.workspace_mib, p.tmp_mib, host_tree(p)))
    end
  end
  -- what holds where: cgroups and the inode caps need root here; without them the host's limits apply
  p.enforced = {
    memory = p.cg_mode ~= nil, pids = p.cg_mode ~= nil, cpus = p.cg_mode ~= nil,
    workspace_mib = true, tmp_mib = true, lifetime = true, network = true,
    inodes = p.staged, oom_protected = not checking and oom_shield_works(),
  }
  if not checking and not p.enforced.oom_protected then warn_unshielded() end
  local counter = 0

  -- A sandbox up to its agent's hello (its network connected): what a warm one is until handed out.
  local function start(self, spec)
    if spec.network == 'all' and not self.can_connect then
      errors.raise('INVALID_INPUT', 'network all needs root, slirp4netns, nft, nsenter and setpriv here', nil, 0)
    end
    if type(spec.network) == 'table' and not self.root then
      errors.raise('INVALID_INPUT', 'a network allow-list needs root here', nil, 0)
    end
    if spec.ports and #spec.ports > 0 and not online(spec) then
      errors.raise('INVALID_INPUT', 'ports are served only with network all or an allow-list', nil, 0)
    end
    if spec.image ~= nil then check_image(self, spec.image, 0) end
    -- what follows up to the launcher's start (its arguments, its mount table, the process
    -- itself) takes a millisecond or two at once: under a host's budget it starts only with half
    -- of the step left
    task.fresh_step(0.5)
    counter = counter + 1
    local id = 'local-' .. random_hex(6)
    local limits = {
      memory_mib = math.min(spec.memory_mib or self.memory_mib, self.memory_mib),
      cpus = math.min(spec.cpus or self.cpus, self.cpus),
      pids = self.pids,
    }
    local cg_dirs, cg_kill, cg_set = {}, {}, nil
    if self.cg_parts then
      cg_dirs, cg_kill, cg_set = plan_cgroups(self.cg_parts, id, limits)
      if not self.launch_bin then
        make_cgroups(cg_dirs, cg_set)
        cg_set = nil
      end
    end
    local host_uid = self.root and (HOST_UID_BASE + (tonumber(random_hex(2), 16) or counter)) or nil
    -- out of the host's process tree (a session of its own, without the tree's tag: core.spawn's
    -- `outlive`), so that the host ending, even its state closing, never kills the launcher
    -- before it cleans up
    local argv = self.launch_bin and { self.launch_bin } or { '/bin/sh', '-c', LAUNCHER, 'mayura-launch' }
    local tree = built_table(self, spec)
    for _, x in ipairs(bwrap_argv(self, spec, tree)) do argv[#argv + 1] = x end

    -- the mount table, this launcher's own: a sealed file in memory on a descriptor it inherits
    local text = self.staged and (tree or self.fstab) or nil
    local t = text and core.sealed_fd(text)
    local a, b
    if t or not text then a, b = core.socketpair() end
    local c, d
    if a then c, d = core.socketpair() end
    if not c then
      for _, fd in ipairs({ a, b }) do core.close_fd(fd) end
      if t then core.close_fd(t) end
      remove_cgroups(cg_dirs)
      error(errors.sandbox('unavailable', 'cannot make a socket pair or a mount table'), 0)
    end
    local backend = setmetatable({
      id = id, network = type(spec.network) == 'table' and 'allowlist' or spec.network,
      cg_mode = self.cg_mode, cg_dirs = cg_dirs, host_uid = host_uid,
      control = c, closed = false, released = false, exited = false,
    }, Backend)
    -- with 'all', bubblewrap says its pid on INFO_FD (the launcher's 5) while the host connects it
    local fds_ok, net_fds = pcall(network_fds, spec)
    if not fds_ok then
      for _, fd in ipairs({ a, b, d }) do core.close_fd(fd) end
      if t then core.close_fd(t) end
      backend:_close_control()
      remove_cgroups(cg_dirs)
      error(net_fds, 0)
    end
    local fds = { b, d }
    if net_fds then fds[#fds + 1] = net_fds.info_child end
    local env = launcher_env(self, spec, cg_dirs, cg_kill, host_uid, cg_set, tree)
    if t then
      fds[#fds + 1] = t
      env.MAYURA_MOUNT = tostring(2 + #fds)
    end
    local proc, err = core.spawn({
      argv = argv, fds = fds,
      stdin = not (spec.image or self.image) and self.agent_host_bytes or self.agent_bytes,
      max_output_bytes = 65536, env = env, outlive = true,
    }, function(res) backend:_exited(res) end)
    core.close_fd(b)
    core.close_fd(d)
    if t then core.close_fd(t) end
    if net_fds then core.close_fd(net_fds.info_child) end
    if not proc then
      core.close_fd(a)
      if net_fds then core.close_fd(net_fds.info_host) end
      backend:_close_control()
      remove_cgroups(cg_dirs)
      error(errors.sandbox('unavailable', 'cannot start the sandbox', err), 0)
    end
    backend.proc = proc
    backend.ch = core.channel(a, {
      max_frame_bytes = agent_backend.MAX_FRAME_BYTES,
      on_close = function() backend.closed = true end,
    })
    if net_fds then
      local nok, nerr = pcall(connect_network, self, backend, spec, net_fds.info_host)
      if not nok then agent_backend.start_failed(backend, nerr) end
    end
    -- the agent answers once the namespaces are up
    local ok, cerr = pcall(agent_backend.hello, backend)
    if not ok then agent_backend.start_failed(backend, cerr) end
    return backend
  end

  -- What a started sandbox gets before it is handed out: the env (never on a command line), the
  -- desktop when asked for.
  local function finish(self, backend, spec, warm)
    local env = spec.env
    if type(spec.network) == 'table' then   -- an allow-list: commands find the proxy
      env = {}
      for k, v in pairs(spec.env or {}) do env[k] = v end
      for k, v in pairs(egress.env()) do env[k] = v end
    end
    agent_backend.setup(backend, desktop.env(self.desktop, spec, env), WORKDIR, warm and spec.lifetime_ms or nil)
    if spec.desktop then desktop.attach(backend, self.desktop) end
    backend.labels = spec.labels
  end

  function p.create(self, spec)
    local backend = start(self, spec)
    local ok, cerr = pcall(finish, self, backend, spec)
    if not ok then agent_backend.start_failed(backend, cerr) end
    return backend
  end

  -- warm sandboxes: the provider's own shape (network 'none', its image and limits, no ports, no
  -- desktop), handed out to a create that asks for no more than that
  agent_backend.add_warm(p, p.warm, {
    make = function(self, lifetime_ms, labels)
      return start(self, { lifetime_ms = lifetime_ms, network = 'none', labels = labels })
    end,
    matches = function(self, spec)
      return spec.network == 'none' and not (spec.ports and #spec.ports > 0) and not spec.desktop
        and (spec.image == nil or spec.image == self.image)
        and (spec.cpus == nil or spec.cpus >= self.cpus)
        and (spec.memory_mib == nil or spec.memory_mib >= self.memory_mib)
    end,
    hand_out = function(self, backend, spec) finish(self, backend, spec, true) end,
  })
  return p
end

-- }======================================================

return M
