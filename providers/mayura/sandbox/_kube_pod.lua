--- mayura.sandbox._kube_pod: what the Kubernetes provider sends to the API server: a sandbox's Pod
-- and its NetworkPolicy (core/v1, networking.k8s.io/v1), label checks, and what a Pod's status says.
-- Private to mayura.sandbox.kubernetes; pure functions of their arguments (no calls), so each can
-- be checked on its own.
--
--   local pod = require('mayura.sandbox._kube_pod')
--   pod.check_labels(labels)                 -- INVALID_INPUT unless Kubernetes label syntax
--   local manifest = pod.manifest(p, name, spec, { lifetime_ms, expires_s })
--   local policy = pod.network_policy(p, name, 'none' | 'all', expires_s)
--   local state, why = pod.status(body)      -- 'running' | 'waiting' | 'failed' | 'ended', and why
--   pod.sandbox_resource(p, name, spec, t), pod.claim_resource(p, name, spec, t)   -- Agent Sandbox
--
-- The Pod is locked down as a Docker sandbox is: a uid of no account, no capabilities, no privilege
-- escalation, RuntimeDefault seccomp, a read-only root with tmpfs (emptyDir of medium Memory) for
-- the workdir and /tmp, no service account token, no service links, no host namespaces, its
-- resources' limits equal to its requests, and `activeDeadlineSeconds`, so the cluster ends it
-- even when the host is gone. The agent is its main container's first process (`--stdio`, its
-- standard input and output held open for an attach). Kubernetes has no per-Pod process limit
-- (a kubelet's podPidsLimit is the node's), so none is set here.
local core = require('mayura.core')
local errors = require('mayura.errors')

local M = {}

local json = core.json

--- Labels of our own (refused in a create's labels).
M.PREFIX = 'mayura.io/'
M.SANDBOX_LABEL = 'mayura.io/sandbox'   -- the Pod's name: what its NetworkPolicy selects
M.POOL_LABEL = 'mayura.io/pool'         -- the provider (one a process) that made it
M.EXPIRES_LABEL = 'mayura.io/expires'   -- when its lifetime ends (unix seconds): the sweep's key

M.AGENT_DIR = '/.mayura'
M.AGENT_IN = '/.mayura/agent'
M.CONTAINER = 'sandbox'

-- Transient states of a container that will not start without a change: a create fails at once.
local STUCK = {
  ImagePullBackOff = 'its image could not be pulled', ErrImagePull = 'its image could not be pulled',
  ErrImageNeverPull = 'its image is not on the node (and pull is off)',
  InvalidImageName = 'its image name is not valid',
  CreateContainerConfigError = 'its container could not be configured',
  CreateContainerError = 'its container could not be made', RunContainerError = 'its container could not run',
  CrashLoopBackOff = 'its container keeps failing', PreCreateHookError = 'its container could not be made',
}

local function object(t)
  return setmetatable(t or {}, json.object_mt)
end

local function array(t)
  return setmetatable(t or {}, json.array_mt)
end

local function bad(msg)
  errors.raise('INVALID_INPUT', msg, nil, 0)
end

-- A DNS-1123 label: what a namespace, a Pod and a label name's last part are made of.
local function dns_label(s, max)
  return type(s) == 'string' and #s >= 1 and #s <= (max or 63) and s:match('^[a-z0-9][a-z0-9%-]*$') ~= nil
    and s:sub(-1) ~= '-'
end
M.dns_label = dns_label

-- A label name's part or a value: up to 63 of [A-Za-z0-9-_.], beginning and ending alphanumeric.
local function label_part(s, empty_ok)
  if s == '' then return empty_ok == true end
  return #s <= 63 and s:match('^[%w][%w%-_%.]*$') ~= nil and s:sub(-1):match('%w') ~= nil
end

-- A DNS subdomain: dot-separated DNS labels, at most 253 bytes.
local function dns_subdomain(s)
  if #s == 0 or #s > 253 then return false end
  for part in (s .. '.'):gmatch('([^%.]*)%.') do
    if not dns_label(part) then return false end
  end
  return true
end

--- Raises INVALID_INPUT unless every label is a Kubernetes label (an optional DNS-subdomain prefix
-- and '/', a name of up to 63 bytes; a value of up to 63, maybe empty) and none is ours.
function M.check_labels(labels)
  for k, v in pairs(labels or {}) do
    if type(k) ~= 'string' or type(v) ~= 'string' then bad('a label name and its value must be strings') end
    local prefix, name = k:match('^(.*)/([^/]*)$')
    if not prefix then prefix, name = nil, k end
    if (prefix and not dns_subdomain(prefix)) or not label_part(name) then
      bad('a label name is not a Kubernetes label name ([prefix/]name, name up to 63 of A-Z a-z 0-9 - _ .)')
    end
    if not label_part(v, true) then
      bad('a label value is not a Kubernetes label value (up to 63 of A-Z a-z 0-9 - _ ., alphanumeric at the ends)')
    end
    if prefix == 'mayura.io' or (prefix and prefix:sub(-10) == '.mayura.io') then
      bad('label names under mayura.io/ are the library\'s own')
    end
  end
end

local function our_labels(p, name, labels, expires_s)
  local out = object({})
  for k, v in pairs(labels or {}) do out[k] = v end
  out[M.SANDBOX_LABEL] = name
  out[M.POOL_LABEL] = p.pool_id
  out[M.EXPIRES_LABEL] = ('%d'):format(expires_s)
  return out
end

local function mebi(n)
  return ('%dMi'):format(math.max(1, math.ceil(n)))
end

--- The Pod of sandbox `name`: `p` is the provider (its options), `spec` the create's spec,
-- `t.lifetime_ms` what is left of its lifetime, `t.expires_s` when it ends (unix seconds).
function M.manifest(p, name, spec, t)
  local memory_mib = math.min(spec.memory_mib or p.memory_mib, p.memory_mib)
  local cpus = math.min(spec.cpus or p.cpus, p.cpus)
  local pull = p.pull and 'Always' or p.pull_policy
  local limits = object({ cpu = ('%dm'):format(math.max(1, math.ceil(cpus * 1000))), memory = mebi(memory_mib) })
  local uid = p.uid
  local function hardened()
    return object({
      runAsUser = uid, runAsGroup = uid, runAsNonRoot = true, privileged = false,
      allowPrivilegeEscalation = false, readOnlyRootFilesystem = true,
      capabilities = object({ drop = array({ 'ALL' }) }),
      seccompProfile = object({ type = 'RuntimeDefault' }),
    })
  end
  -- tmpfs counts against the memory limit: each is capped within it
  local volumes = array({
    object({ name = 'workdir', emptyDir = object({ medium = 'Memory',
      sizeLimit = mebi(math.min(p.workspace_mib, memory_mib)) }) }),
    object({ name = 'tmp', emptyDir = object({ medium = 'Memory',
      sizeLimit = mebi(math.min(p.tmp_mib, memory_mib)) }) }),
  })
  local mounts = array({
    object({ name = 'workdir', mountPath = p.workdir }),
    object({ name = 'tmp', mountPath = '/tmp' }),
  })
  local agent = p.agent_path
  local init
  if not p.agent_in_image then
    agent = M.AGENT_IN
    volumes[#volumes + 1] = object({ name = 'mayura-agent',
      emptyDir = object({ medium = 'Memory', sizeLimit = '32Mi' }) })
    -- read-only where the sandbox's code runs: it cannot replace its agent
    mounts[#mounts + 1] = object({ name = 'mayura-agent', mountPath = M.AGENT_DIR, readOnly = true })
    init = array({ object({
      name = 'mayura-agent', image = p.agent_image, imagePullPolicy = pull,
      command = array({ 'cp', p.agent_path, M.AGENT_IN }),
      securityContext = hardened(),
      resources = object({ limits = object({ cpu = '100m', memory = '64Mi' }),
        requests = object({ cpu = '100m', memory = '64Mi' }) }),
      volumeMounts = array({ object({ name = 'mayura-agent', mountPath = M.AGENT_DIR }) }),
    }) })
  end
  local container = object({
    name = M.CONTAINER, image = spec.image or p.image, imagePullPolicy = pull,
    command = array({ agent }),
    args = array({ '--stdio', '--lifetime-ms', ('%d'):format(t.lifetime_ms), '--workdir', p.workdir }),
    workingDir = p.workdir,
    stdin = true, stdinOnce = false, tty = false,
    securityContext = hardened(),
    resources = object({ limits = limits, requests = object({ cpu = limits.cpu, memory = limits.memory }) }),
    volumeMounts = mounts,
  })
  return object({
    apiVersion = 'v1', kind = 'Pod',
    metadata = object({ name = name, namespace = p.namespace, labels = our_labels(p, name, spec.labels, t.expires_s) }),
    spec = object({
      restartPolicy = 'Never',
      activeDeadlineSeconds = math.max(1, math.ceil(t.lifetime_ms / 1000)),
      terminationGracePeriodSeconds = 0,
      automountServiceAccountToken = false,
      enableServiceLinks = false,
      hostNetwork = false, hostPID = false, hostIPC = false,
      runtimeClassName = p.runtime_class,
      securityContext = object({
        runAsUser = uid, runAsGroup = uid, runAsNonRoot = true,
        seccompProfile = object({ type = 'RuntimeDefault' }),
      }),
      initContainers = init,
      containers = array({ container }),
      volumes = volumes,
    }),
  })
end

local function rfc3339(unix_s)
  return os.date('!%Y-%m-%dT%H:%M:%SZ', unix_s)
end

--- The Agent Sandbox resource (agents.x-k8s.io/v1beta1 Sandbox) of sandbox `name`: its Pod
-- template is the Pod of `manifest`, and the controller deletes it at its shutdownTime.
function M.sandbox_resource(p, name, spec, t)
  local m = M.manifest(p, name, spec, t)
  return object({
    apiVersion = 'agents.x-k8s.io/v1beta1', kind = 'Sandbox',
    metadata = object({ name = name, namespace = p.namespace, labels = m.metadata.labels }),
    spec = object({
      podTemplate = object({ metadata = object({ labels = m.metadata.labels }), spec = m.spec }),
      shutdownTime = rfc3339(t.expires_s), shutdownPolicy = 'Delete',
    }),
  })
end

--- A claim (extensions.agents.x-k8s.io/v1alpha1 SandboxClaim) of a Sandbox of the template
-- `p.template`, whose Pod gets our labels (its NetworkPolicy selects it by them).
function M.claim_resource(p, name, spec, t)
  local labels = our_labels(p, name, spec.labels, t.expires_s)
  return object({
    apiVersion = 'extensions.agents.x-k8s.io/v1alpha1', kind = 'SandboxClaim',
    metadata = object({ name = name, namespace = p.namespace, labels = labels }),
    spec = object({
      sandboxTemplateRef = object({ name = p.template }),
      additionalPodMetadata = object({ labels = labels }),
      lifecycle = object({ shutdownTime = rfc3339(t.expires_s), shutdownPolicy = 'Delete' }),
    }),
  })
end

--- The NetworkPolicy of sandbox `name` (selecting its Pod by its own label): 'none' refuses all
-- ingress and egress; 'all' refuses ingress and allows egress to every address but the cluster's
-- own ranges (`p.cluster_cidrs`), and DNS to the cluster's DNS (kube-dns in kube-system).
function M.network_policy(p, name, network, expires_s)
  local pspec = object({
    podSelector = object({ matchLabels = object({ [M.SANDBOX_LABEL] = name }) }),
    policyTypes = array({ 'Ingress', 'Egress' }),
    ingress = array({}),
    egress = array({}),
  })
  if network == 'all' then
    local v4, v6 = array({}), array({})
    for _, cidr in ipairs(p.cluster_cidrs) do
      if cidr:find(':', 1, true) then v6[#v6 + 1] = cidr else v4[#v4 + 1] = cidr end
    end
    local to = array({
      object({ ipBlock = object({ cidr = '0.0.0.0/0', except = #v4 > 0 and v4 or nil }) }),
      object({ ipBlock = object({ cidr = '::/0', except = #v6 > 0 and v6 or nil }) }),
    })
    pspec.egress = array({
      object({ to = to }),
      object({
        to = array({ object({
          namespaceSelector = object({ matchLabels = object({ ['kubernetes.io/metadata.name'] = 'kube-system' }) }),
          podSelector = object({ matchLabels = object({ ['k8s-app'] = 'kube-dns' }) }),
        }) }),
        ports = array({ object({ protocol = 'UDP', port = 53 }), object({ protocol = 'TCP', port = 53 }) }),
      }),
    })
  end
  return object({
    apiVersion = 'networking.k8s.io/v1', kind = 'NetworkPolicy',
    metadata = object({ name = name, namespace = p.namespace, labels = our_labels(p, name, nil, expires_s) }),
    spec = pspec,
  })
end

local function find_status(list, name)
  for _, s in ipairs(type(list) == 'table' and list or {}) do
    if type(s) == 'table' and s.name == name then return s end
  end
end

local function text(v)
  return type(v) == 'string' and v:match('^[%w%-_%.]+$') and #v <= 64 and v or nil
end

--- What a Pod's body says: 'running' (its sandbox container runs), 'waiting' (not yet), 'failed'
-- (it will not start without a change: a bad image, an init container that failed), or 'ended'
-- (Succeeded, Failed, or being deleted); the second value is a reason of ours (a Kubernetes reason
-- word at most, never the server's message).
function M.status(body)
  if type(body) ~= 'table' then return 'waiting' end
  local meta, st = body.metadata, body.status
  if type(meta) == 'table' and meta.deletionTimestamp ~= nil and meta.deletionTimestamp ~= json.null then
    return 'ended', 'the pod is being deleted'
  end
  if type(st) ~= 'table' then return 'waiting' end
  if st.phase == 'Succeeded' or st.phase == 'Failed' then
    local r = text(st.reason)
    return 'ended', 'the pod ended (' .. st.phase .. (r and (', ' .. r) or '') .. ')'
  end
  for _, s in ipairs(type(st.initContainerStatuses) == 'table' and st.initContainerStatuses or {}) do
    local w = type(s) == 'table' and type(s.state) == 'table' and s.state or {}
    if type(w.waiting) == 'table' and STUCK[w.waiting.reason] then
      return 'failed', 'the agent\'s init container did not start: ' .. STUCK[w.waiting.reason]
        .. ' (' .. w.waiting.reason .. ')'
    end
    if type(w.terminated) == 'table' and w.terminated.exitCode ~= 0 then
      return 'failed', 'the agent\'s init container failed (it must hold the agent at agent_path and cp)'
    end
  end
  local s = find_status(st.containerStatuses, M.CONTAINER)
  local state = type(s) == 'table' and type(s.state) == 'table' and s.state or {}
  if type(state.running) == 'table' then return 'running' end
  if type(state.waiting) == 'table' and STUCK[state.waiting.reason] then
    return 'failed', 'the sandbox container did not start: ' .. STUCK[state.waiting.reason]
      .. ' (' .. state.waiting.reason .. ')'
  end
  if type(state.terminated) == 'table' then return 'ended', 'the sandbox container ended' end
  for _, c in ipairs(type(st.conditions) == 'table' and st.conditions or {}) do
    if type(c) == 'table' and c.type == 'PodScheduled' and c.status == 'False' and c.reason == 'Unschedulable' then
      return 'waiting', 'the pod cannot be scheduled (no node has room for it or accepts it)'
    end
  end
  return 'waiting', st.phase == 'Pending' and 'the pod stayed Pending' or nil
end

return M
