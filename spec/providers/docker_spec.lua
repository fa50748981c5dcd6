-- mayura.sandbox.docker: the conformance suite and the lockdown, against a real Docker engine, both engines.
--
-- Needs a daemon that answers `docker info` and the offline test images (scripts/docker-setup.sh makes
-- both; the test setup runs it). Without them this file fails at once, loudly: it never skips.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local docker = require('mayura.sandbox.docker')
local mayura = require('mayura')
local task = require('mayura._task')
local core = require('mayura.core')
local http = require('mayura.http')
local util = require('support.util')

local BUSYBOX = 'mayura-test/busybox:1'
local NODE = 'mayura-test/node:1'
local RUN_BASE = '/run/mayura/docker'
local SECRET = 'env-value-only-inside-5d1c9e'

--- Runs a host shell command; returns its stdout and whether it succeeded.
local function host(cmd)
  local p = io.popen(cmd .. ' 2>/dev/null')
  local out = p:read('a')
  local ok = p:close()
  return out, ok == true
end

local _, daemon_answers = host('docker info')
if not daemon_answers then
  error('no Docker daemon answers `docker info`: run scripts/docker-setup.sh (as root) before these specs', 0)
end
for _, image in ipairs({ BUSYBOX, NODE }) do
  local _, there = host('docker image inspect ' .. image)
  if not there then error('the test image ' .. image .. ' is missing: run scripts/docker-setup.sh', 0) end
end

local raises = util.raises

local function sh(sb, script, opts) return sb:exec({ 'sh', '-c', script }, opts) end

--- Container ids (all states) carrying a label `key=value`.
local function containers(filter)
  local out = host('docker ps -aq --no-trunc --filter label=' .. filter)
  local ids = {}
  for id in out:gmatch('%x+') do ids[#ids + 1] = id end
  return ids
end

local function run_dirs()
  local out = host('ls -1 ' .. RUN_BASE)
  local names = {}
  for name in out:gmatch('[^\n]+') do names[#names + 1] = name end
  return names
end

local function dir_of(id)
  for _, name in ipairs(run_dirs()) do
    if name:find(id, 1, true) then return RUN_BASE .. '/' .. name end
  end
  return nil
end

local function inspect(id)
  local text = host('docker inspect ' .. id)
  local list = core.json.decode(text)
  return list[1], text
end

local function has(list, v)
  for _, x in ipairs(list or {}) do if x == v then return true end end
  return false
end

describe('docker_sandboxes options', function()
  it('refuses bad options with INVALID_CONFIG', function()
    raises('INVALID_CONFIG', docker.docker_sandboxes, nil)
    raises('INVALID_CONFIG', docker.docker_sandboxes, {})
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, nope = 1 })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, engine = 'podman' })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, user = 'sandbox' })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, user = '0:0' })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, workdir = 'relative' })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, workdir = '/tmp' })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, memory_mib = 1 })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, cpus = 0 })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, read_only_root = 'yes' })
    raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, docker = '/no/such/docker' })
  end)

  it('refuses a remote host with INVALID_CONFIG, on both engines', function()
    for _, engine in ipairs({ 'cli', 'api' }) do
      for _, h in ipairs({ 'tcp://203.0.113.7:2375', 'ssh://user@203.0.113.7', 'https://203.0.113.7:2376',
        'npipe:////./pipe/docker_engine', '203.0.113.7:2375' }) do
        local err = raises('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, engine = engine, host = h })
        assert.is_nil(err.message:find('203.0.113.7', 1, true) and err.message:find('dial', 1, true))
      end
    end
  end)

  it('has the reference\'s defaults and features', function()
    local p = docker.docker_sandboxes({ image = BUSYBOX })
    assert.are.same({ stdin = true, ports = true, desktop = false, network = { 'none', 'all' } }, p.features)
    assert.are.equal('/workspace', p.workdir)
    assert.are.equal(86400000, p.max_lifetime_ms)
    assert.are.equal('1000:1000', p.user)
    assert.are.equal(1024, p.memory_mib)
    assert.are.equal(1024, p.workspace_mib)
    assert.are.equal(256, p.tmp_mib)
    assert.are.equal(256, p.pids)
    assert.are.equal(1, p.cpus)
    assert.is_true(p.read_only_root)
    assert.are.equal('cli', p.engine_name)
  end)
end)

for _, engine in ipairs({ 'cli', 'api' }) do
  local provider = docker.docker_sandboxes({ image = BUSYBOX, engine = engine, memory_mib = 512, pids = 128 })

  describe('the conformance suite against docker (' .. engine .. ')', function()
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
    local sb = pool:create({ lifetime_ms = 600000 })
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
    teardown(function() pool:close() end)
  end)

  describe('a docker sandbox (' .. engine .. ')', function()
    local pool
    setup(function()
      pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 600000,
        network = { 'none', 'all' } })
    end)
    teardown(function() pool:close() end)

    it('is locked down, and its env values are nowhere in docker inspect', function()
      local sb = pool:create({ lifetime_ms = 600000, env = { SANDBOX_SECRET = SECRET } })
      assert.are.equal(SECRET .. '\n', sh(sb, 'echo $SANDBOX_SECRET').stdout)
      local info, text = inspect(sb.id)
      assert.is_table(info, 'no container named ' .. sb.id)
      local hc, cfg = info.HostConfig, info.Config
      assert.are.equal('none', hc.NetworkMode)
      assert.is_true(has(hc.CapDrop, 'ALL'))
      assert.is_true(has(hc.SecurityOpt, 'no-new-privileges'))
      assert.is_true(hc.ReadonlyRootfs)
      assert.are.equal('1000:1000', cfg.User)
      assert.are.equal(512 * 1048576, hc.Memory)
      assert.are.equal(hc.Memory, hc.MemorySwap)
      assert.are.equal(1e9, hc.NanoCpus)
      assert.are.equal(128, hc.PidsLimit)
      assert.is_false(hc.Init)
      assert.is_true(hc.AutoRemove)
      assert.matches('size=1073741824', hc.Tmpfs['/workspace'])
      assert.matches('size=268435456', hc.Tmpfs['/tmp'])
      assert.are.equal(sb.id, cfg.Labels['mayura.sandbox'])
      assert.are.same({ '/.mayura/agent' }, cfg.Entrypoint)
      local agent_ro
      for _, m in ipairs(info.Mounts) do
        if m.Destination == '/.mayura/agent' then agent_ro = m.RW == false end
      end
      assert.is_true(agent_ro, 'the agent is not mounted read-only')
      assert.is_nil(text:find(SECRET, 1, true), 'the env value is in docker inspect')
      for _, e in ipairs(cfg.Env or {}) do assert.is_nil(e:find('SANDBOX_SECRET', 1, true)) end
      -- and from inside
      local r = sh(sb, 'id -u; id -g; grep -E "^(CapEff|CapBnd|NoNewPrivs):" /proc/self/status; ' ..
        'cat /proc/1/cmdline | tr "\\000" " "; echo; tail -n +3 /proc/net/dev | cut -d: -f1; ' ..
        'touch /mayura-escape 2>&1; echo x > /bin/mayura-escape 2>&1; cat /proc/1/environ 2>&1')
      assert.matches('^1000\n1000\n', r.stdout)
      assert.matches('CapEff:%s+0000000000000000', r.stdout)
      assert.matches('CapBnd:%s+0000000000000000', r.stdout)
      assert.matches('NoNewPrivs:%s+1', r.stdout)
      assert.matches('/%.mayura/agent %-%-listen', r.stdout)
      assert.matches('\n%s*lo\n', r.stdout)
      assert.is_nil(r.stdout:find('eth0', 1, true))
      assert.matches('Read%-only', r.stdout)
      raises('PERMISSION_DENIED', sb.write_file, sb, '/bin/mayura-escape', 'x')
      -- the socket directory on the host is closed to the sandbox once the host is connected, and
      -- empty: the agent serves that one connection and unlinked its socket
      r = sh(sb, 'ls -ld /.mayura/run; touch /.mayura/run/fill 2>&1 || echo refused')
      assert.matches('refused', r.stdout)
      local dir = dir_of(sb.id)
      assert.is_string(dir, 'no socket directory for ' .. sb.id)
      assert.are.equal('', host('ls -1A ' .. dir))
      sb:release()
      assert.are.same({}, containers('mayura.sandbox=' .. sb.id))
      assert.is_nil(dir_of(sb.id), 'the socket directory outlived release')
    end)

    it('gives a smaller memory and cpus when a sandbox asks for less', function()
      local sb = pool:create({ lifetime_ms = 60000, memory_mib = 64, cpus = 0.5 })
      local info = inspect(sb.id)
      assert.are.equal(64 * 1048576, info.HostConfig.Memory)
      assert.are.equal(64 * 1048576, info.HostConfig.MemorySwap)
      assert.are.equal(5e8, info.HostConfig.NanoCpus)
      sb:release()
    end)

    it('fails with INVALID_CONFIG for a missing image, and creates nothing', function()
      local before = #containers('mayura.provider=docker')
      local dirs = #run_dirs()
      local missing = docker.docker_sandboxes({ image = 'mayura-test/no-such-image:1', engine = engine })
      local p2 = sandbox.create_sandboxes(missing, { max_sandboxes = 1, max_lifetime_ms = 60000 })
      local err = raises('INVALID_CONFIG', p2.create, p2, { lifetime_ms = 60000 })
      assert.is_nil(err.message:find('Error response', 1, true))
      assert.are.equal(0, p2:count())
      raises('INVALID_CONFIG', pool.create, pool, { lifetime_ms = 60000, image = 'mayura-test/nor-this:2' })
      assert.are.equal(before, #containers('mayura.provider=docker'))
      assert.are.equal(dirs, #run_dirs())
      local _, pulled = host('docker image inspect mayura-test/no-such-image:1')
      assert.is_false(pulled)
      p2:close()
    end)

    it('fails an exec with gone when the container is removed behind its back', function()
      local sb = pool:create({ lifetime_ms = 600000 })
      local t = task.spawn(function()
        return pcall(sb.exec, sb, { 'sleep', '30' }, { timeout_ms = 60000 })
      end)
      mayura.sleep(300)
      local _, removed = host('docker rm -f ' .. sb.id)
      assert.is_true(removed)
      local started = core.hrtime_ms()
      local ok, err = t:wait()
      assert.is_false(ok)
      assert.is_true(core.hrtime_ms() - started < 10000)
      assert.are.equal('SANDBOX_ERROR', err.code, tostring(err))
      assert.are.equal('gone', err.reason)
      err = raises('SANDBOX_ERROR', sb.read_file, sb, 'x')
      assert.are.equal('gone', err.reason)
      sb:release()
      assert.is_nil(dir_of(sb.id))
    end)

    it('publishes ports on 127.0.0.1 only with network all, and they answer', function()
      raises('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, ports = { 8080 } })
      local sb = pool:create({ lifetime_ms = 120000, network = 'all', ports = { 8080 } })
      sb:write_file('www/index.html', 'served from the sandbox')
      -- waits until the server listens: the server has then left the command's process group
      local r = sh(sb, 'setsid httpd -f -p 8080 -h /workspace/www >/dev/null 2>&1 </dev/null & ' ..
        'while ! netstat -ltn | grep -q ":8080 "; do sleep 0.05; done; echo started', { timeout_ms = 10000 })
      assert.are.equal('started\n', r.stdout)
      local url = sb:url(8080)
      assert.matches('^http://127%.0%.0%.1:%d+$', url)
      local info = inspect(sb.id)
      assert.are.equal('bridge', info.HostConfig.NetworkMode)
      for _, b in ipairs(info.HostConfig.PortBindings['8080/tcp']) do assert.are.equal('127.0.0.1', b.HostIp) end
      for _, b in ipairs(info.NetworkSettings.Ports['8080/tcp']) do assert.are.equal('127.0.0.1', b.HostIp) end
      local res
      for _ = 1, 50 do
        local ok, got = pcall(http.request, { url = url .. '/index.html', timeout_ms = 2000 })
        if ok and got.status == 200 then res = got break end
        mayura.sleep(100)
      end
      assert.is_table(res, 'the port never answered')
      assert.are.equal('served from the sandbox', res.body)
      raises('INVALID_INPUT', sb.url, sb, 9999)
      sb:release()
    end)

    it('runs node from an image made offline', function()
      local p3 = sandbox.create_sandboxes(docker.docker_sandboxes({ image = NODE, engine = engine }),
        { max_sandboxes = 1, max_lifetime_ms = 600000 })
      local sb = p3:create({ lifetime_ms = 600000, env = { NODE_ENV = 'test' } })
      sb:write_file('index.js', 'console.log(6 * 7, process.env.NODE_ENV)')
      local r = sb:exec({ 'node', 'index.js' })
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.are.equal('42 test\n', r.stdout)
      p3:close()
    end)

    it('removes the socket directories that a killed host left behind, once their lifetime is over', function()
      local stale = RUN_BASE .. '/' .. (os.time() - 3600) .. '-mayura-0123456789ab'
      local fresh = RUN_BASE .. '/' .. (os.time() + 3600) .. '-mayura-ba9876543210'
      assert.is_true(os.execute('mkdir -p ' .. stale .. ' ' .. fresh .. ' && touch ' .. stale .. '/agent.sock'))
      local p4 = sandbox.create_sandboxes(docker.docker_sandboxes({ image = BUSYBOX, engine = engine }),
        { max_sandboxes = 1, max_lifetime_ms = 60000 })
      local sb = p4:create({ lifetime_ms = 60000 })
      local _, stale_left = host('test -e ' .. stale)
      local _, fresh_left = host('test -e ' .. fresh)
      os.execute('rm -rf ' .. fresh)
      assert.is_false(stale_left, 'a stale directory was kept')
      assert.is_true(fresh_left, 'a directory whose sandbox may still live was removed')
      sb:release()
      p4:close()
    end)

    it('leaves no container after its lifetime when the host process is killed with SIGKILL', function()
      local dir = util.tmpdir()
      local script = dir .. '/hold.lua'
      local f = assert(io.open(script, 'w'))
      f:write(([[
local sandbox = require('mayura.sandbox')
local docker = require('mayura.sandbox.docker')
local pool = sandbox.create_sandboxes(docker.docker_sandboxes({ image = %q, engine = %q }),
  { max_sandboxes = 1, max_lifetime_ms = 60000 })
local sb = pool:create({ lifetime_ms = 4000 })
local out = io.open(%q, 'w')
out:write(sb.id)
out:close()
require('mayura').sleep(600000)
]]):format(BUSYBOX, engine, dir .. '/id'))
      f:close()
      local proc = assert(core.spawn({ argv = { 'build/mayura', script } }, function() end))
      local id
      util.eventually(function()
        local g = io.open(dir .. '/id', 'r')
        id = g and g:read('a')
        if g then g:close() end
        return id ~= nil and id ~= ''
      end, 20000)
      assert.matches('^mayura%-%x+$', id or '')
      os.execute('kill -9 ' .. proc:pid())
      -- the container outlives its host, then ends itself and is removed
      assert.are.equal(1, #containers('mayura.sandbox=' .. id))
      local gone = util.eventually(function() return #containers('mayura.sandbox=' .. id) == 0 end, 15000)
      assert.is_true(gone, 'the container outlived its lifetime')
      os.execute('rm -f ' .. (dir_of(id) or '/nonexistent') .. '/agent.sock; rmdir ' .. (dir_of(id) or '/nonexistent'))
      util.rmdir(dir)
    end)
  end)
end
