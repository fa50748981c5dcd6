--- mayura._session: a session (mayura.runtime's `runtime:session`), tool calls made by a caller
-- (`mayura serve`'s clients) instead of a model, each through the very checks of a run's tool
-- call (mayura._run).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local define = require('mayura._define')
local run_mod = require('mayura._run')

local M = {}

local Agent, End, GRACE_MS = define.Agent, run_mod.End, run_mod.GRACE_MS
local new_run, emit, run_hooks = run_mod.new_run, run_mod.emit, run_mod.run_hooks
local missing_grants, check_time, tool_call = run_mod.missing_grants, run_mod.check_time, run_mod.tool_call

local Session = {}
Session.__index = Session

local session_keys = { id = true, on_event = true }
local call_keys = { signal = true, call_id = true, progress = true }

--- A session of `agent`: `{ id, on_event }`. The caller (a tool host's client) makes the tool calls
-- a model would make, with `session:call(tool_id, input, { signal, call_id, progress })`; each goes through
-- the very checks of a run's tool call, in the same order: the grants, `max_tool_calls`, the input
-- schema, the budget (the tool's `exec_cost_micros`), the `before_tool_call` hooks, the tool, the
-- `after_tool_call` hooks. `max_duration_ms` counts from the session's start. `call` returns the
-- tool's result (the very table the tool gave back), or raises a coded error: what ends a run (a
-- missing grant: PERMISSION_DENIED; a limit: LIMIT_EXCEEDED; the budget: BUDGET_EXCEEDED; a cancel:
-- CANCELLED; a failed hook: HOOK_FAILED) as it is, and what a run hands back to its model (an
-- unknown tool or a bad input: INVALID_INPUT; the tool's own failure: the error the tool raised,
-- with all its fields) with `tool_error = true`. Neither ends the session. `progress(update)` gets
-- the call's `{ stream, text }` updates as they come (each also a `tool_output` event).
-- The on_start hooks run when the session is made (a failure raises), the on_finally hooks at
-- `session:close()`, with `{ outcome = { status = 'succeeded', run_id, agent_id, usage } }`;
-- `context.run_id` of tools and hooks is the session's id. `session.usage` is the run's usage.
-- `session.tools` lists the tools the session may call (every grant they need is given),
-- `session.declared` every tool of the agent, each `{ id, description, effect, input (the z schema),
-- input_schema (its JSON Schema) }`. `call` and `close` work with `.` or `:`.
function M.open(self, agent, options)
  if self._closed then errors.raise('INVALID_INPUT', 'the runtime is closed') end
  if getmetatable(agent) ~= Agent then errors.raise('INVALID_INPUT', 'session expects an agent from define_agent') end
  if options == nil then options = {} end
  check.keys(options, session_keys, 'session options', 'INVALID_INPUT', 3)
  if options.id ~= nil and (type(options.id) ~= 'string' or options.id == '' or #options.id > 256) then
    errors.raise('INVALID_INPUT', 'the session id must be a non-empty string')
  end
  if options.on_event ~= nil and type(options.on_event) ~= 'function' then
    errors.raise('INVALID_INPUT', 'on_event must be a function')
  end
  local run = new_run(self, agent, 'session', options.id, options.on_event)
  local tools, declared = {}, {}
  for i, t in ipairs(agent.tools) do
    local entry = { id = t.id, description = t.description, effect = t.effect, input = t.input,
      input_schema = agent._tool_defs[i].input_schema }
    declared[#declared + 1] = entry
    if #missing_grants(run, t) == 0 then tools[#tools + 1] = entry end
  end
  local session = setmetatable({ id = run.id, agent_id = agent.id, usage = run.usage, tools = tools,
    declared = declared, _run = run, _active = 0, _idle = {} }, Session)
  -- `session.call(...)` as well as `session:call(...)`: a tool id is never the session
  function session.call(a, ...)
    if a == session then return Session.call(session, ...) end
    return Session.call(session, a, ...)
  end
  function session.close() return Session.close(session) end
  emit(run, { type = 'run_started', agent_id = run.agent_id, agent_version = agent.version })
  local ok, err = pcall(run_hooks, run, 'on_start', { input = nil })
  if not ok then
    run._ended = true
    error(getmetatable(err) == End and err.error or errors.wrap(err), 2)
  end
  self._sessions = self._sessions or {}
  self._sessions[session] = true
  return session
end

--- Makes one tool call in the session (see Runtime:session).
function Session:call(tool_id, input, options)
  if getmetatable(self) ~= Session then errors.raise('INVALID_INPUT', 'call call with a colon: session:call(...)') end
  if type(tool_id) ~= 'string' then errors.raise('INVALID_INPUT', 'tool_id must be a string') end
  if options == nil then options = {} end
  check.keys(options, call_keys, 'call options', 'INVALID_INPUT', 3)
  if options.signal ~= nil and not task.is_token(options.signal) then
    errors.raise('INVALID_INPUT', 'signal must be a cancel token (mayura.cancel_token())')
  end
  if options.call_id ~= nil and type(options.call_id) ~= 'string' then
    errors.raise('INVALID_INPUT', 'call_id must be a string')
  end
  if options.progress ~= nil and type(options.progress) ~= 'function' then
    errors.raise('INVALID_INPUT', 'progress must be a function')
  end
  if self._closed then errors.raise('CANCELLED', 'the session is closed') end
  local run = self._run
  run._call_counter = run._call_counter + 1
  local token = task.cancel_token()
  local unlink_run = run._token:on_cancel(function() token:cancel('cancelled') end)
  local unlink_call = options.signal and options.signal:on_cancel(function() token:cancel('cancelled') end)
  local call = { id = options.call_id or ('call_' .. run._call_counter), tool_id = tool_id, input = input,
    signal = token, on_progress = options.progress }
  self._active = self._active + 1
  local ok, result, failure = pcall(function()
    check_time(run)
    return tool_call(run, call)
  end)
  self._active = self._active - 1
  run._events = {}   -- a session may be long: its events go to on_event only
  unlink_run()
  if unlink_call then unlink_call() end
  if self._active == 0 and #self._idle > 0 then
    local idle = self._idle
    self._idle = {}
    for _, w in ipairs(idle) do w() end
  end
  if not ok then
    if getmetatable(result) == End then error(result.raised or result.error, 2) end
    error(errors.wrap(result), 2)
  end
  if failure then error(failure, 2) end
  return result
end

--- Ends the session: cancels the calls still running (waiting at most a second for them), runs the
-- on_finally hooks and returns the outcome. Again returns the same outcome.
function Session:close()
  if self._outcome then return self._outcome end
  if self._closing then
    while not self._outcome do task.await(function(done) table.insert(self._idle, done) end) end
    return self._outcome
  end
  self._closing, self._closed = true, true
  local run = self._run
  run._stop = { status = 'cancelled', code = 'CANCELLED', message = 'the session was closed' }
  run._token:cancel('closed')
  if self._active > 0 then
    local timer
    task.await(function(done)
      local finished = false
      local function finish()
        if finished then return end
        finished = true
        done()
      end
      table.insert(self._idle, finish)
      timer = task.after(GRACE_MS, finish)
    end)
    timer.cancel(true)
  end
  run._finishing = true
  local outcome = { status = 'succeeded', run_id = run.id, agent_id = run.agent_id, usage = run.usage,
    hook_errors = run._hook_errors }
  pcall(run_hooks, run, 'on_finally', { outcome = outcome })
  outcome.duration_ms = math.floor(core.hrtime_ms() - run._started_at)
  emit(run, { type = 'run_ended', status = outcome.status })
  run._ended = true
  if run._runtime._sessions then run._runtime._sessions[self] = nil end
  self._outcome = outcome
  local idle = self._idle
  self._idle = {}
  for _, w in ipairs(idle) do w() end
  return outcome
end

M.Session = Session

return M
