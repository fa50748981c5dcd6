--- A stand-in for Northflank's API as sandboxes use it, on a stand-in
-- (support/stand_in.lua), over real local sandboxes: what
-- mayura.sandbox.northflank and the official `@northflank/js-client` talk to in
-- the specs (the client's WebSocket exec through spec/npm/northflank_front.mjs).
--
--   local state = northflank_service.install(svc, backing, { token = t, project_id = 'p' })
--   local state = northflank_service.install_with_exec_host(svc, backing, opts)   -- state.exec_url
--
-- REST (`Authorization: Bearer <token>`; every success is HTTP 200 with `{ data }`,
-- every failure `{ error = { status, message, id } }`):
--   POST   /v1/projects/{p}/services/deployment   { name, billing, deployment = { instances,
--          external = { imagePath }, docker = { configType, customCommand } },
--          runtimeEnvironment } -> { data = { id, name, ... } }  (409 for a name in use)
--   GET    /v1/projects/{p}/services/{s}          -> { data = { id, name, status = { deployment =
--          { status } } } }: IN_PROGRESS for the first `state.pending_polls` reads, then COMPLETED
--   DELETE /v1/projects/{p}/services/{s}          -> { data = {} }
--   (and the same under /v1/teams/{t}/projects/...)
-- Exec (`POST /exec`, the HTTP/2 exec host's API; here over HTTP/1.1, behind the HTTP/2 exec host
-- of spec/npm/northflank_exec.mjs, which `install_with_exec_host` starts): a body of NDJSON messages,
-- `init` ({ auth = { type = 'apiToken', apiToken }, context = { projectId, serviceId, command
-- (argv with shell 'none', else a string run by `sh -c`), encoding } }), `payload` (standard
-- input, base64 with encoding 'base64') and `stdInEnd`; the answer is NDJSON: `init` ({ auth =
-- 'successful' } or a refusal with a message naming the token it got), `stdOut`/`stdErr`
-- (base64 with that encoding, else text), `completion` ({ exitCode, status }), or `error` for a
-- service that is not there. With `X-Init-Only: 1` the answer is the init line alone and nothing
-- runs (the WebSocket front's first step).
--
-- Faults: the stand-in's own per-route faults (svc:fault), `state.pending_polls`, and
-- `state.cut_exec` (the next that many exec answers end after `init`, before any completion).
local core = require('mayura.core')
local compat = require('support.compat')

local json, b64 = core.json, core.base64

local M = {}

local CHUNK = 48 * 1024

local function fail(status, message)
  return { status = status, json = { error = { status = status, message = message, id = 'stand-in-error' } } }
end

--- Installs the API on `svc` over `backing`; `opts` = { token, project_id, team_id }. Returns its
-- state: `services` (id -> record: { id, name, backing_id, body, polls, deleted }).
function M.install(svc, backing, opts)
  local state = { services = {}, pending_polls = 0, cut_exec = 0, execs = {} }

  local function authed(req)
    return req.headers['authorization'] == 'Bearer ' .. opts.token
  end

  local function api(fn)
    return function(req)
      if not authed(req) then
        return fail(401, 'Unauthorized: ' .. tostring(req.headers['authorization']))
      end
      if req.params.p ~= opts.project_id or (req.params.t and req.params.t ~= opts.team_id) then
        return fail(404, 'Project not found')
      end
      return fn(req)
    end
  end

  local function live(id)
    local rec = state.services[id]
    if not rec or rec.deleted then return nil end
    if not backing:get(rec.backing_id) then return nil end
    return rec
  end

  local function create(req)
    local b = req.json
    if type(b) ~= 'table' or type(b.name) ~= 'string' or not b.name:match('^[a-z][a-z0-9%-]*$') or #b.name > 39
      or type(b.deployment) ~= 'table' or type(b.deployment.external) ~= 'table'
      or type(b.deployment.external.imagePath) ~= 'string' then
      return fail(400, 'Invalid request body')
    end
    if state.services[b.name] and not state.services[b.name].deleted then return fail(409, 'Name already in use') end
    local env
    if b.runtimeEnvironment ~= nil then
      if type(b.runtimeEnvironment) ~= 'table' then return fail(400, 'Invalid runtimeEnvironment') end
      env = {}
      for k, v in pairs(b.runtimeEnvironment) do
        if type(v) ~= 'string' then return fail(400, 'Invalid runtimeEnvironment') end
        env[k] = v
      end
    end
    local bid = backing:create({ lifetime_ms = 3600000, env = env, network = 'all' })
    local rec = { id = b.name, name = b.name, backing_id = bid, body = b, polls = state.pending_polls }
    state.services[rec.id] = rec
    return { json = { data = { id = rec.id, name = rec.name, appId = '/' .. opts.project_id .. '/' .. rec.id,
      serviceType = 'deployment', deployment = b.deployment } } }
  end

  local function get(req)
    local rec = live(req.params.s)
    if not rec then return fail(404, 'Service not found') end
    local status = 'COMPLETED'
    if rec.polls > 0 then
      rec.polls = rec.polls - 1
      status = 'IN_PROGRESS'
    end
    return { json = { data = { id = rec.id, name = rec.name, serviceType = 'deployment',
      status = { deployment = { status = status, lastTransitionTime = '2026-11-30T12:00:00.000Z' } } } } }
  end

  local function delete(req)
    local rec = state.services[req.params.s]
    if not rec or rec.deleted then return fail(404, 'Service not found') end
    rec.deleted = true
    backing:release(rec.backing_id)
    return { json = { data = setmetatable({}, json.object_mt) } }
  end

  for _, base in ipairs({ '/v1/projects/{p}', '/v1/teams/{t}/projects/{p}' }) do
    svc:route('POST', base .. '/services/deployment', api(create))
    svc:route('GET', base .. '/services/{s}', api(get))
    svc:route('DELETE', base .. '/services/{s}', api(delete))
  end

  svc:route('POST', '/exec', function(req)
    local msgs = {}
    for line in (req.body or ''):gmatch('[^\n]+') do
      local ok, v = pcall(json.decode, line)
      if not ok or type(v) ~= 'table' then return { status = 400, body = 'bad message' } end
      msgs[#msgs + 1] = v
    end
    local init = msgs[1]
    local headers = { ['Content-Type'] = 'application/x-ndjson' }
    local function line(v) return json.encode(v) .. '\n' end
    if type(init) ~= 'table' or init.type ~= 'init' or type(init.data) ~= 'table' then
      return { status = 400, body = 'no init' }
    end
    local auth, context = init.data.auth, init.data.context
    state.execs[#state.execs + 1] = { init = init, req = req }
    if type(auth) ~= 'table' or auth.apiToken ~= opts.token then
      return { headers = headers, body = line({ type = 'init', data = { auth = 'failed',
        message = 'Invalid token ' .. tostring(type(auth) == 'table' and auth.apiToken) } }) }
    end
    if type(context) ~= 'table' or context.projectId ~= opts.project_id
      or req.headers['x-target-key'] ~= tostring(context.serviceId) .. (context.instanceName or 'na') then
      return { headers = headers, body = line({ type = 'error', data = { message = 'Invalid context' } }) }
    end
    local rec = live(context.serviceId)
    if not rec then
      return { headers = headers, body = line({ type = 'error', data = { message = 'Service not found' } }) }
    end
    local argv = context.command
    if type(argv) == 'string' then argv = { 'sh', '-c', argv }
    elseif context.shell ~= nil and context.shell ~= 'none' and type(argv) == 'table' then
      argv = { 'sh', '-c', table.concat(argv, ' ') }
    end
    if type(argv) ~= 'table' or #argv == 0 then
      return { headers = headers, body = line({ type = 'error', data = { message = 'Invalid command' } }) }
    end
    local base64 = context.encoding == 'base64'
    local stdin = {}
    for i = 2, #msgs do
      if msgs[i].type == 'payload' and type(msgs[i].data) == 'string' then
        stdin[#stdin + 1] = base64 and b64.decode(msgs[i].data) or msgs[i].data
      end
    end
    local welcome = line({ type = 'init', data = { auth = 'successful', context = { instanceName = rec.id .. '-0' } } })
    -- the WebSocket front asks for the init answer first, as Northflank sends it at once
    if req.headers['x-init-only'] then return { status = 200, headers = headers, body = welcome } end
    local cut = state.cut_exec > 0
    if cut then state.cut_exec = state.cut_exec - 1 end
    return { status = 200, headers = headers, stream = function(send)
      if not send(welcome) then return end
      if cut then return end
      local sb = backing:get(rec.backing_id)
      local ok, r = pcall(sb.exec, sb, argv, { stdin = #stdin > 0 and table.concat(stdin) or nil, signal = req.signal,
        timeout_ms = 600000 })
      if not ok then
        send(line({ type = 'error', data = { message = 'Command failed' } }))
        return
      end
      for _, name in ipairs({ 'stdout', 'stderr' }) do
        local out = r[name]
        for i = 1, #out, CHUNK do
          local part = out:sub(i, i + CHUNK - 1)
          if not send(line({ type = name == 'stdout' and 'stdOut' or 'stdErr', data = base64 and b64.encode(part)
            or part })) then return end
        end
      end
      local code = r.exit_code
      if code == nil then code = compat.math_type(r.signal) == 'integer' and 128 + r.signal or 137 end
      send(line({ type = 'completion', data = { exitCode = code, status = code == 0 and 'Success' or 'Failure' } }))
    end }
  end)

  return state
end

--- install, then the exec host (spec/npm/northflank_exec.mjs, a Node process speaking HTTP/2 alone)
-- in front of the stand-in's `/exec`: `state.exec_url` is its h2c origin, `state.close_all()`
-- ends it.
function M.install_with_exec_host(svc, backing, opts)
  local process = require('mayura.process')
  local task = require('mayura._task')
  local util = require('support.util')
  local state = M.install(svc, backing, opts)
  local dir = util.tmpdir()
  local portfile = dir .. '/exec-host.port'
  state.exec_host = task.spawn(function()
    return process.run({ 'node', 'spec/npm/northflank_exec.mjs', svc:url(''), portfile }, { timeout_ms = 3600000 })
  end)
  local deadline = core.hrtime_ms() + 15000
  while not state.exec_url do
    local f = io.open(portfile)
    local port = f and f:read('a')
    if f then f:close() end
    if port and port:match('^%d+$') then
      state.exec_url = 'http://127.0.0.1:' .. port
    elseif core.hrtime_ms() > deadline then
      util.rmdir(dir)
      error('the exec host did not start')
    else
      task.sleep(20)
    end
  end
  function state.close_all()
    if state.exec_host then
      pcall(require('mayura.http').request, { url = state.exec_url .. '/quit', http_version = '2', timeout_ms = 5000 })
      state.exec_host:wait()
      state.exec_host = nil
    end
    util.rmdir(dir)
  end
  return state
end

return M
