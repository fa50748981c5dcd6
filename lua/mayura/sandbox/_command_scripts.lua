--- mayura.sandbox._command_scripts: the sh scripts of one command's life under
-- command_sandbox_backend, and the parsing of their answers: its start in a session of its own
-- with its files, the waits in the sandbox, the polls (with what its outputs grew by while it
-- streams), the report of its outputs, a signal to its processes, the removal of its files.
local scripts = require('mayura.sandbox.scripts')
local run = require('mayura.sandbox._command_run')

local M = {}

local q = scripts.quote
local nonsense, int_of, decode = run.nonsense, run.int_of, run.decode

-- A command's files are <base>.in, .out, .err, .rc (its exit code, written in one write once it
-- ended) and .pid, with <base> = <state dir>/x<n>: no directory to make, one rm to remove them.

-- The command's own shell, in a session of its own: checks the cwd, sets the env, runs the
-- command with its files, writes the exit code, then, when no caller waits for it ($b.w: none
-- did, or the one that did gave up), ends what is left in its process group a second later.
local JOB = 'b=$1 c=$2 i=$3 n=$4;shift 4\n' ..
  'if [ ! -d "$c" ];then if [ -e "$c" ];then r="E ENOTDIR";else r="E ENOENT";fi\n' ..
  'elif ! cd -- "$c" 2>/dev/null;then r="E EACCES"\n' ..
  'else (while [ "$n" -gt 0 ];do export "$1=$2";shift 2;n=$((n-1));done;exec "$@") <"$i" >"$b.out" 2>"$b.err"' ..
  ';r=$?;fi\n' ..
  ': >>"$b.out";: >>"$b.err";echo "$r" >"$b.rc"\n' ..
  'if [ -e "$b.w" ];then (sleep 1;kill -9 0)& fi\n'

-- Right after the start (the command's shell is this one's child, $!): waits for that child to
-- end, at most `ms`, with a `sleep` as the timer: a trap on SIGCHLD ends the `wait` on the timer
-- when either ends (dash, BusyBox), bash's `wait -n` does; the timer is then killed (an unreaped
-- child of ours: its pid cannot be another's yet). Whatever the shell, wait_script follows (the
-- time the timer ran out counted in `w`). A command that ended while waited for leaves its
-- shell nothing to do: this one reaps it, and only when its process group still has someone
-- (kill -0 to the group) starts the kill a second later; one that did not end yet is left to its
-- own shell ($b.w, made before the exit code is looked at again: one of the two sees it).
local function wait_child_script(ms)
  if ms <= 0 then return '' end
  return 'p=$!\n[ -s "$b.rc" ]||{ sleep ' .. ('%.3f'):format(ms / 1000) .. ' </dev/null >/dev/null 2>&1 & t=$!\n' ..
    'if [ -n "$BASH_VERSION" ];then wait -n 2>/dev/null;else [ -s "$b.rc" ]||wait $t;fi\n' ..
    'kill $t 2>/dev/null||w=' .. math.floor(ms) .. ';};trap - CHLD\n' ..
    '[ -s "$b.rc" ]||: >"$b.w"\n' ..
    'if [ -s "$b.rc" ];then wait $p 2>/dev/null\n' ..
    'kill -0 -$p 2>/dev/null&&setsid sh -c \'sleep 1;kill -9 -$1\' sh $p </dev/null >/dev/null 2>&1 &\nfi\n'
end

-- The names of a command's environment, sorted, but the tag's variable: it is never taken from
-- `env` (the command's own tag is what stops it).
local function env_names(env)
  local names = {}
  for k in pairs(env) do
    if k ~= scripts.TAG_VAR then names[#names + 1] = k end
  end
  table.sort(names)
  return names
end

--- Appends to `words` a command's environment and argv as a start script reads its arguments:
-- the count of names, each name and value (sorted by name, never the tag's variable), then the
-- argv, every word quoted.
function M.env_argv_words(words, env, argv)
  local names = env_names(env)
  words[#words + 1] = tostring(#names)
  for _, k in ipairs(names) do
    words[#words + 1] = q(k)
    words[#words + 1] = q(env[k])
  end
  for _, a in ipairs(argv) do words[#words + 1] = q(a) end
  return words
end

-- A command run in the call itself (the backend's direct path): the cwd checked as the start's
-- command shell does, the command exec'd in a subshell with its env, its tag and its files (no
-- session of its own, no timer: the call's shell waits for it), then 'D', its exit code and the
-- report, as the poll that sees a command's end answers.
local function direct_script(base, tag, cwd, env, argv, inline)
  local sets, words = {}, {}
  for i, k in ipairs(env_names(env)) do sets[i] = q(k .. '=' .. env[k]) end
  sets[#sets + 1] = q(scripts.TAG_VAR .. '=' .. tag)
  for i, a in ipairs(argv) do words[i] = q(a) end
  return 'b=' .. q(base) .. ' c=' .. q(cwd) .. '\n' ..
    'if [ ! -d "$c" ];then if [ -e "$c" ];then r="E ENOTDIR";else r="E ENOENT";fi\n' ..
    'elif ! cd -- "$c" 2>/dev/null;then r="E EACCES"\n' ..
    'else (export ' .. table.concat(sets, ' ') .. ';exec ' .. table.concat(words, ' ') ..
    ') </dev/null >"$b.out" 2>"$b.err";r=$?;fi\n' ..
    'echo D;echo "$r"\n' .. M.report(base, inline)
end

local function start_script(base, tag, cwd, stdin_file, env, argv, wait_ms)
  local words = M.env_argv_words({ q(base), q(cwd), q(stdin_file or '/dev/null') }, env, argv)
  return 'b=' .. q(base) .. '\n' ..
    'command -v setsid >/dev/null 2>&1||{ echo "E nosetsid";exit 0;}\n' ..
    (wait_ms > 0 and 'trap : CHLD\n' or ': >"$b.w"\n') ..
    scripts.TAG_VAR .. '=' .. q(tag) .. ' setsid sh -c ' .. q(JOB) .. ' sh ' .. table.concat(words, ' ') ..
    ' </dev/null >/dev/null 2>&1 &\n' ..
    'echo $! >"$b.pid"\n' .. wait_child_script(wait_ms) .. 'echo OK\n'
end

-- Waits in the sandbox, at most about `ms`, until the command ends (its exit code is written or
-- its shell is gone) or, with `offsets`, until its outputs grow past them: naps of 1 ms doubling
-- to 64 ms, each counted 1 ms longer than asked (a nap's own start takes time). Empty for 0 ms.
local function wait_script(ms, offsets)
  if ms <= 0 then return '' end
  local grow = ''
  if offsets then
    grow = '[ $d -ge 16 ]&&{ set -- $(stat -c %s -- "$b.out" "$b.err" 2>/dev/null)\n' ..
      '{ [ "${1:-0}" -gt ' .. offsets.stdout .. ' ]||[ "${2:-0}" -gt ' .. offsets.stderr .. ' ];}&&break;}\n'
  end
  return 'p=;read -r p 2>/dev/null <"$b.pid";w=${w:-0};d=1\n' ..
    'while [ ! -s "$b.rc" ]&&[ $w -lt ' .. math.floor(ms) .. ' ]&&kill -0 "$p" 2>/dev/null;do\n' .. grow ..
    'case $d in 1)s=.001;;2)s=.002;;4)s=.004;;8)s=.008;;16)s=.016;;32)s=.032;;*)s=.064;;esac\n' ..
    'sleep $s 2>/dev/null||{ sleep 1;w=$((w+1000));}\nw=$((w+d+1));[ $d -lt 64 ]&&d=$((d+d))\ndone\n'
end

-- The command's files, removed in the background (the answer does not wait for rm).
local function remove_files(base)
  return 'rm -f -- ' .. q(base) .. '.* </dev/null >/dev/null 2>&1 &\n'
end

-- The sizes of out and err, then both as base64 when small (the files are then left for a later
-- call to remove with others: no process of its own). Only what is not empty costs a process;
-- `head -c` bounds what is read whatever the file became.
function M.report(base, inline)
  local inl = tostring(inline)
  return 'b=' .. q(base) .. '\no=0;e=0\n' ..
    'if [ -s "$b.out" ];then o=$(stat -c %s -- "$b.out" 2>/dev/null)||o=0;fi\n' ..
    'if [ -s "$b.err" ];then e=$(stat -c %s -- "$b.err" 2>/dev/null)||e=0;fi\n' ..
    'echo "$o $e"\n' ..
    'if [ "$o" -le ' .. inl .. ' ]&&[ "$e" -le ' .. inl .. ' ];then\n' ..
    'if [ "$o" -gt 0 ];then head -c ' .. inl .. ' "$b.out"|base64;fi;echo -\n' ..
    'if [ "$e" -gt 0 ];then head -c ' .. inl .. ' "$b.err"|base64;fi;echo .\n' ..
    'else echo .;fi\n'
end
local report = M.report

local function poll_script(base, inline, wait)
  return 'b=' .. q(base) .. '\n' .. (wait or '') ..
    'if [ ! -s "$b.rc" ];then p=;read -r p 2>/dev/null <"$b.pid";if kill -0 "$p" 2>/dev/null;then echo R;exit 0;fi\n' ..
    'if [ ! -s "$b.rc" ];then echo X;exit 0;fi;fi\n' ..
    -- rc is one short line written in one write; read stops at its newline
    'echo D;r=;read -r r 2>/dev/null <"$b.rc";echo "$r"\n' .. report(base, inline)
end

-- A streaming command's poll while it runs: 'R', then the bytes of out and err past the offsets
-- given (at most INLINE of each) as base64, each followed by '-'.
local function poll_stream_script(base, offsets, cap, inline, wait)
  local lo = math.max(0, math.min(inline, cap - offsets.stdout))
  local le = math.max(0, math.min(inline, cap - offsets.stderr))
  return 'b=' .. q(base) .. '\n' .. (wait or '') ..
    'if [ ! -s "$b.rc" ];then p=;read -r p 2>/dev/null <"$b.pid";if kill -0 "$p" 2>/dev/null;then echo R\n' ..
    'for f in out:' .. offsets.stdout .. ':' .. lo .. ' err:' .. offsets.stderr .. ':' .. le .. ';do\n' ..
    'k=${f#*:};n=${k#*:};k=${k%:*};[ "$n" -gt 0 ]&&tail -c +$((k+1)) "$b.${f%%:*}" 2>/dev/null|head -c "$n"|base64\n' ..
    'echo -;done;exit 0;fi\n' ..
    'if [ ! -s "$b.rc" ];then echo X;exit 0;fi;fi\n' ..
    'echo D;r=;read -r r 2>/dev/null <"$b.rc";echo "$r"\n' .. report(base, inline)
end

-- The chunks of a running streaming command's poll (lines from 2): out's and err's bytes.
local function parse_chunks(lines)
  local parts, k = { {}, {} }, 1
  for j = 2, #lines do
    if lines[j] == '-' then
      k = k + 1
      if k > 2 and j ~= #lines then error(nonsense(), 0) end
    elseif k <= 2 then
      table.insert(parts[k], lines[j])
    end
  end
  if k ~= 3 then error(nonsense(), 0) end
  return decode(table.concat(parts[1])), decode(table.concat(parts[2]))
end

-- Signals the command's processes (those carrying its tag) but its own shell, which then
-- records how the command ended; one pass.
local function signal_script(rec, sig)
  return 'b=' .. q(rec.base) .. '\np=;read -r p 2>/dev/null <"$b.pid"\n' ..
    [[for d in /proc/[0-9]*;do i=${d#/proc/};[ "$i" = "$p" ]&&continue;if tr '\0' '\n' 2>/dev/null <"$d/environ"|]] ..
    'grep -qxF -- ' .. q(scripts.TAG_VAR .. '=' .. rec.tag) .. ';then kill -' .. sig .. ' "$i" 2>/dev/null;fi;done\n' ..
    'echo OK\n'
end

-- Reads report()'s lines from `i`: sizes, and the outputs when they came inline.
local function parse_report(lines, i)
  local o, e = (lines[i] or ''):match('^(%d+) (%d+)$')
  o, e = int_of(o), int_of(e)
  if not o or not e then error(nonsense(), 0) end
  if lines[i + 1] == '.' and #lines == i + 1 then return { out_size = o, err_size = e } end
  local parts, j = { {}, {} }, i + 1
  local k = 1
  while lines[j] and lines[j] ~= '.' do
    if lines[j] == '-' and k == 1 then k = 2 else table.insert(parts[k], lines[j]) end
    j = j + 1
  end
  if lines[j] ~= '.' or j ~= #lines or k ~= 2 then error(nonsense(), 0) end
  return { out_size = o, err_size = e, out = decode(table.concat(parts[1])), err = decode(table.concat(parts[2])) }
end

M.start_script, M.wait_script, M.remove_files = start_script, wait_script, remove_files
M.direct_script = direct_script
M.poll_script, M.poll_stream_script, M.parse_chunks = poll_script, poll_stream_script, parse_chunks
M.signal_script, M.parse_report = signal_script, parse_report

return M
