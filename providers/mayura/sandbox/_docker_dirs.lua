--- mayura.sandbox._docker_dirs: the host directories of the Docker sandboxes' agent sockets.
--
-- The per-sandbox host directory lives in a base directory of ours (0700;
-- /run/mayura/docker as root, else under XDG_RUNTIME_DIR or /tmp, refused
-- when another user controls a directory above it). As root the default base
-- is a tmpfs of its own (mounted once, under a lock): a container's mount
-- table shows a bind by its path inside the file system it comes from, so a
-- sandbox sees '/agent-<hash>' and '/<expires>-<id>' there, never a path of
-- the host (with another user, or a `run_dir`, it sees the path inside the
-- file system that holds the base: XDG_RUNTIME_DIR is a tmpfs on most
-- hosts). Docker's own storage still shows under runc (the root's overlay
-- options and the binds of /etc/hosts, /etc/hostname and /etc/resolv.conf
-- name /var/lib/docker); under gVisor the mount table is gVisor's own. While the agent starts
-- it is 0703: the container's user may make its socket in it but not list
-- it; once the host has connected and said hello it is 0700, so code in the
-- sandbox cannot store files on the host through it. The agent serves that
-- one connection (an agent that knows `--peer-uid` is told this process's
-- uid and serves its 0666 socket to that uid only, so a user in the docker
-- group, not root, gets sandboxes with uids of their own too; with an older
-- agent such a user must set `user` to its own uid) and unlinks its socket,
-- so code in the sandbox cannot reach it. The directory is removed on
-- release, by the reaper, or, once its name's time (when it expires) is a
-- minute past, by the next create.
-- Private to the Docker provider.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local process = require('mayura.process')
local host_util = require('mayura.sandbox._host')

local M = {}

local MODE_0700 = tonumber('700', 8)
local SWEEP_GRACE_S = 60                   -- a directory is stale this long after its sandbox's end
local await, read_plain, find_in_path, random_hex =
  host_util.await, host_util.read_plain, host_util.find_in_path, host_util.random_hex

--- A luv file call `name` on the loop (a task waits): its result (true for none), or nil and the error.
local function uv_fs(name, ...)
  local uv = require('luv')
  local args, n = { ... }, select('#', ...)
  return task.await(function(done)
    args[n + 1] = function(err, res) done(err == nil and (res == nil and true or res) or nil, err) end
    local ok, e = pcall(uv[name], check.unpack(args, 1, n + 1))
    if not ok or e == nil then done(nil, ok and 'failed' or e) end
  end)
end

-- Removes a per-sandbox directory and what is in it (never following links).
local function remove_dir(dir)
  uv_fs('fs_chmod', dir, MODE_0700)   -- a closed (0555) directory must be opened to empty it
  await(function(cb) core.fs.remove(dir, { recursive = true }, cb) end)
end

local function run_base(uid)
  if uid == 0 then return '/run/mayura/docker' end
  local rt = os.getenv('XDG_RUNTIME_DIR')
  if rt and rt:sub(1, 1) == '/' then return rt .. '/mayura/docker' end
  return '/tmp/mayura-' .. tostring(uid) .. '/docker'
end

-- Whether another user could replace `dir` or what is in it: every directory from `dir` up to the
-- root (links resolved) must be root's or ours, and writable by nobody else unless it is sticky
-- and root's (as /tmp is).
local function others_control(dir, uid)
  local real = uv_fs('fs_realpath', dir)
  if type(real) ~= 'string' then return true end
  local path = real
  while true do
    local st = uv_fs('fs_lstat', path == '' and '/' or path)
    if type(st) ~= 'table' or st.type ~= 'directory' or (st.uid ~= 0 and st.uid ~= uid) then return true end
    local others_write = math.floor(st.mode / 16) % 2 == 1 or math.floor(st.mode / 2) % 2 == 1
    local sticky = math.floor(st.mode / 512) % 2 == 1
    if others_write and not (sticky and st.uid == 0) then return true end
    if path == '' or path == '/' then return false end
    path = path:match('^(.*)/[^/]*$')
  end
end

-- Makes the base directory (0700, ours, not a link, in directories no other user controls); raises
-- INVALID_CONFIG when it cannot be trusted.
local function prepare_base(base, uid)
  local ok = await(function(cb) core.fs.mkdir(base, { mode = MODE_0700 }, cb) end)
  local st = uv_fs('fs_lstat', base)
  if not ok or type(st) ~= 'table' or st.type ~= 'directory' or st.uid ~= uid
    or others_control(base:match('^(.*)/[^/]*$'), uid) then
    errors.raise('INVALID_CONFIG', 'the sandbox socket directory ' .. base .. ' cannot be made or is not ours', nil, 0)
  end
  if st.mode % 64 ~= 0 then uv_fs('fs_chmod', base, MODE_0700) end
end

-- As root, the default base directory is a file system of its own (a tmpfs, mounted once under a
-- lock, so two hosts starting at once never stack two): a bind of a directory or file in it shows in
-- a container's mount table as its name inside that file system alone ('/<expires>-<id>',
-- '/agent-<hash>'), never a path of the host. Returns whether the base is one.
local BASE_FS_OPTIONS = 'mode=0700,size=64m,nr_inodes=262144,nosuid,nodev'
local function own_fs(base)
  local function mounted()
    local st, up = uv_fs('fs_lstat', base), uv_fs('fs_lstat', base .. '/..')
    return type(st) == 'table' and type(up) == 'table' and st.dev ~= up.dev
  end
  if mounted() then return true end
  local flock, mount, mountpoint = find_in_path('flock'), find_in_path('mount'), find_in_path('mountpoint')
  if not (flock and mount and mountpoint) then return false end
  pcall(process.run, { flock, '-w', '10', base .. '.lock', mount, '--no-mtab', '-t', 'tmpfs', '-o',
    BASE_FS_OPTIONS, 'mayura', base }, { timeout_ms = 15000 })
  return mounted()
end

-- The agent as a file of the base directory, named by its SHA-256 (made by a rename, so a file of
-- that name is always whole): what the container binds, instead of the agent's path on the host.
local function stage_agent(base, agent)
  local bytes = read_plain(agent)
  if not bytes or bytes == '' then errors.raise('INVALID_CONFIG', 'the sandbox agent cannot be read', nil, 0) end
  local hex = core.sha256(bytes):gsub('.', function(c) return ('%02x'):format(c:byte()) end)
  local path = base .. '/agent-' .. hex:sub(1, 32)
  local st = uv_fs('fs_lstat', path)
  if type(st) == 'table' and st.type == 'file' and st.size == #bytes then return path end
  local tmp = path .. '.' .. random_hex(6)
  local f = io.open(tmp, 'wb')
  local ok = f and f:write(bytes) and true
  if f then ok = f:close() and ok end
  if not ok or not uv_fs('fs_chmod', tmp, tonumber('555', 8)) or not uv_fs('fs_rename', tmp, path) then
    os.remove(tmp)
    error(errors.sandbox('unavailable', 'cannot place the sandbox agent in the socket directory'), 0)
  end
  return path
end

-- Removes the directories of sandboxes whose lifetime is over (left by a host killed before release).
local function sweep(base)
  local entries = await(function(cb) core.fs.list(base, cb) end)
  if type(entries) ~= 'table' then return end
  local now_s = math.floor(core.now_ms() / 1000)
  for _, e in ipairs(entries) do
    local expires = tonumber((e.name or ''):match('^(%d+)%-mayura%-%x+$'))
    if expires and expires + SWEEP_GRACE_S < now_s then remove_dir(base .. '/' .. e.name) end
  end
end

-- Removes the directories of the sandboxes named in `ids` (a set), whatever their time.
local function remove_dirs_of(base, ids)
  local entries = await(function(cb) core.fs.list(base, cb) end)
  if type(entries) ~= 'table' then return end
  for _, e in ipairs(entries) do
    local id = (e.name or ''):match('^%d+%-(mayura%-%x+)$')
    if id and ids[id] then remove_dir(base .. '/' .. e.name) end
  end
end

M.uv_fs, M.remove_dir, M.run_base, M.prepare_base, M.own_fs, M.stage_agent, M.sweep, M.remove_dirs_of =
  uv_fs, remove_dir, run_base, prepare_base, own_fs, stage_agent, sweep, remove_dirs_of

return M
