--- A stand-in for the HTTP API of Cloudflare's sandbox bridge Worker (`bridge/worker` of
-- cloudflare/sandbox-sdk, prefix /v1), on a stand-in (support/stand_in.lua) backed by real local
-- sandboxes (stand_in.local_backing()): each sandbox's container is a local sandbox.
--
--   local svc = stand_in.new()
--   local state = cloudflare_service.install(svc, backing, { api_key = K })
--   -- base URL: svc:url('') (the user's https://<worker>.<subdomain>.workers.dev)
--
-- Every /v1 call needs `Authorization: Bearer <key>` (else 401 `unauthorized`, whose body echoes
-- the key it got, so specs can check it never shows). Errors are `{ error, code }`.
--
--   GET    /health                        { ok = true } (no key)
--   POST   /v1/sandbox                    { id } (26 characters of a-z2-7): only mints the id
--   POST   /v1/sandbox/{id}/exec          { argv, timeout_ms, cwd (a relative one is under /workspace;
--                                         one that resolves outside is 403 invalid_request, as the
--                                         bridge answers) } -> text/event-stream: events
--                                         stdout and stderr (data: base64 of a chunk), then exit
--                                         (data: { exit_code }) or error (data: { error, code })
--   GET    /v1/sandbox/{id}/running       { running = bool }
--   DELETE /v1/sandbox/{id}               204: the container ends; the id can be used again and
--                                         then gets a fresh container, as the bridge does
--
-- As on the bridge, the container starts at the first call that needs it (a fresh one after a
-- DELETE, a sleep or a restart: `state.restart(id)` ends the current one behind the client's
-- back). Where it differs: the argv is joined by the stand-in as the bridge does, but run as
-- `sh -c` in a local sandbox without network (the bridge's containers have the internet); the
-- file routes (GET and PUT /v1/sandbox/{id}/file/...) are not there, as the provider moves files
-- through commands;
-- output comes once the command has ended, not as it is written. `state.stall_streams` stalls
-- the next that many exec streams after their first event (the command goes on).
local core = require('mayura.core')
local task = require('mayura._task')

local json = core.json

local M = {}

M.STALLED = 'the stand-in stalled this stream'

local function fail(status, code, message)
  return { status = status, json = { error = message or code, code = code } }
end

local ALPHABET = 'abcdefghijklmnopqrstuvwxyz234567'
local function new_id()
  local t = {}
  for i = 1, 26 do
    local k = math.random(1, 32)
    t[i] = ALPHABET:sub(k, k)
  end
  return table.concat(t)
end

-- The bridge's shell quoting of one word.
local function quote(s)
  if s:match('^[%w@%%+=:,./-]+$') then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- The bridge's resolveWorkspacePath: a relative path is under /workspace, `.` and `..` are
-- resolved by name; nil when the result is not /workspace or under it.
local function resolve_workspace_path(path)
  local abs = path:sub(1, 1) == '/' and path or ('/workspace/' .. path)
  local parts = {}
  for seg in abs:gmatch('[^/]+') do
    if seg == '..' then
      parts[#parts] = nil
    elseif seg ~= '.' then
      parts[#parts + 1] = seg
    end
  end
  local resolved = '/' .. table.concat(parts, '/')
  if resolved == '/workspace' or resolved:sub(1, 11) == '/workspace/' then return resolved end
  return nil
end

--- Installs the API on `svc` over `backing`: `opts` = { api_key }. Returns the state:
-- `containers` (sandbox id -> backing id), `minted` (id -> true), `restart(id)`, `stall_streams`.
function M.install(svc, backing, opts)
  local key = opts.api_key
  local state = { containers = {}, minted = {}, stall_streams = 0 }

  function state.restart(id)
    local b = state.containers[id]
    state.containers[id] = nil
    if b then backing:release(b) end
  end

  local function refuse(req)
    if req.headers.authorization ~= 'Bearer ' .. key then
      return fail(401, 'unauthorized', 'key ' .. tostring(req.headers.authorization) .. ' is not valid')
    end
    local id = req.params.id
    if id and not id:match('^[a-z2-7]+$') then return fail(400, 'invalid_request', 'bad sandbox id') end
    return nil
  end

  -- The container of `id`, started when it has none (or lost it).
  local function container(id)
    local b = state.containers[id]
    local sb = b and backing:get(b)
    if not sb then
      b, sb = backing:create({ lifetime_ms = 3600000 })
      state.containers[id] = b
    end
    return sb
  end

  svc:route('GET', '/health', function() return { json = { ok = true } } end)

  svc:route('POST', '/v1/sandbox', function(req)
    local no = refuse(req)
    if no then return no end
    local id = new_id()
    state.minted[id] = true
    return { json = { id = id } }
  end)

  svc:route('POST', '/v1/sandbox/{id}/exec', function(req)
    local no = refuse(req)
    if no then return no end
    local body = req.json
    if type(body) ~= 'table' or type(body.argv) ~= 'table' or #body.argv == 0 then
      return fail(400, 'invalid_request', 'argv is required')
    end
    local words = {}
    for i, a in ipairs(body.argv) do
      if type(a) ~= 'string' then return fail(400, 'invalid_request', 'argv must hold strings') end
      words[i] = quote(a)
    end
    local cwd = '/workspace'
    if type(body.cwd) == 'string' then
      cwd = resolve_workspace_path(body.cwd)
      if not cwd then return fail(403, 'invalid_request', 'cwd must resolve to a location within /workspace') end
    end
    local timeout_ms = type(body.timeout_ms) == 'number' and body.timeout_ms or nil
    local sb = container(req.params.id)
    local stall = state.stall_streams > 0
    if stall then state.stall_streams = state.stall_streams - 1 end
    return {
      headers = { ['Content-Type'] = 'text/event-stream' },
      stream = function(send)
        local ok, r = pcall(sb.exec, sb, { 'sh', '-c', table.concat(words, ' ') },
          { cwd = cwd, timeout_ms = timeout_ms or 600000 })
        if not ok then
          send('event: error\ndata: ' .. json.encode({ error = 'exec failed', code = 'exec_transport_error' }) .. '\n\n')
          return
        end
        if r.stdout ~= '' then send('event: stdout\ndata: ' .. core.base64.encode(r.stdout) .. '\n\n') end
        if stall then
          svc.failures[#svc.failures + 1] = M.STALLED
          while send(': still here\n') ~= false and not req.signal.cancelled do task.sleep(5000) end
          return
        end
        if r.stderr ~= '' then send('event: stderr\ndata: ' .. core.base64.encode(r.stderr) .. '\n\n') end
        send('event: exit\ndata: ' .. json.encode({ exit_code = r.exit_code or 137 }) .. '\n\n')
      end,
    }
  end)

  svc:route('GET', '/v1/sandbox/{id}/running', function(req)
    local no = refuse(req)
    if no then return no end
    local b = state.containers[req.params.id]
    return { json = { running = b ~= nil and backing:get(b) ~= nil } }
  end)

  svc:route('DELETE', '/v1/sandbox/{id}', function(req)
    local no = refuse(req)
    if no then return no end
    state.restart(req.params.id)
    return { status = 204, body = '' }
  end)

  return state
end

return M
