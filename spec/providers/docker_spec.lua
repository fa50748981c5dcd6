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
local compat = require('support.compat')

local BUSYBOX = 'mayura-test/busybox:1'
local NODE = 'mayura-test/node:1'
local RUN_BASE = '/run/mayura/docker'
local SECRET = 'env-value-only-inside-5d1c9e'

--- Runs a host shell command; returns its stdout and whether it succeeded.
local function host(cmd)
  return compat.shell(cmd .. ' 2>/dev/null')
end

local _, daemon_answers = host('docker info')
if not daemon_answers then
  error('no Docker daemon answers `docker info`: run scripts/docker-setup.sh (as root) before these specs', 0)
end
for _, image in ipairs({ BUSYBOX, NODE }) do
  local _, there = host('docker image inspect ' .. image)
  if not there then error('the test image ' .. image .. ' is missing: run scripts/docker-setup.sh', 0) end
end


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

local function random_hex(n)
  local f = assert(io.open('/dev/urandom', 'rb'))
  local bytes = f:read(n)
  f:close()
  return (bytes:gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

--- The host pid of a container's PID 1 (the agent).
local function agent_pid(container)
  return host("docker inspect --format '{{.State.Pid}}' " .. container):match('%d+')
end

--- Whether the Docker daemon here may lower an OOM score (CAP_SYS_RESOURCE in its effective set).
local function daemon_lowers_oom_scores()
  local pid = host('pidof dockerd'):match('%d+')
  local status = pid and host('cat /proc/' .. pid .. '/status') or ''
  local caps = status:match('CapEff:%s*(%x+)')
  if not caps then return false end
  return math.floor(tonumber(caps:sub(-7), 16) / 16777216) % 2 == 1
end

--- Whether the agent the provider uses (MAYURA_AGENT, else this checkout's) knows --peer-uid.
local function agent_takes_peer_uid()
  local agent = os.getenv('MAYURA_AGENT')
  if not agent or agent == '' then agent = 'build/mayura-agent' end
  local _, yes = host("grep -q -a -F -e --peer-uid '" .. agent .. "'")
  return yes
end

describe('docker_sandboxes options', function()
  it('refuses bad options with INVALID_CONFIG', function()
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, nil)
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, {})
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, nope = 1 })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, engine = 'podman' })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, user = 'sandbox' })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, user = '0:0' })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, workdir = 'relative' })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, workdir = '/tmp' })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, memory_mib = 1 })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, cpus = 0 })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, read_only_root = 'yes' })
    assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, docker = '/no/such/docker' })
  end)

  it('refuses a remote host with INVALID_CONFIG, on both engines', function()
    for _, engine in ipairs({ 'cli', 'api' }) do
      for _, h in ipairs({ 'tcp://203.0.113.7:2375', 'ssh://user@203.0.113.7', 'https://203.0.113.7:2376',
        'npipe:////./pipe/docker_engine', '203.0.113.7:2375' }) do
        local err = assert.raises_code('INVALID_CONFIG', docker.docker_sandboxes, { image = BUSYBOX, engine = engine, host = h })
        assert.is_nil(err.message:find('203.0.113.7', 1, true) and err.message:find('dial', 1, true))
      end
    end
  end)

  it('has the reference\'s defaults and features', function()
    local p = docker.docker_sandboxes({ image = BUSYBOX })
    -- an allow-list's proxy joins the container's namespace: root only
    local kinds = require('mayura.sandbox._host').uid() == 0 and { 'none', 'all', 'allowlist' } or { 'none', 'all' }
    assert.are.same({ stdin = true, ports = true, desktop = false, network = kinds, snapshots = 'native' }, p.features)
    assert.are.equal('/workspace', p.workdir)
    assert.are.equal(86400000, p.max_lifetime_ms)
    -- the reference's 1000:1000 is `user = '1000:1000'`; by default each sandbox has a uid of its own
    assert.is_nil(p.user)
    assert.are.equal('1000:1000', docker.docker_sandboxes({ image = BUSYBOX, user = '1000:1000' }).user)
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
      -- a uid and gid of its own that no host account or group has
      local uid = tonumber(cfg.User:match('^(%d+):%1$'))
      assert.is_number(uid, cfg.User)
      assert.is_true(uid >= 1300000, cfg.User)
      assert.are.equal(uid, sb._backend.uid)
      for _, db in ipairs({ 'passwd', 'group' }) do
        local _, known = host('getent ' .. db .. ' ' .. uid)
        assert.is_false(known, 'the host knows ' .. db .. ' ' .. uid)
      end
      assert.are.equal(512 * 1048576, hc.Memory)
      assert.are.equal(hc.Memory, hc.MemorySwap)
      assert.are.equal(1e9, hc.NanoCpus)
      assert.are.equal(128, hc.PidsLimit)
      assert.is_false(hc.Init)
      assert.is_true(hc.AutoRemove)
      -- stopped at once (the agent has no SIGTERM handler: a daemon shutting down would wait 10 s)
      assert.are.equal('SIGKILL', cfg.StopSignal)
      -- tmpfs sizes and inodes capped, /dev/shm too (with /tmp's cap, not Docker's 64 MiB)
      assert.matches('size=1073741824,nr_inodes=131072,', hc.Tmpfs['/workspace'])
      assert.matches('size=268435456,nr_inodes=32768,', hc.Tmpfs['/tmp'])
      assert.matches('noexec,nosuid,nodev,size=268435456,nr_inodes=32768,', hc.Tmpfs['/dev/shm'])
      assert.are.equal(268435456, hc.ShmSize)
      -- the end of its lifetime, for the reaper (ms since the epoch)
      local expires = tonumber(cfg.Labels['mayura.expires'])
      assert.is_true(math.abs(expires - (os.time() * 1000 + 600000)) < 120000, cfg.Labels['mayura.expires'])
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
      assert.matches('^' .. uid .. '\n' .. uid .. '\n', r.stdout)
      assert.matches('CapEff:%s+0000000000000000', r.stdout)
      assert.matches('CapBnd:%s+0000000000000000', r.stdout)
      assert.matches('NoNewPrivs:%s+1', r.stdout)
      assert.matches('/%.mayura/agent %-%-listen', r.stdout)
      assert.matches('\n%s*lo\n', r.stdout)
      assert.is_nil(r.stdout:find('eth0', 1, true))
      assert.matches('Read%-only', r.stdout)
      assert.raises_code('PERMISSION_DENIED', sb.write_file, sb, '/bin/mayura-escape', 'x')
      -- the socket directory on the host is closed to the sandbox once the host is connected, and
      -- empty: the agent serves that one connection and unlinked its socket
      r = sh(sb, 'ls -ld /.mayura/run; touch /.mayura/run/fill 2>&1 || echo refused')
      assert.matches('refused', r.stdout)
      local dir = dir_of(sb.id)
      assert.is_string(dir, 'no socket directory for ' .. sb.id)
      assert.are.equal('', host('ls -1A ' .. dir))
      assert.are.equal('700\n', host('stat -c %a ' .. dir))
      assert.are.equal('700\n', host('stat -c %a ' .. RUN_BASE))
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
      -- other processes may use the same daemon meanwhile: what this test would make carries a label of its own
      local tag = random_hex(6)
      local tmp = util.tmpdir()
      local missing = docker.docker_sandboxes({ image = 'mayura-test/no-such-image:1', engine = engine,
        run_dir = tmp .. '/run' })
      local p2 = sandbox.create_sandboxes(missing, { max_sandboxes = 1, max_lifetime_ms = 60000,
        labels = { ['spec.missing'] = tag } })
      local err = assert.raises_code('INVALID_CONFIG', p2.create, p2, { lifetime_ms = 60000 })
      assert.is_nil(err.message:find('Error response', 1, true))
      assert.are.equal(0, p2:count())
      assert.raises_code('INVALID_CONFIG', pool.create, pool, { lifetime_ms = 60000, image = 'mayura-test/nor-this:2',
        labels = { ['spec.missing'] = tag } })
      assert.are.equal(0, #containers('spec.missing=' .. tag))
      assert.are.equal('', (host('ls -A ' .. tmp .. '/run')))
      util.rmdir(tmp)
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
      -- the exec of a 30 s sleep ends as soon as its container is gone, not when the sleep would have
      local ok, err = t:wait()
      assert.is_false(ok)
      assert.are.equal('SANDBOX_ERROR', err.code, tostring(err))
      assert.are.equal('gone', err.reason)
      err = assert.raises_code('SANDBOX_ERROR', sb.read_file, sb, 'x')
      assert.are.equal('gone', err.reason)
      sb:release()
      assert.is_nil(dir_of(sb.id))
    end)

    it('publishes ports on 127.0.0.1 only with network all, and they answer', function()
      assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, ports = { 8080 } })
      local sb = pool:create({ lifetime_ms = 120000, network = 'all', ports = { 8080 } })
      sb:write_file('www/index.html', 'served from the sandbox')
      -- waits until the server listens: the server has then left the command's process group
      local r = sh(sb, 'setsid httpd -f -p 8080 -h /workspace/www >/dev/null 2>&1 </dev/null & ' ..
        'while ! netstat -ltn | grep -q ":8080 "; do sleep 0.05; done; echo started', { timeout_ms = 10000 })
      assert.are.equal('started\n', r.stdout)
      local url = sb:url(8080)
      assert.matches('^http://127%.0%.0%.1:%d+$', url)
      local info = inspect(sb.id)
      assert.are.equal('mayura-isolated', info.HostConfig.NetworkMode)
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
      assert.raises_code('INVALID_INPUT', sb.url, sb, 9999)
      sb:release()
    end)

    it("keeps 'all' sandboxes from reaching each other, while the host reaches their ports", function()
      local a = pool:create({ lifetime_ms = 120000, network = 'all', ports = { 8080 } })
      local b = pool:create({ lifetime_ms = 120000, network = 'all' })
      a:write_file('www/index.html', 'served from a')
      local r = sh(a, 'setsid httpd -f -p 8080 -h /workspace/www >/dev/null 2>&1 </dev/null & ' ..
        'while ! netstat -ltn | grep -q ":8080 "; do sleep 0.05; done; echo started', { timeout_ms = 10000 })
      assert.are.equal('started\n', r.stdout)
      local info = inspect(a.id)
      local ip = info.NetworkSettings.Networks['mayura-isolated'].IPAddress
      assert.matches('^%d+%.%d+%.%d+%.%d+$', ip)
      local get = "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 2 " .. ip .. ' 8080'
      -- a answers at that address (so the address is right and the server listens on it)
      assert.matches('served from a', sh(a, get, { timeout_ms = 10000 }).stdout)
      -- b, on the same network, gets nothing from it; and has no IPv6 address to try instead
      r = sh(b, get .. '; echo rc=$?', { timeout_ms = 10000 })
      assert.is_nil(r.stdout:find('served from a', 1, true), 'one sandbox reached another: ' .. r.stdout)
      assert.matches('rc=%d+', r.stdout)
      assert.are.equal('0\n', sh(b, 'cat /proc/net/if_inet6 2>/dev/null | grep -c eth0').stdout)
      -- the host still reaches a through url()
      local res
      for _ = 1, 50 do
        local ok, got = pcall(http.request, { url = a:url(8080) .. '/index.html', timeout_ms = 2000 })
        if ok and got.status == 200 then res = got break end
        mayura.sleep(100)
      end
      assert.is_table(res, 'the port never answered')
      assert.are.equal('served from a', res.body)
      -- the network is ours, and lets no traffic between its containers
      local net = core.json.decode((host('docker network inspect mayura-isolated')))[1]
      assert.are.equal('false', net.Options['com.docker.network.bridge.enable_icc'])
      assert.are.equal('127.0.0.1', net.Options['com.docker.network.bridge.host_binding_ipv4'])
      assert.are.equal('isolated', net.Labels['mayura.network'])
      a:release()
      b:release()
    end)

    it('gives every sandbox a uid of its own', function()
      local a = pool:create({ lifetime_ms = 60000 })
      local b = pool:create({ lifetime_ms = 60000 })
      local ua, ub = sh(a, 'id -u').stdout, sh(b, 'id -u').stdout
      assert.are_not.equal(ua, ub)
      assert.are.equal(a._backend.uid .. '\n', ua)
      a:release()
      b:release()
    end)

    it('is removed by the host at its lifetime even when its agent is stopped', function()
      -- straight from the provider, without a pool (whose own timer would release it too)
      local b = provider:create({ lifetime_ms = 3000, network = 'none', env = {}, labels = {} })
      local pid = agent_pid(b.container)
      assert.is_string(pid)
      -- the agent can no longer end its container at its lifetime
      assert.is_true(compat.execute('kill -STOP ' .. pid))
      -- its state from /proc (a `ps` run by an AddressSanitizer pass, which preloads into children, can hang)
      local function state()
        local f = io.open('/proc/' .. pid .. '/stat', 'r')
        local st = f and f:read('a') or ''
        if f then f:close() end
        return st:match('%) (%a) ')
      end
      local stopped = util.eventually(function() return state() == 'T' end, 10000)
      assert.is_true(stopped, 'the agent did not stop')
      local gone = util.eventually(function() return #containers('mayura.sandbox=' .. b.id) == 0 end, 30000)
      assert.is_true(gone, 'the container outlived its lifetime')
      assert.is_true(b.released)
      util.eventually(function() return dir_of(b.id) == nil end, 10000)
      assert.is_nil(dir_of(b.id), 'the socket directory outlived the container')
    end)

    it('removes expired containers with our labels, and their socket directories, when a provider is made',
      function()
        local now = os.time()
        local old, young = 'mayura-' .. random_hex(6), 'mayura-' .. random_hex(6)
        local function start(id, expires_s)
          local _, ok = host('docker run -d --network none --label mayura.provider=docker --label mayura.sandbox=' ..
            id .. ' --label mayura.expires=' .. expires_s * 1000 .. ' --entrypoint sleep ' .. BUSYBOX .. ' 600')
          assert.is_true(ok)
        end
        start(old, now - 600)
        start(young, now + 3600)
        -- named as if it lived on, so only the reaper (by the container's id) removes it
        local old_dir = RUN_BASE .. '/' .. (now + 3600) .. '-' .. old
        assert.is_true(compat.execute('mkdir -p ' .. old_dir .. ' && touch ' .. old_dir .. '/agent.sock'))
        docker.docker_sandboxes({ image = BUSYBOX, engine = engine })
        local gone = util.eventually(function() return #containers('mayura.sandbox=' .. old) == 0 end, 30000)
        local dir_left = not util.eventually(function() return not select(2, host('test -e ' .. old_dir)) end, 10000)
        local young_left = #containers('mayura.sandbox=' .. young)
        host('docker rm -f $(docker ps -aq --filter label=mayura.sandbox=' .. young .. ')')
        os.execute('rm -rf ' .. old_dir)
        assert.is_true(gone, 'an expired container was kept')
        assert.are.equal(1, young_left, 'a container whose lifetime is not over was removed')
        assert.is_false(dir_left, 'the expired container\'s socket directory was kept')
      end)

    it('ends an inode flood with "no space", and the sandbox goes on', function()
      local p5 = sandbox.create_sandboxes(docker.docker_sandboxes({ image = BUSYBOX, engine = engine,
        workspace_mib = 16, tmp_mib = 16 }), { max_sandboxes = 1, max_lifetime_ms = 120000 })
      local sb = p5:create({ lifetime_ms = 120000 })
      for _, dir in ipairs({ '/workspace/flood', '/dev/shm/flood' }) do
        local r = sh(sb, 'mkdir ' .. dir .. ' && cd ' .. dir .. ' && i=0; while true > f$i; do i=$((i + 1)); done; ' ..
          'echo made=$i', { timeout_ms = 60000 })
        assert.matches('No space left on device', r.stderr)
        -- 16 MiB at one inode per 8 KiB
        local made = tonumber(r.stdout:match('made=(%d+)'))
        assert.is_number(made, r.stdout)
        assert.is_true(made > 1024 and made < 2048, 'made ' .. made)
        assert.are.equal('cleaned\n', sh(sb, 'rm -rf ' .. dir .. ' && echo cleaned', { timeout_ms = 60000 }).stdout)
        sb:write_file('after.txt', 'still usable')
        assert.are.equal('still usable', sh(sb, 'cat after.txt').stdout)
      end
      p5:close()
    end)

    it('shields its agent from the OOM killer, and not its commands', function()
      local sb = pool:create({ lifetime_ms = 60000 })
      local pid = agent_pid(sb._backend.container)
      assert.are.equal('0\n', sh(sb, 'cat /proc/self/oom_score_adj').stdout)
      if not daemon_lowers_oom_scores() then
        -- the provider found out, and started the sandbox without it
        assert.is_nil(sb._backend.oom_score_adj)
        assert.are.equal('0\n', host('cat /proc/' .. pid .. '/oom_score_adj'))
        sb:release()
        return pending('the Docker daemon here lacks CAP_SYS_RESOURCE, so runc cannot set a negative OOM score')
      end
      assert.are.equal(-500, sb._backend.oom_score_adj)
      assert.are.equal(-500, inspect(sb.id).HostConfig.OomScoreAdj)
      assert.are.equal('-500\n', host('cat /proc/' .. pid .. '/oom_score_adj'))
      -- and a command cannot shield itself further
      assert.matches('refused', sh(sb, 'echo -501 > /proc/self/oom_score_adj || echo refused').stdout)
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
      assert.is_true(compat.execute('mkdir -p ' .. stale .. ' ' .. fresh .. ' && touch ' .. stale .. '/agent.sock'))
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
      local proc = assert(core.spawn({ argv = { compat.host, script } }, function() end))
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

describe('docker sandboxes for a user in the docker group, not root', function()
  if util.pending_if_closed_to_others('the user it makes runs build/mayura from the checkout', pending) then return end
  local name, uid, gid, dir
  setup(function()
    name = 'mayura-dk' .. random_hex(3)
    local _, made = host('useradd --no-create-home --shell /usr/sbin/nologin --groups docker ' .. name)
    assert.is_true(made, 'useradd failed')
    uid = host('id -u ' .. name):match('%d+')
    gid = host('id -g ' .. name):match('%d+')
    dir = util.tmpdir()
    os.execute('chmod 755 ' .. dir)
  end)
  teardown(function()
    host('userdel ' .. name)
    if uid then os.execute('rm -rf /tmp/mayura-' .. uid) end
    if dir then util.rmdir(dir) end
  end)

  -- Runs, as that user, a script making a sandbox on each engine with `user` (nil: the default);
  -- returns its output.
  local function run_as_user(user)
    local script = dir .. '/as_user.lua'
    local f = assert(io.open(script, 'w'))
    f:write(([[
local sandbox = require('mayura.sandbox')
local docker = require('mayura.sandbox.docker')
for _, engine in ipairs({ 'cli', 'api' }) do
  local ok, err = pcall(function()
    local pool = sandbox.create_sandboxes(docker.docker_sandboxes({ image = %q, engine = engine, user = %s }),
      { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    sb:write_file('x.txt', 'hello')
    local r = sb:exec({ 'sh', '-c', 'cat x.txt; echo " $(id -u)"' })
    io.write(engine, ' ', r.stdout)
    pool:close()
  end)
  if not ok then io.write(engine, ' failed ', tostring(err), '\n') end
end
]]):format(BUSYBOX, user and ('%q'):format(user) or 'nil'))
    f:close()
    os.execute('chmod 644 ' .. script)
    return host('env -u XDG_RUNTIME_DIR -u DOCKER_HOST runuser -u ' .. name .. ' -- build/mayura ' .. script)
  end

  it('makes and uses sandboxes under its own uid, as today\'s agent allows', function()
    local out = run_as_user(uid .. ':' .. gid)
    assert.are.equal('cli hello ' .. uid .. '\napi hello ' .. uid .. '\n', out)
    -- its socket directories were in a directory of its own, closed to other users, and are gone
    assert.are.equal(uid .. ' 700\n', host('stat -c "%u %a" /tmp/mayura-' .. uid .. '/docker'))
    -- (the agent's copy the containers bind stays, named by its hash)
    assert.are.equal('', host('ls -A /tmp/mayura-' .. uid .. '/docker | grep -v "^agent-[0-9a-f]*$"'))
  end)

  it('makes and uses sandboxes with the defaults (a uid of their own)', function()
    if not agent_takes_peer_uid() then
      local out = run_as_user(nil)
      assert.matches('cli failed INVALID_CONFIG', out)
      return pending('needs agent --peer-uid: the sandbox agent built here serves its socket only to its own uid')
    end
    local out = run_as_user(nil)
    local cli_uid, api_uid = out:match('^cli hello (%d+)\napi hello (%d+)\n$')
    assert.is_string(cli_uid, out)
    assert.is_true(tonumber(cli_uid) >= 1300000 and tonumber(api_uid) >= 1300000, out)
    assert.are.equal('', host('ls -A /tmp/mayura-' .. uid .. '/docker | grep -v "^agent-[0-9a-f]*$"'))
  end)
end)
