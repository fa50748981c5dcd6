--- mayura.sandbox.docker: sandboxes as Docker containers on this machine.
--
-- `docker_sandboxes(options)` is a provider for `create_sandboxes`. Each
-- sandbox is one locked-down container:
--
--   * no network (`--network none`) unless 'all' was allowed and asked for;
--     then the bridge network `mayura-isolated`, isolating, behind the
--     host's rules as root; with an allow-list, `--network none` and an
--     egress proxy of its own (mayura.sandbox._docker_net says how);
--   * every capability dropped, no-new-privileges, the image's root
--     read-only, memory with no swap (memory-swap = memory), CPUs and a
--     process limit; logs off;
--   * by default a uid and gid of its own (mayura.sandbox._docker_uid); `user`
--     gives every sandbox one fixed numeric uid:gid instead;
--   * the working directory, /tmp and /dev/shm in memory (tmpfs, owned by the
--     sandbox's user, /dev/shm with /tmp's cap rather than Docker's 64 MiB),
--     each capped in bytes and in inodes (one per 8 KiB of its size, as the
--     kernel sizes a tmpfs by its RAM), so a flood of empty files ends with
--     ENOSPC; their pages count toward the container's memory;
--   * the in-sandbox agent (the static build/mayura-agent) bind-mounted
--     read-only as the container's entrypoint and PID 1 (no docker init), from
--     a copy in the socket directories' base named by its SHA-256 (never from
--     its path on the host),
--     with an OOM score of -500 (its commands reset theirs to 0); a runtime
--     that cannot lower a score (no CAP_SYS_RESOURCE, as in some nested
--     setups) fails the start, and the provider then starts its containers
--     without it and says so once on stderr;
--   * SIGKILL as the container's stop signal: the agent, PID 1, has no
--     handler for SIGTERM, so a daemon shutting down (or a `docker stop`)
--     would wait 10 s a container for nothing before killing it anyway;
--   * commands and files go through the agent (a fork+exec and a socket round
--     trip, not a `docker exec`); the environment reaches commands through
--     the agent's `setup` request, never the container's configuration or a
--     host command line;
--   * images are never pulled: an image that is not on the machine fails with
--     INVALID_CONFIG before anything is created;
--   * with the option `desktop` (the image has Xvfb, xdotool, xwd and
--     netpbm, as mayura-test/desktop:1 of scripts/docker-setup.sh),
--     `features.desktop` is true and a sandbox created with `desktop = true`
--     runs an X server of its own (mayura.sandbox._desktop); an image without
--     the programs fails that create with INVALID_INPUT.
--
-- The lifetime is held by the host, not only by the agent (code in the
-- sandbox shares the agent's uid and may stop it): the agent ends its
-- container at its lifetime; a host timer removes it a little after; and the
-- container carries its end in a label (mayura.expires, ms since the epoch),
-- so that a reaper, run at every construction of a provider and at creates
-- (at most every 30 s), removes our containers (label mayura.provider) whose
-- time is over, and their socket directories: what a host killed with
-- SIGKILL left (mayura.sandbox._docker_reap). Containers are created with
-- auto-remove too. Release returns once the container is gone.
--
-- Snapshots are 'native': the sandbox's files (its tmpfs, which `docker commit` misses) archived
-- in it as its user, then put into an image the daemon commits from the sandbox's image
-- (`mayura-snapshot:<hex>`, never pushed, labelled with this host process's mark); a sandbox made
-- from one runs that image and unpacks the archive from its layer before it is handed out. The
-- image goes when the snapshot is released and no sandbox of it runs; a provider made sweeps
-- those of a host process that is gone (mayura.sandbox._docker_snap).
--
-- `runtime` names one of the daemon's runtimes (checked against `docker info`:
-- INVALID_CONFIG otherwise); 'runsc' (gVisor, registered by
-- scripts/docker-setup.sh with gVisor's network stack off and the agent's
-- socket made as a host socket) is a stronger tier: the sandbox's system
-- calls meet gVisor's kernel, not the host's (`enforced.kernel` is
-- 'gvisor'). What differs there: network 'none' alone (`features.network`);
-- processes held to `pids` by RLIMIT_NPROC in gVisor's kernel, the host's
-- pids cgroup sized for gVisor's own threads (a bomb whose churn reaches it
-- ends the sandbox whole, `gone`); no OOM score (the host's OOM killer ends
-- the sandbox whole: `enforced.oom_protected` false); tmpfs capped in bytes
-- but not inodes (`enforced.inodes` false); no child subreaper, so a process
-- that leaves both its command's session and environment outlives the
-- command until the release; PID 1 not shielded from its own namespace (code
-- inside can end its agent, and so its sandbox); the agent's filter on every
-- command (`--no-spawner`: gVisor's CLONE_PARENT children never reach PID
-- 1's wait, so the agent forks each command itself); Docker's own seccomp
-- profile is not applied by runsc (gVisor is the boundary).
--
-- `engine = 'cli'` (the default) runs the docker CLI, `engine = 'api'` speaks
-- the Engine API over its unix socket (mayura.sandbox._docker_engine). Only
-- local daemons: a tcp:// or ssh:// host is refused, because the agent and its
-- socket directory are bind-mounted from this machine. The agent's socket is
-- made in a per-sandbox host directory of ours (mayura.sandbox._docker_dirs).
-- The options are checked, and the provider's table made from them, by
-- mayura.sandbox._docker_options.
--
-- Warm sandboxes (`warm = N`, mayura.sandbox._agent_backend's add_warm): N
-- containers of the provider's shape (network none, its image and limits, no
-- ports, no desktop) with the pool's labels, started and connected (hello
-- said, no setup) for the pool made over the provider. A create asking for
-- that shape with no labels of its own (a container's labels are fixed when
-- it is made) gets one: the image's and the asked env go in the agent's one
-- setup then, and the host's timer is set to the asked lifetime. They live
-- the pool's max_lifetime_ms (mayura.expires says so), take slots of its
-- max_sandboxes, and end with the pool's close or, as every container here,
-- with the host: the agent ends its container when the host's connection
-- closes, and the reaper removes what is past its time.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local agent_backend = require('mayura.sandbox._agent_backend')
local desktop = require('mayura.sandbox._desktop')
local egress = require('mayura.sandbox._egress')
local engines = require('mayura.sandbox._docker_engine')
local dirs = require('mayura.sandbox._docker_dirs')
local uids = require('mayura.sandbox._docker_uid')
local docker_net = require('mayura.sandbox._docker_net')
local docker_options = require('mayura.sandbox._docker_options')
local reaper = require('mayura.sandbox._docker_reap')
local docker_snap = require('mayura.sandbox._docker_snap')
local host_util = require('mayura.sandbox._host')

local M = {}

local MIB = 1048576
local MODE_0700 = tonumber('700', 8)
local MODE_0703 = tonumber('703', 8)
local AGENT_IN = '/.mayura/agent'          -- where the agent is mounted in the container
local RUN_IN = '/.mayura/run'              -- where the socket directory is mounted
local SOCKET = 'agent.sock'
local IMAGE_CACHE_MS = 30000               -- how long an image found stays known
local START_WAIT_MS = 30000                -- from a started container to its agent's socket
local NETWORK_CHECK_MS = 30000             -- how long a checked network stays known
local LIFETIME_GRACE_MS = reaper.LIFETIME_GRACE_MS   -- the host removes a container this long after its lifetime
local OOM_SCORE_ADJ = -500                 -- the agent's (PID 1's); its commands reset theirs to 0
local INODE_BYTES = 8192                   -- a tmpfs gets one inode per this many bytes of its size
local MIN_INODES = 1024
local GVISOR_BASE_TASKS = 128              -- host tasks of an idle gVisor sandbox (about 40), with room
local GVISOR_TASKS_PER_PID = 12            -- host tasks per process in a gVisor sandbox (9 to 11 measured)
local ID_LABEL, PROVIDER_LABEL, EXPIRES_LABEL = engines.ID_LABEL, engines.PROVIDER_LABEL, engines.EXPIRES_LABEL
local exists, read_plain, random_hex = host_util.exists, host_util.read_plain, host_util.random_hex
local uv_fs, remove_dir = dirs.uv_fs, dirs.remove_dir

local oom_refused = {}      -- daemon host -> true once its runtime refused a negative OOM score

-- {======================================================
-- A sandbox backend
-- =======================================================

local Backend = agent_backend.class()

function Backend:url(port)
  if self.network ~= 'all' and self.network ~= 'allowlist' then
    errors.raise('INVALID_INPUT', 'a sandbox serves ports only with network all or an allow-list', nil, 0)
  end
  local host_port = self.ports[port]
  if not host_port then error(errors.sandbox('not_found', 'the port is not published'), 0) end
  return 'http://127.0.0.1:' .. host_port
end

-- Processes of the sandbox killed for memory, from its cgroup (0 when it cannot be read).
function Backend:oom_kills()
  if not self.oom_file then return 0 end
  local s = read_plain(self.oom_file) or ''
  return tonumber(s:match('oom_kill (%d+)')) or 0
end

function Backend:release()
  -- a release under way (the host's timer's, say): return once it is done too
  if not self:release_begin() then return end
  -- killing PID 1 ends every process of the container; its auto-remove is raced safely by rm -f,
  -- and remove returns once the container is gone. The channel closes after: its end would end
  -- the agent, and so start the auto-remove first
  if self.proxy then self.proxy:close() end
  local ok, err = pcall(self.engine.remove, self.engine, self.container)
  self:close_channel()
  pcall(remove_dir, self.dir)
  if self.own_uid then uids.free(self.uid) end
  docker_snap.let_go(self)
  self:release_done(ok, err)
end

-- A native snapshot (mayura.sandbox._docker_snap).
Backend.snapshot = docker_snap.take

local function cgroup_oom_file(id)
  local candidates = {
    '/sys/fs/cgroup/memory/docker/' .. id .. '/memory.oom_control',
    '/sys/fs/cgroup/system.slice/docker-' .. id .. '.scope/memory.events',
    '/sys/fs/cgroup/docker/' .. id .. '/memory.events',
    '/sys/fs/cgroup/memory/system.slice/docker-' .. id .. '.scope/memory.oom_control',
  }
  for _, p in ipairs(candidates) do
    if exists(p) then return p end
  end
  return nil
end

-- Waits for the agent's socket and connects; raises `unavailable` when the container ends first.
local function connect_agent(engine, id, socket_path, on_close)
  local started = core.hrtime_ms()
  local delay, next_check = 2, started + 1000
  while true do
    local ch = agent_backend.connect(socket_path, on_close)
    if ch then return ch end
    local now = core.hrtime_ms()
    if now - started > START_WAIT_MS then
      error(errors.sandbox('unavailable', 'the sandbox agent did not start in time'), 0)
    end
    if now >= next_check then
      next_check = now + 1000
      local st = engine:inspect(id)
      if not st or not st.running then error(errors.sandbox('unavailable', 'the sandbox did not start'), 0) end
    end
    task.sleep(delay)
    if delay < 50 then delay = delay * 2 end
  end
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

--- A provider of Docker sandboxes. Options (and defaults): `image` (required),
-- `engine` ('cli' | 'api'), `docker` (the CLI; 'docker' on the PATH), `host`
-- (DOCKER_HOST or unix:///var/run/docker.sock; local sockets only), `user`
-- (a numeric 'uid:gid' for every sandbox; by default each sandbox gets a uid
-- and gid of its own that no host account has), `workdir` ('/workspace'),
-- `workspace_mib` (1024), `tmp_mib`
-- (256), `cpus` (1), `memory_mib` (1024), `pids` (256), `read_only_root`
-- (true), `max_lifetime_ms` (24 hours); and `agent` (the agent binary) and
-- `run_dir` (where the sockets' directories are made) for unusual setups;
-- `desktop` (true, or `{ display = 0, width = 1024, height = 768 }`: the
-- image has a desktop's programs; none by default); `runtime` (the daemon's
-- default; 'runsc' for gVisor, see above); `warm` (0: how many containers of the
-- provider's own shape to keep started ahead for the pool that uses it; see "Warm sandboxes");
-- `proxy_resolve` (tests only: the allow-list proxy's names, see mayura.sandbox._egress).
-- With `how = { check = true }` the options are only checked: nothing is run, made or started (a
-- policy's check; the reaper of expired containers waits for a provider made to be used).
function M.docker_sandboxes(options, how)
  local p, checking = docker_options.provider(options, how)
  -- a runtime that refused a negative OOM score for an earlier provider of this daemon refuses it still
  if oom_refused[p.host] then p.enforced.oom_protected = false end
  if not checking then reaper.reap(p.engine, p.host, p.run_base, p.my_uid, true) end
  local images = {}          -- image -> { env, until_ms }
  local prepared = false
  local network_checked      -- until when the network of 'all' sandboxes is known to be right (hrtime ms)

  local function image_env(self, name)
    local known = images[name]
    if known and known.until_ms > core.hrtime_ms() then return known.env end
    local env = self.engine:image_env(name)
    if env == nil then
      images[name] = nil
      error(engines.no_image(name), 0)
    end
    local map = {}
    for _, kv in ipairs(env) do
      local k, v
      if type(kv) == 'string' then k, v = kv:match('^([%a_][%w_]*)=(.*)$') end
      if k and not v:find('%z') then map[k] = v end
    end
    images[name] = { env = map, until_ms = core.hrtime_ms() + IMAGE_CACHE_MS }
    return map
  end

  -- A sandbox up to its agent's hello (its socket directory closed again): what a warm one is until
  -- handed out. Returns the backend and the time left of its lifetime (ms).
  local function start(self, spec)
    local started = core.hrtime_ms()
    local network = spec.network == 'all' and 'all' or type(spec.network) == 'table' and 'allowlist' or 'none'
    if spec.ports and #spec.ports > 0 and network == 'none' then
      errors.raise('INVALID_INPUT', 'ports are served only with network all or an allow-list', nil, 0)
    end
    if network == 'all' and self.my_uid == 0 and not self.firewall then
      errors.raise('INVALID_INPUT', 'network all needs iptables and ip6tables here (the host\'s rules around it)',
        nil, 0)
    end
    if network == 'allowlist' and not self.allowlist then
      errors.raise('INVALID_INPUT', 'a network allow-list needs root and the daemon on this machine', nil, 0)
    end
    for k, v in pairs(spec.labels or {}) do
      if k:find('[=%c]') or v:find('[%c]') then
        errors.raise('INVALID_INPUT',
          'a label name holds "=" or a control character, or a value a control character', nil, 0)
      end
    end
    local memory_mib = math.min(spec.memory_mib or self.memory_mib, self.memory_mib)
    if memory_mib < 6 then errors.raise('INVALID_INPUT', 'memory_mib must be at least 6 for docker', nil, 0) end
    local uv = require('luv')
    local ncpu = (uv.available_parallelism and uv.available_parallelism()) or #(uv.cpu_info() or {})
    local want_cpus = math.min(spec.cpus or self.cpus, self.cpus)
    if ncpu and ncpu > 0 then want_cpus = math.min(want_cpus, ncpu) end
    if want_cpus < 0.01 then errors.raise('INVALID_INPUT', 'cpus must be at least 0.01', nil, 0) end
    local image_name = spec.image or self.image
    local snap = spec.snapshot
    if snap then
      -- the snapshot's image is the one it was taken in, with its files
      image_name = docker_snap.image_of(snap, spec)
    end
    if image_name:find('[%s%z]') or image_name:sub(1, 1) == '-' then
      errors.raise('INVALID_CONFIG', 'image is not a usable image name', nil, 0)
    end

    -- the image first: nothing is created for an image that is not here
    image_env(self, image_name)

    if not prepared then
      dirs.prepare_base(self.run_base, self.my_uid)
      if self.own_fs then dirs.own_fs(self.run_base) end
      dirs.sweep(self.run_base)
      self.agent_in_base = dirs.stage_agent(self.run_base, self.agent)
      prepared = true
    end
    reaper.reap(self.engine, self.host, self.run_base, self.my_uid, false)
    if network == 'all' and not (network_checked and network_checked > core.hrtime_ms()) then
      docker_net.ensure(self.engine, self.firewall)
      network_checked = core.hrtime_ms() + NETWORK_CHECK_MS
    end
    local sb_uid, sb_gid, own_uid = self.uid, self.gid, false
    if not sb_uid then
      sb_uid = uids.pick()
      sb_gid, own_uid = sb_uid, true
    end
    local id = 'mayura-' .. random_hex(6)
    local expires_ms = math.floor(core.now_ms()) + spec.lifetime_ms
    local expires_s = math.floor(expires_ms / 1000) + 1
    local dir = self.run_base .. '/' .. expires_s .. '-' .. id
    local made, merr = uv_fs('fs_mkdir', dir, MODE_0700)
    if not made then
      if own_uid then uids.free(sb_uid) end
      error(errors.sandbox('unavailable', 'cannot make the sandbox\'s socket directory', merr), 0)
    end
    -- the agent (the sandbox's user, "other" here) makes its socket in it, but cannot list it; closed
    -- to everyone but its owner once the host is connected
    uv_fs('fs_chmod', dir, MODE_0703)

    local labels = {}
    for k, v in pairs(spec.labels or {}) do labels[k] = v end
    labels[ID_LABEL] = id
    labels[PROVIDER_LABEL] = 'docker'
    labels[EXPIRES_LABEL] = ('%d'):format(expires_ms)
    local ports = spec.ports or {}
    local function tmpfs(path, mib, mode, exec)
      local bytes = mib * MIB
      return { path = path, options = ('rw,%s,nosuid,nodev,size=%d,nr_inodes=%d,mode=%s,uid=%d,gid=%d'):format(
        exec, bytes, math.max(MIN_INODES, math.floor(bytes / INODE_BYTES)), mode, sb_uid, sb_gid) }
    end
    local c = {
      name = id, image = image_name, user = sb_uid .. ':' .. sb_gid, workdir = self.workdir,
      network = network == 'all' and docker_net.NETWORK or 'none',
      read_only = self.read_only_root,
      tmpfs = {
        tmpfs(self.workdir, self.workspace_mib, '0755', 'exec'),
        tmpfs('/tmp', self.tmp_mib, '1777', 'exec'),
        -- instead of Docker's own 64 MiB /dev/shm, whose inodes have no cap
        tmpfs('/dev/shm', self.tmp_mib, '1777', 'noexec'),
      },
      shm_bytes = self.tmp_mib * MIB,
      -- gVisor's runsc cannot set a score on its sandbox (the host's OOM killer ends the sandbox whole)
      oom_score_adj = not self.gvisor and not oom_refused[self.host] and OOM_SCORE_ADJ or nil,
      runtime = self.runtime,
      mounts = {
        { source = self.agent_in_base, target = AGENT_IN, read_only = true },
        { source = dir, target = RUN_IN, read_only = false },
      },
      memory_bytes = memory_mib * MIB,
      cpus = want_cpus,
      pids = self.pids,
      labels = labels,
      -- an allow-list's ports are forwarded by its proxy (a container without a network publishes none)
      ports = network == 'all' and ports or {},
      entrypoint = { AGENT_IN },
      cmd = { '--listen', RUN_IN .. '/' .. SOCKET, '--lifetime-ms', '0', '--workdir', self.workdir },
    }
    if self.gvisor then
      -- gVisor's kernel holds the sandbox's processes to `pids` (RLIMIT_NPROC of its one uid); the host's
      -- pids cgroup counts gVisor's own threads too, about ten host tasks per process of the sandbox
      c.nproc = self.pids
      c.pids = GVISOR_BASE_TASKS + self.pids * GVISOR_TASKS_PER_PID
      -- gVisor gives a peer from the host the sandbox's own credentials: the check is the sandbox's uid
      -- there, and what keeps others out is the socket's directory (ours, closed to other host users)
      c.cmd[#c.cmd + 1] = '--peer-uid'
      c.cmd[#c.cmd + 1] = tostring(sb_uid)
      -- and a child made with CLONE_PARENT never reaches PID 1's wait: commands are forked by the agent
      c.cmd[#c.cmd + 1] = '--no-spawner'
      c.cmd[#c.cmd + 1] = '1'
    elseif self.peer_uid then
      c.cmd[#c.cmd + 1] = '--peer-uid'
      c.cmd[#c.cmd + 1] = tostring(self.peer_uid)
    end
    -- the pool counts the lifetime from the start of create: so does the container, near enough
    local remaining = math.max(1, spec.lifetime_ms - math.floor(core.hrtime_ms() - started))
    c.cmd[4] = ('%d'):format(remaining)
    -- a start the runtime refuses for a while is tried again within the create's time
    if spec.call_timeout_ms then c.start_by = started + spec.call_timeout_ms end
    local eng = self.engine
    local rok, container = pcall(eng.run_container, eng, c)
    if not rok and c.oom_score_adj and type(container) == 'table' and container.runtime then
      -- a runtime without CAP_SYS_RESOURCE cannot lower a score: once more without it, and say so once
      c.oom_score_adj = nil
      self.enforced.oom_protected = false
      rok, container = pcall(eng.run_container, eng, c)
      if rok and not oom_refused[self.host] then
        oom_refused[self.host] = true
        core.report_once('the Docker runtime refuses a negative OOM score here (it lacks CAP_SYS_RESOURCE); ' ..
          'sandbox agents run without that protection')
      end
    end
    if not rok then
      remove_dir(dir)
      if own_uid then uids.free(sb_uid) end
      if network == 'all' then network_checked = nil end
      error(container, 0)
    end

    local backend = setmetatable({
      id = id, container = container, engine = eng, dir = dir, network = network, provider = self,
      uid = sb_uid, gid = sb_gid, own_uid = own_uid, oom_score_adj = c.oom_score_adj, expires_ms = expires_ms,
      ports = {}, closed = false, released = false,
    }, Backend)
    local sok, serr = pcall(function()
      if network == 'allowlist' then
        docker_net.start_proxy(backend, eng, container, spec, self.proxy_resolve)
      elseif #ports > 0 then
        local st = eng:inspect(container)
        if not st then error(errors.sandbox('unavailable', 'the sandbox did not start'), 0) end
        for _, port in ipairs(ports) do
          local b = type(st.ports) == 'table' and st.ports[port .. '/tcp']
          local hp = type(b) == 'table' and type(b[1]) == 'table' and tonumber(b[1].HostPort)
          if not hp then error(errors.sandbox('failed', 'docker did not publish port ' .. port), 0) end
          backend.ports[port] = math.floor(hp)
        end
      end
      backend.ch = connect_agent(eng, container, dir .. '/' .. SOCKET, function() backend.closed = true end)
      backend.oom_file = cgroup_oom_file(container)
      agent_backend.hello(backend)
      -- no more files from the sandbox's side in this host directory (the agent, answering, has
      -- unlinked its socket: it serves this connection only; nothing else ran in the sandbox yet)
      uv_fs('fs_chmod', dir, MODE_0700)
    end)
    if snap then
      -- held until this sandbox is gone (its release lets the image go)
      docker_snap.hold(backend, snap)
    end
    if not sok then agent_backend.start_failed(backend, serr) end
    backend.image_name = image_name
    backend.base_image = snap and snap.base_image or image_name
    backend:arm(remaining + LIFETIME_GRACE_MS)
    return backend
  end

  -- What a started sandbox gets before it is handed out: the image's env and the asked one through
  -- the agent's setup, the desktop when asked for.
  local function finish(self, backend, spec, warm)
    local env = {}
    for k, v in pairs(image_env(self, backend.image_name)) do env[k] = v end
    for k, v in pairs(spec.env or {}) do env[k] = v end
    if type(spec.network) == 'table' then   -- an allow-list: commands find the proxy
      for k, v in pairs(egress.env()) do env[k] = v end
    end
    agent_backend.setup(backend, desktop.env(self.desktop, spec, env), self.workdir, warm and spec.lifetime_ms or nil)
    if spec.desktop then desktop.attach(backend, self.desktop) end
  end

  function p.create(self, spec)
    local backend = start(self, spec)
    local fok, err = pcall(function()
      finish(self, backend, spec)
      local snap = spec.snapshot
      if snap then
        -- the snapshot's files, from the image's layer into the sandbox's own places
        docker_snap.unpack(backend, snap, spec)
      end
    end)
    if not fok then agent_backend.start_failed(backend, err) end
    return backend
  end

  -- warm sandboxes: the provider's own shape with the pool's labels (a container's labels cannot
  -- change once it is made: a create adding labels of its own gets a cold one); the host removes
  -- one at the lifetime asked for when it is handed out, not the warm one's
  agent_backend.add_own_shape_warm(p, start, {
    same_labels = true,
    hand_out = function(self, backend, spec) finish(self, backend, spec, true) end,
    rearm_ms = function(spec) return spec.lifetime_ms + LIFETIME_GRACE_MS end,
  })
  return p
end

-- }======================================================

M.sandboxes = M.docker_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
