--- mayura._run: a run of an agent (mayura.runtime's `submit`, and the run behind a session):
-- its steps (a model call, then its tool calls), each checked in order against the grants, the
-- limits, the tool's input, the budget and the `before_*` hooks; its events; its outcome. The
-- rules it keeps are said in mayura.runtime's doc comment.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')

local M = {}

local GRACE_MS = 1000

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


M.Run, M.End, M.GRACE_MS = Run, End, GRACE_MS
M.new_run, M.drive, M.emit, M.run_hooks = new_run, drive, emit, run_hooks
M.missing_grants, M.check_time, M.tool_call = missing_grants, check_time, tool_call

return M
