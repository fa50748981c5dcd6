-- examples/providers/docker_exec.lua, the provider written in one file on command_sandbox_backend:
-- it stays short, passes the conformance suite in the BusyBox test image (BusyBox sh and applets
-- only), keeps its containers locked down, and leaves no container behind.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local providers = require('support.providers')

local EXAMPLE = 'examples/providers/docker_exec.lua'

local _, daemon = providers.host('docker info')
local _, image = providers.host('docker image inspect ' .. providers.BUSYBOX)

describe(EXAMPLE, function()
  it('is one short file', function()
    local n = 0
    for _ in io.lines(EXAMPLE) do n = n + 1 end
    assert.is_true(n < 150, EXAMPLE .. ' has ' .. n .. ' lines')
  end)

  if not (daemon and image) then
    pending('needs a Docker daemon and ' .. providers.BUSYBOX .. ' (scripts/docker-setup.sh)')
    return
  end

  local docker_exec = dofile(EXAMPLE)
  local provider = docker_exec.docker_exec_sandboxes({ image = providers.BUSYBOX })
  local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 3, max_lifetime_ms = 600000 })
  local sb = pool:create({ lifetime_ms = 600000, env = { GREETING = 'hello there' } })
  teardown(function() pool:close() end)

  describe('passes the conformance suite', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
  end)

  it('runs as uid 1000 without network, with the create env, on a read-only root', function()
    local r = sb:exec({ 'sh', '-c', 'id -u; echo "$GREETING"; ls /sys/class/net' })
    assert.are.equal('1000\nhello there\nlo\n', r.stdout)
    assert.raises_code('PERMISSION_DENIED', sb.write_file, sb, '/etc/passwd', 'x')
    assert.raises_code('PERMISSION_DENIED', sb.write_file, sb, '/bin/new', 'x')
  end)

  it('removes the container at release', function()
    local other = pool:create({ lifetime_ms = 60000 })
    local container = other.id:match('^docker%-exec%-(%x+)$')
    assert.is_string(container)
    local _, there = providers.host('docker inspect ' .. container)
    assert.is_true(there)
    other:release()
    _, there = providers.host('docker inspect ' .. container)
    assert.is_false(there)
  end)
end)
