-- mayura.sandbox.cloudflare against the stand-in of Cloudflare's sandbox bridge Worker
-- (support/cloudflare_service.lua) over real local sandboxes: the requests the provider makes,
-- as the bridge's API documents them, then the conformance suite through the provider. The
-- official @cloudflare/sandbox package is the Worker side (a library for Durable Objects), with
-- no HTTP client to point at a stand-in, so no SDK check runs here.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local cloudflare = require('mayura.sandbox.cloudflare')
local stand_in = require('support.stand_in')
local cloudflare_service = require('support.cloudflare_service')

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

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the Cloudflare bridge stand-in, over real local sandboxes', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state, pool, sb

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = cloudflare_service.install(svc, backing, { api_key = KEY })
    local provider = cloudflare.cloudflare_sandboxes({ worker_url = svc:url(''), api_key = KEY, retry_base_ms = 20 })
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } })
    sb = pool:create({ lifetime_ms = 600000, network = 'all' })
  end)

  teardown(function()
    pool:close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  describe('passes the conformance suite through the mayura provider', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
  end)

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

  it('refuses network none, ports, a size and an image, before any call', function()
    local n = #svc.requests
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 80 } })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', cpus = 2 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', image = 'x' })
    assert.are.equal(n, #svc.requests)
  end)
end)
