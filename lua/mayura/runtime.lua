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
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local z = require('mayura.z')

local M = {}

local STAGES = {
  on_start = true, before_model_call = true, after_model_call = true,
  before_tool_call = true, after_tool_call = true, on_finally = true,
}
local GRACE_MS = 1000
local DEFAULT_DURATION_MS = 60000
local DEFAULT_HOOK_TIMEOUT_MS = 30000
local DAY_MS = 86400000

-- Codes that end a run when a tool or a model raises them, with the status they give.
local ENDING = {
  PERMISSION_DENIED = 'blocked',
  BUDGET_EXCEEDED = 'failed',
  LIMIT_EXCEEDED = 'failed',
  CANCELLED = 'cancelled',
}

local function pack(...)
  return { n = select('#', ...), ... }
end

local function cfg(message, level)
  errors.raise('INVALID_CONFIG', message, nil, (level or 2) + 1)
end

local function list_of(v, what, level)
  if v == nil then return {} end
  if type(v) ~= 'table' then cfg(what .. ' must be a list', level + 1) end
  local n, out = #v, {}
  for k in pairs(v) do
    if not check.is_int(k) or k < 1 or k > n then cfg(what .. ' must be a list', level + 1) end
  end
  for i = 1, n do out[i] = v[i] end
  return out
end

local function non_empty_string(v, what, level)
  if type(v) ~= 'string' or v == '' or #v > 256 then cfg(what .. ' must be a non-empty string', level + 1) end
  return v
end

-- {======================================================
-- Hooks
-- =======================================================

local Hook = {}
Hook.__index = Hook

local hook_keys = { id = true, version = true, stage = true, timeout_ms = true, handler = true, description = true }

--- A lifecycle hook: `{ id, version, stage, timeout_ms (30000), handler = function(event, context) }`.
function M.define_hook(def)
  if type(def) ~= 'table' then cfg('define_hook expects a table') end
  check.keys(def, hook_keys, 'define_hook', 'INVALID_CONFIG', 3)
  non_empty_string(def.id, 'hook id', 2)
  if def.version ~= nil then non_empty_string(def.version, 'hook version', 2) end
  if not STAGES[def.stage] then
    cfg('hook stage must be one of on_start, before_model_call, after_model_call, before_tool_call, '
      .. 'after_tool_call, on_finally')
  end
  if type(def.handler) ~= 'function' then cfg('hook handler must be a function') end
  return setmetatable({
    id = def.id,
    version = def.version,
    stage = def.stage,
    description = def.description,
    timeout_ms = check.int(def.timeout_ms, 'timeout_ms', 1, DAY_MS, 'INVALID_CONFIG', 3, DEFAULT_HOOK_TIMEOUT_MS),
    handler = def.handler,
  }, Hook)
end

-- }======================================================

-- {======================================================
-- Agents
-- =======================================================

local Agent = {}
Agent.__index = Agent

local agent_keys = {
  id = true, version = true, instructions = true, input = true, output = true, tools = true,
  model = true, hooks = true, description = true,
}
local tool_keys = {
  id = true, description = true, input = true, capabilities = true, effect = true, run = true,
  exec_cost_micros = true,
}

local function check_tool(t, i)
  local what = 'tools[' .. i .. ']'
  if type(t) ~= 'table' then cfg(what .. ' must be a tool table', 4) end
  check.keys(t, tool_keys, what, 'INVALID_CONFIG', 5)
  if type(t.id) ~= 'string' or not t.id:match('^[%w_%-%.:]+$') or #t.id > 128 then
    cfg(what .. '.id must be a name of letters, digits, _ - . :', 4)
  end
  if t.description ~= nil and type(t.description) ~= 'string' then cfg(what .. '.description must be a string', 4) end
  if t.input ~= nil and not z.is_schema(t.input) then cfg(what .. '.input must be a schema from mayura.z', 4) end
  if t.effect ~= 'read' and t.effect ~= 'write' then cfg(what .. ".effect must be 'read' or 'write'", 4) end
  if type(t.run) ~= 'function' then cfg(what .. '.run must be a function', 4) end
  local caps = list_of(t.capabilities, what .. '.capabilities', 4)
  for j, c in ipairs(caps) do non_empty_string(c, what .. '.capabilities[' .. j .. ']', 4) end
  return {
    id = t.id,
    description = t.description or '',
    input = t.input or z.object({}),
    capabilities = caps,
    effect = t.effect,
    run = t.run,
    exec_cost_micros = check.int(t.exec_cost_micros, what .. '.exec_cost_micros', 0, nil, 'INVALID_CONFIG', 5, 0),
  }
end

local function check_model(m)
  if type(m) == 'function' then
    return { id = 'function', max_cost_micros = 0, call = function(_, request) return m(request) end }
  end
  if type(m) ~= 'table' or type(m.call) ~= 'function' then
    cfg('model must be a model (a table with id and call) or a function', 4)
  end
  non_empty_string(m.id, 'model.id', 4)
  check.int(m.max_cost_micros or 0, 'model.max_cost_micros', 0, nil, 'INVALID_CONFIG', 5)
  return m
end

--- An agent: `{ id, version, instructions, input, output, tools, model, hooks }`.
-- `instructions` is a string or a list of lines; `input` and `output` are
-- schemas from mayura.z (anything goes when left out).
function M.define_agent(def)
  if type(def) ~= 'table' then cfg('define_agent expects a table') end
  check.keys(def, agent_keys, 'define_agent', 'INVALID_CONFIG', 3)
  non_empty_string(def.id, 'agent id', 2)
  if def.version ~= nil then non_empty_string(def.version, 'agent version', 2) end
  local instructions = def.instructions
  if type(instructions) == 'table' then
    local lines = list_of(instructions, 'instructions', 2)
    for i, line in ipairs(lines) do
      if type(line) ~= 'string' then cfg('instructions[' .. i .. '] must be a string') end
    end
    instructions = table.concat(lines, '\n')
  elseif instructions == nil then
    instructions = ''
  elseif type(instructions) ~= 'string' then
    cfg('instructions must be a string or a list of strings')
  end
  if def.input ~= nil and not z.is_schema(def.input) then cfg('input must be a schema from mayura.z') end
  if def.output ~= nil and not z.is_schema(def.output) then cfg('output must be a schema from mayura.z') end
  if def.model == nil then cfg('model is required') end
  local model = check_model(def.model)
  local tools, by_id, defs = {}, {}, {}
  for i, t in ipairs(list_of(def.tools, 'tools', 2)) do
    local tool = check_tool(t, i)
    if by_id[tool.id] then cfg('two tools have the id ' .. tool.id) end
    tools[i], by_id[tool.id] = tool, tool
    defs[i] = { id = tool.id, description = tool.description, input_schema = tool.input:json_schema() }
  end
  local hooks = {}
  for i, h in ipairs(list_of(def.hooks, 'hooks', 2)) do
    if getmetatable(h) ~= Hook then cfg('hooks[' .. i .. '] must be made by define_hook') end
    hooks[h.stage] = hooks[h.stage] or {}
    table.insert(hooks[h.stage], h)
  end
  local output = def.output or z.any()
  return setmetatable({
    id = def.id,
    version = def.version,
    description = def.description,
    instructions = instructions,
    input = def.input or z.any(),
    output = output,
    tools = tools,
    model = model,
    _tool_by_id = by_id,
    _tool_defs = setmetatable(defs, core.json.array_mt),
    _output_schema = output:json_schema(),
    _hooks = hooks,
  }, Agent)
end

-- }======================================================

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

-- {======================================================
-- A run
-- =======================================================

local Run = {}
Run.__index = Run

local run_counter = 0

-- Raised inside a run to end it: `{ status, error }`.
local End = {}
End.__index = End

local function end_run(status, code, message, fields)
  error(setmetatable({ status = status, error = errors.new(code, message, fields) }, End), 0)
end

local function emit(run, event)
  if run._ended then return end
  event.run_id = run.id
  event.at_ms = core.hrtime_ms() - run._started_at
  local events = run._events
  events[#events + 1] = event
  if run._on_event then
    local ok, err = pcall(run._on_event, event)
    if not ok and not run._on_event_failed then
      run._on_event_failed = true
      core.report('on_event failed (further failures of this run are not shown): ' .. tostring(err))
    end
  end
  local waiters = run._waiters
  if #waiters > 0 then
    run._waiters = {}
    for _, w in ipairs(waiters) do w() end
  end
end

-- The run was stopped from outside (cancel, duration): end it as that.
local function check_stop(run)
  local stop = run._stop
  if stop then end_run(stop.status, stop.code, stop.message) end
end

local function check_time(run)
  check_stop(run)
  local max = run._limits.max_duration_ms
  if core.hrtime_ms() - run._started_at >= max then
    emit(run, { type = 'limit_reached', limit = 'max_duration_ms', value = max })
    end_run('failed', 'LIMIT_EXCEEDED', 'the run passed max_duration_ms (' .. max .. ')')
  end
end

local function count_limit(run, name, used, what)
  local max = run._limits[name]
  if max ~= nil and used >= max then
    emit(run, { type = 'limit_reached', limit = name, value = max })
    end_run('failed', 'LIMIT_EXCEEDED', name .. ' (' .. max .. ') reached: ' .. what .. ' was not made')
  end
end

local function reserve(run, amount, what)
  local max = run._limits.max_cost_micros
  local usage = run.usage
  if max ~= nil and usage.cost_micros + run._reserved + amount > max then
    emit(run, { type = 'limit_reached', limit = 'max_cost_micros', value = max })
    end_run('failed', 'BUDGET_EXCEEDED', what .. ' would reserve ' .. amount .. ' micros, with '
      .. usage.cost_micros .. ' of max_cost_micros (' .. max .. ') spent: it was not made')
  end
  run._reserved = run._reserved + amount
end

local function settle(run, reserved, cost)
  run._reserved = run._reserved - reserved
  run.usage.cost_micros = run.usage.cost_micros + cost
end

-- Runs `fn(...)` as a task of its own, for at most `ms`, with a cancel token
-- (cancelled at the timeout, or when `outer` is) put in `context.signal` by
-- the caller. Returns pcall's results, or false and a HOOK_FAILED error.
local function bounded(ms, outer, token, fn, ...)
  local args = pack(...)
  local timer
  local res = pack(task.await(function(done)
    local finished, unlink = false, nil
    local function finish(...)
      if finished then return end
      finished = true
      if unlink then unlink() end
      done(...)
    end
    timer = task.after(ms, function()
      token:cancel('timeout')
      finish(false, errors.new('HOOK_FAILED', 'did not finish within its timeout_ms (' .. ms .. ')'))
    end)
    if outer then unlink = outer:on_cancel(function() token:cancel('cancelled') end) end
    task.spawn(function()
      local r = pack(pcall(fn, check.unpack(args, 1, args.n)))
      finish(check.unpack(r, 1, r.n))
    end)
  end))
  -- answer once the timer is closed, so that a run never leaves a close pending
  timer.cancel(true)
  return check.unpack(res, 1, res.n)
end

local function error_fields(err)
  local e = errors.wrap(err)
  if type(err) ~= 'table' then e = errors.new('HOOK_FAILED', tostring(err)) end
  return e
end

-- Runs the hooks of `stage`. Returns nothing; ends the run when a hook
-- refuses or fails (except on_finally, whose failures are only recorded).
local function run_hooks(run, stage, event)
  local hooks = run._agent._hooks[stage]
  if not hooks then return end
  for _, hook in ipairs(hooks) do
    local token = task.cancel_token()
    local context = { run_id = run.id, agent_id = run.agent_id, stage = stage, signal = token }
    event.stage = stage
    event.run_id = run.id
    local outer = stage ~= 'on_finally' and run._token or nil
    local ok, res = bounded(hook.timeout_ms, outer, token, hook.handler, event, context)
    emit(run, { type = 'hook_ran', hook_id = hook.id, stage = stage, ok = ok })
    if not ok then
      local err = error_fields(res)
      table.insert(run._hook_errors, { hook_id = hook.id, stage = stage, code = err.code, message = err.message })
      -- on_finally: recorded, and the outcome stands
      if stage == 'before_tool_call' or stage == 'before_model_call' then
        check_stop(run)
        end_run('blocked', 'PERMISSION_DENIED', 'hook ' .. hook.id .. ' failed, so the call was refused: '
          .. tostring(err.message))
      elseif stage ~= 'on_finally' then
        check_stop(run)
        end_run('failed', 'HOOK_FAILED', 'hook ' .. hook.id .. ' (' .. stage .. ') failed: ' .. tostring(err.message))
      end
    elseif (stage == 'before_tool_call' or stage == 'before_model_call') and type(res) == 'table'
      and res.deny ~= nil and res.deny ~= false then
      end_run('blocked', 'PERMISSION_DENIED', 'hook ' .. hook.id .. ' denied the call: ' .. tostring(res.deny))
    end
  end
end

-- A short text that says what a tool gave back.
local function summarize(result)
  if type(result) ~= 'table' then return tostring(result) end
  local e = result.error
  if type(e) == 'table' then return 'error ' .. tostring(e.code) .. ': ' .. tostring(e.message):sub(1, 200) end
  if result.timed_out == true then return 'timed out' end
  if result.exit_code ~= nil then return 'exit ' .. tostring(result.exit_code) end
  local keys = {}
  for k in pairs(result) do
    if type(k) == 'string' then keys[#keys + 1] = k end
    if #keys >= 8 then break end
  end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = result[k]
    local tv = type(v)
    if tv == 'string' then
      parts[#parts + 1] = k .. '=' .. (#v > 40 and (#v .. ' bytes') or string.format('%q', v))
    elseif tv == 'number' or tv == 'boolean' then
      parts[#parts + 1] = k .. '=' .. tostring(v)
    else
      parts[#parts + 1] = k
    end
  end
  return table.concat(parts, ' ')
end

local function error_result(err)
  local e = { code = err.code, message = tostring(err.message) }
  if err.reason ~= nil then e.reason = err.reason end
  return { error = e }
end

local function check_step(step, counter)
  if type(step) ~= 'table' then return nil, 'the model gave ' .. type(step) .. ', not a step' end
  local usage = step.usage
  local cost = 0
  if usage ~= nil then
    if type(usage) ~= 'table' then return nil, 'the step usage must be a table' end
    if usage.cost_micros ~= nil then
      if not check.is_int(usage.cost_micros) or usage.cost_micros < 0 then
        return nil, 'usage.cost_micros must be a whole number at least 0'
      end
      cost = usage.cost_micros
    end
  end
  if step.type == 'final' then return step, nil, cost end
  if step.type ~= 'tool_calls' then
    return nil, "the step type must be 'tool_calls' or 'final', not " .. tostring(step.type), cost
  end
  local calls = step.calls
  if type(calls) ~= 'table' or #calls == 0 then
    return nil, 'a tool_calls step needs a non-empty list of calls', cost
  end
  local out = {}
  for i, c in ipairs(calls) do
    if type(c) ~= 'table' or type(c.tool_id) ~= 'string' then
      return nil, 'calls[' .. i .. '] needs a tool_id', cost
    end
    if c.id ~= nil and type(c.id) ~= 'string' then return nil, 'calls[' .. i .. '].id must be a string', cost end
    out[i] = { id = c.id or ('call_' .. (counter + i)), tool_id = c.tool_id, input = c.input }
  end
  return { type = 'tool_calls', calls = out, text = step.text, extra = step.extra, usage = usage }, nil, cost
end

-- One model call: checks, reservation, the call, settlement. Returns the step.
local function model_step(run)
  local agent, usage = run._agent, run.usage
  local model = agent.model
  local grant = 'model:' .. model.id
  if not run._allow[grant] then
    end_run('blocked', 'PERMISSION_DENIED', 'calling model ' .. model.id .. ' needs the grant ' .. grant)
  end
  count_limit(run, 'max_steps', usage.steps, 'the next model call')
  count_limit(run, 'max_model_calls', usage.model_calls, 'the next model call')
  local reservation = model.max_cost_micros or 0
  reserve(run, reservation, 'the model call')
  run_hooks(run, 'before_model_call', { model_id = model.id, messages = run._messages })
  check_stop(run)
  usage.model_calls = usage.model_calls + 1
  emit(run, { type = 'model_call_started', model_id = model.id, call = usage.model_calls })
  local request = {
    run_id = run.id,
    instructions = agent.instructions,
    messages = run._messages,
    tools = agent._tool_defs,
    output_schema = agent._output_schema,
    signal = run._token,
  }
  local ok, res = pcall(model.call, model, request)
  check_stop(run)
  if not ok then
    settle(run, reservation, 0)
    emit(run, { type = 'model_call_ended', model_id = model.id, ok = false, cost_micros = 0,
      total_cost_micros = usage.cost_micros })
    if getmetatable(res) == End then error(res, 0) end
    local err = errors.wrap(res)
    local status = ENDING[err.code]
    if status then end_run(status, err.code, err.message) end
    local message = err.code == 'MODEL_ERROR' and err.message
      or (type(res) == 'table' and (err.code .. ': ' .. tostring(err.message)) or tostring(res))
    end_run('failed', 'MODEL_ERROR', message, { reason = err.reason })
  end
  local step, problem, cost = check_step(res, run._call_counter)
  settle(run, reservation, cost or 0)
  usage.steps = usage.steps + 1
  emit(run, { type = 'model_call_ended', model_id = model.id, ok = step ~= nil, cost_micros = cost or 0,
    total_cost_micros = usage.cost_micros, step_type = step and step.type or nil })
  local max = run._limits.max_cost_micros
  if max ~= nil and (cost or 0) > reservation then
    -- the reservation is what keeps the run within its budget: a call that spent past it has
    -- broken that, so the run ends here, its true spend counted, before any further call
    emit(run, { type = 'limit_reached', limit = 'max_cost_micros', value = max })
    end_run('failed', 'BUDGET_EXCEEDED', 'the model call cost ' .. cost .. ' micros, more than the ' .. reservation
      .. ' it reserved; ' .. usage.cost_micros .. ' of max_cost_micros (' .. max .. ') spent: no further call')
  end
  if not step then end_run('failed', 'MODEL_ERROR', problem) end
  if step.calls then run._call_counter = run._call_counter + #step.calls end
  run_hooks(run, 'after_model_call', { model_id = model.id, step = step })
  return step
end

local function missing_grants(run, tool)
  local allow, missing = run._allow, {}
  local g = 'tool:' .. tool.id
  if not allow[g] then missing[#missing + 1] = g end
  for _, c in ipairs(tool.capabilities) do
    if not allow[c] then missing[#missing + 1] = c end
  end
  g = 'effect:' .. tool.effect
  if not allow[g] then missing[#missing + 1] = g end
  return missing
end

-- One tool call: grants, limit, input, reservation, hooks, the call. Returns the result handed back
-- (the tool's own table, or `{ error = { code, message } }`) and, when the call failed without ending
-- the run, the coded error itself (the tool's own error object, marked `tool_error = true`).
local function tool_call(run, call)
  local agent, usage = run._agent, run.usage
  local tool = agent._tool_by_id[call.tool_id]
  if tool then
    local missing = missing_grants(run, tool)
    if #missing > 0 then
      end_run('blocked', 'PERMISSION_DENIED', 'calling ' .. tool.id .. ' needs the grant'
        .. (#missing > 1 and 's ' or ' ') .. table.concat(missing, ', '))
    end
  end
  count_limit(run, 'max_tool_calls', usage.tool_calls, 'the call to ' .. call.tool_id)
  usage.tool_calls = usage.tool_calls + 1
  local input = call.input
  local refused
  if not tool then
    local ids = {}
    for i, t in ipairs(agent.tools) do ids[i] = t.id end
    refused = errors.new('INVALID_INPUT', 'there is no tool ' .. call.tool_id
      .. (#ids > 0 and ('; the tools are ' .. table.concat(ids, ', ')) or ''))
  elseif call.input_error ~= nil or (type(input) == 'table' and type(input._invalid_json) == 'string') then
    -- the model's arguments could not be read (a model adapter marks them): give that back, run nothing
    refused = errors.new('INVALID_INPUT', type(call.input_error) == 'string'
      and call.input_error or 'the arguments were not valid JSON')
  else
    local ok, parsed, err = tool.input:safe_parse(input)
    if ok then input = parsed else refused = errors.wrap(err) end
  end
  if refused then
    refused.tool_error = true
    local result = error_result(refused)
    emit(run, { type = 'tool_call_started', tool_id = call.tool_id, call_id = call.id, input = input })
    emit(run, { type = 'tool_call_ended', tool_id = call.tool_id, call_id = call.id, ok = false,
      summary = summarize(result) })
    return result, refused
  end
  local cost = tool.exec_cost_micros
  reserve(run, cost, 'the call to ' .. tool.id)
  run_hooks(run, 'before_tool_call', { tool_id = tool.id, call_id = call.id, input = input })
  check_stop(run)
  emit(run, { type = 'tool_call_started', tool_id = tool.id, call_id = call.id, input = input })
  local context = { run_id = run.id, agent_id = run.agent_id, tool_id = tool.id, call_id = call.id,
    signal = call.signal or run._token }
  -- a tool's progress as it runs (a command's output as it comes): a `tool_output` event each,
  -- `{ stream, text }` taken from the update, until the call ends
  local call_over = false
  function context.progress(update)
    if call_over or type(update) ~= 'table' or type(update.text) ~= 'string' then return end
    local stream = type(update.stream) == 'string' and update.stream or nil
    emit(run, { type = 'tool_output', tool_id = tool.id, call_id = call.id, stream = stream, text = update.text })
    -- a session's caller (mayura serve) may follow its own call's progress
    if call.on_progress then pcall(call.on_progress, { stream = stream, text = update.text }) end
  end
  local ok, result = pcall(tool.run, input, context)
  call_over = true
  settle(run, cost, cost)
  local ending, failure
  if not ok then
    if getmetatable(result) == End then
      ending = result
      result = error_result(result.error)
    else
      local err = type(result) == 'table' and errors.wrap(result) or errors.new('TOOL_ERROR', tostring(result))
      if ENDING[err.code] and err.tool_error ~= true then ending = err else failure = err end
      result = error_result(err)
    end
  elseif type(result) ~= 'table' then
    result = result == nil and {} or { value = result }
  end
  local ended = { type = 'tool_call_ended', tool_id = tool.id, call_id = call.id, ok = ok,
    summary = summarize(result) }
  if type(result.exit_code) == 'number' then ended.exit_code = result.exit_code end
  if result.timed_out == true then ended.timed_out = true end
  emit(run, ended)
  check_stop(run)
  if ending then
    if getmetatable(ending) == End then error(ending, 0) end
    -- the run's outcome gets its own error; a session's caller gets the tool's (`raised`)
    error(setmetatable({ status = ENDING[ending.code], raised = ending,
      error = errors.new(ending.code, tostring(ending.message)) }, End), 0)
  end
  if failure then failure.tool_error = true end
  run_hooks(run, 'after_tool_call', { tool_id = tool.id, call_id = call.id, input = input, result = result })
  return result, failure
end

-- The run's work, up to its outcome (without on_finally).
local function work(run)
  local agent = run._agent
  local ok, input, err = agent.input:safe_parse(run._input)
  if not ok then end_run('failed', 'INVALID_INPUT', 'the input does not match the agent input: ' .. err.message,
    { issues = input }) end
  run._messages = { { role = 'user', content = input } }
  run_hooks(run, 'on_start', { input = input })
  while true do
    check_time(run)
    local step = model_step(run)
    if step.type == 'final' then
      local ok2, output, err2 = agent.output:safe_parse(step.output)
      if not ok2 then
        end_run('failed', 'INVALID_OUTPUT', 'the final answer does not match the agent output: ' .. err2.message,
          { issues = output })
      end
      return { status = 'succeeded', output = output }
    end
    local messages = run._messages
    messages[#messages + 1] = { role = 'assistant', calls = step.calls, text = step.text, extra = step.extra }
    for _, call in ipairs(step.calls) do
      check_time(run)
      local result = tool_call(run, call)
      messages[#messages + 1] = { role = 'tool', call_id = call.id, tool_id = call.tool_id, result = result }
    end
  end
end

local function outcome_of(run, ok, res)
  if run._stop then
    local s = run._stop
    return { status = s.status, error = errors.new(s.code, s.message) }
  end
  if ok then return res end
  if getmetatable(res) == End then return { status = res.status, error = res.error } end
  local err = errors.wrap(res)
  if err.code == 'CANCELLED' then return { status = 'cancelled', error = err } end
  return { status = 'failed', error = err }
end

-- The task of a run: the work (abandoned a grace period after a stop when it
-- does not end by itself), then the on_finally hooks, then run_ended.
local function drive(run)
  local uv = require('luv')
  run._started_at = core.hrtime_ms()
  emit(run, { type = 'run_started', agent_id = run.agent_id, agent_version = run._agent.version })
  local max = run._limits.max_duration_ms
  uv.update_time()   -- the loop's clock may be stale: the limit counts from now
  local limit_timer = task.after(max, function()
    if run._stop or run._finishing then return end
    run._stop = { status = 'failed', code = 'LIMIT_EXCEEDED',
      message = 'the run passed max_duration_ms (' .. max .. ')' }
    emit(run, { type = 'limit_reached', limit = 'max_duration_ms', value = max })
    run._token:cancel('limit')
  end)
  local unlink, grace
  local kind, ok, res = task.await(function(done)
    unlink = run._token:on_cancel(function()
      grace = task.after(GRACE_MS, function() done('abandoned') end)
    end)
    task.spawn(function()
      local r = pack(pcall(work, run))
      done('work', r[1], r[2])
    end)
  end)
  run._finishing = true
  if unlink then unlink() end
  -- wait for the timers to close: a handle whose close is still pending when
  -- Lua closes its state crashes luv 1.44, so a run leaves none behind
  limit_timer.cancel(true)
  if grace then grace.cancel(true) end
  local outcome
  local built, err = pcall(function()
    outcome = outcome_of(run, kind == 'work' and ok, res)
  end)
  if not built then outcome = { status = 'failed', error = errors.new('INTERNAL', tostring(err)) } end
  outcome.run_id = run.id
  outcome.agent_id = run.agent_id
  outcome.usage = run.usage
  outcome.hook_errors = run._hook_errors
  pcall(run_hooks, run, 'on_finally', { outcome = outcome })
  outcome.duration_ms = math.floor(core.hrtime_ms() - run._started_at)
  run.status = outcome.status
  run._outcome = outcome
  emit(run, { type = 'run_ended', status = outcome.status,
    code = outcome.error and outcome.error.code or nil })
  run._ended = true
  if run._unlink_signal then run._unlink_signal() end
  run._runtime._runs[run] = nil
  return outcome
end

-- A new run of `agent` on `runtime`, running, its usage at zero: the one of a submit and the one
-- behind a session. Its id is `id`, or `prefix`_<count>_<clock> (the count goes up either way);
-- its events go to `on_event`.
local function new_run(runtime, agent, prefix, id, on_event)
  run_counter = run_counter + 1
  return setmetatable({
    id = id or string.format('%s_%d_%x', prefix, run_counter, math.floor(core.now_ms()) % 0x1000000),
    agent_id = agent.id,
    status = 'running',
    usage = { steps = 0, model_calls = 0, tool_calls = 0, cost_micros = 0 },
    _runtime = runtime,
    _agent = agent,
    _on_event = on_event,
    _limits = runtime.limits,
    _allow = runtime._allow,
    _events = {},
    _waiters = {},
    _hook_errors = {},
    _token = task.cancel_token(),
    _reserved = 0,
    _call_counter = 0,
    _started_at = core.hrtime_ms(),
  }, Run)
end

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

-- {======================================================
-- Sessions: tool calls made by a caller instead of a model
-- =======================================================

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
function Runtime:session(agent, options)
  if getmetatable(self) ~= Runtime then
    errors.raise('INVALID_INPUT', 'call session with a colon: runtime:session(...)')
  end
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

--- Waits for the run to end and returns its outcome (never raises).
function Run:result()
  if self._outcome then return self._outcome end
  return self._task:wait()
end

--- Cancels the run: a running command or model call is stopped through its
-- cancel token and the outcome is `cancelled`. Once the run is ending, does nothing.
function Run:cancel()
  if self._finishing or self._stop then return end
  self._stop = { status = 'cancelled', code = 'CANCELLED', message = 'the run was cancelled' }
  self._token:cancel('cancelled')
end

--- An iterator over the run's events: those so far, then each as it comes
-- (waiting for it), until `run_ended`.
function Run:events()
  local i = 0
  return function()
    while true do
      local events = self._events
      if i < #events then
        i = i + 1
        return events[i]
      end
      if self._ended then return nil end
      task.await(function(done) table.insert(self._waiters, done) end)
    end
  end
end

M.Agent = Agent
M.Hook = Hook
M.Runtime = Runtime
M.Run = Run
M.Session = Session

return M
