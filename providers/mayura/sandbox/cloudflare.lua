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
-- `max_retry_after_ms`, `idle_timeout_ms` (the longest an exec stream may be silent: 60 s).
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
local scripts = require('mayura.sandbox.scripts')

local M = {}

local json = core.json
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local MAX_COMMAND = 64 * 1024
local IDLE_MS = 60000
local LOST = 213      -- the exit status of the state check: the container is not the one we made

local function random_hex(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(n)
  if f then f:close() end
  if not bytes or #bytes ~= n then bytes = tostring(core.hrtime_ms()) .. tostring(math.random()) end
  return (bytes:sub(1, n):gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

-- The transport: one exec (an SSE stream) per script.
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

local option_keys = {
  worker_url = true, api_key = true, workdir = true, max_lifetime_ms = true, retries = true, retry_base_ms = true,
  max_retry_after_ms = true, idle_timeout_ms = true,
}

--- The provider: see the module's comment for the options.
function M.cloudflare_sandboxes(options)
  local C = 'INVALID_CONFIG'
  if type(options) ~= 'table' then
    errors.raise(C, 'cloudflare_sandboxes needs an options table with worker_url and api_key', nil, 2)
  end
  check.keys(options, option_keys, 'cloudflare options', C, 3)
  if options.worker_url == nil then errors.raise(C, 'cloudflare: worker_url is required', nil, 2) end
  if options.api_key == nil then errors.raise(C, 'cloudflare: api_key is required', nil, 2) end
  local workdir = options.workdir or '/workspace'
  if type(workdir) ~= 'string' or not (workdir == '/workspace' or workdir:match('^/workspace/[%w%._%-/]*$'))
      or #workdir > 256 or workdir:find('/%.%.?/') or workdir:find('/%.%.?$') then
    errors.raise(C, 'cloudflare: workdir must be /workspace or a plain path under it', nil, 2)
  end
  local idle = check.int(options.idle_timeout_ms, 'idle_timeout_ms', 100, nil, C, 3, IDLE_MS)
  local api = hosted.client({
    label = 'cloudflare', base_url = options.worker_url, api_key = options.api_key,
    retries = options.retries, retry_base_ms = options.retry_base_ms, max_retry_after_ms = options.max_retry_after_ms,
  })

  local provider = {
    id = 'cloudflare',
    features = { stdin = true, ports = false, desktop = false, network = { 'all' } },
    workdir = workdir,
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 60000, nil, C, 3, DEFAULT_MAX_LIFETIME_MS),
  }

  function provider.create(_, spec)
    if spec.cpus or spec.memory_mib or spec.image then
      errors.raise('INVALID_INPUT', 'cloudflare: size and image are the bridge Worker\'s deploy-time settings', nil, 0)
    end
    local c = api
    if spec.call_timeout_ms then c = api:with({ call_timeout_ms = spec.call_timeout_ms }) end
    local body = c:json('POST', '/v1/sandbox')
    local id = type(body) == 'table' and body.id
    if type(id) ~= 'string' or not id:match('^[a-z2-7]+$') or #id > 128 then
      error(c:bad_answer('a sandbox id that is not the bridge\'s'), 0)
    end
    local path = '/v1/sandbox/' .. id
    local function destroy()
      c:json('DELETE', path, nil, { allow = { 404 } })
    end
    -- the backend's first call starts the container and makes the workdir
    local ok, backend = pcall(function()
      local t = transport(c, path, workdir, spec.env, idle)
      t.make_workdir = true
      t.backend = sandbox.command_sandbox_backend('cloudflare-' .. id, t, function() destroy() end)
      return t.backend
    end)
    if not ok then
      pcall(destroy)
      error(backend, 0)
    end
    backend.sandbox_id = id
    return backend
  end

  return provider
end

M.sandboxes = M.cloudflare_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
