--- mayura.sandbox._local_snap: the local provider's native snapshots (features.snapshots 'native').
--
-- `mayura-launch --snapshot` copies a sandbox's workspace and /tmp, in its own mount namespace and
-- as its uid, into a tmpfs of the host's under /run/mayura-snap (_local_root's SNAPROOT); a
-- sandbox made from one mounts an overlay over that copy (_local_root's fstab_lines). This file
-- runs those commands, tells their failures, and keeps each snapshot until it is released and no
-- sandbox is being started from it. Private to the local provider.
local errors = require('mayura.errors')
local task = require('mayura._task')
local process = require('mayura.process')
local host = require('mayura.sandbox._host')
local root_fs = require('mayura.sandbox._local_root')
local snapshots = require('mayura.sandbox._snapshot')

local M = {}

local WORKDIR = root_fs.WORKDIR

-- Runs mayura-launch's snapshot commands; in a loop callback (where nothing may wait) in a task.
local function launch_cmd(p, argv, opts)
  local full = { p.launch_bin }
  for _, a in ipairs(argv) do full[#full + 1] = a end
  return process.run(full, opts or { max_output_bytes = 4096 })
end

local function drop_snapshot(p, name)
  local ok = pcall(launch_cmd, p, { '--snapshot-drop', name })
  if not ok then task.spawn(function() pcall(launch_cmd, p, { '--snapshot-drop', name }) end) end
end

local Snap = {}
Snap.__index = Snap

-- The snapshot's tmpfs goes once it is released and no sandbox is being started from it (a started
-- one holds its own reference, in its mount namespace).
function Snap:_maybe_drop()
  if self.released and self.users == 0 and not self.dropped then
    self.dropped = true
    drop_snapshot(self.provider, self.name)
  end
end

function Snap:release()
  if self.released then return end
  self.released = true
  self:_maybe_drop()
end

--- The snapshot as a tar archive of its files (names relative to the sandbox's /), for
-- `sandbox:restore` (mayura.sandbox._snapshot's restore unpacks it in the sandbox).
function Snap:archive()
  if self.released then error(errors.sandbox('gone', 'the snapshot was released'), 0) end
  local uv = require('luv')
  local names = {}
  for _, place in ipairs({ WORKDIR:sub(2), 'tmp' }) do
    local dir = uv.fs_scandir(self.dir .. '/' .. place)
    while dir do
      local n = uv.fs_scandir_next(dir)
      if not n then break end
      names[#names + 1] = place .. '/' .. n
    end
  end
  if #names == 0 then return '' end
  local argv = { 'tar', '-C', self.dir, '-cf', '-', '--' }
  for _, n in ipairs(names) do argv[#argv + 1] = n end
  local res = process.run(argv, { max_output_bytes = snapshots.MAX_BYTES })
  if res.exit_code ~= 0 or res.truncated then
    error(errors.sandbox('failed', 'the snapshot could not be read back'), 0)
  end
  return res.stdout
end

-- The exit statuses of `mayura-launch --snapshot` (launcher/snapshot.c's SNAP_ ones).
local SNAP_ERRORS = {
  [3] = function(o) return errors.new('LIMIT_EXCEEDED', 'the sandbox\'s files are more than max_snapshot_bytes '
    .. 'leaves room for (' .. o.max_bytes .. ' bytes)') end,
  [4] = function() return errors.sandbox('failed', 'the host has no memory left for the snapshot') end,
  [5] = function() return errors.sandbox('failed', 'the snapshot failed: a file the sandbox\'s user cannot read') end,
  [6] = function() return errors.sandbox('failed', 'the snapshot failed: the sandbox\'s files changed while they '
    .. 'were copied, or the sandbox ended') end,
}

--- A native snapshot (features.snapshots 'native'): the sandbox's workspace and /tmp copied, in
-- one pass in the sandbox's own view and as its user, into a tmpfs of the host's that no sandbox
-- can reach (mayura-launch --snapshot); `{ size_bytes, release, archive }`.
function M.snapshot(self, o)
  local p = self.provider
  if self.released or self.exited or not self.proc then error(errors.sandbox('gone', 'the sandbox has ended'), 0) end
  local name = host.process_mark() .. '-' .. host.random_hex(8)
  local ok, res = pcall(launch_cmd, p, { '--snapshot', tostring(self.proc:pid()), tostring(self.host_uid), name,
    tostring(o.max_bytes), WORKDIR, '/tmp' }, { timeout_ms = o.timeout_ms, max_output_bytes = 4096 })
  if not ok or res.exit_code ~= 0 then
    -- a copy cut by the timeout (or a failure it could not clean up) leaves nothing either
    drop_snapshot(p, name)
    if not ok then error(res, 0) end
    if res.timed_out then
      error(errors.sandbox('timeout', 'the snapshot took longer than ' .. o.timeout_ms .. ' ms'), 0)
    end
    local make = SNAP_ERRORS[res.exit_code]
    if make then error(make(o), 0) end
    error(errors.sandbox('failed', 'the snapshot could not be made', res.stderr), 0)
  end
  local size = tonumber((res.stdout or ''):match('^(%d+)\n$'))
  if not size then
    drop_snapshot(p, name)
    error(errors.sandbox('failed', 'the snapshot could not be made'), 0)
  end
  return setmetatable({ size_bytes = size, provider = p, name = name, dir = root_fs.SNAPROOT .. '/' .. name,
    uid = self.host_uid, released = false, users = 0 }, Snap)
end

-- Whether this kernel can start a sandbox from a native snapshot: overlayfs over an idmapped tmpfs
-- (Linux 6.3 and later). Asked once.
local native_ok
function M.native()
  if native_ok ~= nil then return native_ok end
  native_ok = false
  local major, minor = (require('luv').os_uname().release or ''):match('^(%d+)%.(%d+)')
  major, minor = tonumber(major), tonumber(minor)
  if not major or major < 6 or (major == 6 and minor < 3) then return false end
  local fs = host.read_plain('/proc/filesystems') or ''
  if not fs:find('%soverlay\n') then
    -- a module not loaded yet: loaded by its first mount; modprobe says whether it is there
    local ok, r = pcall(process.run, { 'modprobe', '-q', 'overlay' },
      { env = { PATH = '/usr/sbin:/usr/bin:/sbin:/bin' } })
    if not (ok and r.exit_code == 0) then return false end
  end
  native_ok = true
  return true
end


--- The provider's way of snapshots: 'native' where the launcher mounts the sandbox's file systems
-- (`p.staged`) and the kernel has idmapped tmpfs under overlayfs, else 'generic'; the native
-- snapshots of a host process that is gone are swept first.
function M.kind(p)
  if not (p.staged and M.native()) then return 'generic' end
  pcall(process.run, { p.launch_bin, '--snapshot-sweep' }, { max_output_bytes = 4096 })
  return 'native'
end

--- Runs `start(...)`, holding the snapshot the sandbox is made from until its mounts are made (its
-- overlay holds it from then on): a release meanwhile takes it off the host only after.
function M.hold(snap, start, ...)
  if getmetatable(snap) ~= Snap or snap.released then
    errors.raise('INVALID_INPUT', 'the snapshot is not one of this provider\'s', nil, 0)
  end
  snap.users = snap.users + 1
  local ok, backend = pcall(start, ...)
  snap.users = snap.users - 1
  snap:_maybe_drop()
  if not ok then error(backend, 0) end
  return backend
end

return M
