-- mayura.sandbox.vercel against the Vercel stand-in (support/vercel_service.lua) over real local
-- sandboxes: first the official @vercel/sandbox SDK, unchanged, against the stand-in (so the
-- stand-in speaks the API the service speaks), then the conformance suite through the mayura
-- provider against the same stand-in, then what the provider sends for each option. The helpers
-- it stands on: core.crc32 and the gzip'd tar of mayura.sandbox._tar, checked with the host's tar.
local core = require('mayura.core')
local testing = require('mayura.sandbox.testing')
local process = require('mayura.process')
local http = require('mayura.http')
local tar = require('mayura.sandbox._tar')
local vercel = require('mayura.sandbox.vercel')
local suite = require('support.stand_in_suite')
local vercel_service = require('support.vercel_service')
local stand_in = require('support.stand_in')
local sandbox = require('mayura.sandbox')
local util = require('support.util')
local stop_cases = require('support.stop_cases')

local TOKEN = 'vcp_0123456789abcdefTOKEN'
local TEAM, PROJECT = 'team_mayura', 'prj_mayura'
local SDK_SCRIPT = 'spec/npm/vercel_sdk.mjs'

local function run_host(argv, opts)
  return process.run(argv, opts or { timeout_ms = 30000 })
end

describe('mayura.sandbox._tar', function()
  it('makes a gzip that gzip -t accepts and a tar that tar extracts, long names included', function()
    local dir = util.tmpdir()
    local bytes = {}
    for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
    local binary = table.concat(bytes):rep(700)   -- 179,200 bytes: several stored blocks
    local long = string.rep('d', 60) .. '/' .. string.rep('e', 120) .. '/' .. string.rep('f', 90) .. '.txt'
    local split = string.rep('p', 120) .. '/' .. string.rep('q', 80)
    local entries = {
      { name = 'a/b.txt', data = 'hello' }, { name = long, data = 'long' }, { name = split, data = 'x', mode = 493 },
      { name = 'bin/all.bin', data = binary }, { name = 'empty', data = '' },
    }
    local f = assert(io.open(dir .. '/t.tgz', 'wb'))
    f:write(tar.tar_gz(entries, 1700000000))
    f:close()
    assert.are.equal(0, run_host({ 'gzip', '-t', dir .. '/t.tgz' }).exit_code)
    local r = run_host({ 'tar', '-xzf', dir .. '/t.tgz', '-C', dir })
    assert.are.equal(0, r.exit_code, r.stderr)
    for _, e in ipairs(entries) do
      local got = assert(io.open(dir .. '/' .. e.name, 'rb'))
      assert.is_true(got:read('a') == e.data, e.name)
      got:close()
    end
    assert.are.equal('755', run_host({ 'stat', '-c', '%a', dir .. '/' .. split }).stdout:match('%d+'))
    util.rmdir(dir)
  end)

  it('refuses names that are absolute, empty or climb', function()
    for _, name in ipairs({ '/etc/passwd', '', 'a/../../b', './a', 'a//b', 'a/' }) do
      assert.raises_code('INVALID_INPUT', tar.tar, { { name = name, data = 'x' } })
    end
  end)

  it('frames gzip around core.crc32', function()
    assert.are.equal(0xCBF43926, core.crc32('123456789'))
    assert.are.equal(core.crc32('123456789'), core.crc32('6789', core.crc32('12345')))
    local gz = tar.gzip('')
    assert.are.equal(10 + 5 + 8, #gz)   -- the header, one empty stored block, the CRC and the length
  end)
end)

describe('vercel_sandboxes options', function()
  it('needs a token, a team and a project, and never shows the token', function()
    assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes, { team_id = TEAM, project_id = PROJECT })
    assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes, { token = TOKEN, project_id = PROJECT })
    assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes, { token = TOKEN, team_id = TEAM })
    assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes, { token = TOKEN, team_id = 'a/b', project_id = PROJECT })
    assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes,
      { token = TOKEN, team_id = TEAM, project_id = PROJECT, workdir = 'rel' })
    local err = assert.raises_code('INVALID_CONFIG', vercel.vercel_sandboxes,
      { token = TOKEN .. ' x', team_id = TEAM, project_id = PROJECT })
    assert.is_falsy(tostring(err):find(TOKEN, 1, true))
    local p = vercel.vercel_sandboxes({ token = TOKEN, team_id = TEAM, project_id = PROJECT })
    assert.are.same({ stdin = false, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' }, p.features)
    assert.are.equal('/vercel/sandbox', p.workdir)
    assert.are.equal(5 * 3600000, p.max_lifetime_ms)
  end)
end)

suite.describe('the Vercel stand-in, over real local sandboxes', function()
  local svc, backing, state, pool, sb
  suite.stand_in_pool({
    backing = 8,
    install = function(s, b)
      return vercel_service.install(s, b, { token = TOKEN, team_id = TEAM, project_id = PROJECT })
    end,
    provider = function(s)
      return vercel.vercel_sandboxes({
        token = TOKEN, team_id = TEAM, project_id = PROJECT, base_url = s:url('/api'), workdir = '/workspace',
        retry_base_ms = 20,
      })
    end,
    pool = { max_sandboxes = 3, max_lifetime_ms = 600000, labels = { suite = 'c' },
      network = { 'none', 'all', 'allowlist' } },
    create = { lifetime_ms = 600000, labels = { case = 'conformance' } },
    ready = function(e) svc, backing, state, pool, sb = e.svc, e.backing, e.state, e.pool, e.sb end,
  })

  it('is what the official SDK (@vercel/sandbox) takes for the service', function()
    if not suite.npm_installed('@vercel/sandbox', 'the SDK') then return end
    local before = backing.pool:count()
    local r = suite.node(SDK_SCRIPT, { VERCEL_SANDBOX_TELEMETRY_DISABLED = '1', STAND_IN_URL = svc:url('/api'),
      STAND_IN_TOKEN = TOKEN, STAND_IN_TEAM = TEAM, STAND_IN_PROJECT = PROJECT })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.equal(3, result.exit_code)
    assert.are.equal('out\n', result.stdout)
    assert.are.equal('err\n', result.stderr)
    assert.are.equal('hello from the SDK\n', result.file)
    assert.are.equal('hello from the SDK\n', result.cat)
    assert.is_true(result.missing_is_null)
    assert.is_true(result.listed)
    assert.are.equal(143, result.killed_exit)   -- SIGTERM, the SDK's default
    assert.are.equal(137, result.parent_exit)
    assert.are.equal('alive\n', result.child_after_kill)   -- the kill reached the command's process only
    assert.are.equal('later\n', result.detached_stdout)
    -- a snapshot stops its session; a sandbox made from it has its files; deleted, it starts none
    assert.truthy(result.snapshot.id:match('^snap_'), result.snapshot.id)
    assert.are.equal('created', result.snapshot.status)
    assert.is_true(result.snapshot.size > 0)
    assert.are.equal(86400000, result.snapshot.expires)
    assert.are.equal('stopped', result.session_after_snapshot)
    assert.are.equal('kept by the snapshot', result.fork_file)
    assert.are.equal('created', result.got_status)
    assert.are.equal('deleted', result.deleted_status)
    assert.are.same({ 410, 'snapshot_not_found' }, result.from_deleted)
    assert.are.equal('deleted', state.snapshots[result.snapshot.id].status)
    assert.are.equal('stopped', result.status)
    -- what the SDK sent: a gzip'd tar of the file, the team on every call
    local writes = svc:calls('POST', '/api/v2/sandboxes/sessions/{sid}/fs/write')
    assert.are.equal('application/gzip', writes[#writes].headers['content-type'])
    for _, req in ipairs(svc.requests) do assert.are.equal(TEAM, req.query.teamId) end
    -- the stop ended the local sandbox behind it
    assert.are.equal(before, backing.pool:count())
  end)

  it('stops a command\'s tree at its timeout and a cancel by mayura\'s own kill: the stand-in, as the '
    .. 'service, signals the command\'s own process only', function()
    local function alive(pid)
      return sb:exec({ 'sh', '-c', 'grep -q "^State:.*Z" /proc/' .. pid .. '/status 2>/dev/null && exit 1; kill -0 '
        .. pid .. ' 2>/dev/null' }).exit_code == 0
    end
    local function signalled(pid)
      for _, x in ipairs(state.signalled) do if x.pid == pid then return true end end
      return false
    end
    local r = sb:exec({ 'sh', '-c', 'sleep 53 >/dev/null 2>&1 & echo $! > bg3.pid; sleep 30' }, { timeout_ms = 500 })
    assert.is_true(r.timed_out)
    local child = assert(tonumber(sb:read_file('bg3.pid')))
    assert.is_false(signalled(child))
    assert.is_false(alive(child))
    local token = require('mayura._task').cancel_token()
    require('mayura._task').after(300, function() token:cancel() end)
    assert.raises_code('CANCELLED', sb.exec, sb, { 'sh', '-c', 'sleep 54 >/dev/null 2>&1 & echo $! > bg4.pid; sleep 30' },
      { signal = token })
    child = assert(tonumber(sb:read_file('bg4.pid')))
    assert.is_false(signalled(child))
    assert.is_false(alive(child))
  end)

  describe('stops a command whole', function()
    stop_cases.describe(function() return sb end)
  end)

  describe('passes the conformance suite through the mayura provider', function()
    for _, case in ipairs(testing.sandbox_conformance) do
      local name = case.name
      if name:find('standard input', 1, true) then
        -- features.stdin is false: the case checks that the pool refuses stdin
        name = name .. ' (refused: features.stdin = false)'
      end
      it(name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
  end)

  it('refuses stdin, and ports below 1024 or past 15, before any call', function()
    local n = #svc.requests
    assert.raises_code('INVALID_INPUT', sb.exec, sb, { 'cat' }, { stdin = 'x' })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = { 80 } })
    local many = {}
    for i = 1, 16 do many[i] = 3000 + i end
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, network = 'all', ports = many })
    assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 60000, cpus = 9 })
    assert.are.equal(n, #svc.requests)
    assert.are.equal(1, pool:count())
  end)

  it('sends the lifetime in ms, labels as tags, the network as a policy, and cpus as vCPUs', function()
    local other = pool:create({ lifetime_ms = 90500, labels = { owner = 'spec' }, network = { allow = { '.example.com',
      'api.example.org' } }, memory_mib = 3000, env = { A = 'b' } })
    local creates = svc:calls('POST', '/api/v3/sandboxes')
    local body = creates[#creates].json
    assert.are.equal(90500, body.timeout)
    assert.are.same({ suite = 'c', owner = 'spec' }, body.tags)
    assert.are.same({ allow = { '*.example.com', 'api.example.org' } }, body.networkPolicy)
    assert.are.same({ vcpus = 2 }, body.resources)
    assert.are.same({ A = 'b' }, body.env)
    assert.are.equal(false, body.persistent)
    assert.are.equal(PROJECT, body.projectId)
    assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
    other:release()
    assert.is_nil(state.sandboxes[other.id])

    local offline = pool:create({ lifetime_ms = 60000 })
    creates = svc:calls('POST', '/api/v3/sandboxes')
    assert.are.same({ mode = 'deny-all' }, creates[#creates].json.networkPolicy)
    offline:release()
  end)

  local function own_pool(extra)
    local o = { max_sandboxes = 2, max_lifetime_ms = 600000 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return sandbox.create_sandboxes(vercel.vercel_sandboxes({ token = TOKEN, team_id = TEAM, project_id = PROJECT,
      base_url = svc:url('/api'), workdir = '/workspace', retry_base_ms = 20, retries = 0 }), o)
  end

  local function last(method, pattern)
    local calls = svc:calls(method, pattern)
    return calls[#calls]
  end

  it('snapshots natively: the service\'s snapshot ends the sandbox, a create from it has exactly its files, '
    .. 'release deletes it on the service', function()
    local pl = own_pool({ max_snapshots = 2 })
    local other = own_pool()
    local ok, err = pcall(function()
      local base = pl:create({ lifetime_ms = 120000 })
      assert.are.equal('native', base.features.snapshots)
      assert.are.equal(0, base:exec({ 'sh', '-c', suite.SNAPSHOT_FILES }).exit_code)
      local before = suite.listing(base)
      local snap = base:snapshot()
      local native = snap._held.native.id
      local sn = state.snapshots[native]
      assert.are.equal('created', sn.status)
      assert.are.equal(86400000, last('POST', '/api/v2/sandboxes/sessions/{sid}/snapshot').json.expiration)
      -- the size is the service's
      assert.is_true(sn.sizeBytes > 0)
      assert.are.equal(sn.sizeBytes, snap.size_bytes)
      assert.are.same({ 1, sn.sizeBytes }, { pl:snapshots() })
      -- the service stopped the session to make it: the sandbox is gone
      local e = assert.raises_code('SANDBOX_ERROR', base.exec, base, { 'true' })
      assert.are.equal('gone', e.reason)
      base:release()
      local fork = pl:create({ lifetime_ms = 120000, snapshot = snap })
      local body = last('POST', '/api/v3/sandboxes').json
      assert.are.same({ type = 'snapshot', snapshotId = native }, body.source)
      assert.is_nil(body.image)
      suite.same_files(before, fork)
      -- another pool's create, or one with an image too, is refused before any call
      suite.snapshot_refusals(pl, other, snap, function() return #svc:calls('POST', '/api/v3/sandboxes') end)
      fork:release()
      snap:release()
      assert.are.equal('deleted', sn.status, 'release deleted the snapshot on the service')
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      assert.raises_code('INVALID_INPUT', pl.create, pl, { lifetime_ms = 60000, snapshot = snap })
      -- close() deletes what the pool still holds
      local kept_sb = pl:create({ lifetime_ms = 120000 })
      local kept = kept_sb:snapshot()
      local kept_sn = state.snapshots[kept._held.native.id]
      assert.are.equal('created', kept_sn.status)
      pl:close()
      assert.are.equal('deleted', kept_sn.status)
    end)
    pl:close()
    other:close()
    if not ok then error(err, 0) end
  end)

  it('counts a snapshot at the service\'s size, and a failed snapshot call leaves none', function()
    local pl = own_pool({ max_snapshot_bytes = 1024 })
    local ok, err = pcall(function()
      local function live()
        local n = 0
        for _, sn in pairs(state.snapshots) do if sn.status == 'created' then n = n + 1 end end
        return n
      end
      local before = live()
      -- larger than max_snapshot_bytes leaves room for: deleted on the service
      local big = pl:create({ lifetime_ms = 120000 })
      big:write_file('big.bin', string.rep('x', 4096))
      assert.raises_code('LIMIT_EXCEEDED', big.snapshot, big)
      assert.are.equal(before, live())
      big:release()
      -- the service fails it
      local a = pl:create({ lifetime_ms = 120000 })
      svc:fault('POST', '/api/v2/sandboxes/sessions/{sid}/snapshot', stand_in.status(500), 1)
      local e = assert.raises_code('SANDBOX_ERROR', a.snapshot, a)
      assert.are.equal('unavailable', e.reason)
      assert.are.equal(before, live())
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      a:release()
      -- the service made it, but its answer was lost: the provider finds it by the session and deletes it
      local b = pl:create({ lifetime_ms = 120000 })
      state.snapshot_answer = { status = 503, json = { error = { code = 'unavailable', message = 'later' } } }
      e = assert.raises_code('SANDBOX_ERROR', b.snapshot, b)
      state.snapshot_answer = nil
      assert.are.equal('unavailable', e.reason)
      assert.are.equal(before, live(), 'the snapshot of the lost answer was left on the service')
      assert.are.same({ 0, 0 }, { pl:snapshots() })
      b:release()
    end)
    state.snapshot_answer = nil
    svc:clear()
    pl:close()
    if not ok then error(err, 0) end
  end)

  it('serves a port at the URL of its route, with network all', function()
    local web = pool:create({ lifetime_ms = 120000, network = 'all', ports = { 8080 } })
    local creates = svc:calls('POST', '/api/v3/sandboxes')
    assert.are.same({ mode = 'allow-all' }, creates[#creates].json.networkPolicy)
    assert.are.same({ 8080 }, creates[#creates].json.ports)
    web:write_file('index.html', 'served from the sandbox\n')
    web:exec({ 'sh', '-c', 'setsid nohup node -e "require(\'http\').createServer((q, s) => s.end(require(\'fs\')'
      .. '.readFileSync(\'index.html\'))).listen(8080)" >/dev/null 2>&1 </dev/null &' })
    local url = web:url(8080)
    assert.truthy(url:match('^http://127%.0%.0%.1:%d+'), url)
    local body = util.eventually(function()
      local ok, res = pcall(http.request, { url = url .. '/', timeout_ms = 2000 })
      return ok and res.status == 200 and res.body
    end, 10000)
    assert.are.equal('served from the sandbox\n', body)
    web:release()
  end)
end)
