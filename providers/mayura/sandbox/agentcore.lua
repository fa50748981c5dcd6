--- mayura.sandbox.agentcore: Amazon Bedrock AgentCore Code Interpreter sessions
-- (https://docs.aws.amazon.com/bedrock-agentcore/latest/devguide/code-interpreter-tool.html) as
-- sandboxes, on command_sandbox_backend over the session's executeCommand tool.
--
--   local agentcore = require('mayura.sandbox.agentcore')
--   local provider = agentcore.agentcore_sandboxes({ region = 'us-east-1',
--     credentials = { access_key_id = id, secret_access_key = secret, session_token = token } })
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4, network = { 'all' } })
--
-- Options: `region` (required), `credentials` (required: `access_key_id`,
-- `secret_access_key`, and `session_token` for temporary credentials; the library never reads
-- the environment or AWS's files), `interpreter` (the code interpreter's identifier:
-- `aws.codeinterpreter.v1`, AWS's built-in one, by default), `network` ('all' by default, or
-- 'none': what the interpreter was made with; the built-in one's SANDBOX mode still reaches
-- some AWS services, so only an interpreter made without any egress should be declared 'none'),
-- `endpoint` (https://bedrock-agentcore.<region>.amazonaws.com), `workdir` (/tmp/workspace, made
-- with the first command), `max_lifetime_ms` (8 h, AgentCore's longest session), `retries`, `retry_base_ms`,
-- `max_retry_after_ms`, `idle_timeout_ms` (the longest an invoke stream may be silent: 60 s).
--
-- Every request is signed with AWS Signature V4 by libcurl itself (CURLOPT_AWS_SIGV4, service
-- `bedrock-agentcore`); the key pair goes only to libcurl's signer and the session token only in
-- X-Amz-Security-Token: no message, field, log line or URL holds any of them.
--
-- A create is PUT /code-interpreters/{id}/sessions/start with `sessionTimeoutSeconds` (the
-- lifetime, rounded up; AgentCore ends the session then) and a `clientToken` of its own, so that
-- a start retried after a cut makes one session; the pool also stops it at its lifetime (PUT
-- .../sessions/stop). Everything else is one POST .../tools/invoke of `executeCommand` at a time,
-- with the script as `sh -c '<script>'`; the answer is an AWS event stream
-- (core.stream_parser('eventstream'): CRCs checked, as bytes arrive) whose `result` event holds
-- the exit code and stdout. command_sandbox_backend starts commands in the background, polls
-- them, moves files as base64 inside the scripts (executeCommand has no standard input) and
-- kills a command's every process by a tag at its timeout or a cancel.
--
-- Failures: AWS's JSON errors become SANDBOX_ERROR through the kit (403 authentication, 404 a
-- session that ended: gone, 429 rate_limited with `retry_after_ms`, 5xx unavailable), as do the
-- stream's exception events (resourceNotFoundException gone, throttlingException rate_limited,
-- accessDeniedException authentication, internalServerException unavailable, others failed),
-- never with AWS's text; an invoke stream silent past `idle_timeout_ms` is `timeout`.
--
-- `features`: network { 'all' } or { 'none' } as declared, no ports (AgentCore serves none),
-- stdin true (through a file), no desktop. `env` goes with each command; `image`, `cpus` and
-- `memory_mib` are refused (they are the interpreter's).
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local MAX_LIFETIME_MS = 28800 * 1000
local MAX_COMMAND = 64 * 1024
local IDLE_MS = 60000
local DEFAULT_INTERPRETER = 'aws.codeinterpreter.v1'
local EXCEPTIONS = {
  resourceNotFoundException = 'gone', throttlingException = 'rate_limited', accessDeniedException = 'authentication',
  internalServerException = 'unavailable', serviceQuotaExceededException = 'rate_limited',
}

local function uuid()
  local f = io.open('/dev/urandom', 'rb')
  local b = f and f:read(16)
  if f then f:close() end
  if not b or #b ~= 16 then b = (tostring(core.hrtime_ms()) .. tostring(math.random())):rep(2):sub(1, 16) end
  local h = b:gsub('.', function(c) return ('%02x'):format(c:byte()) end)
  return h:sub(1, 8) .. '-' .. h:sub(9, 12) .. '-4' .. h:sub(14, 16) .. '-a' .. h:sub(18, 20) .. '-' .. h:sub(21, 32)
end

-- The transport: one executeCommand invoke (an event stream) per script.
local function transport(api, base, session, workdir, env, idle)
  -- a call waits in the sandbox within the stream's idle limit (the stream is silent meanwhile)
  local t = { stdin = false, max_command_bytes = MAX_COMMAND, workdir = workdir, env = env,
    wait_ms = hosted.wait_ms(api.call_timeout_ms, math.floor(idle / 2)) }
  function t.run(_, command, o)
    local result, failure
    local ok, err = pcall(api.stream, api, 'POST', base .. '/tools/invoke',
      { name = 'executeCommand', arguments = { command = 'sh -c ' .. scripts.quote(command) } }, {
        format = 'eventstream', gone = true, signal = o.signal, idle_timeout_ms = idle, idempotent = false,
        headers = { ['x-amzn-code-interpreter-session-id'] = session },
        on_event = function(ev)
          if ev.message_type == 'exception' or ev.message_type == 'error' then
            local kind = api:_safe_code(ev.event)
            failure = errors.sandbox(EXCEPTIONS[kind] or 'failed', 'agentcore: the session answered an exception')
            failure.provider_code = kind
            return false
          end
          if ev.message_type == 'event' and ev.event == 'result' then
            local v = hosted.decode(ev.data)
            local sc = type(v) == 'table' and v.structuredContent
            if type(sc) ~= 'table' or not check.is_int(sc.exitCode) or type(sc.stdout or '') ~= 'string' then
              error(api:bad_answer('a result without an exit code and output'), 0)
            end
            result = { exit_code = sc.exitCode, stdout = sc.stdout or '' }
            return false
          end
          return true   -- events the provider does not use
        end,
      })
    if not ok then error(err, 0) end
    if failure then error(failure, 0) end
    if not result then error(api:bad_answer('an invoke stream without its result'), 0) end
    return result
  end
  return t
end

local option_keys = {
  region = true, credentials = true, interpreter = true, network = true, endpoint = true, workdir = true,
  max_lifetime_ms = true, retries = true, retry_base_ms = true, max_retry_after_ms = true, idle_timeout_ms = true,
}

--- The provider: see the module's comment for the options.
function M.agentcore_sandboxes(options)
  local C = 'INVALID_CONFIG'
  if type(options) ~= 'table' then
    errors.raise(C, 'agentcore_sandboxes needs an options table with region and credentials', nil, 2)
  end
  check.keys(options, option_keys, 'agentcore options', C, 3)
  local region = options.region
  if type(region) ~= 'string' or not region:match('^[a-z][a-z0-9%-]+$') or #region > 32 then
    errors.raise(C, 'agentcore: region is required (such as us-east-1)', nil, 2)
  end
  if options.credentials == nil then errors.raise(C, 'agentcore: credentials are required', nil, 2) end
  local interpreter = options.interpreter or DEFAULT_INTERPRETER
  if type(interpreter) ~= 'string' or not interpreter:match('^[%w][%w%._%-]*$') or #interpreter > 100 then
    errors.raise(C, 'agentcore: interpreter must be an interpreter identifier', nil, 2)
  end
  local network = options.network or 'all'
  if network ~= 'all' and network ~= 'none' then
    errors.raise(C, "agentcore: network must be 'all' or 'none'", nil, 2)
  end
  local workdir = options.workdir or '/tmp/workspace'
  if type(workdir) ~= 'string' or not workdir:match('^/[%w%._%-/]*$') or #workdir > 256
      or workdir:find('/%.%.?/') or workdir:find('/%.%.?$') then
    errors.raise(C, 'agentcore: workdir must be an absolute path of letters, digits, . _ - and /', nil, 2)
  end
  local idle = check.int(options.idle_timeout_ms, 'idle_timeout_ms', 100, nil, C, 3, IDLE_MS)
  local api = hosted.client({
    label = 'agentcore', base_url = options.endpoint or ('https://bedrock-agentcore.' .. region .. '.amazonaws.com'),
    aws_sigv4 = 'aws:amz:' .. region .. ':bedrock-agentcore', aws_credentials = options.credentials,
    retries = options.retries, retry_base_ms = options.retry_base_ms, max_retry_after_ms = options.max_retry_after_ms,
  })
  local base = '/code-interpreters/' .. hosted.escape(interpreter)

  local provider = {
    id = 'agentcore',
    features = { stdin = true, ports = false, desktop = false, network = { network } },
    workdir = workdir,
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 60000, MAX_LIFETIME_MS, C, 3,
      MAX_LIFETIME_MS),
  }

  function provider.create(_, spec)
    if spec.cpus or spec.memory_mib or spec.image then
      errors.raise('INVALID_INPUT', 'agentcore: image and size are the code interpreter\'s', nil, 0)
    end
    local c = api
    if spec.call_timeout_ms then c = api:with({ call_timeout_ms = spec.call_timeout_ms }) end
    local seconds = hosted.lifetime(spec.lifetime_ms, { unit = 's', min = 60, max = 28800 })
    local body = c:json('PUT', base .. '/sessions/start', {
      name = 'mayura', sessionTimeoutSeconds = seconds, clientToken = uuid(),
    }, { idempotent = true })
    local session = type(body) == 'table' and body.sessionId
    if type(session) ~= 'string' or not session:match('^[%w%-_]+$') or #session > 128 then
      error(c:bad_answer('a session without an id'), 0)
    end
    local function stop()
      c:json('PUT', base .. '/sessions/stop', nil, { query = { sessionId = session }, allow = { 404 } })
    end
    local ok, backend = pcall(function()
      local t = transport(c, base, session, workdir, spec.env, idle)
      t.make_workdir = true   -- with the backend's first command
      return sandbox.command_sandbox_backend('agentcore-' .. session, t, function() stop() end)
    end)
    if not ok then
      pcall(stop)
      error(backend, 0)
    end
    backend.session_id = session
    return backend
  end

  return provider
end

M.sandboxes = M.agentcore_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
