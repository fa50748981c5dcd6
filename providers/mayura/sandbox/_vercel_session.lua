--- mayura.sandbox._vercel_session: a Vercel sandbox's session, the backend of mayura.sandbox.vercel.
--
-- What a running sandbox does through the service's session API: a command as a detached command
-- whose log is streamed (a cut stream taken up again, a stop by the command's tag), files through
-- the service's file calls and the sandbox scripts, `url(port)` from the session's routes, the
-- service's own snapshots, and release (the session stopped, then the sandbox deleted). The
-- provider (mayura.sandbox.vercel) makes a backend with `M.new(fields)` once its create answered.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local tar = require('mayura.sandbox._tar')
local scripts = require('mayura.sandbox.scripts')

local json = core.json

local M = {}

M.GONE = { 404, 410, 422 }         -- 422: sandbox_stopping
local GONE = M.GONE
local BACKSTOP_MS = 5000           -- the service's command timeout, past ours
local KILL_TIMEOUT_MS = 10000      -- each call that stops a command
local KILL_GRACE_MS = 5000         -- for the stream to end with the exit once killed
local MAX_RESUMES = 8              -- a cut command stream taken up again, at most

local object, array = kit.object, kit.array

local tag_seq = 0
local function new_tag()
  tag_seq = tag_seq + 1
  return string.format('v%x-%x-%08x', core.now_ms(), tag_seq, math.random(0, 0x7fffffff))
end

-- {======================================================
-- The backend
-- =======================================================

local Backend = {}
Backend.__index = Backend
Backend.streaming = true   -- exec passes output lines on as they come, and tells on_start (a kill, no pid)

function Backend:_path(tail)
  return '/v2/sandboxes/sessions/' .. hosted.escape(self.session_id) .. (tail or '')
end

function Backend:_query(extra)
  local q = { teamId = self.team_id }
  for k, v in pairs(extra or {}) do q[k] = v end
  return q
end

-- Whether the session still runs: false when the service says it is gone or stopped.
function Backend:_running()
  local ok, body = pcall(self.client.json, self.client, 'GET', self:_path(), nil, {
    query = self:_query(), gone = GONE, retries = 1,
  })
  if not ok then
    if errors.is(body, 'SANDBOX_ERROR') and body.reason == 'gone' then return false end
    error(body, 0)
  end
  local s = type(body) == 'table' and body.session
  return type(s) == 'table' and (s.status == 'running' or s.status == 'pending')
end

local function stream_error(c, data)
  local code = type(data) == 'table' and c:_safe_code(data.code) or nil
  if code == 'sandbox_stopped' or code == 'sandbox_stopping' then
    return errors.sandbox('gone', 'vercel: the sandbox stopped while the command ran')
  end
  local e = errors.sandbox('failed', 'vercel: the command failed in the service')
  e.provider_code = code
  return e
end

-- Reads NDJSON lines of a command into `st`: output (capped), the command's id and its end.
local function command_reader(c, st, cap)
  return function(msg)
    if type(msg) ~= 'table' then error(c:bad_answer('a command line that is not an object'), 0) end
    local cmd = msg.command
    if type(cmd) == 'table' then
      if st.cmd_id == nil and type(cmd.id) == 'string' and cmd.id ~= '' and #cmd.id <= 256 then
        st.cmd_id = cmd.id
        if st.on_id then st.on_id() end
      end
      if check.is_int(cmd.exitCode) then
        st.final = cmd
        return false
      end
      return
    end
    local name = msg.stream
    if name == 'stdout' or name == 'stderr' then
      local data = msg.data
      if type(data) ~= 'string' then error(c:bad_answer('an output line without text'), 0) end
      local room = cap - st.sizes[name]
      if #data > room then
        data = data:sub(1, room > 0 and room or 0)
        st.truncated = true
      end
      if #data > 0 then
        st.sizes[name] = st.sizes[name] + #data
        local buf = st.out[name]
        buf[#buf + 1] = data
        -- streamed as the lines come; the logs read again after a cut pass on only what is new
        local streamed = st.streamed and st.streamed[name]
        if streamed and st.sizes[name] > streamed then
          st.streamed[name] = st.sizes[name]
          st.on_output(name, data:sub(#data - (st.sizes[name] - streamed) + 1))
        end
      end
    elseif name == 'error' then
      error(stream_error(c, msg.data), 0)
    end
    -- any other line is one a newer service added: not ours to read
  end
end

local function reset_output(st)
  st.out, st.sizes, st.truncated = { stdout = {}, stderr = {} }, { stdout = 0, stderr = 0 }, false
end

-- Runs an internal shell script as a command (no tag, the session's cwd) and returns its stdout.
function Backend:_script(script, timeout_ms, signal)
  local c = self.client
  local st = {}
  reset_output(st)
  c:stream('POST', self:_path('/cmd'), {
    command = 'sh', args = array({ '-c', script }), env = object(), sudo = false, wait = true, logs = true,
    timeout = (timeout_ms or c.call_timeout_ms) + BACKSTOP_MS,
  }, {
    query = self:_query(), format = 'ndjson', on_event = command_reader(c, st, 64 * 1048576), gone = GONE,
    timeout_ms = timeout_ms, signal = signal,
  })
  if not st.final then error(c:bad_answer('a command stream without its end'), 0) end
  if st.final.exitCode ~= 0 then
    error(errors.sandbox('failed', 'vercel: a helper command of the provider failed in the sandbox'), 0)
  end
  return table.concat(st.out.stdout)
end

-- Kills a command: the command itself when its id is known, then every process with its tag.
function Backend:_kill(st, tag)
  local c = self.client
  if st.cmd_id and not st.killed then
    st.killed = true
    pcall(c.json, c, 'POST', self:_path('/cmd/' .. hosted.escape(st.cmd_id) .. '/kill'), { signal = 9 }, {
      query = self:_query(), timeout_ms = KILL_TIMEOUT_MS, retries = 1, allow = { 404, 410 },
    })
  end
  pcall(self._script, self, scripts.kill(tag), KILL_TIMEOUT_MS)
end

-- Takes up a command whose stream was cut: its logs from the start (they end with it), then its exit.
function Backend:_resume(st, cap, deadline, token)
  local c = self.client
  local id = hosted.escape(st.cmd_id)
  local n = 0
  while true do
    local remaining = math.ceil(deadline - core.hrtime_ms())
    if remaining <= 0 then
      error(errors.sandbox('timeout', 'vercel: the command did not end within its time'), 0)
    end
    reset_output(st)
    local ok, err = pcall(c.stream, c, 'GET', self:_path('/cmd/' .. id .. '/logs'), nil, {
      query = self:_query(), format = 'ndjson', on_event = command_reader(c, st, cap), gone = GONE,
      timeout_ms = remaining, signal = token,
    })
    if ok then break end
    n = n + 1
    if n >= MAX_RESUMES or not (errors.is(err, 'SANDBOX_ERROR') and err.reason == 'unavailable') then
      error(err, 0)
    end
  end
  local body = c:json('GET', self:_path('/cmd/' .. id), nil, {
    query = self:_query({ wait = 'true' }), gone = GONE, signal = token,
    timeout_ms = math.max(1, math.ceil(deadline - core.hrtime_ms())),
  })
  local cmd = type(body) == 'table' and body.command
  if type(cmd) ~= 'table' or not check.is_int(cmd.exitCode) then
    error(c:bad_answer('a finished command without its exit code'), 0)
  end
  st.final = cmd
end

function Backend:exec(argv, o)
  local c = self.client
  local cap = o.max_output_bytes
  local tag = new_tag()
  local env = {}
  for k, v in pairs(self._env) do env[k] = v end   -- a warm sandbox's: its create's env
  for k, v in pairs(o.env or {}) do env[k] = v end
  env[scripts.TAG_VAR] = tag
  local args = {}
  for i = 2, #argv do args[#args + 1] = argv[i] end
  local body = {
    command = argv[1], args = array(args), cwd = o.cwd or self.workdir, env = object(env), sudo = false,
    wait = true, logs = true, timeout = o.timeout_ms + BACKSTOP_MS,
  }
  local started = core.hrtime_ms()
  local deadline = started + o.timeout_ms + c.call_timeout_ms
  local token = task.cancel_token()   -- ends our reading, never the caller's token
  local st = {}
  reset_output(st)
  local grace
  local function stop(why)
    if st.stopping or st.final then return end
    st.stopping = why
    st.stopper = task.spawn(function()
      self:_kill(st, tag)
      if why == 'cancel' then
        token:cancel('stopped')
      else
        -- the stream ends with the killed command's exit; if it does not, it ends here
        grace = task.after(KILL_GRACE_MS, function() token:cancel('stopped') end, true)
      end
    end)
  end
  if o.on_output then st.on_output, st.streamed = o.on_output, { stdout = 0, stderr = 0 } end
  -- an id that comes after the command was stopped: that command is killed too
  st.on_id = function()
    if st.stopping and not st.killed then task.spawn(function() self:_kill(st, tag) end) end
    if o.on_start then
      -- a started process's kill(signal): the service's kill of the command (no pid is told)
      o.on_start({ kill = function(sig)
        if st.final or st.killed then return end
        task.spawn(function()
          pcall(c.json, c, 'POST', self:_path('/cmd/' .. hosted.escape(st.cmd_id) .. '/kill'), { signal = sig }, {
            query = self:_query(), timeout_ms = KILL_TIMEOUT_MS, retries = 1, allow = { 404, 410 },
          })
        end)
      end })
    end
  end
  local timer = task.after(o.timeout_ms, function() stop('timeout') end, true)
  local remove
  if o.signal then remove = o.signal:on_cancel(function() stop('cancel') end) end

  local ok, err = pcall(c.stream, c, 'POST', self:_path('/cmd'), body, {
    query = self:_query(), format = 'ndjson', on_event = command_reader(c, st, cap), gone = GONE,
    timeout_ms = o.timeout_ms + c.call_timeout_ms, signal = token,
  })
  -- a cut stream, or one that ended before the command did: the command goes on in the sandbox
  local cut = (ok and not st.final) or (not ok and errors.is(err, 'SANDBOX_ERROR') and err.reason == 'unavailable')
  if cut and st.cmd_id and not st.stopping then
    local rok, rerr = pcall(self._resume, self, st, cap, deadline, token)
    if rok then
      ok, err = true, nil
    else
      ok = false
      if errors.is(rerr, 'SANDBOX_ERROR') and rerr.reason == 'gone' or not err then err = rerr end
    end
  elseif cut and not st.stopping then
    ok = false
    err = err or c:bad_answer('a command stream that ended before its command')
  end
  timer.cancel()
  if remove then remove() end
  if st.stopper then pcall(st.stopper.wait, st.stopper) end
  if grace then grace.cancel() end

  if st.stopping == 'cancel' then
    errors.raise('CANCELLED', 'the command was cancelled', nil, 0)
  end
  local timed_out = st.stopping == 'timeout'
  if not timed_out and not ok then
    if not st.cmd_id and errors.is(err, 'SANDBOX_ERROR') and err.reason ~= 'gone' then
      -- nobody knows whether it started: whatever carries its tag ends
      task.spawn(function() pcall(self._script, self, scripts.kill(tag), KILL_TIMEOUT_MS) end)
    end
    error(err, 0)
  end
  local final = st.final
  local elapsed = core.hrtime_ms() - started
  -- the service's own timeout (our backstop) kills with SIGKILL: 137
  if final and final.exitCode == 137 and elapsed >= o.timeout_ms then timed_out = true end
  return {
    exit_code = (not timed_out and final) and final.exitCode or nil,
    timed_out = timed_out,
    truncated = st.truncated,
    duration_ms = final and type(final.durationMs) == 'number' and final.durationMs >= 0 and final.durationMs
      or elapsed,
    stdout = table.concat(st.out.stdout), stderr = table.concat(st.out.stderr),
  }
end

-- Maps a file call's refusals to the caller's words; other statuses keep the kit's mapping.
local function file_error(what)
  return function(status)
    if status == 400 then return errors.new('INVALID_INPUT', what .. ' cannot be used there (HTTP 400)') end
    if status == 413 or status == 507 then
      return errors.new('LIMIT_EXCEEDED', what .. ' does not fit in the sandbox (HTTP ' .. status .. ')')
    end
    return nil
  end
end

function Backend:read_file(path, opts)
  local c = self.client
  local res = c:call('POST', self:_path('/fs/read'), {
    query = self:_query(), body = json.encode({ path = path }), content_type = 'application/json',
    headers = { Accept = 'application/octet-stream' }, gone = { 410, 422 }, allow = { 404 },
    on_error = file_error('the file'),
  })
  if res.status == 404 then
    -- no file, or no session: a bare 404 is the file; one with a body is asked about
    if res.body ~= '' and not self:_running() then
      error(errors.sandbox('gone', 'vercel: the sandbox is gone'), 0)
    end
    return nil
  end
  local ctype = tostring(res.headers['content-type'] or '')
  if not ctype:find('application/octet-stream', 1, true) then
    error(c:bad_answer('a file that is not application/octet-stream'), 0)
  end
  if opts and opts.max_bytes and #res.body > opts.max_bytes then
    errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes (' .. opts.max_bytes .. ')', nil, 0)
  end
  return res.body
end

function Backend:write_file(path, data)
  local body = tar.tar_gz({ { name = path:sub(2), data = data, mode = tonumber('644', 8) } })
  self.client:call('POST', self:_path('/fs/write'), {
    query = self:_query(), body = body, content_type = 'application/gzip', headers = { ['x-cwd'] = '/' },
    gone = GONE, on_error = file_error('the file'),
  })
end

kit.script_files(Backend, function(b) return b.client:bad_answer('a removal the provider cannot read') end)

function Backend:url(port)
  local url = self.routes[port]
  if not url then error(errors.sandbox('failed', 'vercel: the service gave port ' .. port .. ' no route'), 0) end
  return url
end

-- {------------------------------------------------------ snapshots

M.SNAPSHOT_EXPIRATION_MS = 86400000   -- the least the service keeps one: what a lost host leaves goes then

local function snapshot_release(snap)
  if snap._released then return end
  snap._released = true
  snap._client:json('DELETE', '/v2/sandboxes/snapshots/' .. hosted.escape(snap.id), nil, {
    query = { teamId = snap._team_id }, allow = { 404 }, timeout_ms = KILL_TIMEOUT_MS,
  })
end

local function native_snapshot(backend, id, size)
  return { id = id, size_bytes = size, _client = backend.client, _team_id = backend.team_id, _released = false,
    release = snapshot_release }
end

local function snapshot_id(v)
  return type(v) == 'string' and v ~= '' and #v <= 256 and not v:find('[%c%s/]') and v or nil
end

-- The snapshots of this sandbox's session on the service that this backend does not know (a call
-- whose answer was lost made them), deleted; best effort.
function Backend:_sweep_snapshots()
  pcall(function()
    local body = self.client:json('GET', '/v2/sandboxes/snapshots', nil, {
      query = self:_query({ project = self.project_id }), timeout_ms = KILL_TIMEOUT_MS,
    })
    local list = type(body) == 'table' and type(body.snapshots) == 'table' and body.snapshots or {}
    for _, sn in ipairs(list) do
      local id = type(sn) == 'table' and snapshot_id(sn.id)
      if id and sn.sourceSessionId == self.session_id and sn.status == 'created' and not self._snapshots[id] then
        pcall(snapshot_release, native_snapshot(self, id, 0))
      end
    end
  end)
end

--- The service's snapshot of the session (POST .../snapshot, kept a day after its last use): the
-- service stops the session to make it, so the sandbox ends with it (every later call is `gone`).
-- `o` = { timeout_ms }. Its size is the service's `sizeBytes`. A call that failed in a way that may
-- have made one looks for it by the session and deletes it.
function Backend:snapshot(o)
  local c = self.client
  local ok, res = pcall(c.json, c, 'POST', self:_path('/snapshot'), { expiration = M.SNAPSHOT_EXPIRATION_MS }, {
    query = self:_query(), gone = GONE, timeout_ms = o and o.timeout_ms, retries = 0,
  })
  local sn = ok and type(res) == 'table' and type(res.snapshot) == 'table' and res.snapshot or nil
  local id = sn and snapshot_id(sn.id)
  if id then
    self._snapshots[id] = true
    local snap = native_snapshot(self, id, 0)
    if not check.is_int(sn.sizeBytes) or sn.sizeBytes < 0 then
      pcall(snapshot_release, snap)
      error(c:bad_answer('a snapshot without its size'), 0)
    end
    snap.size_bytes = math.tointeger and math.tointeger(sn.sizeBytes) or sn.sizeBytes
    return snap
  end
  if ok or kit.may_have_made(res) then self:_sweep_snapshots() end
  if not ok then error(res, 0) end
  error(c:bad_answer('a snapshot without an id'), 0)
end

-- }------------------------------------------------------

function Backend:release()
  local c = self.client
  pcall(c.json, c, 'POST', self:_path('/stop'), nil, { query = self:_query(), allow = { 404, 410 } })
  c:json('DELETE', '/v2/sandboxes/' .. hosted.escape(self.name), nil, {
    query = self:_query({ projectId = self.project_id }), allow = { 404, 410 },
  })
end

-- }======================================================

--- A backend of a sandbox the service made: `fields` are `id`, `name`, `session_id`, `client`,
-- `team_id`, `project_id` and `workdir`.
function M.new(fields)
  fields._env, fields._snapshots = fields._env or {}, fields._snapshots or {}
  return setmetatable(fields, Backend)
end

-- }======================================================

return M
