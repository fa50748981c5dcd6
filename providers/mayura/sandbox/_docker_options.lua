--- mayura.sandbox._docker_options: the Docker provider's options, checked, as the provider's table.
--
-- `provider(options, how)` checks every option of `docker_sandboxes` (mayura.sandbox.docker says
-- what each is for) and returns the provider's table before anything is run: its features and
-- limits, the engine (the CLI or the Engine API, local sockets only), the runtime (checked against
-- the daemon's list; gVisor's 'runsc' gives network 'none' alone), the agent, what this process may
-- give (an allow-list and the host's rules of 'all' take root) and the sockets' base directory.
-- Everything it refuses is INVALID_CONFIG. Private to the Docker provider.
local errors = require('mayura.errors')
local check = require('mayura._check')
local desktop = require('mayura.sandbox._desktop')
local egress = require('mayura.sandbox._egress')
local fw = require('mayura.sandbox._firewall')
local engines = require('mayura.sandbox._docker_engine')
local dirs = require('mayura.sandbox._docker_dirs')
local uids = require('mayura.sandbox._docker_uid')
local host_util = require('mayura.sandbox._host')

local M = {}

local exists, read_plain = host_util.exists, host_util.read_plain
local absolute, find_in_path, find_agent, my_uid =
  host_util.absolute, host_util.find_in_path, host_util.find_agent, host_util.uid

--- Whether `s` is a string usable as a path (no NUL, no line break).
function M.plain_path(s)
  return type(s) == 'string' and not s:find('[%z\n\r]')
end
local plain_path = M.plain_path

local option_keys = {
  image = true, engine = true, docker = true, host = true, user = true, workdir = true, workspace_mib = true,
  tmp_mib = true, cpus = true, memory_mib = true, pids = true, read_only_root = true, max_lifetime_ms = true,
  agent = true, run_dir = true, desktop = true, warm = true, proxy_resolve = true, runtime = true,
}

-- Checks `runtime` (the name of a runtime the daemon lists) and sets it on the provider `p`; raises
-- INVALID_CONFIG for one the daemon does not have. Under gVisor (runsc) sandboxes get network 'none'
-- alone: the runtime is registered with gVisor's own network stack off (scripts/docker-setup.sh).
-- Only checking (a policy's check: nothing is run), the name alone is checked.
local function check_runtime(p, runtime, checking)
  if type(runtime) ~= 'string' or #runtime > 64 or not runtime:match('^%w[%w._-]*$') then
    errors.raise('INVALID_CONFIG', 'runtime must be the name of one of the Docker daemon\'s runtimes', nil, 0)
  end
  if checking then
    p.runtime, p.gvisor = runtime, runtime == 'runsc'
    if p.gvisor then p.features.network = { 'none' } end
    return
  end
  local known = p.engine:runtimes()
  local info = known[runtime]
  if type(info) ~= 'table' then
    local names = {}
    for name in pairs(known) do
      if type(name) == 'string' and name:match('^%w[%w._-]*$') then names[#names + 1] = name end
    end
    table.sort(names)
    errors.raise('INVALID_CONFIG', 'the Docker daemon has no runtime named ' .. runtime .. ' (it has: ' ..
      table.concat(names, ', ') .. ')', nil, 0)
  end
  p.runtime = runtime
  local path = type(info.path) == 'string' and info.path or ''
  p.gvisor = runtime == 'runsc' or path:match('runsc$') ~= nil
  if p.gvisor then p.features.network = { 'none' } end
end

local RESERVED_DIRS = { ['/'] = true, ['/tmp'] = true, ['/proc'] = true, ['/sys'] = true, ['/dev'] = true,
  ['/etc'] = true, ['/.mayura'] = true }

local function check_workdir(w)
  if type(w) ~= 'string' or not w:match('^/[%w%._%-/]*$') or #w > 512 or w:find('//', 1, true)
    or w:find('/%.%.?/') or w:find('/%.%.?$') or (w ~= '/' and w:sub(-1) == '/') then
    errors.raise('INVALID_CONFIG', 'workdir must be an absolute path of letters, digits, . _ - and /', nil, 0)
  end
  if RESERVED_DIRS[w] or w:sub(1, 8) == '/.mayura' or w:sub(1, 5) == '/tmp/' or w:sub(1, 6) == '/proc/'
    or w:sub(1, 5) == '/sys/' or w:sub(1, 5) == '/dev/' then
    errors.raise('INVALID_CONFIG', 'workdir cannot be ' .. w, nil, 0)
  end
  return w
end

--- The provider's table from `options` (see mayura.sandbox.docker's docker_sandboxes), and whether
-- it is only being checked (`how = { check = true }`: nothing is run then).
function M.provider(options, how)
  local C = 'INVALID_CONFIG'
  local checking = type(how) == 'table' and how.check == true
  if type(options) ~= 'table' then errors.raise(C, 'docker_sandboxes needs options with an image', nil, 2) end
  check.keys(options, option_keys, 'docker_sandboxes options', C, 3)
  local image = options.image
  if type(image) ~= 'string' or image == '' or #image > 1024 or image:find('[%s%z]') or image:sub(1, 1) == '-' then
    errors.raise(C, 'image is required: the name of an image on this machine', nil, 2)
  end
  local engine = options.engine or 'cli'
  if engine ~= 'cli' and engine ~= 'api' then errors.raise(C, "engine must be 'cli' or 'api'", nil, 2) end
  local ok, socket = pcall(engines.socket_of, options.host or engines.default_host())
  if not ok then error(socket, 2) end
  local user, uid, gid = options.user, nil, nil
  if user ~= nil then
    if type(user) == 'string' then uid, gid = user:match('^(%d+):(%d+)$') end
    if not uid or #uid > 10 or #gid > 10 then errors.raise(C, "user must be a numeric 'uid:gid'", nil, 2) end
    if tonumber(uid) == 0 then errors.raise(C, 'user must not be root (uid 0)', nil, 2) end
  end
  local wok, workdir = pcall(check_workdir, options.workdir or '/workspace')
  if not wok then error(workdir, 2) end
  local cpus = options.cpus or 1
  if type(cpus) ~= 'number' or cpus ~= cpus or cpus < 0.01 or cpus > 1024 then
    errors.raise(C, 'cpus must be a number from 0.01', nil, 2)
  end
  if options.read_only_root ~= nil and type(options.read_only_root) ~= 'boolean' then
    errors.raise(C, 'read_only_root must be a boolean', nil, 2)
  end
  local settings = desktop.settings(options.desktop, nil, 2)
  local p = {
    id = 'docker',
    features = { stdin = true, ports = true, desktop = settings ~= nil, network = { 'none', 'all' },
      snapshots = 'native' },
    proxy_resolve = egress.check_resolve(options.proxy_resolve, 2),
    desktop = settings,
    workdir = workdir,
    image = image,
    engine_name = engine,
    host = 'unix://' .. socket,
    user = uid and (uid .. ':' .. gid) or nil,   -- nil: a uid and gid of its own per sandbox
    uid = tonumber(uid),
    gid = tonumber(gid),
    cpus = cpus,
    workspace_mib = check.int(options.workspace_mib, 'workspace_mib', 1, 1048576, C, 3, 1024),
    tmp_mib = check.int(options.tmp_mib, 'tmp_mib', 1, 1048576, C, 3, 256),
    memory_mib = check.int(options.memory_mib, 'memory_mib', 6, 16 * 1048576, C, 3, 1024),
    pids = check.int(options.pids, 'pids', 8, 4194304, C, 3, 256),
    read_only_root = options.read_only_root ~= false,
    max_lifetime_ms = check.int(options.max_lifetime_ms, 'max_lifetime_ms', 1, 366 * 86400000, C, 3, 86400000),
    warm = check.int(options.warm, 'warm', 0, 10000, C, 3, 0),
  }
  if engine == 'cli' then
    if options.docker ~= nil and (type(options.docker) ~= 'string' or options.docker == '') then
      errors.raise(C, 'docker must be the path of the docker CLI', nil, 2)
    end
    local cli = find_in_path(options.docker or 'docker')
    if not cli then errors.raise(C, 'the docker CLI is not installed (or not on the PATH)', nil, 2) end
    p.engine = engines.new('cli', cli, p.host)
  else
    p.engine = engines.new('api', nil, nil, socket)
  end
  if options.runtime ~= nil then
    local rok, rerr = pcall(check_runtime, p, options.runtime, checking)
    if not rok then error(rerr, 2) end
  end
  p.agent = options.agent and absolute(options.agent) or find_agent()
  if not p.agent or not exists(p.agent) then errors.raise(C, 'the sandbox agent is not built (make)', nil, 2) end
  if not plain_path(p.agent) then errors.raise(C, 'the agent path is not usable', nil, 2) end
  local me = my_uid()
  -- an agent that knows --peer-uid serves its socket to this process's uid only (any uid can connect);
  -- an older one makes it 0600 for the sandbox's user, which only root or that same uid can open
  p.peer_uid = uids.agent_takes_peer_uid(p.agent) and me or nil
  if me ~= 0 and me ~= p.uid and not p.peer_uid then
    errors.raise(C, 'run as root, or with user set to this process\'s own uid (' .. tostring(me) .. '): ' ..
      'this sandbox agent cannot serve another uid (rebuild it with make)', nil, 2)
  end
  if p.gvisor and not (read_plain(p.agent) or ''):find('--no-spawner', 1, true) then
    errors.raise(C, 'this sandbox agent cannot run under gVisor (rebuild it with make)', nil, 2)
  end
  p.my_uid = me
  -- an allow-list's proxy listens in the container's namespace, which takes root on the daemon's machine
  -- (under gVisor, commands reach no network of the host's: its own stack has a loopback alone)
  p.allowlist = me == 0 and not p.gvisor
  if p.allowlist then p.features.network[#p.features.network + 1] = 'allowlist' end
  -- the host's rules around the bridge of 'all' take root; as root without the programs there is no
  -- 'all'; as another user (the docker group) 'all' is the bridge alone: enforced.network is false
  p.firewall = me == 0 and fw.docker_tools() or nil
  if me == 0 and not p.firewall then table.remove(p.features.network, 2) end
  -- under gVisor (network 'none' alone) its tmpfs has no inode cap and its sandbox takes no OOM score
  -- (a runtime that refuses one clears oom_protected at the first create); `kernel` is the kernel
  -- that the sandbox's system calls meet
  p.enforced = {
    memory = true, pids = true, cpus = true, workspace_mib = true, tmp_mib = true, lifetime = true,
    network = p.gvisor or p.firewall ~= nil, inodes = not p.gvisor,
    oom_protected = not p.gvisor, kernel = p.gvisor and 'gvisor' or 'host',
  }
  p.run_base = options.run_dir and absolute(options.run_dir) or dirs.run_base(me)
  p.own_fs = me == 0 and not options.run_dir
  if not plain_path(p.run_base) or #p.run_base > 60 then
    errors.raise(C, 'run_dir must be a path of at most 60 bytes', nil, 2)
  end
  return p, checking
end

return M
