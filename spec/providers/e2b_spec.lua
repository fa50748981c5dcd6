-- mayura.sandbox.e2b and mayura.sandbox.e2b_desktop against the E2B stand-in
-- (support/e2b_service.lua) over real local sandboxes: first the official `e2b` and
-- `@e2b/desktop` npm SDKs against the stand-in (so the stand-in is one the service's own client
-- takes for E2B), then the conformance suite and the provider's own promises through mayura.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local process = require('mayura.process')
local e2b = require('mayura.sandbox.e2b')
local e2b_desktop = require('mayura.sandbox.e2b_desktop')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')

local json = core.json

local KEY = 'e2b_0123456789abcdef0123456789abcdef'

local can_run_local = pcall(function()
  local local_provider = require('mayura.sandbox.local')
  local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
  local sb = pool:create({ lifetime_ms = 60000 })
  sb:release()
  pool:close()
end)

local function node_ok()
  local ok, r = pcall(process.run, { 'node', '--version' }, { timeout_ms = 10000 })
  return ok and r.exit_code == 0
end

local function sdk_installed(name)
  local f = io.open('spec/npm/node_modules/' .. name .. '/package.json', 'r')
  if f then f:close() end
  return f ~= nil
end

-- Runs a Node script of spec/npm against the stand-in; returns its JSON line and the result.
local function run_node(script, svc, extra)
  local env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), E2B_API_KEY = KEY,
    E2B_API_URL = svc:url(''), E2B_SANDBOX_URL = svc:url('') }
  for k, v in pairs(extra or {}) do env[k] = v end
  local r = process.run({ 'node', 'spec/npm/' .. script }, { env = env, timeout_ms = 90000 })
  local line = r.stdout:match('([^\n]+)\n?$')
  local ok, v = pcall(json.decode, line or '')
  return ok and v or nil, r
end

describe('the E2B stand-in, as the official SDKs see it', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  if not node_ok() or not sdk_installed('e2b') or not sdk_installed('@e2b/desktop') then
    pending('needs node and the npm clients of spec/npm (sh scripts/setup.sh installs them)')
    return
  end
  local svc, backing, service

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 4 })
    service = e2b_service.install(svc, backing, { api_key = KEY })
  end)

  teardown(function()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  it('e2b: create, a command\'s exit code and output, a file written and read, list, kill', function()
    local out, r = run_node('e2b_check.mjs', svc, { RUN_ID = 'r1' })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.are.same({ exitCode = 0, stdout = 'hello from the sdk\n', stderr = 'oops\n' }, out.ok)
    assert.are.same({ threw = true, exitCode = 3, stdout = 'partial\n' }, out.failed)
    assert.are.equal('written by the sdk\n', out.read)
    assert.are.equal('/workspace/sdk/dir/note.txt', out.written.path)
    assert.is_true(out.bytes)
    assert.are.equal('written by the sdk\n', out.catSeen)
    assert.are.same({ name = 'bytes.bin', type = 'file', size = 256 }, out.list[1])
    assert.are.same({ 'dir', 'dir' }, { out.list[2].name, out.list[2].type })
    assert.are.equal(2, #out.list)
    assert.are.same({ out.id }, out.listed)
    assert.are.equal('base', out.infoTemplate)
    assert.is_true(out.killed)
    assert.is_false(out.killedAgain)
    assert.are.same({}, out.listedAfter)
    assert.is_nil(backing:get(out.id))
    -- what the SDK sent: the key in its header, the envd token, argv through bash -l -c
    local create = svc:calls('POST', '/v2/sandboxes')[1]
    assert.are.equal(KEY, create.headers['x-api-key'])
    assert.are.same({ suite = 'sdk', run = 'r1' }, create.json.metadata)
    assert.is_false(create.json.allow_internet_access)
    local start = svc:calls('POST', '/process.Process/Start')[1]
    assert.are.equal(out.id, start.headers['e2b-sandbox-id'])
    assert.truthy(start.headers['x-access-token'])
    assert.is_nil(start.headers['x-api-key'])
    assert.are.same({ 'multipart', 'multipart' }, { service.uploads[1].kind, service.uploads[2].kind })
  end)

  it('@e2b/desktop: create starts the display, a screenshot, clicks, typing and keys '
    .. '(the stand-in answers with a fixed PNG and records the actions)', function()
    local out, r = run_node('e2b_desktop_check.mjs', svc, { E2B_DOMAIN = 'e2b.test' })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.are.equal(#e2b_service.PNG, out.png.length)
    assert.are.equal('89504e470d0a1a0a', out.png.signature)
    assert.are.same({ width = 1024, height = 768 }, out.size)
    assert.are.same({ x = 300, y = 400 }, out.cursor)
    assert.are.equal('https://6080-' .. out.id .. '.e2b.test/vnc.html?autoconnect=true&resize=scale', out.viewUrl)
    assert.are.equal(':0\n', out.echo)
    assert.is_true(out.killed)
    local rec = service.seen_desktops[out.id]
    local kinds = {}
    for _, a in ipairs(rec.actions) do kinds[#kinds + 1] = a.kind end
    assert.are.same({ 'screenshot', 'move', 'click', 'move', 'click', 'type', 'key', 'key', 'click', 'move',
      'mousedown', 'move', 'mouseup', 'view' }, kinds)
    assert.are.same({ kind = 'click', button = 1, ['repeat'] = 1, x = 100, y = 200 }, rec.actions[3])
    assert.are.same({ kind = 'click', button = 1, ['repeat'] = 2, x = 30, y = 40 }, rec.actions[5])
    assert.are.equal("it's typed", rec.actions[6].text)
    assert.are.equal('Return', rec.actions[7].keys)
    assert.are.equal('Control_L+c', rec.actions[8].keys)
    assert.are.same({ kind = 'click', button = 4, ['repeat'] = 3, x = 30, y = 40 }, rec.actions[9])
  end)
end)
