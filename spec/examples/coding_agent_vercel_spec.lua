-- examples/coding_agent.lua --provider vercel: the coding-agent guide's recorded session on Vercel
-- sandboxes, here the Vercel stand-in (support/vercel_service.lua over real local sandboxes) run
-- by this spec, with the example pointed at it by VERCEL_API_URL and VERCEL_WORKDIR. The run's
-- tests fail, then pass, and the example's own re-check in a fresh sandbox passes.
local vercel_service = require('support.vercel_service')
local example = require('support.coding_agent_example')

local TOKEN = 'vcp_example0123456789abcdefTOKEN'
local TEAM, PROJECT = 'team_example', 'prj_example'

example.hosted_suite({
  title = 'examples/coding_agent.lua --provider vercel',
  install = function(svc, backing)
    return vercel_service.install(svc, backing, { token = TOKEN, team_id = TEAM, project_id = PROJECT })
  end,
  cases = function(env)
    it('needs VERCEL_TOKEN, VERCEL_TEAM_ID and VERCEL_PROJECT_ID (exit code 2)', function()
      example.needs('vercel', { VERCEL_TEAM_ID = TEAM, VERCEL_PROJECT_ID = PROJECT }, 'VERCEL_TOKEN', env.svc)
    end)

    it('plays the recorded session on the stand-in, and the re-check passes', function()
      example.plays('vercel', {
        VERCEL_TOKEN = TOKEN, VERCEL_TEAM_ID = TEAM, VERCEL_PROJECT_ID = PROJECT,
        VERCEL_API_URL = env.svc:url('/api'), VERCEL_WORKDIR = '/workspace',
      }, TOKEN, 'no network')
      -- the run's sandbox and the re-check's, both offline, both deleted at the end
      local creates = env.svc:calls('POST', '/api/v3/sandboxes')
      assert.are.equal(2, #creates)
      for _, req in ipairs(creates) do
        assert.are.same({ mode = 'deny-all' }, req.json.networkPolicy)
        assert.are.equal('Bearer ' .. TOKEN, req.headers.authorization)
      end
      assert.are.same({}, env.state.sandboxes)
      assert.are.equal(0, env.backing.pool:count())
    end)
  end,
})
