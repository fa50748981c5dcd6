-- mayura.sandbox.railway when the service misbehaves, on the Railway stand-in
-- (support/railway_service.lua) over real local sandboxes: a refused token (as a GraphQL error
-- at HTTP 200, and as HTTP 401), a sandbox destroyed behind the pool's back, 429 with
-- Retry-After and a GraphQL rate-limit error, a command whose answer stalls, a create that never
-- answers or never leaves CREATING (these through the GraphQL sandboxExec, exec = 'graphql');
-- then over the WebSocket exec bridge: a shell token the bridge refuses, a sandbox gone under a
-- command's connection, a command whose answer stalls; a port's domain never published, or its
-- sandbox gone, and domains the service refuses. Each ends as a SandboxError with the
-- right reason and none of the service's text or the token; and a command past its timeout is
-- killed by its tag.
local railway = require('mayura.sandbox.railway')
local stand_in = require('support.stand_in')
local railway_service = require('support.railway_service')
local util = require('support.util')
local faults = require('support.fault_checks')

local TOKEN = 'rw_fault0123456789abcdefTOKEN'
local ENV = 'env-faults'

faults.hosted_suite({
  title = 'the Railway provider when the service misbehaves',
  provider = railway.railway_sandboxes,
  options = function(svc)
    return { token = TOKEN, environment_id = ENV, endpoint = svc:url(railway_service.PATH), retry_base_ms = 20,
      exec = 'graphql', exec_rate = { per_second = 1000, burst = 1000 } }
  end,
  install = function(svc, backing)
    return railway_service.install_with_front(svc, backing, { token = TOKEN, environment_id = ENV })
  end,
  teardown = function(env) env.state.close_all() end,
  reset = function(env)
    env.state.faults = {}
    env.state.creating_polls = 0
  end,
  secrets = { TOKEN, 'WRONG' },
  words = { 'Not Authorized', 'Sandbox not found', 'UNAUTHENTICATED', 'NOT_FOUND', 'try later', 'Rate limit exceeded' },
  cases = function(env)
    local check, CREATE = env.check, env.CREATE
    local make_pool = env.make_pool

    it('a command sandboxExec waits for may take longer than call_timeout_ms', env.direct_outlasts_call_timeout)

    it('401: a wrong token is authentication (a GraphQL error or HTTP 401), and neither token shows', function()
      env.refused({ token = 'rw_WRONG_token_0123456789' })
      -- a project token goes in its own header
      local pool = make_pool({ token_kind = 'project' })
      local sb = pool:create(CREATE)
      local last = env.state.ops[#env.state.ops].req
      assert.are.equal(TOKEN, last.headers['project-access-token'])
      assert.is_nil(last.headers['authorization'])
      -- revoked while a sandbox lives: HTTP 401 with the token in the body
      env.state:fault('sandboxExec', { status = 401, json = { errors = { { message = 'Not Authorized ' .. TOKEN } } } })
      check('authentication', sb.exec, sb, { 'true' })
      check('authentication', sb.list_files, sb, '.')
      env.state.faults = {}
      sb:release()
      pool:close()
    end)

    it('a sandbox destroyed behind the pool\'s back is gone for every call', function()
      local pool, sb = env.open()
      sb:write_file('x.txt', 'x')
      env.state:vanish(sb._backend.id)
      env.all_fail('gone', sb)
      sb:release()
      assert.are.equal(0, pool:count())
      pool:close()
    end)

    it('429: waits the Retry-After it was given; a wait too long, or a GraphQL rate limit, is rate_limited', function()
      local pool, sb = env.open()
      env.retry_after(sb, {
        calls = function() return env.state:calls('sandboxExec') end,
        at = function(call) return call.req.at_ms end,
        fault = function(answer) env.state:fault('sandboxExec', answer, 1) end,
      })
      env.state:fault('sandboxExec', { json = { errors = { { message = 'Rate limit exceeded', extensions = {
        code = 'RATE_LIMITED' } } }, data = railway_service.NULL } }, 1)
      check('rate_limited', sb.list_files, sb, '.')
      assert.are.equal('fine\n', sb:exec({ 'echo', 'fine' }).stdout)
      sb:release()
      pool:close()
    end)

    it('a command whose answer stalls ends at the call timeout, and the sandbox goes on', function()
      local pool, sb = env.open(nil, { call_timeout_ms = 800 })
      env.state:fault('sandboxExec', stand_in.stall(), 1)
      check('timeout', sb.list_files, sb, '.')
      local calls = env.state:calls('sandboxExec')
      local stalled = calls[#calls].req
      assert.is_truthy(util.eventually(function() return stalled.signal.cancelled end, 5000))
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      sb:release()
      pool:close()
    end)

    it('a create that never answers, or never leaves CREATING, ends at the call timeout; the latter is destroyed',
      function()
        local pool = make_pool(nil, { call_timeout_ms = 600 })
        env.state:fault('sandboxCreate', stand_in.stall(), 1)
        check('timeout', pool.create, pool, CREATE)
        assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 5000))
        env.state.creating_polls = 1000
        local n = #env.state:calls('sandboxCreate')
        check('timeout', pool.create, pool, CREATE)
        env.state.creating_polls = 0
        local id = env.state:calls('sandboxCreate')[n + 1].id
        assert.is_truthy(util.eventually(function()
          local rec = env.state.sandboxes[id]
          return rec and rec.status == 'DESTROYED'
        end, 5000))
        -- and the pool goes on
        env.goes_on(pool)
      end)

    it('kills a command past its timeout by its tag', function()
      local pool, sb = env.open()
      local r = sb:exec({ 'sh', '-c', 'setsid sleep 66 >/dev/null 2>&1 </dev/null & sleep 67' }, { timeout_ms = 400 })
      assert.is_true(r.timed_out)
      local ps = sb:exec({ 'sh', '-c', 'ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr "\\0" " "' })
      assert.is_falsy(ps.stdout:find('sleep 6[67]'), ps.stdout)
      sb:release()
      pool:close()
    end)

    it('a port\'s domain never published ends url at the call timeout; a sandbox gone is gone there too', function()
      local pool = make_pool({ network_isolation = 'PRIVATE' }, { call_timeout_ms = 800 })
      env.state.domain_polls = 1000
      local sb = pool:create({ lifetime_ms = 60000, network = 'all', ports = { 8080 } })
      env.state.domain_polls = 0
      check('timeout', sb.url, sb, 8080)
      env.state:vanish(sb._backend.id)
      check('gone', sb.url, sb, 8080)
      sb:release()
      -- the service refusing the domains it was asked for: failed, without its words
      env.state:fault('sandboxCreate', { json = { errors = { { message = 'Sandbox not found: publicDomains ' .. TOKEN,
        extensions = { code = 'BAD_USER_INPUT' } } }, data = railway_service.NULL } })
      check('failed', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 8080 } })
      pool:close()
    end)

    describe('over the WebSocket exec bridge', function()
      local function ws_pool(pool_options)
        return make_pool({ exec = 'websocket', ws_url = env.state.ws_url }, pool_options)
      end

      it('a shell token the bridge refuses is authentication; a new one is asked for next time', function()
        local pool = ws_pool()
        local sb = pool:create(CREATE)
        sb:exec({ 'true' })   -- a token in hand (a create runs no command)
        local tokens = #env.state:calls('generateShellToken')
        env.svc:fault('GET', '/_bridge/check', { status = 401, json = { error = 'Not Authorized ' .. TOKEN } }, 1)
        check('authentication', sb.exec, sb, { 'true' })
        assert.are.equal('back\n', sb:exec({ 'echo', 'back' }).stdout)
        assert.are.equal(tokens + 1, #env.state:calls('generateShellToken'))
        sb:release()
        pool:close()
      end)

      it('a sandbox gone under a command\'s connection is gone, also at the handshake', function()
        local pool = ws_pool()
        local sb = pool:create(CREATE)
        sb:write_file('x.txt', 'x')
        -- the bridge closes without an exit: the provider asks the API, which says it is gone
        env.svc:fault('POST', '/_bridge/exec', { status = 404, json = {} }, 1)
        env.state:vanish(sb._backend.id)
        check('gone', sb.exec, sb, { 'true' })
        check('gone', sb.read_file, sb, 'x.txt')
        sb:release()
        pool:close()
      end)

      it('a command whose answer stalls ends at the call timeout, and the next one runs', function()
        local pool = ws_pool({ call_timeout_ms = 1000 })
        local sb = pool:create(CREATE)
        env.svc:fault('POST', '/_bridge/exec', stand_in.stall(), 1)
        check('timeout', sb.list_files, sb, '.')
        assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
        sb:release()
        pool:close()
      end)
    end)
  end,
})
