--- mayura.sandbox.vercel: sandboxes on Vercel Sandbox (Firecracker microVMs),
-- through its REST API (`https://vercel.com/api`, JSON and NDJSON).
--
--   local vercel = require('mayura.sandbox.vercel')
--   local provider = vercel.vercel_sandboxes({
--     token = token, team_id = 'team_...', project_id = 'prj_...',
--   })
--   local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000 })
--
-- Options: `token` (a Vercel access token; required, sent only as
-- `Authorization: Bearer`, never read from the environment by this module),
-- `team_id` and `project_id` (required: every request names the team, a
-- sandbox belongs to the project), `base_url` (the API; for a service that
-- speaks the same API elsewhere), `image` (a managed image such as
-- `vercel/sandbox/node:24`; the service's default when left out; a
-- sandbox's own `image` wins), `region`, `workdir` (where relative paths and
-- commands start: the service's `/vercel/sandbox` by default),
-- `max_lifetime_ms` (5 hours, the Pro plan's most; 45 minutes on Hobby),
-- the kit's `retries`, `retry_base_ms` and `max_retry_after_ms`, and `warm` (sandboxes made ahead
-- for the pool, 0 to 64, none by default: a create with the pool's labels, no image, ports, cpus or
-- memory and the network 'none' takes one, its env going with each command; mayura.sandbox._kit).
--
-- How the contract maps onto the service:
--   * create: `POST /v3/sandboxes` with the lifetime as the session's
--     `timeout` (ms), `env`, the labels as `tags` (at most 5), `ports` (each
--     1024 and up, at most 15, each given a public route), `resources.vcpus`
--     from `cpus` and `memory_mib` (2,048 MiB per vCPU, at most 8),
--     `persistent: false`, and the network as `networkPolicy`: 'none' is
--     `deny-all`, 'all' is `allow-all`, `{ allow = domains }` is the
--     service's domain allow-list (`.example.com` becomes `*.example.com`);
--     a session still `pending` is polled until it runs;
--   * exec: `POST /v2/sandboxes/sessions/{id}/cmd` with `wait` and `logs`,
--     read as NDJSON (its first line names the command, then output lines,
--     then the command with its exit code). The service has no standard
--     input (`features.stdin` is false: the pool refuses stdin before any
--     call). Output arrives as text (the service sends JSON strings). Every
--     process of a command carries `MAYURA_EXEC=<tag>` in its environment; at
--     the timeout or a cancel the command is killed (`.../kill`, SIGKILL) and
--     then everything with its tag (a `setsid` child too) by a second command;
--     the service's own `timeout` is set a little later, as a backstop should
--     this process be gone. A stream cut while the command runs (the
--     service's edge cuts long streams) is taken up again: the command's
--     logs from the start, then its exit. Output lines go to `o.on_output`
--     as they come (after a cut, only what the logs add); `o.on_start` gets
--     a `kill(signal)` that is the service's kill of the command (no pid);
--   * files: `fs/read` (the bytes; 404 is no file), `fs/write` (a gzip'd tar
--     of the one file, extracted at `/`, which makes the directories);
--     listing and removing run `sandbox_scripts` as commands (the service
--     has no call for them);
--   * url(port): the route the service gave the port at create;
--   * snapshots are the service's own (`features.snapshots` 'native'):
--     `POST /v2/sandboxes/sessions/{id}/snapshot` (with an `expiration` of a
--     day, the least the service takes, renewed by each use: one a lost host
--     leaves goes by itself) stops the session to make it, as the service
--     documents, so the sandbox ends with its snapshot (later calls are
--     `gone`); its size is the service's `sizeBytes`; a create from it sends
--     `source: { type = 'snapshot', snapshotId }` (and no image); release is
--     `DELETE /v2/sandboxes/snapshots/{id}`. A snapshot call whose answer was
--     lost lists the project's snapshots and deletes those of the session it
--     did not make;
--   * release: the session is stopped, then the sandbox deleted.
-- Failures are SandboxErrors without the service's text (the kit's mapping):
-- 404 and 410 (`sandbox_stopped`) on a session are `gone`; 401/403
-- `authentication`; 429 is retried after its `Retry-After`.
local errors = require('mayura.errors')
local check = require('mayura._check')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')

local M = {}

M.DEFAULT_BASE_URL = 'https://vercel.com/api'
M.DEFAULT_WORKDIR = '/vercel/sandbox'
M.MAX_LIFETIME_MS = 5 * 3600000
M.MAX_PORTS = 15
M.MIN_PORT = 1024
M.MAX_TAGS = 5
M.MAX_VCPUS = 8
M.MIB_PER_VCPU = 2048

local session = require('mayura.sandbox._vercel_session')

local GONE = session.GONE
local object, array = kit.object, kit.array
local POLL_MS = 250                -- a pending session


-- {======================================================
-- The provider
-- =======================================================

local function id_option(v, _, name)
  if type(v) ~= 'string' or not v:match('^[%w_%-]+$') or #v > 128 then
    errors.raise('INVALID_CONFIG', 'vercel: ' .. name .. ' must be an id (letters, digits, _ and -)', nil, 0)
  end
  return v
end

local function token_option(v)
  -- the token is checked by the kit's client (no spaces or control characters) and kept out of every message
  if type(v) ~= 'string' or v == '' then errors.raise('INVALID_CONFIG', 'vercel: token is required', nil, 0) end
  return v
end

local function workdir_option(v)
  local workdir = v or M.DEFAULT_WORKDIR
  if type(workdir) ~= 'string' or workdir:sub(1, 1) ~= '/' or workdir:find('[%z\n]') or workdir:find('/%.%.?/')
    or workdir:find('/%.%.?$') then
    errors.raise('INVALID_CONFIG', 'vercel: workdir must be an absolute path', nil, 0)
  end
  if #workdir > 1 then workdir = workdir:gsub('/+$', '') end
  return workdir
end

local function name_option(v, _, name)
  if v ~= nil and (type(v) ~= 'string' or v == '' or #v > 512 or v:find('[%c%s]')) then
    errors.raise('INVALID_CONFIG', 'vercel: ' .. name .. ' must be a non-empty string', nil, 0)
  end
  return v
end

local function taken(v) return v end

local function network_policy(network)
  if network == 'all' then return object({ mode = 'allow-all' }) end
  if type(network) == 'table' then
    local allow = {}
    for i, d in ipairs(network.allow) do
      if d:sub(1, 1) == '.' then d = '*' .. d end
      allow[i] = d
    end
    return object({ allow = array(allow) })
  end
  return object({ mode = 'deny-all' })
end

-- vCPUs for `cpus` and `memory_mib` (2,048 MiB each), nil for the service's default.
local function vcpus_of(spec)
  local n = 0
  if spec.cpus then n = math.ceil(spec.cpus) end
  if spec.memory_mib then n = math.max(n, math.ceil(spec.memory_mib / M.MIB_PER_VCPU)) end
  if n == 0 then return nil end
  if n > M.MAX_VCPUS then
    errors.raise('INVALID_INPUT', 'vercel: a sandbox has at most ' .. M.MAX_VCPUS .. ' vCPUs (2,048 MiB each)', nil, 0)
  end
  return n
end

local function check_ports(ports)
  local list = {}
  if #(ports or {}) > M.MAX_PORTS then
    errors.raise('INVALID_INPUT', 'vercel: a sandbox serves at most ' .. M.MAX_PORTS .. ' ports', nil, 0)
  end
  for i, p in ipairs(ports or {}) do
    if p < M.MIN_PORT then
      errors.raise('INVALID_INPUT', 'vercel: ports below ' .. M.MIN_PORT .. ' are not served', nil, 0)
    end
    list[i] = p
  end
  return list
end

-- The routes of a create answer: port -> URL.
local function routes_of(c, routes)
  local out = {}
  if routes == nil then return out end
  if type(routes) ~= 'table' then error(c:bad_answer('routes that are not a list'), 0) end
  for _, r in ipairs(routes) do
    if type(r) == 'table' and check.is_int(r.port) then
      if type(r.url) == 'string' and r.url:match('^https?://[%w%.%-%[%]:]+[^%s]*$') then
        out[r.port] = r.url
      elseif type(r.subdomain) == 'string' and r.subdomain:match('^[%w%-]+$') then
        out[r.port] = 'https://' .. r.subdomain .. '.vercel.run'
      end
    end
  end
  return out
end

local function check_id(c, v, what)
  if type(v) ~= 'string' or v == '' or #v > 256 or v:find('[%c%s]') then
    error(c:bad_answer('a ' .. what .. ' without an id'), 0)
  end
  return v
end

--- The provider: see the module's comment for the options.
function M.vercel_sandboxes(options)
  local o = kit.options(options, {
    { token = token_option }, { team_id = id_option }, { project_id = id_option },
    { workdir = workdir_option }, { image = name_option }, { region = name_option },
    { max_lifetime_ms = kit.int(1000, M.MAX_LIFETIME_MS, M.MAX_LIFETIME_MS) },
    { base_url = taken }, { retries = taken }, { retry_base_ms = taken }, { max_retry_after_ms = taken },
    { warm = kit.int(0, 64, 0) },
  }, 'vercel', 'options with token, team_id and project_id are required')
  local client = hosted.client({
    label = 'vercel', base_url = o.base_url or M.DEFAULT_BASE_URL, api_key = o.token,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms or 20000,
  })
  local team_id, project_id, workdir = o.team_id, o.project_id, o.workdir
  local query = { teamId = team_id }

  return kit.provider({
    id = 'vercel', label = 'vercel', client = client, warm = o.warm, ready_interval_ms = POLL_MS,
    features = { stdin = false, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' },
    workdir = workdir, max_lifetime_ms = o.max_lifetime_ms,

    create = function(ctx)
      local spec = ctx.spec
      local ports = check_ports(spec.ports)
      local vcpus = vcpus_of(spec)
      local tags = hosted.metadata(spec.labels, { max_keys = M.MAX_TAGS, max_key_bytes = 63, max_value_bytes = 256 })
      ctx.ports = ports
      local source
      if spec.snapshot ~= nil then
        -- the service's own snapshot: the new sandbox starts from its filesystem
        if spec.image ~= nil then
          errors.raise('INVALID_INPUT', 'vercel: a snapshot brings its own image; image cannot be given with it',
            nil, 0)
        end
        source = object({ type = 'snapshot', snapshotId = spec.snapshot.id })
      end
      return ctx.client:json('POST', '/v3/sandboxes', {
        projectId = project_id,
        timeout = hosted.lifetime(spec.lifetime_ms, { unit = 'ms', max = o.max_lifetime_ms }),
        ports = array(ports),
        env = object(spec.env),
        tags = tags,
        networkPolicy = network_policy(spec.network),
        resources = vcpus and object({ vcpus = vcpus }) or nil,
        image = not source and (spec.image or o.image) or nil,
        source = source,
        region = o.region,
        persistent = false,
      }, {
        query = query,
        on_error = function(status)
          if source and (status == 404 or status == 410) then
            return errors.new('INVALID_INPUT', 'vercel: the service no longer has the snapshot (HTTP '
              .. status .. ')')
          end
          if status == 400 or status == 422 then
            return errors.new('INVALID_INPUT', 'vercel: the service refused the sandbox\'s options (HTTP '
              .. status .. ')')
          end
          return nil
        end,
      })
    end,

    -- the backend (no call yet), with the answer's session
    accept = function(ctx, res)
      local c = ctx.client
      if type(res) ~= 'table' or type(res.sandbox) ~= 'table' or type(res.session) ~= 'table' then
        error(c:bad_answer('a sandbox without its session'), 0)
      end
      local backend = session.new({
        id = check_id(c, res.sandbox.name, 'sandbox'), name = res.sandbox.name,
        session_id = check_id(c, res.session.id, 'session'),
        client = c, team_id = team_id, project_id = project_id, workdir = workdir,
      })
      return { backend = backend, session = res.session, routes = res.routes }
    end,

    -- a session still pending is polled until it runs
    ready = function(ctx, h)
      local c = ctx.client
      if not h.backend.routes then h.backend.routes = routes_of(c, h.routes) end
      if h.session.status ~= 'pending' then return true end
      local got = c:json('GET', h.backend:_path(), nil, { query = query, gone = GONE })
      if type(got) ~= 'table' or type(got.session) ~= 'table' then
        error(c:bad_answer('a session that is not an object'), 0)
      end
      h.session = got.session
      if got.routes ~= nil then h.backend.routes = routes_of(c, got.routes) end
      return h.session.status ~= 'pending'
    end,

    backend = function(ctx, h)
      local c, backend = ctx.client, h.backend
      if h.session.status ~= 'running' then
        error(errors.sandbox('failed', 'vercel: the sandbox did not start (its session is '
          .. (c:_safe_code(h.session.status) or 'in an unknown state') .. ')'), 0)
      end
      for _, p in ipairs(ctx.ports) do
        if not backend.routes[p] then error(c:bad_answer('no route for port ' .. p), 0) end
      end
      return backend
    end,

    destroy = function(_, h) h.backend:release() end,

    -- a warm sandbox given to a create, once its session still runs: its env goes with every
    -- command (the session's own timeout stays the warm one's: the pool ends the sandbox at the
    -- asked lifetime)
    hand_out = function(_, backend, spec)
      if not backend:_running() then error(errors.sandbox('gone', 'vercel: the warm sandbox ended'), 0) end
      for k, v in pairs(spec.env or {}) do backend._env[k] = v end
    end,
  })
end

-- }======================================================

M.SNAPSHOT_EXPIRATION_MS = session.SNAPSHOT_EXPIRATION_MS
M.sandboxes = M.vercel_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
