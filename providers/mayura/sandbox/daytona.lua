--- mayura.sandbox.daytona: sandboxes on Daytona (https://www.daytona.io), from a snapshot.
--
--   local daytona = require('mayura.sandbox.daytona')
--   local provider = daytona.daytona_sandboxes({ api_key = key })   -- the key: the caller's to find
--   local sandboxes = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 3600000 })
--
-- Options: `api_key` (required; the library never reads it from the environment),
-- `base_url` (https://app.daytona.io/api), `snapshot` (Daytona's default when
-- nil; a create's `image` names another), `target` (a region), `user` (the OS
-- user of the sandbox), `workdir` (where relative paths and commands start; by
-- default the daemon's own working directory, asked once, with GET /work-dir, of
-- the first sandbox this provider makes), `desktop` (true: every sandbox starts
-- Daytona's computer-use desktop and has `sandbox.desktop`), `max_lifetime_ms`
-- (24 h), `wait_ms` (the longest one execute waits for a command before the next
-- call takes over: 10 s), `retries` and `retry_base_ms` (the kit's, for 429 and 5xx
-- answers), `warm` (sandboxes made ahead for the pool, 0 to 64, none by default: a create with
-- the pool's labels, no image, cpus or memory and the network 'none' takes one (any ports), its env
-- going with each command; mayura.sandbox._kit).
--
-- The control plane (`{base_url}/sandbox`, Bearer key) makes the sandbox:
-- `snapshot`, `env`, `labels`, `networkBlockAll` for 'none', `domainAllowList`
-- for { allow = ... }, `cpu` and `memory` (GiB, rounded up) when asked, and the
-- lifetime in minutes (rounded up) three ways: `ttlMinutes` (wall clock, the
-- sandbox is destroyed at its end), `autoStopInterval` (idle) and
-- `autoDeleteInterval = 0` (deleted once stopped); the pool also releases it at
-- its lifetime. A create that comes back before the sandbox runs is polled
-- (GET /sandbox/{id}) until `started`. Each create carries a label of its own,
-- so that a sandbox whose create answer was lost (a timeout, a cut) is found by
-- that label afterwards and deleted, rather than left running.
--
-- The toolbox (`{toolboxProxyUrl}/{id}`, the same key) does the rest, and is
-- the only way in: no SSH, no sessions.
--   * exec: one POST /process/execute hands the daemon's shell (which reads the
--     command on its standard input: zsh, bash or sh, so the script is written
--     for all three) a script that starts the command
--     in the background, in a session of its own (setsid), tagged with
--     MAYURA_EXEC=<tag> in its environment, its stdout, stderr and exit status
--     going to files in a state directory (/tmp/.mayura-<random>, 0700), then
--     waits for it and answers its exit status and both outputs as base64 (up
--     to 48 KiB each; longer ones are cut at the pool's max_output_bytes in the
--     sandbox and read with GET /files/download). A short command costs one round
--     trip. The answer is awaited at most `wait_ms` (or the command's timeout) at
--     a time; past that, the same call's shorter form waits again (each call is
--     safe to repeat: the start is guarded by an exclusive file, so a call the
--     kit retries after a cut never runs the command twice). At the timeout, or
--     when the signal cancels, one more call kills every process carrying the
--     tag (setsid'd ones too: `sandbox_scripts.kill`) and collects what the
--     command wrote. Whatever the command leaves in its own process group is
--     killed a second after it ends; a process started with setsid outlives it.
--     Standard input goes inline in the script (to 48 KiB) or through the file
--     API. Output is bytes, exactly; a command killed by a signal reports the
--     shell's 128 + signal as its exit code. Each command's files are removed by
--     the next one (and all with the sandbox). The sandbox needs setsid, head,
--     sleep and what sandbox_scripts use (coreutils or BusyBox), as Daytona's
--     images have.
--   * read_file: GET /files/info (a missing file is nil; a directory, or a file
--     that is not regular, INVALID_INPUT; larger than max_bytes LIMIT_EXCEEDED
--     before any byte moves), then GET /files/download, bytes as they are.
--   * write_file: POST /files/bulk-upload (multipart): the daemon makes the
--     parents and replaces the file by a rename. A refused upload is diagnosed
--     with one command (a directory is INVALID_INPUT, EACCES PERMISSION_DENIED,
--     no space LIMIT_EXCEEDED).
--   * list_files and remove_file: `sandbox_scripts` through an execute, because
--     Daytona's listing follows symbolic links (a link shows as what it points
--     to) and its delete refuses an empty directory without `recursive`.
--   * url(port): a signed preview URL (GET .../ports/{port}/signed-preview-url)
--     valid for what is left of the sandbox's lifetime (at least a minute, at
--     most Daytona's day); any port, as Daytona serves them all.
--   * desktop (with `desktop = true`): `screenshot()` (PNG bytes),
--     `click{ x, y, button }`, `double_click{ x, y }`, `move{ x, y }`,
--     `drag{ from = { x, y }, to = { x, y } }`, `scroll{ direction, amount, x, y }`,
--     `type(text)`, `key('ctrl+c')`, `size()` ({ width, height }) and
--     `view_url()` (the noVNC page on port 6080, signed) over /computeruse/*.
--
-- Failures: every answer that is not 2xx becomes SANDBOX_ERROR through the kit
-- (`sandbox_http_failure`: 401 authentication, 429 rate_limited with
-- `retry_after_ms`, 5xx unavailable, ...), never with the service's text, and
-- the key is in no message, field or URL. Daytona's proxy answers a toolbox
-- call about a sandbox that is no more with 400, 401 or 5xx rather than 404,
-- so a toolbox failure is checked against the control plane (GET
-- /sandbox/{id}): 404 there, or a state that is not running (destroyed,
-- stopped, archived, error, ...), is SANDBOX_ERROR `gone`.
--
-- `features`: stdin true (through a file), ports true, desktop as asked,
-- network { 'none', 'all', 'allowlist' } (domains; organisations on Daytona's
-- lower tiers have egress limits of their own that a sandbox cannot lift).
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local json, b64 = core.json, core.base64
local q = scripts.quote

local KIB, MIB = 1024, 1048576
local DEFAULT_BASE_URL = 'https://app.daytona.io/api'
local DEFAULT_MAX_LIFETIME_MS = 24 * 3600000
local INLINE = 48 * KIB            -- outputs and standard input up to this travel inside the execute
local MAX_SCRIPT = 96 * KIB        -- a longer script goes to a file first (one argument has 128 KiB)
local WAIT_MS = 10000              -- the longest one execute waits for a command (wait_ms)
local POLL_MAX_MS = 100            -- the longest pause between two looks at a running command
local MAX_RESPONSE = 512 * MIB + 1 -- the pool's largest max_file_bytes, and one byte to see more
local PREVIEW_MAX_S = 86400
local DESKTOP_PORT = 6080
-- states in which the sandbox is not running: its toolbox fails, and the pool calls that gone
local DOWN = {
  destroyed = true, destroying = true, stopped = true, stopping = true, archived = true, archiving = true,
  error = true, build_failed = true, paused = true, pausing = true,
}
local STARTING = {
  creating = true, restoring = true, starting = true, pending_build = true, building_snapshot = true,
  pulling_snapshot = true, unknown = true, resuming = true,
}
-- toolbox statuses that may mean the sandbox is gone (the proxy's way of saying it)
local CONFIRM = { [400] = true, [401] = true, [403] = true, [404] = true, [409] = true, [410] = true,
  [500] = true, [502] = true, [503] = true, [504] = true }

local function gone(message)
  return errors.sandbox('gone', message or 'daytona: the sandbox is gone')
end

local function failed(message)
  return errors.sandbox('failed', 'daytona: ' .. message)
end

local lines_of = scripts.lines

local function int_of(s)
  if type(s) ~= 'string' or not s:match('^%-?%d+$') or #s > 15 then return nil end
  return math.tointeger and math.tointeger(tonumber(s)) or tonumber(s)
end

-- An http(s) URL from the service, or nil: no blanks, no credentials.
local function service_url(u)
  if type(u) ~= 'string' or #u > 2048 or not u:match('^https?://[^%s/@]+') or u:find('[%s%c]') then
    return nil
  end
  if u:match('^https?://[^/]*@') then return nil end
  return u
end

-- {======================================================
-- Scripts
-- =======================================================

-- The daemon hands the command to its shell (zsh when the image lists it, else bash, else sh) on
-- standard input. The scripts of this file are written for all three (quoted expansions, no
-- globs, no `echo -`) and go as they are; sandbox_scripts' are POSIX sh and go as `sh -c '...'`.

-- The command's own shell, in a session of its own: checks the cwd, sets the env, runs the command
-- with its files, writes the exit status, and leaves behind a watcher that removes the files of
-- earlier commands and, a second later, kills what is left in its process group.
-- Arguments: base, cwd, stdin file, trash (a word list), count of env pairs, the pairs, the argv.
-- It says its own pid first (setsid may have forked), in the file the start made, empty, as a lock.
local JOB = 'b=$1 c=$2 i=$3 t=$4 n=$5;shift 5;echo $$ >"$b.pid"\n' ..
  'if [ ! -d "$c" ];then if [ -e "$c" ];then r="E ENOTDIR";else r="E ENOENT";fi\n' ..
  'elif ! cd -- "$c" 2>/dev/null;then r="E EACCES"\n' ..
  'else (while [ "$n" -gt 0 ];do export "$1=$2";shift 2;n=$((n-1));done;exec "$@") <"$i" >"$b.out" 2>"$b.err"' ..
  ';r=$?;fi\n' ..
  ': >>"$b.out";: >>"$b.err";echo "$r" >"$b.rc"\n' ..
  '(sleep 1;eval "rm -f -- $t";kill -9 0) </dev/null >/dev/null 2>&1 &\n'

-- Pauses (in seconds, as sleep takes them) that add up to `ms`: 1 ms doubling to POLL_MAX_MS.
local function pauses(ms)
  local out, d, total = {}, 1, 0
  while total < ms do
    out[#out + 1] = string.format('%d.%03d', math.floor(d / 1000), d % 1000)
    total = total + d
    d = math.min(d * 2, POLL_MAX_MS)
  end
  return table.concat(out, ' ')
end

-- Waits for the command's exit status at most `ms` (looking between pauses), and no longer once
-- its shell is gone (killed, at a timeout or a cancel, before it could write one).
local function wait_script(ms)
  if ms <= 0 then return '' end
  return 'p=;for d in ' .. pauses(ms) .. ';do [ -s "$b.rc" ]&&break\n' ..
    '[ -n "$p" ]||read -r p <"$b.pid";[ -z "$p" ]||kill -0 "$p"||break;sleep $d||sleep 1;done\n'
end

-- What the command did: 'D <status>', 'R' (running, or starting), 'N' (never started), 'X' (ended
-- without a status) or, with `killed`, 'K'; after D and K, stdout and stderr as base64 (up to
-- INLINE + 1 bytes each), ended by a line ':' and a line '.'.
local function report_script(killed)
  local n = tostring(INLINE + 1)
  local blocks = 'if [ -s "$b.out" ];then head -c ' .. n .. ' "$b.out"|base64;fi;echo :\n' ..
    'if [ -s "$b.err" ];then head -c ' .. n .. ' "$b.err"|base64;fi;echo .\n'
  if killed then return 'echo K\n' .. blocks end
  return 'r=;if [ -s "$b.rc" ];then read -r r <"$b.rc";fi\n' ..
    'if [ -z "$r" ];then if [ ! -e "$b.pid" ];then echo N;exit 0;fi;p=;read -r p 2>/dev/null <"$b.pid"\n' ..
    'if [ -z "$p" ]||kill -0 "$p" 2>/dev/null;then echo R;else echo X;fi;exit 0;fi\n' ..
    'echo "D $r"\n' .. blocks
end

-- }======================================================

-- {======================================================
-- The backend
-- =======================================================

local Backend = {}
Backend.__index = Backend

function Backend:_id()
  self._seq = self._seq + 1
  return self._seq
end

-- Whether the sandbox still runs, by the control plane: returns true, or raises gone (404, or a
-- state that is not running) or the control plane's own failure.
function Backend:_check_alive()
  local body = self._api:json('GET', '/sandbox/' .. hosted.escape(self.id), nil, { gone = true })
  if type(body) ~= 'table' then error(self._api:bad_answer('a sandbox that is not an object'), 0) end
  if DOWN[body.state] then error(gone('daytona: the sandbox is ' .. body.state), 0) end
  return true
end

-- Raises `err` from a toolbox call, or gone when the control plane says the sandbox is no more.
function Backend:_toolbox_failed(err)
  if self._closed then error(gone('daytona: the sandbox was released'), 0) end
  if errors.is(err, 'SANDBOX_ERROR') and (CONFIRM[err.status] or err.reason == 'unavailable') then
    local ok, e = pcall(self._check_alive, self)
    if not ok then
      if errors.is(e, 'SANDBOX_ERROR') and e.reason == 'gone' then
        self._closed = true
        e.cause = err
        error(e, 0)
      end
      if errors.is(e, 'SANDBOX_ERROR') and e.reason == 'authentication' then error(e, 0) end
    end
  end
  error(err, 0)
end

-- A toolbox call through the kit (`kind` 'json' or 'call'); failures go through _toolbox_failed.
function Backend:_toolbox(kind, method, path, body, opts)
  if self._closed then error(gone('daytona: the sandbox was released'), 0) end
  local ok, a, b
  if kind == 'json' then
    ok, a, b = pcall(self._tb.json, self._tb, method, path, body, opts)
  else
    ok, a, b = pcall(self._tb.call, self._tb, method, path, opts)
  end
  if not ok then self:_toolbox_failed(a) end
  return a, b
end

-- Runs a script with POST /process/execute and returns its standard output. `o.any_shell`: the
-- script runs in zsh, bash and sh alike (else it goes through `sh -c`). `o.window_ms` bounds the
-- wait for the answer (nil when the answer comes by then: returns nil); `o.signal` cancels it.
function Backend:_execute(script, o)
  o = o or {}
  local window = o.window_ms and math.max(1, math.ceil(o.window_ms))
  if #script > MAX_SCRIPT then
    self:_ensure_state()
    local name = self._state .. '/s' .. self:_id()
    self:_upload(name, 'rm -f -- ' .. q(name) .. '\n' .. script)
    script = (o.any_shell and '. ' or 'sh ') .. q(name) .. '\n'
  end
  local command = 'exec 2>/dev/null\n' .. script
  if not o.any_shell then command = 'sh -c ' .. q(command) end
  local token = task.cancel_token()
  local remove, timer
  if o.signal then remove = o.signal:on_cancel(function() token:cancel('user') end) end
  if window then timer = task.after(window, function() token:cancel('window') end, true) end
  local ok, body = pcall(self._toolbox, self, 'json', 'POST', '/process/execute',
    { command = command }, {
      signal = token, idempotent = true,
      timeout_ms = (window or 0) + self._tb.call_timeout_ms,
    })
  if timer then timer.cancel() end
  if remove then remove() end
  if not ok then
    if token.reason == 'window' and errors.is(body, 'CANCELLED') then return nil end
    if token.reason == 'user' then errors.raise('CANCELLED', 'the command was cancelled', nil, 0) end
    error(body, 0)
  end
  if type(body) ~= 'table' or type(body.result) ~= 'string' then
    error(self._tb:bad_answer('an execute answer without its result'), 0)
  end
  local status = body.exitCode
  if status == nil then status = body.code end   -- the name older daemons gave it
  if status ~= 0 then
    error(failed('a backend command failed in the sandbox (are sh, setsid, base64 and head there?)'), 0)
  end
  return body.result
end

-- Makes the state directory (once; the first exec's script makes it too).
function Backend:_ensure_state()
  if self._state_ready then return end
  local out = self:_execute('mkdir -m 700 -p -- ' .. q(self._state) .. '||{ echo "E state";exit 0;}\necho OK\n',
    { any_shell = true })
  if out ~= 'OK\n' then error(failed('cannot make the state directory in the sandbox'), 0) end
  self._state_ready = true
end

-- Runs one of sandbox_scripts' scripts and returns its output.
function Backend:_script(script, signal)
  return self:_execute(script, { signal = signal })
end

-- Uploads `data` to `path` (POST /files/bulk-upload).
function Backend:_upload(path, data)
  local boundary
  repeat boundary = 'mayura-' .. kit.random_hex(16) until not data:find(boundary, 1, true)
  local body = table.concat({
    '--', boundary, '\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n', path, '\r\n',
    '--', boundary, '\r\nContent-Disposition: form-data; name="files[0].file"; filename="file"\r\n',
    'Content-Type: application/octet-stream\r\n\r\n', data, '\r\n--', boundary, '--\r\n',
  })
  self:_toolbox('call', 'POST', '/files/bulk-upload', nil, {
    body = body, content_type = 'multipart/form-data; boundary=' .. boundary, idempotent = true,
  })
end

-- The paths Daytona's file API takes as they are: it trims blanks around a path, and a line break
-- would end the multipart field.
local function api_path(path)
  if path:find('[\r\n]') or path:match('%s$') then
    errors.raise('INVALID_INPUT', 'daytona: the file API does not take a path with a line break or a trailing blank',
      nil, 0)
  end
  return path
end

-- {------------------------------------------------------ files

-- The daemon's 403 is about the file (the proxy refuses a key with 401).
local function file_refused(status, code)
  if status == 403 and (code == 'FILE_ACCESS_DENIED' or code == 'FORBIDDEN') then
    return errors.new('PERMISSION_DENIED', 'the file: the sandbox does not allow it')
  end
  return nil
end

function Backend:read_file(path, o)
  local max = o and o.max_bytes or 16 * MIB
  local res = self:_toolbox('call', 'GET', '/files/info', nil, { query = { path = api_path(path) }, allow = { 404 },
    on_error = file_refused })
  local info = hosted.decode(res.body, 16)
  if res.status == 404 then
    local code = type(info) == 'table' and info.code or nil
    if code ~= 'FILE_NOT_FOUND' then self:_check_alive() end
    return nil
  end
  if type(info) ~= 'table' or type(info.isDir) ~= 'boolean' or type(info.size) ~= 'number' then
    error(self._tb:bad_answer('file information that is not an object'), 0)
  end
  if info.isDir then errors.raise('INVALID_INPUT', 'the file is a directory', nil, 0) end
  if type(info.mode) == 'string' and info.mode:sub(1, 1) ~= '-' then
    errors.raise('INVALID_INPUT', 'the file is not a regular file', nil, 0)
  end
  if info.size > max then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes', nil, 0) end
  res = self:_toolbox('call', 'GET', '/files/download', nil, { query = { path = path }, allow = { 404 },
    on_error = file_refused })
  if res.status == 404 then return nil end
  if #res.body > max then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes', nil, 0) end
  return res.body
end

-- Why an upload was refused, by trying its steps in a command: the mapped error.
function Backend:_why_not_written(path)
  local tmp = scripts.temp_name(path, self._prefix:sub(1, 8) .. self:_id())
  local ok, out = pcall(self._script, self, scripts.write_begin(path, tmp) .. scripts.write_abort(tmp))
  if ok then
    for _, line in ipairs(lines_of(out)) do
      local code = line:match('^E ([%w_]+)$')
      if code then return scripts.script_error(code, 'the file') end
    end
  end
  return nil
end

function Backend:write_file(path, data)
  local ok, err = pcall(self._upload, self, api_path(path), data)
  if ok then return end
  if errors.is(err, 'SANDBOX_ERROR') and err.status == 400 then
    local why = self:_why_not_written(path)
    if why then
      why.cause = err
      error(why, 0)
    end
  end
  error(err, 0)
end

function Backend:list_files(path)
  return scripts.parse_listing(self:_script(scripts.list(path)))
end

function Backend:remove_file(path, o)
  scripts.remove_result(self:_script(scripts.remove(path, o and o.recursive)), function()
    return self._tb:bad_answer('nonsense')
  end)
end

-- }------------------------------------------------------

-- {------------------------------------------------------ commands

-- The outputs a report gave (decoded), and whether each was cut at INLINE + 1 bytes.
local function parse_blocks(self, lines, i)
  local parts, k, j = { {}, {} }, 1, i
  while lines[j] and lines[j] ~= '.' do
    if lines[j] == ':' and k == 1 then k = 2 else table.insert(parts[k], lines[j]) end
    j = j + 1
  end
  if lines[j] ~= '.' or j ~= #lines or k ~= 2 then error(self._tb:bad_answer('a command report out of shape'), 0) end
  local out = {}
  for n = 1, 2 do
    local text = table.concat(parts[n])
    local data = text == '' and '' or b64.decode(text)
    if not data then error(self._tb:bad_answer('output that is not base64'), 0) end
    out[n] = data
  end
  return out[1], out[2]
end

-- stdout and stderr from the report's blocks, fetching whole files (cut at `cap` in the sandbox)
-- when one passed INLINE; returns them and whether one was cut.
function Backend:_outputs(base, out, err, cap)
  local truncated = false
  if #out > INLINE or #err > INLINE then
    local sizes = self:_execute('b=' .. q(base) .. '\n' ..
      'for f in out err;do s=0;if [ -s "$b.$f" ];then s=$(stat -c %s -- "$b.$f")||s=0;fi\n' ..
      'if [ "$s" -gt ' .. cap .. ' ];then head -c ' .. cap .. ' "$b.$f" >"$b.$f.c";mv -f "$b.$f.c" "$b.$f";fi\n' ..
      'echo "$s";done\n', { any_shell = true })
    local l = lines_of(sizes)
    local so, se = int_of(l[1]), int_of(l[2])
    if not so or not se or #l ~= 2 then error(self._tb:bad_answer('nonsense sizes'), 0) end
    truncated = so > cap or se > cap
    if #out > INLINE then
      local res = self:_toolbox('call', 'GET', '/files/download', nil, { query = { path = base .. '.out' } })
      out = res.body
    end
    if #err > INLINE then
      local res = self:_toolbox('call', 'GET', '/files/download', nil, { query = { path = base .. '.err' } })
      err = res.body
    end
  end
  if #out > cap then out, truncated = out:sub(1, cap), true end
  if #err > cap then err, truncated = err:sub(1, cap), true end
  return out, err, truncated
end

-- Reads a report: 'done', status, stdout, stderr | 'killed', nil, stdout, stderr | 'running' |
-- 'unstarted' | 'lost'.
function Backend:_read_report(text)
  local lines = lines_of(text)
  local head = lines[1] or ''
  if head == 'R' and #lines == 1 then return 'running' end
  if head == 'N' and #lines == 1 then return 'unstarted' end
  if head == 'X' and #lines == 1 then return 'lost' end
  local code = head:match('^E ([%w_]+)$')
  if code and #lines == 1 then
    if code == 'nosetsid' then error(failed('the sandbox has no setsid, which commands need'), 0) end
    if code == 'state' then error(failed('cannot make the state directory in the sandbox'), 0) end
    error(self._tb:bad_answer('an unknown failure'), 0)
  end
  local status = head:match('^D (.*)$')
  if head ~= 'K' and not status then error(self._tb:bad_answer('a command report out of shape'), 0) end
  local out, err = parse_blocks(self, lines, 2)
  if status then return 'done', status, out, err end
  return 'killed', nil, out, err
end

-- The script that starts a command (unless it started already: the call may be a repeat) and
-- waits for it. `rec` = { base, tag }, `cwd`, `env`, `argv`, `stdin_inline`, `stdin_file`.
function Backend:_start_script(rec, cwd, env, argv, stdin_inline, stdin_file, window_ms)
  local b = rec.base
  local trash = {}
  for i, t in ipairs(self._trash) do trash[i] = q(t) .. '.*' end
  self._trash = {}
  local words = { q(b), q(cwd), q(stdin_file or '/dev/null'), q(table.concat(trash, ' ')) }
  local names = {}
  for k in pairs(env) do names[#names + 1] = k end
  table.sort(names)
  words[#words + 1] = tostring(#names)
  for _, k in ipairs(names) do
    words[#words + 1] = q(k)
    words[#words + 1] = q(env[k])
  end
  for _, a in ipairs(argv) do words[#words + 1] = q(a) end
  local input = ''
  if stdin_inline then
    input = "printf %s '" .. b64.encode(stdin_inline) .. "'|base64 -d >|" .. q(b .. '.in') .. '\n'
  end
  return 'b=' .. q(b) .. '\n' ..
    'if [ ! -d ' .. q(self._state) .. ' ];then mkdir -m 700 -p -- ' .. q(self._state) ..
    '||{ echo "E state";exit 0;};fi\n' ..
    'command -v setsid >/dev/null 2>&1||{ echo "E nosetsid";exit 0;}\n' ..
    'set -C\nif true >"$b.pid";then\n' .. input ..
    scripts.TAG_VAR .. '=' .. q(rec.tag) .. ' setsid sh -c ' .. q(JOB) .. ' sh ' .. table.concat(words, ' ') ..
    ' </dev/null >/dev/null 2>&1 &\n' ..
    'wait $!\nfi\nset +C\n' ..
    wait_script(window_ms) .. report_script(false)
end

function Backend:exec(argv, o)
  local id = self:_id()
  local rec = { tag = self._prefix .. '.' .. id, base = self._state .. '/x' .. id }
  local cap = o.max_output_bytes or MIB
  local started = core.hrtime_ms()
  local deadline = started + (o.timeout_ms or 60000)
  local env = {}
  for k, v in pairs(self._env) do env[k] = v end   -- a warm sandbox's: its create's env
  for k, v in pairs(o.env or {}) do env[k] = v end
  local token = o.signal
  local stdin_inline, stdin_file
  if o.stdin then
    if #o.stdin <= INLINE then
      stdin_inline, stdin_file = o.stdin, rec.base .. '.in'
    else
      self:_ensure_state()
      stdin_file = rec.base .. '.in'
      self:_upload(stdin_file, o.stdin)
    end
  end
  local cwd = o.cwd or self._workdir
  local ok, res = pcall(function()
    local window = math.max(1, math.min(self._wait_ms, deadline - core.hrtime_ms()))
    local start = self:_start_script(rec, cwd, env, argv, stdin_inline, stdin_file, window)
    local text = self:_execute(start, { window_ms = window, signal = token, any_shell = true })
    local kind, status, out, err
    while true do
      if text then
        kind, status, out, err = self:_read_report(text)
        self._state_ready = true
        if kind == 'done' then break end
        if kind == 'lost' then error(failed('the command ended without an exit status'), 0) end
      end
      local left = deadline - core.hrtime_ms()
      if left <= 5 then
        -- the timeout: stop everything it started, then take what it wrote
        text = self:_execute('b=' .. q(rec.base) .. '\n' .. scripts.kill(rec.tag) .. report_script(true))
        kind, status, out, err = self:_read_report((text:gsub('^OK\n', '', 1)))
        break
      end
      window = math.min(self._wait_ms, left)
      if kind == 'unstarted' then
        -- the first call never reached the sandbox (its window passed first): send it again
        text = self:_execute(self:_start_script(rec, cwd, env, argv, stdin_inline, stdin_file, window),
          { window_ms = window, signal = token, any_shell = true })
      else
        text = self:_execute('b=' .. q(rec.base) .. '\n' .. wait_script(window) .. report_script(false),
          { window_ms = window + 2000, signal = token, any_shell = true })
      end
    end
    local so, se, truncated = self:_outputs(rec.base, out, err, cap)
    local r = { stdout = so, stderr = se, truncated = truncated }
    if kind == 'killed' then
      r.timed_out = true
    else
      local code = status:match('^E ([%w_]+)$')
      if code then error(scripts.script_error(code, 'cwd'), 0) end
      r.exit_code = int_of(status)
      if not r.exit_code then error(self._tb:bad_answer('an exit status that is not a number'), 0) end
      r.timed_out = false
    end
    return r
  end)
  self._trash[#self._trash + 1] = rec.base
  if not ok then
    if errors.is(res, 'CANCELLED') or (token and token.cancelled) then
      -- stop what it started, whether the start got through or not
      if not self._closed then pcall(self._execute, self, scripts.kill(rec.tag)) end
      errors.raise('CANCELLED', 'the command was cancelled', nil, 0)
    end
    error(res, 0)
  end
  res.duration_ms = core.hrtime_ms() - started
  return res
end

-- }------------------------------------------------------

-- {------------------------------------------------------ url, release

function Backend:url(port)
  local left = math.floor((self._expires_at - core.hrtime_ms()) / 1000)
  local expires = math.max(60, math.min(PREVIEW_MAX_S, left))
  local path = '/sandbox/' .. hosted.escape(self.id) .. '/ports/' .. port .. '/signed-preview-url'
  local body = self._api:json('GET', path, nil, { query = { expiresInSeconds = expires }, gone = true })
  local u = type(body) == 'table' and service_url(body.url)
  if not u then error(self._api:bad_answer('a preview URL that is not an http(s) URL'), 0) end
  return u
end

function Backend:release()
  if self._released then return end
  self._released, self._closed = true, true
  -- 404: it ended already, which is what release wants
  self._api:json('DELETE', '/sandbox/' .. hosted.escape(self.id), nil, { allow = { 404 } })
end

-- }------------------------------------------------------

-- }======================================================

-- {======================================================
-- The desktop (Daytona's computer use)
-- =======================================================

local Desktop = {}
Desktop.__index = Desktop

local BUTTONS = { left = true, right = true, middle = true }
local DIRECTIONS = { up = true, down = true, left = true, right = true }
local MODIFIERS = { ctrl = 'ctrl', control = 'ctrl', alt = 'alt', shift = 'shift', cmd = 'cmd', super = 'cmd',
  meta = 'cmd', win = 'cmd' }
local PNG = '\137PNG\r\n\26\n'

local function xy(v, name)
  return check.int(v, name, 0, 100000, 'INVALID_INPUT', 4)
end

function Desktop:_call(method, path, body)
  local b = self._b
  if b._closed or core.hrtime_ms() >= b._expires_at then error(gone(), 0) end
  return b:_toolbox('json', method, path, body)
end

function Desktop:screenshot()
  local body = self:_call('GET', '/computeruse/screenshot')
  local data = type(body) == 'table' and type(body.screenshot) == 'string' and b64.decode(body.screenshot)
  if not data or data:sub(1, 8) ~= PNG then error(self._b._tb:bad_answer('a screenshot that is not a PNG'), 0) end
  return data
end

function Desktop:click(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'click takes { x, y, button }', nil, 2) end
  local button = o.button or 'left'
  if not BUTTONS[button] then errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 2) end
  self:_call('POST', '/computeruse/mouse/click', { x = xy(o.x, 'x'), y = xy(o.y, 'y'), button = button,
    double = o.double == true })
end

function Desktop:double_click(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'double_click takes { x, y }', nil, 2) end
  self:click({ x = o.x, y = o.y, button = o.button, double = true })
end

function Desktop:move(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'move takes { x, y }', nil, 2) end
  self:_call('POST', '/computeruse/mouse/move', { x = xy(o.x, 'x'), y = xy(o.y, 'y') })
end

function Desktop:drag(o)
  if type(o) ~= 'table' or type(o.from) ~= 'table' or type(o.to) ~= 'table' then
    errors.raise('INVALID_INPUT', 'drag takes { from = { x, y }, to = { x, y } }', nil, 2)
  end
  local button = o.button or 'left'
  if not BUTTONS[button] then errors.raise('INVALID_INPUT', "button must be 'left', 'right' or 'middle'", nil, 2) end
  self:_call('POST', '/computeruse/mouse/drag', { startX = xy(o.from.x, 'from.x'), startY = xy(o.from.y, 'from.y'),
    endX = xy(o.to.x, 'to.x'), endY = xy(o.to.y, 'to.y'), button = button })
end

function Desktop:scroll(o)
  if type(o) ~= 'table' then errors.raise('INVALID_INPUT', 'scroll takes { direction, amount, x, y }', nil, 2) end
  if not DIRECTIONS[o.direction] then
    errors.raise('INVALID_INPUT', "direction must be 'up', 'down', 'left' or 'right'", nil, 2)
  end
  local amount = check.int(o.amount, 'amount', 1, 100, 'INVALID_INPUT', 3, 1)
  local x, y = o.x, o.y
  if x == nil or y == nil then
    local at = self:_call('GET', '/computeruse/mouse/position')
    x, y = type(at) == 'table' and at.x, type(at) == 'table' and at.y
    if not check.is_int(x) or not check.is_int(y) then error(self._b._tb:bad_answer('a mouse position'), 0) end
  end
  self:_call('POST', '/computeruse/mouse/scroll', { x = xy(x, 'x'), y = xy(y, 'y'), direction = o.direction,
    amount = amount })
end

function Desktop:type(text)
  if type(text) ~= 'string' or #text > 100000 or text:find('%z') then
    errors.raise('INVALID_INPUT', 'type takes a string without NUL bytes (at most 100000 bytes)', nil, 2)
  end
  self:_call('POST', '/computeruse/keyboard/type', { text = text })
end

--- A key, or a chord such as 'ctrl+c' or 'ctrl+shift+t'.
function Desktop:key(name)
  if type(name) ~= 'string' or #name == 0 or #name > 64 or not name:match('^[%w_+%-]+$') then
    errors.raise('INVALID_INPUT', "key takes a key name such as 'Return' or 'ctrl+c'", nil, 2)
  end
  local parts = {}
  for p in name:gmatch('[^+]+') do parts[#parts + 1] = p end
  if #parts == 0 then errors.raise('INVALID_INPUT', 'key takes a key name', nil, 2) end
  local mods = setmetatable({}, json.array_mt)
  for i = 1, #parts - 1 do
    local m = MODIFIERS[parts[i]:lower()]
    if not m then errors.raise('INVALID_INPUT', 'unknown modifier ' .. parts[i], nil, 2) end
    mods[#mods + 1] = m
  end
  self:_call('POST', '/computeruse/keyboard/key', { key = parts[#parts], modifiers = mods })
end

--- The screen's size, `{ width, height }`.
function Desktop:size()
  local body = self:_call('GET', '/computeruse/display/info')
  local displays = type(body) == 'table' and body.displays
  local d = type(displays) == 'table' and displays[1]
  if type(displays) == 'table' then
    for _, x in ipairs(displays) do
      if type(x) == 'table' and x.isActive then d = x break end
    end
  end
  if type(d) ~= 'table' or not check.is_int(d.width) or not check.is_int(d.height) then
    error(self._b._tb:bad_answer('display information'), 0)
  end
  return { width = d.width, height = d.height }
end

--- A URL of the desktop's live view in a browser (noVNC), signed.
function Desktop:view_url()
  local b = self._b
  if b._closed then error(gone(), 0) end
  return b:url(DESKTOP_PORT):gsub('/+$', '') .. '/vnc.html'
end

-- }======================================================

-- {======================================================
-- The provider
-- =======================================================

local CREATE_LABEL = 'mayura-create'   -- Daytona's label of a create: what finds one whose answer was lost

local function name_option(v, _, name)
  if v == nil then return nil end
  if type(v) ~= 'string' or v == '' or #v > 256 or v:find('[%c]') then
    errors.raise('INVALID_CONFIG', 'daytona: ' .. name .. ' must be a non-empty string', nil, 0)
  end
  return v
end

local function workdir_option(v)
  if v ~= nil and (type(v) ~= 'string' or not v:match('^/[%w%._%-/]*$') or #v > 256
      or v:find('/%.%.?/') or v:find('/%.%.?$')) then
    errors.raise('INVALID_CONFIG', 'daytona: workdir must be an absolute path of letters, digits, . _ - and /', nil, 0)
  end
  return v
end

local function key_option(v)
  -- its form is checked by the kit's client, which keeps it out of every message
  if v == nil then errors.raise('INVALID_CONFIG', 'daytona: api_key is required', nil, 0) end
  return v
end

local function taken(v) return v end

--- The provider: see the module's comment for the options.
function M.daytona_sandboxes(options)
  local o = kit.options(options, {
    { api_key = key_option }, { base_url = kit.url(DEFAULT_BASE_URL) }, { workdir = workdir_option },
    { desktop = kit.bool(false) }, { snapshot = name_option }, { target = name_option }, { user = name_option },
    { wait_ms = kit.int(100, 600000, WAIT_MS) },
    { max_lifetime_ms = kit.int(60000, nil, DEFAULT_MAX_LIFETIME_MS) },
    { retries = taken }, { retry_base_ms = taken },
    { warm = kit.int(0, 64, 0) },
  }, 'daytona', 'daytona_sandboxes needs an options table with api_key')
  local api = hosted.client({
    label = 'daytona', base_url = o.base_url, api_key = o.api_key,
    retries = o.retries, retry_base_ms = o.retry_base_ms, max_response_bytes = MAX_RESPONSE,
  })
  local secure = o.base_url:match('^https://') ~= nil
  local desktop = o.desktop
  local learned = o.workdir ~= nil

  return kit.provider({
    id = 'daytona', label = 'daytona', client = api, warm = o.warm, warm_ports = true,
    features = { stdin = true, ports = true, desktop = desktop, network = { 'none', 'all', 'allowlist' } },
    workdir = o.workdir or '/home/daytona', max_lifetime_ms = o.max_lifetime_ms,
    -- a create the service finishes late is looked for now and twice more; one missed still ends at
    -- its ttlMinutes (the waits do not keep a script's loop alive)
    sweep_after_ms = { 0, 2000, 10000 }, sweep_in_background = true,
    ready_interval_ms = 50, ready_backoff_max_ms = 1000,

    create = function(ctx)
      local spec = ctx.spec
      local minutes = hosted.lifetime(spec.lifetime_ms, { unit = 'min' })
      local labels = {}
      for k, v in pairs(spec.labels or {}) do labels[k] = v end
      labels[CREATE_LABEL] = ctx.tag
      local net = spec.network
      local body = {
        snapshot = spec.image or o.snapshot, target = o.target, user = o.user,
        env = kit.object(spec.env),
        labels = hosted.metadata(labels, { max_keys = 64, max_key_bytes = 63, key_pattern = '^[%w][%w%._/%-]*$' }),
        public = false,
        networkBlockAll = net == 'none',
        domainAllowList = type(net) == 'table' and table.concat(net.allow, ',') or nil,
        ttlMinutes = minutes, autoStopInterval = minutes, autoDeleteInterval = 0,
      }
      if spec.cpus then body.cpu = math.ceil(spec.cpus) end
      if spec.memory_mib then body.memory = math.ceil(spec.memory_mib / 1024) end
      return ctx.client:json('POST', '/sandbox', body)
    end,

    accept = function(ctx, sb)
      if type(sb) ~= 'table' or type(sb.id) ~= 'string' or not sb.id:match('^[%w%._%-]+$') or #sb.id > 128 then
        error(ctx.client:bad_answer('a sandbox without an id'), 0)
      end
      return { id = sb.id, sb = sb }
    end,

    find = function(_, tag)
      local body = api:json('GET', '/sandbox', nil, {
        query = { labels = json.encode(kit.object({ [CREATE_LABEL] = tag })) },
      })
      local found = {}
      local items = type(body) == 'table' and (body.items or body) or {}
      for _, s in ipairs(type(items) == 'table' and items or {}) do
        if type(s) == 'table' and type(s.id) == 'string' and type(s.labels) == 'table'
          and s.labels[CREATE_LABEL] == tag then
          found[#found + 1] = { id = s.id }
        end
      end
      return found
    end,

    -- until it runs: the create's answer first, then GET /sandbox/{id}
    ready = function(ctx, h)
      if h.polled then
        h.sb = ctx.client:json('GET', '/sandbox/' .. hosted.escape(h.id), nil, { gone = true })
        if type(h.sb) ~= 'table' then error(ctx.client:bad_answer('a sandbox that is not an object'), 0) end
      end
      h.polled = true
      local state = h.sb.state
      if state == 'started' then return true end
      if not STARTING[state] and state ~= nil then
        error(failed('the sandbox did not start (' .. (DOWN[state] and state or 'an unknown state') .. ')'), 0)
      end
      return false
    end,

    backend = function(ctx, h)
      local c, id, p = ctx.client, h.id, ctx.provider
      local self = setmetatable({
        id = id, _api = c, _seq = 0, _trash = {}, _prefix = kit.random_hex(8), _closed = false,
        _wait_ms = o.wait_ms, _expires_at = ctx.started + ctx.spec.lifetime_ms, _env = {},
      }, Backend)
      self._state = '/tmp/.mayura-' .. self._prefix
      local proxy = service_url(h.sb.toolboxProxyUrl)
      if not proxy or (secure and not proxy:match('^https://')) then
        error(c:bad_answer('a toolbox URL that is not ' .. (secure and 'https' or 'http(s)')), 0)
      end
      self._tb = c:with({ base_url = proxy:gsub('/+$', '') .. '/' .. hosted.escape(id) })
      if desktop then
        local dok, derr = pcall(self._toolbox, self, 'json', 'POST', '/computeruse/start', nil)
        if not dok then
          local e = failed('the desktop did not start (does the snapshot have one?)')
          e.cause = derr
          error(e, 0)
        end
        self.desktop = setmetatable({ _b = self }, Desktop)
      end
      if not learned then
        local dir = self:_toolbox('json', 'GET', '/work-dir')
        local d = type(dir) == 'table' and dir.dir
        if type(d) ~= 'string' or not d:match('^/[%w%._%-/]*$') or #d > 256 then
          error(c:bad_answer('a working directory that is not a plain absolute path'), 0)
        end
        d = d:gsub('(.)/+$', '%1')
        if not learned then p.workdir, learned = d, true end
      end
      self._workdir = p.workdir
      return self
    end,

    destroy = function(ctx, h)
      ctx.client:json('DELETE', '/sandbox/' .. hosted.escape(h.id), nil, { allow = { 404 } })
    end,

    -- a warm sandbox given to a create: its env goes with every command, and its signed URLs last
    -- the asked lifetime (Daytona's ttl stays the warm one's: the pool ends it at the asked one)
    hand_out = function(_, backend, spec)
      for k, v in pairs(spec.env or {}) do backend._env[k] = v end
      backend._expires_at = core.hrtime_ms() + spec.lifetime_ms
    end,
  })
end

-- }======================================================

M.sandboxes = M.daytona_sandboxes   -- the generic name, which mayura.sandbox.provider(name, options) calls
return M
