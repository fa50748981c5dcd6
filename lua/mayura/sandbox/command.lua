--- mayura.sandbox.command: the whole sandbox backend from a transport that runs short commands.
--
-- `command_sandbox_backend(id, transport, release)` (exported by mayura.sandbox)
-- returns a backend for a provider's `create` when all the provider's API can
-- do is run a short command and answer with its exit code and output (an SSH
-- session, `docker exec`, a hosted service's exec endpoint). The transport is a
-- table:
--
--   transport:run(command, { stdin = text or nil, signal = token or nil, wait_ms = ms or nil })
--       runs `command`, a POSIX sh script, as `sh -c command` in the sandbox and
--       returns `{ exit_code = n, stdout = text }`; it may raise coded errors
--       (SANDBOX_ERROR `gone`, `timeout`, `unavailable`, ... or CANCELLED when
--       `signal` is cancelled), anything else becomes SANDBOX_ERROR `failed`.
--       A method (called with `:`), like every other backend call. `wait_ms`, given only
--       to a transport with `direct_ms`: the call runs a command itself and may take that
--       much longer than a call that does not.
--   transport.stdin              whether `run` takes standard input (default false)
--   transport.max_command_bytes  the longest command `run` takes (default 65536, at least 1024)
--   transport.max_output_bytes   the most standard output `run` gives back (default 1 MiB, at
--                                least 8192): every answer the backend asks for fits in it (file
--                                reads, outputs and listings come in parts that do); an answer
--                                cut anyway (`run` returned `truncated = true`, or the answer
--                                lacks the line every backend command ends with) is SANDBOX_ERROR
--                                `truncated`
--   transport.workdir            where commands run without a cwd (default /workspace)
--   transport.make_workdir       true: making the backend makes the workdir too (mkdir -p)
--   transport.wait_ms            the longest one call may wait in the sandbox for a command
--                                (default 1000; 0: never, the host polls with a backoff): a
--                                command that ends within it costs one call, its start
--   transport.direct_ms          the longest timeout of a command the call itself may run (default 0:
--                                none): a command without standard input, streaming or on_start
--                                whose timeout is at most this is run by the call's own shell as the
--                                service's exec would (no session of its own, no timer process), its
--                                outputs still to files and its cwd, env and tag as any other's;
--                                at its timeout it is stopped by its tag in a call of its own. For a
--                                transport whose calls can wait that long; a direct command does not
--                                outlive a call that breaks
--   transport.rate               optional `{ per_second = n, burst = n }`: the service's rate,
--                                which every call the backend makes keeps (a token bucket per
--                                table: sandboxes given the same table share it)
--   transport.state_dir          the backend's own directory in the sandbox (default
--                                /tmp/.mayura-<random>; made with mode 0700)
--   transport.env                optional: environment every command gets (the create
--                                spec's `env`, for a transport that cannot set it itself)
--   transport:url(port)          optional: the URL for `url(port)`
--
-- `release(backend)` (optional) ends the sandbox; the backend first kills every
-- process its commands started (setsid'd ones too) and removes its state
-- directory. Making the backend runs no command: its first call first makes the
-- state directory (and the workdir, with `make_workdir`) and checks for the tools
-- the scripts need, and fails with SANDBOX_ERROR `failed` when one is missing
-- (as does every call after it, until one finds them). exec takes standard input whatever the transport (it goes
-- through a file), so the provider can declare `features.stdin = true`.
--
-- How it works: exec writes standard input (if any) to a file, then starts the
-- command in the background in a session of its own, with MAYURA_EXEC=<tag> in
-- its environment and its stdout, stderr and exit code going to files in the
-- state directory. The same call then waits in the sandbox (up to `wait_ms`, never past the
-- command's timeout) until the exit code is there, so a short command costs one call; a longer
-- one is polled, each poll waiting as long again (without waits, polls back off on the host: 2 ms
-- doubling to 250 ms), every call within `rate`. The outputs are read (with the call that saw the end
-- when they are small, else in chunks within the transport's `max_output_bytes`)
-- up to the pool's `max_output_bytes`,
-- setting `truncated` past it. At the timeout or a cancel it runs
-- `sandbox_scripts.kill(tag)`, which stops every process carrying the tag, also
-- those that left the session; what a command leaves in its own process group
-- is killed a second after it ends (setsid'd processes survive), as the agent
-- does. Files move as base64 in chunks: on standard input when the transport
-- takes it, else inside the command line, each command kept within
-- `max_command_bytes` (a longer script is first written to a file in the state
-- directory, in chunks, then sourced). Writes go to a temporary file beside the
-- target, renamed into place.
--
-- Streaming (`o.on_output`, as the agent backend's): while the command runs, each poll also
-- brings what its files grew by (at most 48 KiB of each per poll, less where the transport's
-- answers are smaller; a waiting poll ends when they grow, a host-side one comes every 20 ms at
-- most while output keeps coming), passed on in order; the rest comes with the end. `o.on_start`
-- gets `{ kill(signal) }` (no pid: the command's own is not known here): it signals every process
-- carrying the command's tag but its own shell, which then records the exit code (128 + signal).
--
-- Errors are the agent backend's (`script_error`): INVALID_INPUT, PERMISSION_DENIED,
-- LIMIT_EXCEEDED, or SANDBOX_ERROR `failed`; the sandbox's own text never
-- becomes a message. Differences from the agent: the exit code of a command
-- killed by a signal is the shell's 128 + signal (no `signal` field), listing
-- times have the resolution stat gives (ms with GNU stat, seconds with BusyBox),
-- and a command's output takes room in the state directory until it ends (the
-- host reads at most the cap of it; small outputs a little longer: the files of
-- 16 ended commands are removed together, by a later call).
--
-- This file holds the flow (exec, release, the backend made); its mechanisms are private files:
-- _command_run (one script through the transport), _command_files (files over commands) and
-- _command_scripts (the sh scripts of a command's life and the parsing of their answers).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local scripts = require('mayura.sandbox.scripts')
local run = require('mayura.sandbox._command_run')
local files = require('mayura.sandbox._command_files')
local cs = require('mayura.sandbox._command_scripts')

local M = {}

local KIB, MIB = 1024, 1048576
local INLINE = 48 * KIB           -- outputs up to this come back with the poll that sees the end
local DEFAULT_OUTPUT_BYTES, MIN_OUTPUT_BYTES = MIB, 8192
local POLL_FIRST_MS, POLL_MAX_MS = 2, 250
local DEFAULT_WAIT_MS = 1000      -- the longest one call waits in the sandbox, unless the transport says
local GIVE_UP_MS = 5000          -- after a direct command's kill at its timeout, the longest its call may take
local POLL_STREAM_MS = 20         -- while a streaming command writes: the longest wait between polls
local DEFAULT_COMMAND_BYTES = 65536
local MIN_COMMAND_BYTES = 1024
local HEAD_ROOM, READY, TRAP, TOOLS = run.HEAD_ROOM, run.READY, run.TRAP, run.TOOLS

local q = scripts.quote
local gone, nonsense, int_of, nap = run.gone, run.nonsense, run.int_of, run.nap
local start_script, wait_script, remove_files, report = cs.start_script, cs.wait_script, cs.remove_files, cs.report
local direct_script = cs.direct_script
local poll_script, poll_stream_script, parse_chunks = cs.poll_script, cs.poll_stream_script, cs.parse_chunks
local signal_script, parse_report = cs.signal_script, cs.parse_report

-- The bytes base64 prints for `n` bytes: 4 per 3, and a newline after each 76 and at the end.
local function b64_bytes(n)
  local b = 4 * math.ceil(n / 3)
  return b + math.ceil(b / 76)
end

-- The most raw bytes, a multiple of `unit`, whose base64 fits in `room` (at least `unit`).
local function fits(room, unit)
  local n = math.floor(room * 57 / 77 / unit) * unit
  while n > unit and b64_bytes(n) > room do n = n - unit end
  return math.max(n, unit)
end

local function random_hex(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(n)
  if f then f:close() end
  if not bytes or #bytes ~= n then bytes = tostring(core.hrtime_ms()) .. tostring(math.random()) end
  return (bytes:sub(1, n):gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

local lines_of = scripts.lines

local Backend = {}
Backend.__index = Backend

-- running scripts (_command_run.lua) and files (_command_files.lua)
for _, methods in ipairs({ run.methods, files.methods }) do
  for name, f in pairs(methods) do Backend[name] = f end
end

function Backend:url(port)
  local t = self._transport
  if type(t.url) == 'function' then return t:url(port) end
  errors.raise('INVALID_INPUT', 'this sandbox serves no ports', nil, 0)
end

-- {======================================================
-- Commands
-- =======================================================
-- The outputs, from the report or read in chunks, cut at the cap; then the files are removed.
function Backend:_outputs(base, rep, cap)
  local res = { truncated = rep.out_size > cap or rep.err_size > cap }
  if rep.out then
    res.stdout, res.stderr = rep.out, rep.err
    self._trash[#self._trash + 1] = base   -- removed with a later call, with others
  else
    res.stdout = self:_read_upto(base .. '.out', cap) or ''
    res.stderr = self:_read_upto(base .. '.err', cap) or ''
    self:_run(remove_files(base))
  end
  if #res.stdout > cap then res.stdout, res.truncated = res.stdout:sub(1, cap), true end
  if #res.stderr > cap then res.stderr, res.truncated = res.stderr:sub(1, cap), true end
  return res
end

-- Runs a direct command's script (transport.direct_ms): the call's shell waits for the command.
-- At the deadline its processes are stopped by the tag, in a call of their own, which ends it; a
-- call that does not come back within GIVE_UP_MS after that is given up.
function Backend:_direct(rec, script, deadline, token)
  local call = task.cancel_token()
  local remove = token and token:on_cancel(function() call:cancel() end)
  local give_up
  local watch = task.after(math.max(1, math.ceil(deadline - core.hrtime_ms())), function()
    rec.expired = true
    give_up = task.after(self._give_up_ms, function() call:cancel() end, true)
    task.spawn(function() pcall(self._raw, self, scripts.kill(rec.tag)) end)
  end)
  local ok, out = pcall(self._run, self, script, nil, call, math.max(0, math.ceil(deadline - core.hrtime_ms())))
  watch.cancel()
  if give_up then give_up.cancel() end
  if remove then remove() end
  if not ok then
    if rec.expired and call.cancelled and not (token and token.cancelled) then
      error(errors.sandbox('timeout', 'the command did not end when it was stopped at its timeout'), 0)
    end
    error(out, 0)
  end
  return lines_of(out)
end

-- Kills the command's processes and removes its files (best effort: used on the way out).
function Backend:_stop(rec)
  pcall(self._raw, self, scripts.kill(rec.tag) .. remove_files(rec.base))
end

function Backend:exec(argv, o)
  local id = self:_id()
  local rec = { tag = self._prefix .. '.' .. id, base = self._state .. '/x' .. id }
  local cap = o.max_output_bytes or MIB
  local started = core.hrtime_ms()
  local env = {}
  for k, v in pairs(self._env) do env[k] = v end
  for k, v in pairs(o.env or {}) do env[k] = v end
  local stdin_file
  if o.stdin then
    stdin_file = rec.base .. '.in'
    self:_put(stdin_file, o.stdin)
  end
  local token = o.signal
  local remove
  if token then
    remove = token:on_cancel(function()
      rec.cancelled = true
      if rec.wake then rec.wake() end
    end)
  end
  self._running[rec] = true
  local streaming = o.on_output ~= nil
  local offsets = { stdout = 0, stderr = 0 }
  -- what a streaming command wrote past what was passed on already
  local function pass_on(name, bytes)
    if not streaming or #bytes == 0 then return end
    offsets[name] = offsets[name] + #bytes
    o.on_output(name, bytes)
  end
  local deadline = started + (o.timeout_ms or 60000)
  -- one call's script for the command's state: waits in the sandbox (up to the transport's
  -- wait_ms, never past the deadline) for its end, or for more output while it streams
  local function poll()
    local wait = wait_script(math.min(self._wait, deadline - core.hrtime_ms()), streaming and offsets or nil)
    return streaming and poll_stream_script(rec.base, offsets, cap, self._inline, wait)
      or poll_script(rec.base, self._inline, wait)
  end
  local ok, res = pcall(function()
    rec.started = true   -- from here on, a failure kills by the tag (whether the start got through or not)
    -- the start, then the command's state in the same call: a short command ends in it. A streaming
    -- one does not wait there for its end (its output would come at once, out of order): the
    -- poll's own wait ends as soon as either output grows
    local lines, code
    local cwd = o.cwd or self._workdir
    if not streaming and not o.on_start and not stdin_file and deadline - core.hrtime_ms() <= self._direct_ms then
      -- short enough for the call itself to wait for it
      lines = self:_direct(rec, direct_script(rec.base, rec.tag, cwd, env, argv, self._inline), deadline, token)
      if lines[1] ~= 'D' then error(nonsense(), 0) end
    else
      local first = streaming and 0 or math.min(self._wait, deadline - core.hrtime_ms())
      lines = lines_of(self:_run(start_script(rec.base, rec.tag, cwd, stdin_file, env, argv, first) .. poll(), nil,
        token))
      code = (lines[1] or ''):match('^E ([%w_]+)$')
      if code then error(scripts.script_error(code, 'the command'), 0) end
      if lines[1] ~= 'OK' then error(nonsense(), 0) end
      table.remove(lines, 1)
      if o.on_start then
        o.on_start({ kill = function(sig)
          if not rec.over and not self._closed then
            task.spawn(function() pcall(self._raw, self, signal_script(rec, sig)) end)
          end
        end })
      end
    end
    -- without waits in the sandbox, polls back off on the host (2 ms doubling to 250 ms)
    local delay = POLL_FIRST_MS
    while true do
      if streaming and lines[1] == 'R' and #lines > 1 then
        local o_new, e_new = parse_chunks(lines)
        pass_on('stdout', o_new)
        pass_on('stderr', e_new)
        -- output keeps coming: poll again soon
        if #o_new + #e_new > 0 then delay = math.min(delay, POLL_STREAM_MS) end
      elseif lines[1] == 'X' and #lines == 1 then
        error(errors.sandbox('failed', 'the command ended without an exit status'), 0)
      elseif lines[1] == 'D' then
        local rc = lines[2] or ''
        code = rc:match('^E ([%w_]+)$')
        if code then error(scripts.script_error(code, 'cwd'), 0) end
        local exit_code = int_of(rc)
        if not exit_code then error(nonsense(), 0) end
        local r = self:_outputs(rec.base, parse_report(lines, 3), cap)
        -- a direct command stopped at its timeout ended in the call
        if rec.expired then r.timed_out = true else r.exit_code, r.timed_out = exit_code, false end
        pass_on('stdout', r.stdout:sub(offsets.stdout + 1))
        pass_on('stderr', r.stderr:sub(offsets.stderr + 1))
        return r
      elseif lines[1] ~= 'R' or #lines ~= 1 then
        error(nonsense(), 0)
      end
      local now = core.hrtime_ms()
      if rec.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 0) end
      if now >= deadline then break end
      if self._wait <= 0 then
        nap(rec, math.min(delay, deadline - now))
        delay = math.min(delay * 2, POLL_MAX_MS)
      end
      if self._closed then error(gone(), 0) end
      if rec.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 0) end
      lines = lines_of(self:_run(poll(), nil, token))
    end
    -- the timeout: stop everything, then take what the command wrote
    lines = lines_of(self:_run(scripts.kill(rec.tag) .. 'echo K\n' .. report(rec.base, self._inline)))
    if lines[1] ~= 'OK' or lines[2] ~= 'K' then error(nonsense(), 0) end
    local r = self:_outputs(rec.base, parse_report(lines, 3), cap)
    r.timed_out = true
    pass_on('stdout', r.stdout:sub(offsets.stdout + 1))
    pass_on('stderr', r.stderr:sub(offsets.stderr + 1))
    return r
  end)
  rec.over = true
  self._running[rec] = nil
  if remove then remove() end
  if not ok then
    -- a cancel, a failure on the way: what was started stops
    if rec.started and not self._closed then self:_stop(rec) end
    if rec.cancelled and not (errors.is(res, 'SANDBOX_ERROR') and res.reason == 'gone') then
      errors.raise('CANCELLED', 'the command was cancelled', nil, 0)
    end
    error(res, 0)
  end
  res.duration_ms = core.hrtime_ms() - started
  return res
end

-- }======================================================

function Backend:release()
  if self._closed then return end
  self._closed = true
  for rec in pairs(self._running) do
    if rec.wake then rec.wake() end
  end
  -- every command this backend started, running or left behind, by the tags' common prefix
  local stop = scripts.kill(self._prefix .. '.', nil, true) .. 'rm -rf -- ' .. q(self._state) .. '\n'
  pcall(self._raw, self, stop, nil, nil, true)
  if self._release then self._release(self) end
end

--- A sandbox backend over `transport` (see the module's comment).
function M.command_sandbox_backend(id, transport, release)
  local C = 'INVALID_CONFIG'
  if type(id) ~= 'string' or id == '' then errors.raise(C, 'id must be a non-empty string', nil, 2) end
  if type(transport) ~= 'table' or type(transport.run) ~= 'function' then
    errors.raise(C, 'transport must be a table with a run method', nil, 2)
  end
  if release ~= nil and type(release) ~= 'function' then errors.raise(C, 'release must be a function', nil, 2) end
  for _, k in ipairs({ 'stdin', 'make_workdir' }) do
    if transport[k] ~= nil and type(transport[k]) ~= 'boolean' then
      errors.raise(C, 'transport.' .. k .. ' must be a boolean', nil, 2)
    end
  end
  local max = check.int(transport.max_command_bytes, 'transport.max_command_bytes', MIN_COMMAND_BYTES, nil, C, 2,
    DEFAULT_COMMAND_BYTES)
  local out_max = check.int(transport.max_output_bytes, 'transport.max_output_bytes', MIN_OUTPUT_BYTES, nil, C, 2,
    DEFAULT_OUTPUT_BYTES)
  local wait = check.int(transport.wait_ms, 'transport.wait_ms', 0, 3600000, C, 2, DEFAULT_WAIT_MS)
  local direct = check.int(transport.direct_ms, 'transport.direct_ms', 0, 3600000, C, 2, 0)
  local rate = transport.rate
  local ps = type(rate) == 'table' and rate.per_second
  if rate ~= nil and (type(ps) ~= 'number' or ps ~= ps or ps <= 0 or ps == math.huge
      or not check.is_int(rate.burst) or rate.burst < 1) then
    errors.raise(C, 'transport.rate must be { per_second = n > 0, burst = integer >= 1 }', nil, 2)
  end
  local workdir = transport.workdir or '/workspace'
  local prefix = random_hex(8)
  local state = transport.state_dir or ('/tmp/.mayura-' .. prefix)
  for what, p in pairs({ workdir = workdir, state_dir = state }) do
    if type(p) ~= 'string' or p:sub(1, 1) ~= '/' or #p > 256 or p:find('[%z\n]') then
      errors.raise(C, 'transport.' .. what .. ' must be an absolute path (at most 256 bytes)', nil, 2)
    end
  end
  local self = setmetatable({
    streaming = true,   -- exec passes output on as its polls see it, and tells on_start (no pid)
    id = id, _transport = transport, _release = release, _stdin = transport.stdin == true, _max = max - #TRAP,
    _out = out_max,
    -- a read's part and an output that comes inline (two of them in one answer) within _out
    _read_chunk = fits(out_max - HEAD_ROOM, 4096),
    _inline = math.min(INLINE, fits(math.floor((out_max - HEAD_ROOM) / 2), 3)),
    _workdir = workdir, _state = state, _prefix = prefix, _seq = 0, _running = {}, _closed = false,
    _env = {}, _wait = wait, _direct_ms = direct, _give_up_ms = GIVE_UP_MS, _rate = rate, _trash = {},
  }, Backend)
  if transport.env ~= nil then
    if type(transport.env) ~= 'table' then errors.raise(C, 'transport.env must be a table of strings', nil, 2) end
    for k, v in pairs(transport.env) do
      if type(k) ~= 'string' or not k:match('^[%a_][%w_]*$') or type(v) ~= 'string' or v:find('%z') then
        errors.raise(C, 'transport.env must map names to strings', nil, 2)
      end
      self._env[k] = v
    end
  end
  local words = {}
  for i, t in ipairs(TOOLS) do words[i] = t end
  -- the setup goes with the backend's first call (it ends the call early when it fails). One mkdir
  -- makes both directories: the mode applies to the state directory, not to the workdir (made as
  -- the parent of its `.`, with the default mode; one that exists is left as it is)
  local mk = 'mkdir -p -m 700 -- ' .. q(state) .. (transport.make_workdir and ' ' .. q(workdir .. '/.') or '') ..
    ' 2>/dev/null||{ if [ -d ' .. q(state) .. ' ];then echo "E workdir";else echo "E state";fi;exit 0;}\n'
  self._setup = mk ..
    'm=;for t in ' .. table.concat(words, ' ') .. ';do command -v "$t" >/dev/null 2>&1||{ echo "M $t";m=1;};done\n' ..
    '[ -z "$m" ]||exit 0\necho ' .. READY .. '\n'
  return self
end

return M