--- mayura._policy_file: reading mayura.policy's files: each runs in an environment of its own
-- (the declarations, a read-only `z`, the plain functions; see mayura.policy's doc comment) into a
-- registry of declarations with their file and line; the declarations' shapes (keys and types);
-- and the INVALID_CONFIG errors, `<file>:<line>: <kind> '<name>': <problem>`, both make.
local errors = require('mayura.errors')
local z = require('mayura.z')

local M = {}

local NAME = '^[%a][%w_%-]*$'

-- {======================================================
-- Errors
-- =======================================================

-- The errors this module makes: any other error a policy raises is wrapped with its file and line.
local own_errors = setmetatable({}, { __mode = 'k' })

local function config_error(file, line, message, key)
  local where = file and (file .. ':' .. tostring(line or 0) .. ': ') or ''
  local e = errors.new('INVALID_CONFIG', where .. message, { file = file, line = line, key = key })
  own_errors[e] = true
  return e
end

local function what_of(d)
  if d.kind == 'serve' then return 'serve' end
  return d.kind .. " '" .. d.name .. "'"
end

-- Raises the problem of declaration `d`: "<file>:<line>: <kind> '<name>': <problem>".
local function fail(d, problem, key)
  error(config_error(d.file, d.line, what_of(d) .. ': ' .. problem, key), 0)
end

-- }======================================================

-- {======================================================
-- The shapes of the declarations
-- =======================================================

local function is_int(v)
  return type(v) == 'number' and v == math.floor(v) and v >= -2 ^ 53 and v <= 2 ^ 53
end

local function is_list_of_strings(v)
  if type(v) ~= 'table' then return false end
  local n = #v
  for k, x in pairs(v) do
    if not is_int(k) or k < 1 or k > n or type(x) ~= 'string' then return false end
  end
  return true
end

-- type name -> { test, what it says it expected }
local TYPES = {
  string = { function(v) return type(v) == 'string' end, 'a string' },
  int = { is_int, 'a whole number' },
  number = { function(v) return type(v) == 'number' end, 'a number' },
  boolean = { function(v) return type(v) == 'boolean' end, 'a boolean' },
  table = { function(v) return type(v) == 'table' end, 'a table' },
  ['function'] = { function(v) return type(v) == 'function' end, 'a function' },
  schema = { function(v) return z.is_schema(v) end, 'a schema from z' },
  strings = { is_list_of_strings, 'a list of strings' },
  text = { function(v) return type(v) == 'string' or is_list_of_strings(v) end, 'a string or a list of strings' },
  network = { function(v) return v == 'none' or v == 'all' or type(v) == 'table' end,
    "'none', 'all' or { allow = { ... } }" },
}

local SHAPES = {
  pool = {
    provider = 'string', provider_options = 'table', max_sandboxes = 'int', max_lifetime_ms = 'int',
    network = 'strings', exec_timeout_ms = 'int', max_exec_timeout_ms = 'int', max_output_bytes = 'int',
    max_file_bytes = 'int', call_timeout_ms = 'int', labels = 'table', sandbox = 'table', max_snapshots = 'int',
    max_snapshot_bytes = 'int',
  },
  sandbox = {
    lifetime_ms = 'int', network = 'network', env = 'table', ports = 'table', cpus = 'number',
    memory_mib = 'int', image = 'string', labels = 'table', desktop = 'boolean',
  },
  tools = {
    pool = 'string', exec = 'boolean', write = 'boolean', ports = 'boolean', desktop = 'boolean',
    snapshots = 'boolean', exec_timeout_ms = 'int', exec_cost_micros = 'int', max_output_bytes = 'int',
    max_read_bytes = 'int', max_write_bytes = 'int',
  },
  tool = {
    description = 'string', input = 'schema', effect = 'string', capabilities = 'strings', run = 'function',
    exec_cost_micros = 'int',
  },
  hook = { stage = 'string', timeout_ms = 'int', handler = 'function', description = 'string', version = 'string' },
  agent = {
    instructions = 'text', description = 'string', version = 'string', input = 'schema', output = 'schema',
    tools = 'strings', allow = 'strings', limits = 'table', budget = 'table', hooks = 'strings',
  },
  limits = { max_steps = 'int', max_model_calls = 'int', max_tool_calls = 'int', max_duration_ms = 'int' },
  budget = { max_cost_micros = 'int' },
  serve = { agent = 'string', max_sessions = 'int' },
}

local REQUIRED = {
  pool = { 'provider', 'max_sandboxes', 'max_lifetime_ms' },
  tool = { 'effect', 'run' },
  hook = { 'stage', 'handler' },
  agent = {},
  tools = {},
  serve = {},
}

local STAGES = {
  on_start = true, before_model_call = true, after_model_call = true,
  before_tool_call = true, after_tool_call = true, on_finally = true,
}

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

-- Checks table `t` (the declaration's, or its field `prefix`) against SHAPES[shape].
local function check_shape(d, t, shape, prefix)
  local fields = SHAPES[shape]
  for _, k in ipairs(sorted_keys(t)) do
    local key = prefix and (prefix .. '.' .. tostring(k)) or tostring(k)
    local ty = type(k) == 'string' and fields[k] or nil
    if ty == nil then fail(d, "unknown key '" .. key .. "'", key) end
    local spec = TYPES[ty]
    if not spec[1](t[k]) then
      fail(d, 'wrong type (' .. spec[2] .. ' expected, got ' .. type(t[k]) .. ") for '" .. key .. "'", key)
    end
  end
  for _, k in ipairs(REQUIRED[shape] or {}) do
    if t[k] == nil then
      local key = prefix and (prefix .. '.' .. k) or k
      fail(d, "missing key '" .. key .. "'", key)
    end
  end
end

-- }======================================================

-- {======================================================
-- Reading the files
-- =======================================================

local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end

-- A read-only view of a module table: reads go through, writes raise, and its metatable can be
-- neither read nor replaced (so the table behind it stays out of reach).
local function read_only(t, what)
  return setmetatable({}, {
    __index = t,
    __newindex = function() error(what .. ' cannot be changed here', 2) end,
    __metatable = false,
  })
end

local function read_text(path)
  local f, err = io.open(path, 'rb')
  local text
  if f then
    -- a directory opens, and its read fails
    local ok, res, rerr = pcall(f.read, f, '*a')
    f:close()
    if ok and type(res) == 'string' then text = res else err = ok and rerr or res end
  end
  if not text then
    err = tostring(err or 'unreadable'):gsub('^' .. path:gsub('%p', '%%%0') .. ': ', '')
    local e = errors.new('INVALID_CONFIG', path .. ': cannot read the policy file (' .. err .. ')', { file = path })
    own_errors[e] = true
    error(e, 0)
  end
  return text
end

-- What a policy raised, as a message: a string, or a table's message (a coded error's code first),
-- or its __tostring when that works; never an address.
local function describe(e)
  if type(e) == 'string' then return e end
  if type(e) == 'table' then
    local ok_code, code = pcall(function() return rawget(e, 'code') end)
    local ok_msg, msg = pcall(function() return rawget(e, 'message') end)
    if ok_msg and type(msg) == 'string' then
      return (ok_code and type(code) == 'string' and code ~= 'INVALID_CONFIG') and (code .. ': ' .. msg) or msg
    end
    local ok, text = pcall(tostring, e)
    if ok and type(text) == 'string' and not text:match('^table: ') then return text end
    if ok_code and type(code) == 'string' then return code end
    return 'an error without a message (a table)'
  end
  if e == nil then return 'an error without a message (nil)' end
  return tostring(e)
end

-- A policy reads the environment (an API key's variable) but not mayura's own variables: a server's
-- token (MAYURA_MCP_TOKEN) or the paths it was started with are not the policy's to see, nor to pass
-- into a sandbox's env where its code could read them.
local function policy_getenv(name)
  if type(name) ~= 'string' or name:upper():sub(1, 7) == 'MAYURA_' then return nil end
  return os.getenv(name)
end

-- The environment a policy file runs in, whose declaration functions add to `reg`.
local function make_env(reg, file)
  local env = {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = pcall,
    select = select, tonumber = tonumber, tostring = tostring, type = type, xpcall = xpcall,
    rawequal = rawequal, rawget = rawget, rawlen = rawlen,
    unpack = table.unpack or unpack,  -- luacheck: ignore 143
    string = copy(string), table = copy(table), math = copy(math),
    os = { time = os.time, clock = os.clock, date = os.date, getenv = policy_getenv },
  }
  -- no finalizer: policy code runs when it is called, never from the collector in the middle of the host
  env.setmetatable = function(t, mt)
    if type(mt) == 'table' and rawget(mt, '__gc') ~= nil then
      error('a policy cannot set __gc (a finalizer would run in the middle of the host)', 2)
    end
    return setmetatable(t, mt)
  end
  env.string.dump = nil
  env.math.randomseed = nil   -- the generator is the process's
  env.utf8 = utf8 and copy(utf8) or nil  -- luacheck: ignore 143
  env.z = read_only(z, 'z')
  env.print = function(...)
    local n, parts = select('#', ...), {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    io.stderr:write(table.concat(parts, '\t'), '\n')
  end
  env.require = function(name)
    if name == 'mayura.z' then return env.z end
    error("a policy may require only 'mayura.z', not '" .. tostring(name) .. "'", 2)
  end
  env._G = env

  local function line_of()
    local info = debug.getinfo(3, 'Sl')
    return info and info.currentline or 0
  end

  local function record(kind, name, line, def)
    local d = { kind = kind, name = name, file = file, line = line }
    if type(def) ~= 'table' then fail(d, 'wrong type (a table expected, got ' .. type(def) .. ')', nil) end
    d.def = copy(def)
    local key = (kind == 'tools' or kind == 'tool') and 'tool' or kind
    local names = reg.names[key]
    local first = names[name]
    if first then
      fail(d, 'declared twice (first at ' .. first.file .. ':' .. first.line .. ')', nil)
    end
    names[name] = d
    reg.list[#reg.list + 1] = d
  end

  local function declaration(kind)
    return function(name)
      local line = line_of()
      if reg.loaded then error(kind .. ': declarations are made only while the policy loads', 2) end
      if type(name) ~= 'string' or not name:match(NAME) or #name > 64 then
        error(config_error(file, line, kind
          .. ' needs a name (a letter, then letters, digits, _ or -) before its table', nil), 0)
      end
      local pending = { kind = kind, name = name, line = line }
      reg.pending[pending] = true
      return function(def)
        reg.pending[pending] = nil
        record(kind, name, line, def)
      end
    end
  end

  env.pool = declaration('pool')
  env.tools = declaration('tools')
  env.tool = declaration('tool')
  env.hook = declaration('hook')
  env.agent = declaration('agent')
  env.serve = function(def)
    local line = line_of()
    if reg.loaded then error('serve: declarations are made only while the policy loads', 2) end
    local d = { kind = 'serve', name = 'serve', file = file, line = line }
    if type(def) ~= 'table' then fail(d, 'wrong type (a table expected, got ' .. type(def) .. ')', nil) end
    if reg.serve then fail(d, 'declared twice (first at ' .. reg.serve.file .. ':' .. reg.serve.line .. ')', nil) end
    d.def = copy(def)
    reg.serve = d
  end
  return env
end

-- Runs one policy file into `reg`.
local function run_file(reg, path, text)
  if text:sub(1, 1) == '\27' then
    error(config_error(path, 1, 'a policy file must be Lua source, not bytecode', nil), 0)
  end
  local env = make_env(reg, path)
  -- a chunk name Lua never cuts (it keeps 60 bytes of one): messages start with it and the line
  local name = #path <= 40 and path or ('...' .. path:sub(-37))
  local prefix = '^' .. name:gsub('%p', '%%%0') .. ':(%d+): (.*)$'
  local chunk, err = load(text, '=' .. name, 't', env)
  if not chunk then
    local line, rest = tostring(err):match(prefix)
    error(config_error(path, tonumber(line) or 0, 'syntax error: ' .. (rest or tostring(err)), nil), 0)
  end
  -- the line is that of the innermost frame of the file where the error was raised
  local where = 0
  local ok, res = xpcall(chunk, function(e)
    for level = 2, 64 do
      local info = debug.getinfo(level, 'Sl')
      if not info then break end
      if info.source == '=' .. name and (info.currentline or 0) > 0 then
        where = info.currentline
        break
      end
    end
    return e
  end)
  if not ok then
    if own_errors[res] then error(res, 0) end
    local msg = describe(res)
    local line, rest = msg:match(prefix)
    if line then error(config_error(path, tonumber(line), rest, nil), 0) end
    error(config_error(path, where, msg, nil), 0)
  end
  for p in pairs(reg.pending) do
    reg.pending[p] = nil
    fail({ kind = p.kind, name = p.name, file = path, line = p.line }, 'no table after the name', nil)
  end
end

-- }======================================================

M.STAGES, M.fail, M.sorted_keys = STAGES, fail, sorted_keys
M.check_shape, M.copy, M.read_text, M.run_file = check_shape, copy, read_text, run_file

return M
