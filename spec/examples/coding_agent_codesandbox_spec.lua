-- examples/coding_agent.lua --provider codesandbox: the coding-agent guide's recorded session on
-- CodeSandbox VMs, here the CodeSandbox stand-in (support/codesandbox_service.lua over real local
-- sandboxes, its pitcher behind a Node WebSocket front) run by this spec, with the example pointed
-- at it by CSB_BASE_URL. The run's tests fail, then pass, and the example's own re-check in a
-- fresh sandbox passes; the token never shows.
local process = require('mayura.process')
local stand_in = require('support.stand_in')
local codesandbox_service = require('support.codesandbox_service')
local util = require('support.util')

local HOST = 'build/mayura'
local EXAMPLE = 'examples/coding_agent.lua'
local TOKEN = 'csb_example0123456789abcdefTOKEN'

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

describe('examples/coding_agent.lua --provider codesandbox', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent) for the stand-in: not available here')
    return
  end
  local svc, backing, state, dir

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
    state = codesandbox_service.install(svc, backing, { token = TOKEN })
    dir = util.tmpdir()
    state:start_front(dir)
  end)

  teardown(function()
    state.close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
    util.rmdir(dir)
  end)

  it('needs CSB_API_KEY (exit code 2)', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'codesandbox' }, { env = env(), timeout_ms = 60000 })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('CSB_API_KEY', 1, true), r.stderr)
    assert.are.equal(0, #svc.requests)
  end)

  it('plays the recorded session on the stand-in, and the re-check passes', function()
    local r = process.run({ HOST, EXAMPLE, '--provider', 'codesandbox' }, {
      env = env({ CSB_API_KEY = TOKEN, CSB_BASE_URL = svc:url(''), CSB_WORKDIR = codesandbox_service.WORKSPACE }),
      timeout_ms = 180000,
    })
    local all = r.stdout .. r.stderr
    assert.are.equal(0, r.exit_code, all)
    assert.truthy(r.stdout:find('plays a recorded session', 1, true), all)
    assert.truthy(r.stdout:find('Sandboxes: codesandbox, ', 1, true), all)
    local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
    assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
    assert.truthy(r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed), all)
    assert.truthy(r.stdout:find('\nVerdict: the re-check passed', 1, true), all)
    assert.is_falsy(all:find(TOKEN, 1, true))
    -- the run's sandbox and the re-check's, both deleted at the end
    local forks = svc:calls('POST', '/sandbox/{template}/fork')
    assert.are.equal(2, #forks)
    for _, f in ipairs(forks) do assert.are.equal('Bearer ' .. TOKEN, f.headers.authorization) end
    assert.are.equal(2, #svc:calls('DELETE', '/vm/{id}'))
    assert.are.same({}, state.sandboxes)
    assert.are.equal(0, backing.pool:count())
  end)
end)
