-- mayura.sandbox.railway against the Railway stand-in (support/railway_service.lua) over real
-- local sandboxes: first the official `railway` SDK, unchanged, against the stand-in's GraphQL
-- API and its WebSocket exec bridge (so the stand-in speaks the API the service speaks), then
-- the conformance suite through the mayura provider against the same stand-in (commands over
-- the bridge), then what the provider sends for each option, and its GraphQL sandboxExec path.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local railway = require('mayura.sandbox.railway')
local suite = require('support.stand_in_suite')
local railway_service = require('support.railway_service')
local stop_cases = require('support.stop_cases')

local TOKEN = 'rw_0123456789abcdefTOKEN'
local ENV = 'env-mayura-1'
local SDK_SCRIPT = 'spec/npm/railway_sdk.mjs'

describe('railway_sandboxes options', function()
  it('needs a token and an environment, and never shows the token', function()
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { environment_id = ENV })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = 'a/b' })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = ENV,
      endpoint = 'ftp://x/graphql' })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = ENV,
      token_kind = 'team' })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = ENV,
      network_isolation = 'NONE' })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = ENV,
      workdir = 'rel' })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = ENV,
      exec = 'ssh' })
    assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes, { token = TOKEN, environment_id = ENV,
      ws_url = 'http://h/ws/exec' })
    local err = assert.raises_code('INVALID_CONFIG', railway.railway_sandboxes,
      { token = TOKEN .. ' x', environment_id = ENV })
    assert.is_falsy(tostring(err):find(TOKEN, 1, true))
    local p = railway.railway_sandboxes({ token = TOKEN, environment_id = ENV })
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'all' } }, p.features)
    assert.are.equal('/workspace', p.workdir)
    assert.are.equal(24 * 3600000, p.max_lifetime_ms)
  end)
end)

suite.describe('the Railway stand-in, over real local sandboxes', function()
  local svc, backing, state, pool, sb, ws_url
  suite.stand_in_pool({
    install = function(s, b)
      return railway_service.install_with_front(s, b, { token = TOKEN, environment_id = ENV })
    end,
    provider = function(s, e)
      return railway.railway_sandboxes({
        token = TOKEN, environment_id = ENV, endpoint = s:url(railway_service.PATH), ws_url = e.state.ws_url,
        retry_base_ms = 20,
      })
    end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 6 * 3600000, network = { 'all' } },
    create = { lifetime_ms = 600000, network = 'all' },
    teardown = function(e) e.state.close_all() end,
    ready = function(e) svc, backing, state, pool, sb, ws_url = e.svc, e.backing, e.state, e.pool, e.sb, e.state.ws_url end,
  })

  it('is what the official SDK (railway) takes for the service\'s GraphQL API', function()
    if not suite.npm_installed('railway', 'the SDK') then return end
    local before = backing.pool:count()
    local creates = #state:calls('sandboxCreate')
    state.creating_polls = 1
    local r = suite.node(SDK_SCRIPT, { STAND_IN_URL = svc:url(railway_service.PATH), STAND_IN_WS = ws_url,
      STAND_IN_TOKEN = TOKEN, STAND_IN_ENV = ENV })
    state.creating_polls = 0
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.equal('RUNNING', result.status)
    assert.are.equal(3, result.exit_code)
    assert.are.equal('out hi\n', result.stdout)
    assert.are.equal('err\n', result.stderr)
    -- the SDK's kill('KILL') reached the command's processes through the bridge's signal frame
    assert.is_true(result.kill_sent)
    assert.are.equal(-1, result.killed_exit_code)
    assert.are.equal('started\n', result.killed_stdout)
    assert.is_true(result.killed_fast)
    assert.are.equal('KILL', state.signals[#state.signals].signal)
    assert.is_true(result.connected)
    assert.is_true(result.listed)
    assert.are.equal('DESTROYED', result.after_destroy)
    assert.are.equal('graphql_error', result.wrong_token)
    local input = state:calls('sandboxCreate')[creates + 1].variables.input
    assert.are.same({ environmentId = ENV, variables = { GREETING = 'hi' }, idleTimeoutMinutes = 7,
      region = 'us-east4' }, input)
    assert.are.equal(before, backing.pool:count())
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  suite.conformance(function() return sb end)

  it('sends the lifetime as the idle timeout, env as variables, and polls a sandbox that is still creating', function()
    state.creating_polls = 2
    local n = #state:calls('sandbox')
    local other = pool:create({ lifetime_ms = 90500, network = 'all', env = { A = 'b' } })
    state.creating_polls = 0
    assert.are.equal(n + 2, #state:calls('sandbox'))
    local creates = state:calls('sandboxCreate')
    local input = creates[#creates].variables.input
    assert.are.same({ environmentId = ENV, idleTimeoutMinutes = 2, networkIsolation = 'ISOLATED',
      variables = { A = 'b' } }, input)
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    local id = other._backend.id
    other:release()
    assert.are.equal('DESTROYED', state.sandboxes[id].status)
    -- a lifetime past the service's 120 idle minutes is sent as 120 (the pool's timer ends it)
    local long = pool:create({ lifetime_ms = 5 * 3600000, network = 'all' })
    creates = state:calls('sandboxCreate')
    assert.are.equal(120, creates[#creates].variables.input.idleTimeoutMinutes)
    long:release()
  end)

  it('runs commands through the GraphQL sandboxExec with exec = \'graphql\'', function()
    local gp = sandbox.create_sandboxes(railway.railway_sandboxes({ token = TOKEN, environment_id = ENV,
      endpoint = svc:url(railway_service.PATH), exec = 'graphql' }),
      { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'all' } })
    local g = gp:create({ lifetime_ms = 60000, network = 'all' })
    local before = #state:calls('sandboxExec')
    local r = g:exec({ 'sh', '-c', 'cat; echo err >&2; exit 4' }, { stdin = 'in\0put' })
    assert.are.equal(4, r.exit_code)
    assert.is_true(r.stdout == 'in\0put')
    assert.are.equal('err\n', r.stderr)
    g:write_file('f.bin', '\1\2\255')
    assert.is_true(g:read_file('f.bin') == '\1\2\255')
    assert.is_true(#state:calls('sandboxExec') > before)
    g:release()
    gp:close()
  end)

  it('refuses network none and ports before any call', function()
    local n = #state.ops
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'none' })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 8080 } })
    assert.are.equal(n, #state.ops)
  end)
end)
