--- mayura.sandbox.railway: sandboxes on Railway (Linux VMs from Railway's
-- default image), through its public GraphQL API
-- (`https://backboard.railway.com/graphql/v2`).
--
--   local railway = require('mayura.sandbox.railway')
--   local provider = railway.railway_sandboxes({ token = token, environment_id = env_id })
--   local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000 })
--
-- Options: `token` (an account or workspace token, sent as `Authorization:
-- Bearer`; with `token_kind = 'project'` a project token, sent as
-- `Project-Access-Token`; required, never read from the environment by this
-- module), `environment_id` (required: every sandbox lives in one
-- environment), `endpoint` (the GraphQL URL; for a service that speaks the
-- same API elsewhere), `exec` ('websocket' or 'graphql'), `ws_url` (the
-- exec bridge; from the endpoint's host by default), `region`,
-- `network_isolation` ('ISOLATED', the default, or 'PRIVATE', which joins the
-- environment's private network and lets a sandbox have ports), `workdir`
-- (where relative paths and commands start; `/workspace` by default, made at
-- create), `max_lifetime_ms` (24 hours by default), `exec_rate` (with `exec =
-- 'graphql'`, the rate its sandboxes' sandboxExec calls keep together: `{
-- per_second = 500 / 3600, burst = 9 }` by default, half of the API's
-- documented 1,000 requests an hour of the Hobby plan, within its 10 a second;
-- the exec bridge documents no rate), the client's `retries`,
-- `retry_base_ms` and `max_retry_after_ms`, and `warm` (sandboxes made ahead
-- for the pool, 0 to 64, none by default: a create with the pool's labels
-- and no image, cpus, memory or ports takes one; mayura.sandbox._kit owns
-- the lifecycle).
--
-- How the contract maps onto the service:
--   * create: `sandboxCreate` with the environment, the create spec's `env`
--     as `variables`, and `idleTimeoutMinutes` = the lifetime in minutes (the
--     service allows 1 to 120); a sandbox still `CREATING` is polled
--     (`sandbox(environmentId, id)`) until it is `RUNNING`. The service ends a
--     sandbox only when it is idle that long, so the pool's timer ends it at
--     its lifetime (a release is `sandboxDestroy`);
--   * commands and files: the whole contract runs on
--     `command_sandbox_backend` over the service's WebSocket exec bridge
--     (`exec = 'websocket'`, the default: a shell token from
--     `generateShellToken` as the subprotocol, `init_exec`, standard input as
--     `0x02` frames, stdout frames and the `exit` frame), or over
--     `sandboxExec(command, environmentId, id, timeoutSec)` (`exec =
--     'graphql'`), which runs one short command and answers with its exit
--     code and output: commands start in the background and are polled, files
--     move as base64 inside the command line, and a timeout or a cancel kills
--     every process of a command by its tag. Each backend command is sent as
--     `sh -c '<script>'`;
--   * network: 'all' only (the service has no egress policy); labels stay
--     with the pool (the service keeps none);
--   * ports: each of the create spec's `ports` (at most 10) is asked for as one
--     of `sandboxCreate`'s `publicDomains` ({ port }, the service names it),
--     and `url(port)` is `https://` and the domain the sandbox's `domains`
--     give for that port (read again until the route is published, within
--     the call's timeout). The service gives public domains only to a sandbox
--     created with `PRIVATE` network isolation (it then joins the
--     environment's private network), so `features.ports` is true only with
--     `network_isolation = 'PRIVATE'`; the service has no call that adds a
--     domain to a sandbox that runs.
-- Failures are SandboxErrors without the service's text. GraphQL errors come
-- with HTTP 200: one saying the caller is not authorized is `authentication`,
-- one saying the sandbox was not found `gone` (as is a `null` sandbox or one
-- `DESTROYING`, `DESTROYED` or `FAILED`), a rate limit `rate_limited`, any
-- other `failed`; HTTP statuses map as the kit maps them (401/403
-- `authentication`, 429 retried after its `Retry-After`).
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local scripts = require('mayura.sandbox.scripts')
local ws = require('mayura.ws')

local json = core.json

local M = {}

M.DEFAULT_ENDPOINT = 'https://backboard.railway.com/graphql/v2'
M.DEFAULT_WORKDIR = '/workspace'
M.MAX_LIFETIME_MS = 24 * 3600000
M.MAX_IDLE_MINUTES = 120
M.MAX_COMMAND_BYTES = 32768
M.MAX_DOMAINS = 10                  -- the service's limit on a sandbox's public domains
local DIRECT_MS = 60000
local EXEC_TIMEOUT_S = 60           -- the service's limit on one backend command (they are short)
local POLL_FIRST_MS, POLL_MAX_MS = 100, 2000

local SANDBOX_FIELDS = '{ id status domains { prefix port domain } }'
local Q_CREATE = 'mutation RailwaySandboxCreate($input: SandboxCreateInput!) { sandboxCreate(input: $input) '
  .. SANDBOX_FIELDS .. ' }'
local Q_GET = 'query RailwaySandbox($environmentId: String!, $id: String!) '
  .. '{ sandbox(environmentId: $environmentId, id: $id) ' .. SANDBOX_FIELDS .. ' }'
local Q_EXEC = 'mutation RailwaySandboxExec($command: String!, $environmentId: String!, $id: String!, '
  .. '$timeoutSec: Int) { sandboxExec(command: $command, environmentId: $environmentId, id: $id, '
  .. 'timeoutSec: $timeoutSec) { exitCode stdout stderr timedOut truncated } }'
local Q_TOKEN = 'mutation RailwayGenerateShellToken($input: ShellTokenInput!) { generateShellToken(input: $input) }'
local TOKEN_REUSE_MS = 4 * 60000     -- the service's shell tokens last 5 minutes
local STDIN_FRAME = 65536
local Q_DESTROY = 'mutation RailwaySandboxDestroy($id: String!, $environmentId: String!) '
  .. '{ sandboxDestroy(id: $id, environmentId: $environmentId) ' .. SANDBOX_FIELDS .. ' }'

-- {======================================================
-- GraphQL
-- =======================================================

-- What a GraphQL error says, in our words: its extensions' code or message is only matched,
-- never passed on.
local function classify(e)
  if type(e) ~= 'table' then return 'failed' end
  local words = {}
  if type(e.message) == 'string' then words[#words + 1] = e.message:sub(1, 512):lower() end
  if type(e.extensions) == 'table' and type(e.extensions.code) == 'string' then
    words[#words + 1] = e.extensions.code:sub(1, 128):lower()
  end
  local text = table.concat(words, ' ')
  if text:find('not authori[sz]ed') or text:find('unauthori[sz]ed') or text:find('unauthenticated')
    or text:find('forbidden') or text:find('invalid token') then
    return 'authentication'
  end
  if text:find('rate limit') or text:find('too many requests') or text:find('ratelimit') then return 'rate_limited' end
  if text:find('not found') or text:find('not_found') or text:find('does not exist') then return 'gone' end
  return 'failed'
end

-- One GraphQL operation: returns its `data`. `opts.gone`: the operation is about a sandbox that
-- existed (a not-found error is `gone`; else `failed`).
local function graphql(c, what, query, variables, opts)
  opts = opts or {}
  local body = c:json('POST', c.railway_path, { query = query, variables = variables }, {
    signal = opts.signal, timeout_ms = opts.timeout_ms, idempotent = opts.idempotent,
  })
  if type(body) ~= 'table' then error(c:bad_answer('an answer to ' .. what .. ' that is not an object'), 0) end
  if body.errors ~= nil and body.errors ~= json.null then
    if type(body.errors) ~= 'table' then error(c:bad_answer('errors that are not a list'), 0) end
    local reason = classify(body.errors[1])
    if reason == 'gone' and not opts.gone then reason = 'failed' end
    local msg = {
      authentication = 'railway: the service refused the token for ' .. what,
      rate_limited = 'railway: the service\'s rate limit stopped ' .. what,
      gone = 'railway: the sandbox is gone (' .. what .. ')',
      failed = 'railway: the service refused ' .. what,
    }
    error(errors.sandbox(reason, msg[reason]), 0)
  end
  if type(body.data) ~= 'table' then error(c:bad_answer('an answer to ' .. what .. ' without data'), 0) end
  return body.data
end

local function check_sandbox(c, s, what)
  if type(s) ~= 'table' or type(s.id) ~= 'string' or s.id == '' or #s.id > 128 or s.id:find('[%c%s]')
    or type(s.status) ~= 'string' then
    error(c:bad_answer('a sandbox that is not one (' .. what .. ')'), 0)
  end
  return s
end

-- The sandbox's public domains as port -> host name (a domain that is not a host name is not taken).
local function domains_of(s)
  local by_port = {}
  if type(s) == 'table' and type(s.domains) == 'table' then
    for _, d in ipairs(s.domains) do
      if type(d) == 'table' and check.is_int(d.port) and type(d.domain) == 'string' and #d.domain <= 253
        and d.domain:match('^[%w][%w%-]*%.[%w%.%-]*[%w]$') and not d.domain:find('..', 1, true) then
        by_port[d.port] = d.domain:lower()
      end
    end
  end
  return by_port
end

-- }======================================================

-- {======================================================
-- The transport: sandboxExec
-- =======================================================

local Transport = {}
Transport.__index = Transport

-- url(port): the domain the service published for the port, read again until it is there.
local function url(self, port)
  local c = self.client
  local deadline = core.hrtime_ms() + c.call_timeout_ms
  local wait
  while not self.domains[port] do
    if wait then
      if core.hrtime_ms() >= deadline then
        error(errors.sandbox('timeout', 'railway: the service published no domain for port ' .. port .. ' within '
          .. c.call_timeout_ms .. ' ms'), 0)
      end
      task.sleep(wait)
    end
    wait = math.min((wait or POLL_FIRST_MS / 2) * 2, POLL_MAX_MS)
    local data = graphql(c, 'sandbox', Q_GET, { environmentId = self.environment_id, id = self.sandbox_id },
      { gone = true, idempotent = true })
    local sb = data.sandbox
    if sb == nil or sb == json.null or (type(sb) == 'table' and sb.status ~= 'RUNNING' and sb.status ~= 'CREATING') then
      error(errors.sandbox('gone', 'railway: the sandbox is gone (url)'), 0)
    end
    self.domains = domains_of(sb)
  end
  return 'https://' .. self.domains[port]
end
Transport.url = url

function Transport:run(script, o)
  local c = self.client
  local data = graphql(c, 'sandboxExec', Q_EXEC, {
    command = 'sh -c ' .. scripts.quote(script), environmentId = self.environment_id, id = self.sandbox_id,
    timeoutSec = EXEC_TIMEOUT_S,
  }, { gone = true, signal = o.signal, timeout_ms = c.call_timeout_ms + (o.wait_ms or 0) })
  local r = data.sandboxExec
  if r == nil or r == json.null then
    error(errors.sandbox('gone', 'railway: the sandbox is gone (sandboxExec)'), 0)
  end
  if type(r) ~= 'table' or not check.is_int(r.exitCode) or type(r.stdout) ~= 'string' then
    error(c:bad_answer('a command result that is not one'), 0)
  end
  if r.timedOut == true then error(errors.sandbox('timeout', 'railway: a backend command timed out'), 0) end
  if r.truncated == true then error(c:bad_answer('a backend command\'s output cut short'), 0) end
  return { exit_code = r.exitCode, stdout = r.stdout }
end

-- }======================================================

-- {======================================================
-- The transport: the WebSocket exec bridge
-- =======================================================

local WsTransport = {}
WsTransport.__index = WsTransport
WsTransport.url = url

-- A shell token for this sandbox (one is used for every connection for a few minutes).
function WsTransport:_jwt(signal)
  local now = core.hrtime_ms()
  if self._token and now < self._token_until then return self._token end
  local data = graphql(self.client, 'generateShellToken', Q_TOKEN, { input = { environmentId = self.environment_id,
    instanceId = self.sandbox_id, kind = 'sandbox', scope = 'shell' } }, { gone = true, signal = signal })
  local t = data.generateShellToken
  if type(t) ~= 'string' or t == '' or #t > 8192 or t:find('[%s%c,]') then
    error(self.client:bad_answer('a shell token that is not one'), 0)
  end
  self._token, self._token_until = t, now + TOKEN_REUSE_MS
  return t
end

-- After a connection that ended without an exit: gone when the sandbox is, else unavailable.
function WsTransport:_why()
  local data = graphql(self.client, 'sandbox', Q_GET, { environmentId = self.environment_id, id = self.sandbox_id },
    { gone = true, idempotent = true })
  local sb = data.sandbox
  if sb == nil or sb == json.null or (type(sb) == 'table' and sb.status ~= 'RUNNING' and sb.status ~= 'CREATING') then
    error(errors.sandbox('gone', 'railway: the sandbox is gone (its command\'s connection ended)'), 0)
  end
  error(errors.sandbox('unavailable', 'railway: a command\'s connection ended before its exit'), 0)
end

function WsTransport:_connect(signal)
  local c = self.client
  local ok, conn = pcall(ws.connect, { url = self.ws_url, protocols = 'railway-shell, ' .. self:_jwt(signal),
    timeout_ms = c.call_timeout_ms, signal = signal, max_message_bytes = c.max_message_bytes,
    headers = { ['User-Agent'] = hosted.USER_AGENT } })
  if ok then return conn end
  local code = errors.is(conn) and conn.code
  if code == 'CANCELLED' then error(errors.new('CANCELLED', 'railway: the command was cancelled'), 0) end
  if code == 'TIMEOUT' then
    error(errors.sandbox('timeout', 'railway: no WebSocket handshake within ' .. c.call_timeout_ms .. ' ms'), 0)
  end
  if code == 'CONNECT_FAILED' and (conn.status == 401 or conn.status == 403) then
    self._token = nil
    error(errors.sandbox('authentication', 'railway: the exec bridge refused the shell token (HTTP '
      .. conn.status .. ')'), 0)
  end
  if code == 'CONNECT_FAILED' and conn.status == 429 then
    error(errors.sandbox('rate_limited', 'railway: the exec bridge\'s rate limit (HTTP 429)'), 0)
  end
  if code == 'CONNECT_FAILED' and conn.status == 404 then return self:_why() end
  error(errors.sandbox('unavailable', 'railway: the exec bridge could not be reached'), 0)
end

function WsTransport:run(script, o)
  local c = self.client
  local conn = self:_connect(o.signal)
  local out, exit_code = {}, nil
  local ok, err = pcall(function()
    -- the bridge runs the command string with sh -c
    conn:send(json.encode({ type = 'init_exec', data = { command = script } }))
    local stdin = o.stdin or ''
    for i = 1, #stdin, STDIN_FRAME do conn:send('\2' .. stdin:sub(i, i + STDIN_FRAME - 1), true) end
    conn:send('{"type":"stdin_close"}')
    local deadline = core.hrtime_ms() + c.call_timeout_ms + (o.wait_ms or 0)
    while true do
      local remaining = math.ceil(deadline - core.hrtime_ms())
      if remaining <= 0 then error(errors.sandbox('timeout', 'railway: no exit within the call\'s time'), 0) end
      local rok, msg, binary = pcall(conn.receive, conn, { timeout_ms = remaining, signal = o.signal })
      if not rok then
        if errors.is(msg, 'CANCELLED') then error(errors.new('CANCELLED', 'railway: the command was cancelled'), 0) end
        error(errors.sandbox('timeout', 'railway: no exit within the call\'s time'), 0)
      end
      if msg == nil then break end
      if binary then
        if msg:byte(1) == 1 and #msg > 1 then out[#out + 1] = msg:sub(2) end
      else
        local v = hosted.decode(msg)
        if type(v) == 'table' and v.type == 'exit' then
          local d = type(v.data) == 'table' and v.data or {}
          exit_code = d.exit_code == nil and 0 or d.exit_code
          if not check.is_int(exit_code) then error(c:bad_answer('an exit without a code'), 0) end
          break
        end
      end
    end
  end)
  conn:close()
  if not ok then error(err, 0) end
  if exit_code == nil then return self:_why() end
  return { exit_code = exit_code, stdout = table.concat(out) }
end

-- {======================================================
-- The provider
-- =======================================================

local function destroy(c, environment_id, id)
  local ok, err = pcall(graphql, c, 'sandboxDestroy', Q_DESTROY, { id = id, environmentId = environment_id },
    { gone = true, idempotent = true })
  if not ok and not (errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone') then error(err, 0) end
end

local function one_of(values, what)
  return function(v, label, name)
    if v == nil then return values[1] end
    for _, x in ipairs(values) do if v == x then return v end end
    errors.raise('INVALID_CONFIG', label .. ': ' .. name .. ' must be ' .. what, nil, 0)
  end
end

local function endpoint_option(v, label)
  local origin, path
  if type(v or M.DEFAULT_ENDPOINT) == 'string' then
    origin, path = (v or M.DEFAULT_ENDPOINT):match('^(https?://[^/%s]+)(/[^%s%c?#]*)$')
  end
  if not origin then
    errors.raise('INVALID_CONFIG', label .. ': endpoint must be an http:// or https:// URL with a path', nil, 0)
  end
  return { origin = origin, path = path }
end

--- The provider (see the module's comment for `options`).
function M.railway_sandboxes(options)
  local o = kit.options(options, {
    { token = kit.secret('a token (a string without spaces or control characters)') },
    { token_kind = one_of({ 'account', 'project' }, '\'account\' or \'project\'') },
    { environment_id = kit.required(kit.word('^[%w_%-]+$', 'an id (letters, digits, - and _)', nil, 128)) },
    { endpoint = endpoint_option },
    { region = kit.word('^[%w_%-]+$', 'a region name', nil, 64) },
    { network_isolation = one_of({ 'ISOLATED', 'PRIVATE' }, '\'ISOLATED\' or \'PRIVATE\'') },
    { exec = one_of({ 'websocket', 'graphql' }, '\'websocket\' or \'graphql\'') },
    { ws_url = kit.word('^wss?://[^/%s@]+/[^%s%c]*$', 'a ws:// or wss:// URL with a path', nil, 4096) },
    { workdir = kit.workdir(M.DEFAULT_WORKDIR) },
    { max_lifetime_ms = kit.int(60000, nil, M.MAX_LIFETIME_MS) },
    { exec_rate = function(v)
      return hosted.rate_option(v, 'railway', 'exec_rate', { per_second = 500 / 3600, burst = 9 })
    end },
    kit.RETRY_OPTIONS, kit.WARM_OPTION,
  }, 'railway', 'options with token and environment_id are required')
  local env_id, workdir, exec, isolation = o.environment_id, o.workdir, o.exec, o.network_isolation
  local origin, path = o.endpoint.origin, o.endpoint.path
  -- the service's bridge by default: the API's host with backboard. made ssh., port 2226
  local ws_url = o.ws_url or 'wss://ssh.' .. (origin:match('^https?://([^/:]+)'):gsub('^backboard%.', ''))
    .. ':2226/ws/exec'
  -- the token is kept out of every message
  local client = hosted.client({
    label = 'railway', base_url = origin, api_key = o.token,
    auth_header = o.token_kind == 'project' and 'Project-Access-Token' or 'Authorization',
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms or 20000,
  })
  client.railway_path = path
  -- the GraphQL API's documented rate (the Hobby plan's 1,000 requests an hour and 10 a second):
  -- sandboxExec calls of the provider's sandboxes share a bucket of half the hour (9 at once, then
  -- 500 an hour); the exec bridge documents none
  local graphql_rate = exec == 'graphql' and o.exec_rate or nil

  return kit.provider({
    id = 'railway', label = 'railway', client = client, options = o, command = true,
    features = { stdin = true, ports = isolation == 'PRIVATE', desktop = false, network = { 'all' } },
    ready_interval_ms = 100, ready_backoff_max_ms = 2000,

    create = function(ctx)
      local spec = ctx.spec
      local domains
      if spec.ports and #spec.ports > 0 then
        if #spec.ports > M.MAX_DOMAINS then
          errors.raise('INVALID_INPUT', 'railway: a sandbox has at most ' .. M.MAX_DOMAINS .. ' public domains',
            nil, 0)
        end
        domains = setmetatable({}, json.array_mt)
        for i, port in ipairs(spec.ports) do domains[i] = { port = port } end
      end
      local input = {
        environmentId = env_id,
        idleTimeoutMinutes = hosted.lifetime(spec.lifetime_ms, { unit = 'min', max = M.MAX_IDLE_MINUTES }),
        networkIsolation = isolation, region = o.region, variables = hosted.env_object(spec.env),
        publicDomains = domains,
      }
      return graphql(ctx.client, 'sandboxCreate', Q_CREATE, { input = input }).sandboxCreate
    end,

    accept = function(ctx, answer)
      local s = check_sandbox(ctx.client, answer, 'sandboxCreate')
      return { id = s.id, s = s }
    end,

    -- a sandbox still CREATING is read again until it runs
    ready = function(ctx, h)
      if h.s.status == 'CREATING' then
        local data = graphql(ctx.client, 'sandbox', Q_GET, { environmentId = env_id, id = h.id },
          { gone = true, idempotent = true })
        if data.sandbox == nil or data.sandbox == json.null then
          error(errors.sandbox('gone', 'railway: the sandbox vanished while it started'), 0)
        end
        h.s = check_sandbox(ctx.client, data.sandbox, 'sandbox')
        if h.s.status == 'CREATING' then return false end
      end
      if h.s.status ~= 'RUNNING' then
        error(errors.sandbox('failed', 'railway: the sandbox did not start (it is '
          .. (ctx.client:_safe_code(h.s.status) or 'in an unknown state') .. ')'), 0)
      end
      return true
    end,

    backend = function(ctx, h)
      local c = ctx.client
      local transport = setmetatable({
        client = c, environment_id = env_id, sandbox_id = h.id, stdin = exec == 'websocket',
        max_command_bytes = M.MAX_COMMAND_BYTES, workdir = workdir, make_workdir = true, ws_url = ws_url,
        domains = domains_of(h.s), wait_ms = hosted.wait_ms(c.call_timeout_ms, (EXEC_TIMEOUT_S - 10) * 1000),
        rate = graphql_rate,
        -- a short command is one exec that waits for it: the bridge has no limit of its own, sandboxExec
        -- the HTTP proxy's minute
        direct_ms = exec == 'websocket' and DIRECT_MS or (EXEC_TIMEOUT_S - 10) * 1000,
      }, exec == 'websocket' and WsTransport or Transport)
      return sandbox.command_sandbox_backend(h.id, transport, function() destroy(c, env_id, h.id) end)
    end,

    destroy = function(ctx, h) destroy(ctx.client, env_id, h.id) end,
  })
end

-- }======================================================

M.sandboxes = M.railway_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
