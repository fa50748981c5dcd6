--- A sample provider on the hosted kit (mayura.sandbox._hosted), for the toy
-- API of support/toy_service.lua: how a provider for a hosted service is
-- written, small enough to read in one go, and real enough to pass the
-- conformance suite.
--
--   local toy = require('support.toy_provider')
--   local provider = toy.toy_sandboxes({ base_url = svc:url('/v1'), api_key = key, format = 'connect' })
--   local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
--
-- `format` picks how commands stream their output ('connect', 'ndjson' or
-- 'sse'); `retry_base_ms` and `retries` go to the kit's client.
local core = require('mayura.core')
local compat = require('support.compat')
local errors = require('mayura.errors')
local hosted = require('mayura.sandbox._hosted')

local json, b64 = core.json, core.base64

local M = {}

local MAX_TIMEOUT_S = 3600

-- The toy API's error codes in our words; other failures keep the kit's mapping.
local function on_error(what)
  return function(status, code)
    if status == 400 and code == 'invalid_input' then return errors.new('INVALID_INPUT', what .. ' was refused') end
    if status == 413 then return errors.new('LIMIT_EXCEEDED', what .. ' is larger than max_bytes') end
    if status == 403 and code == 'permission_denied' then
      return errors.new('PERMISSION_DENIED', what .. ': the sandbox does not allow it')
    end
    return nil
  end
end

local Backend = {}
Backend.__index = Backend

function Backend:_path(tail)
  return '/sandboxes/' .. hosted.escape(self.id) .. (tail or '')
end

function Backend:exec(argv, o)
  local out, err, cap = {}, {}, o.max_output_bytes
  local sizes = { stdout = 0, stderr = 0 }
  local bufs = { stdout = out, stderr = err }
  local exit
  local truncated = false
  local function on_event(msg)
    if self.format == 'sse' then
      local v = hosted.decode(msg.data)
      if v == nil then error(self.client:bad_answer('an event that is not JSON'), 0) end
      msg = v
    end
    if type(msg) ~= 'table' then error(self.client:bad_answer('a message that is not an object'), 0) end
    for _, name in ipairs({ 'stdout', 'stderr' }) do
      if type(msg[name]) == 'string' then
        local ok, bytes = pcall(b64.decode, msg[name])
        if not ok then error(self.client:bad_answer('output that is not base64'), 0) end
        local room = cap - sizes[name]
        if #bytes > room then bytes, truncated = bytes:sub(1, room), true end
        sizes[name] = sizes[name] + #bytes
        table.insert(bufs[name], bytes)
      end
    end
    if type(msg.exit) == 'table' then exit = msg.exit end
  end
  local body = {
    argv = setmetatable(argv, json.array_mt), cwd = o.cwd, env = o.env and setmetatable(o.env, json.object_mt),
    timeout_ms = o.timeout_ms,
    max_output_bytes = cap, stdin = o.stdin and b64.encode(o.stdin) or nil,
  }
  self.client:stream('POST', self:_path('/exec'), body, {
    query = { format = self.format }, format = self.format, on_event = on_event, gone = true,
    -- the command may take its whole timeout; the call gets its own time on top
    timeout_ms = o.timeout_ms + self.client.call_timeout_ms, signal = o.signal,
  })
  if not exit then error(self.client:bad_answer('a stream without the exit of the command'), 0) end
  return {
    exit_code = compat.math_type(exit.code) == 'integer' and exit.code or nil,
    signal = type(exit.signal) == 'string' and exit.signal or nil,
    timed_out = exit.timed_out == true,
    truncated = truncated or exit.truncated == true,
    duration_ms = type(exit.duration_ms) == 'number' and exit.duration_ms or 0,
    stdout = table.concat(out), stderr = table.concat(err),
  }
end

function Backend:read_file(path, opts)
  local body = self.client:json('GET', self:_path('/files'), nil, {
    query = { path = path, max_bytes = opts.max_bytes }, gone = true, on_error = on_error('the file'),
  })
  if type(body) ~= 'table' then error(self.client:bad_answer('a file answer that is not an object'), 0) end
  if body.exists == false then return nil end
  local ok, data = pcall(b64.decode, body.data)
  if not ok then error(self.client:bad_answer('file data that is not base64'), 0) end
  return data
end

function Backend:write_file(path, data)
  self.client:json('PUT', self:_path('/files'), { data = b64.encode(data) }, {
    query = { path = path }, gone = true, on_error = on_error('the file'),
  })
end

function Backend:list_files(path)
  local body = self.client:json('GET', self:_path('/dir'), nil, {
    query = { path = path }, gone = true, on_error = on_error('the directory'),
  })
  if type(body) ~= 'table' then error(self.client:bad_answer('a listing that is not an object'), 0) end
  if body.exists == false then return nil end
  if type(body.entries) ~= 'table' then error(self.client:bad_answer('a listing without entries'), 0) end
  return body.entries   -- the pool checks every entry
end

function Backend:remove_file(path, opts)
  self.client:json('DELETE', self:_path('/files'), nil, {
    query = { path = path, recursive = opts.recursive and 'true' or 'false' }, gone = true,
    on_error = on_error('the path'),
  })
end

function Backend.url()
  errors.raise('INVALID_INPUT', 'the toy service serves no ports', nil, 2)
end

function Backend:release()
  -- 404: it ended already, which is what release wants
  self.client:json('DELETE', self:_path(), nil, { allow = { 404 } })
end

--- The provider: `options` = { base_url, api_key, format, retries, retry_base_ms }.
function M.toy_sandboxes(options)
  local client = hosted.client({
    label = 'toy', base_url = options.base_url, api_key = options.api_key, auth_header = 'X-API-Key',
    retries = options.retries, retry_base_ms = options.retry_base_ms or 50,
  })
  local format = options.format or 'connect'
  return {
    id = 'toy',
    features = { stdin = true, ports = false, desktop = false, network = { 'none', 'all' } },
    workdir = '/workspace',
    max_lifetime_ms = MAX_TIMEOUT_S * 1000,
    client = client,
    create = function(_, spec)
      local c = client
      if spec.call_timeout_ms then c = client:with({ call_timeout_ms = spec.call_timeout_ms }) end
      local timeout_s = hosted.lifetime(spec.lifetime_ms, { unit = 's', max = MAX_TIMEOUT_S })
      local body = c:json('POST', '/sandboxes', {
        timeout_s = timeout_s,
        env = spec.env and setmetatable(spec.env, json.object_mt) or nil,
        network = spec.network == 'all' and 'all' or 'none',
        metadata = hosted.metadata(spec.labels, { max_keys = 16, key_pattern = '^[%w_%.%-]+$' }),
      })
      if type(body) ~= 'table' or type(body.id) ~= 'string' or body.id == '' or #body.id > 128 then
        error(c:bad_answer('a sandbox without an id'), 0)
      end
      return setmetatable({ id = body.id, client = c, format = format }, Backend)
    end,
  }
end

return M
