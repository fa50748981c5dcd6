--- mayura.sandbox._docker_engine: the two ways the Docker provider (mayura.sandbox.docker) talks
-- to the daemon, and how their failures are told.
--
-- `engine = 'cli'` (the default) runs the docker CLI for the container's life
-- (image inspect, run, inspect, rm, ps, network inspect/create; for snapshots create, cp,
-- commit, image ls/rm); `engine = 'api'` speaks the Engine API over its unix socket through
-- libcurl (images/{name}/json, containers/create, start, json, wait, DELETE, containers/json,
-- networks; for snapshots containers/{id}/archive, commit, images/json and DELETE). Only local
-- daemons: a tcp:// or ssh:// host is refused, because the agent and its socket directory are
-- bind-mounted from this machine.
--
-- Both engines take a container description (`c`: name, image, user, workdir, network, tmpfs,
-- mounts, limits, labels, ports, entrypoint and cmd, made by the provider) and offer the same
-- calls: image_env, run_container, runtimes, inspect, remove, list_ours, network and
-- create_network; and for snapshots kept as images (never pushed): snapshot_image (a container
-- made, not started, a tar put into its file system, committed as an image with the labels below,
-- the container removed; it returns the image's id, so that nothing uses a tag another user of the
-- daemon could move), remove_image and list_snapshot_images (only the images named in our
-- repository: one built on a snapshot's image inherits its label, and is not ours). The daemon's own words never
-- reach a caller's message: a failure is mapped to a reason (`docker could not <what> (<reason>)`),
-- its text kept as `cause` at most. Private to the Docker provider.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local process = require('mayura.process')
local http = require('mayura.http')
local exists = require('mayura.sandbox._host').exists

local M = {}

local MIB = 1048576
local ENGINE_TIMEOUT_MS = 60000            -- one docker CLI call or Engine API request
--- The labels of our containers: the sandbox's id, the provider, the end of its lifetime (ms since
-- the epoch).
M.ID_LABEL, M.PROVIDER_LABEL, M.EXPIRES_LABEL = 'mayura.sandbox', 'mayura.provider', 'mayura.expires'
local ID_LABEL, PROVIDER_LABEL, EXPIRES_LABEL = M.ID_LABEL, M.PROVIDER_LABEL, M.EXPIRES_LABEL
--- The label of a snapshot's image: the host process that made it (`PID-START`, its start time in
-- /proc/PID/stat), so that a provider can tell the images a killed host left; the pid namespace that
-- PID is of (a host in a container of its own, on the same daemon, has its own). Their repository.
M.SNAPSHOT_LABEL, M.SNAPSHOT_NS_LABEL, M.SNAPSHOT_REPO = 'mayura.snapshot.owner', 'mayura.snapshot.pidns',
  'mayura-snapshot'
local SNAPSHOT_LABEL, SNAPSHOT_NS_LABEL, SNAPSHOT_REPO = M.SNAPSHOT_LABEL, M.SNAPSHOT_NS_LABEL, M.SNAPSHOT_REPO
-- the entrypoint of the container an image is committed from (never started)
local NO_ENTRYPOINT = '/.mayura-none'

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

--- The coded error of a failed docker call about `what`, for a mapped `reason`.
function M.error(reason, what)
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

--- INVALID_CONFIG for an image that is not on this machine.
function M.no_image(image)
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
    error(M.error('unavailable', what), 0)
  end
  if res.timed_out then error(M.error('timeout', what), 0) end
  if res.exit_code ~= 0 then
    local reason = cli_reason(res.stderr)
    if allow and allow[reason] then return nil, reason end
    local e = M.error(reason == 'no_image' and 'not_found' or reason, what)
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
    elseif reason == 'no_image' then error(M.no_image(c.image), 0)
    else error(M.error('failed', 'start a container'), 0) end
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
  if not ok or type(t) ~= 'table' then error(M.error('failed', 'inspect a container'), 0) end
  return { running = t.running == true, pid = tonumber(t.pid), ports = t.ports }
end

--- Removes the container (killing it) and returns once it is gone; no such container is fine.
function Cli:remove(id)
  local _, reason = self:run({ 'rm', '--force', '--', id }, 'remove a container', { not_found = true, conflict = true })
  if reason ~= 'conflict' then return end
  -- its auto-remove is under way: wait for it to finish
  local started, delay = core.hrtime_ms(), 10
  while self:inspect(id) do
    if core.hrtime_ms() - started > ENGINE_TIMEOUT_MS then error(M.error('timeout', 'remove a container'), 0) end
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
  if not ok or type(t) ~= 'table' then error(M.error('failed', 'inspect a network'), 0) end
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

--- Makes the image `mayura-snapshot:TAG` from `image` with `tar` (a tar archive) unpacked at its /,
-- labelled `labels` (with the label of our containers and an end `expires_ms`, so that the reaper
-- removes the container it is made from should this host die meanwhile); returns its reference.
function Cli:snapshot_image(image, tar, tag, labels, expires_ms)
  local name = 'mayura-snap-' .. tag
  local a = { 'create', '--pull', 'never', '--name', name, '--network', 'none', '--entrypoint', NO_ENTRYPOINT,
    '--label', PROVIDER_LABEL .. '=docker', '--label', EXPIRES_LABEL .. '=' .. ('%d'):format(expires_ms) }
  for k, v in pairs(labels) do a[#a + 1] = '--label'; a[#a + 1] = k .. '=' .. v end
  a[#a + 1] = '--'
  a[#a + 1] = image
  local ref = SNAPSHOT_REPO .. ':' .. tag
  local id
  local ok, err = pcall(function()
    self:run(a, 'make a snapshot\'s container')
    local argv = { self.docker, '-H', self.host, 'cp', '-', name .. ':/' }
    local rok, res = pcall(process.run, argv, { stdin = tar, timeout_ms = ENGINE_TIMEOUT_MS, max_output_bytes = 65536 })
    if not rok or res.exit_code ~= 0 then error(M.error(rok and cli_reason(res.stderr) or 'unavailable',
      'put the snapshot into its image'), 0) end
    local made = self:run({ 'commit', '--pause=false', name, ref }, 'make a snapshot\'s image')
    id = made.stdout:match('^%s*(sha256:%x+)%s*$')
    if not id then error(M.error('failed', 'make a snapshot\'s image'), 0) end
  end)
  pcall(self.remove, self, name)
  if not ok then
    pcall(self.remove_image, self, id or ref)
    error(err, 0)
  end
  return id
end

--- Removes an image (also one that containers still use: it goes once they do); none is fine.
function Cli:remove_image(ref)
  self:run({ 'image', 'rm', '--force', '--', ref }, 'remove an image', { not_found = true, no_image = true })
end

--- The snapshots' images: `{ ref, owner, pidns }` each (ref: the image's id; pidns nil when unlabelled).
function Cli:list_snapshot_images()
  local res = self:run({ 'image', 'ls', '--no-trunc', '--quiet', '--filter', 'label=' .. SNAPSHOT_LABEL,
    '--filter', 'reference=' .. SNAPSHOT_REPO }, 'list images')
  local out = {}
  for id in res.stdout:gmatch('(sha256:%x+)') do
    local r = self:run({ 'image', 'inspect', '--format', '{{index .Config.Labels "' .. SNAPSHOT_LABEL .. '"}} '
      .. '{{index .Config.Labels "' .. SNAPSHOT_NS_LABEL .. '"}}', '--', id }, 'inspect an image',
      { not_found = true, no_image = true })
    local owner, ns = (r and r.stdout or ''):match('^(%S*) (%S*)')
    if owner then out[#out + 1] = { ref = id, owner = owner, pidns = ns:match('^%d+$') } end
  end
  return out
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
  if type(body) == 'string' then   -- a tar archive
    text = body
    headers['Content-Type'] = 'application/x-tar'
  elseif body ~= nil then
    text = core.json.encode(body)
    headers['Content-Type'] = 'application/json'
  end
  local ok, res = pcall(http.request, {
    url = 'http://docker' .. path, method = method, headers = headers, body = text,
    unix_socket = self.socket, timeout_ms = timeout_ms or ENGINE_TIMEOUT_MS, max_body_bytes = 16 * MIB,
  })
  if not ok then
    if errors.is(res, 'CANCELLED') then error(res, 0) end
    if errors.is(res, 'TIMEOUT') then error(M.error('timeout', what), 0) end
    error(M.error('unavailable', what), 0)
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
    if status == 404 then error(M.no_image(c.image), 0) end
    if status ~= 201 then error(api_failure(status, 'create a container'), 0) end
    local id = type(body) == 'table' and body.Id
    if type(id) ~= 'string' or not id:match('^%x+$') then
      pcall(self.remove, self, c.name)
      error(M.error('failed', 'create a container'), 0)
    end
    status, body = self:request('POST', '/containers/' .. id .. '/start', nil, 'start a container')
    if status == 204 or status == 304 then return id end
    pcall(self.remove, self, id)
    if status == 404 then error(M.error('unavailable', 'start a container'), 0) end
    local reason = daemon_reason(body)
    local pause = START_PAUSE_MS * tries
    local low = reason:lower()
    local passing = (status == 400 or status >= 500) and (transient(reason) or runc_lost_child(c, low))
    if passing and may_retry(c, tries) then
      task.sleep(pause)
    else
      if not passing and (status == 400 or status == 500) and c.oom_score_adj
        and (low:find('oci runtime', 1, true) or low:find('oom_score_adj', 1, true)) then
        error(M.error('runtime', 'start a container'), 0)
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


function Api:snapshot_image(image, tar, tag, labels, expires_ms)
  local all = { [PROVIDER_LABEL] = 'docker', [EXPIRES_LABEL] = ('%d'):format(expires_ms) }
  for k, v in pairs(labels) do all[k] = v end
  local ref = SNAPSHOT_REPO .. ':' .. tag
  local id, made
  local ok, err = pcall(function()
    local status, body = self:request('POST', '/containers/create?name=mayura-snap-' .. tag, {
      Image = image, Entrypoint = { NO_ENTRYPOINT }, Labels = all, HostConfig = { NetworkMode = 'none' } },
      'make a snapshot\'s container')
    if status ~= 201 or type(body) ~= 'table' or type(body.Id) ~= 'string' or not body.Id:match('^%x+$') then
      error(api_failure(status, 'make a snapshot\'s container'), 0)
    end
    id = body.Id
    status = self:request('PUT', '/containers/' .. id .. '/archive?path=/', tar, 'put the snapshot into its image')
    if status ~= 200 then error(api_failure(status, 'put the snapshot into its image'), 0) end
    status, body = self:request('POST', '/commit?container=' .. id .. '&repo=' .. SNAPSHOT_REPO .. '&tag=' .. tag
      .. '&pause=false', nil, 'make a snapshot\'s image')
    if status ~= 201 then error(api_failure(status, 'make a snapshot\'s image'), 0) end
    made = type(body) == 'table' and type(body.Id) == 'string' and body.Id:match('^sha256:%x+$') and body.Id
    if not made then error(M.error('failed', 'make a snapshot\'s image'), 0) end
  end)
  if id then pcall(self.remove, self, id) end
  if not ok then
    pcall(self.remove_image, self, made or ref)
    error(err, 0)
  end
  return made
end

function Api:remove_image(ref)
  local status = self:request('DELETE', '/images/' .. url_escape(ref) .. '?force=true', nil, 'remove an image')
  if status == 200 or status == 404 then return end
  error(api_failure(status, 'remove an image'), 0)
end

function Api:list_snapshot_images()
  local filters = core.json.encode({ label = { SNAPSHOT_LABEL }, reference = { SNAPSHOT_REPO } })
  local status, body = self:request('GET', '/images/json?filters=' .. url_escape(filters), nil, 'list images')
  if status ~= 200 or type(body) ~= 'table' then error(api_failure(status, 'list images'), 0) end
  local out = {}
  for _, im in ipairs(body) do
    local labels = type(im) == 'table' and type(im.Labels) == 'table' and im.Labels or {}
    if type(im.Id) == 'string' and type(labels[SNAPSHOT_LABEL]) == 'string' then
      local ns = labels[SNAPSHOT_NS_LABEL]
      out[#out + 1] = { ref = im.Id, owner = labels[SNAPSHOT_LABEL], pidns = type(ns) == 'string' and ns or nil }
    end
  end
  return out
end


-- The local daemon's socket path from a host string; raises INVALID_CONFIG for anything else.
function M.socket_of(host)
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

--- The daemon to use when the options name none: DOCKER_HOST, else the usual sockets.
function M.default_host()
  local env = os.getenv('DOCKER_HOST')
  if env and env ~= '' then return env end
  if exists('/var/run/docker.sock') then return 'unix:///var/run/docker.sock' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  if rt and rt ~= '' and exists(rt .. '/docker.sock') then return 'unix://' .. rt .. '/docker.sock' end
  return 'unix:///var/run/docker.sock'
end

--- The engine `name` ('cli': `docker` is the CLI's path, `host` the daemon; 'api': `socket` the
-- daemon's socket path).
function M.new(name, docker, host, socket)
  if name == 'cli' then return setmetatable({ docker = docker, host = host }, Cli) end
  return setmetatable({ socket = socket }, Api)
end

return M
