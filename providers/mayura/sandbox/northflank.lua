--- mayura.sandbox.northflank: sandboxes on Northflank (each one a deployment
-- service, a microVM on Northflank's cloud), through its REST API
-- (`https://api.northflank.com/v1`) and its command-exec endpoint.
--
--   local northflank = require('mayura.sandbox.northflank')
--   local provider = northflank.northflank_sandboxes({ token = token, project_id = 'sandboxes' })
--   local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000,
--     network = { 'all' } })
--
-- Options: `token` (a Northflank API token; required, sent as `Authorization:
-- Bearer` and in the exec calls' `init` message as the service wants it;
-- never read from the environment by this module), `project_id` (required),
-- `team_id` (for a team's project: the paths then start `/v1/teams/<id>`),
-- `api_url` (`https://api.northflank.com`), `exec_region` ('us', the
-- default, 'eu' or 'asia': commands go to `api-exec-<region>` of the API's
-- host) or `exec_url` (another exec host), `image` (`node:22-bookworm`: the
-- image's own command is replaced by `sleep infinity`), `plan` (the
-- deployment plan, `nf-compute-20` by default), `workdir` (`/workspace`, made
-- at create), `max_lifetime_ms` (24 hours), the client's `retries`,
-- `retry_base_ms` and `max_retry_after_ms`, and `warm` (services made ahead
-- for the pool, 0 to 64, none by default: a create with the pool's labels and
-- no image, cpus or memory takes one; mayura.sandbox._kit owns the lifecycle).
--
-- How the contract maps onto the service:
--   * create: `POST .../services/deployment` (a name `mayura-<the create's tag>`, one
--     instance of the image running `sleep infinity`, the create spec's `env`
--     as `runtimeEnvironment`), then the service is polled until its
--     deployment is `COMPLETED`; `FAILED` fails the create (the service is
--     deleted). A create whose answer is lost deletes the service by that
--     name, its id. `cpus` and `memory_mib` are refused (they come with the plan);
--   * commands and files: the whole contract runs on `command_sandbox_backend`
--     over the exec endpoint (`POST <exec host>/exec`, NDJSON: an `init`
--     message with the token and `sh -c <script>` as argv, standard input as
--     base64 `payload` then `stdInEnd`; the answer's `stdOut`/`stdErr` as
--     base64 and the `completion`'s exit code). The exec host speaks HTTP/2
--     alone, as the official client dials it: libcurl asks for HTTP/2 by ALPN
--     over TLS, and with prior knowledge (h2c) to an `http://` exec_url; the
--     request is sent whole (the backend's commands are short and take their
--     standard input at once). Commands start in the background and are polled; a
--     timeout or a cancel kills every process of the command by its tag (the
--     service has no kill message);
--   * network: 'all' only (no egress policy for services); no ports;
--     lifetime: the service has none, so the pool's timer ends a sandbox at
--     its lifetime; release is `DELETE .../services/<id>` with its child objects.
-- Failures are SandboxErrors without the service's text: 401/403 are
-- `authentication`, 404 on a service `gone`, 429 is retried after its
-- `Retry-After` (the service allows 1,000 calls an hour); an exec whose
-- `init` is refused or that ends without a `completion` asks the REST API
-- about the service, and is `gone` when it is, `failed` otherwise.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')

local json, b64 = core.json, core.base64

local M = {}

M.DEFAULT_API_URL = 'https://api.northflank.com'
M.DEFAULT_IMAGE = 'node:22-bookworm'
M.DEFAULT_PLAN = 'nf-compute-20'
M.DEFAULT_WORKDIR = '/workspace'
M.MAX_LIFETIME_MS = 24 * 3600000
M.MAX_COMMAND_BYTES = 65536
local REGIONS = { us = true, eu = true, asia = true }

local function gone(what)
  return errors.sandbox('gone', 'northflank: the sandbox is gone (' .. what .. ')')
end

-- {======================================================
-- The transport: the exec endpoint
-- =======================================================

local Transport = {}
Transport.__index = Transport

-- After an exec that went wrong: `gone` when the REST API says the service is, else `failed`.
function Transport:_why(what)
  local ok, err = pcall(self.owner.get_service, self.owner, self.client, self.service_id)
  if not ok and errors.is(err) then error(err, 0) end
  error(errors.sandbox('failed', 'northflank: ' .. what), 0)
end

function Transport:run(script, o)
  local c = self.exec_client
  local context = {
    projectId = self.owner.project_id, teamId = self.owner.team_id, serviceId = self.service_id,
    command = setmetatable({ 'sh', '-c', script }, json.array_mt), shell = 'none', encoding = 'base64',
  }
  local lines = {
    json.encode({ type = 'init', data = { auth = { type = 'apiToken', apiToken = self.owner.token() },
      context = context } }),
  }
  if o.stdin ~= nil and o.stdin ~= '' then
    lines[#lines + 1] = json.encode({ type = 'payload', data = b64.encode(o.stdin) })
  end
  lines[#lines + 1] = json.encode({ type = 'stdInEnd' })
  local out, authed, completion, refused = {}, false, nil, false
  local ok, err = pcall(c.stream, c, 'POST', '/exec', table.concat(lines, '\n') .. '\n', {
    format = 'ndjson', signal = o.signal, gone = true, idempotent = false,
    headers = { ['Content-Type'] = 'application/x-ndjson', ['X-Target-Key'] = self.service_id .. 'na' },
    on_event = function(msg)
      if type(msg) ~= 'table' then error(c:bad_answer('an exec message that is not an object'), 0) end
      if msg.type == 'init' then
        if type(msg.data) ~= 'table' or msg.data.auth ~= 'successful' then
          refused = true
          return false
        end
        authed = true
      elseif msg.type == 'stdOut' then
        local okd, bytes = pcall(b64.decode, type(msg.data) == 'string' and msg.data or '')
        if not okd then error(c:bad_answer('output that is not base64'), 0) end
        out[#out + 1] = bytes
      elseif msg.type == 'completion' then
        completion = msg.data
        return false
      elseif msg.type == 'error' then
        refused = true
        return false
      end
      return true
    end,
  })
  if not ok then
    if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then error(gone('exec'), 0) end
    error(err, 0)
  end
  if refused or not authed then return self:_why('the service refused a command') end
  if type(completion) ~= 'table' then return self:_why('a command ended without its completion') end
  if not check.is_int(completion.exitCode) then error(c:bad_answer('a completion without an exit code'), 0) end
  return { exit_code = completion.exitCode, stdout = table.concat(out) }
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local function id_option(v, label, name)
  if v == nil then return nil end
  if type(v) ~= 'string' or not v:match('^[%w][%w_%-]*$') or #v > 128 then
    errors.raise('INVALID_CONFIG', label .. ': ' .. name .. ' must be an id (letters, digits, - and _)', nil, 0)
  end
  return v
end

local function url_option(v, label, name)
  if v == nil then return nil end
  if type(v) ~= 'string' or not v:match('^https?://[^/%s@]+$') then
    errors.raise('INVALID_CONFIG', label .. ': ' .. name .. ' must be an http:// or https:// origin (no path)',
      nil, 0)
  end
  return v
end

local function region_option(v, label)
  if v == nil then return 'us' end
  if not REGIONS[v] then
    errors.raise('INVALID_CONFIG', label .. ': exec_region must be \'us\', \'eu\' or \'asia\'', nil, 0)
  end
  return v
end

local Owner = {}
Owner.__index = Owner

function Owner:path(tail)
  local base = '/projects/' .. hosted.escape(self.project_id)
  if self.team_id then base = '/teams/' .. hosted.escape(self.team_id) .. base end
  return '/v1' .. base .. (tail or '')
end

-- The service's deployment status (`PENDING`, `IN_PROGRESS`, `COMPLETED`, `FAILED`); 404 is gone.
function Owner:get_service(c, id)
  local body = c:json('GET', self:path('/services/' .. hosted.escape(id)), nil, { gone = { 404 } })
  if type(body) ~= 'table' or type(body.data) ~= 'table' then error(c:bad_answer('a service that is not one'), 0) end
  local st = body.data.status
  local dep = type(st) == 'table' and type(st.deployment) == 'table' and st.deployment.status or nil
  return type(dep) == 'string' and dep or 'PENDING'
end

function Owner:delete_service(c, id)
  c:json('DELETE', self:path('/services/' .. hosted.escape(id)), nil,
    { query = { delete_child_objects = 'true' }, allow = { 404 } })
end

--- The provider (see the module's comment for `options`).
function M.northflank_sandboxes(options)
  local o = kit.options(options, {
    { token = kit.secret('a token (a string without spaces or control characters)') },
    { project_id = kit.required(id_option) }, { team_id = id_option },
    { api_url = function(v, label, name) return url_option(v or M.DEFAULT_API_URL, label, name) end },
    { exec_region = region_option }, { exec_url = url_option },
    { image = kit.word('^[^%c%s]+$', 'a non-empty string', M.DEFAULT_IMAGE, 512) },
    { plan = kit.word('^[^%c%s]+$', 'a non-empty string', M.DEFAULT_PLAN, 512) },
    { workdir = kit.workdir(M.DEFAULT_WORKDIR) },
    { max_lifetime_ms = kit.int(60000, nil, M.MAX_LIFETIME_MS) },
    kit.RETRY_OPTIONS, kit.WARM_OPTION,
  }, 'northflank', 'options with token and project_id are required')
  local token = o.token
  local owner = setmetatable({ project_id = o.project_id, team_id = o.team_id }, Owner)
  -- the token lives in a closure, out of every table a caller could print
  owner.token = function() return token end
  local exec_url = o.exec_url or o.api_url:gsub('//api%.', '//api-exec-' .. o.exec_region .. '.', 1)
  local workdir = o.workdir
  local function client_for(base, version)
    return hosted.client({ label = 'northflank', base_url = base, http_version = version, api_key = token,
      retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms or 20000 })
  end
  local exec_client = client_for(exec_url, '2')

  -- Northflank's rate is 1,000 requests an hour per account: the provider's sandboxes share a bucket
  -- that keeps them within it (500 at once, then 500 more an hour)
  local RATE = { per_second = 500 / 3600, burst = 500 }
  return kit.provider({
    id = 'northflank', label = 'northflank', client = client_for(o.api_url), options = o, command = true,
    features = { stdin = true, ports = false, desktop = false, network = { 'all' } },
    ready_interval_ms = 100, ready_backoff_max_ms = 2000,

    create = function(ctx)
      local spec = ctx.spec
      if spec.cpus ~= nil or spec.memory_mib ~= nil then
        errors.raise('INVALID_INPUT', 'northflank: cpus and memory_mib come with the deployment plan (option plan)',
          nil, 0)
      end
      -- the service's name carries the create's tag
      return ctx.client:json('POST', owner:path('/services/deployment'), {
        name = 'mayura-' .. ctx.tag,
        billing = { deploymentPlan = o.plan },
        deployment = {
          instances = 1,
          external = { imagePath = spec.image or o.image },
          docker = { configType = 'customCommand', customCommand = 'sleep infinity' },
        },
        runtimeEnvironment = hosted.env_object(spec.env),
      }, {
        on_error = function(status)
          if status == 400 or status == 409 or status == 422 then
            return errors.new('INVALID_INPUT', 'northflank: the service refused the sandbox\'s options (HTTP '
              .. status .. ')')
          end
          return nil
        end,
      })
    end,

    accept = function(ctx, body)
      local data = type(body) == 'table' and type(body.data) == 'table' and body.data or {}
      return { id = ctx:id_of(data.id, '^[%w][%w_%-]*$', 128, 'a service without an id') }
    end,

    -- a service's id is its name: what a lost create made is deleted by it (404 when none was made)
    find = function(_, tag) return { { id = 'mayura-' .. tag } } end,
    sweep_after_ms = { 0, 3000 }, sweep_in_background = true,

    -- its deployment `COMPLETED`; `FAILED` fails the create
    ready = function(ctx, h)
      local status = owner:get_service(ctx.client, h.id)
      if status == 'FAILED' then error(errors.sandbox('failed', 'northflank: the sandbox\'s deployment failed'), 0) end
      return status == 'COMPLETED'
    end,

    backend = function(ctx, h)
      local xc = exec_client
      if ctx.spec.call_timeout_ms then xc = exec_client:with({ call_timeout_ms = ctx.spec.call_timeout_ms }) end
      local transport = setmetatable({
        owner = owner, client = ctx.client, exec_client = xc, service_id = h.id, stdin = true,
        max_command_bytes = M.MAX_COMMAND_BYTES, workdir = workdir, make_workdir = true,
        wait_ms = hosted.wait_ms(xc.call_timeout_ms), rate = RATE,
      }, Transport)
      return sandbox.command_sandbox_backend(h.id, transport, function() owner:delete_service(ctx.client, h.id) end)
    end,

    destroy = function(ctx, h) owner:delete_service(ctx.client, h.id) end,
  })
end

-- }======================================================

M.sandboxes = M.northflank_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
