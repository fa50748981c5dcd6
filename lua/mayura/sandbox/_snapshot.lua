--- mayura.sandbox._snapshot: snapshots of a sandbox's files, the generic way every provider has.
--
-- The pool (mayura.sandbox) checks and counts snapshots; this module makes and restores them
-- through a backend's ordinary calls, so it works on any provider whose sandbox has `sh` and `tar`
-- (GNU or BusyBox):
--
--   capture(call, o): in the sandbox, `tar -c` of what is in each of `o.paths` (its working
--     directory and /tmp), leaving out the names under /tmp that start with `.mayura-` (the
--     backends' own) and /tmp/.X11-unix (a desktop's display), written to the command's
--     stdout (no file in the sandbox, so a full disk does not stop it) and cut after
--     `o.max_bytes` (past them LIMIT_EXCEEDED: tar ends at its next write, however much it had
--     left). Through the agent (a backend with `binary_streams`) the bytes come as a streamed
--     exec's output, which the agent passes on without holding it; through any other backend,
--     as one line of base64. The archive is kept in the host process's memory only. tar runs
--     as the sandbox's user: the archive holds what that user can read, links as links, and
--     no host path. A tar that fails (a file it cannot read, one changed as it was read) fails
--     the snapshot, and nothing was made.
--   restore(call, snap, o): unpacks the archive in the new sandbox from `/` (as that sandbox's
--     user, umask 0, modes kept): through the agent on the command's standard input, else
--     written to a file in its /tmp first and removed after. The host never unpacks the
--     archive nor follows a name in it; what a hostile archive could do, it does inside the
--     new sandbox, as its user, which that user could do anyway.
--
-- BusyBox's tar sets a directory's mode as it makes it, so a directory without the owner's write
-- bit could not receive its files, and leaves a directory the time its last entry was unpacked
-- at: before the archive is written into the new sandbox, its directory headers lacking that bit
-- get it (the header's checksum made again), and once it is unpacked a script written beside it
-- puts the real modes back (`chmod`, deepest first) and every directory's time (`touch -t`).
-- Reading the headers is the only parsing the host does, and it only ever changes mode bits: a
-- header it does not understand ends the walk, and the archive goes as it is.
--
-- `call(name, ...)` is the caller's way to a backend method (the pool's, with its deadline and
-- its errors).
local core = require('mayura.core')
local errors = require('mayura.errors')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local MIB = 1048576
local BLOCK = 512

--- The most one generic snapshot holds: the agent's cap of one exec's output (core/wire.h's frame
-- of 1 GiB, halved), with room to spare.
M.MAX_BYTES = 511 * MIB
--- The same through a backend whose exec output is text, once in base64.
M.MAX_TEXT_BYTES = 383 * MIB

local q = scripts.quote

-- {======================================================
-- The snapshot object
-- =======================================================

local Snapshot = {}
Snapshot.__index = Snapshot

--- A snapshot of `pool`: `{ id, size_bytes, provider }` and `release()`. `held` is what the pool
-- keeps of it (the archive, or the provider's own snapshot).
function M.new(pool, id, size_bytes, provider_id, held)
  return setmetatable({ id = id, size_bytes = size_bytes, provider = provider_id, _pool = pool, _held = held,
    _released = false }, Snapshot)
end

--- Whether `v` is a snapshot object.
function M.is(v)
  return type(v) == 'table' and getmetatable(v) == Snapshot
end

--- Releases the snapshot: the pool forgets it and frees its room. Releasing again does nothing.
function Snapshot:release()
  if self._released then return end
  self._pool:_release_snapshot(self)
end

-- }======================================================

-- {======================================================
-- Reading the archive's headers
-- =======================================================

-- An octal or base-256 number field of a header (bytes `at`..`at + len - 1`), or nil.
local function number_field(h, at, len)
  local first = h:byte(at)
  if first >= 128 then
    local n = first - 128
    for i = at + 1, at + len - 1 do n = n * 256 + h:byte(i) end
    return n
  end
  local digits = h:sub(at, at + len - 1):match('^[ %z]*([0-7]*)')
  if digits == nil then return nil end
  if digits == '' then return 0 end
  return tonumber(digits, 8)
end

local function cstring(s)
  return (s:match('^[^%z]*'))
end

-- The value of `key` in a pax header's records (`<len> key=value\n`, each counting its own bytes).
local function pax_value(body, key)
  local at = 1
  while at <= #body do
    local len = body:match('^(%d+) ', at)
    len = len and tonumber(len)
    if not len or len < 1 or at + len - 1 > #body then return nil end
    local k, v = body:sub(at, at + len - 1):match('^%d+ ([^=]*)=(.*)\n$')
    if k == key then return v end
    at = at + len
  end
  return nil
end

-- A header with `mode` in place of its own, its checksum made again.
local function with_mode(h, mode)
  h = h:sub(1, 100) .. string.format('%07o', mode) .. '\0' .. h:sub(109, 148) .. '        ' .. h:sub(157)
  local sum = 0
  for i = 1, BLOCK do sum = sum + h:byte(i) end
  return h:sub(1, 148) .. string.format('%06o', sum) .. '\0 ' .. h:sub(157)
end

local OWNER_WRITE = 128   -- 0200

--- The directories of `archive`: returns the archive with the owner's write bit added to the
-- header of each directory that lacks it, the list `{ { name, mode } }` of those directories' real
-- modes, and the list `{ { name, mtime } }` of every directory's time (BusyBox's tar leaves a
-- directory the time its last entry was unpacked at).
function M.directories(archive)
  local pieces, modes, times, at, last = {}, {}, {}, 1, 1
  local long_name, pax_path
  while at + BLOCK - 1 <= #archive do
    local h = archive:sub(at, at + BLOCK - 1)
    if not h:find('[^%z]') then break end   -- the end of the archive
    local size, mode, mtime = number_field(h, 125, 12), number_field(h, 101, 8), number_field(h, 137, 12)
    if not size or not mode or not mtime then break end
    local flag = h:sub(157, 157)
    local data_at = at + BLOCK
    if flag == 'L' then
      long_name = cstring(archive:sub(data_at, data_at + size - 1))
    elseif flag == 'x' then
      pax_path = pax_value(archive:sub(data_at, data_at + size - 1), 'path') or pax_path
    elseif flag ~= 'g' and flag ~= 'K' then   -- (a global pax header, a GNU long link name: not names)
      if flag == '5' then
        local name = pax_path or long_name
        if not name then
          name = cstring(h:sub(1, 100))
          local prefix = h:sub(258, 263) == 'ustar\0' and cstring(h:sub(346, 500)) or ''
          if prefix ~= '' then name = prefix .. '/' .. name end
        end
        name = name:gsub('/+$', '')
        if name ~= '' then
          times[#times + 1] = { name = name, mtime = mtime }
          if mode % 256 < OWNER_WRITE then
            modes[#modes + 1] = { name = name, mode = mode % 4096 }
            pieces[#pieces + 1] = archive:sub(last, at - 1)
            pieces[#pieces + 1] = with_mode(h, mode % 4096 + OWNER_WRITE)
            last = at + BLOCK
          end
        end
      end
      long_name, pax_path = nil, nil
    end
    at = data_at + math.ceil(size / BLOCK) * BLOCK
  end
  if #modes == 0 then return archive, modes, times end
  pieces[#pieces + 1] = archive:sub(last)
  return table.concat(pieces), modes, times
end

-- The script that gives the unpacked directories their modes (deepest first) and times (those of a
-- time together, in UTC), run from /.
local function fixup_script(modes, times)
  local lines = { 'TZ=UTC0', 'export TZ' }
  table.sort(modes, function(a, b) return #a.name > #b.name end)
  for _, f in ipairs(modes) do
    lines[#lines + 1] = ('chmod -- %04o %s || exit 1'):format(f.mode, q(f.name))
  end
  local by_time, order = {}, {}
  for _, t in ipairs(times) do
    if t.mtime >= 0 and t.mtime < 253402300800 then   -- what touch -t can say (years to 9999)
      local stamp = os.date('!%Y%m%d%H%M.%S', t.mtime)
      if not by_time[stamp] then
        by_time[stamp] = {}
        order[#order + 1] = stamp
      end
      table.insert(by_time[stamp], q(t.name))
    end
  end
  for _, stamp in ipairs(order) do
    local names = by_time[stamp]
    for i = 1, #names, 64 do
      lines[#lines + 1] = 'touch -c -t ' .. stamp .. ' -- ' .. table.concat(names, ' ', i, math.min(i + 63, #names))
        .. ' || exit 1'
    end
  end
  return table.concat(lines, '\n') .. '\n'
end

-- }======================================================

-- {======================================================
-- Capture and restore
-- =======================================================

-- `sh -c CAPTURE sh limit path...`: the names in each path (hidden ones too; under /tmp not the
-- backends' `.mayura-*`), relative to /, then tar of them to stdout, cut after `limit` bytes (tar
-- then ends at its next write: a sparse file of terabytes is not read to its end), and tar's exit
-- status on stderr. Nothing there: no output.
local CAPTURE = [=[
limit=$1
shift
n=$#
for r in "$@"; do
  cd "$r" 2>/dev/null || continue
  for f in * .[!.]* ..?*; do
    [ -e "$f" ] || [ -h "$f" ] || continue
    case "$r/$f" in /tmp/.mayura-*|/tmp/.X11-unix) continue ;; esac
    set -- "$@" "${r#/}/$f"
  done
done
shift "$n"
[ "$#" -gt 0 ] || { echo 'tar=0' >&2; exit 0; }
cd / || exit 1
{ tar -cf - "$@" 2>/dev/null; echo "tar=$?" >&2; } | head -c "$limit" ]=]

-- CAPTURE's end for a backend whose exec output is text: the archive as base64 on one line.
local TEXT = [=[ | base64 | tr -d '\n'
]=]

-- `sh -c RESTORE sh archive chmods path...`: first empties each path (but what CAPTURE leaves out; a
-- directory its owner cannot write made writable first, no link followed), then unpacks the
-- archive from / (none when ''), removes what it was given, then runs the modes and times script
-- (none when '').
local RESTORE = [=[
a=$1
fix=$2
shift 2
for r in "$@"; do
  cd "$r" 2>/dev/null || continue
  for f in * .[!.]* ..?*; do
    [ -e "$f" ] || [ -h "$f" ] || continue
    case "$r/$f" in /tmp/.mayura-*|/tmp/.X11-unix) continue ;; esac
    [ -h "$f" ] || chmod -R u+w -- "$f" 2>/dev/null
    rm -rf -- "$f" || exit 1
  done
done
umask 0
cd / || exit 1
s=0
if [ -n "$a" ]; then
  tar -xpf "$a"; s=$?
  [ "$a" = - ] || rm -f -- "$a"
fi
if [ -n "$fix" ]; then
  if [ "$s" = 0 ]; then sh "$fix" || s=1; fi
  rm -f -- "$fix"
fi
exit "$s"
]=]

local function random_hex(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(n)
  if f then f:close() end
  if not bytes or #bytes ~= n then bytes = tostring(os.time()) .. tostring(math.random()):sub(3) end
  return (bytes:sub(1, n):gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end
M.random_hex = random_hex

--- The paths a generic snapshot keeps: the provider's `snapshot_paths` (absolute directories), or
-- its working directory and /tmp; one inside another is kept once.
function M.paths(provider, workdir)
  local given = type(provider.snapshot_paths) == 'table' and provider.snapshot_paths or { workdir, '/tmp' }
  local list = {}
  for _, p in ipairs(given) do
    if type(p) == 'string' and p:sub(1, 1) == '/' and p ~= '/' and not p:find('%z') then
      list[#list + 1] = (p:gsub('/+$', ''))
    end
  end
  local out = {}
  for _, p in ipairs(list) do
    local inside = false
    for _, o in ipairs(list) do
      if o ~= p and p:sub(1, #o + 1) == o .. '/' then inside = true end
    end
    for _, o in ipairs(out) do inside = inside or o == p end
    if not inside then out[#out + 1] = p end
  end
  return out
end

-- One try of capture: the archive, or false when tar failed.
local function capture_once(call, o)
  local most = o.binary and M.MAX_BYTES or M.MAX_TEXT_BYTES
  local cap = math.min(o.max_bytes, most)
  local argv = { 'sh', '-c', o.binary and CAPTURE or (CAPTURE .. TEXT), 'sh', tostring(cap + 1) }
  for _, p in ipairs(o.paths) do argv[#argv + 1] = p end
  local eo = { timeout_ms = o.timeout_ms, max_output_bytes = cap + 1 }
  if o.binary then
    eo.on_output = function() end
  else
    eo.max_output_bytes = 4 * math.ceil((cap + 1) / 3) + 64
  end
  local res = call('exec', argv, eo)
  if type(res) ~= 'table' or type(res.stdout) ~= 'string' then
    error(errors.sandbox('failed', 'the provider returned an invalid exec result'), 0)
  end
  local archive = res.stdout
  if not o.binary and not res.truncated then
    archive = core.base64.decode(archive) or error(errors.sandbox('failed', 'the sandbox\'s archive is not base64'), 0)
  end
  if res.truncated or #archive > cap then
    if cap < o.max_bytes then
      error(errors.new('LIMIT_EXCEEDED', 'the sandbox\'s files are more than a snapshot holds ('
        .. most .. ' bytes)'), 0)
    end
    error(errors.new('LIMIT_EXCEEDED', 'the sandbox\'s files are more than max_snapshot_bytes leaves room for ('
      .. o.max_bytes .. ' bytes)'), 0)
  end
  if res.timed_out then
    error(errors.sandbox('timeout', 'the snapshot took longer than ' .. o.timeout_ms .. ' ms'), 0)
  end
  if res.exit_code ~= 0 or type(res.stderr) ~= 'string' or not ('\n' .. res.stderr):find('\ntar=0\n', 1, true)
    or #archive % BLOCK ~= 0 then
    return false
  end
  return archive
end

--- Archives the files of `o.paths` in the sandbox; returns the archive (at most `o.max_bytes`).
-- `o.timeout_ms` bounds the command; `o.binary`: the backend's exec passes any bytes on (the
-- agent's, streamed: the agent holds none of it); else the archive comes as base64 text. A tar
-- that fails is tried again, three times in all (a file that a process removed between the
-- listing and its reading fails it; one that stays unreadable fails every try).
function M.capture(call, o)
  for _ = 1, 3 do
    local archive = capture_once(call, o)
    if archive then return archive end
  end
  error(errors.sandbox('failed', 'the sandbox\'s files could not be archived (one it cannot read, or one '
    .. 'changed while it was read)'), 0)
end

-- An unpacking command's result, checked: a timeout, no room (LIMIT_EXCEEDED) or any other
-- failure (tar's own words are only looked at, and kept as the error's cause with `keep_cause`).
local function unpacked(res, timeout_ms, keep_cause)
  if type(res) ~= 'table' then
    error(errors.sandbox('failed', 'the provider returned an invalid exec result'), 0)
  end
  if res.timed_out then
    error(errors.sandbox('timeout', 'unpacking the snapshot took longer than ' .. timeout_ms .. ' ms'), 0)
  end
  if res.exit_code ~= 0 then
    local text = type(res.stderr) == 'string' and res.stderr or ''
    if text:find('No space left', 1, true) or text:find('Disk quota', 1, true) then
      error(errors.new('LIMIT_EXCEEDED', 'the new sandbox has no room for the snapshot\'s files'), 0)
    end
    error(errors.sandbox('failed', 'the snapshot could not be unpacked in the new sandbox',
      keep_cause and text or nil), 0)
  end
end

--- Unpacks `archive` in a new sandbox (see the module's comment). `o.timeout_ms` bounds it;
-- `o.binary`: the archive goes on the exec's standard input, else through a file in /tmp;
-- `o.wipe`: the paths to empty first (a sandbox going back to a snapshot of its own).
function M.restore(call, archive, o)
  local wipe = o.wipe or {}
  if archive == '' and #wipe == 0 then return end
  local data, modes, times = M.directories(archive)
  local base = '/tmp/.mayura-restore-' .. random_hex(8)
  local function room(err)
    if errors.is(err, 'LIMIT_EXCEEDED') then
      return errors.new('LIMIT_EXCEEDED', 'the new sandbox has no room for the snapshot\'s files')
    end
    return err
  end
  local ok, err
  -- the script first: it is small, and the archive may fill /tmp
  local script = ''
  if #modes > 0 or #times > 0 then
    script = base .. '.sh'
    ok, err = pcall(call, 'write_file', script, fixup_script(modes, times))
    if not ok then error(room(err), 0) end
  end
  local eo = { timeout_ms = o.timeout_ms, max_output_bytes = 65536 }
  local argv = { 'sh', '-c', RESTORE, 'sh', '-', script }
  for _, p in ipairs(wipe) do argv[#argv + 1] = p end
  if archive == '' then
    argv[5] = ''
  elseif o.binary then
    eo.stdin = data   -- through the agent's pipe: no copy of the archive in the sandbox's /tmp
  else
    argv[5] = base .. '.tar'
    ok, err = pcall(call, 'write_file', argv[5], data)
    if not ok then
      if script ~= '' then pcall(call, 'remove_file', script, { recursive = false }) end
      error(room(err), 0)
    end
  end
  unpacked(call('exec', argv, eo), o.timeout_ms)
end

-- {======================================================
-- A snapshot as files a provider keeps (the Docker provider's image)
-- =======================================================

--- What a provider keeps to start sandboxes from `archive` without moving it again: `{ tar, script }`,
-- the archive as restore unpacks it (directories writable while unpacked) and the script that
-- then gives the directories their modes and times ('' when there is nothing to do).
function M.prepared(archive)
  local data, modes, times = M.directories(archive)
  local script = (#modes > 0 or #times > 0) and fixup_script(modes, times) or ''
  return { tar = data, script = script }
end

-- `sh -c UNPACK sh archive script`: unpacks a prepared archive (a file in the sandbox, which it
-- only reads) from /, as the sandbox's user with modes kept, then runs the modes and times script.
local UNPACK = [=[
umask 0
cd / || exit 1
tar -xpf "$1" || exit 1
[ -z "$2" ] || . "$2"
]=]

--- Unpacks a prepared archive that is a file in the new sandbox already (`tar_path`, and
-- `script_path` or nil: see prepared), as restore does. `o.timeout_ms` bounds it.
function M.unpack_file(call, tar_path, script_path, o)
  -- tar's words are kept as the cause (for logs), never the message
  unpacked(call('exec', { 'sh', '-c', UNPACK, 'sh', tar_path, script_path or '' },
    { timeout_ms = o.timeout_ms, max_output_bytes = 65536 }), o.timeout_ms, true)
end

-- }======================================================

return M
