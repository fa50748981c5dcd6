--- mayura.mcp.policy: the tool sessions `mayura serve` gives, from policy files.
--
--   local env = require('mayura.mcp.policy').open({ 'examples/policies/workspace.lua' })
--   env.max_sessions; env:session(id) -> { tools, call, close }; env:close()
--
-- A policy file runs in an environment of its own (no `os`, `io`, `require`,
-- `load` or globals leaking out) and returns a table:
--
--   return {
--     pool = { provider = 'local', max_sandboxes = 8, max_lifetime_ms = 3600000 },  -- create_sandboxes options
--     sandbox = { lifetime_ms = 1800000 },               -- each session's sandbox
--     tools = { name = 'workspace', exec = true, write = true },   -- sandbox_tools options (or a list)
--     grants = { 'tool:workspace.read', 'sandbox:workspace:read', 'effect:read', ... },
--     limits = { max_tool_calls = 1000, max_cost_micros = 0 },
--     serve = { max_sessions = 8, session_idle_ms = 1800000, progress_interval_ms = 1000 },
--   }
--
-- An unknown key or a wrong type stops startup with INVALID_CONFIG naming the
-- file and the key. Providers: 'local' (mayura.sandbox.local).
local errors = require('mayura.errors')
local env_mod = require('mayura.mcp.env')

local M = {}

local KEYS = { pool = 'table', sandbox = 'table', tools = 'table', grants = 'table', limits = 'table', serve = 'table' }
local SERVE_KEYS = { max_sessions = 'number', session_idle_ms = 'number', progress_interval_ms = 'number' }
local LIMIT_KEYS = { max_tool_calls = 'number', max_cost_micros = 'number' }
local PROVIDERS = { ['local'] = 'mayura.sandbox.local' }

local function safe_env()
  return {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = pcall, select = select,
    tonumber = tonumber, tostring = tostring, type = type, unpack = table.unpack or unpack,  -- luacheck: ignore 143
    string = { format = string.format, rep = string.rep, sub = string.sub, upper = string.upper,
      lower = string.lower, find = string.find, match = string.match, gsub = string.gsub },
    table = { concat = table.concat, insert = table.insert, remove = table.remove, sort = table.sort },
    math = { floor = math.floor, ceil = math.ceil, max = math.max, min = math.min, huge = math.huge },
  }
end

local function bad(path, msg)
  errors.raise('INVALID_CONFIG', path .. ': ' .. msg)
end

local function check_keys(path, where, t, keys)
  for k, v in pairs(t) do
    if keys[k] == nil then bad(path, 'unknown key ' .. where .. tostring(k)) end
    if type(v) ~= keys[k] then bad(path, where .. k .. ' must be a ' .. keys[k]) end
  end
end

--- Loads one policy file: its table, checked.
function M.load(path)
  local f, err = io.open(path, 'r')
  if not f then errors.raise('INVALID_CONFIG', 'cannot read the policy ' .. path .. ': ' .. tostring(err)) end
  local text = f:read('a')
  f:close()
  local env = safe_env()
  local chunk, cerr
  if setfenv then  -- luacheck: ignore 113
    chunk, cerr = loadstring(text, '@' .. path)  -- luacheck: ignore 113
    if chunk then setfenv(chunk, env) end  -- luacheck: ignore 113
  else
    chunk, cerr = load(text, '@' .. path, 't', env)
  end
  if not chunk then errors.raise('INVALID_CONFIG', tostring(cerr)) end
  local ok, p = pcall(chunk)
  if not ok then errors.raise('INVALID_CONFIG', tostring(type(p) == 'table' and p.message or p)) end
  if type(p) ~= 'table' then bad(path, 'a policy file returns a table') end
  check_keys(path, '', p, KEYS)
  check_keys(path, 'serve.', p.serve or {}, SERVE_KEYS)
  check_keys(path, 'limits.', p.limits or {}, LIMIT_KEYS)
  if p.pool and not PROVIDERS[p.pool.provider] then
    bad(path, 'pool.provider must be one of: local')
  end
  return p
end

--- Opens the environment of one or more policy files (later files add grants and tools).
function M.open(paths)
  if type(paths) == 'string' then paths = { paths } end
  local merged = { grants = {}, extra = {}, limits = {}, serve = {} }
  for _, path in ipairs(paths) do
    local p = M.load(path)
    for _, k in ipairs({ 'pool', 'sandbox', 'tools' }) do
      if p[k] ~= nil then merged[k] = p[k] end
    end
    for _, g in ipairs(p.grants or {}) do merged.grants[#merged.grants + 1] = g end
    for k, v in pairs(p.limits or {}) do merged.limits[k] = v end
    for k, v in pairs(p.serve or {}) do merged.serve[k] = v end
  end
  if merged.pool then
    local opts = {}
    for k, v in pairs(merged.pool) do if k ~= 'provider' then opts[k] = v end end
    local sandbox = require('mayura.sandbox')
    local provider = require(PROVIDERS[merged.pool.provider])
    merged.pool = sandbox.create_sandboxes(provider.local_sandboxes(), opts)
  end
  local env = env_mod.open(merged)
  env.max_sessions = merged.serve.max_sessions
  env.session_idle_ms = merged.serve.session_idle_ms
  env.progress_interval_ms = merged.serve.progress_interval_ms
  local pool = merged.pool
  local close = env.close
  function env.close(self)
    close(self)
    if pool then pool:close() end
  end
  return env
end

return M
