--- A stand-in for the data plane of Amazon Bedrock AgentCore's Code Interpreter (the calls
-- mayura.sandbox.agentcore makes, as AWS's API reference and the SDK's model describe them), on
-- a stand-in (support/stand_in.lua) backed by real local sandboxes: each session is a local
-- sandbox. Every request must carry a valid AWS Signature V4 for the configured key pair, region
-- and service `bedrock-agentcore` (support/sigv4.lua checks it; a session token, when
-- configured, in X-Amz-Security-Token), else 403 InvalidSignatureException (whose message echoes
-- the key id it got, so specs can check it never shows).
--
--   local state = agentcore_service.install(svc, backing, { access_key_id = A, secret_access_key = S,
--     session_token = T, region = 'us-east-1' })
--   -- endpoint: svc:url('') (the service's https://bedrock-agentcore.<region>.amazonaws.com)
--
--   PUT  /code-interpreters/{ci}/sessions/start          { name, sessionTimeoutSeconds (1..28800,
--                                                        900 by default), clientToken } ->
--                                                        { codeInterpreterIdentifier, sessionId,
--                                                        createdAt }; the same clientToken again
--                                                        gives the same session
--   GET  /code-interpreters/{ci}/sessions/get?sessionId= { ..., status READY | TERMINATED }
--   PUT  /code-interpreters/{ci}/sessions/stop?sessionId= { codeInterpreterIdentifier, sessionId }
--   POST /code-interpreters/{ci}/tools/invoke            x-amzn-code-interpreter-session-id;
--                                                        { name, arguments } -> an event stream:
--                                                        one `result` event (CodeInterpreterResult),
--                                                        the session id in the same header
--
-- Tools: executeCommand { command } (run by sh -c) -> structuredContent { stdout, stderr,
-- exitCode, executionTime } and a text content block; writeFiles { content = { { path, text | blob
-- (base64) } } } -> a text block; readFiles { paths } -> one `resource` block per file ({ type text
-- | blob, uri file://<absolute path>, mimeType, text | blob }), relative paths from /workspace. Errors before the stream are AWS's JSON
-- errors (x-amzn-ErrorType, { message }): 400 ValidationException, 403, 404
-- ResourceNotFoundException for an unknown or terminated session. `state.exception_next` makes
-- the next invoke answer 200 with that exception event instead of a result; `state.stall_streams`
-- stalls the next that many invoke streams before their event. Where it differs: only
-- these three tools are there (the provider needs executeCommand, the official SDK's check the
-- file tools); sessions have no network (the local sandbox's 'none'); only the built-in
-- interpreter `aws.codeinterpreter.v1` exists.
local core = require('mayura.core')
local task = require('mayura._task')
local sigv4 = require('support.sigv4')
local eventstream = require('support.eventstream')


local M = {}

M.INTERPRETER = 'aws.codeinterpreter.v1'
M.STALLED = 'the stand-in stalled this stream'
M.WORKDIR = '/workspace'

local function aws_error(status, kind, message)
  return { status = status, headers = { ['x-amzn-ErrorType'] = kind }, json = { message = message } }
end

local seq = 0
local function new_id()
  seq = seq + 1
  return string.format('%08x%04x%08x', core.now_ms() % 0xffffffff, seq, math.random(0, 0x7fffffff))
end

-- Paths of the file tools are relative to the session's working directory.
local function absolute(path)
  if path:sub(1, 1) == '/' then return path end
  return M.WORKDIR .. '/' .. path
end

-- writeFiles and readFiles on the session's sandbox: a CodeInterpreterResult.
local function file_tool(sb, name, args)
  if name == 'writeFiles' then
    for _, f in ipairs(args.content) do
      local data = f.text or (type(f.blob) == 'string' and core.base64.decode(f.blob))
      local ok = type(f.path) == 'string' and type(data) == 'string' and pcall(sb.write_file, sb, absolute(f.path), data)
      if not ok then
        return { content = { { type = 'text', text = 'could not write ' .. tostring(f.path) } }, isError = true }
      end
    end
    return { content = { { type = 'text', text = 'wrote ' .. #args.content .. ' files' } }, isError = false }
  end
  local blocks = {}
  for _, path in ipairs(args.paths) do
    local ok, data = pcall(sb.read_file, sb, absolute(tostring(path)))
    if not ok or not data then
      return { content = { { type = 'text', text = 'no such file ' .. tostring(path) } }, isError = true }
    end
    local resource = { uri = 'file://' .. absolute(path) }
    if data:find('[%z\1-\8\11\12\14-\31\127-\255]') then
      resource.type, resource.mimeType, resource.blob = 'blob', 'application/octet-stream', core.base64.encode(data)
    else
      resource.type, resource.mimeType, resource.text = 'text', 'text/plain', data
    end
    blocks[#blocks + 1] = { type = 'resource', resource = resource }
  end
  return { content = blocks, isError = false }
end

--- Installs the API on `svc` over `backing` (see the module's comment). Returns the state:
-- `sessions` (id -> record with `backing_id`, `status`, `timeout_s`, `body`), `verified` (how
-- many signatures were checked), `exception_next`, `stall_streams`.
function M.install(svc, backing, opts)
  local state = { sessions = {}, by_token = {}, verified = 0, stall_streams = 0 }
  local creds = {
    access_key_id = opts.access_key_id, secret_access_key = opts.secret_access_key,
    session_token = opts.session_token, region = opts.region or 'us-east-1', service = 'bedrock-agentcore',
    max_skew_ms = 15 * 60000,
  }

  local function refuse(req)
    local ok, why = sigv4.verify(req, creds)
    if not ok then
      state.last_refusal = why
      local key = (req.headers.authorization or ''):match('Credential=([^/]+)') or '?'
      return aws_error(403, 'InvalidSignatureException', 'The request signature we calculated does not match '
        .. 'the signature you provided for key ' .. key)
    end
    state.verified = state.verified + 1
    if req.params.ci ~= M.INTERPRETER then
      return aws_error(404, 'ResourceNotFoundException', 'code interpreter not found')
    end
    return nil
  end

  local function live(id)
    local s = state.sessions[id]
    if not s then return nil end
    if s.status == 'READY' and not backing:get(s.backing_id) then s.status = 'TERMINATED' end
    return s
  end

  svc:route('PUT', '/code-interpreters/{ci}/sessions/start', function(req)
    local no = refuse(req)
    if no then return no end
    local body = req.json or {}
    local timeout = body.sessionTimeoutSeconds or 900
    if type(timeout) ~= 'number' or timeout < 1 or timeout > 28800 or timeout % 1 ~= 0 then
      return aws_error(400, 'ValidationException', 'sessionTimeoutSeconds must be 1..28800')
    end
    local token = body.clientToken
    local s = token and state.by_token[token]
    if not s then
      local backing_id = backing:create({ lifetime_ms = timeout * 1000 })
      s = { id = new_id(), backing_id = backing_id, status = 'READY', timeout_s = timeout, body = body,
        created = '2026-11-30T00:00:00Z' }
      state.sessions[s.id] = s
      if token then state.by_token[token] = s end
    end
    return { json = { codeInterpreterIdentifier = M.INTERPRETER, sessionId = s.id, createdAt = s.created } }
  end)

  svc:route('GET', '/code-interpreters/{ci}/sessions/get', function(req)
    local no = refuse(req)
    if no then return no end
    local s = live(req.query.sessionId or '')
    if not s then return aws_error(404, 'ResourceNotFoundException', 'session not found') end
    return { json = { codeInterpreterIdentifier = M.INTERPRETER, sessionId = s.id, createdAt = s.created,
      sessionTimeoutSeconds = s.timeout_s, status = s.status } }
  end)

  svc:route('PUT', '/code-interpreters/{ci}/sessions/stop', function(req)
    local no = refuse(req)
    if no then return no end
    local s = live(req.query.sessionId or '')
    if not s or s.status ~= 'READY' then return aws_error(404, 'ResourceNotFoundException', 'session not found') end
    s.status = 'TERMINATED'
    backing:release(s.backing_id)
    return { json = { codeInterpreterIdentifier = M.INTERPRETER, sessionId = s.id,
      lastUpdatedAt = '2026-11-30T00:00:01Z' } }
  end)

  svc:route('POST', '/code-interpreters/{ci}/tools/invoke', function(req)
    local no = refuse(req)
    if no then return no end
    local s = live(req.headers['x-amzn-code-interpreter-session-id'] or '')
    if not s or s.status ~= 'READY' then return aws_error(404, 'ResourceNotFoundException', 'session not found') end
    local body = req.json
    local args = type(body) == 'table' and body.arguments
    local valid = type(args) == 'table' and ((body.name == 'executeCommand' and type(args.command) == 'string')
      or (body.name == 'writeFiles' and type(args.content) == 'table')
      or (body.name == 'readFiles' and type(args.paths) == 'table'))
    if not valid then
      return aws_error(400, 'ValidationException', 'only executeCommand, writeFiles and readFiles are here')
    end
    local headers = { ['Content-Type'] = 'application/vnd.amazon.eventstream',
      ['x-amzn-code-interpreter-session-id'] = s.id }
    if state.exception_next then
      local kind = state.exception_next
      state.exception_next = nil
      return { headers = headers, body = eventstream.exception(kind, 'stand-in exception ' .. kind) }
    end
    local stall = state.stall_streams > 0
    if stall then state.stall_streams = state.stall_streams - 1 end
    local sb = backing:get(s.backing_id)
    return {
      headers = headers,
      stream = function(send)
        if stall then
          svc.failures[#svc.failures + 1] = M.STALLED
          while not req.signal.cancelled do task.sleep(50) end
          return
        end
        if body.name ~= 'executeCommand' then
          send(eventstream.event('result', file_tool(sb, body.name, args)))
          return
        end
        local t0 = core.now_ms()
        local ok, r = pcall(sb.exec, sb, { 'sh', '-c', args.command }, { timeout_ms = 600000 })
        if not ok then
          send(eventstream.exception('internalServerException', 'exec failed in the stand-in'))
          return
        end
        local result = {
          content = { { type = 'text', text = r.stdout } },
          structuredContent = { stdout = r.stdout, stderr = r.stderr, exitCode = r.exit_code or 137,
            executionTime = (core.now_ms() - t0) / 1000 },
          isError = r.exit_code ~= 0,
        }
        send(eventstream.event('result', result))
      end,
    }
  end)

  return state
end

return M
