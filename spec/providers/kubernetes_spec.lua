-- mayura.sandbox.kubernetes: its options, the Pod and NetworkPolicy it sends (checked against
-- core/v1 and networking.k8s.io/v1 field names), what it makes of a Pod's status, its errors
-- against a loopback server answering as an API server does, and the agent's --stdio mode it
-- relies on (the agent's frames on standard input and output, two descriptors).
local core = require('mayura.core')
local kubernetes = require('mayura.sandbox.kubernetes')
local pod = require('mayura.sandbox._kube_pod')
local sandbox = require('mayura.sandbox')
local task = require('mayura._task')
local server = require('support.http_server')
local uv = require('luv')

-- the agent of the build (a LuaJIT build, build/luajit, shares build/'s)
local AGENT = os.getenv('MAYURA_AGENT') or ((os.getenv('MAYURA_BUILD') or 'build') .. '/mayura-agent')
do
  local f = io.open(AGENT)
  if f then f:close() else AGENT = 'build/mayura-agent' end
end
local TOKEN = 'eyJhbGciOiJSUzI1NiJ9.k8sTOKENword'

local function base(extra)
  local o = { server = 'https://10.1.2.3:6443', token = TOKEN, agent_image = 'mayura/agent:1' }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local function run_until(pred, ms)
  local timer = uv.new_timer()
  local expired = false
  timer:start(ms or 20000, 0, function() expired = true end)
  while not pred() and not expired do core.run_once() end
  timer:stop()
  timer:close()
  return pred()
end

describe('kubernetes_sandboxes options', function()
  it('needs a server and one way to the agent, and never shows the token', function()
    assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes, nil)
    assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes, { token = 'x', agent_image = 'a' })
    -- the agent comes from an image of its own or from the sandbox's image
    assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes, { server = 'https://k:6443', token = 'x' })
    for _, bad in ipairs({
      { server = 'ftp://x' }, { server = 'https://x/path' }, { server = 'http://10.1.2.3:8080' },
      { server = 'http://127.0.0.1.evil.example:80' }, { namespace = 'Not_A_Name' },
      { namespace = string.rep('a', 64) },
      { agent_in_image = true }, { image = 'bad image' }, { agent_path = 'relative' },
      { agent_path = '/a/../b' }, { pull_policy = 'Always' }, { runtime_class = 'Bad_Class' },
      { uid = 0 }, { cpus = 0 }, { memory_mib = 8 }, { workdir = 'rel' }, { cluster_cidrs = { '10.0.0.0/33' } },
      { cluster_cidrs = { 'nope' } }, { ca_file = 'rel.pem' }, { client_cert = '/c.pem' }, { unknown = 1 },
      { network_policy_enforced = 'yes' }, { client_cert = '/c', client_key = '/k' },
      { ca_data = 'not pem' }, { ca_data = '-----BEGIN CERTIFICATE-----', ca_file = '/ca.pem' },
    }) do
      local ok, e = pcall(kubernetes.kubernetes_sandboxes, base(bad))
      assert.is_false(ok, core.json.encode(bad))
      assert.are.equal('INVALID_CONFIG', e.code, core.json.encode(bad))
    end
    local err = assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes,
      base({ token = TOKEN .. '\n' }))
    assert.is_falsy(tostring(err):find(TOKEN, 1, true))
    local p = kubernetes.kubernetes_sandboxes(base())
    assert.are.same({ stdin = true, ports = true, desktop = false, network = { 'none', 'all' } }, p.features)
    -- the API cannot tell whether the cluster's network plugin enforces NetworkPolicies
    assert.is_false(p.enforced.network)
    assert.is_false(p.enforced.pids)
    assert.is_true(kubernetes.kubernetes_sandboxes(base({ network_policy_enforced = true })).enforced.network)
    assert.are.equal('/workspace', p.workdir)
    -- client certificates instead of a token
    local o = base({ client_cert = '/c.pem', client_key = '/k.pem' })
    o.token = nil
    kubernetes.kubernetes_sandboxes(o)
  end)
end)

describe('the Pod of a sandbox', function()
  local p = kubernetes.kubernetes_sandboxes(base({ memory_mib = 512, cpus = 2, workspace_mib = 1024, tmp_mib = 64,
    runtime_class = 'gvisor' }))
  local spec = { lifetime_ms = 90500, labels = { team = 'a', ['example.com/run'] = 'r-1' }, env = { SECRET = 's3' } }
  local m = pod.manifest(p, 'mayura-abc', spec, { lifetime_ms = 90500, expires_s = 2000000000 })

  it('is locked down as a Docker sandbox is', function()
    local s = m.spec
    assert.are.equal('Never', s.restartPolicy)
    assert.are.equal(91, s.activeDeadlineSeconds)   -- the lifetime, rounded up: the cluster ends it
    assert.is_false(s.automountServiceAccountToken)
    assert.is_false(s.enableServiceLinks)
    assert.is_false(s.hostNetwork)
    assert.is_false(s.hostPID)
    assert.is_false(s.hostIPC)
    assert.are.equal('gvisor', s.runtimeClassName)
    assert.are.equal(1300000, s.securityContext.runAsUser)
    assert.is_true(s.securityContext.runAsNonRoot)
    for _, c in ipairs({ s.containers[1], s.initContainers[1] }) do
      local sc = c.securityContext
      assert.are.equal(1300000, sc.runAsUser)
      assert.are.equal(1300000, sc.runAsGroup)
      assert.is_true(sc.runAsNonRoot)
      assert.is_false(sc.allowPrivilegeEscalation)
      assert.is_false(sc.privileged)
      assert.is_true(sc.readOnlyRootFilesystem)
      assert.are.same({ 'ALL' }, sc.capabilities.drop)
      assert.are.equal('RuntimeDefault', sc.seccompProfile.type)
      assert.are.equal('IfNotPresent', c.imagePullPolicy)
    end
  end)

  it('runs the agent --stdio as the first process, copied in by an init container', function()
    local c = m.spec.containers[1]
    assert.are.equal('sandbox', c.name)
    assert.are.same({ '/.mayura/agent' }, c.command)
    assert.are.same({ '--stdio', '--lifetime-ms', '90500', '--workdir', '/workspace' }, c.args)
    assert.is_true(c.stdin)
    assert.is_false(c.stdinOnce)
    assert.is_false(c.tty)
    assert.are.same({ cpu = '2000m', memory = '512Mi' }, c.resources.limits)
    assert.are.same(c.resources.limits, c.resources.requests)
    local init = m.spec.initContainers[1]
    assert.are.equal('mayura/agent:1', init.image)
    assert.are.same({ 'cp', '/mayura-agent', '/.mayura/agent' }, init.command)
    local mounts = {}
    for _, v in ipairs(c.volumeMounts) do mounts[v.mountPath] = v end
    assert.is_true(mounts['/.mayura'].readOnly)   -- the sandbox cannot replace its agent
    local vols = {}
    for _, v in ipairs(m.spec.volumes) do vols[v.name] = v end
    -- tmpfs within the memory limit
    assert.are.same({ medium = 'Memory', sizeLimit = '512Mi' }, vols.workdir.emptyDir)
    assert.are.same({ medium = 'Memory', sizeLimit = '64Mi' }, vols.tmp.emptyDir)
    assert.are.equal('workdir', mounts['/workspace'].name)
    assert.are.equal('tmp', mounts['/tmp'].name)
    -- the env goes through the agent's setup, never into the Pod
    assert.is_falsy(core.json.encode(m):find('s3', 1, true))
  end)

  it('carries the labels and ours, and the image the create names', function()
    local l = m.metadata.labels
    assert.are.equal('a', l.team)
    assert.are.equal('r-1', l['example.com/run'])
    assert.are.equal('mayura-abc', l['mayura.io/sandbox'])
    assert.are.equal(p.pool_id, l['mayura.io/pool'])
    assert.are.equal('2000000000', l['mayura.io/expires'])
    local other = pod.manifest(p, 'x', { lifetime_ms = 1000, image = 'alpine:3' }, { lifetime_ms = 1000, expires_s = 1 })
    assert.are.equal('alpine:3', other.spec.containers[1].image)
  end)

  it('needs no init container when the image holds the agent; pull = true pulls always', function()
    local q = kubernetes.kubernetes_sandboxes({ server = 'http://127.0.0.1:8001', agent_in_image = true,
      agent_path = '/usr/local/bin/mayura-agent', pull = true })
    local n = pod.manifest(q, 'x', { lifetime_ms = 1000 }, { lifetime_ms = 1000, expires_s = 1 })
    assert.is_nil(n.spec.initContainers)
    assert.are.same({ '/usr/local/bin/mayura-agent' }, n.spec.containers[1].command)
    assert.are.equal('Always', n.spec.containers[1].imagePullPolicy)
    for _, v in ipairs(n.spec.volumes) do assert.are_not.equal('mayura-agent', v.name) end
    local never = kubernetes.kubernetes_sandboxes(base({ pull_policy = 'Never' }))
    local nv = pod.manifest(never, 'x', { lifetime_ms = 1000 }, { lifetime_ms = 1000, expires_s = 1 })
    assert.are.equal('Never', nv.spec.containers[1].imagePullPolicy)
  end)
end)

describe('the NetworkPolicy of a sandbox', function()
  local p = kubernetes.kubernetes_sandboxes(base())
  it("'none' selects the Pod alone and allows nothing", function()
    local n = pod.network_policy(p, 'mayura-abc', 'none', 5)
    assert.are.same({ ['mayura.io/sandbox'] = 'mayura-abc' }, n.spec.podSelector.matchLabels)
    assert.are.same({ 'Ingress', 'Egress' }, n.spec.policyTypes)
    assert.are.same({}, n.spec.ingress)
    assert.are.same({}, n.spec.egress)
  end)
  it("'all' allows egress but to the cluster's ranges, and DNS to kube-dns alone", function()
    local a = pod.network_policy(p, 'mayura-abc', 'all', 5)
    assert.are.same({}, a.spec.ingress)
    local any = a.spec.egress[1].to
    assert.are.equal('0.0.0.0/0', any[1].ipBlock.cidr)
    local except = table.concat(any[1].ipBlock.except, ' ')
    for _, r in ipairs({ '10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '169.254.0.0/16' }) do
      assert.truthy(except:find(r, 1, true), r)
    end
    assert.are.equal('::/0', any[2].ipBlock.cidr)
    assert.are.same({ 'fc00::/7', 'fe80::/10' }, any[2].ipBlock.except)
    local dns = a.spec.egress[2]
    assert.are.equal('kube-dns', dns.to[1].podSelector.matchLabels['k8s-app'])
    assert.are.same({ 53, 53 }, { dns.ports[1].port, dns.ports[2].port })
    local own = kubernetes.kubernetes_sandboxes(base({ cluster_cidrs = { '10.96.0.0/12' } }))
    assert.are.same({ '10.96.0.0/12' }, pod.network_policy(own, 'x', 'all', 5).spec.egress[1].to[1].ipBlock.except)
  end)
end)

describe('labels', function()
  it('must be Kubernetes labels, none of ours', function()
    pod.check_labels({ a = '', ['app.kubernetes.io/name'] = 'web-1', x = string.rep('v', 63) })
    for _, bad in ipairs({
      { ['-a'] = 'x' }, { a = '-x' }, { a = string.rep('v', 64) }, { [string.rep('k', 64)] = 'x' },
      { ['Bad_Prefix/a'] = 'x' }, { ['a/b/c'] = 'x' }, { a = 'sp ace' }, { ['mayura.io/pool'] = 'x' },
      { ['x.mayura.io/y'] = 'x' }, { a = 'x\n' },
    }) do
      assert.raises_code('INVALID_INPUT', pod.check_labels, bad)
    end
  end)
end)

describe("a Pod's status", function()
  local function st(s, meta) return pod.status({ status = s, metadata = meta or {} }) end
  it('says running, waiting, failed (with a reason) or ended', function()
    assert.are.equal('running', (st({ phase = 'Running',
      containerStatuses = { { name = 'sandbox', state = { running = { startedAt = 'x' } } } } })))
    assert.are.equal('waiting', (st({ phase = 'Pending' })))
    for _, r in ipairs({ 'ImagePullBackOff', 'ErrImagePull', 'InvalidImageName', 'CreateContainerConfigError' }) do
      local state, why = st({ phase = 'Pending',
        containerStatuses = { { name = 'sandbox', state = { waiting = { reason = r, message = 'SERVER TEXT' } } } } })
      assert.are.equal('failed', state)
      assert.truthy(why:find(r, 1, true))
      assert.is_falsy(why:find('SERVER TEXT', 1, true))
    end
    local state, why = st({ phase = 'Pending',
      initContainerStatuses = { { name = 'mayura-agent', state = { terminated = { exitCode = 1 } } } } })
    assert.are.equal('failed', state)
    assert.truthy(why:find('init container', 1, true))
    assert.are.equal('ended', (st({ phase = 'Failed', reason = 'DeadlineExceeded' })))
    assert.are.equal('ended', (st({ phase = 'Running' }, { deletionTimestamp = '2026-01-01T00:00:00Z' })))
    local _, unsched = st({ phase = 'Pending', conditions = { { type = 'PodScheduled', status = 'False',
      reason = 'Unschedulable' } } })
    assert.truthy(unsched:find('scheduled', 1, true))
  end)
end)

describe('kubernetes errors', function()
  local srv, seen
  local answer = { status = 403, headers = {} }
  before_each(function()
    seen = {}
    srv = server.tcp(function(s, client, req)
      seen[#seen + 1] = req
      local headers = { { 'Content-Type', 'application/json' } }
      for _, h in ipairs(answer.headers) do headers[#headers + 1] = h end
      s:respond(client, answer.status, headers, core.json.encode({ kind = 'Status', status = 'Failure',
        message = 'SERVER TEXT ' .. TOKEN, reason = 'Forbidden', code = answer.status }))
    end)
  end)
  after_each(function() srv:close() end)

  local function create_error(status, extra)
    answer.status, answer.headers = status, extra or {}
    local p = kubernetes.kubernetes_sandboxes(base({ server = srv:url(''):gsub('/$', ''), retries = 0 }))
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 600000, network = { 'none', 'all' } })
    local err
    task.run(function()
      local ok, e = pcall(pool.create, pool, { lifetime_ms = 60000 })
      err = not ok and e or 'created'
      pool:close()
    end)
    assert(run_until(function() return err ~= nil end, 20000))
    return err
  end

  it("maps the API server's statuses to coded errors without its text or the token", function()
    for status, reason in pairs({ [401] = 'authentication', [403] = 'authentication', [409] = 'conflict',
        [422] = 'failed', [500] = 'unavailable' }) do
      local err = create_error(status)
      assert.are.equal('SANDBOX_ERROR', err.code, tostring(status))
      assert.are.equal(reason, err.reason, tostring(status))
      assert.are.equal(status, err.status)
      local text = tostring(err) .. core.json.encode({ m = err.message })
      assert.is_falsy(text:find('SERVER TEXT', 1, true))
      assert.is_falsy(text:find(TOKEN, 1, true))
    end
    -- the token travelled in the Authorization header alone, the policy went first
    local req = seen[#seen]
    assert.are.equal('Bearer ' .. TOKEN, req.headers.authorization)
    assert.are.equal('POST', req.method)
    assert.are.equal('/apis/networking.k8s.io/v1/namespaces/default/networkpolicies', req.target)
  end)

  it('says when to come back on a 429', function()
    local err = create_error(429, { { 'Retry-After', '120' } })
    assert.are.equal('rate_limited', err.reason)
    assert.are.equal(120000, err.retry_after_ms)
  end)

  it('refuses bad labels, and ports without network all, before any call', function()
    local p = kubernetes.kubernetes_sandboxes(base({ server = srv:url(''):gsub('/$', '') }))
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 600000, network = { 'none', 'all' } })
    local errs = {}
    task.run(function()
      for _, s in ipairs({ { lifetime_ms = 60000, labels = { ['-bad'] = 'x' } },
          { lifetime_ms = 60000, ports = { 8080 } } }) do
        local ok, e = pcall(pool.create, pool, s)
        errs[#errs + 1] = not ok and e or 'created'
      end
      pool:close()
    end)
    assert(run_until(function() return #errs == 2 end, 20000))
    for _, e in ipairs(errs) do assert.are.equal('INVALID_INPUT', e.code) end
    assert.are.equal(0, #seen)
  end)
end)

describe('the agent --stdio', function()
  -- The agent reads frames on one socket pair (its stdin) and writes them on another (its stdout);
  -- the spec joins the two into one channel through a third pair.
  local function start_stdio(extra)
    local in_host, in_agent = core.socketpair()
    local out_agent, out_host = core.socketpair()
    local mine, relay = core.socketpair()
    local argv = { '/bin/sh', '-c', 'exec "$0" --stdio --lifetime-ms 60000 --workdir /tmp ' .. (extra or '')
      .. ' <&3 >&4', AGENT }
    local ag = {}
    ag.proc = assert(core.spawn({ argv = argv, fds = { in_agent, out_agent } }, function(r) ag.result = r end))
    core.close_fd(in_agent)
    core.close_fd(out_agent)
    local to_agent, from_agent, joined = uv.new_pipe(false), uv.new_pipe(false), uv.new_pipe(false)
    to_agent:open(in_host)
    from_agent:open(out_host)
    joined:open(relay)
    joined:read_start(function(err, data)
      if err or not data then return to_agent:close() end
      to_agent:write(data)
    end)
    from_agent:read_start(function(err, data)
      if err or not data then return joined:close() end
      joined:write(data)
    end)
    ag.ch = core.channel(mine, { on_close = function() ag.closed = true end })
    function ag.call(req)
      local r
      ag.ch:call(req, function(x, e) r = x or e end)
      assert(run_until(function() return r ~= nil end, 10000))
      return r
    end
    function ag.stop()
      if not to_agent:is_closing() then to_agent:close() end
    end
    return ag
  end

  it('serves the protocol on standard input and output, and ends with its input', function()
    local ag = start_stdio()
    assert.is_truthy(ag.call({ op = 'hello' }).version)
    assert.is_true(ag.call({ op = 'setup', workdir = '/tmp', env = { K8S = 'yes' } }).ok ~= false)
    local r = ag.call({ op = 'exec', argv = { '/bin/sh', '-c', 'echo "$K8S"; ls /proc/self/fd' }, timeout_ms = 5000 })
    assert.are.equal(0, r.exit_code)
    local lines = {}
    for l in r.stdout:gmatch('[^\n]+') do lines[#lines + 1] = l end
    assert.are.equal('yes', lines[1])
    -- a command holds none of the agent's descriptors: 0, 1, 2 and ls's own directory
    assert.are.same({ '0', '1', '2', '3' }, { lines[2], lines[3], lines[4], lines[5] })
    assert.is_nil(lines[6])
    local big = string.rep('k', 3 * 1048576 + 17)
    assert.is_nil(ag.call({ op = 'write', path = '/tmp/mayura-k8s-stdio-' .. ag.proc:pid(), data = big }).error)
    local back = ag.call({ op = 'read', path = '/tmp/mayura-k8s-stdio-' .. ag.proc:pid(), max_bytes = 8 * 1048576,
      offset = 0, length = 8 * 1048576 })
    assert.are.equal(#big, #back.data)
    os.remove('/tmp/mayura-k8s-stdio-' .. ag.proc:pid())
    ag.stop()
    assert(run_until(function() return ag.result ~= nil end, 10000))
    assert.are.equal(0, ag.result.exit_code)
  end)

  it('refuses --stdio with --fd or --listen', function()
    for _, argv in ipairs({
      { AGENT, '--stdio', '--fd', '0', '--lifetime-ms', '100' },
      { AGENT, '--stdio', '--listen', '/tmp/mayura-k8s-x', '--lifetime-ms', '100' },
      { AGENT, '--stdio' },
    }) do
      local r
      core.spawn({ argv = argv }, function(x) r = x end)
      assert(run_until(function() return r ~= nil end, 5000))
      assert.are.equal(2, r.exit_code, table.concat(argv, ' '))
    end
  end)
end)

describe('the attach and port-forward streams', function()
  local process = require('mayura.process')
  local util = require('support.util')
  local attach = require('mayura.sandbox._kube_attach')
  local agent_backend = require('mayura.sandbox._agent_backend')
  local f = io.open('spec/npm/node_modules/ws/package.json')
  if not f then
    pending('the ws package is not installed (sh scripts/setup.sh installs spec/npm)')
    return
  end
  f:close()
  local dir, srv, base_url
  local function conn(token)
    return {
      ws_base = 'ws://127.0.0.1:' .. base_url,
      headers = function() return { Authorization = 'Bearer ' .. (token or 'good') } end,
      status_error = function(status)
        local e = sandbox.sandbox_http_failure(status)
        e.message = 'kubernetes: the API server answered HTTP ' .. status .. ' to an attach'
        return e
      end,
    }
  end

  setup(function()
    dir = util.tmpdir()
    srv = task.spawn(function()
      return process.run({ 'node', 'spec/npm/kube_streams.mjs', dir .. '/port', AGENT, dir }, { timeout_ms = 300000 })
    end)
    base_url = util.eventually(function()
      local pf = io.open(dir .. '/port')
      local p = pf and pf:read('a')
      if pf then pf:close() end
      return p ~= nil and p ~= '' and p
    end, 10000)
    assert(base_url)
  end)

  teardown(function()
    task.run(function()
      pcall(require('mayura.http').request, { url = 'http://127.0.0.1:' .. base_url .. '/quit', timeout_ms = 5000 })
    end)
    srv:wait()
    util.rmdir(dir)
  end)

  local Backend = agent_backend.class()
  function Backend.release() end

  it("carry the agent's protocol over channels 0 and 1, and the Pod's end makes the sandbox gone", function()
    task.run(function()
      local b = setmetatable({ closed = false }, Backend)
      b.ch, b.session = attach.agent(conn(), '/api/v1/namespaces/ns/pods/p1', function() b.closed = true end)
      agent_backend.handshake(b, { FROM = 'setup' }, dir)
      local r = b:exec({ '/bin/sh', '-c', 'echo "$FROM"; echo err >&2; exit 3' }, { timeout_ms = 5000 })
      assert.are.same({ 3, 'setup\n', 'err\n' }, { r.exit_code, r.stdout, r.stderr })
      -- streamed output, standard input, and files of several parts both ways
      local chunks = {}
      r = b:exec({ '/bin/sh', '-c', 'cat; echo one; sleep 0.1; echo two' }, { timeout_ms = 5000, stdin = 'in\n',
        on_output = function(name, data) chunks[#chunks + 1] = name .. ':' .. data end })
      assert.are.equal('in\none\ntwo\n', r.stdout)
      assert.is_true(#chunks >= 2)
      local big = string.rep('0123456789abcdef', 200000) .. 'end'
      b:write_file(dir .. '/big', big)
      assert.is_true(b:read_file(dir .. '/big', {}) == big)
      -- a command's tree is killed at its timeout
      r = b:exec({ '/bin/sh', '-c', 'sleep 30 & sleep 30' }, { timeout_ms = 300 })
      assert.is_true(r.timed_out)
      -- the Pod deleted behind the host: the attach ends, and every call is gone
      require('mayura.http').request({ url = 'http://127.0.0.1:' .. base_url .. '/api/v1/namespaces/ns/pods/p1',
        method = 'DELETE', timeout_ms = 5000 })
      local ok, err = pcall(function()
        for _ = 1, 50 do
          b:exec({ 'true' }, { timeout_ms = 1000 })
          task.await(function(done) task.after(50, done, true) end)
        end
      end)
      assert.is_false(ok)
      assert.are.equal('gone', err.reason)
      assert.is_true(b.closed)
    end)
  end)

  it('falls back to v4.channel.k8s.io where the server has no v5', function()
    task.run(function()
      local b = setmetatable({ closed = false }, Backend)
      b.ch, b.session = attach.agent(conn(), '/api/v1/namespaces/ns/pods/v4-p', function() b.closed = true end)
      agent_backend.handshake(b, nil, dir)
      assert.are.equal('v4\n', b:exec({ 'echo', 'v4' }, { timeout_ms = 5000 }).stdout)
      b.session.close()
      assert.is_true(b.closed)
    end)
  end)

  it('maps a refused handshake to its coded error', function()
    task.run(function()
      local ok, err = pcall(attach.agent, conn('bad'), '/api/v1/namespaces/ns/pods/p2')
      assert.is_false(ok)
      assert.are.equal('authentication', err.reason, err.message)
      assert.are.equal(403, err.status)
    end)
  end)

  it('serves a port of the Pod on 127.0.0.1, one port-forward a connection', function()
    task.run(function()
      -- a TCP echo server standing for the Pod's port
      local echo = uv.new_tcp()
      echo:bind('127.0.0.1', 0)
      echo:listen(8, function()
        local c = uv.new_tcp()
        echo:accept(c)
        c:read_start(function(err, data)
          if err or not data then return c:close() end
          c:write('echo:' .. data)
        end)
      end)
      local port = echo:getsockname().port
      local fwd = attach.forward(conn(), '/api/v1/namespaces/ns/pods/p3', port)
      assert.matches('^http://127%.0%.0%.1:%d+$', fwd.url)
      for round = 1, 2 do
        local got = task.await(function(done)
          local c = uv.new_tcp()
          c:connect('127.0.0.1', tonumber(fwd.url:match(':(%d+)$')), function(err)
            if err then return done(nil) end
            c:read_start(function(_, data)
              c:close()
              done(data)
            end)
            c:write('ping' .. round)
          end)
        end)
        assert.are.equal('echo:ping' .. round, got)
      end
      fwd.close()
      echo:close()
    end)
  end)
end)

-- {======================================================
-- Against the API server stand-in (support/kube_service.lua): Pods as real namespaced processes
-- =======================================================

describe('kubernetes sandboxes on the API server stand-in', function()
  local pods_rt = require('support.kube_pods')
  if not pods_rt.available() then
    pending('needs root, bubblewrap, nsenter, setpriv and build/mayura-launch')
    return
  end
  local stand_in = require('support.stand_in')
  local kube = require('support.kube_service')
  local suite = require('support.stand_in_suite')
  local util = require('support.util')
  local NS = 'sandboxes'
  local svc, state, provider, pool, sb

  local function options(extra)
    local o = { server = state.server, ca_file = state.ca_file, token = TOKEN, namespace = NS,
      image = 'busybox:1', agent_image = 'mayura/agent:1', retry_base_ms = 20, start_timeout_ms = 20000 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end

  local function api(method, path)
    local r = require('mayura.http').request({ url = state.server .. path, method = method,
      headers = { Authorization = 'Bearer ' .. TOKEN, Accept = 'application/json' }, ca_file = state.ca_file,
      timeout_ms = 20000 })
    local ok, v = pcall(core.json.decode, r.body)
    return r.status, ok and v or nil
  end

  local function pod_path(name) return '/api/v1/namespaces/' .. NS .. '/pods/' .. name end

  setup(function()
    svc = stand_in.new()
    state = kube.install(svc, nil, { token = TOKEN, namespace = NS, images = { 'busybox:1', 'mayura/agent:1' } })
    provider = kubernetes.kubernetes_sandboxes(options())
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 600000,
      network = { 'none', 'all' }, labels = { suite = 'k8s' } })
    sb = pool:create({ lifetime_ms = 600000, labels = { case = 'conformance' } })
  end)
  teardown(function()
    pool:close()
    svc:close()
    assert.are.same({}, svc.failures)
  end)

  it('makes a locked-down Pod and its NetworkPolicy, and deletes both at release', function()
    local name = sb._backend.id
    local status, p = api('GET', pod_path(name))
    assert.are.equal(200, status)
    assert.are.equal('Running', p.status.phase)
    assert.are.equal('k8s', p.metadata.labels.suite)
    assert.are.equal('conformance', p.metadata.labels.case)
    assert.are.equal(name, p.metadata.labels['mayura.io/sandbox'])
    local c = p.spec.containers[1]
    assert.are.same({ 'ALL' }, c.securityContext.capabilities.drop)
    assert.is_true(c.securityContext.readOnlyRootFilesystem)
    local np_path = '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies/' .. name
    local np_status, np = api('GET', np_path)
    assert.are.equal(200, np_status)
    assert.are.same({}, np.spec.egress or {})
    -- inside: the uid of no account, the read-only root, the tmpfs workdir
    local r = sb:exec({ 'sh', '-c', 'id -u; touch /etc/x 2>/dev/null && echo writable; pwd; echo hi > f && cat f' })
    assert.are.equal('1300000\n/workspace\nhi\n', r.stdout)
    local other = pool:create({ lifetime_ms = 60000, network = 'all' })
    local oname = other._backend.id
    local _, onp = api('GET', '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies/' .. oname)
    assert.are.equal('0.0.0.0/0', onp.spec.egress[1].to[1].ipBlock.cidr)
    other:release()
    assert.is_true(util.eventually(function() return (api('GET', pod_path(oname))) == 404 end, 10000))
    assert.are.equal(404, (api('GET', '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies/' .. oname)))
  end)

  suite.conformance(function() return sb end)

  it('is gone when its Pod is deleted or evicted behind the pool', function()
    for _, how in ipairs({ 'delete', 'evict' }) do
      local s = pool:create({ lifetime_ms = 60000 })
      assert.are.equal('ok\n', s:exec({ 'echo', 'ok' }).stdout)
      if how == 'delete' then
        api('DELETE', pod_path(s._backend.id) .. '?gracePeriodSeconds=0')
      else
        state:evict(NS, s._backend.id)
      end
      local ok, err = pcall(function()
        for _ = 1, 100 do
          s:exec({ 'true' })
          task.await(function(done) task.after(50, done, true) end)
        end
      end)
      assert.is_false(ok, how)
      assert.are.equal('SANDBOX_ERROR', err.code, how)
      assert.are.equal('gone', err.reason, how)
      s:release()
    end
  end)

  it('fails a create whose image cannot be pulled, or that cannot be scheduled, with a reason', function()
    state.pull_failures = state.pull_failures or {}
    state.pull_failures['nowhere/image:1'] = true
    local ok, err = pcall(pool.create, pool, { lifetime_ms = 60000, image = 'nowhere/image:1' })
    assert.is_false(ok)
    assert.are.equal('failed', err.reason)
    assert.truthy(err.message:find('pulled', 1, true), err.message)
    state.unschedulable = true
    local quick = kubernetes.kubernetes_sandboxes(options({ start_timeout_ms = 1500 }))
    local qpool = sandbox.create_sandboxes(quick, { max_sandboxes = 1, max_lifetime_ms = 600000 })
    ok, err = pcall(qpool.create, qpool, { lifetime_ms = 60000 })
    state.unschedulable = false
    qpool:close()
    assert.is_false(ok)
    assert.are.equal('unavailable', err.reason, err.message)
    assert.truthy(err.message:find('scheduled', 1, true), err.message)
    -- nothing of either is left
    local _, list = api('GET', '/api/v1/namespaces/' .. NS .. '/pods?labelSelector=mayura.io%2Fsandbox')
    for _, item in ipairs(list.items) do
      assert.is_truthy(item.metadata.labels.suite, 'a pod of a failed create is left: ' .. item.metadata.name)
    end
  end)

  it('serves a port of a network all sandbox on 127.0.0.1 through a port-forward', function()
    local s = pool:create({ lifetime_ms = 60000, network = 'all', ports = { 8080 } })
    s:exec({ 'sh', '-c', 'mkdir -p www && echo served > www/index.html' })
    s:start({ 'sh', '-c', 'cd www && exec busybox httpd -f -p 127.0.0.1:8080' })
    local url = s:url(8080)
    assert.matches('^http://127%.0%.0%.1:%d+$', url)
    local body
    assert.is_true(util.eventually(function()
      local okr, res = pcall(require('mayura.http').request, { url = url .. '/index.html', timeout_ms = 5000 })
      body = okr and res.status == 200 and res.body or nil
      return body ~= nil
    end, 10000))
    assert.are.equal('served\n', body)
    s:release()
  end)

  it('deletes what a host that died left: Pods and policies past their expiry, and Pods that ended', function()
    local http = require('mayura.http')
    local function post(path, body)
      local r = http.request({ url = state.server .. path, method = 'POST', ca_file = state.ca_file, timeout_ms = 20000,
        headers = { Authorization = 'Bearer ' .. TOKEN, ['Content-Type'] = 'application/json' },
        body = core.json.encode(body) })
      assert(r.status == 201, r.body)
    end
    local past = tostring(math.floor(core.now_ms() / 1000) - 60)
    local future = tostring(math.floor(core.now_ms() / 1000) + 3600)
    local function left(name, expires, command)
      local labels = { ['mayura.io/sandbox'] = name, ['mayura.io/pool'] = 'dead01', ['mayura.io/expires'] = expires }
      post('/api/v1/namespaces/' .. NS .. '/pods', { apiVersion = 'v1', kind = 'Pod',
        metadata = { name = name, labels = labels },
        spec = { restartPolicy = 'Never', containers = { { name = 'sandbox', image = 'busybox:1', command = command } } } })
      post('/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies', { apiVersion = 'networking.k8s.io/v1',
        kind = 'NetworkPolicy', metadata = { name = name, labels = labels },
        spec = { podSelector = { matchLabels = { ['mayura.io/sandbox'] = name } }, policyTypes = { 'Ingress' } } })
    end
    left('mayura-expired', past, { 'sleep', '600' })
    left('mayura-ended', future, { 'true' })
    left('mayura-alive', future, { 'sleep', '600' })
    assert.is_true(util.eventually(function()
      local _, p = api('GET', pod_path('mayura-ended'))
      return p and p.status and p.status.phase == 'Succeeded'
    end, 10000))
    -- a provider made after the host's death sweeps at its first create
    local later = sandbox.create_sandboxes(kubernetes.kubernetes_sandboxes(options()), { max_sandboxes = 1,
      max_lifetime_ms = 600000 })
    later:create({ lifetime_ms = 60000 }):release()
    local policies = '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies/'
    assert.is_true(util.eventually(function()
      return (api('GET', pod_path('mayura-expired'))) == 404 and (api('GET', pod_path('mayura-ended'))) == 404
        and (api('GET', policies .. 'mayura-expired')) == 404
    end, 10000))
    -- what is not past its time stays: another host's live sandbox
    assert.are.equal(200, (api('GET', pod_path('mayura-alive'))))
    assert.are.equal(200, (api('GET', policies .. 'mayura-alive')))
    later:close()
    api('DELETE', pod_path('mayura-alive') .. '?gracePeriodSeconds=0')
    api('DELETE', policies .. 'mayura-alive')
    api('DELETE', policies .. 'mayura-ended')
  end)

  it("runs through the Agent Sandbox controller: a Sandbox of its Pod, or a claim of a template", function()
    local http = require('mayura.http')
    local ax = '/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/' .. NS
    local as = '/apis/agents.x-k8s.io/v1beta1/namespaces/' .. NS
    -- a template an operator made: the provider's own Pod, with the agent --stdio
    local tpl_pod = pod.manifest(kubernetes.kubernetes_sandboxes(options()), 'tpl', { lifetime_ms = 600000 },
      { lifetime_ms = 600000, expires_s = 1 })
    local r = http.request({ url = state.server .. ax .. '/sandboxtemplates', method = 'POST', ca_file = state.ca_file,
      headers = { Authorization = 'Bearer ' .. TOKEN, ['Content-Type'] = 'application/json' }, timeout_ms = 20000,
      body = core.json.encode({ apiVersion = 'extensions.agents.x-k8s.io/v1alpha1', kind = 'SandboxTemplate',
        metadata = { name = 'coder' }, spec = { podTemplate = { spec = tpl_pod.spec } } }) })
    assert.are.equal(201, r.status, r.body)
    for _, o in ipairs({ { mode = 'agent-sandbox' }, { mode = 'agent-sandbox', template = 'coder' } }) do
      local apool = sandbox.create_sandboxes(kubernetes.kubernetes_sandboxes(options(o)), { max_sandboxes = 1,
        max_lifetime_ms = 600000 })
      local s = apool:create({ lifetime_ms = 60000, labels = { via = 'agent-sandbox' } })
      assert.are.equal('via the controller\n', s:exec({ 'echo', 'via the controller' }).stdout)
      local name = s._backend.id
      local resource = o.template and (ax .. '/sandboxclaims/' .. name) or (as .. '/sandboxes/' .. name)
      local status, obj = api('GET', resource)
      assert.are.equal(200, status, resource)
      assert.truthy(obj.spec.shutdownTime or obj.spec.lifecycle.shutdownTime)
      -- its Pod carries our labels: the policy selects it
      local _, p = api('GET', s._backend.path:gsub('^/api/v1/namespaces/[^/]+/pods/', '/api/v1/namespaces/' .. NS
        .. '/pods/'))
      assert.are.equal(name, p.metadata.labels['mayura.io/sandbox'])
      assert.are.equal('agent-sandbox', p.metadata.labels.via)
      local pod_api = s._backend.path
      s:release()
      assert.are.equal(404, (api('GET', resource)))
      assert.is_true(util.eventually(function() return (api('GET', pod_api)) == 404 end, 10000))
      apool:close()
    end
    assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes, options({ template = 'coder' }))
    assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes, options({ mode = 'vm' }))
  end)

  it('keeps an idle attach busy with the agent\'s ping, and stops at the release', function()
    local kpool = sandbox.create_sandboxes(kubernetes.kubernetes_sandboxes(options({ keepalive_ms = 1000 })),
      { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local s = kpool:create({ lifetime_ms = 60000 })
    local b = s._backend
    -- count the agent's answers: each ping is a request and its reply through the attach
    local calls, real = 0, b.ch
    b.ch = {
      call = function(_, req, ...)
        if req.op == 'ping' then calls = calls + 1 end
        return real:call(req, ...)
      end,
      close = function() return real:close() end,
    }
    task.await(function(done) task.after(2600, done, true) end)
    assert.is_true(calls >= 2, calls .. ' pings')
    assert.are.equal('idle\n', s:exec({ 'echo', 'idle' }).stdout)
    s:release()
    assert.is_nil(b.pinger)
    kpool:close()
    assert.raises_code('INVALID_CONFIG', kubernetes.kubernetes_sandboxes, options({ keepalive_ms = 10 }))
  end)

  it("maps RBAC's refusals and a 429 to coded errors, leaving nothing made", function()
    local function count(plural)
      local n = 0
      for _ in pairs((state.objects[plural] or {})[NS] or {}) do n = n + 1 end
      return n
    end
    local before_pods, before_policies = count('pods'), count('networkpolicies')
    for _, rule in ipairs({ 'create pods/attach', 'create pods', 'create networkpolicies' }) do
      state.forbidden[rule] = true
      local ok, err = pcall(pool.create, pool, { lifetime_ms = 60000 })
      state.forbidden[rule] = nil
      assert.is_false(ok, rule)
      assert.are.equal('authentication', err.reason, rule .. ': ' .. tostring(err.message))
      assert.are.equal(403, err.status, rule)
      assert.is_falsy(tostring(err.message):find('forbidden', 1, true), rule)
      assert.is_true(util.eventually(function()
        return count('pods') == before_pods and count('networkpolicies') == before_policies
      end, 10000), rule .. ': something was left')
    end
    svc:fault('POST', '/api/v1/namespaces/{ns}/pods', kube.too_many_requests(90), 1)
    local ok, err = pcall(pool.create, pool, { lifetime_ms = 60000 })
    assert.is_false(ok)
    assert.are.equal('rate_limited', err.reason)
    assert.are.equal(90000, err.retry_after_ms)
    assert.is_true(util.eventually(function() return count('networkpolicies') == before_policies end, 10000))
  end)

  it('authenticates with a client certificate instead of a token, trusting the authority given as text', function()
    if not state.client_cert_file then
      pending('the stand-in made no client certificate')
      return
    end
    -- and the authority as PEM text (a kubeconfig's certificate-authority-data), no file
    local f = assert(io.open(state.ca_file))
    local o = options({ client_cert = state.client_cert_file, client_key = state.client_key_file, ca_data = f:read('a') })
    f:close()
    o.token, o.ca_file = nil, nil
    local cpool = sandbox.create_sandboxes(kubernetes.kubernetes_sandboxes(o), { max_sandboxes = 1,
      max_lifetime_ms = 600000 })
    local s = cpool:create({ lifetime_ms = 60000 })
    assert.are.equal('cert\n', s:exec({ 'echo', 'cert' }).stdout)
    cpool:close()
  end)
end)
