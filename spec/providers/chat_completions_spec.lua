-- mayura.provider.openai (Chat Completions, as OpenAI, llama.cpp, Ollama and
-- vLLM serve it) against the loopback stand-in (spec/support/model_server.lua):
-- what is its own (no key, no pricing and no ceiling needed, the error bodies
-- of local servers, finish reasons, the requests sent). What every model
-- adapter does is the contract of spec/support/model_contract.lua, run here
-- against the wire described by WIRE.
local openai = require('mayura.provider.openai')
local mayura = require('mayura')
local json = require('mayura.core').json
local contract = require('support.model_contract')

local z = mayura.z

-- {======================================================
-- Bodies in the shapes of Chat Completions
-- =======================================================

local function usage(prompt, completion, cached)
  return string.format('{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,'
    .. '"prompt_tokens_details":{"cached_tokens":%d},"completion_tokens_details":{"reasoning_tokens":0}}',
    prompt, completion, prompt + completion, cached or 0)
end

local function completion(message, finish, usage_json)
  return string.format('{"id":"chatcmpl-1","object":"chat.completion","created":1760000000,"model":"qwen-test",'
    .. '"choices":[{"index":0,"finish_reason":"%s","message":%s}],"usage":%s}', finish, message,
    usage_json or usage(120, 18))
end

local function tool_call(id, name, arguments)
  return string.format('{"id":%s,"type":"function","function":{"name":"%s","arguments":%s}}',
    id and ('"' .. id .. '"') or 'null', name, json.encode(arguments))
end

local function calls_message(calls, content, usage_json)
  return completion(string.format('{"role":"assistant","content":%s,"refusal":null,"tool_calls":[%s]}',
    content and json.encode(content) or 'null', table.concat(calls, ',')), 'tool_calls', usage_json)
end

local function text_message(text, finish, usage_json)
  return completion('{"role":"assistant","content":' .. json.encode(text) .. ',"refusal":null}', finish or 'stop',
    usage_json)
end

-- The API key, and the text of the API's error bodies (which holds it): neither may reach a message.
local KEY = 'sk-local-SECRET-42d1e0'
local API_TEXT = 'Invalid API key sk-local-SECRET-42d1e0 for this server.'

-- An error body as llama.cpp and OpenAI give it.
local function error_body(status, type_)
  return '{"error":{"code":' .. status .. ',"message":' .. json.encode(API_TEXT) .. ',"type":"' .. type_ .. '"}}'
end

-- }======================================================

-- Chat Completions for the contract (see spec/support/model_contract.lua).
local WIRE = {
  name = 'openai_chat_completions', new = openai.openai_chat_completions, id = 'openai.chat', path = '/v1',
  key = KEY, secrets = { KEY, 'SECRET', 'Invalid API key' }, required = {},
  output_field = 'max_tokens', max_retry_after_s = 120, tokens = { 'prompt_tokens', 'completion_tokens' },
  usage = usage,
  final = function(text, usage_json) return { body = text_message(text, 'stop', usage_json) } end,
  calls = function(calls, usage_json)
    local list = {}
    for i, c in ipairs(calls) do list[i] = tool_call(c.id, c.name, c.arguments) end
    return { body = calls_message(list, nil, usage_json) }
  end,
  -- what a request sends back of the conversation
  history = function(req, call, result)
    for _, m in ipairs(req.json.messages) do
      if m.role == 'assistant' then
        for _, tc in ipairs(m.tool_calls) do call(tc.id, tc['function'].arguments) end
      elseif m.role == 'tool' then
        result(m.tool_call_id, m.content)
      end
    end
  end,
  refusal = function()
    return { body = completion('{"role":"assistant","content":null,"refusal":"I cannot help."}', 'stop') }
  end,
  errors = {
    authentication = { body = error_body(401, 'authentication_error'), code = 'authentication_error' },
    permission = { body = error_body(403, 'permission_error'), code = 'permission_error' },
    invalid_request = { body = error_body(400, 'invalid_request_error'), code = 'invalid_request_error' },
    rate_limit = { body = '{"error":{"type":"rate_limit"}}', code = 'rate_limit' },
    quota = { body = '{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota",'
      .. '"code":"insufficient_quota"}}', code = 'insufficient_quota' },
    -- a model still loading
    unavailable = { status = 503, body = '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
      code = 'unavailable_error' },
  },
  malformed = {
    '{"choices":[]}', '{"choices":[1]}', '{"choices":[{"message":"x"}]}',
    '{"choices":[{"message":{"tool_calls":[1]}}]}', '{"choices":[{"message":{"tool_calls":[{"function":1}]}}]}',
    '{"choices":[{"message":{"tool_calls":[{"function":{"name":7}}]}}]}',
    '{"choices":[{"message":{"tool_calls":"x","content":5}}]}',
    '{"choices":[{"message":{"content":[{"type":"text","text":"{}"},3]}}]}',
    '{"choices":[{"finish_reason":7,"message":{}}],"usage":[1]}',
  },
}

contract.run(WIRE)

local new_model, model_error = contract.kit(WIRE, { model = 'qwen-test' })

local RESULT = z.object({ summary = z.string() })

local request = contract.builder({
  instructions = 'You are a build agent.',
  messages = { { role = 'user', content = { task = 'Summarize README.md' } } },
  tools = { { id = 'workspace.read', description = 'Read a UTF-8 text file.',
    input_schema = z.object({ path = z.string() }):json_schema() } },
  output_schema = RESULT:json_schema(),
})

describe('openai_chat_completions', function()
  local srv
  contract.serve(function(s) srv = s end)

  describe('failure modes', function()
    it('needs nothing but a model: no key, no pricing, no ceiling', function()
      local model = openai.openai_chat_completions({ model = 'm' })
      assert.are.equal('openai.chat', model.id)
      assert.are.equal(0, model.max_cost_micros)
    end)

    it('the error bodies of vLLM and Ollama give their short code', function()
      local model = new_model({ api_key = KEY })
      -- old vLLM: a top-level error object
      srv:push({ status = 400, body = '{"object":"error","message":' .. json.encode(API_TEXT)
        .. ',"type":"BadRequestError","param":null,"code":400}' })
      local err = model_error('invalid_request', model.call, model, request())
      assert.are.equal('BadRequestError', err.provider_code)
      -- Ollama: an unknown model
      srv:push({ status = 404, body = '{"error":{"message":"model \\"qwen-test\\" not found, try pulling it first",'
        .. '"type":"not_found_error","param":null,"code":null}}' })
      err = model_error('invalid_request', model.call, model, request())
      assert.are.equal('not_found_error', err.provider_code)
      assert.is_nil(err.message:find('pulling', 1, true))
      assert.are.equal(2, #srv.requests)
    end)

    it('finish_reason length or content_filter: incomplete, even with tool calls', function()
      local model = new_model()
      srv:push({ body = text_message('{"summary":"trunc', 'length') })
      local err = model_error('incomplete', model.call, model, request())
      assert.are.equal('length', err.provider_code)
      srv:push({ body = completion('{"role":"assistant","content":null,"tool_calls":[' .. tool_call('c1',
        'workspace_read', '{"path":"RE') .. ']}', 'length') })
      model_error('incomplete', model.call, model, request())
      srv:push({ body = text_message('', 'content_filter') })
      model_error('incomplete', model.call, model, request())
    end)
  end)

  describe('requests', function()
    it('posts messages, nested tools with strict, response_format json_schema and max_tokens', function()
      local model = new_model({ api_key = KEY, max_tokens = 2000 })
      srv:push({ body = text_message('{"summary":"A tiny CLI."}') })
      local step = model:call(request({ tools = {
        { id = 'workspace.read', description = 'Read a UTF-8 text file.',
          input_schema = z.object({ path = z.string() }):json_schema() },
        { id = 'workspace.list', description = '', input_schema = z.object({ path = z.string():optional() })
          :json_schema() },
      } }))
      assert.are.same({ summary = 'A tiny CLI.' }, step.output)
      local r = srv.requests[1]
      assert.are.equal('POST', r.method)
      assert.are.equal('/v1/chat/completions', r.path)
      assert.are.equal('Bearer ' .. KEY, r.headers['authorization'])
      assert.are.equal('application/json', r.headers['content-type'])
      assert.are.same({
        model = 'qwen-test',
        max_tokens = 2000,
        parallel_tool_calls = true,
        messages = {
          { role = 'system', content = 'You are a build agent.' },
          { role = 'user', content = '{"task":"Summarize README.md"}' },
        },
        tools = {
          { type = 'function', ['function'] = { name = 'workspace_read', description = 'Read a UTF-8 text file.',
            strict = true, parameters = { type = 'object', properties = { path = { type = 'string' } },
              required = { 'path' }, additionalProperties = false } } },
          { type = 'function', ['function'] = { name = 'workspace_list', strict = false,
            parameters = { type = 'object', properties = { path = { type = 'string' } },
              required = {}, additionalProperties = false } } },
        },
        response_format = { type = 'json_schema', json_schema = { name = 'final_answer', strict = true,
          schema = { type = 'object', properties = { summary = { type = 'string' } }, required = { 'summary' },
            additionalProperties = false } } },
      }, r.json)
    end)

    it('sends no Authorization without a key, no tools and no response_format when there are none', function()
      local model = new_model()
      srv:push({ body = text_message('plain words') })
      local step = model:call(request({ tools = {}, output_schema = {}, instructions = '' }))
      assert.are.equal('plain words', step.output)
      local r = srv.requests[1]
      assert.is_nil(r.headers['authorization'])
      assert.are.same({ model = 'qwen-test', messages = { { role = 'user',
        content = '{"task":"Summarize README.md"}' } } }, r.json)
    end)

    it('reads tool calls, and sends the history back as assistant tool_calls and tool messages', function()
      local model = new_model()
      srv:push({ body = calls_message({ tool_call('call_A1', 'workspace_read', '{"path":"README.md"}'),
        tool_call(nil, 'workspace_read', '{"path":"LICENSE"}') }, '') })
      local step = model:call(request())
      assert.are.same({
        { id = 'call_A1', tool_id = 'workspace.read', input = { path = 'README.md' } },
        { id = 'call_1_2', tool_id = 'workspace.read', input = { path = 'LICENSE' } },
      }, step.calls)
      assert.is_nil(step.text)
      srv:push({ body = text_message('{"summary":"A tiny CLI."}') })
      model:call(request({ messages = {
        { role = 'user', content = { task = 'Summarize README.md' } },
        { role = 'assistant', calls = step.calls, extra = step.extra },
        { role = 'tool', call_id = 'call_A1', tool_id = 'workspace.read', result = { text = '# Demo' } },
        { role = 'tool', call_id = 'call_1_2', tool_id = 'workspace.read', result = { text = 'MIT' } },
      } }))
      local messages = srv.requests[2].json.messages
      assert.are.same({
        { role = 'system', content = 'You are a build agent.' },
        { role = 'user', content = '{"task":"Summarize README.md"}' },
        { role = 'assistant', content = json.null, tool_calls = {
          { id = 'call_A1', type = 'function', ['function'] = { name = 'workspace_read',
            arguments = '{"path":"README.md"}' } },
          { id = 'call_1_2', type = 'function', ['function'] = { name = 'workspace_read',
            arguments = '{"path":"LICENSE"}' } },
        } },
        { role = 'tool', tool_call_id = 'call_A1', content = '{"text":"# Demo"}' },
        { role = 'tool', tool_call_id = 'call_1_2', content = '{"text":"MIT"}' },
      }, messages)
      assert.truthy(srv.requests[2].body:find('"content":null', 1, true))
    end)

    it('costs 0 without pricing, and is priced like OpenAI with it', function()
      local model = new_model()
      srv:push({ body = text_message('{"summary":"s"}') })
      local step = model:call(request())
      assert.are.equal(0, step.usage.cost_micros)
      assert.are.equal(120, step.usage.input_tokens)
      model = new_model({ max_cost_micros = 500, pricing = { input_micros_per_million_tokens = 150000,
        output_micros_per_million_tokens = 600000 } })
      -- 1000 * 0.15 + 300 * 0.6 = 150 + 180
      srv:push({ body = completion('{"role":"assistant","content":"{\\"summary\\":\\"s\\"}"}', 'stop',
        usage(1000, 300)) })
      assert.are.equal(330, model:call(request()).usage.cost_micros)
      -- Ollama sends no details; a server that sends no usage is charged the reservation
      srv:push({ body = '{"choices":[{"finish_reason":"stop","message":{"role":"assistant",'
        .. '"content":"{\\"summary\\":\\"s\\"}"}}]}' })
      assert.are.equal(500, model:call(request()).usage.cost_micros)
    end)

    it('without pricing, or without a ceiling, max_tokens is not capped (a local server)', function()
      local pricing = { input_micros_per_million_tokens = 150000, output_micros_per_million_tokens = 600000 }
      srv:push({ body = text_message('{"summary":"s"}') }, { body = text_message('{"summary":"s"}') })
      new_model({ pricing = pricing }):call(request())
      assert.is_nil(srv.requests[1].json.max_tokens)
      new_model({ max_cost_micros = 500 }):call(request())
      assert.is_nil(srv.requests[2].json.max_tokens)
    end)
  end)

  describe('in a run', function()
    local GRANTS = { 'model:openai.chat', 'tool:notes.add', 'effect:write' }

    local function agent(model, added)
      return mayura.define_agent({
        id = 'adder', version = '1', instructions = 'Add the numbers with the tool.',
        input = z.object({ numbers = z.array(z.number()) }), output = z.object({ total = z.number() }),
        model = model,
        tools = { {
          id = 'notes.add', description = 'Add two numbers.', effect = 'write',
          input = z.object({ a = z.number(), b = z.number() }),
          run = function(input)
            added[#added + 1] = input
            return { sum = input.a + input.b }
          end,
        } },
      })
    end

    it('runs end to end against a local server', function()
      srv:push({ body = calls_message({ tool_call('c1', 'notes_add', '{"a":2,"b":3}') }) })
      srv:push(function(req)
        local last = req.json.messages[#req.json.messages]
        assert.are.same({ role = 'tool', tool_call_id = 'c1', content = '{"sum":5}' }, last)
        return { body = text_message('{"total":5}') }
      end)
      local added = {}
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local outcome = runtime:submit(agent(new_model(), added), { input = { numbers = { 2, 3 } } }):result()
      runtime:close()
      assert.are.equal('succeeded', outcome.status, outcome.error and outcome.error.message)
      assert.are.same({ total = 5 }, outcome.output)
      assert.are.same({ { a = 2, b = 3 } }, added)
      assert.are.equal(0, outcome.usage.cost_micros)
      assert.are.equal('{"numbers":[2,3]}', srv.requests[1].json.messages[2].content)
    end)
  end)
end)
