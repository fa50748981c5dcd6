--- Every sandbox provider that can run on this machine, for specs that try the same thing on each.
--
--   local providers = require('support.providers')
--   for _, p in ipairs(providers.list()) do
--     describe(p.name, function()
--       local pool = p.make_pool({ memory_mib = 128, max_sandboxes = 2 })
--       ...
--     end)
--   end
--
-- An entry is `{ name, kind, engine, make_provider(opts), make_pool(opts), leftovers(sb) }`:
--   * `name`: 'local', 'docker-cli', 'docker-api' or 'docker-runsc' (the Engine API with `runtime =
--     'runsc'`, gVisor, when the daemon lists that runtime: scripts/docker-setup.sh registers it; its
--     entry has `gvisor = true`: its processes run in gVisor's kernel, not as processes of this host);
--   * `make_pool(opts)` returns `pool, provider`: `opts` mixes the provider's options (memory_mib,
--     pids, tmp_mib, workspace_mib, cpus, image, ...) and the pool's (max_sandboxes,
--     max_lifetime_ms, network, exec_timeout_ms, call_timeout_ms, max_output_bytes, ...), with
--     small limits by default (memory 128 MiB, 64 processes, 16 MiB /tmp and workspace), so a
--     bomb ends quickly;
--   * `leftovers(sb)` lists, as strings, what of the sandbox `sb` still exists on the host:
--     processes, cgroups, containers, socket directories, (local, network 'all') the network
--     stack process and its API socket, and (Docker) overlay mounts that no container owns any
--     more. Empty once it is all gone. Call it with
--     the sandbox object (released or not): it reads the ids the backend recorded.
--
-- MAYURA_SPEC_PROVIDERS (names separated by commas, e.g. 'docker-runsc') keeps only those entries.
--
-- 'kubernetes' (mayura.sandbox.kubernetes against the API server stand-in, support/kube_service.lua,
-- one for the process, made at the first make_pool) is there only when MAYURA_SPEC_PROVIDERS names
-- it, and where the stand-in's pods can run (root, bubblewrap, nsenter, setpriv, mayura-launch): the
-- stand-in stores NetworkPolicies without enforcing them, so the network specs do not hold there.
-- Its `leftovers` are its Pod, its NetworkPolicy and its container still running; `remove_behind(sb)`
-- deletes its Pod through the API; `token` is the bearer token its providers use (which no sandbox
-- may see).
--
-- The local provider is there when bubblewrap and the agent are; the Docker ones when a daemon
-- answers `docker info` and the test image (scripts/docker-setup.sh) is on the machine.
local sandbox = require('mayura.sandbox')
local compat = require('support.compat')

local M = {}

M.BUSYBOX = 'mayura-test/busybox:1'

local POOL_KEYS = {
  max_sandboxes = true, max_lifetime_ms = true, network = true, exec_timeout_ms = true,
  max_exec_timeout_ms = true, max_output_bytes = true, max_file_bytes = true, call_timeout_ms = true,
  labels = true, on_event = true, max_snapshots = true, max_snapshot_bytes = true,
}

local DEFAULTS = {
  provider = { memory_mib = 128, pids = 64, tmp_mib = 16, workspace_mib = 16 },
  pool = { max_sandboxes = 4, max_lifetime_ms = 600000 },
}

--- Runs a host shell command; returns its stdout and whether it exited 0.
function M.host(cmd)
  return compat.shell(cmd .. ' 2>/dev/null')
end

local function read_file(path)
  local f = io.open(path, 'r')
  if not f then return nil end
  local s = f:read('a')
  f:close()
  return s
end

-- Splits `opts` into the provider's and the pool's, over the defaults.
local function split(opts)
  local prov, pool = {}, {}
  for k, v in pairs(DEFAULTS.provider) do prov[k] = v end
  for k, v in pairs(DEFAULTS.pool) do pool[k] = v end
  for k, v in pairs(opts or {}) do
    if POOL_KEYS[k] then pool[k] = v else prov[k] = v end
  end
  return prov, pool
end

-- {======================================================
-- What a sandbox leaves on the host
-- =======================================================

-- Host pids whose /proc/<pid>/cgroup mentions `needle` (live, not zombies).
local function pids_in_cgroup(needle)
  local found = {}
  local ls = io.popen('ls /proc')
  for name in ls:lines() do
    if name:match('^%d+$') then
      local cg = read_file('/proc/' .. name .. '/cgroup')
      local stat = read_file('/proc/' .. name .. '/stat') or ''
      if cg and cg:find(needle, 1, true) and stat:match('%) (%a)') ~= 'Z' then found[#found + 1] = name end
    end
  end
  ls:close()
  return found
end

local function local_leftovers(sb)
  local out = {}
  local id = sb.id
  for _, pid in ipairs(pids_in_cgroup('/mayura/' .. id)) do out[#out + 1] = 'process ' .. pid end
  local dirs = (sb._backend and sb._backend.cg_dirs) or {}
  for _, d in ipairs(dirs) do
    if read_file(d .. '/cgroup.procs') then out[#out + 1] = 'cgroup ' .. d end
  end
  local launcher = sb._backend and sb._backend.proc
  if launcher and not sb._backend.exited then out[#out + 1] = 'launcher still running' end
  -- with network 'all': its user-mode network stack (outside the cgroups), and the stack's API socket
  local net = sb._backend and sb._backend.net
  if net and net.pid then
    local stat = read_file('/proc/' .. net.pid .. '/stat') or ''
    local cmd = (read_file('/proc/' .. net.pid .. '/cmdline') or ''):gsub('%z', ' ')
    if stat ~= '' and stat:match('%) (%a)') ~= 'Z' and cmd:find('slirp4netns', 1, true) then
      out[#out + 1] = 'network stack ' .. net.pid
    end
  end
  if net and net.api and select(2, M.host('test -e ' .. net.api)) then out[#out + 1] = 'stack API socket ' .. net.api end
  return out
end

-- Overlay mounts of Docker on this host that belong to no container docker still knows.
local docker_root
local function orphan_docker_mounts()
  docker_root = docker_root or (M.host("docker info --format '{{.DockerRootDir}}'"):match('%S+') or '/var/lib/docker')
  local mounts = {}
  local f = io.open('/proc/self/mountinfo')
  for line in (f and f:read('a') or ''):gmatch('[^\n]+') do
    local point = line:match('^%S+ %S+ %S+ %S+ (%S+)')
    if point and point:sub(1, #docker_root) == docker_root and point:match('/merged$') then mounts[#mounts + 1] = point end
  end
  if f then f:close() end
  if #mounts == 0 then return {} end
  local known = {}
  local ids = M.host('docker ps -aq'):gsub('%s+', ' ')
  if ids:find('%x') then
    for dir in M.host("docker inspect --format '{{.GraphDriver.Data.MergedDir}}' " .. ids):gmatch('%S+') do
      known[dir] = true
    end
  end
  local out = {}
  for _, m in ipairs(mounts) do
    if not known[m] then out[#out + 1] = 'mount ' .. m end
  end
  return out
end

local function docker_leftovers(sb)
  local out = orphan_docker_mounts()
  local ids = M.host('docker ps -aq --no-trunc --filter label=mayura.sandbox=' .. sb.id)
  for cid in ids:gmatch('%x+') do out[#out + 1] = 'container ' .. cid end
  local b = sb._backend or {}
  if b.container then
    for _, pid in ipairs(pids_in_cgroup(b.container)) do out[#out + 1] = 'process ' .. pid end
  end
  if b.dir then
    local _, there = M.host('test -e ' .. b.dir)
    if there then out[#out + 1] = 'socket directory ' .. b.dir end
  end
  return out
end

--- The host directory of one cgroup controller ('pids', 'memory', 'cpu') of the sandbox `sb`, or nil
-- (no cgroups here: not root, say). With cgroup v2, the one directory of the sandbox.
function M.cgroup_dir(sb, controller)
  local b = sb._backend or {}
  local candidates = {}
  if b.container then
    candidates = {
      '/sys/fs/cgroup/' .. controller .. '/docker/' .. b.container,
      '/sys/fs/cgroup/system.slice/docker-' .. b.container .. '.scope',
      '/sys/fs/cgroup/docker/' .. b.container,
    }
  else
    for _, d in ipairs(b.cg_dirs or {}) do
      if d:find('/' .. controller .. '/', 1, true) or not d:find('/sys/fs/cgroup/[^/]+/mayura/') then
        candidates[#candidates + 1] = d
      end
    end
  end
  for _, d in ipairs(candidates) do
    if read_file(d .. '/cgroup.procs') then return d end
  end
  return nil
end

-- }======================================================

local cached

--- The entries for this machine (computed once).
function M.list()
  if cached then return cached end
  cached = {}
  local ok_local, local_provider = pcall(require, 'mayura.sandbox.local')
  if ok_local and pcall(local_provider.local_sandboxes, {}) then
    local entry = { name = 'local', kind = 'local' }
    function entry.make_provider(opts)
      local prov = split(opts)
      return local_provider.local_sandboxes(prov)
    end
    function entry.make_pool(opts)
      local prov, pool = split(opts)
      local p = local_provider.local_sandboxes(prov)
      return sandbox.create_sandboxes(p, pool), p
    end
    entry.leftovers = local_leftovers
    cached[#cached + 1] = entry
  end
  local _, answers = M.host('docker info')
  local _, image = M.host('docker image inspect ' .. M.BUSYBOX)
  if answers and image then
    local docker = require('mayura.sandbox.docker')
    local variants = { { 'docker-cli', 'cli' }, { 'docker-api', 'api' } }
    if M.host("docker info --format '{{json .Runtimes}}'"):find('"runsc"', 1, true) then
      variants[#variants + 1] = { 'docker-runsc', 'api', 'runsc' }
    end
    for _, v in ipairs(variants) do
      local engine, runtime = v[2], v[3]
      local entry = { name = v[1], kind = 'docker', engine = engine, runtime = runtime, gvisor = runtime == 'runsc' }
      function entry.make_provider(opts)
        local prov = split(opts)
        prov.image = prov.image or M.BUSYBOX
        prov.engine = engine
        prov.runtime = runtime
        return docker.docker_sandboxes(prov)
      end
      function entry.make_pool(opts)
        local _, pool = split(opts)
        local p = entry.make_provider(opts)
        return sandbox.create_sandboxes(p, pool), p
      end
      entry.leftovers = docker_leftovers
      cached[#cached + 1] = entry
    end
  end
  local only = os.getenv('MAYURA_SPEC_PROVIDERS')
  if only and (',' .. only .. ','):find(',kubernetes,', 1, true) and require('support.kube_pods').available() then
    cached[#cached + 1] = M.kubernetes_entry()
  end
  if only and only ~= '' then
    local kept = {}
    for _, e in ipairs(cached) do
      if (',' .. only .. ','):find(',' .. e.name .. ',', 1, true) then kept[#kept + 1] = e end
    end
    cached = kept
  end
  return cached
end

--- The names of the entries, for a message.
-- The API server stand-in the 'kubernetes' entry's pools share (made once, on first use).
local kube
local KUBE_TOKEN, KUBE_NS = 'providers-spec-token-0123456789', 'sandboxes'
local function kube_stand_in()
  if not kube then
    local stand_in = require('support.stand_in')
    local svc = stand_in.new()
    kube = { svc = svc, state = require('support.kube_service').install(svc, nil, { token = KUBE_TOKEN,
      namespace = KUBE_NS, images = { 'busybox:1', 'mayura/agent:1' } }) }
  end
  return kube
end

--- The entry of mayura.sandbox.kubernetes on the stand-in.
function M.kubernetes_entry()
  local entry = { name = 'kubernetes', kind = 'kubernetes', token = KUBE_TOKEN }
  function entry.make_provider(opts)
    local prov = split(opts)
    local k = kube_stand_in()
    prov.pids = nil   -- Kubernetes has no process cap per Pod
    prov.server, prov.ca_file, prov.token, prov.namespace = k.state.server, k.state.ca_file, KUBE_TOKEN, KUBE_NS
    prov.image = prov.image or 'busybox:1'
    prov.agent_image = 'mayura/agent:1'
    prov.memory_mib = math.max(16, prov.memory_mib or 128)
    return require('mayura.sandbox.kubernetes').kubernetes_sandboxes(prov)
  end
  function entry.make_pool(opts)
    local _, pool = split(opts)
    local p = entry.make_provider(opts)
    return sandbox.create_sandboxes(p, pool), p
  end
  -- deletes the sandbox's Pod through the API, at once, as an operator would
  function entry.remove_behind(sb)
    local k = kube_stand_in()
    local r = require('mayura.http').request({ method = 'DELETE', ca_file = k.state.ca_file, timeout_ms = 20000,
      url = k.state.server .. '/api/v1/namespaces/' .. KUBE_NS .. '/pods/' .. sb._backend.id .. '?gracePeriodSeconds=0',
      headers = { Authorization = 'Bearer ' .. KUBE_TOKEN } })
    return r.status == 200
  end
  function entry.leftovers(sb)
    local out, k = {}, kube_stand_in()
    local name = sb._backend and sb._backend.id or sb.id
    local objects = k.state.objects or {}
    for _, plural in ipairs({ 'pods', 'networkpolicies' }) do
      local obj = ((objects[plural] or {})[KUBE_NS] or {})[name]
      if obj then
        out[#out + 1] = plural .. ' ' .. name
        local ct = plural == 'pods' and obj.metadata and (k.state.containers or {})[obj.metadata.uid]
        if ct and ct.running then out[#out + 1] = 'container ' .. tostring(ct.id) end
      end
    end
    return out
  end
  return entry
end

function M.names()
  local names = {}
  for i, e in ipairs(M.list()) do names[i] = e.name end
  return table.concat(names, ', ')
end

return M
