-- mayura.sandbox.modal when the service misbehaves, on the Modal stand-in (spec/npm/modal_stand_in.mjs,
-- gRPC over bubblewrap containers, faults from its control port): a refused token (control plane
-- and command service), a sandbox ended behind the pool's back, RESOURCE_EXHAUSTED and UNAVAILABLE,
-- a command that never answers, a create that never answers, an auth token that ends, a service
-- that is not there. Each
-- ends as a SandboxError with the right reason and none of the service's text or the token.
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local modal = require('mayura.sandbox.modal')
local grpc = require('mayura.sandbox._grpc')
local faults = require('support.fault_checks')
local util = require('support.util')
local modal_stand_in = require('support.modal_stand_in')

local TOKEN_ID = 'ak-fault0123456789ID'
local TOKEN_SECRET = 'as-fault0123456789abcdefSECRET'
local CREATE = { lifetime_ms = 60000, network = 'none' }
-- the stand-in's own words in its statuses, which must never reach an error
local check = faults.checker({ TOKEN_SECRET, 'as-WRONG' }, { 'is not valid', 'not found', 'fault',
  'invalid router token', 'has finished' })

describe('the Modal provider when the service misbehaves', function()
  local stand

  setup(function()
    if modal_stand_in.available() then
      stand = modal_stand_in.start({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET })
    end
  end)
  teardown(function()
    if stand then stand:stop() end
  end)

  local function ready()
    if not stand then
      pending('@grpc/grpc-js is not installed (sh scripts/setup.sh installs spec/npm)')
      return false
    end
    return true
  end

  local function make_pool(extra, pool_options)
    local o = { token_id = TOKEN_ID, token_secret = TOKEN_SECRET, server_url = stand.url, retry_base_ms = 20 }
    for k, v in pairs(extra or {}) do o[k] = v end
    local p = { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'none', 'all' } }
    for k, v in pairs(pool_options or {}) do p[k] = v end
    return sandbox.create_sandboxes(modal.modal_sandboxes(o), p)
  end

  local function open(extra, pool_options)
    local pool = make_pool(extra, pool_options)
    return pool, pool:create(CREATE)
  end

  it('a wrong token is authentication at create, and nothing is made; so is a refused command service', function()
    if not ready() then return end
    local n = #stand:sandboxes()
    local pool = make_pool({ token_secret = 'as-WRONG-secret-0123' })
    check('authentication', pool.create, pool, CREATE)
    assert.are.equal(0, pool:count())
    assert.are.equal(n, #stand:sandboxes())
    pool:close()
    -- the command service refuses the JWT twice: once is taken for an expired JWT (a new one is
    -- asked for), twice is authentication
    local p2, sb = open()
    local asked = #stand:calls('SandboxGetCommandRouterAccess')
    stand:fault({ method = 'TaskExecStart', code = 16, count = 2, details = 'invalid router token' })
    check('authentication', sb.exec, sb, { 'true' })
    assert.are.equal(asked + 1, #stand:calls('SandboxGetCommandRouterAccess'))
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    p2:close()
  end)

  it('a sandbox ended behind the pool\'s back is gone for every call', function()
    if not ready() then return end
    local pool, sb = open()
    sb:write_file('x.txt', 'x')
    local c = grpc.client({ label = 'modal', base_url = stand.url,
      metadata = { ['x-modal-token-id'] = TOKEN_ID, ['x-modal-token-secret'] = TOKEN_SECRET } })
    c:call('/modal.client.ModalClient/SandboxTerminateV2', { sandbox_id = (sb._backend.id:gsub('^modal%-', '')) })
    for _, call in ipairs(faults.file_calls(sb)) do check('gone', call) end
    sb:release()
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('RESOURCE_EXHAUSTED is rate_limited at once; UNAVAILABLE is tried again and goes on', function()
    if not ready() then return end
    local pool, sb = open()
    stand:fault({ method = 'TaskExecStart', code = 8, count = 1 })
    local t0 = core.hrtime_ms()
    check('rate_limited', sb.exec, sb, { 'true' })
    assert.is_true(core.hrtime_ms() - t0 < 1000)   -- not waited out: gRPC's status names no wait
    stand:fault({ method = 'TaskExecStart', code = 14, count = 1 })
    assert.are.equal('after\n', sb:exec({ 'echo', 'after' }).stdout)
    -- unavailable past the retries: unavailable, and the sandbox goes on
    stand:fault({ method = 'TaskExecStart', code = 14, count = 3 })   -- the first try and two more
    check('unavailable', sb.exec, sb, { 'true' })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a command whose wait never answers is timeout within the call timeout, and the sandbox goes on', function()
    if not ready() then return end
    local pool, sb = open(nil, { call_timeout_ms = 1500 })
    stand:fault({ method = 'TaskExecWait', code = 0, delay_ms = 20000, count = 1 })
    local t0 = core.hrtime_ms()
    check('timeout', sb.exec, sb, { 'echo', 'lost' })
    assert.is_true(core.hrtime_ms() - t0 < 10000)
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    pool:close()
  end)

  it('a create that never answers ends at the call timeout; the sandbox made late is found and ended', function()
    if not ready() then return end
    local pool = make_pool(nil, { call_timeout_ms = 800 })
    stand:fault({ method = 'SandboxCreateV2', code = 0, delay_ms = 3000, count = 1 })
    check('timeout', pool.create, pool, CREATE)
    assert.is_truthy(util.eventually(function() return pool:count() == 0 end, 3000))
    -- the stand-in, as Modal, still makes it: the provider looks for it by its name and ends it
    local creates = stand:calls('SandboxCreateV2')
    local name = creates[#creates].request.definition.name
    assert.truthy(name:match('^mayura%-%x+$'), name)
    local function lost()
      for _, s in ipairs(stand:sandboxes()) do
        if s.definition.name == name then return s end
      end
    end
    assert.is_truthy(util.eventually(function() return lost() ~= nil and lost().state == 'ended' end, 10000))
    assert.is_true(#stand:calls('SandboxGetFromNameV2') > 0)
    pool:close()
    local p2 = make_pool()
    local sb = p2:create(CREATE)
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    p2:close()
  end)

  it('an auth token that ends is fetched again: a sandbox outlives its first one and is released', function()
    if not ready() then return end
    stand:config({ auth_token_ttl_s = 3 })
    local pool, sb = open()
    local fetched = #stand:calls('AuthTokenGet')
    require('mayura._task').sleep(4000)   -- the first token has ended: the stand-in refuses it
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    local id = sb._backend.id:gsub('^modal%-', '')
    sb:release()
    stand:config({ auth_token_ttl_s = 3600 })
    assert.is_true(#stand:calls('AuthTokenGet') > fetched)
    for _, s in ipairs(stand:sandboxes()) do
      if s.id == id then assert.are.equal('ended', s.state) end
    end
    local terms = stand:calls('SandboxTerminateV2')
    assert.are_not.equal(stand:calls('SandboxCreateV2')[1].metadata['x-modal-auth-token'],
      terms[#terms].metadata['x-modal-auth-token'])
    pool:close()
  end)

  it('a service that is not there is unavailable, and no token shows', function()
    if not ready() then return end
    local pool = make_pool({ server_url = 'http://127.0.0.1:9', retries = 1 })
    check('unavailable', pool.create, pool, CREATE)
    pool:close()
  end)
end)
