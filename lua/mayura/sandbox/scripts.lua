--- mayura.sandbox.scripts: POSIX sh scripts that do a sandbox's file calls and
-- stop a command's processes, for providers whose API only runs commands.
--
-- `scripts` (exported as `sandbox_scripts` by mayura.sandbox) is a table of
-- functions that build command strings; every argument is single-quoted (a
-- path never reaches the shell unquoted), and a NUL byte, which no command line
-- can carry, is refused with INVALID_INPUT. The scripts run with dash, bash and
-- BusyBox sh and need, besides the shell's builtins: base64, stat (with -c),
-- dd, od, awk, tr, grep, mkdir, mv, rm, rmdir and ln (coreutils or BusyBox
-- applets). Their standard output is ASCII only (base64, hex and
-- decimal), so a transport that carries text (JSON strings) carries it intact.
--
-- Every script exits 0 when it did its job or found a failure it can name; a
-- failure is a line `E <name>` (`ENOENT`, `EACCES`, `ENOSPC`, `is_directory`,
-- ... the names of the in-sandbox agent's errors, mapped to coded errors by
-- `script_error`, the table the agent's backend maps its replies with too, so the sandbox's own text
-- never reaches a caller). Another
-- exit code means the script could not run (a tool is missing).
--
--   read(path, offset, length)   'F <size>' then base64 of up to `length` bytes from
--                                `offset`; or 'N' (no such file) or an error line
--   write_begin(path, tmp, link) makes the parents and an empty `tmp` (mode 0644), and
--                                `link`, when given, a symbolic link to it; 'OK'
--   write_chunk(target, b64)     appends the bytes of `b64` to `target` (b64 nil: base64
--                                text read from standard input); 'OK'
--   write_commit(tmp, path, link) renames `tmp` to `path` atomically, removes `link`; 'OK'
--   write_abort(tmp, link)       removes both; 'OK'
--   list(path)                   a listing for `parse_listing` (below); or 'N', or an error
--   remove(path, recursive)      'OK', or 'N' when there was nothing; or an error line
--   kill(tag, var, prefix)       stops (SIGSTOP) every process whose environment holds
--                                `var=tag` exactly (var defaults to MAYURA_EXEC; with
--                                `prefix`, a value starting with tag), also those that left
--                                the command's session or group, and those they fork while
--                                being stopped; then SIGKILL; in rounds until none is left, so
--                                that none runs another statement whatever its pid; 'OK'
--   temp_name(path, suffix)      '<dir>/.<base>.mayura-<suffix>' beside path, for write_begin
--
-- A listing is a line 'L', then one line per entry
--   <mode, hex> <size> <mtime: seconds, or seconds.milliseconds> <name, hex>
-- (the name as hex of its bytes, so names with newlines or any byte survive),
-- then a line 'end'. `parse_listing(text)` (exported as `parse_sandbox_listing`)
-- turns it into `{ { name, type, size, modified } }` as list_files returns
-- (`modified` in ms since the epoch), nil for 'N', and raises the mapped error
-- for an 'E' line. Anything else, whatever its bytes, is refused with
-- SANDBOX_ERROR reason `failed` (the text came from the sandbox, so a listing
-- that does not parse is the sandbox's failure, not the caller's input); it
-- never raises a plain Lua error.
local errors = require('mayura.errors')

local M = {}

M.TAG_VAR = 'MAYURA_EXEC'

--- Single-quotes `s` for sh: `'` becomes `'\''`. Refuses NUL bytes.
function M.quote(s)
  if type(s) ~= 'string' then errors.raise('INVALID_INPUT', 'a script argument must be a string', nil, 2) end
  if s:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'a script argument contains a NUL byte', nil, 2) end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end
local q = M.quote

local function path_arg(path, what)
  if type(path) ~= 'string' or path == '' then
    errors.raise('INVALID_INPUT', (what or 'path') .. ' must be a non-empty string', nil, 3)
  end
  return q(path)
end

local function count_arg(v, what)
  if type(v) ~= 'number' or v ~= math.floor(v) or v < 0 or v > 2 ^ 53 then
    errors.raise('INVALID_INPUT', what .. ' must be a whole number from 0', nil, 3)
  end
  return string.format('%d', v)
end

-- Names a failed command's error from its (C locale) message, `$1`: by the strerror text after
-- the message's last ': ', so that a path in the message (the caller's, or the sandbox's) cannot
-- change the answer.
local CLASSIFY = 'LC_ALL=C;export LC_ALL;e(){ case ${1##*: } in ' ..
  '"No space"*|"Disk quota"*|"File too large"*)c=ENOSPC;;' ..
  '"Permission denied"*|"Operation not permitted"*)c=EACCES;;"Read-only"*)c=EROFS;;' ..
  '"File exists"*|"Not a directory"*)c=ENOTDIR;;"Is a directory"*)c=EISDIR;;"Directory not empty"*)c=ENOTEMPTY;;' ..
  '"No such file"*|"Directory nonexistent"*|"nonexistent directory"*)c=ENOENT;;' ..
  '"File name too long"*)c=ENAMETOOLONG;;"Too many levels"*)c=ELOOP;;*)c=failed;;esac;echo "E $c";exit 0;}\n'

--- The bytes [offset, offset + length) of a regular file, base64, after a line 'F <size>'.
function M.read(path, offset, length)
  local p = path_arg(path)
  offset, length = tonumber(count_arg(offset, 'offset')), tonumber(count_arg(length, 'length'))
  -- dd seeks by whole blocks: the largest power of two (up to 64 KiB) dividing both
  local bs = 1
  while bs < 65536 and offset % (bs * 2) == 0 and length % (bs * 2) == 0 do bs = bs * 2 end
  local copy = ''
  if length > 0 then
    copy = string.format('dd if="$p" bs=%d skip=%d count=%d 2>/dev/null|base64\n',
      bs, math.floor(offset / bs), math.floor(length / bs))
  end
  return 'p=' .. p .. '\n' ..
    'if [ -d "$p" ];then echo "E is_directory";exit 0;fi\n' ..
    'if [ ! -e "$p" ];then echo N;exit 0;fi\n' ..
    'if [ ! -f "$p" ];then echo "E not_regular";exit 0;fi\n' ..
    'if [ ! -r "$p" ];then echo "E EACCES";exit 0;fi\n' ..
    's=$(stat -L -c %s -- "$p")||exit 3\n' ..
    'echo "F $s"\n' .. copy
end

--- '<dir>/.<base>.mayura-<suffix>': a temporary name beside `path` (the base cut to 100 bytes).
function M.temp_name(path, suffix)
  local dir, base = path:match('^(.*/)([^/]*)$')
  if not dir then dir, base = '', path end
  return dir .. '.' .. base:sub(1, 100) .. '.mayura-' .. suffix
end

--- Makes the parents of `path` and an empty `tmp` (0644); `link` (optional) becomes a symlink to `tmp`.
function M.write_begin(path, tmp, link)
  local p, t = path_arg(path), path_arg(tmp, 'tmp')
  local d = path:match('^(.*)/[^/]*$')
  local s = CLASSIFY .. 'p=' .. p .. ';t=' .. t .. '\n' ..
    'if [ -d "$p" ]&&[ ! -h "$p" ];then echo "E EISDIR";exit 0;fi\n'
  if d and d ~= '' then
    s = s .. 'd=' .. q(d) .. '\n' ..
      'if [ ! -d "$d" ];then o=$(umask 022;mkdir -p -- "$d" 2>&1)||e "$o";fi\n'
  end
  s = s .. 'o=$( (umask 022;: >"$t") 2>&1)||e "$o"\n'
  if link then s = s .. 'o=$(ln -sf -- "$t" ' .. path_arg(link, 'link') .. ' 2>&1)||e "$o"\n' end
  return s .. 'echo OK\n'
end

--- Appends the bytes `b64` decodes to to `target`; with b64 nil the base64 text comes on standard input.
function M.write_chunk(target, b64)
  local t = path_arg(target, 'target')
  local src = ''
  if b64 ~= nil then
    if type(b64) ~= 'string' or not b64:match('^[%w+/=]*$') then
      errors.raise('INVALID_INPUT', 'b64 must be base64 text', nil, 2)
    end
    src = "printf %s '" .. b64 .. "'|"
  end
  return 'o=$(' .. src .. 'base64 -d 2>&1 >>' .. t .. ')||{ case ${o##*: } in "No space"*|"Disk quota"*|"File too"*)' ..
    'echo "E ENOSPC";;*)echo "E failed";;esac;exit 0;}\necho OK\n'
end

--- Renames `tmp` to `path` (replacing a file or a symlink, never a directory) and removes `link`.
function M.write_commit(tmp, path, link)
  local p, t = path_arg(path), path_arg(tmp, 'tmp')
  local s = CLASSIFY .. 'p=' .. p .. ';t=' .. t .. '\n'
  if link then s = s .. 'rm -f -- ' .. path_arg(link, 'link') .. '\n' end
  return s ..
    -- mv would move into a directory a symlink names: such a link is removed first
    'if [ -h "$p" ];then if [ -d "$p" ];then rm -f -- "$p";fi\n' ..
    'elif [ -d "$p" ];then rm -f -- "$t";echo "E EISDIR";exit 0;fi\n' ..
    'o=$(mv -f -- "$t" "$p" 2>&1)||{ rm -f -- "$t";e "$o";}\necho OK\n'
end

--- Removes a write's temporary file and link.
function M.write_abort(tmp, link)
  local s = 'rm -f -- ' .. path_arg(tmp, 'tmp')
  if link then s = s .. ' ' .. path_arg(link, 'link') end
  return s .. '\necho OK\n'
end

-- The listing's entries: each a NUL-ended record '<stat> <name bytes>' through od, then awk
-- writes it as a line with the name in hex (od's bytes after the third space, as they are).
local LIST_AWK = [[awk 'BEGIN{for(i=32;i<127;i++)h[sprintf("%02x",i)]=sprintf("%c",i)}]] ..
  [[{for(i=1;i<=NF;i++){b=$i;if(b=="00"){print r;r="";k=0}else if(k<3){c=h[b];if(c==" ")k++;r=r c}else r=r b}}']]

--- A directory's entries, for `parse_listing`.
function M.list(path)
  return 'LC_ALL=C;export LC_ALL;p=' .. path_arg(path) .. '\n' ..
    'if [ ! -d "$p" ];then if [ -e "$p" ]||[ -h "$p" ];then echo "E not_directory";else echo N;fi;exit 0;fi\n' ..
    'if ! cd -- "$p" 2>/dev/null||[ ! -r . ];then echo "E EACCES";exit 0;fi\n' ..
    -- milliseconds where stat has them (GNU), else seconds
    "f='%f %s %Y';case $(stat -c %.3Y . 2>/dev/null) in *[0-9].[0-9][0-9][0-9])f='%f %s %.3Y';;esac\n" ..
    'echo L\n' ..
    '{ for n in * .[!.]* ..?*;do if [ -e "$n" ]||[ -h "$n" ];then ' ..
    [[s=$(stat -c "$f" -- "$n" 2>/dev/null)&&printf '%s %s\0' "$s" "$n";fi;done;printf 'end\0';}]] ..
    '|od -An -v -tx1|' .. LIST_AWK .. '\n'
end

--- Removes a file, a symlink or an empty directory; with `recursive` a directory and all in it.
function M.remove(path, recursive)
  local p = path_arg(path)
  local rmdir = recursive and 'rm -rf -- "$p"' or 'rmdir -- "$p"'
  return CLASSIFY .. 'p=' .. p .. '\n' ..
    'if [ ! -e "$p" ]&&[ ! -h "$p" ];then echo N;exit 0;fi\n' ..
    'if [ -d "$p" ]&&[ ! -h "$p" ];then o=$(' .. rmdir .. ' 2>&1)||e "$o"\n' ..
    'else o=$(rm -f -- "$p" 2>&1)||e "$o";fi\necho OK\n'
end

--- The lines of a script's output (without the final newline's empty line).
function M.lines(text)
  local out = {}
  for line in text:gmatch('([^\n]*)\n?') do out[#out + 1] = line end
  if out[#out] == '' then out[#out] = nil end   -- the text's final newline
  return out
end

--- Reads what `remove` printed: nothing when it removed the path or there was none; raises the
-- coded error it names; `nonsense()` (an error) for anything else.
function M.remove_result(text, nonsense)
  local lines = M.lines(text)
  local code = #lines == 1 and lines[1]:match('^E ([%w_]+)$')
  if code then error(M.script_error(code, 'the path'), 0) end
  if #lines ~= 1 or (lines[1] ~= 'OK' and lines[1] ~= 'N') then error(nonsense(), 0) end
end

--- Stops, then kills, every process whose environment holds `var=tag`; with `prefix`, every
-- process whose `var` starts with `tag`. Killing them one by one in /proc order would let a
-- shell whose child died first (pid 10 is listed before pid 9) run its next statement; so every
-- one is first stopped (SIGSTOP), in scans until two scans in a row find each of them stopped
-- already (the second scan starts once all the first found were stopped: a child forked just
-- before its parent stopped is seen by it), and only then killed (SIGKILL), in rounds until a
-- round finds none. The tagged processes are found with one `grep -z` over every environ where
-- grep has -z, else with tr and grep for each process.
function M.kill(tag, var, prefix)
  var = var or M.TAG_VAR
  if type(tag) ~= 'string' or not tag:match('^[%w._:-]+$') or #tag > 128 then
    errors.raise('INVALID_INPUT', 'tag must be 1..128 letters, digits and . _ : -', nil, 2)
  end
  if type(var) ~= 'string' or not var:match('^[%a_][%w_]*$') then
    errors.raise('INVALID_INPUT', 'var must be an environment variable name', nil, 2)
  end
  -- one variable a record; exact, or the start of the record (a BRE: only '.' needs escaping)
  local m, flags
  if prefix then
    m, flags = q('^' .. var .. '=' .. tag:gsub('%.', '\\.')), ''
  else
    m, flags = q(var .. '=' .. tag), 'xF'
  end
  return 'm=' .. m .. '\n' ..
    -- f: the environ files of the tagged processes, one a line
    'if printf \'x\\0\' 2>/dev/null|grep -qz' .. flags .. ' -- x 2>/dev/null;then ' ..
    'f(){ grep -lsz' .. flags .. ' -- "$m" /proc/[0-9]*/environ 2>/dev/null;}\n' ..
    'else f(){ for d in /proc/[0-9]*;do tr \'\\0\' \'\\n\' 2>/dev/null <"$d/environ"|grep -q' .. flags ..
    ' -- "$m"&&echo "$d/environ";done;}\nfi\n' ..
    -- a round: stop every one until two scans in a row stop none (a process stopped, dead or
    -- being traced is not signalled again), then kill them; 64 rounds at most, as core/tree.h
    'r=0\nwhile [ $r -lt 64 ];do q=0;n=0\n' ..
    'while [ $q -lt 2 ]&&[ $n -lt 256 ];do h=0\n' ..
    'for e in $(f);do d=${e%/environ};s=;read -r s 2>/dev/null <"$d/stat"||continue;s=${s##*) }\n' ..
    'case $s in [TtZX]*);;*)kill -STOP "${d#/proc/}" 2>/dev/null&&h=1;;esac;done\n' ..
    'if [ $h = 0 ];then q=$((q+1));else q=0;fi;n=$((n+1));done\n' ..
    'h=0;for e in $(f);do d=${e%/environ};kill -9 "${d#/proc/}" 2>/dev/null&&h=1;done\n' ..
    '[ $h = 0 ]&&break;r=$((r+1));done\necho OK\n'
end

-- {======================================================
-- Reading what the scripts print
-- =======================================================

local function bad_listing()
  return errors.sandbox('failed', 'the sandbox returned an invalid listing')
end

-- What an error name of the in-sandbox agent means (core/wire.h's tokens): the one table, for a
-- script's 'E <name>' line and for the agent's replies (mayura.sandbox._agent_files'
-- reply_error), so a provider answers the same either way.
local ERROR_NAMES = {
  too_large = { 'LIMIT_EXCEEDED', ' is larger than max_bytes' },
  is_directory = { 'INVALID_INPUT', ' is a directory' },
  EISDIR = { 'INVALID_INPUT', ' is a directory' },
  not_directory = { 'INVALID_INPUT', ' is not a directory' },
  ENOTDIR = { 'INVALID_INPUT', ' is not a directory' },
  not_regular = { 'INVALID_INPUT', ' is not a regular file' },
  ENOTEMPTY = { 'INVALID_INPUT', ' is a directory that is not empty' },
  ENOENT = { 'INVALID_INPUT', ' does not exist' },
  ENAMETOOLONG = { 'INVALID_INPUT', ': a name is too long' },
  ELOOP = { 'INVALID_INPUT', ': too many symbolic links' },
  EACCES = { 'PERMISSION_DENIED', ': the sandbox does not allow it (EACCES)' },
  EPERM = { 'PERMISSION_DENIED', ': the sandbox does not allow it (EPERM)' },
  EROFS = { 'PERMISSION_DENIED', ': the sandbox does not allow it (EROFS)' },
}

--- The coded error for an agent error name (a script's 'E <name>' line, an agent reply's `error`),
-- about `what` ('the file', 'the path'). A name it does not know is SANDBOX_ERROR `failed`; the
-- name itself never reaches the message.
function M.script_error(name, what)
  if name == 'ENOSPC' or name == 'EDQUOT' or name == 'EFBIG' then
    return errors.new('LIMIT_EXCEEDED', 'the sandbox has no space left for ' .. what)
  end
  local known = rawget(ERROR_NAMES, name)
  if known then return errors.new(known[1], what .. known[2]) end
  return errors.sandbox('failed', what .. ' failed in the sandbox')
end

local TYPES = { [8] = 'file', [4] = 'directory', [10] = 'symlink' }

local function hex_name(h)
  if #h < 2 or #h % 2 ~= 0 or #h > 2048 or not h:match('^%x+$') then return nil end
  local name = h:gsub('%x%x', function(x) return string.char(tonumber(x, 16)) end)
  if name:find('[/%z]') or name == '.' or name == '..' then return nil end
  return name
end

-- ms since the epoch from 'seconds' or 'seconds.fraction' (stat's %Y or %.3Y).
local function mtime_ms(t)
  local neg, sec, frac = t:match('^(%-?)(%d+)$')
  if not sec then neg, sec, frac = t:match('^(%-?)(%d+)%.(%d+)$') end
  if not sec or #sec > 12 or (frac and #frac > 9) then return nil end
  local ms = tonumber(sec) * 1000
  if frac then ms = ms + tonumber((frac .. '00'):sub(1, 3)) end
  if neg == '-' then ms = -ms end
  return math.tointeger and math.tointeger(ms) or ms
end

local function parse_entry(line)
  local mode, size, mtime, name = line:match('^(%x+) (%d+) (%S+) (%x+)$')
  if not mode or #mode > 8 or #size > 15 then return nil end
  local m = mtime_ms(mtime)
  name = hex_name(name)
  if not m or not name then return nil end
  local kind = math.floor(tonumber(mode, 16) / 4096) % 16
  local n = tonumber(size)
  return { name = name, type = TYPES[kind] or 'other', size = math.tointeger and math.tointeger(n) or n, modified = m }
end

--- The entries of a listing `list(path)` printed; nil for 'N'. See the module's comment.
function M.parse_listing(text)
  if type(text) ~= 'string' then error(bad_listing(), 2) end
  local lines, n = {}, 0
  for line in text:gmatch('([^\n]*)\n') do
    n = n + 1
    lines[n] = line
  end
  -- every line ends with a newline: a last line without one was cut short
  if n == 0 or #text == 0 or text:sub(-1) ~= '\n' then error(bad_listing(), 2) end
  if n == 1 and lines[1] == 'N' then return nil end
  local code = lines[1]:match('^E ([%w_]+)$')
  if n == 1 and code then error(M.script_error(code, 'the path'), 2) end
  if lines[1] ~= 'L' or lines[n] ~= 'end' then error(bad_listing(), 2) end
  local out = {}
  for i = 2, n - 1 do
    local e = parse_entry(lines[i])
    if not e then error(bad_listing(), 2) end
    out[#out + 1] = e
  end
  return out
end

-- }======================================================

return M
