--- mayura._task: tasks on the shared loop, and the one way to wait.
--
-- A task is a coroutine started by `run`. A waiting call (`await`) yields
-- inside a task and is resumed by the loop; called from plain top-level
-- code, it runs the loop itself until its work is done, so a short script
-- needs no ceremony. Calling it from a loop callback that is not a task is
-- refused, since the loop cannot be run from inside itself; so is calling it
-- from top-level code when a host runs the loop (an editor's loop, or a game
-- that calls `step` every frame, see `core.set_driver`): there `run` starts a
-- task and returns it at once, and the waits go inside it.
local core = require('mayura.core')
local errors = require('mayura.errors')

local unpack = table.unpack or unpack  -- luacheck: ignore 143

local M = {}

local tasks = setmetatable({}, { __mode = 'k' })   -- coroutine -> task

local function pack(...)
  return { n = select('#', ...), ... }
end

local Task = {}
Task.__index = Task

-- A one-shot timer: calls fn() once after `ms` on the loop, unless cancelled first. Returns a
-- handle with `cancel(wait)` (true when it stopped the timer before it fired); with `wait`, inside a
-- task, cancel also waits for the timer's handle to close, so nothing is left pending (a handle whose
-- close is pending when the Lua state closes crashes luv 1.44). `unref`: the timer alone does not
-- keep a script's loop running.
local function after(ms, fn, unref)
  local uv = require('luv')
  local timer = uv.new_timer()
  local handle = { fired = false }
  local over = false
  -- libuv counts a timer from the loop's cached time, which lags while callbacks run: taken
  -- afresh, the timer never fires before `ms` have passed from now
  uv.update_time()
  timer:start(ms, 0, function()
    if over then return end
    over = true
    handle.fired = true
    timer:close()
    fn()
  end)
  if unref then timer:unref() end
  function handle.cancel(wait)
    if over then return false end
    over = true
    timer:stop()
    if wait and M.in_task() then
      M.await(function(closed) timer:close(function() closed() end) end)
    else
      timer:close()
    end
    return true
  end
  return handle
end

local function report(task)
  core.report('a task failed: ' .. task.traceback)
end

local function finish(task, ok, ...)
  task.done = true
  task.ok = ok
  if ok then
    task.results = pack(...)
  else
    local err = ...
    task.error = err
    local msg = type(err) == 'string' and err or tostring(err)
    task.traceback = debug.traceback(task.co, msg)
  end
  tasks[task.co] = nil
  local joiners = task.joiners
  task.joiners = nil
  if not ok and not task.main and not task.observed then
    -- nobody waits yet: report it unless someone joins before the next turn of the loop
    after(0, function()
      if not task.observed then report(task) end
    end)
  end
  if joiners then
    for _, resume in ipairs(joiners) do resume() end
  end
end

local function step(task, ...)
  local co = task.co
  local res = pack(coroutine.resume(co, ...))
  if coroutine.status(co) == 'dead' then
    finish(task, unpack(res, 1, res.n))
  end
end

-- Resumptions put off to the next step: when a host steps the loop with a budget (core.step,
-- mayura_step) and the budget is spent, a task whose wait ended is resumed at a later step instead
-- of now, so completions that arrive together (four sandboxes' files, say) are spread over frames
-- rather than all run in one. An idle handle runs the queue, in order; each step resumes at least
-- one task, so every step makes progress. The handle is closed as soon as the queue is empty (a
-- luv handle still open when the Lua state closes crashes luv 1.44; a close finishes within the
-- loop's pass that began it).
local later, later_head, later_tail, idler, ran_in = {}, 1, 0, nil, nil

local function run_later()
  while later[later_head] ~= nil do
    local over, this_step, stepping = core.over_budget()
    -- put off to a later step (fresh_step); when the host no longer steps, whoever runs the loop runs it
    local not_before = later[later_head].not_before
    if (over and ran_in == this_step) or (not_before and stepping and this_step < not_before) then
      -- this step is done: with the queue's idle handle open, it would go on passing over it until
      -- its budget is spent, doing nothing
      core.end_step()
      return
    end
    ran_in = this_step
    local item = later[later_head]
    later[later_head] = nil
    later_head = later_head + 1
    step(item.task, unpack(item.args, 1, item.args.n))
  end
  later, later_head, later_tail = {}, 1, 0
  if idler then
    idler:close()
    idler = nil
  end
end

-- Puts a resumption at the end of the queue (not before step `not_before`, when given).
local function put_off(task, args, not_before)
  later_tail = later_tail + 1
  later[later_tail] = { task = task, args = args, not_before = not_before }
  if not idler then
    idler = require('luv').new_idle()
    idler:start(run_later)
  end
end

local function resume(task, ...)
  local over, this_step = core.over_budget()
  if later[later_head] == nil and not (over and ran_in == this_step) then
    ran_in = this_step
    return step(task, ...)
  end
  put_off(task, pack(...))
end

--- In a task, while a host steps the loop with a budget: when more than `share` (in (0, 1]) of
-- this step's budget is spent, waits for the next step, where tasks put off run first, before
-- going on. Work that cannot be cut (making a string of many MiB) calls it first, so that it
-- begins a step instead of pushing the end of one past its budget. Anywhere else it returns at
-- once.
function M.fresh_step(share)
  local co = coroutine.running()
  local task = co and tasks[co]
  if not task then return end
  local over, this_step = core.over_budget(share)
  if not over then return end
  put_off(task, pack(), this_step + 1)
  coroutine.yield()
end

--- Whether the running coroutine is a task.
function M.in_task()
  local co = coroutine.running()
  return co ~= nil and tasks[co] ~= nil
end

--- Waits for asynchronous work. `start(done)` begins it and arranges for
-- `done(...)` to be called once; `await` returns what `done` was given.
function M.await(start)
  local co = coroutine.running()
  local task = co and tasks[co]
  if task then
    local fired, early, waiting = false, nil, false
    start(function(...)
      if fired then return end
      fired = true
      if waiting then resume(task, ...) else early = pack(...) end
    end)
    if fired then return unpack(early, 1, early.n) end
    waiting = true
    return coroutine.yield()
  end
  if core.loop_running() then
    local driver = core.driver()
    if driver ~= 'mayura' then
      errors.raise('INVALID_INPUT', 'the host runs the loop (driver \'' .. driver
        .. '\'): a waiting call must run inside a task (mayura.run), which never blocks the host', nil, 2)
    end
    errors.raise('INVALID_INPUT',
      'a waiting call made from a loop callback must run inside a task (mayura.run)', nil, 2)
  end
  local done, res = false, nil
  start(function(...)
    if done then return end
    done = true
    res = pack(...)
  end)
  while not done do
    if not core.run_once() and not done then
      errors.raise('INTERNAL', 'waiting for work that nothing on the loop will finish', nil, 2)
    end
  end
  return unpack(res, 1, res.n)
end

--- Starts `fn(...)` as a task and returns it. Its first steps run at once,
-- up to its first wait.
function M.spawn(fn, ...)
  if type(fn) ~= 'function' then
    errors.raise('INVALID_INPUT', 'run expects a function', nil, 2)
  end
  local task = setmetatable({ co = coroutine.create(fn), done = false }, Task)
  tasks[task.co] = task
  step(task, ...)
  return task
end

--- Waits for the task to end; returns its results or raises its error.
function Task:wait()
  self.observed = true
  if not self.done then
    M.await(function(done)
      if self.done then return done() end
      self.joiners = self.joiners or {}
      table.insert(self.joiners, done)
    end)
  end
  if self.ok then return unpack(self.results, 1, self.results.n) end
  error(self.error, 0)
end

--- Runs `fn(...)` as a task. From plain top-level code it runs the loop
-- until the task ends and returns its results (raising its error); from a
-- task or a loop callback it returns the running task, whose `:wait()`
-- joins it.
function M.run(fn, ...)
  local task = M.spawn(fn, ...)
  if M.in_task() or core.loop_running() then return task end
  return task:wait()
end

--- The host program's entry: runs the script's chunk as the main task to
-- its end; an error is raised as its traceback.
function M.main(chunk, ...)
  local task = setmetatable({ co = coroutine.create(chunk), done = false, main = true }, Task)
  tasks[task.co] = task
  step(task, ...)
  while not task.done do
    if not core.run_once() and not task.done then
      error('the script waits for work that nothing on the loop will finish', 0)
    end
  end
  if not task.ok then error(task.traceback, 0) end
end

--- Calls `fn()` once after `ms` milliseconds on the loop; returns a handle whose `cancel(wait)`
-- stops it (see `after` above). `unref`: the timer alone does not keep the loop running.
M.after = after

--- Waits `ms` milliseconds without blocking the loop. With a cancel token `signal`, ends early
-- when it is cancelled and raises CANCELLED (with `message`).
function M.sleep(ms, signal, message)
  if signal and signal.cancelled then errors.raise('CANCELLED', message or 'cancelled', nil, 2) end
  local remove
  local timer
  M.await(function(done)
    timer = after(ms, function()
      if remove then remove() end
      done()
    end)
    if signal then
      remove = signal:on_cancel(function()
        timer.cancel()
        done()
      end)
    end
  end)
  if signal and signal.cancelled and not timer.fired then
    errors.raise('CANCELLED', message or 'cancelled', nil, 2)
  end
end

--- Runs `fn()` as a task of its own and waits for it at most `ms` milliseconds. Returns what fn
-- returns, or raises what it raised; past `ms` raises `err` (an error, or a function that makes
-- one) while fn goes on, and `on_late(ok, ...)` is told fn's result when it comes.
function M.with_timeout(ms, fn, err, on_late)
  local res = pack(M.await(function(done)
    local finished = false
    local timer = after(ms, function()
      if finished then return end
      finished = true
      done(false, type(err) == 'function' and err() or err)
    end)
    M.spawn(function()
      local r = pack(pcall(fn))
      if finished then
        if on_late then on_late(unpack(r, 1, r.n)) end
        return
      end
      finished = true
      timer.cancel()
      done(unpack(r, 1, r.n))
    end)
  end))
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- A token's methods are shared by every token of the process (a policy's hooks and tools get tokens
-- too), so they cannot be reached or changed through a token: its metatable is hidden, and the
-- methods have no `__index` a token could name.
local Token = {}
local TOKEN_TAG = setmetatable({}, { __newindex = function() error('read-only', 2) end, __metatable = false })
local token_mt = { __index = Token, __metatable = TOKEN_TAG }

--- A cancel token: `token:cancel()`, `token.cancelled`, `token:on_cancel(fn)`.
function M.cancel_token()
  return setmetatable({ cancelled = false, handlers = {} }, token_mt)
end

--- Cancels: sets `cancelled` and calls every handler once. Again does nothing.
function Token:cancel(reason)
  if self.cancelled then return end
  self.cancelled = true
  self.reason = reason
  local handlers = self.handlers
  self.handlers = {}
  for _, fn in pairs(handlers) do
    local ok, err = pcall(fn, reason)
    if not ok then core.report('a cancel handler failed: ' .. tostring(err)) end
  end
end

--- Calls `fn` when cancelled (at once when already cancelled); returns a function that removes it.
function Token:on_cancel(fn)
  if self.cancelled then
    fn(self.reason)
    return function() end
  end
  local key = {}
  self.handlers[key] = fn
  return function() self.handlers[key] = nil end
end

--- Whether `v` is a cancel token.
function M.is_token(v)
  return getmetatable(v) == TOKEN_TAG
end

return M
