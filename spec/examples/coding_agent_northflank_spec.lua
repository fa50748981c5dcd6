-- examples/coding_agent.lua --provider northflank: the coding-agent guide's recorded session on
-- Northflank services, here the Northflank stand-in (support/northflank_service.lua over real
-- local sandboxes) run by this spec, with the example pointed at it by NORTHFLANK_API_URL and
-- NORTHFLANK_EXEC_URL. The run's tests fail, then pass, and the example's own re-check in a fresh
-- sandbox passes.
local process = require('mayura.process')
local stand_in = require('support.stand_in')
local northflank_service = require('support.northflank_service')

local HOST = 'build/mayura'
local EXAMPLE = 'examples/coding_agent.lua'
local TOKEN = 'nf_example0123456789abcdefTOKEN'
local PROJECT = 'example'

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

describe('examples/coding_agent.lua --provider northflank', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent) for the stand-in: not available here')
    return
  end
  local svc, backing, state

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
    state = northflank_service.install(svc, backing, { token = TOKEN, project_id = PROJECT })
  end)

  teardown(function()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  it('needs NORTHFLANK_API_TOKEN and NORTHFLANK_PROJECT_ID (exit code 2)', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'northflank' },
      { env = env({ NORTHFLANK_PROJECT_ID = PROJECT }), timeout_ms = 60000 })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('NORTHFLANK_API_TOKEN', 1, true), r.stderr)
    assert.are.equal(0, #svc.requests)
  end)

  it('plays the recorded session on the stand-in, and the re-check passes', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'northflank' }, {
      env = env({
        NORTHFLANK_API_TOKEN = TOKEN, NORTHFLANK_PROJECT_ID = PROJECT,
        NORTHFLANK_API_URL = svc:url(''), NORTHFLANK_EXEC_URL = svc:url(''),
      }),
      timeout_ms = 180000,
    })
    local all = r.stdout .. r.stderr
    assert.are.equal(0, r.exit_code, all)
    assert.truthy(r.stdout:find('plays a recorded session', 1, true), all)
    assert.truthy(r.stdout:find('Sandboxes: northflank, network all', 1, true), all)
    local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
    assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
    assert.truthy(r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed), all)
    assert.truthy(r.stdout:find('\nVerdict: the re-check passed', 1, true), all)
    assert.is_falsy(all:find(TOKEN, 1, true))
    -- the run's service and the re-check's, both deleted at the end
    local creates = svc:calls('POST', '/v1/projects/{p}/services/deployment')
    assert.are.equal(2, #creates)
    for _, req in ipairs(creates) do
      assert.is_true(state.services[req.json.name].deleted)
    end
    assert.are.equal(0, backing.pool:count())
  end)
end)
