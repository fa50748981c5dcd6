-- examples/coding_agent.lua, the coding-agent guide end to end, run as `make demo` runs it: a
-- subprocess of build/mayura with no OPENAI_API_KEY, so it plays the recorded session through the
-- scripted model against real sandboxes, runs the tests again on the returned files and exits 0
-- only when that re-check passes; the same with Docker, and with Daytona on its stand-in.
local process = require('mayura.process')

local HOST = require('support.compat').host
local EXAMPLE = 'examples/coding_agent.lua'

-- The environment of this process, without any model key (plus `extra`).
local function env(extra)
  local out = {}
  for _, name in ipairs({ 'PATH', 'HOME', 'LANG', 'TMPDIR' }) do out[name] = os.getenv(name) end
  for k, v in pairs(extra or {}) do out[k] = v end
  return out
end

local function demo(args, extra_env)
  local argv = { HOST, EXAMPLE }
  for _, a in ipairs(args or {}) do argv[#argv + 1] = a end
  return process.run(argv, { env = env(extra_env), timeout_ms = 120000 })
end

local function lines(text)
  local out = {}
  for line in text:gmatch('[^\n]+') do out[#out + 1] = line end
  return out
end

-- Checks a successful offline run of the demo.
local function check_offline_run(r)
  local all = r.stdout .. r.stderr
  assert.are.equal(0, r.exit_code, all)
  local out = lines(r.stdout)
  assert.truthy(out[1]:find('no OPENAI_API_KEY', 1, true), out[1])
  assert.truthy(out[1]:find('plays a recorded session', 1, true), out[1])
  -- the tests fail in the sandbox, then pass after the fix, as the progress shows
  local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
  assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
  local passed = r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed)
  assert.truthy(passed, 'a passing run of node --test after the failing one:\n' .. all)
  -- each model call with its cost and the cost so far
  assert.truthy(r.stdout:find('model call 1 .- so far %$0%.%d%d%d%d'), all)
  assert.truthy(r.stdout:find('\nRun succeeded:', 1, true), all)
  assert.truthy(r.stdout:find('\n--- slugify.js ', 1, true), all)
  assert.truthy(r.stdout:find('\n--- slugify.test.js ', 1, true), all)
  assert.truthy(out[#out]:find('^Verdict: the re%-check passed'), out[#out])
end

describe('examples/coding_agent.lua', function()
  it('refuses an unknown provider, and a key without a model, with exit code 2', function()
    local r = demo({ '--provider', 'nowhere' })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('usage:', 1, true))
    r = demo({}, { OPENAI_API_KEY = 'sk-not-a-key' })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stderr:find('OPENAI_MODEL', 1, true), r.stderr)
  end)

  it('plays the recorded session: the tests fail, then pass, and the re-check passes', function()
    local r = demo()
    check_offline_run(r)
  end)

  it('does the same with Docker sandboxes (--provider docker)', function()
    local found, image = pcall(process.run, { 'docker', 'image', 'inspect', 'mayura-test/node:1' },
      { timeout_ms = 30000 })
    if not found or image.exit_code ~= 0 then
      pending('no Docker image mayura-test/node:1 here (scripts/docker-setup.sh builds it)')
      return
    end
    check_offline_run(demo({ '--provider', 'docker' }))
  end)

  it('does the same with Daytona sandboxes (--provider daytona) on the Daytona stand-in', function()
    local daytona_service = require('support.daytona_service')
    local key = 'dtn_example_5b7d9f1a3c5e7a9b'
    local r = demo({ '--provider', 'daytona' })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)   -- no key, no run
    assert.truthy(r.stderr:find('DAYTONA_API_KEY', 1, true), r.stderr)
    local svc = daytona_service.new({ api_key = key })
    r = demo({ '--provider', 'daytona' }, { DAYTONA_API_KEY = key, DAYTONA_API_URL = svc:url('/api') })
    local created, left = svc.daytona.created, svc.daytona.count()
    svc:close()
    check_offline_run(r)
    assert.are.equal(2, created)   -- the run's sandbox and the re-check's, both on the stand-in
    assert.are.equal(0, left)      -- and both released
    assert.are.same({}, svc.failures)
  end)
end)
