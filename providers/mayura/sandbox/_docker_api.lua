--- mayura.sandbox._docker_api: the Docker provider's `engine = 'api'`: the Engine API over the
-- daemon's unix socket through libcurl (images/{name}/json, containers/create, start, json, wait,
-- DELETE, containers/json, networks; for snapshots containers/{id}/archive, commit, images/json
-- and DELETE), behind the calls mayura.sandbox._docker_engine names; the daemon's answers are
-- read here for a reason and never passed on. Private to the Docker provider.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local http = require('mayura.http')
local engine = require('mayura.sandbox._docker_engine')

local M = {}

local MIB = 1048576
local ID_LABEL, PROVIDER_LABEL, EXPIRES_LABEL = engine.ID_LABEL, engine.PROVIDER_LABEL, engine.EXPIRES_LABEL
local SNAPSHOT_LABEL, SNAPSHOT_REPO, NO_ENTRYPOINT = engine.SNAPSHOT_LABEL, engine.SNAPSHOT_REPO, engine.NO_ENTRYPOINT
local SNAPSHOT_NS_LABEL = engine.SNAPSHOT_NS_LABEL
local ENGINE_TIMEOUT_MS = engine.ENGINE_TIMEOUT_MS
local runc_lost_child, may_retry = engine.runc_lost_child, engine.may_retry

local function url_escape(s)
  return (s:gsub('[^%w%-%._~/:@]', function(c) return ('%%%02X'):format(c:byte()) end))
end

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
    if errors.is(res, 'TIMEOUT') then error(engine.error('timeout', what), 0) end
    error(engine.error('unavailable', what), 0)
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
    StopSignal = 'SIGKILL',
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
    if status == 404 then error(engine.no_image(c.image), 0) end
    if status ~= 201 then error(api_failure(status, 'create a container'), 0) end
    local id = type(body) == 'table' and body.Id
    if type(id) ~= 'string' or not id:match('^%x+$') then
      pcall(self.remove, self, c.name)
      error(engine.error('failed', 'create a container'), 0)
    end
    status, body = self:request('POST', '/containers/' .. id .. '/start', nil, 'start a container')
    if status == 204 or status == 304 then return id end
    pcall(self.remove, self, id)
    if status == 404 then error(engine.error('unavailable', 'start a container'), 0) end
    local reason = daemon_reason(body)
    local pause = engine.start_pause(tries)
    local low = reason:lower()
    local passing = (status == 400 or status >= 500) and (transient(reason) or runc_lost_child(c, low))
    if passing and may_retry(c, tries) then
      task.sleep(pause)
    else
      if not passing and (status == 400 or status == 500) and c.oom_score_adj
        and (low:find('oci runtime', 1, true) or low:find('oom_score_adj', 1, true)) then
        error(engine.error('runtime', 'start a container'), 0)
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
    -- the image by its id: the tag is another user's to move
    made = type(body) == 'table' and type(body.Id) == 'string' and body.Id:match('^sha256:%x+$') and body.Id
    if not made then error(engine.error('failed', 'make a snapshot\'s image'), 0) end
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

--- The engine over the daemon's socket at `socket`.
function M.new(socket)
  return setmetatable({ socket = socket }, Api)
end

return M
