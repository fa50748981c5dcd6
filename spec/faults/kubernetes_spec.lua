-- mayura.sandbox.kubernetes when the API server or the cluster misbehaves, on the API server
-- stand-in (support/kube_service.lua, its Pods real processes in namespaces of their own): a
-- wrong or refused token (401, 403), a Pod deleted or evicted behind the pool (404 on every call
-- after), 409 and 422 on a create, 429 with Retry-After (waited out within the call, or raised
-- with retry_after_ms), a Pod stuck Pending past the create's time, an image that cannot be
-- pulled (ImagePullBackOff) or is not on the node with pulls off (ErrImageNeverPull), the attach
-- stream cut in the middle of a command, and a stalled API server. Each ends as a SANDBOX_ERROR
-- of a clear reason with none of the server's words and no token, and leaves no Pod and no
-- NetworkPolicy of the pool on the stand-in.
local kubernetes = require('mayura.sandbox.kubernetes')
local sandbox = require('mayura.sandbox')
local task = require('mayura._task')
local faults = require('support.fault_checks')
local util = require('support.util')
local pods_rt = require('support.kube_pods')

local TOKEN = 'eyJhbGciOiJSUzI1NiJ9.faultTOKEN0123456789'
local NS = 'sandboxes'
local PODS = '/api/v1/namespaces/{ns}/pods'
local POD = '/api/v1/namespaces/{ns}/pods/{name}'
local POLICIES = '/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies'
local ATTACH = '/api/v1/namespaces/{ns}/pods/{name}/attach'
-- what the server says, which a message must never repeat
local WORDS = { 'SERVER TEXT', 'Too many requests', 'Unauthorized', 'forbidden:', 'admission webhook', 'Evicted',
  'low on resource', 'already exists' }

describe('the Kubernetes provider when the API server or the cluster misbehaves', function()
  if not pods_rt.available() then
    pending('needs root, bubblewrap, nsenter, setpriv and build/mayura-launch')
    return
  end
  local stand_in = require('support.stand_in')
  local kube = require('support.kube_service')
  local check = faults.checker({ TOKEN, 'WRONG' }, WORDS)
  local svc, state
  local pools = {}

  -- A Status as the API server sends it, its message holding the server's words and the token.
  local function status(code, reason, extra)
    return kube.status(code, reason, 'SERVER TEXT for Bearer ' .. TOKEN .. (extra or ''),
      { name = 'x', kind = 'pods', causes = { { message = 'SERVER TEXT ' .. TOKEN } } })
  end

  local function provider(extra)
    local o = { server = state.server, ca_file = state.ca_file, token = TOKEN, namespace = NS, image = 'busybox:1',
      agent_image = 'mayura/agent:1', retry_base_ms = 20, start_timeout_ms = 20000, memory_mib = 64 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return kubernetes.kubernetes_sandboxes(o)
  end

  local function make_pool(extra, pool_extra)
    local p = provider(extra)
    local o = { max_sandboxes = 3, max_lifetime_ms = 600000, network = { 'none', 'all' } }
    for k, v in pairs(pool_extra or {}) do o[k] = v end
    local pool = sandbox.create_sandboxes(p, o)
    pools[#pools + 1] = { pool = pool, provider = p }
    return pool, p
  end

  -- The Pods and NetworkPolicies of provider `p` on the stand-in, and its containers still running.
  local function leftovers(p)
    local out = {}
    for _, plural in ipairs({ 'pods', 'networkpolicies' }) do
      for name, obj in pairs(state.objects[plural][NS] or {}) do
        if obj.metadata.labels and obj.metadata.labels['mayura.io/pool'] == p.pool_id then
          out[#out + 1] = plural .. ' ' .. name
        end
      end
    end
    return out
  end

  -- Nothing of `p` is left on the stand-in (at once, or within `ms` for what ends in the background).
  local function nothing_left(p, ms)
    util.eventually(function() return #leftovers(p) == 0 end, ms or 5000)
    assert.are.same({}, leftovers(p))
  end

  -- Deletes a Pod (or the object `under` a path) through the API at once, as an operator would: the status.
  local function delete_pod(name, under)
    return require('mayura.http').request({ method = 'DELETE', ca_file = state.ca_file, timeout_ms = 10000,
      url = state.server .. (under or ('/api/v1/namespaces/' .. NS .. '/pods/')) .. name .. '?gracePeriodSeconds=0',
      headers = { Authorization = 'Bearer ' .. TOKEN } }).status
  end

  local function pod_of(sb) return state.objects.pods[NS][sb._backend.id] end

  setup(function()
    svc = stand_in.new()
    state = kube.install(svc, nil, { token = TOKEN, namespace = NS, images = { 'busybox:1', 'mayura/agent:1' } })
  end)
  teardown(function()
    for _, x in ipairs(pools) do pcall(x.pool.close, x.pool) end
    svc:close()
    assert.are.same({}, svc.failures)
  end)
  after_each(function() svc:clear() end)

  it('401: a wrong token is authentication, with neither token shown, and makes nothing', function()
    local pool, p = make_pool({ token = 'WRONG-token-0123456789' })
    check('authentication', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(0, pool:count())
    nothing_left(p)
    -- a token revoked while a sandbox lives: its calls go on over the attach it has, and its
    -- release still deletes what it made once the token is good again
    local good, gp = make_pool()
    local sb = good:create({ lifetime_ms = 60000 })
    state.token = 'rotated-' .. TOKEN
    assert.are.equal('on\n', sb:exec({ 'echo', 'on' }).stdout)
    check('authentication', good.create, good, { lifetime_ms = 60000 })
    state.token = TOKEN
    sb:release()
    nothing_left(gp)
  end)

  it('403 on the Pod, 409 and 422 on the create: clear reasons, and the NetworkPolicy made first is deleted', function()
    local pool, p = make_pool({ retries = 0 })
    for _, case in ipairs({
      { 403, 'Forbidden', 'authentication' },
      { 409, 'AlreadyExists', 'conflict' },
      { 422, 'Invalid', 'failed' },
    }) do
      svc:fault('POST', PODS, status(case[1], case[2], ' admission webhook "x" denied: forbidden: '), 1)
      local err = check(case[3], pool.create, pool, { lifetime_ms = 60000 })
      assert.are.equal(case[1], err.status)
      nothing_left(p)
    end
    assert.are.equal(0, pool:count())
  end)

  it('429: a Retry-After within the call is waited out; a longer one is rate_limited with retry_after_ms', function()
    local pool, p = make_pool()
    local before = #svc:calls('POST', PODS)
    svc:fault('POST', PODS, kube.too_many_requests(1), 1)
    local sb = pool:create({ lifetime_ms = 60000 })
    local calls = svc:calls('POST', PODS)
    assert.are.equal(before + 2, #calls)
    local waited = calls[before + 2].at - calls[before + 1].at
    assert.is_true(waited >= 950, 'waited ' .. waited .. ' ms')
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    svc:fault('POST', PODS, kube.too_many_requests(60), 1)
    local err = check('rate_limited', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(60000, err.retry_after_ms)
    nothing_left(p)
    -- a wait longer than what is left of the call's time is not waited
    local quick = make_pool({ max_retry_after_ms = 60000 }, { call_timeout_ms = 1500 })
    svc:fault('POST', POLICIES, kube.too_many_requests(5), 1)
    local t0 = require('mayura.core').hrtime_ms()
    local e2 = check('rate_limited', quick.create, quick, { lifetime_ms = 60000 })
    assert.are.equal(5000, e2.retry_after_ms)
    assert.is_true(require('mayura.core').hrtime_ms() - t0 < 1000, 'it waited into its timeout')
    nothing_left(p)
  end)

  it('a Pod stuck Pending past the create\'s time is unavailable, and deleted', function()
    state.unschedulable = true
    local pool, p = make_pool({ start_timeout_ms = 1500 })
    local err = check('unavailable', pool.create, pool, { lifetime_ms = 60000 })
    assert.truthy(err.message:find('scheduled', 1, true), err.message)
    -- the pool's own call time, shorter than start_timeout_ms, bounds it too
    local short, sp = make_pool(nil, { call_timeout_ms = 1500 })
    local t0 = require('mayura.core').hrtime_ms()
    local e2 = assert.raises_code('SANDBOX_ERROR', short.create, short, { lifetime_ms = 60000 })
    assert.is_true(e2.reason == 'unavailable' or e2.reason == 'timeout', e2.reason)
    assert.is_true(require('mayura.core').hrtime_ms() - t0 < 4000)
    state.unschedulable = false
    nothing_left(p)
    nothing_left(sp, 10000)
  end)

  it('ImagePullBackOff and ErrImageNeverPull fail the create at once with the reason, and leave nothing', function()
    state.pull_failures['nowhere/image:1'] = true
    local pool, p = make_pool()
    local t0 = require('mayura.core').hrtime_ms()
    local err = check('failed', pool.create, pool, { lifetime_ms = 60000, image = 'nowhere/image:1' })
    assert.truthy(err.message:find('pulled', 1, true), err.message)
    assert.truthy(err.message:find('ImagePullBackOff', 1, true) or err.message:find('ErrImagePull', 1, true),
      err.message)
    assert.is_true(require('mayura.core').hrtime_ms() - t0 < 10000)   -- not the 20 s start time
    nothing_left(p)
    local never, np = make_pool({ pull_policy = 'Never' })
    err = check('failed', never.create, never, { lifetime_ms = 60000, image = 'not-on-the-node:1' })
    assert.truthy(err.message:find('ErrImageNeverPull', 1, true), err.message)
    nothing_left(np)
  end)

  it('a Pod deleted behind the pool (404 after) or evicted is gone for every call, and release ends it', function()
    local pool, p = make_pool()
    for _, how in ipairs({ 'deleted', 'evicted', 'vanished' }) do
      local sb = pool:create({ lifetime_ms = 60000 })
      sb:write_file('x.txt', 'x')
      local name = sb._backend.id
      if how == 'deleted' then
        assert.are.equal(200, delete_pod(name))
      elseif how == 'evicted' then
        assert.is_true(state:evict(NS, name))
      else
        -- the Pod answers 404 to every call from now on, and its attach ends
        svc:vanish(name)
        state:cut_attach(NS, name)
      end
      util.eventually(function() return sb._backend.closed end, 10000)
      for i, call in ipairs(faults.file_calls(sb)) do
        local ok, e = pcall(call)
        assert.is_false(ok, how .. ' call ' .. i)
        check('gone', error, e, 0)
      end
      sb:release()
      svc:clear()
      -- the stand-in's 404s were a pretence: its Pod and policy are still there, as no real server's would be
      if how == 'vanished' then
        assert.are.equal(200, delete_pod(name))
        assert.are.equal(200, delete_pod(name, '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies/'))
      end
      assert.are.equal(0, pool:count(), how)
      nothing_left(p)
    end
  end)

  it('the attach cut in the middle of a command is gone for that command and every later one', function()
    local pool, p = make_pool()
    local sb = pool:create({ lifetime_ms = 60000 })
    local done, err
    task.spawn(function()
      local ok, e = pcall(sb.exec, sb, { 'sh', '-c', 'echo started; sleep 20' })
      done, err = true, not ok and e or 'finished'
    end)
    util.eventually(function() return next(state.attached[pod_of(sb).metadata.uid] or {}) ~= nil end, 5000)
    task.sleep(300)
    local t0 = require('mayura.core').hrtime_ms()
    assert.are.equal(1, state:cut_attach(NS, sb._backend.id))
    util.eventually(function() return done end, 10000)
    assert.is_true(require('mayura.core').hrtime_ms() - t0 < 5000, 'the command waited for its own end')
    assert.are.equal('SANDBOX_ERROR', err.code, tostring(err))
    assert.are.equal('gone', err.reason)
    check('gone', sb.exec, sb, { 'true' })
    sb:release()
    nothing_left(p)
  end)

  it('a stalled API server ends a create at the call time, and what the create made is deleted', function()
    local pool, p = make_pool(nil, { call_timeout_ms = 1500 })
    -- each step of a create in turn: the policy, the Pod, its status, the attach
    for _, step in ipairs({ { 'POST', POLICIES }, { 'POST', PODS }, { 'GET', POD }, { 'GET', ATTACH } }) do
      svc:fault(step[1], step[2], stand_in.stall(), 1)
      local t0 = require('mayura.core').hrtime_ms()
      check('timeout', pool.create, pool, { lifetime_ms = 60000 })
      assert.is_true(require('mayura.core').hrtime_ms() - t0 < 3000, step[2])
      svc:clear()
      nothing_left(p, 10000)
      util.eventually(function() return pool:count() == 0 end, 10000)
      assert.are.equal(0, pool:count(), step[2])
    end
    -- and the pool goes on
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
    sb:release()
    nothing_left(p)
  end)
end)
