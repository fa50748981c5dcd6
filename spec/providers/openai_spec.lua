-- mayura.provider.openai (Responses API) against the loopback stand-in
-- (spec/support/model_server.lua): the requests sent, the steps read back,
-- the costs, the retries and every failure, then whole runs.
local openai = require('mayura.provider.openai')
local shared = require('mayura.provider._shared')
local mayura = require('mayura')
local task = require('mayura._task')
local core = require('mayura.core')
local uv = require('luv')
local model_server = require('support.model_server')

local json = core.json
local z = mayura.z

local KEY = 'sk-test-SECRET-5f1c0a9e77'
-- The text an error body carries; it must never reach a message.
local API_TEXT = 'Incorrect API key provided: sk-test-SECRET-5f1c0a9e77. You can find your key at example.'
local PRICING = { input_micros_per_million_tokens = 1250000, output_micros_per_million_tokens = 10000000 }


-- A MODEL_ERROR with `reason` whose message has neither the key nor the API's text.
local function model_error(reason, fn, ...)
  local err = assert.raises_code('MODEL_ERROR', fn, ...)
  assert.are.equal(reason, err.reason, err.message)
  assert.is_nil(err.message:find(KEY, 1, true))
  assert.is_nil(err.message:find('Incorrect', 1, true))
  assert.is_nil(err.message:find('SECRET', 1, true))
  return err
end

local function ms_since(t0)
  return (uv.hrtime() - t0) / 1e6
end

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

local function error_body(type_, code)
  return string.format('{"error":{"message":%s,"type":"%s","param":null,"code":%s}}', json.encode(API_TEXT), type_,
    code and ('"' .. code .. '"') or 'null')
end

-- }======================================================

local srv

local function new_model(options)
  local o = { api_key = KEY, model = 'gpt-test', base_url = srv:url('/v1'), max_cost_micros = 50000,
    pricing = PRICING, retry_base_ms = 1 }
  for k, v in pairs(options or {}) do o[k] = v end
  return openai.openai_responses(o)
end

local function tool(id, input, description)
  return { id = id, description = description or ('The ' .. id .. ' tool.'), input_schema = input:json_schema() }
end

local TASK = z.object({ task = z.string() })
local RESULT = z.object({ summary = z.string(), files = z.array(z.string()) })

local function request(fields)
  local r = {
    instructions = 'You are a build agent.',
    messages = { { role = 'user', content = { task = 'Summarize README.md' } } },
    tools = { tool('workspace.read', z.object({ path = z.string() })) },
    output_schema = RESULT:json_schema(),
  }
  for k, v in pairs(fields or {}) do r[k] = v end
  return r
end

local function final_answer(text)
  return { status = 200, body = response({ message(text) }) }
end

describe('openai_responses', function()
  before_each(function() srv = model_server.new() end)

  after_each(function()
    srv:close()
    -- run the pending close callbacks: luv 1.44 crashes at exit on a handle still closing
    uv.new_timer():close()
    core.run_once()
  end)

  describe('failure modes', function()
    it('refuses bad options with INVALID_CONFIG, never echoing the key', function()
      local base = { api_key = KEY, model = 'm', max_cost_micros = 1, pricing = PRICING }
      local function with(k, v)
        local o = {}
        for key, val in pairs(base) do o[key] = val end
        o[k] = v
        return o
      end
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, nil)
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('api_key', nil))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('api_key', ''))
      local err = assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('api_key', KEY .. '\r\nX-Evil: 1'))
      assert.is_nil(err.message:find('SECRET', 1, true))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('model', nil))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('max_cost_micros', nil))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('max_cost_micros', -1))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('max_cost_micros', 1.5))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('pricing', nil))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('pricing', { input_micros_per_million_tokens = 1 }))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses,
        with('pricing', { input_micros_per_million_tokens = 1, output_micros_per_million_tokens = 1, extra = 1 }))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('base_url', 'ftp://example.com'))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('base_url', 'https://exa mple.com'))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('timeout_ms', 0))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('max_retries', 11))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('max_output_tokens', 0))
      assert.raises_code('INVALID_CONFIG', openai.openai_responses, with('temperature', 1))
      local model = openai.openai_responses(base)
      assert.are.equal('openai.responses', model.id)
      assert.are.equal(1, model.max_cost_micros)
      -- the key is not a field of the model, nor of its config
      for _, t in ipairs({ model, model._config }) do
        for _, v in pairs(t) do assert.are_not.equal(KEY, v) end
      end
    end)

    it('401 and 403: MODEL_ERROR authentication, no retry, neither key nor API text in the message', function()
      local model = new_model()
      srv:push({ status = 401, body = error_body('invalid_request_error', 'invalid_api_key') })
      local err = model_error('authentication', model.call, model, request())
      assert.are.equal(401, err.status)
      assert.are.equal('invalid_api_key', err.provider_code)
      assert.are.equal(1, #srv.requests)
      srv:push({ status = 403, body = error_body('permission_error', 'unsupported_country_region_territory') })
      err = model_error('authentication', model.call, model, request())
      assert.are.equal(403, err.status)
      assert.are.equal(2, #srv.requests)
    end)

    it('a code that carries the key is left out', function()
      local model = new_model()
      srv:push({ status = 401, body = '{"error":{"message":"x","type":"t","code":"' .. KEY .. '"}}' })
      local err = model_error('authentication', model.call, model, request())
      assert.are.equal('t', err.provider_code)
    end)

    it('400, 404 and 422: invalid_request, not retried', function()
      local model = new_model()
      for _, status in ipairs({ 400, 404, 422 }) do
        srv:push({ status = status, body = error_body('invalid_request_error', 'missing_required_parameter') })
        local err = model_error('invalid_request', model.call, model, request())
        assert.are.equal(status, err.status)
      end
      assert.are.equal(3, #srv.requests)
    end)

    it('429 honours retry-after-ms and retry-after in seconds, then succeeds', function()
      local model = new_model()
      srv:push({ status = 429, headers = { ['retry-after-ms'] = '300' }, body = error_body('requests',
        'rate_limit_exceeded') }, final_answer('{"summary":"ok","files":[]}'))
      local t0 = uv.hrtime()
      local step = model:call(request())
      assert.is_true(ms_since(t0) >= 280)
      assert.are.equal('final', step.type)
      assert.are.equal(2, #srv.requests)
      srv:push({ status = 429, headers = { ['retry-after'] = '1' }, body = error_body('tokens', 'rate_limit_exceeded') },
        final_answer('{"summary":"ok","files":[]}'))
      t0 = uv.hrtime()
      step = model:call(request())
      assert.is_true(ms_since(t0) >= 950)
      assert.are.equal('final', step.type)
      assert.are.equal(4, #srv.requests)
      -- the same bytes every attempt
      assert.are.equal(srv.requests[3].body, srv.requests[4].body)
    end)

    it('429 past max_retries ends rate_limited; an HTTP date in the past means backoff', function()
      local model = new_model({ max_retries = 2 })
      local past = 'Sun, 06 Nov 1994 08:49:37 GMT'
      for _ = 1, 3 do
        srv:push({ status = 429, headers = { ['retry-after'] = past }, body = error_body('requests',
          'rate_limit_exceeded') })
      end
      local err = model_error('rate_limited', model.call, model, request())
      assert.are.equal(429, err.status)
      assert.are.equal('rate_limit_exceeded', err.provider_code)
      assert.are.equal(3, #srv.requests)
    end)

    it('429 insufficient_quota, or a retry-after over 120 s, is not retried', function()
      local model = new_model()
      srv:push({ status = 429, body = error_body('insufficient_quota', 'insufficient_quota') })
      model_error('rate_limited', model.call, model, request())
      assert.are.equal(1, #srv.requests)
      srv:push({ status = 429, headers = { ['retry-after'] = '600' }, body = error_body('requests',
        'rate_limit_exceeded') })
      model_error('rate_limited', model.call, model, request())
      assert.are.equal(2, #srv.requests)
      -- x-should-retry: false overrides the status
      srv:push({ status = 503, headers = { ['x-should-retry'] = 'false' }, body = error_body('server_error') })
      model_error('unavailable', model.call, model, request())
      assert.are.equal(3, #srv.requests)
    end)

    it('a wait for retry-after ends at once, CANCELLED, when the run is cancelled', function()
      local model = new_model()
      srv:push({ status = 429, headers = { ['retry-after'] = '30' }, body = error_body('requests',
        'rate_limit_exceeded') })
      local token = task.cancel_token()
      local timer = uv.new_timer()
      uv.update_time()
      timer:start(80, 0, function()
        timer:close()
        token:cancel()
      end)
      assert.raises_code('CANCELLED', model.call, model, request({ signal = token }))
      assert.are.equal(1, #srv.requests)
      -- a cancelled token: nothing is sent
      assert.raises_code('CANCELLED', model.call, model, request({ signal = token }))
      assert.are.equal(1, #srv.requests)
    end)

    it('5xx is retried with backoff, then ends unavailable', function()
      local model = new_model({ max_retries = 2 })
      srv:push({ status = 500, body = error_body('server_error') }, { status = 503, body = 'not json at all' },
        final_answer('{"summary":"ok","files":[]}'))
      local step = model:call(request())
      assert.are.equal('final', step.type)
      assert.are.equal(3, #srv.requests)
      for _ = 1, 3 do srv:push({ status = 502, body = '' }) end
      local err = model_error('unavailable', model.call, model, request())
      assert.are.equal(502, err.status)
      assert.are.equal(6, #srv.requests)
    end)

    it('backoff doubles from retry_base_ms, with jitter, up to 8 s', function()
      for n = 0, 6 do
        local d = shared.backoff_ms(500, n)
        local full = math.min(500 * 2 ^ n, 8000)
        assert.is_true(d >= math.floor(full * 0.75) and d <= full, tostring(d))
      end
      local model = new_model({ retry_base_ms = 200, max_retries = 1 })
      srv:push({ status = 500, body = '' }, final_answer('{"summary":"ok","files":[]}'))
      local t0 = uv.hrtime()
      model:call(request())
      assert.is_true(ms_since(t0) >= 140)
    end)

    it('a refused connection is retried, then unavailable', function()
      local model = openai.openai_responses({ api_key = KEY, model = 'm', max_cost_micros = 50000, pricing = PRICING,
        base_url = 'http://127.0.0.1:' .. model_server.closed_port() .. '/v1', max_retries = 1, retry_base_ms = 1 })
      local err = model_error('unavailable', model.call, model, request())
      assert.is_nil(err.status)
    end)

    it('a stalled server: timeout after the retries', function()
      local model = new_model({ timeout_ms = 200, max_retries = 1 })
      srv:push({ stall = true }, { stall = true })
      local t0 = uv.hrtime()
      model_error('timeout', model.call, model, request())
      assert.is_true(ms_since(t0) >= 380)
      assert.are.equal(2, #srv.requests)
    end)

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

    it('a refusal part: MODEL_ERROR refused', function()
      local model = new_model()
      srv:push({ body = response({ '{"type":"message","id":"msg_1","role":"assistant","status":"completed",'
        .. '"content":[{"type":"refusal","refusal":"I cannot help with that."}]}' }) })
      model_error('refused', model.call, model, request())
    end)

    it('a final answer that is not JSON: MODEL_ERROR invalid_output', function()
      local model = new_model()
      srv:push(final_answer('Here is the summary: it is a CLI.'))
      model_error('invalid_output', model.call, model, request())
    end)

    it('never crashes on a body of the wrong shape', function()
      local model = new_model()
      local bodies = {
        '', 'null', '[]', '"x"', '42', '{}', '{"output":null}', '{"output":"x"}', '{"output":[1]}',
        '{"output":[null]}', '{"status":"queued","output":[]}', '{"status":42,"output":[]}',
        '{"output":[{"type":"function_call"}]}', '{"output":[{"type":"function_call","call_id":5,"name":"x"}]}',
        '{"output":[{"type":"message","content":"x"}]}', '{"output":[{"type":"message","content":[1,null]}]}',
        '{"output":[{"type":"message","content":[{"type":"output_text","text":7}]}]}',
        '{"output":[],"usage":"lots"}', '{"output":[],"usage":{"input_tokens":-1,"output_tokens":"x"}}',
        '{"status":"incomplete","incomplete_details":"x"}', '{"status":"failed","error":"x"}',
        '{"output":[{"type":"function_call","call_id":"c","name":"n","arguments":{"a":1}}]}',
        string.rep('[', 5000) .. string.rep(']', 5000), '{"output":' .. string.rep('[', 300) .. '}',
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
      -- every error body too
      for _, b in ipairs({ '', 'x', '[]', '{"error":"boom"}', '{"error":{"code":[1]}}', '{"error":null}' }) do
        srv:push({ status = 401, body = b })
        model_error('authentication', model.call, model, request())
      end
    end)

    it('arguments that are not JSON go back to the model as a tool error, not a failure', function()
      local model = new_model()
      srv:push({ body = response({ fcall('call_1', 'workspace_read', '{"path": "README.md"') }) })
      local step = model:call(request())
      assert.are.equal('tool_calls', step.type)
      assert.are.same({ _invalid_json = '{"path": "README.md"' }, step.calls[1].input)
      -- the runtime refused that input (the tool's schema needs path) and handed back an error
      local messages = {
        { role = 'user', content = { task = 'Summarize README.md' } },
        { role = 'assistant', calls = step.calls, text = step.text, extra = step.extra },
        { role = 'tool', call_id = 'call_1', tool_id = 'workspace.read',
          result = { error = { code = 'INVALID_INPUT', message = 'path: expected a string, got nil' } } },
      }
      srv:push(final_answer('{"summary":"s","files":[]}'))
      model:call(request({ messages = messages }))
      local input = srv.requests[2].json.input
      assert.are.equal('{"path": "README.md"', input[2].arguments)   -- replayed as it came
      assert.are.equal('function_call_output', input[3].type)
      local out = json.decode(input[3].output)
      assert.are.equal('INVALID_INPUT', out.error.code)
      assert.truthy(out.error.message:find('not valid JSON', 1, true))
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
    it('prices usage per million tokens and rounds up to a whole micro-dollar', function()
      local model = new_model()
      -- 812 input (512 cached) at 1.25 $/MTok, 96 output at 10 $/MTok: 1015 + 960 = 1975 micros
      srv:push({ body = response({ message('{"summary":"s","files":[]}') }, usage(812, 96, 512)) })
      local step = model:call(request())
      assert.are.equal(1975, step.usage.cost_micros)
      assert.are.equal(812, step.usage.input_tokens)
      assert.are.equal(96, step.usage.output_tokens)
      assert.are.equal(512, step.usage.cached_tokens)
      -- 1 input token: 1.25 micros, rounded up to 2
      srv:push({ body = response({ message('{"summary":"s","files":[]}') }, usage(1, 0)) })
      assert.are.equal(2, model:call(request()).usage.cost_micros)
      srv:push({ body = response({ message('{"summary":"s","files":[]}') }, usage(0, 0)) })
      assert.are.equal(0, model:call(request()).usage.cost_micros)
    end)

    it('cached input at its own price when given', function()
      local model = new_model({ pricing = { input_micros_per_million_tokens = 1250000,
        output_micros_per_million_tokens = 10000000, cached_input_micros_per_million_tokens = 125000 } })
      -- 300 * 1.25 + 512 * 0.125 + 96 * 10 = 375 + 64 + 960
      srv:push({ body = response({ message('{"summary":"s","files":[]}') }, usage(812, 96, 512)) })
      assert.are.equal(1399, model:call(request()).usage.cost_micros)
    end)

    it('usage that is missing or unreadable is charged max_cost_micros, never 0', function()
      local model = new_model({ max_cost_micros = 7777 })
      for _, u in ipairs({ 'null', '{}', '{"input_tokens":5}', '{"input_tokens":"5","output_tokens":1}',
        '{"input_tokens":1e12,"output_tokens":1}' }) do
        srv:push({ body = response({ message('{"summary":"s","files":[]}') }, u) })
        assert.are.equal(7777, model:call(request()).usage.cost_micros, u)
      end
    end)

    it('caps max_output_tokens to what the ceiling leaves after the input, counted one token a byte', function()
      local model = new_model()   -- at most 50000 micros a call, at 1.25 and 10 $/MTok
      srv:push(final_answer('{"summary":"s","files":[]}'))
      model:call(request())
      local r = srv.requests[1]
      local sent = r.json.max_output_tokens
      -- the body measured was the one without the field: one comma, the key and the number fewer
      local function cap_for(measured)
        return math.floor((50000 * 1000000 - (measured + shared.INPUT_ALLOWANCE_TOKENS) * 1250000) / 10000000)
      end
      local measured = #r.body - #(',"max_output_tokens":' .. sent)
      local input = measured + shared.INPUT_ALLOWANCE_TOKENS
      assert.are.equal(cap_for(measured), sent)
      -- at most the ceiling with the input counted so, and not a token to spare
      assert.is_true(shared.cost_micros({ { input, 1250000 }, { sent, 10000000 } }) <= 50000)
      assert.is_true(shared.cost_micros({ { input, 1250000 }, { sent + 1, 10000000 } }) > 50000)
      -- a smaller max_output_tokens of its own is sent as it is; a larger one comes down
      srv:push(final_answer('{"summary":"s","files":[]}'), final_answer('{"summary":"s","files":[]}'))
      new_model({ max_output_tokens = 100 }):call(request())
      assert.are.equal(100, srv.requests[2].json.max_output_tokens)
      new_model({ max_output_tokens = 1000000 }):call(request())
      local r3 = srv.requests[3]
      -- measured with its own 1000000 in place of the number sent
      assert.are.equal(cap_for(#r3.body - #tostring(r3.json.max_output_tokens) + 7), r3.json.max_output_tokens)
      -- a larger request leaves less room for output
      srv:push(final_answer('{"summary":"s","files":[]}'))
      model:call(request({ instructions = string.rep('Be brief. ', 400) }))
      assert.is_true(srv.requests[4].json.max_output_tokens < sent - 400)
    end)

    it('a request whose input alone may pass the ceiling is not sent: BUDGET_EXCEEDED', function()
      local model = new_model({ max_cost_micros = 1000 })
      local err = assert.raises_code('BUDGET_EXCEEDED', model.call, model, request())
      assert.matches('the call was not made', err.message)
      assert.are.equal(0, #srv.requests)
      -- room for fewer than 16 output tokens (10 micros each) is no room either
      srv:push(final_answer('{"summary":"s","files":[]}'), final_answer('{"summary":"s","files":[]}'))
      new_model({ max_cost_micros = 3000 }):call(request())
      local room = srv.requests[1].json.max_output_tokens
      new_model({ max_cost_micros = 3000 - (room - 16) * 10 }):call(request())
      assert.are.equal(16, srv.requests[2].json.max_output_tokens)
      local too_tight = new_model({ max_cost_micros = 3000 - (room - 15) * 10 })
      assert.raises_code('BUDGET_EXCEEDED', too_tight.call, too_tight, request())
      assert.are.equal(2, #srv.requests)
    end)

    it('computes exactly, as integers', function()
      assert.are.equal(0, shared.cost_micros({}))
      assert.are.equal(1, shared.cost_micros({ { 1, 1 } }))
      assert.are.equal(1000000, shared.cost_micros({ { 1000000, 1000000 } }))
      assert.are.equal(1000001, shared.cost_micros({ { 1000001, 1000000 } }))
      assert.are.equal(3, shared.cost_micros({ { 1, 2000000, 25 } }))   -- 2.5 up to 3
      assert.is_true(math.type == nil or math.type(shared.cost_micros({ { 7, 3 } })) == 'integer')
    end)
  end)

  it('reads retry-after as seconds, milliseconds or an HTTP date', function()
    local now = shared.http_date('Wed, 21 Oct 2015 07:28:00 GMT')
    assert.are.equal(1445412480, now)
    assert.are.equal(3000, shared.retry_after_ms({ ['retry-after'] = '3' }, now))
    assert.are.equal(1500, shared.retry_after_ms({ ['retry-after'] = '1.5' }, now))
    assert.are.equal(250, shared.retry_after_ms({ ['retry-after-ms'] = '250', ['retry-after'] = '9' }, now))
    assert.are.equal(7000, shared.retry_after_ms({ ['retry-after'] = 'Wed, 21 Oct 2015 07:28:07 GMT' }, now))
    assert.are.equal(0, shared.retry_after_ms({ ['retry-after'] = 'Wed, 21 Oct 2015 07:27:00 GMT' }, now))
    assert.are.equal(86400000, shared.retry_after_ms({ ['retry-after'] = 'Thu, 22 Oct 2015 07:28:00 GMT' }, now))
    assert.are.equal(951782400, shared.http_date('Tue, 29 Feb 2000 00:00:00 GMT'))
    assert.is_nil(shared.retry_after_ms({ ['retry-after'] = 'soon' }, now))
    assert.is_nil(shared.retry_after_ms({ ['retry-after'] = '-3' }, now))
    assert.is_nil(shared.retry_after_ms({}, now))
    assert.is_nil(shared.http_date('Wed, 21 Foo 2015 07:28:00 GMT'))
  end)

  describe('in a run', function()
    local function agent(model)
      return mayura.define_agent({
        id = 'summarizer', version = '1', instructions = 'Summarize the file.',
        input = TASK, output = RESULT, model = model,
        tools = { {
          id = 'workspace.read', description = 'Read a file.', effect = 'read',
          input = z.object({ path = z.string() }),
          run = function(input) return { text = 'contents of ' .. input.path } end,
        } },
      })
    end

    local GRANTS = { 'model:openai.responses', 'tool:workspace.read', 'effect:read' }

    it('runs end to end: a tool call, its result, then the structured answer', function()
      srv:push({ body = response({ REASONING, fcall('call_1', 'workspace_read', '{"path":"README.md"}') },
        usage(1000, 100)) })
      srv:push(function(req)
        local last = req.json.input[#req.json.input]
        assert.are.equal('function_call_output', last.type)
        assert.are.equal('call_1', last.call_id)
        assert.are.same({ text = 'contents of README.md' }, json.decode(last.output))
        return { body = response({ message('{"summary":"A tiny CLI.","files":["README.md"]}') }, usage(2000, 50)) }
      end)
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_cost_micros = 200000 } })
      local outcome = runtime:submit(agent(new_model()), { input = { task = 'Summarize README.md' } }):result()
      runtime:close()
      assert.are.equal('succeeded', outcome.status, outcome.error and outcome.error.message)
      assert.are.same({ summary = 'A tiny CLI.', files = { 'README.md' } }, outcome.output)
      -- 1000 * 1.25 + 100 * 10 = 2250; 2000 * 1.25 + 50 * 10 = 3000
      assert.are.equal(5250, outcome.usage.cost_micros)
      assert.are.equal(2, outcome.usage.model_calls)
      assert.are.equal(1, outcome.usage.tool_calls)
      assert.are.equal(2, #srv.requests)
      local input = srv.requests[2].json.input
      assert.are.equal('reasoning', input[2].type)
      assert.are.equal('function_call', input[3].type)
    end)

    it('arguments that are not JSON come back to the model as a tool error, and the run goes on', function()
      local ran = 0
      local a = mayura.define_agent({
        id = 'summarizer', version = '1', input = TASK, output = RESULT, model = new_model(),
        tools = { { id = 'workspace.read', effect = 'read', input = z.object({ path = z.string() }),
          run = function() ran = ran + 1; return {} end } },
      })
      srv:push({ body = response({ fcall('call_1', 'workspace_read', '{"path": README.md}') }) })
      srv:push(function(req)
        local last = req.json.input[#req.json.input]
        assert.are.equal('call_1', last.call_id)
        local out = json.decode(last.output)
        assert.are.equal('INVALID_INPUT', out.error.code)
        assert.truthy(out.error.message:find('not valid JSON', 1, true))
        return { body = response({ message('{"summary":"gave up","files":[]}') }) }
      end)
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local outcome = runtime:submit(a, { input = { task = 't' } }):result()
      runtime:close()
      assert.are.equal('succeeded', outcome.status, outcome.error and outcome.error.message)
      assert.are.equal(0, ran)
      assert.are.equal(1, outcome.usage.tool_calls)
    end)

    it('a retry-after wait ends with the run, at its duration limit', function()
      srv:push({ status = 429, headers = { ['retry-after'] = '60' }, body = error_body('requests',
        'rate_limit_exceeded') })
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_duration_ms = 300 } })
      local outcome = runtime:submit(agent(new_model()), { input = { task = 't' } }):result()
      runtime:close()
      -- ended by its 300 ms limit, not after the 60 s the server asked for
      assert.are.equal('failed', outcome.status)
      assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
      assert.are.equal(1, #srv.requests)
    end)

    it('a response reporting more than the call reserved ends the run: BUDGET_EXCEEDED, no further call', function()
      -- reserved 50000; 1000 input and 10000 output tokens cost 1250 + 100000
      srv:push({ body = response({ fcall('call_1', 'workspace_read', '{"path":"README.md"}') }, usage(1000, 10000)) })
      srv:push(final_answer('{"summary":"never asked for","files":[]}'))
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_cost_micros = 500000 } })
      local outcome = runtime:submit(agent(new_model()), { input = { task = 'Summarize README.md' } }):result()
      runtime:close()
      assert.are.equal('failed', outcome.status)
      assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
      assert.are.equal(101250, outcome.usage.cost_micros)
      assert.are.equal(1, outcome.usage.model_calls)
      assert.are.equal(0, outcome.usage.tool_calls)
      assert.are.equal(1, #srv.requests)
      assert.are.equal(1, srv:pending())
      -- and the request it made asked for no more output than the ceiling leaves
      local sent = srv.requests[1].json.max_output_tokens
      assert.is_true(sent > 0 and sent * 10 <= 50000)
    end)

    it('a request too large for the ceiling ends the run BUDGET_EXCEEDED before anything is sent', function()
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = { max_cost_micros = 500000 } })
      local outcome = runtime:submit(agent(new_model({ max_cost_micros = 500 })),
        { input = { task = 'Summarize README.md' } }):result()
      runtime:close()
      assert.are.equal('failed', outcome.status)
      assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
      assert.are.equal(0, outcome.usage.cost_micros)
      assert.are.equal(0, #srv.requests)
    end)

    it('a refused key ends the run failed with MODEL_ERROR, the key nowhere in the message', function()
      srv:push({ status = 401, body = error_body('invalid_request_error', 'invalid_api_key') })
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local outcome = runtime:submit(agent(new_model()), { input = { task = 'Summarize README.md' } }):result()
      runtime:close()
      assert.are.equal('failed', outcome.status)
      assert.are.equal('MODEL_ERROR', outcome.error.code)
      assert.are.equal('authentication', outcome.error.reason)
      assert.is_nil(outcome.error.message:find('SECRET', 1, true))
      assert.is_nil(outcome.error.message:find('Incorrect', 1, true))
      assert.are.equal(1, #srv.requests)
      assert.are.equal(0, outcome.usage.cost_micros)
    end)
  end)
end)
