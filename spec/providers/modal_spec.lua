-- mayura.sandbox.modal against the Modal stand-in (spec/npm/modal_stand_in.mjs: Modal's gRPC
-- services, from the project's proto/modal, over bubblewrap containers): first the wire (a unary
-- call, a server stream and a status in the trailers through core.http's HTTP/2 and
-- mayura.sandbox._grpc), then the official `modal` SDK, unchanged, against the stand-in, then the
-- conformance suite through the mayura provider against the same stand-in, then what the provider
-- sends for each option.
local core = require('mayura.core')
local errors = require('mayura.errors')
local sandbox = require('mayura.sandbox')
local modal = require('mayura.sandbox.modal')
local grpc = require('mayura.sandbox._grpc')
local suite = require('support.stand_in_suite')
local modal_stand_in = require('support.modal_stand_in')

local TOKEN_ID = 'ak-0123456789abcdefID'
local TOKEN_SECRET = 'as-0123456789abcdefSECRET'
local API = '/modal.client.ModalClient/'
local SDK_SCRIPT = 'spec/npm/modal_sdk.mjs'

describe('modal_sandboxes options', function()
  it('needs a token id and secret, and never shows them', function()
    local f = modal.modal_sandboxes
    assert.raises_code('INVALID_CONFIG', f, 'not a table')
    assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID })
    assert.raises_code('INVALID_CONFIG', f, { token_secret = TOKEN_SECRET })
    assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID, token_secret = TOKEN_SECRET, app_name = 'a/b' })
    assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID, token_secret = TOKEN_SECRET, server_url = 'ftp://x' })
    assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID, token_secret = TOKEN_SECRET, workdir = 'rel' })
    assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID, token_secret = TOKEN_SECRET, image = 'a b' })
    assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID, token_secret = TOKEN_SECRET, nope = 1 })
    local err = assert.raises_code('INVALID_CONFIG', f, { token_id = TOKEN_ID, token_secret = TOKEN_SECRET .. ' x' })
    assert.is_falsy(tostring(err):find(TOKEN_SECRET, 1, true))
    local p = f({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET })
    assert.are.same({ stdin = true, ports = true, desktop = false, network = { 'none', 'all', 'allowlist' },
      snapshots = 'native' }, p.features)
    assert.are.equal('/workspace', p.workdir)
    assert.are.equal(24 * 3600000, p.max_lifetime_ms)
  end)
end)

describe('core.proto', function()
  it('turns a request into Modal\'s bytes and back, and refuses what the message does not have', function()
    local m = API .. 'SandboxCreateV2'
    local bytes = core.proto.encode(m, 'request', { app_id = 'ap-1', definition = { timeout_secs = 60,
      entrypoint_args = { 'sleep', '60' }, network_access = { network_access_type = 2 } },
      tags = { { tag_name = 'a', tag_value = 'b' } } })
    -- field 1 (app_id) is the first thing on the wire: tag 0x0a, length 4
    assert.are.equal('\10\4ap-1', bytes:sub(1, 6))
    local back = core.proto.decode(m, 'request', bytes)
    assert.are.equal(60, back.definition.timeout_secs)
    assert.are.same({ 'sleep', '60' }, back.definition.entrypoint_args)
    assert.are.equal('b', back.tags[1].tag_value)
    assert.raises_code('INVALID_INPUT', core.proto.encode, m, 'request', { app = 'x' })
    assert.raises_code('INVALID_INPUT', core.proto.encode, m, 'request', { app_id = 5 })
    assert.raises_code('INVALID_INPUT', core.proto.encode, m, 'request', { app_id = 'a\0b' })
    assert.raises_code('INVALID_INPUT', core.proto.encode, '/no.Such/Method', 'request', {})
    local v, err = core.proto.decode(m, 'response', '\255\255\255')
    assert.is_nil(v)
    assert.are.equal('INVALID_OUTPUT', err.code)
    -- a oneof member that is 0 is still sent, and read back
    local wait = '/modal.task_command_router.TaskCommandRouter/TaskExecWait'
    assert.are.equal(0, core.proto.decode(wait, 'response', core.proto.encode(wait, 'response', { code = 0 })).code)
    assert.is_nil(core.proto.decode(wait, 'response', '').code)
  end)
end)

describe('proto/modal', function()
  it('has every field and method as the official SDK\'s own generated code has them', function()
    if not suite.npm_installed('modal', 'the modal SDK') then return end
    local r = suite.node('spec/npm/modal_proto_check.mjs', {})
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
    assert.are.same({}, result.mismatches)
    assert.is_true(result.messages >= 60 and result.fields >= 140 and result.methods >= 25, r.stdout)
  end)
end)

suite.describe('the Modal stand-in, over bubblewrap containers', function()
  local stand, pool, sb

  setup(function()
    if not modal_stand_in.available() then return end
    stand = modal_stand_in.start({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET })
  end)
  teardown(function()
    if pool then pool:close() end
    if stand then stand:stop() end
  end)

  local function needs_stand_in()
    if not stand then
      pending('@grpc/grpc-js is not installed (sh scripts/setup.sh installs spec/npm)')
      return false
    end
    return true
  end

  it('answers a unary call over HTTP/2 with its status in the trailers, and a stream to its end', function()
    if not needs_stand_in() then return end
    local c = grpc.client({ label = 'modal', base_url = stand.url, secrets = { TOKEN_SECRET },
      metadata = { ['x-modal-token-id'] = TOKEN_ID, ['x-modal-token-secret'] = TOKEN_SECRET } })
    local app = c:call(API .. 'AppGetOrCreate', { app_name = 'wire', object_creation_type = 1 })
    assert.truthy(app.app_id:match('^ap%-'))
    assert.are.equal(app.app_id, c:call(API .. 'AppGetOrCreate', { app_name = 'wire' }).app_id)
    local img = c:call(API .. 'ImageGetOrCreate', { app_id = app.app_id, image = { dockerfile_commands = { 'FROM alpine' } } })
    local items = c:call(API .. 'ImageJoinStreaming', { image_id = img.image_id }, { stream = true })
    assert.are.equal(1, #items)
    assert.are.equal(1, items[1].result.status)
    -- a status that is not OK: the code's reason, not the service's words
    local err = assert.raises_code('SANDBOX_ERROR', c.call, c, API .. 'AppGetOrCreate', { app_name = 'missing' })
    assert.are.equal('not_found', err.reason)
    assert.are.equal(5, err.grpc_status)
    assert.is_falsy(err.message:find('missing', 1, true))
    err = assert.raises_code('SANDBOX_ERROR', c.call, c, API .. 'SandboxWaitV2', { sandbox_id = 'sb-none' }, { gone = true })
    assert.are.equal('gone', err.reason)
    -- a wrong secret: authentication, and the secret in no message (the stand-in's text names the id)
    local bad = grpc.client({ label = 'modal', base_url = stand.url, secrets = { 'as-wrong-secret' },
      metadata = { ['x-modal-token-id'] = TOKEN_ID, ['x-modal-token-secret'] = 'as-wrong-secret' } })
    err = assert.raises_code('SANDBOX_ERROR', bad.call, bad, API .. 'AppGetOrCreate', { app_name = 'wire' })
    assert.are.equal('authentication', err.reason)
    assert.is_falsy(tostring(err):find('as-wrong-secret', 1, true))
    assert.is_falsy(tostring(err):find(TOKEN_ID, 1, true))
    -- UNAVAILABLE is tried again; RESOURCE_EXHAUSTED is rate_limited at once
    stand:fault({ method = 'AppGetOrCreate', code = 14, count = 1 })
    local before = #stand:calls('AppGetOrCreate')
    assert.are.equal(app.app_id, c:call(API .. 'AppGetOrCreate', { app_name = 'wire' }).app_id)
    assert.are.equal(before + 2, #stand:calls('AppGetOrCreate'))
    stand:fault({ method = 'AppGetOrCreate', code = 8, count = 1 })
    err = assert.raises_code('SANDBOX_ERROR', c.call, c, API .. 'AppGetOrCreate', { app_name = 'wire' })
    assert.are.equal('rate_limited', err.reason)
    -- the deadline goes as grpc-timeout, and a call past it is a timeout
    stand:fault({ method = 'AppGetOrCreate', code = 0, delay_ms = 3000, count = 1 })
    local t0 = core.hrtime_ms()
    err = assert.raises_code('SANDBOX_ERROR', c.call, c, API .. 'AppGetOrCreate', { app_name = 'wire' },
      { timeout_ms = 500 })
    assert.are.equal('timeout', err.reason)
    assert.is_true(core.hrtime_ms() - t0 < 2500)
    local last = stand:calls('AppGetOrCreate')
    assert.is_true(last[#last].deadline_ms ~= core.json.null and last[#last].deadline_ms <= 500)
  end)

  -- The SDK's whole course, by the sandbox API it is told to take (`MODAL_SANDBOX_V2`: the second,
  -- its default, or the first), each with the calls of that API.
  for _, api in ipairs({ { v2 = 'true', create = 'SandboxCreateV2', access = 'SandboxGetCommandRouterAccess' },
    { v2 = 'false', create = 'SandboxCreate', access = 'TaskGetCommandRouterAccess' } }) do
    it('is what the official SDK (modal 0.11.1) drives unchanged, MODAL_SANDBOX_V2=' .. api.v2, function()
      if not needs_stand_in() then return end
      if not suite.npm_installed('modal', 'the modal SDK') then return end
      local creates, accesses = #stand:calls(api.create), #stand:calls(api.access)
      local r = suite.node(SDK_SCRIPT, { MODAL_SERVER_URL = stand.url, MODAL_TOKEN_ID = TOKEN_ID,
        MODAL_TOKEN_SECRET = TOKEN_SECRET, MODAL_CONFIG_PATH = '/nonexistent/.modal.toml',
        NODE_EXTRA_CA_CERTS = stand.cert, MODAL_SANDBOX_V2 = api.v2 }, 120000)
      assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
      local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
      assert.is_nil(result.error, result.error)
      assert.truthy(result.app_id:match('^ap%-'))
      assert.are.equal('made with it\n', result.create_env)
      assert.are.equal('out hi /work\n', result.stdout)
      assert.are.equal('err\n', result.stderr)
      assert.are.equal(3, result.exit_code)
      assert.are.equal('from env\na b|c|', result.argv_stdout)
      assert.are.equal('data\n65534\n', result.file)
      assert.truthy(result.tunnel_url:match('^https://127%.0%.0%.1:%d+$'), result.tunnel_url)
      assert.are.equal('tunnel-ok\n', result.tunnel_page)
      -- its filesystem API: commands of the sandbox's fs tool, standard input streamed
      assert.are.equal('hello files\n', result.fs_text)
      assert.are.same({ 0, 1, 2, 255 }, result.fs_bytes)
      assert.are.same({ 'a.txt:file:12', 'b.bin:file:4' }, result.fs_list)
      assert.are.equal('directory', result.fs_stat)
      assert.are.equal('SandboxFilesystemNotFoundError', result.fs_missing)
      assert.are.equal('SandboxFilesystemDirectoryNotEmptyError', result.fs_not_empty)
      assert.are.same({ 'f.txt', 'page.txt', 'sub' }, result.fs_after)
      assert.is_true(#stand:calls('TaskExecStdinWriteStream') >= 2)
      assert.are.equal(137, result.timeout_exit)        -- killed at its 1 s timeout
      assert.is_true(result.timeout_took_ms < 5000)
      assert.are.equal(137, result.terminated_exit)     -- Modal's code for a terminated sandbox
      assert.are.equal('ClientError', result.exec_after_terminate)
      assert.are.equal('ClientError 16', result.wrong_token)
      -- a snapshot: an image a new sandbox starts from with the files of its time; deleted, none starts
      assert.truthy(result.snapshot_image:match('^im%-'), result.snapshot_image)
      assert.are.equal('kept by the snapshot\n', result.fork_file)
      assert.are.equal('t', result.fork_tmp)
      assert.are.equal('changed after it\n', result.source_file)
      assert.are.equal('NotFoundError', result.deleted_again)
      assert.are.equal('ClientError', result.from_deleted)
      local snap_call = stand:calls('TaskSnapshotFilesystem')[1]
      assert.truthy(snap_call.metadata.authorization:match('^Bearer '))
      assert.are.equal(30 * 24 * 3600, snap_call.request.ttl_seconds)   -- the SDK's default
      assert.are.same({}, stand:snapshots())
      -- the SDK's own calls: the create of that API, the router's exec, the auth token on control calls
      assert.are.equal(creates + 3, #stand:calls(api.create))
      if api.v2 == 'false' then assert.are.equal(accesses + 2, #stand:calls(api.access)) end
      local starts = stand:calls('TaskExecStart')
      assert.truthy(starts[#starts].metadata.authorization:match('^Bearer '))
      for _, s in ipairs(stand:sandboxes()) do
        if s.id == result.sandbox_id then assert.are.equal('ended', s.state) end
      end
    end)
  end

  describe('through the mayura provider', function()
    setup(function()
      if not stand then return end
      pool = sandbox.create_sandboxes(modal.modal_sandboxes({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET,
        server_url = stand.url, retry_base_ms = 20 }), { max_sandboxes = 3, max_lifetime_ms = 600000,
        network = { 'none', 'all' } })
      sb = pool:create({ lifetime_ms = 600000, network = 'none' })
    end)

    suite.conformance(function() return sb end)

    it('creates with the lifetime as timeout, labels as tags, resources, env and the network', function()
      if not needs_stand_in() then return end
      local other = pool:create({ lifetime_ms = 90500, network = 'all', env = { A = 'b' }, cpus = 1.5,
        memory_mib = 1000, labels = { team = 'x' } })
      local creates = stand:calls('SandboxCreateV2')
      local req = creates[#creates].request
      assert.are.equal(91, req.definition.timeout_secs)
      assert.are.same({ 'sleep', '91' }, req.definition.entrypoint_args)
      assert.are.equal('/workspace', req.definition.workdir)
      assert.are.equal(1500, req.definition.resources.milli_cpu)
      assert.are.equal(1000, req.definition.resources.memory_mb)
      assert.are.equal(1, req.definition.network_access.network_access_type)
      assert.is_false(req.definition.block_network)
      assert.are.same({ { tag_name = 'team', tag_value = 'x' } }, req.tags)
      assert.are.same({ A = 'b' }, req.secret_sources[1].env.contents)
      assert.are.equal('b\n', other:exec({ 'sh', '-c', 'echo $A' }).stdout)
      local meta = creates[#creates].metadata
      assert.are.equal(TOKEN_ID, meta['x-modal-token-id'])
      assert.truthy(meta['x-modal-auth-token'])
      -- the blocked sandbox asked for BLOCKED
      local first = creates[1].request
      for _, c in ipairs(creates) do if c.request.definition.block_network then first = c.request end end
      assert.is_true(first.definition.block_network)
      assert.are.equal(2, first.definition.network_access.network_access_type)
      local id = other._backend.id:gsub('^modal%-', '')
      other:release()
      for _, s in ipairs(stand:sandboxes()) do
        if s.id == id then assert.are.equal('ended', s.state) end
      end
    end)

    it('serves a port as its tunnel\'s https URL, with the network blocked or open', function()
      if not needs_stand_in() then return end
      for _, network in ipairs({ 'none', 'all' }) do
        local other = pool:create({ lifetime_ms = 60000, network = network, ports = { 8000 } })
        local url = other:url(8000)
        assert.truthy(url:match('^https://127%.0%.0%.1:%d+$'), url)
        other:write_file('page.txt', 'through ' .. network .. '\n')
        other:exec({ 'sh', '-c', 'setsid busybox httpd -p 127.0.0.1:8000 -h /workspace' })
        local page
        for _ = 1, 50 do
          local r = require('mayura.process').run({ 'curl', '-sS', '--cacert', stand.cert, url .. '/page.txt' },
            { timeout_ms = 5000 })
          if r.exit_code == 0 then page = r.stdout break end
          require('mayura._task').sleep(100)
        end
        assert.are.equal('through ' .. network .. '\n', page)
        assert.raises_code('INVALID_INPUT', other.url, other, 9000)
        other:release()
      end
    end)

    it('asks for a domain allow-list as ALLOWLIST; the stand-in lets nothing out', function()
      if not needs_stand_in() then return end
      local p = sandbox.create_sandboxes(modal.modal_sandboxes({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET,
        server_url = stand.url }), { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'allowlist' } })
      local other = p:create({ lifetime_ms = 60000, network = { allow = { 'example.com', '.modal.com' } } })
      local creates = stand:calls('SandboxCreateV2')
      local na = creates[#creates].request.definition.network_access
      assert.are.equal(3, na.network_access_type)
      assert.are.same({ 'example.com', '.modal.com' }, na.allowed_domains)
      -- the stand-in's own port is not reachable from in there
      local port = stand.url:match(':(%d+)$')
      local r = other:exec({ 'sh', '-c', 'busybox nc -w 2 127.0.0.1 ' .. port .. ' </dev/null; echo $?' })
      assert.are.equal('1\n', r.stdout)   -- refused: nothing of the host's is there
      other:release()
      p:close()
    end)

    local function own_pool(extra)
      local o = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'none', 'all' } }
      for k, v in pairs(extra or {}) do o[k] = v end
      return sandbox.create_sandboxes(modal.modal_sandboxes({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET,
        server_url = stand.url, retry_base_ms = 20 }), o)
    end

    it('snapshots natively: a create from one has exactly its files, release deletes it on the service', function()
      if not needs_stand_in() then return end
      local pl = own_pool({ max_snapshots = 2 })
      local other = own_pool()
      local ok, err = pcall(function()
        local base = pl:create({ lifetime_ms = 120000, network = 'none' })
        assert.are.equal('native', base.features.snapshots)
        assert.are.equal(0, base:exec({ 'sh', '-c', suite.SNAPSHOT_FILES }).exit_code)
        local before = suite.listing(base)
        local snap = base:snapshot()
        local image = snap._held.native.id
        assert.are.same({ image }, stand:snapshots())
        local call = stand:calls('TaskSnapshotFilesystem')
        call = call[#call]
        assert.are.equal(86400, call.request.ttl_seconds)
        assert.truthy(call.metadata.authorization:match('^Bearer '))
        assert.are.equal(0, snap.size_bytes)   -- Modal says no size
        -- the sandbox runs on; what it changes later is not in the snapshot
        base:write_file('s/a.txt', 'two')
        local fork = pl:create({ lifetime_ms = 120000, network = 'none', snapshot = snap })
        local creates = stand:calls('SandboxCreateV2')
        assert.are.equal(image, creates[#creates].request.definition.image_id)
        suite.same_files(before, fork)
        assert.truthy(before:find('f 644 tmp/t.txt t', 1, true), before)
        assert.are.equal('two', base:read_file('s/a.txt'))
        -- another pool's create, or one with an image too, is refused before any call
        suite.snapshot_refusals(pl, other, snap, function() return #stand:calls('SandboxCreateV2') end)
        fork:release()
        base:release()
        snap:release()
        assert.are.same({}, stand:snapshots(), 'release deleted the image on the service')
        assert.are.equal(image, stand:calls('ImageDelete')[#stand:calls('ImageDelete')].request.image_id)
        assert.raises_code('INVALID_INPUT', pl.create, pl, { lifetime_ms = 60000, snapshot = snap })
        -- close() deletes what the pool still holds
        local kept = pl:create({ lifetime_ms = 120000, network = 'none' }):snapshot()
        assert.are.same({ kept._held.native.id }, stand:snapshots())
        pl:close()
        assert.are.same({}, stand:snapshots())
      end)
      pl:close()
      other:close()
      if not ok then error(err, 0) end
    end)

    it('a failed snapshot call leaves no snapshot and is a SANDBOX_ERROR; one deleted behind the pool\'s back '
      .. 'makes no sandbox', function()
      if not needs_stand_in() then return end
      local pl = own_pool()
      local ok, err = pcall(function()
        local base = pl:create({ lifetime_ms = 120000, network = 'none' })
        base:write_file('f.txt', 'x')
        stand:fault({ method = 'TaskSnapshotFilesystem', code = 13 })
        local e = assert.raises_code('SANDBOX_ERROR', base.snapshot, base)
        assert.are.equal('failed', e.reason)
        assert.are.same({}, stand:snapshots())
        assert.are.same({ 0, 0 }, { pl:snapshots() })
        assert.are.equal('x', base:read_file('f.txt'))
        local snap = base:snapshot()
        -- deleted on the service behind the pool's back
        local c = grpc.client({ label = 'modal', base_url = stand.url, metadata = {
          ['x-modal-token-id'] = TOKEN_ID, ['x-modal-token-secret'] = TOKEN_SECRET } })
        c:call(API .. 'ImageDelete', { image_id = snap._held.native.id })
        base:release()
        e = assert.raises_code('INVALID_INPUT', pl.create, pl, { lifetime_ms = 60000, network = 'none', snapshot = snap })
        assert.truthy(e.message:find('no longer has the snapshot', 1, true), e.message)
        assert.are.equal(0, pl:count())
      end)
      pl:close()
      if not ok then error(err, 0) end
    end)

    it('makes sandboxes the official SDK reaches by their id, and the other way round', function()
      if not needs_stand_in() then return end
      if not suite.npm_installed('modal', 'the modal SDK') then return end
      local other = pool:create({ lifetime_ms = 60000, network = 'none' })
      other:write_file('shared.txt', 'from mayura\n')
      local r = suite.node(SDK_SCRIPT, { MODAL_SERVER_URL = stand.url, MODAL_TOKEN_ID = TOKEN_ID,
        MODAL_TOKEN_SECRET = TOKEN_SECRET, MODAL_CONFIG_PATH = '/nonexistent/.modal.toml',
        MAYURA_SANDBOX_ID = (other._backend.id:gsub('^modal%-', '')), MAYURA_FILE = '/workspace/shared.txt' })
      local result = core.json.decode(r.stdout:match('RESULT (%b{})'))
      assert.is_nil(result.error, result.error)
      assert.are.equal('from mayura\n', result.read)
      assert.are.equal(0, result.read_exit)
      assert.are.equal('from the SDK\n', other:read_file('shared.txt.sdk'))
      other:release()
    end)

    it('speaks gRPC over TLS (HTTP/2 by ALPN) to a server of its own authority, and to no other', function()
      if not needs_stand_in() then return end
      local tls = modal_stand_in.start({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET, tls = true })
      local ok, err = pcall(function()
        assert.truthy(tls.url:match('^https://'))
        local p = sandbox.create_sandboxes(modal.modal_sandboxes({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET,
          server_url = tls.url, ca_file = tls.cert }), { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'none' } })
        local other = p:create({ lifetime_ms = 60000, network = 'none' })
        assert.are.equal('over tls\n', other:exec({ 'echo', 'over tls' }).stdout)
        other:write_file('t.txt', 'tls file')
        assert.are.equal('tls file', other:read_file('t.txt'))
        other:release()
        p:close()
        -- the command service was reached over TLS too (the stand-in serves nothing in the clear)
        assert.is_true(#tls:calls('TaskExecStart') > 0)
        -- without its authority the server is not trusted: nothing is made, no token shows
        local q = sandbox.create_sandboxes(modal.modal_sandboxes({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET,
          server_url = tls.url, retries = 0 }), { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'none' } })
        local e = assert.raises_code('SANDBOX_ERROR', q.create, q, { lifetime_ms = 60000, network = 'none' })
        assert.are.equal('unavailable', e.reason)
        assert.is_falsy(tostring(e):find(TOKEN_SECRET, 1, true))
        assert.are.equal(1, #tls:calls('AuthTokenGet'))   -- the trusted pool's only
        q:close()
      end)
      tls:stop()
      if not ok then error(err, 0) end
    end)

    it('says gone for a sandbox Modal ended, and never shows the token', function()
      if not needs_stand_in() then return end
      local other = pool:create({ lifetime_ms = 60000, network = 'none' })
      local id = other._backend.id:gsub('^modal%-', '')
      local c = grpc.client({ label = 'modal', base_url = stand.url,
        metadata = { ['x-modal-token-id'] = TOKEN_ID, ['x-modal-token-secret'] = TOKEN_SECRET } })
      c:call(API .. 'SandboxTerminateV2', { sandbox_id = id })
      local err = assert.raises_code('SANDBOX_ERROR', other.exec, other, { 'true' })
      assert.are.equal('gone', err.reason)
      assert.is_falsy(tostring(err):find(TOKEN_SECRET, 1, true))
      other:release()
      -- a wrong secret: authentication at create, nothing made
      local bad = sandbox.create_sandboxes(modal.modal_sandboxes({ token_id = TOKEN_ID, token_secret = 'as-wrong-1234',
        server_url = stand.url }), { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'none' } })
      local n = #stand:sandboxes()
      err = assert.raises_code('SANDBOX_ERROR', bad.create, bad, { lifetime_ms = 60000, network = 'none' })
      assert.are.equal('authentication', err.reason)
      assert.is_falsy(tostring(err):find('as-wrong-1234', 1, true))
      assert.are.equal(n, #stand:sandboxes())
      bad:close()
      assert.is_true(errors.is(err))
    end)
  end)
end)
