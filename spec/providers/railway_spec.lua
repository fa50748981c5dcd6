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
local util = require('support.util')
local http = require('mayura.http')
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
    -- public domains come only with PRIVATE isolation (the service's rule)
    assert.is_true(railway.railway_sandboxes({ token = TOKEN, environment_id = ENV, network_isolation = 'PRIVATE' })
      .features.ports)
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

  it('serves a port at its Railway domain, asked for at create as a public domain', function()
    local pp = sandbox.create_sandboxes(railway.railway_sandboxes({ token = TOKEN, environment_id = ENV,
      endpoint = svc:url(railway_service.PATH), ws_url = ws_url, network_isolation = 'PRIVATE' }),
      { max_sandboxes = 1, max_lifetime_ms = 120000, network = { 'all' } })
    local n = #state.ops
    local many = {}
    for i = 1, railway.MAX_DOMAINS + 1 do many[i] = 8000 + i end
    assert.raises_code('INVALID_INPUT', pp.create, pp, { lifetime_ms = 60000, network = 'all', ports = many })
    assert.are.equal(n, #state.ops)
    state.domain_polls = 2   -- the route is published only at the second read
    local web = pp:create({ lifetime_ms = 120000, network = 'all', ports = { 8080 } })
    state.domain_polls = 0
    local creates = state:calls('sandboxCreate')
    local input = creates[#creates].variables.input
    assert.are.same({ { port = 8080 } }, input.publicDomains)
    assert.are.equal('PRIVATE', input.networkIsolation)
    web:write_file('index.html', 'served from the sandbox\n')
    web:exec({ 'sh', '-c', 'setsid nohup node -e "require(\'http\').createServer((q, s) => s.end(require(\'fs\')'
      .. '.readFileSync(\'index.html\'))).listen(8080)" >/dev/null 2>&1 </dev/null &' })
    local reads = #state:calls('sandbox')
    local url = web:url(8080)
    assert.are.equal(reads + 2, #state:calls('sandbox'))
    local host = url:match('^https://([%w%.%-]+)$')
    assert.truthy(host and host:match('%.up%.railway%.test$'), url)
    assert.are.equal(url, web:url(8080))   -- known now: not asked again
    assert.are.equal(reads + 2, #state:calls('sandbox'))
    assert.raises_code('INVALID_INPUT', web.url, web, 9090)
    -- the domain routes to the sandbox's port (the stand-in's edge, over loopback)
    local body = util.eventually(function()
      local ok, res = pcall(http.request, { url = state.edge[host] .. '/', timeout_ms = 2000 })
      return ok and res.status == 200 and res.body
    end, 10000)
    assert.are.equal('served from the sandbox\n', body)
    -- the official SDK takes a sandbox whose answers carry its domains
    if suite.npm_installed('railway', 'the SDK') then
      local r = suite.node(SDK_SCRIPT, { STAND_IN_URL = svc:url(railway_service.PATH), STAND_IN_WS = ws_url,
        STAND_IN_TOKEN = TOKEN, STAND_IN_ENV = ENV, STAND_IN_CONNECT = web._backend.id })
      assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
      assert.are.same({ status = 'RUNNING', networkIsolation = 'PRIVATE', exit_code = 0,
        stdout = 'served from the sandbox\n' }, core.json.decode(r.stdout:match('RESULT (%b{})')))
    end
    web:release()
    pp:close()
  end)

  it('refuses network none and ports before any call', function()
    local n = #state.ops
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'none' })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 8080 } })
    assert.are.equal(n, #state.ops)
  end)

  it('sent only documents that Railway\'s public schema takes, the SDK\'s and mayura\'s alike', function()
    -- every request the stand-in got above, one of each document and shape of its variables
    local function shape(v)
      if type(v) ~= 'table' then return type(v) end
      local keys = {}
      for k, x in pairs(v) do keys[#keys + 1] = tostring(k) .. '=' .. shape(x) end
      table.sort(keys)
      return '{' .. table.concat(keys, ',') .. '}'
    end
    local bodies, seen, ops = {}, {}, {}
    for _, o in ipairs(state.ops) do
      local b = o.req.json
      local key = type(b) == 'table' and tostring(b.query) .. shape(b.variables)
      if key and not seen[key] then
        seen[key] = true
        bodies[#bodies + 1] = o.req.body
        ops[o.op] = true
      end
    end
    for _, op in ipairs({ 'sandboxCreate', 'sandbox', 'sandboxes', 'sandboxExec', 'generateShellToken',
      'sandboxDestroy' }) do
      assert.is_true(ops[op] == true, op)
    end
    local dir = util.tmpdir()
    local f = assert(io.open(dir .. '/requests.json', 'w'))
    f:write('[' .. table.concat(bodies, ',') .. ']')
    f:close()
    local r = require('mayura.process').run({ 'node', 'spec/npm/railway_schema_check.mjs',
      'spec/support/railway_schema.graphql', dir .. '/requests.json' }, { timeout_ms = 60000 })
    util.rmdir(dir)
    assert.are.equal(0, r.exit_code, r.stderr)
    local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.same({}, result.errors)
    assert.are.equal(#bodies, result.checked)
  end)
end)
