-- examples/coding_agent.lua --provider northflank: the coding-agent guide's recorded session on
-- Northflank services, here the Northflank stand-in (support/northflank_service.lua over real
-- local sandboxes) run by this spec, with the example pointed at it by NORTHFLANK_API_URL and
-- NORTHFLANK_EXEC_URL (the stand-in's HTTP/2 exec host). The run's tests fail, then pass, and the example's own re-check in a fresh
-- sandbox passes.
local northflank_service = require('support.northflank_service')
local example = require('support.coding_agent_example')

local TOKEN = 'nf_example0123456789abcdefTOKEN'
local PROJECT = 'example'

example.hosted_suite({
  title = 'examples/coding_agent.lua --provider northflank',
  install = function(svc, backing)
    return northflank_service.install_with_exec_host(svc, backing, { token = TOKEN, project_id = PROJECT })
  end,
  teardown = function(env) env.state.close_all() end,
  cases = function(env)
    it('needs NORTHFLANK_API_TOKEN and NORTHFLANK_PROJECT_ID (exit code 2)', function()
      example.needs('northflank', { NORTHFLANK_PROJECT_ID = PROJECT }, 'NORTHFLANK_API_TOKEN', env.svc)
    end)

    it('plays the recorded session on the stand-in, and the re-check passes', function()
      example.plays('northflank', {
        NORTHFLANK_API_TOKEN = TOKEN, NORTHFLANK_PROJECT_ID = PROJECT,
        NORTHFLANK_API_URL = env.svc:url(''), NORTHFLANK_EXEC_URL = env.state.exec_url,
      }, TOKEN, 'network all')
      -- the run's service and the re-check's, both deleted at the end
      local creates = env.svc:calls('POST', '/v1/projects/{p}/services/deployment')
      assert.are.equal(2, #creates)
      for _, req in ipairs(creates) do
        assert.is_true(env.state.services[req.json.name].deleted)
      end
      assert.are.equal(0, env.backing.pool:count())
    end)
  end,
})
