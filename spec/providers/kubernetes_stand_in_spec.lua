-- The Kubernetes API server stand-in (support/kube_service.lua) against what a real API server
-- does: discovery, bearer-token auth, admission, Pods as real namespaced processes with their
-- phases and conditions, deadlines, graceful deletes, images, list and watch, faults,
-- NetworkPolicies and the Agent Sandbox resources; then the official @kubernetes/client-node,
-- unchanged (spec/npm/kubernetes_sdk.mjs), and Debian's kubectl against the same stand-in.
local core = require('mayura.core')
local http = require('mayura.http')
local task = require('mayura._task')
local stand_in = require('support.stand_in')
local kube = require('support.kube_service')
local pods_rt = require('support.kube_pods')
local suite = require('support.stand_in_suite')
local util = require('support.util')

local json = core.json
local TOKEN = 'k8s-standin-token-0123456789'
local NS = 'sandboxes'

describe('the Kubernetes API server stand-in', function()
  if not pods_rt.available() then
    pending('needs root, bubblewrap, nsenter, setpriv and build/mayura-launch')
    return
  end
  local svc, state

  setup(function()
    svc = stand_in.new()
    state = kube.install(svc, nil, { token = TOKEN, namespace = NS, images = { 'busybox:1' } })
  end)
  teardown(function()
    svc:close()
    assert.are.same({}, svc.failures)
  end)

  local function call(method, path, body, o)
    o = o or {}
    local headers = { Authorization = 'Bearer ' .. (o.token or TOKEN), Accept = 'application/json' }
    if body then headers['Content-Type'] = o.content_type or 'application/json' end
    local r = http.request({ url = state.server .. path, method = method, headers = headers, ca_file = state.ca_file,
      body = body and (type(body) == 'string' and body or json.encode(body)) or nil, timeout_ms = 20000 })
    local ok, v = pcall(json.decode, r.body)
    r.json = ok and v or nil
    return r
  end

  local function pod_body(name, command, extra)
    local c = { name = 'sandbox', image = 'busybox:1', command = command }
    for k, v in pairs(extra and extra.container or {}) do c[k] = v end
    local spec = { restartPolicy = 'Never', containers = { c } }
    for k, v in pairs(extra and extra.spec or {}) do spec[k] = v end
    return { apiVersion = 'v1', kind = 'Pod', metadata = { name = name, labels = { app = 'spec', which = name } },
      spec = spec }
  end

  local function pod_path(name) return '/api/v1/namespaces/' .. NS .. '/pods' .. (name and ('/' .. name) or '') end

  local function wait_pod(name, pred, ms)
    local pod
    assert.is_true(util.eventually(function()
      local r = call('GET', pod_path(name))
      pod = r.json
      return r.status == 200 and pred(pod)
    end, ms or 10000), 'pod ' .. name .. ' never got there: ' .. json.encode(pod or {}))
    return pod
  end

  local function cond(pod, t)
    for _, c in ipairs(pod.status and pod.status.conditions or {}) do
      if c.type == t then return c.status end
    end
    return nil
  end

  it('serves discovery as an API server does, over TLS with its CA', function()
    local r = call('GET', '/api')
    assert.are.equal(200, r.status)
    assert.are.equal('APIVersions', r.json.kind)
    assert.are.same({ 'v1' }, r.json.versions)
    local v1 = call('GET', '/api/v1').json
    local names = {}
    for _, res in ipairs(v1.resources) do names[res.name] = res end
    assert.is_true(names.pods.namespaced)
    assert.is_truthy(names['pods/attach'] and names['pods/exec'] and names['pods/portforward'])
    local groups = {}
    for _, g in ipairs(call('GET', '/apis').json.groups) do groups[g.name] = g.preferredVersion.version end
    assert.are.same({ ['networking.k8s.io'] = 'v1', ['agents.x-k8s.io'] = 'v1beta1',
      ['extensions.agents.x-k8s.io'] = 'v1beta1' }, groups)
    assert.are.equal('1', call('GET', '/version').json.major)
    local crs = call('GET', '/apis/extensions.agents.x-k8s.io/v1alpha1').json
    assert.are.equal('extensions.agents.x-k8s.io/v1alpha1', crs.groupVersion)
    -- a client without the CA does not get through
    local ok = pcall(http.request, { url = state.server .. '/api', timeout_ms = 5000 })
    assert.is_false(ok)
  end)

  it('answers 401 with a Status, echoing nothing of the token it got', function()
    local wrong = 'Wrong-Token-Secret-777'
    local r = call('GET', pod_path(), nil, { token = wrong })
    assert.are.equal(401, r.status)
    assert.are.same({ kind = 'Status', apiVersion = 'v1', metadata = {}, status = 'Failure', message = 'Unauthorized',
      reason = 'Unauthorized', code = 401 }, r.json)
    assert.is_nil(r.body:find(wrong, 1, true))
    assert.are.equal(401, call('GET', '/api', nil, { token = '' }).status)
    -- straight to the stand-in behind the front, a claimed client certificate is not believed
    local direct = http.request({ url = svc:url('/api'), timeout_ms = 5000,
      headers = { ['X-Kube-Client'] = state.client_user, ['X-Kube-Front'] = 'guess' } })
    assert.are.equal(401, direct.status)
  end)

  it('rejects at admission what a real API server rejects, and keeps nothing of it', function()
    local before = call('GET', pod_path()).json.metadata.resourceVersion
    local function rejected(body, status, field)
      local r = call('POST', pod_path(), body)
      assert.are.equal(status, r.status, r.body)
      assert.are.equal('Status', r.json.kind)
      assert.are.equal('Failure', r.json.status)
      if field then
        local fields = {}
        for _, c in ipairs(r.json.details.causes) do fields[c.field] = true end
        assert.is_true(fields[field], r.body)
        assert.are.equal('Invalid', r.json.reason)
      end
      return r
    end
    rejected(pod_body('Bad_Name', { 'true' }), 422, 'metadata.name')
    local b = pod_body('badlabel', { 'true' })
    b.metadata.labels['no spaces'] = 'x'
    rejected(b, 422, 'metadata.labels')
    b = pod_body('badvalue', { 'true' })
    b.metadata.labels.ok = 'not ok!'
    rejected(b, 422, 'metadata.labels')
    rejected({ metadata = { name = 'nocontainers' }, spec = { containers = {} } }, 422, 'spec.containers')
    b = pod_body('dupe', { 'true' })
    b.spec.containers[2] = { name = 'sandbox', image = 'busybox:1' }
    rejected(b, 422, 'spec.containers[1].name')
    rejected(pod_body('noimage', { 'true' }, { container = { image = '' } }), 422, 'spec.containers[0].image')
    rejected(pod_body('overask', { 'true' }, { container = { resources = { limits = { memory = '64Mi' },
      requests = { memory = '1Gi' } } } }), 422, 'spec.containers[0].resources.requests')
    rejected(pod_body('badqty', { 'true' }, { container = { resources = { limits = { memory = 'lots' } } } }), 400)
    rejected(pod_body('nomount', { 'true' }, { container = { volumeMounts = { { name = 'v', mountPath = '/v' } } } }),
      422, 'spec.containers[0].volumeMounts[0].name')
    rejected(pod_body('badpull', { 'true' }, { container = { imagePullPolicy = 'Sometimes' } }), 422,
      'spec.containers[0].imagePullPolicy')
    rejected(pod_body('baddeadline', { 'true' }, { spec = { activeDeadlineSeconds = 0 } }), 422,
      'spec.activeDeadlineSeconds')
    rejected(pod_body('baduid', { 'true' }, { spec = { securityContext = { runAsUser = -1 } } }), 422,
      'spec.securityContext.runAsUser')
    local r = call('POST', '/api/v1/namespaces/nowhere/pods', pod_body('x', { 'true' }))
    assert.are.equal(404, r.status)
    assert.are.equal('NotFound', r.json.reason)
    assert.are.equal(400, call('POST', pod_path(), '{"metadata": ').status)
    -- nothing was stored, nothing changed
    local list = call('GET', pod_path()).json
    assert.are.equal(0, #list.items)
    assert.are.equal(before, list.metadata.resourceVersion)
  end)

  it('starts a pod Pending without conditions, then Running with its conditions, as a real isolated process',
    function()
      local r = call('POST', pod_path(), pod_body('iso', { 'sh', '-c',
        'id -u; ls -A / | tr "\\n" " "; echo; grep CapEff /proc/self/status; ' ..
        'touch /x 2>/dev/null && echo rootrw || echo rootro; echo data > /data/f && cat /data/f; ' ..
        'ls /root /home /var 2>&1 | head -1; exec sleep 60' },
        { container = { securityContext = { runAsUser = 1234, readOnlyRootFilesystem = true },
          resources = { limits = { memory = '96Mi' } }, volumeMounts = { { name = 'data', mountPath = '/data' } } },
          spec = { volumes = { { name = 'data', emptyDir = { sizeLimit = '8Mi' } } } } }))
      assert.are.equal(201, r.status, r.body)
      assert.are.equal('Pending', r.json.status.phase)
      assert.are.equal('Burstable', r.json.status.qosClass)
      assert.is_nil(r.json.status.conditions)
      assert.is_truthy(tonumber(r.json.metadata.resourceVersion))
      assert.are.equal('IfNotPresent', r.json.spec.containers[1].imagePullPolicy)
      -- a second create of the name: 409
      local again = call('POST', pod_path(), pod_body('iso', { 'true' }))
      assert.are.equal(409, again.status)
      assert.are.equal('AlreadyExists', again.json.reason)
      local pod = wait_pod('iso', function(p) return p.status.phase == 'Running' end)
      for _, t in ipairs({ 'PodScheduled', 'Initialized', 'ContainersReady', 'Ready' }) do
        assert.are.equal('True', cond(pod, t), t)
      end
      assert.is_truthy(pod.status.containerStatuses[1].state.running)
      -- the watch saw the way there: Pending first, PodScheduled before Ready
      local seen = {}
      for _, ev in ipairs(state.events) do
        if ev.plural == 'pods' and ev.object.metadata.name == 'iso' then
          seen[#seen + 1] = ev.object.status.phase .. ':' .. tostring(cond(ev.object, 'PodScheduled')) .. ':' ..
            tostring(cond(ev.object, 'Ready'))
        end
      end
      assert.are.equal('Pending:nil:nil', seen[1])
      assert.are.equal('Running:True:True', seen[#seen])
      local log
      assert.is_true(util.eventually(function()
        log = call('GET', pod_path('iso') .. '/log').body
        return log:find('No such file', 1, true) ~= nil
      end, 5000), log)
      local lines = {}
      for l in log:gmatch('[^\n]+') do lines[#lines + 1] = l end
      assert.are.equal('1234', lines[1])
      -- no host files beyond /usr and the root links
      assert.is_nil(lines[2]:find('root', 1, true))
      assert.is_nil(lines[2]:find('home', 1, true))
      assert.are.equal('CapEff:\t0000000000000000', lines[3])
      assert.are.equal('rootro', lines[4])
      assert.are.equal('data', lines[5])
      -- the memory limit is a cgroup of the pod
      local ct = state.containers[pod.metadata.uid]
      local limit
      for _, d in ipairs(ct.cg_dirs) do
        local f = io.open(d .. '/memory.limit_in_bytes') or io.open(d .. '/memory.max')
        if f then limit = tonumber(f:read('l')); f:close() end
      end
      assert.are.equal(96 * 1048576, limit)
      assert.are.equal(200, call('DELETE', pod_path('iso') .. '?gracePeriodSeconds=0').status)
      assert.are.equal(404, call('GET', pod_path('iso')).status)
      assert.is_true(util.eventually(function() return not ct.running end, 5000))
    end)

  it('puts the agent where an init container copies it into an emptyDir at /.mayura, and nowhere else', function()
    local probe = { 'sh', '-c', 'if [ -x /.mayura/agent ]; then echo agent-there; else echo no-agent; fi; ' ..
      'touch /.mayura/x 2>/dev/null && echo agent-dir-writable; exec sleep 30' }
    local with = pod_body('with-agent', probe, { container = { volumeMounts = { { name = 'mayura',
      mountPath = '/.mayura', readOnly = true } } }, spec = { volumes = { { name = 'mayura', emptyDir = {} } },
      initContainers = { { name = 'agent', image = 'busybox:1', command = { 'cp', '/agent', '/.mayura/agent' },
        volumeMounts = { { name = 'mayura', mountPath = '/.mayura' } } } } } })
    assert.are.equal(201, call('POST', pod_path(), with).status)
    assert.are.equal(201, call('POST', pod_path(), pod_body('without-agent', probe)).status)
    local pod = wait_pod('with-agent', function(p) return p.status.phase == 'Running' end)
    assert.are.equal('Completed', pod.status.initContainerStatuses[1].state.terminated.reason)
    wait_pod('without-agent', function(p) return p.status.phase == 'Running' end)
    local function log(name)
      local text
      util.eventually(function()
        text = call('GET', pod_path(name) .. '/log').body
        return text:find('agent', 1, true) ~= nil
      end, 5000)
      return text
    end
    assert.are.equal('agent-there\n', log('with-agent'))
    assert.are.equal('no-agent\n', log('without-agent'))
    -- the agent as the first program where there is none: the runtime's StartError
    call('POST', pod_path(), pod_body('no-agent', { '/.mayura/agent', '--stdio' }))
    pod = wait_pod('no-agent', function(p) return p.status.phase == 'Failed' end)
    local term = pod.status.containerStatuses[1].state.terminated
    assert.are.equal('StartError', term.reason)
    assert.are.equal(128, term.exitCode)
    assert.is_truthy(term.message:find('/.mayura/agent', 1, true))
    call('POST', pod_path(), pod_body('no-program', { 'no-such-program' }))
    pod = wait_pod('no-program', function(p) return p.status.phase == 'Failed' end)
    assert.is_truthy(pod.status.containerStatuses[1].state.terminated.message:find('not found in $PATH', 1, true))
    for _, n in ipairs({ 'with-agent', 'without-agent', 'no-agent', 'no-program' }) do
      call('DELETE', pod_path(n) .. '?gracePeriodSeconds=0')
    end
  end)

  it('validates fields: Strict refuses one a Pod does not have, the default warns and drops it', function()
    local b = pod_body('typo', { 'sleep', '30' }, { container = { stdinOnec = true }, spec = { activeDeadline = 5 } })
    local r = call('POST', pod_path() .. '?fieldValidation=Strict', b)
    assert.are.equal(400, r.status)
    assert.are.equal('BadRequest', r.json.reason)
    assert.is_truthy(r.json.message:find('unknown field "spec.activeDeadline"', 1, true), r.json.message)
    assert.is_truthy(r.json.message:find('unknown field "spec.containers[0].stdinOnec"', 1, true), r.json.message)
    r = call('POST', pod_path(), b)
    assert.are.equal(201, r.status)
    assert.is_truthy(r.headers.warning:find('unknown field \\"spec.activeDeadline\\"', 1, true), r.headers.warning)
    assert.is_nil(r.json.spec.activeDeadline)
    assert.is_nil(r.json.spec.containers[1].stdinOnec)
    call('DELETE', pod_path('typo') .. '?gracePeriodSeconds=0')
  end)

  it('keeps a pod Pending as a kubelet and scheduler do: runAsNonRoot as root, requests above the node', function()
    call('POST', pod_path(), pod_body('asroot', { 'true' }, { container = { securityContext = { runAsNonRoot = true } } }))
    local pod = wait_pod('asroot', function(p)
      local st = p.status.containerStatuses
      return st and st[1].state.waiting and st[1].state.waiting.reason == 'CreateContainerConfigError'
    end)
    assert.are.equal('Pending', pod.status.phase)
    assert.is_nil(state.containers[pod.metadata.uid])
    call('POST', pod_path(), pod_body('huge', { 'true' }, { container = { resources = { requests = { cpu = '64' } } } }))
    pod = wait_pod('huge', function(p) return cond(p, 'PodScheduled') == 'False' end)
    assert.are.equal('Pending', pod.status.phase)
    assert.are.equal('Unschedulable', pod.status.conditions[1].reason)
    assert.is_truthy(pod.status.conditions[1].message:find('Insufficient cpu', 1, true))
    assert.is_nil(pod.spec.nodeName)
    -- as root with runAsNonRoot and a uid, it runs; its group is the image's (0) unless runAsGroup says
    local nr = call('POST', pod_path(), pod_body('nonroot', { 'sh', '-c', 'id -u; id -g; exec sleep 30' }, {
      container = { securityContext = { runAsNonRoot = true, runAsUser = 4321 },
        resources = { limits = { cpu = '500m', memory = '64Mi' } } } }))
    assert.are.equal('Guaranteed', nr.json.status.qosClass)
    wait_pod('nonroot', function(p) return p.status.phase == 'Running' end)
    local log
    assert.is_true(util.eventually(function()
      log = call('GET', pod_path('nonroot') .. '/log').body
      return log == '4321\n0\n'
    end, 5000), log)
    for _, n in ipairs({ 'asroot', 'huge', 'nonroot' }) do call('DELETE', pod_path(n) .. '?gracePeriodSeconds=0') end
  end)

  it('ends a pod at activeDeadlineSeconds: Failed, DeadlineExceeded, its process gone', function()
    call('POST', pod_path(), pod_body('deadline', { 'sleep', '60' }, { spec = { activeDeadlineSeconds = 1 } }))
    local pod = wait_pod('deadline', function(p) return p.status.phase == 'Running' end)
    local ct = state.containers[pod.metadata.uid]
    pod = wait_pod('deadline', function(p) return p.status.phase == 'Failed' end, 5000)
    assert.are.equal('DeadlineExceeded', pod.status.reason)
    assert.are.equal('False', cond(pod, 'Ready'))
    assert.is_true(util.eventually(function() return not ct.running end, 5000))
    call('DELETE', pod_path('deadline'))
  end)

  it('deletes with a grace period: marked, SIGTERM to the process, DELETED once it ends', function()
    call('POST', pod_path(), pod_body('graceful', { 'sh', '-c',
      'trap "echo got-term; exit 0" TERM; while :; do sleep 0.05; done' }))
    local pod = wait_pod('graceful', function(p) return p.status.phase == 'Running' end)
    local ct = state.containers[pod.metadata.uid]
    local t0 = core.hrtime_ms()
    local r = call('DELETE', pod_path('graceful') .. '?gracePeriodSeconds=20')
    assert.are.equal(200, r.status)
    assert.is_truthy(r.json.metadata.deletionTimestamp)
    assert.are.equal(20, r.json.metadata.deletionGracePeriodSeconds)
    assert.is_true(util.eventually(function() return call('GET', pod_path('graceful')).status == 404 end, 10000))
    -- it ended on the TERM, long before the grace ran out
    assert.is_true(core.hrtime_ms() - t0 < 10000)
    assert.is_false(ct.running)
    local deleted = false
    for _, ev in ipairs(state.events) do
      if ev.type == 'DELETED' and ev.object.metadata.name == 'graceful' then deleted = true end
    end
    assert.is_true(deleted)
    assert.are.equal(404, call('DELETE', pod_path('graceful')).status)
  end)

  it('keeps imagePullPolicy: Never without the image waits ErrImageNeverPull, a failing pull ImagePullBackOff',
    function()
      call('POST', pod_path(), pod_body('never', { 'true' }, { container = { image = 'missing/image:1',
        imagePullPolicy = 'Never' } }))
      local pod = wait_pod('never', function(p)
        local st = p.status.containerStatuses
        return st and st[1].state.waiting and st[1].state.waiting.reason == 'ErrImageNeverPull'
      end)
      assert.are.equal('Pending', pod.status.phase)
      assert.are.equal('Never', pod.spec.containers[1].imagePullPolicy)
      state.pull_failures['private/image:2'] = true
      call('POST', pod_path(), pod_body('backoff', { 'true' }, { container = { image = 'private/image:2' } }))
      pod = wait_pod('backoff', function(p)
        local st = p.status.containerStatuses
        return st and st[1].state.waiting and st[1].state.waiting.reason == 'ImagePullBackOff'
      end)
      assert.are.equal('Pending', pod.status.phase)
      -- a tag 'latest' defaults to Always
      local r = call('POST', pod_path(), pod_body('latest', { 'true' }, { container = { image = 'busybox' } }))
      assert.are.equal('Always', r.json.spec.containers[1].imagePullPolicy)
      for _, n in ipairs({ 'never', 'backoff', 'latest' }) do call('DELETE', pod_path(n) .. '?gracePeriodSeconds=0') end
    end)

  it('lists and watches with label selectors, from a resourceVersion, and says 410 for one too old', function()
    local rv0 = tonumber(call('GET', pod_path()).json.metadata.resourceVersion)
    for _, n in ipairs({ 'sel-a', 'sel-b' }) do
      local b = pod_body(n, { 'sleep', '30' })
      b.metadata.labels.tier = n == 'sel-a' and 'front' or 'back'
      assert.are.equal(201, call('POST', pod_path(), b).status)
    end
    local function names(q)
      local r = call('GET', pod_path() .. '?labelSelector=' .. q)
      assert.are.equal(200, r.status, r.body)
      local out = {}
      for _, p in ipairs(r.json.items) do out[#out + 1] = p.metadata.name end
      return table.concat(out, ',')
    end
    assert.are.equal('sel-a', names('tier%3Dfront'))
    assert.are.equal('sel-b', names('tier%21%3Dfront,app%3Dspec'))
    assert.are.equal('sel-a,sel-b', names('tier%20in%20(front,back)'))
    assert.are.equal('', names('tier%20notin%20(front,back)'))
    assert.are.equal('sel-a,sel-b', names('tier'))
    assert.are.equal(400, call('GET', pod_path() .. '?labelSelector=tier%3D%3D%3Dx!').status)
    -- a watch from rv0 replays what came after it, in order; without one it starts with ADDED
    local r = call('GET', pod_path() .. '?watch=true&labelSelector=tier%3Dback&resourceVersion=' .. rv0 ..
      '&timeoutSeconds=1')
    assert.are.equal(200, r.status)
    local types, last = {}, 0
    for line in r.body:gmatch('[^\n]+') do
      local ev = json.decode(line)
      assert.are.equal('sel-b', ev.object.metadata.name)
      assert.are.equal('Pod', ev.object.kind)
      local rv = tonumber(ev.object.metadata.resourceVersion)
      assert.is_true(rv > last)
      last = rv
      types[#types + 1] = ev.type
    end
    assert.are.equal('ADDED', types[1])
    assert.is_true(#types >= 2)
    local fresh = call('GET', pod_path() .. '?watch=1&fieldSelector=metadata.name%3Dsel-a&timeoutSeconds=1')
    local first = json.decode(fresh.body:match('[^\n]+'))
    assert.are.equal('ADDED', first.type)
    assert.are.equal('sel-a', first.object.metadata.name)
    -- history is kept for 2000 changes; a resourceVersion before that is gone
    local old = call('GET', pod_path() .. '?watch=true&resourceVersion=1&timeoutSeconds=1')
    if state.history[1].rv > 2 then
      local ev = json.decode(old.body:match('[^\n]+'))
      assert.are.equal('ERROR', ev.type)
      assert.are.equal(410, ev.object.code)
    end
    -- deletecollection by label: marked at once, gone once their processes ended on the TERM
    local del = call('DELETE', pod_path() .. '?labelSelector=app%3Dspec')
    assert.are.equal(200, del.status)
    assert.are.equal(2, #del.json.items)
    for _, p in ipairs(call('GET', pod_path()).json.items) do assert.is_truthy(p.metadata.deletionTimestamp) end
    assert.is_true(util.eventually(function() return #call('GET', pod_path()).json.items == 0 end, 10000))
  end)

  it('answers a scripted 429 with Retry-After and a TooManyRequests Status', function()
    svc:fault('GET', '/api/v1/namespaces/{ns}/pods', kube.too_many_requests(3), 1)
    local r = call('GET', pod_path())
    assert.are.equal(429, r.status)
    assert.are.equal('3', r.headers['retry-after'])
    assert.are.equal('TooManyRequests', r.json.reason)
    assert.are.equal(3, r.json.details.retryAfterSeconds)
    assert.are.equal(200, call('GET', pod_path()).status)
    -- RBAC's refusal, scripted: 403 with a Status naming the verb and resource, not the token
    state.forbidden['create pods'] = true
    local f = call('POST', pod_path(), pod_body('forbidden', { 'true' }))
    state.forbidden['create pods'] = nil
    assert.are.equal(403, f.status)
    assert.are.equal('Forbidden', f.json.reason)
    assert.is_truthy(f.json.message:find('cannot create resource "pods" in API group "" in the namespace "' .. NS .. '"',
      1, true), f.json.message)
    assert.is_nil(f.body:find(TOKEN, 1, true))
    assert.are.equal(404, call('GET', pod_path('forbidden')).status)
  end)

  it('stores and returns NetworkPolicies (not enforced), checking them as admission does', function()
    local base = '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies'
    local np = { apiVersion = 'networking.k8s.io/v1', kind = 'NetworkPolicy', metadata = { name = 'deny-all',
      labels = { app = 'spec' } }, spec = { podSelector = { matchLabels = { app = 'spec' } },
      egress = { { to = { { ipBlock = { cidr = '0.0.0.0/0', except = { '169.254.169.254/32' } } } } } } } }
    local r = call('POST', base, np)
    assert.are.equal(201, r.status, r.body)
    assert.are.same({ 'Ingress', 'Egress' }, r.json.spec.policyTypes)
    local got = call('GET', base .. '/deny-all').json
    assert.are.equal('169.254.169.254/32', got.spec.egress[1].to[1].ipBlock.except[1])
    assert.are.equal(1, #call('GET', base .. '?labelSelector=app%3Dspec').json.items)
    local bad = { metadata = { name = 'bad' }, spec = { policyTypes = { 'Sideways' } } }
    assert.are.equal(422, call('POST', base, bad).status)
    bad = { metadata = { name = 'bad' }, spec = { egress = { { to = { { ipBlock = { cidr = '10.0.0.0/99' } } } } } } }
    assert.are.equal(422, call('POST', base, bad).status)
    assert.are.equal(200, call('DELETE', base .. '/deny-all').status)
    assert.are.equal(404, call('GET', base .. '/deny-all').status)
  end)

  it('runs the Agent Sandbox resources: a Sandbox makes its Pod, a claim of a template its Sandbox, both end',
    function()
      local AS = '/apis/agents.x-k8s.io/v1beta1/namespaces/' .. NS .. '/sandboxes'
      local tpl_spec = { metadata = { labels = { app = 'agent' } }, spec = { restartPolicy = 'Never',
        containers = { { name = 'sandbox', image = 'busybox:1', command = { 'sleep', '60' } } } } }
      local r = call('POST', AS, { apiVersion = 'agents.x-k8s.io/v1beta1', kind = 'Sandbox',
        metadata = { name = 'sb-one' }, spec = { podTemplate = tpl_spec } })
      assert.are.equal(201, r.status, r.body)
      local sb
      assert.is_true(util.eventually(function()
        sb = call('GET', AS .. '/sb-one').json
        return cond(sb, 'Ready') == 'True'
      end, 10000), json.encode(sb))
      local first_uid = call('GET', pod_path('sb-one')).json.metadata.uid
      -- its pod deleted behind it is made again; suspended, it has none; running again, one more
      assert.are.equal(200, call('DELETE', pod_path('sb-one') .. '?gracePeriodSeconds=0').status)
      assert.is_true(util.eventually(function()
        local p = call('GET', pod_path('sb-one')).json
        return p.metadata and p.metadata.uid ~= first_uid and p.status.phase == 'Running'
      end, 10000))
      local r2 = call('PATCH', AS .. '/sb-one', { spec = { operatingMode = 'Suspended' } },
        { content_type = 'application/merge-patch+json' })
      assert.are.equal(200, r2.status, r2.body)
      assert.is_true(util.eventually(function()
        return call('GET', pod_path('sb-one')).status == 404 and cond(call('GET', AS .. '/sb-one').json, 'Suspended') == 'True'
      end, 5000))
      call('PATCH', AS .. '/sb-one', { spec = { operatingMode = 'Running' } },
        { content_type = 'application/merge-patch+json' })
      assert.is_true(util.eventually(function()
        return cond(call('GET', AS .. '/sb-one').json, 'Ready') == 'True'
      end, 10000))
      assert.are.equal('False', cond(call('GET', AS .. '/sb-one').json, 'Suspended'))
      assert.are.equal(200, call('DELETE', AS .. '/sb-one').status)
      assert.is_true(util.eventually(function() return call('GET', pod_path('sb-one')).status == 404 end, 5000))
      -- v1alpha1: a claim names its template
      local AX = '/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/' .. NS
      assert.are.equal(201, call('POST', AX .. '/sandboxtemplates', { apiVersion =
        'extensions.agents.x-k8s.io/v1alpha1', kind = 'SandboxTemplate', metadata = { name = 'tpl' },
        spec = { podTemplate = tpl_spec } }).status)
      local past = os.date('!%Y-%m-%dT%H:%M:%SZ', math.floor(core.now_ms() / 1000) + 3)
      assert.are.equal(201, call('POST', AX .. '/sandboxclaims', { apiVersion = 'extensions.agents.x-k8s.io/v1alpha1',
        kind = 'SandboxClaim', metadata = { name = 'claim' }, spec = { sandboxTemplateRef = { name = 'tpl' },
        lifecycle = { shutdownTime = past, shutdownPolicy = 'Retain' } } }).status)
      local claim
      assert.is_true(util.eventually(function()
        claim = call('GET', AX .. '/sandboxclaims/claim').json
        return cond(claim, 'Ready') == 'True'
      end, 10000), json.encode(claim))
      local name = claim.status.sandbox.name
      assert.are.equal('Running', call('GET', pod_path(name)).json.status.phase)
      -- the claim's shutdown time ends its sandbox and pod
      assert.is_true(util.eventually(function() return call('GET', pod_path(name)).status == 404 end, 8000))
      assert.are.equal('ClaimExpired', (function()
        for _, c in ipairs(call('GET', AX .. '/sandboxclaims/claim').json.status.conditions) do
          if c.type == 'Ready' then return c.reason end
        end
      end)())
      call('DELETE', AX .. '/sandboxclaims/claim')
      call('DELETE', AX .. '/sandboxtemplates/tpl')
    end)

  it('is driven by the official @kubernetes/client-node, unchanged', function()
    if not suite.npm_installed('@kubernetes/client-node', 'the Kubernetes client') then return end
    local r = suite.node('spec/npm/kubernetes_sdk.mjs', { STAND_IN_SERVER = state.server, STAND_IN_CA = state.ca_file,
      STAND_IN_TOKEN = TOKEN, STAND_IN_NAMESPACE = NS })
    if r.exit_code ~= 0 then
      error(('the client exited %s (signal %s, timed out %s): %s %s'):format(tostring(r.exit_code),
        tostring(r.signal), tostring(r.timed_out), r.stdout, r.stderr), 0)
    end
    local res = json.decode(r.stdout:match('RESULT (%b{})'))
    assert.is_nil(res.error)
    assert.are.equal('Pending', res.created_phase)
    assert.are.same({ 'ContainersReady=True', 'Initialized=True', 'PodScheduled=True', 'Ready=True' }, res.conditions)
    assert.are.same({ 'sdk-main' }, res.listed)
    assert.are.equal(0, res.listed_other)
    assert.are.equal('v5.channel.k8s.io', res.exec_protocol)
    assert.are.same({ stdout = 'out\n', stderr = 'err\n', status = 'Failure', reason = 'NonZeroExitCode', exit = '3' },
      res.exec)
    assert.are.same({ stdout = 'first\nsecond\n', status = 'Success' }, res.exec_stdin)
    assert.are.equal('got ping\n', res.attach)
    assert.are.equal('200 served\n', res.forwarded)
    assert.are.same({ 'Ingress', 'Egress' }, res.netpol)
    assert.are.same({ kind = 'SandboxClaim', sandbox_kind = 'Sandbox', pod_phase = 'Running' }, res.claim)
    assert.are.equal(404, res.claim_pod_gone)
    assert.are.equal(404, res.after_delete)
    assert.are.same({ code = 422, reason = 'Invalid', kind = 'Status' }, res.bad_label)
    assert.are.equal(401, res.wrong_token.code)
    assert.are.equal('ADDED sdk-main Pending', res.watch[1])
    local saw_running, saw_deleted = false, false
    for _, w in ipairs(res.watch) do
      if w == 'MODIFIED sdk-main Running' then saw_running = true end
      if w:match('^DELETED sdk%-main') then saw_deleted = true end
    end
    assert.is_true(saw_running and saw_deleted)
  end)

  it('answers Debian\'s kubectl: apply, wait for Ready, get, exec, delete', function()
    if not os.execute('command -v kubectl >/dev/null 2>&1') then
      pending('kubectl is not installed (sh scripts/setup.sh installs kubernetes-client)')
      return
    end
    local dir = util.tmpdir()
    local f = io.open(dir .. '/config', 'w')
    f:write(('apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: %s\n' ..
      '    certificate-authority: %s\nusers:\n- name: u\n  user:\n    token: %s\ncontexts:\n- name: c\n' ..
      '  context:\n    cluster: s\n    user: u\n    namespace: %s\ncurrent-context: c\n')
      :format(state.server, state.ca_file, TOKEN, NS))
    f:close()
    f = io.open(dir .. '/pod.yaml', 'w')
    f:write('apiVersion: v1\nkind: Pod\nmetadata:\n  name: kubectl-pod\n  labels: {app: kubectl}\nspec:\n' ..
      '  restartPolicy: Never\n  containers:\n  - name: sandbox\n    image: busybox:1\n' ..
      '    command: [sleep, "60"]\n')
    f:close()
    local function kubectl(...)
      local argv = { 'kubectl', '--kubeconfig', dir .. '/config' }
      for _, a in ipairs({ ... }) do argv[#argv + 1] = a end
      return require('mayura.process').run(argv, { timeout_ms = 30000, env = { PATH = os.getenv('PATH'),
        HOME = dir } })
    end
    local r = kubectl('apply', '-f', dir .. '/pod.yaml')
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal('pod/kubectl-pod created\n', r.stdout)
    r = kubectl('wait', '--for=condition=Ready', 'pod/kubectl-pod', '--timeout=20s')
    assert.are.equal(0, r.exit_code, r.stderr)
    r = kubectl('get', 'pods', '-l', 'app=kubectl')
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.is_truthy(r.stdout:match('kubectl%-pod%s+1/1%s+Running%s+0'), r.stdout)
    r = kubectl('exec', 'kubectl-pod', '--', 'sh', '-c', 'echo in-pod; exit 4')
    assert.are.equal(4, r.exit_code, r.stderr)
    assert.are.equal('in-pod\n', r.stdout)
    r = kubectl('apply', '-f', dir .. '/pod.yaml')
    assert.are.equal('pod/kubectl-pod unchanged\n', r.stdout)
    r = kubectl('delete', '-f', dir .. '/pod.yaml', '--grace-period=1')
    assert.are.equal(0, r.exit_code, r.stderr)
    r = kubectl('get', 'pod', 'kubectl-pod')
    assert.are_not.equal(0, r.exit_code)
    assert.is_truthy(r.stderr:find('NotFound', 1, true), r.stderr)
    r = kubectl('get', 'pods', '--token', 'not-it')
    assert.are_not.equal(0, r.exit_code)
    assert.is_nil(r.stderr:find(TOKEN, 1, true))
    -- the client certificate instead of the token
    f = io.open(dir .. '/config', 'w')
    f:write(('apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: %s\n' ..
      '    certificate-authority: %s\nusers:\n- name: u\n  user:\n    client-certificate: %s\n' ..
      '    client-key: %s\ncontexts:\n- name: c\n  context:\n    cluster: s\n    user: u\n    namespace: %s\n' ..
      'current-context: c\n'):format(state.server, state.ca_file, state.client_cert_file, state.client_key_file, NS))
    f:close()
    r = kubectl('get', 'namespace', NS, '-o', 'name')
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal('namespace/' .. NS .. '\n', r.stdout)
    util.rmdir(dir)
    task.sleep(0)
  end)

  describe('over plain HTTP (tls = false), through mayura.ws as libwebsockets speaks it', function()
    local plain_svc, plain
    setup(function()
      plain_svc = stand_in.new()
      plain = kube.install(plain_svc, nil, { token = TOKEN, namespace = NS, images = { 'busybox:1' }, tls = false })
    end)
    teardown(function()
      plain_svc:close()
      assert.are.same({}, plain_svc.failures)
    end)

    local function pcall_json(method, path, body)
      local r = http.request({ url = plain.server .. path, method = method, timeout_ms = 10000, body = body and
        json.encode(body), headers = { Authorization = 'Bearer ' .. TOKEN, ['Content-Type'] = 'application/json' } })
      return r.status, json.decode(r.body)
    end

    -- Creates a pod and waits for it to run; the ws:// base of its path and its body.
    local function running(body)
      local status = pcall_json('POST', pod_path(), body)
      assert.are.equal(201, status)
      local pod
      assert.is_true(util.eventually(function()
        local _, p = pcall_json('GET', pod_path(body.metadata.name))
        pod = p
        return p.status.phase == 'Running'
      end, 10000))
      return plain.server:gsub('^http', 'ws') .. pod_path(body.metadata.name), pod
    end

    it('attaches with v4.channel.k8s.io to the first process, and execs with the Status on channel 3', function()
      local ws = require('mayura.ws')
      assert.is_nil(plain.ca_file)
      assert.is_truthy(plain.server:match('^http://127%.0%.0%.1:%d+$'))
      local base = running(pod_body('ws-pod', { 'sh', '-c', 'while read l; do echo "echo:$l"; done' },
        { container = { stdin = true } }))
      local conn = ws.connect({ url = base .. '/attach?container=sandbox&stdin=true&stdout=true&stderr=true',
        headers = { Authorization = 'Bearer ' .. TOKEN }, protocols = 'v4.channel.k8s.io', timeout_ms = 10000 })
      assert.are.equal('v4.channel.k8s.io', conn.protocol)
      conn:send('\0hello\n', true)
      local msg = conn:receive({ timeout_ms = 5000 })
      assert.are.equal('\1echo:hello\n', msg)
      conn:close()
      local ex = ws.connect({ url = base .. '/exec?container=sandbox&command=sh&command=-c&command=echo%20x%3B%20exit%207' ..
        '&stdout=true&stderr=true', headers = { Authorization = 'Bearer ' .. TOKEN },
        protocols = 'v4.channel.k8s.io', timeout_ms = 10000 })
      local got = {}
      while true do
        local m = ex:receive({ timeout_ms = 5000 })
        if not m then break end
        got[#got + 1] = m
      end
      assert.are.equal('\1x\n', got[1])
      local st = json.decode(got[#got]:sub(2))
      assert.are.equal(3, got[#got]:byte(1))
      assert.are.equal('NonZeroExitCode', st.reason)
      assert.are.equal('7', st.details.causes[1].message)
      -- a MiB of standard input in one message, through exec
      local big = ws.connect({ url = base .. '/exec?container=sandbox&command=sh&command=-c&command=' ..
        'head%20-c%201048576%20%7C%20wc%20-c&stdin=true&stdout=true&stderr=true',
        headers = { Authorization = 'Bearer ' .. TOKEN }, protocols = 'v4.channel.k8s.io', timeout_ms = 10000 })
      big:send('\0' .. string.rep('x', 1048576), true)
      assert.are.equal('\1' .. '1048576\n', big:receive({ timeout_ms = 10000 }))
      assert.are.equal('Success', json.decode(big:receive({ timeout_ms = 10000 }):sub(2)).status)
      -- a refused upgrade is the API server's answer: no token, 401; no such pod, 404; RBAC, 403
      plain.forbidden['create pods/attach'] = true
      local fok, ferr = pcall(ws.connect, { url = base .. '/attach?stdin=true&stdout=true', protocols = 'v4.channel.k8s.io',
        headers = { Authorization = 'Bearer ' .. TOKEN }, timeout_ms = 5000 })
      plain.forbidden['create pods/attach'] = nil
      assert.is_false(fok)
      assert.are.equal(403, ferr.status)
      local ok, err = pcall(ws.connect, { url = base .. '/attach?stdin=true', protocols = 'v4.channel.k8s.io',
        timeout_ms = 5000 })
      assert.is_false(ok)
      assert.are.equal(401, err.status)
      ok, err = pcall(ws.connect, { url = base .. '-gone/attach?stdin=true', protocols = 'v4.channel.k8s.io',
        headers = { Authorization = 'Bearer ' .. TOKEN }, timeout_ms = 5000 })
      assert.is_false(ok)
      assert.are.equal(404, err.status)
      pcall_json('DELETE', pod_path('ws-pod') .. '?gracePeriodSeconds=0')
    end)

    it('runs exec with the host\'s own programs, whatever PATH the pod\'s env names', function()
      local ws = require('mayura.ws')
      local dir = util.tmpdir()
      for _, name in ipairs({ 'sh', 'nsenter', 'setpriv' }) do
        local f = io.open(dir .. '/' .. name, 'w')
        f:write('#!/bin/sh\ntouch ' .. dir .. '/ran-' .. name .. '\nexit 0\n')
        f:close()
        os.execute('chmod 755 ' .. dir .. '/' .. name)
      end
      local base = running(pod_body('path-pod', { '/usr/bin/sleep', '30' }, { container = {
        env = { { name = 'PATH', value = dir } } } }))
      local ex = ws.connect({ url = base .. '/exec?command=/usr/bin/printenv&command=PATH&stdout=true',
        headers = { Authorization = 'Bearer ' .. TOKEN }, protocols = 'v4.channel.k8s.io', timeout_ms = 10000 })
      -- the command gets the pod's env; the host ran none of the directory's programs
      assert.are.equal('\1' .. dir .. '\n', ex:receive({ timeout_ms = 5000 }))
      for _, name in ipairs({ 'sh', 'nsenter', 'setpriv' }) do
        assert.is_nil(io.open(dir .. '/ran-' .. name), name)
      end
      pcall_json('DELETE', pod_path('path-pod') .. '?gracePeriodSeconds=0')
      util.rmdir(dir)
    end)

    it('gives the loader\'s variables and its own names of a pod\'s env to the pod alone, not to host programs',
      function()
        local ws = require('mayura.ws')
        local dir = util.tmpdir()
        local env = { { name = 'LD_DEBUG', value = 'libs' }, { name = 'LD_DEBUG_OUTPUT', value = dir .. '/dbg' },
          { name = 'MAYURA_UID', value = '1000' }, { name = 'MAYURA_CG', value = dir },
          { name = 'KPOD_CG', value = dir }, { name = 'PLAIN', value = 'kept' } }
        local base, p = running(pod_body('env-pod', { '/usr/bin/sleep', '30' }, { container = { env = env } }))
        local ct = plain.containers[p.metadata.uid]
        -- the launcher took its own uid, not the pod's MAYURA_UID
        local status = io.open('/proc/' .. ct.pid .. '/status'):read('a')
        assert.is_nil(status:match('\nUid:%s+1000%s'), status:match('\nUid:[^\n]*'))
        local ex = ws.connect({ url = base .. '/exec?command=/usr/bin/env&stdout=true',
          headers = { Authorization = 'Bearer ' .. TOKEN }, protocols = 'v4.channel.k8s.io', timeout_ms = 10000 })
        local out = {}
        while true do
          local m = ex:receive({ timeout_ms = 5000 })
          if not m then break end
          if m:byte(1) == 1 then out[#out + 1] = m:sub(2) end
          if m:byte(1) == 3 then assert.are.equal('Success', json.decode(m:sub(2)).status) end
        end
        local text = table.concat(out)
        -- inside, the pod's env is whole, and nothing of the host's carrying shows
        for _, e in ipairs(env) do assert.is_truthy(text:find('\n' .. e.name .. '=' .. e.value .. '\n', 1, true), e.name) end
        assert.is_nil(text:find('KPOD_X_', 1, true))
        -- no host program wrote the loader's debug output
        local listing = io.popen('ls -A ' .. dir):read('a')
        assert.are.equal('', listing)
        pcall_json('DELETE', pod_path('env-pod') .. '?gracePeriodSeconds=0')
        util.rmdir(dir)
      end)
  end)
end)
