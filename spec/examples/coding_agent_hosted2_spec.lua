-- examples/coding_agent.lua --provider fly | cloudflare | agentcore | apple-container: the
-- coding-agent guide's recorded session on each, against the stand-ins of the specs (over real
-- local sandboxes) or, for apple-container, the fake `container` CLI (Docker containers of the
-- mayura-test/node:1 image). Each run's tests fail, then pass, and the example's own re-check in
-- a fresh sandbox passes; no credential shows in the output.
local process = require('mayura.process')
local stand_in = require('support.stand_in')
local fly_service = require('support.fly_service')
local cloudflare_service = require('support.cloudflare_service')
local agentcore_service = require('support.agentcore_service')
local util = require('support.util')

local example = require('support.coding_agent_example')
local plays = example.plays

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('examples/coding_agent.lua on the hosted providers of part 2', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent) for the stand-ins: not available here')
    return
  end
  local svc, backing

  before_each(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
  end)

  after_each(function()
    backing:close()
    local others = {}
    for _, f in ipairs(svc.failures) do others[#others + 1] = f end
    svc:close()
    assert.are.same({}, others)
  end)

  it('--provider fly needs FLY_API_TOKEN and FLY_APP (exit code 2), then plays the session', function()
    example.needs('fly', { FLY_APP = 'a' })
    local token = 'fm2_example0123456789TOKEN'
    local state = fly_service.install(svc, backing, { token = token, app = 'coding' })
    plays('fly', { FLY_API_TOKEN = token, FLY_APP = 'coding', FLY_API_URL = svc:url('') }, token, 'network all')
    assert.are.equal(2, #svc:calls('POST', '/v1/apps/{app}/machines'))
    for _, m in pairs(state.machines) do assert.are.equal('destroyed', m.state) end
  end)

  it('--provider cloudflare plays the session through the bridge stand-in', function()
    local key = 'cfsb_example0123456789KEY'
    cloudflare_service.install(svc, backing, { api_key = key })
    plays('cloudflare', { CLOUDFLARE_SANDBOX_URL = svc:url(''), CLOUDFLARE_SANDBOX_API_KEY = key }, key, 'network all')
    assert.are.equal(2, #svc:calls('DELETE', '/v1/sandbox/{id}'))
    assert.are.equal(0, backing.pool:count())
  end)

  it('--provider agentcore plays the session, every request signed', function()
    local id, secret = 'AKIAEXAMPLEAGENTKEY0', 'example/Secret+0123456789SECRET'
    local state = agentcore_service.install(svc, backing, { access_key_id = id, secret_access_key = secret,
      region = 'eu-west-1' })
    plays('agentcore', { AWS_REGION = 'eu-west-1', AWS_ACCESS_KEY_ID = id, AWS_SECRET_ACCESS_KEY = secret,
      AGENTCORE_ENDPOINT = svc:url('') }, secret, 'network all')
    assert.are.equal(#svc.requests, state.verified)
    for _, s in pairs(state.sessions) do assert.are.equal('TERMINATED', s.status) end
  end)

  it('--provider apple-container plays the session through the fake container CLI', function()
    if process.run({ 'docker', 'image', 'inspect', 'mayura-test/node:1' }, { timeout_ms = 20000 }).exit_code ~= 0 then
      pending('needs Docker and the mayura-test/node:1 image (sh scripts/docker-setup.sh)')
      return
    end
    local dir = util.tmpdir()
    local cwd = process.run({ 'pwd' }).stdout:gsub('\n$', '')
    local cli = dir .. '/container'
    local f = assert(io.open(cli, 'w'))
    f:write('#!/bin/sh\nFAKE_CONTAINER_IMAGE=mayura-test/node:1 exec ' .. cwd .. '/spec/support/fake_container/container "$@"\n')
    f:close()
    process.run({ 'chmod', '+x', cli })
    plays('apple-container', { CONTAINER_CLI = cli }, nil, 'no network')
    -- a container the daemon is still removing (its auto-remove and the delete race) is listed a moment
    local left
    util.eventually(function()
      left = process.run({ 'sh', '-c', 'docker ps -aq --filter label=mayura.fake-container=1' }).stdout
      return left == ''
    end, 10000)
    util.rmdir(dir)
    assert.are.equal('', left)
  end)
end)
