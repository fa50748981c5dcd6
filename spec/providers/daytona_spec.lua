-- mayura.sandbox.daytona against the Daytona stand-in (support/daytona_service.lua), which real
-- local sandboxes back: first the official SDK (@daytonaio/sdk, spec/npm) takes the stand-in for
-- the service, then the whole conformance suite runs through the mayura provider on the same
-- stand-in, then what is Daytona's own: what a create asks for, the service's lifetimes, signed
-- preview URLs, the learned working directory, long commands, the desktop. The failures (401,
-- 404, 429, cuts, slow creates) are in spec/faults/daytona_spec.lua.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local process = require('mayura.process')
local daytona = require('mayura.sandbox.daytona')
local daytona_service = require('support.daytona_service')
local stand_in = require('support.stand_in')
local suite = require('support.stand_in_suite')
local util = require('support.util')
local stop_cases = require('support.stop_cases')

local json = core.json

local KEY = 'dtn_test_3f9a1c0d5e7b2a4c6e8f'
local SDK = 'spec/npm/node_modules/@daytonaio/sdk/package.json'

local function exists(path)
  local f = io.open(path, 'r')
  if f then f:close() end
  return f ~= nil
end

-- Why the SDK cannot run here, or nil.
local function sdk_missing()
  if not exists(SDK) then return 'spec/npm has no @daytonaio/sdk (sh scripts/setup.sh installs it)' end
  local ok, r = pcall(process.run, { 'node', '--version' }, { timeout_ms = 20000 })
  if not ok or r.exit_code ~= 0 then return 'no node on the PATH' end
  return nil
end

local function provider_for(svc, extra)
  local o = { api_key = KEY, base_url = svc:url('/api'), retry_base_ms = 20 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return daytona.daytona_sandboxes(o)
end

-- The stand-in's record of the sandbox behind `sb`.
local function record(svc, sb)
  return svc.daytona.sandboxes[sb.id]
end

describe('the Daytona stand-in', function()
  it('is taken for the service by the official SDK: create, exec, files, list, delete', function()
    local why = sdk_missing()
    if why then
      pending(why)
      return
    end
    local svc = daytona_service.new({ api_key = KEY })
    local r = process.run({ 'node', 'spec/npm/daytona_sdk.js', 'check', svc:url('/api') }, {
      env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), DAYTONA_API_KEY = KEY }, timeout_ms = 60000,
    })
    local created = svc.daytona.created
    local left = svc.daytona.count()
    local calls = svc:calls('POST', '/toolbox/{id}/files/bulk-upload')
    local snapshots_left = next(svc.daytona.snapshots)
    local snapshot_call = svc:calls('POST', '/api/sandbox/{id}/snapshot')[1]
    svc:close()
    assert.are.same({}, svc.failures)
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local out = json.decode(r.stdout)
    assert.are.equal('started', out.state)
    -- the command really ran in a local sandbox with the env the create gave
    assert.are.equal(3, out.exec.exitCode)
    assert.truthy(out.exec.result:find('hi from the sdk\n', 1, true), out.exec.result)
    assert.truthy(out.exec.result:find('oops\n', 1, true), out.exec.result)
    -- a timeout (408) killed the command's process group only: its setsid'd child lived on
    assert.are.equal(408, out.timeout)
    assert.are.equal('s-alive\n', out.after_timeout)
    -- bytes up (a chunked multipart upload) and down (a multipart answer) unchanged
    assert.are.same({ same = true, length = 8 }, out.file)
    assert.are.equal(2, #calls)
    assert.are.same({ { name = 'file.bin', size = 8, isDir = false } }, out.listing)
    assert.are.same({ out.id }, out.listed)
    -- a snapshot of the running sandbox: it goes back to started, a sandbox made from it has its
    -- files, and once deleted the service no longer knows it
    assert.are.equal('started', out.state_after_snapshot)
    assert.are.same({ state = 'active', fromSandbox = true, sized = true }, out.snapshot)
    assert.are.equal(1, #out.snapshots_listed)
    assert.are.equal('kept by the snapshot', out.fork_file)
    assert.are.equal(404, out.snapshot_after_delete)
    assert.is_nil(snapshots_left)
    assert.are.equal(out.snapshots_listed[1], snapshot_call.json.name)
    -- deleted: the service no longer knows it, and its local sandbox is released
    assert.are.equal(404, out.after_delete)
    assert.are.equal(2, created)
    assert.are.equal(0, left)
  end)
end)

describe('mayura.sandbox.daytona', function()
  local svc, provider, pool, sb

  setup(function()
    svc = daytona_service.new({ api_key = KEY })
    provider = provider_for(svc)
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 3, max_lifetime_ms = 3600000,
      network = { 'none', 'all', 'allowlist' }, labels = { suite = 'daytona' } })
    sb = pool:create({ lifetime_ms = 600000, ports = { 3000 } })
  end)

  teardown(function()
    pool:close()
    svc:close()
    assert.are.same({}, svc.failures)
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  describe('passes the conformance suite', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function()
        assert.are.equal('passed', case.run({ sandbox = sb }))
      end)
    end
  end)

  local function live_snapshots()
    local n = 0
    for _ in pairs(svc.daytona.snapshots) do n = n + 1 end
    return n
  end

  it('snapshots natively: a create from one has exactly its files, release deletes it on the service', function()
    local pl = sandbox.create_sandboxes(provider_for(svc), { max_sandboxes = 3, max_lifetime_ms = 600000,
      max_snapshots = 2 })
    local other = sandbox.create_sandboxes(provider_for(svc), { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local ok, err = pcall(function()
      local base = pl:create({ lifetime_ms = 120000 })
      assert.are.equal('native', base.features.snapshots)
      assert.are.equal(0, base:exec({ 'sh', '-c', suite.SNAPSHOT_FILES }).exit_code)
      local before = suite.listing(base)
      local snap = base:snapshot()
      local native = snap._held.native
      local sn = svc.daytona.snapshots[native.id]
      assert.are.equal('active', sn.dto.state)
      assert.are.equal(base.id, sn.dto.sourceSandboxId)
      local posts = svc:calls('POST', '/api/sandbox/{id}/snapshot')
      assert.are.equal(native.name, posts[#posts].json.name)
      -- its size is the service's (GB, as bytes)
      assert.is_true(snap.size_bytes > 0)
      assert.are.equal(math.ceil(sn.dto.size * 1073741824), snap.size_bytes)
      -- the sandbox runs on after it
      assert.are.equal('started', record(svc, base).dto.state)
      base:write_file('s/a.txt', 'two')
      local fork = pl:create({ lifetime_ms = 120000, snapshot = snap })
      local creates = svc:calls('POST', '/api/sandbox')
      assert.are.equal(native.name, creates[#creates].json.snapshot)
      suite.same_files(before, fork)
      -- another pool's create, or one with an image too, is refused before any call
      suite.snapshot_refusals(pl, other, snap, function() return #svc:calls('POST', '/api/sandbox') end)
      fork:release()
      base:release()
      snap:release()
      assert.is_nil(svc.daytona.snapshots[native.id], 'release deleted the snapshot on the service')
      assert.raises_code('INVALID_INPUT', pl.create, pl, { lifetime_ms = 60000, snapshot = snap })
      local kept = pl:create({ lifetime_ms = 120000 }):snapshot()
      assert.truthy(svc.daytona.snapshots[kept._held.native.id])
      pl:close()
      assert.are.equal(0, live_snapshots())
    end)
    pl:close()
    other:close()
    if not ok then error(err, 0) end
  end)

  it('a failed snapshot leaves none on the service and is a SANDBOX_ERROR; one past max_snapshot_bytes '
    .. 'is deleted', function()
    local pl = sandbox.create_sandboxes(provider_for(svc, { retries = 0 }), { max_sandboxes = 1,
      max_lifetime_ms = 600000, max_snapshot_bytes = 1024 })
    local ok, err = pcall(function()
      local base = pl:create({ lifetime_ms = 120000 })
      base:write_file('f.txt', 'x')
      -- the call fails
      svc:fault('POST', '/api/sandbox/{id}/snapshot', stand_in.status(500), 1)
      local e = assert.raises_code('SANDBOX_ERROR', base.snapshot, base)
      assert.are.equal('unavailable', e.reason)
      assert.are.equal(0, live_snapshots())
      -- the snapshot ends in error: deleted
      svc.daytona.snapshot_fails = 1
      e = assert.raises_code('SANDBOX_ERROR', base.snapshot, base)
      assert.are.equal('failed', e.reason)
      assert.are.equal(0, live_snapshots())
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      -- larger than max_snapshot_bytes leaves room for: deleted on the service
      base:write_file('big.bin', string.rep('x', 4096))
      assert.raises_code('LIMIT_EXCEEDED', base.snapshot, base)
      assert.are.equal(0, live_snapshots())
      assert.are.equal('x', base:read_file('f.txt'))
    end)
    svc:clear()
    svc.daytona.snapshot_fails = 0
    pl:close()
    if not ok then error(err, 0) end
  end)

  it('takes its options at the boundary, the key never from the environment', function()
    assert.raises_code('INVALID_CONFIG', daytona.daytona_sandboxes, {})
    assert.raises_code('INVALID_CONFIG', daytona.daytona_sandboxes, { api_key = KEY, nope = true })
    assert.raises_code('INVALID_CONFIG', daytona.daytona_sandboxes, { api_key = KEY, workdir = 'rel' })
    assert.raises_code('INVALID_CONFIG', daytona.daytona_sandboxes, { api_key = KEY, desktop = 'yes' })
    assert.raises_code('INVALID_CONFIG', daytona.daytona_sandboxes, { api_key = KEY, base_url = 'ftp://x' })
    local p = daytona.daytona_sandboxes({ api_key = KEY })
    assert.are.same({ stdin = true, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' }, p.features)
    assert.is_true(daytona.daytona_sandboxes({ api_key = KEY, desktop = true }).features.desktop)
    -- the library reads no DAYTONA_* variable: the provider's source names none
    local f = assert(io.open('providers/mayura/sandbox/daytona.lua'))
    local src = f:read('a')
    f:close()
    assert.is_nil(src:find('getenv', 1, true))
  end)

  it('asks Daytona for the snapshot, env, labels, network and lifetime of the create', function()
    local p = provider_for(svc, { snapshot = 'team-node', target = 'eu' })
    local own = sandbox.create_sandboxes(p, { max_sandboxes = 2, max_lifetime_ms = 3600000,
      network = { 'none', 'allowlist' }, labels = { team = 'a' } })
    local a = own:create({ lifetime_ms = 90001, env = { GREETING = 'hello' }, labels = { run = 'r1' } })
    local b = own:create({ lifetime_ms = 60000, image = 'other-snapshot', cpus = 1.5, memory_mib = 1536,
      network = { allow = { 'packages.example.com', '*.github.com' } } })
    local ra, rb = record(svc, a).body, record(svc, b).body
    assert.are.equal('team-node', ra.snapshot)
    assert.are.equal('eu', ra.target)
    assert.are.same({ GREETING = 'hello' }, ra.env)
    assert.are.equal('hello\n', a:exec({ 'sh', '-c', 'echo $GREETING' }).stdout)
    assert.are.equal('a', ra.labels.team)
    assert.are.equal('r1', ra.labels.run)
    -- 90001 ms is two of Daytona's minutes: destroyed at two (wall clock), stopped after two idle,
    -- deleted once stopped
    assert.are.equal(2, ra.ttlMinutes)
    assert.are.equal(2, ra.autoStopInterval)
    assert.are.equal(0, ra.autoDeleteInterval)
    assert.is_true(ra.networkBlockAll)
    assert.is_nil(ra.domainAllowList)
    assert.is_false(ra.public)
    assert.are.equal('other-snapshot', rb.snapshot)
    assert.are.equal(2, rb.cpu)
    assert.are.equal(2, rb.memory)
    assert.is_false(rb.networkBlockAll)
    assert.are.equal('packages.example.com,*.github.com', rb.domainAllowList)
    a:release()
    b:release()
    own:close()
    assert.is_nil(record(svc, a))
    assert.is_nil(record(svc, b))
  end)

  it('maps what the file API refuses to the same errors as the other providers', function()
    sb:write_file('errs/dir/inner.txt', 'x')
    assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'errs/dir')           -- a directory
    assert.raises_code('INVALID_INPUT', sb.write_file, sb, 'errs/dir', 'y')     -- refused, then diagnosed
    assert.raises_code('PERMISSION_DENIED', sb.write_file, sb, '/usr/mayura-daytona.txt', 'y')
    sb:exec({ 'mkfifo', 'errs/pipe' })
    assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'errs/pipe')          -- not a regular file
    sb:exec({ 'sh', '-c', 'echo s > errs/secret; chmod 000 errs/secret' })
    assert.raises_code('PERMISSION_DENIED', sb.read_file, sb, 'errs/secret')    -- the daemon's 403
    -- paths the daemon would change (it trims blanks) or cannot carry in a multipart field
    assert.raises_code('INVALID_INPUT', sb.write_file, sb, 'errs/a\nb', 'y')
    assert.raises_code('INVALID_INPUT', sb.write_file, sb, 'errs/trailing ', 'y')
    assert.are.equal('x', sb:read_file('errs/dir/inner.txt'))
    sb:remove_file('errs', { recursive = true })
  end)

  it('gives a signed preview URL for a port, valid for what is left of the lifetime', function()
    local u = sb:url(3000)
    local previews = record(svc, sb).previews
    local last = previews[#previews]
    assert.are.equal('https://3000-' .. last.token .. '.' .. svc.daytona.proxy_domain, u)
    assert.is_true(last.signed)
    assert.is_true(last.expires > 500 and last.expires <= 600, tostring(last.expires))
    assert.raises_code('INVALID_INPUT', sb.url, sb, 8080)   -- not one of its ports
  end)

  it('learns the working directory from the first sandbox, or keeps the one it is given', function()
    assert.are.equal(daytona_service.WORKDIR, provider.workdir)
    assert.are.equal(daytona_service.WORKDIR .. '\n', sb:exec({ 'pwd' }).stdout)
    local asked = #svc:calls('GET', '/toolbox/{id}/work-dir')
    local again = pool:create({ lifetime_ms = 60000 })   -- known now: not asked again
    again:release()
    local p = provider_for(svc, { workdir = '/tmp' })
    local own = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local t = own:create({ lifetime_ms = 60000 })
    assert.are.equal('/tmp\n', t:exec({ 'pwd' }).stdout)
    t:write_file('here.txt', 'x')
    assert.are.equal('x', t:read_file('/tmp/here.txt'))
    t:release()
    own:close()
    assert.are.equal(asked, #svc:calls('GET', '/toolbox/{id}/work-dir'))
  end)

  it('waits for a sandbox that is still starting', function()
    svc.daytona.starting_polls = 3
    local gets = #svc:calls('GET', '/api/sandbox/{id}')
    local t = pool:create({ lifetime_ms = 60000 })
    svc.daytona.starting_polls = 0
    -- three answers 'starting', the fourth 'started'
    assert.are.equal(4, #svc:calls('GET', '/api/sandbox/{id}') - gets)
    assert.are.equal('ok\n', t:exec({ 'echo', 'ok' }).stdout)
    t:release()
  end)

  it('follows a command past one execute\'s wait, and runs each command once', function()
    local p = provider_for(svc, { wait_ms = 300, workdir = daytona_service.WORKDIR })
    local own = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local t = own:create({ lifetime_ms = 60000 })
    local before = #svc:calls('POST', '/toolbox/{id}/process/execute')
    local r = t:exec({ 'sh', '-c', 'echo run >> runs.txt; sleep 1.2; echo done; echo warn >&2' })
    local calls = #svc:calls('POST', '/toolbox/{id}/process/execute') - before
    assert.are.equal(0, r.exit_code)
    assert.are.equal('done\n', r.stdout)
    assert.are.equal('warn\n', r.stderr)
    assert.is_true(calls >= 3, calls .. ' executes')
    assert.are.equal('run\n', t:read_file('runs.txt'))
    t:release()
    own:close()
  end)

  it('ends its sandboxes by Daytona\'s own lifetime too: after it, calls fail with gone', function()
    svc.daytona.minute_ms = 300   -- one of Daytona's minutes lasts 300 ms here
    local own = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local t = own:create({ lifetime_ms = 60000 })   -- a minute: ttlMinutes = 1
    svc.daytona.minute_ms = 60000
    assert.are.equal('up\n', t:exec({ 'echo', 'up' }).stdout)
    assert.truthy(util.eventually(function() return record(svc, t) == nil end, 3000), 'the service ended it')
    local err = assert.raises_code('SANDBOX_ERROR', t.exec, t, { 'echo', 'late' })
    assert.are.equal('gone', err.reason)
    err = assert.raises_code('SANDBOX_ERROR', t.read_file, t, 'x')
    assert.are.equal('gone', err.reason)
    t:release()
    own:close()
  end)

  it('stops an idle sandbox after autoStopInterval and deletes it (autoDeleteInterval 0)', function()
    svc.daytona.minute_ms = 400
    local own = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local t = own:create({ lifetime_ms = 120000 })   -- two minutes: 800 ms here, idle or not
    svc.daytona.minute_ms = 60000
    local rec = record(svc, t)
    rec.dto.ttlMinutes = 0   -- leave only the idle stop
    rec.dto.autoStopInterval = 1
    -- busy: a command longer than the idle interval keeps it up
    assert.are.equal(0, t:exec({ 'sleep', '0.6' }).exit_code)
    assert.are.equal('started', rec.dto.state)
    svc.daytona.minute_ms = 200
    assert.truthy(util.eventually(function() return record(svc, t) == nil end, 3000), 'stopped and deleted')
    svc.daytona.minute_ms = 60000
    local err = assert.raises_code('SANDBOX_ERROR', t.list_files, t, '.')
    assert.are.equal('gone', err.reason)
    t:release()
    own:close()
  end)
end)

describe('mayura.sandbox.daytona under the daemon\'s other shells', function()
  for _, shell in ipairs({ 'zsh', 'bash' }) do
    it('runs commands, files and timeouts when the daemon\'s shell is ' .. shell, function()
      if not exists('/usr/bin/' .. shell) then
        pending('no /usr/bin/' .. shell .. ' here (scripts/setup.sh installs it)')
        return
      end
      local svc = daytona_service.new({ api_key = KEY, shell = shell })
      local pool = sandbox.create_sandboxes(provider_for(svc), { max_sandboxes = 1, max_lifetime_ms = 600000,
        max_output_bytes = 100000 })
      local sb = pool:create({ lifetime_ms = 60000 })
      local r = sb:exec({ 'sh', '-c', 'echo "out $0"; echo err >&2; exit 5' }, { env = { X = "a'b" } })
      assert.are.same({ 5, 'out sh\n', 'err\n' }, { r.exit_code, r.stdout, r.stderr })
      assert.are.equal("a'b", sb:exec({ 'printenv', 'X' }, { env = { X = "a'b" } }).stdout:sub(1, -2))
      assert.are.equal('in\0put', sb:exec({ 'cat' }, { stdin = 'in\0put' }).stdout)
      r = sb:exec({ 'sh', '-c', 'head -c 150000 /dev/zero | tr "\\000" x' })
      assert.are.same({ 100000, true }, { #r.stdout, r.truncated })
      r = sb:exec({ 'sh', '-c', 'sleep 30' }, { timeout_ms = 300 })
      assert.is_true(r.timed_out)
      sb:write_file('d/f.txt', 'f')
      assert.are.equal('f.txt', sb:list_files('d')[1].name)
      sb:remove_file('d', { recursive = true })
      assert.is_nil(sb:list_files('d'))
      assert.raises_code('INVALID_INPUT', sb.exec, sb, { 'true' }, { cwd = 'no/such/dir' })
      sb:release()
      pool:close()
      svc:close()
      assert.are.same({}, svc.failures)
    end)
  end
end)

describe('mayura.sandbox.daytona with desktop = true', function()
  it('starts the desktop and drives it: a PNG screenshot, the size, clicks, keys, text, a view URL', function()
    local svc = daytona_service.new({ api_key = KEY, desktop = true })
    local p = provider_for(svc, { desktop = true })
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    local d = assert(sb.desktop)
    local png = d:screenshot()
    assert.are.equal(daytona_service.PNG, png)
    assert.are.equal('\137PNG\r\n\26\n', png:sub(1, 8))
    assert.are.same({ width = 320, height = 200 }, d:size())
    d:click({ x = 150, y = 100 })
    d:double_click({ x = 151, y = 101 })
    d:move({ x = 10, y = 20 })
    d:scroll({ direction = 'down', amount = 3 })          -- where the mouse is
    d:drag({ from = { x = 1, y = 2 }, to = { x = 30, y = 40 } })
    d:type('hello')
    d:key('ctrl+shift+t')
    d:key('Return')
    assert.truthy(d:view_url():match('^https://6080%-%x+%.proxy%.daytona%.test/vnc%.html$'))
    local actions = svc.daytona.sandboxes[sb.id].actions
    assert.are.same({ kind = 'start' }, actions[1])
    assert.are.same({ kind = 'click', x = 150, y = 100, button = 'left', double = false }, actions[3])
    assert.are.same({ kind = 'click', x = 151, y = 101, button = 'left', double = true }, actions[4])
    assert.are.same({ kind = 'move', x = 10, y = 20 }, actions[5])
    assert.are.same({ kind = 'scroll', x = 10, y = 20, direction = 'down', amount = 3 }, actions[6])
    assert.are.same({ kind = 'drag', x = 1, y = 2, to_x = 30, to_y = 40, button = 'left' }, actions[7])
    assert.are.same({ kind = 'type', text = 'hello' }, actions[8])
    assert.are.same({ kind = 'key', key = 't', modifiers = { 'ctrl', 'shift' } }, actions[9])
    assert.are.same({ kind = 'key', key = 'Return', modifiers = {} }, actions[10])
    assert.raises_code('INVALID_INPUT', d.click, d, { x = -1, y = 0 })
    assert.raises_code('INVALID_INPUT', d.key, d, 'hyper+x')
    assert.raises_code('INVALID_INPUT', d.scroll, d, { direction = 'sideways' })
    sb:release()
    local err = assert.raises_code('SANDBOX_ERROR', d.screenshot, d)
    assert.are.equal('gone', err.reason)
    pool:close()
    svc:close()
    assert.are.same({}, svc.failures)
  end)

  it('has none without the option, and fails a create whose snapshot has none, leaving nothing', function()
    local svc = daytona_service.new({ api_key = KEY })   -- no computer use in this "snapshot"
    local plain = sandbox.create_sandboxes(provider_for(svc), { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local sb = plain:create({ lifetime_ms = 60000 })
    assert.is_nil(sb.desktop)
    assert.is_false(sb.features.desktop)
    sb:release()
    plain:close()
    local pool = sandbox.create_sandboxes(provider_for(svc, { desktop = true }),
      { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal('failed', err.reason)
    assert.is_nil(err.message:find('computer use is not', 1, true))   -- the service's words stay out
    assert.are.equal(0, svc.daytona.count())
    pool:close()
    svc:close()
  end)
end)
