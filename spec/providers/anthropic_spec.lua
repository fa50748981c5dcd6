-- mayura.provider.anthropic (Messages API) against the loopback stand-in
-- (spec/support/model_server.lua): what is its own (structured output as
-- output_config or a tool, stop reasons, the requests sent, the prices of
-- cache writes and reads). What every model adapter does is the contract of
-- spec/support/model_contract.lua, run here against the wire described by WIRE.
local anthropic = require('mayura.provider.anthropic')
local json = require('mayura.core').json
local z = require('mayura').z
local contract = require('support.model_contract')

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

-- The API key, and the text of the API's error bodies (which holds it): neither may reach a message.
local KEY = 'sk-ant-api03-SECRET-77aa19'
local API_TEXT = 'invalid x-api-key sk-ant-api03-SECRET-77aa19'

local function error_body(type_)
  return string.format('{"type":"error","error":{"type":"%s","message":%s},"request_id":"req_011CS"}', type_,
    json.encode(API_TEXT))
end

-- }======================================================

-- The Messages API for the contract (see spec/support/model_contract.lua).
local WIRE = {
  name = 'anthropic_messages', new = anthropic.anthropic_messages, id = 'anthropic.messages', path = '',
  key = KEY, secrets = { KEY, 'SECRET', 'x-api-key' }, required = { 'api_key', 'max_cost_micros', 'pricing' },
  output_field = 'max_tokens', default_output_tokens = 4096, max_retry_after_s = 60,
  tokens = { 'input_tokens', 'output_tokens' },
  usage = function(input, output) return usage(input, output) end, kept = '"signature":"EqQBCkgIARABGAIiQ"',
  final = function(t, usage_json) return { body = message({ text(t) }, 'end_turn', usage_json) } end,
  -- a thinking block first; arguments that are not a JSON object come as a
  -- string, as a lenient server may send them
  calls = function(calls, usage_json)
    local blocks = { THINKING }
    for _, c in ipairs(calls) do
      local ok, v = pcall(json.decode, c.arguments)
      blocks[#blocks + 1] = tool_use(c.id, c.name,
        (ok and type(v) == 'table') and c.arguments or json.encode(c.arguments))
    end
    return { body = message(blocks, 'tool_use', usage_json) }
  end,
  -- what a request sends back of the conversation
  history = function(req, call, result)
    for _, m in ipairs(req.json.messages) do
      for _, b in ipairs(type(m.content) == 'table' and m.content or {}) do
        if b.type == 'tool_use' then
          call(b.id, type(b.input) == 'string' and b.input or json.encode(b.input))
        elseif b.type == 'tool_result' then
          result(b.tool_use_id, b.content)
        end
      end
    end
  end,
  refusal = function() return { body = message({ text('I cannot help with that.') }, 'refusal') } end,
  errors = {
    authentication = { body = error_body('authentication_error'), code = 'authentication_error' },
    permission = { body = error_body('permission_error'), code = 'permission_error' },
    invalid_request = { body = error_body('invalid_request_error'), code = 'invalid_request_error' },
    rate_limit = { body = error_body('rate_limit_error'), code = 'rate_limit_error' },
    quota = { body = '{"type":"error","error":{"type":"rate_limit_error","message":"x",'
      .. '"details":{"error_code":"enforced_spend_limit_reached"}}}', code = 'rate_limit_error' },
    unavailable = { status = 529, body = error_body('overloaded_error'), code = 'overloaded_error' },
  },
  malformed = {
    '{"content":null}', '{"content":"x"}', '{"content":[1]}', '{"content":[{"type":"tool_use"}]}',
    '{"content":[{"type":"tool_use","id":"t","name":"n","input":"{bad"}],"stop_reason":"tool_use"}',
    '{"content":[{"type":"tool_use","id":"t","name":"n","input":[1,2]}]}',
    '{"content":[{"type":"text","text":5}],"usage":{"input_tokens":"x"}}',
    '{"type":"error","error":{"type":"api_error","message":"boom"}}', '{"stop_reason":42,"content":[]}',
  },
}

contract.run(WIRE)

-- The models of the cases below: 3 and 15 $ a million input and output tokens.
local PRICING = { input_micros_per_million_tokens = 3000000, output_micros_per_million_tokens = 15000000 }
local new_model, model_error = contract.kit(WIRE, { api_key = KEY, model = 'claude-test',
  max_cost_micros = 60000, pricing = PRICING })

local RESULT = z.object({ summary = z.string():max(2000), missing = z.array(z.string():max(200)):min(1):max(10) })

local request = contract.builder({
  instructions = 'You are a build agent. Call tools when you need facts.',
  messages = { { role = 'user', content = { task = 'Summarize README.md and LICENSE' } } },
  tools = { { id = 'workspace.read', description = 'Read a UTF-8 text file from the workspace.',
    input_schema = z.object({ path = z.string() }):json_schema() } },
  output_schema = RESULT:json_schema(),
})

local function final_text(t)
  return { body = message({ text(t) }, 'end_turn') }
end

describe('anthropic_messages', function()
  local srv
  contract.serve(function(s) srv = s end)

  describe('failure modes', function()
    it('refuses a structured_output it does not know with INVALID_CONFIG', function()
      local base = { api_key = KEY, model = 'm', max_cost_micros = 1, pricing = PRICING }
      assert.raises_code('INVALID_CONFIG', anthropic.anthropic_messages,
        contract.with(base, { structured_output = 'prefill' }))
      assert.are.equal('tool', anthropic.anthropic_messages(contract.with(base, { structured_output = 'tool' }))
        ._config.structured_output)
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
end)
