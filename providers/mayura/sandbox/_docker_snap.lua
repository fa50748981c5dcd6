--- mayura.sandbox._docker_snap: the Docker provider's native snapshots (features.snapshots 'native').
--
-- A snapshot is the sandbox's files (its tmpfs, which `docker commit` misses) archived in it as its
-- user (mayura.sandbox._snapshot), then put into an image the daemon commits from the sandbox's
-- image (`mayura-snapshot:<hex>`, never pushed, labelled with this host process's mark); a sandbox
-- made from one runs that image and unpacks the archive from its layer before it is handed out, so
-- nothing moves through the host again. The image goes when the snapshot is released and no
-- sandbox of it runs; mayura.sandbox._docker_reap sweeps those of a host process that is gone.
-- Private to the Docker provider.
local core = require('mayura.core')
local errors = require('mayura.errors')
local engines = require('mayura.sandbox._docker_engine')
local host_util = require('mayura.sandbox._host')
local snapshots = require('mayura.sandbox._snapshot')
local tar = require('mayura.sandbox._tar')

local M = {}

-- Where a snapshot's image holds its files: the prepared archive and the script of its directories'
-- modes and times (mayura.sandbox._snapshot's prepared), root's and read-only, beside the agent's
-- mount point.
local SNAP_DIR = '.mayura-snapshot'

local Snap = {}
Snap.__index = Snap

-- The image goes once the snapshot is released and no sandbox made from it runs (an image in use
-- would only lose its name, and stay).
function Snap:_maybe_remove()
  if self.released and self.users == 0 and not self.removed then
    self.removed = true
    pcall(self.engine.remove_image, self.engine, self.image)
  end
end

function Snap:release()
  if self.released then return end
  self.released = true
  self.archive_text = nil
  self:_maybe_remove()
end

--- The snapshot's archive, for `sandbox:restore` (unpacked the generic way).
function Snap:archive()
  if self.released then error(errors.sandbox('gone', 'the snapshot was released'), 0) end
  return self.archive_text
end

--- A native snapshot of the sandbox `backend` (its `snapshot(o)` method): the sandbox's files
-- archived in it (the generic way, mayura.sandbox._snapshot: its working directory and /tmp are
-- tmpfs, which `docker commit` does not see), then put into an image the daemon makes from the
-- sandbox's image (`mayura-snapshot:<hex>`, labelled with this host process's mark and its pid
-- namespace, never pushed), which the sandboxes made from it start from by its id (a tag another
-- user of the daemon moved is never used): each unpacks the archive from its own image's layer, and
-- nothing moves through the host again.
function M.take(self, o)
  if self.released or self.closed then error(errors.sandbox('gone', 'the sandbox has ended'), 0) end
  local p = self.provider
  local archive = snapshots.capture(function(name, ...) return self[name](self, ...) end,
    { paths = snapshots.paths(p, p.workdir), max_bytes = o.max_bytes, timeout_ms = o.timeout_ms, binary = true })
  local prep = snapshots.prepared(archive)
  local files = { { name = SNAP_DIR .. '/archive.tar', data = prep.tar, mode = tonumber('444', 8) } }
  if prep.script ~= '' then
    files[2] = { name = SNAP_DIR .. '/fix.sh', data = prep.script, mode = tonumber('444', 8) }
  end
  local tag = host_util.random_hex(8)
  local ref = self.engine:snapshot_image(self.base_image, tar.tar(files, 0), tag,
    { [engines.SNAPSHOT_LABEL] = host_util.process_mark(), [engines.SNAPSHOT_NS_LABEL] = host_util.pid_namespace() },
    math.floor(core.now_ms()) + 600000)
  return setmetatable({ size_bytes = #archive, image = ref, base_image = self.base_image, engine = self.engine,
    script = prep.script ~= '',
    archive_text = archive, users = 0, released = false }, Snap)
end

--- The image a create from `spec.snapshot` runs: the one the snapshot was taken in, with its files.
-- Raises INVALID_INPUT for a snapshot not of this provider, released, or with another image asked.
function M.image_of(snap, spec)
  if getmetatable(snap) ~= Snap or snap.released then
    errors.raise('INVALID_INPUT', 'the snapshot is not one of this provider\'s', nil, 0)
  end
  if spec.image ~= nil and spec.image ~= snap.base_image then
    errors.raise('INVALID_INPUT', 'a sandbox made from a snapshot has the image the snapshot was taken in', nil, 0)
  end
  return snap.image
end

--- Holds `snap` until the sandbox `backend` made from it is gone (its release lets the image go).
function M.hold(backend, snap)
  snap.users = snap.users + 1
  backend.from_snapshot = snap
end

--- The sandbox `backend` is gone: its snapshot's image may go (`let_go` once per hold).
function M.let_go(backend)
  local from = backend.from_snapshot
  if from then
    backend.from_snapshot = nil
    from.users = from.users - 1
    from:_maybe_remove()
  end
end

--- The snapshot's files, from the image's layer into the new sandbox's own places (before it is
-- handed out); a sandbox that ends meanwhile fails the create as `failed`, saying why it may have.
function M.unpack(backend, snap, spec)
  local dir = '/' .. SNAP_DIR .. '/'
  local uok, uerr = pcall(snapshots.unpack_file, function(name, ...) return backend[name](backend, ...) end,
    dir .. 'archive.tar', snap.script and (dir .. 'fix.sh') or nil,
    { timeout_ms = spec.call_timeout_ms or 300000 })
  if not uok then
    if errors.is(uerr, 'SANDBOX_ERROR') and (uerr.reason == 'gone' or uerr.reason == 'unavailable') then
      uerr = errors.sandbox('failed', 'the new sandbox ended while the snapshot was unpacked in it (do its '
        .. 'files fit its memory?)')
    end
    error(uerr, 0)
  end
end

return M
