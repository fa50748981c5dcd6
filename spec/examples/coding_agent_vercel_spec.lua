-- examples/coding_agent.lua --provider vercel: the coding-agent guide's recorded session on Vercel
-- sandboxes, here the Vercel stand-in (support/vercel_service.lua over real local sandboxes) run
-- by this spec, with the example pointed at it by VERCEL_API_URL and VERCEL_WORKDIR. The run's
-- tests fail, then pass, and the example's own re-check in a fresh sandbox passes.
local process = require('mayura.process')
local stand_in = require('support.stand_in')
local vercel_service = require('support.vercel_service')

local HOST = 'build/mayura'
local EXAMPLE = 'examples/coding_agent.lua'
local TOKEN = 'vcp_example0123456789abcdefTOKEN'
local TEAM, PROJECT = 'team_example', 'prj_example'

-- The environment of this process without any model key, plus `extra`.
local function env(extra)
  local out = {}
  for _, name in ipairs({ 'PATH', 'HOME', 'LANG', 'TMPDIR' }) do out[name] = os.getenv(name) end
  for k, v in pairs(extra or {}) do out[k] = v end
  return out
end

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('examples/coding_agent.lua --provider vercel', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent) for the stand-in: not available here')
    return
  end
  local svc, backing, state

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
    state = vercel_service.install(svc, backing, { token = TOKEN, team_id = TEAM, project_id = PROJECT })
  end)

  teardown(function()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  it('needs VERCEL_TOKEN, VERCEL_TEAM_ID and VERCEL_PROJECT_ID (exit code 2)', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'vercel' },
      { env = env({ VERCEL_TEAM_ID = TEAM, VERCEL_PROJECT_ID = PROJECT }), timeout_ms = 60000 })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('VERCEL_TOKEN', 1, true), r.stderr)
    assert.are.equal(0, #svc.requests)
  end)

  it('plays the recorded session on the stand-in, and the re-check passes', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'vercel' }, {
      env = env({
        VERCEL_TOKEN = TOKEN, VERCEL_TEAM_ID = TEAM, VERCEL_PROJECT_ID = PROJECT,
        VERCEL_API_URL = svc:url('/api'), VERCEL_WORKDIR = '/workspace',
      }),
      timeout_ms = 180000,
    })
    local all = r.stdout .. r.stderr
    assert.are.equal(0, r.exit_code, all)
    assert.truthy(r.stdout:find('plays a recorded session', 1, true), all)
    assert.truthy(r.stdout:find('Sandboxes: vercel, no network', 1, true), all)
    local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
    assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
    assert.truthy(r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed), all)
    assert.truthy(r.stdout:find('\nVerdict: the re-check passed', 1, true), all)
    assert.is_falsy(all:find(TOKEN, 1, true))
    -- the run's sandbox and the re-check's, both offline, both deleted at the end
    local creates = svc:calls('POST', '/api/v3/sandboxes')
    assert.are.equal(2, #creates)
    for _, req in ipairs(creates) do
      assert.are.same({ mode = 'deny-all' }, req.json.networkPolicy)
      assert.are.equal('Bearer ' .. TOKEN, req.headers.authorization)
    end
    assert.are.same({}, state.sandboxes)
    assert.are.equal(0, backing.pool:count())
  end)
end)
