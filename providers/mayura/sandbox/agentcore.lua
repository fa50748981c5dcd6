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
-- `max_retry_after_ms`, `idle_timeout_ms` (the longest an invoke stream may be silent: 60 s),
-- `exec_rate` (the invokes' rate, which the provider's sandboxes keep together: `{ per_second =
-- 15, burst = 15 }` by default, half of AWS's documented quota of 30 a second per account), `warm`
-- (sessions started ahead for the pool, 0 to 64, none by default: a create with the pool's labels
-- and the declared network takes one, its env going with each command; mayura.sandbox._kit owns
-- the lifecycle).
--
-- Every request is signed with AWS Signature V4 by libcurl itself (CURLOPT_AWS_SIGV4, service
-- `bedrock-agentcore`); the key pair goes only to libcurl's signer and the session token only in
-- X-Amz-Security-Token: no message, field, log line or URL holds any of them.
--
-- A create is PUT /code-interpreters/{id}/sessions/start with `sessionTimeoutSeconds` (the
-- lifetime, rounded up; AgentCore ends the session then) and a `clientToken` of its own, so that
-- a start retried after a cut makes one session; the pool also stops it at its lifetime (PUT
-- .../sessions/stop). Everything else is one POST .../tools/invoke of `executeCommand` at a time,
-- the script as its shell string; the answer is an AWS event stream
-- (core.stream_parser('eventstream'): CRCs checked, as bytes arrive) whose `result` event holds
-- the exit code and stdout. On command_sandbox_backend: a command whose timeout is at most 60 s
-- (the pool's default) and that takes no standard input is one invoke that waits for it, run
-- by the invoke's own shell as executeCommand runs the SDK's (`direct_ms`; the stream may be
-- silent that long); others start in the background and are polled, each invoke waiting up
-- to half the idle limit for their end. Files move as base64 inside the scripts (executeCommand
-- has no standard input), outputs go through files (binary kept, cut at the pool's cap), and a
-- command's every process is stopped by a tag at its timeout or a cancel. The invokes of the
-- provider's sandboxes keep half of AWS's documented 30 a second per account (`transport.rate`).
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
local errors = require('mayura.errors')
local check = require('mayura._check')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')

local M = {}

local MAX_LIFETIME_MS = 28800 * 1000
local MAX_COMMAND = 64 * 1024
local IDLE_MS = 60000
local DIRECT_MS = 60000   -- a command with a timeout up to this is one executeCommand that waits for it
local DEFAULT_INTERPRETER = 'aws.codeinterpreter.v1'
local EXCEPTIONS = {
  resourceNotFoundException = 'gone', throttlingException = 'rate_limited', accessDeniedException = 'authentication',
  internalServerException = 'unavailable', serviceQuotaExceededException = 'rate_limited',
}

-- The transport: one executeCommand invoke (an event stream) per script, within `rate`.
local function transport(api, base, session, workdir, env, idle, rate)
  -- a call waits in the sandbox within the stream's idle limit (the stream is silent meanwhile)
  local t = { stdin = false, max_command_bytes = MAX_COMMAND, workdir = workdir, env = env, rate = rate,
    wait_ms = hosted.wait_ms(api.call_timeout_ms, math.floor(idle / 2)), direct_ms = DIRECT_MS }
  function t.run(_, command, o)
    local result, failure
    local ok, err = pcall(api.stream, api, 'POST', base .. '/tools/invoke',
      { name = 'executeCommand', arguments = { command = command } }, {
        format = 'eventstream', gone = true, signal = o.signal, idle_timeout_ms = idle + (o.wait_ms or 0),
        timeout_ms = api.call_timeout_ms + (o.wait_ms or 0), idempotent = false,
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

--- The provider: see the module's comment for the options.
function M.agentcore_sandboxes(options)
  local o = kit.options(options, {
    { region = kit.required(kit.word('^[a-z][a-z0-9%-]+$', 'a region such as us-east-1', nil, 32)) },
    { credentials = kit.required() },   -- the client checks them
    { interpreter = kit.word('^[%w][%w%._%-]*$', 'an interpreter identifier', DEFAULT_INTERPRETER, 100) },
    { network = function(v, label)
      if v ~= nil and v ~= 'all' and v ~= 'none' then
        errors.raise('INVALID_CONFIG', label .. ": network must be 'all' or 'none'", nil, 0)
      end
      return v or 'all'
    end },
    { endpoint = kit.taken },   -- the client checks it
    { workdir = kit.word('^/[%w%._%-/]*$', 'an absolute path of letters, digits, . _ - and /', '/tmp/workspace') },
    { max_lifetime_ms = kit.int(60000, MAX_LIFETIME_MS, MAX_LIFETIME_MS) },
    { idle_timeout_ms = kit.int(100, nil, IDLE_MS) },
    -- AWS's quota on InvokeCodeInterpreter is 30 a second per account: the provider's sandboxes share
    -- a bucket of half of it (15 at once, 15 more a second), never past 30 in any second
    { exec_rate = function(v)
      return hosted.rate_option(v, 'agentcore', 'exec_rate', { per_second = 15, burst = 15 })
    end },
    kit.RETRY_OPTIONS, kit.WARM_OPTION,
  }, 'agentcore', 'agentcore_sandboxes needs an options table with region and credentials')
  local workdir, idle = o.workdir, o.idle_timeout_ms
  if workdir:find('/%.%.?/') or workdir:find('/%.%.?$') then
    errors.raise('INVALID_CONFIG', 'agentcore: workdir must be an absolute path of letters, digits, . _ - and /',
      nil, 2)
  end
  local api = hosted.client({
    label = 'agentcore', base_url = o.endpoint or ('https://bedrock-agentcore.' .. o.region .. '.amazonaws.com'),
    aws_sigv4 = 'aws:amz:' .. o.region .. ':bedrock-agentcore', aws_credentials = o.credentials,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms,
  })
  local base = '/code-interpreters/' .. hosted.escape(o.interpreter)
  local function stop(ctx, h)
    ctx.client:json('PUT', base .. '/sessions/stop', nil, { query = { sessionId = h.session }, allow = { 404 } })
  end

  return kit.provider({
    id = 'agentcore', label = 'agentcore', client = api, options = o, command = true,
    features = { stdin = true, ports = false, desktop = false, network = { o.network } },

    -- a clientToken of its own: a start retried after a cut makes one session
    create = function(ctx)
      local spec = ctx.spec
      if spec.cpus or spec.memory_mib or spec.image then
        errors.raise('INVALID_INPUT', 'agentcore: image and size are the code interpreter\'s', nil, 0)
      end
      local seconds = hosted.lifetime(spec.lifetime_ms, { unit = 's', min = 60, max = 28800 })
      return ctx.client:json('PUT', base .. '/sessions/start', {
        name = 'mayura', sessionTimeoutSeconds = seconds, clientToken = kit.uuid(),
      }, { idempotent = true })
    end,

    accept = function(ctx, body)
      local session = type(body) == 'table' and body.sessionId
      return { session = ctx:id_of(session, '^[%w%-_]+$', 128, 'a session without an id') }
    end,

    backend = function(ctx, h)
      local t = transport(ctx.client, base, h.session, workdir, ctx.spec.env, idle, o.exec_rate)
      t.make_workdir = true   -- with the backend's first command
      local backend = sandbox.command_sandbox_backend('agentcore-' .. h.session, t, function() stop(ctx, h) end)
      backend.session_id = h.session
      return backend
    end,

    destroy = stop,
  })
end

M.sandboxes = M.agentcore_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
