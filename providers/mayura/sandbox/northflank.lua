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
-- at create), `max_lifetime_ms` (24 hours), and the kit's `retries`,
-- `retry_base_ms` and `max_retry_after_ms`.
--
-- How the contract maps onto the service:
--   * create: `POST .../services/deployment` (a name `mayura-<random>`, one
--     instance of the image running `sleep infinity`, the create spec's `env`
--     as `runtimeEnvironment`), then the service is polled until its
--     deployment is `COMPLETED`; `FAILED` fails the create (the service is
--     deleted). `cpus` and `memory_mib` are refused (they come with the plan);
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
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')

local json, b64 = core.json, core.base64

local M = {}

M.DEFAULT_API_URL = 'https://api.northflank.com'
M.DEFAULT_IMAGE = 'node:22-bookworm'
M.DEFAULT_PLAN = 'nf-compute-20'
M.DEFAULT_WORKDIR = '/workspace'
M.MAX_LIFETIME_MS = 24 * 3600000
M.MAX_COMMAND_BYTES = 65536
local REGIONS = { us = true, eu = true, asia = true }
local POLL_FIRST_MS, POLL_MAX_MS = 100, 2000

local function random_hex(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(n)
  if f then f:close() end
  if not bytes or #bytes ~= n then bytes = tostring(core.hrtime_ms()) .. tostring(math.random()) end
  return (bytes:sub(1, n):gsub('.', function(ch) return ('%02x'):format(ch:byte()) end))
end

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

local option_keys = {
  token = true, project_id = true, team_id = true, api_url = true, exec_region = true, exec_url = true,
  image = true, plan = true, workdir = true, max_lifetime_ms = true, retries = true, retry_base_ms = true,
  max_retry_after_ms = true,
}

local function id_option(v, name)
  if type(v) ~= 'string' or not v:match('^[%w][%w_%-]*$') or #v > 128 then
    errors.raise('INVALID_CONFIG', 'northflank: ' .. name .. ' must be an id (letters, digits, - and _)', nil, 3)
  end
  return v
end

local function url_option(v, name)
  if type(v) ~= 'string' or not v:match('^https?://[^/%s@]+$') then
    errors.raise('INVALID_CONFIG', 'northflank: ' .. name .. ' must be an http:// or https:// origin (no path)',
      nil, 3)
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
  local C = 'INVALID_CONFIG'
  if type(options) ~= 'table' then
    errors.raise(C, 'northflank: options with token and project_id are required', nil, 2)
  end
  check.keys(options, option_keys, 'northflank options', C, 3)
  local token = options.token
  if type(token) ~= 'string' or token == '' or #token > 4096 or token:find('[%c ]') then
    errors.raise(C, 'northflank: token is required (a string without spaces or control characters)', nil, 2)
  end
  local owner = setmetatable({
    project_id = id_option(options.project_id, 'project_id'),
    team_id = options.team_id ~= nil and id_option(options.team_id, 'team_id') or nil,
  }, Owner)
  -- the token lives in a closure, out of every table a caller could print
  owner.token = function() return token end
  local api_url = url_option(options.api_url or M.DEFAULT_API_URL, 'api_url')
  local exec_url = options.exec_url
  if exec_url ~= nil then
    exec_url = url_option(exec_url, 'exec_url')
  else
    local region = options.exec_region or 'us'
    if not REGIONS[region] then
      errors.raise(C, 'northflank: exec_region must be \'us\', \'eu\' or \'asia\'', nil, 2)
    end
    exec_url = api_url:gsub('//api%.', '//api-exec-' .. region .. '.', 1)
  end
  local workdir = hosted.workdir_option(options.workdir or M.DEFAULT_WORKDIR, 'northflank')
  for _, name in ipairs({ 'image', 'plan' }) do
    local v = options[name]
    if v ~= nil and (type(v) ~= 'string' or v == '' or #v > 512 or v:find('[%c%s]')) then
      errors.raise(C, 'northflank: ' .. name .. ' must be a non-empty string', nil, 2)
    end
  end
  local image, plan = options.image or M.DEFAULT_IMAGE, options.plan or M.DEFAULT_PLAN
  local max_lifetime = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 60000, nil, C, 2, M.MAX_LIFETIME_MS)
  local kit = {
    api_key = token, retries = options.retries, retry_base_ms = options.retry_base_ms,
    max_retry_after_ms = options.max_retry_after_ms or 20000,
  }
  local function client_for(label, base, version)
    local o = { label = label, base_url = base, http_version = version }
    for k, v in pairs(kit) do o[k] = v end
    return hosted.client(o)
  end
  local client = client_for('northflank', api_url)
  local exec_client = client_for('northflank', exec_url, '2')

  -- Northflank's rate is 1,000 requests an hour per account: the provider's sandboxes share a bucket
  -- that keeps them within it (500 at once, then 500 more an hour)
  local RATE = { per_second = 500 / 3600, burst = 500 }
  local provider = {
    id = 'northflank',
    features = { stdin = true, ports = false, desktop = false, network = { 'all' } },
    workdir = workdir,
    max_lifetime_ms = max_lifetime,
  }

  function provider.create(_, spec)
    if spec.cpus ~= nil or spec.memory_mib ~= nil then
      errors.raise('INVALID_INPUT', 'northflank: cpus and memory_mib come with the deployment plan (option plan)',
        nil, 2)
    end
    local c, xc = client, exec_client
    if spec.call_timeout_ms then
      c = client:with({ call_timeout_ms = spec.call_timeout_ms })
      xc = exec_client:with({ call_timeout_ms = spec.call_timeout_ms })
    end
    local env = hosted.env_object(spec.env)
    local name = 'mayura-' .. random_hex(6)
    local body = c:json('POST', owner:path('/services/deployment'), {
      name = name,
      billing = { deploymentPlan = plan },
      deployment = {
        instances = 1,
        external = { imagePath = spec.image or image },
        docker = { configType = 'customCommand', customCommand = 'sleep infinity' },
      },
      runtimeEnvironment = env,
    }, {
      on_error = function(status)
        if status == 400 or status == 409 or status == 422 then
          return errors.new('INVALID_INPUT', 'northflank: the service refused the sandbox\'s options (HTTP '
            .. status .. ')')
        end
        return nil
      end,
    })
    if type(body) ~= 'table' or type(body.data) ~= 'table' or type(body.data.id) ~= 'string'
      or not body.data.id:match('^[%w][%w_%-]*$') or #body.data.id > 128 then
      error(c:bad_answer('a service without an id'), 0)
    end
    local id = body.data.id
    return hosted.command_backend('northflank', id, workdir, function() owner:delete_service(c, id) end, function()
      local deadline = core.hrtime_ms() + c.call_timeout_ms
      local wait = POLL_FIRST_MS
      local status = owner:get_service(c, id)
      while status ~= 'COMPLETED' do
        if status == 'FAILED' then
          error(errors.sandbox('failed', 'northflank: the sandbox\'s deployment failed'), 0)
        end
        if core.hrtime_ms() >= deadline then
          error(errors.sandbox('timeout', 'northflank: the sandbox did not start within ' .. c.call_timeout_ms
            .. ' ms'), 0)
        end
        task.sleep(wait)
        wait = math.min(wait * 2, POLL_MAX_MS)
        status = owner:get_service(c, id)
      end
      return setmetatable({
        owner = owner, client = c, exec_client = xc, service_id = id, stdin = true,
        max_command_bytes = M.MAX_COMMAND_BYTES, workdir = workdir, wait_ms = hosted.wait_ms(xc.call_timeout_ms),
        rate = RATE,
      }, Transport)
    end)
  end

  return provider
end

-- }======================================================

M.sandboxes = M.northflank_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
