--- mayura.sandbox._docker_cli: the Docker provider's `engine = 'cli'`: the docker CLI run for each
-- call (image inspect, run, inspect, rm, ps, network inspect/create; for snapshots create, cp,
-- commit, image ls/rm), behind the calls mayura.sandbox._docker_engine names; what its stderr says
-- is read here for a reason and never passed on. Private to the Docker provider.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local process = require('mayura.process')
local engine = require('mayura.sandbox._docker_engine')

local M = {}

local ID_LABEL, PROVIDER_LABEL, EXPIRES_LABEL = engine.ID_LABEL, engine.PROVIDER_LABEL, engine.EXPIRES_LABEL
local SNAPSHOT_LABEL, SNAPSHOT_REPO, NO_ENTRYPOINT = engine.SNAPSHOT_LABEL, engine.SNAPSHOT_REPO, engine.NO_ENTRYPOINT
local SNAPSHOT_NS_LABEL = engine.SNAPSHOT_NS_LABEL
local ENGINE_TIMEOUT_MS = engine.ENGINE_TIMEOUT_MS
local runc_lost_child, may_retry = engine.runc_lost_child, engine.may_retry

-- A field of docker's --mount value (a CSV record): quoted when it holds a comma or a quote.
local function csv_field(s)
  if s:find('[,"]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

local function cpus_text(c)
  local s = ('%.3f'):format(c):gsub('0+$', ''):gsub('%.$', '')
  return s
end

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

local Cli = {}
Cli.__index = Cli

-- Runs `docker -H <host> args...`; returns the result, or raises a mapped error about `what`.
function Cli:run(args, what, allow)
  local argv = { self.docker, '-H', self.host }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local ok, res = pcall(process.run, argv, { timeout_ms = ENGINE_TIMEOUT_MS, max_output_bytes = 1048576 })
  if not ok then
    if errors.is(res, 'CANCELLED') then error(res, 0) end
    error(engine.error('unavailable', what), 0)
  end
  if res.timed_out then error(engine.error('timeout', what), 0) end
  if res.exit_code ~= 0 then
    local reason = cli_reason(res.stderr)
    if allow and allow[reason] then return nil, reason end
    local e = engine.error(reason == 'no_image' and 'not_found' or reason, what)
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
    '--stop-signal', 'SIGKILL',
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
        task.sleep(engine.start_pause(tries))
      else
        error(res, 0)
      end
    elseif reason == 'no_image' then error(engine.no_image(c.image), 0)
    else error(engine.error('failed', 'start a container'), 0) end
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
  if not ok or type(t) ~= 'table' then error(engine.error('failed', 'inspect a container'), 0) end
  return { running = t.running == true, pid = tonumber(t.pid), ports = t.ports }
end

--- Removes the container (killing it) and returns once it is gone; no such container is fine.
function Cli:remove(id)
  local _, reason = self:run({ 'rm', '--force', '--', id }, 'remove a container', { not_found = true, conflict = true })
  if reason ~= 'conflict' then return end
  -- its auto-remove is under way: wait for it to finish
  local started, delay = core.hrtime_ms(), 10
  while self:inspect(id) do
    if core.hrtime_ms() - started > ENGINE_TIMEOUT_MS then error(engine.error('timeout', 'remove a container'), 0) end
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
  if not ok or type(t) ~= 'table' then error(engine.error('failed', 'inspect a network'), 0) end
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
-- removes the container it is made from should this host die meanwhile); returns its id (never the
-- tag, which another user of the daemon could move).
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
    if not rok or res.exit_code ~= 0 then error(engine.error(rok and cli_reason(res.stderr) or 'unavailable',
      'put the snapshot into its image'), 0) end
    local made = self:run({ 'commit', '--pause=false', name, ref }, 'make a snapshot\'s image')
    id = made.stdout:match('^%s*(sha256:%x+)%s*$')
    if not id then error(engine.error('failed', 'make a snapshot\'s image'), 0) end
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

--- The snapshots' images named in our repository: `{ ref, owner, pidns }` each (ref: the image's id;
-- pidns nil when unlabelled).
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

--- The engine over the CLI at `docker`, for the daemon `host`.
function M.new(docker, host)
  return setmetatable({ docker = docker, host = host }, Cli)
end

return M
