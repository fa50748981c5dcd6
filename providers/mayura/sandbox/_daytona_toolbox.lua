--- mayura.sandbox._daytona_toolbox: a Daytona sandbox's toolbox, the backend of
-- mayura.sandbox.daytona (whose control plane makes the sandbox; the desktop is
-- mayura.sandbox._daytona_desktop).
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
--
-- `M.new(fields)` makes the backend: { id, _api (the control plane's client), _tb (the
-- toolbox's), _wait_ms, _expires_at (hrtime ms), _workdir, _env (every command's) }.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local hosted = require('mayura.sandbox._hosted')
local kit = require('mayura.sandbox._kit')
local scripts = require('mayura.sandbox.scripts')
local command_scripts = require('mayura.sandbox._command_scripts')

local M = {}

local b64 = core.base64
local q = scripts.quote

local KIB, MIB = 1024, 1048576
local INLINE = 48 * KIB            -- outputs and standard input up to this travel inside the execute
local MAX_SCRIPT = 96 * KIB        -- a longer script goes to a file first (one argument has 128 KiB)
local POLL_MAX_MS = 100            -- the longest pause between two looks at a running command
local PREVIEW_MAX_S = 86400
--- States in which the sandbox is not running: its toolbox fails, and the pool calls that gone.
M.DOWN = {
  destroyed = true, destroying = true, stopped = true, stopping = true, archived = true, archiving = true,
  error = true, build_failed = true, paused = true, pausing = true,
}
local DOWN = M.DOWN
-- toolbox statuses that may mean the sandbox is gone (the proxy's way of saying it)
local CONFIRM = { [400] = true, [401] = true, [403] = true, [404] = true, [409] = true, [410] = true,
  [500] = true, [502] = true, [503] = true, [504] = true }

--- SANDBOX_ERROR `gone`.
function M.gone(message)
  return errors.sandbox('gone', message or 'daytona: the sandbox is gone')
end
local gone = M.gone

--- SANDBOX_ERROR `failed`, with `message` after the provider's name.
function M.failed(message)
  return errors.sandbox('failed', 'daytona: ' .. message)
end
local failed = M.failed

local lines_of = scripts.lines

local function int_of(s)
  if type(s) ~= 'string' or not s:match('^%-?%d+$') or #s > 15 then return nil end
  return math.tointeger and math.tointeger(tonumber(s)) or tonumber(s)
end

--- An http(s) URL from the service, or nil: no blanks, no credentials.
function M.service_url(u)
  if type(u) ~= 'string' or #u > 2048 or not u:match('^https?://[^%s/@]+') or u:find('[%s%c]') then
    return nil
  end
  if u:match('^https?://[^/]*@') then return nil end
  return u
end
local service_url = M.service_url

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

kit.script_files(Backend, function(b) return b._tb:bad_answer('nonsense') end)

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
  local words = command_scripts.env_argv_words(
    { q(b), q(cwd), q(stdin_file or '/dev/null'), q(table.concat(trash, ' ')) }, env, argv)
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

--- The backend over the fields (see the module's comment).
function M.new(fields)
  fields._seq, fields._trash, fields._closed = 0, {}, false
  fields._prefix = kit.random_hex(8)
  fields._state = '/tmp/.mayura-' .. fields._prefix
  return setmetatable(fields, Backend)
end

return M
