--- mayura.sandbox._exec: commands in a pool's sandbox: `exec`, `start` and its process handles.
--
-- `sandbox:exec(argv, opts)` and `sandbox:start(argv, opts)` (mayura.sandbox says what they
-- give): their options checked against the pool's limits, the backend's result checked and cut to
-- the caller's shape, the output streamed to `on_stdout` / `on_stderr` as the backend passes it on
-- (at most the result's cap), and the handle of a started command (`wait`, `kill`, `output`).
-- The sandbox's methods `exec` and `start` are this module's functions (mayura.sandbox._sandbox).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local checks = require('mayura.sandbox._checks')

local M = {}

local gone, alive, bad_reply = checks.gone, checks.alive, checks.bad_reply
local check_env, check_argv = checks.check_env, checks.check_argv

local exec_keys = { cwd = true, env = true, stdin = true, timeout_ms = true, signal = true,
  on_stdout = true, on_stderr = true }

-- Signals `kill` takes by name (with or without SIG); any number 1..64 goes as it is.
local SIGNALS = { HUP = 1, INT = 2, QUIT = 3, KILL = 9, USR1 = 10, USR2 = 12, TERM = 15, CONT = 18, STOP = 19 }

-- {======================================================
-- Streamed output: what reaches on_stdout / on_stderr
-- =======================================================

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

-- }======================================================

-- Checks exec's options; returns the argv and the backend's options.
local function exec_options(self, command, opts, default_timeout)
  local pool = self._pool
  local argv = check_argv(command)
  opts = opts == nil and {} or opts
  check.keys(opts, exec_keys, 'exec options', 'INVALID_INPUT', 4)
  local o = {}
  if opts.cwd ~= nil then o.cwd = checks.normalize_path(opts.cwd, self._workdir, 'cwd') end
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
function M.exec(self, command, opts)
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

-- {======================================================
-- Started processes: sandbox:start(argv, opts)
-- =======================================================

local Process = {}
Process.__index = Process

--- Starts a command and returns at once (once it runs, on a provider that says so) with a handle:
-- `pid` (in the sandbox; nil where the provider does not tell), `wait()` (exec's result, or its
-- errors), `kill(signal)` (9 by default; a number or a name such as 'TERM'), `output()` (the
-- output so far: `{ stdout, stderr, truncated }`). Options are exec's; `timeout_ms` defaults to
-- the sandbox's remaining lifetime (within the pool's `max_exec_timeout_ms`). Releasing the
-- sandbox stops it (`wait()` then fails `gone`).
function M.start(self, command, opts)
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

-- }======================================================

return M
