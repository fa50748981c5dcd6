--- The containers of the Kubernetes stand-in (support/kube_service.lua): each Pod's main
-- container is a real process in namespaces of its own, started by mayura-launch (the local
-- provider's root launcher) as bubblewrap, as a local sandbox is:
--
--   * new user, pid, mount, net, ipc and uts namespaces; the root is bubblewrap's own tmpfs
--     with the host's /usr read-only (and its root links), a synthesized /etc (passwd, group,
--     hosts) and the host's ld.so.cache, /proc and a minimal /dev (read-only but for its devices
--     and a 64 MiB /dev/shm, as a container runtime's); read-only with `read_only_root`; nothing
--     else of the host's files;
--   * each emptyDir volume mount is a tmpfs of its own (`size` from its sizeLimit, 64 MiB by
--     default; read-only when the mount says so), the agent copied into `agent_dir`'s (the init
--     container's copy) at `agent_dir`/agent (mode 0555);
--   * the process runs as `uid`/`gid` inside (mapped to a host uid of no account, its own
--     among this process's pods), with no capabilities, no_new_privs and no user namespaces of its own to make
--     (bubblewrap's --cap-drop ALL and --disable-userns); no seccomp filter;
--   * run as root, memory, cpus and pids are cgroups the launcher makes, joins, kills and removes
--     (mayura.sandbox._local_cgroup), as for a local sandbox;
--   * its standard input, output and error are socket pairs to the host (stdin shut at once
--     unless `stdin`); the launcher kills it at `lifetime_ms` (the pod's deadline, a backstop)
--     or when the host closes its control socket (kill()).
--
-- `exec` runs another process in the same namespaces and cgroups (nsenter, then setpriv to the
-- container's uid with no capabilities, no_new_privs); `connect(port)` opens a TCP connection
-- to 127.0.0.1:port inside the pod's network namespace (nsenter into it alone, as nobody).
-- Needs root (nsenter into the pod's namespaces); `M.available()` says whether it can run here.
local core = require('mayura.core')
local task = require('mayura._task')
local host = require('mayura.sandbox._host')
local cgroup = require('mayura.sandbox._local_cgroup')
local root_fs = require('mayura.sandbox._local_root')
local uv = require('luv')

local M = {}

local MIB = 1048576
local HOST_UID_BASE = 1400000   -- host uids for pods: [base, base + 65536)
local seq, uid_start = 0, nil

local function bin(name)
  local build = os.getenv('MAYURA_BUILD') or 'build'
  local p = host.absolute(build .. '/' .. name)
  if not host.exists(p) then p = host.absolute('build/' .. name) end
  return p
end

-- The host's programs, by absolute path: never looked up on a PATH a pod's env gives. setpriv
-- runs inside a pod too, where only /usr is the host's.
local programs
local function prog(name)
  programs = programs or {}
  if programs[name] == nil then programs[name] = host.find_in_path(name) or false end
  return programs[name] or nil
end

--- Whether pods can run here: root, bubblewrap, nsenter, setpriv (under /usr), bash and the launcher.
function M.available()
  return host.uid() == 0 and prog('bwrap') ~= nil and prog('nsenter') ~= nil and prog('bash') ~= nil
    and (prog('setpriv') or ''):match('^/usr/') ~= nil and prog('sh') ~= nil and host.exists(bin('mayura-launch'))
end

-- A byte stream over one end of a socket pair (a luv pipe), with on_data(bytes) / on_end().
local function stream(fd, on_data, on_end)
  local pipe = uv.new_pipe(false)
  pipe:open(fd)
  local s = { pipe = pipe, open = true }
  if on_data then
    pipe:read_start(function(err, chunk)
      if err or not chunk then
        pipe:read_stop()
        if on_end then on_end() end
        return
      end
      on_data(chunk)
    end)
  end
  function s.write(bytes)
    if not s.open or pipe:is_closing() then return false end
    pipe:write(bytes)
    return true
  end
  function s.shutdown()
    if not s.open or pipe:is_closing() then return end
    s.open = false
    pipe:shutdown(function() end)
  end
  function s.close()
    s.open = false
    if not pipe:is_closing() then pipe:close() end
  end
  return s
end

local function pair()
  local a, b = core.socketpair()
  assert(a, 'cannot make a socket pair')
  return a, b
end

-- The host's text of a descriptor's worth of bytes: a socket pair whose one end holds `text` and EOF.
local function text_fd(text)
  local a, b = pair()
  local s = stream(a)
  s.write(text)
  s.shutdown()
  task.after(2000, function() s.close() end, true)
  return b
end

local cg_parts
local function cgroups()
  if cg_parts == nil then
    local mode = cgroup.mode()
    cg_parts = mode and cgroup.parts(mode) or false
  end
  return cg_parts or nil
end

-- Inside the container: its streams onto 0, 1 and 2, the others closed, then its command.
local WRAP = 'exec "$@" <&3 >&6 2>&7 3<&- 4>&- 5>&- 6>&- 7>&- 8<&- 9<&-'

-- Variables the dynamic loader or the C library act on (glibc's list for setuid programs, and any
-- LD_*), and the names of the launcher's and this file's own (MAYURA_*, KPOD_*): a pod's env
-- never gives them to a program of the host (the launcher, bubblewrap, nsenter, sh run as root),
-- but they travel as KPOD_X_<name> and are set again inside, just before its command.
local LOADER_VARS = {}
for _, n in ipairs({ 'GCONV_PATH', 'GETCONF_DIR', 'HOSTALIASES', 'LOCALDOMAIN', 'LOCPATH', 'MALLOC_TRACE',
  'NIS_PATH', 'NLSPATH', 'RESOLV_HOST_CONF', 'RES_OPTIONS', 'TMPDIR', 'TZDIR', 'GLIBC_TUNABLES' }) do
  LOADER_VARS[n] = true
end

-- The pod's env as host programs may carry it (into `out`), and the shell text that sets the
-- loader's variables again inside.
local function carry_env(env, out)
  local names = {}
  for k, v in pairs(env or {}) do
    if LOADER_VARS[k] or k:match('^LD_') or k:match('^MAYURA_') or k:match('^KPOD_') then
      out['KPOD_X_' .. k] = v
      names[#names + 1] = k
    else
      out[k] = v
    end
  end
  table.sort(names)
  local set = {}
  for _, k in ipairs(names) do
    -- a name of the pod's env is [-._a-zA-Z][-._a-zA-Z0-9]* (admission); only plain ones reach here
    if k:match('^[%a_][%w_]*$') then
      set[#set + 1] = ('export %s="$KPOD_X_%s"; unset KPOD_X_%s; '):format(k, k, k)
    end
  end
  return table.concat(set)
end

--- Starts a container: `c` = { name (the hostname), argv, env (name -> value), workdir, uid,
-- gid, mounts ({ path, mib, read_only } emptyDirs), agent_dir (a mount that gets the agent), read_only_root,
-- memory_mib, cpus, pids, lifetime_ms, stdin, stdin_once, on_output(stream, bytes) (stream 1
-- stdout, 2 stderr), on_exit(result) }. Returns the container: `pid` (the host pid of its
-- first process, once started), `write(bytes)`, `close_stdin()`, `kill()`, `exec(argv, o)`,
-- `connect(port, o)`, `running`.
function M.start(c)
  seq = seq + 1
  local id = ('kpod-%d-%s'):format(seq, host.random_hex(4))
  local uid, gid = c.uid or 0, c.gid or c.uid or 0
  -- a host uid of its own: a random start per process, then one more per pod
  uid_start = uid_start or tonumber(host.random_hex(2), 16) or 0
  local host_uid = HOST_UID_BASE + (uid_start + seq) % 65536
  local a = { bin('mayura-launch'), prog('bwrap'),
    '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-net', '--unshare-cgroup-try',
    '--uid', tostring(uid), '--gid', tostring(gid), '--hostname', c.name or 'pod',
    '--new-session', '--die-with-parent', '--disable-userns', '--cap-drop', 'ALL', '--info-fd', '4',
    '--ro-bind', '/usr', '/usr' }
  local function add(...) for _, x in ipairs({ ... }) do a[#a + 1] = x end end
  for _, d in ipairs(root_fs.ROOT_DIRS) do
    if root_fs.lstat_type('/' .. d) == 'link' then add('--symlink', 'usr/' .. d, '/' .. d) end
  end
  add('--dir', '/etc', '--file', '8', '/etc/passwd', '--file', '9', '/etc/group')
  if host.exists('/etc/ld.so.cache') then add('--ro-bind', '/etc/ld.so.cache', '/etc/ld.so.cache') end
  -- /dev as a container runtime gives it: its devices, a 64 MiB /dev/shm, nothing else writable
  add('--proc', '/proc', '--dev', '/dev', '--size', ('%d'):format(64 * MIB), '--perms', '1777', '--tmpfs', '/dev/shm')
  for _, m in ipairs(c.mounts or {}) do
    add('--size', ('%d'):format(math.floor((m.mib or 64) * MIB)), '--perms', '1777', '--tmpfs', m.path)
  end
  if c.agent_dir then add('--perms', '0555', '--file', '0', c.agent_dir .. '/agent') end
  for _, m in ipairs(c.mounts or {}) do
    if m.read_only then add('--remount-ro', m.path) end
  end
  add('--remount-ro', '/dev')
  if c.read_only_root then add('--remount-ro', '/') end
  -- the launcher's variables are not the container's
  for _, v in ipairs({ 'MAYURA_LIFE', 'MAYURA_CG', 'MAYURA_CG_SET', 'MAYURA_FREEZER', 'MAYURA_CGKILL',
    'MAYURA_UID', 'MAYURA_INFO' }) do add('--unsetenv', v) end
  add('--chdir', c.workdir or '/', '--', '/usr/bin/sh', '-c', '@WRAP@', 'sh')
  for _, x in ipairs(c.argv) do add(x) end

  local life = (c.lifetime_ms or 86400000) + 1000
  local env = {}
  local reset = carry_env(c.env, env)
  env.PATH = env.PATH or '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  env.HOME, env.HOSTNAME = env.HOME or '/', env.HOSTNAME or c.name or 'pod'
  -- the launcher's own, after the pod's (none of whose names are these)
  env.MAYURA_LIFE = ('%d.%03d'):format(math.floor(life / 1000), life % 1000)
  env.MAYURA_UID, env.MAYURA_INFO = tostring(host_uid), '1'
  for i, x in ipairs(a) do
    if x == '@WRAP@' then a[i] = reset .. WRAP; break end
  end
  local parts = host.uid() == 0 and cgroups()
  local cg_dirs = {}
  if parts then
    local cg_kill, cg_set
    cg_dirs, cg_kill, cg_set = cgroup.plan(parts, id, {
      memory_mib = c.memory_mib or 512, cpus = c.cpus or 1, pids = c.pids or 256 })
    env.MAYURA_CG, env.MAYURA_CG_SET = table.concat(cg_dirs, ' '), cgroup.set_text(cg_set)
    env.MAYURA_FREEZER, env.MAYURA_CGKILL = cg_kill.freezer or '', cg_kill.v2 or ''
  end

  local self = { id = id, running = true, uid = uid, gid = gid, env = c.env or {}, workdir = c.workdir or '/',
    cg_dirs = cg_dirs, waiters = {} }
  local in_host, in_child = pair()
  local ctl_host, ctl_child = pair()
  local info_host, info_child = pair()
  local out_host, out_child = pair()
  local err_host, err_child = pair()
  local names = 'root:x:0:0:root:/root:/bin/sh\n'
  if uid ~= 0 then names = names .. ('user:x:%d:%d:user:/:/bin/sh\n'):format(uid, gid) end
  names = names .. 'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n'
  local groups = 'root:x:0:\nnogroup:x:65534:\n'
  if gid ~= 0 then groups = groups .. ('user:x:%d:\n'):format(gid) end
  local passwd_fd, group_fd = text_fd(names), text_fd(groups)
  local agent = c.agent_dir and host.read_plain(bin('mayura-agent')) or ''
  local proc, err = core.spawn({ argv = a, env = env, stdin = agent, max_output_bytes = 65536, outlive = true,
    fds = { in_child, ctl_child, info_child, out_child, err_child, passwd_fd, group_fd } },
    function(res) self:_exited(res) end)
  for _, fd in ipairs({ in_child, ctl_child, info_child, out_child, err_child, passwd_fd, group_fd }) do
    core.close_fd(fd)
  end
  if not proc then
    for _, fd in ipairs({ in_host, ctl_host, info_host, out_host, err_host }) do core.close_fd(fd) end
    if #cg_dirs > 0 then cgroup.remove(cg_dirs) end
    error('cannot start the container: ' .. tostring(err), 0)
  end
  self.proc, self.control = proc, ctl_host
  self.stdin = stream(in_host)
  if not c.stdin then self.stdin.shutdown() end
  local ends = 0
  local function ended()
    ends = ends + 1
    if ends == 2 then self.output_done = true; self:_wake() end
  end
  self.stdout = stream(out_host, function(b) if c.on_output then c.on_output(1, b) end end, ended)
  self.stderr = stream(err_host, function(b) if c.on_output then c.on_output(2, b) end end, ended)
  self.on_exit = c.on_exit
  -- bubblewrap says its child's pid on the info descriptor
  local info, info_s = {}, nil
  info_s = stream(info_host, function(b)
    info[#info + 1] = b
    local pid = table.concat(info):match('"child%-pid"%s*:%s*(%d+)')
    if pid and not self.pid then
      self.pid = tonumber(pid)
      self:_wake()
    end
  end, function() info_s.close(); self:_wake() end)
  self.info = info_s
  return setmetatable(self, { __index = M.Container })
end

M.Container = {}
local Container = M.Container

function Container:_wake()
  local w = self.waiters
  self.waiters = {}
  for _, f in ipairs(w) do f() end
end

function Container:_exited(res)
  self.running = false
  self.result = res
  if self.control then core.close_fd(self.control); self.control = nil end
  self.stdin.close()
  -- what it wrote last comes before its end
  task.spawn(function()
    local deadline = core.hrtime_ms() + 2000
    while not self.output_done and core.hrtime_ms() < deadline do
      task.await(function(done)
        self.waiters[#self.waiters + 1] = done
        task.after(50, done, true)
      end)
    end
    self.stdout.close()
    self.stderr.close()
    if self.info then self.info.close() end
    self:_wake()
    if self.on_exit then self.on_exit(res) end
  end)
end

--- Waits (`ms` at most) for the container's first process to be there; its host pid, or nil.
function Container:wait_pid(ms)
  local deadline = core.hrtime_ms() + (ms or 5000)
  while not self.pid and self.running and core.hrtime_ms() < deadline do
    task.await(function(done)
      self.waiters[#self.waiters + 1] = done
      task.after(50, done, true)
    end)
  end
  return self.pid
end

--- The host pids of the container's command: the processes right under its first process
-- (bubblewrap's, pid 1 of its namespace); empty before the command is there and after it ended.
function Container:command_pids()
  if not self.pid or not self.running then return {} end
  local text = host.read_plain(('/proc/%d/task/%d/children'):format(self.pid, self.pid)) or ''
  local out = {}
  for n in text:gmatch('%d+') do out[#out + 1] = tonumber(n) end
  return out
end

--- Waits (`ms` at most) for the container's command to be there; whether it is (false once it ended).
function Container:wait_command(ms)
  local deadline = core.hrtime_ms() + (ms or 5000)
  self:wait_pid(ms)
  while self.running and #self:command_pids() == 0 and core.hrtime_ms() < deadline do task.sleep(10) end
  return self.running and #self:command_pids() > 0
end

function Container:write(bytes) return self.stdin.write(bytes) end
function Container:close_stdin() self.stdin.shutdown() end

--- Ends the container (the launcher kills its pid namespace and cgroups).
function Container:kill()
  if self.control then core.close_fd(self.control); self.control = nil end
end

-- In the container's namespaces (and cgroups) as its user, without capabilities.
local ENTER = 'for d in $KPOD_CG; do echo $$ > "$d/cgroup.procs" || exit 126; done; unset KPOD_CG; exec "$@"'

--- Runs `argv` in the container: `o` = { on_output(stream, bytes), on_exit(result), stdin }.
-- Returns { write(bytes), close_stdin(), kill(), running }.
function Container:exec(argv, o)
  local pid = self:wait_pid(5000)
  if not pid or not self.running then error('the container is not running', 0) end
  -- nsenter takes the uid inside (with the capabilities joining the user namespace gave); the
  -- program after it has none unless it is uid 0 there, whose are dropped by setpriv
  local a = { prog('sh'), '-c', ENTER, 'enter', prog('nsenter'), '-t', tostring(pid), '-U', '-m', '-p', '-n', '-i',
    '-u', '-S', tostring(self.uid), '-G', tostring(self.gid), '--', prog('setpriv'), '--no-new-privs' }
  if self.uid == 0 then
    for _, x in ipairs({ '--bounding-set', '-all', '--inh-caps', '-all' }) do a[#a + 1] = x end
  end
  local env = {}
  local reset = carry_env(self.env, env)
  env.PATH = env.PATH or '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  env.HOME = env.HOME or '/'
  env.KPOD_CG = table.concat(self.cg_dirs, ' ')
  for _, x in ipairs({ '--', '/usr/bin/sh', '-c', 'cd "$0" 2>/dev/null || cd /; ' .. reset .. WRAP, self.workdir }) do
    a[#a + 1] = x
  end
  for _, x in ipairs(argv) do a[#a + 1] = x end
  local x = { running = true }
  local in_host, in_child = pair()
  local out_host, out_child = pair()
  local err_host, err_child = pair()
  local dummy_host, dummy_child = pair()
  local pending = 3
  local result
  local function maybe_end()
    if pending == 0 and o.on_exit then
      local cb = o.on_exit
      o.on_exit = nil
      cb(result)
    end
  end
  local proc, err = core.spawn({ argv = a, env = env, max_output_bytes = 65536,
    fds = { in_child, dummy_child, dummy_child, out_child, err_child } },
    function(res)
      x.running = false
      result = res
      pending = pending - 1
      maybe_end()
    end)
  for _, fd in ipairs({ in_child, out_child, err_child, dummy_child }) do core.close_fd(fd) end
  core.close_fd(dummy_host)
  if not proc then
    for _, fd in ipairs({ in_host, out_host, err_host }) do core.close_fd(fd) end
    error('cannot exec in the container: ' .. tostring(err), 0)
  end
  local sin = stream(in_host)
  if not o.stdin then sin.shutdown() end
  local function done_stream() pending = pending - 1; maybe_end() end
  local sout = stream(out_host, function(b) if o.on_output then o.on_output(1, b) end end, done_stream)
  local serr = stream(err_host, function(b) if o.on_output then o.on_output(2, b) end end, done_stream)
  function x.write(bytes) return sin.write(bytes) end
  function x.close_stdin() sin.shutdown() end
  function x.kill() if x.running then proc:cancel() end end
  function x.close()
    x.kill()
    sin.close(); sout.close(); serr.close()
  end
  return x
end

-- Inside the pod's network namespace, as nobody: a connection to 127.0.0.1:$0 bridged to fd 3.
local CONNECT = 'exec 4<>/dev/tcp/127.0.0.1/"$0" || exit 1; cat <&4 >&3 & cat <&3 >&4; wait'

--- A TCP connection to `port` on the pod's loopback: `o` = { on_data(bytes), on_end(code) }
-- (code: the connector's exit, 0 when the connection was made and ended). Returns
-- { write(bytes), shutdown(), close() }.
function Container:connect(port, o)
  local pid = self:wait_pid(5000)
  if not pid or not self.running then error('the container is not running', 0) end
  local a = { prog('nsenter'), '-t', tostring(pid), '-n', '--', prog('setpriv'), '--reuid', '65534', '--regid',
    '65534', '--clear-groups', '--no-new-privs', '--', prog('bash'), '-c', CONNECT, tostring(port) }
  local s_host, s_child = pair()
  local c = {}
  local proc, err = core.spawn({ argv = a, env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' }, max_output_bytes = 4096,
    fds = { s_child } }, function(res)
      c.result = res
      if c.s then c.s.close() end
      if o.on_end then o.on_end(res.exit_code or 1) end
    end)
  core.close_fd(s_child)
  if not proc then
    core.close_fd(s_host)
    error('cannot connect in the container: ' .. tostring(err), 0)
  end
  c.s = stream(s_host, function(b) if o.on_data then o.on_data(b) end end)
  function c.write(bytes) return c.s.write(bytes) end
  function c.shutdown() c.s.shutdown() end
  function c.close()
    if not c.result then proc:cancel() end
    c.s.close()
  end
  return c
end

return M
