-- The Docker daemon going away under the pool, both engines: during commands and during creates.
--
-- When scripts/docker-setup.sh started the daemon (its pid file names the running dockerd), the
-- daemon is really stopped with `sh scripts/docker-setup.sh stop` and started again after; a create
-- is caught in flight by pausing the daemon (SIGSTOP) just before. Otherwise, or when another
-- client's sandboxes are running (a real stop would end them), the daemon is only paused
-- (SIGSTOP) for a few seconds and resumed (SIGCONT). MAYURA_FAULTS_DOCKERD=pause|restart chooses.
-- The daemon is always resumed or started again in a `finally`, so later specs find it running.
--
-- Either way: every failure is a coded SANDBOX_ERROR within its deadline, nothing is left behind
-- (no container, no socket directory), and the pool makes a working sandbox afterwards.
local providers = require('support.providers')
local common = require('security.common')
local process = require('mayura.process')
local util = require('support.util')

local docker_entries = {}
for _, p in ipairs(providers.list()) do
  if p.kind == 'docker' then docker_entries[#docker_entries + 1] = p end
end

local PIDFILE = '/run/mayura/dockerd.pid'
local FAULT = 'fault-' .. tostring(math.random(1e9))

local function read_line(path)
  local f = io.open(path, 'r')
  if not f then return nil end
  local s = f:read('l')
  f:close()
  return s
end

-- 'restart' (with the pid) when the setup script started the running dockerd, else 'pause'.
local function daemon_mode()
  local pid = read_line(PIDFILE)
  local owned = pid and pid:match('^%d+$') and read_line('/proc/' .. pid .. '/comm') == 'dockerd'
  if not owned then
    pid = providers.host('pidof dockerd'):match('%d+')
  end
  local mode = owned and 'restart' or 'pause'
  local forced = os.getenv('MAYURA_FAULTS_DOCKERD')
  if forced == 'pause' or (forced == 'restart' and owned) then mode = forced end
  if mode == 'restart' then
    -- someone else's sandboxes would die with the daemon: only pause it then
    local all = providers.host("docker ps -q --filter label=mayura.provider=docker")
    local ours = providers.host("docker ps -q --filter label=mayura.fault=" .. FAULT)
    if #all:gsub('%s', '') > #ours:gsub('%s', '') then mode = 'pause' end
  end
  return mode, tonumber(pid)
end

local function answers()
  local _, ok = providers.host('docker info')
  return ok
end

-- Containers carrying this file's label, in any state.
local function fault_containers()
  local out = providers.host('docker ps -aq --filter label=mayura.fault=' .. FAULT)
  local ids = {}
  for id in out:gmatch('%x+') do ids[#ids + 1] = id end
  return ids
end

local function entries_in(dir)
  local names = {}
  for n in providers.host("ls -1A '" .. dir .. "'"):gmatch('[^\n]+') do
    -- the provider's copy of the agent (agent-<sha256>) stays in the base by design
    if not n:match('^agent%-%x+$') then names[#names + 1] = n end
  end
  return names
end

describe('the Docker daemon going away', function()
  if #docker_entries == 0 then
    it('needs a Docker daemon and the test image (scripts/docker-setup.sh)', function()
      error('no Docker provider is available here: ' .. providers.names(), 0)
    end)
    return
  end

  it('fails commands and creates in flight with coded errors, leaves nothing, and the pool goes on', function()
    local mode, pid = daemon_mode()
    assert.is_not_nil(pid, 'no dockerd pid')
    local runs = {}
    for i, e in ipairs(docker_entries) do
      local dir = util.tmpdir()
      local pool = e.make_pool({ run_dir = dir, max_sandboxes = 4, max_lifetime_ms = 120000,
        call_timeout_ms = mode == 'pause' and 1500 or 30000, labels = { ['mayura.fault'] = FAULT } })
      runs[i] = { entry = e, pool = pool, dir = dir, sb = pool:create({ lifetime_ms = 120000 }) }
    end
    local stopped, paused = false, false
    local ok, err = pcall(function()
      -- commands in flight: short ones while paused (they do not need the daemon), long ones for a stop
      for _, run in ipairs(runs) do
        run.exec = common.spawn(function()
          local t = common.now()
          local argv = mode == 'pause' and { 'sh', '-c', 'sleep 1; echo done' } or { 'sleep', '60' }
          local eok, res = pcall(run.sb.exec, run.sb, argv, { timeout_ms = 90000 })
          return eok, res, common.now() - t
        end)
      end
      common.sleep(200)
      os.execute('kill -STOP ' .. pid)
      paused = true
      -- creates in flight: they wait on the paused daemon
      for _, run in ipairs(runs) do
        run.create = common.spawn(function()
          local t = common.now()
          local cok, res = pcall(run.pool.create, run.pool, { lifetime_ms = 60000 })
          return cok, res, common.now() - t
        end)
      end
      common.sleep(300)
      if mode == 'restart' then
        local stopper = common.spawn(function()
          return process.run({ 'sh', 'scripts/docker-setup.sh', 'stop' }, { timeout_ms = 90000 })
        end)
        common.sleep(100)
        os.execute('kill -CONT ' .. pid)
        paused = false
        stopped = true
        local r = stopper:wait()
        assert.are.equal(0, r.exit_code, r.stderr)
        assert.is_false(answers(), 'the daemon still answers after stop')
        -- commands: their containers ended with the daemon
        for _, run in ipairs(runs) do
          local eok, res = run.exec:wait()
          assert.is_false(eok, run.entry.name .. ': the command outlived the daemon')
          assert.is_true(common.is_gone(res), run.entry.name .. ': ' .. tostring(res))
        end
        -- creates: failed with a coded error, or made a sandbox (one the daemon started as it was
        -- stopping may even outlive it) that answers or is gone
        for _, run in ipairs(runs) do
          local cok, res = run.create:wait()
          if cok then
            run.extra = res
            local xok, xres = pcall(res.exec, res, { 'echo', 'alive' })
            assert.is_true((xok and xres.stdout == 'alive\n') or common.is_gone(xres),
              run.entry.name .. ': ' .. tostring(xres))
          else
            assert.are.equal('SANDBOX_ERROR', res.code, run.entry.name .. ': ' .. tostring(res))
            assert.is_nil(res.message:find('Cannot connect', 1, true), 'docker\'s words came through')
          end
        end
        -- while it is down: unavailable, at once
        for _, run in ipairs(runs) do
          local t = common.now()
          local e2 = assert.raises_code('SANDBOX_ERROR', run.pool.create, run.pool, { lifetime_ms = 60000 })
          assert.are.equal('unavailable', e2.reason, run.entry.name .. ': ' .. tostring(e2))
          assert.is_true(common.now() - t < 10000)
          assert.is_true(common.is_gone(select(2, pcall(run.sb.read_file, run.sb, 'x'))))
        end
      else
        -- creates: the pool's call timeout ends them
        for _, run in ipairs(runs) do
          local cok, res = run.create:wait()
          assert.is_false(cok, run.entry.name .. ': created on a paused daemon')
          assert.are.equal('SANDBOX_ERROR', res.code, tostring(res))
          assert.are.equal('timeout', res.reason, tostring(res))
        end
        -- commands go on: they talk to the agent, not to the daemon
        for _, run in ipairs(runs) do
          local eok, res = run.exec:wait()
          assert.is_true(eok, run.entry.name .. ': ' .. tostring(res))
          assert.are.equal('done\n', res.stdout)
        end
        -- a release ends within the pool's call timeout, even with the daemon paused
        for _, run in ipairs(runs) do
          local t = common.now()
          run.sb:release()
          assert.is_true(common.now() - t < 5000)
        end
        os.execute('kill -CONT ' .. pid)
        paused = false
      end
    end)
    -- the daemon runs again, whatever happened above
    if paused then os.execute('kill -CONT ' .. pid) end
    if stopped or not answers() then
      local r = process.run({ 'sh', 'scripts/docker-setup.sh' }, { timeout_ms = 120000 })
      assert.are.equal(0, r.exit_code, 'could not start the daemon again: ' .. r.stdout .. r.stderr)
    end
    assert.is_true(answers(), 'the Docker daemon does not answer after the faults')
    if not ok then
      for _, run in ipairs(runs) do
        pcall(run.pool.close, run.pool)
        os.execute("rm -rf '" .. run.dir .. "'")
      end
      error(err, 0)
    end
    -- the pool goes on, and nothing is left
    for _, run in ipairs(runs) do
      local sb = run.pool:create({ lifetime_ms = 60000 })
      assert.are.equal('after\n', sb:exec({ 'echo', 'after' }).stdout, run.entry.name)
      run.pool:close()
      assert.are.equal(0, run.pool:count())
    end
    assert.is_true(common.eventually(function() return #fault_containers() == 0 end, 15000),
      'containers left: ' .. table.concat(fault_containers(), ' '))
    for _, run in ipairs(runs) do
      assert.is_true(common.eventually(function() return #entries_in(run.dir) == 0 end, 5000),
        run.entry.name .. ' left socket directories: ' .. table.concat(entries_in(run.dir), ' '))
      util.rmdir(run.dir)
    end
  end)
end)
