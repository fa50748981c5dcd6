-- mayura.sandbox.daytona when Daytona misbehaves, on the stand-in (support/daytona_service.lua):
-- a refused key (401), a sandbox that vanished (404, or the toolbox's 401 for a sandbox it cannot
-- find), 429 with Retry-After, an answer cut after the command ran, a cut download, a create
-- slower than the pool's call timeout, a sandbox that fails to start, answers that are not JSON.
-- Every error is a SANDBOX_ERROR with the right reason, in mayura's words: no key and none of the
-- service's text in its message, fields or cause.
local sandbox = require('mayura.sandbox')
local daytona = require('mayura.sandbox.daytona')
local stand_in = require('support.stand_in')
local daytona_service = require('support.daytona_service')
local util = require('support.util')
local hosted = require('mayura.sandbox._hosted')
local faults = require('support.fault_checks')

local KEY = 'dtn_fault_8d2e6a4f0b1c3e5a7d9f'
local WRONG = 'dtn_wrong_1a2b3c4d5e6f7a8b9c0d'
-- phrases of the stand-in's error bodies: none may reach an error
-- (a short plain code such as UNAUTHORIZED may stay, as `provider_code`: the kit's rule)
local SERVICE_TEXT = { 'Invalid credentials', 'not found', 'not accessible', 'try later', 'no capacity',
  'organization' }

-- A SANDBOX_ERROR of `reason` from fn(...), clean of keys and of the service's text.
local sandbox_error = faults.checker({ KEY, WRONG }, SERVICE_TEXT)

describe('mayura.sandbox.daytona when the service fails', function()
  local svc, provider, pool

  -- Deletes a sandbox as someone else would (the console, another client).
  local function delete_behind(id)
    local other = hosted.client({ base_url = svc:url('/api'), api_key = KEY })
    other:json('DELETE', '/sandbox/' .. id)
  end

  setup(function()
    svc = daytona_service.new({ api_key = KEY })
    provider = daytona.daytona_sandboxes({ api_key = KEY, base_url = svc:url('/api'), retry_base_ms = 20 })
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 3, max_lifetime_ms = 600000 })
  end)

  after_each(function()
    svc:clear()
    svc.daytona.api_key = KEY
  end)

  teardown(function()
    pool:close()
    svc:close()
    assert.are.same({}, svc.failures)
  end)

  it('401: a refused key is authentication, and neither key shows, though the service echoes it', function()
    local wrong = sandbox.create_sandboxes(daytona.daytona_sandboxes({ api_key = WRONG, base_url = svc:url('/api') }),
      { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local before = svc.daytona.created
    sandbox_error('authentication', wrong.create, wrong, { lifetime_ms = 60000 })
    assert.are.equal(before, svc.daytona.created)
    wrong:close()
    -- the key revoked while a sandbox runs: its toolbox calls say authentication too
    local sb = pool:create({ lifetime_ms = 60000 })
    svc.daytona.api_key = 'dtn_rotated_000000000000000'
    sandbox_error('authentication', sb.exec, sb, { 'true' })
    sandbox_error('authentication', sb.read_file, sb, 'x')
    svc.daytona.api_key = KEY
    sb:release()
  end)

  it('404 on a vanished sandbox: every call is gone', function()
    local sb = pool:create({ lifetime_ms = 60000, ports = { 8080 } })
    sb:write_file('f.txt', 'x')
    svc:vanish(sb.id)
    sandbox_error('gone', sb.exec, sb, { 'true' })
    sandbox_error('gone', sb.read_file, sb, 'f.txt')
    sandbox_error('gone', sb.write_file, sb, 'f.txt', 'y')
    sandbox_error('gone', sb.list_files, sb, '.')
    sandbox_error('gone', sb.remove_file, sb, 'f.txt')
    sandbox_error('gone', sb.url, sb, 8080)
    sb:release()   -- 404 too: nothing to end, and no error
    svc:clear()
    delete_behind(sb.id)
  end)

  it('a sandbox deleted behind its back (the toolbox answers 401): gone', function()
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    delete_behind(sb.id)
    sandbox_error('gone', sb.exec, sb, { 'true' })
    sandbox_error('gone', sb.read_file, sb, 'x')
    sb:release()
  end)

  it('429: waits the Retry-After it is given, on the control plane and the toolbox', function()
    svc:fault('POST', '/api/sandbox', stand_in.rate_limited(1), 1)
    local sb = pool:create({ lifetime_ms = 60000 })
    local creates = svc:calls('POST', '/api/sandbox')
    local a, b = creates[#creates - 1], creates[#creates]
    assert.is_true(b.at_ms - a.at_ms >= 1000, 'waited ' .. (b.at_ms - a.at_ms) .. ' ms')
    assert.are.equal(1, svc.daytona.count())
    svc:fault('POST', '/toolbox/{id}/process/execute', stand_in.rate_limited(1), 1)
    local r = sb:exec({ 'sh', '-c', 'echo once >> ran.txt; cat ran.txt' })
    assert.are.equal('once\n', r.stdout)
    -- a wait longer than the client takes is not waited: rate_limited, with the wait on it
    svc:fault('POST', '/toolbox/{id}/process/execute', stand_in.rate_limited(120), 1)
    local err = sandbox_error('rate_limited', sb.exec, sb, { 'true' })
    assert.are.equal(120000, err.retry_after_ms)
    sb:release()
  end)

  it('an answer cut after the command ran: the call is made again and the command runs once', function()
    local sb = pool:create({ lifetime_ms = 60000 })
    local before = #svc:calls('POST', '/toolbox/{id}/process/execute')
    svc.daytona.cut_executes = 1
    local r = sb:exec({ 'sh', '-c', 'echo run >> runs.txt; echo out; echo err >&2; exit 4' })
    assert.are.equal(4, r.exit_code)
    assert.are.equal('out\n', r.stdout)
    assert.are.equal('err\n', r.stderr)
    assert.are.equal(2, #svc:calls('POST', '/toolbox/{id}/process/execute') - before)
    assert.are.equal('run\n', sb:read_file('runs.txt'))
    -- a connection reset before the service saw the call: sent again, run once
    svc:fault_next(stand_in.reset())
    r = sb:exec({ 'sh', '-c', 'echo run >> runs.txt' })
    assert.are.equal(0, r.exit_code)
    assert.are.equal('run\nrun\n', sb:read_file('runs.txt'))
    -- a download cut: a GET, tried again
    svc:fault('GET', '/toolbox/{id}/files/download', stand_in.reset(), 1)
    assert.are.equal('run\nrun\n', sb:read_file('runs.txt'))
    -- cut every time: unavailable once the retries are spent
    svc:fault('GET', '/toolbox/{id}/files/download', stand_in.reset())
    sandbox_error('unavailable', sb.read_file, sb, 'runs.txt')
    sb:release()
  end)

  it('a create slower than the call timeout: timeout, and the late sandbox is found and deleted', function()
    local quick = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000,
      call_timeout_ms = 400 })
    svc.daytona.create_delay_ms = 1200
    local before = svc.daytona.created
    sandbox_error('timeout', quick.create, quick, { lifetime_ms = 60000 })
    svc.daytona.create_delay_ms = 0
    -- the service made it all the same; the label of its create finds it, and it is deleted
    assert.truthy(util.eventually(function() return svc.daytona.created > before end, 5000), 'made late')
    assert.truthy(util.eventually(function() return svc.daytona.count() == 0 end, 8000), 'deleted')
    assert.truthy(util.eventually(function() return quick:count() == 0 end, 2000), 'the pool\'s slot is free ' .. quick:count())
    quick:close()
  end)

  it('a sandbox that fails to start: failed, and it is deleted', function()
    svc.daytona.starting_polls, svc.daytona.starting_state = 1, 'error'
    local err = sandbox_error('failed', pool.create, pool, { lifetime_ms = 60000 })
    svc.daytona.starting_polls, svc.daytona.starting_state = 0, 'starting'
    assert.truthy(err.message:find('did not start', 1, true), err.message)
    assert.are.equal(0, svc.daytona.count())
  end)

  it('answers that are not JSON, or not what they should be: failed', function()
    svc:fault('POST', '/api/sandbox', stand_in.malformed(), 1)
    sandbox_error('failed', pool.create, pool, { lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    svc:fault('POST', '/toolbox/{id}/process/execute', stand_in.malformed(), 1)
    sandbox_error('failed', sb.exec, sb, { 'true' })
    svc:fault('POST', '/toolbox/{id}/process/execute', { json = { exitCode = 0, result = 'D 0\nnot base64!\n-\n.\n' } }, 1)
    sandbox_error('failed', sb.exec, sb, { 'true' })
    assert.are.equal('fine\n', sb:exec({ 'echo', 'fine' }).stdout)
    sb:release()
    -- the malformed create left nothing behind either
    assert.truthy(util.eventually(function() return svc.daytona.count() == 0 end, 5000))
  end)

  it('503 from the toolbox while the sandbox runs: retried, then unavailable, not gone', function()
    local sb = pool:create({ lifetime_ms = 60000 })
    svc:fault('POST', '/toolbox/{id}/process/execute', stand_in.status(503), 1)
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    svc:fault('POST', '/toolbox/{id}/process/execute', stand_in.status(503))
    sandbox_error('unavailable', sb.exec, sb, { 'true' })
    svc:clear()
    assert.are.equal('still\n', sb:exec({ 'echo', 'still' }).stdout)
    sb:release()
  end)
end)
