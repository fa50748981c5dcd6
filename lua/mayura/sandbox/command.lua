--- mayura.sandbox.command: the whole sandbox backend from a transport that runs short commands.
--
-- `command_sandbox_backend(id, transport, release)` (exported by mayura.sandbox)
-- returns a backend for a provider's `create` when all the provider's API can
-- do is run a short command and answer with its exit code and output (an SSH
-- session, `docker exec`, a hosted service's exec endpoint). The transport is a
-- table:
--
--   transport:run(command, { stdin = text or nil, signal = token or nil })
--       runs `command`, a POSIX sh script, as `sh -c command` in the sandbox and
--       returns `{ exit_code = n, stdout = text }`; it may raise coded errors
--       (SANDBOX_ERROR `gone`, `timeout`, `unavailable`, ... or CANCELLED when
--       `signal` is cancelled), anything else becomes SANDBOX_ERROR `failed`.
--       A method (called with `:`), like every other backend call.
--   transport.stdin              whether `run` takes standard input (default false)
--   transport.max_command_bytes  the longest command `run` takes (default 65536, at least 1024)
--   transport.max_output_bytes   the most standard output `run` gives back (default 1 MiB, at
--                                least 8192): every answer the backend asks for fits in it (file
--                                reads, outputs and listings come in parts that do); an answer
--                                cut anyway (`run` returned `truncated = true`, or the answer
--                                lacks the line every backend command ends with) is SANDBOX_ERROR
--                                `truncated`
--   transport.workdir            where commands run without a cwd (default /workspace)
--   transport.make_workdir       true: making the backend makes the workdir too (mkdir -p)
--   transport.wait_ms            the longest one call may wait in the sandbox for a command
--                                (default 1000; 0: never, the host polls with a backoff): a
--                                command that ends within it costs one call, its start
--   transport.rate               optional `{ per_second = n, burst = n }`: the service's rate,
--                                which every call the backend makes keeps (a token bucket per
--                                table: sandboxes given the same table share it)
--   transport.state_dir          the backend's own directory in the sandbox (default
--                                /tmp/.mayura-<random>; made with mode 0700)
--   transport.env                optional: environment every command gets (the create
--                                spec's `env`, for a transport that cannot set it itself)
--   transport:url(port)          optional: the URL for `url(port)`
--
-- `release(backend)` (optional) ends the sandbox; the backend first kills every
-- process its commands started (setsid'd ones too) and removes its state
-- directory. Making the backend runs no command: its first call first makes the
-- state directory (and the workdir, with `make_workdir`) and checks for the tools
-- the scripts need, and fails with SANDBOX_ERROR `failed` when one is missing
-- (as does every call after it, until one finds them). exec takes standard input whatever the transport (it goes
-- through a file), so the provider can declare `features.stdin = true`.
--
-- How it works: exec writes standard input (if any) to a file, then starts the
-- command in the background in a session of its own, with MAYURA_EXEC=<tag> in
-- its environment and its stdout, stderr and exit code going to files in the
-- state directory. The same call then waits in the sandbox (up to `wait_ms`, never past the
-- command's timeout) until the exit code is there, so a short command costs one call; a longer
-- one is polled, each poll waiting as long again (without waits, polls back off on the host: 2 ms
-- doubling to 250 ms), every call within `rate`. The outputs are read (with the call that saw the end
-- when they are small, else in chunks within the transport's `max_output_bytes`)
-- up to the pool's `max_output_bytes`,
-- setting `truncated` past it. At the timeout or a cancel it runs
-- `sandbox_scripts.kill(tag)`, which stops every process carrying the tag, also
-- those that left the session; what a command leaves in its own process group
-- is killed a second after it ends (setsid'd processes survive), as the agent
-- does. Files move as base64 in chunks: on standard input when the transport
-- takes it, else inside the command line, each command kept within
-- `max_command_bytes` (a longer script is first written to a file in the state
-- directory, in chunks, then sourced). Writes go to a temporary file beside the
-- target, renamed into place.
--
-- Streaming (`o.on_output`, as the agent backend's): while the command runs, each poll also
-- brings what its files grew by (at most 48 KiB of each per poll, less where the transport's
-- answers are smaller; a waiting poll ends when they grow, a host-side one comes every 20 ms at
-- most while output keeps coming), passed on in order; the rest comes with the end. `o.on_start`
-- gets `{ kill(signal) }` (no pid: the command's own is not known here): it signals every process
-- carrying the command's tag but its own shell, which then records the exit code (128 + signal).
--
-- Errors are the agent backend's (`script_error`): INVALID_INPUT, PERMISSION_DENIED,
-- LIMIT_EXCEEDED, or SANDBOX_ERROR `failed`; the sandbox's own text never
-- becomes a message. Differences from the agent: the exit code of a command
-- killed by a signal is the shell's 128 + signal (no `signal` field), listing
-- times have the resolution stat gives (ms with GNU stat, seconds with BusyBox),
-- and a command's output takes room in the state directory until it ends (the
-- host reads at most the cap of it; small outputs a little longer: the files of
-- 16 ended commands are removed together, by a later call).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local KIB, MIB = 1024, 1048576
local STDIN_CHUNK = 768 * KIB     -- raw bytes per write on standard input (1 MiB of base64)
local INLINE = 48 * KIB           -- outputs up to this come back with the poll that sees the end
local DEFAULT_OUTPUT_BYTES, MIN_OUTPUT_BYTES = MIB, 8192
local HEAD_ROOM = 256             -- an answer's lines besides its base64 (headers, sizes, the end)
local MAX_LISTING = 64 * MIB      -- the longest listing text read back
local END = ':end'                -- the last line of every answer: without it, it was cut
local READY = ':ready'            -- the setup's last line (it then goes on with the call's script)
local TRAP = "trap 'echo " .. END .. "' EXIT\n"   -- starts every command (its room is kept)
local MIN_ROOM = 512              -- the least base64 worth a chunk of its own command
local POLL_FIRST_MS, POLL_MAX_MS = 2, 250
local DEFAULT_WAIT_MS = 1000      -- the longest one call waits in the sandbox, unless the transport says
local POLL_STREAM_MS = 20         -- while a streaming command writes: the longest wait between polls
local TRASH_BATCH = 16            -- ended commands whose small files one rm removes, with a later call
local DEFAULT_COMMAND_BYTES = 65536
local MIN_COMMAND_BYTES = 1024
local TOOLS = { 'base64', 'stat', 'dd', 'od', 'awk', 'tr', 'grep', 'mkdir', 'mv', 'rm', 'rmdir', 'ln', 'kill',
  'sleep', 'setsid', 'head', 'tail' }

local q = scripts.quote

local function gone()
  return errors.sandbox('gone', 'the sandbox is gone')
end

local function nonsense()
  return errors.sandbox('failed', 'the sandbox answered a backend command with nonsense')
end

local function cut()
  return errors.sandbox('truncated', 'the transport cut the answer of a backend command short')
end

-- The bytes base64 prints for `n` bytes: 4 per 3, and a newline after each 76 and at the end.
local function b64_bytes(n)
  local b = 4 * math.ceil(n / 3)
  return b + math.ceil(b / 76)
end

-- The most raw bytes, a multiple of `unit`, whose base64 fits in `room` (at least `unit`).
local function fits(room, unit)
  local n = math.floor(room * 57 / 77 / unit) * unit
  while n > unit and b64_bytes(n) > room do n = n - unit end
  return math.max(n, unit)
end

local function random_hex(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(n)
  if f then f:close() end
  if not bytes or #bytes ~= n then bytes = tostring(core.hrtime_ms()) .. tostring(math.random()) end
  return (bytes:sub(1, n):gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

local lines_of = scripts.lines

local function int_of(s)
  if type(s) ~= 'string' or not s:match('^%d+$') or #s > 15 then return nil end
  return math.tointeger and math.tointeger(tonumber(s)) or tonumber(s)
end

local function decode(b64)
  local data = core.base64.decode(b64)
  if not data then error(nonsense(), 0) end
  return data
end

local Backend = {}
Backend.__index = Backend

-- The calls' buckets, one per `transport.rate` table (a provider that gives every sandbox of an
-- account the same table keeps them all within the account's rate together).
local buckets = setmetatable({}, { __mode = 'k' })
local nap

-- {======================================================
-- Running scripts
-- =======================================================

function Backend:_id()
  self._seq = self._seq + 1
  return self._seq
end

-- The setup's answer at the start of `out` (see _raw): raises what it says went wrong, else
-- returns the rest.
local KNOWN_TOOLS = {}
for _, t in ipairs(TOOLS) do KNOWN_TOOLS[t] = true end
local function after_setup(out)
  local head, rest = out:match('^(.-)' .. READY .. '\n(.*)$')
  if head == '' then return rest end
  for line in ((head or out) .. '\n'):gmatch('([^\n]*)\n') do
    local tool = line:match('^M (%S+)$')
    if tool and KNOWN_TOOLS[tool] then
      error(errors.sandbox('failed', 'the sandbox has no ' .. tool .. ', which the command backend needs'), 0)
    end
    if line == 'E state' then error(errors.sandbox('failed', 'cannot make the backend\'s state directory'), 0) end
    if line == 'E workdir' then error(errors.sandbox('failed', 'cannot make the working directory'), 0) end
  end
  error(nonsense(), 0)
end

-- Runs one script through the transport (raw: also after release, `bare`: without the setup);
-- returns its stdout. Until one call has run the setup (made the state directory, found the
-- tools), each call runs it first (alone first when the two would not fit in one command).
function Backend:_raw(script, stdin, signal, bare)
  local t = self._transport
  local setup = not bare and self._setup
  if setup and #setup + #script > self._max then
    after_setup(self:_raw(setup, nil, signal, true))
    self._setup, setup = nil, nil
  end
  if setup then script = setup .. script end
  self:_take()
  -- the shell says it ended, whichever way it exits (a subshell does not inherit the trap)
  local ok, res = pcall(t.run, t, TRAP .. script, { stdin = stdin, signal = signal })
  if not ok then
    if errors.is(res) then
      if getmetatable(res) == nil then setmetatable(res, errors.mt) end
      error(res, 0)
    end
    error(errors.sandbox('failed', 'the transport failed'), 0)
  end
  if type(res) ~= 'table' or not check.is_int(res.exit_code) or type(res.stdout) ~= 'string' then
    error(errors.sandbox('failed', 'the transport returned an invalid result'), 0)
  end
  if res.exit_code ~= 0 then error(errors.sandbox('failed', 'a backend command failed in the sandbox'), 0) end
  local out = res.stdout
  -- the end line (a transport may drop the last newline); nothing may follow it
  if out:sub(-#END - 1) == END .. '\n' then out = out:sub(1, -#END - 2)
  elseif out:sub(-#END) == END and (#out == #END or out:sub(-#END - 1, -#END - 1) == '\n') then
    out = out:sub(1, -#END - 1)
  else
    error(cut(), 0)
  end
  if res.truncated == true then error(cut(), 0) end
  if setup then
    out = after_setup(out)
    self._setup = nil
  end
  return out
end

-- Waits until the transport's rate allows one more call (a token of its bucket: `burst` at most,
-- `per_second` more each second), then takes it; a stop waits too (the service would refuse it).
function Backend:_take()
  local r = self._rate
  if not r then return end
  local b = buckets[r]
  if not b then
    b = { tokens = r.burst, at = core.hrtime_ms() }
    buckets[r] = b
  end
  while true do
    local now = core.hrtime_ms()
    b.tokens = math.min(r.burst, b.tokens + (now - b.at) * r.per_second / 1000)
    b.at = now
    if b.tokens >= 1 then
      b.tokens = b.tokens - 1
      return
    end
    nap({}, (1 - b.tokens) * 1000 / r.per_second)
  end
end

-- Runs a script; one longer than max_command_bytes is written to a file in chunks, then sourced.
function Backend:_run(script, stdin, signal)
  if self._closed then error(gone(), 0) end
  local trash = self._trash
  if #trash >= TRASH_BATCH then
    local names = {}
    for i, base in ipairs(trash) do names[i] = q(base) .. '.*' end
    local rm = 'rm -f -- ' .. table.concat(names, ' ') .. ' </dev/null >/dev/null 2>&1 &\n'
    if #rm + #script <= self._max then
      self._trash = {}
      script = rm .. script
    end
  end
  if #script > self._max then
    local name = self._state .. '/s' .. self:_id()
    self:_put(name, 'rm -f -- ' .. q(name) .. '\n' .. script)
    script = '. ' .. q(name) .. '\n'
  end
  local out = self:_raw(script, stdin, signal)
  if self._closed then error(gone(), 0) end
  return out
end

-- Expects `n` lines 'OK'; an 'E <name>' line is raised as the error it names about `what`.
local function expect_ok(out, n, what)
  local lines = lines_of(out)
  for _, line in ipairs(lines) do
    local code = line:match('^E ([%w_]+)$')
    if code then error(scripts.script_error(code, what), 0) end
  end
  if #lines ~= n then error(nonsense(), 0) end
  for _, line in ipairs(lines) do
    if line ~= 'OK' then error(nonsense(), 0) end
  end
end

-- }======================================================

-- {======================================================
-- Files
-- =======================================================

-- Writes `data` to `path`: one command when it fits, else chunks appended through a short link.
function Backend:_put(path, data)
  local id = self:_id()
  local tmp = scripts.temp_name(path, self._prefix:sub(1, 8) .. id)
  local begin, commit = scripts.write_begin(path, tmp), scripts.write_commit(tmp, path)
  local b64 = core.base64.encode
  if self._stdin and #data <= STDIN_CHUNK then
    return expect_ok(self:_run(begin .. scripts.write_chunk(tmp, nil) .. commit, b64(data)), 3, 'the file')
  end
  if not self._stdin and math.ceil(#data / 3) * 4 < self._max then
    local one = begin .. scripts.write_chunk(tmp, b64(data)) .. commit
    if #one <= self._max then return expect_ok(self:_run(one), 3, 'the file') end
  end
  local link = self._state .. '/w' .. id
  begin, commit = scripts.write_begin(path, tmp, link), scripts.write_commit(tmp, path, link)
  local ok, err = pcall(function()
    local pending, parts = begin, 1
    local bare = #scripts.write_chunk(link, '')
    if #pending + bare + MIN_ROOM > self._max then
      expect_ok(self:_run(pending), 1, 'the file')
      pending, parts = '', 0
    end
    local off, committed = 0, false
    repeat
      local take = STDIN_CHUNK
      if not self._stdin then take = math.floor((self._max - #pending - bare) / 4) * 3 end
      take = math.min(take, #data - off)
      local piece = b64(data:sub(off + 1, off + take))
      local script, stdin
      if self._stdin then
        script, stdin = pending .. scripts.write_chunk(link, nil), piece
      else
        script = pending .. scripts.write_chunk(link, piece)
      end
      off = off + take
      parts = parts + 1
      if off >= #data and #script + #commit <= self._max then
        script, parts, committed = script .. commit, parts + 1, true
      end
      expect_ok(self:_run(script, stdin), parts, 'the file')
      pending, parts = '', 0
    until off >= #data
    if not committed then expect_ok(self:_run(commit), 1, 'the file') end
  end)
  if not ok then
    if not self._closed then pcall(self._run, self, scripts.write_abort(tmp, link)) end
    error(err, 0)
  end
end

-- One read: nil for no file, else the size the header gave and the bytes.
function Backend:_read_part(path, offset, length)
  local out = self:_run(scripts.read(path, offset, length))
  local head, rest = out:match('^([^\n]*)\n?(.*)$')
  if head == 'N' then return nil end
  local code = head:match('^E ([%w_]+)$')
  if code then error(scripts.script_error(code, 'the file'), 0) end
  local size = int_of(head:match('^F (%d+)$'))
  if not size then error(nonsense(), 0) end
  return size, decode(rest)
end

-- Rounds up to whole 4 KiB pages (so that dd reads whole blocks), at most a read's chunk.
function Backend:_read_len(n)
  return math.min(self._read_chunk, math.ceil(n / 4096) * 4096)
end

-- The first `limit` bytes of a file (nil when there is none), and its size; with `refuse`, a file
-- larger than `limit` is LIMIT_EXCEEDED as soon as its size is known.
function Backend:_read_upto(path, limit, refuse)
  local size, data = self:_read_part(path, 0, self:_read_len(math.min(limit, self._read_chunk)))
  if not size then return nil end
  local function check_size(s)
    if refuse and s > limit then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes', nil, 0) end
  end
  check_size(size)
  local parts, got = { data }, #data
  local want = math.min(size, limit)
  while got < want and #parts[#parts] > 0 do
    local s, more = self:_read_part(path, got, self:_read_len(want - got))
    if not s then break end
    check_size(s)
    if s > size then size = s end
    parts[#parts + 1] = more
    got = got + #more
  end
  local all = table.concat(parts)
  if #all > want then all = all:sub(1, want) end
  return all, size
end

function Backend:read_file(path, o)
  return (self:_read_upto(path, o and o.max_bytes or 16 * MIB, true))
end

function Backend:write_file(path, data)
  self:_put(path, data)
end

function Backend:list_files(path)
  -- the listing goes to a file; it comes back with the answer when it fits, else read in parts
  local name = self._state .. '/l' .. self:_id()
  local f = q(name)
  local out = self:_run('(' .. scripts.list(path) .. ') >' .. f .. '\n' ..
    's=$(stat -c %s -- ' .. f .. ')||s=0\nif [ "$s" -le ' .. (self._out - HEAD_ROOM) .. ' ];then ' ..
    'cat -- ' .. f .. ';rm -f -- ' .. f .. ';else echo "S $s";fi\n')
  local big = int_of(out:match('^S (%d+)\n$'))
  if big then
    if big > MAX_LISTING then
      pcall(self._run, self, 'rm -f -- ' .. f .. '\n')
      errors.raise('LIMIT_EXCEEDED', 'the listing is too large', nil, 0)
    end
    local ok, text = pcall(self._read_upto, self, name, big)
    pcall(self._run, self, 'rm -f -- ' .. f .. '\n')
    if not ok then error(text, 0) end
    out = text or ''
  end
  local ok, res = pcall(scripts.parse_listing, out)
  if not ok then error(res, 0) end
  return res
end

function Backend:remove_file(path, o)
  scripts.remove_result(self:_run(scripts.remove(path, o and o.recursive)), nonsense)
end

function Backend:url(port)
  local t = self._transport
  if type(t.url) == 'function' then return t:url(port) end
  errors.raise('INVALID_INPUT', 'this sandbox serves no ports', nil, 0)
end

-- }======================================================

-- {======================================================
-- Commands
-- =======================================================

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

local function start_script(base, tag, cwd, stdin_file, env, argv, wait_ms)
  local words = { q(base), q(cwd), q(stdin_file or '/dev/null') }
  local names = {}
  for k in pairs(env) do names[#names + 1] = k end
  table.sort(names)
  words[#words + 1] = tostring(#names)
  for _, k in ipairs(names) do
    words[#words + 1] = q(k)
    words[#words + 1] = q(env[k])
  end
  for _, a in ipairs(argv) do words[#words + 1] = q(a) end
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
local function report(base, inline)
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

-- Waits `ms`, or less when rec.wake() is called (a cancel, a release).
function nap(rec, ms)
  local uv = require('luv')
  task.await(function(done)
    local timer = uv.new_timer()
    local fired = false
    local function fire()
      if fired then return end
      fired = true
      rec.wake = nil
      if not timer:is_closing() then
        timer:stop()
        timer:close()
      end
      done()
    end
    rec.wake = fire
    timer:start(math.max(1, math.ceil(ms)), 0, fire)
  end)
end

-- The outputs, from the report or read in chunks, cut at the cap; then the files are removed.
function Backend:_outputs(base, rep, cap)
  local res = { truncated = rep.out_size > cap or rep.err_size > cap }
  if rep.out then
    res.stdout, res.stderr = rep.out, rep.err
    self._trash[#self._trash + 1] = base   -- removed with a later call, with others
  else
    res.stdout = self:_read_upto(base .. '.out', cap) or ''
    res.stderr = self:_read_upto(base .. '.err', cap) or ''
    self:_run(remove_files(base))
  end
  if #res.stdout > cap then res.stdout, res.truncated = res.stdout:sub(1, cap), true end
  if #res.stderr > cap then res.stderr, res.truncated = res.stderr:sub(1, cap), true end
  return res
end

-- Kills the command's processes and removes its files (best effort: used on the way out).
function Backend:_stop(rec)
  pcall(self._raw, self, scripts.kill(rec.tag) .. remove_files(rec.base))
end

function Backend:exec(argv, o)
  local id = self:_id()
  local rec = { tag = self._prefix .. '.' .. id, base = self._state .. '/x' .. id }
  local cap = o.max_output_bytes or MIB
  local started = core.hrtime_ms()
  local env = {}
  for k, v in pairs(self._env) do env[k] = v end
  for k, v in pairs(o.env or {}) do env[k] = v end
  local stdin_file
  if o.stdin then
    stdin_file = rec.base .. '.in'
    self:_put(stdin_file, o.stdin)
  end
  local token = o.signal
  local remove
  if token then
    remove = token:on_cancel(function()
      rec.cancelled = true
      if rec.wake then rec.wake() end
    end)
  end
  self._running[rec] = true
  local streaming = o.on_output ~= nil
  local offsets = { stdout = 0, stderr = 0 }
  -- what a streaming command wrote past what was passed on already
  local function pass_on(name, bytes)
    if not streaming or #bytes == 0 then return end
    offsets[name] = offsets[name] + #bytes
    o.on_output(name, bytes)
  end
  local deadline = started + (o.timeout_ms or 60000)
  -- one call's script for the command's state: waits in the sandbox (up to the transport's
  -- wait_ms, never past the deadline) for its end, or for more output while it streams
  local function poll()
    local wait = wait_script(math.min(self._wait, deadline - core.hrtime_ms()), streaming and offsets or nil)
    return streaming and poll_stream_script(rec.base, offsets, cap, self._inline, wait)
      or poll_script(rec.base, self._inline, wait)
  end
  local ok, res = pcall(function()
    rec.started = true   -- from here on, a failure kills by the tag (whether the start got through or not)
    -- the start, then the command's state in the same call: a short command ends in it. A streaming
    -- one does not wait there for its end (its output would come at once, out of order): the
    -- poll's own wait ends as soon as either output grows
    local first = streaming and 0 or math.min(self._wait, deadline - core.hrtime_ms())
    local lines = lines_of(self:_run(start_script(rec.base, rec.tag, o.cwd or self._workdir, stdin_file, env, argv,
      first) .. poll(), nil, token))
    local code = (lines[1] or ''):match('^E ([%w_]+)$')
    if code then error(scripts.script_error(code, 'the command'), 0) end
    if lines[1] ~= 'OK' then error(nonsense(), 0) end
    table.remove(lines, 1)
    if o.on_start then
      o.on_start({ kill = function(sig)
        if not rec.over and not self._closed then
          task.spawn(function() pcall(self._raw, self, signal_script(rec, sig)) end)
        end
      end })
    end
    -- without waits in the sandbox, polls back off on the host (2 ms doubling to 250 ms)
    local delay = POLL_FIRST_MS
    while true do
      if streaming and lines[1] == 'R' and #lines > 1 then
        local o_new, e_new = parse_chunks(lines)
        pass_on('stdout', o_new)
        pass_on('stderr', e_new)
        -- output keeps coming: poll again soon
        if #o_new + #e_new > 0 then delay = math.min(delay, POLL_STREAM_MS) end
      elseif lines[1] == 'X' and #lines == 1 then
        error(errors.sandbox('failed', 'the command ended without an exit status'), 0)
      elseif lines[1] == 'D' then
        local rc = lines[2] or ''
        code = rc:match('^E ([%w_]+)$')
        if code then error(scripts.script_error(code, 'cwd'), 0) end
        local exit_code = int_of(rc)
        if not exit_code then error(nonsense(), 0) end
        local r = self:_outputs(rec.base, parse_report(lines, 3), cap)
        r.exit_code, r.timed_out = exit_code, false
        pass_on('stdout', r.stdout:sub(offsets.stdout + 1))
        pass_on('stderr', r.stderr:sub(offsets.stderr + 1))
        return r
      elseif lines[1] ~= 'R' or #lines ~= 1 then
        error(nonsense(), 0)
      end
      local now = core.hrtime_ms()
      if rec.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 0) end
      if now >= deadline then break end
      if self._wait <= 0 then
        nap(rec, math.min(delay, deadline - now))
        delay = math.min(delay * 2, POLL_MAX_MS)
      end
      if self._closed then error(gone(), 0) end
      if rec.cancelled then errors.raise('CANCELLED', 'the command was cancelled', nil, 0) end
      lines = lines_of(self:_run(poll(), nil, token))
    end
    -- the timeout: stop everything, then take what the command wrote
    lines = lines_of(self:_run(scripts.kill(rec.tag) .. 'echo K\n' .. report(rec.base, self._inline)))
    if lines[1] ~= 'OK' or lines[2] ~= 'K' then error(nonsense(), 0) end
    local r = self:_outputs(rec.base, parse_report(lines, 3), cap)
    r.timed_out = true
    pass_on('stdout', r.stdout:sub(offsets.stdout + 1))
    pass_on('stderr', r.stderr:sub(offsets.stderr + 1))
    return r
  end)
  rec.over = true
  self._running[rec] = nil
  if remove then remove() end
  if not ok then
    -- a cancel, a failure on the way: what was started stops
    if rec.started and not self._closed then self:_stop(rec) end
    if rec.cancelled and not (errors.is(res, 'SANDBOX_ERROR') and res.reason == 'gone') then
      errors.raise('CANCELLED', 'the command was cancelled', nil, 0)
    end
    error(res, 0)
  end
  res.duration_ms = core.hrtime_ms() - started
  return res
end

-- }======================================================

function Backend:release()
  if self._closed then return end
  self._closed = true
  for rec in pairs(self._running) do
    if rec.wake then rec.wake() end
  end
  -- every command this backend started, running or left behind, by the tags' common prefix
  local stop = scripts.kill(self._prefix .. '.', nil, true) .. 'rm -rf -- ' .. q(self._state) .. '\n'
  pcall(self._raw, self, stop, nil, nil, true)
  if self._release then self._release(self) end
end

--- A sandbox backend over `transport` (see the module's comment).
function M.command_sandbox_backend(id, transport, release)
  local C = 'INVALID_CONFIG'
  if type(id) ~= 'string' or id == '' then errors.raise(C, 'id must be a non-empty string', nil, 2) end
  if type(transport) ~= 'table' or type(transport.run) ~= 'function' then
    errors.raise(C, 'transport must be a table with a run method', nil, 2)
  end
  if release ~= nil and type(release) ~= 'function' then errors.raise(C, 'release must be a function', nil, 2) end
  for _, k in ipairs({ 'stdin', 'make_workdir' }) do
    if transport[k] ~= nil and type(transport[k]) ~= 'boolean' then
      errors.raise(C, 'transport.' .. k .. ' must be a boolean', nil, 2)
    end
  end
  local max = check.int(transport.max_command_bytes, 'transport.max_command_bytes', MIN_COMMAND_BYTES, nil, C, 2,
    DEFAULT_COMMAND_BYTES)
  local out_max = check.int(transport.max_output_bytes, 'transport.max_output_bytes', MIN_OUTPUT_BYTES, nil, C, 2,
    DEFAULT_OUTPUT_BYTES)
  local wait = check.int(transport.wait_ms, 'transport.wait_ms', 0, 3600000, C, 2, DEFAULT_WAIT_MS)
  local rate = transport.rate
  local ps = type(rate) == 'table' and rate.per_second
  if rate ~= nil and (type(ps) ~= 'number' or ps ~= ps or ps <= 0 or ps == math.huge
      or not check.is_int(rate.burst) or rate.burst < 1) then
    errors.raise(C, 'transport.rate must be { per_second = n > 0, burst = integer >= 1 }', nil, 2)
  end
  local workdir = transport.workdir or '/workspace'
  local prefix = random_hex(8)
  local state = transport.state_dir or ('/tmp/.mayura-' .. prefix)
  for what, p in pairs({ workdir = workdir, state_dir = state }) do
    if type(p) ~= 'string' or p:sub(1, 1) ~= '/' or #p > 256 or p:find('[%z\n]') then
      errors.raise(C, 'transport.' .. what .. ' must be an absolute path (at most 256 bytes)', nil, 2)
    end
  end
  local self = setmetatable({
    streaming = true,   -- exec passes output on as its polls see it, and tells on_start (no pid)
    id = id, _transport = transport, _release = release, _stdin = transport.stdin == true, _max = max - #TRAP,
    _out = out_max,
    -- a read's part and an output that comes inline (two of them in one answer) within _out
    _read_chunk = fits(out_max - HEAD_ROOM, 4096),
    _inline = math.min(INLINE, fits(math.floor((out_max - HEAD_ROOM) / 2), 3)),
    _workdir = workdir, _state = state, _prefix = prefix, _seq = 0, _running = {}, _closed = false,
    _env = {}, _wait = wait, _rate = rate, _trash = {},
  }, Backend)
  if transport.env ~= nil then
    if type(transport.env) ~= 'table' then errors.raise(C, 'transport.env must be a table of strings', nil, 2) end
    for k, v in pairs(transport.env) do
      if type(k) ~= 'string' or not k:match('^[%a_][%w_]*$') or type(v) ~= 'string' or v:find('%z') then
        errors.raise(C, 'transport.env must map names to strings', nil, 2)
      end
      self._env[k] = v
    end
  end
  local words = {}
  for i, t in ipairs(TOOLS) do words[i] = t end
  local mk = transport.make_workdir and 'mkdir -p -- ' .. q(workdir) .. ' 2>/dev/null||{ echo "E workdir";exit 0;}\n'
    or ''
  -- the setup goes with the backend's first call (it ends the call early when it fails)
  self._setup = mk .. 'mkdir -p -m 700 -- ' .. q(state) .. ' 2>/dev/null||{ echo "E state";exit 0;}\n' ..
    'm=;for t in ' .. table.concat(words, ' ') .. ';do command -v "$t" >/dev/null 2>&1||{ echo "M $t";m=1;};done\n' ..
    '[ -z "$m" ]||exit 0\necho ' .. READY .. '\n'
  return self
end

return M
