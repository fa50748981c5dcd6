-- mayura.sandbox._hosted, the kit of hosted providers, against stand-ins on loopback
-- (support/stand_in.lua): retries and retry-after, keys that never show, timeouts, resets,
-- malformed answers, gone sandboxes, streams in three formats, and a sample provider on the
-- kit (support/toy_provider.lua) over real local sandboxes, through the conformance suite.
local core = require('mayura.core')
local compat = require('support.compat')
local errors = require('mayura.errors')
local sandbox = require('mayura.sandbox')
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')
local stand_in = require('support.stand_in')
local toy_service = require('support.toy_service')
local toy = require('support.toy_provider')
local util = require('support.util')
local suite = require('support.stand_in_suite')

local json = core.json

local KEY = 'sk_live_0123456789abcdef'

-- Whether `needle` appears anywhere in `v`: its tostring, its fields and their fields.
local function shows(v, needle, seen)
  seen = seen or {}
  if type(v) == 'string' then return v:find(needle, 1, true) ~= nil end
  if type(v) ~= 'table' or seen[v] then return false end
  seen[v] = true
  if tostring(v):find(needle, 1, true) then return true end
  for k, x in pairs(v) do
    if shows(k, needle, seen) or shows(x, needle, seen) then return true end
  end
  return false
end

local function sandbox_error(reason, fn, ...)
  local err = assert.raises_code('SANDBOX_ERROR', fn, ...)
  assert.are.equal(reason, err.reason)
  return err
end

local function gap_ms(a, b)
  return b.at_ms - a.at_ms
end

local function envelope(flags, text)
  return compat.pack('>BI4', flags, #text) .. text
end

describe('the hosted kit', function()
  local svc, client

  before_each(function()
    svc = stand_in.new()
    client = hosted.client({ label = 'svc', base_url = svc:url('/api'), api_key = KEY, auth_header = 'X-API-Key',
      retries = 2, retry_base_ms = 20, call_timeout_ms = 20000 })
  end)

  after_each(function()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  describe('JSON calls', function()
    it('sends the key in its header only, the body as JSON, and the query encoded', function()
      svc:route('POST', '/api/things/{id}', function(req)
        return { status = 201, json = { got = req.json, id = req.params.id, q = req.query } }
      end)
      local body, res = client:json('POST', '/things/' .. hosted.escape('a b/..'), { n = 1, s = 'x' },
        { query = { path = '/w s/é', list = { 'a', 'b' } } })
      assert.are.equal(201, res.status)
      assert.are.same({ n = 1, s = 'x' }, body.got)
      assert.are.equal('a b/..', body.id)
      assert.are.equal('/w s/é', body.q.path)
      local req = svc.requests[1]
      assert.are.equal(KEY, req.headers['x-api-key'])
      assert.is_nil(req.headers['authorization'])
      assert.are.equal('application/json', req.headers['content-type'])
      assert.is_falsy(req.target:find(KEY, 1, true))
    end)

    it('names mayura and its version in User-Agent on every call, whatever headers it was given', function()
      local want = 'mayura/' .. core.version
      assert.matches('^mayura/%d+%.%d+%.%d+', want)
      svc:route('GET', '/api/ua', function(req) return { json = { ua = req.headers['user-agent'] } } end)
      svc:route('POST', '/api/ua', function() return { status = 200, headers = { ['Content-Type'] = 'application/x-ndjson' },
        body = '{"n":1}\n' } end)
      assert.are.equal(want, (client:json('GET', '/ua')).ua)
      client:call('GET', '/ua')
      client:stream('POST', '/ua', { x = 1 }, { format = 'ndjson', on_event = function() end })
      -- a header of the caller's cannot take the name away, in any case of its letters
      local other = client:with({ headers = { ['user-agent'] = 'someone-else/1' } })
      other:json('GET', '/ua', nil, { headers = { ['USER-AGENT'] = 'x' } })
      assert.are.equal(4, #svc.requests)
      for _, req in ipairs(svc.requests) do assert.are.equal(want, req.headers['user-agent']) end
      assert.are.equal(want, hosted.USER_AGENT)
    end)

    it('uses Authorization: Bearer by default, and nothing without a key', function()
      svc:route('GET', '/api/who', function(req) return { json = { auth = req.headers['authorization'] or '' } } end)
      local bearer = hosted.client({ base_url = svc:url('/api'), api_key = KEY })
      assert.are.equal('Bearer ' .. KEY, (bearer:json('GET', '/who')).auth)
      local none = hosted.client({ base_url = svc:url('/api') })
      assert.are.equal('', (none:json('GET', '/who')).auth)
    end)

    it('refuses keys and URLs that would leak, without showing the key', function()
      for _, bad in ipairs({ KEY .. '\n', KEY .. ' x', '' }) do
        local err = assert.raises_code('INVALID_CONFIG', hosted.client, { base_url = 'https://x.test', api_key = bad })
        assert.is_false(shows(err, KEY))
      end
      assert.raises_code('INVALID_CONFIG', hosted.client, { base_url = 'https://user:' .. KEY .. '@x.test' })
      assert.raises_code('INVALID_CONFIG', hosted.client, { base_url = 'ftp://x.test' })
      assert.raises_code('INVALID_CONFIG', hosted.client, { base_url = 'https://x.test', nope = 1 })
      assert.raises_code('INVALID_CONFIG', hosted.client, { base_url = 'https://x.test', http_version = '3' })
      assert.raises_code('INVALID_CONFIG', hosted.client, { base_url = 'https://x.test', http_version = 2 })
      assert.is_false(shows(client, KEY))
    end)

    it('retries a 429 and waits at least the Retry-After seconds it asked for', function()
      svc:route('GET', '/api/limited', function() return { json = { ok = true } } end)
      svc:fault('GET', '/api/limited', stand_in.rate_limited(1), 1)
      local body = client:json('GET', '/limited')
      assert.is_true(body.ok)
      local calls = svc:calls('GET', '/api/limited')
      assert.are.equal(2, #calls)
      assert.is_true(gap_ms(calls[1], calls[2]) >= 1000, 'waited ' .. gap_ms(calls[1], calls[2]) .. ' ms')
    end)

    it('takes Retry-After as an HTTP date', function()
      svc:route('POST', '/api/limited', function() return { status = 201, json = { ok = true } } end)
      svc:fault('POST', '/api/limited', stand_in.rate_limited(os.date('!%a, %d %b %Y %H:%M:%S GMT', os.time() + 2)), 1)
      assert.is_true(client:json('POST', '/limited', {}).ok)
      local calls = svc:calls('POST', '/api/limited')
      assert.are.equal(2, #calls)
      -- the date has whole seconds: at least one of the two seconds is left when it is read
      assert.is_true(gap_ms(calls[1], calls[2]) >= 1000, 'waited ' .. gap_ms(calls[1], calls[2]) .. ' ms')
    end)

    it('retries 502, 503 and 504 with a growing backoff, and gives up after `retries`', function()
      svc:route('GET', '/api/flaky', function() return { json = { ok = true } } end)
      svc:fault('GET', '/api/flaky', stand_in.status(502), 1)
      svc:fault('GET', '/api/flaky', stand_in.status(504), 1)
      assert.is_true(client:json('GET', '/flaky').ok)
      local calls = svc:calls('GET', '/api/flaky')
      assert.are.equal(3, #calls)
      -- the waits are retry_base_ms * 2^n with a jitter of at most a quarter off
      assert.is_true(gap_ms(calls[1], calls[2]) >= 15)
      assert.is_true(gap_ms(calls[2], calls[3]) >= 30)

      svc:fault('GET', '/api/flaky', stand_in.status(503))
      local err = sandbox_error('unavailable', client.json, client, 'GET', '/flaky')
      assert.are.equal(503, err.status)
      assert.are.equal('unavailable', err.provider_code)
      assert.are.equal(3 + 3, #svc:calls('GET', '/api/flaky'))
    end)

    it('does not retry other statuses, and maps each through sandbox_http_failure', function()
      svc:route('GET', '/api/s/{n}', function(req)
        return { status = tonumber(req.params.n), json = { error = { code = 'some_code', message = 'their words' } } }
      end)
      local want = { [400] = 'failed', [401] = 'authentication', [403] = 'authentication', [404] = 'not_found',
        [409] = 'conflict', [408] = 'timeout', [500] = 'unavailable', [501] = 'unavailable' }
      for status, reason in pairs(want) do
        local before = #svc.requests
        local err = sandbox_error(reason, client.json, client, 'GET', '/s/' .. status)
        assert.are.equal(status, err.status)
        assert.are.equal('some_code', err.provider_code)
        assert.is_falsy(err.message:find('their words', 1, true))
        assert.are.equal('svc: the service answered HTTP ' .. status .. ' to GET /s/' .. status, err.message)
        assert.are.equal(before + 1, #svc.requests)
      end
    end)

    it('raises at once a Retry-After above max_retry_after_ms or past the deadline', function()
      svc:route('GET', '/api/later', function() return { json = {} } end)
      svc:fault('GET', '/api/later', stand_in.rate_limited(120))
      local err = sandbox_error('rate_limited', client.json, client, 'GET', '/later')
      assert.are.equal(120000, err.retry_after_ms)
      assert.are.equal(1, #svc:calls('GET', '/api/later'))
      local short = client:with({ call_timeout_ms = 500 })
      svc:clear()
      svc:fault('GET', '/api/later', stand_in.rate_limited(2))
      err = sandbox_error('rate_limited', short.json, short, 'GET', '/later')
      assert.are.equal(2000, err.retry_after_ms)
      assert.are.equal(2, #svc:calls('GET', '/api/later'))
    end)

    it('never shows the key in a 401, even when the service echoes it back', function()
      svc:route('GET', '/api/private', function(req)
        local echoed = req.headers['x-api-key']
        return { status = 401, headers = { ['X-Echo'] = echoed, ['WWW-Authenticate'] = 'Key ' .. echoed },
          json = { error_code = echoed, code = echoed, message = 'bad key ' .. echoed, error = { type = echoed } } }
      end)
      local err = sandbox_error('authentication', client.json, client, 'GET', '/private')
      assert.are.equal(401, err.status)
      assert.is_false(shows(err, KEY))
      assert.is_false(shows(tostring(err), KEY))
      assert.is_nil(err.provider_code)   -- every code in the body was the key
      -- and when the service answers 401 with a body that is only the key
      svc:fault('GET', '/api/private', { status = 401, body = KEY })
      err = sandbox_error('authentication', client.json, client, 'GET', '/private')
      assert.is_false(shows(err, KEY))
    end)

    it('answers a malformed body with SANDBOX_ERROR failed', function()
      svc:route('GET', '/api/thing', function() return { json = { ok = true } } end)
      svc:fault('GET', '/api/thing', stand_in.malformed(), 1)
      local err = sandbox_error('failed', client.json, client, 'GET', '/thing')
      assert.matches('not JSON', err.message)
      assert.is_true(client:json('GET', '/thing').ok)
    end)

    it('tries an idempotent call again after a reset connection, but not a POST', function()
      svc:route('GET', '/api/thing', function() return { json = { ok = true } } end)
      svc:route('POST', '/api/thing', function() return { json = { ok = true } } end)
      svc:fault('GET', '/api/thing', stand_in.reset(), 1)
      assert.is_true(client:json('GET', '/thing').ok)
      assert.are.equal(2, #svc:calls('GET', '/api/thing'))
      svc:fault('POST', '/api/thing', stand_in.reset(), 1)
      sandbox_error('unavailable', client.json, client, 'POST', '/thing', {})
      assert.are.equal(1, #svc:calls('POST', '/api/thing'))
      -- unless the caller says the POST is idempotent
      svc:fault('POST', '/api/thing', stand_in.reset(), 1)
      assert.is_true(client:json('POST', '/thing', {}, { idempotent = true }).ok)
    end)

    it('retries a connection that could not be made, then says unavailable', function()
      local port = require('support.http_server').closed_port()
      local c = hosted.client({ base_url = 'http://127.0.0.1:' .. port, retries = 1, retry_base_ms = 1 })
      local err = sandbox_error('unavailable', c.json, c, 'POST', '/x', {})
      assert.matches('could not be reached', err.message)
    end)

    it('cuts a call that gets no answer at the call timeout, without retrying it', function()
      svc:route('GET', '/api/slow', function() return { json = {} } end)
      svc:fault('GET', '/api/slow', stand_in.stall())
      local c = client:with({ call_timeout_ms = 300 })
      local err = sandbox_error('timeout', c.json, c, 'GET', '/slow')
      assert.matches('within 300 ms', err.message)
      assert.are.equal(1, #svc:calls('GET', '/api/slow'))
      -- a per-call timeout_ms wins over the client's
      err = sandbox_error('timeout', client.json, client, 'GET', '/slow', nil, { timeout_ms = 200 })
      assert.matches('within 200 ms', err.message)
    end)

    it('says gone for 404 and 410 on a sandbox that existed, and not_found otherwise', function()
      svc:route('GET', '/api/sandboxes/{id}', function(req) return { json = { id = req.params.id } } end)
      svc:route('DELETE', '/api/sandboxes/{id}', function() return { status = 204 } end)
      assert.are.equal('sb1', (client:json('GET', '/sandboxes/sb1', nil, { gone = true })).id)
      svc:vanish('sb1')
      local err = sandbox_error('gone', client.json, client, 'GET', '/sandboxes/sb1', nil, { gone = true })
      assert.are.equal(404, err.status)
      sandbox_error('not_found', client.json, client, 'GET', '/sandboxes/sb1')
      svc:vanish('sb1', 410)
      sandbox_error('gone', client.json, client, 'GET', '/sandboxes/sb1', nil, { gone = true })
      -- a provider's own list (E2B's envd says 502 when the sandbox is gone)
      svc:vanish('sb1', 502)
      sandbox_error('gone', client.json, client, 'GET', '/sandboxes/sb1', nil, { gone = { 404, 502 } })
      -- allow: a status handed back rather than raised (deleting what is gone already)
      svc:vanish('sb1', 404)
      local body, res = client:json('DELETE', '/sandboxes/sb1', nil, { allow = { 404 } })
      assert.are.equal(404, res.status)
      assert.are.equal('unavailable', body.code)
    end)

    it('reads raw bodies, and refuses an answer above max_response_bytes', function()
      svc:route('PUT', '/api/raw', function(req)
        return { headers = { ['Content-Type'] = 'application/octet-stream' }, body = req.body:rep(600) }
      end)
      local res = client:call('PUT', '/raw', { body = '\0\255', content_type = 'application/octet-stream' })
      assert.are.equal(string.rep('\0\255', 600), res.body)
      assert.are.equal('application/octet-stream', svc.requests[1].headers['content-type'])
      local small = hosted.client({ base_url = svc:url('/api'), max_response_bytes = 1000 })
      local err = sandbox_error('failed', small.call, small, 'PUT', '/raw', { body = 'ab' })
      assert.matches('larger than 1000 bytes', err.message)
    end)

    it('lets on_error put a service code in the provider\'s words', function()
      svc:route('GET', '/api/file', function() return { status = 413, json = { code = 'too_large' } } end)
      local err = assert.raises_code('LIMIT_EXCEEDED', client.json, client, 'GET', '/file', nil, {
        on_error = function(status, code)
          if status == 413 and code == 'too_large' then return errors.new('LIMIT_EXCEEDED', 'the file is too large') end
        end,
      })
      assert.are.equal('the file is too large', err.message)
      assert.are.equal(413, err.status)
    end)

    it('ends a wait between attempts when the call is cancelled', function()
      svc:route('GET', '/api/limited', function() return { json = {} } end)
      svc:fault('GET', '/api/limited', stand_in.rate_limited(5))
      local token = task.cancel_token()
      local uv = require('luv')
      local timer = uv.new_timer()
      timer:start(100, 0, function() timer:close(); token:cancel() end)
      assert.raises_code('CANCELLED', client.json, client, 'GET', '/limited', nil, { signal = token })
      assert.are.equal(1, #svc:calls('GET', '/api/limited'))
    end)
  end)

  describe('streams', function()
    -- A route that sends `pieces`, one write each, a few ms apart.
    local function streaming(path, content_type, pieces, status)
      svc:route('POST', path, function()
        return { status = status or 200, headers = { ['Content-Type'] = content_type }, stream = function(send)
          for _, p in ipairs(pieces) do
            if not send(p) then return end
            task.sleep(1)
          end
        end }
      end)
    end

    local function bytes_of(s)
      local t = {}
      for i = 1, #s do t[i] = s:sub(i, i) end
      return t
    end

    it('reads Connect envelopes cut at every byte, and returns the trailer', function()
      local body = envelope(0, '{"n":1}') .. envelope(0, '{"n":2,"s":"a\\nb"}') .. envelope(2, '{"metadata":{"k":["v"]}}')
      streaming('/api/run', 'application/connect+json', bytes_of(body))
      local got = {}
      local trailer = client:stream('POST', '/run', { cmd = 'x' }, { format = 'connect', on_event = function(m)
        got[#got + 1] = m
      end })
      assert.are.same({ { n = 1 }, { n = 2, s = 'a\nb' } }, got)
      assert.are.same({ k = { 'v' } }, trailer.metadata)
      local req = svc.requests[1]
      assert.are.equal('application/connect+json', req.headers['content-type'])
      assert.are.equal(envelope(0, '{"cmd":"x"}'), req.body)
    end)

    it('maps the error in a Connect trailer like an HTTP status, gone included', function()
      streaming('/api/run', 'application/connect+json',
        { envelope(0, '{"n":1}'), envelope(2, '{"error":{"code":"not_found","message":"' .. KEY .. '"}}') })
      local n = 0
      local on_event = function() n = n + 1 end
      local err = sandbox_error('not_found', client.stream, client, 'POST', '/run', nil,
        { format = 'connect', on_event = on_event })
      assert.are.equal('not_found', err.connect_code)
      assert.is_false(shows(err, KEY))
      err = sandbox_error('gone', client.stream, client, 'POST', '/run', nil,
        { format = 'connect', on_event = on_event, gone = true })
      assert.are.equal(404, err.status)
      assert.are.equal(2, n)
      -- a code that is the key (or another secret the provider named) is not shown either
      local token = 'envd_token_abcdef0123'
      streaming('/api/echo', 'application/connect+json',
        { envelope(2, '{"error":{"code":"' .. KEY .. '"}}') })
      streaming('/api/echo2', 'application/connect+json',
        { envelope(2, '{"error":{"code":"' .. token .. '"}}') })
      err = sandbox_error('unavailable', client.stream, client, 'POST', '/echo', nil,
        { format = 'connect', on_event = on_event, retries = 0 })
      assert.are.equal(500, err.status)
      assert.is_false(shows(err, KEY))
      local c = client:with({ secrets = { token } })
      err = sandbox_error('unavailable', c.stream, c, 'POST', '/echo2', nil, { format = 'connect', on_event = on_event })
      assert.is_false(shows(err, token))
    end)

    it('says failed for a Connect stream without its end, or that breaks the format', function()
      streaming('/api/cut', 'application/connect+json', { envelope(0, '{}') })
      streaming('/api/zip', 'application/connect+json', { envelope(1, 'zz'), envelope(2, '{}') })
      streaming('/api/text', 'application/connect+json', { envelope(0, 'not json'), envelope(2, '{}') })
      local on_event = function() end
      for _, path in ipairs({ '/cut', '/zip', '/text' }) do
        sandbox_error('failed', client.stream, client, 'POST', path, nil, { format = 'connect', on_event = on_event })
      end
    end)

    it('reads NDJSON lines and SSE events cut at every byte', function()
      streaming('/api/lines', 'application/x-ndjson', bytes_of('{"a":1}\r\n\n{"b":[2]}\n{"c":null}'))
      streaming('/api/events', 'text/event-stream',
        bytes_of(': hi\r\nevent: out\r\ndata: {"x":1}\r\nid: 9\r\n\r\ndata: a\rdata: b\r\r'))
      local lines, events = {}, {}
      assert.is_nil(client:stream('POST', '/lines', nil, { format = 'ndjson', on_event = function(v)
        lines[#lines + 1] = v
      end }))
      assert.are.same({ { a = 1 }, { b = { 2 } }, { c = json.null } }, lines)
      client:stream('POST', '/events', nil, { format = 'sse', on_event = function(e) events[#events + 1] = e end })
      assert.are.same({ { event = 'out', data = '{"x":1}', id = '9' }, { event = 'message', data = 'a\nb', id = '9' } },
        events)
      assert.are.equal('text/event-stream', svc.requests[2].headers['accept'])
    end)

    it('cuts a stream that stalls after its head at the call timeout', function()
      svc:route('POST', '/api/stall', function() return { json = {} } end)
      svc:fault('POST', '/api/stall', stand_in.stall_body(envelope(0, '{"n":1}')))
      local got = 0
      local c = client:with({ call_timeout_ms = 300 })
      local err = sandbox_error('timeout', c.stream, c, 'POST', '/stall', nil,
        { format = 'connect', on_event = function() got = got + 1 end })
      assert.matches('within 300 ms', err.message)
      assert.are.equal(1, got)
      assert.are.equal(1, #svc:calls('POST', '/api/stall'))
      -- idle_timeout_ms: silent for that long ends it before the call timeout
      err = sandbox_error('timeout', client.stream, client, 'POST', '/stall', nil,
        { format = 'ndjson', on_event = function() end, idle_timeout_ms = 150 })
      assert.matches('silent for 150 ms', err.message)
    end)

    it('says unavailable for a stream cut midway, and does not retry it', function()
      svc:route('POST', '/api/cut', function()
        return { headers = { ['Content-Type'] = 'application/x-ndjson' }, stream = function(send)
          send('{"n":1}\n{"n":')
          error('the stand-in cuts the stream here', 0)
        end }
      end)
      local got = {}
      sandbox_error('unavailable', client.stream, client, 'POST', '/cut', nil, { format = 'ndjson', idempotent = true,
        on_event = function(v) got[#got + 1] = v end })
      assert.are.same({ { n = 1 } }, got)
      assert.are.equal(1, #svc:calls('POST', '/api/cut'))
      svc.failures = {}
    end)

    it('retries a stream refused with 429 before any byte', function()
      streaming('/api/lines', 'application/x-ndjson', { '{"a":1}\n' })
      svc:fault('POST', '/api/lines', stand_in.rate_limited(1), 1)
      local got = {}
      client:stream('POST', '/lines', nil, { format = 'ndjson', on_event = function(v) got[#got + 1] = v end })
      assert.are.same({ { a = 1 } }, got)
      local calls = svc:calls('POST', '/api/lines')
      assert.are.equal(2, #calls)
      assert.is_true(gap_ms(calls[1], calls[2]) >= 1000)
    end)

    it('refuses a message above max_message_bytes without holding it', function()
      streaming('/api/big', 'application/x-ndjson', { '{"a":"' .. string.rep('x', 5000) })
      local c = hosted.client({ base_url = svc:url('/api'), max_message_bytes = 1000 })
      local err = sandbox_error('failed', c.stream, c, 'POST', '/big', nil, { format = 'ndjson', on_event = function() end })
      assert.matches('larger than 1000 bytes', err.message)
    end)

    it('stops when on_event returns false, and raises what on_event raises', function()
      streaming('/api/lines', 'application/x-ndjson', { '{"a":1}\n{"a":2}\n{"a":3}\n' })
      local got = {}
      client:stream('POST', '/lines', nil, { format = 'ndjson', on_event = function(v)
        got[#got + 1] = v.a
        return v.a < 2
      end })
      assert.are.same({ 1, 2 }, got)
      local err = assert.raises_code('INVALID_INPUT', client.stream, client, 'POST', '/lines', nil, { format = 'ndjson',
        on_event = function() errors.raise('INVALID_INPUT', 'the provider did not like it') end })
      assert.are.equal('the provider did not like it', err.message)
      sandbox_error('failed', client.stream, client, 'POST', '/lines', nil, { format = 'ndjson',
        on_event = function(v) return v.nope.deeper end })
    end)

    it('cancels a stream on its signal, and the service sees the client leave', function()
      svc:route('POST', '/api/forever', function(req)
        return { headers = { ['Content-Type'] = 'application/x-ndjson' }, stream = function(send)
          while send('{"tick":true}\n') do task.sleep(20) end
          req.left = req.signal.cancelled
        end }
      end)
      local token = task.cancel_token()
      local ticks = 0
      assert.raises_code('CANCELLED', client.stream, client, 'POST', '/forever', nil, { format = 'ndjson', signal = token,
        on_event = function()
          ticks = ticks + 1
          if ticks == 3 then token:cancel() end
        end })
      local req = svc:calls('POST', '/api/forever')[1]
      assert.is_truthy(util.eventually(function() return req.left end, 5000))
    end)
  end)

  describe('helpers', function()
    it('maps a lifetime to the service\'s unit, rounding up and clamping', function()
      assert.are.equal(1, hosted.lifetime(1))
      assert.are.equal(1, hosted.lifetime(1000))
      assert.are.equal(2, hosted.lifetime(1001))
      assert.are.equal(3600, hosted.lifetime(3600000, { max = 3600 }))
      local v, clamped = hosted.lifetime(3600001, { max = 3600 })
      assert.are.equal(3600, v)
      assert.is_true(clamped)
      assert.are.equal(1500, hosted.lifetime(1500, { unit = 'ms' }))
      assert.are.equal(2, hosted.lifetime(60001, { unit = 'min' }))
      assert.are.equal(5, hosted.lifetime(1000, { unit = 'min', min = 5 }))
      assert.raises_code('INVALID_INPUT', hosted.lifetime, 0)
      assert.raises_code('INVALID_INPUT', hosted.lifetime, 1000, { unit = 'h' })
    end)

    it('maps labels to metadata: strings only, within the service\'s limits', function()
      local m = hosted.metadata({ team = 'a', run = 'r-1' }, { max_keys = 2 })
      assert.are.same({ team = 'a', run = 'r-1' }, json.decode(json.encode(m)))
      assert.are.equal('{}', json.encode(hosted.metadata(nil)))
      assert.raises_code('INVALID_INPUT', hosted.metadata, { a = 1 })
      assert.raises_code('INVALID_INPUT', hosted.metadata, { a = 'x', b = 'y', c = 'z' }, { max_keys = 2 })
      assert.raises_code('INVALID_INPUT', hosted.metadata, { ['a b'] = 'x' }, { key_pattern = '^[%w_]+$' })
      assert.raises_code('INVALID_INPUT', hosted.metadata, { a = string.rep('v', 300) })
      assert.raises_code('INVALID_INPUT', hosted.metadata, { [string.rep('k', 64)] = 'v' })
    end)

    it('escapes path segments and queries so an id cannot add a segment', function()
      assert.are.equal('..%2Fx', hosted.escape('../x'))
      assert.are.equal('a%3Fb%23c%20d', hosted.escape('a?b#c d'))
      assert.raises_code('INVALID_INPUT', hosted.escape, '..')
      assert.raises_code('INVALID_INPUT', hosted.escape, '')
      assert.are.equal('?a=1&b=x%26y&b=z', hosted.query({ b = { 'x&y', 'z' }, a = 1 }))
      assert.are.equal('', hosted.query({}))
    end)

    it('maps Connect codes to HTTP statuses', function()
      assert.are.equal(404, hosted.connect_status('not_found'))
      assert.are.equal(401, hosted.connect_status('unauthenticated'))
      assert.are.equal(429, hosted.connect_status('resource_exhausted'))
      assert.are.equal(503, hosted.connect_status('unavailable'))
      assert.are.equal(504, hosted.connect_status('deadline_exceeded'))
      assert.are.equal(500, hosted.connect_status('something_new'))
      assert.are.equal(envelope(2, '{}'), hosted.connect_envelope('{}', true))
    end)
  end)
end)

suite.describe('a sample provider on the kit, over real local sandboxes', function()
  local svc, backing, provider, pool, sb
  local toy_key = 'toy_' .. KEY
  suite.stand_in_pool({
    backing = 8,
    install = function(s, b) return toy_service.install(s, b, { api_key = toy_key }) end,
    provider = function(s) return toy.toy_sandboxes({ base_url = s:url('/v1'), api_key = toy_key, format = 'connect' }) end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, labels = { suite = 'c' } },
    create = { lifetime_ms = 600000, labels = { case = 'conformance' } },
    ready = function(e) svc, backing, provider, pool, sb = e.svc, e.backing, e.provider, e.pool, e.sb end,
  })

  suite.conformance(function() return sb end, 'passes the conformance suite')

  it('sent User-Agent mayura/<version> with every request of the suite', function()
    assert.is_true(#svc.requests > 0)
    for _, req in ipairs(svc.requests) do
      assert.are.equal('mayura/' .. core.version, req.headers['user-agent'], req.method .. ' ' .. req.path)
    end
  end)

  it('sends the lifetime in seconds, rounded up, and the labels as metadata', function()
    local other = pool:create({ lifetime_ms = 90500, labels = { owner = 'spec' } })
    local create = svc:calls('POST', '/v1/sandboxes')
    local last = create[#create].json
    assert.are.equal(91, last.timeout_s)
    assert.are.same({ suite = 'c', owner = 'spec' }, last.metadata)
    local info = provider.client:json('GET', '/sandboxes/' .. hosted.escape(other.id))
    assert.are.same({ suite = 'c', owner = 'spec' }, info.metadata)
    other:release()
    assert.are.equal(nil, backing:get(other.id))
  end)

  it('runs commands with their output streamed as NDJSON and SSE too', function()
    for _, format in ipairs({ 'ndjson', 'sse' }) do
      local p = toy.toy_sandboxes({ base_url = svc:url('/v1'), api_key = toy_key, format = format })
      local pl = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000, max_output_bytes = 100000 })
      local s = pl:create({ lifetime_ms = 60000 })
      local r = s:exec({ 'sh', '-c', 'head -c 150000 /dev/zero | tr "\\000" a; echo e >&2; exit 4' })
      assert.are.equal(4, r.exit_code)
      assert.are.equal(100000, #r.stdout)
      assert.is_true(r.truncated)
      assert.are.equal('e\n', r.stderr)
      pl:close()
    end
  end)

  it('says gone when the service lost the sandbox, and the key never shows', function()
    local s = pool:create({ lifetime_ms = 60000 })
    s:write_file('x.txt', 'x')
    svc:vanish(s.id)
    for _, call in ipairs({
      function() return s:exec({ 'true' }) end,
      function() return s:read_file('x.txt') end,
      function() return s:write_file('x.txt', 'y') end,
      function() return s:list_files('.') end,
      function() return s:remove_file('x.txt') end,
    }) do
      local err = sandbox_error('gone', call)
      assert.is_false(shows(err, toy_key))
    end
    s:release()
    svc:clear()
  end)

  it('refuses a wrong key with authentication, never showing either key', function()
    local wrong = 'toy_wrong_' .. KEY
    local p = toy.toy_sandboxes({ base_url = svc:url('/v1'), api_key = wrong })
    local pl = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local err = sandbox_error('authentication', pl.create, pl, { lifetime_ms = 1000 })
    assert.is_false(shows(err, wrong))
    assert.is_false(shows(err, toy_key))
    assert.are.equal(0, pl:count())
  end)

  it('answers the pool\'s call timeout when the service stalls, and the call ends', function()
    local p = toy.toy_sandboxes({ base_url = svc:url('/v1'), api_key = toy_key })
    local pl = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000, call_timeout_ms = 400 })
    local s = pl:create({ lifetime_ms = 60000 })
    svc:fault('GET', '/v1/sandboxes/{id}/files', stand_in.stall(), 1)
    sandbox_error('timeout', s.read_file, s, 'x')
    -- an exec gets its own timeout on top of the call timeout
    svc:fault('POST', '/v1/sandboxes/{id}/exec', stand_in.stall_body(''), 1)
    sandbox_error('timeout', s.exec, s, { 'sleep', '5' }, { timeout_ms = 200 })
    -- the transfers were ended, not left running: the service saw both clients leave
    local reads, execs = svc:calls('GET', '/v1/sandboxes/{id}/files'), svc:calls('POST', '/v1/sandboxes/{id}/exec')
    local stalled = { reads[#reads], execs[#execs] }
    for _, req in ipairs(stalled) do
      assert.is_truthy(util.eventually(function() return req.signal.cancelled end, 5000))
    end
    assert.are.equal('fine\n', s:exec({ 'echo', 'fine' }).stdout)
    pl:close()
  end)
end)
