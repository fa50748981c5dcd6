-- examples/coding_agent.lua --provider e2b: the guide's coding agent on E2B, against the E2B
-- stand-in (support/e2b_service.lua, real local sandboxes behind it) served from this process
-- while the example runs as a subprocess of build/mayura. It plays the recorded session, and its
-- independent re-check (node --test in a fresh sandbox) must pass; the key comes from
-- E2B_API_KEY, read by the example, never by the library.
local sandbox = require('mayura.sandbox')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')

local example = require('support.coding_agent_example')

local KEY = 'e2b_example_0123456789abcdef012345'

local can_run_local = pcall(function()
  local local_provider = require('mayura.sandbox.local')
  local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
  local sb = pool:create({ lifetime_ms = 60000 })
  sb:release()
  pool:close()
end)

local function demo(extra_env)
  return example.run('e2b', extra_env, 120000)
end

describe('examples/coding_agent.lua --provider e2b', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent) behind the E2B stand-in: not available here')
    return
  end

  it('needs E2B_API_KEY: without it, a usage error (exit 2)', function()
    local r = demo()
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('E2B_API_KEY', 1, true), r.stderr)
  end)

  it('plays the recorded session on the stand-in: the tests fail, then pass, and the re-check passes', function()
    local svc = stand_in.new()
    local backing = stand_in.local_backing({ max_sandboxes = 4 })
    local service = e2b_service.install(svc, backing, { api_key = KEY })
    local r = demo({ E2B_API_KEY = KEY, E2B_API_URL = svc:url(''), E2B_SANDBOX_URL = svc:url(''),
      E2B_WORKDIR = '/workspace' })
    local all = r.stdout .. r.stderr
    assert.are.equal(0, r.exit_code, all)
    assert.truthy(r.stdout:find('Sandboxes: e2b', 1, true), all)
    local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
    assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
    assert.truthy(r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed), all)
    assert.truthy(r.stdout:find('\nRun succeeded:', 1, true), all)
    local last = r.stdout:match('([^\n]+)\n?$')
    assert.truthy(last:find('^Verdict: the re%-check passed'), last)
    assert.is_falsy(all:find(KEY, 1, true))
    -- two sandboxes on the service: the run's, with its run label, and the re-check's; both ended
    local creates = svc:calls('POST', '/v2/sandboxes')
    assert.are.equal(2, #creates)
    assert.truthy(creates[1].json.metadata.run)
    assert.are.equal('base', creates[1].json.templateID)
    assert.are.equal(900, creates[1].json.timeout)
    assert.are.equal(2, #svc:calls('DELETE', '/sandboxes/{id}'))
    assert.is_nil(next(service.sandboxes))
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)
end)
