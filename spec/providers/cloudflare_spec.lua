-- mayura.sandbox.cloudflare against the stand-in of Cloudflare's sandbox bridge Worker
-- (support/cloudflare_service.lua) over real local sandboxes: the requests the provider makes,
-- as the bridge's API documents them, then the conformance suite through the provider. The
-- official @cloudflare/sandbox package is the Worker side (a library for Durable Objects), with
-- no HTTP client to point at a stand-in, so no SDK check runs here.
local cloudflare = require('mayura.sandbox.cloudflare')
local suite = require('support.stand_in_suite')
local cloudflare_service = require('support.cloudflare_service')
local stop_cases = require('support.stop_cases')

local KEY = 'cfsb_0123456789abcdefKEY'

describe('cloudflare_sandboxes options', function()
  it('needs a worker URL and a key, and never shows the key', function()
    assert.raises_code('INVALID_CONFIG', cloudflare.cloudflare_sandboxes, { api_key = KEY })
    assert.raises_code('INVALID_CONFIG', cloudflare.cloudflare_sandboxes, { worker_url = 'https://w.example.dev' })
    assert.raises_code('INVALID_CONFIG', cloudflare.cloudflare_sandboxes,
      { worker_url = 'https://w.example.dev', api_key = KEY, workdir = '/tmp' })
    local err = assert.raises_code('INVALID_CONFIG', cloudflare.cloudflare_sandboxes,
      { worker_url = 'https://w.example.dev', api_key = KEY .. ' x' })
    assert.is_falsy(tostring(err):find(KEY, 1, true))
    local p = cloudflare.cloudflare_sandboxes({ worker_url = 'https://w.example.dev', api_key = KEY })
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'all' } }, p.features)
    assert.are.equal('/workspace', p.workdir)
  end)
end)

suite.describe('the Cloudflare bridge stand-in, over real local sandboxes', function()
  local svc, state, pool, sb
  suite.stand_in_pool({
    install = function(s, b) return cloudflare_service.install(s, b, { api_key = KEY }) end,
    provider = function(s)
      return cloudflare.cloudflare_sandboxes({ worker_url = s:url(''), api_key = KEY, retry_base_ms = 20 })
    end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } },
    create = { lifetime_ms = 600000, network = 'all' },
    ready = function(e) svc, state, pool, sb = e.svc, e.state, e.pool, e.sb end,
  })

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  suite.conformance(function() return sb end)

  it('mints an id, runs sh -c through the exec stream, and deletes at release', function()
    local other = pool:create({ lifetime_ms = 60000, network = 'all', env = { A = 'b' } })
    local id = other._backend.sandbox_id
    assert.truthy(id:match('^[a-z2-7]+$'), id)
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    for _, req in ipairs(svc:calls('POST', '/v1/sandbox/{id}/exec')) do
      assert.are.equal('Bearer ' .. KEY, req.headers.authorization)
      assert.are.equal('sh', req.json.argv[1])
      assert.are.equal('-c', req.json.argv[2])
      assert.is_falsy(req.body:find(KEY, 1, true))
    end
    other:release()
    local deletes = svc:calls('DELETE', '/v1/sandbox/{id}')
    assert.are.equal(id, deletes[#deletes].params.id)
    assert.is_nil(state.containers[id])
  end)

  it('resolves a cwd as the bridge does: a relative one under /workspace, `..` by name; one that '
    .. 'leaves /workspace is 403 invalid_request', function()
    local http = require('mayura.http')
    local json = require('mayura.core').json
    local headers = { Authorization = 'Bearer ' .. KEY, ['Content-Type'] = 'application/json' }
    local r = http.request({ url = svc:url('/v1/sandbox'), method = 'POST', headers = headers, body = '{}' })
    local id = json.decode(r.body).id
    local function exec(cwd)
      return http.request({ url = svc:url('/v1/sandbox/' .. id .. '/exec'), method = 'POST', headers = headers,
        body = json.encode({ argv = { 'sh', '-c', 'mkdir -p /workspace/sub && pwd' }, cwd = cwd }), timeout_ms = 20000 })
    end
    assert.are.equal(200, exec('.').status)
    local out = exec('sub/../sub')
    assert.are.equal(200, out.status)
    assert.truthy(out.body:find('data: ' .. require('mayura.core').base64.encode('/workspace/sub\n'), 1, true))
    for _, bad in ipairs({ '..', '/etc', '/workspace/../etc', 'sub/../../tmp' }) do
      r = exec(bad)
      assert.are.equal(403, r.status, bad)
      assert.are.same({ error = 'cwd must resolve to a location within /workspace', code = 'invalid_request' },
        json.decode(r.body))
    end
    http.request({ url = svc:url('/v1/sandbox/' .. id), method = 'DELETE', headers = headers })
  end)

  it('refuses network none, ports, a size and an image, before any call', function()
    local n = #svc.requests
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 80 } })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', cpus = 2 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', image = 'x' })
    assert.are.equal(n, #svc.requests)
  end)
end)
