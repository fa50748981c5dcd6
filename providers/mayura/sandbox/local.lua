--- mayura.sandbox.local: daemonless Linux sandboxes from namespaces (bubblewrap).
--
-- `local_sandboxes(options)` is a provider for `create_sandboxes`. Each sandbox
-- is a set of new user, mount, pid, net, ipc and uts namespaces made by
-- bubblewrap, with the in-sandbox agent (build/mayura-agent) as its PID 1:
--
--   * the root is read-only: the host's /usr (and its library links) with a
--     synthesized /etc (passwd, group, hosts, an empty resolv.conf), or a root
--     file system directory given as `image`; never the host's /home, /root,
--     /var, /run, /tmp or the secrets of its /etc;
--   * /workspace and /tmp are tmpfs with size caps; the user is uid 1000 with
--     no capabilities and no_new_privs; no network unless 'all' (then the
--     host's network, and url(port) is on 127.0.0.1);
--   * run as root, each sandbox runs under a host uid of its own (no host
--     root behind the sandbox's user), and `cpus`, `memory_mib` and `pids` are
--     enforced with cgroups (v1 or v2); run as another user, the host's
--     limits apply and `provider.enforced` says so;
--   * commands and file calls go to the agent over a socket pair, so
--     environment values never appear on a host command line, and file calls
--     happen in the sandbox's own view of its files;
--   * the lifetime is enforced by the agent: it exits at the end of it, and as
--     PID 1 its exit ends every process of the sandbox. It also exits when the
--     host end of its socket closes, so a host killed with SIGKILL leaves no
--     sandbox behind; the launcher then removes the sandbox's cgroups.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local agent_backend = require('mayura.sandbox._agent_backend')
local host = require('mayura.sandbox._host')

local M = {}

local MIB = 1048576
local SANDBOX_UID = 1000
local HOST_UID_BASE = 1200000     -- host uids for sandboxes when run as root: [base, base + 65536)
local WORKDIR = '/workspace'
local AGENT_PATH = '/.mayura/agent'

-- {======================================================
-- Host helpers
-- =======================================================

local await_cb, exists, read_plain, write_plain = host.await, host.exists, host.read_plain, host.write_plain
local absolute, find_in_path, find_agent, random_hex =
  host.absolute, host.find_in_path, host.find_agent, host.random_hex

local function is_dir(path)
  local st = await_cb(function(cb) core.fs.stat(path, cb) end)
  return st ~= nil and st.type == 'directory'
end

local function readlink_type(path)
  local st = await_cb(function(cb) core.fs.stat(path, cb) end)
  return st and st.type
end

local function is_root()
  return host.uid() == 0
end

-- }======================================================

-- {======================================================
-- The synthesized /etc
-- =======================================================

local ETC = {
  passwd = 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n' ..
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n',
  group = 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n',
  hosts = '127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n',
  ['resolv.conf'] = '',
  ['nsswitch.conf'] = 'passwd: files\ngroup: files\nhosts: files dns\n',
}

-- Parts of the host's /etc that hold no secrets and that programs need.
local ETC_HOST = { 'alternatives', 'ld.so.cache', 'localtime', 'ssl/certs', 'ca-certificates' }

-- Where the provider keeps what every sandbox binds read-only: root's /run, else the user's runtime dir.
local function runtime_base()
  if is_root() then return '/run/mayura' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  return (rt and rt ~= '') and (rt .. '/mayura') or ('/tmp/mayura-' .. (os.getenv('USER') or 'user'))
end

-- Writes `files` (name -> content) with `mode` into base/name, rewriting only what differs, readable
-- by the sandboxes' own host uids whatever the umask and the checkout's directory modes are.
local function install(base, name, files, mode, what)
  local dir = base .. '/' .. name
  local ok, err = await_cb(function(cb) core.fs.mkdir(dir, { mode = 493 }, cb) end)
  if not ok then errors.raise('INVALID_CONFIG', 'cannot make ' .. what .. ': ' .. tostring(err and err.errno)) end
  require('mayura.process').run({ 'chmod', '0755', base, dir })
  for file, content in pairs(files) do
    if read_plain(dir .. '/' .. file) ~= content then
      local w, werr = await_cb(function(cb) core.fs.write(dir .. '/' .. file, content, { mode = mode }, cb) end)
      if not w then errors.raise('INVALID_CONFIG', 'cannot write ' .. what .. ': ' .. tostring(werr and werr.errno)) end
    end
  end
  return dir
end

-- }======================================================

-- {======================================================
-- cgroups
-- =======================================================

-- Which cgroup version can be used here, as root: 'v2', 'v1' or nil.
local function cgroup_mode()
  if not is_root() then return nil end
  if exists('/sys/fs/cgroup/cgroup.controllers') then return 'v2' end
  if exists('/sys/fs/cgroup/memory/memory.limit_in_bytes') and exists('/sys/fs/cgroup/pids/cgroup.procs') then
    return 'v1'
  end
  return nil
end

-- Makes the sandbox's cgroups; returns the directories (whose cgroup.procs the launcher joins).
local function make_cgroups(mode, id, limits)
  local dirs = {}
  local function mk(path)
    local ok = await_cb(function(cb) core.fs.mkdir(path, nil, cb) end)
    if not ok then error(errors.sandbox('unavailable', 'cannot make a cgroup')) end
    dirs[#dirs + 1] = path
    return path
  end
  local function set(path, value, optional)
    if not write_plain(path, value) and not optional then
      error(errors.sandbox('unavailable', 'cannot set a cgroup limit'))
    end
  end
  local bytes = tostring(limits.memory_mib * MIB)
  local quota = math.floor(limits.cpus * 100000 + 0.5)
  if mode == 'v1' then
    local mem = mk('/sys/fs/cgroup/memory/mayura/' .. id)
    set(mem .. '/memory.limit_in_bytes', bytes)
    set(mem .. '/memory.memsw.limit_in_bytes', bytes, true)
    set(mem .. '/memory.swappiness', '0', true)
    local pids = mk('/sys/fs/cgroup/pids/mayura/' .. id)
    set(pids .. '/pids.max', tostring(limits.pids))
    if exists('/sys/fs/cgroup/cpu/cpu.cfs_quota_us') then
      local cpu = mk('/sys/fs/cgroup/cpu/mayura/' .. id)
      set(cpu .. '/cpu.cfs_period_us', '100000')
      set(cpu .. '/cpu.cfs_quota_us', tostring(quota))
    end
  else
    write_plain('/sys/fs/cgroup/cgroup.subtree_control', '+memory +pids +cpu')
    mk('/sys/fs/cgroup/mayura')
    dirs = {}
    write_plain('/sys/fs/cgroup/mayura/cgroup.subtree_control', '+memory +pids +cpu')
    local cg = mk('/sys/fs/cgroup/mayura/' .. id)
    set(cg .. '/memory.max', bytes)
    set(cg .. '/memory.swap.max', '0', true)
    set(cg .. '/pids.max', tostring(limits.pids))
    set(cg .. '/cpu.max', quota .. ' 100000', true)
  end
  return dirs
end

local function remove_cgroups(dirs)
  for i = #dirs, 1, -1 do os.remove(dirs[i]) end
end

-- How many times the sandbox's memory cgroup has killed a process for memory.
local function oom_kills(mode, dirs)
  if mode == 'v1' then
    local s = read_plain(dirs[1] .. '/memory.oom_control') or ''
    return tonumber(s:match('oom_kill (%d+)')) or 0
  elseif mode == 'v2' then
    local s = read_plain(dirs[1] .. '/memory.events') or ''
    return tonumber(s:match('oom_kill (%d+)')) or 0
  end
  return 0
end

-- }======================================================

-- {======================================================
-- The launcher
-- =======================================================

-- Runs bubblewrap in the cgroups, then removes them. The launcher itself
-- stays outside them: were it inside, the sandbox's own memory limit could
-- have it killed (an OOM in the sandbox), and nothing would remove them.
-- Arguments: the number of cgroup directories, the directories, the command.
local LAUNCHER = [[
n=$1; shift; dirs=; i=$n
for d; do
  [ "$i" -gt 0 ] || break
  dirs="$d $dirs"; i=$((i - 1))
done
/bin/sh -c '
n=$1; shift
while [ "$n" -gt 0 ]; do
  echo $$ > "$1/cgroup.procs" || exit 125
  shift; n=$((n - 1))
done
echo -1000 > /proc/self/oom_score_adj 2>/dev/null
exec "$@"' mayura-join "$n" "$@"
rc=$?
# bubblewrap may end first (killed for memory, say): the rest of the sandbox ends soon after
# (the agent at its lifetime at the latest), and only an empty cgroup can be removed
for d in $dirs; do
  while [ -n "$(cat "$d/cgroup.procs" 2>/dev/null)" ]; do sleep 0.05; done
  rmdir "$d" 2>/dev/null
done
exit $rc
]]

local function bwrap_argv(p, spec, sb_id)
  local a = { p.bwrap,
    '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try',
    '--uid', tostring(SANDBOX_UID), '--gid', tostring(SANDBOX_UID),
    '--hostname', 'sandbox',
    '--new-session', '--as-pid-1', '--disable-userns', '--clearenv', '--cap-drop', 'ALL',
  }
  local function add(...) for _, x in ipairs({ ... }) do a[#a + 1] = x end end
  if spec.network ~= 'all' then add('--unshare-net') end
  local image = spec.image or p.image
  if image then
    add('--ro-bind', image, '/')
  else
    add('--ro-bind', '/usr', '/usr')
    for _, d in ipairs({ 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32' }) do
      local t = p.root_links[d]
      if t == 'symlink' then add('--symlink', 'usr/' .. d, '/' .. d)
      elseif t == 'directory' then add('--ro-bind', '/' .. d, '/' .. d) end
    end
    add('--dir', '/etc')
    for name in pairs(ETC) do add('--ro-bind', p.etc .. '/' .. name, '/etc/' .. name) end
    for _, name in ipairs(ETC_HOST) do
      if p.etc_host[name] then add('--ro-bind', '/etc/' .. name, '/etc/' .. name) end
    end
    if spec.network == 'all' and p.etc_host['resolv'] then
      add('--ro-bind', '/etc/resolv.conf', '/etc/resolv.conf')
    end
  end
  add('--proc', '/proc', '--dev', '/dev')
  -- /dev/shm is as small as /tmp: a tmpfs without a cap fills the sandbox's memory instead
  add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/dev/shm')
  add('--size', tostring(p.tmp_mib * MIB), '--perms', '1777', '--tmpfs', '/tmp')
  add('--size', tostring(p.workspace_mib * MIB), '--perms', '0755', '--tmpfs', WORKDIR)
  add('--ro-bind', p.agent, AGENT_PATH)
  -- the root (bubblewrap's tmpfs, with no cap) and /dev hold no writable place of their own
  add('--remount-ro', '/dev', '--remount-ro', '/')
  add('--chdir', '/')
  add(AGENT_PATH, '--fd', '3', '--lifetime-ms', tostring(spec.lifetime_ms), '--workdir', WORKDIR)
  local _ = sb_id
  return a
end

-- }======================================================

-- {======================================================
-- A sandbox backend over the agent
-- =======================================================

-- exec, files and the error mapping are shared with the Docker provider
local Backend = agent_backend.class()

-- How many processes the sandbox's memory cgroup has killed (0 without cgroups).
function Backend:oom_kills()
  if not self.cg_mode then return 0 end
  return oom_kills(self.cg_mode, self.cg_dirs)
end

function Backend:url(port)
  if self.network ~= 'all' then
    errors.raise('INVALID_INPUT', 'a sandbox serves ports only with network all', nil, 0)
  end
  return 'http://127.0.0.1:' .. port
end

function Backend:release()
  if self.released then return end
  self.released = true
  if not self.closed then
    -- ask the agent to end everything; closing our end ends it too
    pcall(self.ch.call, self.ch, { op = 'shutdown' }, function() end)
    self.closed = true
    self.ch:close()
  end
  -- wait for the launcher (and so bubblewrap and the cgroups) to be gone, a few seconds at most
  if not self.exited then
    local uv = require('luv')
    task.await(function(done)
      local timer = uv.new_timer()
      local fired = false
      local function finish()
        if fired then return end
        fired = true
        if not timer:is_closing() then timer:stop(); timer:close() end
        done()
      end
      self.on_exit = finish
      timer:start(5000, 0, function()
        if self.proc then self.proc:cancel() end
        finish()
      end)
    end)
  end
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local option_keys = {
  image = true, workdir = true, workspace_mib = true, tmp_mib = true, cpus = true, memory_mib = true,
  pids = true, max_lifetime_ms = true, bwrap = true, agent = true,
}

--- A provider of local namespace sandboxes. Options: `image` (a root file
-- system directory; the host's /usr by default), `workspace_mib` (1024),
-- `tmp_mib` (256), `cpus` (1), `memory_mib` (1024), `pids` (256),
-- `max_lifetime_ms` (24 hours), `bwrap` (path of bubblewrap), `agent` (path of
-- the agent binary).
function M.local_sandboxes(options)
  options = options or {}
  check.keys(options, option_keys, 'local_sandboxes options', 'INVALID_CONFIG', 3)
  local C = 'INVALID_CONFIG'
  if options.workdir ~= nil and options.workdir ~= WORKDIR then
    errors.raise(C, 'the local provider\'s workdir is ' .. WORKDIR, nil, 2)
  end
  local p = {
    id = 'local',
    workdir = WORKDIR,
    workspace_mib = check.int(options.workspace_mib, 'workspace_mib', 1, 1048576, C, 3, 1024),
    tmp_mib = check.int(options.tmp_mib, 'tmp_mib', 1, 1048576, C, 3, 256),
    memory_mib = check.int(options.memory_mib, 'memory_mib', 16, 16 * 1048576, C, 3, 1024),
    pids = check.int(options.pids, 'pids', 8, 4194304, C, 3, 256),
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, nil, C, 3, 86400000),
  }
  local cpus = options.cpus or 1
  if type(cpus) ~= 'number' or cpus ~= cpus or cpus <= 0 or cpus > 1024 then
    errors.raise(C, 'cpus must be a number above 0', nil, 2)
  end
  p.cpus = cpus
  if options.image ~= nil then
    if type(options.image) ~= 'string' or options.image:sub(1, 1) ~= '/' or not is_dir(options.image) then
      errors.raise(C, 'image must be the absolute path of a root file system directory', nil, 2)
    end
    p.image = options.image
  end
  p.bwrap = find_in_path(options.bwrap or 'bwrap')
  if not p.bwrap then errors.raise(C, 'bubblewrap (bwrap) is not installed', nil, 2) end
  p.agent = options.agent and absolute(options.agent) or find_agent()
  if not p.agent or not exists(p.agent) then errors.raise(C, 'the sandbox agent is not built (make)', nil, 2) end
  p.cg_mode = cgroup_mode()
  p.root = is_root()
  p.features = { stdin = true, ports = true, desktop = false, network = { 'none', 'all' } }
  -- what holds where: cgroups need root here; without them the host's limits apply
  p.enforced = {
    memory = p.cg_mode ~= nil, pids = p.cg_mode ~= nil, cpus = p.cg_mode ~= nil,
    workspace_mib = true, tmp_mib = true, lifetime = true, network = true,
  }
  p.root_links = {}
  for _, d in ipairs({ 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32' }) do
    p.root_links[d] = readlink_type('/' .. d)
  end
  p.etc_host = {}
  for _, name in ipairs(ETC_HOST) do p.etc_host[name] = readlink_type('/etc/' .. name) ~= nil end
  p.etc_host.resolv = exists('/etc/resolv.conf')
  local base = runtime_base()
  p.etc = install(base, 'etc-1', ETC, 420, 'the sandbox /etc')
  -- a copy of the agent beside it: the checkout it was built in may be closed to other uids
  local agent_bytes = read_plain(p.agent)
  if not agent_bytes then errors.raise(C, 'the sandbox agent cannot be read', nil, 2) end
  -- named by its content, so two checkouts (or builds) never replace each other's agent
  local sum = require('mayura.process').run({ 'sha256sum' }, { stdin = agent_bytes }).stdout:match('^(%x+)')
  if not sum then errors.raise(C, 'the sandbox agent cannot be read', nil, 2) end
  p.agent = install(base, 'agent-' .. sum:sub(1, 16), { ['mayura-agent'] = agent_bytes }, 493, 'the sandbox agent') ..
    '/mayura-agent'
  local counter = 0

  function p.create(self, spec)
    if spec.ports and #spec.ports > 0 and spec.network ~= 'all' then
      errors.raise('INVALID_INPUT', 'ports are served only with network all', nil, 0)
    end
    if spec.image ~= nil and (spec.image:sub(1, 1) ~= '/' or not is_dir(spec.image)) then
      errors.raise('INVALID_CONFIG', 'image must be the absolute path of a root file system directory', nil, 0)
    end
    counter = counter + 1
    local id = 'local-' .. random_hex(6)
    local limits = {
      memory_mib = math.min(spec.memory_mib or self.memory_mib, self.memory_mib),
      cpus = math.min(spec.cpus or self.cpus, self.cpus),
      pids = self.pids,
    }
    local cg_dirs = {}
    if self.cg_mode then cg_dirs = make_cgroups(self.cg_mode, id, limits) end
    local argv = { '/bin/sh', '-c', LAUNCHER, 'mayura-launch', tostring(#cg_dirs) }
    for _, d in ipairs(cg_dirs) do argv[#argv + 1] = d end
    if self.root then
      local uid = tostring(HOST_UID_BASE + (tonumber(random_hex(2), 16) or counter))
      for _, x in ipairs({ 'setpriv', '--reuid', uid, '--regid', uid, '--clear-groups', '--' }) do
        argv[#argv + 1] = x
      end
    end
    for _, x in ipairs(bwrap_argv(self, spec, id)) do argv[#argv + 1] = x end

    local a, b = core.socketpair()
    if not a then
      remove_cgroups(cg_dirs)
      error(errors.sandbox('unavailable', 'cannot make a socket pair'), 0)
    end
    local backend = setmetatable({
      id = id, network = spec.network, cg_mode = self.cg_mode, cg_dirs = cg_dirs,
      closed = false, released = false, exited = false,
    }, Backend)
    local proc, err = core.spawn({
      argv = argv, fds = { b }, max_output_bytes = 65536,
      env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' },
    }, function(res)
      backend.exited = true
      backend.launcher_result = res
      if not backend.closed then
        backend.closed = true
        pcall(backend.ch.close, backend.ch)
      end
      if backend.on_exit then backend.on_exit() end
    end)
    core.close_fd(b)
    if not proc then
      core.close_fd(a)
      remove_cgroups(cg_dirs)
      local _ = err
      error(errors.sandbox('unavailable', 'cannot start the sandbox'), 0)
    end
    backend.proc = proc
    backend.ch = core.channel(a, {
      max_frame_bytes = agent_backend.MAX_FRAME_BYTES,
      on_close = function() backend.closed = true end,
    })
    -- the agent answers once the namespaces are up; then it gets the env, never on a command line
    local ok, cerr = pcall(agent_backend.handshake, backend, spec.env, WORKDIR)
    if not ok then agent_backend.start_failed(backend, cerr) end
    return backend
  end
  return p
end

-- }======================================================

return M
