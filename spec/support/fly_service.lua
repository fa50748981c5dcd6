--- A stand-in for the Fly Machines API (the calls mayura.sandbox.fly makes, as Fly's
-- documentation and its OpenAPI spec describe them), on a stand-in (support/stand_in.lua)
-- backed by real local sandboxes (stand_in.local_backing()): each machine is a local sandbox.
--
--   local svc = stand_in.new()
--   local state = fly_service.install(svc, backing, { token = T, app = 'my-app' })
--   -- base URL: svc:url('') (the service's https://api.machines.dev)
--
-- Every call needs `Authorization: Bearer <token>` (else 401, whose body echoes the token it
-- got, so specs can check it never shows); an app other than `app` is 404. Errors are
-- `{ error = <message>, status = <machine-readable status> }` as fly-go reads them.
--
--   POST   /v1/apps/{app}/machines                { name, region, config = { image, env, guest,
--                                                   init, auto_destroy, restart, metadata } }
--                                                  -> the Machine (state 'created' or, with
--                                                  `started_at_create`, 'started')
--   GET    /v1/apps/{app}/machines                 [Machine]
--   GET    /v1/apps/{app}/machines/{id}            Machine (404 once destroyed)
--   GET    /v1/apps/{app}/machines/{id}/wait       ?state=started&timeout=<1..60 s>: the
--                                                  machine's state (400 outside 1..60; 408 past it)
--   POST   /v1/apps/{app}/machines/{id}/exec       { command = argv | cmd = 'words' (fly-go's
--                                                  deprecated form, split at blanks, quotes kept
--                                                  together), stdin, timeout (s) } -> { stdout,
--                                                  stderr, exit_code } (200 whatever the exit code;
--                                                  408 deadline_exceeded past timeout)
--   DELETE /v1/apps/{app}/machines/{id}?kill=true  destroys it (`kill`, as fly-go sends it, or
--                                                  `force`, as the OpenAPI names it; without
--                                                  either a started machine is 412)
--
-- An exec past its timeout answers 408 and the command runs on: Fly's documents do not say
-- that the deadline stops the command, so the stand-in does not (a caller stops its own).
--
-- Where it differs from the service: the image is not pulled (every machine is a local
-- sandbox with its /workspace, whatever `config.image` says) and `init` is not run (the local
-- sandbox's lifetime is the seconds of an `init.exec` that ends in `sleep N`, else ten
-- minutes); machines have no network (the local sandbox's 'none', though Fly gives every
-- machine the internet); exec's stdout is bytes, where Fly's is a JSON string.
local core = require('mayura.core')

local json = core.json

local M = {}

local function object(t) return setmetatable(t or {}, json.object_mt) end
local function array(t) return setmetatable(t or {}, json.array_mt) end

local function fail(status, code, message)
  return { status = status, json = { error = message or code, status = code } }
end

-- fly-go's `cmd`: one string, split into words at blanks; '...' and "..." hold blanks.
local function split_words(cmd)
  local words, cur, quote, any = {}, {}, nil, false
  for ch in cmd:gmatch('.') do
    if quote then
      if ch == quote then quote = nil else cur[#cur + 1] = ch end
    elseif ch == '"' or ch == "'" then
      quote, any = ch, true
    elseif ch:match('%s') then
      if #cur > 0 or any then words[#words + 1] = table.concat(cur) end
      cur, any = {}, false
    else
      cur[#cur + 1] = ch
    end
  end
  if quote then return nil end
  if #cur > 0 or any then words[#words + 1] = table.concat(cur) end
  return words
end

local seq = 0
local function new_id()
  seq = seq + 1
  return string.format('%x%04x%06x', core.now_ms() % 0xffffffff, seq, math.random(0, 0xffffff))
end

--- Installs the API on `svc` over `backing`: `opts` = { token, app, started_at_create }.
-- Returns the state: `machines` (id -> record with `backing_id`, `body` (the create's JSON),
-- `state`), `execs` (how many execs ran).
function M.install(svc, backing, opts)
  local token, app = opts.token, opts.app
  local state = { machines = {}, execs = 0 }

  local function refresh(m)
    if m.state ~= 'destroyed' and not backing:get(m.backing_id) then m.state = 'destroyed' end
    return m
  end

  local function machine_json(m)
    refresh(m)
    return object({
      id = m.id, name = m.name, state = m.state, region = m.region, instance_id = m.instance_id,
      private_ip = 'fdaa::3', config = m.body.config, image_ref = object({ repository = 'library/stand-in' }),
      created_at = m.created_at, updated_at = m.created_at, events = array(),
    })
  end

  -- Checks the token and the app; returns an answer when the call is refused.
  local function refuse(req)
    local auth = req.headers.authorization
    if auth ~= 'Bearer ' .. token then
      return fail(401, 'unauthenticated', 'token ' .. tostring(auth) .. ' is not valid for this stand-in')
    end
    if req.params.app ~= app then return fail(404, 'not_found', 'app not found: stand-in') end
    return nil
  end

  local function find(req)
    local m = state.machines[req.params.id]
    if not m or refresh(m).state == 'destroyed' then
      return nil, fail(404, 'not_found', 'machine not found (stand-in)')
    end
    return m
  end

  svc:route('POST', '/v1/apps/{app}/machines', function(req)
    local no = refuse(req)
    if no then return no end
    local body = req.json
    if type(body) ~= 'table' or type(body.config) ~= 'table' or type(body.config.image) ~= 'string' then
      return fail(400, 'invalid_argument', 'config.image is required')
    end
    local seconds = 600
    local init = body.config.init
    if type(init) == 'table' and type(init.exec) == 'table' then
      local last = init.exec[#init.exec]
      local n = type(last) == 'string' and tonumber(last:match('sleep (%d+)%s*$') or last:match('^(%d+)$'))
      if n then seconds = n end
    end
    local env = {}
    for k, v in pairs(type(body.config.env) == 'table' and body.config.env or {}) do env[k] = v end
    local backing_id = backing:create({ lifetime_ms = seconds * 1000, env = env })
    local m = {
      id = new_id(), name = body.name or ('m-' .. seq), region = body.region or 'iad', backing_id = backing_id,
      instance_id = '01' .. new_id(), body = body, created_at = '2026-11-30T00:00:00Z',
      state = opts.started_at_create and 'started' or 'created',
    }
    state.machines[m.id] = m
    -- it starts a little later, as Fly's do
    if m.state == 'created' then
      require('mayura._task').after(30, function() if m.state == 'created' then m.state = 'started' end end, true)
    end
    return { json = machine_json(m) }
  end)

  svc:route('GET', '/v1/apps/{app}/machines', function(req)
    local no = refuse(req)
    if no then return no end
    local out = {}
    for _, m in pairs(state.machines) do
      if refresh(m).state ~= 'destroyed' then out[#out + 1] = machine_json(m) end
    end
    return { json = array(out) }
  end)

  svc:route('GET', '/v1/apps/{app}/machines/{id}', function(req)
    local no = refuse(req)
    if no then return no end
    local m, err = find(req)
    if not m then return err end
    return { json = machine_json(m) }
  end)

  svc:route('GET', '/v1/apps/{app}/machines/{id}/wait', function(req)
    local no = refuse(req)
    if no then return no end
    local m, err = find(req)
    if not m then return err end
    local want = req.query.state or 'started'
    local timeout = tonumber(req.query.timeout or '60')
    if not timeout or timeout < 1 or timeout > 60 then
      return fail(400, 'invalid_argument', 'timeout must be between 1 and 60 seconds')
    end
    local deadline = core.now_ms() + timeout * 1000
    while refresh(m).state ~= want do
      if core.now_ms() >= deadline then return fail(408, 'deadline_exceeded', 'waiting timed out') end
      require('mayura._task').sleep(10)
    end
    return { json = { ok = true } }
  end)

  svc:route('POST', '/v1/apps/{app}/machines/{id}/exec', function(req)
    local no = refuse(req)
    if no then return no end
    local m, err = find(req)
    if not m then return err end
    if m.state ~= 'started' then return fail(412, 'failed_precondition', 'machine is not started') end
    local body = req.json
    local argv = type(body) == 'table' and body.command
    if type(body) == 'table' and argv == nil and type(body.cmd) == 'string' then argv = split_words(body.cmd) end
    if type(argv) ~= 'table' or #argv == 0 then
      return fail(400, 'invalid_argument', 'command is required')
    end
    local sb = backing:get(m.backing_id)
    if not sb then return fail(404, 'not_found', 'machine not found (stand-in)') end
    state.execs = state.execs + 1
    local timeout = tonumber(body.timeout) or 30
    -- the command runs in a task of its own: past the deadline the answer is 408, and it runs on
    local task = require('mayura._task')
    local result
    local wake
    task.spawn(function()
      local ok, r = pcall(sb.exec, sb, argv, { stdin = body.stdin, timeout_ms = 1800000 })   -- the backing's longest
      result = { ok = ok, r = r }
      if wake then wake() end
    end)
    if not result then
      task.await(function(done)
        local timer = task.after(timeout * 1000, function() if wake then wake = nil; done() end end)
        wake = function() wake = nil; timer.cancel(); done() end
      end)
    end
    if not result then return fail(408, 'deadline_exceeded', 'exec timed out') end
    local ok, r = result.ok, result.r
    if not ok then return fail(500, 'internal', 'exec failed in the stand-in') end
    local out = { stdout = r.stdout, stderr = r.stderr }
    if r.exit_code ~= 0 then out.exit_code = r.exit_code end   -- omitempty, as fly-go
    return { json = out }
  end)

  svc:route('DELETE', '/v1/apps/{app}/machines/{id}', function(req)
    local no = refuse(req)
    if no then return no end
    local m, err = find(req)
    if not m then return err end
    if req.query.kill ~= 'true' and req.query.force ~= 'true' and m.state == 'started' then
      return fail(412, 'failed_precondition', 'machine is running: stop it or force')
    end
    m.state = 'destroyed'
    backing:release(m.backing_id)
    return { json = { ok = true } }
  end)

  return state
end

return M
