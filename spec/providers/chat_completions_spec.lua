-- mayura.provider.openai (Chat Completions, as OpenAI, llama.cpp, Ollama and
-- vLLM serve it) against the loopback stand-in (spec/support/model_server.lua).
local openai = require('mayura.provider.openai')
local mayura = require('mayura')
local core = require('mayura.core')
local uv = require('luv')
local model_server = require('support.model_server')

local json = core.json
local z = mayura.z

local KEY = 'sk-local-SECRET-42d1e0'
local API_TEXT = 'Invalid API key sk-local-SECRET-42d1e0 for this server.'


local function model_error(reason, fn, ...)
  local err = assert.raises_code('MODEL_ERROR', fn, ...)
  assert.are.equal(reason, err.reason, err.message)
  assert.is_nil(err.message:find('SECRET', 1, true))
  assert.is_nil(err.message:find('Invalid API key', 1, true))
  return err
end

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

local function calls_message(calls, content)
  return completion(string.format('{"role":"assistant","content":%s,"refusal":null,"tool_calls":[%s]}',
    content and json.encode(content) or 'null', table.concat(calls, ',')), 'tool_calls')
end

local function text_message(text, finish)
  return completion('{"role":"assistant","content":' .. json.encode(text) .. ',"refusal":null}', finish or 'stop')
end

-- }======================================================

local srv

local function new_model(options)
  local o = { model = 'qwen-test', base_url = srv:url('/v1'), retry_base_ms = 1 }
  for k, v in pairs(options or {}) do o[k] = v end
  return openai.openai_chat_completions(o)
end

local RESULT = z.object({ summary = z.string() })

local function request(fields)
  local r = {
    instructions = 'You are a build agent.',
    messages = { { role = 'user', content = { task = 'Summarize README.md' } } },
    tools = { { id = 'workspace.read', description = 'Read a UTF-8 text file.',
      input_schema = z.object({ path = z.string() }):json_schema() } },
    output_schema = RESULT:json_schema(),
  }
  for k, v in pairs(fields or {}) do r[k] = v end
  return r
end

describe('openai_chat_completions', function()
  before_each(function() srv = model_server.new() end)

  after_each(function()
    srv:close()
    uv.new_timer():close()
    core.run_once()
  end)

  describe('failure modes', function()
    it('refuses bad options with INVALID_CONFIG', function()
      assert.raises_code('INVALID_CONFIG', openai.openai_chat_completions, {})
      assert.raises_code('INVALID_CONFIG', openai.openai_chat_completions, { model = 'm', api_key = '' })
      assert.raises_code('INVALID_CONFIG', openai.openai_chat_completions, { model = 'm', base_url = 'localhost:8080' })
      assert.raises_code('INVALID_CONFIG', openai.openai_chat_completions, { model = 'm', max_tokens = 0 })
      assert.raises_code('INVALID_CONFIG', openai.openai_chat_completions, { model = 'm', tool_choice = 'auto' })
      local model = openai.openai_chat_completions({ model = 'm' })
      assert.are.equal('openai.chat', model.id)
      assert.are.equal(0, model.max_cost_micros)
    end)

    it('401: authentication; llama.cpp and vLLM error bodies give their short code', function()
      local model = new_model({ api_key = KEY })
      srv:push({ status = 401, body = '{"error":{"code":401,"message":' .. json.encode(API_TEXT)
        .. ',"type":"authentication_error"}}' })
      local err = model_error('authentication', model.call, model, request())
      assert.are.equal('authentication_error', err.provider_code)
      -- old vLLM: a top-level error object
      srv:push({ status = 400, body = '{"object":"error","message":' .. json.encode(API_TEXT)
        .. ',"type":"BadRequestError","param":null,"code":400}' })
      err = model_error('invalid_request', model.call, model, request())
      assert.are.equal('BadRequestError', err.provider_code)
      -- Ollama: an unknown model
      srv:push({ status = 404, body = '{"error":{"message":"model \\"qwen-test\\" not found, try pulling it first",'
        .. '"type":"not_found_error","param":null,"code":null}}' })
      err = model_error('invalid_request', model.call, model, request())
      assert.are.equal('not_found_error', err.provider_code)
      assert.is_nil(err.message:find('pulling', 1, true))
      assert.are.equal(3, #srv.requests)
    end)

    it('429 with retry-after, then success; 503 (a model still loading) retried, then unavailable', function()
      local model = new_model({ max_retries = 1 })
      srv:push({ status = 429, headers = { ['retry-after'] = '0.2' }, body = '{"error":{"type":"rate_limit"}}' },
        { body = text_message('{"summary":"ok"}') })
      assert.are.same({ summary = 'ok' }, model:call(request()).output)
      srv:push({ status = 503, body = '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}' },
        { status = 503, body = '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}' })
      local err = model_error('unavailable', model.call, model, request())
      assert.are.equal('unavailable_error', err.provider_code)
      assert.are.equal(4, #srv.requests)
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

    it('a refusal: refused; an answer that is not JSON: invalid_output', function()
      local model = new_model()
      srv:push({ body = completion('{"role":"assistant","content":null,"refusal":"I cannot help."}', 'stop') })
      model_error('refused', model.call, model, request())
      srv:push({ body = text_message('Sure! The summary is: a CLI.') })
      model_error('invalid_output', model.call, model, request())
    end)

    it('arguments that are not JSON become a marked input, and the next request says so', function()
      local model = new_model()
      srv:push({ body = calls_message({ tool_call('c1', 'workspace_read', "{'path': 'README.md'}") }) })
      local step = model:call(request())
      assert.are.same({ _invalid_json = "{'path': 'README.md'}" }, step.calls[1].input)
      srv:push({ body = text_message('{"summary":"s"}') })
      model:call(request({ messages = {
        { role = 'user', content = { task = 't' } },
        { role = 'assistant', calls = step.calls, extra = step.extra },
        { role = 'tool', call_id = 'c1', tool_id = 'workspace.read',
          result = { error = { code = 'INVALID_INPUT', message = 'path: expected a string, got nil' } } },
      } }))
      local messages = srv.requests[2].json.messages
      assert.are.equal("{'path': 'README.md'}", messages[3].tool_calls[1]['function'].arguments)
      local out = json.decode(messages[4].content)
      assert.truthy(out.error.message:find('not valid JSON', 1, true))
    end)

    it('never crashes on a body of the wrong shape', function()
      local model = new_model()
      local bodies = {
        '', '[]', '{}', '{"choices":[]}', '{"choices":[1]}', '{"choices":[{"message":"x"}]}',
        '{"choices":[{"message":{"tool_calls":[1]}}]}', '{"choices":[{"message":{"tool_calls":[{"function":1}]}}]}',
        '{"choices":[{"message":{"tool_calls":[{"function":{"name":7}}]}}]}',
        '{"choices":[{"message":{"tool_calls":"x","content":5}}]}',
        '{"choices":[{"message":{"content":[{"type":"text","text":"{}"},3]}}]}',
        '{"choices":[{"finish_reason":7,"message":{}}],"usage":[1]}',
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

    it('with pricing and max_cost_micros, max_tokens comes down to what the ceiling leaves', function()
      local pricing = { input_micros_per_million_tokens = 150000, output_micros_per_million_tokens = 600000 }
      srv:push({ body = text_message('{"summary":"s"}') }, { body = text_message('{"summary":"s"}') },
        { body = text_message('{"summary":"s"}') })
      new_model({ max_cost_micros = 500, pricing = pricing }):call(request())
      local r = srv.requests[1]
      local sent = r.json.max_tokens
      local input = #r.body - #(',"max_tokens":' .. sent) + require('mayura.provider._shared').INPUT_ALLOWANCE_TOKENS
      assert.are.equal(math.floor((500 * 1000000 - input * 150000) / 600000), sent)
      -- a max_tokens of its own below that is kept
      new_model({ max_cost_micros = 500, pricing = pricing, max_tokens = 50 }):call(request())
      assert.are.equal(50, srv.requests[2].json.max_tokens)
      -- no pricing, or no ceiling: nothing is capped (a local server)
      new_model({ pricing = pricing }):call(request())
      assert.is_nil(srv.requests[3].json.max_tokens)
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

    it('a refused key ends the run failed with MODEL_ERROR', function()
      srv:push({ status = 401, body = '{"error":{"code":401,"message":' .. json.encode(API_TEXT)
        .. ',"type":"authentication_error"}}' })
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local outcome = runtime:submit(agent(new_model({ api_key = KEY }), {}), { input = { numbers = { 1 } } }):result()
      runtime:close()
      assert.are.equal('failed', outcome.status)
      assert.are.equal('MODEL_ERROR', outcome.error.code)
      assert.are.equal('authentication', outcome.error.reason)
      assert.is_nil(outcome.error.message:find('SECRET', 1, true))
      assert.is_nil(outcome.error.message:find('Invalid API key', 1, true))
    end)
  end)
end)
