--- mayura.sandbox.cloudflare: Cloudflare Sandboxes (https://developers.cloudflare.com/sandbox/)
-- through the user's sandbox bridge Worker (the `bridge/worker` of cloudflare/sandbox-sdk,
-- deployed to the user's account), on command_sandbox_backend over the bridge's exec call.
--
--   local cloudflare = require('mayura.sandbox.cloudflare')
--   local provider = cloudflare.cloudflare_sandboxes({ worker_url = 'https://sandbox.example.workers.dev',
--     api_key = key })
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 3, network = { 'all' } })
--
-- Options: `worker_url` (required: the bridge Worker's URL), `api_key` (the Worker's
-- SANDBOX_API_KEY secret; required: a bridge without one serves anybody, which this provider does
-- not help with; the library never reads the environment), `workdir` (/workspace: the bridge
-- keeps a command's cwd under it), `max_lifetime_ms` (24 h), `retries`, `retry_base_ms`,
-- `max_retry_after_ms`, `idle_timeout_ms` (the longest an exec stream may be silent: 60 s), `warm`
-- (sandboxes made ahead for the pool, 0 to 64, none by default: a create with the pool's labels
-- takes one, its env going with each command; mayura.sandbox._kit owns the lifecycle).
--
-- A create is POST /v1/sandbox, which only mints an id: the container starts at the first
-- command. The bridge has no lifetime, environment, size or egress setting per sandbox (those are
-- the Worker's deploy-time settings): the pool releases the sandbox at its lifetime (DELETE
-- /v1/sandbox/{id}), the environment goes with each command, `cpus`, `memory_mib` and `image` are
-- refused. Everything else is one exec at a time: POST /v1/sandbox/{id}/exec with argv
-- `["sh","-c",script]`, whose answer is a server-sent event stream (stdout and stderr as base64
-- chunks, then `exit` with the exit code, or `error`); command_sandbox_backend starts commands in
-- the background, polls them, moves files as base64 inside the scripts (the bridge's exec has no
-- standard input) and kills a command's every process by a tag at its timeout or a cancel.
--
-- Gone: the bridge answers a released id with a fresh container (and the Worker sleeps an idle
-- one, losing its processes and files), so every script after the first checks that the
-- backend's state directory is still there; a container that lost it is SANDBOX_ERROR `gone`, as
-- is a 404 or 410. Every other failure is SANDBOX_ERROR through the kit (401 authentication, 429
-- rate_limited with `retry_after_ms`, 503 `capacity_exceeded` unavailable, an exec stream silent
-- past `idle_timeout_ms` timeout, an `error` event failed or unavailable), never with the
-- bridge's text; the key is in no message, field, URL or command.
--
-- `features`: network { 'all' } only (the bridge cannot keep a container offline), no ports (the
-- bridge's tunnels are not offered), stdin true (through a file), no desktop.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local json = core.json
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local MAX_COMMAND = 64 * 1024
local IDLE_MS = 60000
local LOST = 213      -- the exit status of the state check: the container is not the one we made

local random_hex = kit.random_hex

-- The transport: one exec (an SSE stream) per script. No `rate`: the bridge is the user's own
-- Worker and documents no rate of its own.
local function transport(api, path, workdir, env, idle)
  local state = '/tmp/.mayura-' .. random_hex(8)
  local t = { stdin = false, max_command_bytes = MAX_COMMAND, workdir = workdir, env = env, state_dir = state,
    wait_ms = hosted.wait_ms(api.call_timeout_ms, idle and math.floor(idle / 2) or nil) }
  t.armed = false     -- set once the backend made its state directory (its first call did)
  function t.run(_, command, o)
    if not t.armed and t.backend and t.backend._setup == nil then t.armed = true end
    local script = command
    if t.armed then script = '[ -d ' .. scripts.quote(state) .. ' ]||exit ' .. LOST .. '\n' .. command end
    local out, code, failure = {}, nil, nil
    local ok, err = pcall(api.stream, api, 'POST', path .. '/exec',
      { argv = setmetatable({ 'sh', '-c', script }, json.array_mt) }, {
        format = 'sse', gone = true, signal = o.signal, idle_timeout_ms = idle, idempotent = false,
        on_event = function(ev)
          if ev.event == 'stdout' then
            local bytes = core.base64.decode(ev.data)
            if not bytes then error(api:bad_answer('output that is not base64'), 0) end
            out[#out + 1] = bytes
          elseif ev.event == 'exit' then
            local v = hosted.decode(ev.data)
            code = type(v) == 'table' and v.exit_code
            if not check.is_int(code) then error(api:bad_answer('an exit event without an exit code'), 0) end
            return false
          elseif ev.event == 'error' then
            local v = hosted.decode(ev.data)
            local c = type(v) == 'table' and api:_safe_code(v.code) or nil
            failure = errors.sandbox(c == 'exec_transport_error' and 'unavailable' or 'failed',
              'cloudflare: the bridge could not run a command')
            failure.provider_code = c
            return false
          end
          return true
        end,
      })
    if not ok then error(err, 0) end
    if failure then error(failure, 0) end
    if code == nil then error(api:bad_answer('an exec stream that ended without its exit'), 0) end
    if t.armed and code == LOST then
      error(errors.sandbox('gone', 'cloudflare: the sandbox\'s container is not the one that was made'), 0)
    end
    return { exit_code = code, stdout = table.concat(out) }
  end
  return t
end

local function workdir_option(v, label)
  v = v or '/workspace'
  if type(v) ~= 'string' or not (v == '/workspace' or v:match('^/workspace/[%w%._%-/]*$'))
      or #v > 256 or v:find('/%.%.?/') or v:find('/%.%.?$') then
    errors.raise('INVALID_CONFIG', label .. ': workdir must be /workspace or a plain path under it', nil, 0)
  end
  return v
end

--- The provider: see the module's comment for the options.
function M.cloudflare_sandboxes(options)
  local o = kit.options(options, {
    { worker_url = kit.required() }, { api_key = kit.required() },   -- the client checks both
    { workdir = workdir_option },
    { max_lifetime_ms = kit.int(60000, nil, DEFAULT_MAX_LIFETIME_MS) },
    { idle_timeout_ms = kit.int(100, nil, IDLE_MS) },
    kit.RETRY_OPTIONS, kit.WARM_OPTION,
  }, 'cloudflare', 'cloudflare_sandboxes needs an options table with worker_url and api_key')
  local workdir, idle = o.workdir, o.idle_timeout_ms
  local api = hosted.client({
    label = 'cloudflare', base_url = o.worker_url, api_key = o.api_key,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms,
  })
  local function destroy(ctx, h) ctx.client:json('DELETE', h.path, nil, { allow = { 404 } }) end

  return kit.provider({
    id = 'cloudflare', label = 'cloudflare', client = api, options = o, command = true,
    features = { stdin = true, ports = false, desktop = false, network = { 'all' } },

    create = function(ctx)
      local spec = ctx.spec
      if spec.cpus or spec.memory_mib or spec.image then
        errors.raise('INVALID_INPUT', 'cloudflare: size and image are the bridge Worker\'s deploy-time settings', nil,
          0)
      end
      return ctx.client:json('POST', '/v1/sandbox')
    end,

    accept = function(ctx, body)
      local id = ctx:id_of(type(body) == 'table' and body.id, '^[a-z2-7]+$', 128,
        'a sandbox id that is not the bridge\'s')
      return { id = id, path = '/v1/sandbox/' .. id }
    end,

    -- the backend's first call starts the container and makes the workdir
    backend = function(ctx, h)
      local t = transport(ctx.client, h.path, workdir, ctx.spec.env, idle)
      t.make_workdir = true
      t.backend = sandbox.command_sandbox_backend('cloudflare-' .. h.id, t, function() destroy(ctx, h) end)
      t.backend.sandbox_id = h.id
      return t.backend
    end,

    destroy = destroy,
  })
end

M.sandboxes = M.cloudflare_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
