--- A stand-in for a hosted sandbox service, for specs: the loopback server of
-- support/http_server.lua with a fake service described by its routes, and
-- faults scripted per route or per call.
--
--   local stand_in = require('support.stand_in')
--   local svc = stand_in.new()
--   svc:route('POST', '/v1/sandboxes', function(req) return { status = 201, json = { id = 'a' } } end)
--   svc:route('GET', '/v1/sandboxes/{id}', function(req) return { json = { id = req.params.id } } end)
--   svc:url('/v1')                                  -- http://127.0.0.1:<port>/v1
--   svc:fault('GET', '/v1/sandboxes/{id}', stand_in.rate_limited(1), 2)   -- the next 2 calls
--   svc:fault_next(stand_in.reset())                -- the next request, whatever its route
--   svc:vanish('a')                                 -- every later call naming 'a' answers 404
--   svc:calls('GET', '/v1/sandboxes/{id}')          -- the requests that route got
--   svc:close()
--
-- A handler runs as a task (it may wait: run a command in a real sandbox)
-- and gets the request: `method`, `path`, `target`, `query` (name -> value),
-- `params` (from `{name}` segments), `headers` (lower-cased names), `body`,
-- `json` (the body decoded, or nil), `at_ms` (arrival, on the loop's clock),
-- `n` (its number among all requests) and `signal`, a cancel token cancelled
-- when the client goes away. It returns an answer:
--
--   { status = 200, headers = { name = value }, json = value }   -- or body = 'bytes'
--   { status = 200, headers = ..., stream = function(send) ... end }
--       chunked; send(bytes) returns false once the client is gone; the
--       answer ends when the function returns (it may wait between sends)
--   { stall = true }                   reads the request, never answers
--   { stall_body = true, body = ... }  the head (and body bytes, if any), then silence
--   { reset = true }                   closes the connection with a TCP reset
--   { malformed = true }               200, application/json, a body that is not JSON
--   { raw = function(client) ... end } the connection itself (a luv stream, not read from):
--       the function writes and reads it (an upgrade); svc:release(client) closes it
--   { delay_ms = n, ... }              any of the above after n ms
--
-- A request no route takes answers 404; a handler that raises answers 500
-- (the error is kept in `svc.failures`). Every answer closes its connection.
-- `local_backing(opts)` runs real local sandboxes (mayura.sandbox.local) for
-- a service to stand on, so that its commands really run.
local core = require('mayura.core')
local task = require('mayura._task')
local http_server = require('support.http_server')

local json = core.json

local M = {}

local REASONS = {
  [200] = 'OK', [201] = 'Created', [202] = 'Accepted', [204] = 'No Content', [400] = 'Bad Request',
  [401] = 'Unauthorized', [403] = 'Forbidden', [404] = 'Not Found', [409] = 'Conflict', [410] = 'Gone',
  [413] = 'Payload Too Large', [429] = 'Too Many Requests', [500] = 'Internal Server Error',
  [502] = 'Bad Gateway', [503] = 'Service Unavailable', [504] = 'Gateway Timeout',
}

-- {======================================================
-- Faults
-- =======================================================

--- 429 with `Retry-After: <seconds or an HTTP date>`.
function M.rate_limited(retry_after)
  return { status = 429, headers = { ['Retry-After'] = tostring(retry_after) }, json = { code = 'rate_limited' } }
end

--- A status with a JSON body holding a code (503 by default).
function M.status(status, headers)
  return { status = status or 503, headers = headers, json = { code = 'unavailable', message = 'try later' } }
end

function M.stall() return { stall = true } end
function M.stall_body(prefix) return { stall_body = true, body = prefix } end
function M.reset() return { reset = true } end
function M.malformed() return { malformed = true } end

-- }======================================================

local Stand = {}
Stand.__index = Stand

local function unescape(s)
  return (s:gsub('%%(%x%x)', function(h) return string.char(tonumber(h, 16)) end))
end

local function decode_query(q)
  local out = {}
  for pair in (q or ''):gmatch('[^&]+') do
    local k, v = pair:match('^([^=]*)=?(.*)$')
    out[unescape((k:gsub('+', ' ')))] = unescape((v:gsub('+', ' ')))
  end
  return out
end

--- A new stand-in on 127.0.0.1 and a port of its own.
function M.new()
  local self = setmetatable({
    routes = {}, requests = {}, failures = {}, next_faults = {}, vanished = {}, tasks = {},
  }, Stand)
  self.server = http_server.tcp(function(_, client, req) self:_handle(client, req) end)
  return self
end

--- The URL of `path` on the stand-in.
function Stand:url(path)
  return self.server:url(path or '')
end

--- Adds a route: `pattern` is a path whose `{name}` segments are parameters.
function Stand:route(method, pattern, handler)
  local names = {}
  local lp = pattern:gsub('[%^%$%(%)%%%.%[%]%*%+%-%?]', '%%%0'):gsub('{(%w+)}', function(n)
    names[#names + 1] = n
    return '([^/]+)'
  end)
  self.routes[#self.routes + 1] = {
    key = method .. ' ' .. pattern, method = method, lua = '^' .. lp .. '$', names = names, handler = handler,
    faults = {},
  }
end

local function find_route(self, method, pattern)
  for _, r in ipairs(self.routes) do
    if r.key == method .. ' ' .. pattern then return r end
  end
  error('no route ' .. method .. ' ' .. pattern)
end

--- Scripts `answer` for the next `times` calls of a route (every call when `times` is nil).
function Stand:fault(method, pattern, answer, times)
  local r = find_route(self, method, pattern)
  r.faults[#r.faults + 1] = { answer = answer, left = times or math.huge }
end

--- Scripts `answer` for the next request, whatever its route (queued in order).
function Stand:fault_next(answer)
  self.next_faults[#self.next_faults + 1] = answer
end

--- Every later call with a path parameter equal to `id` answers `status` (404).
function Stand:vanish(id, status)
  self.vanished[id] = status or 404
end

--- Drops every scripted fault and vanished id.
function Stand:clear()
  for _, r in ipairs(self.routes) do r.faults = {} end
  self.next_faults, self.vanished = {}, {}
end

--- The requests a route got, in order.
function Stand:calls(method, pattern)
  local key = method .. ' ' .. pattern
  local out = {}
  for _, req in ipairs(self.requests) do
    if req.route == key then out[#out + 1] = req end
  end
  return out
end

-- {======================================================
-- Answering
-- =======================================================

local function head(status, headers, extra)
  local lines = { string.format('HTTP/1.1 %d %s', status, REASONS[status] or 'Status') }
  local names = {}
  for name in pairs(headers or {}) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do lines[#lines + 1] = name .. ': ' .. headers[name] end
  for _, l in ipairs(extra) do lines[#lines + 1] = l end
  lines[#lines + 1] = 'Connection: close'
  return table.concat(lines, '\r\n') .. '\r\n\r\n'
end

local function has_header(headers, name)
  for k in pairs(headers or {}) do
    if k:lower() == name then return true end
  end
  return false
end

function Stand:_done(client)
  self.server:forget(client)
end

--- Closes a connection a `raw` answer took.
function Stand:release(client)
  self:_done(client)
end

function Stand:_send(client, req, answer)
  if client:is_closing() then return end
  if answer.reset then
    self.server.clients[client] = nil
    if client.close_reset then client:close_reset() else client:close() end
    return
  end
  if answer.stall then return end   -- the watcher closes it when the client goes
  if answer.raw then
    client:read_stop()
    local ok, err = pcall(answer.raw, client)
    if not ok then
      self.failures[#self.failures + 1] = err
      self:_done(client)
    end
    return
  end
  local status = answer.status or 200
  local headers = {}
  for k, v in pairs(answer.headers or {}) do headers[k] = v end
  if answer.stall_body then
    if not has_header(headers, 'content-type') then headers['Content-Type'] = 'application/json' end
    local data = head(status, headers, { 'Transfer-Encoding: chunked' })
    if answer.body and #answer.body > 0 then data = data .. string.format('%x\r\n%s\r\n', #answer.body, answer.body) end
    client:write(data)
    return
  end
  if answer.stream then
    local data = head(status, headers, { 'Transfer-Encoding: chunked' })
    client:write(data)
    local function send(bytes)
      if client:is_closing() or req.signal.cancelled then return false end
      if #bytes == 0 then return true end
      client:write(string.format('%x\r\n', #bytes) .. bytes .. '\r\n')
      return true
    end
    local ok, err = pcall(answer.stream, send)
    if not ok then self.failures[#self.failures + 1] = err end
    if client:is_closing() then return end
    if not ok then
      self.server.clients[client] = nil
      client:close()   -- a broken stream: cut it, without its last chunk
      return
    end
    client:write('0\r\n\r\n', function() self:_done(client) end)
    return
  end
  local body = answer.body or ''
  if answer.malformed then
    body = '{"id": "half'
    status = 200
    headers['Content-Type'] = 'application/json'
  elseif answer.json ~= nil then
    body = json.encode(answer.json)
    if not has_header(headers, 'content-type') then headers['Content-Type'] = 'application/json' end
  end
  client:write(head(status, headers, { 'Content-Length: ' .. #body }) .. body, function() self:_done(client) end)
end

-- The answer scripted for this request, if any.
function Stand:_scripted(route, req)
  if #self.next_faults > 0 then return table.remove(self.next_faults, 1) end
  if route then
    for _, v in pairs(req.params) do
      if self.vanished[v] then return M.status(self.vanished[v]) end
    end
    local f = route.faults[1]
    if f then
      f.left = f.left - 1
      if f.left <= 0 then table.remove(route.faults, 1) end
      return f.answer
    end
  end
  return nil
end

function Stand:_handle(client, req)
  local path, query = req.target:match('^([^?]*)%??(.*)$')
  req.path, req.query, req.params = path, decode_query(query), {}
  req.n, req.at = #self.requests + 1, core.hrtime_ms()
  req.signal = task.cancel_token()
  local ok, v = pcall(json.decode, req.body)
  req.json = ok and v or nil   -- nil when the body is not JSON
  self.requests[#self.requests + 1] = req
  -- the client going away (a cancel, a timeout) cancels what the handler runs for it
  client:read_start(function(err, data)
    if err or not data then
      req.signal:cancel('client gone')
      self:_done(client)
    end
  end)
  local route
  for _, r in ipairs(self.routes) do
    if r.method == req.method then
      local caps = { path:match(r.lua) }
      if caps[1] then
        route = r
        for i, name in ipairs(r.names) do req.params[name] = unescape(caps[i]) end
        break
      end
    end
  end
  req.route = route and route.key
  local scripted = self:_scripted(route, req)
  local t = task.spawn(function()
    local answer = scripted
    if answer and answer.delay_ms then task.sleep(answer.delay_ms) end
    if not answer then
      if not route then
        answer = { status = 404, json = { code = 'no_route' } }
      else
        local hok, res = pcall(route.handler, req)
        if not hok then
          self.failures[#self.failures + 1] = res
          answer = { status = 500, json = { code = 'internal' } }
        else
          answer = res or { status = 204 }
        end
      end
      if answer.delay_ms then task.sleep(answer.delay_ms) end
    end
    self:_send(client, req, answer)
  end)
  self.tasks[t] = true
end

--- Closes the listener and every connection, and cancels what handlers still run.
function Stand:close()
  for _, req in ipairs(self.requests) do req.signal:cancel('closed') end
  self.server:close()
end

-- }======================================================

-- {======================================================
-- Real sandboxes behind a stand-in
-- =======================================================

local Backing = {}
Backing.__index = Backing

--- Real local sandboxes for a stand-in service: `opts` = { provider (options
-- of local_sandboxes), max_sandboxes }. `backing:create(spec)` returns a new
-- id (`spec` as for `sandboxes:create`), `backing:get(id)` the sandbox (nil
-- once released or unknown), `backing:release(id)`, `backing:close()`.
-- The pool behind it is generous (64 MiB of output and files, a day of
-- lifetime): the service in front applies its own limits.
function M.local_backing(opts)
  opts = opts or {}
  local sandbox = require('mayura.sandbox')
  local local_provider = require('mayura.sandbox.local')
  local provider = local_provider.local_sandboxes(opts.provider or
    { memory_mib = 256, pids = 128, tmp_mib = 16, workspace_mib = 64 })
  local pool = sandbox.create_sandboxes(provider, {
    max_sandboxes = opts.max_sandboxes or 8, max_lifetime_ms = 86400000, network = { 'none', 'all' },
    max_output_bytes = 64 * 1048576, max_file_bytes = 64 * 1048576,
  })
  return setmetatable({ pool = pool, by_id = {}, seq = 0 }, Backing)
end

function Backing:create(spec)
  local sb = self.pool:create(spec)
  self.seq = self.seq + 1
  local id = string.format('sbx-%d-%08x', self.seq, math.random(0, 0x7fffffff))
  self.by_id[id] = sb
  return id, sb
end

function Backing:get(id)
  local sb = self.by_id[id]
  if sb and sb._released then
    self.by_id[id] = nil
    return nil
  end
  return sb
end

function Backing:release(id)
  local sb = self.by_id[id]
  self.by_id[id] = nil
  if sb then sb:release() end
  return sb ~= nil
end

function Backing:close()
  self.pool:close()
  self.by_id = {}
end

-- {======================================================
-- A command as a service runs it
-- =======================================================

-- A keeper shell starts the command in a session of its own (so that no kill of the keeper's
-- group reaches it), writes its pid to /tmp/.svc-<n>, waits for it and answers its status (128 +
-- n for a signal n); the command gets its env through env(1), so the keeper carries none of it
-- (a kill by the command's env, as mayura's, finds the command's processes only).
-- With `end_kills_group` ($2 = 1) what is left of the command's group is killed once it ended.
local KEEPER = 'f=/tmp/.svc-$1; g=$2; shift 2; exec 3<&0; setsid "$@" <&3 3<&- & echo $! > "$f"; exec 2>/dev/null; ' ..
  'wait $!; st=$?; [ "$g" = 1 ] && kill -9 -$! 2>/dev/null; rm -f "$f"; exit $st'
local command_seq = 0

local Command = {}
Command.__index = Command

--- Runs `argv` in the local sandbox `sb` as a hosted service runs a command, so that a kill
-- reaches what the service's kill reaches and nothing more: `opts` = { cwd, env, stdin,
-- on_stdout, on_stderr, timeout_ms (the service's deadline: it signals with SIGKILL, then
-- `timed_out` is set), reach ('process': the command's own process, as E2B's envd and Vercel
-- signal it; 'group': its process group, as Daytona's timeout and Railway's signals do; a
-- process that left the group with setsid is not reached), end_kills_group (what is left of the
-- command's process group is killed once it ended, as Daytona's daemon does), on_signal(record)
-- (each signal sent:
-- { pid (in the sandbox), signal, why }) }. Returns a command: `kill(signal, why)` (false once it
-- ended), `wait()` -> { exit_code (nil when a signal ended it), signal, stdout, stderr,
-- timed_out } (raises what the backing's exec raised: INVALID_INPUT for a cwd, gone, ...).
function M.command(sb, argv, opts)
  opts = opts or {}
  command_seq = command_seq + 1
  local n = command_seq
  local keeper = { 'sh', '-c', KEEPER, 'keeper', tostring(n), opts.end_kills_group and '1' or '0', 'env', '--' }
  local names = {}
  for k in pairs(opts.env or {}) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do keeper[#keeper + 1] = k .. '=' .. opts.env[k] end
  for _, a in ipairs(argv) do keeper[#keeper + 1] = a end
  local self = setmetatable({ sb = sb, n = n, reach = opts.reach or 'process', on_signal = opts.on_signal,
    running = true, waiters = {} }, Command)
  local timer
  if opts.timeout_ms then
    timer = task.after(opts.timeout_ms, function()
      self.timed_out = true
      self:kill(9, 'deadline')
    end, true)
  end
  task.spawn(function()
    -- the backing's own limit is a backstop only: the pool's longest command
    local ok, r = pcall(sb.exec, sb, keeper, { cwd = opts.cwd, stdin = opts.stdin, timeout_ms = 1800000,
      on_stdout = opts.on_stdout, on_stderr = opts.on_stderr })
    self.running = false
    if timer then timer.cancel() end
    self.result = { ok = ok, r = r }
    local waiters = self.waiters
    self.waiters = {}
    for _, w in ipairs(waiters) do w() end
  end)
  return self
end

--- Sends `sig` (a number) where the service's kill reaches; whether the command still ran.
function Command:kill(sig, why)
  if not self.running then return false end
  task.spawn(function()
    local f = '/tmp/.svc-' .. self.n
    local target = self.reach == 'group' and '-"$p"' or '"$p"'   -- dash's kill takes no --
    -- a kill at the very start waits (2 s at most) for the keeper to write the pid
    local script = 'i=0; while [ ! -s ' .. f .. ' ] && [ $i -lt 200 ]; do sleep 0.01; i=$((i+1)); done; ' ..
      '[ -s ' .. f .. ' ] || exit 3; p=$(cat ' .. f .. '); kill -' .. sig .. ' ' .. target .. ' && echo "$p"'
    local ok, r = pcall(self.sb.exec, self.sb, { 'sh', '-c', script }, { timeout_ms = 10000 })
    local pid = ok and r.exit_code == 0 and tonumber(r.stdout:match('%d+')) or nil
    if pid and self.on_signal then self.on_signal({ pid = pid, signal = sig, why = why }) end
  end)
  return true
end

--- Waits for the command's end (see M.command).
function Command:wait()
  if not self.result then task.await(function(done) self.waiters[#self.waiters + 1] = done end) end
  if not self.result.ok then error(self.result.r, 0) end
  local r = self.result.r
  local out = { stdout = r.stdout, stderr = r.stderr, timed_out = self.timed_out or false }
  local code = r.exit_code
  if code and code > 128 and code <= 128 + 64 then
    out.signal = code - 128
  elseif code then
    out.exit_code = code
  else
    out.signal = tonumber(r.signal) or 9
  end
  return out
end

-- }======================================================

return M
