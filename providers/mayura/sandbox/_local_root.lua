--- mayura.sandbox._local_root: the file tree of a local sandbox (mayura.sandbox.local).
--
-- The synthesized /etc (passwd, group, hosts, resolv.conf, nsswitch.conf: copies, never binds of
-- the host's files) and the parts of the host's /etc that hold no secrets; the host's /usr and
-- root links a sandbox without an image gets; the checks an image passes and the entries of its
-- top directory a sandbox gets; and the mount tables from which mayura-launch (launcher/launch.c)
-- mounts a sandbox's file systems, or builds its whole root, run as root in a mount namespace of
-- its own over STAGE. Private to the local provider.
local errors = require('mayura.errors')
local host = require('mayura.sandbox._host')

local M = {}

local MIB = 1048576
local MODE_0700 = tonumber('700', 8)
local WORKDIR = '/workspace'
local AGENT_PATH = '/.mayura/agent'
M.WORKDIR, M.AGENT_PATH = WORKDIR, AGENT_PATH

local await_cb = host.await

local function is_dir(path)
  local st = await_cb(function(cb) require('mayura.core').fs.stat(path, cb) end)
  return st ~= nil and st.type == 'directory'
end

--- The type of `path` itself (a symbolic link is 'link'), or nil.
function M.lstat_type(path)
  local st = require('luv').fs_lstat(path)
  return st and st.type
end
local lstat_type = M.lstat_type

local ETC = {
  passwd = 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/workspace:/bin/sh\n' ..
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n',
  group = 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n',
  hosts = '127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n',
  ['resolv.conf'] = '',
  ['nsswitch.conf'] = 'passwd: files\ngroup: files\nhosts: files dns\n',
}
-- Their order in the launcher's environment (MAYURA_ETC_1..5) and, run as another user, the
-- descriptors bubblewrap copies them from (5..9: pipes mayura-launch writes them to).
local ETC_NAMES = { 'passwd', 'group', 'hosts', 'resolv.conf', 'nsswitch.conf' }

-- Parts of the host's /etc that hold no secrets and that programs need.
local ETC_HOST = { 'alternatives', 'ld.so.cache', 'localtime', 'ssl/certs', 'ca-certificates' }

-- The device nodes of the sandbox's /dev (binds of the host's, or like them), and its links.
local DEVICES = { 'null', 'zero', 'full', 'random', 'urandom', 'tty' }
local DEV_LINKS = { { '/proc/self/fd', 'fd' }, { '/proc/self/fd/0', 'stdin' }, { '/proc/self/fd/1', 'stdout' },
  { '/proc/self/fd/2', 'stderr' }, { 'pts/ptmx', 'ptmx' } }

-- Run as root, the launcher mounts the sandbox's file systems here, in a mount namespace of its
-- own: the host sees only an empty directory owned by root.
local STAGE = '/run/mayura'

-- Where native snapshots are kept (launcher/snapshot.c's SNAPROOT): a tmpfs of root's alone, beside
-- STAGE, holding a tmpfs of each snapshot. Every launcher takes it off its own mount namespace once
-- its mounts are made (`detach`), so a sandbox holds only the snapshot it was made from.
local SNAPROOT = '/run/mayura-snap'

-- A writable place of a sandbox (`opts`: a tmpfs's options, as an fstab line's) at `target`: its
-- tmpfs; with a native snapshot (`snap`: { dir, uid }) an overlay whose lower layer is the
-- snapshot's copy of the place (`name` in its directory) and whose upper one is that tmpfs.
local function place(target, opts, snap, name)
  if snap then return ('overlay %s/%s %s %s %d'):format(snap.dir, name, target, opts, snap.uid) end
  return ('mayura %s tmpfs %s 0 0'):format(target, opts)
end

local function lstat(path)
  local uv = require('luv')
  local err, st = await_cb(function(cb) uv.fs_lstat(path, cb) end)
  if err then return nil, err end
  return st
end

local function bit(n, b) return math.floor(n / b) % 2 == 1 end

-- Makes STAGE when it is missing; refuses it unless it is a directory (not a link) owned by root
-- that nobody else may write.
function M.make_stage()
  local uv = require('luv')
  await_cb(function(cb) uv.fs_mkdir(STAGE, MODE_0700, cb) end)   -- already there is fine
  local st = lstat(STAGE)
  if not st or st.type ~= 'directory' or st.uid ~= 0 or bit(st.mode, 16) or bit(st.mode, 2) then
    errors.raise('INVALID_CONFIG', STAGE .. ' must be a directory owned by root that only root may write', nil, 3)
  end
  return true
end

-- tmpfs options: `bytes`, one inode per 4 KiB page (every file with data takes a page anyway, so
-- only empty files, directories and links can run out of inodes before the bytes run out), `mode`.
local function tmpfs_options(bytes, mode)
  return ('size=%d,nr_inodes=%d,mode=%s'):format(bytes, math.max(64, math.floor(bytes / 4096)), mode)
end

-- The mount table of the provider's sandboxes whose tree bubblewrap makes (with an image a table
-- cannot name): their file systems under STAGE. mayura-launch reads it whole before the first line
-- mounts a small tmpfs over STAGE (in which the others make their directories), and so hide it.
-- X-mayura.own: mayura-launch gives that root to the sandbox's uid.
-- `snap`: a native snapshot the workspace and /tmp start from (place).
function M.fstab_lines(agent_bytes, workspace_mib, tmp_mib, snap)
  return {
    ('mayura %s tmpfs size=65536,nr_inodes=16,mode=0755 0 0'):format(STAGE),
    ('mayura %s/root tmpfs %s,X-mount.mkdir,X-mayura.own 0 0'):format(STAGE, tmpfs_options(agent_bytes + MIB, '0755')),
    place(STAGE .. '/w', tmpfs_options(workspace_mib * MIB, '0755') .. ',X-mount.mkdir,X-mayura.own', snap,
      WORKDIR:sub(2)),
    place(STAGE .. '/t', tmpfs_options(tmp_mib * MIB, '1777') .. ',X-mount.mkdir', snap, 'tmp'),
    ('mayura %s/s tmpfs %s,X-mount.mkdir 0 0'):format(STAGE, tmpfs_options(tmp_mib * MIB, '1777')),
    ('devpts %s/pts devpts newinstance,ptmxmode=0666,mode=0620,X-mount.mkdir 0 0'):format(STAGE),
    'detach ' .. SNAPROOT,
  }
end

-- The mount table with which mayura-launch builds the whole root of a sandbox (launcher/mount.c's
-- steps), for bubblewrap to bind as one: bubblewrap's own binds each read the mount table back
-- and remount what they bound, a cost that grows with every bind. Without an image, the same tree
-- bubblewrap would make: /usr and the host's /etc files bound read-only, copies of the /etc texts;
-- with one, each entry of the image's top directory bound read-only (its links made alike), so an
-- image needs no mount point of ours. Then the agent's copy, device nodes of its own, capped tmpfs
-- for /dev/shm, /tmp and the workspace; the root and /dev read-only. Mounts made in the host's user
-- namespace come into the sandbox's locked: it cannot make them writable, nor take them off.
-- `tree(add, R)` adds the steps of the root's own entries.
local function built_lines(agent_bytes, workspace_mib, tmp_mib, tree, snap)
  local R = STAGE .. '/root'
  local lines = {
    ('mayura %s tmpfs size=65536,nr_inodes=16,mode=0755 0 0'):format(STAGE),
    ('mayura %s tmpfs %s,nosuid,nodev,X-mount.mkdir,X-mayura.own 0 0'):format(R,
      tmpfs_options(agent_bytes + MIB, '0755')),
  }
  local function add(...) lines[#lines + 1] = table.concat({ ... }, ' ') end
  tree(add, R)
  add('dir', R .. '/.mayura')
  add('agent', R .. AGENT_PATH)
  add('dir', R .. '/proc')
  add(('mayura %s/dev tmpfs size=65536,nr_inodes=64,mode=0755,nosuid,X-mount.mkdir 0 0'):format(R))
  for _, d in ipairs(DEVICES) do add('node', d, R .. '/dev/' .. d) end
  for _, l in ipairs(DEV_LINKS) do add('link', l[1], R .. '/dev/' .. l[2]) end
  add(('devpts %s/dev/pts devpts newinstance,ptmxmode=0666,mode=0620,nosuid,noexec,X-mount.mkdir 0 0'):format(R))
  add(('mayura %s/dev/shm tmpfs %s,nosuid,nodev,X-mount.mkdir 0 0'):format(R, tmpfs_options(tmp_mib * MIB, '1777')))
  add('ro', R .. '/dev', 'nosuid')
  add(place(R .. '/tmp', tmpfs_options(tmp_mib * MIB, '1777') .. ',nosuid,nodev,X-mount.mkdir', snap, 'tmp'))
  add(place(R .. WORKDIR, tmpfs_options(workspace_mib * MIB, '0755') .. ',nosuid,nodev,X-mount.mkdir,X-mayura.own',
    snap, WORKDIR:sub(2)))
  add('ro', R, 'nosuid,nodev')
  add('detach', SNAPROOT)
  return lines
end

-- The directories of the host's root a sandbox without an image gets as the host has them: a link
-- into /usr, or a directory bound read-only.
local ROOT_DIRS = { 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32' }

-- The host's part of the tree of a sandbox without an image, one step each, for whichever makes the
-- tree (host_tree for mayura-launch, bwrap_argv for bubblewrap): { 'bind', SRC, PATH } read-only,
-- { 'link', TARGET, PATH }, { 'dir', PATH }, { 'file', N, PATH } (a copy of the /etc text N of
-- ETC_NAMES). /etc holds copies, never binds of host files, but for the parts named in ETC_HOST
-- (bound from the path each names, p.etc_host).
function M.host_steps(p)
  local steps = { { 'bind', '/usr', '/usr' } }
  local function add(step) steps[#steps + 1] = step end
  for _, d in ipairs(ROOT_DIRS) do
    local t = p.root_links[d]
    if t == 'symlink' then add({ 'link', 'usr/' .. d, '/' .. d })
    elseif t == 'directory' then add({ 'bind', '/' .. d, '/' .. d }) end
  end
  add({ 'dir', '/etc' })
  for i, name in ipairs(ETC_NAMES) do add({ 'file', i, '/etc/' .. name }) end
  local made = {}
  for _, name in ipairs(ETC_HOST) do
    if p.etc_host[name] then
      local parent = name:match('^(.+)/[^/]+$')
      if parent and not made[parent] then
        made[parent] = true
        add({ 'dir', '/etc/' .. parent })
      end
      add({ 'bind', p.etc_host[name], '/etc/' .. name })
    end
  end
  return steps
end

-- The tree of a sandbox without an image, as mayura-launch's steps (host_steps under R).
function M.host_tree(p)
  return function(add, R)
    for _, st in ipairs(M.host_steps(p)) do
      if st[1] == 'dir' then add('dir', R .. st[2])
      elseif st[1] == 'file' then add('file', R .. st[3], tostring(st[2]))
      else add(st[1], st[2], R .. st[3]) end
    end
  end
end

-- A name or link target a mount table line can hold (its fields are split at blanks).
local function table_word(s)
  return type(s) == 'string' and s ~= '' and not s:find('[%s%c]')
end

-- The entries of an image's top directory the sandbox gets, as { name, type, link target }, in
-- order; nil when the image cannot go into a mount table (a blank in its path). Only names and
-- link texts come from here: the launcher finds each entry again beneath the image's directory,
-- never through a link (launcher/mount.c's open_image). What the sandbox
-- has of its own (/dev, /proc, /tmp, the agent's directory, the workspace) is not taken from it,
-- nor what is neither a directory, a file nor a link, nor a name a table cannot hold.
local function image_entries(image)
  local uv = require('luv')
  if not table_word(image) then return nil end
  local own = { dev = true, proc = true, tmp = true, ['.mayura'] = true, [WORKDIR:sub(2)] = true }
  local dir = uv.fs_scandir(image)
  if not dir then return nil end
  local out = {}
  while true do
    local name = uv.fs_scandir_next(dir)
    if not name then break end
    if not own[name] and table_word(name) then
      local t = lstat_type(image .. '/' .. name)
      local target = t == 'link' and uv.fs_readlink(image .. '/' .. name) or nil
      if t == 'directory' or t == 'file' or (t == 'link' and table_word(target)) then
        out[#out + 1] = { name, t, target }
      end
    end
  end
  table.sort(out, function(a, b) return a[1] < b[1] end)
  return out
end

-- The tree of a sandbox with an image: the image's directory, opened once by the launcher, then its
-- top entries (image_entries), each bound by its name beneath that directory; with 'all', the
-- stack's resolver (MAYURA_ETC_4) over the image's resolv.conf when that is a file of a directory
-- /etc (the launcher checks both again, and follows no link to them).
local function image_tree(image, entries, network_all)
  return function(add, R)
    local etc_dir = false
    add('image', image)
    for _, e in ipairs(entries) do
      if e[2] == 'link' then add('link', e[3], R .. '/' .. e[1])
      else add('bind', e[1], R .. '/' .. e[1]) end
      if e[1] == 'etc' and e[2] == 'directory' then etc_dir = true end
    end
    if network_all and etc_dir and lstat_type(image .. '/etc/resolv.conf') == 'file' then
      add('file', STAGE .. '/resolv.conf', '4')
      add('over', STAGE .. '/resolv.conf', R .. '/etc/resolv.conf')
    end
  end
end

-- The bytes a mount table may have (launcher/mount.c's TABLE_MAX, less one).
local TABLE_MAX = 32767

-- A mount table's text, or nil past TABLE_MAX. It goes to each launcher on a descriptor of its own
-- (a sealed file in memory, core.sealed_fd: start), never through a file another create, or
-- anyone, could name, replace or leave behind.
function M.table_text(lines)
  local text = table.concat(lines, '\n') .. '\n'
  return #text <= TABLE_MAX and text or nil
end

local stage_ok

-- Whether the launcher can mount tmpfs in a mount namespace of its own here (asked once).
function M.stage_works()
  if stage_ok == nil then
    local ok, r = pcall(require('mayura.process').run,
      { 'unshare', '--mount', '--propagation', 'private', 'mount', '-t', 'tmpfs', '-o', 'size=4096,nr_inodes=16',
        'mayura', STAGE },
      { env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' } })
    stage_ok = ok and r.exit_code == 0
  end
  return stage_ok
end

-- Checks an image, the provider's or a create's, and returns it: the absolute path of a directory,
-- neither the host's root nor one that holds mayura's own files (p.own_files: the checkout or the
-- installed tree); run as root, also named without a link, `.` or `..` at any name, and it and
-- every directory above it owned by root and writable by nobody else (what sshd asks of the
-- directories of its keys): so nobody but root can point the path, or any name the launcher finds
-- beneath it, elsewhere while a sandbox starts. INVALID_CONFIG otherwise.
function M.check_image(p, image, level)
  local uv = require('luv')
  local function refuse(why)
    errors.raise('INVALID_CONFIG', 'image ' .. why, nil, level > 0 and level + 1 or 0)
  end
  if type(image) ~= 'string' or image:sub(1, 1) ~= '/' or not is_dir(image) then
    refuse('must be the absolute path of a root file system directory')
  end
  if p.root then
    local path = ''
    local function check_dir(at)
      local st = uv.fs_lstat(at)
      if not st or st.type ~= 'directory' then
        refuse('must be named without a link: ' .. at .. ' is a link or no directory')
      end
      if st.uid ~= 0 or bit(st.mode, 16) or bit(st.mode, 2) then
        refuse('and every directory above it must be owned by root and writable by nobody else: ' .. at ..
          ' is not')
      end
    end
    check_dir('/')
    for name in image:gmatch('[^/]+') do
      if name == '.' or name == '..' then refuse('must be named without . or ..') end
      path = path .. '/' .. name
      check_dir(path)
    end
  end
  local real = uv.fs_realpath(image)
  if not real or real == '/' then refuse('must not be the host\'s root') end
  for _, f in pairs(p.own_files) do
    local rf = uv.fs_realpath(f)
    if rf and (rf == real or rf:sub(1, #real + 1) == real .. '/') then
      refuse('must not hold mayura\'s own files (' .. f .. ')')
    end
  end
  return image
end

--- The mount table (its text) from which mayura-launch builds the sandbox's whole root
-- (built_lines), bubblewrap binding it as one; nil when bubblewrap makes the tree (not root here,
-- an image a table cannot name or hold).
-- `spec.snapshot`: the native snapshot (local.lua's) the sandbox starts from.
function M.built_table(p, spec)
  if not p.root_table then return nil end
  local image = spec.image or p.image
  local snap = spec.snapshot
  if not image then
    if not snap then return p.root_table end
    return M.table_text(built_lines(#(p.agent_host_bytes or p.agent_bytes), p.workspace_mib, p.tmp_mib,
      M.host_tree(p), snap))
  end
  local entries = image_entries(image)
  if not entries then return nil end
  return M.table_text(built_lines(#p.agent_bytes, p.workspace_mib, p.tmp_mib,
    image_tree(image, entries, spec.network == 'all'), snap))
end

--- The mount table of a sandbox without an image, which mayura-launch builds whole (made once).
function M.host_table(p, agent_bytes)
  return M.table_text(built_lines(agent_bytes, p.workspace_mib, p.tmp_mib, M.host_tree(p)))
end

M.ETC, M.ETC_NAMES, M.ETC_HOST, M.ROOT_DIRS, M.DEVICES, M.DEV_LINKS, M.STAGE, M.SNAPROOT =
  ETC, ETC_NAMES, ETC_HOST, ROOT_DIRS, DEVICES, DEV_LINKS, STAGE, SNAPROOT

return M
