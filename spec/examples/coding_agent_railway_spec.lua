-- examples/coding_agent.lua --provider railway: the coding-agent guide's recorded session on
-- Railway sandboxes, here the Railway stand-in (support/railway_service.lua over real local
-- sandboxes, its command bridge a Node process) run by this spec, with the example pointed at it
-- by RAILWAY_GRAPHQL_ENDPOINT and RAILWAY_TCP_PROXY_WS_ENDPOINT. The run's tests fail, then pass,
-- and the example's own re-check in a fresh sandbox passes.
local process = require('mayura.process')
local stand_in = require('support.stand_in')
local railway_service = require('support.railway_service')
local util = require('support.util')

local HOST = 'build/mayura'
local EXAMPLE = 'examples/coding_agent.lua'
local TOKEN = 'rw_example0123456789abcdefTOKEN'
local ENV = 'env-example'

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

describe('examples/coding_agent.lua --provider railway', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent) for the stand-in: not available here')
    return
  end
  local svc, backing, state, dir, ws_url

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
    state = railway_service.install(svc, backing, { token = TOKEN, environment_id = ENV })
    dir = util.tmpdir()
    ws_url = state:start_front(dir)
  end)

  teardown(function()
    state.close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
    util.rmdir(dir)
  end)

  it('needs RAILWAY_API_TOKEN and RAILWAY_ENVIRONMENT_ID (exit code 2)', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'railway' },
      { env = env({ RAILWAY_ENVIRONMENT_ID = ENV }), timeout_ms = 60000 })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('RAILWAY_API_TOKEN', 1, true), r.stderr)
    assert.are.equal(0, #svc.requests)
  end)

  it('plays the recorded session on the stand-in, and the re-check passes', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'railway' }, {
      env = env({
        RAILWAY_API_TOKEN = TOKEN, RAILWAY_ENVIRONMENT_ID = ENV,
        RAILWAY_GRAPHQL_ENDPOINT = svc:url(railway_service.PATH), RAILWAY_TCP_PROXY_WS_ENDPOINT = ws_url,
      }),
      timeout_ms = 180000,
    })
    local all = r.stdout .. r.stderr
    assert.are.equal(0, r.exit_code, all)
    assert.truthy(r.stdout:find('plays a recorded session', 1, true), all)
    assert.truthy(r.stdout:find('Sandboxes: railway, network all', 1, true), all)
    local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
    assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
    assert.truthy(r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed), all)
    assert.truthy(r.stdout:find('\nVerdict: the re-check passed', 1, true), all)
    assert.is_falsy(all:find(TOKEN, 1, true))
    -- the run's sandbox and the re-check's, both destroyed at the end
    local creates = state:calls('sandboxCreate')
    assert.are.equal(2, #creates)
    for _, c in ipairs(creates) do
      assert.are.equal('Bearer ' .. TOKEN, c.req.headers.authorization)
      assert.are.equal('DESTROYED', state.sandboxes[c.id].status)
    end
    assert.are.equal(0, backing.pool:count())
    assert.are.equal(0, #state:calls('sandboxExec'))   -- every command went over the bridge
  end)
end)
