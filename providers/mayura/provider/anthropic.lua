--- mayura.provider.anthropic: a model over the Anthropic Messages API.
--
--   local anthropic = require('mayura.provider.anthropic')
--   local model = anthropic.anthropic_messages{
--     api_key = os.getenv('ANTHROPIC_API_KEY'), model = 'claude-sonnet-4-5',
--     max_tokens = 4096, max_cost_micros = 60000,
--     pricing = { input_micros_per_million_tokens = 3000000, output_micros_per_million_tokens = 15000000 },
--   }
--   -- a run needs the grant 'model:anthropic.messages'
--
-- `anthropic_messages{ api_key, model, base_url ('https://api.anthropic.com'),
-- max_tokens (4096), max_cost_micros, pricing = { input_micros_per_million_tokens,
-- output_micros_per_million_tokens, cached_input_micros_per_million_tokens },
-- structured_output ('output_config' or 'tool'), timeout_ms (600000),
-- max_retries (2), retry_base_ms (500) }` posts to `<base_url>/v1/messages`
-- with `x-api-key`, `anthropic-version: 2023-06-01` and a JSON content type:
--
--   * `system` is the agent's instructions; `messages` are the run's input as
--     a user message (a string as it is, anything else as JSON text), each
--     model step as an assistant message with the content blocks it gave
--     (kept in the step's `extra.anthropic` and replayed unchanged, thinking
--     blocks and their signatures included; empty text blocks are left out,
--     since the API refuses them), and the results of a step's calls as one
--     user message of `tool_result` blocks (`is_error` when the runtime handed
--     back an error);
--   * tools are `{ name, description, input_schema }`, named as in
--     mayura.provider.openai (tool ids cleaned to `a-z A-Z 0-9 _ -`);
--   * the final answer: with `structured_output = 'output_config'` (the
--     default, for models with structured outputs) the output schema goes to
--     `output_config.format` (json_schema; the keywords structured outputs do
--     not take, such as lengths, bounds and `maxItems`, are left out of what
--     is sent: the runtime still checks the answer against the full schema)
--     and the answer's text blocks are the JSON; with `'tool'` (older models)
--     a tool `final_answer` takes the output schema as its input schema and
--     `tool_choice = { type = 'any' }` makes the model call a tool every turn:
--     a `final_answer` call is the final answer. A schema whose root is not
--     an object is sent as `{ value = <schema> }` and unwrapped;
--   * `stop_reason` `max_tokens`, `model_context_window_exceeded` or
--     `pause_turn` is MODEL_ERROR `incomplete`; `refusal` is `refused`;
--   * cost: `input_tokens` (uncached) at the input price, cache writes at 1.25
--     (5 minutes) or 2 (1 hour) times it, cache reads at
--     `cached_input_micros_per_million_tokens` or 0.1 times the input price,
--     output at the output price; rounded up to a whole micro-dollar. A
--     response without readable usage is charged `max_cost_micros`;
--   * `max_tokens` is sent as the smaller of the option and what
--     `max_cost_micros` leaves after the request's input (counted as one
--     token per byte of the body, plus an allowance for the tool-use prompt),
--     so that a call cannot cost more than its ceiling; a request whose input
--     alone may pass the ceiling is not sent (BUDGET_EXCEEDED).
--
-- Errors and retries are mayura.provider._shared's: 401/403 `authentication`,
-- 429 `rate_limited` (retried, honouring `retry-after` up to 60 s, except a
-- spend-limit 429), 529 `overloaded_error` and other 5xx retried with backoff,
-- then `unavailable`. Messages never carry the API's text.
--
-- The wire verbs are `M.messages`: `{ to_request, from_response, map_error }`.
local shared = require('mayura.provider._shared')
local check = require('mayura._check')

local M = {}

local list, object = shared.list, shared.object

local DEFAULT_BASE = 'https://api.anthropic.com'
local VERSION = '2023-06-01'
local MAX_RETRY_AFTER_MS = 60000
local FINAL_NAME = 'final_answer'

-- Keywords that structured outputs refuse; left out of the schema sent.
local UNSUPPORTED = {
  minLength = true, maxLength = true, minimum = true, maximum = true, exclusiveMinimum = true,
  exclusiveMaximum = true, multipleOf = true, maxItems = true, default = true,
}

local function each(t)
  if type(t) ~= 'table' then return ipairs({}) end
  return ipairs(t)
end

local function nonempty(s)
  return type(s) == 'string' and s:find('%S') and s or nil
end

local function invalid(config, what)
  error(shared.model_error(config.label, 'invalid_response', what), 0)
end

-- A copy of `schema` without the keywords structured outputs refuse.
local function output_schema(s, depth)
  depth = depth or 0
  if type(s) ~= 'table' or depth > 64 then return s end
  local out = {}
  for k, v in pairs(s) do
    if k == 'minItems' then
      if v == 0 or v == 1 then out[k] = v end
    elseif not UNSUPPORTED[k] then
      if k == 'properties' or k == '$defs' or k == 'definitions' then
        local props = {}
        for name, sub in pairs(v) do props[name] = output_schema(sub, depth + 1) end
        out[k] = setmetatable(props, getmetatable(v))
      elseif k == 'items' then
        out[k] = output_schema(v, depth + 1)
      elseif k == 'anyOf' then
        local opts = list()
        for i, sub in each(v) do opts[i] = output_schema(sub, depth + 1) end
        out[k] = opts
      else
        out[k] = shared.copy(v)
      end
    end
  end
  return setmetatable(out, getmetatable(s))
end

-- The input of a call: the block's input object (a string is decoded).
local function call_input(input, wrapped)
  if type(input) == 'string' then input = shared.decode_arguments(input) end
  if input == nil then input = object() end
  if wrapped and type(input) == 'table' and not shared.is_invalid_input(input) then input = input.value end
  return input
end

local messages = {}

-- The messages of the conversation.
local function messages_of(request, context)
  local out = list()
  local results   -- the user message of tool results being filled
  local bad = {}
  local function flush()
    if results then out[#out + 1] = results end
    results = nil
  end
  for _, m in each(request.messages) do
    if m.role == 'user' then
      flush()
      out[#out + 1] = object({ role = 'user', content = shared.input_text(m.content) })
    elseif m.role == 'assistant' then
      flush()
      for _, c in each(m.calls) do
        if shared.is_invalid_input(c.input) then bad[c.id] = true end
      end
      local blocks = list()
      local raw = type(m.extra) == 'table' and m.extra.anthropic or nil
      if type(raw) == 'table' then
        for _, b in ipairs(raw) do
          if type(b) == 'table' and not (b.type == 'text' and not nonempty(b.text)) then blocks[#blocks + 1] = b end
        end
      else
        if nonempty(m.text) then blocks[1] = object({ type = 'text', text = m.text }) end
        for _, c in each(m.calls) do
          local name = context.name_of[c.tool_id] or (tostring(c.tool_id):gsub('[^%w_%-]', '_'):sub(1, 64))
          local input = c.input
          if shared.is_invalid_input(input) then
            input = object()
          elseif context.wrapped[name] then
            input = object({ value = input })
          elseif type(input) ~= 'table' then
            input = object()
          end
          blocks[#blocks + 1] = object({ type = 'tool_use', id = c.id, name = name, input = input })
        end
      end
      out[#out + 1] = object({ role = 'assistant', content = blocks })
    elseif m.role == 'tool' then
      results = results or object({ role = 'user', content = list() })
      local result = m.result
      if bad[m.call_id] and shared.is_error_result(result) then result = shared.INVALID_JSON_RESULT end
      local block = object({ type = 'tool_result', tool_use_id = m.call_id, content = shared.result_text(result) })
      if shared.is_error_result(result) then block.is_error = true end
      results.content[#results.content + 1] = block
    end
  end
  flush()
  return out
end

--- The wire request for a runtime request, and the context to read its answer.
function messages.to_request(config, request)
  local tools = request.tools or {}
  local final
  if not shared.is_any_schema(request.output_schema) then
    local schema, wrapped = shared.object_schema(request.output_schema)
    final = { schema = schema, wrapped = wrapped }
  end
  local reserved = {}
  if final and config.structured_output == 'tool' then
    final.name = FINAL_NAME
    reserved[FINAL_NAME] = true
  end
  local names, by_name = shared.tool_names(tools, reserved)
  local context = { by_name = by_name, name_of = {}, wrapped = {}, final = final }
  local wire_tools = list()
  for i, t in ipairs(tools) do
    local schema, wrapped = shared.object_schema(t.input_schema)
    context.name_of[t.id] = names[i]
    context.wrapped[names[i]] = wrapped
    wire_tools[i] = object({ name = names[i], description = nonempty(t.description),
      input_schema = schema or object({ type = 'object' }) })
  end
  local body = object({ model = config.model, max_tokens = config.max_tokens })
  if nonempty(request.instructions) then body.system = request.instructions end
  body.messages = messages_of(request, context)
  if final and final.name then
    wire_tools[#wire_tools + 1] = object({ name = final.name,
      description = 'Give the final answer. Call this tool once the task is done, with the answer as its input.',
      input_schema = final.schema })
    body.tool_choice = object({ type = 'any' })
  elseif final then
    body.output_config = object({ format = object({ type = 'json_schema', schema = output_schema(final.schema) }) })
  end
  if #wire_tools > 0 then body.tools = wire_tools end
  local headers = {
    ['x-api-key'] = config.api_key(),
    ['anthropic-version'] = VERSION,
    ['content-type'] = 'application/json',
  }
  return { url = config.base_url .. '/v1/messages', headers = headers, body = body }, context
end

local function request_id(headers)
  local id = type(headers) == 'table' and headers['request-id'] or nil
  if type(id) == 'string' and #id <= 128 and id:match('^[%w_%.%-]+$') then return id end
  return nil
end

-- The usage of a response, with its cost.
local function usage_of(config, u, res)
  local usage = { request_id = request_id(res and res.headers) }
  local input = type(u) == 'table' and shared.tokens(u.input_tokens) or nil
  local output = type(u) == 'table' and shared.tokens(u.output_tokens) or nil
  if not input or not output then
    usage.cost_micros = config.max_cost_micros
    return usage
  end
  local read = shared.tokens(u.cache_read_input_tokens) or 0
  local write = shared.tokens(u.cache_creation_input_tokens) or 0
  local split = type(u.cache_creation) == 'table' and u.cache_creation or nil
  local w5, w1 = write, 0
  if split then
    local a, b = shared.tokens(split.ephemeral_5m_input_tokens), shared.tokens(split.ephemeral_1h_input_tokens)
    if a or b then w5, w1 = a or 0, b or 0 end
  end
  local p = config.pricing
  local pin = p.input_micros_per_million_tokens
  local read_term = p.cached_input_micros_per_million_tokens and { read, p.cached_input_micros_per_million_tokens }
    or { read, pin, 2 }
  usage.input_tokens, usage.output_tokens = input, output
  usage.cache_read_tokens, usage.cache_write_tokens = read, w5 + w1
  usage.cost_micros = shared.cost_micros({
    { input, pin }, { w5, pin, 25 }, { w1, pin, 40 }, read_term, { output, p.output_micros_per_million_tokens },
  })
  return usage
end

local INCOMPLETE = { max_tokens = true, model_context_window_exceeded = true, pause_turn = true }

--- The step of a decoded response body.
function messages.from_response(config, body, context, res)
  local label = config.label
  if body.type == 'error' then
    local code = shared.error_code(body, config.api_key())
    error(shared.model_error(label, 'failed', 'the response is an error' .. (code and (' (' .. code .. ')') or ''),
      { provider_code = code }), 0)
  end
  local stop = body.stop_reason
  if INCOMPLETE[stop] then
    error(shared.model_error(label, 'incomplete', 'the answer was cut short (' .. stop .. ')',
      { provider_code = stop }), 0)
  end
  if stop == 'refusal' then error(shared.model_error(label, 'refused', 'the model refused to answer'), 0) end
  if type(body.content) ~= 'table' then invalid(config, 'the response has no content') end
  local usage = usage_of(config, body.usage, res)
  local final = context.final
  local calls, texts = {}, {}
  local answer, answered = nil, false
  for _, b in ipairs(body.content) do
    if type(b) ~= 'table' then invalid(config, 'a content block is not an object') end
    if b.type == 'tool_use' then
      if not nonempty(b.id) or not nonempty(b.name) then invalid(config, 'a tool_use block has no id or name') end
      if final and final.name and b.name == final.name and not answered then
        answer, answered = b.input, true
      else
        calls[#calls + 1] = { id = b.id, tool_id = context.by_name[b.name] or b.name,
          input = call_input(b.input, context.wrapped[b.name]) }
      end
    elseif b.type == 'text' and type(b.text) == 'string' then
      texts[#texts + 1] = b.text
    end
  end
  if answered then
    if type(answer) == 'string' then answer = shared.decode(answer) end
    if type(answer) ~= 'table' then
      error(shared.model_error(label, 'invalid_output', 'the final answer is not an object'), 0)
    end
    return { type = 'final', output = shared.unwrap(label, answer, final.wrapped), usage = usage }
  end
  local text = table.concat(texts)
  if #calls > 0 then
    return { type = 'tool_calls', calls = calls, text = nonempty(text), extra = { anthropic = body.content },
      usage = usage }
  end
  return { type = 'final', output = shared.final_output(label, text, final), usage = usage }
end

-- 429 codes that waiting does not clear.
local NO_RETRY = { enforced_spend_limit_reached = true }

--- The error for an HTTP status that is not 2xx, and whether to retry (529 is).
function messages.map_error(config, status, _headers, body)
  local err, retry = shared.http_error(config.label, status, body, config.api_key())
  if status == 429 and type(body) == 'table' and type(body.error) == 'table'
    and type(body.error.details) == 'table' and NO_RETRY[body.error.details.error_code] then
    retry = false
  end
  return err, retry
end

--- The body field that caps the output tokens (see mayura.provider._shared).
messages.output_tokens_field = 'max_tokens'

M.messages = messages

--- A model over the Messages API (id 'anthropic.messages'); options in the module header.
function M.anthropic_messages(options)
  local config = shared.config(options, {
    label = 'anthropic.messages', base_url = DEFAULT_BASE, key_required = true, cost_required = true,
    keys = { max_tokens = true, structured_output = true }, max_retry_after_ms = MAX_RETRY_AFTER_MS,
  }, 2)
  config.max_tokens = check.int(options.max_tokens, 'max_tokens', 1, 1000000, 'INVALID_CONFIG', 3, 4096)
  local so = options.structured_output or 'output_config'
  if so ~= 'output_config' and so ~= 'tool' then
    shared.config_error("structured_output must be 'output_config' or 'tool'")
  end
  config.structured_output = so
  return shared.new_model(messages, config)
end

return M
