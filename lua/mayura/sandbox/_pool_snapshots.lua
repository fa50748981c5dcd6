--- mayura.sandbox._pool_snapshots: the pool's side of snapshots.
--
-- `sandbox:snapshot()` and `sandbox:restore(snap)` (mayura.sandbox says what they do): a provider's
-- own snapshot ('native') or an archive made in the sandbox (mayura.sandbox._snapshot), held within
-- the pool's max_snapshots and max_snapshot_bytes, checked as one of the pool's when it is given
-- back (`check`), and forgotten, with its room freed, at its release or the pool's close
-- (`release`). The sandbox's and the pool's methods of the same names are these functions.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local snapshots = require('mayura.sandbox._snapshot')
local checks = require('mayura.sandbox._checks')

local M = {}

local gone, alive, with_deadline, provider_error, bad_reply =
  checks.gone, checks.alive, checks.with_deadline, checks.provider_error, checks.bad_reply

-- A snapshot given to create or restore, checked: one of `pool`'s, not released.
local function check_snapshot(pool, snap, level)
  if not snapshots.is(snap) then
    errors.raise('INVALID_INPUT', 'snapshot must be a snapshot (sandbox:snapshot())', nil, level)
  end
  if snap._pool ~= pool then errors.raise('INVALID_INPUT', 'the snapshot belongs to another pool', nil, level) end
  if snap._released or not pool._snapshots[snap] then
    errors.raise('INVALID_INPUT', 'the snapshot was released', nil, level)
  end
  return snap
end
M.check = check_snapshot

--- Keeps the sandbox's files: `{ id, size_bytes, provider }` with `release()` (see the top of this
-- mayura.sandbox). Counted against the pool's max_snapshots and max_snapshot_bytes until released; with
-- `{ until_release = true }` also released with this sandbox (the tools' checkpoints).
function M.snapshot(self, options)
  local pool = self._pool
  local kind = self.features.snapshots
  options = options == nil and {} or options
  check.keys(options, { until_release = true }, 'snapshot options', 'INVALID_INPUT', 3)
  if options.until_release ~= nil and type(options.until_release) ~= 'boolean' then
    errors.raise('INVALID_INPUT', 'until_release must be a boolean', nil, 2)
  end
  if not kind then errors.raise('INVALID_INPUT', 'this provider makes no snapshots', nil, 2) end
  alive(self)
  if pool._closed then error(errors.sandbox('closed', 'the pool is closed'), 2) end
  if pool._snap_count >= pool.max_snapshots then
    errors.raise('LIMIT_EXCEEDED', 'max_snapshots (' .. pool.max_snapshots .. ') are held', nil, 2)
  end
  -- the slot is taken while the snapshot is made, so that snapshots made at once keep to the limit
  pool._snap_count = pool._snap_count + 1
  -- and the pool makes one at a time, each up to the room the others left: those being made hold at
  -- most max_snapshot_bytes of the host's memory together (not that much each)
  if pool._snap_busy then task.await(function(done) pool._snap_turns[#pool._snap_turns + 1] = done end) end
  pool._snap_busy = true
  local room = pool.max_snapshot_bytes - pool._snap_bytes
  local ok, held, size = pcall(function()
    alive(self)
    if pool._closed then error(errors.sandbox('closed', 'the pool was closed'), 0) end
    local timeout = pool.call_timeout_ms
    -- one held with its sandbox is for going back in it (restore): an archive, whatever the provider
    if kind == 'native' and not options.until_release and type(self._backend.snapshot) == 'function' then
      -- one made after the deadline is released as it comes
      local backend = self._backend
      local made, native = pcall(with_deadline, timeout, function()
        return backend:snapshot({ max_bytes = room, timeout_ms = timeout })
      end, function(late_ok, late)
        if late_ok and type(late) == 'table' and type(late.release) == 'function' then pcall(late.release, late) end
      end)
      if not made then
        if self._released or core.hrtime_ms() >= self._expires_at then error(gone(), 0) end
        error(provider_error(native), 0)
      end
      if type(native) ~= 'table' or not check.is_int(native.size_bytes) or native.size_bytes < 0
        or type(native.release) ~= 'function' then
        if type(native) == 'table' and type(native.release) == 'function' then pcall(native.release, native) end
        error(bad_reply('snapshot'), 0)
      end
      return { native = native }, native.size_bytes
    end
    local archive = snapshots.capture(function(name, ...)
      return self:_call(2 * timeout, name, ...)
    end, { paths = snapshots.paths(pool.provider, self._workdir), max_bytes = room, timeout_ms = timeout,
      binary = self._backend.binary_streams == true })
    return { archive = archive }, #archive
  end)
  pool._snap_count = pool._snap_count - 1
  -- the next one's turn, once this one is counted or gone
  local function next_turn()
    local turn = table.remove(pool._snap_turns, 1)
    if turn then turn() else pool._snap_busy = false end
  end
  local function drop()
    if ok and held.native then pcall(held.native.release, held.native) end
    next_turn()
  end
  if not ok then
    next_turn()
    error(held, 0)
  end
  if pool._closed then
    drop()
    error(errors.sandbox('closed', 'the pool was closed'), 2)
  end
  if pool._snap_count >= pool.max_snapshots then
    drop()
    errors.raise('LIMIT_EXCEEDED', 'max_snapshots (' .. pool.max_snapshots .. ') are held', nil, 2)
  end
  if size > pool.max_snapshot_bytes - pool._snap_bytes then
    drop()
    errors.raise('LIMIT_EXCEEDED', 'the snapshot (' .. size .. ' bytes) is more than max_snapshot_bytes ('
      .. pool.max_snapshot_bytes .. ') leaves room for', nil, 2)
  end
  local snap = snapshots.new(pool, 'snapshot-' .. snapshots.random_hex(8), size,
    type(pool.provider.id) == 'string' and pool.provider.id or 'provider', held)
  pool._snapshots[snap] = true
  pool._snap_count = pool._snap_count + 1
  pool._snap_bytes = pool._snap_bytes + size
  next_turn()
  if options.until_release then
    if self._released then
      pool:_release_snapshot(snap)
      error(gone('the sandbox was released'), 2)
    end
    self._own_snapshots = self._own_snapshots or {}
    self._own_snapshots[snap] = true
  end
  return snap
end

--- Puts the files of `snap` (one of this pool's) back in this sandbox: its working directory and
-- /tmp (the snapshot's places) are emptied first, then hold exactly the snapshot's files. What runs
-- in the sandbox goes on running. A provider's own (native) snapshot goes back only when it can give
-- its files as an archive (`native:archive()`); else it only starts new sandboxes.
function M.restore(self, snap)
  local pool = self._pool
  check_snapshot(pool, snap, 3)
  local held = snap._held
  local native = held.native
  if not held.archive and not (native and type(native.archive) == 'function') then
    errors.raise('INVALID_INPUT', 'this provider\'s snapshots start new sandboxes only', nil, 2)
  end
  alive(self)
  local timeout = pool.call_timeout_ms
  local ok, err = pcall(function()
    -- a provider's own snapshot that can give its files as an archive goes back the generic way
    local archive = held.archive or native:archive()
    if type(archive) ~= 'string' then error(bad_reply('snapshot archive'), 0) end
    return snapshots.restore(function(name, ...)
      return self:_call(2 * timeout, name, ...)
    end, archive, { timeout_ms = timeout, binary = self._backend.binary_streams == true,
    wipe = snapshots.paths(pool.provider, self._workdir) })
  end)
  if not ok then error(err, 0) end
end

--- Ends the sandbox. Every call fails with `gone` from then on; the pool's slot is freed once
-- the provider's release has returned (the sandbox is really over), even when that comes after

-- The pool forgets a snapshot and frees its room (snapshot:release(), close()).
function M.release(self, snap)
  if snap._released then return end
  snap._released = true
  if self._snapshots[snap] then
    self._snapshots[snap] = nil
    self._snap_count = self._snap_count - 1
    self._snap_bytes = self._snap_bytes - snap.size_bytes
  end
  local held = snap._held
  snap._held = nil
  if held and held.native then pcall(held.native.release, held.native) end
end

--- How many snapshots the pool holds, and their bytes together.
function M.count(self)
  return self._snap_count, self._snap_bytes
end

return M
