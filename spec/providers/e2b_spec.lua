-- mayura.sandbox.e2b and mayura.sandbox.e2b_desktop against the E2B stand-in
-- (support/e2b_service.lua) over real local sandboxes: first the official `e2b` and
-- `@e2b/desktop` npm SDKs against the stand-in (so the stand-in is one the service's own client
-- takes for E2B), then the conformance suite and the provider's own promises through mayura.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local e2b = require('mayura.sandbox.e2b')
local e2b_desktop = require('mayura.sandbox.e2b_desktop')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')
local suite = require('support.stand_in_suite')
local stop_cases = require('support.stop_cases')

local json = core.json

local KEY = 'e2b_0123456789abcdef0123456789abcdef'

-- The message of an enveloped Connect request body.
local function e2b_service_message(body)
  return json.decode(body:sub(6))
end

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
    local out, r = run_node('e2b_sdk.mjs', svc, { RUN_ID = 'r1' })
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
    -- a snapshot: the new sandbox has the files of its time, the source its own; deleted on the service
    assert.truthy(out.snapshot.id:match('^%x+:default$'), out.snapshot.id)
    assert.are.same({}, out.snapshot.names)
    assert.are.equal('kept by the snapshot', out.forkRead)
    assert.are.equal('changed after the snapshot', out.sourceRead)
    assert.are.same({ out.snapshot.id }, out.snapshotsListed)
    assert.is_true(out.snapshotDeleted)
    assert.is_false(out.snapshotDeletedAgain)
    assert.are.equal('SandboxError', out.fromDeleted)   -- the 404 of a template it does not know
    assert.is_nil(service.snapshots[out.snapshot.id])
    assert.are.equal(out.snapshot.id, svc:calls('POST', '/v2/sandboxes')[2].json.templateID)
    -- envd's deadline and SendSignal end the command's own process: its background child lives on
    assert.are.same({ threw = true }, out.timeout)
    assert.are.equal('alive\n', out.timeoutChild)
    assert.is_true(out.handleKilled)
    assert.are.equal(-1, out.killedWait)
    assert.are.equal('alive\n', out.killChild)
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
    local out, r = run_node('e2b_desktop_sdk.mjs', svc, { E2B_DOMAIN = 'e2b.test' })
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

describe('mayura.sandbox.e2b against the stand-in', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, service, pool, sb

  local function make_provider(extra)
    local o = { api_key = KEY, api_url = svc:url(''), sandbox_url = svc:url(''), workdir = '/workspace',
      retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return e2b.e2b_sandboxes(o)
  end

  suite.stand_in_pool({
    backing = 8,
    install = function(s, b) return e2b_service.install(s, b, { api_key = KEY }) end,
    provider = function(s)
      svc = s   -- make_provider's
      return make_provider()
    end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, labels = { suite = 'c' },
      network = { 'none', 'all', 'allowlist' } },
    create = { lifetime_ms = 600000, labels = { case = 'conformance' } },
    ready = function(e) backing, service, pool, sb = e.backing, e.state, e.pool, e.sb end,
  })

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  suite.conformance(function() return sb end, 'passes the conformance suite')

  local function last(method, pattern)
    local calls = svc:calls(method, pattern)
    return calls[#calls]
  end

  it('creates with the lifetime in seconds, the labels as metadata, the env and the network asked for', function()
    local other = pool:create({ lifetime_ms = 90500, labels = { owner = 'spec' }, env = { A = 'b' } })
    local body = last('POST', '/v2/sandboxes').json
    assert.are.equal('base', body.templateID)
    assert.are.equal(91, body.timeout)
    assert.are.equal('c', body.metadata.suite)
    assert.are.equal('spec', body.metadata.owner)
    assert.truthy(body.metadata['mayura.create']:match('^%x+$'))
    assert.are.same({ A = 'b' }, body.envVars)
    assert.is_nil(body.secure)   -- the current route secures every sandbox
    assert.are.equal(0, #svc:calls('POST', '/sandboxes'))
    assert.is_false(body.allow_internet_access)
    assert.is_nil(body.network)
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    other:release()
    assert.are.equal('/sandboxes/' .. other.id, last('DELETE', '/sandboxes/{id}').path)
    assert.is_nil(backing:get(other.id))
    local allow = pool:create({ lifetime_ms = 60000, network = { allow = { 'packages.example.com' } } })
    body = last('POST', '/v2/sandboxes').json
    assert.are.same({ allowOut = { 'packages.example.com' }, denyOut = { '0.0.0.0/0' } }, body.network)
    assert.is_nil(body.allow_internet_access)
    allow:release()
  end)

  it('takes another template as image, and refuses cpus and memory before anything is made', function()
    local n = #svc:calls('POST', '/v2/sandboxes')
    local err = assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, cpus = 2 })
    assert.truthy(err.message:find('template', 1, true))
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, memory_mib = 512 })
    assert.are.equal(n, #svc:calls('POST', '/v2/sandboxes'))
    local d = pool:create({ lifetime_ms = 60000, image = 'desktop' })
    assert.are.equal('desktop', last('POST', '/v2/sandboxes').json.templateID)
    d:release()
    -- a template the service does not know
    assert.raises_code('INVALID_CONFIG', pool.create, pool, { lifetime_ms = 60000, image = 'no-such-template' })
    assert.are.equal(1, pool:count())
  end)

  it('runs argv without a shell, with the command\'s timeout, the access token and never the API key', function()
    local r = sb:exec({ 'printf', '%s|', 'a b', '$HOME' }, { timeout_ms = 7000 })
    assert.are.equal('a b|$HOME|', r.stdout)
    local start = last('POST', '/process.Process/Start')
    assert.are.equal(sb.id, start.headers['e2b-sandbox-id'])
    assert.are.equal('49983', start.headers['e2b-sandbox-port'])
    assert.are.equal(service.sandboxes[sb.id].token, start.headers['x-access-token'])
    assert.is_nil(start.headers['x-api-key'])
    assert.are.equal('7000', start.headers['connect-timeout-ms'])
    assert.are.equal('application/connect+json', start.headers['content-type'])
    local p = e2b_service_message(start.body).process
    assert.are.equal('printf', p.cmd)
    assert.are.same({ '%s|', 'a b', '$HOME' }, p.args)
    assert.truthy(p.envs.MAYURA_EXEC)
    for _, req in ipairs(svc.requests) do
      if req.headers['e2b-sandbox-id'] then assert.is_nil(req.headers['x-api-key']) end
    end
  end)

  -- Whether process `pid` of the sandbox still runs (a zombie is not running).
  local function alive(pid)
    local r = sb:exec({ 'sh', '-c', 'grep -q "^State:.*Z" /proc/' .. pid .. '/status 2>/dev/null && exit 1; ' ..
      'kill -0 ' .. pid .. ' 2>/dev/null' })
    return r.exit_code == 0
  end

  -- The pids of the sandbox that the stand-in signalled (as envd does: the command's own process).
  local function signalled_by_stand_in()
    local out = {}
    for _, s in ipairs(service.signalled) do out[s.os_pid] = true end
    return out
  end

  it('at a timeout (envd\'s deadline_exceeded) and a cancel, kills the command\'s tree by its tag '
    .. '(the stand-in, as envd, kills the command\'s own process only)', function()
    local starts = #svc:calls('POST', '/process.Process/Start')
    local r = sb:exec({ 'sh', '-c', 'echo before; sleep 51 >/dev/null 2>&1 & echo $! > bg1.pid; sleep 30' },
      { timeout_ms = 300 })
    assert.is_true(r.timed_out)
    assert.is_nil(r.exit_code)
    assert.are.equal('before\n', r.stdout)
    local calls = svc:calls('POST', '/process.Process/Start')
    assert.are.equal(starts + 2, #calls)
    local cmd = e2b_service_message(calls[starts + 1].body).process
    local kill = e2b_service_message(calls[starts + 2].body).process
    assert.are.same({ '/bin/sh', '-c' }, { kill.cmd, kill.args[1] })
    assert.truthy(kill.args[2]:find("MAYURA_EXEC=" .. cmd.envs.MAYURA_EXEC, 1, true))
    assert.is_nil(kill.envs)
    -- the background child is gone, and not by the stand-in's hand
    local child = assert(tonumber(sb:read_file('bg1.pid')))
    assert.is_nil(signalled_by_stand_in()[child])
    assert.is_false(alive(child))
    local token = require('mayura._task').cancel_token()
    require('mayura._task').after(300, function() token:cancel() end)
    assert.raises_code('CANCELLED', sb.exec, sb, { 'sh', '-c', 'sleep 52 >/dev/null 2>&1 & echo $! > bg2.pid; sleep 30' },
      { signal = token })
    calls = svc:calls('POST', '/process.Process/Start')
    kill = e2b_service_message(calls[#calls].body).process
    assert.are.equal('/bin/sh', kill.cmd)
    local signal = last('POST', '/process.Process/SendSignal').json
    assert.are.equal('SIGNAL_SIGKILL', signal.signal)
    child = assert(tonumber(sb:read_file('bg2.pid')))
    assert.is_nil(signalled_by_stand_in()[child])
    assert.is_false(alive(child))
  end)

  it('sends standard input with SendInput in chunks, then CloseStdin', function()
    local before = #svc:calls('POST', '/process.Process/SendInput')
    local data = string.rep('0123456789abcdef', 40000)   -- 640 000 bytes: three chunks
    local r = sb:exec({ 'cat' }, { stdin = data })
    assert.is_true(r.stdout == data)
    assert.are.equal(3, #svc:calls('POST', '/process.Process/SendInput') - before)
    assert.truthy(last('POST', '/process.Process/CloseStdin'))
  end)

  it('reads a file with a Range of max_bytes + 1, and writes raw bytes', function()
    sb:write_file('range/f.bin', string.rep('z', 5000))
    local post = last('POST', '/files')
    assert.are.equal('application/octet-stream', post.headers['content-type'])
    assert.are.equal('/workspace/range/f.bin', post.query.path)
    assert.are.equal(5000, #sb:read_file('range/f.bin'))
    assert.are.equal('bytes=0-16777216', last('GET', '/files').headers['range'])
    assert.raises_code('LIMIT_EXCEEDED', sb.read_file, sb, 'range/f.bin', { max_bytes = 4999 })
    assert.are.equal('bytes=0-4999', last('GET', '/files').headers['range'])
    sb:write_file('range/empty', '')
    assert.are.equal('', sb:read_file('range/empty'))
    assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'range')
    assert.raises_code('INVALID_INPUT', sb.write_file, sb, 'range', 'x')
    assert.raises_code('INVALID_INPUT', sb.list_files, sb, 'range/f.bin')
  end)

  it('gives URLs of ports as E2B builds them, from the domain', function()
    local p = make_provider({ domain = 'e2b.example' })
    local pl = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'none', 'all' } })
    local s = pl:create({ lifetime_ms = 60000, ports = { 3000 } })
    assert.are.equal('https://3000-' .. s.id .. '.e2b.example', s:url(3000))
    assert.are.same({ stdin = true, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' }, s.features)
    pl:close()
    -- without sandbox_url, each sandbox's envd is its own host under the domain, as E2B names it
    p = e2b.e2b_sandboxes({ api_key = KEY, api_url = svc:url(''), domain = 'E2B.example' })
    pl = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000 })
    s = pl:create({ lifetime_ms = 60000 })
    assert.are.equal('https://49983-' .. s.id .. '.e2b.example', s._backend.envd.base_url)
    assert.are.equal('https://8080-' .. s.id .. '.e2b.example', s._backend:url(8080))
    pl:close()
    assert.is_nil(backing:get(s.id))
  end)

  it('snapshots natively: a create from one has exactly its files, release deletes it on the service', function()
    local pl = sandbox.create_sandboxes(make_provider(), { max_sandboxes = 3, max_lifetime_ms = 600000,
      max_snapshots = 2 })
    local other = sandbox.create_sandboxes(make_provider(), { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local ok, err = pcall(function()
      local base = pl:create({ lifetime_ms = 120000 })
      assert.are.equal('native', base.features.snapshots)
      assert.are.equal(0, base:exec({ 'sh', '-c', suite.SNAPSHOT_FILES }).exit_code)
      local before = suite.listing(base)
      local snap = base:snapshot()
      local native = snap._held.native.id
      assert.truthy(service.snapshots[native], 'the service holds the snapshot')
      assert.are.equal('/sandboxes/' .. base.id .. '/snapshots', last('POST', '/sandboxes/{id}/snapshots').path)
      assert.are.equal(0, snap.size_bytes)   -- E2B says no size
      assert.are.same({ 1, 0 }, { pl:snapshots() })
      -- the sandbox runs on after it; what it changes later is not in the snapshot
      base:write_file('s/a.txt', 'two')
      base:write_file('s/later.txt', 'later')
      local fork = pl:create({ lifetime_ms = 120000, snapshot = snap })
      assert.are.equal(native, last('POST', '/v2/sandboxes').json.templateID)
      suite.same_files(before, fork)
      -- the snapshot outlives its sandbox; another pool's create refuses it before any call
      base:release()
      suite.snapshot_refusals(pl, other, snap, function() return #svc:calls('POST', '/v2/sandboxes') end)
      local again = pl:create({ lifetime_ms = 120000, snapshot = snap })
      assert.are.equal('one', again:read_file('s/a.txt'))
      again:release()
      snap:release()
      assert.is_nil(service.snapshots[native], 'release deleted the snapshot on the service')
      assert.are.equal('/templates/' .. native:gsub(':', '%%3A'), last('DELETE', '/templates/{id}').path)
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      assert.raises_code('INVALID_INPUT', pl.create, pl, { lifetime_ms = 60000, snapshot = snap })
      -- close() deletes what the pool still holds
      local kept = fork:snapshot()
      local kept_id = kept._held.native.id
      assert.truthy(service.snapshots[kept_id])
      pl:close()
      assert.is_nil(service.snapshots[kept_id])
    end)
    pl:close()
    other:close()
    if not ok then error(err, 0) end
  end)

  it('a failed snapshot call leaves no snapshot, here nor on the service, and is a SANDBOX_ERROR', function()
    local pl = sandbox.create_sandboxes(make_provider({ retries = 0 }), { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local ok, err = pcall(function()
      local base = pl:create({ lifetime_ms = 120000 })
      base:write_file('f.txt', 'x')
      -- the service fails it
      svc:fault('POST', '/sandboxes/{id}/snapshots', stand_in.status(500), 1)
      local e = assert.raises_code('SANDBOX_ERROR', base.snapshot, base)
      assert.are.equal('unavailable', e.reason)
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      assert.is_nil(next(service.snapshots))
      -- the service made it, but its answer was lost: the provider finds it by the sandbox and deletes it
      service.snapshot_answer = { status = 503, json = { code = 503, message = 'try later' } }
      e = assert.raises_code('SANDBOX_ERROR', base.snapshot, base)
      service.snapshot_answer = nil
      assert.are.equal('unavailable', e.reason)
      assert.is_nil(next(service.snapshots), 'the snapshot of the lost answer was left on the service')
      assert.are.equal(base.id, last('GET', '/snapshots').query.sandboxID)
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      -- the sandbox still works, and a later snapshot is made
      assert.are.equal('x', base:read_file('f.txt'))
      local snap = base:snapshot()
      assert.truthy(service.snapshots[snap._held.native.id])
      -- a snapshot deleted on the service behind the pool's back: a create from it says so
      service.snapshots[snap._held.native.id].held:release()
      service.snapshots[snap._held.native.id] = nil
      base:release()
      e = assert.raises_code('INVALID_INPUT', pl.create, pl, { lifetime_ms = 60000, snapshot = snap })
      assert.truthy(e.message:find('no longer has the snapshot', 1, true), e.message)
      assert.are.equal(0, pl:count())
    end)
    svc:clear()
    service.snapshot_answer = nil
    pl:close()
    if not ok then error(err, 0) end
  end)

  it('refuses options that are not usable, and needs the key as an option', function()
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, {})
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = '' })
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = KEY, api_url = 'ftp://x' })
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = KEY, api_url = 'https://u:p@host' })
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = KEY, domain = 'a..b' })
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = KEY, workdir = 'rel' })
    assert.raises_code('INVALID_CONFIG', e2b.e2b_sandboxes, { api_key = KEY, colour = 'red' })
    local err = assert.raises_code('INVALID_CONFIG', sandbox.create_sandboxes, e2b.e2b_sandboxes({ api_key = KEY }),
      { max_sandboxes = 1, max_lifetime_ms = 25 * 3600000 })
    assert.truthy(err.message:find('provider', 1, true))
  end)
end)

describe('mayura.sandbox.e2b with an older envd', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end

  it('writes files as multipart before envd 0.5.7, and refuses stdin before 0.5.2', function()
    local svc = stand_in.new()
    local backing = stand_in.local_backing({ max_sandboxes = 2 })
    local service = e2b_service.install(svc, backing, { api_key = KEY, envd_version = '0.5.0' })
    local pool = sandbox.create_sandboxes(e2b.e2b_sandboxes({ api_key = KEY, api_url = svc:url(''),
      sandbox_url = svc:url(''), workdir = '/workspace' }), { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    local data = 'a\r\n--not-a-boundary\r\n\0\255'
    sb:write_file('multi/part.bin', data)
    assert.are.equal('multipart', service.uploads[#service.uploads].kind)
    assert.are.equal(data, sb:read_file('multi/part.bin'))
    local err = assert.raises_code('INVALID_INPUT', sb.exec, sb, { 'cat' }, { stdin = 'x' })
    assert.truthy(err.message:find('0.5.0', 1, true))
    pool:close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)
end)

describe('mayura.sandbox.e2b_desktop against the stand-in '
  .. '(which answers the desktop\'s commands with a fixed PNG and records the actions)', function()
  if not can_run_local then
    pending('needs local sandboxes (bubblewrap and the agent): not available here')
    return
  end
  local svc, backing, service, pool, sb

  setup(function()
    svc = stand_in.new()
    backing = stand_in.local_backing({ max_sandboxes = 2 })
    service = e2b_service.install(svc, backing, { api_key = KEY, domain = 'e2b.test' })
    pool = sandbox.create_sandboxes(e2b_desktop.e2b_desktop_sandboxes({ api_key = KEY, api_url = svc:url(''),
      sandbox_url = svc:url(''), workdir = '/workspace', resolution = { 1280, 800 } }),
      { max_sandboxes = 2, max_lifetime_ms = 600000 })
    sb = pool:create({ lifetime_ms = 600000 })
  end)

  teardown(function()
    pool:close()
    backing:close()
    assert.are.same({}, svc.failures)
    svc:close()
  end)

  local function actions()
    return service.seen_desktops[sb.id].actions
  end

  it('starts the display and Xfce at create, as the SDK does, with DISPLAY=:0', function()
    local create = svc:calls('POST', '/v2/sandboxes')[1].json
    assert.are.equal('desktop', create.templateID)
    assert.are.same({ DISPLAY = ':0' }, create.envVars)
    local d = service.seen_desktops[sb.id]
    assert.is_true(d.display)
    assert.is_true(d.xfce)
    assert.are.equal('1280x800', d.screen)
    assert.is_true(sb.features.desktop)
    assert.are.equal(':0\n', sb:exec({ 'sh', '-c', 'echo $DISPLAY' }).stdout)
  end)

  it('takes screenshots as PNG bytes, and leaves no file behind', function()
    local png = sb.desktop:screenshot()
    assert.are.equal(e2b_service.PNG, png)
    assert.are.same({}, sb:list_files('/tmp') or {})
  end)

  it('clicks, double clicks, moves, scrolls, types, presses keys and drags', function()
    local n = #actions()
    sb.desktop:click({ x = 0, y = 0 })
    sb.desktop:click({ x = 5, y = 6, button = 'right' })
    sb.desktop:double_click({ x = 7, y = 8 })
    sb.desktop:move({ x = 9, y = 10 })
    sb.desktop:scroll({ direction = 'down', amount = 2 })
    sb.desktop:scroll({ direction = 'left', x = 1, y = 2 })
    sb.desktop:type("it's a quote; $(no) `shell` here: é")
    sb.desktop:key('enter')
    sb.desktop:key('ctrl+shift+t')
    sb.desktop:drag({ from = { 10, 20 }, to = { x = 30, y = 40 } })
    local got = {}
    for i = n + 1, #actions() do got[#got + 1] = actions()[i] end
    assert.are.same({
      { kind = 'move', x = 0, y = 0 }, { kind = 'click', button = 1, ['repeat'] = 1, x = 0, y = 0 },
      { kind = 'move', x = 5, y = 6 }, { kind = 'click', button = 3, ['repeat'] = 1, x = 5, y = 6 },
      { kind = 'move', x = 7, y = 8 }, { kind = 'click', button = 1, ['repeat'] = 2, x = 7, y = 8 },
      { kind = 'move', x = 9, y = 10 }, { kind = 'click', button = 5, ['repeat'] = 2, x = 9, y = 10 },
      { kind = 'move', x = 1, y = 2 }, { kind = 'click', button = 6, ['repeat'] = 1, x = 1, y = 2 },
      { kind = 'type', text = "it's a quote; $(no) `shel" }, { kind = 'type', text = 'l` here: é' },
      { kind = 'key', keys = 'Return' }, { kind = 'key', keys = 'Control_L+Shift_L+t' },
      { kind = 'move', x = 10, y = 20 }, { kind = 'mousedown', button = 1, x = 10, y = 20 },
      { kind = 'move', x = 30, y = 40 }, { kind = 'mouseup', button = 1, x = 30, y = 40 },
    }, got)
  end)

  it('says the screen size, and gives the live view\'s URL with a password', function()
    assert.are.same({ width = 1280, height = 800 }, sb.desktop:size())
    local url = sb.desktop:view_url()
    local pw = service.seen_desktops[sb.id].vnc_password
    assert.truthy(pw:match('^%w+$') and #pw == 16)
    assert.are.equal('https://6080-' .. sb.id .. '.e2b.test/vnc.html?autoconnect=true&resize=scale&password=' .. pw,
      url)
    assert.are.equal('https://6080-' .. sb.id .. '.e2b.test/vnc.html?autoconnect=true&view_only=true&resize=scale'
      .. '&password=' .. pw, sb.desktop:view_url({ view_only = true }))
    local views = 0
    for _, a in ipairs(actions()) do if a.kind == 'view' then views = views + 1 end end
    assert.are.equal(1, views)
  end)

  it('refuses what could reach the shell, and bad coordinates, before sending anything', function()
    local n = #svc:calls('POST', '/process.Process/Start')
    assert.raises_code('INVALID_INPUT', sb.desktop.key, sb.desktop, 'a; rm -rf /')
    assert.raises_code('INVALID_INPUT', sb.desktop.key, sb.desktop, 'ctrl++c')
    assert.raises_code('INVALID_INPUT', sb.desktop.click, sb.desktop, { x = -1, y = 2 })
    assert.raises_code('INVALID_INPUT', sb.desktop.click, sb.desktop, { x = 1.5, y = 2 })
    assert.raises_code('INVALID_INPUT', sb.desktop.click, sb.desktop, { x = 1, y = 2, button = 'other' })
    assert.raises_code('INVALID_INPUT', sb.desktop.type, sb.desktop, 'a\0b')
    assert.raises_code('INVALID_INPUT', sb.desktop.scroll, sb.desktop, { direction = 'sideways' })
    assert.are.equal(n, #svc:calls('POST', '/process.Process/Start'))
  end)

  it('works through the desktop tools of sandbox_tools', function()
    local tools = sandbox.sandbox_tools(sb, { name = 'screen', desktop = true })
    local by = {}
    for _, t in ipairs(tools) do by[t.id] = t end
    local shot = by['screen.screenshot'].run({}, {})
    assert.are.equal('image/png', shot.media_type)
    assert.are.equal(e2b_service.PNG, core.base64.decode(shot.base64))
    by['screen.click'].run({ x = 11, y = 12 }, {})
    local a = actions()
    assert.are.same({ kind = 'click', button = 1, ['repeat'] = 1, x = 11, y = 12 }, a[#a])
  end)

  it('says gone once the sandbox is released', function()
    local other = pool:create({ lifetime_ms = 60000 })
    local d = other.desktop
    other:release()
    local err = assert.raises_code('SANDBOX_ERROR', d.screenshot, d)
    assert.are.equal('gone', err.reason)
    err = assert.raises_code('SANDBOX_ERROR', d.click, d, { x = 1, y = 1 })
    assert.are.equal('gone', err.reason)
  end)
end)
