--- mayura.sandbox._kit: the lifecycle every hosted provider shares.
--
-- A hosted provider is a declaration plus translation. The kit owns what every one of them does
-- the same way: options checked from a declared table, create, wait until ready, build the
-- backend, destroy on a failed create, find by its label a create whose answer was lost, warm
-- sandboxes, release. A provider file holds its service's endpoints, its translation and what is
-- truly its own (the HTTP, retries and streams are mayura.sandbox._hosted's).
--
--   local kit = require('mayura.sandbox._kit')
--   local o = kit.options(options, {
--     { api_key = kit.secret('the API key (a string without spaces)') },
--     { image = kit.word('^[%w][%w%._/:@%-]*$', 'an image reference', 'node:22') },
--     { max_lifetime_ms = kit.int(60000, nil, 3600000) },
--   }, 'fly')
--   return kit.provider({
--     id = 'fly', label = 'fly', features = {...}, workdir = '/workspace', max_lifetime_ms = o.max_lifetime_ms,
--     client = api,                     -- a _hosted client: ctx.client is it with the pool's call timeout
--     warm = o.warm,                    -- warm sandboxes (0: none); or options = o for all three
--     create = function(ctx) ... end,   -- POSTs the create (labels + kit.TAG_LABEL = ctx.tag); the answer
--     accept = function(ctx, answer) return handle end,   -- checks it (ctx:id_of, ctx:bad_answer)
--     find = function(ctx, tag) return { handle, ... } end,  -- what a lost create of `tag` made
--     ready = function(ctx, handle, left_ms) return true end, -- optional: polled until true
--     backend = function(ctx, handle) return backend end,    -- the pool's backend over it
--     destroy = function(ctx, handle) end,                    -- ends it (gone already is fine)
--     hand_out = function(p, backend, spec) end,              -- a warm one given to `spec`
--     warm_up = function(backend) end,                        -- optional: run on a warm one once made
--     command = true,   -- the backend is on command_sandbox_backend: warm_up and hand_out are the
--                       -- kit's command_probe and command_probe_hand_out unless given
--   })
--
-- A create (`p:create(spec)`): `ctx` = { provider, spec, tag (16 hex digits), client, started
-- (hrtime ms), label }; `create(ctx)` makes the sandbox and returns the service's answer, `accept`
-- turns it into a handle. A create that failed in a way that may have made a sandbox (a timeout,
-- no connection, a 5xx, or a bad answer) is swept: `find(ctx, tag)` lists what carries the tag and
-- each is destroyed (`sweep_after_ms`, default { 0 }: when to look, and `sweep_in_background`);
-- the caller gets the first error. Then `ready` is polled every `ready_interval_ms` (500; doubled
-- after each poll up to `ready_backoff_max_ms`) until it says true or the call timeout passes
-- (SANDBOX_ERROR `timeout`), and `backend` builds the
-- backend; where either raises, the sandbox is destroyed and the error goes on (an uncoded one as
-- SANDBOX_ERROR `failed`).
--
-- Warm sandboxes (`warm = n`, mayura.sandbox._warm and the pool's protocol): n sandboxes made
-- ahead with the pool's labels and lifetime, network `warm_network` (the provider's 'none' when it
-- has it, else its first kind); a create asking for that network, the pool's labels and no image,
-- cpus, memory, desktop (unless `warm_desktop`: every sandbox has one) or ports (unless
-- `warm_ports`) claims one, and `hand_out(p, backend, spec)` gives it the asked env and lifetime
-- (the kit's `command_hand_out` does it for a backend on command_sandbox_backend,
-- `command_probe_hand_out` after a probe); one the service says is gone there gives way to a cold
-- create; `warm_up(backend)` runs on each once made. They take slots of the pool's max_sandboxes
-- and end with its close.
--
-- How to move a provider onto the kit:
--   1. its options: one `kit.options` table (kit.secret, kit.word, kit.url, kit.int, kit.bool,
--      kit.workdir, kit.required, kit.taken, kit.RETRY_OPTIONS, or a function(value, label, name)
--      -> value for what is its own); add kit.WARM_OPTION;
--   2. its create: split the POST (`create`), the answer's check (`accept`, raising through
--      ctx:bad_answer), the list by label (`find`), the wait (`ready`, one poll a call), the backend
--      (`backend`) and the DELETE (`destroy`); delete its random_hex, object, ready loop and
--      pcall-destroy tail (kit.random_hex, kit.object, kit.array are here);
--   3. `hand_out`: how a warm sandbox takes a create's env and lifetime;
--   4. run its provider, fault and example specs, and spec/providers/warm_hosted_spec.lua.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local host = require('mayura.sandbox._host')
local hosted = require('mayura.sandbox._hosted')
local warm = require('mayura.sandbox._warm')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local json = core.json
local C = 'INVALID_CONFIG'

--- The label that finds a sandbox whose create answer was lost.
M.TAG_LABEL = 'mayura.create'

-- {======================================================
-- Helpers
-- =======================================================

--- `n` random bytes as hex.
M.random_hex = host.random_hex

--- A random UUID (version 4).
function M.uuid()
  local h = M.random_hex(16)
  return h:sub(1, 8) .. '-' .. h:sub(9, 12) .. '-4' .. h:sub(14, 16) .. '-a' .. h:sub(18, 20) .. '-' .. h:sub(21, 32)
end

--- A copy of `t` (or an empty table) that goes on the wire as a JSON object.
function M.object(t)
  local o = setmetatable({}, json.object_mt)
  for k, v in pairs(t or {}) do o[k] = v end
  return o
end

--- `t` (or an empty table) marked to go on the wire as a JSON list.
function M.array(t)
  return setmetatable(t or {}, json.array_mt)
end

--- Whether a create that failed with `err` may have made a sandbox whose answer never came (or
-- came unreadable): no answer in time, no connection, a 5xx, or a failure without a status.
function M.may_have_made(err)
  if not errors.is(err, 'SANDBOX_ERROR') then return false end
  if err.reason == 'timeout' or err.reason == 'unavailable' or err.status == nil then return true end
  return type(err.status) == 'number' and err.status >= 500
end

-- }======================================================

-- {======================================================
-- Options from a declared table
-- =======================================================

--- Checks `options` against `declared`, a list of `{ name = checker }` (in the order they are
-- checked); a checker is `function(value, label, name) -> value` raising INVALID_CONFIG. An
-- unknown name, or options that are not a table (`missing`: what to say then), raise too.
-- Returns the checked values by name.
function M.options(options, declared, label, missing)
  if type(options) ~= 'table' then
    errors.raise(C, label .. ': ' .. (missing or 'an options table is required'), nil, 0)
  end
  local known = {}
  for _, entry in ipairs(declared) do
    for k in pairs(entry) do known[k] = true end
  end
  for k in pairs(options) do
    if not known[k] then errors.raise(C, 'unknown option ' .. tostring(k) .. ' in ' .. label .. ' options', nil, 0) end
  end
  local out = {}
  for _, entry in ipairs(declared) do
    for name, checker in pairs(entry) do out[name] = checker(options[name], label, name) end
  end
  return out
end

--- A whole number in [lo, hi] (either may be nil), `default` when not given.
function M.int(lo, hi, default)
  return function(v, _, name) return check.int(v, name, lo, hi, C, 0, default) end
end

--- A required secret: a non-empty string of at most 4096 bytes without spaces or control characters.
function M.secret(what)
  return function(v, label, name)
    if type(v) ~= 'string' or v == '' or #v > 4096 or v:find('[%c ]') then
      errors.raise(C, label .. ': ' .. name .. ' must be ' .. what, nil, 0)
    end
    return v
  end
end

--- An optional string matching `pattern` (at most `max` bytes, 256), `default` when not given.
function M.word(pattern, what, default, max)
  return function(v, label, name)
    if v == nil then return default end
    if type(v) ~= 'string' or v == '' or #v > (max or 256) or not v:match(pattern) then
      errors.raise(C, label .. ': ' .. name .. ' must be ' .. what, nil, 0)
    end
    return v
  end
end

--- An optional http:// or https:// URL without credentials, trailing slashes dropped.
function M.url(default)
  return function(v, label, name)
    if v == nil then return default end
    if type(v) ~= 'string' or not v:match('^https?://[^%s/@]+[^%s@]*$') or v:find('%c') then
      errors.raise(C, label .. ': ' .. name .. ' must be an http:// or https:// URL without credentials', nil, 0)
    end
    return (v:gsub('/+$', ''))
  end
end

--- An optional boolean.
function M.bool(default)
  return function(v, label, name)
    if v == nil then return default end
    if type(v) ~= 'boolean' then errors.raise(C, label .. ': ' .. name .. ' must be a boolean', nil, 0) end
    return v
  end
end

--- An option taken as it is: what uses it checks it (the HTTP client its retries, say).
function M.taken(v) return v end

--- An option that must be given, then checked by `checker` (kit.taken when nil).
function M.required(checker)
  checker = checker or M.taken
  return function(v, label, name)
    if v == nil then errors.raise(C, label .. ': ' .. name .. ' is required', nil, 0) end
    return checker(v, label, name)
  end
end

--- An absolute `workdir` (mayura.sandbox._hosted.workdir_option), `default` when not given.
function M.workdir(default)
  return function(v, label) return hosted.workdir_option(v or default, label) end
end

--- Entries of a kit.options table: the HTTP client's retry options (mayura.sandbox._hosted checks
-- them), and `warm`, how many sandboxes are made ahead for the pool (0 to 64, none by default).
M.RETRY_OPTIONS = { retries = M.taken, retry_base_ms = M.taken, max_retry_after_ms = M.taken }
M.WARM_OPTION = { warm = M.int(0, 64, 0) }

-- }======================================================

-- {======================================================
-- The lifecycle
-- =======================================================

local Ctx = {}
Ctx.__index = Ctx

--- The error of a create whose answer cannot be used: what it made is swept.
function Ctx:bad_answer(what)
  self.answered = true
  return errors.sandbox('failed', self.label .. ': the service answered the create with ' .. what)
end

--- `v` where it is an id the service may have given: a string matching `pattern`, at most `max`
-- bytes; else the error of a bad answer (saying `what` came).
function Ctx:id_of(v, pattern, max, what)
  if type(v) ~= 'string' or not v:match(pattern) or #v > max then error(self:bad_answer(what), 0) end
  return v
end

local function new_ctx(p, d, spec)
  local c = d.client
  if c and spec.call_timeout_ms then c = c:with({ call_timeout_ms = spec.call_timeout_ms }) end
  local timeout = (c and c.call_timeout_ms) or spec.call_timeout_ms or 120000
  return setmetatable({
    provider = p, spec = spec, tag = M.random_hex(8), client = c, label = d.label,
    started = core.hrtime_ms(), timeout_ms = timeout,
  }, Ctx)
end

-- Destroys what a lost create of `ctx.tag` made (best effort).
local function sweep(d, ctx)
  if not d.find then return end
  local function once()
    pcall(function()
      for _, h in ipairs(d.find(ctx, ctx.tag) or {}) do pcall(d.destroy, ctx, h) end
    end)
  end
  local waits = d.sweep_after_ms or { 0 }
  local function all()
    for _, wait in ipairs(waits) do
      if wait > 0 then task.await(function(done) task.after(wait, done, true) end) end
      once()
    end
  end
  if d.sweep_in_background then task.spawn(all) else all() end
end

local function wait_ready(d, ctx, handle)
  local interval = d.ready_interval_ms or 500
  local max = d.ready_backoff_max_ms or interval
  while true do
    local left = ctx.started + ctx.timeout_ms - core.hrtime_ms()
    if left <= 0 then
      error(errors.sandbox('timeout', d.label .. ': the sandbox did not start within ' .. ctx.timeout_ms .. ' ms'), 0)
    end
    if d.ready(ctx, handle, left) then return end
    if interval > 0 then
      local pause = math.ceil(math.min(interval, math.max(1, ctx.started + ctx.timeout_ms - core.hrtime_ms())))
      task.await(function(done) task.after(pause, done, true) end)
      interval = math.min(interval * 2, max)
    end
  end
end

-- A cold create: the whole lifecycle up to a backend.
local function cold(p, d, spec)
  local ctx = new_ctx(p, d, spec)
  local ok, handle = pcall(function() return d.accept(ctx, d.create(ctx)) end)
  if not ok then
    if ctx.answered or M.may_have_made(handle) then sweep(d, ctx) end
    error(handle, 0)
  end
  local built, backend = pcall(function()
    if d.ready then wait_ready(d, ctx, handle) end
    return d.backend(ctx, handle)
  end)
  if not built then
    pcall(d.destroy, ctx, handle)
    if not errors.is(backend) then
      backend = errors.sandbox('failed', d.label .. ': the sandbox could not be set up')
    end
    error(backend, 0)
  end
  return backend
end

local function has(list, x)
  for _, v in ipairs(list or {}) do if v == x then return true end end
  return false
end

--- The provider table for `create_sandboxes` from the declaration `d` (see the module's comment):
-- `id`, `features`, `workdir`, `max_lifetime_ms` and every key of `d.fields` are copied onto it.
-- `d.options` (what kit.options returned) gives `workdir`, `max_lifetime_ms` and `warm` where `d`
-- does not.
function M.provider(d)
  for _, name in ipairs({ 'create', 'accept', 'backend', 'destroy' }) do
    if type(d[name]) ~= 'function' then error('kit: the declaration has no ' .. name, 2) end
  end
  local o = d.options or {}
  local p = { id = d.id, features = d.features, workdir = d.workdir or o.workdir,
    max_lifetime_ms = d.max_lifetime_ms or o.max_lifetime_ms }
  for k, v in pairs(d.fields or {}) do p[k] = v end
  function p.create(self, spec)
    return cold(self, d, spec)
  end
  local n = d.warm or o.warm or 0
  if n > 0 then
    if d.command then
      -- on command_sandbox_backend: set up once made, probed when claimed, the create's env given
      d.warm_up = d.warm_up or M.command_probe
      d.hand_out = d.hand_out or M.command_probe_hand_out
    end
    if type(d.hand_out) ~= 'function' then error('kit: warm sandboxes need hand_out', 2) end
    local net = d.warm_network
    if not net then net = has(d.features.network, 'none') and 'none' or d.features.network[1] end
    warm.add(p, n, {
      make = function(self, lifetime_ms, labels)
        local b = cold(self, d, { lifetime_ms = lifetime_ms, labels = labels, network = net, env = {} })
        if d.warm_up then
          local ok, err = pcall(d.warm_up, b)
          if not ok then
            pcall(b.release, b)
            error(err, 0)
          end
        end
        return b
      end,
      matches = function(_, spec, labels)
        return spec.network == net and spec.image == nil and spec.cpus == nil and spec.memory_mib == nil
          and (d.warm_desktop or not spec.desktop) and (d.warm_ports or not (spec.ports and #spec.ports > 0))
          and warm.same_labels(spec.labels, labels)
      end,
      hand_out = d.hand_out,
      -- one the service ended meanwhile (killed from outside, say) gives way to a cold create
      failed = function(self, b, err, spec)
        pcall(b.release, b)
        if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then return cold(self, d, spec) end
        error(errors.is(err) and err or errors.sandbox('failed', d.label .. ': the sandbox could not be handed out'), 0)
      end,
    })
  end
  return p
end

--- Gives the backend class `Backend`, whose `_script(text)` runs a sandbox script and returns its
-- output, `list_files` and `remove_file` by the sandbox scripts (for a service whose own calls
-- cannot: a listing that follows links, a delete that refuses an empty directory);
-- `nonsense(backend)` is the error of an answer the scripts cannot read.
function M.script_files(Backend, nonsense)
  function Backend:list_files(path)
    return scripts.parse_listing(self:_script(scripts.list(path)))
  end
  function Backend:remove_file(path, o)
    scripts.remove_result(self:_script(scripts.remove(path, o and o.recursive)), function() return nonsense(self) end)
  end
end

--- `hand_out` for a backend on command_sandbox_backend: every command gets the create's env (the
-- service's own lifetime stays the warm one's: the pool ends the sandbox at the asked one).
function M.command_hand_out(_, backend, spec)
  for k, v in pairs(spec.env or {}) do backend._env[k] = v end
end

--- A command that does nothing, on a backend on command_sandbox_backend: its first one sets the
-- backend up (the state directory and the workdir made, the tools found); the transports raise
-- SANDBOX_ERROR `gone` for a sandbox their service ended. As `warm_up`, a warm sandbox is ready to
-- the last step before it is claimed.
function M.command_probe(backend)
  backend:_run(':\n')
end

--- `hand_out` for a backend on command_sandbox_backend whose service may end a sandbox unseen:
-- kit.command_probe first (a warm one ended meanwhile then gives way to a cold create), then
-- command_hand_out.
function M.command_probe_hand_out(p, backend, spec)
  M.command_probe(backend)
  M.command_hand_out(p, backend, spec)
end

-- }======================================================

return M
