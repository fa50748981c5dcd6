--- mayura.sandbox._checks: what the pool checks, and how it calls a provider.
--
-- The checks of what goes to a provider (paths, network requests, env, labels, argv, the
-- features it declares) and of what comes back (`bad_reply`, `provider_error`: the provider's
-- failures keep their coded shape, anything else is SANDBOX_ERROR `failed`); `with_deadline`, a
-- provider call held to a time; and `alive`, whether a sandbox may still be called. Shared by the
-- pool (mayura.sandbox), its sandboxes and their desktops; mechanism only: nothing here keeps state.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')

local M = {}

local MAX_PATH = 4096
local MAX_ARGV_BYTES = 1048576
local MAX_ENV_BYTES = 1048576

--- SANDBOX_ERROR `gone` (a sandbox released, or past its lifetime).
local function gone(message)
  return errors.sandbox('gone', message or 'the sandbox is gone')
end

-- {======================================================
-- Paths
-- =======================================================

--- Normalizes a sandbox path: absolute, or relative to `workdir`; `.` and
-- `..` are folded lexically (inside the sandbox's own root, so `..` cannot
-- leave it). Raises INVALID_INPUT for a path that is not a usable string.
function M.normalize_path(path, workdir, what)
  what = what or 'path'
  if type(path) ~= 'string' then errors.raise('INVALID_INPUT', what .. ' must be a string', nil, 3) end
  if path == '' then errors.raise('INVALID_INPUT', what .. ' is empty', nil, 3) end
  if path:find('\0', 1, true) then errors.raise('INVALID_INPUT', what .. ' contains a NUL byte', nil, 3) end
  if #path > MAX_PATH then
    errors.raise('INVALID_INPUT', what .. ' is longer than ' .. MAX_PATH .. ' bytes', nil, 3)
  end
  if path:sub(1, 1) ~= '/' then path = workdir .. '/' .. path end
  local parts = {}
  for part in path:gmatch('[^/]+') do
    if part == '..' then
      if #parts > 0 then table.remove(parts) end
    elseif part ~= '.' then
      parts[#parts + 1] = part
    end
  end
  return '/' .. table.concat(parts, '/')
end

-- }======================================================

-- {======================================================
-- Checking options
-- =======================================================

local function check_network_request(network)
  if network == nil then return nil end
  if network == 'none' or network == 'all' then return network, network end
  if type(network) == 'table' then
    check.keys(network, { allow = true }, 'network', 'INVALID_INPUT', 4)
    local allow = network.allow
    if type(allow) ~= 'table' or #allow == 0 then
      errors.raise('INVALID_INPUT', 'network.allow must be a non-empty list of domains', nil, 4)
    end
    local copy = {}
    for i, domain in ipairs(allow) do
      if type(domain) ~= 'string' or #domain > 253 or not domain:match('^%*?%.?[%w][%w%.%-]*$')
        or domain:find('..', 1, true) then
        errors.raise('INVALID_INPUT', 'network.allow[' .. i .. '] is not a domain', nil, 4)
      end
      copy[i] = domain:lower()
    end
    return 'allowlist', { allow = copy }
  end
  errors.raise('INVALID_INPUT', "network must be 'none', 'all' or { allow = { ... } }", nil, 4)
end

local function check_env(env, level)
  if env == nil then return nil end
  if type(env) ~= 'table' then errors.raise('INVALID_INPUT', 'env must be a table of strings', nil, level) end
  local copy, total = {}, 0
  for k, v in pairs(env) do
    if type(k) ~= 'string' or not k:match('^[%a_][%w_]*$') then
      errors.raise('INVALID_INPUT', 'env name ' .. tostring(k) .. ' is not valid', nil, level)
    end
    if type(v) ~= 'string' then errors.raise('INVALID_INPUT', 'env ' .. k .. ' must be a string', nil, level) end
    if v:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'env ' .. k .. ' contains a NUL byte', nil, level) end
    total = total + #k + #v + 2
    copy[k] = v
  end
  if total > MAX_ENV_BYTES then errors.raise('INVALID_INPUT', 'env is larger than 1 MiB', nil, level) end
  return copy
end

local function check_labels(labels, level)
  if labels == nil then return {} end
  if type(labels) ~= 'table' then errors.raise('INVALID_INPUT', 'labels must be a table of strings', nil, level) end
  local copy = {}
  for k, v in pairs(labels) do
    if type(k) ~= 'string' or #k == 0 or #k > 63 or type(v) ~= 'string' or #v > 256
      or k:find('%z') or v:find('%z') then
      errors.raise('INVALID_INPUT', 'labels must map names (1..63 bytes) to strings (at most 256 bytes)', nil, level)
    end
    copy[k] = v
  end
  return copy
end

local function check_argv(argv)
  if type(argv) ~= 'table' or #argv == 0 then
    errors.raise('INVALID_INPUT', 'command must be a non-empty list of strings', nil, 3)
  end
  local total, copy = 0, {}
  for k in pairs(argv) do
    if not check.is_int(k) or k < 1 or k > #argv then
      errors.raise('INVALID_INPUT', 'command must be a list of strings', nil, 3)
    end
  end
  for i, a in ipairs(argv) do
    if type(a) ~= 'string' then errors.raise('INVALID_INPUT', 'command[' .. i .. '] must be a string', nil, 3) end
    if a:find('\0', 1, true) then errors.raise('INVALID_INPUT', 'command[' .. i .. '] contains a NUL byte', nil, 3) end
    total = total + #a + 1
    copy[i] = a
  end
  if copy[1] == '' then errors.raise('INVALID_INPUT', 'the program name is empty', nil, 3) end
  if total > MAX_ARGV_BYTES then errors.raise('INVALID_INPUT', 'command is larger than 1 MiB', nil, 3) end
  return copy
end

-- How a provider's snapshots are made (see the top of mayura.sandbox): 'generic' unless it says.
local function snapshot_kind(f)
  if f.snapshots == false or f.snapshots == 'native' then return f.snapshots end
  return 'generic'
end

local function copy_features(f)
  f = f or {}
  local net = {}
  for i, k in ipairs(f.network or {}) do net[i] = k end
  return { stdin = f.stdin == true, ports = f.ports == true, desktop = f.desktop == true, network = net,
    snapshots = snapshot_kind(f) }
end

local function has(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

-- }======================================================

-- {======================================================
-- Calls with a deadline
-- =======================================================

local function pack(...)
  return { n = select('#', ...), ... }
end

--- Runs `fn()` as a task and waits for it at most `ms`; past that raises
-- SANDBOX_ERROR reason `timeout` (the call goes on; `on_late(ok, ...)` gets its result).
local function with_deadline(ms, fn, on_late)
  return task.with_timeout(ms, fn, function()
    return errors.sandbox('timeout', 'the provider did not answer within ' .. ms .. ' ms')
  end, on_late)
end

-- Provider failures keep their coded shape; anything else becomes SANDBOX_ERROR reason `failed`,
-- without the provider's own text.
local function provider_error(err)
  if errors.is(err) then
    if getmetatable(err) == nil then setmetatable(err, errors.mt) end
    return err
  end
  return errors.sandbox('failed', 'the provider failed')
end

local function bad_reply(what)
  return errors.sandbox('failed', 'the provider returned an invalid ' .. what)
end

-- }======================================================

-- {======================================================
-- A sandbox's life
-- =======================================================

--- Raises `gone` for a sandbox released or past its lifetime (which it then ends from the pool's side).
local function alive(self)
  if self._released then error(gone('the sandbox was released'), 3) end
  if core.hrtime_ms() >= self._expires_at then
    self._pool:_expire(self)
    error(gone('the sandbox reached the end of its lifetime'), 3)
  end
end

-- }======================================================

M.gone, M.alive = gone, alive
M.check_network_request, M.check_env, M.check_labels, M.check_argv =
  check_network_request, check_env, check_labels, check_argv
M.copy_features, M.has = copy_features, has
M.pack, M.with_deadline, M.provider_error, M.bad_reply = pack, with_deadline, provider_error, bad_reply

return M
