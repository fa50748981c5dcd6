--- mayura.sandbox.modal: sandboxes on Modal (https://modal.com/docs/guide/sandboxes), over Modal's
-- gRPC API, on command_sandbox_backend.
--
--   local modal = require('mayura.sandbox.modal')
--   local provider = modal.modal_sandboxes({ token_id = id, token_secret = secret })
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4, network = { 'none' } })
--
-- Options: `token_id` and `token_secret` (required: a Modal token, `modal token new`; the library
-- never reads the environment or ~/.modal.toml), `app_name` (the app the sandboxes belong to, made
-- when missing: default 'mayura-sandboxes'), `environment` (Modal's environment, the workspace's
-- default when nil), `image` (a registry image with sh and coreutils or BusyBox, or an image id
-- `im-...`: default `debian:bookworm-slim`; a create's `image` names another), `server_url`
-- (https://api.modal.com:443), `ca_file` (a PEM file of the authorities to trust instead of the
-- system's, for a server with its own), `workdir` (/workspace), `max_lifetime_ms` (24 h), `retries`,
-- `retry_base_ms`, `warm` (sandboxes made ahead for the pool, 0 to 64, none by default: a create
-- with the pool's labels and network 'none', and no image, cpus, memory or ports, takes one, its
-- env going with each command; mayura.sandbox._kit owns the lifecycle).
--
-- Modal's API is gRPC (protobuf over HTTP/2): `mayura.sandbox._grpc` through libcurl, with the
-- messages of the project's proto/modal/*.proto (names and field numbers as Modal publishes them).
-- Every control call carries the token (`x-modal-token-id`, `x-modal-token-secret`) and the short
-- lived auth token AuthTokenGet gives (`x-modal-auth-token`, fetched again before its `exp`), as
-- Modal's own SDKs do. A create is AppGetOrCreate (once), EnvironmentGetOrCreate and
-- ImageGetOrCreate (once per image; ImageJoinStreaming until a build ends), then SandboxCreateV2
-- (the path Modal's SDK takes by default): the image, `timeout_secs` = the lifetime (rounded up to
-- seconds; Modal ends the sandbox then), the workdir, `sleep <lifetime>` as the main process,
-- `resources` (`cpus` as milli-CPUs, `memory_mib` as MiB), the labels as tags, `env` as an
-- ephemeral secret, a name of its own (`mayura-<the create's tag>`: a sandbox whose create answer was lost
-- is found by it, SandboxGetFromNameV2, and terminated), the `ports` as `open_ports` (each served
-- as a tunnel: `url(port)` is its https:// URL), and the network: 'none' is `block_network` with
-- network access BLOCKED, 'all' is OPEN, `{ allow = domains }` is ALLOWLIST with `allowed_domains`.
-- A command service that refuses the JWT is asked for a new one, once.
--
-- Commands go to the sandbox's command service (TaskCommandRouter, at the URL and with the JWT
-- that SandboxCreateV2 or SandboxGetCommandRouterAccess gives; Modal's URL is https:, dialled in
-- the clear only when the server is a loopback http:// one, as Modal's SDK does): one
-- TaskExecStart of `sh -c <script>` per backend script, its standard input by TaskExecStdinWrite
-- (with eof), its stdout read by TaskExecStdioRead to the stream's end, its exit by TaskExecWait
-- (a signal is 128 + n); the last three at once, one failing cancels the others.
-- command_sandbox_backend starts each command in the background, polls it, moves files as base64
-- and kills a command's every process by a tag at its timeout or a cancel.
-- Release is SandboxTerminateV2.
--
-- Failures: a gRPC status is SANDBOX_ERROR with its reason (UNAUTHENTICATED `authentication`,
-- RESOURCE_EXHAUSTED `rate_limited`, UNAVAILABLE `unavailable`, NOT_FOUND of a sandbox's call
-- `gone`, ...), never with Modal's text; no token is in a message. A command that fails is
-- checked with SandboxWaitV2 (timeout 0): a sandbox with a result has ended, and is `gone`.
--
-- Snapshots are Modal's own (`features.snapshots` 'native'): sandbox:snapshot() is the command
-- service's TaskSnapshotFilesystem (the sandbox's filesystem as an image, the sandbox running on;
-- kept by Modal a day, `ttl_seconds`, so one a lost host leaves goes by itself), a create from it
-- starts from that image id, release is ImageDelete (NOT_FOUND: gone already). Modal says no size
-- of it: its size_bytes is 0. Modal lists no snapshots by sandbox: one whose answer was lost stays
-- until its day is over.
--
-- `features`: network { 'none', 'all', 'allowlist' }, ports (as tunnels), stdin true, no desktop,
-- snapshots 'native'.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local grpc = require('mayura.sandbox._grpc')

local M = {}

local API = '/modal.client.ModalClient/'
local ROUTER = '/modal.task_command_router.TaskCommandRouter/'
local DEFAULT_SERVER = 'https://api.modal.com:443'
local DEFAULT_IMAGE = 'debian:bookworm-slim'
local DEFAULT_APP = 'mayura-sandboxes'
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local MAX_COMMAND = 256 * 1024
local STATUS_SUCCESS = 1
local NETWORK_OPEN, NETWORK_BLOCKED, NETWORK_ALLOWLIST = 1, 2, 3
local TOKEN_MARGIN_S = 300           -- an auth token is fetched again this long before its exp
local EXEC_TIMEOUT_MS = 60000        -- one backend script (each is short: the commands run in the background)
M.SNAPSHOT_TTL_S = 86400            -- how long Modal keeps a snapshot's image

-- The `exp` of a JWT (seconds since the epoch), or nil.
local function jwt_exp(token)
  local payload = type(token) == 'string' and token:match('^[^.]+%.([^.]+)%.')
  if not payload then return nil end
  payload = payload:gsub('-', '+'):gsub('_', '/')
  payload = payload .. string.rep('=', (4 - #payload % 4) % 4)
  local text = core.base64.decode(payload)
  local v = text and hosted.decode(text, 8)
  return type(v) == 'table' and type(v.exp) == 'number' and v.exp or nil
end

local function is_loopback_http(url)
  local host = url:match('^http://([^/]+)')
  if not host then return false end
  host = host:gsub(':%d+$', '')
  return host == '127.0.0.1' or host == 'localhost' or host == '[::1]'
end

local function image_option(v, what)
  return check.word(v, '^[%w][%w%._/:@%-]*$', 'modal: ' .. what .. ' is not an image name or id', 'INVALID_CONFIG', 0)
end

local function token_option(v, label, name)
  if type(v) ~= 'string' or v == '' or #v > 256 or v:find('[%c%s]') then
    errors.raise('INVALID_CONFIG', label .. ': ' .. name .. ' is required, a string without blanks', nil, 0)
  end
  return v
end

--- The provider: see the module's comment for the options.
function M.modal_sandboxes(options)
  local opt = kit.options(options, {
    { token_id = token_option }, { token_secret = token_option },
    { app_name = function(v, label)
      v = check.word(v, '^[%w%-_%.]+$', label .. ': app_name is not a valid name', 'INVALID_CONFIG', 0) or DEFAULT_APP
      if #v > 64 then errors.raise('INVALID_CONFIG', label .. ': app_name is longer than 64 bytes', nil, 0) end
      return v
    end },
    { environment = kit.word('^[%w%-_%.]+$', 'a valid name') },
    { image = function(v) return image_option(v, 'image') or DEFAULT_IMAGE end },
    { server_url = function(v, label)
      v = v or DEFAULT_SERVER
      if type(v) ~= 'string' or not v:match('^https?://[%w%.%-%[%]:]+/*$') then
        errors.raise('INVALID_CONFIG', label .. ': server_url must be an http:// or https:// URL of a host and port',
          nil, 0)
      end
      return v
    end },
    { workdir = kit.workdir('/workspace') },
    { max_lifetime_ms = kit.int(60000, nil, DEFAULT_MAX_LIFETIME_MS) },
    { retries = kit.taken }, { retry_base_ms = kit.taken },
    { ca_file = function(v, label)
      if v ~= nil and (type(v) ~= 'string' or v:sub(1, 1) ~= '/' or v:find('%z')) then
        errors.raise('INVALID_CONFIG', label .. ': ca_file must be an absolute path', nil, 0)
      end
      return v
    end },
    kit.WARM_OPTION,
  }, 'modal', 'modal_sandboxes needs an options table with token_id and token_secret')
  local app_name, environment, image = opt.app_name, opt.environment, opt.image
  local workdir, ca_file = opt.workdir, opt.ca_file
  local api = grpc.client({
    label = 'modal', base_url = opt.server_url, secrets = { opt.token_secret, opt.token_id },
    metadata = { ['x-modal-token-id'] = opt.token_id, ['x-modal-token-secret'] = opt.token_secret,
      ['x-modal-client-type'] = '8', ['x-modal-client-version'] = '1.0.0' },
    retries = opt.retries, retry_base_ms = opt.retry_base_ms, ca_file = ca_file,
  })
  local loopback = is_loopback_http(opt.server_url)

  local state = { app_id = nil, builder = nil, images = {}, token = nil, token_refresh = 0 }

  local function control(c)
    if not state.token or os.time() >= state.token_refresh then
      local resp = c:call(API .. 'AuthTokenGet', {}, { idempotent = true })
      if type(resp.token) ~= 'string' or resp.token == '' or resp.token:find('%c') then
        error(errors.sandbox('failed', 'modal: AuthTokenGet gave no token'), 0)
      end
      local now = os.time()
      local exp = jwt_exp(resp.token) or (now + 20 * 60)
      state.token = resp.token
      state.token_refresh = math.min(exp - TOKEN_MARGIN_S, now + math.floor((exp - now) * 3 / 4))
    end
    return c:with({ metadata = { ['x-modal-auth-token'] = state.token }, secrets = { state.token,
      opt.token_secret, opt.token_id } })
  end

  local function app_id(c)
    if not state.app_id then
      local resp = c:call(API .. 'AppGetOrCreate', { app_name = app_name, environment_name = environment,
        object_creation_type = 1 }, { idempotent = true })
      if type(resp.app_id) ~= 'string' or resp.app_id == '' then
        error(errors.sandbox('failed', 'modal: AppGetOrCreate gave no app'), 0)
      end
      state.app_id = resp.app_id
    end
    return state.app_id
  end

  local function image_id(c, name, app)
    if name:match('^im%-[%w]+$') then return name end
    if state.images[name] then return state.images[name] end
    if not state.builder then
      local env = c:call(API .. 'EnvironmentGetOrCreate', { deployment_name = environment }, { idempotent = true })
      state.builder = env.metadata and env.metadata.settings and env.metadata.settings.image_builder_version or ''
    end
    local resp = c:call(API .. 'ImageGetOrCreate', { app_id = app, builder_version = state.builder,
      image = { dockerfile_commands = { 'FROM ' .. name } } }, { idempotent = true })
    local id = resp.image_id
    if type(id) ~= 'string' or id == '' then
      error(errors.sandbox('failed', 'modal: ImageGetOrCreate gave no image'), 0)
    end
    local result = resp.result
    local last = ''
    while not (result and (result.status or 0) ~= 0) do
      for _, item in ipairs(c:call(API .. 'ImageJoinStreaming', { image_id = id, timeout = 55, last_entry_id = last },
          { stream = true, idempotent = true })) do
        if item.entry_id and item.entry_id ~= '' then last = item.entry_id end
        if item.result and (item.result.status or 0) ~= 0 then result = item.result end
      end
    end
    if result.status ~= STATUS_SUCCESS then
      error(errors.sandbox('failed', 'modal: the image ' .. name .. ' did not build'), 0)
    end
    state.images[name] = id
    return id
  end

  local function terminate(ctx, h)
    local ok, err = pcall(function()
      control(ctx.client):call(API .. 'SandboxTerminateV2', { sandbox_id = h.id }, { idempotent = true })
    end)
    if not ok and not (errors.is(err, 'SANDBOX_ERROR') and err.reason == 'not_found') then error(err, 0) end
  end

  return kit.provider({
    id = 'modal', label = 'modal', client = api, options = opt, command = true,
    features = { stdin = true, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' },
    -- a sandbox Modal makes late is looked for now and once more later; its own timeout ends it otherwise
    sweep_after_ms = { 0, 3000 }, sweep_in_background = true,

    create = function(ctx)
      local spec = ctx.spec
      -- the create's calls share one deadline; the sandbox's later calls each have the call timeout,
      -- and an auth token fetched again when it nears its end
      local c = control(ctx.client):with({ deadline_ms = core.hrtime_ms() + ctx.client.call_timeout_ms })
      local app = app_id(c)
      local img
      if spec.snapshot ~= nil then
        -- Modal's own snapshot is an image
        if spec.image ~= nil then
          errors.raise('INVALID_INPUT', 'modal: a snapshot is an image of its own; image cannot be given with it', nil,
            0)
        end
        img = spec.snapshot.id
      else
        img = image_id(c, image_option(spec.image, 'image') or image, app)
      end
      local seconds = hosted.lifetime(spec.lifetime_ms, { unit = 's', max = 24 * 3600 })
      -- the sandbox's name carries the create's tag: what finds one whose answer was lost
      local def = {
        image_id = img, timeout_secs = seconds, workdir = workdir, name = 'mayura-' .. ctx.tag,
        entrypoint_args = { 'sleep', tostring(seconds) },
      }
      if spec.network == 'none' then
        def.block_network = true
        def.network_access = { network_access_type = NETWORK_BLOCKED }
      elseif type(spec.network) == 'table' then
        local domains = {}
        for i, d in ipairs(spec.network.allow) do domains[i] = d end
        def.network_access = { network_access_type = NETWORK_ALLOWLIST, allowed_domains = domains }
      else
        def.network_access = { network_access_type = NETWORK_OPEN }
      end
      if spec.ports and #spec.ports > 0 then
        local list = {}
        for i, p in ipairs(spec.ports) do list[i] = { port = p } end
        def.open_ports = { ports = list }
      end
      if spec.cpus or spec.memory_mib then
        def.resources = { milli_cpu = math.ceil((spec.cpus or 0.125) * 1000),
          memory_mb = math.ceil(spec.memory_mib or 128) }
      end
      local tags = {}
      local labels = hosted.metadata(spec.labels, { max_keys = 10, max_key_bytes = 63, max_value_bytes = 256 })
      for k, v in pairs(labels) do tags[#tags + 1] = { tag_name = k, tag_value = v } end
      table.sort(tags, function(a, b) return a.tag_name < b.tag_name end)
      local req = { app_id = app, definition = def, tags = tags }
      if spec.env and next(spec.env) then
        local env = {}
        for k, v in pairs(spec.env) do env[k] = v end
        req.secret_sources = { { env = { contents = env } } }
      end
      ctx.sent, ctx.create_client = true, c
      local made, resp = pcall(c.call, c, API .. 'SandboxCreateV2', req)
      if not made and spec.snapshot ~= nil and errors.is(resp, 'SANDBOX_ERROR') and resp.reason == 'not_found' then
        error(errors.new('INVALID_INPUT', 'modal: the service no longer has the snapshot'), 0)
      end
      if not made then error(resp, 0) end
      return resp
    end,

    accept = function(ctx, resp)
      return { id = ctx:id_of(resp.sandbox_id, '^[%w%-_]+$', 128, 'no sandbox'), resp = resp }
    end,

    -- only a create that reached SandboxCreateV2 may have made one
    find = function(ctx, tag)
      if not ctx.sent then return {} end
      local found = control(ctx.client):call(API .. 'SandboxGetFromNameV2', { sandbox_name = 'mayura-' .. tag,
        app_name = app_name, environment_name = environment }, { idempotent = true })
      if type(found.sandbox_id) == 'string' and found.sandbox_id ~= '' then return { { id = found.sandbox_id } } end
      return {}
    end,

    backend = function(ctx, h)
      local spec, id, resp, c = ctx.spec, h.id, h.resp, ctx.create_client
      local function later() return control(ctx.client) end
      local task_id = resp.task_id
      if type(task_id) ~= 'string' or task_id == '' then
        local t = c:call(API .. 'SandboxGetTaskIdV2', { sandbox_id = id, timeout = 55, wait_until_ready = true },
          { gone = true, idempotent = true })
        task_id = t.task_id
        if type(task_id) ~= 'string' or task_id == '' then
          error(errors.sandbox('gone', 'modal: the sandbox ended before it started'), 0)
        end
      end
      local access = resp.command_router_access
      local router

      local function connect()
        if not access or (access.url or '') == '' then
          access = later():call(API .. 'SandboxGetCommandRouterAccess', { sandbox_id = id },
            { gone = true, idempotent = true })
        end
        local url = type(access.url) == 'string' and access.url:match('^https://([%w%.%-%[%]:]+)/*$')
        if not url or type(access.jwt) ~= 'string' or access.jwt == '' or access.jwt:find('%c') then
          error(errors.sandbox('failed', 'modal: the command service\'s address is not https:'), 0)
        end
        router = grpc.client({
          label = 'modal', base_url = (loopback and 'http://' or 'https://') .. url,
          metadata = { authorization = 'Bearer ' .. access.jwt },
          secrets = { access.jwt, opt.token_secret }, retries = opt.retries, ca_file = ca_file,
          retry_base_ms = opt.retry_base_ms, call_timeout_ms = c.call_timeout_ms,
        })
      end
      connect()

      local function check_alive()
        local ok, w = pcall(function()
          return later():call(API .. 'SandboxWaitV2', { sandbox_id = id, timeout = 0 }, { gone = true })
        end)
        if ok and type(w) == 'table' and w.result and (w.result.status or 0) ~= 0 then
          error(errors.sandbox('gone', 'modal: the sandbox has ended'), 0)
        end
        if not ok and errors.is(w, 'SANDBOX_ERROR') and w.reason == 'gone' then error(w, 0) end
      end

      -- a call that failed: `gone` where the sandbox has ended, else its own error
      local function fail(res)
        if errors.is(res, 'SANDBOX_ERROR') and res.reason ~= 'gone' and res.reason ~= 'authentication'
            and res.reason ~= 'rate_limited' then
          check_alive()
        end
        error(res, 0)
      end

      -- each port's tunnel: https://host[:port], from the create's answer or SandboxGetTunnelsV2
      local urls = {}
      local function add_tunnels(list)
        for _, tn in ipairs(list or {}) do
          if type(tn.host) == 'string' and tn.host:match('^[%w%.%-]+$') and check.is_int(tn.port)
              and tn.port > 0 and tn.port < 65536 then
            urls[tn.container_port] = 'https://' .. tn.host .. (tn.port ~= 443 and (':' .. tn.port) or '')
          end
        end
      end
      add_tunnels(resp.tunnels)
      for _, p in ipairs(spec.ports or {}) do
        if not urls[p] then
          add_tunnels(c:call(API .. 'SandboxGetTunnelsV2', { sandbox_id = id, timeout = 50 },
            { gone = true, idempotent = true }).tunnels)
          if not urls[p] then
            error(errors.sandbox('failed', 'modal: the service gave port ' .. p .. ' no tunnel'), 0)
          end
        end
      end

      local t = { stdin = true, max_command_bytes = MAX_COMMAND, workdir = workdir }
      function t.url(_, port) return urls[port] end

      -- a snapshot of the filesystem, by the command service (a JWT that expired is fetched again, once)
      local function snapshot_of(o)
        local body = { task_id = task_id, snapshot_id = kit.uuid(), ttl_seconds = M.SNAPSHOT_TTL_S }
        local call_opts = { gone = true, timeout_ms = o and o.timeout_ms, retries = 0 }
        local ok, res = pcall(router.call, router, ROUTER .. 'TaskSnapshotFilesystem', body, call_opts)
        if not ok and errors.is(res, 'SANDBOX_ERROR') and res.reason == 'authentication' then
          access = nil
          connect()
          ok, res = pcall(router.call, router, ROUTER .. 'TaskSnapshotFilesystem', body, call_opts)
        end
        if not ok then fail(res) end
        local img_id = type(res) == 'table' and res.image_id
        if type(img_id) ~= 'string' or not img_id:match('^im%-[%w]+$') or #img_id > 128 then
          error(errors.sandbox('failed', 'modal: TaskSnapshotFilesystem gave no image'), 0)
        end
        return {
          id = img_id, size_bytes = 0,
          release = function(snap)
            if snap._released then return end
            snap._released = true
            local gone_ok, err = pcall(function()
              later():call(API .. 'ImageDelete', { image_id = img_id }, { idempotent = true })
            end)
            if not gone_ok and not (errors.is(err, 'SANDBOX_ERROR') and err.reason == 'not_found') then
              error(err, 0)
            end
          end,
        }
      end
      function t.run(_, command, o)
        local exec_id = kit.uuid()
        local call_opts = { gone = true, signal = o.signal, timeout_ms = math.min(EXEC_TIMEOUT_MS, c.call_timeout_ms) }
        local ok, res = pcall(function()
          local started, err = pcall(router.call, router, ROUTER .. 'TaskExecStart', {
            task_id = task_id, exec_id = exec_id, command_args = { 'sh', '-c', command },
            stdout_config = 1, stderr_config = 0,
          }, call_opts)
          if not started and errors.is(err, 'SANDBOX_ERROR') and err.reason == 'authentication' then
            access = nil   -- the JWT expired: a new one, and the call once more
            connect()
            router:call(ROUTER .. 'TaskExecStart', { task_id = task_id, exec_id = exec_id,
              command_args = { 'sh', '-c', command }, stdout_config = 1, stderr_config = 0 }, call_opts)
          elseif not started then
            error(err, 0)
          end
          -- standard input, the stdout stream and the wait at once, each its own call; one that
          -- fails cancels the others
          local stop = task.cancel_token()
          local unlink = o.signal and o.signal:on_cancel(function() stop:cancel() end)
          local each = { gone = true, signal = stop, timeout_ms = call_opts.timeout_ms }
          local function side(method, body)
            return task.spawn(function()
              local fine, r = pcall(router.call, router, ROUTER .. method, body, each)
              if not fine then stop:cancel() end
              return fine, r
            end)
          end
          local stdin = side('TaskExecStdinWrite', { task_id = task_id, exec_id = exec_id, offset = 0,
            data = o.stdin or '', eof = true })
          local waited = side('TaskExecWait', { task_id = task_id, exec_id = exec_id })
          local read_ok, msgs = pcall(router.call, router, ROUTER .. 'TaskExecStdioRead', { task_id = task_id,
            exec_id = exec_id, offset = 0, file_descriptor = 0 }, { gone = true, signal = stop, stream = true,
            timeout_ms = call_opts.timeout_ms })
          if not read_ok then stop:cancel() end
          local in_ok, in_err = stdin:wait()
          local w_ok, w = waited:wait()
          if unlink then unlink() end
          -- the first real failure (not a cancel this call made), or the caller's cancel
          for _, r in ipairs({ { read_ok, msgs }, { in_ok, in_err }, { w_ok, w } }) do
            if not r[1] and not (errors.is(r[2], 'CANCELLED') and not (o.signal and o.signal.cancelled)) then
              error(r[2], 0)
            end
          end
          for _, r in ipairs({ { read_ok, msgs }, { in_ok, in_err }, { w_ok, w } }) do
            if not r[1] then error(r[2], 0) end
          end
          local parts = {}
          for i, m in ipairs(msgs) do parts[i] = m.data or '' end
          local code = w.code
          if code == nil and w.signal then code = 128 + w.signal end
          if not check.is_int(code) then
            error(errors.sandbox('failed', 'modal: TaskExecWait gave no exit status'), 0)
          end
          return { exit_code = code, stdout = table.concat(parts) }
        end)
        if ok then return res end
        fail(res)
      end
      t.make_workdir = true   -- made with the backend's first command
      local backend = sandbox.command_sandbox_backend('modal-' .. id, t, function() terminate(ctx, h) end)
      function backend.snapshot(_, o) return snapshot_of(o) end
      return backend
    end,

    destroy = terminate,
  })
end

M.sandboxes = M.modal_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
