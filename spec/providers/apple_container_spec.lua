-- mayura.sandbox.apple_container through a fake `container` CLI (support/fake_container/container,
-- which follows the CLI's documented output and runs Docker containers): the conformance suite,
-- what the provider runs, and how it fails (a VM deleted behind the pool's back is gone, a CLI
-- that cannot be run is unavailable, one that never answers is timeout), without the CLI's text.
-- This has not run on a Mac.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local apple = require('mayura.sandbox.apple_container')
local process = require('mayura.process')
local util = require('support.util')
local faults = require('support.fault_checks')
local stop_cases = require('support.stop_cases')

local FAKE = 'spec/support/fake_container/container'
local check = faults.checker({ 'SECRET-VALUE' }, { 'Error:', 'not found', 'notFound' })

describe('apple_container_sandboxes options', function()
  it('checks its options and declares its features', function()
    assert.raises_code('INVALID_CONFIG', apple.apple_container_sandboxes, { executable = 'a b' })
    assert.raises_code('INVALID_CONFIG', apple.apple_container_sandboxes, { unknown = 1 })
    local p = apple.apple_container_sandboxes()
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'none', 'all' } }, p.features)
    assert.are.equal('/workspace', p.workdir)
  end)
end)

local have_docker = process.run({ 'docker', 'image', 'inspect', 'mayura-test/busybox:1' }, { timeout_ms = 20000 })
  .exit_code == 0

describe('Apple container sandboxes, through the fake container CLI', function()
  if not have_docker then
    pending('needs Docker and the mayura-test/busybox:1 image (sh scripts/docker-setup.sh)')
    return
  end
  local dir, wrapper, log, stall, pool, sb

  local function read_log()
    local f = io.open(log, 'r')
    local s = f and f:read('a') or ''
    if f then f:close() end
    return s
  end

  setup(function()
    dir = util.tmpdir()
    wrapper, log, stall = dir .. '/container', dir .. '/log', dir .. '/stall'
    local cwd = process.run({ 'pwd' }).stdout:gsub('\n$', '')
    local f = assert(io.open(wrapper, 'w'))
    f:write('#!/bin/sh\nFAKE_CONTAINER_LOG=' .. log .. ' FAKE_CONTAINER_STALL=' .. stall .. ' exec ' .. cwd .. '/'
      .. FAKE .. ' "$@"\n')
    f:close()
    process.run({ 'chmod', '+x', wrapper })
    pool = sandbox.create_sandboxes(apple.apple_container_sandboxes({ executable = wrapper }),
      { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'none', 'all' } })
    sb = pool:create({ lifetime_ms = 600000, labels = { suite = 'c' } })
  end)

  teardown(function()
    pool:close()
    process.run({ 'sh', '-c', 'docker ps -aq --filter label=mayura.fake-container=1 | xargs -r docker rm -f' })
    util.rmdir(dir)
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  describe('passes the conformance suite through the mayura provider', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
  end)

  it('runs a sleeping VM with --rm and the network asked, and keeps env values off the command line', function()
    local other = pool:create({ lifetime_ms = 90500, network = 'all', env = { A = 'SECRET-VALUE' }, cpus = 1.5,
      memory_mib = 300 })
    assert.are.equal('SECRET-VALUE\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    local id = other._backend.container_id
    other:release()
    local text = read_log()
    assert.is_falsy(text:find('SECRET-VALUE', 1, true))
    assert.truthy(text:find('run -d --rm --name ' .. id .. ' --network default --cap-drop ALL --init -u 1000:1000 '
      .. '--tmpfs /workspace -c 2 -m 300M docker.io/library/node:22-slim sleep 91', 1, true), text)
    assert.truthy(text:find('delete --force ' .. id, 1, true), text)
    assert.truthy(text:find('run -d --rm --name ' .. sb._backend.container_id .. ' --network none ', 1, true), text)
    -- a released VM is gone from the CLI's view
    assert.are.equal(1, process.run({ wrapper, 'inspect', id }).exit_code)
  end)

  it('a VM deleted behind the pool is gone; a CLI that never answers is timeout', function()
    local other = pool:create({ lifetime_ms = 60000 })
    other:write_file('x.txt', 'x')
    process.run({ wrapper, 'delete', '--force', other._backend.container_id })
    check('gone', other.exec, other, { 'true' })
    check('gone', other.read_file, other, 'x.txt')
    check('gone', other.write_file, other, 'x.txt', 'y')
    other:release()
    local slow = sandbox.create_sandboxes(apple.apple_container_sandboxes({ executable = wrapper, cli_timeout_ms = 1000 }),
      { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local f = assert(io.open(stall, 'w'))
    f:write('run')
    f:close()
    check('timeout', slow.create, slow, { lifetime_ms = 60000 })
    local s = slow:create({ lifetime_ms = 60000 })
    assert.are.equal('ok\n', s:exec({ 'echo', 'ok' }).stdout)
    s:release()
    slow:close()
  end)

  it('a CLI that cannot be run is unavailable', function()
    local p = sandbox.create_sandboxes(apple.apple_container_sandboxes({ executable = dir .. '/no-such-cli' }),
      { max_sandboxes = 1, max_lifetime_ms = 600000 })
    check('unavailable', p.create, p, { lifetime_ms = 60000 })
    p:close()
  end)
end)
