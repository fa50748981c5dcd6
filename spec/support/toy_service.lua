--- A toy hosted sandbox API on a stand-in (support/stand_in.lua), backed by
-- real local sandboxes: what spec/providers/hosted_kit_spec.lua's sample
-- provider (support/toy_provider.lua) talks to. Its API:
--
--   every call      X-API-Key: <key>, else 401 whose body echoes the key it got
--   POST   /v1/sandboxes              { timeout_s, env, network, metadata } -> 201 { id, timeout_s }
--   GET    /v1/sandboxes/{id}         -> { id, metadata }
--   DELETE /v1/sandboxes/{id}         -> 204
--   POST   /v1/sandboxes/{id}/exec?format=connect|ndjson|sse
--          { argv, cwd, env, stdin (base64), timeout_ms, max_output_bytes } -> a stream of
--          { stdout = b64 }, { stderr = b64 }, ..., { exit = { code, signal, timed_out, truncated,
--          duration_ms } }: Connect envelopes (request enveloped too; end-of-stream {} or
--          { error = { code } }), NDJSON lines, or SSE events named after their key
--   GET    /v1/sandboxes/{id}/files?path=&max_bytes=   -> { exists, data (b64) }
--   PUT    /v1/sandboxes/{id}/files?path=              { data (b64) } -> 204
--   DELETE /v1/sandboxes/{id}/files?path=&recursive=   -> 204
--   GET    /v1/sandboxes/{id}/dir?path=                -> { exists, entries = [{ name, type, size, modified }] }
--
-- Errors: 400 { code = 'invalid_input' }, 403 'permission_denied', 404 'no_such_sandbox' (an
-- unknown or ended sandbox), 413 'too_large', 500 'internal'; lifetimes above 3600 s are 400.
local core = require('mayura.core')
local compat = require('support.compat')
local errors = require('mayura.errors')

local json, b64 = core.json, core.base64

local M = {}

M.MAX_TIMEOUT_S = 3600
local CHUNK = 48 * 1024

local function fail(status, code)
  return { status = status, json = { code = code, message = 'the toy service says no' } }
end

-- A failure of the real sandbox as the toy API answers it.
local function answer_error(err, backing, id)
  if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then
    backing:release(id)
    return fail(404, 'no_such_sandbox')
  end
  if errors.is(err, 'INVALID_INPUT') then return fail(400, 'invalid_input') end
  if errors.is(err, 'LIMIT_EXCEEDED') then return fail(413, 'too_large') end
  if errors.is(err, 'PERMISSION_DENIED') then return fail(403, 'permission_denied') end
  return fail(500, 'internal')
end

local function envelope(flags, text)
  return compat.pack('>BI4', flags, #text) .. text
end

--- Installs the API on `svc` (a stand-in) over `backing` (stand_in.local_backing()).
-- `opts.api_key` is the key it wants. Returns `svc`.
function M.install(svc, backing, opts)
  local key = opts.api_key

  -- Wraps a handler: the key check, the sandbox lookup, and errors as answers.
  local function api(fn, needs_sandbox)
    return function(req)
      if req.headers['x-api-key'] ~= key then
        return { status = 401, json = { code = 'unauthorized', message = 'key ' .. tostring(req.headers['x-api-key'])
          .. ' refused', error = { type = tostring(req.headers['x-api-key']) } } }
      end
      local sb
      if needs_sandbox then
        sb = backing:get(req.params.id)
        if not sb then return fail(404, 'no_such_sandbox') end
      end
      local ok, res = pcall(fn, req, sb)
      if ok then return res end
      return answer_error(res, backing, req.params.id)
    end
  end

  svc:route('POST', '/v1/sandboxes', api(function(req)
    local b = req.json
    if type(b) ~= 'table' or compat.math_type(b.timeout_s) ~= 'integer' or b.timeout_s < 1 or b.timeout_s > M.MAX_TIMEOUT_S then
      return fail(400, 'invalid_input')
    end
    local id, sb = backing:create({ lifetime_ms = b.timeout_s * 1000, env = b.env, network = b.network })
    sb.toy_metadata = b.metadata
    return { status = 201, json = { id = id, timeout_s = b.timeout_s } }
  end))

  svc:route('GET', '/v1/sandboxes/{id}', api(function(req, sb)
    return { json = { id = req.params.id, metadata = sb.toy_metadata or setmetatable({}, json.object_mt) } }
  end, true))

  svc:route('DELETE', '/v1/sandboxes/{id}', api(function(req)
    backing:release(req.params.id)
    return { status = 204 }
  end, true))

  svc:route('POST', '/v1/sandboxes/{id}/exec', api(function(req, sb)
    local format = req.query.format or 'ndjson'
    local body = req.body
    if format == 'connect' then
      local flags, n = compat.unpack('>BI4', body)
      if flags ~= 0 or n ~= #body - 5 then return fail(400, 'invalid_input') end
      body = body:sub(6)
    end
    local ok, b = pcall(json.decode, body)
    -- b is nil for a body that is not JSON
    if not ok or type(b) ~= 'table' or type(b.argv) ~= 'table' then return fail(400, 'invalid_input') end
    local stdin = b.stdin and b64.decode(b.stdin) or nil
    local cap = b.max_output_bytes or 1048576
    local function encode(msg, name)
      local text = json.encode(msg)
      if format == 'connect' then return envelope(0, text) end
      if format == 'sse' then return 'event: ' .. name .. '\ndata: ' .. text .. '\n\n' end
      return text .. '\n'
    end
    local headers = { ['Content-Type'] = format == 'connect' and 'application/connect+json'
      or format == 'sse' and 'text/event-stream' or 'application/x-ndjson' }
    return { status = 200, headers = headers, stream = function(send)
      local rok, r = pcall(sb.exec, sb, b.argv, { cwd = b.cwd, env = b.env, stdin = stdin, timeout_ms = b.timeout_ms,
        signal = req.signal })
      if not rok then
        if format == 'connect' then
          local code = errors.is(r, 'SANDBOX_ERROR') and r.reason == 'gone' and 'not_found'
            or errors.is(r, 'INVALID_INPUT') and 'invalid_argument' or 'internal'
          send(envelope(2, json.encode({ error = { code = code, message = 'no' } })))
          return
        end
        error(r)   -- the stand-in cuts the stream
      end
      local truncated = r.truncated
      for _, name in ipairs({ 'stdout', 'stderr' }) do
        local out = r[name]
        if #out > cap then out, truncated = out:sub(1, cap), true end
        for i = 1, #out, CHUNK do
          if not send(encode({ [name] = b64.encode(out:sub(i, i + CHUNK - 1)) }, name)) then return end
        end
      end
      send(encode({ exit = { code = r.exit_code, signal = r.signal, timed_out = r.timed_out, truncated = truncated,
        duration_ms = r.duration_ms } }, 'exit'))
      if format == 'connect' then send(envelope(2, '{}')) end
    end }
  end, true))

  svc:route('GET', '/v1/sandboxes/{id}/files', api(function(req, sb)
    local data = sb:read_file(req.query.path, { max_bytes = tonumber(req.query.max_bytes) })
    if data == nil then return { json = { exists = false } } end
    return { json = { exists = true, data = b64.encode(data) } }
  end, true))

  svc:route('PUT', '/v1/sandboxes/{id}/files', api(function(req, sb)
    local b = req.json
    if type(b) ~= 'table' or type(b.data) ~= 'string' then return fail(400, 'invalid_input') end
    sb:write_file(req.query.path, b64.decode(b.data))
    return { status = 204 }
  end, true))

  svc:route('DELETE', '/v1/sandboxes/{id}/files', api(function(req, sb)
    sb:remove_file(req.query.path, { recursive = req.query.recursive == 'true' })
    return { status = 204 }
  end, true))

  svc:route('GET', '/v1/sandboxes/{id}/dir', api(function(req, sb)
    local entries = sb:list_files(req.query.path)
    if entries == nil then return { json = { exists = false } } end
    return { json = { exists = true, entries = setmetatable(entries, json.array_mt) } }
  end, true))

  return svc
end

return M
