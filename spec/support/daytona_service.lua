--- A stand-in for Daytona (control plane and toolbox) on loopback, backed by real local
-- sandboxes, close enough that the official `@daytonaio/sdk` (spec/npm) and
-- `mayura.sandbox.daytona` both take it for the real service. Built on the stand-in kit
-- (support/stand_in.lua): routes, scripted faults, `vanish`, `calls`.
--
--   local daytona_service = require('support.daytona_service')
--   local svc = daytona_service.new({ api_key = KEY })
--   svc:url('/api')                  -- the API's base URL (what the SDK calls apiUrl)
--   svc.daytona.sandboxes            -- id -> the stand-in's record (dto, sb, actions, previews)
--   svc.daytona.count()              -- sandboxes not destroyed
--   svc:close()                      -- also releases every local sandbox behind it
--
-- Options (also fields of `svc.daytona`, changeable while it runs): `api_key`,
-- `minute_ms` (how long one of Daytona's minutes lasts here: 60000; a spec makes the
-- service's own lifetimes short with less), `create_delay_ms` (the create answers that
-- much later, and makes its sandbox all the same), `starting_polls` (a create answers
-- `creating` and that many GETs `starting_state` ('starting') before `started`), `desktop`
-- (the computer-use endpoints work; else they fail as on a snapshot without a desktop),
-- `proxy_domain`, `cut_executes` (the next that many executes run their command, then lose
-- the answer: the connection is reset where the answer would be), `shell` (the daemon's shell,
-- 'sh' by default: Daytona's is zsh where the image lists it, else bash, else sh).
--
-- The control plane, under /api (Authorization: Bearer <key>, else 401 whose body echoes the key
-- it got, so a spec can check that no service text reaches an error):
--   POST   /sandbox               snapshot, env, labels, networkBlockAll, domainAllowList, cpu,
--                                 memory, ttlMinutes, autoStopInterval, autoDeleteInterval -> 200 Sandbox
--   GET    /sandbox               ?labels=<json> -> { items, nextCursor = null }
--   GET    /sandbox/{id}          -> Sandbox; 404 once it is destroyed (NestJS body)
--   DELETE /sandbox/{id}          -> 200 Sandbox (destroyed)
--   GET    /sandbox/{id}/toolbox-proxy-url, .../ports/{port}/preview-url,
--          .../ports/{port}/signed-preview-url?expiresInSeconds=  (https://{port}-{token}.{domain})
--   POST   /sandbox/{id}/autostop|autodelete|ttl/{minutes}, GET /config
--   POST   /sandbox/{id}/snapshot  { name, includeMemory } -> 200 Sandbox in state `snapshotting`
--                                 (its toolbox refuses it then), back to `started` once the
--                                 snapshot is made; 400 for a sandbox that is not started, no
--                                 name, or includeMemory (a container's memory is not kept), 409
--                                 for a name in use. The snapshot is `pending`, then `active` with
--                                 its `size` (GB) and `sourceSandboxId`, or `error`
--   GET    /snapshots/{idOrName}  -> Snapshot; GET /snapshots?page&limit&sourceSandboxId ->
--                                 { items, total, page, totalPages }; DELETE /snapshots/{id} (by id)
--   a create naming an active snapshot of its own starts from its files; one that was deleted is
--   404, one not active yet 400
-- Lifetimes run as Daytona's do: `ttlMinutes` destroys the sandbox that long after its
-- create; `autoStopInterval` stops it after that long without a toolbox request (one in
-- flight counts as activity, as the real proxy's keep-alive makes it), and
-- `autoDeleteInterval = 0` then destroys it.
--
-- The toolbox, under /toolbox/{id} (the same key; a sandbox that is no more answers 401, as
-- the real proxy does when it cannot find one):
--   POST /process/execute         { command, cwd, envs, timeout } -> { exitCode, result }: the
--                                 command is the standard input of the shell (`shell`) in the
--                                 sandbox, as the daemon pipes it to its own, stdout and stderr merged;
--                                 what is left in the command's process group when it ends
--                                 is killed, setsid'd processes live on (Daytona's daemon's
--                                 behaviour); a timeout is 408 REQUEST_TIMEOUT after SIGKILL to
--                                 the process group only (recorded in `signalled`)
--   GET  /work-dir, /user-home-dir -> { dir = '/workspace' }
--   GET  /files/info, /files/download, GET /files (list), DELETE /files, POST
--        /files/bulk-upload (multipart files[i].path + files[i].file; parents made, the file
--        replaced), POST /files/bulk-download (multipart answer, `file` or `error` parts):
--        the daemon's semantics (a listing follows symbolic links and leaves out broken ones;
--        a directory is deleted only with recursive=true; errors carry FILE_NOT_FOUND, ...)
--   /computeruse/*                start, status, screenshot, display/info, mouse (position,
--                                 move, click, drag, scroll), keyboard (type, key, hotkey):
--                                 a FIXED PNG (320x200: a title bar and a blue button) and
--                                 RECORDED actions (svc.daytona.sandboxes[id].actions), not
--                                 a real desktop, until the local providers have one.
--
-- Where it is not the real service: network policies are recorded, not enforced by domain
-- (networkBlockAll and domainAllowList both give an offline local sandbox; otherwise it is
-- online where the local provider can be); preview URLs are strings under `proxy_domain`
-- that nothing serves; a snapshot made from a sandbox keeps its home and /tmp (through the
-- backing pool's snapshot; Daytona keeps the whole filesystem), `size` being those files' archive
-- in GB, and `state.snapshot_fails` makes the next that many end in `error`; snapshots of images
-- (POST /snapshots) are not there; there are no sessions, PTYs, git, LSP or volumes; the
-- socket.io event gateway is absent (the SDK falls back to polling).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local stand_in = require('support.stand_in')

local json, b64 = core.json, core.base64

local M = {}

M.WORKDIR = '/workspace'
local MAX_EXEC_MS = 1800000
local PNG_HEX = table.concat({
  '89504e470d0a1a0a0000000d4948445200000140000000c808020000001666affc0000020b4944415478daedd3410d00',
  '200c0441e4f4893274f68303c46082901426190577d916d181a29a0940c08080010183800101030206040c0206040c08',
  '18040c081810302060783ee0cc091425601030206040c0206040c0808001018380010103020601030206040c0818040c',
  '0818103020601030206040c0206040c08080010183800101030206040c0206040c0818040c0818103020601030206040',
  'c020602b8080010103020601030206040c0818040c0818103008181030206040c0206040c08080010183800101030206',
  '01030206040c0818040c0818103020601030206040c020604e8bb1bee271010b58c00858c00216300216b080052c6004',
  '2c60012360010b58c00858c00216b08011b080052c60042c60012360042c60012360010b58c00858c00216b08011b080',
  '052c602b0858c00246c00216b080058c80052c60012360010b18012360010b18010b58c00246c00216b080058c80052c',
  '60012360010b18010b58c0808041c08080010103020601030206040c0206040c0818103008181030206040c0206040c0',
  '808041c08080010103020601030206040c0206040c0818103008181030206040c0206040c0808041c080800101030206',
  '01030206040c0818040c0818103008181030206040c0206040c0808001018380010103020601030206040c0818040c08',
  '18103008181030206040c0206040c08080010183800101030206010302062ed9f7b112d03d5c9fa30000000049454e44',
  'ae426082',
})

local function from_hex(h)
  return (h:gsub('%x%x', function(x) return string.char(tonumber(x, 16)) end))
end

--- The screenshot every sandbox shows: 320x200, a dark title bar and a blue button at (120..199, 90..119).
M.PNG = from_hex(PNG_HEX)
M.SCREEN = { width = 320, height = 200 }

local REASON = { [400] = 'Bad Request', [401] = 'Unauthorized', [403] = 'Forbidden', [404] = 'Not Found',
  [408] = 'Request Timeout', [409] = 'Conflict', [500] = 'Internal Server Error' }

-- The control plane's error body (NestJS).
local function api_error(status, message)
  return { status = status, json = { statusCode = status, message = message, error = REASON[status] or 'Error' } }
end

-- The toolbox's error body (the daemon's, and the proxy's: common-go's middleware).
local function daemon_error(status, code, message, req)
  return { status = status, json = { statusCode = status, code = code, message = message,
    path = req and req.path or '', method = req and req.method or '', timestamp = os.date('!%Y-%m-%dT%H:%M:%SZ') } }
end

local function iso(sec, nsec)
  local s = os.date('!%Y-%m-%dT%H:%M:%S', math.floor(sec))
  if nsec and nsec ~= '' then
    local frac = nsec:gsub('0+$', '')
    if frac ~= '' then s = s .. '.' .. frac end
  end
  return s .. 'Z'
end

local function random_hex(n)
  local t = {}
  for i = 1, n do t[i] = string.format('%x', math.random(0, 15)) end
  return table.concat(t)
end

local function object(t)
  local o = setmetatable({}, json.object_mt)
  for k, v in pairs(t or {}) do o[k] = v end
  return o
end

-- {======================================================
-- Multipart
-- =======================================================

--- The parts of a multipart/form-data body: `{ name, filename, data }` in order; nil when it is not one.
function M.parse_multipart(content_type, body)
  local boundary = (content_type or ''):match('boundary="?([^";]+)"?')
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
    local next_at = body:find('\r\n' .. delim, head_end + 4, true)
    if not next_at then return nil end
    local disposition = head:match('[Cc]ontent%-[Dd]isposition:%s*([^\r\n]*)') or ''
    parts[#parts + 1] = {
      name = disposition:match('[; ]name="([^"]*)"'), filename = disposition:match('filename="([^"]*)"'),
      data = body:sub(head_end + 4, next_at - 1),
    }
    pos = next_at + 2 + #delim
  end
  return parts
end

--- A multipart/form-data body of `parts` ({ name, filename, content_type, data }) and its boundary.
function M.multipart(parts)
  local boundary = 'standin' .. random_hex(24)
  local out = {}
  for _, p in ipairs(parts) do
    out[#out + 1] = '--' .. boundary .. '\r\nContent-Disposition: form-data; name="' .. p.name .. '"'
      .. (p.filename and ('; filename="' .. p.filename .. '"') or '') .. '\r\n'
      .. 'Content-Type: ' .. (p.content_type or 'application/octet-stream') .. '\r\n'
      .. 'Content-Length: ' .. #p.data .. '\r\n\r\n' .. p.data .. '\r\n'
  end
  out[#out + 1] = '--' .. boundary .. '--\r\n'
  return table.concat(out), boundary
end

-- }======================================================

-- {======================================================
-- Files as the daemon sees them (os.Stat: symbolic links followed)
-- =======================================================

local STAT = 'if [ ! -e "$1" ];then echo N;exit 0;fi\n' ..
  's=$(stat -L -c "%f %s %Y.%.9Y %u %g %a" -- "$1" 2>/dev/null)||{ echo E;exit 0;};echo "S $s"\n'

local TYPE_OF = { [8] = 'file', [4] = 'directory', [10] = 'symlink', [1] = 'fifo', [12] = 'socket', [2] = 'char',
  [6] = 'block' }
local MODE_CHAR = { file = '-', directory = 'd', fifo = 'p', socket = 'S', char = 'Dc', block = 'D' }

local function rwx(perm)
  local out = {}
  for digit in perm:sub(-3):gmatch('%d') do
    local d = tonumber(digit)
    out[#out + 1] = (d >= 4 and 'r' or '-') .. (d % 4 >= 2 and 'w' or '-') .. (d % 2 == 1 and 'x' or '-')
  end
  return table.concat(out)
end

-- The daemon's FileInfo of `path` (following links), or nil when there is nothing there.
local function stat(sb, path)
  local r = sb:exec({ 'sh', '-c', STAT, 'sh', path })
  local line = r.stdout:match('^[^\n]*') or ''
  if line == 'N' then return nil end
  local mode, size, mtime, uid, gid, perm = line:match('^S (%x+) (%d+) (%S+) (%d+) (%d+) (%d+)$')
  if not mode then error(errors.new('PERMISSION_DENIED', 'stat failed')) end
  local kind = TYPE_OF[math.floor(tonumber(mode, 16) / 4096) % 16] or 'file'
  -- %Y.%.9Y gives seconds, then seconds with nanoseconds: take the nanoseconds from the second
  local sec, nsec = mtime:match('^(%d+)%.%d+%.(%d+)$')
  local name = path:match('([^/]*)/*$')
  if name == '' then name = '/' end
  local perms = string.format('%04d', tonumber(perm))
  local modified = iso(tonumber(sec) or 0, nsec)
  return {
    name = name, path = path, size = tonumber(size), isDir = kind == 'directory', kind = kind,
    mode = (MODE_CHAR[kind] or '-') .. rwx(perm), permissions = perms, owner = uid, group = gid,
    modTime = modified, modifiedAt = modified,
  }
end

local function file_info_json(info)
  return { name = info.name, size = info.size, mode = info.mode, permissions = info.permissions, owner = info.owner,
    group = info.group, modTime = info.modTime, modifiedAt = info.modifiedAt, isDir = info.isDir }
end

local DELETE = 'p=$1 r=$2\n' ..
  'if [ ! -e "$p" ];then echo N;exit 0;fi\n' ..
  'if [ -d "$p" ]&&[ "$r" != true ];then echo D;exit 0;fi\n' ..
  'if [ "$r" = true ];then rm -rf -- "$p" 2>/dev/null||{ echo F;exit 0;};else rm -f -- "$p" 2>/dev/null||{ echo F;exit 0;};fi\n' ..
  'echo OK\n'

-- }======================================================

local function now_ms() return core.hrtime_ms() end

--- A stand-in Daytona on a new stand-in (see the module's comment for `opts`).
function M.new(opts)
  opts = opts or {}
  local svc = stand_in.new()
  local backing = opts.backing or stand_in.local_backing({ max_sandboxes = opts.max_sandboxes or 8 })
  local key = assert(opts.api_key, 'the stand-in needs api_key')
  local state = {
    api_key = key, minute_ms = opts.minute_ms or 60000, create_delay_ms = opts.create_delay_ms or 0,
    starting_polls = opts.starting_polls or 0, starting_state = 'starting', desktop = opts.desktop == true,
    cut_executes = 0, shell = opts.shell or 'sh', signalled = {},
    proxy_domain = opts.proxy_domain or 'proxy.daytona.test',
    sandboxes = {}, destroyed = {}, backing = backing, created = 0,
    snapshots = {}, deleted_snapshots = {}, snapshot_fails = 0,
  }
  svc.daytona = state

  function state.count()
    local n = 0
    for _, rec in pairs(state.sandboxes) do
      if rec.dto.state ~= 'destroyed' then n = n + 1 end
    end
    return n
  end

  local function authorized(req)
    return req.headers['authorization'] == 'Bearer ' .. state.api_key
  end

  local function refused(req)
    local got = tostring(req.headers['authorization'])
    return api_error(401, 'Invalid credentials: ' .. got .. ' is not a key of this organization')
  end

  -- {------------------------------------------------------ lifetimes

  local function destroy(rec)
    if rec.dto.state == 'destroyed' then return end
    rec.dto.state, rec.dto.desiredState = 'destroyed', 'destroyed'
    for _, t in pairs(rec.timers) do t.cancel() end
    rec.timers = {}
    state.sandboxes[rec.id] = nil
    state.destroyed[rec.id] = true
    task.spawn(function() backing:release(rec.id) end)
  end

  local function stop(rec)
    if rec.dto.state ~= 'started' then return end
    rec.dto.state = 'stopped'
    if rec.dto.autoDeleteInterval == 0 then
      destroy(rec)
    elseif rec.dto.autoDeleteInterval and rec.dto.autoDeleteInterval > 0 then
      rec.timers.delete = task.after(rec.dto.autoDeleteInterval * state.minute_ms, function() destroy(rec) end, true)
    end
  end

  -- Destroys at ttlMinutes; stops after autoStopInterval minutes without toolbox activity.
  local function arm(rec)
    if rec.timers.ttl then rec.timers.ttl.cancel() end
    local ttl = rec.dto.ttlMinutes
    if ttl and ttl > 0 then
      local left = rec.created_ms + ttl * state.minute_ms - now_ms()
      rec.timers.ttl = task.after(math.max(1, math.floor(left)), function() destroy(rec) end, true)
    end
    local function watch()
      rec.timers.idle = nil
      local every = rec.dto.autoStopInterval
      if rec.dto.state ~= 'started' or not every or every <= 0 then return end
      local idle = now_ms() - rec.last_activity
      if rec.inflight == 0 and idle >= every * state.minute_ms then return stop(rec) end
      local wait = rec.inflight > 0 and every * state.minute_ms or (every * state.minute_ms - idle)
      rec.timers.idle = task.after(math.max(1, math.floor(wait)), watch, true)
    end
    if rec.timers.idle then rec.timers.idle.cancel() end
    watch()
  end

  -- }------------------------------------------------------

  local function dto_out(rec)
    local d = {}
    for k, v in pairs(rec.dto) do d[k] = v end
    d.env, d.labels = object(rec.dto.env), object(rec.dto.labels)
    d.updatedAt = os.date('!%Y-%m-%dT%H:%M:%SZ')
    return d
  end

  -- A control-plane handler: the key, then the sandbox (404 once destroyed or unknown).
  local function api(fn, needs_sandbox)
    return function(req)
      if not authorized(req) then return refused(req) end
      local rec
      if needs_sandbox then
        rec = state.sandboxes[req.params.id]
        if not rec then return api_error(404, 'Sandbox with ID or name ' .. req.params.id .. ' not found') end
      end
      return fn(req, rec)
    end
  end

  svc:route('POST', '/api/sandbox', api(function(req)
    local b = req.json
    if type(b) ~= 'table' then return api_error(400, 'the body must be a JSON object') end
    for _, k in ipairs({ 'ttlMinutes', 'autoStopInterval', 'autoDeleteInterval', 'autoArchiveInterval', 'cpu',
      'memory', 'disk' }) do
      if b[k] ~= nil and (type(b[k]) ~= 'number' or b[k] ~= math.floor(b[k])) then
        return api_error(400, k .. ' must be an integer')
      end
    end
    if b.env ~= nil and type(b.env) ~= 'table' then return api_error(400, 'env must be an object') end
    if b.labels ~= nil and type(b.labels) ~= 'table' then return api_error(400, 'labels must be an object') end
    if state.create_delay_ms > 0 then task.sleep(state.create_delay_ms) end
    local ttl = b.ttlMinutes or 0
    local lifetime = 86400000
    if ttl > 0 then lifetime = math.min(86400000, ttl * state.minute_ms + 5000) end
    local env = {}
    for k, v in pairs(b.env or {}) do env[k] = v end
    local from
    if type(b.snapshot) == 'string' then
      from = state.snapshots[b.snapshot]
      if not from then
        for _, sn in pairs(state.snapshots) do if sn.dto.name == b.snapshot then from = sn end end
      end
      if not from and state.deleted_snapshots[b.snapshot] then
        return api_error(404, 'Snapshot ' .. b.snapshot .. ' not found')
      end
      if from and from.dto.state ~= 'active' then
        return api_error(400, 'Snapshot ' .. b.snapshot .. ' is ' .. from.dto.state)
      end
    end
    local ok, id, sb = pcall(backing.create, backing, { lifetime_ms = lifetime, env = env, network = 'none',
      snapshot = from and from.held or nil })
    if not ok then return api_error(400, 'cannot create the sandbox: ' .. tostring(id and id.message or id)) end
    local at = os.date('!%Y-%m-%dT%H:%M:%SZ')
    local rec = {
      id = id, sb = sb, actions = {}, previews = {}, inflight = 0, last_activity = now_ms(), created_ms = now_ms(),
      timers = {}, polls_left = state.starting_polls, desktop = { started = false, x = 0, y = 0 }, body = b,
    }
    rec.dto = {
      id = id, name = b.name or id, organizationId = 'org-stand-in', snapshot = b.snapshot or 'daytona-small',
      user = b.user or 'daytona', env = env, labels = b.labels or {}, public = b.public == true,
      networkBlockAll = b.networkBlockAll == true, networkAllowList = b.networkAllowList,
      domainAllowList = b.domainAllowList, target = b.target or 'us', cpu = b.cpu or 1, gpu = 0,
      memory = b.memory or 1, disk = b.disk or 3, state = 'started', desiredState = 'started',
      recoverable = false, autoStopInterval = b.autoStopInterval or 15, autoArchiveInterval = b.autoArchiveInterval
      or 10080, autoDeleteInterval = b.autoDeleteInterval or -1, ttlMinutes = ttl, createdAt = at,
      lastActivityAt = at, daemonVersion = '0.0.0-stand-in', toolboxProxyUrl = svc:url('/toolbox'),
    }
    state.sandboxes[id] = rec
    state.created = state.created + 1
    arm(rec)
    local out = dto_out(rec)
    if rec.polls_left > 0 then out.state = 'creating' end
    return { status = 200, json = out }
  end))

  svc:route('GET', '/api/sandbox', api(function(req)
    local want
    if req.query.labels then
      local ok, v = pcall(json.decode, req.query.labels)
      if not ok or type(v) ~= 'table' then return api_error(400, 'labels must be JSON') end
      want = v
    end
    local items = setmetatable({}, json.array_mt)
    for _, rec in pairs(state.sandboxes) do
      local match = true
      for k, v in pairs(want or {}) do
        if rec.dto.labels[k] ~= v then match = false end
      end
      if match then items[#items + 1] = dto_out(rec) end
    end
    return { json = { items = items, nextCursor = json.null } }
  end))

  svc:route('GET', '/api/sandbox/{id}', api(function(_, rec)
    local out = dto_out(rec)
    if rec.polls_left > 0 then
      rec.polls_left = rec.polls_left - 1
      out.state = state.starting_state
      if out.state == 'error' then out.errorReason = 'the runner refused it: no capacity in us-1' end
    end
    return { json = out }
  end, true))

  svc:route('DELETE', '/api/sandbox/{id}', api(function(_, rec)
    destroy(rec)
    return { json = dto_out(rec) }
  end, true))

  -- {------------------------------------------------------ snapshots of a sandbox

  local function snapshot_out(sn)
    return object(sn.dto)
  end

  svc:route('POST', '/api/sandbox/{id}/snapshot', api(function(req, rec)
    local b = req.json
    if type(b) ~= 'table' or type(b.name) ~= 'string' or not b.name:match('^[%w][%w%._%-]*$') or #b.name > 128 then
      return api_error(400, 'name must be a valid snapshot name')
    end
    if b.includeMemory == true then return api_error(400, 'memory snapshots are not supported for this sandbox') end
    if rec.dto.state ~= 'started' then return api_error(400, 'Sandbox must be started to create a snapshot') end
    for _, other in pairs(state.snapshots) do
      if other.dto.name == b.name then return api_error(409, 'Snapshot with name ' .. b.name .. ' already exists') end
    end
    local at = os.date('!%Y-%m-%dT%H:%M:%SZ')
    local sn = { dto = {
      id = string.format('%s-%s-4%s-a%s-%s', random_hex(8), random_hex(4), random_hex(3), random_hex(3),
        random_hex(12)),
      organizationId = 'org-stand-in', general = false, name = b.name, state = 'pending', size = json.null,
      entrypoint = json.null, cpu = rec.dto.cpu, gpu = 0, mem = rec.dto.memory, disk = rec.dto.disk,
      errorReason = json.null, createdAt = at, updatedAt = at, lastUsedAt = json.null, sourceSandboxId = rec.id,
    } }
    state.snapshots[sn.dto.id] = sn
    rec.dto.state = 'snapshotting'
    task.spawn(function()
      local fail = state.snapshot_fails > 0
      if fail then state.snapshot_fails = state.snapshot_fails - 1 end
      local ok, held = false, 'the stand-in fails this snapshot'
      if not fail then ok, held = pcall(rec.sb.snapshot, rec.sb) end
      if rec.dto.state == 'snapshotting' then rec.dto.state = 'started' end
      if ok and state.snapshots[sn.dto.id] then
        sn.held = held
        sn.dto.state, sn.dto.size = 'active', held.size_bytes / 1073741824
      elseif ok then
        held:release()   -- deleted while it was made
      else
        sn.dto.state, sn.dto.errorReason = 'error', 'the snapshot could not be made'
      end
      sn.dto.updatedAt = os.date('!%Y-%m-%dT%H:%M:%SZ')
    end)
    return { json = dto_out(rec) }
  end, true))

  local function snapshot_of(id_or_name)
    local sn = state.snapshots[id_or_name]
    if sn then return sn end
    for _, other in pairs(state.snapshots) do if other.dto.name == id_or_name then return other end end
    return nil
  end

  svc:route('GET', '/api/snapshots', api(function(req)
    local list = {}
    for _, sn in pairs(state.snapshots) do
      if not req.query.sourceSandboxId or sn.dto.sourceSandboxId == req.query.sourceSandboxId then
        list[#list + 1] = sn
      end
    end
    table.sort(list, function(a, b) return a.dto.id < b.dto.id end)
    local items = setmetatable({}, json.array_mt)
    for i, sn in ipairs(list) do items[i] = snapshot_out(sn) end
    return { json = { items = items, total = #items, page = 1, totalPages = 1 } }
  end))

  svc:route('GET', '/api/snapshots/{id}', api(function(req)
    local sn = snapshot_of(req.params.id)
    if not sn then return api_error(404, 'Snapshot ' .. req.params.id .. ' not found') end
    return { json = snapshot_out(sn) }
  end))

  svc:route('DELETE', '/api/snapshots/{id}', api(function(req)
    local sn = state.snapshots[req.params.id]
    if not sn then return api_error(404, 'Snapshot with ID ' .. req.params.id .. ' not found') end
    state.snapshots[req.params.id] = nil
    state.deleted_snapshots[sn.dto.id], state.deleted_snapshots[sn.dto.name] = true, true
    if sn.held then sn.held:release() end
    return { status = 200 }
  end))

  -- }------------------------------------------------------

  svc:route('GET', '/api/sandbox/{id}/toolbox-proxy-url', api(function()
    return { json = { url = svc:url('/toolbox') } }
  end, true))

  local function preview(signed)
    return api(function(req, rec)
      local port = tonumber(req.params.port)
      if not port or port < 1 or port > 65535 or port ~= math.floor(port) then
        return api_error(400, 'invalid port')
      end
      local token = random_hex(32)
      local expires = tonumber(req.query.expiresInSeconds or '60')
      if signed and (not expires or expires < 1 or expires > 86400) then
        return api_error(400, 'expiresInSeconds must be between 1 and 86400')
      end
      rec.previews[#rec.previews + 1] = { port = port, token = token, expires = expires, signed = signed }
      if signed then
        return { json = { sandboxId = rec.id, port = port, token = token,
          url = 'https://' .. port .. '-' .. token .. '.' .. state.proxy_domain } }
      end
      return { json = { sandboxId = rec.id, token = token,
        url = 'https://' .. port .. '-' .. rec.id .. '.' .. state.proxy_domain } }
    end, true)
  end
  svc:route('GET', '/api/sandbox/{id}/ports/{port}/preview-url', preview(false))
  svc:route('GET', '/api/sandbox/{id}/ports/{port}/signed-preview-url', preview(true))

  for _, field in ipairs({ 'autostop', 'autodelete', 'ttl' }) do
    svc:route('POST', '/api/sandbox/{id}/' .. field .. '/{minutes}', api(function(req, rec)
      local n = tonumber(req.params.minutes)
      if not n or n ~= math.floor(n) then return api_error(400, 'minutes must be an integer') end
      local name = ({ autostop = 'autoStopInterval', autodelete = 'autoDeleteInterval', ttl = 'ttlMinutes' })[field]
      rec.dto[name] = n
      arm(rec)
      return { json = dto_out(rec) }
    end, true))
  end

  svc:route('GET', '/api/config', api(function()
    return { json = { defaultSnapshot = 'daytona-small', proxyTemplateUrl = 'https://{{PORT}}-{{sandboxId}}.'
      .. state.proxy_domain } }
  end))

  -- {------------------------------------------------------ the toolbox

  -- A toolbox handler: the key, a running sandbox, activity kept, the local sandbox's failures
  -- as the daemon answers them.
  local function toolbox(fn)
    return function(req)
      if not authorized(req) then
        return daemon_error(401, 'UNAUTHORIZED', 'invalid credentials: ' .. tostring(req.headers['authorization']), req)
      end
      local rec = state.sandboxes[req.params.id]
      if not rec or rec.dto.state ~= 'started' or not backing:get(rec.id) then
        return daemon_error(401, 'UNAUTHORIZED', 'sandbox not found or not accessible', req)
      end
      rec.inflight = rec.inflight + 1
      rec.last_activity = now_ms()
      local ok, res = pcall(fn, req, rec)
      rec.inflight = rec.inflight - 1
      rec.last_activity = now_ms()
      if ok then return res end
      if errors.is(res, 'SANDBOX_ERROR') and res.reason == 'gone' then
        return daemon_error(401, 'UNAUTHORIZED', 'sandbox not found or not accessible', req)
      end
      if errors.is(res, 'PERMISSION_DENIED') then return daemon_error(403, 'FORBIDDEN', 'permission denied', req) end
      if errors.is(res, 'INVALID_INPUT') or errors.is(res, 'LIMIT_EXCEEDED') then
        return daemon_error(400, 'BAD_REQUEST', tostring(res.message), req)
      end
      error(res, 0)
    end
  end

  local T = '/toolbox/{id}'

  svc:route('POST', T .. '/process/execute', toolbox(function(req, rec)
    local b = req.json
    if type(b) ~= 'table' or type(b.command) ~= 'string' or not b.command:find('%S') then
      return daemon_error(400, 'BAD_REQUEST', 'command is required', req)
    end
    local timeout_ms = MAX_EXEC_MS
    if type(b.timeout) == 'number' and b.timeout > 0 then timeout_ms = math.floor(b.timeout * 1000) end
    local env
    if type(b.envs) == 'table' then
      env = {}
      for k, v in pairs(b.envs) do env[k] = v end
    end
    -- the timeout's SIGKILL reaches the command's process group, setsid'd processes live on
    local cmd = stand_in.command(rec.sb, { state.shell }, { stdin = b.command, cwd = b.cwd, env = env,
      timeout_ms = timeout_ms, reach = 'group', end_kills_group = true,
      on_signal = function(sent) state.signalled[#state.signalled + 1] = sent end })
    local ok, r = pcall(cmd.wait, cmd)
    if not ok then
      if errors.is(r, 'INVALID_INPUT') then return { json = { exitCode = -1, result = 'failed to start' } } end
      error(r, 0)
    end
    if r.timed_out then return daemon_error(408, 'REQUEST_TIMEOUT', 'command execution timeout', req) end
    if state.cut_executes > 0 then
      state.cut_executes = state.cut_executes - 1
      return { reset = true }
    end
    return { json = { exitCode = r.exit_code or -1, result = r.stdout .. r.stderr } }
  end))

  for _, p in ipairs({ '/work-dir', '/user-home-dir' }) do
    svc:route('GET', T .. p, toolbox(function() return { json = { dir = M.WORKDIR } } end))
  end

  local function path_of(req)
    local p = req.query.path
    if type(p) ~= 'string' or p == '' then return nil end
    return p
  end

  svc:route('GET', T .. '/files/info', toolbox(function(req, rec)
    local p = path_of(req)
    if not p then return daemon_error(400, 'BAD_REQUEST', 'path is required', req) end
    local info = stat(rec.sb, p)
    if not info then return daemon_error(404, 'FILE_NOT_FOUND', 'file not found: ' .. p, req) end
    return { json = file_info_json(info) }
  end))

  svc:route('GET', T .. '/files/download', toolbox(function(req, rec)
    local p = path_of(req)
    if not p then return daemon_error(400, 'BAD_REQUEST', 'path is required', req) end
    local info = stat(rec.sb, p)
    if not info then return daemon_error(404, 'FILE_NOT_FOUND', 'file not found: ' .. p, req) end
    if info.isDir then return daemon_error(400, 'BAD_REQUEST', 'path must be a file', req) end
    local data = rec.sb:read_file(p)
    if not data then return daemon_error(404, 'FILE_NOT_FOUND', 'file not found: ' .. p, req) end
    return { headers = { ['Content-Type'] = 'application/octet-stream' }, body = data }
  end))

  svc:route('POST', T .. '/files/bulk-download', toolbox(function(req, rec)
    local b = req.json
    if type(b) ~= 'table' or type(b.paths) ~= 'table' then
      return daemon_error(400, 'BAD_REQUEST', 'paths are required', req)
    end
    local parts = {}
    for _, p in ipairs(b.paths) do
      local info = type(p) == 'string' and stat(rec.sb, p)
      local function fail(status, code, message)
        parts[#parts + 1] = { name = 'error', filename = tostring(p), content_type = 'application/json',
          data = json.encode({ message = message, statusCode = status, code = code }) }
      end
      if not info then
        fail(404, 'FILE_NOT_FOUND', 'file not found')
      elseif info.isDir then
        fail(400, 'BAD_REQUEST', 'path is a directory')
      else
        parts[#parts + 1] = { name = 'file', filename = p, data = rec.sb:read_file(p) or '' }
      end
    end
    local body, boundary = M.multipart(parts)
    return { headers = { ['Content-Type'] = 'multipart/form-data; boundary=' .. boundary }, body = body }
  end))

  svc:route('POST', T .. '/files/bulk-upload', toolbox(function(req, rec)
    local parts = M.parse_multipart(req.headers['content-type'], req.body)
    if not parts then return { status = 400, json = { errors = { 'invalid multipart form' } } } end
    local dests, errs, files = {}, {}, setmetatable({}, json.array_mt)
    for _, part in ipairs(parts) do
      local idx, field = (part.name or ''):match('^files%[(%d+)%]%.(%a+)$')
      if field == 'path' then
        local dest = part.data:match('^%s*(.-)%s*$')
        if dest == '' then errs[#errs + 1] = 'path[' .. idx .. ']: empty path' else dests[idx] = dest end
      elseif field == 'file' then
        local dest = dests[idx]
        if not dest then
          errs[#errs + 1] = 'file[' .. tostring(idx) .. ']: missing .path metadata'
        else
          local ok, err = pcall(rec.sb.write_file, rec.sb, dest, part.data)
          if ok then
            files[#files + 1] = { path = dest, bytes = #part.data }
          else
            errs[#errs + 1] = dest .. ': ' .. tostring(errors.is(err) and err.message or err)
          end
        end
      end
    end
    if #errs > 0 then return { status = 400, json = { errors = errs, files = files } } end
    return { json = { files = files } }
  end))

  svc:route('GET', T .. '/files', toolbox(function(req, rec)
    local p = path_of(req) or '.'
    local entries = rec.sb:list_files(p)
    if not entries then return daemon_error(404, 'FILE_NOT_FOUND', 'directory not found: ' .. p, req) end
    local out = setmetatable({}, json.array_mt)
    local dir = p:gsub('/+$', '')
    for _, e in ipairs(entries) do
      local full = dir .. '/' .. e.name
      local info
      if e.type == 'symlink' then
        info = stat(rec.sb, full)   -- followed, as os.Stat does; a broken link is left out
      else
        local perm = e.type == 'directory' and '755' or '644'
        local modified = iso(math.floor(e.modified / 1000), string.format('%03d', e.modified % 1000))
        info = { name = e.name, size = e.size, isDir = e.type == 'directory',
          mode = (MODE_CHAR[e.type] or '-') .. rwx(perm), permissions = '0' .. perm, owner = '1000', group = '1000',
          modTime = modified, modifiedAt = modified }
      end
      if info then
        info.name = e.name
        out[#out + 1] = file_info_json(info)
      end
    end
    return { json = out }
  end))

  svc:route('DELETE', T .. '/files', toolbox(function(req, rec)
    local p = path_of(req)
    if not p then return daemon_error(400, 'BAD_REQUEST', 'path is required', req) end
    local r = rec.sb:exec({ 'sh', '-c', DELETE, 'sh', p, req.query.recursive == 'true' and 'true' or 'false' })
    local word = r.stdout:match('^(%u+)')
    if word == 'N' then return daemon_error(404, 'FILE_NOT_FOUND', 'file not found: ' .. p, req) end
    if word == 'D' then
      return daemon_error(400, 'BAD_REQUEST', 'cannot delete directory without recursive flag', req)
    end
    if word ~= 'OK' then return daemon_error(400, 'BAD_REQUEST', 'cannot delete ' .. p, req) end
    return { status = 204 }
  end))

  -- {------------------------------------------------------ computer use (a fixed PNG, recorded actions)

  local function desktop(fn, needs_started)
    return toolbox(function(req, rec)
      if not state.desktop then
        return daemon_error(500, 'INTERNAL_SERVER_ERROR', 'computer use is not available in this snapshot', req)
      end
      if needs_started ~= false and not rec.desktop.started then
        return daemon_error(409, 'CONFLICT', 'computer use processes are not running', req)
      end
      return fn(req, rec, req.json or {})
    end)
  end

  local function record(rec, action)
    rec.actions[#rec.actions + 1] = action
  end

  local function int(v) return type(v) == 'number' and v == math.floor(v) and v >= 0 end

  svc:route('POST', T .. '/computeruse/start', desktop(function(_, rec)
    rec.desktop.started = true
    record(rec, { kind = 'start' })
    local running = { running = true }
    return { json = { message = 'Computer use processes started successfully', status = {
      xvfb = running, xfce4 = running, x11vnc = running, novnc = running } } }
  end, false))

  svc:route('POST', T .. '/computeruse/stop', desktop(function(_, rec)
    rec.desktop.started = false
    return { json = { message = 'Computer use processes stopped successfully' } }
  end, false))

  svc:route('GET', T .. '/computeruse/status', desktop(function(_, rec)
    return { json = { status = rec.desktop.started and 'active' or 'inactive' } }
  end, false))

  svc:route('GET', T .. '/computeruse/screenshot', desktop(function(_, rec)
    record(rec, { kind = 'screenshot' })
    return { json = { screenshot = b64.encode(M.PNG), sizeBytes = #M.PNG,
      cursorPosition = { x = rec.desktop.x, y = rec.desktop.y } } }
  end))

  svc:route('GET', T .. '/computeruse/display/info', desktop(function()
    return { json = { displays = { { id = 0, x = 0, y = 0, width = M.SCREEN.width, height = M.SCREEN.height,
      isActive = true } } } }
  end))

  svc:route('GET', T .. '/computeruse/mouse/position', desktop(function(_, rec)
    return { json = { x = rec.desktop.x, y = rec.desktop.y } }
  end))

  svc:route('POST', T .. '/computeruse/mouse/move', desktop(function(req, rec, b)
    if not int(b.x) or not int(b.y) then return daemon_error(400, 'BAD_REQUEST', 'x and y are required', req) end
    rec.desktop.x, rec.desktop.y = b.x, b.y
    record(rec, { kind = 'move', x = b.x, y = b.y })
    return { json = { x = b.x, y = b.y } }
  end))

  svc:route('POST', T .. '/computeruse/mouse/click', desktop(function(req, rec, b)
    if not int(b.x) or not int(b.y) then return daemon_error(400, 'BAD_REQUEST', 'x and y are required', req) end
    rec.desktop.x, rec.desktop.y = b.x, b.y
    record(rec, { kind = 'click', x = b.x, y = b.y, button = b.button or 'left', double = b.double == true })
    return { json = { x = b.x, y = b.y } }
  end))

  svc:route('POST', T .. '/computeruse/mouse/drag', desktop(function(req, rec, b)
    if not int(b.startX) or not int(b.startY) or not int(b.endX) or not int(b.endY) then
      return daemon_error(400, 'BAD_REQUEST', 'start and end are required', req)
    end
    rec.desktop.x, rec.desktop.y = b.endX, b.endY
    record(rec, { kind = 'drag', x = b.startX, y = b.startY, to_x = b.endX, to_y = b.endY,
      button = b.button or 'left' })
    return { json = { x = b.endX, y = b.endY } }
  end))

  svc:route('POST', T .. '/computeruse/mouse/scroll', desktop(function(req, rec, b)
    if not int(b.x) or not int(b.y) or type(b.direction) ~= 'string' then
      return daemon_error(400, 'BAD_REQUEST', 'x, y and direction are required', req)
    end
    record(rec, { kind = 'scroll', x = b.x, y = b.y, direction = b.direction, amount = b.amount or 1 })
    return { json = { success = true } }
  end))

  svc:route('POST', T .. '/computeruse/keyboard/type', desktop(function(req, rec, b)
    if type(b.text) ~= 'string' then return daemon_error(400, 'BAD_REQUEST', 'text is required', req) end
    record(rec, { kind = 'type', text = b.text })
    return { json = {} }
  end))

  svc:route('POST', T .. '/computeruse/keyboard/key', desktop(function(req, rec, b)
    if type(b.key) ~= 'string' or b.key == '' then return daemon_error(400, 'BAD_REQUEST', 'key is required', req) end
    local mods = {}
    for i, m in ipairs(type(b.modifiers) == 'table' and b.modifiers or {}) do mods[i] = m end
    record(rec, { kind = 'key', key = b.key, modifiers = mods })
    return { json = {} }
  end))

  svc:route('POST', T .. '/computeruse/keyboard/hotkey', desktop(function(req, rec, b)
    if type(b.keys) ~= 'string' or b.keys == '' then return daemon_error(400, 'BAD_REQUEST', 'keys are required', req) end
    record(rec, { kind = 'hotkey', keys = b.keys })
    return { json = {} }
  end))

  -- }------------------------------------------------------

  local close = svc.close
  function svc.close(s)
    for _, rec in pairs(state.sandboxes) do
      for _, t in pairs(rec.timers) do t.cancel() end
      rec.timers = {}
    end
    close(s)
    if not opts.backing then backing:close() end
  end

  return svc
end

return M
