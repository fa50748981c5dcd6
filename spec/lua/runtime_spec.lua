-- mayura.runtime: agents, runs, permissions, limits, budget, hooks and events,
-- with a scripted model and tools that run in this process.
local mayura = require('mayura')
local testing = require('mayura.testing')
local errors = require('mayura.errors')
local task = require('mayura._task')
local core = require('mayura.core')
local uv = require('luv')

local z = mayura.z

local util = require('support.util')

-- Waits `ms`, or until `token` is cancelled; raises CANCELLED then.
local function sleep_or_cancel(ms, token)
  task.await(function(done)
    local timer = uv.new_timer()
    local remove
    timer:start(ms, 0, function()
      timer:close()
      if remove then remove() end
      done()
    end)
    remove = token:on_cancel(function()
      if not timer:is_closing() then timer:stop(); timer:close() end
      done()
    end)
  end)
  if token.cancelled then errors.raise('CANCELLED', 'stopped') end
end

-- Waits until `flag.done`: work left behind (a hook or tool that ignored its
-- timeout) must end before the spec file does, since luv 1.44 can crash at
-- exit when a timer is still active.
local function drain(flag)
  while not flag.done do mayura.sleep(20) end
end

-- An in-process tool that counts its runs.
local function echo_tool(counter)
  return {
    id = 'echo',
    description = 'Gives back its text.',
    input = z.object({ text = z.string():max(20) }),
    capabilities = { 'echo:use' },
    effect = 'read',
    run = function(input)
      if counter then counter.n = (counter.n or 0) + 1 end
      return { text = input.text }
    end,
  }
end

local GRANTS = { 'model:scripted', 'tool:echo', 'echo:use', 'effect:read' }

local function final(summary, cost)
  return { type = 'final', output = { summary = summary or 'done' }, usage = { cost_micros = cost or 0 } }
end

local function call(tool_id, input, cost, id)
  return { type = 'tool_calls', usage = { cost_micros = cost or 0 },
    calls = { { id = id or 'c', tool_id = tool_id, input = input } } }
end

-- A model that calls echo forever.
local function endless(cost)
  local steps = {}
  for i = 1, 200 do steps[i] = call('echo', { text = 'x' }, cost, 'c' .. i) end
  return steps
end

local function agent(opts)
  return mayura.define_agent({
    id = 'tester', version = '1', instructions = 'Test.',
    input = z.object({ task = z.string() }),
    output = z.object({ summary = z.string():max(50) }),
    tools = opts.tools or { echo_tool(opts.counter) },
    model = opts.model or testing.scripted_model(opts.steps or { final() }, opts.model_options),
    hooks = opts.hooks,
  })
end

local function run(a, runtime_options, input, submit)
  local runtime = mayura.create_runtime(runtime_options or { permissions = { allow = GRANTS } })
  submit = submit or {}
  submit.input = input or { task = 't' }
  local r = runtime:submit(a, submit)
  local outcome = r:result()
  runtime:close()
  return outcome, r
end

local function allow(list, extra)
  local out = {}
  for _, g in ipairs(list) do out[#out + 1] = g end
  for _, g in ipairs(extra or {}) do out[#out + 1] = g end
  return { permissions = { allow = out } }
end

local function without(grant)
  local out = {}
  for _, g in ipairs(GRANTS) do if g ~= grant then out[#out + 1] = g end end
  return { permissions = { allow = out } }
end

local function types(events)
  local out = {}
  for _, e in ipairs(events) do out[#out + 1] = e.type end
  return out
end

describe('define_agent, define_hook and create_runtime', function()
  describe('failure modes', function()
    it('refuse bad definitions with INVALID_CONFIG', function()
      local model = testing.scripted_model({})
      local tool = echo_tool()
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, nil)
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', version = '1' })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = '', model = model })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', model = model, maxSteps = 1 })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', model = {} })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', model = model, input = { task = 'string' } })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', model = model, tools = { tool, tool } })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', model = model, hooks = { { stage = 'on_finally' } } })
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, { id = 'a', model = model, instructions = 42 })
      local function with(k, v)
        local t = echo_tool()
        t[k] = v
        return { id = 'a', model = model, tools = { t } }
      end
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('effect', nil))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('effect', 'delete'))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('id', 'has space'))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('run', nil))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('input', { text = 'string' }))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('capabilities', 'echo:use'))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('exec_cost_micros', -1))
      assert.raises_code('INVALID_CONFIG', mayura.define_agent, with('execCostMicros', 1))

      local handler = function() end
      assert.raises_code('INVALID_CONFIG', mayura.define_hook, nil)
      assert.raises_code('INVALID_CONFIG', mayura.define_hook, { id = 'h', stage = 'onFinally', handler = handler })
      assert.raises_code('INVALID_CONFIG', mayura.define_hook, { id = 'h', stage = 'on_finally' })
      assert.raises_code('INVALID_CONFIG', mayura.define_hook,
        { id = 'h', stage = 'on_finally', handler = handler, timeout_ms = 0 })
      assert.raises_code('INVALID_CONFIG', mayura.define_hook, { stage = 'on_finally', handler = handler })

      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { profile = 'durable' })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { limits = { maxSteps = 3 } })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { limits = { max_steps = 0 } })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { limits = { max_cost_micros = -1 } })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { limits = { max_duration_ms = 1.5 } })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { permissions = { allow = 'model:scripted' } })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { permissions = { allow = { 42 } } })
      assert.raises_code('INVALID_CONFIG', mayura.create_runtime, { permissions = { deny = {} } })
      assert.raises_code('INVALID_CONFIG', testing.scripted_model, { 'step' })
      assert.raises_code('INVALID_CONFIG', testing.scripted_model, {}, { max_cost_micros = -1 })
    end)

    it('submit refuses what is not an agent, unknown options, and a closed runtime', function()
      local runtime = mayura.create_runtime()
      assert.raises_code('INVALID_INPUT', runtime.submit, runtime, {}, { input = {} })
      assert.raises_code('INVALID_INPUT', runtime.submit, runtime, agent({}), { inputs = {} })
      assert.raises_code('INVALID_INPUT', runtime.submit, runtime, agent({}), { on_event = 'print' })
      assert.raises_code('INVALID_INPUT', runtime.submit, runtime, agent({}), { signal = {} })
      runtime:close()
      assert.raises_code('INVALID_INPUT', runtime.submit, runtime, agent({}), { input = { task = 't' } })
    end)
  end)

  it('has the defaults of the seeds', function()
    local runtime = mayura.create_runtime({ profile = 'ephemeral' })
    assert.are.equal(60000, runtime.limits.max_duration_ms)
    assert.is_nil(runtime.limits.max_steps)
    local hook = mayura.define_hook({ id = 'h', version = '1', stage = 'on_finally', handler = function() end })
    assert.are.equal(30000, hook.timeout_ms)
    local a = mayura.define_agent({ id = 'a', model = testing.scripted_model({}), instructions = { 'one', 'two' } })
    assert.are.equal('one\ntwo', a.instructions)
  end)
end)

describe('a run', function()
  describe('failure modes', function()
    it('fails with INVALID_INPUT when the input does not match, before any model call', function()
      local model = testing.scripted_model({ final() })
      local outcome = run(agent({ model = model }), nil, { task = 42 })
      assert.are.equal('failed', outcome.status)
      assert.are.equal('INVALID_INPUT', outcome.error.code)
      assert.matches('task: expected a string, got number', outcome.error.message, 1, true)
      assert.are.equal(0, model.calls)
    end)

    it('rejects a final answer that does not match the output schema, and passes nothing on', function()
      local outcome = run(agent({ steps = { { type = 'final', output = { summary = string.rep('x', 51) } } } }))
      assert.are.equal('failed', outcome.status)
      assert.are.equal('INVALID_OUTPUT', outcome.error.code)
      assert.matches('summary: expected at most 50 characters', outcome.error.message, 1, true)
      assert.is_nil(outcome.output)
      outcome = run(agent({ steps = { { type = 'final', output = 'just text' } } }))
      assert.are.equal('INVALID_OUTPUT', outcome.error.code)
      outcome = run(agent({ steps = { { type = 'final' } } }))
      assert.are.equal('INVALID_OUTPUT', outcome.error.code)
    end)

    it('fails with MODEL_ERROR when the model runs out of steps, raises, or gives no valid step', function()
      local outcome = run(agent({ steps = { call('echo', { text = 'a' }) } }))
      assert.are.equal('failed', outcome.status)
      assert.are.equal('MODEL_ERROR', outcome.error.code)
      assert.matches('no step 2', outcome.error.message)
      outcome = run(agent({ steps = { function() error('the API is down') end } }))
      assert.are.equal('MODEL_ERROR', outcome.error.code)
      assert.matches('the API is down', outcome.error.message)
      for _, bad in ipairs({
        { type = 'answer' },
        { type = 'tool_calls', calls = {} },
        { type = 'tool_calls', calls = { { input = {} } } },
        { type = 'final', output = { summary = 'x' }, usage = { cost_micros = -1 } },
        function() return 'final' end,
      }) do
        outcome = run(agent({ steps = { bad } }))
        assert.are.equal('MODEL_ERROR', outcome.error.code)
      end
    end)

    it('ends blocked when the model grant is missing, without calling the model', function()
      local model = testing.scripted_model({ final() })
      local outcome = run(agent({ model = model }), without('model:scripted'))
      assert.are.equal('blocked', outcome.status)
      assert.are.equal('PERMISSION_DENIED', outcome.error.code)
      assert.matches('model:scripted', outcome.error.message)
      assert.are.equal(0, model.calls)
    end)

    for _, grant in ipairs({ 'tool:echo', 'echo:use', 'effect:read' }) do
      it('ends blocked when the grant ' .. grant .. ' is missing, before the tool runs', function()
        local counter = {}
        local outcome = run(agent({ counter = counter, steps = { call('echo', { text = 'a' }), final() } }),
          without(grant))
        assert.are.equal('blocked', outcome.status)
        assert.are.equal('PERMISSION_DENIED', outcome.error.code)
        assert.matches(grant, outcome.error.message, 1, true)
        assert.is_nil(counter.n)
        assert.are.equal(0, outcome.usage.tool_calls)
      end)
    end

    it('hands a tool input that does not match back to the model, without running the tool', function()
      local counter, seen = {}, nil
      local outcome = run(agent({ counter = counter, steps = {
        call('echo', { text = 42 }),
        function(request)
          seen = request.messages[#request.messages]
          return final()
        end,
      } }))
      assert.are.equal('succeeded', outcome.status)
      assert.is_nil(counter.n)
      assert.are.equal('tool', seen.role)
      assert.are.equal('INVALID_INPUT', seen.result.error.code)
      assert.are.equal('text: expected a string, got number', seen.result.error.message)
      assert.are.equal(1, outcome.usage.tool_calls)
    end)

    it('hands an unknown tool back to the model', function()
      local seen
      local outcome = run(agent({ steps = {
        call('nope', {}),
        function(request)
          seen = request.messages[#request.messages].result
          return final()
        end,
      } }))
      assert.are.equal('succeeded', outcome.status)
      assert.are.equal('INVALID_INPUT', seen.error.code)
      assert.matches('no tool nope', seen.error.message)
    end)

    it('hands tool errors back to the model, with their code', function()
      local results = {}
      local failing = {
        id = 'flaky', effect = 'read', input = z.object({ how = z.string() }),
        run = function(input)
          if input.how == 'string' then error('disk on fire') end
          errors.raise('SANDBOX_ERROR', 'gone away', { reason = 'gone' })
        end,
      }
      local outcome = run(agent({ tools = { failing }, steps = {
        call('flaky', { how = 'string' }),
        function(request)
          results[1] = request.messages[#request.messages].result
          return call('flaky', { how = 'coded' })
        end,
        function(request)
          results[2] = request.messages[#request.messages].result
          return final()
        end,
      } }), allow({ 'model:scripted', 'tool:flaky', 'effect:read' }))
      assert.are.equal('succeeded', outcome.status)
      assert.are.equal('TOOL_ERROR', results[1].error.code)
      assert.matches('disk on fire', results[1].error.message)
      assert.are.same({ code = 'SANDBOX_ERROR', message = 'gone away', reason = 'gone' }, results[2].error)
    end)

    it('ends the run when a tool raises PERMISSION_DENIED, LIMIT_EXCEEDED or BUDGET_EXCEEDED', function()
      local cases = { PERMISSION_DENIED = 'blocked', LIMIT_EXCEEDED = 'failed', BUDGET_EXCEEDED = 'failed' }
      for code, status in pairs(cases) do
        local tool = { id = 'strict', effect = 'write', run = function() errors.raise(code, 'no') end }
        local outcome = run(agent({ tools = { tool }, steps = { call('strict', {}), final() } }),
          allow({ 'model:scripted', 'tool:strict', 'effect:write' }))
        assert.are.equal(status, outcome.status)
        assert.are.equal(code, outcome.error.code)
      end
    end)

    it('hands back an error marked tool_error whatever its code, and the run goes on', function()
      for _, code in ipairs({ 'PERMISSION_DENIED', 'LIMIT_EXCEEDED', 'BUDGET_EXCEEDED' }) do
        local seen
        local tool = { id = 'refusing', effect = 'write', run = function()
          error(errors.new(code, 'the sandbox said no', { tool_error = true }))
        end }
        local outcome = run(agent({ tools = { tool }, steps = {
          call('refusing', {}),
          function(request)
            seen = request.messages[#request.messages].result
            return final()
          end,
        } }), allow({ 'model:scripted', 'tool:refusing', 'effect:write' }))
        assert.are.equal('succeeded', outcome.status, code)
        assert.are.same({ error = { code = code, message = 'the sandbox said no' } }, seen)
      end
    end)
  end)

  it('runs the tool calls of a step in order and keeps the conversation', function()
    local order, messages = {}, nil
    local tool = {
      id = 'note', effect = 'write', input = z.object({ n = z.integer() }),
      run = function(input, context)
        order[#order + 1] = input.n
        assert.is_string(context.run_id)
        assert.is_true(task.is_token(context.signal))
        return input.n == 2 and 'two' or nil
      end,
    }
    local outcome = run(agent({ tools = { tool }, steps = {
      { type = 'tool_calls', text = 'thinking', calls = {
        { id = 'a', tool_id = 'note', input = { n = 1 } },
        { id = 'b', tool_id = 'note', input = { n = 2 } },
        { tool_id = 'note', input = { n = 3 } },
      } },
      function(request)
        messages = request.messages
        assert.are.equal('Test.', request.instructions)
        assert.are.equal('note', request.tools[1].id)
        assert.are.equal('object', request.tools[1].input_schema.type)
        assert.are.equal('object', request.output_schema.type)
        return final('ok')
      end,
    } }), allow({ 'model:scripted', 'tool:note', 'effect:write' }))
    assert.are.equal('succeeded', outcome.status)
    assert.are.same({ summary = 'ok' }, outcome.output)
    assert.are.same({ 1, 2, 3 }, order)
    assert.are.equal(5, #messages)
    assert.are.same({ role = 'user', content = { task = 't' } }, messages[1])
    assert.are.equal('assistant', messages[2].role)
    assert.are.equal('thinking', messages[2].text)
    assert.are.equal(3, #messages[2].calls)
    assert.are.same({ role = 'tool', call_id = 'a', tool_id = 'note', result = {} }, messages[3])
    assert.are.same({ value = 'two' }, messages[4].result)
    assert.is_string(messages[5].call_id)
    assert.are.same({ steps = 2, model_calls = 2, tool_calls = 3, cost_micros = 0 }, outcome.usage)
  end)

  it('takes a function as the model, granted as model:function', function()
    local outcome = run(agent({ model = function() return final('f') end }), allow({ 'model:function' }))
    assert.are.equal('succeeded', outcome.status)
    assert.are.equal('f', outcome.output.summary)
  end)
end)

describe('limits', function()
  it('max_steps ends the run failed with LIMIT_EXCEEDED', function()
    local counter = {}
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_steps = 3 } })
    local r = runtime:submit(agent({ counter = counter, steps = endless() }), { input = { task = 't' } })
    local outcome = r:result()
    assert.are.equal('failed', outcome.status)
    assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
    assert.matches('max_steps', outcome.error.message)
    assert.are.equal(3, outcome.usage.steps)
    assert.are.equal(3, counter.n)
    local reached
    for e in r:events() do if e.type == 'limit_reached' then reached = e end end
    assert.are.equal('max_steps', reached.limit)
    runtime:close()
  end)

  it('max_model_calls ends the run failed with LIMIT_EXCEEDED', function()
    local model = testing.scripted_model(endless())
    local outcome = run(agent({ model = model }),
      { permissions = { allow = GRANTS }, limits = { max_model_calls = 2 } })
    assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
    assert.matches('max_model_calls', outcome.error.message)
    assert.are.equal(2, model.calls)
  end)

  it('max_tool_calls stops the call that would pass it, before it runs', function()
    local counter = {}
    local outcome = run(agent({ counter = counter, steps = {
      { type = 'tool_calls', calls = {
        { id = '1', tool_id = 'echo', input = { text = 'a' } },
        { id = '2', tool_id = 'echo', input = { text = 'b' } },
        { id = '3', tool_id = 'echo', input = { text = 'c' } },
      } },
      final(),
    } }), { permissions = { allow = GRANTS }, limits = { max_tool_calls = 2 } })
    assert.are.equal('failed', outcome.status)
    assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
    assert.matches('max_tool_calls', outcome.error.message)
    assert.are.equal(2, counter.n)
  end)

  it('max_duration_ms stops a tool that honours its cancel token', function()
    local seen = {}
    local slow = {
      id = 'slow', effect = 'read',
      run = function(_, context)
        local ok = pcall(sleep_or_cancel, 10000, context.signal)
        seen.cancelled = not ok and context.signal.cancelled
        seen.done = true
      end,
    }
    local started = core.hrtime_ms()
    local outcome = run(agent({ tools = { slow }, steps = { call('slow', {}), final() } }),
      { permissions = { allow = { 'model:scripted', 'tool:slow', 'effect:read' } },
        limits = { max_duration_ms = 200 } })
    assert.are.equal('failed', outcome.status)
    assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
    assert.matches('max_duration_ms', outcome.error.message)
    assert.is_true(core.hrtime_ms() - started >= 190)
    -- the tool's ten seconds were cut short by its token, not waited out
    drain(seen)
    assert.is_true(seen.cancelled)
  end)

  it('max_duration_ms ends a run whose tool ignores its cancel token, a grace second later', function()
    local left = {}
    local stuck = { id = 'stuck', effect = 'read', run = function() mayura.sleep(1500) left.done = true end }
    local outcome = run(agent({ tools = { stuck }, steps = { call('stuck', {}), final() } }),
      { permissions = { allow = { 'model:scripted', 'tool:stuck', 'effect:read' } },
        limits = { max_duration_ms = 200 } })
    assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
    -- the run ended while the tool was still stuck (its 1.5 s outlast the 0.2 s + the grace second)
    assert.is_nil(left.done)
    drain(left)
  end)

  it('max_duration_ms is checked between calls of a run that never waits', function()
    local busy = {
      id = 'busy', effect = 'read',
      run = function()
        local t = core.hrtime_ms()
        while core.hrtime_ms() - t < 30 do end
      end,
    }
    local steps = {}
    for i = 1, 100 do steps[i] = call('busy', {}) end
    local outcome = run(agent({ tools = { busy }, steps = steps }),
      { permissions = { allow = { 'model:scripted', 'tool:busy', 'effect:read' } },
        limits = { max_duration_ms = 100 } })
    assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
    assert.is_true(outcome.usage.tool_calls < 10)
  end)

  it('max_cost_micros: a model call whose reservation would pass the limit is not made', function()
    -- each call reserves 400 and costs 300: 0+400, 300+400, 600+400 fit in 1000; 900+400 does not
    local model = testing.scripted_model(endless(300), { max_cost_micros = 400 })
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_cost_micros = 1000 } })
    local r = runtime:submit(agent({ model = model }), { input = { task = 't' } })
    local outcome = r:result()
    assert.are.equal('failed', outcome.status)
    assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
    assert.are.equal(3, model.calls)
    assert.are.equal(900, outcome.usage.cost_micros)
    local ended = {}
    for e in r:events() do if e.type == 'model_call_ended' then ended[#ended + 1] = e end end
    assert.are.equal(300, ended[3].cost_micros)
    assert.are.equal(900, ended[3].total_cost_micros)
    runtime:close()
  end)

  it('max_cost_micros: a call that costs more than it reserved ends the run, its true cost counted', function()
    -- reserves 100, reports 700: the run stops there, within its 1000, and makes no second call
    local model = testing.scripted_model(endless(700), { max_cost_micros = 100 })
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_cost_micros = 1000 } })
    local r = runtime:submit(agent({ model = model }), { input = { task = 't' } })
    local outcome = r:result()
    runtime:close()
    assert.are.equal('failed', outcome.status)
    assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
    assert.matches('cost 700 micros, more than the 100 it reserved', outcome.error.message)
    assert.are.equal(1, model.calls)
    assert.are.equal(700, outcome.usage.cost_micros)
    assert.are.equal(0, outcome.usage.tool_calls)
    local reached
    for e in r:events() do if e.type == 'limit_reached' then reached = e.limit end end
    assert.are.equal('max_cost_micros', reached)
    -- a final answer that overspent is not taken either
    model = testing.scripted_model({ final('late', 101) }, { max_cost_micros = 100 })
    outcome = run(agent({ model = model }), { permissions = { allow = GRANTS }, limits = { max_cost_micros = 1000 } })
    assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
    assert.is_nil(outcome.output)
    assert.are.equal(101, outcome.usage.cost_micros)
    -- exactly the reservation is fine
    model = testing.scripted_model({ call('echo', { text = 'x' }, 100), final('ok', 100) }, { max_cost_micros = 100 })
    outcome = run(agent({ model = model }), { permissions = { allow = GRANTS }, limits = { max_cost_micros = 1000 } })
    assert.are.equal('succeeded', outcome.status)
    assert.are.equal(200, outcome.usage.cost_micros)
  end)

  it('without max_cost_micros the cost of a call is counted, whatever it reserved', function()
    local model = testing.scripted_model({ call('echo', { text = 'x' }, 700), final('ok', 5) },
      { max_cost_micros = 100 })
    local outcome = run(agent({ model = model }), { permissions = { allow = GRANTS } })
    assert.are.equal('succeeded', outcome.status)
    assert.are.equal(705, outcome.usage.cost_micros)
  end)

  it('max_cost_micros: a tool call whose exec_cost_micros would pass the limit is not made', function()
    local ran = 0
    local paid = { id = 'paid', effect = 'write', exec_cost_micros = 400, run = function() ran = ran + 1 end }
    local steps = {}
    for i = 1, 10 do steps[i] = call('paid', {}, 100) end
    local outcome = run(agent({ tools = { paid }, steps = steps, model_options = { max_cost_micros = 100 } }),
      { permissions = { allow = { 'model:scripted', 'tool:paid', 'effect:write' } },
        limits = { max_cost_micros = 1000 } })
    -- model 100, tool 400, model 100 (600), tool 400 (1000), model 100 would be 1100: refused
    assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
    assert.are.equal(2, ran)
    assert.are.equal(1000, outcome.usage.cost_micros)
  end)
end)

describe('hooks', function()
  local function finally_hook(log, fn)
    return mayura.define_hook({
      id = 'finally', version = '1', stage = 'on_finally', timeout_ms = 1000,
      handler = function(event, context)
        log[#log + 1] = { status = event.outcome.status, run_id = context.run_id }
        if fn then fn(event, context) end
      end,
    })
  end

  describe('failure modes', function()
    it('a hook that raises in on_finally is recorded and the outcome stands', function()
      local log = {}
      local outcome = run(agent({ hooks = { finally_hook(log, function() error('cannot clean up') end) } }))
      assert.are.equal('succeeded', outcome.status)
      assert.are.equal(1, #log)
      assert.are.equal(1, #outcome.hook_errors)
      assert.are.equal('finally', outcome.hook_errors[1].hook_id)
      assert.are.equal('on_finally', outcome.hook_errors[1].stage)
      assert.matches('cannot clean up', outcome.hook_errors[1].message)
    end)

    it('a hook that hangs is left behind at its timeout, and the run ends', function()
      local left = {}
      local hang = mayura.define_hook({
        id = 'hang', version = '1', stage = 'on_finally', timeout_ms = 100,
        handler = function() mayura.sleep(600) left.done = true end,
      })
      local outcome = run(agent({ hooks = { hang } }))
      -- the run ended while the hook was still hanging
      assert.is_nil(left.done)
      assert.are.equal('succeeded', outcome.status)
      assert.are.equal('HOOK_FAILED', outcome.hook_errors[1].code)
      assert.matches('timeout_ms', outcome.hook_errors[1].message)
      drain(left)
    end)

    it('a hook of on_start that raises ends the run failed with HOOK_FAILED', function()
      local log = {}
      local bad = mayura.define_hook({ id = 'bad', stage = 'on_start', handler = function() error('no') end })
      local outcome = run(agent({ hooks = { bad, finally_hook(log) } }))
      assert.are.equal('failed', outcome.status)
      assert.are.equal('HOOK_FAILED', outcome.error.code)
      assert.are.equal(1, #log)
    end)

    it('before_tool_call denies by returning deny, by raising, or by hanging: blocked, the tool not run', function()
      local left = {}
      for _, handler in ipairs({
        function() return { deny = 'not on Sundays' } end,
        function() error('policy service down') end,
        function() mayura.sleep(300) left.done = true end,
      }) do
        local counter = {}
        local hook = mayura.define_hook({
          id = 'policy', stage = 'before_tool_call', timeout_ms = 100, handler = handler,
        })
        local outcome = run(agent({ counter = counter, hooks = { hook },
          steps = { call('echo', { text = 'a' }), final() } }))
        assert.are.equal('blocked', outcome.status)
        assert.are.equal('PERMISSION_DENIED', outcome.error.code)
        assert.matches('policy', outcome.error.message)
        assert.is_nil(counter.n)
      end
      drain(left)
    end)
  end)

  it('runs on_finally exactly once for every way a run ends', function()
    local cases = {
      succeeded = { steps = { final() } },
      failed = { steps = { { type = 'final', output = {} } } },
      blocked = { steps = { final() }, runtime = without('model:scripted') },
      cancelled = { steps = { function(request) sleep_or_cancel(5000, request.signal) return final() end } },
    }
    for status, case in pairs(cases) do
      local log = {}
      local runtime = mayura.create_runtime(case.runtime or { permissions = { allow = GRANTS } })
      local r = runtime:submit(agent({ steps = case.steps, hooks = { finally_hook(log) } }), { input = { task = 't' } })
      if status == 'cancelled' then r:cancel() end
      local outcome = r:result()
      assert.are.equal(status, outcome.status)
      runtime:close()
      r:cancel()
      assert.are.equal(1, #log, status)
      assert.are.equal(status, log[1].status)
      assert.are.equal(r.id, log[1].run_id)
      assert.are.equal(r.id, outcome.run_id)
    end
  end)

  it('runs every stage with its event', function()
    local seen = {}
    local hooks = {}
    for _, stage in ipairs({ 'on_start', 'before_model_call', 'after_model_call', 'before_tool_call',
      'after_tool_call', 'on_finally' }) do
      hooks[#hooks + 1] = mayura.define_hook({ id = stage, stage = stage, handler = function(event, context)
        assert.are.equal(stage, event.stage)
        assert.is_string(context.run_id)
        seen[#seen + 1] = stage
        if stage == 'after_tool_call' then assert.are.equal('x', event.result.text) end
        if stage == 'before_tool_call' then assert.are.equal('echo', event.tool_id) end
      end })
    end
    local outcome = run(agent({ hooks = hooks, steps = { call('echo', { text = 'x' }), final() } }))
    assert.are.equal('succeeded', outcome.status)
    assert.are.same({ 'on_start', 'before_model_call', 'after_model_call', 'before_tool_call', 'after_tool_call',
      'before_model_call', 'after_model_call', 'on_finally' }, seen)
    assert.are.same({}, outcome.hook_errors)
  end)
end)

describe('events', function()
  it('reports progress as it happens, to on_event and run:events()', function()
    local got = {}
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
    local r = runtime:submit(agent({ steps = { call('echo', { text = 'x' }, 5), final(nil, 7) } }),
      { input = { task = 't' }, on_event = function(e) got[#got + 1] = e end })
    local outcome = r:result()
    assert.are.equal('succeeded', outcome.status)
    assert.are.same({ 'run_started', 'model_call_started', 'model_call_ended', 'tool_call_started', 'tool_call_ended',
      'model_call_started', 'model_call_ended', 'run_ended' }, types(got))
    local listed = {}
    for e in r:events() do listed[#listed + 1] = e end
    assert.are.same(got, listed)
    assert.are.equal(5, got[3].cost_micros)
    assert.are.equal(12, got[7].total_cost_micros)
    assert.are.equal('echo', got[4].tool_id)
    assert.are.same({ text = 'x' }, got[4].input)
    assert.are.equal('succeeded', got[8].status)
    assert.are.equal(r.id, got[1].run_id)
    runtime:close()
  end)

  it('run:events() waits for events while the run goes on', function()
    local slow = {
      id = 'slow', effect = 'read',
      run = function(_, context) sleep_or_cancel(50, context.signal) return { ok = true } end,
    }
    local runtime = mayura.create_runtime({
      permissions = { allow = { 'model:scripted', 'tool:slow', 'effect:read' } },
    })
    local r = runtime:submit(agent({ tools = { slow }, steps = { call('slow', {}), call('slow', {}), final() } }),
      { input = { task = 't' } })
    local seen = {}
    for e in r:events() do seen[#seen + 1] = e.type end
    assert.are.equal('run_ended', seen[#seen])
    assert.are.equal(12, #seen)
    runtime:close()
  end)

  it('an on_event that raises does not break the run', function()
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
    local r
    local ok
    local reports = util.capture_reports(function()
      ok = pcall(function()
        r = runtime:submit(agent({}), { input = { task = 't' }, on_event = function() error('listener bug') end })
      end)
      assert.are.equal('succeeded', r:result().status)
    end)
    assert.is_true(ok)
    -- reported once, however many events failed
    assert.are.equal(1, #reports)
    assert.matches('on_event failed .*listener bug', reports[1])
    runtime:close()
  end)
end)

describe('cancellation', function()
  local function slow_tool()
    return { id = 'slow', effect = 'read', run = function(_, context) sleep_or_cancel(5000, context.signal) end }
  end
  local slow_grants = { permissions = { allow = { 'model:scripted', 'tool:slow', 'effect:read' } } }

  it('run:cancel() stops the running tool and ends the run cancelled', function()
    local runtime = mayura.create_runtime(slow_grants)
    local r = runtime:submit(agent({ tools = { slow_tool() }, steps = { call('slow', {}), final() } }),
      { input = { task = 't' } })
    mayura.sleep(50)
    r:cancel()
    local outcome = r:result()
    assert.are.equal('cancelled', outcome.status)
    assert.are.equal('CANCELLED', outcome.error.code)
    assert.are.equal('cancelled', r.status)
    runtime:close()
  end)

  it('a cancel token given to submit cancels the run', function()
    local token = mayura.cancel_token()
    local runtime = mayura.create_runtime(slow_grants)
    local r = runtime:submit(agent({ tools = { slow_tool() }, steps = { call('slow', {}), final() } }),
      { input = { task = 't' }, signal = token })
    mayura.sleep(20)
    token:cancel()
    assert.are.equal('cancelled', r:result().status)
    runtime:close()
  end)

  it('runtime:close() cancels the runs still going and waits for their on_finally', function()
    local log = {}
    local hook = mayura.define_hook({ id = 'f', stage = 'on_finally', handler = function(event)
      mayura.sleep(20)
      log[#log + 1] = event.outcome.status
    end })
    local runtime = mayura.create_runtime(slow_grants)
    local runs = {}
    for i = 1, 3 do
      runs[i] = runtime:submit(agent({ tools = { slow_tool() }, hooks = { hook },
        steps = { call('slow', {}), final() } }), { input = { task = 't' } })
    end
    mayura.sleep(20)
    runtime:close()
    assert.are.same({ 'cancelled', 'cancelled', 'cancelled' }, log)
    for _, r in ipairs(runs) do assert.are.equal('cancelled', r:result().status) end
  end)

  it('many runs wait at once on one loop', function()
    local runtime = mayura.create_runtime({ permissions = { allow = { 'model:scripted', 'tool:nap', 'effect:read' } },
      limits = { max_duration_ms = 30000 } })
    -- each nap waits until all 50 are waiting: were the runs served one at a time, none would end
    local waiting = 0
    local nap = { id = 'nap', effect = 'read', run = function(_, context)
      waiting = waiting + 1
      while waiting < 50 and not context.signal.cancelled do sleep_or_cancel(10, context.signal) end
    end }
    local runs = {}
    for i = 1, 50 do
      runs[i] = runtime:submit(agent({ tools = { nap }, steps = { call('nap', {}), final() } }),
        { input = { task = 't' } })
    end
    for _, r in ipairs(runs) do assert.are.equal('succeeded', r:result().status) end
    assert.are.equal(50, waiting)
    runtime:close()
  end)

  it('runs inside a task too', function()
    local outcome = mayura.run(function()
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local r = runtime:submit(agent({ steps = { call('echo', { text = 'in' }), final('task') } }),
        { input = { task = 't' } })
      local o = r:result()
      runtime:close()
      return o
    end)
    assert.are.equal('succeeded', outcome.status)
  end)
end)

describe('a session: one path from the tool to its caller', function()
  -- the tool's result and error, as the tool made them; with the session's checks on the way
  local made = {}
  local tools = {
    { id = 'make', effect = 'read', run = function(_, context)
      context.progress({ stream = 'stdout', text = 'half\n' })
      made.result = setmetatable({ n = 1, list = setmetatable({ 1, 2 }, core.json.array_mt), big = 2 ^ 53 },
        { __index = { kind = 'made' } })
      return made.result
    end },
    { id = 'fail', effect = 'read', run = function()
      made.error = errors.new('SANDBOX_ERROR', 'the sandbox is gone', { reason = 'gone', cause = 'daemon said x',
        retry_after_ms = 5 })
      error(made.error)
    end },
    { id = 'stop', effect = 'read', run = function()
      made.stop = errors.new('CANCELLED', 'stopped by the tool', { by = 'tool' })
      error(made.stop)
    end },
  }
  local function open()
    local runtime = mayura.create_runtime({ permissions = { allow = { 'tool:make', 'tool:fail', 'tool:stop',
      'effect:read' } } })
    local a = mayura.define_agent({ id = 'a', model = function() end, tools = tools })
    return runtime, runtime:session(a, { id = 's1' })
  end

  it('returns the very table the tool gave back, and its progress to the call', function()
    mayura.run(function()
      local runtime, s = open()
      local updates = {}
      local r = s:call('make', {}, { progress = function(u) updates[#updates + 1] = u end })
      assert.is_true(rawequal(made.result, r))
      assert.are.equal('made', r.kind)                          -- its metatable came along
      assert.are.equal(core.json.array_mt, getmetatable(r.list))
      assert.are.same({ { stream = 'stdout', text = 'half\n' } }, updates)
      local again = s.call('make', {})                           -- `.` as well as `:`
      assert.is_true(rawequal(made.result, again))
      runtime:close()
    end)
  end)

  it('raises the error the tool raised, with every field', function()
    mayura.run(function()
      local runtime, s = open()
      local ok, err = pcall(s.call, 'fail', {})
      assert.is_false(ok)
      assert.is_true(rawequal(made.error, err))
      assert.are.equal('SANDBOX_ERROR', err.code)
      assert.are.equal('gone', err.reason)
      assert.are.equal('daemon said x', err.cause)
      assert.are.equal(5, err.retry_after_ms)
      assert.is_true(err.tool_error)
      -- an error that ends a run reaches the session's caller as itself too, and the session goes on
      ok, err = pcall(s.call, 'stop', {})
      assert.is_false(ok)
      assert.is_true(rawequal(made.stop, err))
      assert.are.equal('tool', err.by)
      local r = s:call('make', {})
      assert.is_true(rawequal(made.result, r))
      assert.are.equal(3, s.usage.tool_calls)
      runtime:close()
    end)
  end)

  it('is what a policy environment gives, and what mayura serve drives', function()
    local env = mayura.load_policy({ name = 'p.lua', source = [[
tool 'clock' { effect = 'read', run = function() return { t = 1 } end }
agent 'a' { tools = { 'clock' }, allow = { 'tool:clock', 'effect:read' } }
]] }):open()
    local s = env:session('x')
    assert.are.equal(require('mayura.runtime').Session, getmetatable(s))
    assert.are.same({ 'clock' }, { s.tools[1].id })
    s:close()
    env:close()
  end)
end)
