-- mayura.sandbox.codesandbox against the CodeSandbox stand-in (support/codesandbox_service.lua)
-- over real local sandboxes: first the official @codesandbox/sdk, unchanged, against the
-- stand-in's API and its pitcher (MessagePack over a WebSocket, through the Node front), so the
-- stand-in speaks what the service speaks; then the conformance suite through the mayura
-- provider against the same stand-in, and what the provider sends for each option.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local process = require('mayura.process')
local codesandbox = require('mayura.sandbox.codesandbox')
local stand_in = require('support.stand_in')
local util = require('support.util')
local codesandbox_service = require('support.codesandbox_service')
local stop_cases = require('support.stop_cases')

local TOKEN = 'csb_0123456789abcdefTOKEN'

describe('codesandbox_sandboxes options', function()
  it('needs a token, and never shows it', function()
    assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, {})
    assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = TOKEN, base_url = 'ftp://x' })
    assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = TOKEN, template = 'a/b' })
    assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = TOKEN, tier = 'Huge' })
    assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = TOKEN, workdir = 'rel' })
    assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = TOKEN, region = 'x' })
    local err = assert.raises_code('INVALID_CONFIG', codesandbox.codesandbox_sandboxes, { token = TOKEN .. ' x' })
    assert.is_falsy(tostring(err):find(TOKEN, 1, true))
    local p = codesandbox.codesandbox_sandboxes({ token = TOKEN })
    assert.are.same({ stdin = true, ports = false, desktop = false, network = { 'all' } }, p.features)
    assert.are.equal('/project/workspace', p.workdir)
    assert.are.equal(24 * 3600000, p.max_lifetime_ms)
  end)
end)

local can_run_local = pcall(function()
  require('mayura.sandbox.local').local_sandboxes({})
end)

describe('the CodeSandbox stand-in, over real local sandboxes', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, state, pool, sb, dir

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 6 })
    state = codesandbox_service.install(svc, backing, { token = TOKEN })
    dir = util.tmpdir()
    state:start_front(dir)
    pool = sandbox.create_sandboxes(codesandbox.codesandbox_sandboxes({ token = TOKEN, base_url = svc:url(''),
      workdir = codesandbox_service.WORKSPACE, retry_base_ms = 20 }),
      { max_sandboxes = 3, max_lifetime_ms = 6 * 3600000, network = { 'all' } })
    sb = pool:create({ lifetime_ms = 600000, network = 'all' })
  end)

  teardown(function()
    pool:close()
    state.close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
    util.rmdir(dir)
  end)

  it('is what the official @codesandbox/sdk takes: API, pitcher WebSocket, MessagePack, commands, files', function()
    local found = io.open('spec/npm/node_modules/@codesandbox/sdk/package.json')
    if not found then
      pending('@codesandbox/sdk is not installed (sh scripts/setup.sh installs spec/npm)')
      return
    end
    found:close()
    local before = #state.messages
    local r = process.run({ 'node', 'spec/npm/codesandbox_sdk.mjs' }, {
      timeout_ms = 30000,
      env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), STAND_IN_URL = svc:url(''), CSB_TOKEN = TOKEN },
    })
    local seen = {}
    for _, q in ipairs(svc.requests) do seen[#seen + 1] = q.method .. ' ' .. q.path end
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr .. table.concat(seen, ', '))
    local v = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.same({
      -- a command's output as a terminal gives it
      id = v.id, bootup = 'CLEAN', echo = 'hello from the sdk\r\n/workspace\r\n',
      failed = { message = 'Command failed with exit code 3', exitCode = 3 },
      note = 'a note\n', raw = '000102ff0a', listing = { 'file:note.txt', 'file:raw.bin' }, cat = 'a note\r\n',
      kept = { 'hibernate:RESUME:a note\n', 'shutdown:CLEAN:a note\n' },
      title = 'sdk check', gone = 'Failed to get sandbox ' .. v.id .. ': Sandbox not found',
      wrong = 'Failed to fork sandbox pcz35m: Unauthorized: the token was not accepted',
    }, v)
    -- the SDK's own requests, as the stand-in decoded them
    local methods = {}
    for i = before + 1, #state.messages do
      local m = state.messages[i].method
      methods[m] = (methods[m] or 0) + 1
    end
    assert.are.equal(3, methods['client/join'])   -- the first connect, and one after each resume
    assert.are.equal(3, methods['shell/create'])
    local starts = svc:calls('POST', '/vm/{id}/start')
    assert.are.equal(120, starts[#starts - 2].json.hibernation_timeout_seconds)   -- the create's start
    local forks = svc:calls('POST', '/sandbox/{template}/fork')
    assert.are.same({ 'sdk' }, forks[#forks].json.tags)
    assert.is_nil(state.sandboxes[v.id])
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  describe('passes the conformance suite through the mayura provider', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
  end)

  it('forks privately, sends the lifetime as the hibernation timeout, env to commands, and deletes at release', function()
    local other = pool:create({ lifetime_ms = 90500, network = 'all', env = { A = 'b' } })
    local forks = svc:calls('POST', '/sandbox/{template}/fork')
    local fork = forks[#forks]
    assert.are.equal(codesandbox_service.TEMPLATE, fork.params.template)
    assert.are.same({ privacy = 2, private_preview = true, title = 'mayura', tags = { 'sdk', 'mayura' }, path = '/SDK' },
      fork.json)
    local starts = svc:calls('POST', '/vm/{id}/start')
    assert.are.same({ hibernation_timeout_seconds = 91 }, starts[#starts].json)
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    local id = other._backend.id
    other:release()
    assert.is_nil(state.sandboxes[id])
    for _, req in ipairs(svc.requests) do
      assert.is_falsy(req.target:find(TOKEN, 1, true))
      assert.is_falsy(req.body:find(TOKEN, 1, true))
    end
    -- every command went through the pitcher as MessagePack
    local joins = 0
    for _, m in ipairs(state.messages) do
      if m.method == 'client/join' and m.params.clientInfo.appId == 'mayura' then joins = joins + 1 end
    end
    assert.is_true(joins >= 2)
  end)

  it('keeps a sandbox\'s files when the VM hibernates behind its back: the next command starts it '
    .. 'again and reconnects', function()
    local other = pool:create({ lifetime_ms = 90500, network = 'all' })
    other:write_file('kept/note.txt', 'still here')
    local http = require('mayura.http')
    local r = http.request({ url = svc:url('/vm/' .. other._backend.id .. '/hibernate'), method = 'POST',
      headers = { Authorization = 'Bearer ' .. TOKEN, ['Content-Type'] = 'application/json' }, body = '{}' })
    assert.are.equal(200, r.status)
    local got
    for _ = 1, 3 do   -- the command that finds the connection closed is `unavailable`
      local ok, v = pcall(other.read_file, other, 'kept/note.txt')
      if ok then got = v break end
      assert.are.equal('unavailable', v.reason)
    end
    assert.are.equal('still here', got)
    other:release()
  end)

  it('refuses network none and ports before any call', function()
    local n = #svc.requests
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'none' })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 8080 } })
    assert.are.equal(n, #svc.requests)
  end)
end)
