--- mayura.sandbox._e2b: what the E2B providers share (mayura.sandbox.e2b and
-- mayura.sandbox.e2b_desktop): E2B's control plane and the envd data plane of
-- each sandbox (mayura.sandbox._e2b_envd), over the hosted kit (mayura.sandbox._kit, its HTTP
-- mayura.sandbox._hosted).
--
-- Control plane (`api_url`, https://api.<domain> by default; the key in
-- X-API-Key): POST /v2/sandboxes makes a sandbox from the template with
-- `timeout` = the lifetime in seconds (rounded up), `metadata` = the labels,
-- `envVars` = the sandbox's env and the network (every sandbox made so is
-- secured: envd wants the access token the answer holds): 'none' is allow_internet_access false,
-- 'all' true, { allow = ... } is allowOut with those domains and denyOut
-- 0.0.0.0/0 (E2B filters domains on ports 80 and 443). DELETE
-- /sandboxes/{id} ends it (404: it ended already).
--
-- Data plane: envd in each sandbox (mayura.sandbox._e2b_envd).
--
-- Snapshots (mayura.sandbox.e2b says 'native'): POST /sandboxes/{id}/snapshots (the sandbox is
-- paused while it is made) answers a snapshot ID, which POST /v2/sandboxes takes as its
-- templateID and DELETE /templates/{id} deletes (404: gone already). The answer holds no size:
-- size_bytes is 0. A snapshot call whose answer was lost (a timeout, a cut, a 5xx, no usable ID)
-- lists GET /snapshots?sandboxID= and deletes what this backend did not make.
--
-- Failures are SANDBOX_ERROR with the kit's reasons, never the service's text:
-- 401/403 authentication, 404 on the control plane and 502 from the sandbox's
-- proxy `gone` (a command's stream cut midway, or envd's `unavailable`, asks
-- the control plane: 404 there is `gone` too), 429 rate_limited (after the
-- kit's retries, honouring retry-after), 5xx unavailable, no answer in time
-- `timeout`. Templates with envd before 0.4.0 get the user `user` named. A create that
-- timed out or was cut may still have made a sandbox: the kit then looks
-- for it by a label of its own (`mayura.create`) and kills it.
--
-- `M.config(options, defaults, extra_keys)` checks the options;
-- `M.provider(config, spec)` builds the provider table; a backend offers,
-- besides the pool's calls, `shell(command, opts)` (a command string run as
-- the official SDK runs it, `/bin/bash -l -c`) and `background(command)` (the
-- same, left running once it started), which the desktop uses.
local core = require('mayura.core')
local errors = require('mayura.errors')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local envd = require('mayura.sandbox._e2b_envd')

local M = {}

local json, b64 = core.json, core.base64

M.ENVD_PORT = 49983
M.DEFAULT_DOMAIN = 'e2b.app'
M.MAX_LIFETIME_MS = 24 * 3600000            -- E2B Pro; Hobby allows an hour
local KILL_TIMEOUT_MS = envd.KILL_TIMEOUT_MS
local version_at_least = envd.version_at_least
local object, array = kit.object, kit.array

-- {======================================================
-- Options
-- =======================================================

local function domain_option(v, label)
  if v == nil then return M.DEFAULT_DOMAIN end
  if type(v) ~= 'string' or not v:match('^[%w][%w%.%-]*%w$') or v:find('..', 1, true) or #v > 200 then
    errors.raise('INVALID_CONFIG', label .. ': domain must be a domain name such as e2b.app', nil, 0)
  end
  return v:lower()
end

local function workdir_option(v, label)
  if v == nil then return '/home/user' end
  if type(v) ~= 'string' or v:sub(1, 1) ~= '/' or #v > 1024 or v:find('%z') then
    errors.raise('INVALID_CONFIG', label .. ': workdir must be an absolute path', nil, 0)
  end
  return v
end

local function taken(v) return v end

--- Checks the options of an E2B provider: `defaults` = { template, label };
-- `extra_keys` the provider's own options, name -> a kit checker (or true: checked by it). Returns
-- the config.
function M.config(options, defaults, extra_keys)
  local declared = {
    -- the library reads no environment: the key comes from the caller
    { api_key = kit.secret('the E2B API key (a string without spaces)') },
    { template = kit.word('^[%w][%w_%.:/%-]*$', 'a template ID or alias', defaults.template) },
    { domain = domain_option },
    { api_url = kit.url() },
    { sandbox_url = kit.url() },
    { workdir = workdir_option },
    -- every sandbox of POST /v2/sandboxes is secured: `secure` is taken, as by the SDK, and changes nothing
    { secure = kit.bool() },
    { max_lifetime_ms = kit.int(1000, 30 * 86400000, M.MAX_LIFETIME_MS) },
    { retries = kit.int(0, 10, 2) },
    { retry_base_ms = kit.int(0, 60000, 200) },
    { warm = kit.int(0, 64, 0) },
  }
  for k, checker in pairs(extra_keys or {}) do
    declared[#declared + 1] = { [k] = type(checker) == 'function' and checker or taken }
  end
  local config = kit.options(options, declared, defaults.label, 'options with api_key are required')
  config.label = defaults.label
  config.api_url = config.api_url or ('https://api.' .. config.domain)
  return config
end

-- }======================================================

-- {======================================================
-- Snapshots
-- =======================================================

local SNAPSHOT_ID = '^[%w][%w_%.:/%-]*$'

local function snapshot_release(snap)
  if snap._released then return end
  snap._released = true
  -- 404: it is gone already, which is what release wants
  snap._client:json('DELETE', '/templates/' .. hosted.escape(snap.id), nil,
    { allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS })
end

-- A snapshot of the service's, as the pool holds it: E2B says no size (see the module's comment).
local function native_snapshot(client, id)
  return { id = id, size_bytes = 0, _client = client, _released = false, release = snapshot_release }
end

-- The snapshots of the sandbox on the service that its backend does not know (those of a call whose
-- answer was lost), deleted; best effort.
local function sweep_snapshots(b)
  pcall(function()
    local list = b.client:json('GET', '/snapshots', nil, { query = { sandboxID = b.id }, timeout_ms = KILL_TIMEOUT_MS })
    for _, s in ipairs(type(list) == 'table' and list or {}) do
      local id = type(s) == 'table' and s.snapshotID
      if type(id) == 'string' and id:match(SNAPSHOT_ID) and not b._snapshots[id] then
        pcall(snapshot_release, native_snapshot(b.client, id))
      end
    end
  end)
end

--- A backend's snapshot on the service (POST /sandboxes/{id}/snapshots): the sandbox is paused while
-- it is made and runs on after. `o` = { timeout_ms }. A call that failed in a way that may have made
-- one looks for it by the sandbox's ID and deletes it.
local function snapshot(b, o)
  if b._released then error(errors.sandbox('gone', b._label .. ': the sandbox was released'), 0) end
  b._snapshotting = (b._snapshotting or 0) + 1
  local ok, res = pcall(b.client.json, b.client, 'POST', '/sandboxes/' .. hosted.escape(b.id) .. '/snapshots',
    object({}), { gone = { 404 }, timeout_ms = o and o.timeout_ms, retries = 0 })
  b._snapshotting = b._snapshotting - 1
  local id = ok and type(res) == 'table' and res.snapshotID or nil
  if type(id) == 'string' and id:match(SNAPSHOT_ID) and #id <= 512 then
    b._snapshots[id] = true
    return native_snapshot(b.client, id)
  end
  -- no usable answer: what the call made (if anything) goes, unless another call of ours is under way
  if (ok or kit.may_have_made(res)) and b._snapshotting == 0 then sweep_snapshots(b) end
  if not ok then error(res, 0) end
  error(errors.sandbox('failed', b._label .. ': the service answered the snapshot with no usable ID'), 0)
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local function create_error(status)
  if status == 400 then
    return errors.new('INVALID_INPUT', 'e2b: the service refused the sandbox\'s options (HTTP 400)')
  end
  if status == 404 then
    return errors.new('INVALID_CONFIG', 'e2b: the service knows no such template (HTTP 404)')
  end
  return nil
end

local function network_body(body, network)
  if network == 'none' or network == nil then
    body.allow_internet_access = false
  elseif network == 'all' then
    body.allow_internet_access = true
  else
    local allow = {}
    for i, d in ipairs(network.allow) do allow[i] = d end
    body.network = { allowOut = array(allow), denyOut = array({ '0.0.0.0/0' }) }
  end
end

--- The provider table for `create_sandboxes`: `config` from M.config, `spec` = { id, features,
-- env (added to every sandbox's env), after_create(backend) (may raise: the sandbox is then
-- killed) }. Its lifecycle is the kit's (mayura.sandbox._kit); what follows is E2B's translation.
function M.provider(config, spec)
  local label = config.label
  local client = hosted.client({
    label = label, base_url = config.api_url, api_key = config.api_key, auth_header = 'X-API-Key',
    retries = config.retries, retry_base_ms = config.retry_base_ms,
  })
  local function destroy(ctx, h)
    -- 404: it ended already, which is what release wants
    ctx.client:json('DELETE', '/sandboxes/' .. hosted.escape(h.id), nil,
      { allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS })
  end
  return kit.provider({
    id = spec.id, label = label, features = spec.features, workdir = config.workdir,
    max_lifetime_ms = config.max_lifetime_ms, client = client, warm = config.warm, warm_ports = true,
    warm_desktop = spec.features.desktop,
    fields = { config = config, client = client },

    create = function(ctx)
      local s = ctx.spec
      if s.cpus ~= nil or s.memory_mib ~= nil then
        errors.raise('INVALID_INPUT', label .. ': CPUs and memory come with the template; cpus and memory_mib '
          .. 'cannot be set per sandbox', nil, 0)
      end
      local timeout_s = hosted.lifetime(s.lifetime_ms, { unit = 's', max = math.ceil(config.max_lifetime_ms / 1000) })
      local metadata = hosted.metadata(s.labels, { max_keys = 63 })
      metadata[kit.TAG_LABEL] = ctx.tag
      local env = {}
      for k, v in pairs(spec.env or {}) do env[k] = v end
      for k, v in pairs(s.env or {}) do env[k] = v end
      local template = s.image or config.template
      if s.snapshot ~= nil then
        -- a snapshot of the service's is a template of its own
        if s.image ~= nil then
          errors.raise('INVALID_INPUT', label .. ': a snapshot brings its own template; image cannot be given with it',
            nil, 0)
        end
        template = s.snapshot.id
      end
      local body = {
        templateID = template, timeout = timeout_s, metadata = metadata, envVars = object(env),
      }
      network_body(body, s.network)
      return ctx.client:json('POST', '/v2/sandboxes', body, { on_error = function(status)
        if status == 404 and s.snapshot ~= nil then
          return errors.new('INVALID_INPUT', label .. ': the service no longer has the snapshot (HTTP 404)')
        end
        return create_error(status)
      end })
    end,

    accept = function(ctx, res)
      if type(res) ~= 'table' or type(res.sandboxID) ~= 'string' or not res.sandboxID:match('^[%w_%-]+$')
        or #res.sandboxID > 128 then
        error(ctx:bad_answer('no usable sandbox id'), 0)
      end
      local token = res.envdAccessToken
      if token == json.null then token = nil end
      if token ~= nil and (type(token) ~= 'string' or token == '' or #token > 4096 or token:find('[%c ]')) then
        error(ctx:bad_answer('an access token that is not usable'), 0)
      end
      if token == nil then error(ctx:bad_answer('no access token'), 0) end
      local domain = config.domain
      if type(res.domain) == 'string' and res.domain:match('^[%w][%w%.%-]*%w$') and not res.domain:find('..', 1, true)
        then
        domain = res.domain:lower()
      end
      return { id = res.sandboxID, token = token, domain = domain,
        envd_version = type(res.envdVersion) == 'string' and res.envdVersion or '0.0.0' }
    end,

    find = function(ctx, tag)
      local q = hosted.query({ metadata = kit.TAG_LABEL .. '=' .. tag })
      local list = ctx.client:json('GET', '/v2/sandboxes' .. q, nil, { timeout_ms = KILL_TIMEOUT_MS })
      local found = {}
      for _, s in ipairs(type(list) == 'table' and list or {}) do
        if type(s) == 'table' and type(s.sandboxID) == 'string' and s.sandboxID ~= '' then
          found[#found + 1] = { id = s.sandboxID }
        end
      end
      return found
    end,

    destroy = destroy,

    backend = function(ctx, h)
      local c = ctx.client
      local envd_url = config.sandbox_url or string.format('https://%d-%s.%s', M.ENVD_PORT, h.id, h.domain)
      local envd_headers = { ['E2b-Sandbox-Id'] = h.id, ['E2b-Sandbox-Port'] = tostring(M.ENVD_PORT) }
      -- before envd 0.4.0 there is no default user: name the templates' own, 'user'
      if not version_at_least(h.envd_version, '0.4.0') then
        envd_headers.Authorization = 'Basic ' .. b64.encode('user:')
      end
      local envd_client = hosted.client({
        label = label, base_url = envd_url, api_key = h.token, auth_header = 'X-Access-Token', auth_prefix = '',
        headers = envd_headers,
        call_timeout_ms = c.call_timeout_ms, retries = config.retries, retry_base_ms = config.retry_base_ms,
        secrets = { config.api_key },
      })
      local backend = envd.new({
        id = h.id, client = c, envd = envd_client, domain = h.domain, envd_version = h.envd_version, _label = label,
      })
      backend._snapshots, backend.snapshot = {}, snapshot
      if spec.after_create then spec.after_create(backend) end
      return backend
    end,

    -- a warm sandbox given to a create: the create's env goes with every command, its lifetime to E2B
    hand_out = function(_, backend, s)
      for k, v in pairs(s.env or {}) do backend._env[k] = v end
      local timeout_s = hosted.lifetime(s.lifetime_ms, { unit = 's', max = math.ceil(config.max_lifetime_ms / 1000) })
      backend.client:json('POST', '/sandboxes/' .. hosted.escape(backend.id) .. '/timeout', { timeout = timeout_s },
        { gone = true })
    end,
  })
end

-- }======================================================

return M
