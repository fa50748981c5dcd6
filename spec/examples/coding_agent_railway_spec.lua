-- examples/coding_agent.lua --provider railway: the coding-agent guide's recorded session on
-- Railway sandboxes, here the Railway stand-in (support/railway_service.lua over real local
-- sandboxes, its command bridge a Node process) run by this spec, with the example pointed at it
-- by RAILWAY_GRAPHQL_ENDPOINT and RAILWAY_TCP_PROXY_WS_ENDPOINT. The run's tests fail, then pass,
-- and the example's own re-check in a fresh sandbox passes.
local railway_service = require('support.railway_service')
local example = require('support.coding_agent_example')

local TOKEN = 'rw_example0123456789abcdefTOKEN'
local ENV = 'env-example'

example.hosted_suite({
  title = 'examples/coding_agent.lua --provider railway',
  install = function(svc, backing)
    return railway_service.install_with_front(svc, backing, { token = TOKEN, environment_id = ENV })
  end,
  teardown = function(env) env.state.close_all() end,
  cases = function(env)
    it('needs RAILWAY_API_TOKEN and RAILWAY_ENVIRONMENT_ID (exit code 2)', function()
      example.needs('railway', { RAILWAY_ENVIRONMENT_ID = ENV }, 'RAILWAY_API_TOKEN', env.svc)
    end)

    it('plays the recorded session on the stand-in, and the re-check passes', function()
      example.plays('railway', {
        RAILWAY_API_TOKEN = TOKEN, RAILWAY_ENVIRONMENT_ID = ENV,
        RAILWAY_GRAPHQL_ENDPOINT = env.svc:url(railway_service.PATH), RAILWAY_TCP_PROXY_WS_ENDPOINT = env.state.ws_url,
      }, TOKEN, 'network all')
      -- the run's sandbox and the re-check's, both destroyed at the end
      local state = env.state
      local creates = state:calls('sandboxCreate')
      assert.are.equal(2, #creates)
      for _, c in ipairs(creates) do
        assert.are.equal('Bearer ' .. TOKEN, c.req.headers.authorization)
        assert.are.equal('DESTROYED', state.sandboxes[c.id].status)
      end
      assert.are.equal(0, env.backing.pool:count())
      assert.are.equal(0, #state:calls('sandboxExec'))   -- every command went over the bridge
    end)
  end,
})
