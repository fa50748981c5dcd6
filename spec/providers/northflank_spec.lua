-- mayura.sandbox.northflank against the Northflank stand-in (support/northflank_service.lua) over
-- real local sandboxes: first the official @northflank/js-client, unchanged, against the stand-in
-- (its REST calls, and its WebSocket exec through the stand-in's front,
-- spec/npm/northflank_front.mjs), then the conformance suite through the mayura provider against
-- the same stand-in (its commands over HTTP/2 to the stand-in's exec host,
-- spec/npm/northflank_exec.mjs), then what the provider sends for each option, and the client's
-- own HTTP/2 exec path on that host.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local northflank = require('mayura.sandbox.northflank')
local suite = require('support.stand_in_suite')
local northflank_service = require('support.northflank_service')
local http = require('mayura.http')
local stop_cases = require('support.stop_cases')

local TOKEN = 'nf_0123456789abcdefTOKEN'
local PROJECT = 'sandboxes'
local SDK_SCRIPT = 'spec/npm/northflank_sdk.mjs'

describe('northflank_sandboxes options', function()
  it('needs a token and a project, and never shows the token', function()
    local f = northflank.northflank_sandboxes
    assert.raises_code('INVALID_CONFIG', f, { project_id = PROJECT })
    assert.raises_code('INVALID_CONFIG', f, { token = TOKEN })
    assert.raises_code('INVALID_CONFIG', f, { token = TOKEN, project_id = 'a/b' })
    assert.raises_code('INVALID_CONFIG', f, { token = TOKEN, project_id = PROJECT, api_url = 'https://h/v1' })
    assert.raises_code('INVALID_CONFIG', f, { token = TOKEN, project_id = PROJECT, exec_region = 'mars' })
    assert.raises_code('INVALID_CONFIG', f, { token = TOKEN, project_id = PROJECT, workdir = 'rel' })
    local err = assert.raises_code('INVALID_CONFIG', f, { token = TOKEN .. ' x', project_id = PROJECT })
    assert.is_falsy(tostring(err):find(TOKEN, 1, true))
    local p = f({ token = TOKEN, project_id = PROJECT })
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'all' } }, p.features)
    assert.are.equal('/workspace', p.workdir)
    assert.are.equal(24 * 3600000, p.max_lifetime_ms)
    assert.is_falsy(tostring(p):find(TOKEN, 1, true))
  end)
end)

suite.describe('the Northflank stand-in, over real local sandboxes', function()
  local svc, backing, state, pool, sb
  suite.stand_in_pool({
    install = function(s, b)
      return northflank_service.install_with_exec_host(s, b, { token = TOKEN, project_id = PROJECT,
        team_id = 'team-a' })
    end,
    provider = function(s, e)
      return northflank.northflank_sandboxes({
        token = TOKEN, project_id = PROJECT, api_url = s:url(''), exec_url = e.state.exec_url, retry_base_ms = 20,
      })
    end,
    teardown = function(e) e.state.close_all() end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'all' } },
    create = { lifetime_ms = 600000, network = 'all' },
    ready = function(e) svc, backing, state, pool, sb = e.svc, e.backing, e.state, e.pool, e.sb end,
  })

  it('is what the official client (@northflank/js-client) takes for the service', function()
    if not suite.npm_installed('@northflank/js-client', 'the client') then return end
    local before = backing.pool:count()
    state.pending_polls = 1
    local r = suite.node(SDK_SCRIPT, { STAND_IN_URL = svc:url(''), STAND_IN_TOKEN = TOKEN, STAND_IN_PROJECT = PROJECT })
    state.pending_polls = 0
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.equal('IN_PROGRESS', result.first_status)
    assert.are.equal('COMPLETED', result.status)
    assert.are.equal(3, result.exit_code)
    assert.are.equal('Failure', result.completion_status)
    assert.are.equal('out hi\n', result.stdout)
    assert.are.equal('err\n', result.stderr)
    assert.are.equal('a b\n', result.argv_stdout)
    -- standard input sent after init, in several messages, reaches the command
    assert.are.equal('first\nsecond\ndone\n', result.stdin_stdout)
    assert.are.equal(0, result.stdin_exit_code)
    assert.are.equal(0, result.late_input)
    assert.is_true(result.deleted)
    assert.is_true(result.missing_is_404)
    assert.is_true(result.wrong_token_refused)
    assert.are.equal(before, backing.pool:count())
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  suite.conformance(function() return sb end)

  it('creates a service running sleep infinity with env, waits for its deployment, execs argv with the token', function()
    state.pending_polls = 2
    local gets = #svc:calls('GET', '/v1/projects/{p}/services/{s}')
    local other = pool:create({ lifetime_ms = 60000, network = 'all', env = { A = 'b' } })
    state.pending_polls = 0
    local creates = svc:calls('POST', '/v1/projects/{p}/services/deployment')
    local body = creates[#creates].json
    assert.truthy(body.name:match('^mayura%-%x+$'), body.name)
    assert.are.same({ instances = 1, external = { imagePath = 'node:22-bookworm' },
      docker = { configType = 'customCommand', customCommand = 'sleep infinity' } }, body.deployment)
    assert.are.same({ deploymentPlan = 'nf-compute-20' }, body.billing)
    assert.are.same({ A = 'b' }, body.runtimeEnvironment)
    assert.are.equal(gets + 3, #svc:calls('GET', '/v1/projects/{p}/services/{s}'))   -- twice IN_PROGRESS, then COMPLETED
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    local last = state.execs[#state.execs]
    assert.are.equal('none', last.init.data.context.shell)
    assert.are.equal('base64', last.init.data.context.encoding)
    assert.are.equal('sh', last.init.data.context.command[1])
    assert.are.equal(TOKEN, last.init.data.auth.apiToken)
    assert.are.equal('Bearer ' .. TOKEN, last.req.headers.authorization)
    local id = other._backend.id
    other:release()
    assert.is_true(state.services[id].deleted)
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', cpus = 2 })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'none' })
  end)

  it('uses the team\'s paths with team_id', function()
    local tp = sandbox.create_sandboxes(northflank.northflank_sandboxes({ token = TOKEN, project_id = PROJECT,
      team_id = 'team-a', api_url = svc:url(''), exec_url = state.exec_url }),
      { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'all' } })
    local t = tp:create({ lifetime_ms = 60000, network = 'all' })
    assert.are.equal(1, #svc:calls('POST', '/v1/teams/{t}/projects/{p}/services/deployment'))
    assert.are.equal('ok\n', t:exec({ 'echo', 'ok' }).stdout)
    t:release()
    tp:close()
  end)

  it('runs commands over the exec host\'s HTTP/2, as the official client does with an exec location', function()
    -- the exec host speaks HTTP/2 alone: an HTTP/1.1 request gets no answer, mayura's (h2c) do
    local ok, err = pcall(http.request, { url = state.exec_url .. '/exec', method = 'POST', body = '{}\n',
      timeout_ms = 1500 })
    assert.is_false(ok)   -- libcurl reads the server's HTTP/2 frames as no HTTP/1.x answer
    assert.is_string(err.code)
    local before = #svc:calls('POST', '/exec')
    assert.are.equal('in\0put', sb:exec({ 'cat' }, { stdin = 'in\0put' }).stdout)
    assert.is_true(#svc:calls('POST', '/exec') > before)
    if not suite.npm_installed('@northflank/js-client', 'the client') then return end
    local r = suite.node(SDK_SCRIPT, { STAND_IN_URL = svc:url(''), STAND_IN_TOKEN = TOKEN,
      STAND_IN_PROJECT = PROJECT, EXEC_PATH = 'http2' })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.equal(3, result.exit_code)
    assert.are.equal('Failure', result.completion_status)
    assert.are.equal('out hi\n', result.stdout)
    assert.are.equal('err\n', result.stderr)
    assert.are.equal('a b\n', result.argv_stdout)
    assert.are.equal('first\nsecond\ndone\n', result.stdin_stdout)
    assert.are.equal(0, result.stdin_exit_code)
    assert.are.equal(0, result.late_input)
    assert.are.equal('refused', result.wrong_token)
    assert.are.equal(4, result.streams)   -- every command on an HTTP/2 stream of the exec host
    assert.is_true(result.deleted)
    assert.is_true(result.missing_is_404)
    assert.is_true(result.wrong_token_refused)
  end)
end)
