--- mayura.sandbox._agent_backend: a sandbox backend that talks to the in-sandbox agent.
--
-- Shared by the providers whose sandboxes run build/mayura-agent as their
-- PID 1 (docker, and the shape local uses): everything a backend does
-- through the agent's channel (`core.channel` / `core.channel_connect`,
-- framed as in core/wire.h) lives here; a provider adds what is its own
-- (`url`, `release`, and how the channel is made).
--
--   local agent_backend = require('mayura.sandbox._agent_backend')
--   local Backend = agent_backend.class()          -- a class with the shared methods
--   function Backend:release() ... end              -- the provider's own
--   local b = setmetatable({ id = ..., ch = channel, closed = false }, Backend)
--   agent_backend.handshake(b, spec.env, workdir)   -- hello, then setup with the env
--
-- exec streams (`streaming = true`): given `o.on_output(name, chunk)` it asks
-- the agent for a streaming exec (core/wire.h, "Streaming") and passes each
-- chunk of 'stdout' or 'stderr' on as it comes, in order, at most
-- `max_output_bytes` of each (checked here again); the result's stdout and
-- stderr are the chunks joined. `o.on_start(ctl)` is told `{ pid, kill(signal) }`
-- once the command runs: kill sends a signal number to its tree (op `signal`).
--
-- Files (read_file, write_file, list_files, remove_file) move in parts over the
-- same channel: mayura.sandbox._agent_files, whose methods every class here has.
--
-- A backend object needs `ch` (the channel) and `closed` (true once the
-- channel is closed: every call then fails with SANDBOX_ERROR `gone`). It
-- may have `oom_kills()`, a method giving the sandbox's count of processes
-- killed for memory, to mark an exec's result `oom_killed`.
--
-- What the agent answers is untrusted (code in the sandbox runs as its user
-- and may replace it): its error strings are mapped to our own messages and
-- never passed on (mayura.sandbox._agent_files' reply_error), and the pool
-- checks every result again.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local files = require('mayura.sandbox._agent_files')
local warm = require('mayura.sandbox._warm')

local M = {}

local MIB = 1048576

--- The largest frame the host accepts from an agent (mayura.sandbox._agent_files).
M.MAX_FRAME_BYTES = files.MAX_FRAME_BYTES

--- Maps an agent's error reply to a coded error about `what`, in our words (mayura.sandbox._agent_files).
M.reply_error = files.reply_error
local nonsense = files.nonsense

local Methods = {}

--- Sends a request and waits for its reply; `on_id(id)` is told the
-- request's id as soon as it is sent. A closed channel is `gone`. With
-- `max_reply_bytes`, a longer reply closes the channel (`failed`) before it is read.
-- `on_more(frame)` makes it a streaming call (core/wire.h): it gets each `more` frame.
function Methods:call(req, on_id, max_reply_bytes, on_more)
  if self.closed then error(errors.sandbox('gone', 'the sandbox is gone'), 0) end
  local reply, err = task.await(function(done)
    local ok, id = pcall(self.ch.call, self.ch, req, done, max_reply_bytes, on_more)
    if not ok then return done(nil, errors.sandbox('gone', 'the sandbox is gone')) end
    if on_id then on_id(id) end
  end)
  if not reply then
    -- the channel's own errors (gone, failed) carry the core's words, never the agent's
    if errors.is(err) then error(err, 0) end
    error(errors.sandbox('failed', 'the sandbox agent failed'), 0)
  end
  if type(reply) ~= 'table' then error(nonsense(), 0) end
  return reply
end

-- The on_more of a streaming exec: passes chunks on within the cap; fills `st`.
local function stream_frames(self, o, st)
  local cap = o.max_output_bytes or MIB
  return function(f)
    if f.pid ~= nil then
      if st.started or type(f.pid) ~= 'number' then return end
      st.started = true
      if o.on_start then
        o.on_start({ pid = f.pid, kill = function(sig)
          if st.id and not st.over and not self.closed then
            pcall(self.ch.call, self.ch, { op = 'signal', target = st.id, signal = sig }, function() end)
          end
        end })
      end
      return
    end
    local name = f.fd == 1 and 'stdout' or f.fd == 2 and 'stderr' or nil
    if not name or type(f.data) ~= 'string' or st.over then return end
    local data, room = f.data, cap - st.size[name]
    if #data > room then data, st.truncated = data:sub(1, room), true end
    if #data == 0 then return end
    st.size[name] = st.size[name] + #data
    local parts = st[name]
    parts[#parts + 1] = data
    if o.on_output then o.on_output(name, data) end
  end
end

-- The host's own end of the lifetime: whatever the agent does (code in the sandbox runs as its uid
-- and may stop it), the sandbox is released a little after its lifetime, through the provider's
-- `release`. The timer keeps no script running.
function Methods:arm(ms)
  local uv = require('luv')
  local timer = uv.new_timer()
  self.timer = timer
  timer:start(ms, 0, function()
    if not timer:is_closing() then timer:close() end
    self.timer = nil
    if not self.released then task.spawn(function() pcall(self.release, self) end) end
  end)
  timer:unref()
end

-- Stops the host's lifetime timer (a release, or a warm sandbox given a new lifetime).
function Methods:disarm()
  if self.timer then
    if not self.timer:is_closing() then self.timer:close() end
    self.timer = nil
  end
end

-- A provider's release begins with this: false when a release already ran, or is under way (it
-- then returns once that one is done); else the sandbox is marked released and disarmed. The
-- provider then ends it and calls `release_done(ok, err)`, which tells those waiting and raises
-- `err` when not `ok`.
function Methods:release_begin()
  if self.released then
    if self.waiters then task.await(function(done) table.insert(self.waiters, done) end) end
    return false
  end
  self.released = true
  self.waiters = {}
  self:disarm()
  return true
end

function Methods:release_done(ok, err)
  local waiters = self.waiters
  self.waiters = nil
  for _, done in ipairs(waiters) do done() end
  if not ok then error(err, 0) end
end

-- Closes the agent's channel once (its end ends the agent).
function Methods:close_channel()
  if not self.closed then
    self.closed = true
    if self.ch then pcall(self.ch.close, self.ch) end
  end
end

function Methods:exec(argv, o)
  local kills_before = self.oom_kills and self:oom_kills() or 0
  local req = { op = 'exec', argv = argv, timeout_ms = o.timeout_ms, max_output_bytes = o.max_output_bytes }
  if o.cwd then req.cwd = o.cwd end
  if o.env and next(o.env) then req.env = o.env end
  if o.stdin then req.stdin = o.stdin end
  local st, on_more
  if o.on_output or o.on_start then
    req.stream = true
    st = { stdout = {}, stderr = {}, size = { stdout = 0, stderr = 0 } }
    on_more = stream_frames(self, o, st)
  end
  local token, remove = o.signal, nil
  local reply = self:call(req, function(id)
    if st then st.id = id end
    if token then
      remove = token:on_cancel(function()
        if not self.closed then pcall(self.ch.call, self.ch, { op = 'cancel', target = id }, function() end) end
      end)
    end
  end, nil, on_more)
  if st then st.over = true end
  if remove then remove() end
  if reply.error then error(M.reply_error(reply, 'cwd'), 0) end
  if reply.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 0) end
  local res = {
    exit_code = reply.exit_code,
    signal = reply.signal,
    stdout = st and table.concat(st.stdout) or reply.stdout,
    stderr = st and table.concat(st.stderr) or reply.stderr,
    truncated = reply.stdout_truncated == true or reply.stderr_truncated == true or (st and st.truncated) == true,
    timed_out = reply.timed_out == true,
    duration_ms = reply.duration_ms,
  }
  -- killed for memory: the command itself (signal 9), or a process it waited for (a shell's 137)
  if (reply.signal == 9 or reply.exit_code == 137) and self.oom_kills and self:oom_kills() > kills_before then
    res.oom_killed = true
  end
  return res
end


--- A new backend class holding the shared methods; the provider adds `url`
-- and `release` (and may replace any other).
function M.class()
  local class = {}
  for k, fn in pairs(Methods) do class[k] = fn end
  for k, fn in pairs(files.methods) do class[k] = fn end
  class.streaming = true   -- exec honours on_output and on_start as they happen
  class.binary_streams = true   -- exec's stdin and output carry any bytes, up to a frame (snapshots use them)
  class.__index = class
  return class
end

--- The first request on a new channel: `hello` (the agent is up and answers).
function M.hello(backend)
  local hello = backend:call({ op = 'hello' })
  if hello.error then error(errors.sandbox('failed', 'the sandbox agent did not start'), 0) end
end

--- The agent's one `setup`: the environment every command sees (so values never reach a command
-- line or a container's configuration) and the working directory. A warm sandbox gets it when it
-- is handed out, with `lifetime_ms`, the one asked for (the agent only ever shortens its own).
function M.setup(backend, env, workdir, lifetime_ms)
  -- an empty table would go on the wire as a list, which the agent refuses: no env then
  local req = { op = 'setup', workdir = workdir, lifetime_ms = lifetime_ms }
  if env and next(env) then req.env = env end
  local setup = backend:call(req)
  if setup.error then error(errors.sandbox('failed', 'the sandbox agent refused its setup'), 0) end
end

--- The first requests on a new channel: `hello`, then `setup` with the env and workdir.
function M.handshake(backend, env, workdir)
  M.hello(backend)
  M.setup(backend, env, workdir)
end

--- A sandbox that failed to start: releases what was made of it and raises the
-- failure, a channel that closed meanwhile as `unavailable`, anything uncoded
-- as `failed`.
function M.start_failed(backend, err)
  pcall(backend.release, backend)
  if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then
    error(errors.sandbox('unavailable', 'the sandbox did not start'), 0)
  end
  error(errors.is(err) and err or errors.sandbox('failed', 'the sandbox did not start'), 0)
end

--- Connects to an agent listening on the unix socket at `path`; returns the
-- channel, or nil and an error (SANDBOX_ERROR `unavailable`). `on_close(err)`
-- is called when the channel closes on its own.
function M.connect(path, on_close)
  return task.await(function(done)
    local ok, err = pcall(core.channel_connect, path, {
      max_frame_bytes = M.MAX_FRAME_BYTES,
      on_close = on_close,
    }, done)
    if not ok then done(nil, err) end
  end)
end


-- {======================================================
-- Warm sandboxes
-- =======================================================

--- Gives the provider `p` (its option `warm = n`) a set of `n` sandboxes of its default shape,
-- started ahead of time (the agent up and its hello said, no setup yet): mayura.sandbox._warm's
-- `add`, where a sandbox whose hand_out (the agent's setup) fails is ended as one that failed to
-- start (`start_failed`).
function M.add_warm(p, n, hooks)
  local h = {}
  for k, v in pairs(hooks) do h[k] = v end
  h.failed = function(_, b, err) M.start_failed(b, err) end
  return warm.add(p, n, h)
end

--- Warm sandboxes of the provider's own shape (local, Docker, Kubernetes): network 'none', its
-- image, no more than its cpus and memory, no ports, no desktop, made by `start(p, spec)`. With
-- `o.same_labels` a sandbox keeps the labels it was made with (a container's or a Pod's cannot
-- change), so a create asking for others gets a cold one. `o.hand_out(p, backend, spec)` readies
-- one for its create; `o.rearm_ms(spec)`, when given, is the host's new lifetime timer for it (the
-- asked lifetime, not the warm one's).
function M.add_own_shape_warm(p, start, o)
  return M.add_warm(p, p.warm, {
    make = function(self, lifetime_ms, labels)
      return start(self, { lifetime_ms = lifetime_ms, network = 'none', labels = labels })
    end,
    matches = function(self, spec, labels)
      return spec.network == 'none' and not (spec.ports and #spec.ports > 0) and not spec.desktop
        and (spec.image == nil or spec.image == self.image)
        and (spec.cpus == nil or spec.cpus >= self.cpus)
        and (spec.memory_mib == nil or spec.memory_mib >= self.memory_mib)
        and (not o.same_labels or warm.same_labels(spec.labels, labels))
    end,
    hand_out = function(self, backend, spec)
      o.hand_out(self, backend, spec)
      if o.rearm_ms then
        backend:disarm()
        backend:arm(o.rearm_ms(spec))
      end
    end,
  })
end

-- }======================================================

return M
