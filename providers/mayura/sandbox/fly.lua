--- mayura.sandbox.fly: sandboxes on Fly.io Machines (https://fly.io/docs/machines/), in one of
-- the user's apps, on command_sandbox_backend over the Machines exec endpoint.
--
--   local fly = require('mayura.sandbox.fly')
--   local provider = fly.fly_sandboxes({ token = t, app = 'my-sandboxes', image = 'node:22-bookworm' })
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4, network = { 'all' } })
--
-- Options: `token` (required: a Fly token for the app, `fly tokens deploy`; the library never
-- reads the environment), `app` (required: the app the machines go in, made beforehand),
-- `image` (an OCI image with sh and coreutils or BusyBox: default `node:22-bookworm-slim`; a
-- create's `image` names another), `region` (Fly picks one when nil), `base_url`
-- (https://api.machines.dev), `workdir` (/workspace, made at boot), `max_lifetime_ms` (24 h),
-- `retries`, `retry_base_ms`, `max_retry_after_ms` (the kit's), `exec_rate` (`{ per_second, burst }` of exec
-- calls per machine: Fly documents 1 and 3, the default), `warm` (machines made ahead for the pool,
-- 0 to 64, none by default: a create with the pool's labels, no image, cpus or memory and the
-- network 'all' takes one, its env going with each command; mayura.sandbox._kit).
--
-- A create is POST /v1/apps/{app}/machines: the image, `env`, `guest` (cpus, rounded up, and
-- memory in MiB, rounded up to 256), the labels as `metadata`, and a main process that makes
-- the workdir and sleeps for the lifetime (`auto_destroy`, `restart: no`): Fly has no TTL, so the
-- machine destroys itself when that sleep ends, and the pool also destroys it at its lifetime
-- (DELETE ...?kill=true, the flag fly-go and flyctl send to the live API; the published OpenAPI
-- names it `force`). The create waits with GET .../wait?state=started (Fly's longest wait is
-- 60 s a call; a 408 is waited again until the call timeout). Each create names its machine
-- `mayura-<random>`, so that a machine whose create answer was lost (a timeout, a cut) is found
-- by that name and destroyed.
--
-- Everything else is one exec at a time: POST .../machines/{id}/exec with `["sh","-c",script]`
-- and the script's standard input (base64 text), which Fly answers whole, as JSON strings;
-- command_sandbox_backend starts each command in the background, polls it, moves files as
-- base64 and kills a command's every process by a tag at its timeout or a cancel (Fly's exec
-- answers 408 for commands past about 30 s, so no exec is long). Fly answers 200 whatever the
-- exit code; a missing `exit_code` is 0.
--
-- Failures: every non-2xx answer is SANDBOX_ERROR through the kit (401 authentication, 429
-- rate_limited with `retry_after_ms`, 5xx unavailable, ...), never with Fly's text; the token is
-- in no message, field or URL, and never reaches a machine. An exec that fails is checked with
-- GET .../machines/{id}: 404, or a machine that is stopped or destroyed, is `gone`.
--
-- `features`: network { 'all' } only (the Machines API has no egress policy: a machine reaches
-- the internet), no ports (Fly serves ports per app, not per machine), stdin true (through a
-- file), no desktop.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local json = core.json
local MIB = 1048576
local DEFAULT_BASE_URL = 'https://api.machines.dev'
local DEFAULT_IMAGE = 'node:22-bookworm-slim'
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local EXEC_TIMEOUT_S = 25            -- each exec is short; Fly cuts execs at about 30 s
local MAX_COMMAND = 64 * 1024        -- a script and its standard input stay well under Fly's request limit
local DOWN = { stopped = true, stopping = true, destroyed = true, destroying = true, failed = true,
  replacing = true, suspended = true }

-- Whether the machine still runs: raises gone when Fly says it is not (404, or a state that is down).
local function check_alive(api, path)
  local ok, body = pcall(api.json, api, 'GET', path, nil, { gone = true })
  if not ok then
    if errors.is(body, 'SANDBOX_ERROR') and body.reason == 'gone' then error(body, 0) end
    return
  end
  if type(body) == 'table' and DOWN[body.state] then
    error(errors.sandbox('gone', 'fly: the machine is ' .. body.state), 0)
  end
end

-- The transport: one exec per script.
local function transport(api, path, workdir, env, rate)
  -- Fly's rate: 1 request a second per action per machine, bursts of 3 (every script is an exec),
  -- unless the provider's `exec_rate` says otherwise
  local t = { stdin = true, max_command_bytes = MAX_COMMAND, workdir = workdir, env = env,
    wait_ms = hosted.wait_ms(api.call_timeout_ms, (EXEC_TIMEOUT_S - 5) * 1000),
    rate = { per_second = rate.per_second, burst = rate.burst } }
  function t.run(_, command, o)
    -- no exec outlasts the pool's call timeout (a stalled one is SANDBOX_ERROR timeout)
    local limit = math.min(api.call_timeout_ms, (EXEC_TIMEOUT_S + 10) * 1000)
    local body = { command = setmetatable({ 'sh', '-c', command }, json.array_mt),
      timeout = math.max(1, math.min(EXEC_TIMEOUT_S, math.ceil(limit / 1000))) }
    if o.stdin then body.stdin = o.stdin end
    local ok, res = pcall(api.json, api, 'POST', path .. '/exec', body, {
      gone = true, signal = o.signal, idempotent = false, timeout_ms = limit,
    })
    if not ok then
      if errors.is(res, 'SANDBOX_ERROR') and res.reason ~= 'gone' and res.reason ~= 'authentication'
          and res.reason ~= 'rate_limited' then
        check_alive(api, path)
      end
      error(res, 0)
    end
    if type(res) ~= 'table' then error(api:bad_answer('an exec answer that is not an object'), 0) end
    local code = res.exit_code
    if code == nil or code == json.null then code = 0 end
    if not check.is_int(code) or type(res.stdout or '') ~= 'string' then
      error(api:bad_answer('an exec answer without an exit code and output'), 0)
    end
    return { exit_code = code, stdout = res.stdout or '' }
  end
  return t
end

-- `exec_rate`: `{ per_second, burst }` of exec calls per machine (Fly documents 1 a second, bursts of 3).
local function rate_option(v, _)
  return hosted.rate_option(v, 'fly', 'exec_rate', { per_second = 1, burst = 3 })
end

local function name_option(v, what, pattern)
  return check.word(v, pattern, 'fly: ' .. what .. ' is not a valid name', 'INVALID_CONFIG', 4)
end

local function word_option(pattern, default)
  return function(v, _, name) return name_option(v, name, pattern) or default end
end

local function workdir_option(v)
  if v == nil then return '/workspace' end
  if type(v) ~= 'string' or not v:match('^/[%w%._%-/]*$') or #v > 256 or v:find('/%.%.?/') or v:find('/%.%.?$') then
    errors.raise('INVALID_CONFIG', 'fly: workdir must be an absolute path of letters, digits, . _ - and /', nil, 0)
  end
  return v
end

local function required(checker)
  return function(v, label, name)
    if v == nil then errors.raise('INVALID_CONFIG', label .. ': ' .. name .. ' is required', nil, 0) end
    return checker(v, label, name)
  end
end

local function taken(v) return v end

--- The provider: see the module's comment for the options.
function M.fly_sandboxes(options)
  local o = kit.options(options, {
    { token = required(taken) },   -- the kit's client checks it
    { app = required(word_option('^[a-z0-9][a-z0-9%-]*$')) },
    { image = word_option('^[%w][%w%._/:@%-]*$', DEFAULT_IMAGE) },
    { region = word_option('^[a-z0-9]+$') },
    { base_url = kit.url(DEFAULT_BASE_URL) },
    { workdir = workdir_option },
    { max_lifetime_ms = kit.int(60000, nil, DEFAULT_MAX_LIFETIME_MS) },
    { retries = taken }, { retry_base_ms = taken }, { max_retry_after_ms = taken },
    { exec_rate = rate_option },
    { warm = kit.int(0, 64, 0) },
  }, 'fly', 'fly_sandboxes needs an options table with token and app')
  local api = hosted.client({
    label = 'fly', base_url = o.base_url, api_key = o.token,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms,
    max_response_bytes = 16 * MIB,
  })
  local base = '/v1/apps/' .. hosted.escape(o.app) .. '/machines'
  local workdir = o.workdir
  -- 404: it ended already, which is what release wants
  local function destroy(ctx, h)
    ctx.client:json('DELETE', h.path, nil, { query = { kill = true }, allow = { 404 } })
  end

  return kit.provider({
    id = 'fly', label = 'fly', client = api, warm = o.warm,
    features = { stdin = true, ports = false, desktop = false, network = { 'all' } },
    workdir = workdir, max_lifetime_ms = o.max_lifetime_ms,
    -- a machine Fly makes late is looked for now and once more later; its own sleep still ends it
    sweep_after_ms = { 0, 3000 }, sweep_in_background = true, ready_interval_ms = 0,

    create = function(ctx)
      local spec = ctx.spec
      local seconds = hosted.lifetime(spec.lifetime_ms, { unit = 's' })
      local config = {
        image = name_option(spec.image, 'image', '^[%w][%w%._/:@%-]*$') or o.image,
        env = kit.object(spec.env),
        metadata = hosted.metadata(spec.labels, { max_keys = 64, max_key_bytes = 63,
          key_pattern = '^[%w][%w%._%-]*$' }),
        init = { exec = setmetatable({ '/bin/sh', '-c', 'mkdir -p ' .. scripts.quote(workdir) .. ' && exec sleep '
          .. seconds }, json.array_mt) },
        auto_destroy = true,
        restart = { policy = 'no' },
      }
      if spec.cpus or spec.memory_mib then
        config.guest = { cpu_kind = 'shared', cpus = math.ceil(spec.cpus or 1),
          memory_mb = math.ceil((spec.memory_mib or 256) / 256) * 256 }
      end
      -- the machine's name is the create's tag: what finds a machine whose answer was lost
      return ctx.client:json('POST', base, { name = 'mayura-' .. ctx.tag, region = o.region, config = config })
    end,

    accept = function(ctx, m)
      if type(m) ~= 'table' or type(m.id) ~= 'string' or not m.id:match('^[%w]+$') or #m.id > 64 then
        error(ctx.client:bad_answer('a machine without an id'), 0)
      end
      return { id = m.id, path = base .. '/' .. hosted.escape(m.id), started = m.state == 'started' }
    end,

    find = function(_, tag)
      local found, list = {}, api:json('GET', base)
      for _, m in ipairs(type(list) == 'table' and list or {}) do
        if type(m) == 'table' and m.name == 'mayura-' .. tag and type(m.id) == 'string' then
          found[#found + 1] = { path = base .. '/' .. hosted.escape(m.id) }
        end
      end
      return found
    end,

    -- Fly's wait: one long poll a call (at most 60 s; a 408 is waited again)
    ready = function(ctx, h, left)
      if h.started then return true end
      local wait_s = math.max(1, math.min(60, math.floor(left / 1000)))
      local _, res = ctx.client:json('GET', h.path .. '/wait', nil, {
        query = { state = 'started', timeout = wait_s }, gone = true, allow = { 408 },
        timeout_ms = math.ceil(math.min(left, wait_s * 1000 + 5000)),
      })
      h.started = res.status ~= 408
      return h.started
    end,

    backend = function(ctx, h)
      local backend = sandbox.command_sandbox_backend('fly-' .. h.id,
        transport(ctx.client, h.path, workdir, ctx.spec.env, o.exec_rate), function() destroy(ctx, h) end)
      backend.machine_id = h.id
      return backend
    end,

    destroy = destroy,

    -- a warm machine given to a create, once Fly says it still runs: its env goes with every command
    hand_out = function(self, backend, spec)
      check_alive(api, base .. '/' .. hosted.escape(backend.machine_id))
      kit.command_hand_out(self, backend, spec)
    end,
  })
end

M.sandboxes = M.fly_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
