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
-- SIGKILL left. Containers are created with auto-remove too. Release returns
-- once the container is gone.
--
-- Snapshots are 'native': the sandbox's files (its tmpfs, which `docker commit` misses) archived
-- in it as its user, then put into an image the daemon commits from the sandbox's image
-- (`mayura-snapshot:<hex>`, never pushed, labelled with this host process's mark); a sandbox made
-- from one runs that image and unpacks the archive from its layer before it is handed out. The
-- image goes when the snapshot is released and no sandbox of it runs; a provider made sweeps
-- those of a host process that is gone.
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
local check = require('mayura._check')
local agent_backend = require('mayura.sandbox._agent_backend')
local warm_set = require('mayura.sandbox._warm')
local desktop = require('mayura.sandbox._desktop')
local egress = require('mayura.sandbox._egress')
local fw = require('mayura.sandbox._firewall')
local engines = require('mayura.sandbox._docker_engine')
local dirs = require('mayura.sandbox._docker_dirs')
local uids = require('mayura.sandbox._docker_uid')
local docker_net = require('mayura.sandbox._docker_net')
local host_util = require('mayura.sandbox._host')
local snapshots = require('mayura.sandbox._snapshot')
local tar = require('mayura.sandbox._tar')

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
local LIFETIME_GRACE_MS = 2000             -- the host removes a container this long after its lifetime
local REAP_EVERY_MS = 30000                -- creates look for expired containers at most this often
local OOM_SCORE_ADJ = -500                 -- the agent's (PID 1's); its commands reset theirs to 0
local INODE_BYTES = 8192                   -- a tmpfs gets one inode per this many bytes of its size
local MIN_INODES = 1024
local GVISOR_BASE_TASKS = 128              -- host tasks of an idle gVisor sandbox (about 40), with room
local GVISOR_TASKS_PER_PID = 12            -- host tasks per process in a gVisor sandbox (9 to 11 measured)
local ID_LABEL, PROVIDER_LABEL, EXPIRES_LABEL = engines.ID_LABEL, engines.PROVIDER_LABEL, engines.EXPIRES_LABEL
local exists, read_plain = host_util.exists, host_util.read_plain
local absolute, find_in_path, find_agent, random_hex, my_uid =
  host_util.absolute, host_util.find_in_path, host_util.find_agent, host_util.random_hex, host_util.uid
local uv_fs, remove_dir = dirs.uv_fs, dirs.remove_dir

local function plain_path(s)
  return type(s) == 'string' and not s:find('[%z\n\r]')
end

-- {======================================================
-- The reaper of expired containers, and what is shared between providers of this process
-- =======================================================

local reaped_at = {}        -- daemon host -> when a reap last started (hrtime ms)
local oom_refused = {}      -- daemon host -> true once its runtime refused a negative OOM score

-- Removes our containers whose lifetime (label mayura.expires) is over, and their socket directories
-- under `base`: what a host killed with SIGKILL, or an agent that never ended its container, left.
-- Runs as a task of its own; failures are left to the next reap.
local function reap(engine, host, base, owner, force)
  local now = core.hrtime_ms()
  if not force and reaped_at[host] and now - reaped_at[host] < REAP_EVERY_MS then return nil end
  reaped_at[host] = now
  return task.spawn(function()
    pcall(function()
      local now_ms = core.now_ms()
      local gone = {}
      for _, c in ipairs(engine:list_ours()) do
        if c.expires_ms and c.expires_ms + LIFETIME_GRACE_MS < now_ms and pcall(engine.remove, engine, c.id)
          and type(c.sandbox) == 'string' then
          gone[c.sandbox] = true
        end
      end
      -- only in a base directory that is ours and that no other user can swap
      if next(gone) and pcall(dirs.prepare_base, base, owner) then dirs.remove_dirs_of(base, gone) end
    end)
    -- the snapshots' images of host processes that are gone (this machine's: the daemon is local)
    if force then
      pcall(function()
        for _, im in ipairs(engine:list_snapshot_images()) do
          -- a mark of another pid namespace names a process this host cannot see
          if (im.pidns == nil or im.pidns == host_util.pid_namespace()) and not host_util.mark_alive(im.owner) then
            pcall(engine.remove_image, engine, im.ref)
          end
        end
      end)
    end
  end)
end

-- }======================================================

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
  if self.released then
    -- a release under way (the host's timer's, say): return once it is done too
    if self.waiters then task.await(function(done) table.insert(self.waiters, done) end) end
    return
  end
  self.released = true
  self.waiters = {}
  if self.timer then
    if not self.timer:is_closing() then self.timer:close() end
    self.timer = nil
  end
  -- killing PID 1 ends every process of the container; its auto-remove is raced safely by rm -f,
  -- and remove returns once the container is gone. The channel closes after: its end would end
  -- the agent, and so start the auto-remove first
  if self.proxy then self.proxy:close() end
  local ok, err = pcall(self.engine.remove, self.engine, self.container)
  if not self.closed then
    self.closed = true
    if self.ch then pcall(self.ch.close, self.ch) end
  end
  pcall(remove_dir, self.dir)
  if self.own_uid then uids.free(self.uid) end
  local from = self.from_snapshot
  if from then
    self.from_snapshot = nil
    from.users = from.users - 1
    from:_maybe_remove()
  end
  local waiters = self.waiters
  self.waiters = nil
  for _, done in ipairs(waiters) do done() end
  if not ok then error(err, 0) end
end

-- The host's own end of the lifetime: whatever the agent does (code in the sandbox runs as its uid and
-- may stop it), the container is removed a little after its lifetime. The timer keeps no script running.
function Backend:arm(ms)
  local uv = require('luv')
  local timer = uv.new_timer()
  self.timer = timer
  timer:start(ms, 0, function()
    if not timer:is_closing() then timer:close() end
    self.timer = nil
    if not self.released then task.spawn(function() pcall(self.release, self) end) end
  end)
  timer:unref()
end


-- {======================================================
-- Native snapshots: images of the daemon's own
-- =======================================================

-- Where a snapshot's image holds its files: the prepared archive and the script of its directories'
-- modes and times (mayura.sandbox._snapshot's prepared), root's and read-only, beside the agent's
-- mount point.
local SNAP_DIR = '.mayura-snapshot'

local Snap = {}
Snap.__index = Snap

-- The image goes once the snapshot is released and no sandbox made from it runs (an image in use
-- would only lose its name, and stay).
function Snap:_maybe_remove()
  if self.released and self.users == 0 and not self.removed then
    self.removed = true
    pcall(self.engine.remove_image, self.engine, self.image)
  end
end

function Snap:release()
  if self.released then return end
  self.released = true
  self.archive_text = nil
  self:_maybe_remove()
end

--- The snapshot's archive, for `sandbox:restore` (unpacked the generic way).
function Snap:archive()
  if self.released then error(errors.sandbox('gone', 'the snapshot was released'), 0) end
  return self.archive_text
end

--- A native snapshot: the sandbox's files archived in it (the generic way, mayura.sandbox._snapshot:
-- its working directory and /tmp are tmpfs, which `docker commit` does not see), then put into an
-- image the daemon makes from the sandbox's image (`mayura-snapshot:<hex>`, labelled with this host
-- process's mark, never pushed), which the sandboxes made from it start from, by its id (a tag
-- another user of the daemon moved is never used): each unpacks the archive from its own image's
-- layer, and nothing moves through the host again.
function Backend:snapshot(o)
  if self.released or self.closed then error(errors.sandbox('gone', 'the sandbox has ended'), 0) end
  local p = self.provider
  local archive = snapshots.capture(function(name, ...) return self[name](self, ...) end,
    { paths = snapshots.paths(p, p.workdir), max_bytes = o.max_bytes, timeout_ms = o.timeout_ms, binary = true })
  local prep = snapshots.prepared(archive)
  local files = { { name = SNAP_DIR .. '/archive.tar', data = prep.tar, mode = tonumber('444', 8) } }
  if prep.script ~= '' then
    files[2] = { name = SNAP_DIR .. '/fix.sh', data = prep.script, mode = tonumber('444', 8) }
  end
  local tag = random_hex(8)
  local ref = self.engine:snapshot_image(self.base_image, tar.tar(files, 0), tag,
    { [engines.SNAPSHOT_LABEL] = host_util.process_mark(), [engines.SNAPSHOT_NS_LABEL] = host_util.pid_namespace() },
    math.floor(core.now_ms()) + 600000)
  return setmetatable({ size_bytes = #archive, image = ref, base_image = self.base_image, engine = self.engine,
    script = prep.script ~= '',
    archive_text = archive, users = 0, released = false }, Snap)
end

-- }======================================================

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

local option_keys = {
  image = true, engine = true, docker = true, host = true, user = true, workdir = true, workspace_mib = true,
  tmp_mib = true, cpus = true, memory_mib = true, pids = true, read_only_root = true, max_lifetime_ms = true,
  agent = true, run_dir = true, desktop = true, warm = true, proxy_resolve = true, runtime = true,
}

-- Checks `runtime` (the name of a runtime the daemon lists) and sets it on the provider `p`; raises
-- INVALID_CONFIG for one the daemon does not have. Under gVisor (runsc) sandboxes get network 'none'
-- alone: the runtime is registered with gVisor's own network stack off (scripts/docker-setup.sh).
-- Only checking (a policy's check: nothing is run), the name alone is checked.
local function check_runtime(p, runtime, checking)
  if type(runtime) ~= 'string' or #runtime > 64 or not runtime:match('^%w[%w._-]*$') then
    errors.raise('INVALID_CONFIG', 'runtime must be the name of one of the Docker daemon\'s runtimes', nil, 0)
  end
  if checking then
    p.runtime, p.gvisor = runtime, runtime == 'runsc'
    if p.gvisor then p.features.network = { 'none' } end
    return
  end
  local known = p.engine:runtimes()
  local info = known[runtime]
  if type(info) ~= 'table' then
    local names = {}
    for name in pairs(known) do
      if type(name) == 'string' and name:match('^%w[%w._-]*$') then names[#names + 1] = name end
    end
    table.sort(names)
    errors.raise('INVALID_CONFIG', 'the Docker daemon has no runtime named ' .. runtime .. ' (it has: ' ..
      table.concat(names, ', ') .. ')', nil, 0)
  end
  p.runtime = runtime
  local path = type(info.path) == 'string' and info.path or ''
  p.gvisor = runtime == 'runsc' or path:match('runsc$') ~= nil
  if p.gvisor then p.features.network = { 'none' } end
end

-- The local daemon's socket path from a host string; raises INVALID_CONFIG for anything else.

local RESERVED_DIRS = { ['/'] = true, ['/tmp'] = true, ['/proc'] = true, ['/sys'] = true, ['/dev'] = true,
  ['/etc'] = true, ['/.mayura'] = true }

local function check_workdir(w)
  if type(w) ~= 'string' or not w:match('^/[%w%._%-/]*$') or #w > 512 or w:find('//', 1, true)
    or w:find('/%.%.?/') or w:find('/%.%.?$') or (w ~= '/' and w:sub(-1) == '/') then
    errors.raise('INVALID_CONFIG', 'workdir must be an absolute path of letters, digits, . _ - and /', nil, 0)
  end
  if RESERVED_DIRS[w] or w:sub(1, 8) == '/.mayura' or w:sub(1, 5) == '/tmp/' or w:sub(1, 6) == '/proc/'
    or w:sub(1, 5) == '/sys/' or w:sub(1, 5) == '/dev/' then
    errors.raise('INVALID_CONFIG', 'workdir cannot be ' .. w, nil, 0)
  end
  return w
end

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
  local C = 'INVALID_CONFIG'
  local checking = type(how) == 'table' and how.check == true
  if type(options) ~= 'table' then errors.raise(C, 'docker_sandboxes needs options with an image', nil, 2) end
  check.keys(options, option_keys, 'docker_sandboxes options', C, 3)
  local image = options.image
  if type(image) ~= 'string' or image == '' or #image > 1024 or image:find('[%s%z]') or image:sub(1, 1) == '-' then
    errors.raise(C, 'image is required: the name of an image on this machine', nil, 2)
  end
  local engine = options.engine or 'cli'
  if engine ~= 'cli' and engine ~= 'api' then errors.raise(C, "engine must be 'cli' or 'api'", nil, 2) end
  local ok, socket = pcall(engines.socket_of, options.host or engines.default_host())
  if not ok then error(socket, 2) end
  local user, uid, gid = options.user, nil, nil
  if user ~= nil then
    if type(user) == 'string' then uid, gid = user:match('^(%d+):(%d+)$') end
    if not uid or #uid > 10 or #gid > 10 then errors.raise(C, "user must be a numeric 'uid:gid'", nil, 2) end
    if tonumber(uid) == 0 then errors.raise(C, 'user must not be root (uid 0)', nil, 2) end
  end
  local wok, workdir = pcall(check_workdir, options.workdir or '/workspace')
  if not wok then error(workdir, 2) end
  local cpus = options.cpus or 1
  if type(cpus) ~= 'number' or cpus ~= cpus or cpus < 0.01 or cpus > 1024 then
    errors.raise(C, 'cpus must be a number from 0.01', nil, 2)
  end
  if options.read_only_root ~= nil and type(options.read_only_root) ~= 'boolean' then
    errors.raise(C, 'read_only_root must be a boolean', nil, 2)
  end
  local settings = desktop.settings(options.desktop, nil, 2)
  local p = {
    id = 'docker',
    features = { stdin = true, ports = true, desktop = settings ~= nil, network = { 'none', 'all' },
      snapshots = 'native' },
    proxy_resolve = egress.check_resolve(options.proxy_resolve, 2),
    desktop = settings,
    workdir = workdir,
    image = image,
    engine_name = engine,
    host = 'unix://' .. socket,
    user = uid and (uid .. ':' .. gid) or nil,   -- nil: a uid and gid of its own per sandbox
    uid = tonumber(uid),
    gid = tonumber(gid),
    cpus = cpus,
    workspace_mib = check.int(options.workspace_mib, 'workspace_mib', 1, 1048576, C, 3, 1024),
    tmp_mib = check.int(options.tmp_mib, 'tmp_mib', 1, 1048576, C, 3, 256),
    memory_mib = check.int(options.memory_mib, 'memory_mib', 6, 16 * 1048576, C, 3, 1024),
    pids = check.int(options.pids, 'pids', 8, 4194304, C, 3, 256),
    read_only_root = options.read_only_root ~= false,
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, 366 * 86400000, C, 3, 86400000),
    warm = check.int(options.warm, 'warm', 0, 10000, C, 3, 0),
  }
  if engine == 'cli' then
    if options.docker ~= nil and (type(options.docker) ~= 'string' or options.docker == '') then
      errors.raise(C, 'docker must be the path of the docker CLI', nil, 2)
    end
    local cli = find_in_path(options.docker or 'docker')
    if not cli then errors.raise(C, 'the docker CLI is not installed (or not on the PATH)', nil, 2) end
    p.engine = engines.new('cli', cli, p.host)
  else
    p.engine = engines.new('api', nil, nil, socket)
  end
  if options.runtime ~= nil then
    local rok, rerr = pcall(check_runtime, p, options.runtime, checking)
    if not rok then error(rerr, 2) end
  end
  p.agent = options.agent and absolute(options.agent) or find_agent()
  if not p.agent or not exists(p.agent) then errors.raise(C, 'the sandbox agent is not built (make)', nil, 2) end
  if not plain_path(p.agent) then errors.raise(C, 'the agent path is not usable', nil, 2) end
  local me = my_uid()
  -- an agent that knows --peer-uid serves its socket to this process's uid only (any uid can connect);
  -- an older one makes it 0600 for the sandbox's user, which only root or that same uid can open
  p.peer_uid = uids.agent_takes_peer_uid(p.agent) and me or nil
  if me ~= 0 and me ~= p.uid and not p.peer_uid then
    errors.raise(C, 'run as root, or with user set to this process\'s own uid (' .. tostring(me) .. '): ' ..
      'this sandbox agent cannot serve another uid (rebuild it with make)', nil, 2)
  end
  if p.gvisor and not (read_plain(p.agent) or ''):find('--no-spawner', 1, true) then
    errors.raise(C, 'this sandbox agent cannot run under gVisor (rebuild it with make)', nil, 2)
  end
  p.my_uid = me
  -- an allow-list's proxy listens in the container's namespace, which takes root on the daemon's machine
  -- (under gVisor, commands reach no network of the host's: its own stack has a loopback alone)
  p.allowlist = me == 0 and not p.gvisor
  if p.allowlist then p.features.network[#p.features.network + 1] = 'allowlist' end
  -- the host's rules around the bridge of 'all' take root; as root without the programs there is no
  -- 'all'; as another user (the docker group) 'all' is the bridge alone: enforced.network is false
  p.firewall = me == 0 and fw.docker_tools() or nil
  if me == 0 and not p.firewall then table.remove(p.features.network, 2) end
  -- under gVisor (network 'none' alone) its tmpfs has no inode cap and its sandbox takes no OOM score
  -- (a runtime that refuses one clears oom_protected at the first create); `kernel` is the kernel
  -- that the sandbox's system calls meet
  p.enforced = {
    memory = true, pids = true, cpus = true, workspace_mib = true, tmp_mib = true, lifetime = true,
    network = p.gvisor or p.firewall ~= nil, inodes = not p.gvisor,
    oom_protected = not p.gvisor and not oom_refused[p.host], kernel = p.gvisor and 'gvisor' or 'host',
  }
  p.run_base = options.run_dir and absolute(options.run_dir) or dirs.run_base(me)
  p.own_fs = me == 0 and not options.run_dir
  if not plain_path(p.run_base) or #p.run_base > 60 then
    errors.raise(C, 'run_dir must be a path of at most 60 bytes', nil, 2)
  end
  if not checking then reap(p.engine, p.host, p.run_base, me, true) end
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
      if getmetatable(snap) ~= Snap or snap.released then
        errors.raise('INVALID_INPUT', 'the snapshot is not one of this provider\'s', nil, 0)
      end
      if spec.image ~= nil and spec.image ~= snap.base_image then
        errors.raise('INVALID_INPUT', 'a sandbox made from a snapshot has the image the snapshot was taken in', nil, 0)
      end
      image_name = snap.image
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
    reap(self.engine, self.host, self.run_base, self.my_uid, false)
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
      snap.users = snap.users + 1
      backend.from_snapshot = snap
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
        local dir = '/' .. SNAP_DIR .. '/'
        local uok, uerr = pcall(snapshots.unpack_file, function(name, ...) return backend[name](backend, ...) end,
          dir .. 'archive.tar', snap.script and (dir .. 'fix.sh') or nil,
          { timeout_ms = spec.call_timeout_ms or 300000 })
        if not uok then
          if errors.is(uerr, 'SANDBOX_ERROR') and (uerr.reason == 'gone' or uerr.reason == 'unavailable') then
            uerr = errors.sandbox('failed', 'the new sandbox ended while the snapshot was unpacked in it (do its '
              .. 'files fit its memory?)')
          end
          error(uerr, 0)
        end
      end
    end)
    if not fok then agent_backend.start_failed(backend, err) end
    return backend
  end

  -- warm sandboxes: the provider's own shape (network 'none', its image and limits, no ports, no
  -- desktop) with the pool's labels (a container's labels cannot change once it is made: a create
  -- adding labels of its own gets a cold one)
  agent_backend.add_warm(p, p.warm, {
    make = function(self, lifetime_ms, labels)
      return start(self, { lifetime_ms = lifetime_ms, network = 'none', labels = labels })
    end,
    matches = function(self, spec, labels)
      return spec.network == 'none' and not (spec.ports and #spec.ports > 0) and not spec.desktop
        and (spec.image == nil or spec.image == self.image)
        and (spec.cpus == nil or spec.cpus >= self.cpus)
        and (spec.memory_mib == nil or spec.memory_mib >= self.memory_mib)
        and warm_set.same_labels(spec.labels, labels)
    end,
    hand_out = function(self, backend, spec)
      finish(self, backend, spec, true)
      -- the host removes it at the lifetime asked for now, not the warm one's
      if backend.timer then
        if not backend.timer:is_closing() then backend.timer:close() end
        backend.timer = nil
      end
      backend:arm(spec.lifetime_ms + LIFETIME_GRACE_MS)
    end,
  })
  return p
end

-- }======================================================

M.sandboxes = M.docker_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
