--- Runs examples/coding_agent.lua under build/mayura for the specs of spec/examples/ that play the
-- coding-agent guide's recorded session on a provider (most of them hosted, on a stand-in of
-- support/*_service.lua over real local sandboxes): its environment without any model key, the
-- usage error of a missing credential, the checks of a played session, and `hosted_suite`, the
-- describe block with one stand-in for the whole file.
local busted = require('busted')
local assert = require('luassert')
local process = require('mayura.process')
local describe, pending = busted.describe, busted.pending
local setup, teardown = busted.setup, busted.teardown

local M = {}

M.HOST = 'build/mayura'
M.EXAMPLE = 'examples/coding_agent.lua'

--- The environment of this process without any model key, plus `extra`.
function M.env(extra)
  local out = {}
  for _, name in ipairs({ 'PATH', 'HOME', 'LANG', 'TMPDIR' }) do out[name] = os.getenv(name) end
  for k, v in pairs(extra or {}) do out[k] = v end
  return out
end

--- The example run with --provider `name` and the environment variables `vars`; its result.
function M.run(name, vars, timeout_ms)
  return process.run({ M.HOST, M.EXAMPLE, '--provider', name }, { env = M.env(vars), timeout_ms = timeout_ms or 180000 })
end

--- Runs the example with `vars` lacking a credential: a usage error (exit code 2) that names
-- `missing` on stderr; and where `svc` is given, the stand-in heard nothing.
function M.needs(name, vars, missing, svc)
  local r = M.run(name, vars, 60000)
  assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
  if missing then assert.truthy(r.stderr:find(missing, 1, true), r.stderr) end
  if svc then assert.are.equal(0, #svc.requests) end
  return r
end

--- Runs the example with `vars` and checks the session's course: it exits 0, says it plays the
-- recorded session on 'Sandboxes: <name>, <network>', a failing node --test comes before a
-- passing one, the re-check passes, and `secret` (where given) never shows. Returns the result.
function M.plays(name, vars, secret, network)
  local r = M.run(name, vars)
  local all = r.stdout .. r.stderr
  assert.are.equal(0, r.exit_code, all)
  assert.truthy(r.stdout:find('plays a recorded session', 1, true), all)
  assert.truthy(r.stdout:find('Sandboxes: ' .. name .. ', ' .. network, 1, true), all)
  local failed = r.stdout:find('%$ node %-%-test%s+%-> exit [1-9]')
  assert.truthy(failed, 'a failing run of node --test in the progress:\n' .. all)
  assert.truthy(r.stdout:find('%$ node %-%-test%s+%-> exit 0', failed), all)
  assert.truthy(r.stdout:find('\nVerdict: the re-check passed', 1, true), all)
  if secret then assert.is_falsy(all:find(secret, 1, true)) end
  return r
end

--- The describe block `title` of a hosted provider's example spec: pending where local sandboxes
-- cannot run; otherwise one stand-in (env.svc) over a local backing of four sandboxes
-- (env.backing), env.state = s.install(svc, backing, env), declared cases s.cases(env); at the
-- end s.teardown(env), the backing closes and the stand-in must have recorded no failure.
function M.hosted_suite(s)
  local can_run_local = pcall(function() require('mayura.sandbox.local').local_sandboxes({}) end)
  describe(s.title, function()
    if not can_run_local then
      pending('needs local sandboxes (bubblewrap and the agent) for the stand-in: not available here')
      return
    end
    local stand_in = require('support.stand_in')
    local env = {}

    setup(function()
      env.svc = stand_in.new()
      env.backing = stand_in.local_backing({ max_sandboxes = 4 })
      env.state = s.install(env.svc, env.backing, env)
    end)

    teardown(function()
      if s.teardown then s.teardown(env) end
      env.backing:close()
      assert.are.same({}, env.svc.failures)
      env.svc:close()
    end)

    s.cases(env)
  end)
end

return M
