--- mayura.sandbox._e2b_envd: the data plane of an E2B sandbox (envd), the backend of the E2B
-- providers (mayura.sandbox._e2b makes the sandbox and this backend over it).
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
-- `M.new(fields)` makes the backend: { id, client (the control plane's), envd (envd's client),
-- domain, envd_version, _label }; it offers, besides the pool's calls, `shell(command, opts)`
-- and `background(command)` (see _e2b).
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local scripts = require('mayura.sandbox.scripts')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')

local M = {}

local b64 = core.base64

local GONE = { 502 }                        -- envd's proxy: the sandbox was not found
local STDIN_CHUNK = 256 * 1024              -- raw bytes per SendInput
local KILL_TIMEOUT_MS = 10000
M.KILL_TIMEOUT_MS = KILL_TIMEOUT_MS

local function int(v)
  return math.tointeger and math.tointeger(v) or v
end

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

function Backend:release()
  if self._released then return end
  self._released = true
  -- 404: it ended already, which is what release wants
  self.client:json('DELETE', '/sandboxes/' .. hosted.escape(self.id), nil, { allow = { 404 } })
end

-- }======================================================

--- The backend over `fields` (see the module's comment).
function M.new(fields)
  fields._prefix, fields._seq, fields._released, fields._env = kit.random_hex(8), 0, false, {}
  return setmetatable(fields, Backend)
end

return M
