--- The scaffolding the provider specs of hosted services share (spec/providers/*_spec.lua): a
-- describe block that runs only where local sandboxes can (the stand-ins of support/*_service.lua
-- run over them), one stand-in with a pool and a sandbox for the whole block, the conformance
-- suite through that sandbox, a check script of an official npm package run against the stand-in,
-- and the checks the specs of a service's own (native) snapshots share.
--
--   suite.describe('the Fly stand-in, over real local sandboxes', function()
--     local svc, backing, state, pool, sb
--     suite.stand_in_pool({ install = ..., provider = ..., pool = ..., create = ...,
--       ready = function(e) svc, backing, state, pool, sb = e.svc, e.backing, e.state, e.pool, e.sb end })
--     suite.conformance(function() return sb end)
--   end)
local busted = require('busted')
local assert = require('luassert')
local describe, it, pending = busted.describe, busted.it, busted.pending
local setup, teardown = busted.setup, busted.teardown

local M = {}

local can_run_local

--- describe(title, fn), pending where local sandboxes (bubblewrap and the agent) cannot run.
function M.describe(title, fn)
  if can_run_local == nil then
    can_run_local = pcall(function() require('mayura.sandbox.local').local_sandboxes({}) end)
  end
  describe(title, function()
    if not can_run_local then
      pending('needs local sandboxes (bubblewrap and the agent): not available here')
      return
    end
    fn()
  end)
end

--- In the enclosing describe: before its cases a stand-in (`svc`) over a local backing of
-- s.backing (default 6) sandboxes, state = s.install(svc, backing, env), provider =
-- s.provider(svc, env), pool = create_sandboxes(provider, s.pool), sb = pool:create(s.create);
-- then s.ready(env) gets them all (env.svc, env.backing, env.state, env.provider, env.pool,
-- env.sb). After its cases the pool closes, s.teardown(env) runs, the backing closes and the
-- stand-in must have recorded no failure.
function M.stand_in_pool(s)
  local env = {}
  setup(function()
    local sandbox = require('mayura.sandbox')
    local stand_in = require('support.stand_in')
    env.svc = stand_in.new()
    env.backing = stand_in.local_backing({ max_sandboxes = s.backing or 6 })
    env.state = s.install(env.svc, env.backing, env)
    env.provider = s.provider(env.svc, env)
    env.pool = sandbox.create_sandboxes(env.provider, s.pool)
    env.sb = env.pool:create(s.create)
    s.ready(env)
  end)
  teardown(function()
    env.pool:close()
    if s.teardown then s.teardown(env) end
    env.backing:close()
    assert.are.same({}, env.svc.failures)
    env.svc:close()
  end)
  return env
end

--- A describe `title` (default 'passes the conformance suite through the mayura provider') with
-- one case per case of mayura.sandbox.testing's conformance suite, each run on sandbox().
function M.conformance(sandbox_of, title)
  local testing = require('mayura.sandbox.testing')
  describe(title or 'passes the conformance suite through the mayura provider', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sandbox_of() })) end)
    end
  end)
end

--- Whether the npm package `package` is installed under spec/npm; where it is not, the case is
-- marked pending, naming the package as `what`.
function M.npm_installed(package, what)
  local found = io.open('spec/npm/node_modules/' .. package .. '/package.json')
  if not found then
    pending(what .. ' is not installed (sh scripts/setup.sh installs spec/npm)')
    return false
  end
  found:close()
  return true
end

--- Runs `node script` with PATH, HOME and `vars` in its environment, within `timeout_ms`
-- (default 60 s); returns the process's result.
function M.node(script, vars, timeout_ms)
  local env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME') }
  for k, v in pairs(vars or {}) do env[k] = v end
  return require('mayura.process').run({ 'node', script }, { timeout_ms = timeout_ms or 60000, env = env })
end

-- {======================================================
-- Native snapshots
-- =======================================================

--- What the native snapshot specs make in a sandbox (its workdir /workspace) before a snapshot.
M.SNAPSHOT_FILES = 'mkdir -p s/d && printf one > s/a.txt && chmod 640 s/a.txt && chmod 700 s/d && '
  .. 'ln -s a.txt s/link && printf t > /tmp/t.txt'

-- `<type> <mode> <path> <content or link>` of each name under /workspace and /tmp (not the backends' own).
local LISTING = 'cd / && find workspace tmp -mindepth 1 ! -name ".mayura-*" ! -path "*/.mayura-*" '
  .. '! -name ".svc-*" | sort | while read -r f; do '
  .. 'if [ -h "$f" ]; then echo "l $f $(readlink "$f")"; elif [ -d "$f" ]; then echo "d $(stat -c %a "$f") $f"; '
  .. 'else echo "f $(stat -c %a "$f") $f $(cat "$f")"; fi; done'

--- The files of `sb` (see LISTING), as one string.
function M.listing(sb)
  return sb:exec({ 'sh', '-c', LISTING }).stdout
end

--- Checks that `fork` holds exactly the files `before` lists (M.listing), SNAPSHOT_FILES among them.
function M.same_files(before, fork)
  assert.are.equal(before, M.listing(fork))
  assert.truthy(before:find('f 640 workspace/s/a.txt one', 1, true), before)
  assert.truthy(before:find('l workspace/s/link a.txt', 1, true), before)
  assert.truthy(before:find('d 700 workspace/s/d', 1, true), before)
end

--- Checks that a create from `snap` by `other` (another pool), or by `pool` with an image too, is
-- refused before any call: `creates()` counts the service's create calls.
function M.snapshot_refusals(pool, other, snap, creates)
  local n = creates()
  assert.raises_code('INVALID_INPUT', other.create, other, { lifetime_ms = 60000, snapshot = snap })
  assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, snapshot = snap, image = 'x' })
  assert.are.equal(n, creates())
end

-- }======================================================

return M
