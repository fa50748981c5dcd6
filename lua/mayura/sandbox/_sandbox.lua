--- mayura.sandbox._sandbox: a sandbox of a pool, the object `pool:create()` returns.
--
-- Every call goes to the provider's backend after the pool's checks, within its call timeout, and
-- only while the sandbox lives (mayura.sandbox._checks); what comes back is checked again. Files,
-- ports, network events and the release are here; commands are mayura.sandbox._exec's, snapshots
-- mayura.sandbox._pool_snapshots'. `new(fields)` makes one (the pool's create, mayura.sandbox._pool).
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local checks = require('mayura.sandbox._checks')
local exec = require('mayura.sandbox._exec')
local pool_snapshots = require('mayura.sandbox._pool_snapshots')

local M = {}

local ENTRY_TYPES = { file = true, directory = true, symlink = true, other = true }
local gone, alive, with_deadline, provider_error, bad_reply =
  checks.gone, checks.alive, checks.with_deadline, checks.provider_error, checks.bad_reply

local Sandbox = {}
Sandbox.__index = Sandbox

-- Calls backend[name] within the pool's call timeout, mapping failures.
function Sandbox:_call(ms, name, ...)
  local backend, args, n = self._backend, { ... }, select('#', ...)
  local ok, res = pcall(with_deadline, ms, function()
    return backend[name](backend, check.unpack(args, 1, n))
  end)
  if not ok then
    local err = provider_error(res)
    if errors.is(err, 'SANDBOX_ERROR') and err.reason == 'gone' then self._gone = true end
    if self._released or core.hrtime_ms() >= self._expires_at then err = gone() end
    error(err, 0)
  end
  return res
end

--- The sandbox's last network events (see the top of mayura.sandbox), oldest first.
function Sandbox:events()
  local out = {}
  for i, e in ipairs(self._events) do
    local copy = {}
    for k, v in pairs(e) do copy[k] = v end
    out[i] = copy
  end
  return out
end

--- Runs a command (mayura.sandbox._exec).
Sandbox.exec = exec.exec

--- Starts a command and returns at once with its handle (mayura.sandbox._exec).
Sandbox.start = exec.start

--- The file's bytes, or nil when there is none. `max_bytes` refuses larger files.
function Sandbox:read_file(path, opts)
  local pool = self._pool
  local p = checks.normalize_path(path, self._workdir)
  opts = opts == nil and {} or opts
  check.keys(opts, { max_bytes = true }, 'read_file options', 'INVALID_INPUT', 3)
  local max = opts.max_bytes
  if max == nil then max = pool.max_file_bytes end
  check.int(max, 'max_bytes', 0, nil, 'INVALID_INPUT', 3)
  if max > pool.max_file_bytes then max = pool.max_file_bytes end
  alive(self)
  local data = self:_call(pool.call_timeout_ms, 'read_file', p, { max_bytes = max })
  if data == nil then return nil end
  if type(data) ~= 'string' then error(bad_reply('file'), 2) end
  if #data > max then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes (' .. max .. ')', nil, 2) end
  return data
end

--- Writes text or bytes, creating directories and replacing any file there.
function Sandbox:write_file(path, data)
  local pool = self._pool
  local p = checks.normalize_path(path, self._workdir)
  if type(data) ~= 'string' then errors.raise('INVALID_INPUT', 'data must be a string', nil, 2) end
  if #data > pool.max_file_bytes then
    errors.raise('LIMIT_EXCEEDED', 'data is larger than max_file_bytes (' .. pool.max_file_bytes .. ')', nil, 2)
  end
  alive(self)
  self:_call(pool.call_timeout_ms, 'write_file', p, data)
end

--- The directory's entries `{ name, type, size, modified }`, or nil when there is none.
function Sandbox:list_files(path)
  local pool = self._pool
  local p = checks.normalize_path(path == nil and '.' or path, self._workdir)
  alive(self)
  local entries = self:_call(pool.call_timeout_ms, 'list_files', p)
  if entries == nil then return nil end
  if type(entries) ~= 'table' then error(bad_reply('listing'), 2) end
  local out = {}
  for i, e in ipairs(entries) do
    if type(e) ~= 'table' or type(e.name) ~= 'string' or e.name == '' or e.name:find('[/%z]')
      or not ENTRY_TYPES[e.type] or not check.is_int(e.size) or e.size < 0
      or not check.is_int(e.modified) then
      error(bad_reply('listing'), 2)
    end
    out[i] = { name = e.name, type = e.type, size = e.size, modified = e.modified }
  end
  return out
end

--- Removes a file; a directory with what is in it needs `{ recursive = true }`.
function Sandbox:remove_file(path, opts)
  local pool = self._pool
  local p = checks.normalize_path(path, self._workdir)
  opts = opts == nil and {} or opts
  check.keys(opts, { recursive = true }, 'remove_file options', 'INVALID_INPUT', 3)
  if opts.recursive ~= nil and type(opts.recursive) ~= 'boolean' then
    errors.raise('INVALID_INPUT', 'recursive must be a boolean', nil, 2)
  end
  if p == '/' then errors.raise('INVALID_INPUT', 'refusing to remove /', nil, 2) end
  alive(self)
  self:_call(pool.call_timeout_ms, 'remove_file', p, { recursive = opts.recursive == true })
end

--- The URL serving one of the `ports` the sandbox was created with.
function Sandbox:url(port)
  check.int(port, 'port', 1, 65535, 'INVALID_INPUT', 3)
  if not self._ports[port] then
    errors.raise('INVALID_INPUT', 'port ' .. port .. ' is not one of the ports the sandbox was created with', nil, 2)
  end
  alive(self)
  local url = self:_call(self._pool.call_timeout_ms, 'url', port)
  if type(url) ~= 'string' or not url:match('^https?://') then error(bad_reply('URL'), 2) end
  return url
end

--- Keeps the sandbox's files (mayura.sandbox._pool_snapshots).
Sandbox.snapshot = pool_snapshots.snapshot

--- Puts a snapshot's files back in this sandbox (mayura.sandbox._pool_snapshots).
Sandbox.restore = pool_snapshots.restore

function Sandbox:release()
  local pool = self._pool
  if not self._released then
    self._released = true
    pool:_stop_timer(self)
    -- started processes stop with it (the provider's release ends them): their wait() says `gone`
    for p in pairs(self._started) do p._gone = true end
    for snap in pairs(self._own_snapshots or {}) do pool:_release_snapshot(snap) end
    local backend = self._backend
    -- a task of its own: it goes on (and frees the slot) past a deadline the caller gave up at
    self._releasing = task.spawn(function()
      pcall(backend.release, backend)
      pool:_free(self)
    end)
  end
  local releasing = self._releasing
  if releasing and not releasing.done then
    pcall(with_deadline, pool.call_timeout_ms, function() releasing:wait() end)
  end
end

--- A sandbox of the fields the pool's create gives.
function M.new(fields)
  return setmetatable(fields, Sandbox)
end

return M
