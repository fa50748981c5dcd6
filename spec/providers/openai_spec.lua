-- mayura.provider.openai (Responses API) against the loopback stand-in
-- (spec/support/model_server.lua): what is its own, the requests sent, the
-- steps read back, its statuses and its prices for cached input. What every
-- model adapter does (errors, retries, cancellation, costs, the ceiling,
-- whole runs) is the contract of spec/support/model_contract.lua, run here
-- against the wire described by WIRE.
local openai = require('mayura.provider.openai')
local shared = require('mayura.provider._shared')
local json = require('mayura.core').json
local z = require('mayura').z
local contract = require('support.model_contract')

-- {======================================================
-- Bodies in the shapes of the Responses API
-- =======================================================

local function usage(input, output, cached)
  return string.format('{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,'
    .. '"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}', input, cached or 0, output, input + output)
end

local function response(items, usage_json, fields)
  return string.format('{"id":"resp_1","object":"response","created_at":1760000000,"model":"gpt-test",'
    .. '"status":"completed","error":null,"incomplete_details":null,"output":[%s],"usage":%s%s}',
    table.concat(items, ','), usage_json or usage(100, 20), fields or '')
end

local function fcall(call_id, name, arguments)
  return string.format('{"type":"function_call","id":"fc_%s","call_id":"%s","name":"%s","arguments":%s,'
    .. '"status":"completed"}', call_id, call_id, name, json.encode(arguments))
end

local function message(text)
  return '{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":'
    .. '[{"type":"output_text","annotations":[],"text":' .. json.encode(text) .. '}]}'
end

local REASONING = '{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAAB-enc"}'
local REASONING_BARE = '{"type":"reasoning","id":"rs_2","summary":[]}'

-- The API key, and the text of the API's error bodies (which holds it): neither may reach a message.
local KEY = 'sk-test-SECRET-5f1c0a9e77'
local API_TEXT = 'Incorrect API key provided: sk-test-SECRET-5f1c0a9e77. You can find your key at example.'

local function error_body(type_, code)
  return string.format('{"error":{"message":%s,"type":"%s","param":null,"code":%s}}', json.encode(API_TEXT), type_,
    code and ('"' .. code .. '"') or 'null')
end

-- }======================================================

-- The Responses API for the contract (see spec/support/model_contract.lua).
local WIRE = {
  name = 'openai_responses', new = openai.openai_responses, id = 'openai.responses', path = '/v1',
  key = KEY, secrets = { KEY, 'SECRET', 'Incorrect' }, required = { 'api_key', 'max_cost_micros', 'pricing' },
  output_field = 'max_output_tokens', max_retry_after_s = 120, tokens = { 'input_tokens', 'output_tokens' },
  usage = usage, kept = '"encrypted_content":"gAAAAB-enc"',
  final = function(text, usage_json) return { body = response({ message(text) }, usage_json) } end,
  -- a reasoning item first, as reasoning models give it
  calls = function(calls, usage_json)
    local items = { REASONING }
    for _, c in ipairs(calls) do items[#items + 1] = fcall(c.id, c.name, c.arguments) end
    return { body = response(items, usage_json) }
  end,
  -- what a request sends back of the conversation
  history = function(req, call, result)
    for _, item in ipairs(req.json.input) do
      if item.type == 'function_call' then
        call(item.call_id, item.arguments)
      elseif item.type == 'function_call_output' then
        result(item.call_id, item.output)
      end
    end
  end,
  refusal = function()
    return { body = response({ '{"type":"message","id":"msg_1","role":"assistant","status":"completed",'
      .. '"content":[{"type":"refusal","refusal":"I cannot help with that."}]}' }) }
  end,
  errors = {
    authentication = { body = error_body('invalid_request_error', 'invalid_api_key'), code = 'invalid_api_key' },
    permission = { body = error_body('permission_error', 'unsupported_country_region_territory'),
      code = 'unsupported_country_region_territory' },
    invalid_request = { body = error_body('invalid_request_error', 'missing_required_parameter'),
      code = 'missing_required_parameter' },
    rate_limit = { body = error_body('requests', 'rate_limit_exceeded'), code = 'rate_limit_exceeded' },
    quota = { body = error_body('insufficient_quota', 'insufficient_quota'), code = 'insufficient_quota' },
    unavailable = { status = 503, body = error_body('server_error'), code = 'server_error' },
  },
  malformed = {
    '{"output":null}', '{"output":"x"}', '{"output":[1]}',
    '{"output":[null]}', '{"status":"queued","output":[]}', '{"status":42,"output":[]}',
    '{"output":[{"type":"function_call"}]}', '{"output":[{"type":"function_call","call_id":5,"name":"x"}]}',
    '{"output":[{"type":"message","content":"x"}]}', '{"output":[{"type":"message","content":[1,null]}]}',
    '{"output":[{"type":"message","content":[{"type":"output_text","text":7}]}]}',
    '{"output":[],"usage":"lots"}', '{"output":[],"usage":{"input_tokens":-1,"output_tokens":"x"}}',
    '{"status":"incomplete","incomplete_details":"x"}', '{"status":"failed","error":"x"}',
    '{"output":[{"type":"function_call","call_id":"c","name":"n","arguments":{"a":1}}]}',
    '{"output":' .. string.rep('[', 300) .. '}',
  },
}

contract.run(WIRE)

-- The models of the cases below: 1.25 and 10 $ a million input and output tokens.
local PRICING = { input_micros_per_million_tokens = 1250000, output_micros_per_million_tokens = 10000000 }
local new_model, model_error = contract.kit(WIRE, { api_key = KEY, model = 'gpt-test', max_cost_micros = 50000,
  pricing = PRICING })

local function tool(id, input, description)
  return { id = id, description = description or ('The ' .. id .. ' tool.'), input_schema = input:json_schema() }
end

local RESULT = z.object({ summary = z.string(), files = z.array(z.string()) })

local request = contract.builder({
  instructions = 'You are a build agent.',
  messages = { { role = 'user', content = { task = 'Summarize README.md' } } },
  tools = { tool('workspace.read', z.object({ path = z.string() })) },
  output_schema = RESULT:json_schema(),
})

local function final_answer(text)
  return { status = 200, body = response({ message(text) }) }
end

describe('openai_responses', function()
  local srv
  contract.serve(function(s) srv = s end)

  describe('statuses', function()
    it('status incomplete: MODEL_ERROR incomplete, even with a function call in the output', function()
      local model = new_model()
      srv:push({ body = '{"id":"resp_1","object":"response","status":"incomplete","error":null,'
        .. '"incomplete_details":{"reason":"max_output_tokens"},"output":[' .. REASONING .. ','
        .. fcall('call_1', 'workspace_read', '{"path":') .. '],"usage":' .. usage(10, 4000) .. '}' })
      local err = model_error('incomplete', model.call, model, request())
      assert.are.equal('max_output_tokens', err.provider_code)
    end)

    it('status failed: MODEL_ERROR failed with the short code only', function()
      local model = new_model()
      srv:push({ body = '{"id":"resp_1","status":"failed","error":{"code":"server_error","message":'
        .. json.encode(API_TEXT) .. '},"output":[],"usage":null}' })
      local err = model_error('failed', model.call, model, request())
      assert.are.equal('server_error', err.provider_code)
    end)
  end)

  describe('requests', function()
    it('posts the documented request: headers, instructions, input, tools with strict, text.format', function()
      local model = new_model({ max_output_tokens = 4000 })
      srv:push(final_answer('{"summary":"A tiny CLI.","files":["README.md"]}'))
      local tools = {
        tool('workspace.read', z.object({ path = z.string(), max_bytes = z.integer():optional() })),
        tool('workspace.exec', z.object({ command = z.string() })),
        tool('a.b', z.object({})),
        tool('a_b', z.object({ x = z.union({ z.string(), z.number() }) })),
      }
      local step = model:call(request({ tools = tools }))
      assert.are.same({ summary = 'A tiny CLI.', files = { 'README.md' } }, step.output)
      local r = srv.requests[1]
      assert.are.equal('POST', r.method)
      assert.are.equal('/v1/responses', r.path)
      assert.are.equal('Bearer ' .. KEY, r.headers['authorization'])
      assert.are.equal('application/json', r.headers['content-type'])
      assert.are.same({
        model = 'gpt-test',
        instructions = 'You are a build agent.',
        store = false,
        include = { 'reasoning.encrypted_content' },
        max_output_tokens = 4000,
        input = { { type = 'message', role = 'user', content = '{"task":"Summarize README.md"}' } },
        tools = {
          { type = 'function', name = 'workspace_read', description = 'The workspace.read tool.', strict = false,
            parameters = { type = 'object', additionalProperties = false, required = { 'path' },
              properties = { path = { type = 'string' }, max_bytes = { type = 'integer' } } } },
          { type = 'function', name = 'workspace_exec', description = 'The workspace.exec tool.', strict = true,
            parameters = { type = 'object', additionalProperties = false, required = { 'command' },
              properties = { command = { type = 'string' } } } },
          { type = 'function', name = 'a_b', description = 'The a.b tool.', strict = true,
            parameters = { type = 'object', additionalProperties = false, required = {}, properties = {} } },
          { type = 'function', name = 'a_b_2', description = 'The a_b tool.', strict = true,
            parameters = { type = 'object', additionalProperties = false, required = { 'x' },
              properties = { x = { anyOf = { { type = 'string' }, { type = 'number' } } } } } },
        },
        text = { format = { type = 'json_schema', name = 'final_answer', strict = true,
          schema = { type = 'object', additionalProperties = false, required = { 'files', 'summary' },
            properties = { summary = { type = 'string' }, files = { type = 'array', items = { type = 'string' } } } } } },
      }, r.json)
      -- tool names map back to the tool ids
      srv:push({ body = response({ fcall('call_9', 'a_b_2', '{"x":1}'), fcall('call_10', 'a_b', '{}') }) })
      step = model:call(request({ tools = tools }))
      assert.are.equal('a_b', step.calls[1].tool_id)
      assert.are.equal('a.b', step.calls[2].tool_id)
    end)

    it('strict only when every object is closed and every property required', function()
      assert.is_true(shared.is_strict_schema(z.object({ a = z.array(z.object({ b = z.string() })) }):json_schema()))
      assert.is_false(shared.is_strict_schema(z.object({ a = z.string():optional() }):json_schema()))
      assert.is_false(shared.is_strict_schema(z.object({ a = z.string():default('x') }):json_schema()))
      assert.is_false(shared.is_strict_schema(z.object({ a = z.array(z.object({ b = z.string():optional() })) })
        :json_schema()))
      assert.is_false(shared.is_strict_schema(z.object({ a = z.any() }):json_schema()))
      assert.is_false(shared.is_strict_schema(z.string():json_schema()))
      assert.is_false(shared.is_strict_schema({ type = 'object', properties = { a = { type = 'string' } },
        required = { 'a' } }))
      assert.is_true(shared.is_strict_schema({ type = 'object', properties = { a = { ['$ref'] = '#/$defs/x' } },
        required = { 'a' }, additionalProperties = false, ['$defs'] = { x = { type = 'string' } } }))
      assert.is_false(shared.is_strict_schema({ type = 'object', properties = { a = { ['$ref'] = '#/$defs/x',
        description = 'd' } }, required = { 'a' }, additionalProperties = false }))
    end)

    it('no output schema: no text.format, and the final text is taken as it is or as JSON', function()
      local model = new_model()
      srv:push(final_answer('Just text.'), final_answer('{"a":1}'))
      local step = model:call(request({ output_schema = z.any():json_schema(), tools = {} }))
      assert.are.equal('Just text.', step.output)
      local body = srv.requests[1].json
      assert.is_nil(body.text)
      assert.is_nil(body.tools)
      step = model:call(request({ output_schema = {}, tools = {} }))
      assert.are.same({ a = 1 }, step.output)
    end)

    it('a string input is sent as it is; a non-object output schema is wrapped and unwrapped', function()
      local model = new_model()
      srv:push(final_answer('{"value":"done"}'))
      local step = model:call(request({ messages = { { role = 'user', content = 'Print 2 + 3.' } },
        output_schema = z.string():json_schema() }))
      assert.are.equal('done', step.output)
      local body = srv.requests[1].json
      assert.are.equal('Print 2 + 3.', body.input[1].content)
      assert.are.same({ type = 'object', properties = { value = { type = 'string' } }, required = { 'value' },
        additionalProperties = false }, body.text.format.schema)
      assert.is_true(body.text.format.strict)
    end)

    it('replays the output items of earlier steps and sends each tool result as function_call_output', function()
      local model = new_model()
      srv:push({ body = response({ REASONING, REASONING_BARE, message('Reading both files.'),
        fcall('call_A1', 'workspace_read', '{"path":"README.md"}'),
        fcall('call_A2', 'workspace_read', '{"path":"LICENSE"}') }) })
      local step = model:call(request())
      assert.are.equal('tool_calls', step.type)
      assert.are.equal('Reading both files.', step.text)
      assert.are.same({
        { id = 'call_A1', tool_id = 'workspace.read', input = { path = 'README.md' } },
        { id = 'call_A2', tool_id = 'workspace.read', input = { path = 'LICENSE' } },
      }, step.calls)
      local messages = {
        { role = 'user', content = { task = 'Summarize README.md' } },
        { role = 'assistant', calls = step.calls, text = step.text, extra = step.extra },
        { role = 'tool', call_id = 'call_A1', tool_id = 'workspace.read', result = { text = '# Demo\nA tiny CLI.' } },
        { role = 'tool', call_id = 'call_A2', tool_id = 'workspace.read',
          result = { error = { code = 'TOOL_ERROR', message = 'file not found' } } },
      }
      srv:push(final_answer('{"summary":"A tiny CLI.","files":["README.md"]}'))
      model:call(request({ messages = messages }))
      local input = srv.requests[2].json.input
      assert.are.same({
        { type = 'message', role = 'user', content = '{"task":"Summarize README.md"}' },
        { type = 'reasoning', id = 'rs_1', summary = {}, encrypted_content = 'gAAAAB-enc' },
        { type = 'message', id = 'msg_1', role = 'assistant', status = 'completed',
          content = { { type = 'output_text', annotations = {}, text = 'Reading both files.' } } },
        { type = 'function_call', id = 'fc_call_A1', call_id = 'call_A1', name = 'workspace_read',
          arguments = '{"path":"README.md"}', status = 'completed' },
        { type = 'function_call', id = 'fc_call_A2', call_id = 'call_A2', name = 'workspace_read',
          arguments = '{"path":"LICENSE"}', status = 'completed' },
        { type = 'function_call_output', call_id = 'call_A1', output = '{"text":"# Demo\\nA tiny CLI."}' },
        { type = 'function_call_output', call_id = 'call_A2', output = input[7].output },
      }, input)
      assert.are.same({ error = { code = 'TOOL_ERROR', message = 'file not found' } }, json.decode(input[7].output))
      -- empty arrays stay arrays on the wire
      assert.truthy(srv.requests[2].body:find('"summary":[]', 1, true))
    end)

    it('without kept items, rebuilds function_call items from the calls', function()
      local model = new_model()
      srv:push(final_answer('{"summary":"s","files":[]}'))
      model:call(request({ messages = {
        { role = 'user', content = { task = 't' } },
        { role = 'assistant', text = 'Let me look.', calls = { { id = 'c1', tool_id = 'workspace.read',
          input = { path = 'a' } } } },
        { role = 'tool', call_id = 'c1', tool_id = 'workspace.read', result = {} },
      } }))
      local input = srv.requests[1].json.input
      assert.are.same({ type = 'message', role = 'assistant', content = 'Let me look.' }, input[2])
      assert.are.same({ type = 'function_call', call_id = 'c1', name = 'workspace_read', arguments = '{"path":"a"}' },
        input[3])
      assert.are.same({ type = 'function_call_output', call_id = 'c1', output = '{}' }, input[4])
    end)
  end)

  describe('cost', function()
    it('cached input is counted at the input price when no cached price is given', function()
      local model = new_model()
      -- 812 input (512 cached) at 1.25 $/MTok, 96 output at 10 $/MTok: 1015 + 960 = 1975 micros
      srv:push({ body = response({ message('{"summary":"s","files":[]}') }, usage(812, 96, 512)) })
      local step = model:call(request())
      assert.are.equal(1975, step.usage.cost_micros)
      assert.are.equal(812, step.usage.input_tokens)
      assert.are.equal(96, step.usage.output_tokens)
      assert.are.equal(512, step.usage.cached_tokens)
    end)

    it('cached input at its own price when given', function()
      local model = new_model({ pricing = { input_micros_per_million_tokens = 1250000,
        output_micros_per_million_tokens = 10000000, cached_input_micros_per_million_tokens = 125000 } })
      -- 300 * 1.25 + 512 * 0.125 + 96 * 10 = 375 + 64 + 960
      srv:push({ body = response({ message('{"summary":"s","files":[]}') }, usage(812, 96, 512)) })
      assert.are.equal(1399, model:call(request()).usage.cost_micros)
    end)
  end)
end)
