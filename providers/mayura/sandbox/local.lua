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
--     entries beneath its directory, never through a link (_local_root's check_image);
--   * /workspace, /tmp and /dev/shm are tmpfs with size caps; the user is uid
--     1000 with no capabilities and no_new_privs;
--   * every sandbox has a network namespace of its own: with 'none' only a
--     loopback; with 'all' (as root, with slirp4netns, nft, nsenter and
--     setpriv here) a firewall in it and a user-mode stack of its own behind
--     the host's table; with an allow-list (as root) only an egress proxy's
--     socket on its loopback (mayura.sandbox._local_net says how);
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
-- static program, found beside the agent, its command line and environment made by
-- mayura.sandbox._local_launch; outside the sandbox's cgroups
-- (mayura.sandbox._local_cgroup) and out of the host process's own process tree) starts bubblewrap and keeps the
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
-- bubblewrap; mayura.sandbox._local_root makes the tables): the root,
-- /workspace, /tmp and /dev/shm are tmpfs with `size=`, `nr_inodes=` (one
-- inode per 4 KiB page, so only empty files, directories and links can run
-- out of inodes before bytes do) and `mode=`, owned by host
-- root (so their options name no host uid; the roots of the root and of
-- /workspace are given to the sandbox's uid), and /dev holds binds of the
-- usual device nodes and a devpts instance of its own. The sandbox's mount
-- table then names no host path but /usr and the shared parts of /etc, and no
-- host uid (its uid_map is bubblewrap's inner one, 1000 to 1000). Otherwise,
-- and as another user, bubblewrap makes the tmpfs and /dev: no inode cap
-- (`enforced.inodes` is false), and their options show the user's uid; so do
-- /dev and the agent's copy with an `image`, whose own path shows as the root.
--
-- Snapshots (features.snapshots): run as root with the launcher's mounts, on Linux 6.3 and later,
-- 'native': `mayura-launch --snapshot` copies the workspace and /tmp, in the sandbox's own mount
-- namespace and as its uid, never following a link, into a tmpfs of the host's under
-- /run/mayura-snap (root's alone); a sandbox made from one mounts an overlay on each of them, the
-- snapshot's copy its read-only lower layer (idmapped to the new sandbox's uid), a fresh tmpfs
-- its upper one, so the sandboxes made from one snapshot share its pages. Snapshots of a host
-- process that is gone are swept when a provider is made (mayura.sandbox._local_snap). Otherwise 'generic'.
--
-- The agent is shielded from the OOM killer where the kernel allows it;
-- `enforced.oom_protected` says whether it does (mayura.sandbox._local_oom).
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
local root_fs = require('mayura.sandbox._local_root')
local cgroup = require('mayura.sandbox._local_cgroup')
local network = require('mayura.sandbox._local_net')
local oom = require('mayura.sandbox._local_oom')
local snap = require('mayura.sandbox._local_snap')
local launch = require('mayura.sandbox._local_launch')

local M = {}

local HOST_UID_BASE = 1200000     -- host uids for sandboxes when run as root: [base, base + 65536)
local WORKDIR = root_fs.WORKDIR

-- {======================================================
-- Host helpers
-- =======================================================

local await_cb, exists, read_plain = host.await, host.exists, host.read_plain
local absolute, find_in_path, find_agent, random_hex =
  host.absolute, host.find_in_path, host.find_agent, host.random_hex

local function readlink_type(path)
  local st = await_cb(function(cb) core.fs.stat(path, cb) end)
  return st and st.type
end

-- The type of what `path` names, through symbolic links ('directory', 'file', ...), or nil.
local function target_type(path)
  local err, st = await_cb(function(cb) require('luv').fs_stat(path, cb) end)
  return not err and st and st.type or nil
end

local function is_root()
  return host.uid() == 0
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
  return cgroup.oom_kills(self.cg_mode, self.cg_dirs)
end

-- A native snapshot (mayura.sandbox._local_snap): `{ size_bytes, release, archive }`.
Backend.snapshot = snap.snapshot

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
    network.stop(self)
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
  network.stop(self)
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
  -- the launcher (launcher/launch.c), built and installed beside the agent
  local built = find_agent()
  local launch_bin = built and built:gsub('mayura%-agent$', 'mayura-launch')
  if not launch_bin or launch_bin == built or not exists(launch_bin) then
    errors.raise(C, 'the sandbox launcher (mayura-launch) is not built beside the agent (make)', nil, 2)
  end
  p.launch_bin = launch_bin
  p.root = is_root()
  -- mayura's own files (this module, the agents, the launcher), which no image may hold
  p.own_files = { p.agent, built, (debug.getinfo(1, 'S').source:match('^@(.+)$')), launch_bin }
  if options.image ~= nil then p.image = root_fs.check_image(p, options.image, 3) end
  p.cg_mode = cgroup.mode()
  p.cg_parts = cgroup.parts(p.cg_mode)
  -- 'all' is a namespace of its own behind a user-mode stack; joining that namespace (for the stack
  -- and the firewall) needs root here, so run as another user, or without the programs, there is no 'all'
  p.slirp4netns = find_in_path('slirp4netns')
  p.nft = find_in_path('nft') or find_in_path('/usr/sbin/nft') or find_in_path('/sbin/nft')
  p.nsenter = find_in_path('nsenter') or find_in_path('/usr/bin/nsenter')
  p.setpriv = find_in_path('setpriv') or find_in_path('/usr/bin/setpriv')
  local can_connect = p.root and p.slirp4netns ~= nil and p.nft ~= nil and p.nsenter ~= nil and p.setpriv ~= nil
    and network.make_dir()
  p.desktop = desktop.settings(options.desktop, p.image or '', 2)
  p.features = {
    stdin = true, ports = can_connect or p.root == true, desktop = p.desktop ~= nil,
    network = can_connect and { 'none', 'all', 'allowlist' } or p.root and { 'none', 'allowlist' }
      or { 'none' },
  }
  p.proxy_resolve = egress.check_resolve(options.proxy_resolve, 2)
  p.can_connect = can_connect
  p.root_links = {}
  for _, d in ipairs(root_fs.ROOT_DIRS) do
    p.root_links[d] = readlink_type('/' .. d)
  end
  p.etc_host = {}
  -- each one there, by the path it names (mayura-launch binds no link: /etc/localtime is one)
  for _, name in ipairs(root_fs.ETC_HOST) do
    p.etc_host[name] = target_type('/etc/' .. name) and (require('luv').fs_realpath('/etc/' .. name)) or nil
  end
  p.etc_host.resolv = exists('/etc/resolv.conf')
  -- as root, the launcher mounts the sandbox's tmpfs itself where it may (not in a container
  -- without CAP_SYS_ADMIN, say: then bubblewrap makes them, as for another user)
  p.staged = not checking and p.root and root_fs.make_stage() and root_fs.stage_works()
  -- the agent's bytes, read once: each launcher gets them on a pipe, so no sandbox ever reads
  -- them from a path (the checkout may be closed to the sandboxes' uids, a shared directory
  -- could be replaced by another user)
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
    p.fstab = root_fs.table_text(root_fs.fstab_lines(agent_size, p.workspace_mib, p.tmp_mib))
    p.staged = p.fstab ~= nil
    -- mayura-launch builds the whole root of a sandbox without an image
    if p.staged then p.root_table = root_fs.host_table(p, agent_size) end
  end
  -- what holds where: cgroups and the inode caps need root here; without them the host's limits apply
  p.enforced = {
    memory = p.cg_mode ~= nil, pids = p.cg_mode ~= nil, cpus = p.cg_mode ~= nil,
    workspace_mib = true, tmp_mib = true, lifetime = true, network = true,
    inodes = p.staged, oom_protected = not checking and oom.shield_works(),
  }
  if not checking and not p.enforced.oom_protected then oom.warn_unshielded() end
  -- snapshots: native (an overlay over a copy in the host's memory) where the launcher mounts the
  -- sandbox's file systems and the kernel has idmapped tmpfs under overlayfs, else the generic way;
  -- the snapshots of a host process that is gone are swept first
  p.features.snapshots = snap.kind(p)
  local counter = 0

  -- A sandbox up to its agent's hello (its network connected): what a warm one is until handed out.
  local function start(self, spec)
    if spec.network == 'all' and not self.can_connect then
      errors.raise('INVALID_INPUT', 'network all needs root, slirp4netns, nft, nsenter and setpriv here', nil, 0)
    end
    if type(spec.network) == 'table' and not self.root then
      errors.raise('INVALID_INPUT', 'a network allow-list needs root here', nil, 0)
    end
    if spec.ports and #spec.ports > 0 and not network.online(spec) then
      errors.raise('INVALID_INPUT', 'ports are served only with network all or an allow-list', nil, 0)
    end
    if spec.image ~= nil then root_fs.check_image(self, spec.image, 0) end
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
      cg_dirs, cg_kill, cg_set = cgroup.plan(self.cg_parts, id, limits)
    end
    local host_uid = self.root and (HOST_UID_BASE + (tonumber(random_hex(2), 16) or counter)) or nil
    -- out of the host's process tree (a session of its own, without the tree's tag: core.spawn's
    -- `outlive`), so that the host ending, even its state closing, never kills the launcher
    -- before it cleans up
    local argv = { self.launch_bin }
    local tree, tree_fstab = root_fs.built_table(self, spec), nil
    for _, x in ipairs(launch.bwrap_argv(self, spec, tree)) do argv[#argv + 1] = x end

    -- the mount table, this launcher's own: a sealed file in memory on a descriptor it inherits
    if spec.snapshot and not tree then
      tree_fstab = root_fs.table_text(root_fs.fstab_lines(#(self.agent_host_bytes or self.agent_bytes),
        self.workspace_mib, self.tmp_mib, spec.snapshot))
    end
    local text = self.staged and (tree or tree_fstab or self.fstab) or nil
    local t = text and core.sealed_fd(text)
    local a, b
    if t or not text then a, b = core.socketpair() end
    local c, d
    if a then c, d = core.socketpair() end
    if not c then
      for _, fd in ipairs({ a, b }) do core.close_fd(fd) end
      if t then core.close_fd(t) end
      cgroup.remove(cg_dirs)
      error(errors.sandbox('unavailable', 'cannot make a socket pair or a mount table'), 0)
    end
    local backend = setmetatable({
      id = id, network = type(spec.network) == 'table' and 'allowlist' or spec.network, provider = self,
      cg_mode = self.cg_mode, cg_dirs = cg_dirs, host_uid = host_uid,
      control = c, closed = false, released = false, exited = false,
    }, Backend)
    -- with 'all', bubblewrap says its pid on network.INFO_FD (the launcher's 5) while the host connects it
    local fds_ok, net_fds = pcall(network.fds, spec)
    if not fds_ok then
      for _, fd in ipairs({ a, b, d }) do core.close_fd(fd) end
      if t then core.close_fd(t) end
      backend:_close_control()
      cgroup.remove(cg_dirs)
      error(net_fds, 0)
    end
    local fds = { b, d }
    if net_fds then fds[#fds + 1] = net_fds.info_child end
    local env = launch.launcher_env(self, spec, cg_dirs, cg_kill, host_uid, cg_set, tree)
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
      cgroup.remove(cg_dirs)
      error(errors.sandbox('unavailable', 'cannot start the sandbox', err), 0)
    end
    backend.proc = proc
    backend.ch = core.channel(a, {
      max_frame_bytes = agent_backend.MAX_FRAME_BYTES,
      on_close = function() backend.closed = true end,
    })
    if net_fds then
      local nok, nerr = pcall(network.connect, self, backend, spec, net_fds.info_host)
      if not nok then agent_backend.start_failed(backend, nerr) end
    end
    -- the agent answers once the namespaces are up
    local ok, cerr = pcall(agent_backend.hello, backend)
    if not ok then agent_backend.start_failed(backend, cerr) end
    return backend
  end

  -- start, holding the snapshot the sandbox is made from until its mounts are made (its overlay
  -- holds it from then on): a release meanwhile takes it off the host only after
  local start_plain = start
  start = function(self, spec)
    if not spec.snapshot then return start_plain(self, spec) end
    return snap.hold(spec.snapshot, start_plain, self, spec)
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

  -- warm sandboxes: the provider's own shape, handed out to a create that asks for no more than that
  agent_backend.add_own_shape_warm(p, start, {
    hand_out = function(self, backend, spec) finish(self, backend, spec, true) end,
  })
  return p
end

-- }======================================================

M.sandboxes = M.local_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
