--- mayura.provider._shared: what the model adapters have in common.
--
-- Every adapter (mayura.provider.openai, mayura.provider.anthropic) is a
-- table of three verbs over one wire format:
--
--   to_request(config, request)          -> wire = { url, headers, body }, context
--   from_response(config, body, context, response) -> a step for the runtime
--   map_error(config, status, headers, body)       -> a MODEL_ERROR, and whether to retry
--
-- and `new_model(adapter, config)` makes the model the runtime calls:
-- `model.id`, `model.max_cost_micros`, `model:call(request)`. A call builds
-- the wire request, sends it (the same bytes on every attempt) and reads the
-- answer. A call never costs more than `max_cost_micros` when prices are
-- known: the request's maximum of output tokens (the adapter's
-- `output_tokens_field`) is capped to what the ceiling leaves after its input,
-- counted as at most one token per byte of the request body plus an
-- allowance (see `output_room`); a request whose input alone may pass the
-- ceiling is not sent and raises BUDGET_EXCEEDED. What goes wrong otherwise
-- is raised as MODEL_ERROR with a `reason`:
--
--   authentication   HTTP 401 or 403
--   rate_limited     HTTP 429, after the retries
--   unavailable      HTTP 408, 409, 5xx (529 too) or no connection, after the retries
--   timeout          no answer within `timeout_ms`, after the retries
--   invalid_request  HTTP 400, 404, 413, 422 (the request or its schemas were refused)
--   incomplete       the answer was cut (max tokens, content filter, context window)
--   refused          the model refused to answer
--   invalid_response a body that is not the documented shape
--   invalid_output   a final answer that is not valid JSON
--   failed           anything else
--
-- The error carries `status` (the HTTP status, when there was one) and
-- `provider_code` (the error's short code or type from the body, when it is
-- a plain token); its message is ours, never the provider's text.
--
-- Retries: connection failures, timeouts, 408, 409, 429 and 5xx are tried
-- again up to `max_retries` times (an `x-should-retry` header overrides the
-- status rule). The wait is the server's `retry-after-ms` or `retry-after`
-- (seconds, or an HTTP date) when it is above 0 and at most the adapter's cap
-- (a longer wait is not retried); otherwise `min(retry_base_ms * 2^n, 8 s)`
-- times a jitter in [0.75, 1]. A wait ends at once, raising CANCELLED, when
-- the run's cancel token (`request.signal`) is cancelled.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local http = require('mayura.http')
local task = require('mayura._task')

local M = {}

local json = core.json
local array_mt = json.array_mt
local object_mt = json.object_mt

M.json = json
M.null = json.null

local MAX_DEPTH = 200            -- nesting accepted in bodies and tool arguments
local MAX_TOKENS_COUNTED = 1e8   -- a token count above this is not believed
local MAX_OUTPUT_TOKENS_ASKED = 100000000   -- the most output tokens a request is sent with
local MAX_PRICE = 1e9            -- micro-dollars per million tokens ($1000 per token million)
local BACKOFF_CAP_MS = 8000

--- A JSON array (encodes as `[]` even when empty).
function M.list(t)
  return setmetatable(t or {}, array_mt)
end

--- A JSON object (encodes as `{}` even when empty).
function M.object(t)
  return setmetatable(t or {}, object_mt)
end

--- A deep copy that keeps the JSON metatables.
function M.copy(v, depth)
  depth = depth or 0
  if type(v) ~= 'table' or depth > MAX_DEPTH then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = M.copy(x, depth + 1) end
  return setmetatable(out, getmetatable(v))
end

-- {======================================================
-- Errors
-- =======================================================

--- A MODEL_ERROR: `label: message`, with `reason` and the given fields.
function M.model_error(label, reason, message, fields)
  local f = { reason = reason }
  if fields then
    for k, v in pairs(fields) do f[k] = v end
  end
  return errors.new('MODEL_ERROR', label .. ': ' .. message, f)
end

--- The short code of a provider's error body, when it is a plain token that
-- does not contain the key: `error.code`, else `error.type`, nested or at the top.
function M.error_code(body, api_key)
  if type(body) ~= 'table' then return nil end
  local e = type(body.error) == 'table' and body.error or body
  local candidates = { e.code, e.type, body.code }
  for i = 1, 3 do
    local c = candidates[i]
    if http.plain_token(c, api_key) then return c end
  end
  return nil
end

local REASON_BY_STATUS = {
  [400] = 'invalid_request', [401] = 'authentication', [403] = 'authentication', [404] = 'invalid_request',
  [408] = 'unavailable', [409] = 'unavailable', [413] = 'invalid_request', [422] = 'invalid_request',
  [429] = 'rate_limited',
}

local WHAT_BY_REASON = {
  invalid_request = 'the request was refused',
  authentication = 'the API key was refused',
  unavailable = 'the service is unavailable',
  rate_limited = 'the rate limit was reached',
  failed = 'the call failed',
}

--- The error for an HTTP answer that is not a 2xx, and whether to retry it:
-- 408, 409, 429 and 5xx are retried.
function M.http_error(label, status, body, api_key)
  local reason = REASON_BY_STATUS[status]
  if not reason then reason = status >= 500 and 'unavailable' or 'failed' end
  local code = M.error_code(body, api_key)
  local message = 'HTTP ' .. status .. (code and (' (' .. code .. ')') or '') .. ': ' .. WHAT_BY_REASON[reason]
  local retry = status == 408 or status == 409 or status == 429 or status >= 500
  return M.model_error(label, reason, message, { status = status, provider_code = code }), retry
end

-- }======================================================

-- {======================================================
-- Options
-- =======================================================

-- Raises INVALID_CONFIG at `level` counted from the function that calls cfg_error.
local function cfg_error(message, level)
  errors.raise('INVALID_CONFIG', message, nil, level + 2)
end

--- Raises INVALID_CONFIG for the caller of the adapter's constructor.
function M.config_error(message)
  errors.raise('INVALID_CONFIG', message, nil, 4)
end

--- Checks the options every adapter shares and returns the config table.
-- `spec` = { label, keys (extra allowed keys), base_url, key_required, cost_required,
-- pricing_keys (extra keys of pricing), max_retry_after_ms }.
function M.config(options, spec, level)
  level = (level or 2) + 1
  local label = spec.label
  if type(options) ~= 'table' then cfg_error(label .. ' expects an options table', level) end
  local allowed = {
    api_key = true, model = true, base_url = true, max_cost_micros = true, pricing = true,
    timeout_ms = true, max_retries = true, retry_base_ms = true,
  }
  for k in pairs(spec.keys or {}) do allowed[k] = true end
  check.keys(options, allowed, label .. ' options', 'INVALID_CONFIG', level + 1)
  local key = options.api_key
  if key ~= nil or spec.key_required then
    -- never echo the key: the messages only say what is wrong with it
    if type(key) ~= 'string' or key == '' then cfg_error('api_key must be a non-empty string', level) end
    if #key > 4096 or key:find('[%c ]') then
      cfg_error('api_key must not contain spaces or control characters', level)
    end
  end
  if type(options.model) ~= 'string' or options.model == '' or #options.model > 256 then
    cfg_error('model must be a non-empty string', level)
  end
  local base = options.base_url or spec.base_url
  if type(base) ~= 'string' or not base:match('^https?://[^%s]+$') or base:find('%c') then
    cfg_error('base_url must be an http:// or https:// URL', level)
  end
  base = base:gsub('/+$', '')
  local C = 'INVALID_CONFIG'
  local max_cost
  if options.max_cost_micros == nil and spec.cost_required then
    cfg_error('max_cost_micros is required: what one model call may cost at most', level)
  end
  max_cost = check.int(options.max_cost_micros, 'max_cost_micros', 0, nil, C, level + 1, 0)
  local pricing
  if options.pricing == nil then
    if spec.cost_required then
      cfg_error('pricing is required: { input_micros_per_million_tokens, output_micros_per_million_tokens }', level)
    end
  else
    local p = options.pricing
    local pkeys = { input_micros_per_million_tokens = true, output_micros_per_million_tokens = true,
      cached_input_micros_per_million_tokens = true }
    for k in pairs(spec.pricing_keys or {}) do pkeys[k] = true end
    check.keys(p, pkeys, 'pricing', C, level + 1)
    pricing = {}
    for k in pairs(pkeys) do
      local required = k == 'input_micros_per_million_tokens' or k == 'output_micros_per_million_tokens'
      if p[k] ~= nil or required then pricing[k] = check.int(p[k], 'pricing.' .. k, 0, MAX_PRICE, C, level + 1) end
    end
  end
  local config = {
    label = label,
    model = options.model,
    base_url = base,
    max_cost_micros = max_cost,
    pricing = pricing,
    timeout_ms = check.int(options.timeout_ms, 'timeout_ms', 1, 3600000, C, level + 1, 600000),
    max_retries = check.int(options.max_retries, 'max_retries', 0, 10, C, level + 1, 2),
    retry_base_ms = check.int(options.retry_base_ms, 'retry_base_ms', 0, 60000, C, level + 1, 500),
    max_retry_after_ms = spec.max_retry_after_ms or 60000,
    cost_required = spec.cost_required == true,
  }
  -- the key lives in a closure, so printing the config or the model does not show it
  config.api_key = function() return key end
  return config
end

-- }======================================================

-- {======================================================
-- Schemas and tool names
-- =======================================================

local function has(list, v)
  if type(list) ~= 'table' then return list == v end
  for _, x in ipairs(list) do
    if x == v then return true end
  end
  return false
end

local function strict_node(s, depth)
  if type(s) ~= 'table' or depth > 64 then return false end
  if s.default ~= nil then return false end
  if s['$ref'] ~= nil then
    -- a $ref with sibling keywords is not usable in strict mode
    for k in pairs(s) do
      if k ~= '$ref' then return false end
    end
    return true
  end
  if s.type == nil and s.anyOf == nil and s.enum == nil and s.const == nil then return false end
  if has(s.type, 'object') or s.properties ~= nil then
    if s.additionalProperties ~= false then return false end
    local required = {}
    if s.required ~= nil then
      if type(s.required) ~= 'table' then return false end
      for _, k in ipairs(s.required) do required[k] = true end
    end
    if s.properties ~= nil and type(s.properties) ~= 'table' then return false end
    for k, v in pairs(s.properties or {}) do
      if not required[k] or not strict_node(v, depth + 1) then return false end
    end
  end
  if s.items ~= nil and not strict_node(s.items, depth + 1) then return false end
  for _, key in ipairs({ 'anyOf', '$defs', 'definitions' }) do
    local sub = s[key]
    if sub ~= nil then
      if type(sub) ~= 'table' then return false end
      for _, v in pairs(sub) do
        if not strict_node(v, depth + 1) then return false end
      end
    end
  end
  return true
end

--- Whether a JSON Schema can be sent with `strict = true`: an object at the
-- root, every object node with `additionalProperties: false` and all its
-- properties required, no `default`, no `$ref` with siblings, every node typed.
function M.is_strict_schema(schema)
  return type(schema) == 'table' and schema.type == 'object' and strict_node(schema, 0)
end

--- A schema as an object schema for a tool or a final answer. Returns the
-- schema to send and whether it was wrapped as `{ value = ... }`: a schema
-- that says nothing (anything goes) becomes any object, another non-object
-- root is wrapped. Returns nil for `nil`.
function M.object_schema(schema)
  if type(schema) ~= 'table' then return nil, false end
  if schema.type == 'object' then return schema, false end
  local empty = true
  for k in pairs(schema) do
    if k ~= 'description' then empty = false end
  end
  if empty then return M.object({ type = 'object' }), false end
  return M.object({
    type = 'object',
    properties = M.object({ value = schema }),
    required = M.list({ 'value' }),
    additionalProperties = false,
  }), true
end

--- Whether an output schema says nothing (the agent takes any answer).
function M.is_any_schema(schema)
  if type(schema) ~= 'table' then return true end
  for k in pairs(schema) do
    if k ~= 'description' then return false end
  end
  return true
end

--- Names for the tools that the APIs accept (`a-z A-Z 0-9 _ -`, at most 64):
-- other characters become `_`, and a name taken already gets a suffix `_2`,
-- `_3`... Returns the names (in the order of `tools`) and a map name -> tool id.
-- `reserved` (a set) holds names that no tool may get.
function M.tool_names(tools, reserved)
  local names, by_name, used = {}, {}, {}
  for k in pairs(reserved or {}) do used[k] = true end
  for i, t in ipairs(tools or {}) do
    local base = tostring(t.id):gsub('[^%w_%-]', '_'):sub(1, 64)
    if base == '' then base = 'tool' end
    local name, n = base, 1
    while used[name] do
      n = n + 1
      local suffix = '_' .. n
      name = base:sub(1, 64 - #suffix) .. suffix
    end
    used[name] = true
    names[i] = name
    by_name[name] = t.id
  end
  return names, by_name
end

--- A name not in `used` (a set), from `base`.
function M.free_name(base, used)
  local name, n = base, 1
  while used[name] do
    n = n + 1
    name = base .. '_' .. n
  end
  return name
end

-- }======================================================

-- {======================================================
-- JSON in and out
-- =======================================================

--- Decodes untrusted JSON: the value, or nil.
function M.decode(text)
  if type(text) ~= 'string' then return nil end
  local ok, v = pcall(json.decode, text, { max_depth = MAX_DEPTH })
  if ok then return v end
  return nil
end

--- The text sent for the run's input: a string as it is (never empty),
-- anything else as JSON text.
function M.input_text(content)
  if type(content) == 'string' then
    if content:find('%S') then return content end
    return '(empty)'
  end
  local ok, text = pcall(json.encode, content)
  if not ok then errors.raise('INVALID_INPUT', 'the run input cannot be sent as JSON', nil, 2) end
  return text
end

--- A tool result as JSON text (an error object when it cannot be encoded).
function M.result_text(result)
  local ok, text = pcall(json.encode, result)
  if ok then return text end
  return '{"error":{"code":"INVALID_OUTPUT","message":"the tool result cannot be sent as JSON"}}'
end

--- The tool message for an invalid-JSON call, when the runtime handed back
-- an error for it: says what was wrong with the call.
M.INVALID_JSON_RESULT = {
  error = { code = 'INVALID_INPUT', message = 'the arguments were not valid JSON; send them again as one JSON object' },
}

--- The input of a call from its arguments text. Arguments that are not valid
-- JSON give `{ _invalid_json = raw }` (the runtime checks it against the
-- tool's schema and hands the error back); empty arguments give `{}`.
function M.decode_arguments(raw)
  if type(raw) ~= 'string' then return { _invalid_json = '' } end
  if not raw:find('%S') then return M.object() end
  local v = M.decode(raw)
  if v == nil then return { _invalid_json = raw } end
  return v
end

--- Whether a call's input is the mark of invalid JSON arguments.
function M.is_invalid_input(input)
  return type(input) == 'table' and type(input._invalid_json) == 'string'
end

--- Whether a tool result is the runtime's error result.
function M.is_error_result(result)
  return type(result) == 'table' and type(result.error) == 'table' and result.error.code ~= nil
end

--- The final output from the answer's text. `final` is the context's final
-- answer description (`{ wrapped = bool }`), or nil when any answer goes:
-- then the text is decoded when it is JSON and given as it is otherwise.
function M.final_output(label, text, final)
  local v = M.decode(text)
  if final == nil then
    if v == nil then return text end
    return v
  end
  if v == nil then
    errors.raise('MODEL_ERROR', label .. ': the final answer is not valid JSON', { reason = 'invalid_output' }, 0)
  end
  return M.unwrap(label, v, final.wrapped)
end

--- `v.value` when the schema was wrapped.
function M.unwrap(label, v, wrapped)
  if not wrapped then return v end
  if type(v) ~= 'table' then
    errors.raise('MODEL_ERROR', label .. ': the final answer is not an object with a value',
      { reason = 'invalid_output' }, 0)
  end
  return v.value
end

-- }======================================================

-- {======================================================
-- Cost
-- =======================================================

--- A token count read from a usage object: a whole number at least 0, or nil.
function M.tokens(v)
  if not check.is_int(v) or v < 0 or v > MAX_TOKENS_COUNTED then return nil end
  return math.tointeger and math.tointeger(v) or v
end

--- ceil(a / b) for whole a >= 0, b > 0.
function M.ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b < a then q = q + 1 end
  if q > 0 and (q - 1) * b >= a then q = q - 1 end
  return q
end

--- Tokens of input counted for a request whatever its size: what a service
-- adds around the body (its message framing; Anthropic's prompt for tool use
-- is about 350 tokens).
M.INPUT_ALLOWANCE_TOKENS = 512

--- The fewest output tokens a call is made with (the Responses API refuses
-- fewer than 16): a ceiling that leaves room for less refuses the call.
M.MIN_OUTPUT_TOKENS = 16

--- Micro-dollars for `terms` = { { tokens, price, weight }, ... }: prices in
-- micro-dollars per million tokens, weights in twentieths (20 = the price as it
-- is, 25 = 1.25 times it), rounded up to a whole micro-dollar.
function M.cost_micros(terms)
  local sum = 0
  for _, t in ipairs(terms) do
    sum = sum + t[1] * t[2] * (t[3] or 20)
  end
  return M.ceil_div(sum, 20000000)
end

--- Whether calls of `config` are held to a ceiling: prices are known and
-- `max_cost_micros` is required or given (Chat Completions without either
-- has none).
function M.has_ceiling(config)
  return config.pricing ~= nil and (config.cost_required or config.max_cost_micros > 0)
end

--- The most output tokens a call may ask for, when its request body is
-- `bytes` long, so that it cannot cost more than `max_cost_micros`: its input
-- counted conservatively as one token per byte of the body (a token is at
-- least a byte; JSON syntax and escapes only add bytes) plus
-- INPUT_ALLOWANCE_TOKENS, all at the uncached input price. Returns nil when
-- output is free (no bound), and a number below 0 when the input alone may
-- cost more than the ceiling; also returns the input cost counted.
function M.output_room(config, bytes)
  local p = config.pricing
  local max = config.max_cost_micros
  local input = bytes + M.INPUT_ALLOWANCE_TOKENS
  local pin, pout = p.input_micros_per_million_tokens, p.output_micros_per_million_tokens
  local input_cost = M.cost_micros({ { input, pin } })
  if input_cost > max then return -1, input_cost end
  if pout == 0 then return nil, input_cost end
  -- cost <= max  <=>  input * pin + out * pout <= max * 10^6
  local out = math.floor((max * 1000000 - input * pin) / pout)
  if out > MAX_OUTPUT_TOKENS_ASKED then out = MAX_OUTPUT_TOKENS_ASKED end
  -- floating point may be a token or two off: step down to what fits exactly
  while out > 0 and M.cost_micros({ { input, pin }, { out, pout } }) > max do out = out - 1 end
  return out, input_cost
end

--- Caps `body[field]` (the request's maximum of output tokens) so that the
-- call cannot cost more than `max_cost_micros`: the smaller of what the body
-- asks for already and `output_room`. A ceiling that leaves room for fewer
-- than MIN_OUTPUT_TOKENS (or fewer than the body asks for, when that is
-- lower) raises BUDGET_EXCEEDED: the call is not made.
function M.cap_output(config, body, field)
  local ok, payload = pcall(json.encode, body)
  if not ok then return end   -- send says what is wrong with it
  local room, input_cost = M.output_room(config, #payload)
  if room == nil then return end
  local asked = body[field]
  local least = M.MIN_OUTPUT_TOKENS
  if type(asked) == 'number' and asked < least then least = asked end
  if room < least then
    errors.raise('BUDGET_EXCEEDED', config.label .. ': the request (' .. #payload .. ' bytes) may cost up to '
      .. input_cost .. ' micros before any output, leaving room for fewer than ' .. least
      .. ' output tokens within max_cost_micros (' .. config.max_cost_micros .. '): the call was not made', nil, 0)
  end
  if type(asked) ~= 'number' or room < asked then body[field] = room end
end

-- }======================================================

-- {======================================================
-- Sending
-- =======================================================

-- The retry helpers are mayura.http's, shared with the hosted sandbox kit.
M.http_date = http.http_date
M.retry_after_ms = http.retry_after_ms

-- Waits `ms`, ending early with CANCELLED when `signal` is cancelled.
local function pause(ms, signal)
  task.sleep(ms, signal, 'the model call was cancelled')
end

--- The delay before attempt `n + 1` (n from 0) when the server named none.
function M.backoff_ms(base, n)
  return http.backoff_ms(base, n, BACKOFF_CAP_MS)
end

-- The error of a failed transfer, and whether to retry it.
local function transport_error(label, err)
  local code = type(err) == 'table' and err.code or nil
  if code == 'CANCELLED' then errors.raise('CANCELLED', 'the model call was cancelled', nil, 0) end
  if code == 'TIMEOUT' then
    return M.model_error(label, 'timeout', 'no answer within timeout_ms'), true
  end
  if code == 'CONNECT_FAILED' or code == 'NETWORK_ERROR' then
    return M.model_error(label, 'unavailable', 'the service could not be reached'), true
  end
  if code == 'LIMIT_EXCEEDED' then
    return M.model_error(label, 'invalid_response', 'the response is too large'), false
  end
  return M.model_error(label, 'failed', 'the request could not be made'), false
end

--- Sends `wire` = { url, headers, body (a table) } for `adapter` with
-- `config`, retrying as the module header says. Returns `{ status, headers,
-- body }` with the body decoded (a table), or raises.
function M.send(config, adapter, wire, signal)
  local label = config.label
  local ok_enc, payload = pcall(json.encode, wire.body)
  if not ok_enc then
    errors.raise('INVALID_INPUT', label .. ': the request cannot be encoded as JSON', nil, 0)
  end
  local attempt = 0
  while true do
    if signal and signal.cancelled then errors.raise('CANCELLED', 'the model call was cancelled', nil, 0) end
    local ok, res = pcall(http.request, {
      url = wire.url,
      method = 'POST',
      headers = wire.headers,
      body = payload,
      timeout_ms = config.timeout_ms,
      connect_timeout_ms = math.min(config.timeout_ms, 30000),
      max_body_bytes = 32 * 1048576,
      signal = signal,
    })
    local err, retry, headers
    if not ok then
      err, retry = transport_error(label, res)
    else
      headers = type(res.headers) == 'table' and res.headers or {}
      local body = M.decode(res.body)
      if res.status >= 200 and res.status < 300 then
        if type(body) ~= 'table' then
          errors.raise('MODEL_ERROR', label .. ': the response is not a JSON object',
            { reason = 'invalid_response', status = res.status }, 0)
        end
        return { status = res.status, headers = headers, body = body }
      end
      err, retry = adapter.map_error(config, res.status, headers, body)
      local should = headers['x-should-retry']
      if should == 'true' then retry = true elseif should == 'false' then retry = false end
    end
    if not retry or attempt >= config.max_retries then error(err, 0) end
    local delay = M.retry_after_ms(headers)
    if delay and delay > config.max_retry_after_ms then error(err, 0) end
    if not delay or delay <= 0 then delay = M.backoff_ms(config.retry_base_ms, attempt) end
    attempt = attempt + 1
    if delay > 0 then pause(delay, signal) end
  end
end

-- }======================================================

-- {======================================================
-- The model
-- =======================================================

local Model = {}
Model.__index = Model

--- One model call: `request` = { instructions, messages, tools, output_schema, signal }.
function Model:call(request)
  if type(request) ~= 'table' then errors.raise('INVALID_INPUT', 'call expects a request table') end
  local adapter, config = self._adapter, self._config
  local wire, context = adapter.to_request(config, request)
  if adapter.output_tokens_field and M.has_ceiling(config) then
    M.cap_output(config, wire.body, adapter.output_tokens_field)
  end
  local res = M.send(config, adapter, wire, request.signal)
  local ok, step = pcall(adapter.from_response, config, res.body, context, res)
  if ok then return step end
  if errors.is(step) then error(step, 0) end
  errors.raise('MODEL_ERROR', config.label .. ': the response could not be read',
    { reason = 'invalid_response', status = res.status })
end

--- The model for `adapter` and `config` (from M.config).
function M.new_model(adapter, config)
  return setmetatable({
    id = config.label,
    model = config.model,
    max_cost_micros = config.max_cost_micros,
    _adapter = adapter,
    _config = config,
  }, Model)
end

M.Model = Model

-- }======================================================

return M
