--- The contract every model adapter keeps (mayura.provider.openai's
-- openai_responses and openai_chat_completions, mayura.provider.anthropic's
-- anthropic_messages), written once and run against each over real HTTP on
-- loopback (support/model_server.lua), plus the set-up their specs share.
--
--   local contract = require('support.model_contract')
--   contract.run(WIRE)            -- the contract, against the adapter WIRE describes
--   -- and for the cases of the adapter's own:
--   local new_model, model_error = contract.kit(WIRE, { api_key = KEY, model = 'claude-test', ... })
--   local request = contract.builder({ instructions = '...', messages = { ... }, tools = { ... } })
--   describe('anthropic_messages', function()
--     local srv
--     contract.serve(function(s) srv = s end)   -- a new stand-in for each case, closed after it
--     ... model_error('refused', model.call, model, request({ tools = {} }))
--
-- The contract: options refused with INVALID_CONFIG and the key kept out of
-- sight; 401/403 authentication, 400/404/422 invalid_request, neither retried;
-- 429 waits for retry-after (up to the adapter's cap) or backs off, then ends
-- rate_limited; 5xx and refused connections retried, then unavailable; a
-- stalled server ends in timeout; a cancelled run ends a wait at once; refusals,
-- answers that are not JSON and bodies of any shape end in a MODEL_ERROR,
-- never a crash; tool-call arguments that are not JSON go back to the model as
-- a tool error; costs from usage and pricing, rounded up, and the reservation
-- when usage cannot be read; the output-token cap from `max_cost_micros`, and
-- BUDGET_EXCEEDED before sending when the input alone may pass it; and all of
-- it in whole runs. An error message never holds the key or the API's text.
--
-- A wire description (WIRE) says how one adapter's API looks:
--
--   name, new, id          'anthropic_messages', the constructor, the model id (and grant)
--   path                   where the API lives on the stand-in ('/v1', or '' when the adapter adds it)
--   key, secrets           the API key, and the texts no error message may hold
--                          (the key, and words of the API's error text)
--   required               the options a model cannot be made without, but `model`
--   output_field           the option and the body field of the output-token cap
--   default_output_tokens  what the body asks for without the option (nil: the field is left out)
--   max_retry_after_s      the longest retry-after the adapter waits for
--   tokens                 the usage fields of input and output tokens
--   usage(input, output)   a usage object, as JSON text
--   final(text, usage)     an answer whose final text is `text` (`usage` as JSON text, or a default)
--   calls(calls, usage)    an answer with tool calls, each { id, name, arguments (the text sent) }
--   refusal()              an answer in which the model refuses
--   errors                 error answers: authentication (401), permission (403),
--                          invalid_request, rate_limit, quota (a 429 waiting does
--                          not clear), unavailable (with its `status`); each
--                          { body, code = the short code the error keeps }
--   malformed              bodies of the wrong shape for this API (the contract adds shapeless ones)
--   kept                   text of an answer with calls that only goes back when the step's
--                          content is replayed as it came (reasoning, thinking); nil: none
--   history(req, call, result)  reads what a request sends back of the conversation, in
--                          order: call(id, arguments as sent) for each tool call replayed,
--                          result(id, text) for each tool result

-- busted's API, as a spec file sees it (a module does not get its environment)
local busted = require('busted')
local describe, it, assert = busted.describe, busted.it, busted.assert
local before_each, after_each = busted.before_each, busted.after_each
local mayura = require('mayura')
local shared = require('mayura.provider._shared')
local task = require('mayura._task')
local core = require('mayura.core')
local uv = require('luv')
local model_server = require('support.model_server')

local json = core.json
local z = mayura.z

local M = {}

-- {======================================================
-- What the specs of the adapters share
-- =======================================================

--- A copy of `base` with the fields of `fields` set over it.
function M.with(base, fields)
  local t = {}
  for k, v in pairs(base) do t[k] = v end
  for k, v in pairs(fields or {}) do t[k] = v end
  return t
end

--- A function of `fields` that gives a copy of `base` with them set over it
-- (a request with some fields of its own).
function M.builder(base)
  return function(fields) return M.with(base, fields) end
end

local current   -- the stand-in of the case that runs

--- A new stand-in before each case of the enclosing describe, handed to
-- `set`, and closed after it.
function M.serve(set)
  before_each(function()
    current = model_server.new()
    set(current)
  end)
  after_each(function()
    current:close()
    -- run the pending close callbacks: luv 1.44 crashes at exit on a handle still closing
    uv.new_timer():close()
    core.run_once()
  end)
end

--- Asserts that fn(...) raises MODEL_ERROR with `reason` and a message
-- holding none of the wire's secrets; returns the error.
function M.model_error(wire, reason, fn, ...)
  local err = assert.raises_code('MODEL_ERROR', fn, ...)
  assert.are.equal(reason, err.reason, err.message)
  for _, secret in ipairs(wire.secrets) do
    assert.is_nil(err.message:find(secret, 1, true), secret)
  end
  return err
end

--- The helpers of a spec of `wire`'s adapter: new_model(options), a model
-- against the stand-in of the case with `defaults` under `options`, and
-- model_error(reason, fn, ...), M.model_error for `wire`.
function M.kit(wire, defaults)
  local function new_model(options)
    return wire.new(M.with(M.with({ base_url = current:url(wire.path), retry_base_ms = 1 }, defaults), options))
  end
  local function model_error(reason, fn, ...)
    return M.model_error(wire, reason, fn, ...)
  end
  return new_model, model_error
end

--- Milliseconds since `t0` (uv.hrtime()).
function M.ms_since(t0)
  return (uv.hrtime() - t0) / 1e6
end

-- }======================================================

-- What every model of the contract is held to: 1.25 $ a million input
-- tokens, 10 $ a million output tokens, at most 40000 micro-dollars a call.
local PRICING = { input_micros_per_million_tokens = 1250000, output_micros_per_million_tokens = 10000000 }
local MAX_COST = 40000

local RESULT = z.object({ summary = z.string(), files = z.array(z.string()) })
local ANSWER = '{"summary":"s","files":[]}'
local TASK = z.object({ task = z.string() })

local request = M.builder({
  instructions = 'You are a build agent.',
  messages = { { role = 'user', content = { task = 'Summarize README.md' } } },
  tools = { { id = 'workspace.read', description = 'Read a file.',
    input_schema = z.object({ path = z.string() }):json_schema() } },
  output_schema = RESULT:json_schema(),
})

--- Runs the contract against the adapter `wire` describes.
function M.run(wire)
  local srv
  local field = wire.output_field

  local new_model, model_error = M.kit(wire, { api_key = wire.key, model = 'test-model', max_cost_micros = MAX_COST,
    pricing = PRICING })

  local function final(text, usage)
    return wire.final(text or ANSWER, usage)
  end

  -- What `req` sends back: { calls = { { id, arguments } }, results = { { id, text } } }.
  local function sent(req)
    local out = { calls = {}, results = {} }
    wire.history(req, function(id, arguments)
      out.calls[#out.calls + 1] = { id = id, arguments = arguments }
    end, function(id, text)
      out.results[#out.results + 1] = { id = id, text = text }
    end)
    return out
  end

  -- An answer with the status and headers given and the body of wire.errors[kind].
  local function failure(status, kind, headers)
    return { status = status, headers = headers, body = wire.errors[kind].body }
  end

  local function agent(model, tool_run)
    return mayura.define_agent({
      id = 'summarizer', version = '1', instructions = 'Summarize the file.',
      input = TASK, output = RESULT, model = model,
      tools = { {
        id = 'workspace.read', description = 'Read a file.', effect = 'read',
        input = z.object({ path = z.string() }),
        run = tool_run or function(input) return { text = 'contents of ' .. input.path } end,
      } },
    })
  end

  local GRANTS = { 'model:' .. wire.id, 'tool:workspace.read', 'effect:read' }

  -- The outcome of a run of `a` (an agent) with `limits`, the runtime closed again.
  local function run(a, limits)
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS }, limits = limits })
    local outcome = runtime:submit(a, { input = { task = 'Summarize README.md' } }):result()
    runtime:close()
    return outcome
  end

  describe(wire.name .. ' keeps the model adapter contract', function()
    M.serve(function(s) srv = s end)

    describe('failure modes', function()
      it('refuses bad options with INVALID_CONFIG, never echoing the key nor keeping it in the model', function()
        local base = { api_key = wire.key, model = 'm', max_cost_micros = 1, pricing = PRICING }
        local function refused(k, v)
          return assert.raises_code('INVALID_CONFIG', wire.new, M.with(base, { [k] = v }))
        end
        assert.raises_code('INVALID_CONFIG', wire.new, nil)
        assert.raises_code('INVALID_CONFIG', wire.new, {})
        for _, k in ipairs(wire.required) do
          local without = M.with(base)
          without[k] = nil
          assert.raises_code('INVALID_CONFIG', wire.new, without)
        end
        refused('api_key', '')
        local err = refused('api_key', wire.key .. '\r\nX-Evil: 1')
        for _, secret in ipairs(wire.secrets) do assert.is_nil(err.message:find(secret, 1, true)) end
        refused('model', '')
        local no_model = M.with(base)
        no_model.model = nil
        assert.raises_code('INVALID_CONFIG', wire.new, no_model)
        refused('max_cost_micros', -1)
        refused('max_cost_micros', 1.5)
        refused('pricing', { input_micros_per_million_tokens = 1 })
        refused('pricing', { input_micros_per_million_tokens = 1, output_micros_per_million_tokens = 1, extra = 1 })
        refused('base_url', 'ftp://example.com')
        refused('base_url', 'https://exa mple.com')
        refused('base_url', 'localhost:8080')
        refused('timeout_ms', 0)
        refused('max_retries', 11)
        refused(field, 0)
        for _, unknown in ipairs({ 'temperature', 'tool_choice', 'thinking' }) do refused(unknown, 1) end
        local model = wire.new(base)
        assert.are.equal(wire.id, model.id)
        assert.are.equal(1, model.max_cost_micros)
        -- the key is not a field of the model, nor of its config
        for _, t in ipairs({ model, model._config }) do
          for _, v in pairs(t) do assert.are_not.equal(wire.key, v) end
        end
      end)

      it('401 and 403: MODEL_ERROR authentication, no retry, neither key nor API text in the message', function()
        local model = new_model()
        srv:push(failure(401, 'authentication'))
        local err = model_error('authentication', model.call, model, request())
        assert.are.equal(401, err.status)
        assert.are.equal(wire.errors.authentication.code, err.provider_code)
        assert.are.equal(1, #srv.requests)
        srv:push(failure(403, 'permission'))
        err = model_error('authentication', model.call, model, request())
        assert.are.equal(403, err.status)
        assert.are.equal(wire.errors.permission.code, err.provider_code)
        assert.are.equal(2, #srv.requests)
      end)

      it('a code that carries the key is left out', function()
        local model = new_model()
        srv:push({ status = 401, body = '{"error":{"message":"x","type":"t","code":"' .. wire.key .. '"}}' })
        local err = model_error('authentication', model.call, model, request())
        assert.are.equal('t', err.provider_code)
      end)

      it('400, 404 and 422: invalid_request, not retried', function()
        local model = new_model()
        for _, status in ipairs({ 400, 404, 422 }) do
          srv:push(failure(status, 'invalid_request'))
          local err = model_error('invalid_request', model.call, model, request())
          assert.are.equal(status, err.status)
          assert.are.equal(wire.errors.invalid_request.code, err.provider_code)
        end
        assert.are.equal(3, #srv.requests)
      end)

      it('429 honours retry-after-ms and retry-after in seconds, whole or not, then succeeds', function()
        local model = new_model()
        srv:push(failure(429, 'rate_limit', { ['retry-after-ms'] = '300' }), final())
        local t0 = uv.hrtime()
        local step = model:call(request())
        assert.is_true(M.ms_since(t0) >= 280)
        assert.are.equal('final', step.type)
        assert.are.equal(2, #srv.requests)
        srv:push(failure(429, 'rate_limit', { ['retry-after'] = '1' }), final())
        t0 = uv.hrtime()
        step = model:call(request())
        assert.is_true(M.ms_since(t0) >= 950)
        assert.are.equal('final', step.type)
        assert.are.equal(4, #srv.requests)
        -- the same bytes every attempt
        assert.are.equal(srv.requests[3].body, srv.requests[4].body)
        srv:push(failure(429, 'rate_limit', { ['retry-after'] = '0.2' }), final('{"summary":"ok","files":[]}'))
        t0 = uv.hrtime()
        assert.are.same({ summary = 'ok', files = {} }, model:call(request()).output)
        assert.is_true(M.ms_since(t0) >= 180)
        assert.are.equal(6, #srv.requests)
      end)

      it('429 past max_retries ends rate_limited; an HTTP date in the past means backoff', function()
        local model = new_model({ max_retries = 2 })
        for _ = 1, 3 do
          srv:push(failure(429, 'rate_limit', { ['retry-after'] = 'Sun, 06 Nov 1994 08:49:37 GMT' }))
        end
        local err = model_error('rate_limited', model.call, model, request())
        assert.are.equal(429, err.status)
        assert.are.equal(wire.errors.rate_limit.code, err.provider_code)
        assert.are.equal(3, #srv.requests)
      end)

      it('a 429 that waiting does not clear, or a retry-after past the cap, is not retried', function()
        local model = new_model()
        srv:push(failure(429, 'quota'))
        local err = model_error('rate_limited', model.call, model, request())
        assert.are.equal(wire.errors.quota.code, err.provider_code)
        assert.are.equal(1, #srv.requests)
        for i, wait in ipairs({ wire.max_retry_after_s + 1, 600 }) do
          srv:push(failure(429, 'rate_limit', { ['retry-after'] = tostring(wait) }))
          err = model_error('rate_limited', model.call, model, request())
          assert.are.equal(wire.errors.rate_limit.code, err.provider_code)
          assert.are.equal(1 + i, #srv.requests)
        end
        -- x-should-retry: false overrides the status
        srv:push(failure(503, 'unavailable', { ['x-should-retry'] = 'false' }))
        model_error('unavailable', model.call, model, request())
        assert.are.equal(4, #srv.requests)
      end)

      it('a wait for retry-after ends at once, CANCELLED, when the run is cancelled', function()
        local model = new_model()
        srv:push(failure(429, 'rate_limit', { ['retry-after'] = '30' }))
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

      it('5xx is retried with backoff, then ends unavailable with the short code', function()
        local model = new_model({ max_retries = 2 })
        srv:push(failure(500, 'unavailable'), { status = 503, body = 'not json at all' }, final())
        assert.are.equal('final', model:call(request()).type)
        assert.are.equal(3, #srv.requests)
        for _ = 1, 3 do srv:push({ status = 502, body = '' }) end
        local err = model_error('unavailable', model.call, model, request())
        assert.are.equal(502, err.status)
        assert.are.equal(6, #srv.requests)
        local unavailable = wire.errors.unavailable
        for _ = 1, 3 do srv:push(failure(unavailable.status, 'unavailable')) end
        err = model_error('unavailable', model.call, model, request())
        assert.are.equal(unavailable.status, err.status)
        assert.are.equal(unavailable.code, err.provider_code)
        assert.are.equal(9, #srv.requests)
        srv:push(failure(unavailable.status, 'unavailable'), final())
        assert.are.equal('final', model:call(request()).type)
        assert.are.equal(11, #srv.requests)
      end)

      it('without a retry-after the wait is the backoff from retry_base_ms', function()
        local model = new_model({ retry_base_ms = 200, max_retries = 1 })
        srv:push({ status = 500, body = '' }, final())
        local t0 = uv.hrtime()
        model:call(request())
        assert.is_true(M.ms_since(t0) >= 140)
        assert.are.equal(2, #srv.requests)
      end)

      it('a refused connection is retried, then unavailable', function()
        local model = new_model({ max_retries = 1,
          base_url = 'http://127.0.0.1:' .. model_server.closed_port() .. wire.path })
        local err = model_error('unavailable', model.call, model, request())
        assert.is_nil(err.status)
      end)

      it('a stalled server: timeout after the retries', function()
        local model = new_model({ timeout_ms = 200, max_retries = 1 })
        srv:push({ stall = true }, { stall = true })
        local t0 = uv.hrtime()
        model_error('timeout', model.call, model, request())
        assert.is_true(M.ms_since(t0) >= 380)
        assert.are.equal(2, #srv.requests)
      end)

      it('a refusal: MODEL_ERROR refused', function()
        local model = new_model()
        srv:push(wire.refusal())
        model_error('refused', model.call, model, request())
      end)

      it('a final answer that is not JSON: MODEL_ERROR invalid_output', function()
        local model = new_model()
        srv:push(final('Here is the summary: it is a CLI.'))
        model_error('invalid_output', model.call, model, request())
      end)

      it('never crashes on a body of the wrong shape, nor on an error body', function()
        local model = new_model()
        local bodies = { '', 'null', '[]', '"x"', '42', '{}', string.rep('[', 5000) .. string.rep(']', 5000) }
        for _, b in ipairs(wire.malformed) do bodies[#bodies + 1] = b end
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
        for _, b in ipairs({ '', 'x', '[]', '{"error":"boom"}', '{"error":{"code":[1]}}', '{"error":null}' }) do
          srv:push({ status = 401, body = b })
          model_error('authentication', model.call, model, request())
        end
      end)

      it('arguments that are not JSON go back to the model as a tool error, not a failure', function()
        local model = new_model()
        local raw = '{"path": "README.md"'
        srv:push(wire.calls({ { id = 'call_1', name = 'workspace_read', arguments = raw } }))
        local step = model:call(request())
        assert.are.equal('tool_calls', step.type)
        assert.are.same({ _invalid_json = raw }, step.calls[1].input)
        -- the runtime refused that input (the tool's schema needs path) and handed back an error
        srv:push(final())
        model:call(request({ messages = {
          { role = 'user', content = { task = 'Summarize README.md' } },
          { role = 'assistant', calls = step.calls, text = step.text, extra = step.extra },
          { role = 'tool', call_id = 'call_1', tool_id = 'workspace.read',
            result = { error = { code = 'INVALID_INPUT', message = 'path: expected a string, got nil' } } },
        } }))
        local back = sent(srv.requests[2])
        assert.are.same({ { id = 'call_1', arguments = raw } }, back.calls)   -- replayed as it came
        assert.are.equal('call_1', back.results[1].id)
        local out = json.decode(back.results[1].text)
        assert.are.equal('INVALID_INPUT', out.error.code)
        assert.truthy(out.error.message:find('not valid JSON', 1, true))
      end)
    end)

    describe('cost', function()
      it('prices usage per million tokens and rounds up to a whole micro-dollar', function()
        local model = new_model()
        -- 812 input at 1.25 $/MTok, 96 output at 10 $/MTok: 1015 + 960 = 1975 micros
        srv:push(final(ANSWER, wire.usage(812, 96)))
        local step = model:call(request())
        assert.are.equal(1975, step.usage.cost_micros)
        assert.are.equal(812, step.usage.input_tokens)
        assert.are.equal(96, step.usage.output_tokens)
        -- 1 input token: 1.25 micros, rounded up to 2
        srv:push(final(ANSWER, wire.usage(1, 0)))
        assert.are.equal(2, model:call(request()).usage.cost_micros)
        srv:push(final(ANSWER, wire.usage(0, 0)))
        assert.are.equal(0, model:call(request()).usage.cost_micros)
      end)

      it('usage that is missing or unreadable is charged max_cost_micros, never 0', function()
        local model = new_model({ max_cost_micros = 7777 })
        local i, o = wire.tokens[1], wire.tokens[2]
        for _, u in ipairs({ 'null', '{}', '{"' .. i .. '":5}', '{"' .. i .. '":"5","' .. o .. '":1}',
          '{"' .. i .. '":1e12,"' .. o .. '":1}' }) do
          srv:push(final(ANSWER, u))
          assert.are.equal(7777, model:call(request()).usage.cost_micros, u)
        end
      end)

      it('caps the output tokens to what the ceiling leaves after the input, counted one token a byte', function()
        local model = new_model()   -- at most 40000 micros a call, at 1.25 and 10 $/MTok
        srv:push(final())
        model:call(request())
        local r = srv.requests[1]
        local asked = r.json[field]
        local function cap_for(measured)
          return math.floor((MAX_COST * 1000000 - (measured + shared.INPUT_ALLOWANCE_TOKENS) * 1250000) / 10000000)
        end
        -- the body measured was the one before the cap: without the field, or with the adapter's default
        local default = wire.default_output_tokens
        local measured = default and (#r.body - #tostring(asked) + #tostring(default))
          or (#r.body - #(',"' .. field .. '":' .. asked))
        local input = measured + shared.INPUT_ALLOWANCE_TOKENS
        assert.are.equal(cap_for(measured), asked)
        if default then assert.is_true(asked < default) end
        -- at most the ceiling with the input counted so, and not a token to spare
        assert.is_true(shared.cost_micros({ { input, 1250000 }, { asked, 10000000 } }) <= MAX_COST)
        assert.is_true(shared.cost_micros({ { input, 1250000 }, { asked + 1, 10000000 } }) > MAX_COST)
        -- a smaller maximum of its own is sent as it is; a larger one comes down
        srv:push(final(), final())
        new_model({ [field] = 100 }):call(request())
        assert.are.equal(100, srv.requests[2].json[field])
        new_model({ [field] = 1000000 }):call(request())
        local r3 = srv.requests[3]
        -- measured with its own 1000000 in place of the number sent
        assert.are.equal(cap_for(#r3.body - #tostring(r3.json[field]) + 7), r3.json[field])
        -- a larger request leaves less room for output
        srv:push(final())
        model:call(request({ instructions = string.rep('Be brief. ', 400) }))
        assert.is_true(srv.requests[4].json[field] < asked - 400)
      end)

      it('a request whose input alone may pass the ceiling is not sent: BUDGET_EXCEEDED', function()
        local model = new_model({ max_cost_micros = 1000 })
        local err = assert.raises_code('BUDGET_EXCEEDED', model.call, model, request())
        assert.matches('the call was not made', err.message)
        assert.are.equal(0, #srv.requests)
        -- room for fewer than 16 output tokens (10 micros each) is no room either
        srv:push(final(), final())
        new_model({ max_cost_micros = 3000 }):call(request())
        local room = srv.requests[1].json[field]
        new_model({ max_cost_micros = 3000 - (room - 16) * 10 }):call(request())
        assert.are.equal(16, srv.requests[2].json[field])
        local too_tight = new_model({ max_cost_micros = 3000 - (room - 15) * 10 })
        assert.raises_code('BUDGET_EXCEEDED', too_tight.call, too_tight, request())
        assert.are.equal(2, #srv.requests)
      end)
    end)

    describe('in a run', function()
      it('runs end to end: a tool call, its result, then the structured answer', function()
        srv:push(wire.calls({ { id = 'call_1', name = 'workspace_read', arguments = '{"path":"README.md"}' } },
          wire.usage(1000, 100)))
        srv:push(function(req)
          local back = sent(req)
          assert.are.same({ { id = 'call_1', arguments = '{"path":"README.md"}' } }, back.calls)
          assert.are.equal(1, #back.results)
          assert.are.equal('call_1', back.results[1].id)
          assert.are.same({ text = 'contents of README.md' }, json.decode(back.results[1].text))
          return final('{"summary":"A tiny CLI.","files":["README.md"]}', wire.usage(2000, 50))
        end)
        local outcome = run(agent(new_model()), { max_cost_micros = 200000 })
        assert.are.equal('succeeded', outcome.status, outcome.error and outcome.error.message)
        assert.are.same({ summary = 'A tiny CLI.', files = { 'README.md' } }, outcome.output)
        -- 1000 * 1.25 + 100 * 10 = 2250; 2000 * 1.25 + 50 * 10 = 3000
        assert.are.equal(5250, outcome.usage.cost_micros)
        assert.are.equal(2, outcome.usage.model_calls)
        assert.are.equal(1, outcome.usage.tool_calls)
        assert.are.equal(2, #srv.requests)
        assert.are.same({ calls = {}, results = {} }, sent(srv.requests[1]))
        -- what the answer kept went back with the call
        if wire.kept then assert.truthy(srv.requests[2].body:find(wire.kept, 1, true)) end
      end)

      it('arguments that are not JSON come back to the model as a tool error, and the run goes on', function()
        local ran = 0
        srv:push(wire.calls({ { id = 'call_1', name = 'workspace_read', arguments = '{"path": README.md}' } }))
        srv:push(function(req)
          local result = sent(req).results[1]
          assert.are.equal('call_1', result.id)
          local out = json.decode(result.text)
          assert.are.equal('INVALID_INPUT', out.error.code)
          assert.truthy(out.error.message:find('not valid JSON', 1, true))
          return final('{"summary":"gave up","files":[]}')
        end)
        local outcome = run(agent(new_model(), function() ran = ran + 1; return {} end))
        assert.are.equal('succeeded', outcome.status, outcome.error and outcome.error.message)
        assert.are.equal(0, ran)
        assert.are.equal(1, outcome.usage.tool_calls)
        assert.are.equal(2, #srv.requests)
      end)

      it('a retry-after wait ends with the run, at its duration limit', function()
        srv:push(failure(429, 'rate_limit', { ['retry-after'] = '60' }))
        local outcome = run(agent(new_model()), { max_duration_ms = 300 })
        -- ended by its 300 ms limit, not after the 60 s the server asked for
        assert.are.equal('failed', outcome.status)
        assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
        assert.are.equal(1, #srv.requests)
      end)

      it('a response reporting more than the call reserved ends the run: BUDGET_EXCEEDED, no further call', function()
        -- reserved 40000; 1000 input and 10000 output tokens cost 1250 + 100000
        srv:push(wire.calls({ { id = 'call_1', name = 'workspace_read', arguments = '{"path":"README.md"}' } },
          wire.usage(1000, 10000)))
        srv:push(final('{"summary":"never asked for","files":[]}'))
        local outcome = run(agent(new_model()), { max_cost_micros = 500000 })
        assert.are.equal('failed', outcome.status)
        assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
        assert.are.equal(101250, outcome.usage.cost_micros)
        assert.are.equal(1, outcome.usage.model_calls)
        assert.are.equal(0, outcome.usage.tool_calls)
        assert.are.equal(1, #srv.requests)
        assert.are.equal(1, srv:pending())
        -- and the request it made asked for no more output than the ceiling leaves
        local asked = srv.requests[1].json[field]
        assert.is_true(asked > 0 and asked * 10 <= MAX_COST)
      end)

      it('a request too large for the ceiling ends the run BUDGET_EXCEEDED before anything is sent', function()
        local outcome = run(agent(new_model({ max_cost_micros = 500 })), { max_cost_micros = 500000 })
        assert.are.equal('failed', outcome.status)
        assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
        assert.are.equal(0, outcome.usage.cost_micros)
        assert.are.equal(0, #srv.requests)
      end)

      it('a refused key ends the run failed with MODEL_ERROR, the key nowhere in the message', function()
        srv:push(failure(401, 'authentication'))
        local outcome = run(agent(new_model()))
        assert.are.equal('failed', outcome.status)
        assert.are.equal('MODEL_ERROR', outcome.error.code)
        assert.are.equal('authentication', outcome.error.reason)
        for _, secret in ipairs(wire.secrets) do
          assert.is_nil(outcome.error.message:find(secret, 1, true), secret)
        end
        assert.are.equal(1, #srv.requests)
        assert.are.equal(0, outcome.usage.cost_micros)
      end)
    end)
  end)
end

return M
