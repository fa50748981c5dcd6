--- mayura.sandbox.kubernetes: sandboxes as Pods of a Kubernetes cluster, each running the
-- mayura agent as its first process, reached through the API server alone.
--
--   local kubernetes = require('mayura.sandbox.kubernetes')
--   local provider = kubernetes.kubernetes_sandboxes({
--     server = 'https://10.0.0.1:6443', ca_file = '/etc/k/ca.crt', token = t, namespace = 'sandboxes',
--     image = 'debian:bookworm-slim', agent_image = 'registry.example/mayura-agent:1',
--   })
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4 })
--
-- Options: `server` (required: the API server's https:// URL; http:// only on this machine, for a
-- local proxy such as `kubectl proxy`), `ca_file` (a PEM file of the cluster's authority) or
-- `ca_data` (its PEM text, a kubeconfig's certificate-authority-data decoded), `token` (a bearer token) or
-- `client_cert` with `client_key` (PEM files), `namespace` ('default'), `image` (the sandboxes'
-- image: sh and coreutils or BusyBox; a create's `image` names another), `agent_image` (an image
-- holding the static agent, build/mayura-agent, at `agent_path` ('/mayura-agent') and `cp`: an
-- init container copies it into an emptyDir at /.mayura) or `agent_in_image = true` (the image
-- holds the agent at `agent_path` already), `pull` (false: imagePullPolicy IfNotPresent, or
-- `pull_policy = 'Never'`; true: Always), `runtime_class` (runtimeClassName: gVisor, Kata),
-- `uid` (the sandboxes' uid and gid, of no account: 1300000), `cpus` (1), `memory_mib` (1024),
-- `workspace_mib` (512) and `tmp_mib` (128) (tmpfs, within memory_mib), `workdir` (/workspace),
-- `max_lifetime_ms` (24 h), `start_timeout_ms` (120000: how long a Pod may stay Pending),
-- `cluster_cidrs` (what network 'all' keeps a sandbox from: RFC 1918, 100.64.0.0/10, 127.0.0.0/8,
-- 169.254.0.0/16 with the cloud metadata address, fc00::/7, fe80::/10), `network_policy_enforced`
-- (false), `warm` (0), `keepalive_ms` (30000: an idle attach carries the agent's ping this often,
-- so that no proxy or load balancer before the API server, nor the kubelet's idle timeout, ends
-- it), `retries`, `retry_base_ms`, `max_retry_after_ms` (the hosted kit's).
-- `mode = 'agent-sandbox'` makes each sandbox through the Agent Sandbox controller
-- (kubernetes-sigs/agent-sandbox), where the cluster runs it: a Sandbox (agents.x-k8s.io/v1beta1)
-- whose Pod template is the Pod below, or, with `template`, a SandboxClaim
-- (extensions.agents.x-k8s.io/v1alpha1) of that SandboxTemplate, whose Pod must run the agent
-- `--stdio` with `stdin: true` itself (and gets our labels); the Pod is then the Sandbox's, and a
-- release deletes the resource and the Pod. The library reads no environment variable and no file
-- it was not named: a kubeconfig is the caller's to read (examples/kubernetes_kubeconfig.lua).
--
-- A create makes the sandbox's NetworkPolicy, then its Pod (mayura.sandbox._kube_pod: locked
-- down, `activeDeadlineSeconds` its lifetime, the agent `--stdio` its first process), waits for
-- its container to run (a bad image, an init container that failed: SANDBOX_ERROR `failed` with
-- the reason; still Pending past start_timeout_ms: `unavailable`), and attaches to it
-- (mayura.sandbox._kube_attach): the agent's channel then serves mayura.sandbox._agent_backend,
-- as on local and Docker. `url(port)` serves a port-forward on 127.0.0.1. A release deletes the
-- Pod at once (gracePeriodSeconds 0) and its policy; the host also releases a sandbox a little
-- after its lifetime, and the cluster ends its Pod at the deadline even when the host is gone. A
-- Pod deleted or evicted behind the pool ends its attach: the sandbox is `gone`.
--
-- Network: 'none' is a NetworkPolicy refusing the Pod all ingress and egress; 'all' one allowing
-- egress to anywhere but `cluster_cidrs`, and DNS to kube-dns. Whether the cluster enforces
-- NetworkPolicies is its network plugin's business, which the API does not tell:
-- `enforced.network` is the `network_policy_enforced` option, false unless the caller knows.
-- A domain allow-list would need an egress proxy: refused (INVALID_INPUT).
--
-- Leftovers: each Pod and policy carries `mayura.io/sandbox` (its name), `mayura.io/pool` (the
-- provider's id) and `mayura.io/expires` (unix seconds); creates sweep, at most every 30 s, the
-- Pods and policies of the namespace past their expiry and the Pods that ended, so a host that
-- crashed leaves nothing for long. Labels of a create are Kubernetes labels (checked: INVALID_INPUT).
--
-- Failures: every non-2xx answer is SANDBOX_ERROR through the hosted kit (401/403
-- authentication, 404 not_found, 409 conflict, 429 rate_limited with `retry_after_ms`, 5xx
-- unavailable, 422 failed), never with the server's text; the token is in no message or URL.
--
-- `features`: stdin, ports (port-forward), network { 'none', 'all' }, no desktop. `enforced`:
-- memory, cpus, lifetime and the tmpfs sizes by the cluster; no process cap (Kubernetes has none
-- per Pod); network as said. An exec killed by SIGKILL is `oom_killed` when the container's cgroup
-- (read through the agent) counts a new OOM kill.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local sandbox = require('mayura.sandbox')
local hosted = require('mayura.sandbox._hosted')
local agent_backend = require('mayura.sandbox._agent_backend')
local host_util = require('mayura.sandbox._host')
local pod = require('mayura.sandbox._kube_pod')
local attach = require('mayura.sandbox._kube_attach')

local M = {}

local MIB = 1048576
local DEFAULT_IMAGE = 'debian:bookworm-slim'
local DEFAULT_UID = 1300000
local LIFETIME_GRACE_MS = 2000
local SWEEP_EVERY_MS = 30000
local CLUSTER_CIDRS = { '10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '169.254.0.0/16',
  '127.0.0.0/8', 'fc00::/7', 'fe80::/10' }
local IMAGE_PATTERN = '^[%w][%w%._/:@%-]*$'

local C = 'INVALID_CONFIG'

local option_keys = {
  server = true, ca_file = true, ca_data = true, token = true, client_cert = true, client_key = true, namespace = true,
  image = true, agent_image = true, agent_in_image = true, agent_path = true, pull = true, pull_policy = true,
  runtime_class = true, uid = true, cpus = true, memory_mib = true, workspace_mib = true, tmp_mib = true,
  workdir = true, max_lifetime_ms = true, start_timeout_ms = true, cluster_cidrs = true,
  network_policy_enforced = true, warm = true, retries = true, retry_base_ms = true, max_retry_after_ms = true,
  mode = true, template = true, keepalive_ms = true,
}

local function fail(msg)
  errors.raise(C, 'kubernetes: ' .. msg, nil, 0)
end

-- An IPv4 or IPv6 CIDR (checked for its form, not routed anywhere).
local function cidr_ok(s)
  if type(s) ~= 'string' or #s > 64 then return false end
  local a, b, c, d, n = s:match('^(%d+)%.(%d+)%.(%d+)%.(%d+)/(%d+)$')
  if a then
    for _, x in ipairs({ a, b, c, d }) do if tonumber(x) > 255 then return false end end
    return tonumber(n) <= 32
  end
  local addr, bits = s:match('^([%x:]+)/(%d+)$')
  return addr ~= nil and addr:find(':', 1, true) ~= nil and tonumber(bits) <= 128
end

local function bool_option(v, name)
  if v ~= nil and type(v) ~= 'boolean' then fail(name .. ' must be a boolean') end
  return v == true
end

-- The options, checked: what the provider keeps of them.
local function read_options(options)
  if type(options) ~= 'table' then fail('kubernetes_sandboxes needs an options table with server') end
  check.keys(options, option_keys, 'kubernetes options', C, 4)
  local server = options.server
  if type(server) ~= 'string' or not server:match('^https?://[%w%.%-%[%]:]+/?$') then
    fail('server must be the API server\'s https:// URL (scheme, host and port)')
  end
  -- the token or the certificate's session would cross the network in the clear
  local plain_host = server:match('^http://([^/]+)')
  if plain_host and not (plain_host:match('^127%.0%.0%.1:?%d*$') or plain_host:match('^localhost:?%d*$')
      or plain_host:match('^%[::1%]:?%d*$')) then
    fail('server may be http:// only on this machine (a local proxy such as kubectl proxy): use https://')
  end
  if options.token ~= nil and options.client_cert ~= nil then fail('give token or client_cert, not both') end
  local ca_data = options.ca_data
  if ca_data ~= nil and (type(ca_data) ~= 'string' or not ca_data:find('-----BEGIN CERTIFICATE-----', 1, true)
      or #ca_data > 1048576 or ca_data:find('%z') or options.ca_file ~= nil) then
    fail('ca_data must be the cluster authority\'s PEM text (and not with ca_file)')
  end
  for _, name in ipairs({ 'ca_file', 'client_cert', 'client_key' }) do
    local v = options[name]
    if v ~= nil and (type(v) ~= 'string' or v:sub(1, 1) ~= '/' or v:find('%z')) then
      fail(name .. ' must be an absolute path')
    end
  end
  local o = {
    server = server:gsub('/+$', ''),
    namespace = options.namespace or 'default',
    image = options.image or DEFAULT_IMAGE,
    agent_image = options.agent_image,
    agent_in_image = bool_option(options.agent_in_image, 'agent_in_image'),
    agent_path = options.agent_path or '/mayura-agent',
    pull = bool_option(options.pull, 'pull'),
    pull_policy = options.pull_policy or 'IfNotPresent',
    runtime_class = options.runtime_class,
    uid = check.int(options.uid, 'uid', 1, 2147483647, C, 4, DEFAULT_UID),
    memory_mib = check.int(options.memory_mib, 'memory_mib', 16, 16 * MIB, C, 4, 1024),
    workspace_mib = check.int(options.workspace_mib, 'workspace_mib', 1, MIB, C, 4, 512),
    tmp_mib = check.int(options.tmp_mib, 'tmp_mib', 1, MIB, C, 4, 128),
    workdir = hosted.workdir_option(options.workdir or '/workspace', 'kubernetes'),
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1000, 366 * 86400000, C, 4, 86400000),
    start_timeout_ms = check.int(options.start_timeout_ms, 'start_timeout_ms', 1000, 3600000, C, 4, 120000),
    enforced_network = bool_option(options.network_policy_enforced, 'network_policy_enforced'),
    warm = check.int(options.warm, 'warm', 0, 1000, C, 4, 0),
    keepalive_ms = check.int(options.keepalive_ms, 'keepalive_ms', 1000, 3600000, C, 4, 30000),
    cluster_cidrs = options.cluster_cidrs or CLUSTER_CIDRS,
  }
  if not pod.dns_label(o.namespace) then fail('namespace is not a Kubernetes namespace name') end
  for _, name in ipairs({ 'image', 'agent_image' }) do
    local v = o[name]
    if v ~= nil and (type(v) ~= 'string' or #v > 512 or not v:match(IMAGE_PATTERN)) then
      fail(name .. ' is not an image name')
    end
  end
  o.mode = options.mode or 'pod'
  if o.mode ~= 'pod' and o.mode ~= 'agent-sandbox' then fail("mode must be 'pod' or 'agent-sandbox'") end
  o.template = options.template
  if o.template ~= nil and (o.mode ~= 'agent-sandbox' or not pod.dns_label(o.template, 253)) then
    fail('template names a SandboxTemplate, with mode agent-sandbox')
  end
  -- a template's Pod is the template's: it must run the agent itself
  if o.template == nil and o.agent_in_image == (o.agent_image ~= nil) then
    fail('give agent_image (an image holding the agent) or agent_in_image = true, one of them')
  end
  if type(o.agent_path) ~= 'string' or not o.agent_path:match('^/[%w%._/%-]+$') or o.agent_path:find('%.%.') then
    fail('agent_path must be an absolute path')
  end
  if o.pull_policy ~= 'IfNotPresent' and o.pull_policy ~= 'Never' then
    fail("pull_policy must be 'IfNotPresent' or 'Never' (pull = true for Always)")
  end
  if o.runtime_class ~= nil and not (type(o.runtime_class) == 'string' and #o.runtime_class <= 253
      and o.runtime_class:match('^[a-z0-9][a-z0-9%.%-]*$')) then
    fail('runtime_class is not a RuntimeClass name')
  end
  local cpus = options.cpus or 1
  if type(cpus) ~= 'number' or cpus ~= cpus or cpus < 0.001 or cpus > 1024 then
    fail('cpus must be a number from 0.001')
  end
  o.cpus = cpus
  if type(o.cluster_cidrs) ~= 'table' or #o.cluster_cidrs > 64 then fail('cluster_cidrs must be a list of CIDRs') end
  for _, v in ipairs(o.cluster_cidrs) do
    if not cidr_ok(v) then fail('cluster_cidrs holds something that is not a CIDR') end
  end
  return o
end

-- {======================================================
-- A sandbox backend
-- =======================================================

local Backend = agent_backend.class()

function Backend:url(port)
  if self.network ~= 'all' then
    errors.raise('INVALID_INPUT', 'a sandbox serves ports only with network all', nil, 0)
  end
  if self.closed then error(errors.sandbox('gone', 'the sandbox is gone'), 0) end
  local f = self.forwards[port]
  if not f then
    f = attach.forward(self.conn, self.path, port)
    self.forwards[port] = f
  end
  return f.url
end

function Backend:release()
  if not self:release_begin() then return end
  self:stop_keepalive()
  for _, f in pairs(self.forwards) do pcall(f.close) end
  -- an Agent Sandbox resource first (its controller would make the Pod again), then the Pod at once
  local ok, err = true, nil
  if self.workload then
    ok, err = pcall(self.api.json, self.api, 'DELETE', self.workload, nil, { allow = { 404 } })
  end
  local pok, perr = pcall(self.api.json, self.api, 'DELETE', self.path, nil,
    { query = { gracePeriodSeconds = 0 }, allow = { 404 } })
  if ok and not pok then ok, err = pok, perr end
  pcall(self.api.json, self.api, 'DELETE', self.policy_path, nil, { allow = { 404 } })
  self:close_channel()
  if self.session then self.session.close() end
  self:release_done(ok, err)
end

-- The container's count of processes killed for memory, from its cgroup as the agent sees it
-- (cgroup v2's memory.events, v1's memory.oom_control): nil where neither can be read.
local OOM_FILES = { '/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control' }
local function oom_count(self)
  for _, path in ipairs(OOM_FILES) do
    local ok, text = pcall(self.read_file, self, path, { max_bytes = 65536 })
    local n = ok and type(text) == 'string' and tonumber(text:match('oom_kill (%d+)'))
    if n then return n end
  end
  return nil
end

-- An exec killed by SIGKILL (or a shell's 137) is `oom_killed` when the container's count of OOM
-- kills grew since it was last read: read once at the start, then only after such a kill.
local shared_exec = Backend.exec
function Backend:exec(argv, o)
  local res = shared_exec(self, argv, o)
  if (res.signal == 9 or res.exit_code == 137) and self.oom_seen then
    local n = oom_count(self)
    if n and n > self.oom_seen then
      self.oom_seen = n
      res.oom_killed = true
    end
  end
  return res
end

-- Pings the agent every `ms` while the attach is open: an idle stream is not one a proxy, a load
-- balancer or the kubelet ends. The timer keeps no script running.
function Backend:keepalive(ms)
  local uv = require('luv')
  local timer = uv.new_timer()
  self.pinger = timer
  timer:start(ms, ms, function()
    if self.closed then return self:stop_keepalive() end
    pcall(self.ch.call, self.ch, { op = 'ping' }, function() end)
  end)
  timer:unref()
end

function Backend:stop_keepalive()
  local timer = self.pinger
  self.pinger = nil
  if timer and not timer:is_closing() then timer:close() end
end

-- }======================================================

-- Deletes, in the background, the Pods and policies of the namespace past their expiry, and Pods
-- that ended: what hosts that died left.
local function sweep(p)
  task.spawn(function()
    local now_s = core.now_ms() / 1000
    local sel = { labelSelector = pod.SANDBOX_LABEL }
    local function expired(item)
      local labels = type(item) == 'table' and type(item.metadata) == 'table' and item.metadata.labels
      local at = type(labels) == 'table' and tonumber(labels[pod.EXPIRES_LABEL])
      return at ~= nil and at + LIFETIME_GRACE_MS / 1000 < now_s
    end
    local function each(path, keep)
      local ok, list = pcall(p.api.json, p.api, 'GET', path, nil, { query = sel })
      if not ok or type(list) ~= 'table' or type(list.items) ~= 'table' then return end
      for _, item in ipairs(list.items) do
        local name = type(item) == 'table' and type(item.metadata) == 'table' and item.metadata.name
        if type(name) == 'string' and pod.dns_label(name, 253) and not keep(item) then
          pcall(p.api.json, p.api, 'DELETE', path .. '/' .. hosted.escape(name), nil,
            { query = { gracePeriodSeconds = 0 }, allow = { 404 } })
        end
      end
    end
    each(p.pods, function(item)
      local phase = type(item.status) == 'table' and item.status.phase
      return not expired(item) and phase ~= 'Succeeded' and phase ~= 'Failed'
    end)
    each(p.policies, function(item) return not expired(item) end)
  end)
end

-- Waits until the sandbox container of the Pod at `path` runs. A Pod an Agent Sandbox controller
-- makes (`later`) may not be there yet: a 404 is then waited out.
local function wait_running(p, c, path, deadline, later)
  local delay = 25   -- doubling to 1 s: a Pod that starts at once is seen at once
  local why
  while true do
    local body = c:json('GET', path, nil, later and { allow = { 404 } } or { gone = true })
    local state, reason = pod.status(body)
    if state == 'running' then return end
    if state == 'failed' then error(errors.sandbox('failed', 'kubernetes: ' .. reason), 0) end
    if state == 'ended' then error(errors.sandbox('unavailable', 'kubernetes: ' .. reason), 0) end
    why = reason or why
    local left = deadline - core.hrtime_ms()
    if left <= 0 then
      error(errors.sandbox('unavailable', 'kubernetes: the sandbox container did not start within '
        .. p.start_timeout_ms .. ' ms' .. (why and (' (' .. why .. ')') or '')), 0)
    end
    task.await(function(done) task.after(math.ceil(math.min(delay, left)), done, true) end)
    delay = math.min(delay * 2, 1000)
  end
end

-- Waits until the claim at `path` names its Sandbox (whose Pod has its name); returns the name.
local function wait_claim(p, c, path, deadline)
  local delay = 25   -- doubling to 1 s: a Pod that starts at once is seen at once
  while true do
    local body = c:json('GET', path, nil, { gone = true })
    local sb = type(body) == 'table' and type(body.status) == 'table' and body.status.sandbox
    local name = type(sb) == 'table' and sb.name
    if type(name) == 'string' and pod.dns_label(name, 253) then return name end
    local left = deadline - core.hrtime_ms()
    if left <= 0 then
      error(errors.sandbox('unavailable', 'kubernetes: the claim got no sandbox within '
        .. p.start_timeout_ms .. ' ms (is the template ' .. p.template .. ' there?)'), 0)
    end
    task.await(function(done) task.after(math.ceil(math.min(delay, left)), done, true) end)
    delay = math.min(delay * 2, 1000)
  end
end

--- The provider: see the module's comment for the options.
function M.kubernetes_sandboxes(options)
  local o = read_options(options)
  local api = hosted.client({
    label = 'kubernetes', base_url = o.server, api_key = options.token, ca_file = options.ca_file,
    ca_pem = options.ca_data,
    client_cert = options.client_cert, client_key = options.client_key,
    retries = options.retries, retry_base_ms = options.retry_base_ms, max_retry_after_ms = options.max_retry_after_ms,
    max_response_bytes = 16 * MIB,
  })
  local token = options.token
  local conn = {
    ws_base = o.server:gsub('^http', 'ws'),
    ca_file = options.ca_file, ca_pem = options.ca_data, client_cert = options.client_cert,
    client_key = options.client_key,
    headers = function()
      local h = { ['User-Agent'] = hosted.USER_AGENT }
      if token then h.Authorization = 'Bearer ' .. token end
      return h
    end,
    status_error = function(status, what)
      if status == 404 or status == 410 then return errors.sandbox('gone', 'kubernetes: the pod is gone') end
      local e = sandbox.sandbox_http_failure(status)
      e.message = 'kubernetes: the API server answered HTTP ' .. status .. ' to an '
        .. (what:find('/portforward', 1, true) and 'port-forward' or 'attach')
      return e
    end,
  }
  local ns = '/namespaces/' .. o.namespace
  local p = {
    id = 'kubernetes',
    features = { stdin = true, ports = true, desktop = false, network = { 'none', 'all' } },
    enforced = { memory = true, cpus = true, workspace_mib = true, tmp_mib = true, lifetime = true, pids = false,
      network = o.enforced_network },
    api = api,
    pods = '/api/v1' .. ns .. '/pods',
    policies = '/apis/networking.k8s.io/v1' .. ns .. '/networkpolicies',
    sandboxes = '/apis/agents.x-k8s.io/v1beta1' .. ns .. '/sandboxes',
    claims = '/apis/extensions.agents.x-k8s.io/v1alpha1' .. ns .. '/sandboxclaims',
    pool_id = host_util.random_hex(6),
  }
  for k, v in pairs(o) do p[k] = v end
  local last_sweep

  -- A sandbox up to its agent's hello: what a warm one is until handed out.
  local function start(self, spec)
    local started = core.hrtime_ms()
    local network = spec.network
    if type(network) == 'table' then
      errors.raise('INVALID_INPUT', 'kubernetes: a domain allow-list needs an egress proxy, which this provider '
        .. 'does not run: use network all or none', nil, 0)
    end
    network = network == 'all' and 'all' or 'none'
    if spec.ports and #spec.ports > 0 and network ~= 'all' then
      errors.raise('INVALID_INPUT', 'ports are served only with network all', nil, 0)
    end
    pod.check_labels(spec.labels)
    local image = spec.image
    if image ~= nil and (type(image) ~= 'string' or #image > 512 or not image:match(IMAGE_PATTERN)) then
      errors.raise('INVALID_INPUT', 'kubernetes: image is not an image name', nil, 0)
    end
    if not last_sweep or core.hrtime_ms() - last_sweep > SWEEP_EVERY_MS then
      last_sweep = core.hrtime_ms()
      sweep(self)
    end
    local c = api
    if spec.call_timeout_ms then c = api:with({ call_timeout_ms = spec.call_timeout_ms }) end
    local name = 'mayura-' .. host_util.random_hex(6)
    local expires_s = math.floor((core.now_ms() + spec.lifetime_ms) / 1000) + 1
    local path = self.pods .. '/' .. name
    local policy_path = self.policies .. '/' .. name
    -- the policy first: the Pod never runs without it
    c:json('POST', self.policies, pod.network_policy(self, name, network, expires_s))
    local remaining = math.max(1, spec.lifetime_ms - math.floor(core.hrtime_ms() - started))
    -- the Pod itself, or the Agent Sandbox resource its controller makes it from (`workload`)
    local t = { lifetime_ms = remaining, expires_s = expires_s }
    local collection, body, workload
    if self.mode == 'pod' then
      collection, body = self.pods, pod.manifest(self, name, spec, t)
    elseif self.template then
      collection, body = self.claims, pod.claim_resource(self, name, spec, t)
    else
      collection, body = self.sandboxes, pod.sandbox_resource(self, name, spec, t)
    end
    if collection ~= self.pods then workload = collection .. '/' .. name end
    local made, merr = pcall(c.json, c, 'POST', collection, body)
    if not made then
      pcall(api.json, api, 'DELETE', policy_path, nil, { allow = { 404 } })
      -- a create whose answer was lost may have made it
      if errors.is(merr, 'SANDBOX_ERROR') and merr.status == nil then
        pcall(api.json, api, 'DELETE', workload or path, nil, { query = { gracePeriodSeconds = 0 }, allow = { 404 } })
      end
      error(merr, 0)
    end
    local backend = setmetatable({
      id = name, api = api, conn = conn, path = path, policy_path = policy_path, workload = workload,
      network = network, forwards = {}, closed = false, released = false,
    }, Backend)
    local ok, err = pcall(function()
      local deadline = started + math.min(self.start_timeout_ms, c.call_timeout_ms)
      if self.template then
        path = self.pods .. '/' .. wait_claim(self, c, workload, deadline)
        backend.path = path
      end
      wait_running(self, c, path, deadline, workload ~= nil)
      backend.ch, backend.session = attach.agent(conn, path, function()
        backend.closed = true
        backend:stop_keepalive()
      end)
      agent_backend.hello(backend)
      backend.oom_seen = oom_count(backend)
      backend:keepalive(self.keepalive_ms)
    end)
    if not ok then agent_backend.start_failed(backend, err) end
    backend.image_name = image or self.image
    backend:arm(math.max(1, spec.lifetime_ms - math.floor(core.hrtime_ms() - started)) + LIFETIME_GRACE_MS)
    return backend
  end

  function p.create(self, spec)
    local backend = start(self, spec)
    local ok, err = pcall(agent_backend.setup, backend, spec.env, self.workdir)
    if not ok then agent_backend.start_failed(backend, err) end
    return backend
  end

  -- warm sandboxes: the provider's own shape with the pool's labels (a create asking for labels of
  -- its own gets a cold one), set up and given the asked lifetime when handed out
  agent_backend.add_own_shape_warm(p, start, {
    same_labels = true,
    hand_out = function(_, backend, spec) agent_backend.setup(backend, spec.env, p.workdir, spec.lifetime_ms) end,
    rearm_ms = function(spec) return spec.lifetime_ms + LIFETIME_GRACE_MS end,
  })
  return p
end

M.sandboxes = M.kubernetes_sandboxes

return M
