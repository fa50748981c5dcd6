--- A stand-in for Railway's sandboxes API (GraphQL at `/graphql/v2`) on a
-- stand-in (support/stand_in.lua), over real local sandboxes: what
-- mayura.sandbox.railway and the official `railway` SDK talk to in the specs.
--
--   local state = railway_service.install(svc, backing, { token = t, environment_id = 'env' })
--
-- Every request is `POST /graphql/v2` with `{ query, variables }`, answered
-- with HTTP 200 and `{ data }` or `{ errors = [{ message }], data = null }` as
-- the service does. The operation is the query's root field, its arguments
-- the variables of the same names. Taken:
--
--   sandboxCreate(input)            { environmentId, idleTimeoutMinutes (1-120), networkIsolation,
--                                   region, variables, publicDomains } -> { id, status, ... }
--                                   (CREATING when `state.creating_polls` > 0: that many `sandbox`
--                                   reads say so)
--
-- Public domains: `publicDomains` ([{ port, prefix? }], at most 10, one per prefix and port, and
-- only with networkIsolation PRIVATE asked for, as the service's schema says) become the
-- sandbox's `domains` ([{ prefix, port, domain }], `<prefix>.` .. `state.domain_suffix`; a prefix
-- left out is made up), published from the `state.domain_polls`-th read of the sandbox on
-- (at once by default). `state.edge[domain]` is the loopback URL that serves that port of the sandbox behind
-- it (the local sandbox's own forward): the spec's DNS and edge.
--   sandbox(environmentId, id)      the sandbox, or null
--   sandboxes(environmentId)        { edges = [{ node }], pageInfo }
--   sandboxExec(command, environmentId, id, timeoutSec)
--                                   runs `sh -c command` -> { exitCode, stdout, stderr, timedOut,
--                                   truncated } (stdout and stderr cut at 4 MiB)
--   sandboxHeartbeat(id, environmentId), sandboxDestroy(id, environmentId)
--   generateShellToken(input = { environmentId, instanceId, kind = 'sandbox', scope })
--                                   a token for the exec bridge, for that sandbox
--
-- The exec bridge (`/ws/exec`, a WebSocket) is spec/npm/railway_front.mjs, a Node process on the
-- `ws` package (start it with `state:start_front()`, which gives its ws:// URL); it checks a
-- connection's token with `GET /_bridge/check` (X-Shell-Token) and runs a command, once its
-- standard input is closed, with `POST /_bridge/exec` ({ token, command, cwd, env, stdin (base64) }
-- -> { exit_code, stdout, stderr } (base64), 404 for a sandbox that is gone, 401 for a token that
-- is not one); the command runs as `sh -c command`. A `signal` frame ({ signal = TERM, KILL, INT,
-- QUIT or HUP }) goes to the running command's processes with `POST /_bridge/signal` ({ token,
-- exec_id, signal }; recorded in `state.signals`), as Railway delivers it to the process group.
-- Faults there: svc:fault on those routes.
--
-- Auth: `Authorization: Bearer <token>` or `Project-Access-Token: <token>`;
-- another token is a `Not Authorized` error that names the token it got (a
-- provider must not pass it on). An unknown sandbox is `Sandbox not found`.
-- A sandbox idle (no exec, no heartbeat) for its idleTimeoutMinutes is destroyed.
--
-- Faults per operation: `state:fault(op, answer, times)` answers the next
-- `times` calls of `op` with a stand-in answer (stand_in.rate_limited(1),
-- { stall = true }, ...); `state:vanish(id)` destroys a sandbox behind the
-- client's back.
local core = require('mayura.core')
local compat = require('support.compat')
local task = require('mayura._task')
local stand_in = require('support.stand_in')

local json = core.json

local M = {}

M.NULL = json.null
M.PATH = '/graphql/v2'
local CAP = 4 * 1048576   -- the service's own cap on sandboxExec's output is not documented
local ENDED = { DESTROYING = true, DESTROYED = true, FAILED = true }

local function gql_error(message, code)
  return { json = { errors = { { message = message, extensions = code and { code = code } or nil } },
    data = json.null } }
end

-- The root field of a query: the first name inside its first selection set.
local function root_field(query)
  if type(query) ~= 'string' then return nil end
  local sel = query:find('{', 1, true)
  if not sel then return nil end
  return query:match('^%s*([%a_][%w_]*)', sel + 1)
end

--- Installs the API on `svc` over `backing`; `opts` = { token, environment_id }. Returns its state:
-- `sandboxes` (id -> record), `creating_polls`, `fault`, `vanish`, `ops` (the operations, in order).
function M.install(svc, backing, opts)
  local state = { sandboxes = {}, creating_polls = 0, faults = {}, ops = {}, seq = 0, tokens = {}, running = {},
    signals = {} }

  function state.fault(_, op, answer, times)
    state.faults[op] = { answer = answer, left = times or math.huge }
  end

  -- public domains: their suffix, the reads before one is published, domain -> loopback URL
  state.domain_suffix, state.domain_polls, state.edge = 'up.railway.test', 0, {}

  local function drop(rec)
    if rec.timer then rec.timer.cancel() end
    rec.timer = nil
    if rec.backing_id then backing:release(rec.backing_id) end
    rec.backing_id = nil
  end

  local function touch(rec)
    if rec.timer then rec.timer.cancel() end
    rec.timer = task.after(rec.idleTimeoutMinutes * 60000, function()
      rec.status = 'DESTROYED'
      rec.timer = nil
      task.spawn(drop, rec)
    end, true)
  end

  function state.vanish(_, id)
    local rec = state.sandboxes[id]
    if rec then
      state.sandboxes[id] = nil
      drop(rec)
    end
  end

  local function view(rec)
    local domains = setmetatable({}, json.array_mt)
    if (rec.domain_polls or 0) <= 0 then
      for i, d in ipairs(rec.domains or {}) do domains[i] = { prefix = d.prefix, port = d.port, domain = d.domain } end
    end
    return { id = rec.id, status = rec.status, networkIsolation = rec.networkIsolation,
      environmentId = rec.environmentId, region = rec.region, idleTimeoutMinutes = rec.idleTimeoutMinutes,
      createdAt = rec.createdAt, domains = domains }
  end

  -- The public domains asked for at create: a list of { prefix, port }, or nil and a GraphQL error.
  local function public_domains(input)
    local list = input.publicDomains
    if list == nil or list == json.null then return {} end
    if type(list) ~= 'table' or #list > 10 then
      return nil, gql_error('publicDomains supports up to 10 domains', 'BAD_USER_INPUT')
    end
    if input.networkIsolation ~= 'PRIVATE' then
      return nil, gql_error('Public domains require PRIVATE network isolation', 'BAD_USER_INPUT')
    end
    local out, seen = {}, {}
    for _, d in ipairs(list) do
      local port, prefix = type(d) == 'table' and d.port, type(d) == 'table' and d.prefix
      if compat.math_type(port) ~= 'integer' or port < 1 or port > 65535 then
        return nil, gql_error('port must be from 1 through 65535', 'BAD_USER_INPUT')
      end
      if prefix == nil or prefix == json.null then
        state.seq = state.seq + 1
        prefix = string.format('project-%d%04x', state.seq, math.random(0, 0xffff))
      elseif type(prefix) ~= 'string' or #prefix > 46 or not prefix:match('^[a-z0-9]$')
        and not prefix:match('^[a-z0-9][a-z0-9%-]*[a-z0-9]$') then
        return nil, gql_error('Invalid domain prefix', 'BAD_USER_INPUT')
      end
      if seen[prefix .. ':' .. port] then return nil, gql_error('Duplicate public domain', 'BAD_USER_INPUT') end
      seen[prefix .. ':' .. port] = true
      out[#out + 1] = { prefix = prefix, port = port }
    end
    return out
  end

  local function find(v)
    if type(v) ~= 'table' or v.environmentId ~= opts.environment_id then return nil end
    local rec = state.sandboxes[v.id]
    if rec and not ENDED[rec.status] and rec.backing_id and not backing:get(rec.backing_id) then
      rec.status = 'DESTROYED'   -- the sandbox behind it ended
    end
    return rec
  end

  local ops = {}

  function ops.sandboxCreate(v, _, record)
    local input = v.input
    if type(input) ~= 'table' or input.environmentId ~= opts.environment_id then
      return gql_error('Environment not found', 'NOT_FOUND')
    end
    local idle = input.idleTimeoutMinutes or 30
    if compat.math_type(idle) ~= 'integer' or idle < 1 or idle > 120 then
      return gql_error('idleTimeoutMinutes must be between 1 and 120', 'BAD_USER_INPUT')
    end
    local env
    if input.variables ~= nil then
      if type(input.variables) ~= 'table' then return gql_error('variables must be a map', 'BAD_USER_INPUT') end
      env = {}
      for k, x in pairs(input.variables) do
        if type(x) ~= 'string' then return gql_error('variables must be strings', 'BAD_USER_INPUT') end
        env[k] = x
      end
    end
    local domains, derr = public_domains(input)
    if not domains then return derr end
    local ports = {}
    for _, d in ipairs(domains) do ports[#ports + 1] = d.port end
    local bid, bsb = backing:create({ lifetime_ms = 3600000, env = env, network = 'all', ports = ports })
    for _, d in ipairs(domains) do
      d.domain = d.prefix .. '.' .. state.domain_suffix
      state.edge[d.domain] = bsb:url(d.port)
    end
    state.seq = state.seq + 1
    local id = string.format('sbx_%d%06x', state.seq, math.random(0, 0xffffff))
    local rec = { id = id, backing_id = bid, status = state.creating_polls > 0 and 'CREATING' or 'RUNNING',
      polls = state.creating_polls, networkIsolation = input.networkIsolation or 'ISOLATED',
      environmentId = input.environmentId, region = input.region or 'us-west2', idleTimeoutMinutes = idle,
      createdAt = '2026-11-30T12:00:00.000Z', input = input, domains = domains,
      domain_polls = #domains > 0 and state.domain_polls or 0 }
    state.sandboxes[id] = rec
    record.id = id
    touch(rec)
    return { json = { data = { sandboxCreate = view(rec) } } }
  end

  function ops.sandbox(v)
    local rec = find(v)
    if not rec then return { json = { data = { sandbox = json.null } } } end
    if rec.domain_polls > 0 then rec.domain_polls = rec.domain_polls - 1 end
    if rec.status == 'CREATING' then
      rec.polls = rec.polls - 1
      if rec.polls <= 0 then rec.status = 'RUNNING' end
      return { json = { data = { sandbox = view(rec) } } }
    end
    return { json = { data = { sandbox = view(rec) } } }
  end

  function ops.sandboxes(v)
    if type(v) ~= 'table' or v.environmentId ~= opts.environment_id then
      return gql_error('Environment not found', 'NOT_FOUND')
    end
    local edges = {}
    for _, rec in pairs(state.sandboxes) do
      if not ENDED[rec.status] then edges[#edges + 1] = { node = view(rec) } end
    end
    return { json = { data = { sandboxes = { edges = setmetatable(edges, json.array_mt),
      pageInfo = { hasNextPage = false, endCursor = json.null } } } } }
  end

  function ops.sandboxExec(v, req)
    local rec = find(v)
    if not rec or ENDED[rec.status] then return gql_error('Sandbox not found', 'NOT_FOUND') end
    if rec.status ~= 'RUNNING' then return gql_error('Sandbox is not running', 'BAD_USER_INPUT') end
    if type(v.command) ~= 'string' then return gql_error('command is required', 'BAD_USER_INPUT') end
    local sb = backing:get(rec.backing_id)
    touch(rec)
    local timeout_s = v.timeoutSec or 60
    local ok, r = pcall(sb.exec, sb, { 'sh', '-c', v.command }, { timeout_ms = timeout_s * 1000, signal = req.signal })
    if not ok then
      if not backing:get(rec.backing_id) then return gql_error('Sandbox not found', 'NOT_FOUND') end
      return gql_error('exec failed', 'INTERNAL_SERVER_ERROR')
    end
    touch(rec)
    local truncated = r.truncated == true
    local out, err = r.stdout, r.stderr
    if #out > CAP then out, truncated = out:sub(1, CAP), true end
    if #err > CAP then err, truncated = err:sub(1, CAP), true end
    return { json = { data = { sandboxExec = { exitCode = r.exit_code or -1, stdout = out, stderr = err,
      timedOut = r.timed_out == true, truncated = truncated } } } }
  end

  function ops.sandboxHeartbeat(v)
    local rec = find(v)
    if not rec or ENDED[rec.status] then return gql_error('Sandbox not found', 'NOT_FOUND') end
    touch(rec)
    return { json = { data = { sandboxHeartbeat = view(rec) } } }
  end

  function ops.sandboxDestroy(v)
    local rec = find(v)
    if not rec then return gql_error('Sandbox not found', 'NOT_FOUND') end
    rec.status = 'DESTROYED'
    drop(rec)
    return { json = { data = { sandboxDestroy = view(rec) } } }
  end

  function ops.generateShellToken(v)
    local input = v.input
    if type(input) ~= 'table' or input.kind ~= 'sandbox' then return gql_error('Invalid input', 'BAD_USER_INPUT') end
    local rec = find({ environmentId = input.environmentId, id = input.instanceId })
    if not rec or ENDED[rec.status] then return gql_error('Sandbox not found', 'NOT_FOUND') end
    state.seq = state.seq + 1
    local token = string.format('eyJ.stand-in-%d-%08x', state.seq, math.random(0, 0x7fffffff))
    state.tokens[token] = rec.id
    return { json = { data = { generateShellToken = token } } }
  end

  svc:route('GET', '/_bridge/check', function(req)
    local id = state.tokens[req.headers['x-shell-token'] or '']
    if not id then return { status = 401, json = { error = 'bad token' } } end
    local rec = state.sandboxes[id]
    if not rec or ENDED[rec.status] or not backing:get(rec.backing_id) then return { status = 404, json = {} } end
    return { json = { ok = true } }
  end)

  svc:route('POST', '/_bridge/exec', function(req)
    local b = req.json
    local id = type(b) == 'table' and state.tokens[b.token or ''] or nil
    if not id then return { status = 401, json = { error = 'bad token' } } end
    local rec = state.sandboxes[id]
    local sb = rec and not ENDED[rec.status] and backing:get(rec.backing_id)
    if not sb then return { status = 404, json = {} } end
    if type(b.command) ~= 'string' then return { status = 400, json = {} } end
    touch(rec)
    local key = type(b.exec_id) == 'string' and (b.token .. ' ' .. b.exec_id) or nil
    -- a signal frame reaches the command's process group, as Railway delivers it
    local cmd = stand_in.command(sb, { 'sh', '-c', b.command }, { cwd = b.cwd, env = b.env,
      stdin = b.stdin and core.base64.decode(b.stdin) or nil, reach = 'group' })
    if key then state.running[key] = cmd end
    local ok, r = pcall(cmd.wait, cmd)
    if key then state.running[key] = nil end
    if not ok then
      if not backing:get(rec.backing_id) then return { status = 404, json = {} } end
      return { status = 500, json = {} }
    end
    touch(rec)
    return { json = { exit_code = r.exit_code or -1, stdout = core.base64.encode(r.stdout),
      stderr = core.base64.encode(r.stderr) } }
  end)

  -- A `signal` frame of the bridge: the signal goes to the running command's process group (not
  -- to a process that left it with setsid), recorded in `state.signals`.
  local SIGNALS = { TERM = 15, KILL = 9, INT = 2, QUIT = 3, HUP = 1 }
  svc:route('POST', '/_bridge/signal', function(req)
    local b = req.json
    local id = type(b) == 'table' and state.tokens[b.token or ''] or nil
    if not id then return { status = 401, json = { error = 'bad token' } } end
    local n = SIGNALS[type(b.signal) == 'string' and b.signal or '']
    if not n or type(b.exec_id) ~= 'string' then return { status = 400, json = {} } end
    local key = b.token .. ' ' .. b.exec_id
    for _ = 1, 200 do   -- a signal sent just after stdin_close may come before the command started
      if state.running[key] then break end
      task.sleep(10)
    end
    local p = state.running[key]
    if not p then return { json = { delivered = false } } end
    state.signals[#state.signals + 1] = { sandbox = id, signal = b.signal }
    return { json = { delivered = p:kill(n, 'signal') } }
  end)

  svc:route('POST', M.PATH, function(req)
    local auth = req.headers['authorization']
    local project = req.headers['project-access-token']
    local got = auth and auth:match('^Bearer (.*)$') or project
    local b = req.json
    local op = type(b) == 'table' and root_field(b.query) or nil
    local record = { op = op, variables = type(b) == 'table' and b.variables or nil, req = req }
    state.ops[#state.ops + 1] = record
    if got ~= opts.token then
      return gql_error('Not Authorized: ' .. tostring(got), 'UNAUTHENTICATED')
    end
    if not op or not ops[op] then return { status = 400, json = { errors = { { message = 'Unknown operation' } } } } end
    local f = state.faults[op]
    if f then
      f.left = f.left - 1
      if f.left <= 0 then state.faults[op] = nil end
      return f.answer
    end
    local v = type(b.variables) == 'table' and b.variables or {}
    return ops[op](v, req, record)
  end)

  --- The operations of one name the stand-in got, in order (each { op, variables, req }).
  function state.calls(_, op)
    local out = {}
    for _, o in ipairs(state.ops) do
      if o.op == op then out[#out + 1] = o end
    end
    return out
  end

  --- Starts the exec bridge (spec/npm/railway_front.mjs) for this stand-in; returns its ws:// URL.
  function state.start_front(_, dir)
    local process = require('mayura.process')
    local portfile = dir .. '/railway-front.port'
    state.front = task.spawn(function()
      return process.run({ 'node', 'spec/npm/railway_front.mjs', svc:url(''), portfile }, { timeout_ms = 3600000 })
    end)
    local deadline = core.hrtime_ms() + 15000
    while core.hrtime_ms() < deadline do
      local f = io.open(portfile)
      local port = f and f:read('a')
      if f then f:close() end
      if port and port:match('^%d+$') then
        state.front_url = 'http://127.0.0.1:' .. port
        return 'ws://127.0.0.1:' .. port .. '/ws/exec'
      end
      task.sleep(20)
    end
    error('the exec bridge did not start')
  end

  function state.close()
    if state.front then
      pcall(require('mayura.http').request, { url = state.front_url .. '/quit', timeout_ms = 5000 })
      state.front:wait()
      state.front = nil
    end
    for _, rec in pairs(state.sandboxes) do
      if rec.timer then rec.timer.cancel() end
      rec.timer = nil
    end
  end

  return state
end

--- install(svc, backing, opts), then the exec bridge started with its port file in a new
-- temporary directory: state.ws_url is the bridge's URL, and state.close_all() closes the state
-- (the bridge with it) and removes that directory.
function M.install_with_front(svc, backing, opts)
  local util = require('support.util')
  local state = M.install(svc, backing, opts)
  local dir = util.tmpdir()
  state.ws_url = state:start_front(dir)
  function state.close_all()
    state.close()
    util.rmdir(dir)
  end
  return state
end

return M
