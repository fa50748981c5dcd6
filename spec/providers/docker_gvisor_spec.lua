-- mayura.sandbox.docker with `runtime`: the option checked against the daemon's runtimes, and the gVisor
-- tier (`runtime = 'runsc'`, registered by scripts/docker-setup.sh): the conformance suite under it, the
-- kernel its commands meet, what `enforced` says differs; and the local provider's refusal of
-- `isolation = 'gvisor'`. The abuse suite runs under it too, as the 'docker-runsc' entry of
-- spec/support/providers.lua.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local docker = require('mayura.sandbox.docker')
local compat = require('support.compat')

local BUSYBOX = 'mayura-test/busybox:1'

local function host(cmd) return compat.shell(cmd .. ' 2>/dev/null') end

local _, daemon_answers = host('docker info')
if not daemon_answers then
  error('no Docker daemon answers `docker info`: run scripts/docker-setup.sh (as root) before these specs', 0)
end
local has_runsc = host("docker info --format '{{json .Runtimes}}'"):find('"runsc"', 1, true) ~= nil

-- The containers of the sandbox `id` (any state).
local function containers_of(id)
  local n = 0
  for _ in host('docker ps -aq --filter label=mayura.sandbox=' .. id):gmatch('%x+') do n = n + 1 end
  return n
end

describe('the runtime option of docker_sandboxes', function()
  it('refuses a runtime the daemon does not have, or a malformed name, with INVALID_CONFIG', function()
    for _, engine in ipairs({ 'cli', 'api' }) do
      local err = assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes,
        { image = BUSYBOX, engine = engine, runtime = 'no-such-runtime' })
      assert.matches('no runtime named no%-such%-runtime', err.message)
      assert.matches('runc', err.message)   -- it says which there are
      for _, bad in ipairs({ '', 5, true, '--privileged', 'run c', 'a/b', ('x'):rep(65), 'runc\n' }) do
        assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, engine = engine, runtime = bad })
      end
    end
  end)

  it('only checks the name when a policy is checked: the daemon is not asked', function()
    -- a runtime this daemon does not have passes a check, which runs nothing; a malformed name does not
    local p = docker.docker_sandboxes({ image = BUSYBOX, engine = 'cli', docker = '/bin/false',
      runtime = 'not-asked' }, { check = true })
    assert.are.equal('not-asked', p.runtime)
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, runtime = '--x' }, { check = true })
    assert.are.same({ 'none' }, docker.docker_sandboxes({ image = BUSYBOX, runtime = 'runsc' }, { check = true })
      .features.network)
  end)

  it('takes the default runtime by name, with the default tier\'s features', function()
    local p = docker.docker_sandboxes({ image = BUSYBOX, engine = 'api', runtime = 'runc', memory_mib = 128 })
    assert.are.equal('host', p.enforced.kernel)
    assert.is_true(p.enforced.inodes)
    assert.is_true(p.features.network[2] == 'all')
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal(0, sb:exec({ 'true' }).exit_code)
    assert.are.equal(1, containers_of(sb.id))
    sb:release()
    pool:close()
    assert.are.equal(0, containers_of(sb.id))
  end)
end)

describe('the local provider\'s isolation option', function()
  it('refuses isolation = \'gvisor\' with INVALID_CONFIG, saying why, and anything else but namespaces', function()
    local ok, lp = pcall(require, 'mayura.sandbox.local')
    assert.is_true(ok, tostring(lp))
    local err = assert.raises_code('INVALID_CONFIG', lp.local_sandboxes, { isolation = 'gvisor' })
    assert.matches('runtime = \'runsc\'', err.message)
    assert.matches('whole file system', err.message)
    assert.raises_code('INVALID_CONFIG', lp.local_sandboxes, { isolation = 'kvm' })
    assert.raises_code('INVALID_CONFIG', lp.local_sandboxes, { isolation = 5 })
  end)
end)

describe('the gVisor tier (runtime = \'runsc\')', function()
  if not has_runsc then
    it('needs the runtime runsc', function()
      pending('the daemon has no runtime runsc (scripts/docker-setup.sh registers it when runsc is installable)')
    end)
    return
  end

  for _, engine in ipairs({ 'cli', 'api' }) do
    describe('the conformance suite under gVisor (' .. engine .. ')', function()
      local provider = docker.docker_sandboxes({ image = BUSYBOX, engine = engine, runtime = 'runsc',
        memory_mib = 512, pids = 128 })
      local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
      local sb = pool:create({ lifetime_ms = 600000 })
      for _, case in ipairs(testing.sandbox_conformance) do
        it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
      end
      teardown(function() pool:close() end)
    end)
  end

  describe('a gVisor sandbox', function()
    local provider, pool, sb
    setup(function()
      provider = docker.docker_sandboxes({ image = BUSYBOX, engine = 'api', runtime = 'runsc', memory_mib = 256,
        pids = 32 })
      pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000,
        network = { 'none', 'all' } })
      sb = pool:create({ lifetime_ms = 600000 })
    end)
    teardown(function() pool:close() end)

    it('says what differs in enforced and features', function()
      assert.are.equal('gvisor', provider.enforced.kernel)
      assert.is_false(provider.enforced.inodes)          -- gVisor's tmpfs has no inode cap
      assert.is_false(provider.enforced.oom_protected)   -- the host's OOM killer ends the sandbox whole
      assert.is_true(provider.enforced.memory and provider.enforced.pids and provider.enforced.lifetime)
      assert.are.same({ 'none' }, provider.features.network)
      assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all' })
    end)

    it('runs its commands on gVisor\'s kernel, not the host\'s, under the agent\'s filter', function()
      local r = sb:exec({ 'sh', '-c', 'uname -r; grep -E "^(Seccomp|CapEff):" /proc/self/status' })
      assert.are.equal(0, r.exit_code, r.stderr)
      local host_release = host('uname -r'):match('%S+')
      assert.are_not.equal(host_release, r.stdout:match('^(%S+)'))
      assert.matches('Seccomp:%s+2', r.stdout)
      assert.matches('CapEff:%s+0+\n', r.stdout)
      -- its mount table is gVisor's own: no path of Docker's storage, nor of this host
      local mi = sb:exec({ 'cat', '/proc/self/mountinfo' }).stdout
      assert.is_nil(mi:find('/var/lib/docker', 1, true), mi)
      assert.is_nil(mi:find('/run/mayura', 1, true), mi)
    end)

    it('holds the sandbox to pids, and the next command forks freely again', function()
      -- gVisor's own host threads count in the pids cgroup too: forks past the limit may end the
      -- sandbox whole, during the flood or a little after its answer (enforced.oom_protected is
      -- false; the known limits say so). Held either way: the sandbox is gone, and a new one works
      local function ended_whole(err)
        assert.are.equal('SANDBOX_ERROR', err.code, tostring(err))
        assert.are.equal('gone', err.reason, tostring(err))
        sb:release()
        sb = pool:create({ lifetime_ms = 600000 })
        assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      end
      local ok, r = pcall(sb.exec, sb, { 'sh', '-c', 'ulimit -u; i=0; while [ $i -lt 64 ]; do sleep 1 & ' ..
        'i=$((i+1)); done; echo started' }, { timeout_ms = 20000 })
      if not ok then return ended_whole(r) end
      assert.matches('^32\n', r.stdout)
      assert.matches('can\'t fork', r.stderr)
      assert.is_nil(r.stdout:find('started', 1, true))
      -- once its sleeps are over the next command forks freely again
      local deadline = os.time() + 15
      repeat
        ok, r = pcall(sb.exec, sb, { 'sh', '-c', 'i=0; while [ $i -lt 20 ]; do sleep 0.1 & i=$((i+1)); done; wait; echo done' },
          { timeout_ms = 20000 })
        if not ok then return ended_whole(r) end
      until r.stdout == 'done\n' or os.time() > deadline
      assert.are.equal('done\n', r.stdout, r.stderr)
    end)
  end)
end)
