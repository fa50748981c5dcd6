--- mayura.sandbox.codesandbox: sandboxes on CodeSandbox (Firecracker VMs forked from a
-- template), through the API of its SDK (`https://api.codesandbox.io`) and the pitcher, the
-- agent in each VM, which speaks MessagePack over a WebSocket.
--
--   local codesandbox = require('mayura.sandbox.codesandbox')
--   local provider = codesandbox.codesandbox_sandboxes({ token = token })
--   local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000 })
--
-- Options: `token` (an API token, sent as `Authorization: Bearer`; required, never read from the
-- environment by this module), `base_url` (the API; for a service that speaks the same API
-- elsewhere), `template` (the sandbox forked for each new one; `pcz35m`, the service's universal
-- template, by default), `tier` (the VM size: 'Pico', 'Nano', 'Micro', 'Small', 'Medium',
-- 'Large', 'XLarge'; the service's default when not given), `workdir` (where relative paths and
-- commands start; `/project/workspace`, the service's workspace, by default), `max_lifetime_ms`
-- (24 hours by default), the client's `retries`, `retry_base_ms` and `max_retry_after_ms`, and
-- `warm` (sandboxes forked and started ahead for the pool, 0 to 64, none by default: a create with
-- the pool's labels and no image, cpus or memory takes one; mayura.sandbox._kit owns the lifecycle).
--
-- How the contract maps onto the service:
--   * create: `POST /sandbox/{template}/fork` (private, tagged `sdk` and `mayura`), then
--     `POST /vm/{id}/start` with `hibernation_timeout_seconds` = the lifetime in seconds (the
--     service allows 60 to 86400 here); the answer names the pitcher's URL and a token for it.
--     The service only hibernates an idle VM, so the pool's timer ends a sandbox at its lifetime;
--     a release is `DELETE /vm/{id}` (the sandbox is gone for good);
--   * commands and files: the whole contract runs on `command_sandbox_backend` over the
--     pitcher: one WebSocket per sandbox (`<pitcher_url>/?token=<pitcher_token>`), binary frames
--     of MessagePack (core.msgpack) — `client/join` once, then for each backend command
--     `shell/create` with the command, whose output comes as `shell/out` notifications and its end
--     as `shell/exit`. The pitcher runs commands in a terminal, which merges stdout and stderr
--     and ends each line with a carriage return, so each backend command runs in the terminal's
--     own shell and its answer comes after a marker as the terminal gives it (printable ASCII,
--     the carriage returns dropped), its exit code the shell's (no process runs around the
--     command); its standard error is dropped, and its standard input is /dev/null (the
--     backend passes input through files). A timeout or a cancel sends `shell/terminate` and
--     the backend kills the command's processes by their tag;
--   * network: 'all' only (the service has no egress policy); no ports (preview URLs need the
--     service's own host tokens); labels stay with the pool.
-- Failures are SandboxErrors without the service's text: HTTP statuses map as the kit maps them
-- (401/403 `authentication`, 429 retried after its `Retry-After`, then `rate_limited`); a 404 on
-- a sandbox, or a pitcher connection that ends while `GET /sandbox/{id}` says 404, is `gone`; a
-- connection that ends otherwise is `unavailable` (the next command starts the VM again and
-- reconnects). A pitcher error answer is `failed`.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local command = require('mayura.sandbox.command')
local ws = require('mayura.ws')

local json, mp = core.json, core.msgpack

local M = {}

M.DEFAULT_BASE_URL = 'https://api.codesandbox.io'
M.DEFAULT_TEMPLATE = 'pcz35m'
M.DEFAULT_WORKDIR = '/project/workspace'
M.MAX_LIFETIME_MS = 24 * 3600000
M.MAX_COMMAND_BYTES = 32768
M.PROTOCOL_VERSION = '0.367.10'
M.TIERS = { Pico = true, Nano = true, Micro = true, Small = true, Medium = true, Large = true, XLarge = true }
local MAX_MESSAGE_BYTES = 64 * 1048576
local DIRECT_MS = 60000   -- a command with a timeout up to this is one shell that waits for it
local BEGIN = '@@MAYURA-OUT:'

-- {======================================================
-- The pitcher connection
-- =======================================================

local Pitcher = {}
Pitcher.__index = Pitcher

local function pitcher_error(what)
  return errors.sandbox('unavailable', 'codesandbox: the pitcher connection ended (' .. what .. ')')
end

-- Connects and joins; raises SandboxErrors in our words.
local function connect(c, vm, signal)
  local url = vm.pitcher_url .. '/?token=' .. vm.pitcher_token
  local ok, conn = pcall(ws.connect, { url = url, timeout_ms = c.call_timeout_ms, signal = signal,
    max_message_bytes = MAX_MESSAGE_BYTES, headers = { ['User-Agent'] = hosted.USER_AGENT } })
  if not ok then
    local code = errors.is(conn) and conn.code
    if code == 'CANCELLED' then error(errors.new('CANCELLED', 'codesandbox: the command was cancelled'), 0) end
    if code == 'TIMEOUT' then
      error(errors.sandbox('timeout', 'codesandbox: no pitcher handshake within ' .. c.call_timeout_ms .. ' ms'), 0)
    end
    if code == 'CONNECT_FAILED' and (conn.status == 401 or conn.status == 403) then
      error(errors.sandbox('authentication', 'codesandbox: the pitcher refused its token (HTTP '
        .. conn.status .. ')'), 0)
    end
    if code == 'CONNECT_FAILED' and conn.status == 404 then
      error(errors.sandbox('gone', 'codesandbox: the pitcher does not know the sandbox'), 0)
    end
    error(errors.sandbox('unavailable', 'codesandbox: the pitcher could not be reached'), 0)
  end
  local p = setmetatable({ conn = conn, next_id = 0, pending = {}, shells = {}, dead = false }, Pitcher)
  p.reader = task.spawn(function() p:_read() end)
  return p
end

function Pitcher:_shell(id)
  local s = self.shells[id]
  if not s then
    s = { out = {} }
    self.shells[id] = s
  end
  return s
end

local function wake(s)
  local w = s.wake
  if w then
    s.wake = nil
    w()
  end
end

function Pitcher:_end()
  self.dead = true
  local pending = self.pending
  self.pending = {}
  for _, done in pairs(pending) do done(nil) end
  for _, s in pairs(self.shells) do wake(s) end
end

-- The reader: answers go to their requests, shell notifications to their shells.
function Pitcher:_read()
  while true do
    local ok, msg, binary = pcall(self.conn.receive, self.conn)
    if not ok or msg == nil then break end
    local v = binary and mp.decode(msg, { max_bytes = MAX_MESSAGE_BYTES })
    if type(v) == 'table' then
      if v.id ~= nil and v.id ~= json.null then
        local done = self.pending[v.id]
        self.pending[v.id] = nil
        if done then done(v) end
      elseif v.method == 'system/hibernate' then
        break
      elseif type(v.params) == 'table' and type(v.params.shellId) == 'string' then
        local s = self:_shell(v.params.shellId)
        if v.method == 'shell/out' and type(v.params.out) == 'string' then
          s.out[#s.out + 1] = v.params.out
        elseif v.method == 'shell/exit' then
          s.exit = check.is_int(v.params.exitCode) and v.params.exitCode or -1
          wake(s)
        elseif v.method == 'shell/terminate' then
          s.terminated = true
          wake(s)
        end
      end
    end
  end
  pcall(self.conn.close, self.conn)
  self:_end()
end

-- One request: its result, or raises (a pitcher error is `failed`, a dead connection nil).
function Pitcher:request(method, params, timeout_ms)
  if self.dead then error(pitcher_error(method), 0) end
  self.next_id = self.next_id + 1
  local id = self.next_id
  local ok = pcall(self.conn.send, self.conn, mp.encode({ id = id, method = method, params = params }), true)
  if not ok then
    self:_end()
    error(pitcher_error(method), 0)
  end
  local timer
  local v = task.await(function(done)
    self.pending[id] = done
    timer = task.after(timeout_ms, function()
      self.pending[id] = nil
      done(false)
    end, true)
  end)
  timer.cancel()
  if v == false then error(errors.sandbox('timeout', 'codesandbox: no answer to ' .. method .. ' within '
    .. timeout_ms .. ' ms'), 0) end
  if v == nil then error(pitcher_error(method), 0) end
  if v.status ~= 0 or type(v.result) ~= 'table' then
    error(errors.sandbox('failed', 'codesandbox: the pitcher refused ' .. method), 0)
  end
  return v.result
end

function Pitcher:close()
  if not self.dead then pcall(self.conn.close, self.conn) end
end

-- }======================================================

-- {======================================================
-- The transport
-- =======================================================

local Transport = {}
Transport.__index = Transport

-- After a connection that ended: gone when the service says the sandbox is, else unavailable.
function Transport:_why(err)
  if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'unavailable' then
    self.client:json('GET', '/sandbox/' .. hosted.escape(self.sandbox_id), nil, { gone = true, idempotent = true })
  end
  error(err, 0)
end

-- The live pitcher connection; a dead one is replaced (the VM started again if it stopped).
function Transport:_pitcher(signal)
  if self.pitcher and not self.pitcher.dead then return self.pitcher end
  local vm = self.vm
  if self.pitcher then
    vm = self.start_vm()
    self.vm = vm
  end
  local p = connect(self.client, vm, signal)
  local ok, err = pcall(p.request, p, 'client/join', {
    clientInfo = { protocolVersion = M.PROTOCOL_VERSION, appId = 'mayura' }, asyncProgress = false,
    subscriptions = { shell = { status = true }, client = { status = true } },
  }, self.client.call_timeout_ms)
  if not ok then
    p:close()
    error(err, 0)
  end
  self.pitcher = p
  return p
end

function Transport:run(script, o)
  local c = self.client
  -- the script's stdout after a marker, on the terminal as it is: the backend's scripts answer in
  -- printable ASCII lines (file bytes as base64), which a terminal passes on but for a carriage
  -- return before each newline (an answer with any other byte is refused), and end with the
  -- backend's end line; the exit code is the shell's. The script runs in the terminal's own
  -- shell, its standard input and error away from the terminal: no file, no process of its own
  local wrapped = "printf '\\n%s\\n' '" .. BEGIN .. "';exec </dev/null 2>/dev/null\n" .. script
  local ok, p = pcall(self._pitcher, self, o.signal)
  if not ok then return self:_why(p) end
  local rok, r = pcall(p.request, p, 'shell/create', { command = wrapped, cwd = self.workdir,
    size = { cols = 128, rows = 24 }, type = 'TERMINAL', isSystemShell = true }, c.call_timeout_ms)
  if not rok then return self:_why(r) end
  if type(r.shellId) ~= 'string' or r.shellId == '' or #r.shellId > 128 then
    error(c:bad_answer('a shell without an id'), 0)
  end
  local s = p:_shell(r.shellId)
  local deadline = core.hrtime_ms() + c.call_timeout_ms + (o.wait_ms or 0)
  while s.exit == nil and not s.terminated and not p.dead do
    local remaining = math.ceil(deadline - core.hrtime_ms())
    local timed_out, cancelled = remaining <= 0, o.signal and o.signal.cancelled
    if timed_out or cancelled then
      p.shells[r.shellId] = nil
      pcall(p.request, p, 'shell/terminate', { shellId = r.shellId }, 5000)
      if cancelled then error(errors.new('CANCELLED', 'codesandbox: the command was cancelled'), 0) end
      error(errors.sandbox('timeout', 'codesandbox: a command did not end within its call\'s time'), 0)
    end
    local timer, remove
    task.await(function(done)
      s.wake = done
      timer = task.after(remaining, done, true)
      if o.signal then remove = o.signal:on_cancel(done) end
    end)
    s.wake = nil
    timer.cancel()
    if remove then remove() end
  end
  p.shells[r.shellId] = nil
  if s.exit == nil then
    if s.terminated then error(errors.sandbox('failed', 'codesandbox: the pitcher ended a command'), 0) end
    return self:_why(pitcher_error('shell/create'))
  end
  local text = table.concat(s.out)
  local body = text:gsub('\r\n', '\n'):match(BEGIN:gsub('%p', '%%%0') .. '\n(.*)$')
  if not body or body:find('[^\n\32-\126]') or not check.is_int(s.exit) then
    error(c:bad_answer('a command\'s output without its marker'), 0)
  end
  return { exit_code = s.exit, stdout = body }
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local function check_vm(c, d)
  if type(d) ~= 'table' or type(d.pitcher_url) ~= 'string' or not d.pitcher_url:match('^wss?://[^%s%c?#]+$')
    or type(d.pitcher_token) ~= 'string' or d.pitcher_token == '' or #d.pitcher_token > 4096
    or d.pitcher_token:find('[^%w%-_.~]') then
    error(c:bad_answer('a started VM without its pitcher'), 0)
  end
  return { pitcher_url = d.pitcher_url:gsub('/+$', ''), pitcher_token = d.pitcher_token }
end

-- The `data` of the service's envelope.
local function data_of(c, body, what)
  if type(body) ~= 'table' or type(body.data) ~= 'table' then
    error(c:bad_answer('an answer to ' .. what .. ' without data'), 0)
  end
  return body.data
end

--- The provider (see the module's comment for `options`).
function M.codesandbox_sandboxes(options)
  local o = kit.options(options, {
    { token = kit.secret('a token (a string without spaces or control characters)') },
    { base_url = function(v, label)
      v = v or M.DEFAULT_BASE_URL
      if type(v) ~= 'string' or not v:match('^https?://[^%s%c?#]+$') then
        errors.raise('INVALID_CONFIG', label .. ': base_url must be an http:// or https:// URL', nil, 0)
      end
      return (v:gsub('/+$', ''))
    end },
    { template = kit.word('^[%w_%-]+$', 'a sandbox id', M.DEFAULT_TEMPLATE, 64) },
    { tier = function(v, label)
      if v ~= nil and not M.TIERS[v] then
        errors.raise('INVALID_CONFIG', label .. ': tier must be one of Pico, Nano, Micro, Small, Medium, Large, XLarge',
          nil, 0)
      end
      return v
    end },
    { workdir = kit.workdir(M.DEFAULT_WORKDIR) },
    { max_lifetime_ms = kit.int(60000, nil, M.MAX_LIFETIME_MS) },
    kit.RETRY_OPTIONS, kit.WARM_OPTION,
  }, 'codesandbox', 'options with a token are required')
  local workdir = o.workdir
  -- the token is kept out of every message
  local client = hosted.client({
    label = 'codesandbox', base_url = o.base_url, api_key = o.token,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_retry_after_ms = o.max_retry_after_ms or 20000,
  })

  local function destroy(ctx, h)
    if h.transport and h.transport.pitcher then h.transport.pitcher:close() end
    local c = ctx.client
    local ok, err = pcall(c.json, c, 'DELETE', '/vm/' .. hosted.escape(h.id), nil, { gone = true })
    if not ok and not (errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone') then error(err, 0) end
  end

  return kit.provider({
    id = 'codesandbox', label = 'codesandbox', client = client, options = o, command = true,
    features = { stdin = true, ports = false, desktop = false, network = { 'all' } },

    create = function(ctx)
      return ctx.client:json('POST', '/sandbox/' .. hosted.escape(o.template) .. '/fork', {
        privacy = 2, private_preview = true, title = 'mayura', tags = { 'sdk', 'mayura' }, path = '/SDK',
      })
    end,

    accept = function(ctx, body)
      local id = type(body) == 'table' and type(body.data) == 'table' and body.data.id
      return { id = ctx:id_of(id, '^[%w_%-]+$', 64, 'a forked sandbox without an id') }
    end,

    -- the VM started with the lifetime as its hibernation timeout, and the pitcher joined, as the SDK's
    -- connect does (the workdir comes with the first command)
    backend = function(ctx, h)
      local c, id = ctx.client, h.id
      local start = {
        hibernation_timeout_seconds = hosted.lifetime(ctx.spec.lifetime_ms, { unit = 's', min = 60, max = 86400 }),
        tier = o.tier,
      }
      local function start_vm()
        return check_vm(c, data_of(c, c:json('POST', '/vm/' .. hosted.escape(id) .. '/start', start,
          { gone = true }), 'start'))
      end
      h.transport = setmetatable({ client = c, sandbox_id = id, vm = start_vm(), start_vm = start_vm, stdin = false,
        max_command_bytes = M.MAX_COMMAND_BYTES, workdir = workdir, env = ctx.spec.env,
        wait_ms = hosted.wait_ms(c.call_timeout_ms, 60000), direct_ms = DIRECT_MS, make_workdir = true }, Transport)
      -- no `rate`: the pitcher documents none (the service's hourly limits are its API's, per plan,
      -- and a command sends none of those requests)
      h.transport:_pitcher()
      return command.command_sandbox_backend(id, h.transport, function() destroy(ctx, h) end)
    end,

    destroy = destroy,
  })
end

-- }======================================================

M.sandboxes = M.codesandbox_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
