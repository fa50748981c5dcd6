--- The Modal stand-in (spec/npm/modal_stand_in.mjs, a gRPC server in Node) run beside a spec:
-- started as a child process, its address read from the file it writes once it listens, its
-- control port (faults, the calls it got, its sandboxes) spoken to over loopback HTTP.
--
--   local modal_stand_in = require('support.modal_stand_in')
--   local s = modal_stand_in.start({ token_id = 'ak-1', token_secret = 'as-1' })
--   s.url                                    -- http://127.0.0.1:<port> (gRPC over h2c)
--   s.cert                                   -- the file of the tunnels' self-signed certificate
--   s:fault({ method = 'SandboxCreateV2', code = 14, count = 2 })
--   s:calls('TaskExecStart')                 -- { { method, request, metadata }, ... }
--   s:sandboxes()                            -- { { id, state, result, open, definition, ... } }
--   s:snapshots()                            -- the image ids of the snapshots it holds
--   s:stop()
local core = require('mayura.core')
local task = require('mayura._task')
local http = require('mayura.http')

local M = {}

local SCRIPT = 'spec/npm/modal_stand_in.mjs'

--- Whether node and the stand-in's packages are there.
function M.available()
  local f = io.open('spec/npm/node_modules/@grpc/grpc-js/package.json', 'r')
  if not f then return false end
  f:close()
  f = io.open('spec/npm/node_modules/@grpc/proto-loader/package.json', 'r')
  if not f then return false end
  f:close()
  return true
end

local Stand = {}
Stand.__index = Stand

function Stand:_control(method, path, body)
  local res = http.request({ url = self.control .. path, method = method, timeout_ms = 10000,
    headers = body and { ['content-type'] = 'application/json' } or nil,
    body = body and core.json.encode(body) or nil })
  assert(res.status == 200, 'the stand-in control answered ' .. res.status)
  return core.json.decode(res.body)
end

--- The next `count` (1) calls of `method` (its last name, or '*') answer gRPC status `code`
-- (after `delay_ms`, if given; code 0: only the delay).
function Stand:fault(f)
  self:_control('POST', '/faults', f)
end

--- The calls the stand-in got, of `method` when given.
function Stand:calls(method)
  local out = {}
  for _, c in ipairs(self:_control('GET', '/calls')) do
    if method == nil or c.method == method then out[#out + 1] = c end
  end
  return out
end

--- The image ids of the snapshots the stand-in holds.
function Stand:snapshots()
  return self:_control('GET', '/snapshots')
end

--- Sets the stand-in's `config` ({ auth_token_ttl_s }).
function Stand:config(c)
  return self:_control('POST', '/config', c)
end

function Stand:sandboxes()
  return self:_control('GET', '/sandboxes')
end

function Stand:stop()
  if self.proc then
    self.proc:kill(15)
    task.await(function(done) self.done = done end)
    self.proc = nil
  end
  os.remove(self.info)
end

--- Starts a stand-in: `opts` = { token_id, token_secret, tls (both services over TLS) }.
function M.start(opts)
  local info = os.tmpname()
  os.remove(info)
  local s = setmetatable({ info = info, token_id = opts.token_id, token_secret = opts.token_secret }, Stand)
  local finished
  s.proc = assert(core.spawn({
    argv = { 'node', SCRIPT },
    env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), STAND_IN_INFO = info,
      STAND_IN_TOKEN_ID = opts.token_id, STAND_IN_TOKEN_SECRET = opts.token_secret,
      STAND_IN_TLS = opts.tls and '1' or nil },
    timeout_ms = opts.timeout_ms or 1800000,
  }, function(res)
    finished = res
    if s.done then s.done() end
  end))
  local deadline = core.hrtime_ms() + 20000
  while true do
    local f = io.open(info, 'r')
    if f then
      local text = f:read('a')
      f:close()
      local v = core.json.decode(text)
      s.url, s.control, s.cert = v.url, v.control, v.cert
      return s
    end
    if finished or core.hrtime_ms() > deadline then
      error('the Modal stand-in did not start: ' .. tostring(finished and finished.stderr))
    end
    task.sleep(20)
  end
end

return M
