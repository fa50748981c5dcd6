--- mayura.sandbox.docker: sandboxes as Docker containers on this machine.
--
-- `docker_sandboxes(options)` is a provider for `create_sandboxes`. Each
-- sandbox is one locked-down container:
--
--   * no network (`--network none`) unless 'all' was allowed and asked for;
--     then the bridge network `mayura-isolated` (made on demand, labelled
--     ours, with inter-container traffic off: enable_icc=false), with the
--     sandbox's `ports` published on 127.0.0.1 only (`url(port)` gives
--     http://127.0.0.1:<host port>); as root the provider loads the host's
--     rules around that bridge (mayura.sandbox._firewall, iptables: chains
--     MAYURA-ALL-IN from INPUT and MAYURA-ALL-FWD from DOCKER-USER) so 'all'
--     reaches the internet and nothing of the host (no address of it, those
--     it gains later too), no other container, no loopback, link-local
--     (cloud metadata), multicast or IANA special-purpose range, and no
--     IPv6; Docker's embedded DNS (127.0.0.11) relays to the host's
--     resolvers, which take port 53 alone; run as another user (the docker
--     group) no rule is loaded: the bridge alone, `enforced.network` false.
--     One shared network rather than one per sandbox: a network costs about
--     0.3 s to make and remove, and the daemon's address pools hold ~30 of
--     them; a bridge takes about 1,000 containers;
--   * with a network allow-list (`{ allow = { ... } }`, offered when run as
--     root: `features.network` lists 'allowlist'), `--network none` too, and
--     an egress proxy of its own (mayura.sandbox._egress) listening on
--     127.0.0.1:3128 inside the container's namespace (found from its PID 1
--     before the agent gets its setup), with HTTP_PROXY / HTTPS_PROXY set for
--     commands: the listed names on ports 80 and 443 are all it reaches; its
--     refusals are network events (`sandbox:events()`, the pool's
--     `on_event`); `ports` are forwarded by the proxy from 127.0.0.1;
--   * every capability dropped, no-new-privileges, the image's root
--     read-only, memory with no swap (memory-swap = memory), CPUs and a
--     process limit; logs off;
--   * by default a uid and gid of its own (from 1300000 up, one that no host
--     account, group or /etc/subuid / subgid range has), so nothing on the
--     host shares its uid's signals, files or per-uid kernel limits; `user`
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
-- `engine = 'cli'` (the default) runs the docker CLI for the container's life
-- (image inspect, run, inspect, rm, ps, network inspect/create); `engine =
-- 'api'` speaks the Engine API over its unix socket through libcurl
-- (images/{name}/json, containers/create, start, json, wait, DELETE,
-- containers/json, networks). Only local daemons: a tcp:// or ssh:// host is
-- refused, because the agent and its socket directory are bind-mounted from
-- this machine.
--
-- The per-sandbox host directory lives in a base directory of ours (0700;
-- /run/mayura/docker as root, else under XDG_RUNTIME_DIR or /tmp, refused
-- when another user controls a directory above it). As root the default base
-- is a tmpfs of its own (mounted once, under a lock): a container's mount
-- table shows a bind by its path inside the file system it comes from, so a
-- sandbox sees '/agent-<hash>' and '/<expires>-<id>' there, never a path of
-- the host (with another user, or a `run_dir`, it sees the path inside the
-- file system that holds the base: XDG_RUNTIME_DIR is a tmpfs on most
-- hosts). Docker's own storage still shows under runc (the root's overlay
-- options and the binds of /etc/hosts, /etc/hostname and /etc/resolv.conf
-- name /var/lib/docker); under gVisor the mount table is gVisor's own. While the agent starts
-- it is 0703: the container's user may make its socket in it but not list
-- it; once the host has connected and said hello it is 0700, so code in the
-- sandbox cannot store files on the host through it. The agent serves that
-- one connection (an agent that knows `--peer-uid` is told this process's
-- uid and serves its 0666 socket to that uid only, so a user in the docker
-- group, not root, gets sandboxes with uids of their own too; with an older
-- agent such a user must set `user` to its own uid) and unlinks its socket,
-- so code in the sandbox cannot reach it. The directory is removed on
-- release, by the reaper, or, once its name's time (when it expires) is a
-- minute past, by the next create.
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
local process = require('mayura.process')
local http = require('mayura.http')
local agent_backend = require('mayura.sandbox._agent_backend')
local desktop = require('mayura.sandbox._desktop')
local egress = require('mayura.sandbox._egress')
local fw = require('mayura.sandbox._firewall')

local M = {}

local MIB = 1048576
local MODE_0700 = tonumber('700', 8)
local MODE_0703 = tonumber('703', 8)
local AGENT_IN = '/.mayura/agent'          -- where the agent is mounted in the container
local RUN_IN = '/.mayura/run'              -- where the socket directory is mounted
local SOCKET = 'agent.sock'
local ID_LABEL = 'mayura.sandbox'
local PROVIDER_LABEL = 'mayura.provider'
local IMAGE_CACHE_MS = 30000               -- how long an image found stays known
local ENGINE_TIMEOUT_MS = 60000            -- one docker CLI call or Engine API request
local START_WAIT_MS = 30000                -- from a started container to its agent's socket
local SWEEP_GRACE_S = 60                   -- a directory is stale this long after its sandbox's end
local EXPIRES_LABEL = 'mayura.expires'     -- the end of the sandbox's lifetime, ms since the epoch
local NETWORK = 'mayura-isolated'          -- the bridge of 'all' sandboxes: no traffic between its containers
local NETWORK_LABEL = 'mayura.network'
local NETWORK_CHECK_MS = 30000             -- how long a checked network stays known
local LIFETIME_GRACE_MS = 2000             -- the host removes a container this long after its lifetime
local REAP_EVERY_MS = 30000                -- creates look for expired containers at most this often
local UID_BASE, UID_SPAN = 1300000, 1048576  -- per-sandbox uids and gids: [base, base + span)
local OOM_SCORE_ADJ = -500                 -- the agent's (PID 1's); its commands reset theirs to 0
local INODE_BYTES = 8192                   -- a tmpfs gets one inode per this many bytes of its size
local MIN_INODES = 1024
local GVISOR_BASE_TASKS = 128              -- host tasks of an idle gVisor sandbox (about 40), with room
local GVISOR_TASKS_PER_PID = 12            -- host tasks per process in a gVisor sandbox (9 to 11 measured)

-- {======================================================
-- Small helpers
-- =======================================================

local host_util = require('mayura.sandbox._host')
local await, exists, read_plain = host_util.await, host_util.exists, host_util.read_plain
local absolute, find_in_path, find_agent, random_hex, my_uid =
  host_util.absolute, host_util.find_in_path, host_util.find_agent, host_util.random_hex, host_util.uid

local function uv_fs(name, ...)
  local uv = require('luv')
  local args, n = { ... }, select('#', ...)
  return task.await(function(done)
    args[n + 1] = function(err, res) done(err == nil and (res == nil and true or res) or nil, err) end
    local ok, e = pcall(uv[name], check.unpack(args, 1, n + 1))
    if not ok or e == nil then done(nil, ok and 'failed' or e) end
  end)
end

-- Removes a per-sandbox directory and what is in it (never following links).
local function remove_dir(dir)
  uv_fs('fs_chmod', dir, MODE_0700)   -- a closed (0555) directory must be opened to empty it
  await(function(cb) core.fs.remove(dir, { recursive = true }, cb) end)
end

local function plain_path(s)
  return type(s) == 'string' and not s:find('[%z\n\r]')
end

-- A field of docker's --mount value (a CSV record): quoted when it holds a comma or a quote.
local function csv_field(s)
  if s:find('[,"]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

local function url_escape(s)
  return (s:gsub('[^%w%-%._~/:@]', function(c) return ('%%%02X'):format(c:byte()) end))
end

local function cpus_text(c)
  local s = ('%.3f'):format(c):gsub('0+$', ''):gsub('%.$', '')
  return s
end

-- }======================================================

-- {======================================================
-- Mapping docker failures (their text never reaches the caller)
-- =======================================================

-- A reason for a failed docker CLI call, from its stderr (read here, never passed on).
local function cli_reason(stderr)
  local s = (stderr or ''):lower()
  -- the runtime (runc) refused the container: its own words may say "permission denied"
  if s:find('oci runtime', 1, true) then return 'runtime' end
  if s:find('no such network', 1, true) or s:find('network %S+ not found') then return 'not_found' end
  if s:find('no such image', 1, true) or s:find('unable to find image', 1, true) then return 'no_image' end
  if s:find('no such container', 1, true) then return 'not_found' end
  if s:find('cannot connect to the docker daemon', 1, true) or s:find('is the docker daemon running', 1, true)
    or s:find('connection refused', 1, true)
    or (s:find('no such file or directory', 1, true) and s:find('docker.sock', 1, true)) then
    return 'unavailable'
  end
  if s:find('permission denied', 1, true) then return 'authentication' end
  if s:find('already in use', 1, true) or s:find('already exists', 1, true) or s:find('in progress', 1, true)
    or s:find('conflict', 1, true) then
    return 'conflict'
  end
  if s:find('timeout', 1, true) or s:find('deadline exceeded', 1, true) then return 'timeout' end
  return 'failed'
end

local function docker_error(reason, what)
  if reason == 'runtime' then
    -- marked, so that a create can try once more without what the runtime may refuse
    local e = errors.sandbox('failed', 'docker could not ' .. what .. ' (the container runtime refused it)')
    e.runtime = true
    return e
  end
  return errors.sandbox(reason, 'docker could not ' .. what .. ' (' .. reason .. ')')
end

-- A start refused for a passing reason is tried again: START_TRIES in all, a longer pause each time,
-- while the create's time allows (`c.start_by`, on the hrtime clock).
local START_TRIES, START_PAUSE_MS = 4, 250

-- runc's "can't get final child's PID from pipe" is how a refused OOM score ends here, and, without
-- a score to refuse, how a runtime under load loses its child: a passing failure then.
local function runc_lost_child(c, low_reason)
  return not c.oom_score_adj and low_reason:find("final child's pid", 1, true) ~= nil
end

local function may_retry(c, tries)
  return tries < START_TRIES and (not c.start_by or core.hrtime_ms() + START_PAUSE_MS * tries < c.start_by)
end

local function no_image(image)
  return errors.new('INVALID_CONFIG', 'the image ' .. image .. ' is not on this machine (images are never pulled)')
end

-- }======================================================

-- {======================================================
-- Engine: the docker CLI
-- =======================================================

local Cli = {}
Cli.__index = Cli

-- Runs `docker -H <host> args...`; returns the result, or raises a mapped error about `what`.
function Cli:run(args, what, allow)
  local argv = { self.docker, '-H', self.host }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local ok, res = pcall(process.run, argv, { timeout_ms = ENGINE_TIMEOUT_MS, max_output_bytes = 1048576 })
  if not ok then
    if errors.is(res, 'CANCELLED') then error(res, 0) end
    error(docker_error('unavailable', what), 0)
  end
  if res.timed_out then error(docker_error('timeout', what), 0) end
  if res.exit_code ~= 0 then
    local reason = cli_reason(res.stderr)
    if allow and allow[reason] then return nil, reason end
    local e = docker_error(reason == 'no_image' and 'not_found' or reason, what)
    -- a runtime's refusal keeps its words as the cause (for logs, and for the create to tell a passing one)
    if e.runtime then e.cause = res.stderr end
    error(e, 0)
  end
  return res
end

--- The image's environment ("NAME=value" list), or nil when the image is not here.
function Cli:image_env(image)
  local res = self:run({ 'image', 'inspect', '--format', '{{json .Config.Env}}', '--', image }, 'inspect the image',
    { no_image = true, not_found = true })
  if not res then return nil end
  local ok, env = pcall(core.json.decode, res.stdout)
  if not ok or type(env) ~= 'table' then env = {} end
  return env
end

-- The argv of `docker run` for a container description.
local function run_args(c)
  local a = { 'run', '--detach', '--pull', 'never', '--rm', '--name', c.name, '--hostname', 'sandbox',
    '--user', c.user, '--workdir', c.workdir, '--network', c.network,
    '--cap-drop', 'ALL', '--security-opt', 'no-new-privileges', '--init=false',
    '--memory', tostring(c.memory_bytes), '--memory-swap', tostring(c.memory_bytes),
    '--cpus', cpus_text(c.cpus), '--pids-limit', tostring(c.pids), '--log-driver', 'none',
  }
  local function add(...) for _, x in ipairs({ ... }) do a[#a + 1] = x end end
  if c.read_only then add('--read-only') end
  if c.runtime then add('--runtime', c.runtime) end
  if c.nproc then add('--ulimit', ('nproc=%d:%d'):format(c.nproc, c.nproc)) end
  if c.oom_score_adj then add('--oom-score-adj', tostring(c.oom_score_adj)) end
  add('--shm-size', tostring(c.shm_bytes))
  for _, t in ipairs(c.tmpfs) do add('--tmpfs', t.path .. ':' .. t.options) end
  for _, m in ipairs(c.mounts) do
    add('--mount', 'type=bind,' .. csv_field('source=' .. m.source) .. ',' .. csv_field('target=' .. m.target) ..
      (m.read_only and ',readonly' or ''))
  end
  local names = {}
  for k in pairs(c.labels) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do add('--label', k .. '=' .. c.labels[k]) end
  for _, port in ipairs(c.ports) do add('--publish', '127.0.0.1::' .. port .. '/tcp') end
  add('--entrypoint', c.entrypoint[1], '--', c.image)
  for _, x in ipairs(c.cmd) do a[#a + 1] = x end
  return a
end

--- Creates and starts the container; returns its id.
function Cli:run_container(c)
  local tries = 0
  while true do
    tries = tries + 1
    local ok, res, reason = pcall(self.run, self, run_args(c), 'start a container', { no_image = true })
    local id = ok and res and res.stdout:match('(%x+)%s*$')
    if id and #id >= 12 then return id end
    -- a half-made container (created, not started) must not stay behind
    pcall(self.remove, self, c.name)
    if not ok then
      -- runc losing its child with no score to refuse is a passing failure: again, a while
      local passing = type(res) == 'table' and res.runtime and runc_lost_child(c, tostring(res.cause or ''):lower())
      if passing and may_retry(c, tries) then
        task.sleep(START_PAUSE_MS * tries)
      else
        error(res, 0)
      end
    elseif reason == 'no_image' then error(no_image(c.image), 0)
    else error(docker_error('failed', 'start a container'), 0) end
  end
end

--- The names of the daemon's runtimes (`docker info`'s Runtimes), as a set.
function Cli:runtimes()
  local res = self:run({ 'info', '--format', '{{json .Runtimes}}' }, 'list its runtimes')
  local ok, t = pcall(core.json.decode, res.stdout)
  return ok and type(t) == 'table' and t or {}
end

--- `{ running = bool, ports = { [container port] = host port } }`, or nil when there is no such container.
function Cli:inspect(id)
  local res = self:run({ 'container', 'inspect', '--format',
    '{"running":{{json .State.Running}},"pid":{{json .State.Pid}},"ports":{{json .NetworkSettings.Ports}}}', '--', id },
    'inspect a container', { not_found = true })
  if not res then return nil end
  local ok, t = pcall(core.json.decode, res.stdout)
  if not ok or type(t) ~= 'table' then error(docker_error('failed', 'inspect a container'), 0) end
  return { running = t.running == true, pid = tonumber(t.pid), ports = t.ports }
end

--- Removes the container (killing it) and returns once it is gone; no such container is fine.
function Cli:remove(id)
  local _, reason = self:run({ 'rm', '--force', '--', id }, 'remove a container', { not_found = true, conflict = true })
  if reason ~= 'conflict' then return end
  -- its auto-remove is under way: wait for it to finish
  local started, delay = core.hrtime_ms(), 10
  while self:inspect(id) do
    if core.hrtime_ms() - started > ENGINE_TIMEOUT_MS then error(docker_error('timeout', 'remove a container'), 0) end
    task.sleep(delay)
    if delay < 200 then delay = delay * 2 end
  end
end

--- Our containers (label mayura.provider=docker), any state: `{ id, sandbox, expires_ms }` each.
function Cli:list_ours()
  local res = self:run({ 'ps', '--all', '--no-trunc', '--filter', 'label=' .. PROVIDER_LABEL .. '=docker',
    '--format', '{{.ID}} {{.Label "' .. EXPIRES_LABEL .. '"}} {{.Label "' .. ID_LABEL .. '"}}' }, 'list containers')
  local out = {}
  for line in res.stdout:gmatch('[^\n]+') do
    local id, expires, sandbox = line:match('^(%x+) (%d*) (%S*)$')
    if id then out[#out + 1] = { id = id, sandbox = sandbox, expires_ms = tonumber(expires) } end
  end
  return out
end

--- The network `name` as `{ id, driver, labels, options }`, or nil when there is none.
function Cli:network(name)
  local res = self:run({ 'network', 'inspect', '--format',
    '{"id":{{json .Id}},"driver":{{json .Driver}},"labels":{{json .Labels}},"options":{{json .Options}}}', '--', name },
    'inspect a network', { not_found = true })
  if not res then return nil end
  local ok, t = pcall(core.json.decode, res.stdout)
  if not ok or type(t) ~= 'table' then error(docker_error('failed', 'inspect a network'), 0) end
  return t
end

--- Creates a bridge network; returns false when one of that name already exists.
function Cli:create_network(name, labels, options)
  local a = { 'network', 'create', '--driver', 'bridge' }
  for k, v in pairs(labels) do a[#a + 1] = '--label'; a[#a + 1] = k .. '=' .. v end
  for k, v in pairs(options) do a[#a + 1] = '--opt'; a[#a + 1] = k .. '=' .. v end
  a[#a + 1] = '--'
  a[#a + 1] = name
  local res = self:run(a, 'create a network', { conflict = true })
  return res ~= nil
end

-- }======================================================

-- {======================================================
-- Engine: the Engine API over its unix socket
-- =======================================================

local Api = {}
Api.__index = Api

-- One request; returns status and the decoded body (or nil).
function Api:request(method, path, body, what, timeout_ms)
  local headers = {}
  local text
  if body ~= nil then
    text = core.json.encode(body)
    headers['Content-Type'] = 'application/json'
  end
  local ok, res = pcall(http.request, {
    url = 'http://docker' .. path, method = method, headers = headers, body = text,
    unix_socket = self.socket, timeout_ms = timeout_ms or ENGINE_TIMEOUT_MS, max_body_bytes = 16 * MIB,
  })
  if not ok then
    if errors.is(res, 'CANCELLED') then error(res, 0) end
    if errors.is(res, 'TIMEOUT') then error(docker_error('timeout', what), 0) end
    error(docker_error('unavailable', what), 0)
  end
  local decoded
  if res.body and res.body ~= '' then
    local dok, v = pcall(core.json.decode, res.body)
    if dok then decoded = v end
  end
  return res.status, decoded
end

local function api_failure(status, what)
  local sandbox = require('mayura.sandbox')
  local e = sandbox.sandbox_http_failure(status)
  e.message = 'docker could not ' .. what .. ' (HTTP ' .. tostring(status) .. ')'
  return e
end

function Api:image_env(image)
  local status, body = self:request('GET', '/images/' .. url_escape(image) .. '/json', nil, 'inspect the image')
  if status == 404 then return nil end
  if status ~= 200 then error(api_failure(status, 'inspect the image'), 0) end
  local env = type(body) == 'table' and type(body.Config) == 'table' and body.Config.Env
  return type(env) == 'table' and env or {}
end

local function api_config(c)
  local json = core.json
  local tmpfs = {}
  for _, t in ipairs(c.tmpfs) do tmpfs[t.path] = t.options end
  local mounts = {}
  for i, m in ipairs(c.mounts) do
    mounts[i] = { Type = 'bind', Source = m.source, Target = m.target, ReadOnly = m.read_only == true }
  end
  local host = {
    NetworkMode = c.network,
    CapDrop = { 'ALL' },
    SecurityOpt = { 'no-new-privileges' },
    ReadonlyRootfs = c.read_only,
    Tmpfs = tmpfs,
    Mounts = mounts,
    Memory = c.memory_bytes,
    MemorySwap = c.memory_bytes,
    NanoCpus = math.floor(c.cpus * 1e9 + 0.5),
    PidsLimit = c.pids,
    Init = false,
    ShmSize = c.shm_bytes,
    OomScoreAdj = c.oom_score_adj,
    Runtime = c.runtime,
    Ulimits = c.nproc and { { Name = 'nproc', Soft = c.nproc, Hard = c.nproc } } or nil,
    AutoRemove = true,
    LogConfig = { Type = 'none', Config = setmetatable({}, json.object_mt) },
  }
  local config = {
    Image = c.image,
    Hostname = 'sandbox',
    User = c.user,
    WorkingDir = c.workdir,
    Entrypoint = c.entrypoint,
    Cmd = c.cmd,
    Labels = c.labels,
    HostConfig = host,
  }
  if #c.ports > 0 then
    local exposed, bindings = {}, {}
    for _, port in ipairs(c.ports) do
      local key = port .. '/tcp'
      exposed[key] = setmetatable({}, json.object_mt)
      bindings[key] = { { HostIp = '127.0.0.1', HostPort = '' } }
    end
    config.ExposedPorts = exposed
    host.PortBindings = bindings
  end
  return config
end

-- The daemon's reason for a refused call: its message on one line, at most 300 characters.
local function daemon_reason(body)
  local m = type(body) == 'table' and type(body.message) == 'string' and body.message or ''
  m = m:gsub('[%c]+', ' ')
  if #m > 300 then m = m:sub(1, 297) .. '...' end
  return m
end

-- Reasons a start fails for a while on a loaded machine (the runtime starved of time or of
-- processes): such a start is tried again. Docker answers them 500, or 400 when the text holds a
-- word it takes for bad configuration.
local TRANSIENT = {
  'resource temporarily unavailable', 'deadline exceeded', 'timed out', 'timeout', 'connection reset',
  'device or resource busy', 'interrupted system call', 'broken pipe', 'cannot allocate memory',
}

local function transient(reason)
  local low = reason:lower()
  for _, w in ipairs(TRANSIENT) do
    if low:find(w, 1, true) then return true end
  end
  return false
end

-- Creates and starts a container; returns its id. A start refused for a passing reason is tried
-- again (a fresh container each time, START_TRIES in all, before `c.start_by` on the hrtime
-- clock when given); one the runtime refused is an error marked `runtime` (the create then tries
-- without what a runtime may refuse); any other refusal keeps the daemon's reason as its cause.
function Api:run_container(c)
  local tries = 0
  while true do
    tries = tries + 1
    local status, body = self:request('POST', '/containers/create?name=' .. url_escape(c.name), api_config(c),
      'create a container')
    if status == 404 then error(no_image(c.image), 0) end
    if status ~= 201 then error(api_failure(status, 'create a container'), 0) end
    local id = type(body) == 'table' and body.Id
    if type(id) ~= 'string' or not id:match('^%x+$') then
      pcall(self.remove, self, c.name)
      error(docker_error('failed', 'create a container'), 0)
    end
    status, body = self:request('POST', '/containers/' .. id .. '/start', nil, 'start a container')
    if status == 204 or status == 304 then return id end
    pcall(self.remove, self, id)
    if status == 404 then error(docker_error('unavailable', 'start a container'), 0) end
    local reason = daemon_reason(body)
    local pause = START_PAUSE_MS * tries
    local low = reason:lower()
    local passing = (status == 400 or status >= 500) and (transient(reason) or runc_lost_child(c, low))
    if passing and may_retry(c, tries) then
      task.sleep(pause)
    else
      if not passing and (status == 400 or status == 500) and c.oom_score_adj
        and (low:find('oci runtime', 1, true) or low:find('oom_score_adj', 1, true)) then
        error(docker_error('runtime', 'start a container'), 0)
      end
      -- the daemon's words go in `cause` (for logs), never in the message
      local e = api_failure(status, 'start a container')
      if reason ~= '' then
        e.message = 'docker could not start a container (HTTP ' .. status .. '; the daemon\'s reason is the '
          .. 'error\'s cause)'
        e.cause = reason
      end
      error(e, 0)
    end
  end
end

function Api:runtimes()
  local status, body = self:request('GET', '/info', nil, 'list its runtimes')
  if status ~= 200 or type(body) ~= 'table' then error(api_failure(status, 'list its runtimes'), 0) end
  return type(body.Runtimes) == 'table' and body.Runtimes or {}
end

function Api:inspect(id)
  local status, body = self:request('GET', '/containers/' .. id .. '/json', nil, 'inspect a container')
  if status == 404 then return nil end
  if status ~= 200 or type(body) ~= 'table' then error(api_failure(status, 'inspect a container'), 0) end
  local state = type(body.State) == 'table' and body.State or {}
  local net = type(body.NetworkSettings) == 'table' and body.NetworkSettings or {}
  return { running = state.Running == true, pid = tonumber(state.Pid), ports = net.Ports }
end

function Api:remove(id)
  local status = self:request('DELETE', '/containers/' .. id .. '?force=true&v=true', nil, 'remove a container')
  if status == 204 or status == 404 then return end
  if status == 409 then
    -- its auto-remove is under way: wait for it to finish
    status = self:request('POST', '/containers/' .. id .. '/wait?condition=removed', nil, 'remove a container')
    if status == 200 or status == 404 then return end
  end
  error(api_failure(status, 'remove a container'), 0)
end

function Api:list_ours()
  local filters = core.json.encode({ label = { PROVIDER_LABEL .. '=docker' } })
  local status, body = self:request('GET', '/containers/json?all=1&filters=' .. url_escape(filters), nil,
    'list containers')
  if status ~= 200 or type(body) ~= 'table' then error(api_failure(status, 'list containers'), 0) end
  local out = {}
  for _, c in ipairs(body) do
    local labels = type(c) == 'table' and type(c.Labels) == 'table' and c.Labels or {}
    if type(c.Id) == 'string' and c.Id:match('^%x+$') then
      out[#out + 1] = { id = c.Id, sandbox = labels[ID_LABEL], expires_ms = tonumber(labels[EXPIRES_LABEL]) }
    end
  end
  return out
end

function Api:network(name)
  local status, body = self:request('GET', '/networks/' .. url_escape(name), nil, 'inspect a network')
  if status == 404 then return nil end
  if status ~= 200 or type(body) ~= 'table' then error(api_failure(status, 'inspect a network'), 0) end
  return { id = body.Id, driver = body.Driver, labels = body.Labels, options = body.Options }
end

function Api:create_network(name, labels, options)
  local status = self:request('POST', '/networks/create', {
    Name = name, Driver = 'bridge', CheckDuplicate = true, Labels = labels, Options = options,
  }, 'create a network')
  if status == 409 then return false end
  if status ~= 201 then error(api_failure(status, 'create a network'), 0) end
  return true
end

-- }======================================================

-- {======================================================
-- The host directories of the agents' sockets
-- =======================================================

local function run_base(uid)
  if uid == 0 then return '/run/mayura/docker' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  if rt and rt:sub(1, 1) == '/' then return rt .. '/mayura/docker' end
  return '/tmp/mayura-' .. tostring(uid) .. '/docker'
end

-- Whether another user could replace `dir` or what is in it: every directory from `dir` up to the
-- root (links resolved) must be root's or ours, and writable by nobody else unless it is sticky
-- and root's (as /tmp is).
local function others_control(dir, uid)
  local real = uv_fs('fs_realpath', dir)
  if type(real) ~= 'string' then return true end
  local path = real
  while true do
    local st = uv_fs('fs_lstat', path == '' and '/' or path)
    if type(st) ~= 'table' or st.type ~= 'directory' or (st.uid ~= 0 and st.uid ~= uid) then return true end
    local others_write = math.floor(st.mode / 16) % 2 == 1 or math.floor(st.mode / 2) % 2 == 1
    local sticky = math.floor(st.mode / 512) % 2 == 1
    if others_write and not (sticky and st.uid == 0) then return true end
    if path == '' or path == '/' then return false end
    path = path:match('^(.*)/[^/]*$')
  end
end

-- Makes the base directory (0700, ours, not a link, in directories no other user controls); raises
-- INVALID_CONFIG when it cannot be trusted.
local function prepare_base(base, uid)
  local ok = await(function(cb) core.fs.mkdir(base, { mode = MODE_0700 }, cb) end)
  local st = uv_fs('fs_lstat', base)
  if not ok or type(st) ~= 'table' or st.type ~= 'directory' or st.uid ~= uid
    or others_control(base:match('^(.*)/[^/]*$'), uid) then
    errors.raise('INVALID_CONFIG', 'the sandbox socket directory ' .. base .. ' cannot be made or is not ours', nil, 0)
  end
  if st.mode % 64 ~= 0 then uv_fs('fs_chmod', base, MODE_0700) end
end

-- As root, the default base directory is a file system of its own (a tmpfs, mounted once under a
-- lock, so two hosts starting at once never stack two): a bind of a directory or file in it shows in
-- a container's mount table as its name inside that file system alone ('/<expires>-<id>',
-- '/agent-<hash>'), never a path of the host. Returns whether the base is one.
local BASE_FS_OPTIONS = 'mode=0700,size=64m,nr_inodes=262144,nosuid,nodev'
local function own_fs(base)
  local function mounted()
    local st, up = uv_fs('fs_lstat', base), uv_fs('fs_lstat', base .. '/..')
    return type(st) == 'table' and type(up) == 'table' and st.dev ~= up.dev
  end
  if mounted() then return true end
  local flock, mount, mountpoint = find_in_path('flock'), find_in_path('mount'), find_in_path('mountpoint')
  if not (flock and mount and mountpoint) then return false end
  pcall(process.run, { flock, '-w', '10', base .. '.lock', mount, '--no-mtab', '-t', 'tmpfs', '-o',
    BASE_FS_OPTIONS, 'mayura', base }, { timeout_ms = 15000 })
  return mounted()
end

-- The agent as a file of the base directory, named by its SHA-256 (made by a rename, so a file of
-- that name is always whole): what the container binds, instead of the agent's path on the host.
local function stage_agent(base, agent)
  local bytes = read_plain(agent)
  if not bytes or bytes == '' then errors.raise('INVALID_CONFIG', 'the sandbox agent cannot be read', nil, 0) end
  local hex = core.sha256(bytes):gsub('.', function(c) return ('%02x'):format(c:byte()) end)
  local path = base .. '/agent-' .. hex:sub(1, 32)
  local st = uv_fs('fs_lstat', path)
  if type(st) == 'table' and st.type == 'file' and st.size == #bytes then return path end
  local tmp = path .. '.' .. random_hex(6)
  local f = io.open(tmp, 'wb')
  local ok = f and f:write(bytes) and true
  if f then ok = f:close() and ok end
  if not ok or not uv_fs('fs_chmod', tmp, tonumber('555', 8)) or not uv_fs('fs_rename', tmp, path) then
    os.remove(tmp)
    error(errors.sandbox('unavailable', 'cannot place the sandbox agent in the socket directory'), 0)
  end
  return path
end

-- Removes the directories of sandboxes whose lifetime is over (left by a host killed before release).
local function sweep(base)
  local entries = await(function(cb) core.fs.list(base, cb) end)
  if type(entries) ~= 'table' then return end
  local now_s = math.floor(core.now_ms() / 1000)
  for _, e in ipairs(entries) do
    local expires = tonumber((e.name or ''):match('^(%d+)%-mayura%-%x+$'))
    if expires and expires + SWEEP_GRACE_S < now_s then remove_dir(base .. '/' .. e.name) end
  end
end

-- Removes the directories of the sandboxes named in `ids` (a set), whatever their time.
local function remove_dirs_of(base, ids)
  local entries = await(function(cb) core.fs.list(base, cb) end)
  if type(entries) ~= 'table' then return end
  for _, e in ipairs(entries) do
    local id = (e.name or ''):match('^%d+%-(mayura%-%x+)$')
    if id and ids[id] then remove_dir(base .. '/' .. e.name) end
  end
end

-- }======================================================

-- {======================================================
-- Host uids for sandboxes, and what is shared between providers of this process
-- =======================================================

local uids_in_use = {}      -- uid -> true, for the sandboxes of this process
local reaped_at = {}        -- daemon host -> when a reap last started (hrtime ms)
local oom_refused = {}      -- daemon host -> true once its runtime refused a negative OOM score

-- The uid ranges of /etc/subuid or /etc/subgid: a user may run processes under those uids.
local function subid_ranges(path)
  local ranges = {}
  for line in (read_plain(path) or ''):gmatch('[^\n]+') do
    local first, count = line:match('^[^:]*:(%d+):(%d+)')
    if first then ranges[#ranges + 1] = { tonumber(first), tonumber(first) + tonumber(count) - 1 } end
  end
  return ranges
end

local function in_ranges(n, ranges)
  for _, r in ipairs(ranges) do
    if n >= r[1] and n <= r[2] then return true end
  end
  return false
end

-- Whether the host's files or name service know `id` as a user or a group.
local function host_knows(id)
  local text = tostring(id)
  for _, file in ipairs({ '/etc/passwd', '/etc/group' }) do
    for line in (read_plain(file) or ''):gmatch('[^\n]+') do
      if line:match('^[^:]*:[^:]*:(%d+):') == text then return true end
    end
  end
  local getent = find_in_path('getent')
  if not getent then return false end
  for _, db in ipairs({ 'passwd', 'group' }) do
    local ok, res = pcall(process.run, { getent, db, text }, { timeout_ms = 10000 })
    -- 2 is "not found"; anything else (found, or no answer) counts as known
    if not ok or res.exit_code ~= 2 then return true end
  end
  return false
end

-- A uid (also the gid) for one sandbox that no host account, group or subordinate range has and no
-- other sandbox of this process uses; raises `unavailable` when none is found.
local function pick_uid()
  local ranges = subid_ranges('/etc/subuid')
  for _, r in ipairs(subid_ranges('/etc/subgid')) do ranges[#ranges + 1] = r end
  for _ = 1, 16 do
    local n = UID_BASE + (tonumber(random_hex(4), 16) or 0) % UID_SPAN
    if not uids_in_use[n] and not in_ranges(n, ranges) and not host_knows(n) then
      uids_in_use[n] = true
      return n
    end
  end
  error(errors.sandbox('unavailable', 'no free uid for the sandbox'), 0)
end

-- Whether the agent binary knows `--peer-uid` (it then serves only the host's uid on its socket). Read
-- at each construction (a millisecond), plainly, so a provider can be made anywhere.
local function agent_takes_peer_uid(agent)
  return (read_plain(agent) or ''):find('--peer-uid', 1, true) ~= nil
end

-- }======================================================

-- {======================================================
-- The network of 'all' sandboxes, and the reaper of expired containers
-- =======================================================

local NETWORK_OPTIONS = {
  ['com.docker.network.bridge.enable_icc'] = 'false',            -- no traffic between its containers
  ['com.docker.network.bridge.host_binding_ipv4'] = '127.0.0.1', -- ports published on loopback by default
}

local function network_is_ours(info)
  local labels = type(info.labels) == 'table' and info.labels or {}
  local options = type(info.options) == 'table' and info.options or {}
  return info.driver == 'bridge' and labels[NETWORK_LABEL] == 'isolated'
    and options['com.docker.network.bridge.enable_icc'] == 'false'
end

-- The name of the host interface of the bridge network `info`: the name it was given, else Docker's.
local function bridge_name(info)
  local options = type(info.options) == 'table' and info.options or {}
  local name = options['com.docker.network.bridge.name']
  if type(name) == 'string' and name ~= '' then return name end
  if type(info.id) ~= 'string' or not info.id:match('^%x+$') or #info.id < 12 then
    error(docker_error('failed', 'inspect a network (no id)'), 0)
  end
  return 'br-' .. info.id:sub(1, 12)
end

-- Makes sure the network of 'all' sandboxes is there, ours and isolating, creating it when missing;
-- and, with `firewall` (the programs, as root), that the host's rules around its bridge are loaded
-- (mayura.sandbox._firewall: nothing of the host, no other container, no special-purpose range).
local function ensure_network(engine, firewall)
  local info = engine:network(NETWORK)
  if not info then
    engine:create_network(NETWORK, { [PROVIDER_LABEL] = 'docker', [NETWORK_LABEL] = 'isolated' }, NETWORK_OPTIONS)
    -- made here, or by someone else at the same moment: either way, look at what is there
    info = engine:network(NETWORK)
    if not info then error(docker_error('failed', 'create a network'), 0) end
  end
  if not network_is_ours(info) then
    error(errors.sandbox('conflict', 'a Docker network named ' .. NETWORK .. ' exists that is not mayura\'s ' ..
      'isolated bridge (remove it)'), 0)
  end
  if firewall then
    local ok, err = pcall(fw.ensure_docker, firewall, bridge_name(info))
    if not ok then error(errors.sandbox('unavailable', tostring(err)), 0) end
  end
end

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
      if next(gone) and pcall(prepare_base, base, owner) then remove_dirs_of(base, gone) end
    end)
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
  if self.own_uid then uids_in_use[self.uid] = nil end
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

--- Starts the egress proxy of an allow-listed container (`--network none`: its loopback alone) in its
-- network namespace, found from its PID 1 on this machine, and the forwards of `spec.ports`.
local function start_proxy(backend, eng, container, spec, resolve)
  local uv = require('luv')
  local function fail(what)
    error(errors.sandbox('unavailable', 'cannot connect the sandbox\'s network: ' .. what), 0)
  end
  local st = eng:inspect(container)
  if not st or not st.running or not st.pid or st.pid <= 1 then fail('the sandbox did not start') end
  local ns_fd = uv.fs_open('/proc/' .. math.floor(st.pid) .. '/ns/net', 'r', 0)
  if not ns_fd then fail('its namespace cannot be opened') end
  -- never the host's own namespace, whatever the daemon said
  local link = uv.fs_readlink('/proc/self/fd/' .. ns_fd)
  if not link or link == uv.fs_readlink('/proc/self/ns/net') then
    uv.fs_close(ns_fd)
    fail('not the sandbox\'s namespace')
  end
  -- still that container's PID 1 (not a pid reused since the inspect)
  local again = eng:inspect(container)
  if not again or again.pid ~= st.pid then
    uv.fs_close(ns_fd)
    fail('the sandbox ended')
  end
  local ok, proxy = pcall(egress.start, ns_fd, { allow = spec.network.allow, on_event = spec.on_event,
    resolve = resolve })
  if not ok then fail('the egress proxy cannot listen: ' .. tostring(proxy)) end
  backend.proxy = proxy
  for _, port in ipairs(spec.ports or {}) do
    backend.ports[port] = proxy:forward(port)
    if not backend.ports[port] then fail('cannot forward port ' .. port) end
  end
end

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
local function socket_of(host)
  if type(host) ~= 'string' or host == '' then errors.raise('INVALID_CONFIG', 'host must be a string', nil, 0) end
  local path = host:match('^unix://(/.+)$')
  if not path then
    if host:match('^%a[%w+.-]*://') then
      errors.raise('INVALID_CONFIG', 'host must be a local daemon (unix:///path/to/docker.sock); remote hosts ' ..
        '(tcp://, ssh://, ...) are refused', nil, 0)
    end
    errors.raise('INVALID_CONFIG', 'host must be unix:///path/to/docker.sock', nil, 0)
  end
  if path:find('[%z\n]') or #path > 107 then
    errors.raise('INVALID_CONFIG', 'host is not a usable socket path', nil, 0)
  end
  return path
end

local function default_host()
  local env = os.getenv('DOCKER_HOST')
  if env and env ~= '' then return env end
  if exists('/var/run/docker.sock') then return 'unix:///var/run/docker.sock' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  if rt and rt ~= '' and exists(rt .. '/docker.sock') then return 'unix://' .. rt .. '/docker.sock' end
  return 'unix:///var/run/docker.sock'
end

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
  local ok, socket = pcall(socket_of, options.host or default_host())
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
    features = { stdin = true, ports = true, desktop = settings ~= nil, network = { 'none', 'all' } },
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
    p.engine = setmetatable({ docker = cli, host = p.host }, Cli)
  else
    p.engine = setmetatable({ socket = socket }, Api)
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
  p.peer_uid = agent_takes_peer_uid(p.agent) and me or nil
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
  p.run_base = options.run_dir and absolute(options.run_dir) or run_base(me)
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
      error(no_image(name), 0)
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
    if image_name:find('[%s%z]') or image_name:sub(1, 1) == '-' then
      errors.raise('INVALID_CONFIG', 'image is not a usable image name', nil, 0)
    end

    -- the image first: nothing is created for an image that is not here
    image_env(self, image_name)

    if not prepared then
      prepare_base(self.run_base, self.my_uid)
      if self.own_fs then own_fs(self.run_base) end
      sweep(self.run_base)
      self.agent_in_base = stage_agent(self.run_base, self.agent)
      prepared = true
    end
    reap(self.engine, self.host, self.run_base, self.my_uid, false)
    if network == 'all' and not (network_checked and network_checked > core.hrtime_ms()) then
      ensure_network(self.engine, self.firewall)
      network_checked = core.hrtime_ms() + NETWORK_CHECK_MS
    end
    local sb_uid, sb_gid, own_uid = self.uid, self.gid, false
    if not sb_uid then
      sb_uid = pick_uid()
      sb_gid, own_uid = sb_uid, true
    end
    local id = 'mayura-' .. random_hex(6)
    local expires_ms = math.floor(core.now_ms()) + spec.lifetime_ms
    local expires_s = math.floor(expires_ms / 1000) + 1
    local dir = self.run_base .. '/' .. expires_s .. '-' .. id
    local made, merr = uv_fs('fs_mkdir', dir, MODE_0700)
    if not made then
      if own_uid then uids_in_use[sb_uid] = nil end
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
      network = network == 'all' and NETWORK or 'none',
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
      if own_uid then uids_in_use[sb_uid] = nil end
      if network == 'all' then network_checked = nil end
      error(container, 0)
    end

    local backend = setmetatable({
      id = id, container = container, engine = eng, dir = dir, network = network,
      uid = sb_uid, gid = sb_gid, own_uid = own_uid, oom_score_adj = c.oom_score_adj, expires_ms = expires_ms,
      ports = {}, closed = false, released = false,
    }, Backend)
    local sok, serr = pcall(function()
      if network == 'allowlist' then
        start_proxy(backend, eng, container, spec, self.proxy_resolve)
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
    if not sok then agent_backend.start_failed(backend, serr) end
    backend.image_name = image_name
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
    local fok, err = pcall(finish, self, backend, spec)
    if not fok then agent_backend.start_failed(backend, err) end
    return backend
  end

  -- warm sandboxes: the provider's own shape (network 'none', its image and limits, no ports, no
  -- desktop) with the pool's labels (a container's labels cannot change once it is made: a create
  -- adding labels of its own gets a cold one)
  local function same_labels(a, b)
    for k, v in pairs(a or {}) do if b[k] ~= v then return false end end
    for k, v in pairs(b or {}) do if (a or {})[k] ~= v then return false end end
    return true
  end
  agent_backend.add_warm(p, p.warm, {
    make = function(self, lifetime_ms, labels)
      return start(self, { lifetime_ms = lifetime_ms, network = 'none', labels = labels })
    end,
    matches = function(self, spec, labels)
      return spec.network == 'none' and not (spec.ports and #spec.ports > 0) and not spec.desktop
        and (spec.image == nil or spec.image == self.image)
        and (spec.cpus == nil or spec.cpus >= self.cpus)
        and (spec.memory_mib == nil or spec.memory_mib >= self.memory_mib)
        and same_labels(spec.labels, labels)
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

return M
