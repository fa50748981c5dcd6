-- A policy file's author as an attacker: a policy declares and nothing more. It cannot change state
-- the process shares (the schema class, cancel tokens, the module tables it is handed, the random
-- generator), it cannot name a host program or a host path for mayura to run, bind, create or
-- change, and loading and checking it runs and starts nothing (a pool's warm sandboxes start on its
-- first use, and never past its max_sandboxes).
local mayura = require('mayura')
local core = require('mayura.core')
local task = require('mayura._task')
local z = require('mayura.z')

local function load_src(src)
  return mayura.load_policy({ name = 'evil.lua', source = src })
end

-- Counts the programs the process starts while fn runs and for `linger_ms` after (the loop runs).
local function spawns_during(fn, linger_ms)
  local real, n = core.spawn, 0
  core.spawn = function(...)
    n = n + 1
    return real(...)
  end
  local ok, err = pcall(function()
    task.run(function()
      fn()
      task.sleep(linger_ms)
    end)
  end)
  core.spawn = real
  if not ok then error(err, 0) end
  return n
end

local function can_run_local()
  return pcall(function()
    local p = require('mayura.sandbox.local').local_sandboxes()
    assert(p)
  end)
end

describe('a policy file cannot change what the process shares', function()
  local TOOL = [[
tool 'probe' { effect = 'read', run = function(input, context) return ATTACK(input, context) end }
agent 'a' { tools = { 'probe' }, allow = { 'tool:probe', 'effect:read' } }
]]

  it('cannot reach or change the schema class, through a schema or the module', function()
    local attacks = {
      "local cls = z.string().__index; cls.parse = function() return 'pwned' end",
      "z.Schema.parse = function() return 'pwned' end",
      "z.is_schema = function() return true end",
      "z.string = function() return 'pwned' end",
      "setmetatable(z, { __index = { string = function() return 'pwned' end } })",
      "require('mayura.z').object = nil",
      "z.string().kind2 = 'any'",
      "setmetatable({}, { __gc = function() while true do end end })",
    }
    for _, attack in ipairs(attacks) do
      local ok, err = pcall(load_src, attack)
      assert.is_false(ok, attack .. ' was let through')
      assert.are.equal('INVALID_CONFIG', err.code, attack)
      assert.truthy(err.message:find('^evil%.lua:1: '), err.message)
      -- the process's schemas are as they were
      assert.are.equal('x', z.string():parse('x'))
      assert.is_true(z.is_schema(z.object({ a = z.string() })))
      assert.raises_code('INVALID_INPUT', function() z.string():parse(5) end)
    end
  end)

  it('cannot change cancel tokens or the random generator from a tool or hook it runs', function()
    local policy = load_src(TOOL:gsub('ATTACK%(input, context%)', [[(function()
      local hits = {}
      local signal = context.signal
      if pcall(function() signal.__index.cancel = function() end end) then hits[#hits + 1] = 'cancel' end
      if pcall(function() signal.__index.on_cancel = function() end end) then hits[#hits + 1] = 'on_cancel' end
      if pcall(function() setmetatable(context.signal, {}) end) then hits[#hits + 1] = 'token metatable' end
      if pcall(function() math.randomseed(1) end) then hits[#hits + 1] = 'randomseed' end
      return { hits = hits }
    end)()]]), nil)
    local env = policy:open()
    local result
    task.run(function()
      local s = env:session('attacker')
      result = s.call('probe', {})
      s.close()
    end)
    env:close()
    assert.are.same({}, result.hits)
    -- tokens of the process still cancel
    local t = task.cancel_token()
    local called = false
    t:on_cancel(function() called = true end)
    t:cancel('spec')
    assert.is_true(t.cancelled)
    assert.is_true(called)
    assert.is_true(task.is_token(t))
  end)
end)

describe('a policy file cannot read mayura\'s own variables', function()
  it('sees no MAYURA_* variable (a server\'s token), in any spelling, and other variables as they are', function()
    local policy = mayura.load_policy({ name = 'env.lua', source = [[
      SAW = { os.getenv('MAYURA_MCP_TOKEN'), os.getenv('mayura_mcp_token'), os.getenv('MAYURA_BUILD'),
              os.getenv('PATH') }
      tool 'probe' { effect = 'read', run = function() return SAW end }
    ]] })
    assert.is_truthy(policy)
    -- the spec runner sets MAYURA_BUILD; the policy must not see it
    assert.is_truthy(os.getenv('MAYURA_BUILD'))
    local saw = policy._decls.tool[1].def.run()
    assert.is_nil(saw[1])
    assert.is_nil(saw[2])
    assert.is_nil(saw[3])
    assert.are.equal(os.getenv('PATH'), saw[4])
  end)
end)

describe('a policy file cannot name a host program or a host path', function()
  local dir, marker, evil

  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute('mkdir -m 700 ' .. dir))
    marker = dir .. '/ran'
    evil = dir .. '/evil'
    local f = assert(io.open(evil, 'w'))
    f:write('#!/bin/sh\ntouch ' .. marker .. '\nexit 1\n')
    f:close()
    assert(os.execute('chmod 755 ' .. evil))
  end)

  after_each(function() os.execute('rm -rf ' .. dir) end)

  local function refused(provider, key, value, extra)
    local src = ("pool 'p' { provider = '%s', max_sandboxes = 1, max_lifetime_ms = 60000,\n"
      .. "  provider_options = { %s = %s%s } }"):format(provider, key, value, extra or '')
    local spawned = spawns_during(function()
      local ok, err = pcall(load_src, src)
      assert.is_false(ok, provider .. ' ' .. key .. ' was let through')
      assert.are.equal('INVALID_CONFIG', err.code, tostring(err))
      assert.are.equal('provider_options.' .. key, err.key, err.message)
      assert.truthy(err.message:find("'provider_options." .. key .. "'", 1, true), err.message)
      assert.are.equal(1, err.line)
    end, 50)
    assert.are.equal(0, spawned, 'a refused policy ran a program')
    assert.is_nil(io.open(marker, 'r'), provider .. ' ' .. key .. ' ran the policy\'s program')
  end

  it('refuses the local provider\'s bwrap, agent, image and proxy_resolve', function()
    refused('local', 'bwrap', ("'%s'"):format(evil))
    refused('local', 'agent', ("'%s'"):format(evil))
    refused('local', 'image', "'/root'")
    refused('local', 'proxy_resolve', "{ ['example.com'] = '127.0.0.1' }")
    local ok, err = pcall(load_src, "pool 'p' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000,\n"
      .. "  sandbox = { image = '/root' } }")
    assert.is_false(ok)
    assert.are.equal('sandbox.image', err.key, tostring(err and err.message))
  end)

  it('refuses the Docker provider\'s docker, agent, host and run_dir, and changes no directory', function()
    local victim = dir .. '/victim'
    assert(os.execute('mkdir -m 700 ' .. victim))
    refused('docker', 'docker', ("'%s'"):format(evil), ", image = 'busybox'")
    refused('docker', 'agent', ("'%s'"):format(evil), ", image = 'busybox'")
    refused('docker', 'host', "'unix://" .. dir .. "/docker.sock'", ", image = 'busybox'")
    refused('docker', 'run_dir', ("'%s'"):format(victim), ", image = 'busybox'")
    local p = io.popen('stat -c %a ' .. victim)
    local mode = p:read('l')
    p:close()
    assert.are.equal('700', mode)
  end)

  it('leaves them to the host program\'s own code', function()
    if not can_run_local() then
      pending('needs local sandboxes (bubblewrap and the agent)')
      return
    end
    local policy = mayura.load_policy({ name = 'ok.lua', source =
      "pool 'p' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000 }" },
      { provider_options = { ['local'] = { bwrap = 'bwrap' } } })
    assert.are.same({ 'p' }, policy.pools)
    assert.raises_code('INVALID_CONFIG', mayura.load_policy, { name = 'ok.lua', source = '' },
      { provider_options = 'bwrap' })
  end)

  it('cannot change an option the host program set (a weaker runtime, a larger workspace)', function()
    if not can_run_local() then
      pending('needs local sandboxes (bubblewrap and the agent)')
      return
    end
    local host = { provider_options = { ['local'] = { workspace_mib = 32 } } }
    local err = assert.raises_code('INVALID_CONFIG', mayura.load_policy, { name = 'weaker.lua', source =
      "pool 'p' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000,\n"
      .. "  provider_options = { workspace_mib = 64 } }" }, host)
    assert.truthy(err.message:find('provider_options.workspace_mib', 1, true), err.message)
    assert.truthy(err.message:find('weaker.lua:1', 1, true), err.message)
    -- the same value, or an option the host left alone, is the policy's to say
    local policy = mayura.load_policy({ name = 'same.lua', source =
      "pool 'p' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000,\n"
      .. "  provider_options = { workspace_mib = 32, tmp_mib = 16 } }" }, host)
    assert.are.same({ 'p' }, policy.pools)
  end)
end)

describe('loading and checking a policy starts nothing', function()
  if not can_run_local() then
    pending('needs local sandboxes (bubblewrap and the agent)')
    return
  end
  local WARM = [[
pool 'workspace' { provider = 'local', provider_options = { warm = 2 }, max_sandboxes = 2,
  max_lifetime_ms = 120000 }
tools 'workspace' { exec = true }
agent 'a' { tools = { 'workspace' }, allow = { 'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write' } }
]]

  it('runs no program while a policy with warm sandboxes loads and is checked', function()
    local n = spawns_during(function() load_src(WARM) end, 1500)
    assert.are.equal(0, n)
  end)

  it('runs no program while a policy with a Docker pool loads and is checked', function()
    local docker_src = "pool 'd' { provider = 'docker', provider_options = { image = 'busybox', warm = 1 },\n"
      .. "  max_sandboxes = 1, max_lifetime_ms = 60000 }"
    if not pcall(load_src, docker_src) then
      pending('needs the docker CLI and the built agent')
      return
    end
    local n = spawns_during(function() load_src(docker_src) end, 1500)
    assert.are.equal(0, n)
  end)

  it('starts warm sandboxes on the pool\'s first use, and never holds more than max_sandboxes', function()
    local policy = load_src(WARM)
    local env = policy:open()
    local pool = env:pool('workspace')
    local peak = 0
    task.run(function()
      task.sleep(1500)
      assert.are.equal(0, pool.provider:warm_held(), 'warm sandboxes started before the pool was used')
      local s = env:session('one')
      local watching = true
      task.spawn(function()
        while watching do
          peak = math.max(peak, pool:count() + pool.provider:warm_held())
          task.sleep(5)
        end
      end)
      local r = s.call('workspace.exec', { command = 'echo hi' })
      assert.are.equal('hi\n', r.stdout)
      for _ = 1, 300 do
        if pool.provider:warm_ready() >= 1 then break end
        task.sleep(20)
      end
      assert.are.equal(1, pool.provider:warm_ready())
      watching = false
      s.close()
    end)
    env:close()
    assert.is_true(peak <= 2, 'the pool held ' .. peak .. ' sandboxes with max_sandboxes = 2')
  end)
end)
