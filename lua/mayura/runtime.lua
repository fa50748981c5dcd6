--- mayura.runtime: agents, hooks and runs, held to permissions, limits and a budget.
--
--   local agent = mayura.define_agent{ id, version, instructions, input, output, tools, model, hooks }
--   local runtime = mayura.create_runtime{ permissions = { allow = { ... } }, limits = { ... } }
--   local run = runtime:submit(agent, { input = { ... }, on_event = function(event) end })
--   local outcome = run:result()
--   local session = runtime:session(agent, { id = 'client-1' })   -- tool calls made by a caller
--   local result = session:call('workspace.exec', { command = 'ls' }); session:close()
--
-- A run is a task on the shared loop. It checks the input against the
-- agent's input schema, then asks the model for a step at a time: a step
-- either calls tools (run in order, each result handed back to the model as a
-- `{ role = 'tool', call_id, tool_id, result }` message) or gives the final
-- answer, which must match the output schema. Before every model call and
-- every tool call the run checks, in this order: its grants (nothing is
-- allowed unless listed), its limits, the tool input, its budget (the call's
-- reservation), then the `before_*` hooks. The first check that refuses ends
-- the run, before the call is made.
--
-- Outcomes: `{ status = 'succeeded', output = ... }`, or `{ status = 'failed' |
-- 'blocked' | 'cancelled', error = { code, message } }`; every outcome also has
-- `run_id`, `usage = { steps, model_calls, tool_calls, cost_micros }`,
-- `duration_ms` and `hook_errors` (a list, empty when every hook ran well).
--
-- A tool's context has `progress(update)`: each call adds a `tool_output` event
-- (`tool_id`, `call_id`, `stream`, `text` from the update) between the call's
-- `tool_call_started` and `tool_call_ended`; the sandbox exec tool sends a
-- command's output through it as it comes. Later calls are ignored.
--
-- Choices made where the seeds are silent (see also docs):
--   * a hook of a stage before the end that raises or passes its timeout ends
--     the run failed with HOOK_FAILED; in `before_tool_call` and
--     `before_model_call`, returning `{ deny = reason }` or raising ends it
--     blocked with PERMISSION_DENIED; `on_finally` failures only go to
--     `outcome.hook_errors`;
--   * a tool call whose tool the agent does not have, or whose input does not
--     match the tool's schema, is handed back to the model as an error result;
--     it counts as a tool call;
--   * a tool that raises PERMISSION_DENIED, BUDGET_EXCEEDED, LIMIT_EXCEEDED or
--     CANCELLED ends the run; any other error is handed back to the model as
--     `result = { error = { code, message } }` (a plain string error has code
--     TOOL_ERROR). An error marked `tool_error = true` is handed back whatever
--     its code: the sandbox tools mark what the sandbox refused (a read-only
--     path, a full disk, a file too large), which is the model's to react to
--     and not the run's grants or limits;
--   * a tool's charge against the budget is its `exec_cost_micros`, reserved
--     before it runs and kept afterwards; a model call reserves the model's
--     `max_cost_micros` and is settled to the step's `usage.cost_micros`. In
--     a run with `max_cost_micros`, a model call that reports more than it
--     reserved ends the run failed with BUDGET_EXCEEDED, its true cost in
--     `usage`, before any further call (the adapters cap a request's output
--     tokens so that a call does not cost more than its ceiling); without
--     a budget the cost is only counted;
--   * a model or tool that ignores the cancel token is waited for at most one
--     second after a cancel or the duration limit; the run then ends without it;
--   * `max_steps` counts the model's answered steps, `max_model_calls` every
--     call made; with one step per call they differ only by a failed call.
--
-- This module is the front (the runtime, its submit and close); its pieces are private modules:
-- hooks and agents as definitions (mayura._define), a run (mayura._run), a session (mayura._session).
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local define = require('mayura._define')
local run_mod = require('mayura._run')
local session = require('mayura._session')

local M = {}

local DEFAULT_DURATION_MS = 60000
local DAY_MS = 86400000

local cfg, list_of, non_empty_string = define.cfg, define.list_of, define.non_empty_string
local Agent, new_run, drive = define.Agent, run_mod.new_run, run_mod.drive

-- Hooks and agents (mayura._define).
M.define_hook, M.define_agent = define.define_hook, define.define_agent

-- {======================================================
-- Runtime
-- =======================================================

local Runtime = {}
Runtime.__index = Runtime

local runtime_keys = { profile = true, permissions = true, limits = true }
local limit_keys = {
  max_steps = true, max_model_calls = true, max_tool_calls = true, max_duration_ms = true, max_cost_micros = true,
}

--- A runtime: `{ profile = 'ephemeral', permissions = { allow = { grant, ... } }, limits = { max_steps,
-- max_model_calls, max_tool_calls, max_duration_ms (60000), max_cost_micros } }`. A limit left out is
-- not enforced, except the duration.
function M.create_runtime(options)
  if options == nil then options = {} end
  if type(options) ~= 'table' then cfg('create_runtime expects a table') end
  check.keys(options, runtime_keys, 'create_runtime options', 'INVALID_CONFIG', 3)
  local profile = options.profile or 'ephemeral'
  if profile ~= 'ephemeral' then cfg("profile must be 'ephemeral' (the only profile so far)") end
  local allow = {}
  if options.permissions ~= nil then
    check.keys(options.permissions, { allow = true }, 'permissions', 'INVALID_CONFIG', 3)
    for i, g in ipairs(list_of(options.permissions.allow, 'permissions.allow', 2)) do
      allow[non_empty_string(g, 'permissions.allow[' .. i .. ']', 2)] = true
    end
  end
  local lim = options.limits or {}
  check.keys(lim, limit_keys, 'limits', 'INVALID_CONFIG', 3)
  local C = 'INVALID_CONFIG'
  local limits = {
    max_steps = lim.max_steps ~= nil and check.int(lim.max_steps, 'max_steps', 1, nil, C, 3) or nil,
    max_model_calls = lim.max_model_calls ~= nil and check.int(lim.max_model_calls, 'max_model_calls', 1, nil, C, 3)
      or nil,
    max_tool_calls = lim.max_tool_calls ~= nil and check.int(lim.max_tool_calls, 'max_tool_calls', 0, nil, C, 3)
      or nil,
    max_duration_ms = check.int(lim.max_duration_ms, 'max_duration_ms', 1, 366 * DAY_MS, C, 3, DEFAULT_DURATION_MS),
    max_cost_micros = lim.max_cost_micros ~= nil and check.int(lim.max_cost_micros, 'max_cost_micros', 0, nil, C, 3)
      or nil,
  }
  return setmetatable({ profile = profile, _allow = allow, limits = limits, _runs = {}, _closed = false }, Runtime)
end

-- }======================================================

local submit_keys = { input = true, on_event = true, signal = true }

--- Starts a run of `agent`: `{ input = ..., on_event = function(event) end, signal = token }`.
-- Returns the run at once (its first steps may already have happened).
function Runtime:submit(agent, options)
  if getmetatable(self) ~= Runtime then
    errors.raise('INVALID_INPUT', 'call submit with a colon: runtime:submit(...)')
  end
  if self._closed then errors.raise('INVALID_INPUT', 'the runtime is closed') end
  if getmetatable(agent) ~= Agent then errors.raise('INVALID_INPUT', 'submit expects an agent from define_agent') end
  if options == nil then options = {} end
  check.keys(options, submit_keys, 'submit options', 'INVALID_INPUT', 3)
  if options.on_event ~= nil and type(options.on_event) ~= 'function' then
    errors.raise('INVALID_INPUT', 'on_event must be a function')
  end
  if options.signal ~= nil and not task.is_token(options.signal) then
    errors.raise('INVALID_INPUT', 'signal must be a cancel token (mayura.cancel_token())')
  end
  local run = new_run(self, agent, 'run', nil, options.on_event)
  run._input = options.input
  self._runs[run] = true
  if options.signal then run._unlink_signal = options.signal:on_cancel(function() run:cancel() end) end
  run._task = task.spawn(drive, run)
  return run
end

--- Cancels every run still going, closes every session, waits for their on_finally hooks, and
-- refuses new runs and sessions.
function Runtime:close()
  self._closed = true
  local runs = {}
  for run in pairs(self._runs) do runs[#runs + 1] = run end
  for _, run in ipairs(runs) do run:cancel() end
  for _, run in ipairs(runs) do run:result() end
  local sessions = {}
  for s in pairs(self._sessions or {}) do sessions[#sessions + 1] = s end
  for _, s in ipairs(sessions) do s:close() end
end


--- A session of `agent` (mayura._session says what it is): tool calls made by a caller instead of a model.
function Runtime:session(agent, options)
  if getmetatable(self) ~= Runtime then
    errors.raise('INVALID_INPUT', 'call session with a colon: runtime:session(...)')
  end
  return session.open(self, agent, options)
end

M.Agent = Agent
M.Hook = define.Hook
M.Runtime = Runtime
M.Run = run_mod.Run
M.Session = session.Session

return M
