--- mayura.sandbox.daytona: sandboxes on Daytona (https://www.daytona.io), from a snapshot.
--
--   local daytona = require('mayura.sandbox.daytona')
--   local provider = daytona.daytona_sandboxes({ api_key = key })   -- the key: the caller's to find
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000 })
--
-- Options: `api_key` (required; the library never reads it from the environment),
-- `base_url` (https://app.daytona.io/api), `snapshot` (Daytona's default when
-- nil; a create's `image` names another), `target` (a region), `user` (the OS
-- user of the sandbox), `workdir` (where relative paths and commands start; by
-- default the daemon's own working directory, asked once, with GET /work-dir, of
-- the first sandbox this provider makes), `desktop` (true: every sandbox starts
-- Daytona's computer-use desktop and has `sandbox.desktop`), `max_lifetime_ms`
-- (24 h), `wait_ms` (the longest one execute waits for a command before the next
-- call takes over: 10 s), `retries` and `retry_base_ms` (the kit's, for 429 and 5xx
-- answers), `warm` (sandboxes made ahead for the pool, 0 to 64, none by default: a create with
-- the pool's labels, no image, cpus or memory and the network 'none' takes one (any ports), its env
-- going with each command; mayura.sandbox._kit).
--
-- The control plane (`{base_url}/sandbox`, Bearer key) makes the sandbox:
-- `snapshot`, `env`, `labels`, `networkBlockAll` for 'none', `domainAllowList`
-- for { allow = ... }, `cpu` and `memory` (GiB, rounded up) when asked, and the
-- lifetime in minutes (rounded up) three ways: `ttlMinutes` (wall clock, the
-- sandbox is destroyed at its end), `autoStopInterval` (idle) and
-- `autoDeleteInterval = 0` (deleted once stopped); the pool also releases it at
-- its lifetime. A create that comes back before the sandbox runs is polled
-- (GET /sandbox/{id}) until `started`. Each create carries a label of its own,
-- so that a sandbox whose create answer was lost (a timeout, a cut) is found by
-- that label afterwards and deleted, rather than left running.
--
-- The toolbox (`{toolboxProxyUrl}/{id}`, the same key) does the rest: commands, files, signed
-- preview URLs and the desktop (mayura.sandbox._daytona_toolbox and _daytona_desktop say how).
--
-- Failures: every answer that is not 2xx becomes SANDBOX_ERROR through the kit
-- (`sandbox_http_failure`: 401 authentication, 429 rate_limited with
-- `retry_after_ms`, 5xx unavailable, ...), never with the service's text, and
-- the key is in no message, field or URL. Daytona's proxy answers a toolbox
-- call about a sandbox that is no more with 400, 401 or 5xx rather than 404,
-- so a toolbox failure is checked against the control plane (GET
-- /sandbox/{id}): 404 there, or a state that is not running (destroyed,
-- stopped, archived, error, ...), is SANDBOX_ERROR `gone`.
--
-- Snapshots are Daytona's own (`features.snapshots` 'native'): sandbox:snapshot()
-- is POST /sandbox/{id}/snapshot with a name of its own (`mayura-<random>`; the
-- sandbox is `snapshotting` meanwhile, its toolbox refusing it, and runs on
-- after), waited for until the sandbox is started again and the snapshot
-- (GET /snapshots/{name}) `active`; its size is the service's `size` (GB, as
-- bytes). A create from it names it as its `snapshot`; release is DELETE
-- /snapshots/{id} (404: gone already). A snapshot that ends in `error`, or is
-- not active within the call timeout, or whose answer was lost, is looked up by
-- its name and deleted.
--
-- `features`: stdin true (through a file), ports true, desktop as asked,
-- network { 'none', 'all', 'allowlist' } (domains; organisations on Daytona's
-- lower tiers have egress limits of their own that a sandbox cannot lift),
-- snapshots 'native'.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local toolbox = require('mayura.sandbox._daytona_toolbox')
local daytona_desktop = require('mayura.sandbox._daytona_desktop')

local M = {}

local json = core.json

local MIB = 1048576
local DEFAULT_BASE_URL = 'https://app.daytona.io/api'
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local WAIT_MS = 10000              -- the longest one execute waits for a command (wait_ms)
local MAX_RESPONSE = 512 * MIB + 1 -- the pool's largest max_file_bytes, and one byte to see more
local DOWN = toolbox.DOWN
local STARTING = {
  creating = true, restoring = true, starting = true, pending_build = true, building_snapshot = true,
  pulling_snapshot = true, unknown = true, resuming = true,
}
local failed, service_url = toolbox.failed, toolbox.service_url

-- {======================================================
-- Snapshots
-- =======================================================

local GIB = 1073741824
local SNAPSHOT_POLL_MS = 1000   -- the longest pause between two looks at a snapshot being made

local function snapshot_release(snap)
  if snap._released then return end
  snap._released = true
  snap._api:json('DELETE', '/snapshots/' .. hosted.escape(snap.id), nil, { allow = { 404 } })
end

-- Deletes the snapshot named `name` if the service has it (best effort).
local function drop_snapshot(api, name)
  pcall(function()
    local sn = api:json('GET', '/snapshots/' .. hosted.escape(name), nil, { allow = { 404 } })
    if type(sn) == 'table' and type(sn.id) == 'string' and sn.id ~= '' and not sn.id:find('[/%c]') then
      snapshot_release({ id = sn.id, _api = api })
    end
  end)
end

-- Waits until the sandbox is no longer `snapshotting` and the snapshot `name` is active: the
-- snapshot as the pool holds it. Raises past `deadline` (hrtime ms) or when it failed.
local function wait_snapshot(b, api, name, deadline)
  local pause, sandbox_back = 50, false
  while true do
    if not sandbox_back then
      local sb = api:json('GET', '/sandbox/' .. hosted.escape(b.id), nil, { gone = true })
      local st = type(sb) == 'table' and sb.state
      if DOWN[st] then error(toolbox.gone('daytona: the sandbox is ' .. st), 0) end
      sandbox_back = st ~= 'snapshotting'
    end
    local sn = api:json('GET', '/snapshots/' .. hosted.escape(name))
    if type(sn) ~= 'table' or type(sn.id) ~= 'string' or sn.id == '' or sn.id:find('[/%c]') then
      error(api:bad_answer('a snapshot without an id'), 0)
    end
    if sn.state == 'error' or sn.state == 'build_failed' then error(failed('the snapshot could not be made'), 0) end
    if sandbox_back and sn.state == 'active' then
      local size = tonumber(sn.size)
      if size ~= nil and (size < 0 or size ~= size or size == math.huge) then
        error(api:bad_answer('a snapshot size that is not a size'), 0)
      end
      local bytes = math.ceil((size or 0) * GIB)
      return { id = sn.id, name = name, size_bytes = math.tointeger and math.tointeger(bytes) or bytes, _api = api,
        _released = false, release = snapshot_release }
    end
    if core.hrtime_ms() + pause > deadline then
      error(errors.sandbox('timeout', 'daytona: the snapshot was not made within the call timeout'), 0)
    end
    task.sleep(pause)
    pause = math.min(SNAPSHOT_POLL_MS, pause * 2)
  end
end

--- Daytona's snapshot of a backend's running sandbox: made, waited for, and returned as `{ id, name,
-- size_bytes, release }` (see the module's comment). `o` = { timeout_ms }.
local function snapshot(b, o)
  if b._closed then error(toolbox.gone('daytona: the sandbox was released'), 0) end
  local api = b._api
  local deadline = core.hrtime_ms() + ((o and o.timeout_ms) or api.call_timeout_ms or 120000)
  local name = 'mayura-' .. kit.random_hex(8)
  local made, err = pcall(api.json, api, 'POST', '/sandbox/' .. hosted.escape(b.id) .. '/snapshot',
    { name = name }, { gone = true, retries = 0, timeout_ms = math.max(1, math.floor(deadline - core.hrtime_ms())) })
  if not made then
    if kit.may_have_made(err) then drop_snapshot(api, name) end
    error(err, 0)
  end
  local ok, res = pcall(wait_snapshot, b, api, name, deadline)
  if not ok then
    drop_snapshot(api, name)
    error(res, 0)
  end
  return res
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local CREATE_LABEL = 'mayura-create'   -- Daytona's label of a create: what finds one whose answer was lost

local function name_option(v, _, name)
  if v == nil then return nil end
  if type(v) ~= 'string' or v == '' or #v > 256 or v:find('[%c]') then
    errors.raise('INVALID_CONFIG', 'daytona: ' .. name .. ' must be a non-empty string', nil, 0)
  end
  return v
end

local function workdir_option(v)
  if v ~= nil and (type(v) ~= 'string' or not v:match('^/[%w%._%-/]*$') or #v > 256
      or v:find('/%.%.?/') or v:find('/%.%.?$')) then
    errors.raise('INVALID_CONFIG', 'daytona: workdir must be an absolute path of letters, digits, . _ - and /', nil, 0)
  end
  return v
end

local function key_option(v)
  -- its form is checked by the kit's client, which keeps it out of every message
  if v == nil then errors.raise('INVALID_CONFIG', 'daytona: api_key is required', nil, 0) end
  return v
end

local function taken(v) return v end

--- The provider: see the module's comment for the options.
function M.daytona_sandboxes(options)
  local o = kit.options(options, {
    { api_key = key_option }, { base_url = kit.url(DEFAULT_BASE_URL) }, { workdir = workdir_option },
    { desktop = kit.bool(false) }, { snapshot = name_option }, { target = name_option }, { user = name_option },
    { wait_ms = kit.int(100, 600000, WAIT_MS) },
    { max_lifetime_ms = kit.int(60000, nil, DEFAULT_MAX_LIFETIME_MS) },
    { retries = taken }, { retry_base_ms = taken },
    { warm = kit.int(0, 64, 0) },
  }, 'daytona', 'daytona_sandboxes needs an options table with api_key')
  local api = hosted.client({
    label = 'daytona', base_url = o.base_url, api_key = o.api_key,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_response_bytes = MAX_RESPONSE,
  })
  local secure = o.base_url:match('^https://') ~= nil
  local desktop = o.desktop
  local learned = o.workdir ~= nil

  return kit.provider({
    id = 'daytona', label = 'daytona', client = api, warm = o.warm, warm_ports = true,
    features = { stdin = true, ports = true, desktop = desktop, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' },
    workdir = o.workdir or '/home/daytona', max_lifetime_ms = o.max_lifetime_ms,
    -- a create the service finishes late is looked for now and twice more; one missed still ends at
    -- its ttlMinutes (the waits do not keep a script's loop alive)
    sweep_after_ms = { 0, 2000, 10000 }, sweep_in_background = true,
    ready_interval_ms = 50, ready_backoff_max_ms = 1000,

    create = function(ctx)
      local spec = ctx.spec
      local minutes = hosted.lifetime(spec.lifetime_ms, { unit = 'min' })
      local labels = {}
      for k, v in pairs(spec.labels or {}) do labels[k] = v end
      labels[CREATE_LABEL] = ctx.tag
      local net = spec.network
      local from = spec.image or o.snapshot
      if spec.snapshot ~= nil then
        -- Daytona's own snapshot of a sandbox: the new one starts from it
        if spec.image ~= nil then
          errors.raise('INVALID_INPUT', 'daytona: a snapshot is what the sandbox starts from; image cannot be given '
            .. 'with it', nil, 0)
        end
        from = spec.snapshot.name
      end
      local body = {
        snapshot = from, target = o.target, user = o.user,
        env = kit.object(spec.env),
        labels = hosted.metadata(labels, { max_keys = 64, max_key_bytes = 63, key_pattern = '^[%w][%w%._/%-]*$' }),
        public = false,
        networkBlockAll = net == 'none',
        domainAllowList = type(net) == 'table' and table.concat(net.allow, ',') or nil,
        ttlMinutes = minutes, autoStopInterval = minutes, autoDeleteInterval = 0,
      }
      if spec.cpus then body.cpu = math.ceil(spec.cpus) end
      if spec.memory_mib then body.memory = math.ceil(spec.memory_mib / 1024) end
      return ctx.client:json('POST', '/sandbox', body, { on_error = spec.snapshot and function(status)
        if status == 404 then return errors.new('INVALID_INPUT', 'daytona: the service no longer has the snapshot') end
        return nil
      end or nil })
    end,

    accept = function(ctx, sb)
      if type(sb) ~= 'table' or type(sb.id) ~= 'string' or not sb.id:match('^[%w%._%-]+$') or #sb.id > 128 then
        error(ctx.client:bad_answer('a sandbox without an id'), 0)
      end
      return { id = sb.id, sb = sb }
    end,

    find = function(_, tag)
      local body = api:json('GET', '/sandbox', nil, {
        query = { labels = json.encode(kit.object({ [CREATE_LABEL] = tag })) },
      })
      local found = {}
      local items = type(body) == 'table' and (body.items or body) or {}
      for _, s in ipairs(type(items) == 'table' and items or {}) do
        if type(s) == 'table' and type(s.id) == 'string' and type(s.labels) == 'table'
          and s.labels[CREATE_LABEL] == tag then
          found[#found + 1] = { id = s.id }
        end
      end
      return found
    end,

    -- until it runs: the create's answer first, then GET /sandbox/{id}
    ready = function(ctx, h)
      if h.polled then
        h.sb = ctx.client:json('GET', '/sandbox/' .. hosted.escape(h.id), nil, { gone = true })
        if type(h.sb) ~= 'table' then error(ctx.client:bad_answer('a sandbox that is not an object'), 0) end
      end
      h.polled = true
      local state = h.sb.state
      if state == 'started' then return true end
      if not STARTING[state] and state ~= nil then
        error(failed('the sandbox did not start (' .. (DOWN[state] and state or 'an unknown state') .. ')'), 0)
      end
      return false
    end,

    backend = function(ctx, h)
      local c, id, p = ctx.client, h.id, ctx.provider
      local self = toolbox.new({
        id = id, _api = c, _wait_ms = o.wait_ms, _expires_at = ctx.started + ctx.spec.lifetime_ms, _env = {},
      })
      self.snapshot = snapshot
      local proxy = service_url(h.sb.toolboxProxyUrl)
      if not proxy or (secure and not proxy:match('^https://')) then
        error(c:bad_answer('a toolbox URL that is not ' .. (secure and 'https' or 'http(s)')), 0)
      end
      self._tb = c:with({ base_url = proxy:gsub('/+$', '') .. '/' .. hosted.escape(id) })
      if desktop then self.desktop = daytona_desktop.start(self) end
      if not learned then
        local dir = self:_toolbox('json', 'GET', '/work-dir')
        local d = type(dir) == 'table' and dir.dir
        if type(d) ~= 'string' or not d:match('^/[%w%._%-/]*$') or #d > 256 then
          error(c:bad_answer('a working directory that is not a plain absolute path'), 0)
        end
        d = d:gsub('(.)/+$', '%1')
        if not learned then p.workdir, learned = d, true end
      end
      self._workdir = p.workdir
      return self
    end,

    destroy = function(ctx, h)
      ctx.client:json('DELETE', '/sandbox/' .. hosted.escape(h.id), nil, { allow = { 404 } })
    end,

    -- a warm sandbox given to a create: its env goes with every command; Daytona is told the asked
    -- lifetime (its ttl and idle stop), and its signed URLs last that long
    hand_out = function(_, backend, spec)
      for k, v in pairs(spec.env or {}) do backend._env[k] = v end
      local minutes = hosted.lifetime(spec.lifetime_ms, { unit = 'min' })
      for _, field in ipairs({ 'ttl', 'autostop' }) do
        backend._api:json('POST', '/sandbox/' .. hosted.escape(backend.id) .. '/' .. field .. '/' .. minutes, nil,
          { gone = true })
      end
      backend._expires_at = core.hrtime_ms() + spec.lifetime_ms
    end,
  })
end

-- }======================================================

M.sandboxes = M.daytona_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
