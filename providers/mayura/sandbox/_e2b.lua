--- mayura.sandbox._e2b: what the E2B providers share (mayura.sandbox.e2b and
-- mayura.sandbox.e2b_desktop): E2B's control plane and the envd data plane of
-- each sandbox, over the hosted kit (mayura.sandbox._hosted).
--
-- Control plane (`api_url`, https://api.<domain> by default; the key in
-- X-API-Key): POST /v2/sandboxes makes a sandbox from the template with
-- `timeout` = the lifetime in seconds (rounded up), `metadata` = the labels,
-- `envVars` = the sandbox's env and the network (every sandbox made so is
-- secured: envd wants the access token the answer holds): 'none' is allow_internet_access false,
-- 'all' true, { allow = ... } is allowOut with those domains and denyOut
-- 0.0.0.0/0 (E2B filters domains on ports 80 and 443). DELETE
-- /sandboxes/{id} ends it (404: it ended already).
--
-- Data plane: envd in the sandbox, at https://49983-<id>.<domain>, or at
-- `sandbox_url` for every sandbox (as the official SDK's sandboxUrl), with
-- E2b-Sandbox-Id and E2b-Sandbox-Port on every request and the access token
-- in X-Access-Token (never the API key). Commands are Connect streams,
-- process.Process/Start: the argv as cmd + args (no shell), cwd, envs, the
-- timeout as Connect-Timeout-Ms, stdout and stderr as base64 events, the exit
-- in the end event. Standard input goes with SendInput in chunks once the start
-- event named the pid, then CloseStdin (envd 0.5.2 and later). Each command
-- carries MAYURA_EXEC=<tag> in its environment: envd's timeout kills only the
-- command's own process, so at a timeout, a cancel or a stream cut midway the
-- provider runs `sandbox_scripts.kill(tag)` in the sandbox (and SendSignal
-- SIGKILL to the pid), which ends every process the command started, setsid'd
-- ones too. Files: GET /files (with a Range of max_bytes + 1 bytes, so a large
-- file is refused without being sent), POST /files (raw bytes from envd 0.5.7,
-- multipart before), filesystem.Filesystem/ListDir, Stat and Remove (Remove is
-- always recursive in envd, so a remove without `recursive` first looks at
-- what is there).
--
-- Snapshots (mayura.sandbox.e2b says 'native'): POST /sandboxes/{id}/snapshots (the sandbox is
-- paused while it is made) answers a snapshot ID, which POST /v2/sandboxes takes as its
-- templateID and DELETE /templates/{id} deletes (404: gone already). The answer holds no size:
-- size_bytes is 0. A snapshot call whose answer was lost (a timeout, a cut, a 5xx, no usable ID)
-- lists GET /snapshots?sandboxID= and deletes what this backend did not make.
--
-- Failures are SANDBOX_ERROR with the kit's reasons, never the service's text:
-- 401/403 authentication, 404 on the control plane and 502 from the sandbox's
-- proxy `gone` (a command's stream cut midway, or envd's `unavailable`, asks
-- the control plane: 404 there is `gone` too), 429 rate_limited (after the
-- kit's retries, honouring retry-after), 5xx unavailable, no answer in time
-- `timeout`. Templates with envd before 0.4.0 get the user `user` named. A create that
-- timed out or was cut may still have made a sandbox: the provider then looks
-- for it by a label of its own (`mayura.create`) and kills it.
--
-- `M.config(options, defaults, extra_keys)` checks the options;
-- `M.provider(config, spec)` builds the provider table; a backend offers,
-- besides the pool's calls, `shell(command, opts)` (a command string run as
-- the official SDK runs it, `/bin/bash -l -c`) and `background(command)` (the
-- same, left running once it started), which the desktop uses.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local scripts = require('mayura.sandbox.scripts')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')

local M = {}

local json, b64 = core.json, core.base64

M.ENVD_PORT = 49983
M.DEFAULT_DOMAIN = 'e2b.app'
M.MAX_LIFETIME_MS = 24 * 3600000            -- E2B Pro; Hobby allows an hour
local GONE = { 502 }                        -- envd's proxy: the sandbox was not found
local STDIN_CHUNK = 256 * 1024              -- raw bytes per SendInput
local KILL_TIMEOUT_MS = 10000

local function int(v)
  return math.tointeger and math.tointeger(v) or v
end

-- {======================================================
-- Options
-- =======================================================

local function domain_option(v, label)
  if v == nil then return M.DEFAULT_DOMAIN end
  if type(v) ~= 'string' or not v:match('^[%w][%w%.%-]*%w$') or v:find('..', 1, true) or #v > 200 then
    errors.raise('INVALID_CONFIG', label .. ': domain must be a domain name such as e2b.app', nil, 0)
  end
  return v:lower()
end

local function workdir_option(v, label)
  if v == nil then return '/home/user' end
  if type(v) ~= 'string' or v:sub(1, 1) ~= '/' or #v > 1024 or v:find('%z') then
    errors.raise('INVALID_CONFIG', label .. ': workdir must be an absolute path', nil, 0)
  end
  return v
end

local function taken(v) return v end

--- Checks the options of an E2B provider: `defaults` = { template, label };
-- `extra_keys` the provider's own options (checked by it). Returns the config.
function M.config(options, defaults, extra_keys)
  local declared = {
    -- the library reads no environment: the key comes from the caller
    { api_key = kit.secret('the E2B API key (a string without spaces)') },
    { template = kit.word('^[%w][%w_%.:/%-]*$', 'a template ID or alias', defaults.template) },
    { domain = domain_option },
    { api_url = kit.url() },
    { sandbox_url = kit.url() },
    { workdir = workdir_option },
    -- every sandbox of POST /v2/sandboxes is secured: `secure` is taken, as by the SDK, and changes nothing
    { secure = kit.bool() },
    { max_lifetime_ms = kit.int(1000, 30 * 86400000, M.MAX_LIFETIME_MS) },
    { retries = kit.int(0, 10, 2) },
    { retry_base_ms = kit.int(0, 60000, 200) },
    { warm = kit.int(0, 64, 0) },
  }
  for k in pairs(extra_keys or {}) do declared[#declared + 1] = { [k] = taken } end
  local config = kit.options(options, declared, defaults.label, 'options with api_key are required')
  config.label = defaults.label
  config.api_url = config.api_url or ('https://api.' .. config.domain)
  return config
end

-- }======================================================

-- {======================================================
-- Helpers
-- =======================================================

-- 'a.b.c' compared as numbers with 'x.y.z': whether `v` is at least `want`.
local function version_at_least(v, want)
  if type(v) ~= 'string' then return false end
  local a, b = {}, {}
  for n in v:gmatch('%d+') do a[#a + 1] = tonumber(n) end
  for n in want:gmatch('%d+') do b[#b + 1] = tonumber(n) end
  for i = 1, #b do
    local x = a[i] or 0
    if x ~= b[i] then return x > b[i] end
  end
  return true
end
M.version_at_least = version_at_least

local days_from_civil = require('mayura.http').days_from_civil

--- ms since the epoch of an RFC 3339 time ('2026-01-02T03:04:05.123Z', '...+02:00'), or nil.
function M.rfc3339_ms(s)
  if type(s) ~= 'string' or #s > 64 then return nil end
  local y, mo, d, h, mi, sec, frac, tz = s:match('^(%d%d%d%d)%-(%d%d)%-(%d%d)[Tt ](%d%d):(%d%d):(%d%d)(%.?%d*)(.*)$')
  if not y then return nil end
  y, mo, d, h, mi, sec = tonumber(y), tonumber(mo), tonumber(d), tonumber(h), tonumber(mi), tonumber(sec)
  if mo < 1 or mo > 12 or d < 1 or d > 31 or h > 23 or mi > 59 or sec > 60 then return nil end
  local offset = 0
  if tz ~= 'Z' and tz ~= 'z' then
    local sign, oh, om = tz:match('^([%+%-])(%d%d):(%d%d)$')
    if not sign then return nil end
    offset = (tonumber(oh) * 60 + tonumber(om)) * 60
    if sign == '-' then offset = -offset end
  end
  local ms = 0
  if frac ~= '' then
    if #frac < 2 or #frac > 10 then return nil end
    ms = tonumber((frac:sub(2) .. '00'):sub(1, 3))
  end
  local t = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60 + sec - offset
  return int(t * 1000 + ms)
end

-- Go's names of signals (os.ProcessState: "signal: killed") and their numbers.
local SIGNALS = {
  hangup = 1, interrupt = 2, quit = 3, ['illegal instruction'] = 4, ['trace/breakpoint trap'] = 5, aborted = 6,
  ['bus error'] = 7, ['floating point exception'] = 8, killed = 9, ['user defined signal 1'] = 10,
  ['segmentation fault'] = 11, ['user defined signal 2'] = 12, ['broken pipe'] = 13, ['alarm clock'] = 14,
  terminated = 15,
}

local FILE_TYPES = { FILE_TYPE_FILE = 'file', FILE_TYPE_DIRECTORY = 'directory', FILE_TYPE_SYMLINK = 'symlink',
  [1] = 'file', [2] = 'directory', [3] = 'symlink' }

local object, array = kit.object, kit.array

-- }======================================================

-- {======================================================
-- A sandbox
-- =======================================================

local Backend = {}
Backend.__index = Backend
Backend.streaming = true   -- exec passes each data event on as it comes, and tells on_start the pid

local function gone(label)
  return errors.sandbox('gone', label .. ': the sandbox was released')
end

function Backend:_alive()
  if self._released then error(gone(self._label), 0) end
end

-- A Connect unary call to envd: the decoded answer, or nil and the status for one of `allow`.
function Backend:_rpc(name, body, opts)
  opts = opts or {}
  local res_body, res = self.envd:json('POST', '/' .. name, body, {
    headers = { ['Connect-Protocol-Version'] = '1' }, gone = GONE, allow = opts.allow,
    on_error = opts.on_error, signal = opts.signal, timeout_ms = opts.timeout_ms,
    idempotent = opts.idempotent,
  })
  if res.status < 200 or res.status >= 300 then return nil, res.status, res_body end
  return res_body, res.status
end

-- What a failed Start means in our words (the service's text never shows).
local function start_error(status, code)
  if status == 400 and (code == 'invalid_argument' or code == nil) then
    return errors.new('INVALID_INPUT', 'the command cannot start there (its cwd does not exist or is not a directory)')
  end
  if status == 404 and code == 'not_found' then
    return errors.new('INVALID_INPUT', 'the command\'s program or cwd does not exist')
  end
  return nil
end

local function file_error(what)
  return function(status, code)
    if status == 400 then
      if code == 'invalid_argument' then return errors.new('INVALID_INPUT', what .. ' is not a directory') end
      return errors.new('INVALID_INPUT', what .. ' is a directory or not a usable path')
    end
    if status == 403 or (status == 401 and code == 'permission_denied') then
      return errors.new('PERMISSION_DENIED', what .. ': the sandbox does not allow it')
    end
    if status == 413 or status == 507 then
      return errors.new('LIMIT_EXCEEDED', 'the sandbox has no space left for ' .. what)
    end
    return nil
  end
end

--- Starts a process (`process` = { cmd, args, envs, cwd }) and reads its stream.
-- `o` = { timeout_ms (the command's, or nil: none), stream_timeout_ms, max_output_bytes, stdin,
-- signal, background (stop reading once it started), on_output(name, bytes) (each data event's
-- bytes as it comes), on_start({ pid, kill(signal) }) }. Returns { pid, stdout, stderr, truncated,
-- ended (the end event), err (the kit's error when the stream failed) }.
function Backend:_process(process, o)
  local cap = o.max_output_bytes or 1048576
  local bufs, sizes = { stdout = {}, stderr = {} }, { stdout = 0, stderr = 0 }
  local st = { truncated = false }
  local stdin_task, stdin_token
  local label = self._label
  local function bad(what) return errors.sandbox('failed', label .. ': the sandbox answered with ' .. what) end
  local function feed()
    local data, i = o.stdin, 1
    while i <= #data do
      self:_rpc('process.Process/SendInput', {
        process = { pid = st.pid }, input = { stdin = b64.encode(data:sub(i, i + STDIN_CHUNK - 1)) },
      }, { signal = stdin_token })
      i = i + STDIN_CHUNK
    end
    self:_rpc('process.Process/CloseStdin', { process = { pid = st.pid } }, { signal = stdin_token })
  end
  local function on_event(msg)
    local ev = type(msg) == 'table' and msg.event
    if type(ev) ~= 'table' then error(bad('a process event that is not an object'), 0) end
    if ev.start ~= nil then
      local pid = type(ev.start) == 'table' and ev.start.pid or nil
      if not check.is_int(pid) or pid < 0 then error(bad('a start event without a pid'), 0) end
      st.pid = int(pid)
      if o.background then return false end
      if o.on_start then
        o.on_start({ pid = st.pid, kill = function(sig)
          if st.ended or self._released then return end
          -- envd's signals: SIGTERM, or SIGKILL for every other
          task.spawn(function()
            pcall(self._rpc, self, 'process.Process/SendSignal', { process = { pid = st.pid },
              signal = sig == 15 and 'SIGNAL_SIGTERM' or 'SIGNAL_SIGKILL' },
              { allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS })
          end)
        end })
      end
      if o.stdin ~= nil and not stdin_task then
        stdin_token = task.cancel_token()
        -- a command that ends without reading all of it makes the rest fail: no matter
        stdin_task = task.spawn(function() pcall(feed) end)
      end
    elseif ev.data ~= nil then
      if type(ev.data) ~= 'table' then error(bad('a data event that is not an object'), 0) end
      for name, text in pairs(ev.data) do
        local buf = (name == 'stdout' or name == 'pty') and 'stdout' or name == 'stderr' and 'stderr' or nil
        if buf and type(text) == 'string' then
          local ok, bytes = pcall(b64.decode, text)
          if not ok or not bytes then error(bad('output that is not base64'), 0) end
          local room = cap - sizes[buf]
          if #bytes > room then bytes, st.truncated = bytes:sub(1, math.max(room, 0)), true end
          if #bytes > 0 then
            sizes[buf] = sizes[buf] + #bytes
            bufs[buf][#bufs[buf] + 1] = bytes
            if o.on_output then o.on_output(buf, bytes) end   -- streamed as the events come
          end
        end
      end
    elseif ev['end'] ~= nil then
      if type(ev['end']) ~= 'table' then error(bad('an end event that is not an object'), 0) end
      st.ended = ev['end']
    end
    -- keepalive and events of later versions: nothing to do
  end
  local headers = { ['Keepalive-Ping-Interval'] = '50' }
  if o.timeout_ms then headers['Connect-Timeout-Ms'] = string.format('%d', o.timeout_ms) end
  local ok, trailer = pcall(self.envd.stream, self.envd, 'POST', '/process.Process/Start',
    { process = process, stdin = o.stdin ~= nil }, {
      format = 'connect', on_event = on_event, gone = GONE, signal = o.signal, headers = headers,
      timeout_ms = o.stream_timeout_ms, on_error = start_error,
    })
  if stdin_task then
    if not stdin_task.done then
      -- the process ended (or the stream failed) before it took all its input
      if ok and st.ended then
        pcall(stdin_task.wait, stdin_task)
      else
        stdin_token:cancel()
        pcall(stdin_task.wait, stdin_task)
      end
    end
  end
  st.stdout, st.stderr = table.concat(bufs.stdout), table.concat(bufs.stderr)
  if not ok then st.err = trailer end
  return st
end

-- _process, raising its error.
function Backend:_process_or_raise(process, o)
  local st = self:_process(process, o)
  if st.err then error(st.err, 0) end
  return st
end

-- Ends every process of a command: SIGKILL to its pid, then the tag's whole tree. Returns the
-- error of the kill script, if it failed.
function Backend:_kill(tag, pid)
  if pid then
    pcall(self._rpc, self, 'process.Process/SendSignal', { process = { pid = pid }, signal = 'SIGNAL_SIGKILL' },
      { allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS })
  end
  local ok, st = pcall(self._process, self, { cmd = '/bin/sh', args = array({ '-c', scripts.kill(tag) }) },
    { timeout_ms = KILL_TIMEOUT_MS, stream_timeout_ms = KILL_TIMEOUT_MS + 2000, max_output_bytes = 4096 })
  if not ok then return st end
  return st.err
end

-- Whether the control plane says the sandbox is gone (404 to GET /sandboxes/{id}).
function Backend:_ended()
  local ok, err = pcall(self.client.json, self.client, 'GET', '/sandboxes/' .. hosted.escape(self.id), nil,
    { gone = true, timeout_ms = KILL_TIMEOUT_MS })
  return not ok and errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone'
end

local function exit_of(ended)
  local code = ended.exitCode
  if code == nil then code = ended.exit_code end
  if code == nil then code = 0 end   -- protobuf JSON leaves out a zero
  code = tonumber(code)
  if not code or not check.is_int(code) then return nil end
  code = int(code)
  local status = type(ended.status) == 'string' and ended.status or ''
  local sig = status:match('^signal: (.+)$')
  if sig and SIGNALS[sig] then return nil, SIGNALS[sig] end
  return code
end

function Backend:exec(argv, o)
  self:_alive()
  self._seq = self._seq + 1
  local tag = self._prefix .. '.' .. self._seq
  local env = {}
  for k, v in pairs(self._env) do env[k] = v end   -- a warm sandbox's: its create's env
  for k, v in pairs(o.env or {}) do env[k] = v end
  env[scripts.TAG_VAR] = tag
  local args = {}
  for i = 2, #argv do args[i - 1] = argv[i] end
  if o.stdin ~= nil and not version_at_least(self.envd_version, '0.5.2') then
    errors.raise('INVALID_INPUT', self._label .. ': this template\'s envd (' .. tostring(self.envd_version)
      .. ') cannot close standard input: rebuild the template to pass stdin', nil, 0)
  end
  local started = core.hrtime_ms()
  local timeout = o.timeout_ms or 60000
  -- envd stops the command at its timeout; the stream gets half a call timeout more, within the pool's
  local grace = math.max(1, math.floor(self.envd.call_timeout_ms / 2))
  local res = self:_process({
    cmd = argv[1], args = array(args), envs = object(env), cwd = o.cwd,
  }, {
    timeout_ms = timeout, stream_timeout_ms = timeout + grace, max_output_bytes = o.max_output_bytes,
    stdin = o.stdin, signal = o.signal, on_output = o.on_output, on_start = o.on_start,
  })
  local elapsed = core.hrtime_ms() - started
  if res.err then
    local err, pid = res.err, res.pid
    if errors.is(err, 'CANCELLED') then
      self:_kill(tag, pid)
      error(err, 0)
    end
    if errors.is(err, 'SANDBOX_ERROR') then
      local timed_out = err.connect_code == 'deadline_exceeded' or (err.reason == 'timeout' and elapsed >= timeout)
      if timed_out then
        local kerr = self:_kill(tag, pid)
        if errors.is(kerr, 'SANDBOX_ERROR') and kerr.reason == 'gone' then error(kerr, 0) end
        return { timed_out = true, stdout = res.stdout, stderr = res.stderr, truncated = res.truncated,
          duration_ms = core.hrtime_ms() - started }
      end
      if err.reason ~= 'gone' and (not err.status or err.connect_code == 'unavailable') then
        -- the stream broke midway, or envd lost the process: a sandbox that ended says so (the
        -- control plane no longer knows it); otherwise the command may still run, and is stopped
        if self:_ended() then error(errors.sandbox('gone', self._label .. ': the sandbox ended'), 0) end
        local kerr = self:_kill(tag, pid)
        if errors.is(kerr, 'SANDBOX_ERROR') and kerr.reason == 'gone' then error(kerr, 0) end
      end
    end
    error(err, 0)
  end
  if not res.ended then
    self:_kill(tag, res.pid)
    error(errors.sandbox('failed', self._label .. ': the command\'s stream ended without its exit'), 0)
  end
  local code, sig = exit_of(res.ended)
  if code == nil and sig == nil then
    error(errors.sandbox('failed', self._label .. ': the command ended with an exit code that is not a number'), 0)
  end
  return {
    exit_code = code, signal = sig, stdout = res.stdout, stderr = res.stderr, truncated = res.truncated,
    timed_out = false, duration_ms = core.hrtime_ms() - started,
  }
end

--- Runs `command` as the official SDK runs a command string (`/bin/bash -l -c`): returns
-- { exit_code, stdout, stderr }. `opts` = { timeout_ms (60 s), signal }.
function Backend:shell(command, opts)
  self:_alive()
  opts = opts or {}
  local timeout = opts.timeout_ms or 60000
  local res = self:_process_or_raise({ cmd = '/bin/bash', args = array({ '-l', '-c', command }) }, {
    timeout_ms = timeout, stream_timeout_ms = timeout + math.max(1, math.floor(self.envd.call_timeout_ms / 2)),
    max_output_bytes = 1048576, signal = opts.signal,
  })
  if not res.ended then
    error(errors.sandbox('failed', self._label .. ': a command\'s stream ended without its exit'), 0)
  end
  local code = exit_of(res.ended)
  return { exit_code = code, stdout = res.stdout, stderr = res.stderr }
end

--- Starts `command` (`/bin/bash -l -c`) with no timeout and leaves it running once it started.
function Backend:background(command)
  self:_alive()
  local res = self:_process_or_raise({ cmd = '/bin/bash', args = array({ '-l', '-c', command }) },
    { background = true })
  if not res.pid then error(errors.sandbox('failed', self._label .. ': a process did not start'), 0) end
  return res.pid
end

function Backend:read_file(path, o)
  self:_alive()
  local max = o and o.max_bytes or 16 * 1048576
  -- max + 1 bytes at most: enough to tell a file that is too large, without its whole content
  local res = self.envd:call('GET', '/files', {
    query = { path = path }, headers = { Range = string.format('bytes=0-%d', max) }, allow = { 404, 416 },
    gone = GONE, on_error = file_error('the file'),
  })
  if res.status == 404 then return nil end
  if res.status == 416 then return '' end   -- an empty file, from a server that refuses its range
  if #res.body > max then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes', nil, 0) end
  return res.body
end

function Backend:write_file(path, data)
  self:_alive()
  local opts = { query = { path = path }, gone = GONE, on_error = file_error('the file'), idempotent = true }
  if version_at_least(self.envd_version, '0.5.7') then
    opts.body, opts.content_type = data, 'application/octet-stream'
  else
    local boundary
    repeat boundary = 'mayura-' .. kit.random_hex(12) until not data:find(boundary, 1, true)
    local name = path:gsub('[%c"\\]', '_')
    opts.body = '--' .. boundary .. '\r\nContent-Disposition: form-data; name="file"; filename="' .. name .. '"\r\n'
      .. 'Content-Type: application/octet-stream\r\n\r\n' .. data .. '\r\n--' .. boundary .. '--\r\n'
    opts.content_type = 'multipart/form-data; boundary=' .. boundary
  end
  self.envd:call('POST', '/files', opts)
end

local function entry_of(e, label)
  local function bad() return errors.sandbox('failed', label .. ': the sandbox answered with an invalid listing') end
  if type(e) ~= 'table' or type(e.name) ~= 'string' then error(bad(), 0) end
  local size = e.size
  if size == nil then size = 0 end   -- protobuf JSON leaves out a zero
  size = tonumber(size)
  if not size or not check.is_int(size) or size < 0 then error(bad(), 0) end
  local modified = 0
  if e.modifiedTime ~= nil then
    modified = M.rfc3339_ms(e.modifiedTime)
    if not modified then error(bad(), 0) end
  end
  return { name = e.name, type = FILE_TYPES[e.type] or 'other', size = int(size), modified = modified }
end

function Backend:list_files(path)
  self:_alive()
  local body, status = self:_rpc('filesystem.Filesystem/ListDir', { path = path, depth = 1 }, {
    allow = { 404 }, on_error = file_error('the path'), idempotent = true,
  })
  if status == 404 then return nil end
  if type(body) ~= 'table' then
    error(errors.sandbox('failed', self._label .. ': the sandbox answered with an invalid listing'), 0)
  end
  local out = {}
  for i, e in ipairs(type(body.entries) == 'table' and body.entries or {}) do out[i] = entry_of(e, self._label) end
  return out
end

function Backend:remove_file(path, o)
  self:_alive()
  if not (o and o.recursive) then
    -- envd removes whatever is there, directories and all: look first
    local stat, status = self:_rpc('filesystem.Filesystem/Stat', { path = path }, {
      allow = { 404 }, on_error = file_error('the path'), idempotent = true,
    })
    if status == 404 then return end
    local entry = type(stat) == 'table' and stat.entry or nil
    if type(entry) == 'table' and FILE_TYPES[entry.type] == 'directory' then
      local list, st2 = self:_rpc('filesystem.Filesystem/ListDir', { path = path, depth = 1 }, {
        allow = { 404 }, on_error = file_error('the path'), idempotent = true,
      })
      if st2 == 404 then return end
      if type(list) == 'table' and type(list.entries) == 'table' and #list.entries > 0 then
        errors.raise('INVALID_INPUT', 'the path is a directory that is not empty', nil, 0)
      end
    end
  end
  self:_rpc('filesystem.Filesystem/Remove', { path = path }, { on_error = file_error('the path'), idempotent = true })
end

function Backend:url(port)
  return string.format('https://%d-%s.%s', port, self.id, self.domain)
end

-- {------------------------------------------------------ snapshots

local SNAPSHOT_ID = '^[%w][%w_%.:/%-]*$'

local function snapshot_release(snap)
  if snap._released then return end
  snap._released = true
  -- 404: it is gone already, which is what release wants
  snap._client:json('DELETE', '/templates/' .. hosted.escape(snap.id), nil,
    { allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS })
end

-- A snapshot of the service's, as the pool holds it: E2B says no size (see the module's comment).
local function native_snapshot(client, id)
  return { id = id, size_bytes = 0, _client = client, _released = false, release = snapshot_release }
end

-- The snapshots of this sandbox on the service that this backend does not know (those of a call whose
-- answer was lost), deleted; best effort.
function Backend:_sweep_snapshots()
  pcall(function()
    local list = self.client:json('GET', '/snapshots', nil, {
      query = { sandboxID = self.id }, timeout_ms = KILL_TIMEOUT_MS,
    })
    for _, s in ipairs(type(list) == 'table' and list or {}) do
      local id = type(s) == 'table' and s.snapshotID
      if type(id) == 'string' and id:match(SNAPSHOT_ID) and not self._snapshots[id] then
        pcall(snapshot_release, native_snapshot(self.client, id))
      end
    end
  end)
end

--- A snapshot on the service (POST /sandboxes/{id}/snapshots): the sandbox is paused while it is
-- made and runs on after. `o` = { timeout_ms }. A call that failed in a way that may have made one
-- looks for it by the sandbox's ID and deletes it.
function Backend:snapshot(o)
  self:_alive()
  self._snapshotting = (self._snapshotting or 0) + 1
  local ok, res = pcall(self.client.json, self.client, 'POST', '/sandboxes/' .. hosted.escape(self.id) .. '/snapshots',
    object({}), { gone = { 404 }, timeout_ms = o and o.timeout_ms, retries = 0 })
  self._snapshotting = self._snapshotting - 1
  local id = ok and type(res) == 'table' and res.snapshotID or nil
  if type(id) == 'string' and id:match(SNAPSHOT_ID) and #id <= 512 then
    self._snapshots[id] = true
    return native_snapshot(self.client, id)
  end
  -- no usable answer: what the call made (if anything) goes, unless another call of ours is under way
  if (ok or kit.may_have_made(res)) and self._snapshotting == 0 then self:_sweep_snapshots() end
  if not ok then error(res, 0) end
  error(errors.sandbox('failed', self._label .. ': the service answered the snapshot with no usable ID'), 0)
end

-- }------------------------------------------------------

function Backend:release()
  if self._released then return end
  self._released = true
  -- 404: it ended already, which is what release wants
  self.client:json('DELETE', '/sandboxes/' .. hosted.escape(self.id), nil, { allow = { 404 } })
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local function create_error(status)
  if status == 400 then
    return errors.new('INVALID_INPUT', 'e2b: the service refused the sandbox\'s options (HTTP 400)')
  end
  if status == 404 then
    return errors.new('INVALID_CONFIG', 'e2b: the service knows no such template (HTTP 404)')
  end
  return nil
end

local function network_body(body, network)
  if network == 'none' or network == nil then
    body.allow_internet_access = false
  elseif network == 'all' then
    body.allow_internet_access = true
  else
    local allow = {}
    for i, d in ipairs(network.allow) do allow[i] = d end
    body.network = { allowOut = array(allow), denyOut = array({ '0.0.0.0/0' }) }
  end
end

--- The provider table for `create_sandboxes`: `config` from M.config, `spec` = { id, features,
-- env (added to every sandbox's env), after_create(backend) (may raise: the sandbox is then
-- killed) }. Its lifecycle is the kit's (mayura.sandbox._kit); what follows is E2B's translation.
function M.provider(config, spec)
  local label = config.label
  local client = hosted.client({
    label = label, base_url = config.api_url, api_key = config.api_key, auth_header = 'X-API-Key',
    retries = config.retries, retry_base_ms = config.retry_base_ms,
  })
  local function destroy(ctx, h)
    -- 404: it ended already, which is what release wants
    ctx.client:json('DELETE', '/sandboxes/' .. hosted.escape(h.id), nil,
      { allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS })
  end
  return kit.provider({
    id = spec.id, label = label, features = spec.features, workdir = config.workdir,
    max_lifetime_ms = config.max_lifetime_ms, client = client, warm = config.warm, warm_ports = true,
    fields = { config = config, client = client },

    create = function(ctx)
      local s = ctx.spec
      if s.cpus ~= nil or s.memory_mib ~= nil then
        errors.raise('INVALID_INPUT', label .. ': CPUs and memory come with the template; cpus and memory_mib '
          .. 'cannot be set per sandbox', nil, 0)
      end
      local timeout_s = hosted.lifetime(s.lifetime_ms, { unit = 's', max = math.ceil(config.max_lifetime_ms / 1000) })
      local metadata = hosted.metadata(s.labels, { max_keys = 63 })
      metadata[kit.TAG_LABEL] = ctx.tag
      local env = {}
      for k, v in pairs(spec.env or {}) do env[k] = v end
      for k, v in pairs(s.env or {}) do env[k] = v end
      local template = s.image or config.template
      if s.snapshot ~= nil then
        -- a snapshot of the service's is a template of its own
        if s.image ~= nil then
          errors.raise('INVALID_INPUT', label .. ': a snapshot brings its own template; image cannot be given with it',
            nil, 0)
        end
        template = s.snapshot.id
      end
      local body = {
        templateID = template, timeout = timeout_s, metadata = metadata, envVars = object(env),
      }
      network_body(body, s.network)
      return ctx.client:json('POST', '/v2/sandboxes', body, { on_error = function(status)
        if status == 404 and s.snapshot ~= nil then
          return errors.new('INVALID_INPUT', label .. ': the service no longer has the snapshot (HTTP 404)')
        end
        return create_error(status)
      end })
    end,

    accept = function(ctx, res)
      if type(res) ~= 'table' or type(res.sandboxID) ~= 'string' or not res.sandboxID:match('^[%w_%-]+$')
        or #res.sandboxID > 128 then
        error(ctx:bad_answer('no usable sandbox id'), 0)
      end
      local token = res.envdAccessToken
      if token == json.null then token = nil end
      if token ~= nil and (type(token) ~= 'string' or token == '' or #token > 4096 or token:find('[%c ]')) then
        error(ctx:bad_answer('an access token that is not usable'), 0)
      end
      if token == nil then error(ctx:bad_answer('no access token'), 0) end
      local domain = config.domain
      if type(res.domain) == 'string' and res.domain:match('^[%w][%w%.%-]*%w$') and not res.domain:find('..', 1, true)
        then
        domain = res.domain:lower()
      end
      return { id = res.sandboxID, token = token, domain = domain,
        envd_version = type(res.envdVersion) == 'string' and res.envdVersion or '0.0.0' }
    end,

    find = function(ctx, tag)
      local q = hosted.query({ metadata = kit.TAG_LABEL .. '=' .. tag })
      local list = ctx.client:json('GET', '/v2/sandboxes' .. q, nil, { timeout_ms = KILL_TIMEOUT_MS })
      local found = {}
      for _, s in ipairs(type(list) == 'table' and list or {}) do
        if type(s) == 'table' and type(s.sandboxID) == 'string' and s.sandboxID ~= '' then
          found[#found + 1] = { id = s.sandboxID }
        end
      end
      return found
    end,

    destroy = destroy,

    backend = function(ctx, h)
      local c = ctx.client
      local envd_url = config.sandbox_url or string.format('https://%d-%s.%s', M.ENVD_PORT, h.id, h.domain)
      local envd_headers = { ['E2b-Sandbox-Id'] = h.id, ['E2b-Sandbox-Port'] = tostring(M.ENVD_PORT) }
      -- before envd 0.4.0 there is no default user: name the templates' own, 'user'
      if not version_at_least(h.envd_version, '0.4.0') then
        envd_headers.Authorization = 'Basic ' .. b64.encode('user:')
      end
      local envd = hosted.client({
        label = label, base_url = envd_url, api_key = h.token, auth_header = 'X-Access-Token', auth_prefix = '',
        headers = envd_headers,
        call_timeout_ms = c.call_timeout_ms, retries = config.retries, retry_base_ms = config.retry_base_ms,
        secrets = { config.api_key },
      })
      local backend = setmetatable({
        id = h.id, client = c, envd = envd, domain = h.domain, envd_version = h.envd_version,
        _label = label, _prefix = kit.random_hex(8), _seq = 0, _released = false, _env = {}, _snapshots = {},
      }, Backend)
      if spec.after_create then spec.after_create(backend) end
      return backend
    end,

    -- a warm sandbox given to a create: the create's env goes with every command, its lifetime to E2B
    hand_out = function(_, backend, s)
      for k, v in pairs(s.env or {}) do backend._env[k] = v end
      local timeout_s = hosted.lifetime(s.lifetime_ms, { unit = 's', max = math.ceil(config.max_lifetime_ms / 1000) })
      backend.client:json('POST', '/sandboxes/' .. hosted.escape(backend.id) .. '/timeout', { timeout = timeout_s },
        { gone = true })
    end,
  })
end

-- }======================================================

return M
