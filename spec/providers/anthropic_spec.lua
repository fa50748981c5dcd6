-- mayura.provider.anthropic (Messages API) against the loopback stand-in
-- (spec/support/model_server.lua).
local anthropic = require('mayura.provider.anthropic')
local mayura = require('mayura')
local core = require('mayura.core')
local uv = require('luv')
local model_server = require('support.model_server')

local json = core.json
local z = mayura.z

local KEY = 'sk-ant-api03-SECRET-77aa19'
local API_TEXT = 'invalid x-api-key sk-ant-api03-SECRET-77aa19'
local PRICING = { input_micros_per_million_tokens = 3000000, output_micros_per_million_tokens = 15000000 }


local function model_error(reason, fn, ...)
  local err = assert.raises_code('MODEL_ERROR', fn, ...)
  assert.are.equal(reason, err.reason, err.message)
  assert.is_nil(err.message:find('SECRET', 1, true))
  assert.is_nil(err.message:find('x-api-key', 1, true))
  return err
end

local function ms_since(t0)
  return (uv.hrtime() - t0) / 1e6
end

-- {======================================================
-- Bodies in the shapes of the Messages API
-- =======================================================

local function usage(input, output, extra)
  return string.format('{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,'
    .. '"output_tokens":%d,"service_tier":"standard"%s}', input, output, extra or '')
end

local function message(blocks, stop, usage_json)
  return string.format('{"id":"msg_01","type":"message","role":"assistant","model":"claude-test","content":[%s],'
    .. '"stop_reason":"%s","stop_sequence":null,"usage":%s}', table.concat(blocks, ','), stop,
    usage_json or usage(40, 22))
end

local function text(t)
  return '{"type":"text","text":' .. json.encode(t) .. '}'
end

local function tool_use(id, name, input_json)
  return string.format('{"type":"tool_use","id":"%s","name":"%s","input":%s}', id, name, input_json)
end

local THINKING = '{"type":"thinking","thinking":"Both files are needed.","signature":"EqQBCkgIARABGAIiQ"}'

local function error_body(type_)
  return string.format('{"type":"error","error":{"type":"%s","message":%s},"request_id":"req_011CS"}', type_,
    json.encode(API_TEXT))
end

-- }======================================================

local srv

local function new_model(options)
  local o = { api_key = KEY, model = 'claude-test', base_url = srv:url(''), max_cost_micros = 60000,
    pricing = PRICING, retry_base_ms = 1 }
  for k, v in pairs(options or {}) do o[k] = v end
  return anthropic.anthropic_messages(o)
end

local RESULT = z.object({ summary = z.string():max(2000), missing = z.array(z.string():max(200)):min(1):max(10) })

local function request(fields)
  local r = {
    instructions = 'You are a build agent. Call tools when you need facts.',
    messages = { { role = 'user', content = { task = 'Summarize README.md and LICENSE' } } },
    tools = { { id = 'workspace.read', description = 'Read a UTF-8 text file from the workspace.',
      input_schema = z.object({ path = z.string() }):json_schema() } },
    output_schema = RESULT:json_schema(),
  }
  for k, v in pairs(fields or {}) do r[k] = v end
  return r
end

local function final_text(t)
  return { body = message({ text(t) }, 'end_turn') }
end

describe('anthropic_messages', function()
  before_each(function() srv = model_server.new() end)

  after_each(function()
    srv:close()
    uv.new_timer():close()
    core.run_once()
  end)

  describe('failure modes', function()
    it('refuses bad options with INVALID_CONFIG', function()
      local base = { api_key = KEY, model = 'm', max_cost_micros = 1, pricing = PRICING }
      local function with(k, v)
        local o = {}
        for key, val in pairs(base) do o[key] = val end
        o[k] = v
        return o
      end
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages, with('api_key', nil))
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages, with('pricing', nil))
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages, with('max_cost_micros', nil))
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages, with('max_tokens', 0))
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages, with('structured_output', 'prefill'))
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages, with('thinking', true))
      local model = anthropic.anthropic_messages(base)
      assert.are.equal('anthropic.messages', model.id)
      assert.are.equal(1, model.max_cost_micros)
    end)

    it('401 and 403: authentication, not retried, no key or API text in the message', function()
      local model = new_model()
      srv:push({ status = 401, body = error_body('authentication_error') })
      local err = model_error('authentication', model.call, model, request())
      assert.are.equal(401, err.status)
      assert.are.equal('authentication_error', err.provider_code)
      srv:push({ status = 403, body = error_body('permission_error') })
      model_error('authentication', model.call, model, request())
      assert.are.equal(2, #srv.requests)
    end)

    it('429 honours retry-after, then succeeds; a spend-limit 429 or a wait over 60 s is not retried', function()
      local model = new_model()
      srv:push({ status = 429, headers = { ['retry-after'] = '1' }, body = error_body('rate_limit_error') },
        final_text('{"summary":"s","missing":["LICENSE"]}'))
      local t0 = uv.hrtime()
      assert.are.equal('final', model:call(request()).type)
      assert.is_true(ms_since(t0) >= 950)
      assert.are.equal(2, #srv.requests)
      assert.are.equal(srv.requests[1].body, srv.requests[2].body)
      srv:push({ status = 429, body = '{"type":"error","error":{"type":"rate_limit_error","message":"x",'
        .. '"details":{"error_code":"enforced_spend_limit_reached"}}}' })
      model_error('rate_limited', model.call, model, request())
      assert.are.equal(3, #srv.requests)
      srv:push({ status = 429, headers = { ['retry-after'] = '90' }, body = error_body('rate_limit_error') })
      local err = model_error('rate_limited', model.call, model, request())
      assert.are.equal('rate_limit_error', err.provider_code)
      assert.are.equal(4, #srv.requests)
    end)

    it('529 overloaded is retried with backoff, then unavailable', function()
      local model = new_model({ max_retries = 2 })
      srv:push({ status = 529, body = error_body('overloaded_error') },
        final_text('{"summary":"s","missing":["LICENSE"]}'))
      assert.are.equal('final', model:call(request()).type)
      assert.are.equal(2, #srv.requests)
      for _ = 1, 3 do srv:push({ status = 529, body = error_body('overloaded_error') }) end
      local err = model_error('unavailable', model.call, model, request())
      assert.are.equal(529, err.status)
      assert.are.equal('overloaded_error', err.provider_code)
      assert.are.equal(5, #srv.requests)
    end)

    it('a stalled server: timeout', function()
      local model = new_model({ timeout_ms = 150, max_retries = 0 })
      srv:push({ stall = true })
      model_error('timeout', model.call, model, request())
    end)

    it('stop_reason max_tokens, model_context_window_exceeded or pause_turn: incomplete', function()
      local model = new_model()
      for _, stop in ipairs({ 'max_tokens', 'model_context_window_exceeded', 'pause_turn' }) do
        srv:push({ body = message({ text('Reading.'), tool_use('toolu_01', 'workspace_read', '{"path":"REA"}') },
          stop) })
        local err = model_error('incomplete', model.call, model, request())
        assert.are.equal(stop, err.provider_code)
      end
    end)

    it('stop_reason refusal: refused; text that is not JSON: invalid_output', function()
      local model = new_model()
      srv:push({ body = message({ text('I cannot help with that.') }, 'refusal') })
      model_error('refused', model.call, model, request())
      srv:push(final_text('The README describes a tiny CLI.'))
      model_error('invalid_output', model.call, model, request())
    end)

    it('never crashes on a body of the wrong shape', function()
      local model = new_model()
      local bodies = {
        '', '[]', '{}', '{"content":null}', '{"content":"x"}', '{"content":[1]}', '{"content":[{"type":"tool_use"}]}',
        '{"content":[{"type":"tool_use","id":"t","name":"n","input":"{bad"}],"stop_reason":"tool_use"}',
        '{"content":[{"type":"tool_use","id":"t","name":"n","input":[1,2]}]}',
        '{"content":[{"type":"text","text":5}],"usage":{"input_tokens":"x"}}',
        '{"type":"error","error":{"type":"api_error","message":"boom"}}', '{"stop_reason":42,"content":[]}',
      }
      for _, b in ipairs(bodies) do
        srv:push({ body = b })
        local ok, res = pcall(model.call, model, request({ output_schema = {} }))
        if ok then
          assert.is_true(res.type == 'final' or res.type == 'tool_calls', b)
        else
          assert.are.equal('table', type(res), b .. ': ' .. tostring(res))
          assert.are.equal('MODEL_ERROR', res.code, b .. ': ' .. tostring(res.message))
        end
      end
    end)
  end)

  describe('requests', function()
    it('posts the documented request: headers, system, messages, tools, output_config', function()
      local model = new_model({ max_tokens = 2048 })
      srv:push(final_text('{"summary":"README: a tiny CLI.","missing":["LICENSE"]}'))
      local step = model:call(request())
      assert.are.same({ summary = 'README: a tiny CLI.', missing = { 'LICENSE' } }, step.output)
      local r = srv.requests[1]
      assert.are.equal('POST', r.method)
      assert.are.equal('/v1/messages', r.path)
      assert.are.equal(KEY, r.headers['x-api-key'])
      assert.are.equal('2023-06-01', r.headers['anthropic-version'])
      assert.are.equal('application/json', r.headers['content-type'])
      assert.is_nil(r.headers['authorization'])
      assert.are.same({
        model = 'claude-test',
        max_tokens = 2048,
        system = 'You are a build agent. Call tools when you need facts.',
        messages = { { role = 'user', content = '{"task":"Summarize README.md and LICENSE"}' } },
        tools = { { name = 'workspace_read', description = 'Read a UTF-8 text file from the workspace.',
          input_schema = { type = 'object', properties = { path = { type = 'string' } }, required = { 'path' },
            additionalProperties = false } } },
        -- lengths and maxItems are left out; minItems 1 stays
        output_config = { format = { type = 'json_schema', schema = { type = 'object',
          properties = { summary = { type = 'string' }, missing = { type = 'array', items = { type = 'string' },
            minItems = 1 } },
          required = { 'missing', 'summary' }, additionalProperties = false } } },
      }, r.json)
      -- the agent's own schema is left as it was
      assert.are.equal(2000, request().output_schema.properties.summary.maxLength)
    end)

    it("structured_output = 'tool': a final_answer tool, tool_choice any, its input is the answer", function()
      local model = new_model({ structured_output = 'tool' })
      srv:push({ body = message({ tool_use('toolu_09', 'final_answer', '{"value":"all done"}') }, 'tool_use') })
      local tools = {
        { id = 'final_answer', description = 'A tool of the agent with that name.',
          input_schema = z.object({}):json_schema() },
      }
      local step = model:call(request({ tools = tools, output_schema = z.string():json_schema() }))
      assert.are.same({ type = 'final', output = 'all done', usage = step.usage }, step)
      local body = srv.requests[1].json
      assert.are.same({ type = 'any' }, body.tool_choice)
      assert.is_nil(body.output_config)
      assert.are.equal('final_answer_2', body.tools[1].name)
      assert.are.equal('final_answer', body.tools[2].name)
      assert.are.same({ type = 'object', properties = { value = { type = 'string' } }, required = { 'value' },
        additionalProperties = false }, body.tools[2].input_schema)
      -- the agent's own final_answer tool is a tool call
      srv:push({ body = message({ tool_use('toolu_10', 'final_answer_2', '{}') }, 'tool_use') })
      step = model:call(request({ tools = tools, output_schema = z.string():json_schema() }))
      assert.are.same({ { id = 'toolu_10', tool_id = 'final_answer', input = {} } }, step.calls)
    end)

    it('replays the assistant content as it came and groups tool results in one user message', function()
      local model = new_model()
      srv:push({ body = message({ THINKING, text(''), text('Reading both files.'),
        tool_use('toolu_01', 'workspace_read', '{"path":"README.md"}'),
        tool_use('toolu_02', 'workspace_read', '{"path":"LICENSE"}') }, 'tool_use') })
      local step = model:call(request())
      assert.are.equal('tool_calls', step.type)
      assert.are.equal('Reading both files.', step.text)
      assert.are.same({
        { id = 'toolu_01', tool_id = 'workspace.read', input = { path = 'README.md' } },
        { id = 'toolu_02', tool_id = 'workspace.read', input = { path = 'LICENSE' } },
      }, step.calls)
      srv:push(final_text('{"summary":"README: a tiny CLI.","missing":["LICENSE"]}'))
      model:call(request({ messages = {
        { role = 'user', content = { task = 'Summarize README.md and LICENSE' } },
        { role = 'assistant', calls = step.calls, text = step.text, extra = step.extra },
        { role = 'tool', call_id = 'toolu_01', tool_id = 'workspace.read', result = { text = '# Demo' } },
        { role = 'tool', call_id = 'toolu_02', tool_id = 'workspace.read',
          result = { error = { code = 'TOOL_ERROR', message = 'file not found' } } },
      } }))
      local messages = srv.requests[2].json.messages
      assert.are.same({
        { role = 'user', content = '{"task":"Summarize README.md and LICENSE"}' },
        { role = 'assistant', content = {
          { type = 'thinking', thinking = 'Both files are needed.', signature = 'EqQBCkgIARABGAIiQ' },
          { type = 'text', text = 'Reading both files.' },
          { type = 'tool_use', id = 'toolu_01', name = 'workspace_read', input = { path = 'README.md' } },
          { type = 'tool_use', id = 'toolu_02', name = 'workspace_read', input = { path = 'LICENSE' } },
        } },
        { role = 'user', content = {
          { type = 'tool_result', tool_use_id = 'toolu_01', content = '{"text":"# Demo"}' },
          { type = 'tool_result', tool_use_id = 'toolu_02', content = messages[3].content[2].content, is_error = true },
        } },
      }, messages)
      assert.are.same({ error = { code = 'TOOL_ERROR', message = 'file not found' } },
        json.decode(messages[3].content[2].content))
    end)

    it('without kept content, rebuilds text and tool_use blocks from the step', function()
      local model = new_model()
      srv:push(final_text('{"summary":"s","missing":["x"]}'))
      model:call(request({ messages = {
        { role = 'user', content = '' },
        { role = 'assistant', text = 'Looking.', calls = { { id = 't1', tool_id = 'workspace.read',
          input = { path = 'a' } } } },
        { role = 'tool', call_id = 't1', tool_id = 'workspace.read', result = {} },
      } }))
      assert.are.same({
        { role = 'user', content = '(empty)' },
        { role = 'assistant', content = { { type = 'text', text = 'Looking.' },
          { type = 'tool_use', id = 't1', name = 'workspace_read', input = { path = 'a' } } } },
        { role = 'user', content = { { type = 'tool_result', tool_use_id = 't1', content = '{}' } } },
      }, srv.requests[1].json.messages)
    end)
  end)

  describe('cost', function()
    it('prices uncached input, cache writes and reads, and output; rounds up', function()
      local model = new_model()
      -- 40 * 3 + 600 * 3 * 1.25 + 400 * 3 * 2 + 1800 * 3 * 0.1 + 22 * 15 = 120 + 2250 + 2400 + 540 + 330
      srv:push({ body = message({ text('{"summary":"s","missing":["x"]}') }, 'end_turn',
        '{"input_tokens":40,"cache_creation_input_tokens":1000,"cache_read_input_tokens":1800,'
        .. '"cache_creation":{"ephemeral_5m_input_tokens":600,"ephemeral_1h_input_tokens":400},'
        .. '"output_tokens":22,"service_tier":"standard"}') })
      local step = model:call(request())
      assert.are.equal(5640, step.usage.cost_micros)
      assert.are.equal(1800, step.usage.cache_read_tokens)
      assert.are.equal(1000, step.usage.cache_write_tokens)
      -- no split: every write at the 5-minute rate
      srv:push({ body = message({ text('{"summary":"s","missing":["x"]}') }, 'end_turn',
        '{"input_tokens":40,"cache_creation_input_tokens":1000,"cache_read_input_tokens":1800,"output_tokens":22}') })
      assert.are.equal(4740, model:call(request()).usage.cost_micros)
      -- one cache-read token: 0.3 micros, rounded up to 1
      srv:push({ body = message({ text('{"summary":"s","missing":["x"]}') }, 'end_turn',
        '{"input_tokens":0,"cache_read_input_tokens":1,"output_tokens":0}') })
      assert.are.equal(1, model:call(request()).usage.cost_micros)
      -- missing usage: the reservation
      srv:push({ body = '{"type":"message","role":"assistant","content":[' .. text('{"summary":"s","missing":["x"]}')
        .. '],"stop_reason":"end_turn"}' })
      assert.are.equal(60000, model:call(request()).usage.cost_micros)
    end)
  end)

  describe('the ceiling', function()
    it('max_tokens comes down to what max_cost_micros leaves after the input, one token a byte', function()
      local model = new_model()   -- 60000 micros a call, at 3 and 15 $/MTok; max_tokens 4096
      srv:push(final_text('{"summary":"s","missing":["x"]}'))
      model:call(request())
      local r = srv.requests[1]
      local sent = r.json.max_tokens
      -- measured with 4096 in its place
      local input = #r.body - #tostring(sent) + 4 + require('mayura.provider._shared').INPUT_ALLOWANCE_TOKENS
      assert.are.equal(math.floor((60000 * 1000000 - input * 3000000) / 15000000), sent)
      assert.is_true(sent < 4096)
      -- a max_tokens under what the ceiling leaves is sent as it is
      srv:push(final_text('{"summary":"s","missing":["x"]}'))
      new_model({ max_tokens = 1000 }):call(request())
      assert.are.equal(1000, srv.requests[2].json.max_tokens)
      -- no room at all: not sent
      local tiny = new_model({ max_cost_micros = 100 })
      assert.raises_code('BUDGET_EXCEEDED', tiny.call, tiny, request())
      assert.are.equal(2, #srv.requests)
    end)

    it('a response reporting more than reserved ends the run BUDGET_EXCEEDED, its true cost counted', function()
      -- 100 * 3 + 5000 * 15 = 75300, past the 60000 reserved
      srv:push({ body = message({ tool_use('toolu_01', 'clock_now', '{"zone":"UTC"}') }, 'tool_use',
        usage(100, 5000)) })
      srv:push(final_text('{"time":"never asked for"}'))
      local runtime = mayura.create_runtime({
        permissions = { allow = { 'model:anthropic.messages', 'tool:clock.now', 'effect:read' } },
        limits = { max_cost_micros = 1000000 },
      })
      local outcome = runtime:submit(mayura.define_agent({
        id = 'clock', version = '1', input = z.object({ zone = z.string() }), output = z.object({ time = z.string() }),
        model = new_model(),
        tools = { { id = 'clock.now', effect = 'read', input = z.object({ zone = z.string() }),
          run = function() return { time = '12:00' } end } },
      }), { input = { zone = 'UTC' } }):result()
      runtime:close()
      assert.are.equal('failed', outcome.status)
      assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
      assert.are.equal(75300, outcome.usage.cost_micros)
      assert.are.equal(0, outcome.usage.tool_calls)
      assert.are.equal(1, #srv.requests)
      assert.are.equal(1, srv:pending())
    end)
  end)

  describe('in a run', function()
    local GRANTS = { 'model:anthropic.messages', 'tool:clock.now', 'effect:read' }

    local function agent(model)
      return mayura.define_agent({
        id = 'clock', version = '1', instructions = 'Tell the time.',
        input = z.object({ zone = z.string() }), output = z.object({ time = z.string() }),
        model = model,
        tools = { {
          id = 'clock.now', description = 'The time in a zone.', effect = 'read',
          input = z.object({ zone = z.string() }),
          run = function(input) return { time = '12:00 ' .. input.zone } end,
        } },
      })
    end

    it('runs end to end: tool_use, tool_result, then the structured answer', function()
      srv:push({ body = message({ tool_use('toolu_01', 'clock_now', '{"zone":"UTC"}') }, 'tool_use',
        usage(100, 10)) })
      srv:push(function(req)
        local last = req.json.messages[#req.json.messages]
        assert.are.equal('user', last.role)
        assert.are.same({ type = 'tool_result', tool_use_id = 'toolu_01', content = '{"time":"12:00 UTC"}' },
          last.content[1])
        return { body = message({ text('{"time":"12:00 UTC"}') }, 'end_turn', usage(200, 10)) }
      end)
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local outcome = runtime:submit(agent(new_model()), { input = { zone = 'UTC' } }):result()
      runtime:close()
      assert.are.equal('succeeded', outcome.status, outcome.error and outcome.error.message)
      assert.are.same({ time = '12:00 UTC' }, outcome.output)
      -- 100 * 3 + 10 * 15 = 450; 200 * 3 + 10 * 15 = 750
      assert.are.equal(1200, outcome.usage.cost_micros)
      assert.are.equal(2, #srv.requests)
    end)

    it('a refused key ends the run failed with MODEL_ERROR', function()
      srv:push({ status = 401, body = error_body('authentication_error') })
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local outcome = runtime:submit(agent(new_model()), { input = { zone = 'UTC' } }):result()
      runtime:close()
      assert.are.equal('failed', outcome.status)
      assert.are.equal('MODEL_ERROR', outcome.error.code)
      assert.are.equal('authentication', outcome.error.reason)
      assert.is_nil(outcome.error.message:find('SECRET', 1, true))
      assert.is_nil(outcome.error.message:find('x-api-key', 1, true))
    end)
  end)
end)
