--- mayura.provider.openai: models over the OpenAI Responses API and over Chat Completions.
--
--   local openai = require('mayura.provider.openai')
--   local model = openai.openai_responses{
--     api_key = os.getenv('OPENAI_API_KEY'), model = 'gpt-5',
--     max_cost_micros = 40000,    -- what the runtime reserves for each call
--     pricing = { input_micros_per_million_tokens = 1250000, output_micros_per_million_tokens = 10000000 },
--   }
--   -- a run needs the grant 'model:openai.responses'
--
--   local local_model = openai.openai_chat_completions{
--     base_url = 'http://127.0.0.1:8080/v1', model = 'qwen3',   -- llama.cpp, Ollama, vLLM, OpenAI
--   }
--   -- a run needs the grant 'model:openai.chat'
--
-- `openai_responses{ api_key, model, base_url ('https://api.openai.com/v1'),
-- max_cost_micros, pricing = { input_micros_per_million_tokens,
-- output_micros_per_million_tokens, cached_input_micros_per_million_tokens },
-- timeout_ms (600000), max_retries (2), retry_base_ms (500), max_output_tokens }`
-- posts to `<base_url>/responses`, stateless (`store: false`, with
-- `include: ["reasoning.encrypted_content"]`):
--
--   * `instructions` is the agent's instructions; the input items are the
--     conversation: the run's input as a user message (a string as it is,
--     anything else as JSON text), then for each model step every output item
--     it gave, replayed as it came (kept in the step's `extra.openai_responses`;
--     reasoning items without `encrypted_content` are left out, since a
--     stateless call cannot resolve them), then one `function_call_output`
--     (the tool result as JSON text) per call;
--   * tools are function tools named after the tool ids (characters other
--     than `a-z A-Z 0-9 _ -` become `_`; a clash gets a suffix), with the
--     tool's input schema as `parameters` and `strict` always sent: true only
--     when the schema qualifies (every object closed, every property
--     required), false otherwise, since an omitted `strict` would make
--     optional fields mandatory;
--   * an agent output schema becomes `text.format` (json_schema `final_answer`,
--     strict as above); a schema whose root is not an object is sent as
--     `{ value = <schema> }` and unwrapped. With no output schema (anything
--     goes) no format is sent and the final text is decoded when it is JSON;
--   * an answer with `function_call` items is a `tool_calls` step (its text, if
--     any, in `step.text`); otherwise the `output_text` parts of its messages,
--     joined, are the final answer as JSON. A `refusal` part is MODEL_ERROR
--     `refused`; `status = 'incomplete'` is MODEL_ERROR `incomplete`;
--   * arguments that are not valid JSON become the input
--     `{ _invalid_json = '<raw>' }`: the runtime has no separate hook for
--     them, so it checks that input against the tool's schema and hands the
--     refusal back as the tool's `{ error = ... }` (a tool whose schema has no
--     required field would run with `{}`); the next request then tells the
--     model that its arguments were not valid JSON;
--   * `usage` is priced per million tokens (cached input at the cached price
--     when given, else the input price), rounded up to a whole micro-dollar.
--     A response without readable usage is charged `max_cost_micros`;
--   * `max_output_tokens` is always sent, as the smaller of the option and
--     what `max_cost_micros` leaves after the request's input (counted as one
--     token per byte of the body, plus an allowance), so that a call cannot
--     cost more than its ceiling; a request whose input alone may pass the
--     ceiling is not sent (BUDGET_EXCEEDED). Give `max_output_tokens` your
--     model's own maximum when a generous ceiling would ask for more.
--
-- `openai_chat_completions{ api_key, model, base_url ('https://api.openai.com/v1'),
-- max_cost_micros (0), pricing (none: calls cost 0), timeout_ms, max_retries,
-- retry_base_ms, max_tokens }` posts to `<base_url>/chat/completions`: the
-- instructions as a system message, assistant messages with `tool_calls`
-- (replayed as they came, without any reasoning field), `role = 'tool'`
-- messages, tools as `{ type = 'function', function = {...} }` and the output
-- schema as `response_format` json_schema (nested, as llama.cpp, Ollama and
-- vLLM read it). `finish_reason` `length` or `content_filter` is MODEL_ERROR
-- `incomplete`, a `refusal` is `refused`. `api_key` is optional (local servers);
-- `max_tokens` is sent as `max_tokens`, the one cap every server reads. With
-- `pricing` and a `max_cost_micros` above 0, `max_tokens` is capped to what
-- that ceiling leaves after the input, as for the Responses API.
--
-- Errors and retries are mayura.provider._shared's: 401/403 `authentication`,
-- 429 `rate_limited` (retried, honouring `retry-after` up to 120 s, except
-- the quota codes such as `insufficient_quota`), 5xx and connection failures
-- retried with backoff, then `unavailable`. Messages never carry the API's text.
--
-- The wire verbs are `M.responses` and `M.chat`: `{ to_request, from_response, map_error }`.
local shared = require('mayura.provider._shared')
local check = require('mayura._check')

local M = {}

local list, object = shared.list, shared.object
local null = shared.null

local DEFAULT_BASE = 'https://api.openai.com/v1'
local MAX_RETRY_AFTER_MS = 120000
local FINAL_NAME = 'final_answer'

-- 429 codes that waiting does not clear.
local NO_RETRY = {
  insufficient_quota = true, billing_hard_limit_reached = true, billing_not_active = true,
  access_terminated = true,
}

-- ipairs over t when it is a table, over nothing otherwise.
local function each(t)
  if type(t) ~= 'table' then return ipairs({}) end
  return ipairs(t)
end

local function nonempty(s)
  return type(s) == 'string' and s ~= '' and s or nil
end

local function invalid(config, what)
  error(shared.model_error(config.label, 'invalid_response', what), 0)
end

-- The tool definitions' names and schemas shared by both wire formats.
local function tool_table(tools)
  local names, by_name = shared.tool_names(tools)
  local out = { by_name = by_name, name_of = {}, wrapped = {}, defs = {} }
  for i, t in ipairs(tools) do
    local schema, wrapped = shared.object_schema(t.input_schema)
    schema = schema or object({ type = 'object' })
    out.name_of[t.id] = names[i]
    out.wrapped[names[i]] = wrapped
    out.defs[i] = { name = names[i], description = nonempty(t.description), schema = schema,
      strict = shared.is_strict_schema(schema) }
  end
  return out
end

-- The name sent for a call of `tool_id` (a tool the agent does not have keeps a cleaned id).
local function name_for(tt, tool_id)
  return tt.name_of[tool_id] or (tostring(tool_id):gsub('[^%w_%-]', '_'):sub(1, 64))
end

-- The arguments text of a call made earlier, rebuilt from its input.
local function arguments_text(input, wrapped)
  if shared.is_invalid_input(input) then return input._invalid_json end
  if wrapped then input = object({ value = input }) end
  if input == nil then return '{}' end
  local ok, text = pcall(shared.json.encode, input)
  return ok and text or '{}'
end

-- The input of a call from its arguments (a JSON text, or a table from a lenient server).
local function call_input(arguments, wrapped)
  local input
  if type(arguments) == 'table' then input = arguments else input = shared.decode_arguments(arguments) end
  if wrapped and type(input) == 'table' and not shared.is_invalid_input(input) then input = input.value end
  return input
end

-- The final answer's format, or nil when any answer goes.
local function final_of(output_schema)
  if shared.is_any_schema(output_schema) then return nil end
  local schema, wrapped = shared.object_schema(output_schema)
  return { schema = schema, wrapped = wrapped, strict = shared.is_strict_schema(schema) }
end

local function request_id(headers)
  local id = type(headers) == 'table' and headers['x-request-id'] or nil
  if type(id) == 'string' and #id <= 128 and id:match('^[%w_%.%-]+$') then return id end
  return nil
end

-- Usage with its cost: input tokens of which `cached` were cached, output tokens.
local function priced(config, input, cached, output, res)
  local usage = { request_id = request_id(res and res.headers) }
  local p = config.pricing
  if input == nil or output == nil then
    usage.cost_micros = p and config.max_cost_micros or 0
    return usage
  end
  cached = math.min(cached or 0, input)
  usage.input_tokens, usage.output_tokens, usage.cached_tokens = input, output, cached
  if not p then
    usage.cost_micros = 0
  else
    local cached_price = p.cached_input_micros_per_million_tokens or p.input_micros_per_million_tokens
    usage.cost_micros = shared.cost_micros({
      { input - cached, p.input_micros_per_million_tokens },
      { cached, cached_price },
      { output, p.output_micros_per_million_tokens },
    })
  end
  return usage
end

local function details(t, key)
  return type(t) == 'table' and type(t[key]) == 'table' and t[key] or nil
end

local function map_error(config, status, _headers, body)
  local err, retry = shared.http_error(config.label, status, body, config.api_key())
  if status == 429 and NO_RETRY[err.provider_code] then retry = false end
  return err, retry
end

local function auth_headers(config)
  local headers = { ['Content-Type'] = 'application/json' }
  local key = config.api_key()
  if key then headers.Authorization = 'Bearer ' .. key end
  return headers
end

-- The short, safe form of a status or reason token from a body.
local function token(v)
  if type(v) == 'string' and #v <= 48 and v:match('^%a[%w_%-]*$') then return v end
  return nil
end

-- {======================================================
-- Responses
-- =======================================================

local responses = {}

-- The input items of the conversation.
local function input_items(messages, tt)
  local items = list()
  local bad = {}   -- call ids whose arguments were not JSON
  for _, m in each(messages) do
    if m.role == 'user' then
      items[#items + 1] = object({ type = 'message', role = 'user', content = shared.input_text(m.content) })
    elseif m.role == 'assistant' then
      for _, c in each(m.calls) do
        if shared.is_invalid_input(c.input) then bad[c.id] = true end
      end
      local raw = type(m.extra) == 'table' and m.extra.openai_responses or nil
      if type(raw) == 'table' then
        for _, item in ipairs(raw) do
          if type(item) == 'table' and not (item.type == 'reasoning' and type(item.encrypted_content) ~= 'string') then
            items[#items + 1] = item
          end
        end
      else
        if nonempty(m.text) then
          items[#items + 1] = object({ type = 'message', role = 'assistant', content = m.text })
        end
        for _, c in each(m.calls) do
          local name = name_for(tt, c.tool_id)
          items[#items + 1] = object({ type = 'function_call', call_id = c.id, name = name,
            arguments = arguments_text(c.input, tt.wrapped[name]) })
        end
      end
    elseif m.role == 'tool' then
      local result = m.result
      if bad[m.call_id] and shared.is_error_result(result) then result = shared.INVALID_JSON_RESULT end
      items[#items + 1] = object({ type = 'function_call_output', call_id = m.call_id,
        output = shared.result_text(result) })
    end
  end
  return items
end

--- The wire request for a runtime request, and the context to read its answer.
function responses.to_request(config, request)
  local tt = tool_table(request.tools or {})
  local final = final_of(request.output_schema)
  local body = object({
    model = config.model,
    input = input_items(request.messages, tt),
    store = false,
    include = list({ 'reasoning.encrypted_content' }),
  })
  if nonempty(request.instructions) then body.instructions = request.instructions end
  if #tt.defs > 0 then
    local tools = list()
    for i, d in ipairs(tt.defs) do
      tools[i] = object({ type = 'function', name = d.name, description = d.description, parameters = d.schema,
        strict = d.strict })
    end
    body.tools = tools
  end
  if final then
    body.text = object({ format = object({ type = 'json_schema', name = FINAL_NAME, schema = final.schema,
      strict = final.strict }) })
  end
  if config.max_output_tokens then body.max_output_tokens = config.max_output_tokens end
  return { url = config.base_url .. '/responses', headers = auth_headers(config), body = body },
    { tools = tt, final = final }
end

--- The step of a decoded response body.
function responses.from_response(config, body, context, res)
  local label = config.label
  local status = body.status
  if status == 'incomplete' then
    local why = token(type(body.incomplete_details) == 'table' and body.incomplete_details.reason or nil)
    error(shared.model_error(label, 'incomplete', 'the answer was cut short' .. (why and (' (' .. why .. ')') or ''),
      { provider_code = why }), 0)
  end
  if status == 'failed' then
    local code = shared.error_code({ error = body.error }, config.api_key())
    error(shared.model_error(label, 'failed', 'the response failed' .. (code and (' (' .. code .. ')') or ''),
      { provider_code = code }), 0)
  end
  if status ~= nil and status ~= 'completed' then
    invalid(config, 'the response is not complete (' .. (token(status) or 'unknown status') .. ')')
  end
  if type(body.output) ~= 'table' then invalid(config, 'the response has no output') end
  local u = body.usage
  local input = type(u) == 'table' and shared.tokens(u.input_tokens) or nil
  local output = type(u) == 'table' and shared.tokens(u.output_tokens) or nil
  local cached = shared.tokens((details(u, 'input_tokens_details') or {}).cached_tokens)
  local usage = priced(config, input, cached, output, res)
  local tt = context.tools
  local calls, texts, refused = {}, {}, false
  for _, item in ipairs(body.output) do
    if type(item) ~= 'table' then invalid(config, 'an output item is not an object') end
    if item.type == 'function_call' then
      if not nonempty(item.call_id) or not nonempty(item.name) then
        invalid(config, 'a function call has no call_id or name')
      end
      calls[#calls + 1] = { id = item.call_id, tool_id = tt.by_name[item.name] or item.name,
        input = call_input(item.arguments, tt.wrapped[item.name]) }
    elseif item.type == 'message' then
      for _, part in each(item.content) do
        if type(part) == 'table' then
          if part.type == 'output_text' and type(part.text) == 'string' then
            texts[#texts + 1] = part.text
          elseif part.type == 'refusal' then
            refused = true
          end
        end
      end
    end
  end
  local text = table.concat(texts)
  if #calls > 0 then
    return { type = 'tool_calls', calls = calls, text = nonempty(text), extra = { openai_responses = body.output },
      usage = usage }
  end
  if refused then error(shared.model_error(label, 'refused', 'the model refused to answer'), 0) end
  return { type = 'final', output = shared.final_output(label, text, context.final), usage = usage }
end

--- The error for an HTTP status that is not 2xx, and whether to retry.
responses.map_error = map_error

--- The body field that caps the output tokens (see mayura.provider._shared).
responses.output_tokens_field = 'max_output_tokens'

M.responses = responses

-- }======================================================

-- {======================================================
-- Chat Completions
-- =======================================================

local chat = {}

local function chat_messages(request, tt)
  local messages = list()
  local bad = {}
  if nonempty(request.instructions) then
    messages[1] = object({ role = 'system', content = request.instructions })
  end
  for _, m in each(request.messages) do
    if m.role == 'user' then
      messages[#messages + 1] = object({ role = 'user', content = shared.input_text(m.content) })
    elseif m.role == 'assistant' then
      for _, c in each(m.calls) do
        if shared.is_invalid_input(c.input) then bad[c.id] = true end
      end
      local raw = type(m.extra) == 'table' and m.extra.openai_chat or nil
      local tool_calls = list()
      if type(raw) == 'table' and type(raw.tool_calls) == 'table' then
        for i, tc in ipairs(raw.tool_calls) do tool_calls[i] = tc end
      else
        for i, c in each(m.calls) do
          local name = name_for(tt, c.tool_id)
          tool_calls[i] = object({ id = c.id, type = 'function', ['function'] = object({ name = name,
            arguments = arguments_text(c.input, tt.wrapped[name]) }) })
        end
      end
      local content = type(raw) == 'table' and raw.content or m.text
      messages[#messages + 1] = object({ role = 'assistant', content = nonempty(content) or null,
        tool_calls = tool_calls })
    elseif m.role == 'tool' then
      local result = m.result
      if bad[m.call_id] and shared.is_error_result(result) then result = shared.INVALID_JSON_RESULT end
      messages[#messages + 1] = object({ role = 'tool', tool_call_id = m.call_id,
        content = shared.result_text(result) })
    end
  end
  return messages
end

--- The wire request for a runtime request, and the context to read its answer.
function chat.to_request(config, request)
  local tt = tool_table(request.tools or {})
  local final = final_of(request.output_schema)
  local body = object({ model = config.model, messages = chat_messages(request, tt) })
  if #tt.defs > 0 then
    local tools = list()
    for i, d in ipairs(tt.defs) do
      tools[i] = object({ type = 'function', ['function'] = object({ name = d.name, description = d.description,
        parameters = d.schema, strict = d.strict }) })
    end
    body.tools = tools
    body.parallel_tool_calls = true
  end
  if final then
    body.response_format = object({ type = 'json_schema', json_schema = object({ name = FINAL_NAME,
      schema = final.schema, strict = final.strict }) })
  end
  if config.max_tokens then body.max_tokens = config.max_tokens end
  local turn = 1
  for _, m in each(request.messages) do
    if m.role == 'assistant' then turn = turn + 1 end
  end
  return { url = config.base_url .. '/chat/completions', headers = auth_headers(config), body = body },
    { tools = tt, final = final, turn = turn }
end

-- The text of a message's content: a string, or text parts.
local function content_text(content)
  if type(content) == 'string' then return content end
  local parts = {}
  for _, p in each(content) do
    if type(p) == 'table' and type(p.text) == 'string' then parts[#parts + 1] = p.text end
  end
  return table.concat(parts)
end

--- The step of a decoded response body.
function chat.from_response(config, body, context, res)
  local label = config.label
  local choice = type(body.choices) == 'table' and body.choices[1] or nil
  if type(choice) ~= 'table' or type(choice.message) ~= 'table' then invalid(config, 'the response has no choice') end
  local msg = choice.message
  local finish = choice.finish_reason
  if finish == 'length' or finish == 'content_filter' then
    error(shared.model_error(label, 'incomplete', 'the answer was cut short (' .. finish .. ')',
      { provider_code = finish }), 0)
  end
  local u = body.usage
  local input = type(u) == 'table' and shared.tokens(u.prompt_tokens) or nil
  local output = type(u) == 'table' and shared.tokens(u.completion_tokens) or nil
  local cached = shared.tokens((details(u, 'prompt_tokens_details') or {}).cached_tokens)
  local usage = priced(config, input, cached, output, res)
  local tt = context.tools
  local calls, raw_calls = {}, list()
  for i, tc in each(msg.tool_calls) do
    local fn = type(tc) == 'table' and tc['function'] or nil
    if type(fn) ~= 'table' or not nonempty(fn.name) then invalid(config, 'a tool call has no function name') end
    local id = nonempty(tc.id) or string.format('call_%d_%d', context.turn, i)
    local arguments = fn.arguments
    calls[i] = { id = id, tool_id = tt.by_name[fn.name] or fn.name, input = call_input(arguments, tt.wrapped[fn.name]) }
    if type(arguments) ~= 'string' then
      local ok, text = pcall(shared.json.encode, arguments == nil and object() or arguments)
      arguments = ok and text or '{}'
    end
    raw_calls[i] = object({ id = id, type = 'function', ['function'] = object({ name = fn.name,
      arguments = arguments }) })
  end
  local text = content_text(msg.content)
  if #calls > 0 then
    return { type = 'tool_calls', calls = calls, text = nonempty(text),
      extra = { openai_chat = { content = nonempty(text), tool_calls = raw_calls } }, usage = usage }
  end
  if nonempty(msg.refusal) then error(shared.model_error(label, 'refused', 'the model refused to answer'), 0) end
  return { type = 'final', output = shared.final_output(label, text, context.final), usage = usage }
end

--- The error for an HTTP status that is not 2xx, and whether to retry.
chat.map_error = map_error

--- The body field that caps the output tokens (see mayura.provider._shared).
chat.output_tokens_field = 'max_tokens'

M.chat = chat

-- }======================================================

local C = 'INVALID_CONFIG'

--- A model over the Responses API (id 'openai.responses'); options in the module header.
function M.openai_responses(options)
  local config = shared.config(options, {
    label = 'openai.responses', base_url = DEFAULT_BASE, key_required = true, cost_required = true,
    keys = { max_output_tokens = true }, max_retry_after_ms = MAX_RETRY_AFTER_MS,
  }, 2)
  if options.max_output_tokens ~= nil then
    config.max_output_tokens = check.int(options.max_output_tokens, 'max_output_tokens', 1, nil, C, 3)
  end
  return shared.new_model(responses, config)
end

--- A model over Chat Completions (id 'openai.chat'); options in the module header.
function M.openai_chat_completions(options)
  local config = shared.config(options, {
    label = 'openai.chat', base_url = DEFAULT_BASE, keys = { max_tokens = true },
    max_retry_after_ms = MAX_RETRY_AFTER_MS,
  }, 2)
  if options.max_tokens ~= nil then
    config.max_tokens = check.int(options.max_tokens, 'max_tokens', 1, nil, C, 3)
  end
  return shared.new_model(chat, config)
end

return M
