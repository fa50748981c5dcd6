-- mayura.sandbox.fly against the Fly Machines stand-in (support/fly_service.lua) over real local
-- sandboxes. Fly has no official JavaScript SDK with exec (flyctl and fly-go are Go), so the
-- stand-in follows the Machines API as Fly documents it (its OpenAPI spec, operation
-- Machines_exec); this spec checks the requests the provider makes against that document, then
-- runs the conformance suite through the provider.
local fly = require('mayura.sandbox.fly')
local suite = require('support.stand_in_suite')
local fly_service = require('support.fly_service')
local stop_cases = require('support.stop_cases')

local TOKEN_WORD = 'fm2_0123456789abcdefTOKEN'
local APP = 'mayura-sandboxes'

describe('fly_sandboxes options', function()
  it('needs a token and an app, and never shows the token', function()
    assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { app = APP })
    assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { token = 'x' })
    assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { token = 'x', app = 'Not/An/App' })
    assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { token = 'x', app = APP, workdir = 'rel' })
    for _, bad in ipairs({ 1, { per_second = 0 }, { per_second = 1, burst = 0 }, { per_second = 0 / 0 },
      { per_second = 2000 }, { per_second = 1, burst = 1.5 }, { per_second = 1, nope = 1 } }) do
      assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { token = 'x', app = APP, exec_rate = bad })
    end
    local err = assert.raises_code('INVALID_CONFIG', fly.fly_sandboxes, { token = TOKEN_WORD .. '\n', app = APP })
    assert.is_falsy(tostring(err):find(TOKEN_WORD, 1, true))
    local p = fly.fly_sandboxes({ token = TOKEN_WORD, app = APP })
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'all' } }, p.features)
    assert.are.equal('/workspace', p.workdir)
    assert.are.equal(24 * 3600000, p.max_lifetime_ms)
  end)
end)

suite.describe('the Fly stand-in, over real local sandboxes', function()
  local svc, state, pool, sb
  suite.stand_in_pool({
    install = function(s, b) return fly_service.install(s, b, { token = TOKEN_WORD, app = APP }) end,
    provider = function(s)
      -- the stand-in keeps no rate: the suite's calls go faster than Fly's (command_rates_spec keeps Fly's own)
      return fly.fly_sandboxes({ token = TOKEN_WORD, app = APP, base_url = s:url(''), retry_base_ms = 20,
        exec_rate = { per_second = 100, burst = 20 } })
    end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, labels = { suite = 'c' }, network = { 'all' } },
    create = { lifetime_ms = 600000, network = 'all', labels = { case = 'conformance' } },
    ready = function(e) svc, state, pool, sb = e.svc, e.state, e.pool, e.sb end,
  })

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  suite.conformance(function() return sb end)

  it('makes machines as the Machines API documents: a sleeping main process, metadata, guest', function()
    local other = pool:create({ lifetime_ms = 90500, network = 'all', labels = { owner = 'spec' }, env = { A = 'b' },
      cpus = 1.5, memory_mib = 300 })
    local creates = svc:calls('POST', '/v1/apps/{app}/machines')
    local req = creates[#creates]
    local body = req.json
    assert.are.equal('Bearer ' .. TOKEN_WORD, req.headers.authorization)
    assert.truthy(body.name:match('^mayura%-%x+$'), body.name)
    assert.are.equal('node:22-bookworm-slim', body.config.image)
    assert.are.same({ A = 'b' }, body.config.env)
    assert.are.same({ suite = 'c', owner = 'spec' }, body.config.metadata)
    assert.are.same({ cpu_kind = 'shared', cpus = 2, memory_mb = 512 }, body.config.guest)
    assert.are.same({ '/bin/sh', '-c', "mkdir -p '/workspace' && exec sleep 91" }, body.config.init.exec)
    assert.is_true(body.config.auto_destroy)
    assert.are.same({ policy = 'no' }, body.config.restart)
    -- waited for with the documented wait call, within its 1..60 s
    local waits = svc:calls('GET', '/v1/apps/{app}/machines/{id}/wait')
    assert.are.equal('started', waits[#waits].query.state)
    -- exec: argv sh -c, standard input as a string, a short timeout in seconds
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    other:exec({ 'cat' }, { stdin = 'in' })
    local execs = svc:calls('POST', '/v1/apps/{app}/machines/{id}/exec')
    local with_stdin = 0
    for _, e in ipairs(execs) do
      assert.are.equal('sh', e.json.command[1])
      assert.are.equal('-c', e.json.command[2])
      assert.is_true(e.json.timeout >= 1 and e.json.timeout <= 30)
      if type(e.json.stdin) == 'string' then with_stdin = with_stdin + 1 end
      assert.is_falsy(e.body:find(TOKEN_WORD, 1, true))
    end
    assert.is_true(with_stdin > 0)
    local id = other._backend.machine_id
    other:release()
    local deletes = svc:calls('DELETE', '/v1/apps/{app}/machines/{id}')
    assert.are.equal(id, deletes[#deletes].params.id)
    assert.are.equal('true', deletes[#deletes].query.kill)   -- fly-go's flag
    assert.is_nil(deletes[#deletes].query.force)
    assert.are.equal('destroyed', state.machines[id].state)
  end)

  it('takes what fly-go sends: exec with `cmd`, DELETE ?kill=true of a started machine; an exec '
    .. 'past its timeout is 408 and its command runs on', function()
    local http = require('mayura.http')
    local json = require('mayura.core').json
    local other = pool:create({ lifetime_ms = 60000, network = 'all' })
    local base = svc:url('/v1/apps/' .. APP .. '/machines/' .. other._backend.machine_id)
    local headers = { Authorization = 'Bearer ' .. TOKEN_WORD, ['Content-Type'] = 'application/json' }
    local function call(method, path, body)
      local r = http.request({ url = base .. path, method = method, headers = headers,
        body = body and json.encode(body) or nil, timeout_ms = 20000 })
      return r.status, r.body ~= '' and json.decode(r.body) or nil
    end
    -- MachineExecRequest's deprecated one-string form
    local status, out = call('POST', '/exec', { cmd = "printf '%s|' 'a b' c", timeout = 5 })
    assert.are.equal(200, status)
    assert.are.equal('a b|c|', out.stdout)
    -- past its timeout: 408, and the command is not stopped by Fly (its documents do not say so)
    status = call('POST', '/exec', { command = { 'sh', '-c', 'sleep 2; echo late > /workspace/late' }, timeout = 1 })
    assert.are.equal(408, status)
    require('mayura._task').sleep(2500)
    assert.are.equal('late\n', other:read_file('late'))
    -- flyctl's `machine destroy --force`: DELETE ?kill=true, on a started machine
    status = call('DELETE', '?kill=true')
    assert.are.equal(200, status)
    assert.are.equal('destroyed', state.machines[other._backend.machine_id].state)
    pcall(other.release, other)
  end)

  it('refuses network none (asking for nothing too) and ports, before any call', function()
    local n = #svc.requests
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'none' })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 8080 } })
    assert.are.equal(n, #svc.requests)
  end)
end)
