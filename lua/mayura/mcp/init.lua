--- mayura.mcp: a Model Context Protocol server over tool sessions, transport-free.
--
--   local mcp = require('mayura.mcp')
--   local server = mcp.server({
--     open_session = function(id) return env:session(id) end,  -- { tools, call, close }
--     log = function(record) ... end,
--   })
--   local s = server:session('stdio')            -- a protocol session, not yet initialized
--   s:handle(text, { send = function(msg) ... end, reply = function(msg_or_nil) ... end })
--   s:close('disconnect')                         -- cancels its calls, closes its tool session
--
-- JSON-RPC 2.0 over `core.json`: `handle` takes one message as received (an
-- object, or an array where the revision allows batches) and answers through
-- `out.reply` once, with the response (a table: one message or a batch) or
-- nil when nothing answers (notifications, responses, a cancelled request).
-- Notifications that belong to a request (progress) go through `out.send`
-- before its reply. Requests run as tasks: a slow command never holds up the
-- session's other messages, and `notifications/cancelled` cancels the
-- command's token, which stops it and everything it started.
--
-- Revisions: 2025-11-25 (current), 2025-06-18 and 2025-03-26; an initialize
-- asking for another gets the current one. Only 2025-03-26 takes batches;
-- for the others (and before initialize) an array is -32600.
--
-- Tools come from the tool session: `tools` (each `{ id, description,
-- input }`, `input` a `z` schema whose `json_schema()` is the inputSchema:
-- what tools/list gives, the tools the session may call), optionally
-- `declared` (those and the ones it may not: a call of one is refused by
-- `call` with the grant it needs, not as an unknown tool)
-- and `call(tool_id, input, { signal, call_id, progress })`, which checks
-- grants, limits and budget and raises coded errors; `progress(update)` gets
-- the call's `{ stream, text }` updates (a command's output as it comes).
-- `mayura serve` opens the policy environment's sessions (mayura.policy's
-- `env:session`), which are the runtime's own: a call's result and error
-- come here as the tool gave them. A raised error is the
-- tool's result with `isError = true` and text `CODE: message`; a result is
-- given as `structuredContent` and as its JSON text. The tool session is
-- opened at initialize and closed once when the protocol session ends, which
-- releases its sandbox; `open_session` refusing (the policy's max_sessions)
-- is -32000, as is `max_sessions` of the server's own when one is given.
--
-- With a progress token (`_meta.progressToken`) a call sends
-- notifications/progress at its start and every `progress_interval_ms` while
-- it runs. Every call, its grant decision, its outcome and time go to
-- `log(record)`, with secrets redacted (`M.redact`).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')

local json = core.json
local array_mt = json.array_mt
local object_mt = json.object_mt

local M = {}

M.VERSIONS = { '2025-11-25', '2025-06-18', '2025-03-26' }
M.LATEST = '2025-11-25'
local SUPPORTED = { ['2025-11-25'] = true, ['2025-06-18'] = true, ['2025-03-26'] = true }
local BATCHES = { ['2025-03-26'] = true }

M.PARSE_ERROR = -32700
M.INVALID_REQUEST = -32600
M.METHOD_NOT_FOUND = -32601
M.INVALID_PARAMS = -32602
M.INTERNAL_ERROR = -32603
M.SERVER_BUSY = -32000

--- Whether `v` is a protocol revision this server speaks.
function M.supported(v)
  return SUPPORTED[v] == true
end

-- {======================================================
-- Redaction
-- =======================================================

local SECRET_KEY = { 'token', 'secret', 'password', 'passwd', 'authorization', 'api_key', 'apikey', 'credential',
  'private_key' }

local function secret_key(k)
  if type(k) ~= 'string' then return false end
  local l = k:lower()
  for _, w in ipairs(SECRET_KEY) do
    if l:find(w, 1, true) then return true end
  end
  return false
end

local function scrub(s, secrets)
  for _, secret in ipairs(secrets) do
    local i = #secret >= 4 and s:find(secret, 1, true)
    while i do
      s = s:sub(1, i - 1) .. '[redacted]' .. s:sub(i + #secret)
      i = s:find(secret, i + 10, true)
    end
  end
  return s
end

local MAX_LOGGED = 2048

--- A copy of `v` for a log: values under secret-like keys are `[redacted]`, each string of
-- `secrets` (4 bytes or longer) is cut out of every string, and a string past 2048 bytes is then
-- cut there.
function M.redact(v, secrets, depth)
  secrets = secrets or {}
  depth = depth or 0
  if type(v) == 'string' then
    v = scrub(v, secrets)
    if #v > MAX_LOGGED then v = v:sub(1, MAX_LOGGED) .. '...(' .. #v .. ' bytes)' end
    return v
  end
  if type(v) ~= 'table' or depth > 8 then return v end
  local out = setmetatable({}, getmetatable(v))
  for k, x in pairs(v) do
    if secret_key(k) and x ~= nil and type(x) ~= 'table' then
      out[k] = '[redacted]'
    else
      out[k] = M.redact(x, secrets, depth + 1)
    end
  end
  return out
end

-- {======================================================
-- Messages
-- =======================================================

local function is_object(v)
  return type(v) == 'table' and getmetatable(v) ~= array_mt
end

local function valid_id(id)
  return type(id) == 'string' or (type(id) == 'number' and id == math.floor(id) and id >= -2 ^ 53 and id <= 2 ^ 53)
end

local function error_response(id, code, message, data)
  local e = { code = code, message = message }
  if data ~= nil then e.data = data end
  return { jsonrpc = '2.0', id = id == nil and json.null or id, error = e }
end
M.error_response = error_response

local function result_response(id, result)
  return { jsonrpc = '2.0', id = id, result = result }
end

local function empty_object()
  return setmetatable({}, object_mt)
end

local function id_key(id)
  return type(id) .. ':' .. tostring(id)
end

local function now_ms()
  return core.now_ms()
end

-- {======================================================
-- Server
-- =======================================================

local Server = {}
Server.__index = Server

local Session = {}
Session.__index = Session

--- A server over `options.open_session(id, info)`.
function M.server(options)
  if type(options) ~= 'table' or type(options.open_session) ~= 'function' then
    errors.raise('INVALID_CONFIG', 'mcp.server expects { open_session = function(id) ... end }', nil, 2)
  end
  local self = setmetatable({
    open_session = options.open_session,
    max_sessions = options.max_sessions,   -- nil: the session opener's own limit is the one
    progress_interval_ms = options.progress_interval_ms or 1000,
    name = options.name or 'mayura',
    version = options.version or core.version or '0',
    instructions = options.instructions,
    log_fn = options.log,
    secrets = options.secrets or {},
    sessions = {},
    count = 0,
    serial = 0,
  }, Server)
  return self
end

--- Sends a structured record to the log, redacted, with its time.
function Server:log(record)
  if not self.log_fn then return end
  record.ts = os.date('!%Y-%m-%dT%H:%M:%SZ')
  local ok, err = pcall(self.log_fn, M.redact(record, self.secrets))
  if not ok then core.report('the mcp log failed: ' .. tostring(err)) end
end

local function random_id()
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(16)
  if f then f:close() end
  if not bytes or #bytes ~= 16 then
    errors.raise('INTERNAL', 'cannot read random bytes for a session id')
  end
  return (bytes:gsub('.', function(c) return string.format('%02x', c:byte()) end))
end
M.random_id = random_id

--- A new protocol session (not initialized). `transport` names where it came from, for the log.
function Server:session(transport)
  local s = setmetatable({
    server = self,
    id = random_id(),
    transport = transport,
    state = 'new',
    inflight = {},
    version = nil,
  }, Session)
  return s
end

--- The number of initialized sessions that have not ended.
function Server:active()
  return self.count
end

--- Ends every session.
function Server:close(reason)
  local list = {}
  for _, s in pairs(self.sessions) do list[#list + 1] = s end
  for _, s in ipairs(list) do s:close(reason or 'server closed') end
end

-- {======================================================
-- Session
-- =======================================================

--- Whether the session's revision takes batches.
function Session:batches()
  return BATCHES[self.version] == true
end

local function tool_list(tools)
  local out = {}
  for _, t in ipairs(tools or {}) do
    local schema = t.input and t.input.json_schema and t.input:json_schema()
      or { type = 'object', properties = empty_object() }
    out[#out + 1] = { name = t.id, description = t.description, inputSchema = schema }
  end
  return setmetatable(out, array_mt)
end

local function coded(err)
  if type(err) == 'table' and type(err.code) == 'string' then return err end
  return errors.wrap(err)
end

function Session:initialize(id, params)
  if self.state ~= 'new' then
    return error_response(id, M.INVALID_REQUEST, 'the session is already initialized')
  end
  if not is_object(params) or type(params.protocolVersion) ~= 'string' then
    return error_response(id, M.INVALID_PARAMS, 'initialize needs params.protocolVersion')
  end
  local server = self.server
  if server.max_sessions and server.count >= server.max_sessions then
    server:log({ event = 'session_refused', session = self.id, reason = 'max_sessions' })
    return error_response(id, M.SERVER_BUSY, 'the server has max_sessions (' .. server.max_sessions
      .. ') sessions open; try again once one ends')
  end
  local version = SUPPORTED[params.protocolVersion] and params.protocolVersion or M.LATEST
  local ok, tools_session = pcall(server.open_session, self.id, { transport = self.transport })
  if not ok then
    local err = coded(tools_session)
    server:log({ event = 'session_refused', session = self.id, code = err.code, message = err.message })
    return error_response(id, M.SERVER_BUSY, err.code .. ': ' .. tostring(err.message))
  end
  self.tools_session = tools_session
  self.version = version
  self.state = 'ready'
  server.sessions[self.id] = self
  server.count = server.count + 1
  local client = is_object(params.clientInfo) and params.clientInfo or {}
  server:log({ event = 'session_opened', session = self.id, transport = self.transport, protocol = version,
    client = type(client.name) == 'string' and client.name or nil })
  local result = {
    protocolVersion = version,
    capabilities = { tools = { listChanged = false } },
    serverInfo = { name = server.name, version = server.version },
  }
  if server.instructions then result.instructions = server.instructions end
  return result_response(id, result)
end

-- The result of a tools/call: the tool's result, or its coded error as isError.
local function call_result(ok, res)
  if ok then
    if type(res) ~= 'table' or getmetatable(res) == array_mt then res = { value = res } end
    return { content = setmetatable({ { type = 'text', text = json.encode(res) } }, array_mt),
      structuredContent = res, isError = false }
  end
  local err = coded(res)
  local text = err.code .. ': ' .. tostring(err.message)
  return { content = setmetatable({ { type = 'text', text = text } }, array_mt),
    structuredContent = { error = { code = err.code, message = tostring(err.message) } }, isError = true }
end

-- Sends progress for `token` at the start and then every interval until `stop` is cancelled;
-- `count` (shared with the call's own progress, a command's output) keeps `progress` rising.
local function progress_loop(self, progress_token, stop, send, started, count)
  local interval = self.server.progress_interval_ms
  while not stop.cancelled do
    count.n = count.n + 1
    send({ jsonrpc = '2.0', method = 'notifications/progress', params = {
      progressToken = progress_token, progress = count.n,
      message = count.n == 1 and 'started' or ('running for ' .. math.floor(now_ms() - started) .. ' ms') } })
    local ok = pcall(task.sleep, interval, stop)
    if not ok then break end
  end
end

function Session:call_tool(id, params, out)
  local server = self.server
  if not is_object(params) or type(params.name) ~= 'string' then
    return error_response(id, M.INVALID_PARAMS, 'tools/call needs params.name')
  end
  local args = params.arguments
  if args == nil or args == json.null then args = empty_object() end
  if not is_object(args) then
    return error_response(id, M.INVALID_PARAMS, 'tools/call params.arguments must be an object')
  end
  local known = false
  -- a declared tool that is not listed (not granted) is called all the same, to be refused with
  -- the grant it needs
  for _, t in ipairs(self.tools_session.declared or self.tools_session.tools or {}) do
    if t.id == params.name then known = true break end
  end
  if not known then
    server:log({ event = 'tool_call', session = self.id, request = id, tool = params.name, decision = 'unknown' })
    return error_response(id, M.INVALID_PARAMS, 'unknown tool: ' .. params.name)
  end
  local meta = params._meta
  local progress_token = is_object(meta) and meta.progressToken or nil
  if progress_token ~= nil and not valid_id(progress_token) then progress_token = nil end
  local token = task.cancel_token()
  local entry = { token = token }
  self.inflight[id_key(id)] = entry
  local started = now_ms()
  local stop_progress = task.cancel_token()
  local count = { n = 0 }
  if progress_token ~= nil then
    task.spawn(progress_loop, self, progress_token, stop_progress, out.send, started, count)
  end
  -- the call's own progress (a command's output as it comes): `message` is the text; `progress`
  -- goes on rising from where the interval's notifications are
  local function progress(update)
    if progress_token == nil or stop_progress.cancelled then return end
    count.n = count.n + 1
    out.send({ jsonrpc = '2.0', method = 'notifications/progress', params = {
      progressToken = progress_token, progress = count.n, message = update.text } })
  end
  local ok, res = pcall(self.tools_session.call, params.name, args,
    { signal = token, call_id = 'mcp_' .. tostring(id), progress = progress })
  stop_progress:cancel()
  self.inflight[id_key(id)] = nil
  local record = { event = 'tool_call', session = self.id, request = id, tool = params.name, input = args,
    ms = math.floor((now_ms() - started) * 1000) / 1000 }
  if ok then
    record.decision, record.ok = 'allowed', true
    if type(res) == 'table' then
      record.exit_code, record.timed_out = res.exit_code, res.timed_out
      record.cost_micros = res.cost_micros
    end
  else
    local err = coded(res)
    record.ok, record.code, record.message = false, err.code, tostring(err.message)
    record.decision = err.code == 'PERMISSION_DENIED' and 'denied' or 'allowed'
  end
  local usage = self.tools_session.usage
  if type(usage) == 'table' then
    record.usage = { tool_calls = usage.tool_calls, cost_micros = usage.cost_micros }
  end
  if entry.cancelled then record.cancelled = true end
  server:log(record)
  if entry.cancelled then return nil end
  return result_response(id, call_result(ok, res))
end

local handlers = {}

handlers['ping'] = function(_, id) return result_response(id, empty_object()) end

handlers['tools/list'] = function(self, id)
  return result_response(id, { tools = tool_list(self.tools_session.tools) })
end

handlers['tools/call'] = function(self, id, params, out)
  return self:call_tool(id, params, out)
end

-- Handles one request or notification (a decoded object); returns its response or nil.
function Session:dispatch(msg, out)
  if not is_object(msg) or msg.jsonrpc ~= '2.0' then
    local id = is_object(msg) and valid_id(msg.id) and msg.id or nil
    return error_response(id, M.INVALID_REQUEST, 'not a JSON-RPC 2.0 message')
  end
  local method, id, params = msg.method, msg.id, msg.params
  if method == nil then
    -- a response from the client: this server asks nothing, so there is nothing to match
    if valid_id(id) and (msg.result ~= nil or msg.error ~= nil) then return nil end
    return error_response(valid_id(id) and id or nil, M.INVALID_REQUEST, 'a message needs a method')
  end
  if type(method) ~= 'string' then
    return error_response(valid_id(id) and id or nil, M.INVALID_REQUEST, 'method must be a string')
  end
  if params ~= nil and params ~= json.null and type(params) ~= 'table' then
    return error_response(valid_id(id) and id or nil, M.INVALID_REQUEST, 'params must be an object or an array')
  end
  if id == nil then
    -- a notification: never answered
    if method == 'notifications/cancelled' and is_object(params) and valid_id(params.requestId) then
      local entry = self.inflight[id_key(params.requestId)]
      if entry then
        entry.cancelled = true
        self.server:log({ event = 'cancelled', session = self.id, request = params.requestId,
          reason = type(params.reason) == 'string' and params.reason or nil })
        entry.token:cancel(type(params.reason) == 'string' and params.reason or 'cancelled by the client')
      end
    end
    return nil
  end
  if not valid_id(id) then
    return error_response(nil, M.INVALID_REQUEST, 'id must be a string or an integer')
  end
  if method == 'initialize' then return self:initialize(id, params) end
  if self.state == 'new' and method ~= 'ping' then
    return error_response(id, M.INVALID_REQUEST, 'the session is not initialized')
  end
  if self.state == 'closed' then
    return error_response(id, M.INVALID_REQUEST, 'the session has ended')
  end
  local h = handlers[method]
  if not h then return error_response(id, M.METHOD_NOT_FOUND, 'method not found: ' .. method) end
  if self.inflight[id_key(id)] then
    return error_response(id, M.INVALID_REQUEST, 'a request with this id is already running')
  end
  local ok, res = pcall(h, self, id, params, out)
  if not ok then
    local err = coded(res)
    self.server:log({ event = 'internal_error', session = self.id, method = method, message = tostring(err.message) })
    return error_response(id, M.INTERNAL_ERROR, 'internal error')
  end
  return res
end

--- Whether `msg` (decoded) holds a request (which gets an answer).
function M.has_request(msg)
  if is_object(msg) then return msg.id ~= nil and msg.method ~= nil end
  if type(msg) == 'table' then
    for _, m in ipairs(msg) do
      if is_object(m) and m.id ~= nil and m.method ~= nil then return true end
    end
  end
  return false
end

--- Decodes `text`: the message, or nil and the error response to give.
function Session:decode(text)
  local msg, err = json.decode(text)
  if msg == nil and err ~= nil then
    return nil, error_response(nil, M.PARSE_ERROR, 'parse error: ' .. tostring(err.message or err))
  end
  if getmetatable(msg) == array_mt and not self:batches() then
    return nil, error_response(nil, M.INVALID_REQUEST, 'batches are not allowed in protocol revision '
      .. (self.version or '(not initialized)'))
  end
  if getmetatable(msg) == array_mt and #msg == 0 then
    return nil, error_response(nil, M.INVALID_REQUEST, 'an empty batch')
  end
  return msg
end

--- Handles one received message (text, or an already decoded `msg`) and answers through `out`.
-- Runs as a task; returns at once.
function Session:handle(text, out, msg)
  if msg == nil then
    local bad
    msg, bad = self:decode(text)
    if not msg then
      self.server:log({ event = 'bad_message', session = self.id, message = bad.error.message })
      out.reply(bad)
      return
    end
  end
  task.spawn(function()
    if getmetatable(msg) ~= array_mt then
      out.reply(self:dispatch(msg, out))
      return
    end
    -- a batch (2025-03-26): every request runs at once; one array answers those that get an answer
    local answers, pending = {}, #msg
    local finished = task.cancel_token()
    for i, m in ipairs(msg) do
      if is_object(m) and m.method == 'initialize' then
        answers[i] = error_response(valid_id(m.id) and m.id or nil, M.INVALID_REQUEST,
          'initialize cannot be part of a batch')
        pending = pending - 1
      else
        task.spawn(function()
          answers[i] = self:dispatch(m, out) or false
          pending = pending - 1
          if pending == 0 then finished:cancel() end
        end)
      end
    end
    if pending > 0 then
      task.await(function(done) finished:on_cancel(done) end)
    end
    local list = {}
    for i = 1, #msg do
      if answers[i] then list[#list + 1] = answers[i] end
    end
    out.reply(#list > 0 and setmetatable(list, array_mt) or nil)
  end)
end

--- Ends the session: cancels what runs, closes its tool session (releasing its sandbox). Again does nothing.
function Session:close(reason)
  if self.state == 'closed' then return end
  local was = self.state
  self.state = 'closed'
  for _, entry in pairs(self.inflight) do
    entry.cancelled = true
    entry.token:cancel('the session ended')
  end
  local server = self.server
  if was == 'ready' then
    server.sessions[self.id] = nil
    server.count = server.count - 1
    local ts = self.tools_session
    local ok, err = true, nil
    if ts and type(ts.close) == 'function' then
      ok, err = pcall(ts.close, ts)
    end
    server:log({ event = 'session_closed', session = self.id, reason = reason or 'closed', released = ok,
      message = not ok and tostring(coded(err).message) or nil })
  end
end

return M
