--- A stand-in for E2B on a stand-in (support/stand_in.lua), backed by real local sandboxes
-- (stand_in.local_backing): close enough to the published API that the official `e2b` and
-- `@e2b/desktop` npm SDKs work against it unchanged (pointed at it with apiUrl and sandboxUrl),
-- and what the specs of mayura.sandbox.e2b and .e2b_desktop talk to.
--
--   local svc = stand_in.new()
--   local e2b = e2b_service.install(svc, stand_in.local_backing(), { api_key = KEY })
--   -- control plane and envd both on svc:url(''): apiUrl = sandboxUrl = svc:url('')
--
-- Control plane (X-API-Key; a wrong key is 401 with a body that echoes the key it got):
--   POST /v2/sandboxes, POST /sandboxes (deprecated)   NewSandbox { templateID, timeout (s, 15
--        when left out), envVars, metadata, allow_internet_access, network { allowOut, denyOut } };
--        every sandbox of /v2 is secured, one of /sandboxes only when `secure` is not false
--        -> 201 Sandbox { sandboxID, templateID, alias, clientID, envdVersion, envdAccessToken,
--        trafficAccessToken, domain }; 404 for a template it does not know, 400 for a bad body
--   GET /sandboxes/{id}                   -> SandboxDetail, 404 once it ended
--   DELETE /sandboxes/{id}                -> 204, 404 once it ended
--   GET /v2/sandboxes, GET /sandboxes     -> ListedSandbox list (metadata=<k=v&...> filters)
--   POST /sandboxes/{id}/timeout          -> 204 (recorded as the new end; the backing's
--                                            lifetime is not changed)
--   POST /sandboxes/{id}/snapshots        SandboxSnapshotRequest { name? } -> 201 SnapshotInfo
--        { snapshotID, names }: a persistent snapshot that outlives the sandbox. The sandbox is
--        paused while it is made (its envd calls wait until it runs again, as E2B's proxy holds
--        them); 404 for a sandbox that ended, 400 for a bad body. The ID is `<id>:default`, or
--        `stand-in/<name>:default` for a named one (a name given again gets the new build, the
--        old one goes). What it keeps: the backing sandbox's files (its home and /tmp, through
--        the backing pool's snapshot); E2B keeps the whole disk and the memory too, so what ran
--        in the sandbox runs on in one made from it: the stand-in starts none of it.
--   GET /snapshots?sandboxID=&name=       -> SnapshotInfo list
--   DELETE /templates/{id}                -> 204 (a snapshot: deleted), 404 for one it does not
--        know; POST /v2/sandboxes takes a snapshot ID as templateID
-- envd, for the sandbox named by E2b-Sandbox-Id (or a Host of 49983-<id>.<domain>), with
-- X-Access-Token when it was made `secure`; a sandbox that is not there (ended, vanished) is
-- the proxy's 502 { sandboxId, message: "The sandbox was not found", code: 502 }:
--   GET /health                           204
--   GET /files?path=                      the bytes (Range honoured: 206, or 416 past the end;
--                                         an empty file is 200); 404 none, 400 a directory
--   POST /files?path=                     application/octet-stream, or multipart/form-data with
--                                         parts named "file" (the filename is the path without
--                                         ?path=) -> [{ path, name, type }]
--   POST /filesystem.Filesystem/{ListDir,Stat,Remove,MakeDir}   Connect unary (JSON)
--   POST /process.Process/Start           Connect server stream: start { pid }, data { stdout |
--                                         stderr } (base64, 32 KiB at most, sent as the command writes), end { exitCode,
--                                         exited, status }, then the end of stream ({} or
--                                         { error: { code } }: deadline_exceeded at the
--                                         Connect-Timeout-Ms, invalid_argument for a bad cwd)
--   POST /process.Process/{SendInput,CloseStdin,SendSignal,List}  Connect unary
-- Relative paths and cwds are against the backing's home (/workspace: the E2B provider is told
-- so with its `workdir` option). How the stand-in differs from envd: a command started with
-- stdin waits for CloseStdin before it runs; closing the stream does not stop a command, as in
-- envd. The Connect deadline (SIGKILL) and SendSignal reach the command's own process only, as
-- envd's do (`e2b.signalled` records each: { sandbox, pid, os_pid, signal, why }); unlike envd, the
-- stream ends when that process ends even while a child still holds its output. A sandbox asked
-- for a domain allow-list is kept offline (the backing cannot filter by domain); one asked for
-- the internet gets the backing's 'all'.
--
-- The desktop (template `desktop`): local sandboxes have no X server yet, so the stand-in
-- answers the desktop's commands itself (Xvfb, xdpyinfo, startxfce4, pgrep of Xfce, scrot,
-- xdotool, xrandr, x11vnc, noVNC, netstat) and records each action in
-- `e2b.sandboxes[id].desktop.actions`; a screenshot is a fixed PNG (M.PNG, 160x120) written to
-- the path scrot was given, in the real sandbox. Every other command runs for real.
--
-- Knobs for fault specs: `e2b.create_delay_ms` (a create makes the sandbox, then answers that
-- long after, whether or not the client waited), `e2b.snapshot_answer` (an answer a snapshot
-- call gives after it made the snapshot: a lost answer), `M.cut_stream(after)` (an answer for
-- svc:fault that starts a command's stream, sends `after` bytes of output and cuts the
-- connection), and the stand-in's own faults on the routes above (patterns as written there).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local stand_in = require('support.stand_in')

local json, b64 = core.json, core.base64

local M = {}

M.ENVD_VERSION = '0.5.8'
M.HOME = '/workspace'
M.MAX_TIMEOUT_S = 86400
M.CUT = 'e2b stand-in: the stream was cut'
local CHUNK = 32 * 1024

M.PNG = b64.decode('iVBORw0KGgoAAAANSUhEUgAAAKAAAAB4CAIAAAD6wG44AAABO0lEQVR42u3csQ0AEBRFUeMYwmBG1KhtoLGEFUQhwkl+/' ..
  '5J7WhFiyu7hCxIAdoAdYAfYAXaAHWDADrAD7AA7wA6wA/wtcO9j+0pt22f3zC5gwEIDFvpeYLHe3gUMWGjAQgMGDNguYLuA7QIGLDRgoQELDdguY' ..
  'LuA7QIGLDRgoQELDRjwWWCxvKoUGrDQgAEDtgvYLmC7gAELDVhowEIDtgvYLmC7gAELDVhowEIDBgzYrn+y7HpVaRcwYKEBCw1YaMB2AdsFbBcwY' ..
  'KEBCw1YaMB2AdsFbBcwYKEBCw1YaP9kQfKq0i5gu4DtAgYsNGChAQsN2C5gu4DtAgYsNGChAQsNGDBgu4DtAgYstH+yxPKqUmjAgAHbBWwXsF3Ag' ..
  'IUGLDRgoQHbBWwXsF3AgIUGLDRgoQEDBmwXsN2lm/zOk8IDMZl3AAAAAElFTkSuQmCC')

-- {======================================================
-- Wire helpers
-- =======================================================

local function envelope(flags, text)
  local n = #text
  return string.char(flags, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256,
    n % 256) .. text
end
M.envelope = envelope

-- The one message of an enveloped request body, decoded; nil when it is not one.
local function unenvelope(body)
  if type(body) ~= 'string' or #body < 5 then return nil end
  local a, b, c, d, e = body:byte(1, 5)
  local n = (((b * 256) + c) * 256 + d) * 256 + e
  if a ~= 0 or n ~= #body - 5 then return nil end
  local ok, v = pcall(json.decode, body:sub(6))
  if ok and type(v) == 'table' then return v end
  return nil
end

local function event(ev)
  return envelope(0, json.encode({ event = ev }))
end

local function object(t) return setmetatable(t or {}, json.object_mt) end
local function array(t) return setmetatable(t or {}, json.array_mt) end

local CONNECT_STATUS = {
  invalid_argument = 400, failed_precondition = 400, unauthenticated = 401, permission_denied = 403,
  not_found = 404, already_exists = 409, resource_exhausted = 429, internal = 500, unimplemented = 501,
  unavailable = 503, deadline_exceeded = 504,
}

local function connect_error(code, message)
  return { status = CONNECT_STATUS[code] or 500, json = { code = code, message = message or code } }
end

local function rfc3339(ms)
  local s = math.floor(ms / 1000)
  return os.date('!%Y-%m-%dT%H:%M:%S', s) .. string.format('.%03dZ', math.floor(ms % 1000))
end

local function now_ms()
  return os.time() * 1000
end

local function random_token(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f:read(n)
  f:close()
  return (bytes:gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

-- Splits a shell command line into words: '...', "..." (with \ before " \ $ `), \x, blanks.
-- Nil for anything else (operators, substitutions): such a line is not one of the desktop's.
local function words(line)
  local out, cur, i, n, has = {}, {}, 1, #line, false
  while i <= n do
    local c = line:sub(i, i)
    if c == "'" then
      local j = line:find("'", i + 1, true)
      if not j then return nil end
      cur[#cur + 1] = line:sub(i + 1, j - 1)
      has, i = true, j + 1
    elseif c == '"' then
      i = i + 1
      while true do
        local d = line:sub(i, i)
        if d == '' then return nil end
        if d == '"' then break end
        if d == '\\' and line:sub(i + 1, i + 1):match('["\\$`]') then
          d = line:sub(i + 1, i + 1)
          i = i + 1
        elseif d == '$' or d == '`' then
          return nil
        end
        cur[#cur + 1] = d
        i = i + 1
      end
      has, i = true, i + 1
    elseif c == '\\' then
      cur[#cur + 1] = line:sub(i + 1, i + 1)
      has, i = true, i + 2
    elseif c:match('%s') then
      if has then out[#out + 1] = table.concat(cur); cur, has = {}, false end
      i = i + 1
    elseif c:match('[;&|<>()$`*?{}]') then
      return nil
    else
      cur[#cur + 1] = c
      has, i = true, i + 1
    end
  end
  if has then out[#out + 1] = table.concat(cur) end
  return out
end
M.words = words

-- Parts of a multipart/form-data body: { name, filename, data }.
local function multipart(body, content_type)
  local boundary = content_type:match('boundary="([^"]+)"') or content_type:match('boundary=([^;%s]+)')
  if not boundary then return nil end
  local delim = '--' .. boundary
  local parts = {}
  local pos = body:find(delim, 1, true)
  if not pos then return nil end
  pos = pos + #delim
  while true do
    if body:sub(pos, pos + 1) == '--' then break end
    if body:sub(pos, pos + 1) ~= '\r\n' then return nil end
    local head_end = body:find('\r\n\r\n', pos + 2, true)
    if not head_end then return nil end
    local head = body:sub(pos + 2, head_end - 1)
    local data_start = head_end + 4
    local next_at = body:find('\r\n' .. delim, data_start, true)
    if not next_at then return nil end
    local name = head:match('[Nn]ame="([^"]*)"')
    local filename = head:match('[Ff]ilename="([^"]*)"')
    parts[#parts + 1] = { name = name, filename = filename, data = body:sub(data_start, next_at - 1) }
    pos = next_at + 2 + #delim
  end
  return parts
end

-- }======================================================

local Service = {}
Service.__index = Service

local function home_path(p)
  if p == nil or p == '' then return M.HOME end
  if p == '~' then return M.HOME end
  if p:sub(1, 2) == '~/' then return M.HOME .. p:sub(2) end
  if p:sub(1, 1) ~= '/' then return M.HOME .. '/' .. p end
  return p
end

-- The answer for a failure of the real sandbox under a unary envd call.
function Service:_envd_failure(err, id)
  if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then
    self:_forget(id)
    return self:_gone(id)
  end
  if errors.is(err, 'INVALID_INPUT') or errors.is(err, 'NOT_FOUND') then
    return connect_error('invalid_argument', 'the path is not usable')
  end
  if errors.is(err, 'PERMISSION_DENIED') then return connect_error('permission_denied', 'not allowed') end
  if errors.is(err, 'LIMIT_EXCEEDED') then return { status = 507, json = { code = 507, message = 'no space' } } end
  self.svc.failures[#self.svc.failures + 1] = err
  return connect_error('internal', 'internal error')
end

function Service._gone(_, id)
  return { status = 502, json = { sandboxId = id or '', message = 'The sandbox was not found', code = 502 } }
end

function Service:_forget(id)
  local rec = self.sandboxes[id]
  if rec then
    for _, proc in pairs(rec.processes) do proc.token:cancel('gone') end
    self.sandboxes[id] = nil
  end
end

-- The record and the real sandbox of a live sandbox, or nil.
function Service:_live(id)
  local rec = id and self.sandboxes[id]
  if not rec then return nil end
  local sb = self.backing:get(id)
  if not sb then
    self:_forget(id)
    return nil
  end
  return rec, sb
end

function Service:_detail(rec, listed)
  local d = {
    templateID = rec.template, alias = rec.alias, sandboxID = rec.id, clientID = 'stand-in',
    startedAt = rfc3339(rec.started_ms), endAt = rfc3339(rec.end_ms), state = 'running', cpuCount = 2,
    memoryMB = 512, diskSizeMB = 1024, envdVersion = self.envd_version, metadata = object(rec.metadata),
  }
  if not listed then
    d.envdAccessToken = rec.token
    d.domain = self.domain
    d.allowInternetAccess = rec.allow_internet
  end
  return d
end

-- {======================================================
-- The desktop's commands
-- =======================================================

local function desktop_state()
  return { actions = {}, display = false, xfce = false, vnc = false, novnc = false, x = 0, y = 0 }
end

-- What the stand-in answers for a desktop command: nil (run it for real), { background = true }
-- (it started and stays), or { exit_code, stdout, stderr }.
function Service._desktop_command(_, rec, sb, process)
  local d = rec.desktop
  if not d or process.cmd ~= '/bin/bash' or type(process.args) ~= 'table' then return nil end
  local a = process.args
  if #a ~= 3 or a[1] ~= '-l' or a[2] ~= '-c' or type(a[3]) ~= 'string' then return nil end
  local line = a[3]
  local function act(t)
    d.actions[#d.actions + 1] = t
    return { exit_code = 0, stdout = '', stderr = '' }
  end
  local function status(ok, out)
    return { exit_code = ok and 0 or 1, stdout = ok and (out or '') or '', stderr = '' }
  end
  if line == 'pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null' then
    return status(d.xfce)
  end
  if line:match('^netstat %-tuln | grep ":6080 "$') then
    return status(d.novnc, 'tcp        0      0 0.0.0.0:6080            0.0.0.0:*               LISTEN\n')
  end
  if line:match('^cd /opt/noVNC/utils && %./novnc_proxy ') then
    d.novnc = true
    return { background = true }
  end
  if line:match('^x11vnc %-bg ') then
    d.vnc = true
    d.vnc_auth = line:find(' -usepw ', 1, true) ~= nil
    return act({ kind = 'view', auth = d.vnc_auth })
  end
  local w = words(line)
  if not w or #w == 0 then return nil end
  local prog = w[1]
  if prog == 'Xvfb' then
    d.display = true
    d.screen = line:match(' %-screen 0 (%d+x%d+)x%d+')
    return { background = true }
  elseif prog == 'xdpyinfo' then
    return status(d.display)
  elseif prog == 'startxfce4' then
    d.xfce = d.display
    return { background = true }
  elseif prog == 'pgrep' and w[2] == '-x' and w[3] == 'x11vnc' then
    return status(d.vnc, '4242\n')
  elseif prog == 'pkill' and w[2] == 'x11vnc' then
    d.vnc = false
    return status(true)
  elseif prog == 'x11vnc' and w[2] == '-storepasswd' then
    d.vnc_password = w[3]
    return status(true)
  elseif prog == 'scrot' then
    local path = w[#w]
    sb:write_file(home_path(path), M.PNG)
    return act({ kind = 'screenshot' })
  elseif prog == 'xrandr' then
    local size = d.screen or '1024x768'
    local sw, sh = size:match('(%d+)x(%d+)')
    return status(true, string.format('Screen 0: minimum 1 x 1, current %s x %s, maximum 32767 x 32767\n'
      .. 'screen connected %sx%s+0+0 0mm x 0mm\n   %sx%s     0.00*\n', sw, sh, sw, sh, sw, sh))
  elseif prog == 'xdotool' then
    local sub = w[2]
    if sub == 'mousemove' then
      local i = 3
      if w[i] == '--sync' then i = i + 1 end
      d.x, d.y = tonumber(w[i]), tonumber(w[i + 1])
      return act({ kind = 'move', x = d.x, y = d.y })
    elseif sub == 'click' then
      local rep, i = 1, 3
      if w[i] == '--repeat' then rep, i = tonumber(w[i + 1]), i + 2 end
      return act({ kind = 'click', button = tonumber(w[i]), ['repeat'] = rep, x = d.x, y = d.y })
    elseif sub == 'mousedown' or sub == 'mouseup' then
      return act({ kind = sub, button = tonumber(w[3]), x = d.x, y = d.y })
    elseif sub == 'type' then
      local i = 3
      while w[i] and w[i] ~= '--' do i = i + 1 end
      return act({ kind = 'type', text = w[i + 1] or '' })
    elseif sub == 'key' then
      return act({ kind = 'key', keys = w[3] })
    elseif sub == 'getmouselocation' then
      return status(true, string.format('x:%d y:%d screen:0 window:1\n', d.x, d.y))
    end
    return status(false)
  end
  return nil
end

-- }======================================================

-- {======================================================
-- Commands
-- =======================================================

-- Waits until `proc` may run: its stdin closed, a signal, or the client gone.
local function wait_for_stdin(proc, req)
  if proc.stdin_closed then return end
  task.await(function(done)
    local fired = false
    local function fire()
      if fired then return end
      fired = true
      done()
    end
    proc.wake = fire
    proc.token:on_cancel(fire)
    req.signal:on_cancel(fire)
  end)
end

-- envd runs a command as a child of its own (Go's exec.CommandContext) and signals that child
-- alone, at the Connect deadline (SIGKILL) and at SendSignal: stand_in.command with reach
-- 'process'; each signal is recorded in `self.signalled`.

-- Go's os.ProcessState names of the signals a command may end by.
local SIGNAL_NAMES = { [1] = 'hangup', [2] = 'interrupt', [3] = 'quit', [6] = 'aborted', [9] = 'killed',
  [11] = 'segmentation fault', [13] = 'broken pipe', [14] = 'alarm clock', [15] = 'terminated' }

function Service:_start(req, rec, sb)
  local ct = (req.headers['content-type'] or ''):lower()
  if ct ~= 'application/connect+json' then return connect_error('invalid_argument', 'not a Connect stream') end
  local msg = unenvelope(req.body)
  local p = msg and msg.process
  if type(p) ~= 'table' or type(p.cmd) ~= 'string' or p.cmd == '' then
    return connect_error('invalid_argument', 'bad start request')
  end
  local env = {}
  for k, v in pairs(type(p.envs) == 'table' and p.envs or {}) do env[k] = tostring(v) end
  local timeout = tonumber(req.headers['connect-timeout-ms'] or '')
  if timeout and (timeout < 1 or timeout ~= math.floor(timeout)) then timeout = nil end
  self.pid_seq = self.pid_seq + 1
  local pid = self.pid_seq
  local argv = { p.cmd }
  for _, x in ipairs(type(p.args) == 'table' and p.args or {}) do argv[#argv + 1] = tostring(x) end
  local proc = { pid = pid, tag = msg.tag, config = p, token = task.cancel_token(), stdin = {},
    stdin_open = msg.stdin ~= false, stdin_closed = msg.stdin == false }
  rec.processes[pid] = proc
  local headers = { ['Content-Type'] = 'application/connect+json' }
  return { status = 200, headers = headers, stream = function(send)
    if not send(event({ start = { pid = pid } })) then rec.processes[pid] = nil return end
    local fake = self:_desktop_command(rec, sb, p)
    if fake and fake.background then
      -- it runs on: the stream stays open until the client leaves or a signal ends it
      task.await(function(done)
        local fired = false
        local function fire() if not fired then fired = true; done() end end
        proc.token:on_cancel(fire)
        req.signal:on_cancel(fire)
      end)
      rec.processes[pid] = nil
      if proc.token.cancelled then
        send(event({ ['end'] = { exitCode = -1, status = 'signal: killed' } }))
        send(envelope(2, '{}'))
      end
      return
    end
    local r
    local streamed = { stdout = 0, stderr = 0 }
    local timed_out = false
    if fake then
      r = { exit_code = fake.exit_code, stdout = fake.stdout, stderr = fake.stderr }
    else
      local started = now_ms()
      wait_for_stdin(proc, req)
      if not proc.stdin_closed and not proc.token.cancelled then
        rec.processes[pid] = nil   -- the client left before it closed stdin
        return
      end
      local cwd = p.cwd
      if cwd ~= nil then cwd = home_path(cwd) end
      local stdin
      if proc.stdin_open then stdin = table.concat(proc.stdin) end
      local ok, res
      if proc.token.cancelled then
        ok, res = false, errors.new('CANCELLED', 'killed before it ran')
      else
        -- output goes out as data events as the command writes it, as envd sends it
        local function pass(name)
          return function(chunk)
            streamed[name] = streamed[name] + #chunk
            for i = 1, #chunk, CHUNK do send(event({ data = { [name] = b64.encode(chunk:sub(i, i + CHUNK - 1)) } })) end
          end
        end
        -- the deadline and SendSignal reach the command's own process, nothing else
        local cmd = stand_in.command(sb, argv, { cwd = cwd, env = env, stdin = stdin, reach = 'process',
          timeout_ms = timeout and math.max(1, timeout - (now_ms() - started)) or nil,
          on_stdout = pass('stdout'), on_stderr = pass('stderr'),
          on_signal = function(sent)
            self.signalled[#self.signalled + 1] = { sandbox = rec.id, pid = pid, os_pid = sent.pid,
              signal = sent.signal, why = sent.why }
          end })
        proc.kill = function(sig, why) cmd:kill(sig, why) end
        ok, res = pcall(cmd.wait, cmd)
        if ok then timed_out = res.timed_out end
      end
      rec.processes[pid] = nil
      if not ok then
        if errors.is(res, 'CANCELLED') then
          send(event({ ['end'] = { exitCode = -1, status = 'signal: killed' } }))
          send(envelope(2, '{}'))
        elseif errors.is(res, 'SANDBOX_ERROR') and res.reason == 'gone' then
          self:_forget(rec.id)
          send(envelope(2, json.encode({ error = { code = 'unavailable', message = 'sandbox ended' } })))
        elseif errors.is(res, 'INVALID_INPUT') then
          send(envelope(2, json.encode({ error = { code = 'invalid_argument', message = 'cwd does not exist' } })))
        else
          self.svc.failures[#self.svc.failures + 1] = res
          send(envelope(2, json.encode({ error = { code = 'internal', message = 'internal' } })))
        end
        return
      end
      r = res
    end
    for _, name in ipairs({ 'stdout', 'stderr' }) do
      local out = (r[name] or ''):sub(streamed[name] + 1)
      for i = 1, #out, CHUNK do
        if not send(event({ data = { [name] = b64.encode(out:sub(i, i + CHUNK - 1)) } })) then return end
      end
    end
    if timed_out or r.timed_out then
      send(envelope(2, json.encode({ error = { code = 'deadline_exceeded', message = 'context deadline exceeded' } })))
      return
    end
    local ended
    local code = r.exit_code
    if code == nil then
      local n = tonumber(r.signal) or 9
      ended = { exitCode = -1, status = 'signal: ' .. (SIGNAL_NAMES[n] or ('signal ' .. n)) }
    else
      ended = { exited = true, status = 'exit status ' .. code }
      if code ~= 0 then ended.exitCode = code end
    end
    send(event({ ['end'] = ended }))
    send(envelope(2, '{}'))
  end }
end

--- An answer (for svc:fault on POST /process.Process/Start) whose stream starts a command,
-- sends `after` bytes of stdout, then cuts the connection (the stand-in records M.CUT as a
-- failure of its own).
function M.cut_stream(after)
  return { status = 200, headers = { ['Content-Type'] = 'application/connect+json' }, stream = function(send)
    send(event({ start = { pid = 99999 } }))
    send(event({ data = { stdout = b64.encode(string.rep('x', after or 10)) } }))
    error(M.CUT, 0)
  end }
end

-- }======================================================

-- {======================================================
-- Files
-- =======================================================

local TYPES = { file = 'FILE_TYPE_FILE', directory = 'FILE_TYPE_DIRECTORY', symlink = 'FILE_TYPE_SYMLINK' }

local function entry_info(dir, e)
  local path = (dir == '/' and '' or dir) .. '/' .. e.name
  local info = {
    name = e.name, path = path, owner = 'user', group = 'user',
    mode = e.type == 'directory' and 493 or 420,
    permissions = e.type == 'directory' and 'drwxr-xr-x' or '-rw-r--r--',
    modifiedTime = rfc3339(e.modified),
  }
  if TYPES[e.type] then info.type = TYPES[e.type] end
  if e.size ~= 0 then info.size = tostring(math.floor(e.size)) end   -- int64: a string
  return info
end

local function split_path(p)
  local dir, name = p:match('^(.*)/([^/]+)/*$')
  if not dir then return nil end
  if dir == '' then dir = '/' end
  return dir, name
end

-- EntryInfo of one path, from a listing of its directory; nil when there is none.
local function stat(sb, p)
  if p == '/' then return { name = '', path = '/', type = 'FILE_TYPE_DIRECTORY', mode = 493 } end
  local dir, name = split_path(p)
  if not dir then return nil end
  local list = sb:list_files(dir)
  for _, e in ipairs(list or {}) do
    if e.name == name then return entry_info(dir, e) end
  end
  return nil
end

local function list_dir(sb, p, depth, out)
  local list = sb:list_files(p)
  if list == nil then return nil end
  for _, e in ipairs(list) do
    out[#out + 1] = entry_info(p, e)
    if depth > 1 and e.type == 'directory' then list_dir(sb, (p == '/' and '' or p) .. '/' .. e.name, depth - 1, out) end
  end
  return out
end

function Service:_files_get(req, rec, sb)
  local p = home_path(req.query.path)
  local ok, data = pcall(sb.read_file, sb, p)
  if not ok then
    if errors.is(data, 'INVALID_INPUT') then return { status = 400, json = { code = 400, message = 'path is a directory' } } end
    return self:_envd_failure(data, rec.id)
  end
  if data == nil then return { status = 404, json = { code = 404, message = 'file not found' } } end
  local headers = { ['Content-Type'] = 'application/octet-stream',
    ['Content-Disposition'] = 'inline; filename="' .. (p:match('[^/]*$')) .. '"' }
  local range = req.headers['range']
  if range and #data > 0 then
    local a, b = range:match('^bytes=(%d*)%-(%d*)$')
    a, b = tonumber(a), tonumber(b)
    if a then
      if a >= #data then return { status = 416, headers = { ['Content-Range'] = 'bytes */' .. #data } } end
      if not b or b >= #data then b = #data - 1 end
      headers['Content-Range'] = string.format('bytes %d-%d/%d', a, b, #data)
      return { status = 206, headers = headers, body = data:sub(a + 1, b + 1) }
    end
  end
  return { status = 200, headers = headers, body = data }
end

function Service:_files_post(req, rec, sb)
  local ct = (req.headers['content-type'] or ''):lower()
  local files = {}
  if ct:match('^multipart/form%-data') then
    local parts = multipart(req.body, req.headers['content-type'])
    if not parts then return { status = 400, json = { code = 400, message = 'bad multipart body' } } end
    for _, part in ipairs(parts) do
      if part.name == 'file' then
        local dest = req.query.path or part.filename
        if not dest or dest == '' then return { status = 400, json = { code = 400, message = 'no path' } } end
        files[#files + 1] = { path = home_path(dest), data = part.data }
      end
    end
  else
    if not req.query.path then return { status = 400, json = { code = 400, message = 'no path' } } end
    files[1] = { path = home_path(req.query.path), data = req.body }
  end
  local out = {}
  for _, f in ipairs(files) do
    local ok, err = pcall(sb.write_file, sb, f.path, f.data)
    if not ok then
      if errors.is(err, 'INVALID_INPUT') then return { status = 400, json = { code = 400, message = 'path is a directory' } } end
      return self:_envd_failure(err, rec.id)
    end
    out[#out + 1] = { path = f.path, name = f.path:match('[^/]*$'), type = 'file' }
  end
  self.uploads[#self.uploads + 1] = { kind = ct:match('^multipart') and 'multipart' or 'octet-stream', count = #files }
  return { json = array(out) }
end

-- }======================================================

--- Installs the API on `svc` over `backing`. `opts` = { api_key (required), domain (returned in
-- create answers; nil by default), envd_version, templates (name -> { desktop = bool }; base
-- and desktop by default) }. Returns the service: `sandboxes` (id -> record with `metadata`,
-- `template`, `network`, `env`, `processes`, `desktop`), `seen_desktops` (id -> the desktop's
-- state, kept after the sandbox ended), `uploads`, `create_delay_ms`.
function M.install(svc, backing, opts)
  local key = assert(opts.api_key, 'api_key')
  local self = setmetatable({
    svc = svc, backing = backing, key = key, domain = opts.domain, envd_version = opts.envd_version or M.ENVD_VERSION,
    templates = opts.templates or { base = {}, desktop = { desktop = true } },
    sandboxes = {}, seen_desktops = {}, pid_seq = 1000, create_delay_ms = 0, uploads = {}, signalled = {},
    snapshots = {},
  }, Service)

  local function api(fn)
    return function(req)
      local got = req.headers['x-api-key']
      if got ~= key then
        return { status = 401, json = { code = 401, message = 'Invalid API key, got ' .. tostring(got) } }
      end
      local ok, res = pcall(fn, req)
      if ok then return res end
      self.svc.failures[#self.svc.failures + 1] = res
      return { status = 500, json = { code = 500, message = 'internal error' } }
    end
  end

  local function envd(fn)
    return function(req)
      local id = req.headers['e2b-sandbox-id'] or (req.headers['host'] or ''):match('^%d+%-([%w_%-]+)%.')
      if id and svc.vanished[id] then return self:_gone(id) end
      local rec = self:_live(id)
      if not rec then return self:_gone(id) end
      -- a paused sandbox (one being snapshotted): the call waits until it runs again
      while rec.paused do task.sleep(20) end
      local sb
      rec, sb = self:_live(id)
      if not rec then return self:_gone(id) end
      if rec.token and req.headers['x-access-token'] ~= rec.token then
        return connect_error('unauthenticated', 'invalid access token ' .. tostring(req.headers['x-access-token']))
      end
      local ok, res = pcall(fn, req, rec, sb)
      if ok then return res end
      return self:_envd_failure(res, id)
    end
  end

  local function unary(fn)
    return envd(function(req, rec, sb)
      if not (req.headers['content-type'] or ''):lower():match('^application/json') then
        return connect_error('invalid_argument', 'not a Connect unary call')
      end
      if type(req.json) ~= 'table' then return connect_error('invalid_argument', 'bad message') end
      return fn(req.json, rec, sb, req)
    end)
  end

  -- {------------------------------------------------------ control plane

  local function create(req, v2)
    local b = req.json
    if type(b) ~= 'table' or type(b.templateID) ~= 'string' then
      return { status = 400, json = { code = 400, message = 'templateID is required' } }
    end
    local t = self.templates[b.templateID]
    local from = not t and self.snapshots[b.templateID] or nil
    if from then t = from.template end
    if not t then return { status = 404, json = { code = 404, message = 'template ' .. b.templateID .. ' not found' } } end
    local timeout = b.timeout
    if timeout == nil then timeout = 15 end
    if type(timeout) ~= 'number' or timeout ~= math.floor(timeout) or timeout < 0 or timeout > M.MAX_TIMEOUT_S then
      return { status = 400, json = { code = 400, message = 'timeout out of range' } }
    end
    local env = {}
    for k, v in pairs(type(b.envVars) == 'table' and b.envVars or {}) do
      if type(k) == 'string' and k:match('^[%a_][%w_]*$') and type(v) == 'string' then env[k] = v end
    end
    local allow_internet = b.allow_internet_access ~= false
    local net = type(b.network) == 'table' and b.network or nil
    local kind = allow_internet and 'all' or 'none'
    if net and (net.allowOut ~= nil or net.denyOut ~= nil) then kind = 'none' end   -- no domain filter here
    local id = self.backing:create({ lifetime_ms = math.max(timeout, 1) * 1000, env = env, network = kind,
      snapshot = from and from.held or nil })
    local started = now_ms()
    local rec = {
      id = id, template = b.templateID, alias = b.templateID, metadata = {}, env = env, network = net,
      allow_internet = b.allow_internet_access, kind = kind, started_ms = started, end_ms = started + timeout * 1000,
      token = (v2 or b.secure ~= false) and ('ea_' .. random_token(16)) or nil, processes = {},
      desktop = t.desktop and desktop_state() or nil, body = b,
    }
    for k, v in pairs(type(b.metadata) == 'table' and b.metadata or {}) do
      if type(k) == 'string' and type(v) == 'string' then rec.metadata[k] = v end
    end
    self.sandboxes[id] = rec
    self.seen_desktops[id] = rec.desktop
    if self.create_delay_ms > 0 then task.sleep(self.create_delay_ms) end
    return { status = 201, json = {
      sandboxID = id, templateID = b.templateID, alias = b.templateID, clientID = 'stand-in',
      envdVersion = self.envd_version, envdAccessToken = rec.token, trafficAccessToken = json.null,
      domain = self.domain or json.null,
    } }
  end
  svc:route('POST', '/sandboxes', api(create))
  svc:route('POST', '/v2/sandboxes', api(function(req) return create(req, true) end))

  svc:route('GET', '/sandboxes/{id}', api(function(req)
    local rec = self:_live(req.params.id)
    if not rec then return { status = 404, json = { code = 404, message = 'sandbox ' .. req.params.id .. ' not found' } } end
    return { json = self:_detail(rec) }
  end))

  svc:route('DELETE', '/sandboxes/{id}', api(function(req)
    local rec = self:_live(req.params.id)
    if not rec then return { status = 404, json = { code = 404, message = 'sandbox not found' } } end
    self:_forget(rec.id)
    self.backing:release(rec.id)
    return { status = 204 }
  end))

  svc:route('POST', '/sandboxes/{id}/timeout', api(function(req)
    local rec = self:_live(req.params.id)
    if not rec then return { status = 404, json = { code = 404, message = 'sandbox not found' } } end
    local t = type(req.json) == 'table' and req.json.timeout
    if type(t) ~= 'number' or t < 0 then return { status = 400, json = { code = 400, message = 'bad timeout' } } end
    rec.end_ms = now_ms() + t * 1000
    return { status = 204 }
  end))

  -- {------------------------------------------------------ snapshots

  local function snapshot_info(id)
    local s = self.snapshots[id]
    local names = {}
    for i, n in ipairs(s.names) do names[i] = n end
    return { snapshotID = id, names = array(names) }
  end

  svc:route('POST', '/sandboxes/{id}/snapshots', api(function(req)
    local rec, sb = self:_live(req.params.id)
    if not rec then return { status = 404, json = { code = 404, message = 'sandbox not found' } } end
    local b = req.json
    if b == nil and req.body == '' then b = {} end
    if type(b) ~= 'table' or (b.name ~= nil and (type(b.name) ~= 'string' or not b.name:match('^[%w][%w_%-]*$')
      or #b.name > 128)) then
      return { status = 400, json = { code = 400, message = 'invalid snapshot request' } }
    end
    if rec.paused then return { status = 409, json = { code = 409, message = 'sandbox is being paused' } } end
    rec.paused = true
    local ok, held = pcall(sb.snapshot, sb)
    rec.paused = false
    if not ok then
      self.svc.failures[#self.svc.failures + 1] = held
      return { status = 500, json = { code = 500, message = 'snapshot failed' } }
    end
    local id = b.name and ('stand-in/' .. b.name .. ':default') or (random_token(10) .. ':default')
    local old = self.snapshots[id]
    if old then old.held:release() end
    self.snapshots[id] = { held = held, source = rec.id, template = self.templates[rec.template]
      or (self.snapshots[rec.template] or {}).template or {}, names = b.name and { id } or {} }
    if self.snapshot_answer then return self.snapshot_answer end
    return { status = 201, json = snapshot_info(id) }
  end))

  svc:route('GET', '/snapshots', api(function(req)
    local ids = {}
    for id, s in pairs(self.snapshots) do
      if (not req.query.sandboxID or s.source == req.query.sandboxID)
        and (not req.query.name or s.names[1] == req.query.name) then
        ids[#ids + 1] = id
      end
    end
    table.sort(ids)
    local out = {}
    for i, id in ipairs(ids) do out[i] = snapshot_info(id) end
    return { json = array(out) }
  end))

  svc:route('DELETE', '/templates/{id}', api(function(req)
    local s = self.snapshots[req.params.id]
    if not s then return { status = 404, json = { code = 404, message = 'template not found' } } end
    self.snapshots[req.params.id] = nil
    s.held:release()
    return { status = 204 }
  end))

  -- }------------------------------------------------------

  local function list(req)
    local want = {}
    for pair in (req.query.metadata or ''):gmatch('[^&]+') do
      local k, v = pair:match('^([^=]*)=(.*)$')
      if k then
        local function un(s) return (s:gsub('%%(%x%x)', function(h) return string.char(tonumber(h, 16)) end)) end
        want[un(k)] = un(v)
      end
    end
    local out = {}
    local ids = {}
    for id in pairs(self.sandboxes) do ids[#ids + 1] = id end
    table.sort(ids)
    for _, id in ipairs(ids) do
      local rec = self:_live(id)
      local match = rec ~= nil
      for k, v in pairs(want) do
        if not rec or rec.metadata[k] ~= v then match = false end
      end
      if match then out[#out + 1] = self:_detail(rec, true) end
    end
    return { json = array(out) }
  end
  svc:route('GET', '/v2/sandboxes', api(list))
  svc:route('GET', '/sandboxes', api(list))

  -- }------------------------------------------------------

  -- {------------------------------------------------------ envd

  svc:route('GET', '/health', function(req)
    if not req.headers['e2b-sandbox-id'] and not (req.headers['host'] or ''):match('^%d+%-') then
      return { status = 204 }
    end
    return envd(function() return { status = 204 } end)(req)
  end)

  svc:route('GET', '/files', envd(function(req, rec, sb) return self:_files_get(req, rec, sb) end))
  svc:route('POST', '/files', envd(function(req, rec, sb) return self:_files_post(req, rec, sb) end))

  svc:route('POST', '/filesystem.Filesystem/ListDir', unary(function(m, _, sb)
    if type(m.path) ~= 'string' then return connect_error('invalid_argument', 'path is required') end
    local depth = tonumber(m.depth) or 1
    if depth < 1 then depth = 1 end
    local p = home_path(m.path)
    local ok, entries = pcall(list_dir, sb, p, depth, {})
    if not ok then
      if errors.is(entries, 'INVALID_INPUT') then return connect_error('invalid_argument', 'path is not a directory') end
      error(entries, 0)
    end
    if entries == nil then return connect_error('not_found', 'directory not found') end
    return { json = { entries = array(entries) } }
  end))

  svc:route('POST', '/filesystem.Filesystem/Stat', unary(function(m, _, sb)
    if type(m.path) ~= 'string' then return connect_error('invalid_argument', 'path is required') end
    local e = stat(sb, home_path(m.path))
    if not e then return connect_error('not_found', 'no such file or directory') end
    return { json = { entry = e } }
  end))

  svc:route('POST', '/filesystem.Filesystem/Remove', unary(function(m, _, sb)
    if type(m.path) ~= 'string' then return connect_error('invalid_argument', 'path is required') end
    local p = home_path(m.path)
    if stat(sb, p) then sb:remove_file(p, { recursive = true }) end   -- RemoveAll: nothing there is fine
    return { json = object() }
  end))

  svc:route('POST', '/filesystem.Filesystem/MakeDir', unary(function(m, _, sb)
    if type(m.path) ~= 'string' then return connect_error('invalid_argument', 'path is required') end
    local p = home_path(m.path)
    if stat(sb, p) then return connect_error('already_exists', 'it exists') end
    local r = sb:exec({ 'mkdir', '-p', '--', p })
    if r.exit_code ~= 0 then return connect_error('invalid_argument', 'cannot make it') end
    return { json = { entry = stat(sb, p) } }
  end))

  svc:route('POST', '/process.Process/Start', envd(function(req, rec, sb) return self:_start(req, rec, sb) end))

  local function proc_of(m, rec)
    local sel = type(m.process) == 'table' and m.process or {}
    if sel.pid ~= nil then return rec.processes[tonumber(sel.pid)] end
    if sel.tag ~= nil then
      for _, p in pairs(rec.processes) do if p.tag == sel.tag then return p end end
    end
    return nil
  end

  svc:route('POST', '/process.Process/SendInput', unary(function(m, rec)
    local proc = proc_of(m, rec)
    if not proc then return connect_error('not_found', 'process not found') end
    if not proc.stdin_open or proc.stdin_closed then
      return connect_error('failed_precondition', 'stdin not enabled or closed')
    end
    local input = type(m.input) == 'table' and m.input.stdin or nil
    local ok, bytes = pcall(b64.decode, input or '')
    if not ok or not bytes then return connect_error('invalid_argument', 'bad input') end
    proc.stdin[#proc.stdin + 1] = bytes
    return { json = object() }
  end))

  svc:route('POST', '/process.Process/CloseStdin', unary(function(m, rec)
    local proc = proc_of(m, rec)
    if not proc then return connect_error('not_found', 'process not found') end
    proc.stdin_closed = true
    if proc.wake then proc.wake() end
    return { json = object() }
  end))

  svc:route('POST', '/process.Process/SendSignal', unary(function(m, rec)
    local proc = proc_of(m, rec)
    if not proc then return connect_error('not_found', 'process not found') end
    local s = m.signal
    if s ~= 'SIGNAL_SIGKILL' and s ~= 'SIGNAL_SIGTERM' and s ~= 9 and s ~= 15 then
      return connect_error('unimplemented', 'signal not supported')
    end
    local sig = (s == 'SIGNAL_SIGKILL' or s == 9) and 9 or 15
    if proc.kill then proc.kill(sig, 'SendSignal') else proc.token:cancel('signal') end
    return { json = object() }
  end))

  svc:route('POST', '/process.Process/List', unary(function(_, rec)
    local out = {}
    for pid, p in pairs(rec.processes) do
      out[#out + 1] = { pid = pid, tag = p.tag, config = p.config }
    end
    return { json = { processes = array(out) } }
  end))

  -- }------------------------------------------------------

  return self
end

return M
