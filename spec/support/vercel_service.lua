--- A stand-in for Vercel Sandbox's REST API (the part the official
-- `@vercel/sandbox` SDK and mayura.sandbox.vercel use), on a stand-in
-- (support/stand_in.lua) and backed by real local sandboxes
-- (stand_in.local_backing()): commands really run, files are really there.
--
--   local svc = stand_in.new()
--   local backing = stand_in.local_backing()
--   local state = vercel_service.install(svc, backing, { token = T, team_id = 'team_x', project_id = 'prj_x' })
--   -- base URL: svc:url('/api') (the SDK's https://vercel.com/api)
--
-- Every call needs `Authorization: Bearer <token>` (else 401, whose body
-- echoes the token it got, so specs can check it never shows) and
-- `?teamId=<team>` (else 403). Errors are `{ error = { code, message } }`.
--
--   POST   /v3/sandboxes, /v2/sandboxes     create: { projectId, timeout (ms), ports, env, tags,
--                                            networkPolicy, resources, image, name, persistent }
--                                            -> { sandbox, session, routes }
--   GET    /v2/sandboxes?project=           { sandboxes, pagination }
--   GET    /v2/sandboxes/{name}?projectId=  { sandbox, session, routes }
--   DELETE /v2/sandboxes/{name}?projectId=  stops its session, forgets it -> { sandbox }
--   GET    /v2/sandboxes/sessions/{sid}     { session, routes }
--   POST   .../sessions/{sid}/stop          { session, sandbox }
--   POST   .../sessions/{sid}/cmd           { command, args, cwd, env, sudo, wait, logs, timeout }:
--                                            { command } at once, or with `wait` NDJSON: the command,
--                                            with `logs` its output lines as they come, then the command with
--                                            its exitCode (or an `error` line)
--   GET    .../cmd/{id}[?wait=true]          { command } (with wait: once it has ended)
--   GET    .../cmd/{id}/logs                 NDJSON output lines, once it has ended
--   POST   .../cmd/{id}/kill                 { signal } -> { command }
--   POST   .../fs/read                       { path, cwd } -> the bytes (application/octet-stream);
--                                            404 with no body when there is no such file
--   POST   .../fs/write                      a gzip'd tar, extracted by tar in the sandbox at x-cwd
--   POST   .../fs/mkdir                      { path, cwd } (not recursive)
--   POST   .../sessions/{sid}/snapshot       { expiration? (ms: 0 never, else at least a day; 30 days
--                                            when left out) } -> { snapshot, session }: the session is
--                                            `snapshotting` while it is made (its calls answer 422
--                                            `sandbox_snapshotting`), then stopped for good, as the
--                                            service documents; a session that is not running is 410
--   GET    /v2/sandboxes/snapshots?project= { snapshots, pagination }
--   GET    /v2/sandboxes/snapshots/{id}     { snapshot } (404 `not_found` for one it never made)
--   DELETE /v2/sandboxes/snapshots/{id}     { snapshot } with status `deleted`
--   a create with `source: { type = 'snapshot', snapshotId }` starts from it; a deleted or expired
--   one is 410 `snapshot_not_found`
--
-- A session ends with its timeout (the local sandbox's lifetime), a stop or
-- a delete; its calls then answer 410 `sandbox_stopped`; an unknown session
-- 404 `not_found`. Where the stand-in differs from the service, because it
-- stands on local sandboxes: the session's cwd is the local sandbox's
-- `/workspace` (the service's is `/vercel/sandbox`); commands run as the
-- local sandbox's user whatever `sudo` says; output comes once a command has
-- ended (stdout's lines, then stderr's), not as it is written; a domain
-- allow-list is enforced as no network at all (the local sandbox has none);
-- ports are served (on 127.0.0.1, their routes' URLs) only with `allow-all`,
-- and their subdomains resolve nowhere; `extend-timeout`, network-policy
-- changes and resuming a stopped sandbox are not there; a snapshot keeps the
-- local sandbox's files of its home and /tmp (through the backing pool's
-- snapshot; the service keeps the whole filesystem), its `sizeBytes` being
-- those files' archive. A command's timeout (SIGKILL)
-- and a kill reach its own process only, as the documents say (`state.signalled` records each).
--
-- `install` returns the service's state, for specs: `sandboxes` (name ->
-- record), `sessions` (id -> record, each with `backing_id` and `policy`),
-- `commands` (id -> record), and `cut_streams`: the next that many command
-- streams are cut after their first line (the command goes on; each cut is
-- in `svc.failures` as `CUT`, the way the stand-in kit cuts a stream).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local stand_in = require('support.stand_in')

local json = core.json

local M = {}

M.MAX_TIMEOUT_MS = 5 * 3600000
M.DEFAULT_TIMEOUT_MS = 300000
M.MAX_PORTS = 15
M.MAX_TAGS = 5
M.CUT = 'the stand-in cuts this stream'   -- what svc.failures holds for each stream it cut
local LOG_CHUNK = 16384
local NDJSON = { ['Content-Type'] = 'application/x-ndjson' }

local function object(t) return setmetatable(t or {}, json.object_mt) end
local function array(t) return setmetatable(t or {}, json.array_mt) end

local function fail(status, code, message)
  return { status = status, json = { error = { code = code, message = message or code } } }
end

local seq = 0
local function new_id(prefix)
  seq = seq + 1
  return string.format('%s_%x%04x%08x', prefix, core.now_ms(), seq, math.random(0, 0x7fffffff))
end

local function line(v) return json.encode(v) .. '\n' end

local is_int = check.is_int

local function string_map(v, max)
  if v == nil then return object() end
  if type(v) ~= 'table' then return nil end
  local n = 0
  for k, x in pairs(v) do
    if type(k) ~= 'string' or type(x) ~= 'string' then return nil end
    n = n + 1
  end
  if max and n > max then return nil end
  return v
end

-- The network policy of a create: the local network for it ('all' or 'none'), and how answers show it.
local function read_policy(p)
  if p == nil then return 'all', object({ mode = 'allow-all' }) end
  if type(p) ~= 'table' then return nil end
  if p.mode == 'allow-all' then return 'all', object({ mode = 'allow-all' }) end
  if p.mode == 'deny-all' then return 'none', object({ mode = 'deny-all' }) end
  if p.mode ~= nil then return nil end
  local shown = object({ mode = 'custom' })
  if p.allow ~= nil then
    if type(p.allow) ~= 'table' then return nil end
    local domains = {}
    for k, v in pairs(p.allow) do
      if type(k) == 'number' and type(v) == 'string' then domains[#domains + 1] = v
      elseif type(k) == 'string' then domains[#domains + 1] = k
      else return nil end
    end
    table.sort(domains)
    shown.allowedDomains = array(domains)
  end
  if p.subnets ~= nil then
    if type(p.subnets) ~= 'table' then return nil end
    shown.allowedCIDRs = p.subnets.allow and array(p.subnets.allow) or nil
    shown.deniedCIDRs = p.subnets.deny and array(p.subnets.deny) or nil
  end
  return 'none', shown
end

--- Installs the API on `svc` over `backing`: `opts` = { token, team_id, project_id, prefix ('/api'),
-- cwd ('/workspace') }. Returns the state (see the module's comment).
function M.install(svc, backing, opts)
  local token, team, project = opts.token, opts.team_id, opts.project_id
  local prefix = opts.prefix or '/api'
  local cwd = opts.cwd or '/workspace'
  local state = { sandboxes = {}, sessions = {}, commands = {}, cut_streams = 0, signalled = {}, snapshots = {} }

  -- {------------------------------------------------------ payloads

  -- A session that ran past its lifetime, or whose sandbox ended, is stopped.
  local function refresh(s)
    if s.status == 'running' and (not backing:get(s.backing_id) or core.now_ms() >= s.startedAt + s.timeout) then
      s.status, s.stoppedAt, s.updatedAt = 'stopped', core.now_ms(), core.now_ms()
    end
    return s
  end

  local function session_json(s)
    refresh(s)
    return object({
      id = s.id, memory = s.memory, vcpus = s.vcpus, region = 'iad1', timeout = s.timeout, status = s.status,
      requestedAt = s.createdAt, startedAt = s.startedAt, stoppedAt = s.stoppedAt, createdAt = s.createdAt,
      cwd = cwd, updatedAt = s.updatedAt, networkPolicy = s.shown_policy, snapshottedAt = s.snapshottedAt,
    })
  end

  local function sandbox_json(r, s)
    s = s or state.sessions[r.session_id]
    refresh(s)
    return object({
      name = r.name, persistent = false, region = 'iad1', vcpus = s.vcpus, memory = s.memory, timeout = r.timeout,
      networkPolicy = s.shown_policy, createdAt = r.createdAt, updatedAt = r.updatedAt,
      currentSessionId = s.id, status = s.status, cwd = cwd, tags = object(r.tags), image = r.image,
    })
  end

  local function routes_json(r)
    local out = {}
    for _, route in ipairs(r.routes) do out[#out + 1] = object(route) end
    return array(out)
  end

  local function command_json(c, finished)
    local exit = c.exitCode
    if finished and exit == nil then exit = 255 end
    return object({
      id = c.id, name = c.name, args = array(c.args), cwd = c.cwd, sessionId = c.sessionId,
      exitCode = exit == nil and json.null or exit, startedAt = c.startedAt, durationMs = c.durationMs,
    })
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------ the checks every call goes through

  local function api(fn)
    return function(req)
      local auth = req.headers.authorization
      if auth ~= 'Bearer ' .. token then
        return { status = 401, json = { error = { code = 'unauthorized',
          message = 'The token ' .. tostring(auth) .. ' is not valid' } } }
      end
      if req.query.teamId ~= team then
        return fail(403, 'forbidden', 'No access to team ' .. tostring(req.query.teamId))
      end
      local ok, res = pcall(fn, req)
      if ok then return res end
      if type(res) == 'table' and res.answer then return res.answer end
      error(res, 0)
    end
  end

  local function refuse(status, code, message)
    error({ answer = fail(status, code, message) }, 0)
  end

  -- The session of the request: running unless `any` (else 410); 404 when unknown.
  local function session_of(req, any)
    local s = state.sessions[req.params.sid]
    if not s then refuse(404, 'not_found', 'Session not found') end
    refresh(s)
    if s.status == 'snapshotting' then refuse(422, 'sandbox_snapshotting', 'Sandbox is snapshotting') end
    if not any and s.status ~= 'running' then refuse(410, 'sandbox_stopped', 'Sandbox is stopped') end
    return s
  end

  local function sandbox_of(req)
    if req.query.projectId ~= project then refuse(404, 'not_found', 'Project not found') end
    local r = state.sandboxes[req.params.name]
    if not r then refuse(404, 'not_found', 'Sandbox not found') end
    return r
  end

  local function stop_session(s)
    if s.status == 'running' then
      s.status, s.stoppedAt, s.updatedAt = 'stopping', core.now_ms(), core.now_ms()
      backing:release(s.backing_id)
      s.status = 'stopped'
    end
  end

  -- }------------------------------------------------------

  -- {------------------------------------------------------ sandboxes

  local function create(req)
    local b = req.json
    if type(b) ~= 'table' then refuse(400, 'bad_request', 'The body must be JSON') end
    if b.projectId ~= project then refuse(404, 'not_found', 'Project not found') end
    local timeout = b.timeout == nil and M.DEFAULT_TIMEOUT_MS or b.timeout
    if not is_int(timeout) or timeout < 1 or timeout > M.MAX_TIMEOUT_MS then
      refuse(400, 'bad_request', '`timeout` is out of range')
    end
    local ports = b.ports or {}
    if type(ports) ~= 'table' or #ports > M.MAX_PORTS then
      refuse(400, 'bad_request', '`ports` should NOT have more than 15 items')
    end
    for _, p in ipairs(ports) do
      if not is_int(p) or p < 1 or p > 65535 then refuse(400, 'bad_request', '`ports` must be ports') end
    end
    local env, tags = string_map(b.env), string_map(b.tags, M.MAX_TAGS)
    if not env or not tags then refuse(400, 'bad_request', '`env` and `tags` must map strings to strings') end
    local network, shown = read_policy(b.networkPolicy)
    if not network then refuse(400, 'bad_request', '`networkPolicy` is not valid') end
    if #ports > 0 and network ~= 'all' then
      refuse(400, 'bad_request', 'this stand-in serves ports only with allow-all')
    end
    local vcpus = 2
    if b.resources ~= nil then
      vcpus = type(b.resources) == 'table' and b.resources.vcpus or nil
      if not is_int(vcpus) or vcpus < 1 or vcpus > 8 then refuse(400, 'bad_request', '`resources.vcpus` is not valid') end
    end
    if b.runtime ~= nil and b.image ~= nil then refuse(400, 'bad_request', '`runtime` and `image` together') end
    local name = b.name
    if name ~= nil and (type(name) ~= 'string' or not name:match('^[%w_%-]+$') or #name > 64) then
      refuse(400, 'bad_request', '`name` is not valid')
    end
    name = name or new_id('sbx')
    if state.sandboxes[name] then refuse(409, 'conflict', 'A sandbox with this name exists') end
    local from
    if b.source ~= nil then
      if type(b.source) ~= 'table' or b.source.type ~= 'snapshot' or type(b.source.snapshotId) ~= 'string' then
        refuse(400, 'bad_request', 'this stand-in starts sandboxes from snapshots only')
      end
      from = state.snapshots[b.source.snapshotId]
      if not from then refuse(404, 'not_found', 'Snapshot not found') end
      if from.status ~= 'created' or (from.expiresAt and core.now_ms() >= from.expiresAt) then
        refuse(410, 'snapshot_not_found', 'Snapshot not found')
      end
      from.lastUsedAt = core.now_ms()
    end
    local backing_id, sb = backing:create({ lifetime_ms = timeout, env = env, network = network, ports = ports,
      snapshot = from and from.held or nil })
    local now = core.now_ms()
    local s = {
      id = new_id('sess'), name = name, backing_id = backing_id, sb = sb, status = 'running', timeout = timeout,
      vcpus = vcpus, memory = vcpus * 2048, createdAt = now, startedAt = now, updatedAt = now,
      policy = b.networkPolicy, shown_policy = shown,
    }
    local routes = {}
    for _, p in ipairs(ports) do
      local sub = name:lower():gsub('[^%w]+', '-') .. '-' .. p
      routes[#routes + 1] = { url = sb:url(p), subdomain = sub, port = p }
    end
    local r = {
      name = name, session_id = s.id, timeout = timeout, tags = tags, image = b.image or b.runtime,
      createdAt = now, updatedAt = now, routes = routes,
    }
    state.sessions[s.id], state.sandboxes[name] = s, r
    return { json = { sandbox = sandbox_json(r), session = session_json(s), routes = routes_json(r) } }
  end
  svc:route('POST', prefix .. '/v3/sandboxes', api(create))
  svc:route('POST', prefix .. '/v2/sandboxes', api(create))

  svc:route('GET', prefix .. '/v2/sandboxes', api(function(req)
    if req.query.project ~= project then refuse(404, 'not_found', 'Project not found') end
    local list = {}
    for _, r in pairs(state.sandboxes) do list[#list + 1] = r end
    table.sort(list, function(a, b) return a.createdAt > b.createdAt or (a.createdAt == b.createdAt and a.name > b.name) end)
    local out = {}
    for i, r in ipairs(list) do out[i] = sandbox_json(r) end
    return { json = { sandboxes = array(out), pagination = { count = #out, next = json.null } } }
  end))

  -- }------------------------------------------------------

  -- {------------------------------------------------------ sessions

  svc:route('GET', prefix .. '/v2/sandboxes/sessions/{sid}', api(function(req)
    local s = session_of(req, true)
    return { json = { session = session_json(s), routes = routes_json(state.sandboxes[s.name]) } }
  end))

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/stop', api(function(req)
    local s = session_of(req, true)
    stop_session(s)
    local r = state.sandboxes[s.name]
    return { json = { session = session_json(s), sandbox = r and sandbox_json(r) or nil } }
  end))

  -- }------------------------------------------------------

  -- {------------------------------------------------------ commands

  local function finish(c)
    c.done = true
    local waiters = c.waiters
    c.waiters = {}
    for _, w in ipairs(waiters) do w() end
  end

  -- Waits for the command's end, or for the client to leave; whether it ended.
  local function wait_done(c, signal)
    -- waiters are woken by new log lines too: wait again until the end
    while not c.done and not signal.cancelled do
      task.await(function(done)
        c.waiters[#c.waiters + 1] = done
        signal:on_cancel(function() done() end)
      end)
    end
    return c.done
  end

  -- Waits until the command has more than n log lines, or ends, or the client leaves; false then.
  local function wait_more(c, n, signal)
    if c.done or #c.logs > n then return true end
    task.await(function(done)
      c.waiters[#c.waiters + 1] = done
      signal:on_cancel(function() done() end)
    end)
    return not signal.cancelled
  end

  -- The command's output as it comes: log lines (LOG_CHUNK at most each), waking who waits for them.
  local function logger(c, name)
    return function(text)
      for i = 1, #text, LOG_CHUNK do c.logs[#c.logs + 1] = { stream = name, data = text:sub(i, i + LOG_CHUNK - 1) } end
      local waiters = c.waiters
      c.waiters = {}
      for _, w in ipairs(waiters) do w() end
    end
  end

  local function log_lines(c)
    local out = {}
    for _, l in ipairs(c.logs) do out[#out + 1] = line(l) end
    if c.error then out[#out + 1] = line({ stream = 'error', data = c.error }) end
    return out
  end

  -- The command's timeout and a kill reach its own process, as the service documents (SIGKILL at
  -- the timeout: exit code 137): stand_in.command with reach 'process'.
  local function run(s, c, argv, o)
    local started = core.hrtime_ms()
    -- the output reaches the logs as the command writes it (all of it by the time it ended)
    o.on_stdout, o.on_stderr = logger(c, 'stdout'), logger(c, 'stderr')
    o.reach = 'process'
    o.on_signal = function(sent) state.signalled[#state.signalled + 1] = { command = c.id, pid = sent.pid,
      signal = sent.signal, why = sent.why } end
    c.process = stand_in.command(s.sb, argv, o)
    if c.pending_kill then c.process:kill(c.pending_kill, 'kill') end
    local ok, r = pcall(c.process.wait, c.process)
    c.durationMs = math.floor(core.hrtime_ms() - started)
    if ok then
      if r.exit_code then c.exitCode = r.exit_code
      else c.exitCode = 128 + r.signal end
    elseif errors.is(r, 'SANDBOX_ERROR') and r.reason == 'gone' then
      c.error = { code = 'sandbox_stopped', message = 'The sandbox stopped' }
    else
      c.error = { code = 'command_failed', message = 'The command could not run: ' .. tostring(r) }
    end
    finish(c)
  end

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/cmd', api(function(req)
    local s = session_of(req)
    local b = req.json
    if type(b) ~= 'table' or type(b.command) ~= 'string' or b.command == '' then
      refuse(400, 'bad_request', '`command` is required')
    end
    local args = b.args or {}
    local env = string_map(b.env)
    if type(args) ~= 'table' or not env then refuse(400, 'bad_request', '`args` and `env` are not valid') end
    local argv = { b.command }
    for _, a in ipairs(args) do
      if type(a) ~= 'string' then refuse(400, 'bad_request', '`args` must be strings') end
      argv[#argv + 1] = a
    end
    if b.timeout ~= nil and (not is_int(b.timeout) or b.timeout < 1) then
      refuse(400, 'bad_request', '`timeout` is not valid')
    end
    local c = {
      id = new_id('cmd'), name = b.command, args = { check.unpack(argv, 2) }, cwd = b.cwd or cwd,
      sessionId = s.id, startedAt = core.now_ms(), logs = {}, waiters = {},
    }
    state.commands[c.id] = c
    -- the command runs on its own: a client that leaves does not end it
    task.spawn(run, s, c, argv, { cwd = c.cwd, env = env, timeout_ms = b.timeout })
    if not b.wait then return { json = { command = command_json(c) } } end
    local cut = state.cut_streams > 0
    if cut then state.cut_streams = state.cut_streams - 1 end
    return { status = 200, headers = NDJSON, stream = function(send)
      if not send(line({ command = command_json(c) })) then return end
      if cut then
        task.sleep(50)
        error(M.CUT, 0)
      end
      if b.logs then
        -- the lines as they come, as the service streams them
        local i = 0
        while true do
          while i < #c.logs do
            i = i + 1
            if not send(line(c.logs[i])) then return end
          end
          if c.done then break end
          if not wait_more(c, i, req.signal) then return end
        end
        if c.error then send(line({ stream = 'error', data = c.error })) end
      elseif not wait_done(c, req.signal) then
        return
      elseif c.error then
        send(line({ stream = 'error', data = c.error }))
      end
      if not c.error then send(line({ command = command_json(c, true) })) end
    end }
  end))

  local function command_of(req, s)
    local c = state.commands[req.params.cid]
    if not c or c.sessionId ~= s.id then refuse(404, 'not_found', 'Command not found') end
    return c
  end

  svc:route('GET', prefix .. '/v2/sandboxes/sessions/{sid}/cmd/{cid}', api(function(req)
    local c = command_of(req, session_of(req, true))
    if req.query.wait == 'true' then
      wait_done(c, req.signal)
      return { json = { command = command_json(c, true) } }
    end
    return { json = { command = command_json(c) } }
  end))

  svc:route('GET', prefix .. '/v2/sandboxes/sessions/{sid}/cmd/{cid}/logs', api(function(req)
    local c = command_of(req, session_of(req, true))
    return { status = 200, headers = NDJSON, stream = function(send)
      if not wait_done(c, req.signal) then return end
      for _, l in ipairs(log_lines(c)) do
        if not send(l) then return end
      end
    end }
  end))

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/cmd/{cid}/kill', api(function(req)
    local c = command_of(req, session_of(req))
    local sig = type(req.json) == 'table' and req.json.signal or 15
    if not is_int(sig) or sig < 1 or sig > 64 then refuse(400, 'bad_request', '`signal` is not valid') end
    if not c.done then
      if c.process then c.process:kill(sig, 'kill') else c.pending_kill = sig end
    end
    return { json = { command = command_json(c) } }
  end))

  -- }------------------------------------------------------

  -- {------------------------------------------------------ files

  local function abs(path, base)
    if type(path) ~= 'string' or path == '' then refuse(400, 'bad_request', '`path` is required') end
    if path:sub(1, 1) == '/' then return path end
    return (type(base) == 'string' and base or cwd) .. '/' .. path
  end

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/fs/read', api(function(req)
    local s = session_of(req)
    local b = type(req.json) == 'table' and req.json or {}
    local ok, data = pcall(s.sb.read_file, s.sb, abs(b.path, b.cwd), { max_bytes = 64 * 1048576 })
    if not ok then
      if errors.is(data, 'SANDBOX_ERROR') and data.reason == 'gone' then refuse(410, 'sandbox_stopped') end
      refuse(400, 'bad_request', 'The file cannot be read')
    end
    if data == nil then return { status = 404 } end
    return { headers = { ['Content-Type'] = 'application/octet-stream' }, body = data }
  end))

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/fs/write', api(function(req)
    local s = session_of(req)
    local root = req.headers['x-cwd'] or '/'
    if root:sub(1, 1) ~= '/' then refuse(400, 'bad_request', '`x-cwd` must be absolute') end
    local r = s.sb:exec({ 'tar', '-xzf', '-', '-C', root }, { stdin = req.body, timeout_ms = 120000 })
    if r.exit_code ~= 0 then refuse(400, 'bad_request', 'Extracting the files failed: ' .. r.stderr) end
    return { json = object() }
  end))

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/fs/mkdir', api(function(req)
    local s = session_of(req)
    local b = type(req.json) == 'table' and req.json or {}
    local r = s.sb:exec({ 'mkdir', '--', abs(b.path, b.cwd) })
    if r.exit_code ~= 0 then refuse(400, 'bad_request', 'mkdir failed: ' .. r.stderr) end
    return { json = object() }
  end))

  -- }------------------------------------------------------

  -- {------------------------------------------------------ snapshots

  local function snapshot_json(sn)
    return object({
      id = sn.id, sourceSessionId = sn.sourceSessionId, region = 'iad1', status = sn.status, sizeBytes = sn.sizeBytes,
      expiresAt = sn.expiresAt, createdAt = sn.createdAt, updatedAt = sn.updatedAt, lastUsedAt = sn.lastUsedAt,
      creationMethod = 'snapshot',
    })
  end

  svc:route('POST', prefix .. '/v2/sandboxes/sessions/{sid}/snapshot', api(function(req)
    local s = session_of(req)
    local b = req.json
    if b == nil and (req.body or '') == '' then b = {} end
    if type(b) ~= 'table' then refuse(400, 'bad_request', 'The body must be JSON') end
    local expiration = b.expiration == nil and 30 * 86400000 or b.expiration
    if not is_int(expiration) or (expiration ~= 0 and expiration < 86400000) then
      refuse(400, 'bad_request', '`expiration` must be 0 or at least a day')
    end
    local sb = backing:get(s.backing_id)
    if not sb then refuse(410, 'sandbox_stopped', 'Sandbox is stopped') end
    s.status, s.updatedAt = 'snapshotting', core.now_ms()
    local ok, held = pcall(sb.snapshot, sb)
    -- made or not, the session ends with it
    s.status = 'running'
    stop_session(s)
    if not ok then
      svc.failures[#svc.failures + 1] = held
      refuse(500, 'internal_server_error', 'The snapshot failed')
    end
    local now = core.now_ms()
    local sn = {
      id = new_id('snap'), sourceSessionId = s.id, status = 'created', sizeBytes = held.size_bytes, held = held,
      createdAt = now, updatedAt = now, expiresAt = expiration > 0 and now + expiration or nil,
    }
    s.snapshottedAt = now
    state.snapshots[sn.id] = sn
    if state.snapshot_answer then return state.snapshot_answer end
    return { json = { snapshot = snapshot_json(sn), session = session_json(s) } }
  end))

  svc:route('GET', prefix .. '/v2/sandboxes/snapshots', api(function(req)
    if req.query.project ~= project then refuse(404, 'not_found', 'Project not found') end
    local list = {}
    for _, sn in pairs(state.snapshots) do
      if sn.status == 'created' then list[#list + 1] = sn end
    end
    table.sort(list, function(a, b) return a.createdAt > b.createdAt or (a.createdAt == b.createdAt and a.id > b.id) end)
    local out = {}
    for i, sn in ipairs(list) do out[i] = snapshot_json(sn) end
    return { json = { snapshots = array(out), pagination = { count = #out, next = json.null } } }
  end))

  local function snapshot_of(req)
    local sn = state.snapshots[req.params.id]
    if not sn then refuse(404, 'not_found', 'Snapshot not found') end
    return sn
  end

  svc:route('GET', prefix .. '/v2/sandboxes/snapshots/{id}', api(function(req)
    return { json = { snapshot = snapshot_json(snapshot_of(req)) } }
  end))

  svc:route('DELETE', prefix .. '/v2/sandboxes/snapshots/{id}', api(function(req)
    local sn = snapshot_of(req)
    if sn.status == 'created' then
      sn.status, sn.updatedAt = 'deleted', core.now_ms()
      sn.held:release()
    end
    return { json = { snapshot = snapshot_json(sn) } }
  end))

  -- }------------------------------------------------------

  -- {------------------------------------------------------ a sandbox by name (after the sessions' routes)

  svc:route('GET', prefix .. '/v2/sandboxes/{name}', api(function(req)
    local r = sandbox_of(req)
    local s = state.sessions[r.session_id]
    return { json = { sandbox = sandbox_json(r), session = session_json(s), routes = routes_json(r), resumed = false } }
  end))

  svc:route('DELETE', prefix .. '/v2/sandboxes/{name}', api(function(req)
    local r = sandbox_of(req)
    local s = state.sessions[r.session_id]
    stop_session(s)
    state.sandboxes[r.name] = nil
    state.sessions[s.id] = nil
    return { json = { sandbox = sandbox_json(r, s) } }
  end))

  -- }------------------------------------------------------

  return state
end

return M
