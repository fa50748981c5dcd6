--- mayura.sandbox: the sandbox pool, and what providers and tools share.
--
-- `create_sandboxes(provider, options)` holds every sandbox of a provider to
-- the same limits. The pool checks every path, size and option before it
-- calls the provider, and everything the provider returns before the caller
-- sees it; a provider call that takes longer than `call_timeout_ms` fails
-- with SANDBOX_ERROR reason `timeout`; after its lifetime or release every
-- call on a sandbox fails with SANDBOX_ERROR reason `gone`.
--
-- Network: each kind other than 'none' must be listed in the pool's
-- `network` (asking for another fails with PERMISSION_DENIED); 'none' needs no
-- listing: a create that asks for none gets 'none' from any pool, and fails with
-- INVALID_INPUT only when the provider cannot keep a sandbox offline.
--
-- Network events: a provider that filters the network (an allow-list) tells each refusal to
-- `spec.on_event(event)`; the pool stamps it with the sandbox's id (`event.sandbox`), keeps the
-- last MAX_EVENTS of each sandbox for `sandbox:events()` (a copy, oldest first) and hands it to
-- the pool's `on_event(event)` option when there is one (an error there is reported through
-- core.report, never raised into the provider). The allow-list's events are
-- `{ type = 'network_refused', sandbox, host, port, reason }` (mayura.sandbox._egress).
--
-- Providers by name: `provider(name, options)` is mayura.sandbox.<name>'s `sandboxes(options)`
-- (`providers()` lists mayura's own); a name of another shape, or of no provider, is INVALID_INPUT.
--
-- A provider is a table (docs/writing-a-provider.md; ARCHITECTURE.md):
--   { id, features = { stdin, ports, desktop, network = { 'none', 'all', 'allowlist' } },
--     workdir, max_lifetime_ms, create = function(self, spec) return backend end }
-- (`spec` holds the checked create options, the merged labels and the pool's
-- `call_timeout_ms`, for providers whose calls go over the network)
-- and a backend has `id`, `exec(argv, opts)`, `read_file(path, opts)`,
-- `write_file(path, data)`, `list_files(path)`, `remove_file(path, opts)`,
-- `url(port)`, `release()` and optionally `desktop`.
--
-- Warm sandboxes: a provider with `warm_attach` (local, Docker and the hosted ones
-- on mayura.sandbox._kit, with their option `warm`; mayura.sandbox._warm) keeps sandboxes
-- started ahead for the first pool made over it (from its making, or from its
-- first create with the pool option `warm_start = 'first_use'`). They take slots of its
-- max_sandboxes: `count()` plus the provider's `warm_held()` never passes
-- it; the provider starts one only in a free slot, a create that gets one
-- (`warm_claim`, then `create(self, spec, claimed)`) moves its slot to the
-- pool, a create of another shape finding no free slot has one destroyed
-- first (`warm_evict`), and `close()` ends them all (`warm_detach`).
--
-- Snapshots: `sandbox:snapshot()` keeps the sandbox's files (its working directory, /tmp, a
-- provider's `snapshot_paths`) as `{ id, size_bytes, provider }` with `release()`;
-- `create{ snapshot = snap }` starts a sandbox with them, `sandbox:restore(snap)` puts them back in
-- one (a snapshot made `{ until_release = true }` ends with its sandbox). The pool checks that the snapshot is its
-- own and not released (INVALID_INPUT), bounds them by `max_snapshots` and `max_snapshot_bytes`
-- (their sizes together; LIMIT_EXCEEDED past either, nothing kept) and releases them at close().
-- `features.snapshots` is the provider's: 'native' (its backend's `snapshot(o)` returns a
-- snapshot of its own, `{ size_bytes, release }` and optionally `archive()` for restore, which its
-- create gets as `spec.snapshot`; one made `{ until_release = true }` is made the generic way, so
-- that restore can put it back on any provider),
-- false (none), or by default 'generic' (mayura.sandbox._snapshot: an archive made in the
-- sandbox, kept in this process's memory and unpacked in the new sandbox before it is handed out).
--
-- Streaming: `sandbox:exec(argv, { on_stdout = fn, on_stderr = fn })` and
-- `sandbox:start(argv, opts)` (a handle: `pid`, `wait()`, `kill(signal)`,
-- `output()`). The pool passes the backend's exec `o.on_output(name, chunk)`
-- and `o.on_start(ctl)` (ctl = `{ pid, kill(signal_number) }`, once the
-- command runs); a backend that calls them as things happen says
-- `streaming = true` (start then returns once on_start came). Whatever a
-- backend did not stream reaches the callbacks when the command ends; a
-- backend without `ctl.kill` has `kill()` cancel the command (wait() then
-- gives the output so far, `signal` the one asked for).
--
-- Desktop: `create{ desktop = true }` asks for one (INVALID_INPUT when the
-- provider's `features.desktop` is false); `sandbox.desktop` is then the
-- backend's `desktop` behind the pool's checks: `screenshot()` (PNG bytes),
-- `click{ x, y, button }`, `double_click{ x, y, button }`, `move{ x, y }`,
-- `scroll{ direction, amount, x, y }`, `drag{ from = { x, y }, to = { x, y },
-- button }`, `type(text)`, `key(name)`, `size()` (`{ width, height }`) and
-- `view_url()` (INVALID_INPUT from a provider without a live view), each
-- called with `:`. A backend's desktop has the same methods and gets checked
-- arguments (x, y whole numbers, button 'left' by default, amount 1..100);
-- it may leave out double_click, drag and view_url.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local snapshots = require('mayura.sandbox._snapshot')

local M = {}

M.is_error = errors.is

local MIB = 1048576
local NETWORK_KINDS = { none = true, all = true, allowlist = true }
local MAX_PATH = 4096
local MAX_EVENTS = 256
local MAX_ARGV_BYTES = 1048576
local MAX_ENV_BYTES = 1048576
local ENTRY_TYPES = { file = true, directory = true, symlink = true, other = true }

local function gone(message)
  return errors.sandbox('gone', message or 'the sandbox is gone')
end

-- {======================================================
-- Paths
-- =======================================================

--- Normalizes a sandbox path: absolute, or relative to `workdir`; `.` and
-- `..` are folded lexically (inside the sandbox's own root, so `..` cannot
-- leave it). Raises INVALID_INPUT for a path that is not a usable string.
function M.normalize_path(path, workdir, what)
  what = what or 'path'
  if type(path) ~= 'string' then errors.raise('INVALID_INPUT', what .. ' must be a string', nil, 3) end
  if path == '' then errors.raise('INVALID_INPUT', what .. ' is empty', nil, 3) end
  if path:find('\0', 1, true) then errors.raise('INVALID_INPUT', what .. ' contains a NUL byte', nil, 3) end
  if #path > MAX_PATH then
    errors.raise('INVALID_INPUT', what .. ' is longer than ' .. MAX_PATH .. ' bytes', nil, 3)
  end
  if path:sub(1, 1) ~= '/' then path = workdir .. '/' .. path end
  local parts = {}
  for part in path:gmatch('[^/]+') do
    if part == '..' then
      if #parts > 0 then table.remove(parts) end
    elseif part ~= '.' then
      parts[#parts + 1] = part
    end
  end
  return '/' .. table.concat(parts, '/')
end

-- }======================================================

-- {======================================================
-- Checking options
-- =======================================================

local function check_network_request(network)
  if network == nil then return nil end
  if network == 'none' or network == 'all' then return network, network end
  if type(network) == 'table' then
    check.keys(network, { allow = true }, 'network', 'INVALID_INPUT', 4)
    local allow = network.allow
    if type(allow) ~= 'table' or #allow == 0 then
      errors.raise('INVALID_INPUT', 'network.allow must be a non-empty list of domains', nil, 4)
    end
    local copy = {}
    for i, domain in ipairs(allow) do
      if type(domain) ~= 'string' or #domain > 253 or not domain:match('^%*?%.?[%w][%w%.%-]*$')
        or domain:find('..', 1, true) then
        errors.raise('INVALID_INPUT', 'network.allow[' .. i .. '] is not a domain', nil, 4)
      end
      copy[i] = domain:lower()
    end
    return 'allowlist', { allow = copy }
  end
  errors.raise('INVALID_INPUT', "network must be 'none', 'all' or { allow = { ... } }", nil, 4)
end

local function check_env(env, level)
  if env == nil then return nil end
  if type(env) ~= 'table' then errors.raise('INVALID_INPUT', 'env must be a table of strings', nil, level) end
  local copy, total = {}, 0
  for k, v in pairs(env) do
    if type(k) ~= 'string' or not k:match('^[%a_][%w_]*$') then
      errors.raise('INVALID_INPUT', 'env name ' .. tostring(k) .. ' is not valid', nil, level)
    end
    if type(v) ~= 'string' then errors.raise('INVALID_INPUT', 'env ' .. k .. ' must be a string', nil, level) end
    if v:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'env ' .. k .. ' contains a NUL byte', nil, level) end
    total = total + #k + #v + 2
    copy[k] = v
  end
  if total > MAX_ENV_BYTES then errors.raise('INVALID_INPUT', 'env is larger than 1 MiB', nil, level) end
  return copy
end

local function check_labels(labels, level)
  if labels == nil then return {} end
  if type(labels) ~= 'table' then errors.raise('INVALID_INPUT', 'labels must be a table of strings', nil, level) end
  local copy = {}
  for k, v in pairs(labels) do
    if type(k) ~= 'string' or #k == 0 or #k > 63 or type(v) ~= 'string' or #v > 256
      or k:find('%z') or v:find('%z') then
      errors.raise('INVALID_INPUT', 'labels must map names (1..63 bytes) to strings (at most 256 bytes)', nil, level)
    end
    copy[k] = v
  end
  return copy
end

local function check_argv(argv)
  if type(argv) ~= 'table' or #argv == 0 then
    errors.raise('INVALID_INPUT', 'command must be a non-empty list of strings', nil, 3)
  end
  local total, copy = 0, {}
  for k in pairs(argv) do
    if not check.is_int(k) or k < 1 or k > #argv then
      errors.raise('INVALID_INPUT', 'command must be a list of strings', nil, 3)
    end
  end
  for i, a in ipairs(argv) do
    if type(a) ~= 'string' then errors.raise('INVALID_INPUT', 'command[' .. i .. '] must be a string', nil, 3) end
    if a:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'command[' .. i .. '] contains a NUL byte', nil, 3) end
    total = total + #a + 1
    copy[i] = a
  end
  if copy[1] == '' then errors.raise('INVALID_INPUT', 'the program name is empty', nil, 3) end
  if total > MAX_ARGV_BYTES then errors.raise('INVALID_INPUT', 'command is larger than 1 MiB', nil, 3) end
  return copy
end

-- How a provider's snapshots are made (see the top of this module): 'generic' unless it says.
local function snapshot_kind(f)
  if f.snapshots == false or f.snapshots == 'native' then return f.snapshots end
  return 'generic'
end

local function copy_features(f)
  f = f or {}
  local net = {}
  for i, k in ipairs(f.network or {}) do net[i] = k end
  return { stdin = f.stdin == true, ports = f.ports == true, desktop = f.desktop == true, network = net,
    snapshots = snapshot_kind(f) }
end

local function has(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

-- }======================================================

-- {======================================================
-- Calls with a deadline
-- =======================================================

local function pack(...)
  return { n = select('#', ...), ... }
end

--- Runs `fn()` as a task and waits for it at most `ms`; past that raises
-- SANDBOX_ERROR reason `timeout` (the call goes on; `on_late(ok, ...)` gets its result).
local function with_deadline(ms, fn, on_late)
  return task.with_timeout(ms, fn, function()
    return errors.sandbox('timeout', 'the provider did not answer within ' .. ms .. ' ms')
  end, on_late)
end

-- Provider failures keep their coded shape; anything else becomes SANDBOX_ERROR reason `failed`,
-- without the provider's own text.
local function provider_error(err)
  if errors.is(err) then
    if getmetatable(err) == nil then setmetatable(err, errors.mt) end
    return err
  end
  return errors.sandbox('failed', 'the provider failed')
end

local function bad_reply(what)
  return errors.sandbox('failed', 'the provider returned an invalid ' .. what)
end

-- }======================================================

-- {======================================================
-- A sandbox
-- =======================================================

local Sandbox = {}
Sandbox.__index = Sandbox

local function alive(self)
  if self._released then error(gone('the sandbox was released'), 3) end
  if core.hrtime_ms() >= self._expires_at then
    self._pool:_expire(self)
    error(gone('the sandbox reached the end of its lifetime'), 3)
  end
end

-- Calls backend[name] within the pool's call timeout, mapping failures.
function Sandbox:_call(ms, name, ...)
  local backend, args, n = self._backend, { ... }, select('#', ...)
  local ok, res = pcall(with_deadline, ms, function()
    return backend[name](backend, check.unpack(args, 1, n))
  end)
  if not ok then
    local err = provider_error(res)
    if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then self._gone = true end
    if self._released or core.hrtime_ms() >= self._expires_at then err = gone() end
    error(err, 0)
  end
  return res
end

--- The sandbox's last network events (see the top of this module), oldest first.
function Sandbox:events()
  local out = {}
  for i, e in ipairs(self._events) do
    local copy = {}
    for k, v in pairs(e) do copy[k] = v end
    out[i] = copy
  end
  return out
end

local exec_keys = { cwd = true, env = true, stdin = true, timeout_ms = true, signal = true,
  on_stdout = true, on_stderr = true }

-- Signals `kill` takes by name (with or without SIG); any number 1..64 goes as it is.
local SIGNALS = { HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15, CONT = 18, STOP = 19 }

-- {------------------------------------------------------
-- Streamed output: what reaches on_stdout / on_stderr
-- -------------------------------------------------------

-- The callbacks get the bytes of each stream in order, as the backend passes them on, at most
-- `cap` of each (the result's own cap): a chunk past it is cut, and nothing more comes. What a
-- backend did not stream (one that cannot) comes at the end, before the result is returned: the
-- bytes of the result's stdout/stderr past those already given. A callback runs on the loop and
-- must not wait; one that raises is reported (core.report) and not called again.
local function new_output(cap, on_stdout, on_stderr, keep)
  local out = { fns = { stdout = on_stdout, stderr = on_stderr }, size = { stdout = 0, stderr = 0 },
    parts = keep and { stdout = {}, stderr = {} } or nil, truncated = false, over = false }
  function out.push(name, chunk)
    if out.over or type(chunk) ~= 'string' or (name ~= 'stdout' and name ~= 'stderr') then return end
    local room = cap - out.size[name]
    if #chunk > room then chunk, out.truncated = chunk:sub(1, room), true end
    if #chunk == 0 then return end
    out.size[name] = out.size[name] + #chunk
    if out.parts then table.insert(out.parts[name], chunk) end
    local fn = out.fns[name]
    if fn then
      local ok, err = pcall(fn, chunk)
      if not ok then
        out.fns[name] = nil
        core.report('on_' .. name .. ' failed (not called again for this command): ' .. tostring(err))
      end
    end
  end
  return out
end

-- The result's bytes the callbacks have not had yet; then no more.
local function output_end(out, res)
  if not out or out.over then return end
  for _, name in ipairs({ 'stdout', 'stderr' }) do
    if #res[name] > out.size[name] then out.push(name, res[name]:sub(out.size[name] + 1)) end
  end
  out.over = true
end

-- }------------------------------------------------------

-- Checks exec's options; returns the argv and the backend's options.
local function exec_options(self, command, opts, default_timeout)
  local pool = self._pool
  local argv = check_argv(command)
  opts = opts == nil and {} or opts
  check.keys(opts, exec_keys, 'exec options', 'INVALID_INPUT', 4)
  local o = {}
  if opts.cwd ~= nil then o.cwd = M.normalize_path(opts.cwd, self._workdir, 'cwd') end
  o.env = check_env(opts.env, 4)
  if opts.stdin ~= nil then
    if type(opts.stdin) ~= 'string' then errors.raise('INVALID_INPUT', 'stdin must be a string', nil, 3) end
    if not self.features.stdin then
      errors.raise('INVALID_INPUT', 'this provider does not support standard input', nil, 3)
    end
    if #opts.stdin > pool.max_file_bytes then
      errors.raise('LIMIT_EXCEEDED', 'stdin is larger than max_file_bytes (' .. pool.max_file_bytes .. ')', nil, 3)
    end
    o.stdin = opts.stdin
  end
  for _, k in ipairs({ 'on_stdout', 'on_stderr' }) do
    if opts[k] ~= nil and type(opts[k]) ~= 'function' then
      errors.raise('INVALID_INPUT', k .. ' must be a function', nil, 3)
    end
  end
  local timeout = opts.timeout_ms
  if timeout == nil then timeout = default_timeout end
  check.int(timeout, 'timeout_ms', 1, nil, 'INVALID_INPUT', 4)
  if timeout > pool.max_exec_timeout_ms then
    errors.raise('LIMIT_EXCEEDED', 'timeout_ms is above max_exec_timeout_ms (' .. pool.max_exec_timeout_ms .. ')',
      nil, 3)
  end
  o.timeout_ms = timeout
  o.max_output_bytes = pool.max_output_bytes
  local token = opts.signal
  if token ~= nil and not task.is_token(token) then
    errors.raise('INVALID_INPUT', 'signal must be a cancel token (mayura.cancel_token())', nil, 3)
  end
  o.signal = token
  return argv, o, opts
end

-- The backend's exec result, checked and cut to the caller's shape; nil when it is not one.
local function exec_result(pool, res)
  if type(res) ~= 'table' then return nil end
  local out = {
    exit_code = res.exit_code,
    stdout = res.stdout or '',
    stderr = res.stderr or '',
    truncated = res.truncated == true,
    duration_ms = res.duration_ms,
    timed_out = res.timed_out == true,
  }
  if type(out.stdout) ~= 'string' or type(out.stderr) ~= 'string'
    or (out.exit_code ~= nil and not check.is_int(out.exit_code))
    or (not out.timed_out and out.exit_code == nil and res.signal == nil) then
    return nil
  end
  if out.timed_out then out.exit_code = nil end
  if res.signal ~= nil then out.signal = res.signal end
  if res.oom_killed then out.oom_killed = true end
  local cap = pool.max_output_bytes
  if #out.stdout > cap then out.stdout = out.stdout:sub(1, cap); out.truncated = true end
  if #out.stderr > cap then out.stderr = out.stderr:sub(1, cap); out.truncated = true end
  if type(out.duration_ms) ~= 'number' or out.duration_ms < 0 then out.duration_ms = 0 end
  out.duration_ms = math.floor(out.duration_ms)
  return out
end

--- Runs a command: `{ exit_code, stdout, stderr, truncated, duration_ms, timed_out }`. With
-- `on_stdout(chunk)` / `on_stderr(chunk)` its output also comes as it is written (see new_output).
function Sandbox:exec(command, opts)
  local pool = self._pool
  local argv, o, given = exec_options(self, command, opts, pool.exec_timeout_ms)
  local token = o.signal
  alive(self)
  if token and token.cancelled then errors.raise('CANCELLED', 'cancelled before it started', nil, 2) end
  local stream
  if given.on_stdout or given.on_stderr then
    stream = new_output(pool.max_output_bytes, given.on_stdout, given.on_stderr, false)
    o.on_output = stream.push
  end
  -- the provider stops the command at its timeout; the pool waits a call timeout more at most
  local ok, res = pcall(self._call, self, o.timeout_ms + pool.call_timeout_ms, 'exec', argv, o)
  if not ok then
    if stream then stream.over = true end
    error(res, 0)
  end
  if token and token.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 2) end
  local out = exec_result(pool, res)
  if not out then error(bad_reply('exec result'), 2) end
  if stream and stream.truncated then out.truncated = true end
  output_end(stream, out)
  return out
end

-- {------------------------------------------------------
-- Started processes: sandbox:start(argv, opts)
-- -------------------------------------------------------

local Process = {}
Process.__index = Process

--- Starts a command and returns at once (once it runs, on a provider that says so) with a handle:
-- `pid` (in the sandbox; nil where the provider does not tell), `wait()` (exec's result, or its
-- errors), `kill(signal)` (9 by default; a number or a name such as 'TERM'), `output()` (the
-- output so far: `{ stdout, stderr, truncated }`). Options are exec's; `timeout_ms` defaults to
-- the sandbox's remaining lifetime (within the pool's `max_exec_timeout_ms`). Releasing the
-- sandbox stops it (`wait()` then fails `gone`).
function Sandbox:start(command, opts)
  local pool = self._pool
  -- by default it may run as long as the sandbox lives (within max_exec_timeout_ms)
  local left = math.max(1, math.floor(self._expires_at - core.hrtime_ms()))
  local argv, o, given = exec_options(self, command, opts, math.min(pool.max_exec_timeout_ms, left))
  local token = o.signal
  alive(self)
  if token and token.cancelled then errors.raise('CANCELLED', 'cancelled before it started', nil, 2) end
  local stream = new_output(pool.max_output_bytes, given.on_stdout, given.on_stderr, true)
  local stop = task.cancel_token()   -- kill() where the provider gives no control of its own
  local p = setmetatable({ _stream = stream, _stop = stop, _sandbox = self, _started_at = core.hrtime_ms() },
    Process)
  local remove = token and token:on_cancel(function()
    p._cancelled = true
    stop:cancel()
  end)
  o.signal = stop
  o.on_output = stream.push
  o.on_start = function(ctl)
    if type(ctl) ~= 'table' then return end
    if check.is_int(ctl.pid) and ctl.pid > 0 then p.pid = ctl.pid end
    if type(ctl.kill) == 'function' then p._ctl = ctl end
    if p._wake then p._wake() end
  end
  self._started[p] = true
  p._task = task.spawn(function()
    local ok, res = pcall(self._call, self, o.timeout_ms + pool.call_timeout_ms, 'exec', argv, o)
    self._started[p] = nil
    if remove then remove() end
    if p._wake then p._wake() end
    return ok, res
  end)
  if self._backend.streaming and not p._task.done and not p._ctl then
    task.await(function(done) p._wake = done end)
    p._wake = nil
  end
  return p
end

--- Waits for the process to end: exec's result. Killed by `kill()`, its result says how it ended.
function Process:wait()
  if self._result then return self._result end
  local ok, res = self._task:wait()
  local pool = self._sandbox._pool
  if self._gone then
    self._stream.over = true
    error(gone('the sandbox was released'), 2)
  end
  if not ok then
    self._stream.over = true
    if self._cancelled or not self._killed or not errors.is(res, 'CANCELLED') then error(res, 0) end
    -- killed where the provider gives no control: the command was stopped; what it wrote so far
    local o = self:output()
    res = { signal = self._killed, stdout = o.stdout, stderr = o.stderr, truncated = o.truncated,
      duration_ms = core.hrtime_ms() - self._started_at }
  end
  local out = exec_result(pool, res)
  if not out then error(bad_reply('exec result'), 2) end
  if self._stream.truncated then out.truncated = true end
  output_end(self._stream, out)
  self._result = out
  return out
end

--- Sends `signal` (default 9, KILL) to the process and what it started. Returns false when it ended already.
function Process:kill(signal)
  local n = signal == nil and 9 or signal
  if type(n) == 'string' then n = SIGNALS[n:upper():gsub('^SIG', '')] end
  if not check.is_int(n) or n < 1 or n > 64 then
    errors.raise('INVALID_INPUT', 'signal must be a signal number (1..64) or a name such as \'TERM\'', nil, 2)
  end
  if self._task.done then return false end
  if self._ctl then
    self._ctl.kill(n)
  else
    self._killed = n
    self._stop:cancel()
  end
  return true
end

--- The output so far: `{ stdout, stderr, truncated }` (all of it once `wait()` returned).
function Process:output()
  local parts = self._stream.parts
  return { stdout = table.concat(parts.stdout), stderr = table.concat(parts.stderr),
    truncated = self._stream.truncated }
end

-- }------------------------------------------------------

--- The file's bytes, or nil when there is none. `max_bytes` refuses larger files.
function Sandbox:read_file(path, opts)
  local pool = self._pool
  local p = M.normalize_path(path, self._workdir)
  opts = opts == nil and {} or opts
  check.keys(opts, { max_bytes = true }, 'read_file options', 'INVALID_INPUT', 3)
  local max = opts.max_bytes
  if max == nil then max = pool.max_file_bytes end
  check.int(max, 'max_bytes', 0, nil, 'INVALID_INPUT', 3)
  if max > pool.max_file_bytes then max = pool.max_file_bytes end
  alive(self)
  local data = self:_call(pool.call_timeout_ms, 'read_file', p, { max_bytes = max })
  if data == nil then return nil end
  if type(data) ~= 'string' then error(bad_reply('file'), 2) end
  if #data > max then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes (' .. max .. ')', nil, 2) end
  return data
end

--- Writes text or bytes, creating directories and replacing any file there.
function Sandbox:write_file(path, data)
  local pool = self._pool
  local p = M.normalize_path(path, self._workdir)
  if type(data) ~= 'string' then errors.raise('INVALID_INPUT', 'data must be a string', nil, 2) end
  if #data > pool.max_file_bytes then
    errors.raise('LIMIT_EXCEEDED', 'data is larger than max_file_bytes (' .. pool.max_file_bytes .. ')', nil, 2)
  end
  alive(self)
  self:_call(pool.call_timeout_ms, 'write_file', p, data)
end

--- The directory's entries `{ name, type, size, modified }`, or nil when there is none.
function Sandbox:list_files(path)
  local pool = self._pool
  local p = M.normalize_path(path == nil and '.' or path, self._workdir)
  alive(self)
  local entries = self:_call(pool.call_timeout_ms, 'list_files', p)
  if entries == nil then return nil end
  if type(entries) ~= 'table' then error(bad_reply('listing'), 2) end
  local out = {}
  for i, e in ipairs(entries) do
    if type(e) ~= 'table' or type(e.name) ~= 'string' or e.name == '' or e.name:find('[/%z]')
      or not ENTRY_TYPES[e.type] or not check.is_int(e.size) or e.size < 0
      or not check.is_int(e.modified) then
      error(bad_reply('listing'), 2)
    end
    out[i] = { name = e.name, type = e.type, size = e.size, modified = e.modified }
  end
  return out
end

--- Removes a file; a directory with what is in it needs `{ recursive = true }`.
function Sandbox:remove_file(path, opts)
  local pool = self._pool
  local p = M.normalize_path(path, self._workdir)
  opts = opts == nil and {} or opts
  check.keys(opts, { recursive = true }, 'remove_file options', 'INVALID_INPUT', 3)
  if opts.recursive ~= nil and type(opts.recursive) ~= 'boolean' then
    errors.raise('INVALID_INPUT', 'recursive must be a boolean', nil, 2)
  end
  if p == '/' then errors.raise('INVALID_INPUT', 'refusing to remove /', nil, 2) end
  alive(self)
  self:_call(pool.call_timeout_ms, 'remove_file', p, { recursive = opts.recursive == true })
end

--- The URL serving one of the `ports` the sandbox was created with.
function Sandbox:url(port)
  check.int(port, 'port', 1, 65535, 'INVALID_INPUT', 3)
  if not self._ports[port] then
    errors.raise('INVALID_INPUT', 'port ' .. port .. ' is not one of the ports the sandbox was created with', nil, 2)
  end
  alive(self)
  local url = self:_call(self._pool.call_timeout_ms, 'url', port)
  if type(url) ~= 'string' or not url:match('^https?://') then error(bad_reply('URL'), 2) end
  return url
end

-- A snapshot given to create or restore, checked: one of `pool`'s, not released.
local function check_snapshot(pool, snap, level)
  if not snapshots.is(snap) then
    errors.raise('INVALID_INPUT', 'snapshot must be a snapshot (sandbox:snapshot())', nil, level)
  end
  if snap._pool ~= pool then errors.raise('INVALID_INPUT', 'the snapshot belongs to another pool', nil, level) end
  if snap._released or not pool._snapshots[snap] then
    errors.raise('INVALID_INPUT', 'the snapshot was released', nil, level)
  end
  return snap
end

--- Keeps the sandbox's files: `{ id, size_bytes, provider }` with `release()` (see the top of this
-- module). Counted against the pool's max_snapshots and max_snapshot_bytes until released; with
-- `{ until_release = true }` also released with this sandbox (the tools' checkpoints).
function Sandbox:snapshot(options)
  local pool = self._pool
  local kind = self.features.snapshots
  options = options == nil and {} or options
  check.keys(options, { until_release = true }, 'snapshot options', 'INVALID_INPUT', 3)
  if options.until_release ~= nil and type(options.until_release) ~= 'boolean' then
    errors.raise('INVALID_INPUT', 'until_release must be a boolean', nil, 2)
  end
  if not kind then errors.raise('INVALID_INPUT', 'this provider makes no snapshots', nil, 2) end
  alive(self)
  if pool._closed then error(errors.sandbox('closed', 'the pool is closed'), 2) end
  if pool._snap_count >= pool.max_snapshots then
    errors.raise('LIMIT_EXCEEDED', 'max_snapshots (' .. pool.max_snapshots .. ') are held', nil, 2)
  end
  -- the slot is taken while the snapshot is made, so that snapshots made at once keep to the limit
  pool._snap_count = pool._snap_count + 1
  -- and the pool makes one at a time, each up to the room the others left: those being made hold at
  -- most max_snapshot_bytes of the host's memory together (not that much each)
  if pool._snap_busy then task.await(function(done) pool._snap_turns[#pool._snap_turns + 1] = done end) end
  pool._snap_busy = true
  local room = pool.max_snapshot_bytes - pool._snap_bytes
  local ok, held, size = pcall(function()
    alive(self)
    if pool._closed then error(errors.sandbox('closed', 'the pool was closed'), 0) end
    local timeout = pool.call_timeout_ms
    -- one held with its sandbox is for going back in it (restore): an archive, whatever the provider
    if kind == 'native' and not options.until_release and type(self._backend.snapshot) == 'function' then
      -- one made after the deadline is released as it comes
      local backend = self._backend
      local made, native = pcall(with_deadline, timeout, function()
        return backend:snapshot({ max_bytes = room, timeout_ms = timeout })
      end, function(late_ok, late)
        if late_ok and type(late) == 'table' and type(late.release) == 'function' then pcall(late.release, late) end
      end)
      if not made then
        if self._released or core.hrtime_ms() >= self._expires_at then error(gone(), 0) end
        error(provider_error(native), 0)
      end
      if type(native) ~= 'table' or not check.is_int(native.size_bytes) or native.size_bytes < 0
        or type(native.release) ~= 'function' then
        if type(native) == 'table' and type(native.release) == 'function' then pcall(native.release, native) end
        error(bad_reply('snapshot'), 0)
      end
      return { native = native }, native.size_bytes
    end
    local archive = snapshots.capture(function(name, ...)
      return self:_call(2 * timeout, name, ...)
    end, { paths = snapshots.paths(pool.provider, self._workdir), max_bytes = room, timeout_ms = timeout,
      binary = self._backend.binary_streams == true })
    return { archive = archive }, #archive
  end)
  pool._snap_count = pool._snap_count - 1
  -- the next one's turn, once this one is counted or gone
  local function next_turn()
    local turn = table.remove(pool._snap_turns, 1)
    if turn then turn() else pool._snap_busy = false end
  end
  local function drop()
    if ok and held.native then pcall(held.native.release, held.native) end
    next_turn()
  end
  if not ok then
    next_turn()
    error(held, 0)
  end
  if pool._closed then
    drop()
    error(errors.sandbox('closed', 'the pool was closed'), 2)
  end
  if pool._snap_count >= pool.max_snapshots then
    drop()
    errors.raise('LIMIT_EXCEEDED', 'max_snapshots (' .. pool.max_snapshots .. ') are held', nil, 2)
  end
  if size > pool.max_snapshot_bytes - pool._snap_bytes then
    drop()
    errors.raise('LIMIT_EXCEEDED', 'the snapshot (' .. size .. ' bytes) is more than max_snapshot_bytes ('
      .. pool.max_snapshot_bytes .. ') leaves room for', nil, 2)
  end
  local snap = snapshots.new(pool, 'snapshot-' .. snapshots.random_hex(8), size,
    type(pool.provider.id) == 'string' and pool.provider.id or 'provider', held)
  pool._snapshots[snap] = true
  pool._snap_count = pool._snap_count + 1
  pool._snap_bytes = pool._snap_bytes + size
  next_turn()
  if options.until_release then
    if self._released then
      pool:_release_snapshot(snap)
      error(gone('the sandbox was released'), 2)
    end
    self._own_snapshots = self._own_snapshots or {}
    self._own_snapshots[snap] = true
  end
  return snap
end

--- Puts the files of `snap` (one of this pool's) back in this sandbox: its working directory and
-- /tmp (the snapshot's places) are emptied first, then hold exactly the snapshot's files. What runs
-- in the sandbox goes on running. A provider's own (native) snapshot goes back only when it can give
-- its files as an archive (`native:archive()`); else it only starts new sandboxes.
function Sandbox:restore(snap)
  local pool = self._pool
  check_snapshot(pool, snap, 3)
  local held = snap._held
  local native = held.native
  if not held.archive and not (native and type(native.archive) == 'function') then
    errors.raise('INVALID_INPUT', 'this provider\'s snapshots start new sandboxes only', nil, 2)
  end
  alive(self)
  local timeout = pool.call_timeout_ms
  local ok, err = pcall(function()
    -- a provider's own snapshot that can give its files as an archive goes back the generic way
    local archive = held.archive or native:archive()
    if type(archive) ~= 'string' then error(bad_reply('snapshot archive'), 0) end
    return snapshots.restore(function(name, ...)
      return self:_call(2 * timeout, name, ...)
    end, archive, { timeout_ms = timeout, binary = self._backend.binary_streams == true,
    wipe = snapshots.paths(pool.provider, self._workdir) })
  end)
  if not ok then error(err, 0) end
end

--- Ends the sandbox. Every call fails with `gone` from then on; the pool's slot is freed once
-- the provider's release has returned (the sandbox is really over), even when that comes after
-- the call timeout this waits at most. Releasing again waits for the same release.
function Sandbox:release()
  local pool = self._pool
  if not self._released then
    self._released = true
    pool:_stop_timer(self)
    -- started processes stop with it (the provider's release ends them): their wait() says `gone`
    for p in pairs(self._started) do p._gone = true end
    for snap in pairs(self._own_snapshots or {}) do pool:_release_snapshot(snap) end
    local backend = self._backend
    -- a task of its own: it goes on (and frees the slot) past a deadline the caller gave up at
    self._releasing = task.spawn(function()
      pcall(backend.release, backend)
      pool:_free(self)
    end)
  end
  local releasing = self._releasing
  if releasing and not releasing.done then
    pcall(with_deadline, pool.call_timeout_ms, function() releasing:wait() end)
  end
end

-- }======================================================

-- {======================================================
-- The desktop
-- =======================================================

-- `sandbox.desktop`: the provider's desktop (the backend's `desktop`), each call checked, held to the
-- sandbox's life and to the pool's call timeout as the sandbox's own calls are.
local Desktop = {}
Desktop.__index = Desktop

local BUTTONS = { left = true, right = true, middle = true }
local DIRECTIONS = { up = true, down = true, left = true, right = true }
local MAX_COORDINATE = 65535
local MAX_TYPE_BYTES = 65536
local TYPE_MS_PER_BYTE = 50            -- the call timeout grows with what is typed
local PNG_SIGNATURE = '\137PNG\r\n\26\n'

local function new_desktop(sandbox)
  return setmetatable({ _sandbox = sandbox }, Desktop)
end

-- Calls the backend's desktop[name] within the call timeout (plus `extra_ms`), mapping failures.
function Desktop:_call(extra_ms, name, ...)
  local sb = self._sandbox
  alive(sb)
  local d = sb._backend.desktop
  if type(d[name]) ~= 'function' then
    errors.raise('INVALID_INPUT', 'this provider\'s desktop cannot ' .. (name:gsub('_', ' ')), nil, 3)
  end
  local args, n = { ... }, select('#', ...)
  local ok, res = pcall(with_deadline, sb._pool.call_timeout_ms + extra_ms, function()
    return d[name](d, check.unpack(args, 1, n))
  end)
  if not ok then
    local err = provider_error(res)
    if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then sb._gone = true end
    if sb._released or core.hrtime_ms() >= sb._expires_at then err = gone() end
    error(err, 0)
  end
  return res
end

local function coordinate(v, name)
  return check.int(v, name, 0, MAX_COORDINATE, 'INVALID_INPUT', 4)
end

-- `{ x, y, ... }` with x and y both given (or, when `optional`, neither), and only `extra` keys besides.
local function point(o, what, extra, optional)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', what .. ' expects a table', nil, 4) end
  -- a bare pair { x, y } (drag's from and to) reads as { x = ..., y = ... }
  if not extra and o[1] ~= nil and o.x == nil and o.y == nil and next(o, 2) == nil and #o == 2 then
    o = { x = o[1], y = o[2] }
  end
  local keys = { x = true, y = true }
  for k in pairs(extra or {}) do keys[k] = true end
  check.keys(o, keys, what .. ' options', 'INVALID_INPUT', 4)
  local out = {}
  if o.x == nil and o.y == nil and optional then return out end
  out.x, out.y = coordinate(o.x, 'x'), coordinate(o.y, 'y')
  return out
end

local function button(o, out)
  if o.button ~= nil and not BUTTONS[o.button] then
    errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 4)
  end
  out.button = o.button or 'left'
  return out
end

--- The screen as PNG bytes.
function Desktop:screenshot()
  local png = self:_call(0, 'screenshot')
  if type(png) ~= 'string' or png:sub(1, 8) ~= PNG_SIGNATURE or png:sub(13, 16) ~= 'IHDR' then
    error(bad_reply('screenshot'), 2)
  end
  return png
end

--- `{ x, y, button }`: clicks ('left' by default) at x, y, or where the pointer is without them.
function Desktop:click(o)
  self:_call(0, 'click', button(o, point(o, 'click', { button = true }, true)))
end

--- `{ x, y, button }`: as click, twice.
function Desktop:double_click(o)
  self:_call(0, 'double_click', button(o, point(o, 'double_click', { button = true }, true)))
end

--- `{ x, y }`: moves the pointer.
function Desktop:move(o)
  self:_call(0, 'move', point(o, 'move'))
end

--- `{ direction, amount, x, y }`: scrolls 'up', 'down', 'left' or 'right', `amount` steps (1 by
-- default, at most 100), at x, y when given.
function Desktop:scroll(o)
  local out = point(o, 'scroll', { direction = true, amount = true }, true)
  if not DIRECTIONS[o.direction] then
    errors.raise('INVALID_INPUT', "direction must be 'up', 'down', 'left' or 'right'", nil, 2)
  end
  out.direction = o.direction
  out.amount = check.int(o.amount, 'amount', 1, 100, 'INVALID_INPUT', 3, 1)
  self:_call(0, 'scroll', out)
end

--- `{ from = { x, y }, to = { x, y }, button }`: presses at `from`, moves to `to` and lets go there.
function Desktop:drag(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'drag expects a table', nil, 2) end
  check.keys(o, { from = true, to = true, button = true }, 'drag options', 'INVALID_INPUT', 3)
  local out = button(o, {})
  out.from, out.to = point(o.from, 'drag.from'), point(o.to, 'drag.to')
  self:_call(0, 'drag', out)
end

--- Types text (at most 64 KiB, no NUL byte).
function Desktop:type(text)
  if type(text) ~= 'string' then errors.raise('INVALID_INPUT', 'text must be a string', nil, 2) end
  if text:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'text contains a NUL byte', nil, 2) end
  if #text > MAX_TYPE_BYTES then
    errors.raise('INVALID_INPUT', 'text is longer than ' .. MAX_TYPE_BYTES .. ' bytes', nil, 2)
  end
  self:_call(#text * TYPE_MS_PER_BYTE, 'type', text)
end

--- Presses a key or a combination: 'Return', 'Enter', 'ctrl+c', 'shift+Tab', 'F5'.
function Desktop:key(name)
  local ok = type(name) == 'string' and #name >= 1 and #name <= 64
  if ok then
    for part in (name .. '+'):gmatch('([^+]*)%+') do ok = ok and part:match('^[%w_]+$') ~= nil end
  end
  if not ok then
    errors.raise('INVALID_INPUT', 'key must be a key name or names joined by + (letters, digits and _)', nil, 2)
  end
  self:_call(0, 'key', name)
end

--- `{ width, height }` of the screen.
function Desktop:size()
  local s = self:_call(0, 'size')
  if type(s) ~= 'table' or not check.is_int(s.width) or not check.is_int(s.height) or s.width < 1
    or s.height < 1 then
    error(bad_reply('screen size'), 2)
  end
  return { width = s.width, height = s.height }
end

--- The URL of a live view of the desktop, on providers that give one (INVALID_INPUT elsewhere).
-- `options` (a table, or nil) goes to the provider: `{ view_only = true }` for a view that cannot act.
function Desktop:view_url(options)
  alive(self._sandbox)
  if options ~= nil then
    check.keys(options, { view_only = true }, 'view_url options', 'INVALID_INPUT', 3)
    if options.view_only ~= nil and type(options.view_only) ~= 'boolean' then
      errors.raise('INVALID_INPUT', 'view_only must be a boolean', nil, 2)
    end
  end
  local d = self._sandbox._backend.desktop
  if type(d.view_url) ~= 'function' then
    errors.raise('INVALID_INPUT', 'this provider gives no live view of its desktop', nil, 2)
  end
  local url = self:_call(0, 'view_url', options)
  if type(url) ~= 'string' or not url:match('^https?://') then error(bad_reply('URL'), 2) end
  return url
end

-- }======================================================

-- {======================================================
-- The pool
-- =======================================================

local Pool = {}
Pool.__index = Pool

local pool_keys = {
  max_sandboxes = true, max_lifetime_ms = true, network = true, exec_timeout_ms = true,
  max_exec_timeout_ms = true, max_output_bytes = true, max_file_bytes = true, call_timeout_ms = true,
  labels = true, on_event = true, warm_start = true, max_snapshots = true, max_snapshot_bytes = true,
}

--- Holds every sandbox from `provider` to the same limits.
function M.create_sandboxes(provider, options)
  if type(provider) ~= 'table' or type(provider.create) ~= 'function' then
    errors.raise('INVALID_CONFIG', 'provider must be a sandbox provider (a table with create)', nil, 2)
  end
  if type(options) ~= 'table' then
    errors.raise('INVALID_CONFIG', 'options with max_sandboxes and max_lifetime_ms are required', nil, 2)
  end
  check.keys(options, pool_keys, 'create_sandboxes options', 'INVALID_CONFIG', 3)
  if options.max_sandboxes == nil then errors.raise('INVALID_CONFIG', 'max_sandboxes is required', nil, 2) end
  if options.max_lifetime_ms == nil then errors.raise('INVALID_CONFIG', 'max_lifetime_ms is required', nil, 2) end
  local C = 'INVALID_CONFIG'
  check.int(options.max_sandboxes, 'max_sandboxes', 1, 100000, C, 3)
  check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, 366 * 86400000, C, 3)
  local provider_max = provider.max_lifetime_ms
  if check.is_int(provider_max) and options.max_lifetime_ms > provider_max then
    errors.raise(C, 'max_lifetime_ms is above the provider\'s (' .. provider_max .. ')', nil, 2)
  end
  local network = options.network
  if network == nil then network = { 'none' } end
  if type(network) ~= 'table' or #network == 0 then
    errors.raise(C, "network must be a list of kinds ('none', 'all', 'allowlist')", nil, 2)
  end
  local kinds = {}
  for i, k in ipairs(network) do
    if not NETWORK_KINDS[k] then errors.raise(C, 'network[' .. i .. '] is not a network kind', nil, 2) end
    kinds[k] = true
  end
  local self = setmetatable({
    provider = provider,
    max_sandboxes = options.max_sandboxes,
    max_lifetime_ms = options.max_lifetime_ms,
    network = kinds,
    exec_timeout_ms = check.int(options.exec_timeout_ms, 'exec_timeout_ms', 1, nil, C, 3, 60000),
    max_exec_timeout_ms = check.int(options.max_exec_timeout_ms, 'max_exec_timeout_ms', 1, nil, C, 3, 1800000),
    max_output_bytes = check.int(options.max_output_bytes, 'max_output_bytes', 0, 1024 * MIB, C, 3, MIB),
    max_file_bytes = check.int(options.max_file_bytes, 'max_file_bytes', 0, 512 * MIB, C, 3, 16 * MIB),
    call_timeout_ms = check.int(options.call_timeout_ms, 'call_timeout_ms', 1, nil, C, 3, 120000),
    labels = check_labels(options.labels, 3),
    on_event = options.on_event,
    max_snapshots = check.int(options.max_snapshots, 'max_snapshots', 0, 100000, C, 3, 16),
    max_snapshot_bytes = check.int(options.max_snapshot_bytes, 'max_snapshot_bytes', 0, 65536 * MIB, C, 3,
      1024 * MIB),
    _snapshots = {},
    _snap_count = 0,   -- held, and being made
    _snap_bytes = 0,   -- the sizes of those held
    _snap_busy = false, _snap_turns = {},   -- a snapshot is being made; those waiting their turn
    workdir = type(provider.workdir) == 'string' and provider.workdir or '/workspace',
    _alive = {},
    _count = 0,
    _closed = false,
  }, Pool)
  if options.on_event ~= nil and type(options.on_event) ~= 'function' then
    errors.raise(C, 'on_event must be a function', nil, 2)
  end
  if self.exec_timeout_ms > self.max_exec_timeout_ms then
    if options.exec_timeout_ms ~= nil then
      errors.raise(C, 'exec_timeout_ms is above max_exec_timeout_ms', nil, 2)
    end
    self.exec_timeout_ms = self.max_exec_timeout_ms   -- the default never passes the cap
  end
  -- a provider with warm sandboxes (its option `warm`) keeps them for this pool, as long as no other
  -- pool holds them: they live max_lifetime_ms, carry the pool's labels and take free slots only
  -- (at once, or with `warm_start = 'first_use'` at the pool's first create: a pool made only to be
  -- checked, as a policy's are, starts nothing)
  if options.warm_start ~= nil and options.warm_start ~= 'now' and options.warm_start ~= 'first_use' then
    errors.raise(C, "warm_start must be 'now' or 'first_use'", nil, 2)
  end
  if type(provider.warm_attach) == 'function' then
    if options.warm_start == 'first_use' then self._warm_later = true else self:_attach_warm() end
  end
  return self
end

function Pool:_attach_warm()
  local provider = self.provider
  local budget = { max_lifetime_ms = self.max_lifetime_ms, labels = self.labels }
  function budget.may_fill()
    return not self._closed and self._count + provider:warm_held() < self.max_sandboxes
  end
  self._warm = provider:warm_attach(budget)
end

-- How many of this pool's slots the provider's warm sandboxes take (ready, starting or ending).
function Pool:_warm_held()
  return self._warm and self.provider:warm_held() or 0
end

local create_keys = {
  lifetime_ms = true, network = true, env = true, ports = true, cpus = true, memory_mib = true,
  image = true, labels = true, desktop = true, snapshot = true,
}

-- The pool forgets a snapshot and frees its room (snapshot:release(), close()).
function Pool:_release_snapshot(snap)
  if snap._released then return end
  snap._released = true
  if self._snapshots[snap] then
    self._snapshots[snap] = nil
    self._snap_count = self._snap_count - 1
    self._snap_bytes = self._snap_bytes - snap.size_bytes
  end
  local held = snap._held
  snap._held = nil
  if held and held.native then pcall(held.native.release, held.native) end
end

--- How many snapshots the pool holds, and their bytes together.
function Pool:snapshots()
  return self._snap_count, self._snap_bytes
end

--- Creates a sandbox: `{ lifetime_ms, network, env, ports, cpus, memory_mib, image, labels, desktop,
-- snapshot }`.
function Pool:create(options)
  if self._closed then error(errors.sandbox('closed', 'the pool is closed'), 2) end
  if self._warm_later then
    self._warm_later = nil
    self:_attach_warm()
  end
  if type(options) ~= 'table' then errors.raise('INVALID_INPUT', 'options with lifetime_ms are required', nil, 2) end
  check.keys(options, create_keys, 'create options', 'INVALID_INPUT', 3)
  if options.lifetime_ms == nil then errors.raise('INVALID_INPUT', 'lifetime_ms is required', nil, 2) end
  check.int(options.lifetime_ms, 'lifetime_ms', 1, nil, 'INVALID_INPUT', 3)
  if options.lifetime_ms > self.max_lifetime_ms then
    errors.raise('LIMIT_EXCEEDED', 'lifetime_ms is above max_lifetime_ms (' .. self.max_lifetime_ms .. ')', nil, 2)
  end
  local features = copy_features(self.provider.features)
  local kind, network = check_network_request(options.network)
  -- Asking for nothing means 'none', from any pool: 'none' needs no listing. On a provider that
  -- cannot keep a sandbox offline (no 'none' in its features.network) that fails with INVALID_INPUT
  -- below, never a sandbox online that its creator expected offline.
  if kind == nil then kind, network = 'none', 'none' end
  -- Each kind other than 'none' must be listed; 'none' needs no permission, only a provider that keeps it.
  if kind ~= 'none' and not self.network[kind] then
    errors.raise('PERMISSION_DENIED', "network '" .. kind .. "' is not allowed by this pool", nil, 2)
  end
  if not has(features.network, kind) then
    if options.network == nil then
      errors.raise('INVALID_INPUT', "this provider cannot keep a sandbox offline: ask for one of the pool's kinds",
        nil, 2)
    end
    errors.raise('INVALID_INPUT', "this provider cannot give network '" .. kind .. "'", nil, 2)
  end
  -- events the provider tells before the sandbox object exists wait in `events`
  local events, holder = {}, {}
  local function on_event(event)
    if type(event) ~= 'table' or type(event.type) ~= 'string' then return end
    local e = {}
    for k, v in pairs(event) do
      if type(k) == 'string' and (type(v) == 'string' or type(v) == 'number' or type(v) == 'boolean') then e[k] = v end
    end
    e.sandbox = holder.id
    if #events >= MAX_EVENTS then table.remove(events, 1) end
    events[#events + 1] = e
    if self.on_event then
      local copy = {}
      for k, v in pairs(e) do copy[k] = v end
      local ok, err = pcall(self.on_event, copy)
      if not ok then core.report('the pool\'s on_event failed: ' .. tostring(err)) end
    end
  end
  local spec = {
    lifetime_ms = options.lifetime_ms,
    network = network,
    env = check_env(options.env, 3),
    call_timeout_ms = self.call_timeout_ms,
    on_event = on_event,
  }
  local ports = {}
  if options.ports ~= nil then
    if type(options.ports) ~= 'table' then errors.raise('INVALID_INPUT', 'ports must be a list', nil, 2) end
    if not features.ports and #options.ports > 0 then
      errors.raise('INVALID_INPUT', 'this provider does not serve ports', nil, 2)
    end
    if #options.ports > 64 then errors.raise('INVALID_INPUT', 'at most 64 ports', nil, 2) end
    spec.ports = {}
    for i, port in ipairs(options.ports) do
      check.int(port, 'ports[' .. i .. ']', 1, 65535, 'INVALID_INPUT', 3)
      if not ports[port] then
        ports[port] = true
        spec.ports[#spec.ports + 1] = port
      end
    end
  end
  if options.cpus ~= nil then
    if type(options.cpus) ~= 'number' or options.cpus ~= options.cpus or options.cpus <= 0 or options.cpus > 1024 then
      errors.raise('INVALID_INPUT', 'cpus must be a number above 0', nil, 2)
    end
    spec.cpus = options.cpus
  end
  if options.memory_mib ~= nil then
    spec.memory_mib = check.int(options.memory_mib, 'memory_mib', 1, 16 * 1048576, 'INVALID_INPUT', 3)
  end
  if options.image ~= nil then
    if type(options.image) ~= 'string' or options.image == '' or #options.image > 1024
      or options.image:find('%z') then
      errors.raise('INVALID_INPUT', 'image must be a non-empty string', nil, 2)
    end
    spec.image = options.image
  end
  if options.desktop ~= nil then
    if type(options.desktop) ~= 'boolean' then errors.raise('INVALID_INPUT', 'desktop must be a boolean', nil, 2) end
    if options.desktop and not features.desktop then
      errors.raise('INVALID_INPUT', 'this provider has no desktop', nil, 2)
    end
    spec.desktop = options.desktop
  end
  local snap = options.snapshot ~= nil and check_snapshot(self, options.snapshot, 3) or nil
  -- what the new sandbox starts with: the provider's own snapshot goes to its create, an archive is
  -- unpacked once the sandbox is made (a reference of its own: a release meanwhile does not take it)
  local held = snap and snap._held
  if held and held.native then spec.snapshot = held.native end
  local labels = check_labels(options.labels, 3)
  spec.labels = {}
  for k, v in pairs(self.labels) do spec.labels[k] = v end
  for k, v in pairs(labels) do spec.labels[k] = v end

  local provider = self.provider
  -- a warm sandbox of exactly the asked shape moves from the provider's slots to the pool's; a
  -- create of another shape finding every slot taken makes room by destroying a warm one
  local warm = self._warm and not spec.snapshot and provider:warm_claim(self._warm, spec) or nil
  if not warm and self._count + self:_warm_held() >= self.max_sandboxes then
    if self._warm then provider:warm_evict(self._warm) end
    if self._closed then error(errors.sandbox('closed', 'the pool is closed'), 2) end
    if self._count + self:_warm_held() >= self.max_sandboxes then
      errors.raise('LIMIT_EXCEEDED', 'max_sandboxes (' .. self.max_sandboxes .. ') are alive', nil, 2)
    end
  end
  self._count = self._count + 1
  local started = core.hrtime_ms()
  local returned, handed_late = false, false
  local ok, backend = pcall(with_deadline, self.call_timeout_ms, function()
    local r = pack(pcall(provider.create, provider, spec, warm))
    returned = true
    if not r[1] then error(r[2], 0) end
    return check.unpack(r, 2, r.n)
  end, function(created, late)
    -- created after the pool gave up on it: released at once, and only then is its slot free
    handed_late = true
    if created and type(late) == 'table' and late.release then pcall(late.release, late) end
    self._count = self._count - 1
  end)
  if not ok then
    -- else once the late create has ended; a create that ended as the deadline passed, before this
    -- resumed, went to the late path already and frees its slot there
    if returned and not handed_late then self._count = self._count - 1 end
    error(provider_error(backend), 2)
  end
  if type(backend) ~= 'table' or type(backend.exec) ~= 'function' then
    self._count = self._count - 1
    error(bad_reply('backend'), 2)
  end
  if spec.desktop and type(backend.desktop) ~= 'table' then
    pcall(backend.release, backend)
    self._count = self._count - 1
    error(errors.sandbox('failed', 'the provider returned a sandbox without a desktop'), 2)
  end
  if self._closed then
    pcall(backend.release, backend)
    self._count = self._count - 1
    error(errors.sandbox('closed', 'the pool was closed'), 2)
  end
  if held and held.archive then
    -- the snapshot's files, before the sandbox is anyone's; a failure ends it and frees its slot
    local timeout = self.call_timeout_ms
    local restored, err = pcall(snapshots.restore, function(name, ...)
      local args, n = { ... }, select('#', ...)
      return with_deadline(2 * timeout, function() return backend[name](backend, check.unpack(args, 1, n)) end)
    end, held.archive, { timeout_ms = timeout, binary = backend.binary_streams == true })
    if not restored or self._closed then
      pcall(backend.release, backend)
      self._count = self._count - 1
      if restored then error(errors.sandbox('closed', 'the pool was closed'), 2) end
      err = provider_error(err)
      if errors.is(err, 'SANDBOX_ERROR') and (err.reason == 'gone' or err.reason == 'unavailable') then
        err = errors.sandbox('failed', 'the new sandbox ended while the snapshot was unpacked in it (do its files '
          .. 'fit its memory?)')
      end
      error(err, 2)
    end
  end
  local sandbox = setmetatable({
    id = type(backend.id) == 'string' and backend.id or ('sandbox-' .. tostring(started)),
    features = features,
    _pool = self,
    _backend = backend,
    _workdir = type(provider.workdir) == 'string' and provider.workdir or '/workspace',
    _ports = ports,
    _expires_at = started + options.lifetime_ms,
    _released = false,
    _events = events,
    _started = {},   -- handles of started processes still running
  }, Sandbox)
  holder.id = sandbox.id
  for _, e in ipairs(events) do e.sandbox = sandbox.id end
  if features.desktop and type(backend.desktop) == 'table' then sandbox.desktop = new_desktop(sandbox) end
  self._alive[sandbox] = true
  self:_arm(sandbox, options.lifetime_ms)
  return sandbox
end

-- Ends the sandbox from the pool's side at its lifetime (the provider ends it too, on its own).
function Pool:_arm(sandbox, ms)
  -- unref: a sandbox alone does not keep a script running
  sandbox._timer = task.after(ms, function()
    sandbox._timer = nil
    if not sandbox._released then task.spawn(function() self:_expire(sandbox) end) end
  end, true)
end

function Pool._expire(_, sandbox)
  if sandbox._released then return end
  sandbox:release()
end

function Pool._stop_timer(_, sandbox)
  if sandbox._timer then
    sandbox._timer.cancel()
    sandbox._timer = nil
  end
end

-- The provider has released the sandbox: its slot is free.
function Pool:_free(sandbox)
  if self._alive[sandbox] then
    self._alive[sandbox] = nil
    self._count = self._count - 1
    -- a slot is free: the provider's warm sandboxes may take it again
    if self._warm then self.provider:warm_fill(self._warm) end
  end
end

--- How many sandboxes are alive, being created, or being released (until the provider's release
-- has returned). The provider's warm sandboxes are not in it, but take slots too: this count and
-- theirs (`provider:warm_held()`) together stay within max_sandboxes.
function Pool:count()
  return self._count
end

--- Releases every sandbox still alive, and the provider's warm sandboxes held for this pool (those
-- being started too), and refuses new ones.
function Pool:close()
  self._closed = true
  for snap in pairs(self._snapshots) do self:_release_snapshot(snap) end
  local list = {}
  for sb in pairs(self._alive) do list[#list + 1] = sb end
  local tasks = {}
  if self._warm then
    local provider, budget = self.provider, self._warm
    tasks[#tasks + 1] = task.spawn(function() provider:warm_detach(budget) end)
  end
  for _, sb in ipairs(list) do tasks[#tasks + 1] = task.spawn(function() sb:release() end) end
  for _, t in ipairs(tasks) do pcall(t.wait, t) end
end

-- }======================================================

--- Maps an HTTP status to a SandboxError: 401/403 authentication, 404 not_found,
-- 409 conflict, 408/504 timeout, 429 rate_limited, other 5xx unavailable, else failed.
function M.sandbox_http_failure(status)
  local reason
  if status == 401 or status == 403 then reason = 'authentication'
  elseif status == 404 then reason = 'not_found'
  elseif status == 409 then reason = 'conflict'
  elseif status == 408 or status == 504 then reason = 'timeout'
  elseif status == 429 then reason = 'rate_limited'
  elseif type(status) == 'number' and status >= 500 and status <= 599 then reason = 'unavailable'
  else reason = 'failed' end
  local e = errors.sandbox(reason, 'the provider answered HTTP ' .. tostring(status))
  e.status = status
  return e
end

M.with_deadline = with_deadline

-- {======================================================
-- Providers by name
-- =======================================================

-- The providers mayura ships: each is the module mayura.sandbox.<name>, whose `sandboxes` is its
-- own `<name>_sandboxes`.
local PROVIDERS = { 'agentcore', 'apple_container', 'cloudflare', 'codesandbox', 'daytona', 'docker', 'e2b',
  'e2b_desktop', 'fly', 'kubernetes', 'local', 'modal', 'northflank', 'railway', 'vercel' }
-- The library's own modules of the same namespace: never providers, never loaded by name.
local NOT_PROVIDERS = { init = true, command = true, per_run = true, scripts = true, testing = true,
  tools = true }

local function bad_provider(name, message)
  errors.raise('INVALID_INPUT', message, { unknown_provider = name }, 3)
end

--- The names of the providers mayura ships, sorted (a new list each call).
function M.providers()
  local out = {}
  for i, name in ipairs(PROVIDERS) do out[i] = name end
  return out
end

--- The provider named `name`: `require('mayura.sandbox.' .. name).sandboxes(options, how)`, the same
-- function as that module's `<name>_sandboxes` (`how`: local and Docker take `{ check = true }`).
-- A name is lowercase letters, digits and `_`, starting with a letter: one of providers(), or the
-- module of another provider on the module path (one that exports a `sandboxes` function). Any
-- other name raises INVALID_INPUT (with `unknown_provider` = the name) having loaded nothing but,
-- for a well-formed name, the module mayura.sandbox.<name> when there is one.
function M.provider(name, options, how)
  if type(name) ~= 'string' then bad_provider(name, 'a provider name must be a string') end
  if #name > 64 or not name:match('^[a-z][a-z0-9_]*$') then
    bad_provider(name, 'provider name ' .. string.format('%q', name:sub(1, 64)) .. ' is not valid: lowercase '
      .. 'letters, digits and _, starting with a letter, at most 64 bytes')
  end
  if NOT_PROVIDERS[name] then bad_provider(name, 'mayura.sandbox.' .. name .. ' is not a provider') end
  local module = 'mayura.sandbox.' .. name
  local ok, mod = pcall(require, module)
  if not ok then
    -- no such module: an unknown name; a module that fails as it loads fails as itself
    if type(mod) == 'string' and mod:find("module '" .. module .. "' not found", 1, true) then
      bad_provider(name, "unknown provider '" .. name .. "' (mayura's: " .. table.concat(PROVIDERS, ', ') .. ')')
    end
    error(mod, 0)
  end
  if type(mod) ~= 'table' or type(mod.sandboxes) ~= 'function' then
    bad_provider(name, module .. ' is not a provider: it exports no sandboxes(options)')
  end
  return mod.sandboxes(options, how)
end

-- }======================================================

--- Tools that let an agent work in a sandbox (mayura.sandbox.tools).
function M.sandbox_tools(source, options)
  return require('mayura.sandbox.tools').sandbox_tools(source, options)
end

--- A sandbox for each run, created the first time one of its tools needs it (mayura.sandbox.per_run).
function M.sandbox_per_run(sandboxes, options)
  return require('mayura.sandbox.per_run').sandbox_per_run(sandboxes, options)
end

--- sh scripts for providers whose API only runs commands, and their listing's parser
-- (mayura.sandbox.scripts).
M.sandbox_scripts = require('mayura.sandbox.scripts')
M.parse_sandbox_listing = M.sandbox_scripts.parse_listing

--- The whole backend contract from a transport that runs short commands (mayura.sandbox.command).
function M.command_sandbox_backend(id, transport, release)
  return require('mayura.sandbox.command').command_sandbox_backend(id, transport, release)
end

return M
