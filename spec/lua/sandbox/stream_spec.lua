-- Streamed output and started processes (sandbox:exec's on_stdout/on_stderr, sandbox:start) on
-- every provider that runs here (support/providers.lua), on the command backend (over local
-- sandboxes) and on the stand-ins of E2B and Vercel (which stream as the services do): output
-- comes while the command runs, in order, within max_output_bytes (the callbacks stop at the
-- cap, the result says truncated), a cancel stops a streaming exec and a started process,
-- kill() signals one and wait() says how it ended, and a release stops what was started.
local sandbox = require('mayura.sandbox')
local task = require('mayura._task')
local providers = require('support.providers')
local transports = require('support.command_transports')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')
local e2b = require('mayura.sandbox.e2b')
local vercel = require('mayura.sandbox.vercel')
local vercel_service = require('support.vercel_service')

local CAP = 1000

-- Waits (at most 20 s) until fn() is true.
local function eventually(fn, what)
  for _ = 1, 2000 do
    if fn() then return end
    task.sleep(10)
  end
  error('never happened: ' .. what)
end

-- Whether a result says the command was killed by signal `sig` (the command backend and the
-- E2B stand-in report a shell's 128 + signal, or the signal).
local function killed_by(r, sig)
  return r.signal == sig or r.exit_code == 128 + sig
end

-- The cases on the sandboxes `make()` gives (a fresh one per call), `o.term`: SIGTERM reaches the
-- command as itself (a provider that can only kill says false).
local function cases(make, o)
  local sb
  setup(function() sb = make() end)
  teardown(function() if sb then sb:release() end end)

  it('streams stdout and stderr in order, and the result carries the same bytes', function()
    local log, out, err = {}, {}, {}
    local r = sb:exec({ 'sh', '-c', 'echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c' }, {
      on_stdout = function(c) out[#out + 1] = c; log[#log + 1] = 'o' .. c end,
      on_stderr = function(c) err[#err + 1] = c; log[#log + 1] = 'e' .. c end,
    })
    assert.are.equal(0, r.exit_code)
    assert.are.equal('a\nc\n', table.concat(out))
    assert.are.equal('b\n', table.concat(err))
    assert.are.equal(r.stdout, table.concat(out))
    assert.are.equal(r.stderr, table.concat(err))
    assert.are.same({ 'oa\n', 'eb\n', 'oc\n' }, log)
  end)

  it('stops the callback at max_output_bytes and says truncated', function()
    local n, calls = 0, 0
    local r = sb:exec({ 'sh', '-c', 'yes abcdefgh | head -c 200000; echo x >&2' }, {
      on_stdout = function(c) n = n + #c; calls = calls + 1 end,
    })
    assert.are.equal(CAP, n)
    assert.are.equal(CAP, #r.stdout)
    assert.is_true(r.truncated)
    assert.are.equal('x\n', r.stderr)
    assert.are.equal(('abcdefgh\n'):rep(112):sub(1, CAP), r.stdout)
    assert.truthy(calls >= 1)
  end)

  it('a cancel stops a streaming exec', function()
    local token = task.cancel_token()
    assert.raises_code('CANCELLED', sb.exec, sb, { 'sh', '-c', 'echo go; sleep 30' }, {
      signal = token, on_stdout = function() token:cancel() end,
    })
  end)

  it('start: output comes while it runs, kill() ends it, wait() says how', function()
    local seen = {}
    local p = sb:start({ 'sh', '-c', 'echo hi; sleep 30' }, { on_stdout = function(c) seen[#seen + 1] = c end })
    eventually(function() return p:output().stdout == 'hi\n' end, 'the output of a running process')
    assert.are.same({ 'hi\n' }, seen)
    assert.is_true(p:kill())
    local r = p:wait()
    assert.is_true(killed_by(r, 9))
    assert.are.equal('hi\n', r.stdout)
    assert.is_false(p:kill())
    assert.are.equal(r, p:wait())
  end)

  it('start: a process that ends on its own, and a signal by name', function()
    local p = sb:start({ 'sh', '-c', 'echo done' })
    local r = p:wait()
    assert.are.equal(0, r.exit_code)
    assert.are.equal('done\n', r.stdout)
    p = sb:start({ 'sh', '-c', 'trap "echo bye; exit 3" TERM; echo ready; while :; do sleep 0.05; done' })
    eventually(function() return p:output().stdout == 'ready\n' end, 'the trap set')
    p:kill('TERM')
    r = p:wait()
    if o.term then
      assert.are.equal(3, r.exit_code)
      assert.are.equal('ready\nbye\n', r.stdout)
    else
      assert.is_true(killed_by(r, 9) or killed_by(r, 15))
    end
    assert.raises_code('INVALID_INPUT', p.kill, p, 'NOPE')
  end)

  it('start: a cancel stops a started process', function()
    local token = task.cancel_token()
    local p = sb:start({ 'sh', '-c', 'echo up; sleep 30' }, { signal = token })
    eventually(function() return p:output().stdout == 'up\n' end, 'the process up')
    token:cancel()
    assert.raises_code('CANCELLED', p.wait, p)
  end)

  it('release stops what was started', function()
    local other = make()
    local p = other:start({ 'sh', '-c', 'echo up; sleep 30' })
    eventually(function() return p:output().stdout == 'up\n' end, 'the process up')
    other:release()
    local ok, err = pcall(p.wait, p)
    assert.is_false(ok)
    assert.is_true(sandbox.is_error(err, 'SANDBOX_ERROR'))
    assert.are.equal('gone', err.reason)
  end)
end

for _, entry in ipairs(providers.list()) do
  describe('streaming on ' .. entry.name, function()
    local pool
    cases(function()
      if not pool then pool = entry.make_pool({ max_output_bytes = CAP, max_sandboxes = 2 }) end
      return pool:create({ lifetime_ms = 120000 })
    end, { term = true })
    teardown(function() if pool then pool:close() end end)
  end)
end

local local_ok = false
for _, entry in ipairs(providers.list()) do if entry.name == 'local' then local_ok = true end end

describe('streaming on the command backend (by polling)', function()
  if not local_ok then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local provider, pool
  cases(function()
    if not pool then
      provider = transports.command_provider({ stdin = true, max_command_bytes = 65536 })
      pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000, max_output_bytes = CAP })
    end
    return pool:create({ lifetime_ms = 120000 })
  end, { term = true })
  teardown(function()
    if pool then pool:close() end
    if provider then provider.pool:close() end
  end)
end)

describe('streaming on E2B (the stand-in)', function()
  if not local_ok then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, pool
  cases(function()
    if not pool then
      svc = stand_in.new()
      backing = stand_in.local_backing({ max_sandboxes = 4 })
      e2b_service.install(svc, backing, { api_key = 'e2b_0123456789abcdef0123456789abcdef' })
      pool = sandbox.create_sandboxes(e2b.e2b_sandboxes({ api_key = 'e2b_0123456789abcdef0123456789abcdef',
        api_url = svc:url(''), sandbox_url = svc:url(''), workdir = '/workspace', retry_base_ms = 20 }),
        { max_sandboxes = 2, max_lifetime_ms = 600000, max_output_bytes = CAP })
    end
    return pool:create({ lifetime_ms = 120000 })
  end, { term = true })   -- envd's SendSignal SIGTERM reaches the command's own process
  teardown(function()
    if pool then pool:close() end
    if backing then backing:close() end
    if svc then svc:close() end
  end)
end)

describe('streaming on Vercel (the stand-in)', function()
  if not local_ok then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, pool
  cases(function()
    if not pool then
      svc = stand_in.new()
      backing = stand_in.local_backing({ max_sandboxes = 4 })
      vercel_service.install(svc, backing, { token = 'vcp_0123456789abcdefTOKEN', team_id = 'team_m',
        project_id = 'prj_m' })
      pool = sandbox.create_sandboxes(vercel.vercel_sandboxes({ token = 'vcp_0123456789abcdefTOKEN',
        team_id = 'team_m', project_id = 'prj_m', base_url = svc:url('/api'), workdir = '/workspace',
        retry_base_ms = 20 }), { max_sandboxes = 2, max_lifetime_ms = 600000, max_output_bytes = CAP })
    end
    return pool:create({ lifetime_ms = 120000 })
  end, { term = true })   -- the service's kill sends the signal asked for to the command's process
  teardown(function()
    if pool then pool:close() end
    if backing then backing:close() end
    if svc then svc:close() end
  end)
end)
