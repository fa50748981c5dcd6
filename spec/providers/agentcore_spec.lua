-- mayura.sandbox.agentcore against the AgentCore Code Interpreter stand-in
-- (support/agentcore_service.lua) over real local sandboxes, and what it stands on: core.sha256
-- and core.hmac_sha256 (FIPS 180-4 and RFC 4231 vectors), the stand-in's SigV4 verifier (AWS's
-- published get-vanilla example, and requests signed by AWS's own signer, @smithy/signature-v4,
-- accepted), core.stream_parser('eventstream') (CRCs, headers, cuts), then libcurl's signatures
-- (CURLOPT_AWS_SIGV4) on every request the provider makes, and the conformance suite through it.
-- The official @aws-sdk/client-bedrock-agentcore (spec/npm/agentcore_sdk.mjs) drives the
-- stand-in unpatched: its own SigV4 signer, its event-stream decoder, executeCommand and the
-- file tools.
local core = require('mayura.core')
local agentcore = require('mayura.sandbox.agentcore')
local suite = require('support.stand_in_suite')
local agentcore_service = require('support.agentcore_service')
local sigv4 = require('support.sigv4')
local eventstream = require('support.eventstream')
local stop_cases = require('support.stop_cases')

local KEY_ID, SECRET = 'AKIAMAYURASPEC0KEYID', 'mayura/Spec+Secret0123456789abcdefSECRET'
local TOKEN = 'IQoJb3JpZ2luX2VjEMayuraSessionTOKEN0123'
local CREDS = { access_key_id = KEY_ID, secret_access_key = SECRET, session_token = TOKEN }

local function hex(s) return (s:gsub('.', function(c) return ('%02x'):format(c:byte()) end)) end

describe('core.sha256 and core.hmac_sha256', function()
  it('give the published digests', function()
    assert.are.equal('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', hex(core.sha256('abc')))
    assert.are.equal('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', hex(core.sha256('')))
    assert.are.equal('248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1',
      hex(core.sha256('abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq')))
    -- RFC 4231 cases 2 and 6 (a key longer than a block)
    assert.are.equal('5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843',
      hex(core.hmac_sha256('Jefe', 'what do ya want for nothing?')))
    assert.are.equal('60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54',
      hex(core.hmac_sha256(string.rep('\170', 131), 'Test Using Larger Than Block-Size Key - Hash Key First')))
    assert.raises_code('INVALID_INPUT', core.sha256, 1)
  end)
end)

describe('the stand-in\'s SigV4 verifier', function()
  it('computes the signature of AWS\'s published get-vanilla example', function()
    assert.are.equal('5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31', sigv4.signature({
      method = 'GET', path = '/', query = '', headers = { host = 'example.amazonaws.com',
        ['x-amz-date'] = '20150830T123600Z' }, signed = { 'host', 'x-amz-date' }, body = '',
      amz_date = '20150830T123600Z', scope_date = '20150830', region = 'us-east-1', service = 'service',
      secret_access_key = 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY',
    }))
  end)
end)

describe('core.stream_parser eventstream', function()
  local one = eventstream.event('result', { n = 1 })
  local two = eventstream.exception('throttlingException', 'slow down')

  it('reads messages however they are cut, with their headers', function()
    local whole = one .. two
    for _, size in ipairs({ #whole, 1, 7, 13 }) do
      local p = core.stream_parser('eventstream')
      local got = {}
      for i = 1, #whole, size do
        local evs, err = p:feed(whole:sub(i, i + size - 1))
        assert.is_nil(err)
        for _, e in ipairs(evs) do got[#got + 1] = e end
      end
      local evs, err = p:finish()
      assert.is_nil(err)
      assert.are.equal(0, #evs)
      assert.are.equal(2, #got)
      assert.are.equal('{"n":1}', got[1].data)
      assert.are.equal('event', got[1].message_type)
      assert.are.equal('result', got[1].event)
      assert.are.equal('application/json', got[1].headers[':content-type'])
      assert.are.equal('exception', got[2].message_type)
      assert.are.equal('throttlingException', got[2].event)
    end
  end)

  it('refuses a wrong CRC, a cut message, lengths that do not add up, and a payload past max_bytes', function()
    local bad = one:sub(1, #one - 1) .. string.char((one:byte(#one) + 1) % 256)
    local _, err = core.stream_parser('eventstream'):feed(bad)
    assert.are.equal('INVALID_INPUT', err.code)
    local prelude = one:sub(1, 8) .. '\0\0\0\0' .. one:sub(13)
    _, err = core.stream_parser('eventstream'):feed(prelude)
    assert.are.equal('INVALID_INPUT', err.code)
    local p = core.stream_parser('eventstream')
    assert.is_nil(select(2, p:feed(one:sub(1, 20))))
    _, err = p:finish()
    assert.are.equal('INVALID_INPUT', err.code)
    _, err = core.stream_parser('eventstream', { max_bytes = 4 }):feed(one)
    assert.are.equal('LIMIT_EXCEEDED', err.code)
    -- every header type, and a name given twice
    local typed = eventstream.message({ { 'yes', true, 'bool' }, { 'no', false, 'bool' }, { ':event-type', 'x' } }, '')
    local evs = core.stream_parser('eventstream'):feed(typed)
    assert.are.same({ yes = true, no = false, [':event-type'] = 'x' }, evs[1].headers)
    _, err = core.stream_parser('eventstream'):feed(eventstream.message({ { 'a', 'x' }, { 'a', 'y' } }, ''))
    assert.are.equal('INVALID_INPUT', err.code)
  end)
end)

describe('agentcore_sandboxes options', function()
  it('needs a region and credentials, and never shows them', function()
    assert.raises_code('INVALID_CONFIG', agentcore.agentcore_sandboxes, { credentials = CREDS })
    assert.raises_code('INVALID_CONFIG', agentcore.agentcore_sandboxes, { region = 'us-east-1' })
    assert.raises_code('INVALID_CONFIG', agentcore.agentcore_sandboxes, { region = 'us-east-1', credentials = CREDS,
      network = 'allowlist' })
    local err = assert.raises_code('INVALID_CONFIG', agentcore.agentcore_sandboxes, { region = 'us-east-1',
      credentials = { access_key_id = KEY_ID, secret_access_key = SECRET .. ' x' } })
    assert.is_falsy(tostring(err):find(SECRET, 1, true))
    local p = agentcore.agentcore_sandboxes({ region = 'us-east-1', credentials = CREDS })
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'all' } }, p.features)
    assert.are.equal(8 * 3600000, p.max_lifetime_ms)
    p = agentcore.agentcore_sandboxes({ region = 'us-east-1', credentials = CREDS, network = 'none' })
    assert.are.same({ 'none' }, p.features.network)
  end)
end)

suite.describe('the AgentCore stand-in, over real local sandboxes', function()
  local svc, state, pool, sb
  suite.stand_in_pool({
    install = function(s, b)
      return agentcore_service.install(s, b, { access_key_id = KEY_ID, secret_access_key = SECRET,
        session_token = TOKEN, region = 'us-east-1' })
    end,
    provider = function(s)
      return agentcore.agentcore_sandboxes({ region = 'us-east-1', credentials = CREDS, endpoint = s:url(''),
        retry_base_ms = 20 })
    end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } },
    create = { lifetime_ms = 600000, network = 'all' },
    ready = function(e) svc, state, pool, sb = e.svc, e.state, e.pool, e.sb end,
  })

  it('accepts requests signed by AWS\'s own signer (@smithy/signature-v4), and refuses a wrong secret', function()
    if not suite.npm_installed('@smithy/signature-v4', '@smithy/signature-v4') then return end
    local r = suite.node('spec/npm/sigv4_sdk.mjs', { STAND_IN_URL = svc:url(''), AWS_KEY_ID = KEY_ID,
      AWS_SECRET = SECRET, AWS_TOKEN = TOKEN, AWS_REGION = 'us-east-1' }, 30000)
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local v = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.same({ start = 200, get = 200, status = 'READY', wrong = 403, stop = 200, id = v.id }, v)
  end)

  it('is accepted by the official @aws-sdk/client-bedrock-agentcore: signatures, event streams, files', function()
    if not suite.npm_installed('@aws-sdk/client-bedrock-agentcore', '@aws-sdk/client-bedrock-agentcore') then return end
    local before = state.verified
    local r = suite.node('spec/npm/agentcore_sdk.mjs', { STAND_IN_URL = svc:url(''), AWS_KEY_ID = KEY_ID,
      AWS_SECRET = SECRET, AWS_TOKEN = TOKEN, AWS_REGION = 'us-east-1' }, 30000)
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local v = core.json.decode(r.stdout:match('RESULT (%b{})'))
    local id = v.start.id
    assert.are.same({ id = id, interpreter = agentcore_service.INTERPRETER, created = true }, v.start)
    assert.are.same({ session = id, events = 1, kind = 'result', stdout = 'out\n', stderr = 'err\n', exit = 3,
      is_error = true, text = 'out\n' }, v.run)
    assert.are.same({ kind = 'result', is_error = false }, v.write)
    assert.are.same({
      { type = 'resource', uri = 'file:///workspace/sdk/note.txt', text = 'hello from the sdk\n' },
      { type = 'resource', uri = 'file:///workspace/sdk/raw.bin', blob = '000102ff0a' },
    }, v.read)
    assert.are.equal('hello from the sdk\n', v.cat)
    assert.are.same({ status = 'READY', timeout = 300 }, v.get)
    assert.are.same({ name = 'InvalidSignatureException', status = 403 }, v.wrong)
    assert.are.same({ id = id, updated = true }, v.stop)
    assert.are.same({ name = 'ResourceNotFoundException', status = 404 }, v.after)
    assert.are.equal('TERMINATED', state.sessions[id].status)
    assert.is_true(state.verified - before >= 7)
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  suite.conformance(function() return sb end)

  it('signs every request with libcurl\'s SigV4, and no credential travels in a body or URL', function()
    local before = state.verified
    local other = pool:create({ lifetime_ms = 90500, network = 'all', env = { A = 'b' } })
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    local session = other._backend.session_id
    other:release()
    assert.is_true(state.verified > before)
    local starts = svc:calls('PUT', '/code-interpreters/{ci}/sessions/start')
    local body = starts[#starts].json
    assert.are.equal(91, body.sessionTimeoutSeconds)
    assert.truthy(body.clientToken:match('^%x+%-%x+%-4%x+%-a%x+%-%x+$'), body.clientToken)
    for _, req in ipairs(svc.requests) do
      assert.truthy((req.headers.authorization or ''):match('^AWS4%-HMAC%-SHA256 Credential=' .. KEY_ID
        .. '/%d+/us%-east%-1/bedrock%-agentcore/aws4_request'))
      assert.are.equal(TOKEN, req.headers['x-amz-security-token'])
      for _, secret in ipairs({ SECRET, TOKEN }) do
        assert.is_falsy(req.body:find(secret, 1, true))
        assert.is_falsy(req.target:find(secret, 1, true))
      end
    end
    assert.are.equal('TERMINATED', state.sessions[session].status)
  end)

  it('refuses network none from this interpreter, ports, a size and an image, before any call', function()
    local n = #svc.requests
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 80 } })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', cpus = 2 })
    assert.are.equal(n, #svc.requests)
  end)
end)
