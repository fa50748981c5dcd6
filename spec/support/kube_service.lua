--- A stand-in for a Kubernetes API server (the calls mayura.sandbox.kubernetes, the official
-- `@kubernetes/client-node` and `kubectl` make), as the published API describes it (the OpenAPI
-- of core/v1 and networking/v1, and the CRDs of kubernetes-sigs/agent-sandbox), on a stand-in
-- (support/stand_in.lua). Pods are real: each one's main container is a process in namespaces
-- of its own (support/kube_pods.lua), attached to and exec'd into over WebSocket.
--
--   local svc = stand_in.new()
--   local state = kube_service.install(svc, backing, { token = T, namespace = 'default' })
--   -- state.server (https://127.0.0.1:<port>), state.ca_file (its CA, PEM), state.token
--   ...
--   state:close()   -- also done by svc:close()
--
-- `backing` is not used (the pods run on their own; any value, or nil). Options: `token` (the
-- bearer token), `namespace` (made besides default, kube-public and kube-system), `images` (the
-- images the node has already: any other one is pulled on first use, unless pulling it is
-- scripted to fail in `state.pull_failures[image]`), `agent_images` (images that hold the agent
-- at /.mayura/agent themselves), `start_ms` (how long a container takes to start, 30),
-- `node_cpu`, `node_memory` (the node's allocatable resources, '4' and '8Gi'), `tls` (false:
-- plain HTTP and WebSocket at state.server, no ca_file), `client_user` (the CN of the client
-- certificate made: 'mayura'). With TLS, `state.client_cert_file` and `state.client_key_file`
-- (PEM, signed by the CA of state.ca_file) authenticate as well as the token does. Scripted at run time:
-- `state.unschedulable = true` (no node fits: pods stay Pending, PodScheduled False),
-- `state.forbidden['<verb> <resource>'] = true` (RBAC refuses it: 403 Forbidden; verbs get,
-- list, watch, create, update, patch, delete, deletecollection; resources such as pods,
-- pods/exec, pods/attach, pods/portforward, networkpolicies, sandboxclaims),
-- `state:evict(ns, name)` (the kubelet's eviction: Failed, reason Evicted), `state:cut_attach(ns,
-- name)` (the pod's attach streams dropped without a status, the pod running on), svc:fault(...).
--
-- Transport: HTTPS with a CA and a server certificate (127.0.0.1, localhost) made with openssl
-- in a temporary directory, served by spec/npm/kube_front.mjs (node:https and the `ws`
-- package), which passes every request on to the stand-in on loopback and bridges WebSockets.
-- Every answer of the stand-in closes its connection (keep-alive is the front's, to the client).
--
-- Every call needs `Authorization: Bearer <token>` or the client certificate: else 401 with a
-- Status (reason Unauthorized) that echoes nothing. Errors are Status objects (`kind: Status, status:
-- Failure, message, reason, code, details`) as the API server sends them: 404 NotFound, 409
-- AlreadyExists (and Conflict for a stale resourceVersion on update), 422 Invalid (with
-- details.causes), 400 BadRequest, 415 UnsupportedMediaType. Faults: svc:fault(method, pattern,
-- kube_service.too_many_requests(seconds), times) answers 429 TooManyRequests with Retry-After.
--
-- Served (core/v1, networking.k8s.io/v1, and the Agent Sandbox groups agents.x-k8s.io and
-- extensions.agents.x-k8s.io, versions v1beta1 (stored) and v1alpha1, without conversion):
--   discovery: /version, /api, /api/v1, /apis, /apis/<group>, /apis/<group>/<version>, and
--         /openapi/v3 with each group version's paths (their GVK and fieldValidation parameter,
--         what kubectl looks for; no schemas; /openapi/v2 is 404)
--   namespaces: list, get (create is refused: the stand-in's namespaces are fixed)
--   pods: create, get, list, watch, delete (gracePeriodSeconds), deletecollection
--         (labelSelector), status, log (whole, no follow), attach, exec, portforward
--   networkpolicies, sandboxes, sandboxtemplates, sandboxclaims, sandboxwarmpools: create,
--         get, list, watch, replace (PUT, resourceVersion checked), patch, delete,
--         deletecollection
-- List and watch take labelSelector (=, ==, !=, in, notin, exists, !exists) and fieldSelector
-- (metadata.name, metadata.namespace, status.phase, spec.nodeName); `limit` is not applied;
-- watch=true streams WatchEvents (ADDED, MODIFIED, DELETED; ERROR 410 Expired for a
-- resourceVersion older than the 2000 changes kept) as newline-delimited JSON, with the current
-- objects ADDED first unless resourceVersion is given; timeoutSeconds ends it; no bookmarks.
-- Every change takes the next resourceVersion. Lists and gets asked for `as=Table` (kubectl
-- get) answer a meta.k8s.io/v1 Table.
--
-- Admission: names (DNS-1123 subdomain; container, port and volume names DNS-1123 labels),
-- generateName, label keys and values, containers required with an image, unique container
-- names, volume mounts naming a volume, imagePullPolicy, restartPolicy, activeDeadlineSeconds
-- (> 0), resource quantities (400 when one does not parse, 422 for requests above limits),
-- securityContext ids (>= 0), NetworkPolicy policyTypes, ports and CIDRs. Field validation of a
-- Pod's create (core/v1's fields of a Pod, its spec, containers, security contexts, resources,
-- mounts, env, ports, volumes): `fieldValidation=Strict` refuses an unknown field (400, strict
-- decoding error), Warn (the default) answers a `Warning: 299` header, and both Warn and
-- Ignore drop it from the object. A Pod's update may not change its spec (422).
--
-- A Pod: Pending (no conditions), then scheduled (PodScheduled, nodeName; requests above the
-- node's allocatable resources, or `state.unschedulable`, keep it Pending with PodScheduled
-- False, reason Unschedulable), its images checked (one the node lacks with imagePullPolicy
-- Never: waiting ErrImageNeverPull; a pull scripted to fail: ErrImagePull, then
-- ImagePullBackOff; it stays Pending), its init containers marked Completed, runAsNonRoot with
-- uid 0 refused (waiting CreateContainerConfigError), a first program its files do not hold
-- (the agent where there is none, a name not on the PATH) a StartError (terminated, 128: Failed
-- with restartPolicy Never), then its main container started: Running
-- with Initialized, ContainersReady and Ready. The process ending makes it Succeeded or Failed
-- (restartPolicy Never or OnFailure with 0) or leaves the container waiting in CrashLoopBackOff
-- (it is not restarted). activeDeadlineSeconds (from startTime) ends it: phase Failed, reason
-- DeadlineExceeded. A delete with a grace period (the pod's terminationGracePeriodSeconds, 30,
-- by default) marks it (deletionTimestamp, MODIFIED: it still lists, Terminating), sends
-- SIGTERM to the container's process and ends the pod's namespaces after the grace; then
-- DELETED. A pod not running goes at once.
--
-- The main container (the first one, or `kubectl.kubernetes.io/default-container`): its command
-- and args run in a sandbox of support/kube_pods.lua: the host's /usr read-only, emptyDir
-- volumes as tmpfs (sizeLimit, else 64 MiB; a readOnly mount read-only), readOnlyRootFilesystem, runAsUser/runAsGroup
-- (pod or container level; the group is 0 unless given, as for an image's root user), memory
-- and cpu limits as cgroups (512 pids), its env (value only; valueFrom is refused), workingDir,
-- stdin/stdinOnce; always no capabilities and no_new_privs. The agent: an emptyDir that an init
-- container mounts and the main container mounts at /.mayura gets build/mayura-agent at
-- /.mayura/agent (the init container's copy), as does /.mayura with an image in
-- `agent_images`; elsewhere there is none. Other containers of a pod show as running, never
-- ready, and do not run.
--
-- Attach, exec and portforward: WebSocket upgrades (through the front) with the subprotocols
-- v5.channel.k8s.io, v4.channel.k8s.io (and v3, v2, channel.k8s.io for exec and attach;
-- portforward takes v4.channel.k8s.io, as the kubelet's WebSocket port forward): binary
-- messages whose first byte is the channel (0 stdin, 1 stdout, 2 stderr, 3 error: a Status JSON
-- at the end (v4, v5), 4 resize (ignored); v5's 255 + a channel closes that stream: 255 0 closes
-- the process's stdin). Exec's command comes in repeated `command` parameters; the Status says
-- Success or NonZeroExitCode (details.causes ExitCode). Attach joins the main process's stdin and
-- output from then on (what came before is in the log; stdin only with the container's `stdin`;
-- with `stdinOnce` the first attach's end closes it). Portforward: per port two channels (2i
-- data, 2i+1 error), whose first message from the server carries the port (2 bytes,
-- little-endian), the data a connection to 127.0.0.1:<port> in the pod's network namespace. A
-- refused upgrade is a Status (401, 403, 404, 400 for a pod not running or a completed one).
-- kubectl's exec and attach (v5) work; its port-forward (SPDY tunnelled in a WebSocket) does not.
--
-- Where it differs from a real API server: one node; images are names (every container runs
-- on the host's /usr, whatever its image); init containers are not run (marked Completed, see
-- the agent above); restarts are not made; NetworkPolicies are stored and returned, NOT
-- enforced (every pod has its own network namespace with only a loopback: no pod reaches
-- another or the internet); RuntimeClass, seccompProfile, capabilities, privileged, priority,
-- affinity, tolerations, probes, hostNetwork and services are recorded as given, not acted on;
-- the Agent Sandbox controller's work is done by the stand-in (a Sandbox makes its Pod of the
-- same name; a SandboxClaim a Sandbox from its template (v1alpha1's sandboxTemplateRef) or its
-- warm pool's (v1beta1's warmPoolRef), taking a warm one when there is one; a SandboxWarmPool
-- keeps `replicas` Sandboxes; a Sandbox's pod deleted behind it is made again, operatingMode
-- Suspended deletes it; shutdownTime ends a claim's sandbox or a Sandbox's pod, and
-- shutdownPolicy Retain (the default) keeps the object expired, Delete deletes it) without
-- services or PVCs; no server-side apply; a strategic merge patch is taken as a merge patch (lists are
-- replaced, not merged by key); no authorization (the token and the client certificate may
-- do everything state.forbidden does not refuse); TTY is refused.
local core = require('mayura.core')
local task = require('mayura._task')
local host = require('mayura.sandbox._host')
local stand_in = require('support.stand_in')
local pods_rt = require('support.kube_pods')
local is_int = require('mayura._check').is_int

local json = core.json

local M = {}

local function object(t) return setmetatable(t or {}, json.object_mt) end
local function array(t) return setmetatable(t or {}, json.array_mt) end

-- {======================================================
-- Status objects and faults
-- =======================================================

local REASONS = { [400] = 'BadRequest', [401] = 'Unauthorized', [403] = 'Forbidden', [404] = 'NotFound',
  [405] = 'MethodNotAllowed', [409] = 'AlreadyExists', [410] = 'Expired', [415] = 'UnsupportedMediaType',
  [422] = 'Invalid', [429] = 'TooManyRequests', [500] = 'InternalError' }

--- A Status object (a failure unless code is 2xx).
function M.status_object(code, reason, message, details)
  return object({ kind = 'Status', apiVersion = 'v1', metadata = object(), status = 'Failure',
    message = message, reason = reason or REASONS[code], details = details, code = code })
end

--- An answer with a Status.
function M.status(code, reason, message, details, headers)
  return { status = code, headers = headers, json = M.status_object(code, reason, message, details) }
end
local fail = M.status

--- 429 TooManyRequests with Retry-After: seconds (a fault to script with svc:fault).
function M.too_many_requests(seconds)
  return fail(429, 'TooManyRequests', 'Too many requests, please try again later.',
    object({ retryAfterSeconds = seconds or 1 }), { ['Retry-After'] = tostring(seconds or 1) })
end

-- }======================================================

-- {======================================================
-- Names, labels, selectors, quantities
-- =======================================================

local function dns_label(s, max)
  return type(s) == 'string' and #s >= 1 and #s <= (max or 63) and s:match('^[a-z0-9]') ~= nil
    and s:match('[a-z0-9]$') ~= nil and s:match('^[a-z0-9%-]+$') ~= nil
end

local function dns_subdomain(s)
  if type(s) ~= 'string' or #s < 1 or #s > 253 then return false end
  for part in (s .. '.'):gmatch('([^.]*)%.') do
    if not dns_label(part, 253) then return false end
  end
  return s:sub(-1) ~= '.'
end
M.dns_subdomain = dns_subdomain

local function qualified_name_part(s)
  return type(s) == 'string' and #s >= 1 and #s <= 63 and s:match('^[A-Za-z0-9]') ~= nil
    and s:match('[A-Za-z0-9]$') ~= nil and s:match('^[A-Za-z0-9_.%-]+$') ~= nil
end

-- A label key (or annotation key): [prefix/]name. Returns an error text or nil.
local function key_error(k)
  if type(k) ~= 'string' then return 'must be a string' end
  local prefix, name = k:match('^(.*)/(.*)$')
  if not prefix then name = k end
  if prefix and not dns_subdomain(prefix) then
    return 'prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, ' ..
      "'-' or '.', and must start and end with an alphanumeric character"
  end
  if not qualified_name_part(name) then
    return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with " ..
      'an alphanumeric character (e.g. \'MyName\',  or \'my.name\',  or \'123-abc\', regex used for validation ' ..
      "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
  end
  return nil
end

local function value_error(v)
  if type(v) ~= 'string' then return 'must be a string' end
  if v == '' or qualified_name_part(v) then return nil end
  if #v > 63 then return 'must be no more than 63 characters' end
  return "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and " ..
    'must start and end with an alphanumeric character'
end

-- Parses a label selector: a list of { key, op, values }, or nil and an error text.
local function parse_selector(text)
  local reqs = {}
  if text == nil or text == '' then return reqs end
  -- split at commas outside parentheses
  local parts, depth, cur = {}, 0, {}
  for ch in text:gmatch('.') do
    if ch == '(' then depth = depth + 1 elseif ch == ')' then depth = depth - 1 end
    if ch == ',' and depth == 0 then
      parts[#parts + 1] = table.concat(cur); cur = {}
    else
      cur[#cur + 1] = ch
    end
  end
  parts[#parts + 1] = table.concat(cur)
  for _, p in ipairs(parts) do
    p = p:match('^%s*(.-)%s*$')
    local k, op, rest
    k, rest = p:match('^(%S+)%s+notin%s*(%b())$')
    if k then op = 'notin' else
      k, rest = p:match('^(%S+)%s+in%s*(%b())$')
      if k then op = 'in' end
    end
    if op then
      local vals = {}
      for v in rest:sub(2, -2):gmatch('[^,]+') do vals[#vals + 1] = v:match('^%s*(.-)%s*$') end
      rest = vals
    else
      k, op, rest = p:match('^([^=!%s]+)%s*(!=)%s*(.*)$')
      if not k then k, op, rest = p:match('^([^=!%s]+)%s*(==)%s*(.*)$') end
      if not k then k, op, rest = p:match('^([^=!%s]+)%s*(=)%s*(.*)$') end
      if not k then
        k = p:match('^!%s*(%S+)$')
        if k then op = '!' else k = p:match('^(%S+)$'); op = 'exists' end
      end
      if not k then return nil, 'unable to parse requirement: ' .. p end
      rest = (op == '!' or op == 'exists') and {} or { rest }
    end
    if key_error(k) then return nil, ('unable to parse requirement: invalid label key "%s": %s'):format(k, key_error(k)) end
    for _, v in ipairs(rest) do
      if value_error(v) then
        return nil, ('unable to parse requirement: invalid label value: "%s": %s'):format(v, value_error(v))
      end
    end
    reqs[#reqs + 1] = { key = k, op = op, values = rest }
  end
  return reqs
end

local function selector_matches(reqs, labels)
  labels = labels or {}
  for _, r in ipairs(reqs) do
    local v = labels[r.key]
    if r.op == '=' or r.op == '==' then
      if v ~= r.values[1] then return false end
    elseif r.op == '!=' then
      if v == r.values[1] then return false end
    elseif r.op == 'in' or r.op == 'notin' then
      local found = false
      for _, x in ipairs(r.values) do if v == x then found = true end end
      if (r.op == 'in') ~= found then return false end
    elseif r.op == 'exists' then
      if v == nil then return false end
    elseif r.op == '!' then
      if v ~= nil then return false end
    end
  end
  return true
end

local function parse_fields(text)
  local reqs = {}
  if text == nil or text == '' then return reqs end
  for p in text:gmatch('[^,]+') do
    local k, op, v = p:match('^([%w%.]+)(!?=?=)(.*)$')
    if not k or not (k == 'metadata.name' or k == 'metadata.namespace' or k == 'status.phase' or
      k == 'spec.nodeName') then
      return nil, ('"%s" is not a known field selector: only "metadata.name", "metadata.namespace"'):format(p)
    end
    reqs[#reqs + 1] = { key = k, neg = op == '!=', value = v }
  end
  return reqs
end

local function field_of(obj, key)
  local cur = obj
  for part in key:gmatch('[^.]+') do
    if type(cur) ~= 'table' then return nil end
    cur = cur[part]
  end
  return cur
end

local function fields_match(reqs, obj)
  for _, r in ipairs(reqs) do
    local v = field_of(obj, r.key) or ''
    if (v == r.value) == r.neg then return false end
  end
  return true
end

local SUFFIX = { Ki = 2 ^ 10, Mi = 2 ^ 20, Gi = 2 ^ 30, Ti = 2 ^ 40, Pi = 2 ^ 50, Ei = 2 ^ 60,
  n = 1e-9, u = 1e-6, m = 1e-3, [''] = 1, k = 1e3, M = 1e6, G = 1e9, T = 1e12, P = 1e15, E = 1e18 }

--- A quantity's value (bytes, cores), or nil when it does not parse.
function M.quantity(q)
  if type(q) == 'number' then return q end
  if type(q) ~= 'string' then return nil end
  local num, suf = q:match('^([+-]?[%d%.]+)(.*)$')
  if not num or not tonumber(num) then return nil end
  local mult = SUFFIX[suf]
  if not mult then
    local e = suf:match('^[eE]([+-]?%d+)$')
    if not e then return nil end
    mult = 10 ^ tonumber(e)
  end
  return tonumber(num) * mult
end

-- }======================================================

-- {======================================================
-- Time, ids
-- =======================================================

local function timestamp(ms)
  ms = ms or core.now_ms()
  return os.date('!%Y-%m-%dT%H:%M:%SZ', math.floor(ms / 1000))
end

local function uuid()
  local h = host.random_hex(16)
  return ('%s-%s-4%s-a%s-%s'):format(h:sub(1, 8), h:sub(9, 12), h:sub(14, 16), h:sub(18, 20), h:sub(21, 32))
end

local GEN = 'bcdfghjklmnpqrstvwxz2456789'
local function gen_suffix()
  local out = {}
  for i = 1, 5 do
    local n = math.random(1, #GEN)
    out[i] = GEN:sub(n, n)
  end
  return table.concat(out)
end

local function copy(v)
  if type(v) ~= 'table' then return v end
  local out = setmetatable({}, getmetatable(v))
  for k, x in pairs(v) do out[k] = copy(x) end
  return out
end

-- An RFC 7386 merge patch.
local function merge_patch(target, patch)
  if type(patch) ~= 'table' or getmetatable(patch) == json.array_mt then return copy(patch) end
  if type(target) ~= 'table' or getmetatable(target) == json.array_mt then target = object() end
  for k, v in pairs(patch) do
    if v == json.null then target[k] = nil else target[k] = merge_patch(target[k], v) end
  end
  return target
end

-- }======================================================

-- {======================================================
-- Kinds
-- =======================================================

local AS, AX = 'agents.x-k8s.io', 'extensions.agents.x-k8s.io'

-- Each resource kept: plural -> { group, versions, kind, namespaced, short }
local KINDS = {
  pods = { group = '', version = 'v1', kind = 'Pod', short = { 'po' },
    verbs = { 'create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch' } },
  networkpolicies = { group = 'networking.k8s.io', version = 'v1', kind = 'NetworkPolicy', short = { 'netpol' },
    verbs = { 'create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch' } },
  sandboxes = { group = AS, kind = 'Sandbox', short = { 'sandbox' } },
  sandboxtemplates = { group = AX, kind = 'SandboxTemplate', short = { 'sandboxtemplate' } },
  sandboxclaims = { group = AX, kind = 'SandboxClaim', short = { 'sandboxclaim' } },
  sandboxwarmpools = { group = AX, kind = 'SandboxWarmPool', short = { 'sandboxwarmpool' } },
}
local CR_VERSIONS = { 'v1beta1', 'v1alpha1' }
local CRUD = { 'create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch' }

local function api_version(plural, version)
  local k = KINDS[plural]
  if k.group == '' then return k.version end
  return k.group .. '/' .. (version or k.version or 'v1beta1')
end

-- }======================================================

-- {======================================================
-- The fields a Pod may have (core/v1's OpenAPI), for field validation
-- =======================================================

local function set(list)
  local t = {}
  for _, k in ipairs(list) do t[k] = true end
  return t
end

local META = set({ 'name', 'generateName', 'namespace', 'selfLink', 'uid', 'resourceVersion', 'generation',
  'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'labels', 'annotations', 'ownerReferences',
  'finalizers', 'managedFields' })
local SC = { 'capabilities', 'privileged', 'seLinuxOptions', 'windowsOptions', 'runAsUser', 'runAsGroup',
  'runAsNonRoot', 'readOnlyRootFilesystem', 'allowPrivilegeEscalation', 'procMount', 'seccompProfile',
  'appArmorProfile' }
local POD_SC = set({ 'seLinuxOptions', 'windowsOptions', 'runAsUser', 'runAsGroup', 'runAsNonRoot',
  'supplementalGroups', 'supplementalGroupsPolicy', 'fsGroup', 'sysctls', 'fsGroupChangePolicy', 'seccompProfile',
  'appArmorProfile', 'seLinuxChangePolicy' })
local CONTAINER = set({ 'name', 'image', 'command', 'args', 'workingDir', 'ports', 'envFrom', 'env', 'resources',
  'resizePolicy', 'restartPolicy', 'volumeMounts', 'volumeDevices', 'livenessProbe', 'readinessProbe', 'startupProbe',
  'lifecycle', 'terminationMessagePath', 'terminationMessagePolicy', 'imagePullPolicy', 'securityContext', 'stdin',
  'stdinOnce', 'tty' })
local POD_SPEC = set({ 'volumes', 'initContainers', 'containers', 'ephemeralContainers', 'restartPolicy',
  'terminationGracePeriodSeconds', 'activeDeadlineSeconds', 'dnsPolicy', 'nodeSelector', 'serviceAccountName',
  'serviceAccount', 'automountServiceAccountToken', 'nodeName', 'hostNetwork', 'hostPID', 'hostIPC',
  'shareProcessNamespace', 'securityContext', 'imagePullSecrets', 'hostname', 'subdomain', 'affinity', 'schedulerName',
  'tolerations', 'hostAliases', 'priorityClassName', 'priority', 'dnsConfig', 'readinessGates', 'runtimeClassName',
  'enableServiceLinks', 'preemptionPolicy', 'overhead', 'topologySpreadConstraints', 'setHostnameAsFQDN', 'os',
  'hostUsers', 'schedulingGates', 'resourceClaims', 'resources' })
local KNOWN = {
  pod = set({ 'apiVersion', 'kind', 'metadata', 'spec', 'status' }),
  spec = POD_SPEC, container = CONTAINER, sc = set(SC), pod_sc = POD_SC, meta = META,
  resources = set({ 'limits', 'requests', 'claims' }),
  mount = set({ 'name', 'readOnly', 'recursiveReadOnly', 'mountPath', 'subPath', 'mountPropagation', 'subPathExpr' }),
  env = set({ 'name', 'value', 'valueFrom' }),
  port = set({ 'name', 'hostPort', 'containerPort', 'protocol', 'hostIP' }),
  volume = set({ 'name', 'hostPath', 'emptyDir', 'gcePersistentDisk', 'awsElasticBlockStore', 'gitRepo', 'secret',
    'nfs', 'iscsi', 'glusterfs', 'persistentVolumeClaim', 'rbd', 'flexVolume', 'cinder', 'cephfs', 'flocker',
    'downwardAPI', 'fc', 'azureFile', 'configMap', 'vsphereVolume', 'quobyte', 'azureDisk', 'photonPersistentDisk',
    'projected', 'portworxVolume', 'scaleIO', 'storageos', 'csi', 'ephemeral', 'image' }),
  empty_dir = set({ 'medium', 'sizeLimit' }),
}

-- The fields of `pod` that a Pod does not have, as paths (`spec.containers[0].foo`), removed
-- from it as the API server's decoder drops them.
local function unknown_fields(pod)
  local out = {}
  local function walk(t, known, path)
    if type(t) ~= 'table' or getmetatable(t) == json.array_mt then return end
    local names = {}
    for k in pairs(t) do names[#names + 1] = k end
    table.sort(names)
    for _, k in ipairs(names) do
      if not known[k] then
        out[#out + 1] = path .. k
        t[k] = nil
      end
    end
  end
  local function each(list, known, path, inner)
    if type(list) ~= 'table' then return end
    for i, x in ipairs(list) do
      local p = ('%s[%d]'):format(path, i - 1)
      walk(x, known, p .. '.')
      if inner and type(x) == 'table' then inner(x, p .. '.') end
    end
  end
  walk(pod, KNOWN.pod, '')
  walk(pod.metadata, KNOWN.meta, 'metadata.')
  local spec = pod.spec
  walk(spec, KNOWN.spec, 'spec.')
  if type(spec) ~= 'table' then return out end
  walk(spec.securityContext, KNOWN.pod_sc, 'spec.securityContext.')
  each(spec.volumes, KNOWN.volume, 'spec.volumes', function(v, p) walk(v.emptyDir, KNOWN.empty_dir, p .. 'emptyDir.') end)
  for _, which in ipairs({ 'initContainers', 'containers' }) do
    each(spec[which], KNOWN.container, 'spec.' .. which, function(c, p)
      walk(c.securityContext, KNOWN.sc, p .. 'securityContext.')
      walk(c.resources, KNOWN.resources, p .. 'resources.')
      each(c.volumeMounts, KNOWN.mount, p .. 'volumeMounts')
      each(c.env, KNOWN.env, p .. 'env')
      each(c.ports, KNOWN.port, p .. 'ports')
    end)
  end
  return out
end
M.unknown_fields = unknown_fields

-- }======================================================

--- Installs the API server on `svc` (see the header). Returns the state: `server`, `ca_file`,
-- `token`, `client_cert_file`, `client_key_file`, `objects` (plural -> ns -> name -> object),
-- `containers` (uid -> kube_pods container), `pull_failures` (image -> true), `images` (image ->
-- true), `forbidden`, `unschedulable`, `events` (the WatchEvents of the last 10000 to 20000
-- changes, in order: { type, plural, object, rv }), and :pod(ns, name), :evict(ns, name),
-- :cut_attach(ns, name), :close().
function M.install(svc, _, opts)
  opts = opts or {}
  assert(type(opts.token) == 'string' and #opts.token > 0, 'kube_service.install: a token')
  local state = {
    token = opts.token, rv = 1000, objects = {}, containers = {}, watchers = {}, history = {},
    pull_failures = {}, images = {}, agent_images = {}, forbidden = {}, events = {}, logs = {}, attached = {},
    ip_seq = 0,
    namespaces = { default = true, ['kube-system'] = true, ['kube-public'] = true },
    start_ms = opts.start_ms or 30, closed = false,
    node = { cpu = M.quantity(opts.node_cpu or '4'), memory = M.quantity(opts.node_memory or '8Gi') },
  }
  if opts.namespace then state.namespaces[opts.namespace] = true end
  for _, i in ipairs(opts.images or {}) do state.images[i] = true end
  for _, i in ipairs(opts.agent_images or {}) do state.agent_images[i] = true; state.images[i] = true end
  for plural in pairs(KINDS) do state.objects[plural] = {} end
  local ns_created = core.now_ms()

  -- {------------------------------------------------------
  -- Storage and watch
  -- -------------------------------------------------------

  local function bucket(plural, ns)
    local b = state.objects[plural][ns]
    if not b then b = {}; state.objects[plural][ns] = b end
    return b
  end

  -- The object as an answer gives it: with its kind and apiVersion.
  local function typed(plural, obj, version)
    local out = copy(obj)
    out.kind = KINDS[plural].kind
    out.apiVersion = api_version(plural, version)
    return out
  end

  local function notify(kind, plural, obj)
    state.rv = state.rv + 1
    obj.metadata.resourceVersion = tostring(state.rv)
    local ev = { type = kind, plural = plural, object = copy(obj), rv = state.rv }
    state.history[#state.history + 1] = ev
    if #state.history > 2000 then table.remove(state.history, 1) end
    state.events[#state.events + 1] = ev
    if #state.events > 20000 then
      local keep = {}
      for i = 10001, #state.events do keep[#keep + 1] = state.events[i] end
      state.events = keep
    end
    for w in pairs(state.watchers) do
      if w.plural == plural then w.push(ev) end
    end
  end

  local function put(plural, obj, kind)
    bucket(plural, obj.metadata.namespace)[obj.metadata.name] = obj
    notify(kind or 'MODIFIED', plural, obj)
  end

  local function remove(plural, obj)
    local b = bucket(plural, obj.metadata.namespace)
    if b[obj.metadata.name] == obj then b[obj.metadata.name] = nil end
    notify('DELETED', plural, obj)
  end

  local function get(plural, ns, name)
    return state.objects[plural][ns] and state.objects[plural][ns][name] or nil
  end

  function state.pod(_, ns, name) return get('pods', ns, name) end

  local function not_found(plural, name)
    local k = KINDS[plural]
    local what = k.group == '' and plural or (plural .. '.' .. k.group)
    return fail(404, 'NotFound', ('%s "%s" not found'):format(what, name),
      object({ name = name, group = k.group ~= '' and k.group or nil, kind = plural }))
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Requests
  -- -------------------------------------------------------

  -- A bearer token, or a client certificate the front checked (its CN, passed on with the front's
  -- secret: a request straight to the stand-in's own port cannot claim one).
  local function refuse(req)
    local auth = req.headers.authorization
    if auth == 'Bearer ' .. state.token then return nil end
    if auth == nil and state.client_user and req.headers['x-kube-front'] == state.front_secret and
      req.headers['x-kube-client'] == state.client_user then
      return nil
    end
    return fail(401, 'Unauthorized', 'Unauthorized')
  end

  -- every value of a repeated query parameter, in order
  local function query_all(req, name)
    local q = req.target:match('%?(.*)$') or ''
    local out = {}
    for pair in q:gmatch('[^&]+') do
      local k, v = pair:match('^([^=]*)=?(.*)$')
      local function unescape(s)
        return (s:gsub('+', ' '):gsub('%%(%x%x)', function(h) return string.char(tonumber(h, 16)) end))
      end
      if unescape(k) == name then out[#out + 1] = unescape(v) end
    end
    return out
  end

  local function body_of(req)
    local ct = (req.headers['content-type'] or 'application/json'):lower()
    if req.method == 'PATCH' then
      if not ct:find('application/merge-patch+json', 1, true) and
        not ct:find('application/strategic-merge-patch+json', 1, true) then
        return nil, fail(415, 'UnsupportedMediaType', ('the body of the request was in an unknown format - ' ..
          'accepted media types include: application/merge-patch+json (the stand-in has no %s)'):format(ct))
      end
    elseif not ct:find('json', 1, true) and not ct:find('yaml', 1, true) then
      return nil, fail(415, 'UnsupportedMediaType', 'the body of the request was in an unknown format')
    end
    if type(req.json) ~= 'table' or getmetatable(req.json) == json.array_mt then
      return nil, fail(400, 'BadRequest', 'the object provided is unrecognized (must be of type object)')
    end
    return req.json
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Validation
  -- -------------------------------------------------------

  local function invalid(kind, name, causes)
    local msgs, out = {}, {}
    for _, c in ipairs(causes) do
      msgs[#msgs + 1] = c.field .. ': ' .. c.message
      out[#out + 1] = object({ reason = c.reason or 'FieldValueInvalid', message = c.message, field = c.field })
    end
    local message = ('%s "%s" is invalid: %s'):format(kind, name or '', #msgs == 1 and msgs[1] or
      ('[' .. table.concat(msgs, ', ') .. ']'))
    return fail(422, 'Invalid', message, object({ name = name, kind = kind, causes = array(out) }))
  end

  local function show(v)
    if type(v) == 'string' then return '"' .. v .. '"' end
    return tostring(v)
  end

  -- Checks metadata (name, generateName, namespace, labels, annotations): fills the name; causes.
  local function check_meta(obj, ns, causes)
    local meta = obj.metadata
    if type(meta) ~= 'table' then
      meta = object(); obj.metadata = meta
    end
    if (meta.name == nil or meta.name == '') and type(meta.generateName) == 'string' and meta.generateName ~= '' then
      meta.name = meta.generateName .. gen_suffix()
    end
    if meta.name == nil or meta.name == '' then
      causes[#causes + 1] = { field = 'metadata.name', reason = 'FieldValueRequired',
        message = 'Required value: name or generateName is required' }
    elseif not dns_subdomain(meta.name) then
      causes[#causes + 1] = { field = 'metadata.name', message = ('Invalid value: %s: a lowercase RFC 1123 ' ..
        "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end " ..
        "with an alphanumeric character (e.g. 'example.com', regex used for validation is " ..
        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"):format(show(meta.name)) }
    end
    if meta.namespace ~= nil and meta.namespace ~= ns then
      return fail(400, 'BadRequest', 'the namespace of the provided object does not match the namespace sent ' ..
        'on the request')
    end
    meta.namespace = ns
    for _, which in ipairs({ 'labels', 'annotations' }) do
      local m = meta[which]
      if m ~= nil and (type(m) ~= 'table' or getmetatable(m) == json.array_mt) then
        return fail(400, 'BadRequest', ('metadata.%s must be a map of strings'):format(which))
      end
      for k, v in pairs(m or {}) do
        local e = key_error(k)
        if e then
          causes[#causes + 1] = { field = ('metadata.%s'):format(which), message = ('Invalid value: %s: %s')
            :format(show(k), e) }
        end
        if type(v) ~= 'string' then
          return fail(400, 'BadRequest', ('metadata.%s: values must be strings'):format(which))
        end
        if which == 'labels' and value_error(v) then
          causes[#causes + 1] = { field = ('metadata.labels'), message = ('Invalid value: %s: %s')
            :format(show(v), value_error(v)) }
        end
      end
    end
    return nil
  end

  local function check_resources(res, path, causes)
    if res == nil then return nil end
    if type(res) ~= 'table' then return fail(400, 'BadRequest', path .. ' must be an object') end
    local vals = {}
    for _, which in ipairs({ 'limits', 'requests' }) do
      vals[which] = {}
      for name, q in pairs(res[which] or {}) do
        local v = M.quantity(q)
        if v == nil then
          -- a quantity that does not parse fails when the body is decoded
          return fail(400, 'BadRequest', ('quantities must match the regular expression ' ..
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))
        end
        if v < 0 then
          causes[#causes + 1] = { field = ('%s.%s[%s]'):format(path, which, name),
            message = ('Invalid value: "%s": must be greater than or equal to 0'):format(q) }
        end
        if not (name == 'cpu' or name == 'memory' or name == 'ephemeral-storage' or name:find('/', 1, true)
          or name:match('^hugepages%-')) then
          causes[#causes + 1] = { field = ('%s.%s[%s]'):format(path, which, name), reason = 'FieldValueNotSupported',
            message = ('Invalid value: "%s": must be a standard resource type or fully qualified'):format(name) }
        end
        vals[which][name] = v
      end
    end
    for name, v in pairs(vals.requests) do
      local lim = vals.limits[name]
      if lim and v > lim then
        causes[#causes + 1] = { field = ('%s.requests'):format(path), message = ('Invalid value: "%s": must be ' ..
          'less than or equal to %s limit of %s'):format(res.requests[name], name, res.limits[name]) }
      end
    end
    return nil
  end

  local PULL = { Always = true, IfNotPresent = true, Never = true }

  local function default_pull(image)
    local tag = image:match(':([^/:]+)$')
    if image:find('@', 1, true) then return 'IfNotPresent' end
    if not tag or tag == 'latest' then return 'Always' end
    return 'IfNotPresent'
  end

  local function check_sc(sc, path, causes)
    if type(sc) ~= 'table' then return end
    for _, k in ipairs({ 'runAsUser', 'runAsGroup', 'fsGroup' }) do
      local v = sc[k]
      if v ~= nil and (not is_int(v) or v < 0 or v > 2147483647) then
        causes[#causes + 1] = { field = path .. '.' .. k, message = ('Invalid value: %s: must be between 0 and ' ..
          '2147483647, inclusive'):format(tostring(v)) }
      end
    end
  end

  local function check_containers(list, path, volumes, causes, names_seen)
    if list == nil then return nil end
    if type(list) ~= 'table' then return fail(400, 'BadRequest', path .. ' must be a list') end
    for i, c in ipairs(list) do
      local p = ('%s[%d]'):format(path, i - 1)
      if type(c) ~= 'table' then return fail(400, 'BadRequest', p .. ' must be an object') end
      if c.name == nil or c.name == '' then
        causes[#causes + 1] = { field = p .. '.name', reason = 'FieldValueRequired', message = 'Required value' }
      elseif not dns_label(c.name) then
        causes[#causes + 1] = { field = p .. '.name', message = ('Invalid value: %s: a lowercase RFC 1123 label ' ..
          "must consist of lower case alphanumeric characters or '-', and must start and end with an " ..
          "alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is " ..
          "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"):format(show(c.name)) }
      elseif names_seen[c.name] then
        causes[#causes + 1] = { field = p .. '.name', reason = 'FieldValueDuplicate',
          message = ('Duplicate value: %s'):format(show(c.name)) }
      else
        names_seen[c.name] = true
      end
      if type(c.image) ~= 'string' or c.image:match('^%s*$') then
        causes[#causes + 1] = { field = p .. '.image', reason = 'FieldValueRequired', message = 'Required value' }
      elseif c.image:match('^%s') or c.image:match('%s$') then
        causes[#causes + 1] = { field = p .. '.image', message = ('Invalid value: %s: must not have leading or ' ..
          'trailing whitespace'):format(show(c.image)) }
      end
      if c.imagePullPolicy ~= nil and not PULL[c.imagePullPolicy] then
        causes[#causes + 1] = { field = p .. '.imagePullPolicy', reason = 'FieldValueNotSupported',
          message = ('Unsupported value: %s: supported values: "Always", "IfNotPresent", "Never"')
            :format(show(c.imagePullPolicy)) }
      end
      for _, which in ipairs({ 'command', 'args' }) do
        if c[which] ~= nil then
          if type(c[which]) ~= 'table' then return fail(400, 'BadRequest', p .. '.' .. which .. ' must be a list') end
          for _, a in ipairs(c[which]) do
            if type(a) ~= 'string' then return fail(400, 'BadRequest', p .. '.' .. which .. ' must hold strings') end
          end
        end
      end
      for j, e in ipairs(c.env or {}) do
        local ep = ('%s.env[%d]'):format(p, j - 1)
        if type(e) ~= 'table' or type(e.name) ~= 'string' or e.name == '' then
          causes[#causes + 1] = { field = ep .. '.name', reason = 'FieldValueRequired', message = 'Required value' }
        elseif not e.name:match('^[-._a-zA-Z][-._a-zA-Z0-9]*$') then
          causes[#causes + 1] = { field = ep .. '.name', message = ('Invalid value: %s: a valid environment ' ..
            "variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start " ..
            'with a digit'):format(show(e.name)) }
        elseif e.valueFrom ~= nil and path == 'spec.containers' and i == 1 then
          causes[#causes + 1] = { field = ep .. '.valueFrom', reason = 'FieldValueNotSupported',
            message = 'Unsupported value: the stand-in takes env values only' }
        end
      end
      for j, m in ipairs(c.volumeMounts or {}) do
        local mp = ('%s.volumeMounts[%d]'):format(p, j - 1)
        if type(m) ~= 'table' or not volumes[m.name] then
          causes[#causes + 1] = { field = mp .. '.name', reason = 'FieldValueNotFound',
            message = ('Not found: %s'):format(show(type(m) == 'table' and m.name or nil)) }
        end
        if type(m) == 'table' and (type(m.mountPath) ~= 'string' or m.mountPath == '') then
          causes[#causes + 1] = { field = mp .. '.mountPath', reason = 'FieldValueRequired', message = 'Required value' }
        elseif type(m) == 'table' and m.mountPath:sub(1, 1) ~= '/' then
          causes[#causes + 1] = { field = mp .. '.mountPath', message = ('Invalid value: %s: the stand-in takes ' ..
            'absolute mount paths'):format(show(m.mountPath)) }
        elseif type(m) == 'table' and (m.mountPath:find('/%.%./') or m.mountPath:match('/%.%.$')) then
          causes[#causes + 1] = { field = mp .. '.mountPath', message = ('Invalid value: %s: must not contain ' ..
            "'..'"):format(show(m.mountPath)) }
        end
      end
      for j, port in ipairs(c.ports or {}) do
        local pp = ('%s.ports[%d]'):format(p, j - 1)
        local n = type(port) == 'table' and port.containerPort
        if not is_int(n) or n < 1 or n > 65535 then
          causes[#causes + 1] = { field = pp .. '.containerPort', message = ('Invalid value: %s: must be between ' ..
            '1 and 65535, inclusive'):format(tostring(n)) }
        end
      end
      local e = check_resources(c.resources, p .. '.resources', causes)
      if e then return e end
      check_sc(c.securityContext, p .. '.securityContext', causes)
    end
    return nil
  end

  -- Checks and defaults a Pod; nil, or an answer refusing it.
  local function admit_pod(pod, ns)
    local causes = {}
    local e = check_meta(pod, ns, causes)
    if e then return e end
    local spec = pod.spec
    if type(spec) ~= 'table' then
      return invalid('Pod', pod.metadata.name, { { field = 'spec.containers', reason = 'FieldValueRequired',
        message = 'Required value' } })
    end
    local volumes = {}
    for i, v in ipairs(spec.volumes or {}) do
      local vp = ('spec.volumes[%d]'):format(i - 1)
      if type(v) ~= 'table' or not dns_label(v.name) then
        causes[#causes + 1] = { field = vp .. '.name', message = ('Invalid value: %s: a lowercase RFC 1123 label ' ..
          'must consist of lower case alphanumeric characters or \'-\''):format(show(type(v) == 'table' and v.name)) }
      elseif volumes[v.name] then
        causes[#causes + 1] = { field = vp .. '.name', reason = 'FieldValueDuplicate',
          message = ('Duplicate value: %s'):format(show(v.name)) }
      else
        volumes[v.name] = v
        if type(v.emptyDir) == 'table' and v.emptyDir.sizeLimit ~= nil and M.quantity(v.emptyDir.sizeLimit) == nil then
          return fail(400, 'BadRequest', "quantities must match the regular expression " ..
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
        end
      end
    end
    if type(spec.containers) ~= 'table' or #spec.containers == 0 then
      causes[#causes + 1] = { field = 'spec.containers', reason = 'FieldValueRequired', message = 'Required value' }
    end
    local seen = {}
    e = check_containers(spec.initContainers, 'spec.initContainers', volumes, causes, seen)
      or check_containers(spec.containers, 'spec.containers', volumes, causes, seen)
    if e then return e end
    if spec.restartPolicy ~= nil and not ({ Always = true, OnFailure = true, Never = true })[spec.restartPolicy] then
      causes[#causes + 1] = { field = 'spec.restartPolicy', reason = 'FieldValueNotSupported',
        message = ('Unsupported value: %s: supported values: "Always", "OnFailure", "Never"')
          :format(show(spec.restartPolicy)) }
    end
    local ad = spec.activeDeadlineSeconds
    if ad ~= nil and (not is_int(ad) or ad < 1) then
      causes[#causes + 1] = { field = 'spec.activeDeadlineSeconds', message = ('Invalid value: %s: must be ' ..
        'between 1 and 2147483647, inclusive'):format(tostring(ad)) }
    end
    local tg = spec.terminationGracePeriodSeconds
    if tg ~= nil and (not is_int(tg) or tg < 0) then
      causes[#causes + 1] = { field = 'spec.terminationGracePeriodSeconds', message = ('Invalid value: %s: must ' ..
        'be greater than or equal to 0'):format(tostring(tg)) }
    end
    check_sc(spec.securityContext, 'spec.securityContext', causes)
    if #causes > 0 then return invalid('Pod', pod.metadata.name, causes) end
    -- defaults, as the API server fills them
    spec.restartPolicy = spec.restartPolicy or 'Always'
    spec.terminationGracePeriodSeconds = spec.terminationGracePeriodSeconds or 30
    spec.dnsPolicy = spec.dnsPolicy or 'ClusterFirst'
    spec.schedulerName = spec.schedulerName or 'default-scheduler'
    spec.securityContext = spec.securityContext or object()
    spec.enableServiceLinks = spec.enableServiceLinks == nil and true or spec.enableServiceLinks
    spec.serviceAccountName = spec.serviceAccountName or 'default'
    for _, list in ipairs({ spec.initContainers or {}, spec.containers }) do
      for _, c in ipairs(list) do
        c.imagePullPolicy = c.imagePullPolicy or default_pull(c.image)
        c.terminationMessagePath = c.terminationMessagePath or '/dev/termination-log'
        c.terminationMessagePolicy = c.terminationMessagePolicy or 'File'
        c.resources = c.resources or object()
        -- a limit without a request requests the limit
        if type(c.resources.limits) == 'table' then
          c.resources.requests = c.resources.requests or object()
          for k, v in pairs(c.resources.limits) do
            if c.resources.requests[k] == nil then c.resources.requests[k] = v end
          end
        end
      end
    end
    return nil
  end

  local function admit_netpol(np, ns)
    local causes = {}
    local e = check_meta(np, ns, causes)
    if e then return e end
    local spec = np.spec
    if spec == nil then spec = object(); np.spec = spec end
    if type(spec) ~= 'table' then return fail(400, 'BadRequest', 'spec must be an object') end
    spec.podSelector = spec.podSelector or object()
    if type(spec.podSelector.matchLabels) == 'table' then
      for k, v in pairs(spec.podSelector.matchLabels) do
        if key_error(k) then
          causes[#causes + 1] = { field = 'spec.podSelector.matchLabels', message = ('Invalid value: %s: %s')
            :format(show(k), key_error(k)) }
        end
        if value_error(v) then
          causes[#causes + 1] = { field = 'spec.podSelector.matchLabels', message = ('Invalid value: %s: %s')
            :format(show(v), value_error(v)) }
        end
      end
    end
    for i, t in ipairs(spec.policyTypes or {}) do
      if t ~= 'Ingress' and t ~= 'Egress' then
        causes[#causes + 1] = { field = ('spec.policyTypes[%d]'):format(i - 1), reason = 'FieldValueNotSupported',
          message = ('Unsupported value: %s: supported values: "Ingress", "Egress"'):format(show(t)) }
      end
    end
    local function check_peers(rules, what)
      for i, r in ipairs(rules or {}) do
        local rp = ('spec.%s[%d]'):format(what, i - 1)
        for j, port in ipairs(r.ports or {}) do
          if port.protocol ~= nil and not ({ TCP = true, UDP = true, SCTP = true })[port.protocol] then
            causes[#causes + 1] = { field = ('%s.ports[%d].protocol'):format(rp, j - 1),
              reason = 'FieldValueNotSupported', message = ('Unsupported value: %s: supported values: "SCTP", ' ..
              '"TCP", "UDP"'):format(show(port.protocol)) }
          end
          local pn = port.port
          if is_int(pn) and (pn < 1 or pn > 65535) then
            causes[#causes + 1] = { field = ('%s.ports[%d].port'):format(rp, j - 1), message = ('Invalid value: %d: ' ..
              'must be between 1 and 65535, inclusive'):format(pn) }
          end
        end
        for j, peer in ipairs(r[what == 'egress' and 'to' or 'from'] or {}) do
          local cidr = type(peer.ipBlock) == 'table' and peer.ipBlock.cidr
          if peer.ipBlock ~= nil then
            local a, b, c2, d, bits = tostring(cidr):match('^(%d+)%.(%d+)%.(%d+)%.(%d+)/(%d+)$')
            local ok = a and tonumber(a) < 256 and tonumber(b) < 256 and tonumber(c2) < 256 and tonumber(d) < 256
              and tonumber(bits) <= 32
            if not ok and not tostring(cidr):match('^[%x:]+/%d+$') then
              causes[#causes + 1] = { field = ('%s.%s[%d].ipBlock.cidr'):format(rp, what == 'egress' and 'to' or 'from',
                j - 1), message = ('Invalid value: %s: must be a valid CIDR value, (e.g. 10.9.8.0/24 or ' ..
                '2001:db8::/64)'):format(show(cidr)) }
            end
          end
        end
      end
    end
    check_peers(spec.ingress, 'ingress')
    check_peers(spec.egress, 'egress')
    if #causes > 0 then return invalid('NetworkPolicy', np.metadata.name, causes) end
    if spec.policyTypes == nil then
      spec.policyTypes = array({ 'Ingress' })
      if spec.egress ~= nil then spec.policyTypes[2] = 'Egress' end
    end
    return nil
  end

  local function admit_cr(plural, obj, ns)
    local causes = {}
    local e = check_meta(obj, ns, causes)
    if e then return e end
    if type(obj.spec) ~= 'table' then
      if plural == 'sandboxtemplates' or plural == 'sandboxes' or plural == 'sandboxclaims' or
        plural == 'sandboxwarmpools' then
        causes[#causes + 1] = { field = 'spec', reason = 'FieldValueRequired', message = 'Required value' }
      end
    end
    if #causes > 0 then return invalid(KINDS[plural].kind, obj.metadata.name, causes) end
    return nil
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Pods on the node
  -- -------------------------------------------------------

  -- Guaranteed: every container has cpu and memory limits, its requests equal to them; BestEffort:
  -- none asks for anything; else Burstable.
  local function qos_class(pod)
    local any, all = false, true
    for _, list in ipairs({ pod.spec.initContainers or {}, pod.spec.containers }) do
      for _, c in ipairs(list) do
        local lim = c.resources and c.resources.limits or {}
        local req = c.resources and c.resources.requests or {}
        if next(lim) or next(req) then any = true end
        for _, k in ipairs({ 'cpu', 'memory' }) do
          local l, r = M.quantity(lim[k]), M.quantity(req[k] or lim[k])
          if not l or l ~= r then all = false end
        end
      end
    end
    if not any then return 'BestEffort' end
    return all and 'Guaranteed' or 'Burstable'
  end

  local function condition(pod, ctype, status, reason, message)
    local conds = pod.status.conditions
    if not conds then conds = array(); pod.status.conditions = conds end
    for _, c in ipairs(conds) do
      if c.type == ctype then
        if c.status ~= status then c.lastTransitionTime = timestamp() end
        c.status, c.reason, c.message = status, reason, message
        return
      end
    end
    conds[#conds + 1] = object({ type = ctype, status = status, reason = reason, message = message,
      lastProbeTime = json.null, lastTransitionTime = timestamp() })
  end

  local function main_index(pod)
    local want = pod.metadata.annotations and pod.metadata.annotations['kubectl.kubernetes.io/default-container']
    for i, c in ipairs(pod.spec.containers) do
      if c.name == want then return i end
    end
    return 1
  end

  local function container_statuses(pod, fn)
    local out = array()
    for i, c in ipairs(pod.spec.containers) do
      local st = object({ name = c.name, image = c.image, imageID = '', ready = false, restartCount = 0,
        started = false, state = object({ waiting = object({ reason = 'ContainerCreating' }) }),
        lastState = object() })
      if fn then fn(i, c, st) end
      out[#out + 1] = st
    end
    pod.status.containerStatuses = out
  end

  local function alive(pod)
    return get('pods', pod.metadata.namespace, pod.metadata.name) == pod
  end

  local function pod_ended(pod, phase, reason, message)
    local ct = state.containers[pod.metadata.uid]
    if ct then ct:kill() end
    pod.status.phase = phase
    pod.status.reason, pod.status.message = reason, message
    condition(pod, 'Ready', 'False', 'PodCompleted')
    condition(pod, 'ContainersReady', 'False', 'PodCompleted')
  end

  local function pod_log(pod, bytes)
    local l = state.logs[pod.metadata.uid] or {}
    state.logs[pod.metadata.uid] = l
    l[#l + 1] = bytes
    local n = 0
    for _, b in ipairs(l) do n = n + #b end
    while n > 1048576 and #l > 1 do n = n - #table.remove(l, 1) end
  end

  -- The image pull of one container: true when the image is there; else the waiting state set.
  local function pull(pod, c, st)
    if state.images[c.image] and c.imagePullPolicy ~= 'Always' then return true end
    if c.imagePullPolicy == 'Never' then
      st.state = object({ waiting = object({ reason = 'ErrImageNeverPull', message = ('Container image "%s" is ' ..
        'not present with pull policy of Never'):format(c.image) }) })
      return false
    end
    if state.pull_failures[c.image] then
      st.state = object({ waiting = object({ reason = 'ErrImagePull', message = ('failed to pull and unpack ' ..
        'image "%s": not found (stand-in)'):format(c.image) }) })
      put('pods', pod)
      task.sleep(50)
      if not alive(pod) then return false end
      st.state = object({ waiting = object({ reason = 'ImagePullBackOff', message = ('Back-off pulling image ' ..
        '"%s"'):format(c.image) }) })
      return false
    end
    state.images[c.image] = true
    return true
  end

  local function agent_dir(pod, c)
    local volumes = {}
    for _, v in ipairs(pod.spec.volumes or {}) do volumes[v.name] = v end
    local init_mounted = {}
    for _, ic in ipairs(pod.spec.initContainers or {}) do
      for _, m in ipairs(ic.volumeMounts or {}) do init_mounted[m.name] = true end
    end
    for _, m in ipairs(c.volumeMounts or {}) do
      if m.mountPath == '/.mayura' and init_mounted[m.name] and volumes[m.name] and volumes[m.name].emptyDir then
        return '/.mayura', true
      end
    end
    if state.agent_images[c.image] then return '/.mayura', false end
    return nil
  end

  -- Why the container's first program cannot be run, or nil: its files are the host's /usr (and the
  -- root links), the agent where agent_dir puts it, and empty volumes.
  local function no_program(pod, c)
    local prog = (c.command or {})[1] or (c.args or {})[1] or '/bin/sh'
    local dir = agent_dir(pod, c)
    if dir and prog == dir .. '/agent' then return nil end
    local msg = 'failed to create containerd task: failed to create shim task: OCI runtime create failed: ' ..
      'runc create failed: unable to start container process: exec: "%s": %s'
    if prog:sub(1, 1) == '/' then
      local top = prog:match('^/([^/]+)/')
      local host_path = ({ usr = true, bin = true, sbin = true, lib = true, lib64 = true })[top or ''] and prog
      if host_path and not prog:find('/%.%./') and host.exists(host_path) then return nil end
      return msg:format(prog, 'stat ' .. prog .. ': no such file or directory')
    end
    if prog:find('/', 1, true) then return nil end   -- relative to the working directory: left to the run
    for d in ('/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'):gmatch('[^:]+') do
      if host.exists(d .. '/' .. prog) then return nil end
    end
    return msg:format(prog, 'executable file not found in $PATH')
  end

  local function start_container(pod, c)
    local sc = pod.spec.securityContext or {}
    local csc = c.securityContext or {}
    local uid = csc.runAsUser or sc.runAsUser or 0
    local gid = csc.runAsGroup or sc.runAsGroup or 0   -- the image's group: root's, in the stand-in's images
    local mounts = {}
    local volumes = {}
    for _, v in ipairs(pod.spec.volumes or {}) do volumes[v.name] = v end
    local dir, mounted = agent_dir(pod, c)
    for _, m in ipairs(c.volumeMounts or {}) do
      local v = volumes[m.name]
      if v and v.emptyDir then
        local limit = type(v.emptyDir) == 'table' and M.quantity(v.emptyDir.sizeLimit)
        mounts[#mounts + 1] = { path = m.mountPath, mib = limit and math.max(1, math.ceil(limit / 1048576)) or 64,
          read_only = m.readOnly == true }
      end
    end
    if dir and not mounted then mounts[#mounts + 1] = { path = dir, mib = 8 } end
    local argv = {}
    for _, a in ipairs(c.command or {}) do argv[#argv + 1] = a end
    for _, a in ipairs(c.args or {}) do argv[#argv + 1] = a end
    if #argv == 0 then argv = { '/bin/sh' } end   -- the image's entrypoint: the stand-in's images have a shell
    local env = {}
    for _, e in ipairs(c.env or {}) do env[e.name] = e.value or '' end
    local limits = c.resources and c.resources.limits or {}
    local mem = M.quantity(limits.memory)
    local cpu = M.quantity(limits.cpu)
    local uidk = pod.metadata.uid
    local ct = pods_rt.start({
      name = pod.metadata.name:sub(1, 63), argv = argv, env = env, workdir = c.workingDir, uid = uid, gid = gid,
      mounts = mounts, agent_dir = dir, read_only_root = csc.readOnlyRootFilesystem == true,
      memory_mib = mem and math.max(8, math.floor(mem / 1048576)) or 1024, cpus = cpu or 1, pids = 512,
      lifetime_ms = pod.spec.activeDeadlineSeconds and (pod.spec.activeDeadlineSeconds * 1000 + 5000) or nil,
      stdin = c.stdin == true,
      on_output = function(stream, bytes)
        pod_log(pod, bytes)
        for a in pairs(state.attached[uidk] or {}) do a.output(stream, bytes) end
      end,
      on_exit = function(res) state.on_container_exit(pod, c, res) end,
    })
    state.containers[uidk] = ct
    return ct
  end

  function state.on_container_exit(pod, c, res)
    local uidk = pod.metadata.uid
    for a in pairs(state.attached[uidk] or {}) do a.ended(res) end
    if not alive(pod) or pod.status.phase == 'Failed' or pod.status.phase == 'Succeeded' then return end
    local code = res.exit_code or (128 + (tonumber(res.signal) or 9))
    local i = main_index(pod)
    local st = pod.status.containerStatuses[i]
    local started = st.state.running and st.state.running.startedAt or timestamp()
    st.state = object({ terminated = object({ exitCode = code, reason = code == 0 and 'Completed' or 'Error',
      startedAt = started, finishedAt = timestamp(), containerID = st.containerID }) })
    st.ready, st.started = false, false
    local rp = pod.spec.restartPolicy
    if rp == 'Never' or (rp == 'OnFailure' and code == 0) then
      pod_ended(pod, code == 0 and 'Succeeded' or 'Failed')
    else
      -- the stand-in does not restart containers
      st.lastState = st.state
      st.state = object({ waiting = object({ reason = 'CrashLoopBackOff', message = ('back-off 10s restarting ' ..
        'failed container=%s pod=%s'):format(c.name, pod.metadata.name) }) })
      condition(pod, 'Ready', 'False', 'ContainersNotReady', ('containers with unready status: [%s]'):format(c.name))
      condition(pod, 'ContainersReady', 'False', 'ContainersNotReady',
        ('containers with unready status: [%s]'):format(c.name))
    end
    put('pods', pod)
  end

  -- The kubelet's work for one pod.
  -- Why the scheduler finds no node for the pod, or nil: its requests above the node's allocatable
  -- resources, or `state.unschedulable` (a scripted full cluster).
  local function unschedulable(pod)
    if state.unschedulable then return 'Insufficient cpu' end
    local want = { cpu = 0, memory = 0 }
    for _, c in ipairs(pod.spec.containers) do
      local req = c.resources and c.resources.requests or {}
      for k in pairs(want) do want[k] = want[k] + (M.quantity(req[k]) or 0) end
    end
    if want.cpu > state.node.cpu then return 'Insufficient cpu' end
    if want.memory > state.node.memory then return 'Insufficient memory' end
    return nil
  end

  local function run_pod(pod)
    task.sleep(10)
    if not alive(pod) then return end
    local why = unschedulable(pod)
    while why do
      -- it stays Pending, as the scheduler retries
      local msg = ('0/1 nodes are available: 1 %s. preemption: 0/1 nodes are available: 1 No preemption victims ' ..
        'found for incoming pod.'):format(why)
      if not pod.status.conditions then
        condition(pod, 'PodScheduled', 'False', 'Unschedulable', msg)
        put('pods', pod)
      end
      task.sleep(100)
      if not alive(pod) then return end
      why = unschedulable(pod)
    end
    pod.spec.nodeName = 'stand-in-node'
    condition(pod, 'PodScheduled', 'True')
    put('pods', pod)
    task.sleep(10)
    if not alive(pod) then return end
    local now = core.now_ms()
    pod.status.startTime = timestamp(now)
    pod.status.hostIP = '10.0.0.1'
    pod.status.hostIPs = array({ object({ ip = '10.0.0.1' }) })
    local inits = pod.spec.initContainers or {}
    condition(pod, 'Initialized', #inits > 0 and 'False' or 'True', #inits > 0 and 'ContainersNotInitialized' or nil)
    condition(pod, 'Ready', 'False', 'ContainersNotReady')
    condition(pod, 'ContainersReady', 'False', 'ContainersNotReady')
    container_statuses(pod)
    if #inits > 0 then
      local out = array()
      for _, c in ipairs(inits) do
        out[#out + 1] = object({ name = c.name, image = c.image, imageID = '', ready = false, restartCount = 0,
          started = false, state = object({ waiting = object({ reason = 'PodInitializing' }) }), lastState = object() })
      end
      pod.status.initContainerStatuses = out
    end
    put('pods', pod)
    -- the deadline counts from the start
    if pod.spec.activeDeadlineSeconds then
      task.after(pod.spec.activeDeadlineSeconds * 1000, function()
        if alive(pod) and pod.status.phase ~= 'Succeeded' and pod.status.phase ~= 'Failed' then
          for _, st in ipairs(pod.status.containerStatuses or {}) do
            if st.state.running then
              st.state = object({ terminated = object({ exitCode = 137, reason = 'Error',
                startedAt = st.state.running.startedAt, finishedAt = timestamp() }) })
            end
            st.ready = false
          end
          pod_ended(pod, 'Failed', 'DeadlineExceeded', 'Pod was active on the node longer than the specified deadline')
          put('pods', pod)
        end
      end, true)
    end
    -- images, then init containers
    for i, c in ipairs(inits) do
      local st = pod.status.initContainerStatuses[i]
      if not pull(pod, c, st) then
        if alive(pod) then put('pods', pod) end
        return
      end
      st.state = object({ terminated = object({ exitCode = 0, reason = 'Completed', startedAt = timestamp(),
        finishedAt = timestamp() }) })
      st.ready = true
    end
    if #inits > 0 then condition(pod, 'Initialized', 'True') end
    local mi = main_index(pod)
    for i, c in ipairs(pod.spec.containers) do
      local st = pod.status.containerStatuses[i]
      if not pull(pod, c, st) then
        if alive(pod) then put('pods', pod) end
        return
      end
    end
    task.sleep(state.start_ms)
    if not alive(pod) or pod.status.phase ~= 'Pending' then return end
    local c = pod.spec.containers[mi]
    local st = pod.status.containerStatuses[mi]
    -- runAsNonRoot with uid 0 (given, or the image's root) is refused by the kubelet
    local sc, csc = pod.spec.securityContext or {}, c.securityContext or {}
    local non_root = csc.runAsNonRoot
    if non_root == nil then non_root = sc.runAsNonRoot end
    if non_root == true and (csc.runAsUser or sc.runAsUser or 0) == 0 then
      st.state = object({ waiting = object({ reason = 'CreateContainerConfigError', message = (csc.runAsUser or
        sc.runAsUser) and 'container\'s runAsUser breaks non-root policy (pod: "' .. pod.metadata.name ..
        '", container: ' .. c.name .. ')' or 'container has runAsNonRoot and image will run as root (pod: "' ..
        pod.metadata.name .. '", container: ' .. c.name .. ')' }) })
      put('pods', pod)
      return
    end
    -- the runtime's exec of the entrypoint: a program the container's files do not hold fails to start
    local missing = no_program(pod, c)
    if missing then
      st.state = object({ terminated = object({ exitCode = 128, reason = 'StartError', message = missing,
        startedAt = '1970-01-01T00:00:00Z', finishedAt = timestamp() }) })
      if pod.spec.restartPolicy == 'Never' then
        pod_ended(pod, 'Failed')
      else
        st.lastState = st.state
        st.state = object({ waiting = object({ reason = 'CrashLoopBackOff', message = missing }) })
      end
      put('pods', pod)
      return
    end
    local ok, ct = pcall(start_container, pod, c)
    if not ok then
      st.state = object({ waiting = object({ reason = 'CreateContainerError', message = 'the stand-in could not ' ..
        'start the container' }) })
      put('pods', pod)
      return
    end
    -- Running once its command is there (not merely its namespaces)
    ct:wait_command(5000)
    if not alive(pod) or pod.status.phase ~= 'Pending' then return end
    st.containerID = 'standin://' .. ct.id
    if ct.running then
      st.state = object({ running = object({ startedAt = timestamp() }) })
      st.ready, st.started = true, true
    end
    -- the other containers of the pod are not run: they show as running, never ready
    for i, other in ipairs(pod.status.containerStatuses) do
      if i ~= mi then other.state = object({ running = object({ startedAt = timestamp() }) }) end
    end
    if not ct.running then return end   -- it ended already: on_container_exit said so
    state.ip_seq = state.ip_seq + 1
    local ip = ('10.244.%d.%d'):format(math.floor(state.ip_seq / 250) % 250, state.ip_seq % 250 + 2)
    pod.status.podIP, pod.status.podIPs = ip, array({ object({ ip = ip }) })
    pod.status.phase = 'Running'
    condition(pod, 'ContainersReady', 'True')
    condition(pod, 'Ready', 'True')
    put('pods', pod)
  end

  --- Fails a pod as the kubelet's eviction does.
  function state.evict(_, ns, name)
    local pod = get('pods', ns, name)
    if not pod then return false end
    for _, st in ipairs(pod.status.containerStatuses or {}) do
      if st.state.running then
        st.state = object({ terminated = object({ exitCode = 137, reason = 'Error', finishedAt = timestamp() }) })
      end
      st.ready = false
    end
    pod_ended(pod, 'Failed', 'Evicted', 'The node was low on resource: memory.')
    put('pods', pod)
    return true
  end

  --- Drops every attach stream to a pod as a restarting API server or a proxy does, without a
  -- status; the pod runs on. Returns how many were cut.
  function state.cut_attach(_, ns, name)
    local pod = get('pods', ns, name)
    local n = 0
    for a in pairs(pod and state.attached[pod.metadata.uid] or {}) do
      a.cut()
      n = n + 1
    end
    return n
  end

  local function finish_delete(plural, obj)
    if plural == 'pods' then
      local ct = state.containers[obj.metadata.uid]
      if ct then ct:kill() end
      state.containers[obj.metadata.uid] = nil
      state.logs[obj.metadata.uid] = nil
    end
    remove(plural, obj)
  end

  local function delete_pod(pod, grace)
    if pod.metadata.deletionTimestamp then return end
    local ct = state.containers[pod.metadata.uid]
    local running = ct and ct.running
    if grace == nil then grace = pod.spec.terminationGracePeriodSeconds or 30 end
    if not running or pod.spec.nodeName == nil then grace = 0 end
    if grace == 0 then
      pod.metadata.deletionTimestamp = timestamp()
      pod.metadata.deletionGracePeriodSeconds = 0
      finish_delete('pods', pod)
      return
    end
    pod.metadata.deletionTimestamp = timestamp(core.now_ms() + grace * 1000)
    pod.metadata.deletionGracePeriodSeconds = grace
    put('pods', pod)
    task.spawn(function()
      local uv = require('luv')
      local deadline = core.hrtime_ms() + grace * 1000
      -- SIGTERM to the command (once it is there), then the grace
      local pids = ct:command_pids()
      while #pids == 0 and ct.running and core.hrtime_ms() < deadline do
        task.sleep(10)
        pids = ct:command_pids()
      end
      for _, p in ipairs(pids) do pcall(uv.kill, p, 'sigterm') end
      while ct.running and core.hrtime_ms() < deadline do task.sleep(20) end
      if alive(pod) then finish_delete('pods', pod) end
    end)
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- The Agent Sandbox controller
  -- -------------------------------------------------------

  local reconcile

  local function sandbox_pod_spec(sb)
    local tpl = sb.spec and sb.spec.podTemplate or {}
    local labels = object()
    for k, v in pairs(tpl.metadata and tpl.metadata.labels or {}) do labels[k] = v end
    labels['agents.x-k8s.io/sandbox-name-hash'] = host.random_hex(4)
    local annotations = object()
    for k, v in pairs(tpl.metadata and tpl.metadata.annotations or {}) do annotations[k] = v end
    return object({
      metadata = object({ name = sb.metadata.name, labels = labels, annotations = annotations,
        ownerReferences = array({ object({ apiVersion = AS .. '/v1beta1', kind = 'Sandbox', name = sb.metadata.name,
          uid = sb.metadata.uid, controller = true, blockOwnerDeletion = true }) }) }),
      spec = copy(tpl.spec or object()),
    })
  end

  local function set_cond(obj, ctype, status, reason, message)
    obj.status = obj.status or object()
    local conds = obj.status.conditions or array()
    obj.status.conditions = conds
    for _, c in ipairs(conds) do
      if c.type == ctype then
        if c.status ~= status then c.lastTransitionTime = timestamp() end
        c.status, c.reason, c.message = status, reason, message or ''
        c.observedGeneration = obj.metadata.generation
        return
      end
    end
    conds[#conds + 1] = object({ type = ctype, status = status, reason = reason, message = message or '',
      lastTransitionTime = timestamp(), observedGeneration = obj.metadata.generation })
  end

  local function create_object(plural, obj, ns)
    obj.metadata.uid = uuid()
    obj.metadata.creationTimestamp = timestamp()
    obj.metadata.generation = 1
    obj.metadata.namespace = ns
    put(plural, obj, 'ADDED')
  end

  -- A Sandbox goes with its pod (its owner reference).
  local function delete_sandbox(sb)
    local pod = get('pods', sb.metadata.namespace, sb.metadata.name)
    if get('sandboxes', sb.metadata.namespace, sb.metadata.name) == sb then finish_delete('sandboxes', sb) end
    if pod then delete_pod(pod, 0) end
  end
  state.delete_sandbox = delete_sandbox

  local function parse_time(s)
    if type(s) ~= 'string' then return nil end
    local y, mo, d, h, mi, se = s:match('^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)')
    if not y then return nil end
    -- days from the civil date (UTC), without os.time's local zone
    y, mo = tonumber(y), tonumber(mo)
    if mo <= 2 then y = y - 1; mo = mo + 12 end
    local days = 365 * y + math.floor(y / 4) - math.floor(y / 100) + math.floor(y / 400) +
      math.floor((153 * (mo - 3) + 2) / 5) + tonumber(d) - 719469
    return ((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60000 + tonumber(se) * 1000
  end
  state.parse_time = parse_time

  reconcile = function()
    if state.reconciling then state.again = true; return end
    state.reconciling = true
    repeat
      state.again = false
      -- warm pools keep their replicas
      for ns, pools in pairs(state.objects.sandboxwarmpools) do
        for _, wp in pairs(pools) do
          local tpl = get('sandboxtemplates', ns, wp.spec.sandboxTemplateRef and wp.spec.sandboxTemplateRef.name or '')
          local have, ready = 0, 0
          for _, sb in pairs(state.objects.sandboxes[ns] or {}) do
            local l = sb.metadata.labels or {}
            if l['agents.x-k8s.io/warm-pool-sandbox'] == wp.metadata.name and not sb.metadata.deletionTimestamp then
              have = have + 1
              for _, c in ipairs(sb.status and sb.status.conditions or {}) do
                if c.type == 'Ready' and c.status == 'True' then ready = ready + 1 end
              end
            end
          end
          local want = wp.spec.replicas or 1
          while tpl and have < want do
            local sb = object({ metadata = object({ name = wp.metadata.name .. '-' .. gen_suffix(),
              labels = object({ ['agents.x-k8s.io/warm-pool-sandbox'] = wp.metadata.name,
                ['agents.x-k8s.io/launch-type'] = 'warm' }),
              annotations = object({ ['agents.x-k8s.io/sandbox-template-ref'] = tpl.metadata.name }) }),
              spec = object({ podTemplate = copy(tpl.spec.podTemplate), operatingMode = 'Running' }) })
            create_object('sandboxes', sb, ns)
            have = have + 1
          end
          local st = wp.status or object()
          if st.replicas ~= have or st.readyReplicas ~= ready then
            wp.status = object({ replicas = have, readyReplicas = ready, observedGeneration = wp.metadata.generation,
              selector = 'agents.x-k8s.io/warm-pool-sandbox=' .. wp.metadata.name })
            put('sandboxwarmpools', wp)
          end
        end
      end
      -- claims get a sandbox
      for ns, claims in pairs(state.objects.sandboxclaims) do
        for _, cl in pairs(claims) do
          local st = cl.status or object()
          local name = st.sandbox and st.sandbox.name
          if not name then
            local tpl_name = cl.spec.sandboxTemplateRef and cl.spec.sandboxTemplateRef.name
            local pool_name = cl.spec.warmPoolRef and cl.spec.warmPoolRef.name
            local pool = pool_name and get('sandboxwarmpools', ns, pool_name)
            if pool then tpl_name = pool.spec.sandboxTemplateRef and pool.spec.sandboxTemplateRef.name end
            local tpl = tpl_name and get('sandboxtemplates', ns, tpl_name)
            if not tpl then
              set_cond(cl, 'Ready', 'False', 'TemplateNotFound', ('SandboxTemplate %q not found'):format(
                tostring(tpl_name)))
              if not cl._said then cl._said = true; put('sandboxclaims', cl) end
            else
              -- a ready warm sandbox of the pool, else a new one
              local taken
              for _, sb in pairs(state.objects.sandboxes[ns] or {}) do
                local l = sb.metadata.labels or {}
                if not taken and pool_name and l['agents.x-k8s.io/warm-pool-sandbox'] == pool_name then
                  taken = sb
                end
              end
              if taken then
                taken.metadata.labels['agents.x-k8s.io/warm-pool-sandbox'] = nil
                taken.metadata.ownerReferences = array({ object({ apiVersion = AX .. '/v1beta1', kind = 'SandboxClaim',
                  name = cl.metadata.name, uid = cl.metadata.uid, controller = true }) })
                put('sandboxes', taken)
                name = taken.metadata.name
              else
                local spec = copy(tpl.spec.podTemplate) or object()
                spec.metadata = spec.metadata or object()
                spec.metadata.labels = spec.metadata.labels or object()
                local add = cl.spec.additionalPodMetadata or {}
                for k, v in pairs(add.labels or {}) do spec.metadata.labels[k] = v end
                spec.metadata.labels['agents.x-k8s.io/claim-uid'] = cl.metadata.uid
                for _, e in ipairs(cl.spec.env or {}) do
                  for _, c in ipairs(spec.spec and spec.spec.containers or {}) do
                    if e.containerName == nil or e.containerName == c.name then
                      c.env = c.env or array()
                      c.env[#c.env + 1] = object({ name = e.name, value = e.value })
                    end
                  end
                end
                local sb = object({ metadata = object({ name = cl.metadata.name,
                  annotations = object({ ['agents.x-k8s.io/sandbox-template-ref'] = tpl.metadata.name }),
                  ownerReferences = array({ object({ apiVersion = AX .. '/v1beta1', kind = 'SandboxClaim',
                    name = cl.metadata.name, uid = cl.metadata.uid, controller = true }) }) }),
                  spec = object({ podTemplate = spec, operatingMode = 'Running' }) })
                if cl.spec.lifecycle and cl.spec.lifecycle.shutdownTime then
                  sb.spec.shutdownTime = cl.spec.lifecycle.shutdownTime
                  sb.spec.shutdownPolicy = 'Delete'
                end
                if get('sandboxes', ns, sb.metadata.name) then sb.metadata.name = cl.metadata.name .. '-' .. gen_suffix() end
                create_object('sandboxes', sb, ns)
                name = sb.metadata.name
              end
              cl.status = cl.status or object()
              cl.status.sandbox = object({ name = name })
              put('sandboxclaims', cl)
            end
          end
          local sb = name and get('sandboxes', ns, name)
          if sb then
            local ready = false
            for _, c in ipairs(sb.status and sb.status.conditions or {}) do
              if c.type == 'Ready' and c.status == 'True' then ready = true end
            end
            local was = false
            for _, c in ipairs(cl.status.conditions or {}) do
              if c.type == 'Ready' and c.status == 'True' then was = true end
            end
            if ready ~= was then
              set_cond(cl, 'Ready', ready and 'True' or 'False', ready and 'SandboxReady' or 'SandboxNotReady')
              cl.status.sandbox.podIPs = sb.status and sb.status.podIPs
              put('sandboxclaims', cl)
            end
          end
          -- the claim's shutdown time
          local shut = parse_time(cl.spec.lifecycle and cl.spec.lifecycle.shutdownTime)
          if shut and core.now_ms() >= shut and not cl._expired then
            -- its sandbox goes; the claim stays, expired (Retain, the default), or goes too
            cl._expired = true
            if sb then delete_sandbox(sb) end
            if (cl.spec.lifecycle.shutdownPolicy or 'Retain') == 'Retain' then
              set_cond(cl, 'Ready', 'False', 'ClaimExpired')
              put('sandboxclaims', cl)
            else
              finish_delete('sandboxclaims', cl)
            end
          end
        end
      end
      -- sandboxes have their pod
      for ns, sbs in pairs(state.objects.sandboxes) do
        for _, sb in pairs(sbs) do
          local pod = get('pods', ns, sb.metadata.name)
          local shut = parse_time(sb.spec.shutdownTime)
          local mode = sb.spec.operatingMode or 'Running'
          if shut and core.now_ms() >= shut then
            -- its pod goes; the Sandbox stays, expired (Retain, the default), or goes too
            if not sb._expired then
              sb._expired = true
              if pod then delete_pod(pod, 0) end
              if sb.spec.shutdownPolicy == 'Delete' then
                delete_sandbox(sb)
              else
                sb.status = object({ conditions = sb.status and sb.status.conditions })
                set_cond(sb, 'Ready', 'False', 'SandboxExpired', 'the sandbox expired')
                put('sandboxes', sb)
              end
            end
          elseif mode == 'Suspended' then
            -- suspended: no pod
            if pod then delete_pod(pod, 0) end
            if not sb._suspended then
              sb._suspended, sb._was_suspended = true, true
              set_cond(sb, 'Suspended', 'True', 'PodTerminated', 'the pod was deleted')
              set_cond(sb, 'Ready', 'False', 'SandboxSuspended', 'the sandbox is suspended')
              put('sandboxes', sb)
            end
          elseif not pod and not sb._finished then
            -- a pod of the Sandbox's, made again when it was deleted behind its back
            sb._suspended = false
            local p = sandbox_pod_spec(sb)
            local e = admit_pod(p, ns)
            if e then
              set_cond(sb, 'Ready', 'False', 'DependenciesNotReady', e.json.message)
              put('sandboxes', sb)
            else
              create_object('pods', p, ns)
              p.status = object({ phase = 'Pending', qosClass = qos_class(p) })
              task.spawn(run_pod, p)
              sb.metadata.annotations = sb.metadata.annotations or object()
              sb.metadata.annotations['agents.x-k8s.io/pod-name'] = p.metadata.name
              sb.status = sb.status or object()
              sb.status.selector = 'agents.x-k8s.io/sandbox-name-hash=' ..
                p.metadata.labels['agents.x-k8s.io/sandbox-name-hash']
              sb.status.service = sb.metadata.name
              sb.status.serviceFQDN = ('%s.%s.svc.cluster.local'):format(sb.metadata.name, ns)
              set_cond(sb, 'Ready', 'False', 'DependenciesNotReady', 'Pod is not ready')
              if sb._was_suspended then set_cond(sb, 'Suspended', 'False', 'NotSuspended') end
              put('sandboxes', sb)
            end
          elseif pod then
            local ready = pod.status.phase == 'Running'
            for _, c in ipairs(pod.status.conditions or {}) do
              if c.type == 'Ready' then ready = ready and c.status == 'True' end
            end
            local was
            for _, c in ipairs(sb.status and sb.status.conditions or {}) do
              if c.type == 'Ready' then was = c.status == 'True' end
            end
            if ready ~= was then
              set_cond(sb, 'Ready', ready and 'True' or 'False', ready and 'DependenciesReady' or 'DependenciesNotReady',
                ready and 'Pod is Ready' or 'Pod is not ready')
              sb.status.podIPs = pod.status.podIPs and array({ pod.status.podIP }) or nil
              sb.status.nodeName = pod.spec.nodeName
              put('sandboxes', sb)
            end
            if (pod.status.phase == 'Succeeded' or pod.status.phase == 'Failed') and not sb._finished then
              sb._finished = true
              set_cond(sb, 'Finished', 'True', pod.status.phase == 'Succeeded' and 'PodSucceeded' or 'PodFailed')
              put('sandboxes', sb)
            end
          end
        end
      end
    until not state.again
    state.reconciling = false
  end

  -- the controller looks again at every change and every 100 ms (shutdown times)
  local function kick()
    if state.kick_pending or state.closed then return end
    state.kick_pending = true
    task.spawn(function()
      task.sleep(5)
      state.kick_pending = false
      local ok, err = pcall(reconcile)
      if not ok then svc.failures[#svc.failures + 1] = err; state.reconciling = false end
    end)
  end
  local ticker
  ticker = function()
    if state.closed then return end
    local any = next(state.objects.sandboxes) or next(state.objects.sandboxclaims) or
      next(state.objects.sandboxwarmpools)
    if any then kick() end
    task.after(100, ticker, true)
  end
  task.after(100, ticker, true)
  local base_notify = notify
  notify = function(kind, plural, obj)
    base_notify(kind, plural, obj)
    if plural ~= 'sandboxtemplates' then kick() end
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Discovery
  -- -------------------------------------------------------

  local function resource_list(group_version, plurals)
    local res = array()
    local names = {}
    for _, p in ipairs(plurals) do names[#names + 1] = p end
    for _, p in ipairs(names) do
      local k = KINDS[p]
      res[#res + 1] = object({ name = p, singularName = k.kind:lower(), namespaced = true, kind = k.kind,
        verbs = array(k.verbs or CRUD), shortNames = array(k.short) })
      if p == 'pods' then
        for _, sub in ipairs({ 'attach', 'exec', 'portforward' }) do
          res[#res + 1] = object({ name = 'pods/' .. sub, singularName = '', namespaced = true, kind = 'PodAttachOptions',
            verbs = array({ 'create', 'get' }) })
        end
        res[#res + 1] = object({ name = 'pods/log', singularName = '', namespaced = true, kind = 'Pod',
          verbs = array({ 'get' }) })
        res[#res + 1] = object({ name = 'pods/status', singularName = '', namespaced = true, kind = 'Pod',
          verbs = array({ 'get', 'patch', 'update' }) })
      end
      if k.group == AS or k.group == AX then
        res[#res + 1] = object({ name = p .. '/status', singularName = '', namespaced = true, kind = k.kind,
          verbs = array({ 'get', 'patch', 'update' }) })
      end
    end
    if group_version == 'v1' then
      res[#res + 1] = object({ name = 'namespaces', singularName = 'namespace', namespaced = false, kind = 'Namespace',
        verbs = array({ 'get', 'list' }), shortNames = array({ 'ns' }) })
    end
    return object({ kind = 'APIResourceList', apiVersion = 'v1', groupVersion = group_version, resources = res })
  end

  local GROUPS = {
    ['networking.k8s.io'] = { versions = { 'v1' }, plurals = { 'networkpolicies' } },
    [AS] = { versions = CR_VERSIONS, plurals = { 'sandboxes' } },
    [AX] = { versions = CR_VERSIONS, plurals = { 'sandboxtemplates', 'sandboxclaims', 'sandboxwarmpools' } },
  }
  local GROUP_ORDER = { 'networking.k8s.io', AS, AX }

  local function group_doc(name)
    local g = GROUPS[name]
    local versions = array()
    for _, v in ipairs(g.versions) do versions[#versions + 1] = object({ groupVersion = name .. '/' .. v, version = v }) end
    return object({ name = name, versions = versions, preferredVersion = versions[1] })
  end

  -- `verb` (a function of the request, or a word) and `resource` (`plural[/sub]`) for
  -- state.forbidden: RBAC's refusal, 403, as a scripted fault ({ ['create pods'] = true, ... }).
  local function route(method, pattern, fn, verb, resource)
    svc:route(method, pattern, function(req)
      local no = refuse(req)
      if no then return no end
      if resource then
        local v = type(verb) == 'function' and verb(req) or verb
        if state.forbidden[v .. ' ' .. resource] then
          local plural, sub = resource:match('^([^/]+)/?(.*)$')
          local group = KINDS[plural] and KINDS[plural].group or ''
          local user = req.headers.authorization and ('system:serviceaccount:%s:mayura'):format(opts.namespace or
            'default') or tostring(state.client_user)
          local where = req.params.ns and (' in the namespace "' .. req.params.ns .. '"') or ' at the cluster scope'
          return fail(403, 'Forbidden', ('%s%s is forbidden: User "%s" cannot %s resource "%s" in API group "%s"%s')
            :format(plural, req.params.name and (' "' .. req.params.name .. '"') or '', user, v, resource, group, where),
            object({ name = req.params.name, group = group, kind = plural .. (sub ~= '' and ('/' .. sub) or '') }))
        end
      end
      return fn(req)
    end)
  end

  route('GET', '/version', function()
    return { json = object({ major = '1', minor = '32', gitVersion = 'v1.32.0-stand-in', gitCommit = 'stand-in',
      gitTreeState = 'clean', buildDate = '2026-01-01T00:00:00Z', goVersion = 'go1.23', compiler = 'gc',
      platform = 'linux/amd64' }) }
  end)
  route('GET', '/api', function()
    return { json = object({ kind = 'APIVersions', versions = array({ 'v1' }), serverAddressByClientCIDRs =
      array({ object({ clientCIDR = '0.0.0.0/0', serverAddress = '127.0.0.1:443' }) }) }) }
  end)
  route('GET', '/api/v1', function() return { json = resource_list('v1', { 'pods' }) } end)
  route('GET', '/apis', function()
    local groups = array()
    for _, name in ipairs(GROUP_ORDER) do groups[#groups + 1] = group_doc(name) end
    return { json = object({ kind = 'APIGroupList', apiVersion = 'v1', groups = groups }) }
  end)
  route('GET', '/apis/{group}', function(req)
    if not GROUPS[req.params.group] then return fail(404, 'NotFound', 'the server could not find the requested resource') end
    local doc = group_doc(req.params.group)
    doc.kind, doc.apiVersion = 'APIGroup', 'v1'
    return { json = doc }
  end)
  route('GET', '/apis/{group}/{version}', function(req)
    local g = GROUPS[req.params.group]
    local ok = false
    for _, v in ipairs(g and g.versions or {}) do if v == req.params.version then ok = true end end
    if not ok then return fail(404, 'NotFound', 'the server could not find the requested resource') end
    return { json = resource_list(req.params.group .. '/' .. req.params.version, g.plurals) }
  end)
  -- OpenAPI v3: the index and, per group version, its paths with the operations' GVK and their
  -- fieldValidation parameter (what kubectl looks for before it validates on the server); no
  -- schemas. OpenAPI v2 is not served.
  local function gv_paths()
    local out = { { 'api/v1', '/api/v1', '', 'v1', { 'pods' } },
      { 'apis/networking.k8s.io/v1', '/apis/networking.k8s.io/v1', 'networking.k8s.io', 'v1', { 'networkpolicies' } } }
    for _, v in ipairs(CR_VERSIONS) do
      out[#out + 1] = { 'apis/' .. AS .. '/' .. v, '/apis/' .. AS .. '/' .. v, AS, v, { 'sandboxes' } }
      out[#out + 1] = { 'apis/' .. AX .. '/' .. v, '/apis/' .. AX .. '/' .. v, AX, v,
        { 'sandboxtemplates', 'sandboxclaims', 'sandboxwarmpools' } }
    end
    return out
  end
  route('GET', '/openapi/v3', function()
    local paths = object()
    for _, gv in ipairs(gv_paths()) do
      paths[gv[1]] = object({ serverRelativeURL = '/openapi/v3/' .. gv[1] .. '?hash=stand-in' })
    end
    return { json = object({ paths = paths }) }
  end)
  local function openapi_doc(gv)
    local paths = object()
    local param = object({ name = 'fieldValidation', ['in'] = 'query', schema = object({ type = 'string' }),
      description = 'Strict, Warn or Ignore' })
    for _, plural in ipairs(gv[5]) do
      local gvk = object({ group = gv[3], version = gv[4], kind = KINDS[plural].kind })
      local function op(id) return object({ operationId = id, parameters = array({ param }),
        ['x-kubernetes-group-version-kind'] = gvk, responses = object() }) end
      paths[gv[2] .. '/namespaces/{namespace}/' .. plural] = object({ post = op('create' .. KINDS[plural].kind) })
      paths[gv[2] .. '/namespaces/{namespace}/' .. plural .. '/{name}'] = object({
        put = op('replace' .. KINDS[plural].kind), patch = op('patch' .. KINDS[plural].kind) })
    end
    return object({ openapi = '3.0.0', info = object({ title = 'Kubernetes', version = 'v1.32.0' }), paths = paths,
      components = object({ schemas = object() }) })
  end
  for _, gv in ipairs(gv_paths()) do
    route('GET', '/openapi/v3/' .. gv[1], function() return { json = openapi_doc(gv) } end)
  end
  route('GET', '/openapi/v2', function()
    return fail(404, 'NotFound', 'the server could not find the requested resource')
  end)

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Namespaces
  -- -------------------------------------------------------

  local function namespace_json(name)
    return object({ metadata = object({ name = name, uid = 'ns-' .. name, resourceVersion = '1',
      creationTimestamp = timestamp(ns_created), labels = object({ ['kubernetes.io/metadata.name'] = name }) }),
      spec = object({ finalizers = array({ 'kubernetes' }) }), status = object({ phase = 'Active' }) })
  end
  route('GET', '/api/v1/namespaces', function()
    local items = array()
    local names = {}
    for n in pairs(state.namespaces) do names[#names + 1] = n end
    table.sort(names)
    for _, n in ipairs(names) do items[#items + 1] = namespace_json(n) end
    return { json = object({ kind = 'NamespaceList', apiVersion = 'v1', metadata = object({
      resourceVersion = tostring(state.rv) }), items = items }) }
  end)
  route('GET', '/api/v1/namespaces/{ns}', function(req)
    if not state.namespaces[req.params.ns] then
      return fail(404, 'NotFound', ('namespaces "%s" not found'):format(req.params.ns),
        object({ name = req.params.ns, kind = 'namespaces' }))
    end
    local doc = namespace_json(req.params.ns)
    doc.kind, doc.apiVersion = 'Namespace', 'v1'
    return { json = doc }
  end)
  route('POST', '/api/v1/namespaces', function()
    return fail(403, 'Forbidden', 'namespaces is forbidden: the stand-in\'s namespaces are fixed')
  end)

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Generic resource handlers
  -- -------------------------------------------------------

  local function list_items(plural, ns, req)
    local sel, err = parse_selector(req.query.labelSelector)
    if not sel then return nil, fail(400, 'BadRequest', err) end
    local fields, ferr = parse_fields(req.query.fieldSelector)
    if not fields then return nil, fail(400, 'BadRequest', ferr) end
    local out = {}
    local function take(b)
      for _, obj in pairs(b) do
        if selector_matches(sel, obj.metadata.labels) and fields_match(fields, obj) then out[#out + 1] = obj end
      end
    end
    if ns then take(state.objects[plural][ns] or {}) else
      for _, b in pairs(state.objects[plural]) do take(b) end
    end
    table.sort(out, function(a, b)
      if a.metadata.namespace ~= b.metadata.namespace then return a.metadata.namespace < b.metadata.namespace end
      return a.metadata.name < b.metadata.name
    end)
    return out, nil, sel, fields
  end

  local function watch(plural, ns, req, version)
    local items, err, sel, fields = list_items(plural, ns, req)
    if not items then return err end
    local since = tonumber(req.query.resourceVersion or '')
    local timeout = tonumber(req.query.timeoutSeconds or '') or 1800
    local expired = false
    if since and since > 0 and state.history[1] and since < state.history[1].rv - 1 then expired = true end
    return { headers = { ['Content-Type'] = 'application/json', ['Cache-Control'] = 'no-cache, private' },
      stream = function(send)
        local queue, wake = {}, nil
        local function line(kind, obj)
          return json.encode(object({ type = kind, object = obj })) .. '\n'
        end
        if expired then
          send(line('ERROR', M.status_object(410, 'Expired', ('too old resource version: %d (%d)'):format(since,
            state.history[1].rv))))
          return
        end
        local function matches(obj)
          return (ns == nil or obj.metadata.namespace == ns) and selector_matches(sel, obj.metadata.labels)
            and fields_match(fields, obj)
        end
        local w = { plural = plural, push = function(ev)
          queue[#queue + 1] = ev
          if wake then local f = wake; wake = nil; f() end
        end }
        state.watchers[w] = true
        if since and since > 0 then
          for _, ev in ipairs(state.history) do
            if ev.rv > since then queue[#queue + 1] = ev end
          end
        else
          for _, obj in ipairs(items) do
            if not send(line('ADDED', typed(plural, obj, version))) then state.watchers[w] = nil; return end
          end
        end
        local deadline = core.hrtime_ms() + timeout * 1000
        local ok, werr = pcall(function()
          while not state.closed and core.hrtime_ms() < deadline do
            while #queue > 0 do
              local ev = table.remove(queue, 1)
              -- a change that moves an object out of the selection is a DELETED to this watcher
              if matches(ev.object) then
                if not send(line(ev.type, typed(plural, ev.object, version))) then return end
              end
            end
            local left = deadline - core.hrtime_ms()
            if left <= 0 then break end
            task.await(function(done)
              wake = done
              task.after(math.max(1, math.floor(math.min(left, 1000))), function() if wake == done then wake = nil; done() end end, true)
            end)
            if req.signal.cancelled then return end
            if not send('') then return end
          end
        end)
        state.watchers[w] = nil
        if not ok then error(werr, 0) end
      end }
  end

  local function age(ts)
    local t = state.parse_time(ts)
    if not t then return '<unknown>' end
    local s = math.max(0, math.floor((core.now_ms() - t) / 1000))
    if s < 120 then return s .. 's' end
    local m = math.floor(s / 60)
    if m < 10 then return ('%dm%ds'):format(m, s % 60) end
    if m < 180 then return m .. 'm' end
    local h = math.floor(m / 60)
    if h < 48 then return ('%dh%dm'):format(h, m % 60) end
    return math.floor(h / 24) .. 'd'
  end

  local function pod_cells(pod)
    local ready, total, restarts, reason = 0, 0, 0, pod.status.reason or pod.status.phase
    for _, st in ipairs(pod.status.containerStatuses or {}) do
      total = total + 1
      if st.ready then ready = ready + 1 end
      restarts = restarts + (st.restartCount or 0)
      if st.state.waiting and st.state.waiting.reason then reason = st.state.waiting.reason end
      if st.state.terminated and st.state.terminated.reason and pod.status.phase ~= 'Running' then
        reason = st.state.terminated.reason
      end
    end
    if total == 0 then total = #pod.spec.containers end
    if pod.metadata.deletionTimestamp then reason = 'Terminating' end
    return { pod.metadata.name, ('%d/%d'):format(ready, total), reason, restarts, age(pod.metadata.creationTimestamp),
      pod.status.podIP or '<none>', pod.spec.nodeName or '<none>', '<none>', '<none>' }
  end

  -- A Table (meta.k8s.io/v1), as kubectl asks for with its Accept header.
  local function table_of(plural, items)
    local cols = { { 'Name', 'string', 'name', 0 } }
    if plural == 'pods' then
      cols = { { 'Name', 'string', 'name', 0 }, { 'Ready', 'string', '', 0 }, { 'Status', 'string', '', 0 },
        { 'Restarts', 'string', '', 0 }, { 'Age', 'string', '', 0 }, { 'IP', 'string', '', 1 },
        { 'Node', 'string', '', 1 }, { 'Nominated Node', 'string', '', 1 }, { 'Readiness Gates', 'string', '', 1 } }
    elseif plural == 'networkpolicies' then
      cols[#cols + 1] = { 'Pod-Selector', 'string', '', 0 }
      cols[#cols + 1] = { 'Age', 'date', '', 0 }
    elseif plural == 'sandboxes' or plural == 'sandboxclaims' then
      cols[#cols + 1] = { 'Ready', 'string', '', 0 }
      cols[#cols + 1] = { 'Age', 'date', '', 0 }
    else
      cols[#cols + 1] = { 'Age', 'date', '', 0 }
    end
    local defs = array()
    for _, c in ipairs(cols) do
      defs[#defs + 1] = object({ name = c[1], type = c[2], format = c[3], description = c[1], priority = c[4] })
    end
    local rows = array()
    for _, obj in ipairs(items) do
      local cells
      if plural == 'pods' then cells = pod_cells(obj)
      else
        cells = { obj.metadata.name }
        if plural == 'networkpolicies' then
          local sel = {}
          for k, v in pairs(obj.spec.podSelector and obj.spec.podSelector.matchLabels or {}) do sel[#sel + 1] = k .. '=' .. v end
          table.sort(sel)
          cells[#cells + 1] = #sel > 0 and table.concat(sel, ',') or '<none>'
        elseif plural == 'sandboxes' or plural == 'sandboxclaims' then
          local r = 'Unknown'
          for _, c in ipairs(obj.status and obj.status.conditions or {}) do if c.type == 'Ready' then r = c.status end end
          cells[#cells + 1] = r
        end
        cells[#cells + 1] = age(obj.metadata.creationTimestamp)
      end
      local meta = copy(obj.metadata)
      rows[#rows + 1] = object({ cells = array(cells), object = object({ kind = 'PartialObjectMetadata',
        apiVersion = 'meta.k8s.io/v1', metadata = meta }) })
    end
    return object({ kind = 'Table', apiVersion = 'meta.k8s.io/v1', metadata = object({
      resourceVersion = tostring(state.rv) }), columnDefinitions = defs, rows = rows })
  end
  local function wants_table(req)
    return (req.headers.accept or ''):find('as=Table', 1, true) ~= nil
  end
  state.wants_table, state.table_of = wants_table, table_of

  local function list_answer(plural, ns, req, version)
    if req.query.watch == 'true' or req.query.watch == '1' then return watch(plural, ns, req, version) end
    local items, err = list_items(plural, ns, req)
    if not items then return err end
    if wants_table(req) then return { json = table_of(plural, items) } end
    local out = array()
    local core_type = KINDS[plural].group == ''
    for _, obj in ipairs(items) do
      local o = core_type and copy(obj) or typed(plural, obj, version)
      if core_type then o.kind, o.apiVersion = nil, nil end
      out[#out + 1] = o
    end
    return { json = object({ kind = KINDS[plural].kind .. 'List', apiVersion = api_version(plural, version),
      metadata = object({ resourceVersion = tostring(state.rv) }), items = out }) }
  end

  local function check_ns(ns)
    if not state.namespaces[ns] then
      return fail(404, 'NotFound', ('namespaces "%s" not found'):format(ns), object({ name = ns, kind = 'namespaces' }))
    end
    return nil
  end

  local function admit(plural, obj, ns)
    if plural == 'pods' then return admit_pod(obj, ns) end
    if plural == 'networkpolicies' then return admit_netpol(obj, ns) end
    return admit_cr(plural, obj, ns)
  end

  local function create(plural, req, ns, version)
    local e = check_ns(ns)
    if e then return e end
    local body, berr = body_of(req)
    if not body then return berr end
    local want_kind = KINDS[plural].kind
    if body.kind ~= nil and body.kind ~= want_kind then
      return fail(400, 'BadRequest', ('the kind of the object (%s) does not match the resource (%s)')
        :format(tostring(body.kind), want_kind))
    end
    local obj = copy(body)
    -- field validation: Strict refuses a field a Pod does not have, Warn (the default) and Ignore drop it
    local warnings
    if plural == 'pods' then
      local unknown = unknown_fields(obj)
      if #unknown > 0 then
        local mode = req.query.fieldValidation or 'Warn'
        if mode == 'Strict' then
          local quoted = {}
          for i, u in ipairs(unknown) do quoted[i] = ('unknown field "%s"'):format(u) end
          return fail(400, 'BadRequest', ('Pod in version "v1" cannot be handled as a Pod: strict decoding error: %s')
            :format(table.concat(quoted, ', ')))
        elseif mode == 'Warn' then
          local w = {}
          for i, u in ipairs(unknown) do w[i] = ('299 - "unknown field \\"%s\\""'):format(u) end
          warnings = table.concat(w, ', ')
        end
      end
    end
    obj.kind, obj.apiVersion = nil, nil
    e = admit(plural, obj, ns)
    if e then return e end
    if get(plural, ns, obj.metadata.name) then
      local k = KINDS[plural]
      local what = k.group == '' and plural or (plural .. '.' .. k.group)
      return fail(409, 'AlreadyExists', ('%s "%s" already exists'):format(what, obj.metadata.name),
        object({ name = obj.metadata.name, group = k.group ~= '' and k.group or nil, kind = plural }))
    end
    if req.query.dryRun == 'All' then return { status = 201, json = typed(plural, obj, version) } end
    obj.metadata.resourceVersion = nil
    obj.metadata.uid = uuid()
    obj.metadata.creationTimestamp = timestamp()
    obj.metadata.generation = 1
    obj.metadata.managedFields = nil
    if plural == 'pods' then
      local qos = qos_class(obj)
      obj.status = object({ phase = 'Pending', qosClass = qos })
    elseif plural ~= 'networkpolicies' then
      obj.status = nil
    end
    put(plural, obj, 'ADDED')
    if plural == 'pods' then task.spawn(run_pod, obj) end
    return { status = 201, json = typed(plural, obj, version), headers = warnings and { Warning = warnings } }
  end

  local function read(plural, req, ns, version)
    local obj = get(plural, ns, req.params.name)
    if not obj then return not_found(plural, req.params.name) end
    if wants_table(req) then return { json = table_of(plural, { obj }) } end
    return { json = typed(plural, obj, version) }
  end

  local function delete(plural, req, ns, version)
    local obj = get(plural, ns, req.params.name)
    if not obj then return not_found(plural, req.params.name) end
    local grace = tonumber(req.query.gracePeriodSeconds or '')
    local body = type(req.json) == 'table' and req.json or {}
    if grace == nil and is_int(body.gracePeriodSeconds) then grace = body.gracePeriodSeconds end
    local pre = body.preconditions
    if type(pre) == 'table' and pre.uid and pre.uid ~= obj.metadata.uid then
      return fail(409, 'Conflict', ('Precondition failed: UID in precondition: %s, UID in object meta: %s')
        :format(pre.uid, obj.metadata.uid))
    end
    if plural == 'pods' then
      delete_pod(obj, grace)
      return { json = typed(plural, obj, version) }
    end
    finish_delete(plural, obj)
    -- a Sandbox takes its pod; a claim its sandbox; a warm pool its sandboxes (owner references)
    if plural == 'sandboxes' then
      delete_sandbox(obj)
    elseif plural == 'sandboxclaims' then
      local name = obj.status and obj.status.sandbox and obj.status.sandbox.name
      local sb = name and get('sandboxes', ns, name)
      if sb then delete_sandbox(sb) end
    elseif plural == 'sandboxwarmpools' then
      for _, sb in pairs(state.objects.sandboxes[ns] or {}) do
        if (sb.metadata.labels or {})['agents.x-k8s.io/warm-pool-sandbox'] == obj.metadata.name then
          delete_sandbox(sb)
        end
      end
    end
    return { json = M.status_object(200, nil, nil, object({ name = obj.metadata.name, group = KINDS[plural].group,
      kind = plural, uid = obj.metadata.uid })) }
  end

  local function delete_collection(plural, req, ns, version)
    local items, err = list_items(plural, ns, req)
    if not items then return err end
    local out = array()
    for _, obj in ipairs(items) do
      req.params.name = obj.metadata.name
      delete(plural, req, ns, version)
      local o = copy(obj)
      out[#out + 1] = o
    end
    return { json = object({ kind = KINDS[plural].kind .. 'List', apiVersion = api_version(plural, version),
      metadata = object({ resourceVersion = tostring(state.rv) }), items = out }) }
  end

  local function replace(plural, req, ns, version, patch)
    local obj = get(plural, ns, req.params.name)
    if not obj then return not_found(plural, req.params.name) end
    local body, berr = body_of(req)
    if not body then return berr end
    local new
    if patch then
      new = merge_patch(copy(obj), body)
    else
      new = copy(body)
      local rv = new.metadata and new.metadata.resourceVersion
      if rv ~= nil and rv ~= obj.metadata.resourceVersion then
        return fail(409, 'Conflict', ('Operation cannot be fulfilled on %s "%s": the object has been modified; ' ..
          'please apply your changes to the latest version and try again'):format(plural, obj.metadata.name))
      end
    end
    new.kind, new.apiVersion = nil, nil
    if type(new.metadata) ~= 'table' or new.metadata.name ~= obj.metadata.name then
      return fail(400, 'BadRequest', 'the name of the object does not match the name on the URL')
    end
    local e = admit(plural, new, ns)
    if e then return e end
    if plural == 'pods' then
      -- a pod's spec is fixed but for a few fields
      local a, b = json.encode(obj.spec), json.encode(new.spec)
      if a ~= b then
        return invalid('Pod', obj.metadata.name, { { field = 'spec', reason = 'FieldValueForbidden',
          message = 'Forbidden: pod updates may not change fields other than `spec.containers[*].image`, ' ..
          '`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to ' ..
          'existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was ' ..
          'previously negative)' } })
      end
    end
    -- the object keeps what the server owns
    for _, k in ipairs({ 'uid', 'creationTimestamp', 'deletionTimestamp', 'namespace' }) do
      new.metadata[k] = obj.metadata[k]
    end
    if plural == 'pods' or KINDS[plural].group ~= 'networking.k8s.io' then new.status = obj.status end
    if json.encode(new.spec) ~= json.encode(obj.spec) then
      new.metadata.generation = (obj.metadata.generation or 1) + 1
    else
      new.metadata.generation = obj.metadata.generation
    end
    -- the same table stays the stored one (the kubelet's and controller's work holds it)
    for k in pairs(obj) do obj[k] = nil end
    for k, v in pairs(new) do obj[k] = v end
    put(plural, obj)
    return { json = typed(plural, obj, version) }
  end

  local function resource_routes(prefix, plural, version)
    local coll, one = prefix .. '/namespaces/{ns}/' .. plural, prefix .. '/namespaces/{ns}/' .. plural .. '/{name}'
    local function list_verb(req) return (req.query.watch == 'true' or req.query.watch == '1') and 'watch' or 'list' end
    route('GET', coll, function(req)
      local e = check_ns(req.params.ns)
      if e then return e end
      return list_answer(plural, req.params.ns, req, version)
    end, list_verb, plural)
    route('GET', prefix .. '/' .. plural, function(req) return list_answer(plural, nil, req, version) end,
      list_verb, plural)
    route('POST', coll, function(req) return create(plural, req, req.params.ns, version) end, 'create', plural)
    route('DELETE', coll, function(req) return delete_collection(plural, req, req.params.ns, version) end,
      'deletecollection', plural)
    route('GET', one, function(req) return read(plural, req, req.params.ns, version) end, 'get', plural)
    route('GET', one .. '/status', function(req) return read(plural, req, req.params.ns, version) end, 'get',
      plural .. '/status')
    route('DELETE', one, function(req) return delete(plural, req, req.params.ns, version) end, 'delete', plural)
    route('PUT', one, function(req) return replace(plural, req, req.params.ns, version, false) end, 'update', plural)
    route('PATCH', one, function(req) return replace(plural, req, req.params.ns, version, true) end, 'patch', plural)
  end

  resource_routes('/api/v1', 'pods', 'v1')
  resource_routes('/apis/networking.k8s.io/v1', 'networkpolicies', 'v1')
  for _, v in ipairs(CR_VERSIONS) do
    resource_routes('/apis/' .. AS .. '/' .. v, 'sandboxes', v)
    for _, p in ipairs({ 'sandboxtemplates', 'sandboxclaims', 'sandboxwarmpools' }) do
      resource_routes('/apis/' .. AX .. '/' .. v, p, v)
    end
  end

  route('GET', '/api/v1/namespaces/{ns}/pods/{name}/log', function(req)
    local pod = get('pods', req.params.ns, req.params.name)
    if not pod then return not_found('pods', req.params.name) end
    if not state.containers[pod.metadata.uid] then
      return fail(400, 'BadRequest', ('container "%s" in pod "%s" is waiting to start: ContainerCreating')
        :format(pod.spec.containers[main_index(pod)].name, pod.metadata.name))
    end
    return { headers = { ['Content-Type'] = 'text/plain' }, body = table.concat(state.logs[pod.metadata.uid] or {}) }
  end)

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- Attach, exec, portforward (WebSocket, through the front)
  -- -------------------------------------------------------

  local function u32(n)
    return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  end

  -- A bridged WebSocket over the raw connection: send(bytes) a message; on_message(bytes); on_close().
  local function bridge(client, protocol, on_message, on_close)
    local b = { open = true }
    client:write('HTTP/1.1 101 Switching Protocols\r\nX-Kube-Protocol: ' .. protocol .. '\r\n\r\n')
    -- chunks are joined once per message (its head, then its whole), not once per chunk
    local parts, have, need = {}, 0, nil
    client:read_start(function(err, data)
      if err or not data then
        if b.open then
          b.open = false
          on_close()
        end
        svc:release(client)
        return
      end
      parts[#parts + 1] = data
      have = have + #data
      while true do
        if not need then
          if have < 4 then break end
          local buf = table.concat(parts)
          parts = { buf }
          need = 4 + ((buf:byte(1) * 256 + buf:byte(2)) * 256 + buf:byte(3)) * 256 + buf:byte(4)
        end
        if have < need then break end
        local buf = table.concat(parts)
        local msg, rest = buf:sub(5, need), buf:sub(need + 1)
        parts, have, need = { rest }, #rest, nil
        on_message(msg)
      end
    end)
    function b.send(bytes)
      if not b.open or client:is_closing() then return false end
      client:write(u32(#bytes) .. bytes)
      return true
    end
    function b.close()
      if b.open then b.open = false end
      if not client:is_closing() then
        client:shutdown(function() svc:release(client) end)
      end
    end
    return b
  end

  local STREAM_PROTOCOLS = { 'v5.channel.k8s.io', 'v4.channel.k8s.io', 'v3.channel.k8s.io', 'v2.channel.k8s.io',
    'channel.k8s.io' }
  local PF_PROTOCOLS = { 'v4.channel.k8s.io' }

  local function pick(req, supported)
    local offered = {}
    for p in (req.headers['x-kube-upgrade'] or ''):gmatch('[^,%s]+') do offered[p] = true end
    for _, p in ipairs(supported) do if offered[p] then return p end end
    return nil
  end

  local function exit_status(res)
    local code = res and res.exit_code
    if code == 0 then return object({ metadata = object(), status = 'Success' }) end
    code = code or (128 + (tonumber(res and res.signal) or 9))
    return object({ metadata = object(), status = 'Failure',
      message = ('command terminated with non-zero exit code: error executing command, exit code %d'):format(code),
      reason = 'NonZeroExitCode', details = object({ causes = array({ object({ reason = 'ExitCode',
        message = tostring(code) }) }) }) })
  end

  -- Checks an upgrade request: the pod, its container, running; returns pod, container index, protocol.
  local function upgrade_target(req, supported)
    if not req.headers['x-kube-upgrade'] then
      return nil, fail(400, 'BadRequest', 'Upgrade request required')
    end
    local pod = get('pods', req.params.ns, req.params.name)
    if not pod then return nil, not_found('pods', req.params.name) end
    local want = req.query.container
    local idx
    if want == nil or want == '' then idx = main_index(pod) else
      for i, c in ipairs(pod.spec.containers) do if c.name == want then idx = i end end
      if not idx then
        return nil, fail(400, 'BadRequest', ('container %s is not valid for pod %s'):format(want, pod.metadata.name))
      end
    end
    if pod.status.phase == 'Succeeded' or pod.status.phase == 'Failed' then
      return nil, fail(400, 'BadRequest', ('cannot exec into or attach to a container in a completed pod; current ' ..
        'phase is %s'):format(pod.status.phase))
    end
    local ct = state.containers[pod.metadata.uid]
    if pod.status.phase ~= 'Running' or not ct or not ct.running or idx ~= main_index(pod) then
      return nil, fail(400, 'BadRequest', ('pod %s does not have a running container %s (phase %s)')
        :format(pod.metadata.name, pod.spec.containers[idx].name, pod.status.phase))
    end
    if req.query.tty == 'true' or req.query.tty == '1' then
      return nil, fail(400, 'BadRequest', 'the stand-in has no terminals (tty)')
    end
    local proto = pick(req, supported)
    if not proto then
      return nil, fail(400, 'BadRequest', 'unable to upgrade connection: none of the requested subprotocols is ' ..
        'supported')
    end
    return pod, ct, proto
  end

  local function flag(req, name, default)
    local v = req.query[name]
    if v == nil then return default end
    return v == 'true' or v == '1'
  end

  local function stream_session(req, kind)
    local pod, ct, proto = upgrade_target(req, STREAM_PROTOCOLS)
    if not pod then return ct end
    local argv
    if kind == 'exec' then
      argv = query_all(req, 'command')
      if #argv == 0 then return fail(400, 'BadRequest', 'you must specify at least 1 command') end
    end
    local want_in, want_out, want_err = flag(req, 'stdin', false), flag(req, 'stdout', true), flag(req, 'stderr', true)
    local structured = proto == 'v4.channel.k8s.io' or proto == 'v5.channel.k8s.io'
    return { raw = function(client)
      local b
      local proc
      local finished = false
      local function finish(res)
        if finished then return end
        finished = true
        if structured then b.send('\3' .. json.encode(exit_status(res)))
        elseif res and res.exit_code ~= 0 then b.send('\3command terminated with non-zero exit code') end
        b.close()
      end
      local function output(stream, bytes)
        if (stream == 1 and want_out) or (stream == 2 and want_err) then b.send(string.char(stream) .. bytes) end
      end
      local attachment
      local function closed()
        if kind == 'exec' then
          if proc then proc.close() end
        else
          state.attached[pod.metadata.uid][attachment] = nil
          local c = pod.spec.containers[main_index(pod)]
          if want_in and c.stdinOnce then ct:close_stdin() end
        end
      end
      local function message(msg)
        local ch = msg:byte(1)
        local data = msg:sub(2)
        if ch == 0 and want_in then
          if kind == 'exec' then proc.write(data) else ct:write(data) end
        elseif ch == 255 and proto == 'v5.channel.k8s.io' and data:byte(1) == 0 and want_in then
          if kind == 'exec' then proc.close_stdin() else
            local c = pod.spec.containers[main_index(pod)]
            if c.stdinOnce then ct:close_stdin() end
          end
        end
      end
      b = bridge(client, proto, function(msg) pcall(message, msg) end, closed)
      if kind == 'exec' then
        local ok, p = pcall(ct.exec, ct, argv, { stdin = want_in, on_output = output, on_exit = finish })
        if not ok then
          if structured then
            b.send('\3' .. json.encode(M.status_object(500, 'InternalError', 'the container is not running')))
          end
          b.close()
          return
        end
        proc = p
      else
        -- cut: the server drops the stream (a restart, a proxy's idle timeout) with no status
        attachment = { output = output, ended = finish, cut = b.close }
        state.attached[pod.metadata.uid] = state.attached[pod.metadata.uid] or {}
        state.attached[pod.metadata.uid][attachment] = true
      end
    end }
  end

  for _, m in ipairs({ 'GET', 'POST' }) do
    -- RBAC: a WebSocket's GET needs `create` as the POST does (the API server's check since 1.30)
    route(m, '/api/v1/namespaces/{ns}/pods/{name}/attach', function(req) return stream_session(req, 'attach') end,
      'create', 'pods/attach')
    route(m, '/api/v1/namespaces/{ns}/pods/{name}/exec', function(req) return stream_session(req, 'exec') end,
      'create', 'pods/exec')
    route(m, '/api/v1/namespaces/{ns}/pods/{name}/portforward', function(req)
      local pod, ct, proto = upgrade_target(req, PF_PROTOCOLS)
      if not pod then return ct end
      local ports = {}
      for _, v in ipairs(query_all(req, 'ports')) do
        for p in v:gmatch('[^,]+') do
          local n = tonumber(p)
          if not n or not is_int(n) or n < 1 or n > 65535 then
            return fail(400, 'BadRequest', ('invalid port: %q'):format(p))
          end
          ports[#ports + 1] = n
        end
      end
      if #ports == 0 then return fail(400, 'BadRequest', 'query parameter "port" is required') end
      return { raw = function(client)
        local conns = {}
        local b
        local function le(n) return string.char(n % 256, math.floor(n / 256) % 256) end
        local function closed()
          for _, c in pairs(conns) do c.close() end
        end
        b = bridge(client, proto, function(msg)
          local ch = msg:byte(1)
          local data = msg:sub(2)
          local i = math.floor(ch / 2) + 1
          if ch % 2 == 1 or not ports[i] then return end
          if #data > 0 and conns[i] then conns[i].write(data) end
        end, closed)
        for i, port in ipairs(ports) do
          local dch, ech = 2 * (i - 1), 2 * (i - 1) + 1
          b.send(string.char(dch) .. le(port))
          b.send(string.char(ech) .. le(port))
          local ok, c = pcall(ct.connect, ct, port, {
            on_data = function(bytes) b.send(string.char(dch) .. bytes) end,
            on_end = function(code)
              if code ~= 0 then
                b.send(string.char(ech) .. ('an error occurred forwarding %d -> %d: connection refused'):format(port, port))
              end
              b.close()
            end,
          })
          if ok then conns[i] = c else
            b.send(string.char(ech) .. 'the container is not running')
            b.close()
          end
        end
      end }
    end, 'create', 'pods/portforward')
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------
  -- The front: TLS and WebSockets
  -- -------------------------------------------------------

  local process = require('mayura.process')
  local dir = process.run({ 'mktemp', '-d' }).stdout:match('^%s*(.-)%s*$')
  state.dir = dir
  local function run(argv)
    local r = process.run(argv, { timeout_ms = 30000 })
    assert(r.exit_code == 0, 'kube_service: ' .. argv[1] .. ' failed: ' .. tostring(r.stderr))
  end
  local function front_script()
    local src = debug.getinfo(1, 'S').source:sub(2)
    local root = src:match('^(.*)/spec/support/kube_service%.lua$') or '.'
    return root .. '/spec/npm/kube_front.mjs'
  end
  if opts.tls ~= false then
    run({ 'openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-days', '2', '-subj', '/CN=stand-in-ca', '-keyout', dir .. '/ca.key', '-out', dir .. '/ca.crt',
      '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign' })
    run({ 'openssl', 'req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-subj', '/CN=kube-apiserver', '-keyout', dir .. '/server.key', '-out', dir .. '/server.csr' })
    local ext = io.open(dir .. '/ext.cnf', 'w')
    ext:write('subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' ..
      'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n')
    ext:close()
    run({ 'openssl', 'x509', '-req', '-in', dir .. '/server.csr', '-CA', dir .. '/ca.crt', '-CAkey', dir .. '/ca.key',
      '-CAcreateserial', '-days', '2', '-extfile', dir .. '/ext.cnf', '-out', dir .. '/server.crt' })
    state.ca_file = dir .. '/ca.crt'
    -- a client certificate for `client_user` (O=system:masters), signed by the same CA
    state.client_user = opts.client_user or 'mayura'
    run({ 'openssl', 'req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-subj', '/O=system:masters/CN=' .. state.client_user, '-keyout', dir .. '/client.key',
      '-out', dir .. '/client.csr' })
    ext = io.open(dir .. '/client.cnf', 'w')
    ext:write('basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n')
    ext:close()
    run({ 'openssl', 'x509', '-req', '-in', dir .. '/client.csr', '-CA', dir .. '/ca.crt', '-CAkey', dir .. '/ca.key',
      '-CAcreateserial', '-days', '2', '-extfile', dir .. '/client.cnf', '-out', dir .. '/client.crt' })
    state.client_cert_file, state.client_key_file = dir .. '/client.crt', dir .. '/client.key'
  end
  state.front_secret = host.random_hex(16)
  do
    local port_file = dir .. '/port'
    local argv = { 'node', front_script(), svc:url(''), port_file }
    if opts.tls ~= false then
      argv[#argv + 1] = dir .. '/server.crt'
      argv[#argv + 1] = dir .. '/server.key'
      argv[#argv + 1] = dir .. '/ca.crt'
    end
    state.front = core.spawn({ argv = argv, env = { PATH = os.getenv('PATH'), KUBE_FRONT_SECRET = state.front_secret },
      max_output_bytes = 65536 },
      function(res) state.front_result = res end)
    local deadline = core.hrtime_ms() + 15000
    local port
    while not port do
      port = tonumber(host.read_plain(port_file) or '')
      if port then break end
      assert(core.hrtime_ms() < deadline and not state.front_result, 'kube_service: the front did not start: ' ..
        tostring(state.front_result and state.front_result.stderr))
      task.sleep(20)
    end
    state.server = (opts.tls == false and 'http' or 'https') .. '://127.0.0.1:' .. port
  end

  --- Ends every pod, the front, and removes the certificates.
  function state.close()
    if state.closed then return end
    state.closed = true
    for _, ct in pairs(state.containers) do ct:kill() end
    if state.front and not state.front_result then state.front:cancel() end
    os.execute('rm -rf ' .. "'" .. dir .. "'")
  end
  local svc_close = svc.close
  function svc.close(s)
    state.close()
    return svc_close(s)
  end

  -- }------------------------------------------------------

  return state
end

M.parse_selector, M.selector_matches = parse_selector, selector_matches

-- Kept for specs that script faults in the stand-in's own shape.
M.stand_in = stand_in

return M
