--- mayura.policy: policy files, the sandbox pools, tools, agents, grants, limits and hooks of a
-- program written as data in Lua, loaded and checked completely at startup.
--
--   build/mayura --policy examples/policies/workspace.lua app.lua      -- in app.lua: mayura.policy()
--   local policy = mayura.load_policy('policy.lua')                   -- or { 'a.lua', 'b.lua' }
--   local env = policy:open()                       -- makes the pools (no sandbox yet)
--   local s = env:session('client-1')               -- a caller that makes the tool calls itself
--                                                   -- (the runtime's session; what mayura serve drives)
--   local r = s:call('workspace.exec', { command = 'echo hi' })   -- r.stdout == 'hi\n'
--   s:close()                                       -- releases the session's sandbox
--   local outcome = env:run('coder', { task = '...' }, model)     -- or a run with a model
--   env:close()
--
-- A policy file declares, each with a call that records its file and line:
--
--   pool 'workspace' {                 -- a pool of sandboxes (create_sandboxes) over a provider
--     provider = 'local',              -- a provider by name: mayura.sandbox.provider(name, provider_options)
--     provider_options = { ... },      -- what that function takes (local: none needed)
--     max_sandboxes = 4, max_lifetime_ms = 1800000,   -- required, as for create_sandboxes
--     network = { 'none' }, exec_timeout_ms, max_exec_timeout_ms, max_output_bytes, max_file_bytes,
--     call_timeout_ms, labels, max_snapshots, max_snapshot_bytes,   -- the pool's other options
--     sandbox = { lifetime_ms, network, env, ports, cpus, memory_mib, image, labels, desktop },
--   }                                  -- ^ create options of the sandbox each run or session gets
--                                      --   (lifetime_ms: the pool's max_lifetime_ms by default)
--   tools 'workspace' {                -- sandbox_tools over that sandbox: workspace.read, .list, ...
--     pool = 'workspace',              -- the pool (by default the one of the same name)
--     exec = true, write = true, ports, desktop, snapshots, exec_timeout_ms, exec_cost_micros,
--     max_output_bytes, max_read_bytes, max_write_bytes,
--   }
--   tool 'clock' {                     -- a tool written in Lua, as the runtime defines them
--     description = '...', input = z.object({}), effect = 'read', capabilities = { ... },
--     exec_cost_micros = 0, run = function(input, context) return { ms = os.time() * 1000 } end,
--   }
--   hook 'audit' { stage = 'after_tool_call', timeout_ms = 1000, handler = function(event, context) end }
--   agent 'coder' {
--     instructions = '...', description, version, input = z..., output = z...,
--     tools = { 'workspace', 'clock' },            -- tools declarations and tool names
--     allow = { 'tool:workspace.read', 'sandbox:workspace:read', 'effect:read', 'model:scripted' },
--     limits = { max_steps, max_model_calls, max_tool_calls, max_duration_ms },
--     budget = { max_cost_micros = 500000 },
--     hooks = { 'audit' },
--   }
--   serve { agent = 'coder', max_sessions = 16 }  -- what a tool host serves (one at most)
--
-- The grants are the runtime's, and nothing is allowed that is not granted: `tool:<id>` for each
-- tool, the tool's capabilities (`sandbox:<tools>:<read|exec|write|ports|desktop>`), its effect
-- (`effect:read`, `effect:write`), and for a run `model:<id>` of its model. An agent's run or
-- session gets a sandbox of each pool its tools use on the first call that needs one; it is
-- released when the run ends or the session closes (after the agent's own on_finally hooks).
--
-- The file runs in an environment of its own: the declarations, `z` (a read-only view of mayura.z),
-- `require` of 'mayura.z' only, string, table, math (copies; no randomseed), `os.time`, `os.clock`,
-- `os.date`, `os.getenv` (none of mayura's own MAYURA_* variables), and the plain functions (pairs,
-- ipairs, type, tostring, pcall, error, setmetatable without __gc, ...); `print` writes to stderr.
-- No io, no os.execute, no load, no debug, no package, no getmetatable. Its
-- globals stay in it, and so do the functions it defines (a tool's run, a hook's handler).
--
-- Several files merge: each adds its declarations; a name declared twice (tools and tool share
-- names) is an error. Everything is checked before anything runs: each mistake (a syntax error,
-- an error the file raises, an unknown key, a wrong type, a missing key, an unknown pool, tool,
-- hook or agent, a grant for a tool that does not exist, a hook on an unknown stage, a value the
-- pool, provider or tools refuse) raises INVALID_CONFIG with the message
-- `<file>:<line>: <kind> '<name>': <problem> '<key>'` (fields `file`, `line`, `key`).
-- Loading and checking run, make and start nothing (no sandbox, no warm one, no program): `open()`
-- makes the pools, and a sandbox (and a pool's warm ones) comes on first use.
--
-- A policy file declares and nothing more: the module tables it reaches (`z`) are read-only views,
-- and the objects it is handed (schemas, cancel tokens) keep their methods out of its reach. Provider
-- options that name a host program or a host path (local: `bwrap`, `agent`, `image`; Docker:
-- `docker`, `agent`, `host`, `run_dir`; `proxy_resolve`; a local pool's `sandbox.image`) are refused
-- with INVALID_CONFIG naming the option: they are the host program's own (load_policy's options).
local errors = require('mayura.errors')
local file = require('mayura._policy_file')

local M = {}

-- How many sessions may be open at once when `serve` does not say.
local MAX_SESSIONS = 16

-- Reading the files, the declarations' shapes and their errors (mayura._policy_file).
local STAGES, fail, sorted_keys = file.STAGES, file.fail, file.sorted_keys
local check_shape, copy, read_text, run_file = file.check_shape, file.copy, file.read_text, file.run_file

-- {======================================================
-- Checking and building
-- =======================================================

-- Calls fn(...); an error it raises becomes a problem of declaration `d`.
local function as_problem(d, fn, ...)
  local ok, res = pcall(fn, ...)
  if ok then return res end
  if errors.is(res) and res.file then error(res, 0) end
  local msg = errors.is(res) and res.message or tostring(res)
  fail(d, tostring(msg), nil)
end

-- A sandbox grant's power, and the tools option that gives it.
local POWERS = { read = 'read', exec = 'exec', write = 'write', ports = 'ports', desktop = 'desktop',
  snapshot = 'snapshots' }

-- Provider options that name a host program mayura runs, or a host path it runs, binds, creates
-- or changes (as root, when the host runs as root): a policy file declares and cannot name them;
-- they stay options of the host program's own code (load_policy's `provider_options`).
local HOST_OPTIONS = {
  ['local'] = { bwrap = 'a host program', agent = 'a host program', image = 'a host directory',
    proxy_resolve = 'host addresses (tests only)' },
  docker = { docker = 'a host program', agent = 'a host program', host = 'a host socket',
    run_dir = 'a host directory', proxy_resolve = 'host addresses (tests only)' },
  apple_container = { executable = 'a host program' },
}

-- The provider of pool declaration `d`, found by name (mayura.sandbox.provider): the host's own options
-- (`host`, by provider name) with the policy's provider_options added; a policy that sets one the host
-- set, to another value, is refused.
-- Checking makes it with `{ check = true }`: nothing is run, made or started.
local function provider_of(d, host, checking)
  local name = d.def.provider
  local refused = HOST_OPTIONS[name] or {}
  local options = host and host[name] and copy(host[name]) or nil
  for _, k in ipairs(sorted_keys(d.def.provider_options or {})) do
    if refused[k] then
      fail(d, "'provider_options." .. tostring(k) .. "' names " .. refused[k] .. ': only the host program\'s '
        .. 'own code may (load_policy\'s provider_options), not a policy file', 'provider_options.' .. tostring(k))
    end
    local v = d.def.provider_options[k]
    -- the host program's own options are the last word (a policy cannot weaken `runtime = 'runsc'`)
    if options and options[k] ~= nil and options[k] ~= v then
      fail(d, "'provider_options." .. tostring(k) .. "' is set by the host program's own code; a policy file "
        .. 'cannot change it', 'provider_options.' .. tostring(k))
    end
    options = options or {}
    options[k] = v
  end
  local sb = d.def.sandbox
  if sb and sb.image ~= nil and refused.image then
    fail(d, "'sandbox.image' names " .. refused.image .. ': only the host program\'s own code may, not a '
      .. 'policy file', 'sandbox.image')
  end
  local find, how = require('mayura.sandbox').provider, checking and { check = true } or nil
  return as_problem(d, function()
    local ok, provider = pcall(find, name, options, how)
    if ok then return provider end
    if errors.is(provider, 'INVALID_INPUT') and provider.unknown_provider == name then
      fail(d, "unknown provider '" .. name .. "' in 'provider'", 'provider')
    end
    error(provider, 0)
  end)
end

local pool_options = {
  'max_sandboxes', 'max_lifetime_ms', 'network', 'exec_timeout_ms', 'max_exec_timeout_ms', 'max_output_bytes',
  'max_file_bytes', 'call_timeout_ms', 'labels', 'max_snapshots', 'max_snapshot_bytes',
}
local tools_options = {
  'exec', 'write', 'ports', 'desktop', 'snapshots', 'exec_timeout_ms', 'exec_cost_micros', 'max_output_bytes',
  'max_read_bytes', 'max_write_bytes',
}

-- Everything the declarations describe, made: pools (no sandbox), per-run sources, tools, hooks, agents'
-- parts. Made once to check (`checking`: its providers run and make nothing, and its pools are closed
-- again), and again by each open(). A pool's warm sandboxes start at its first create.
local function build(policy, checking)
  local sandbox = require('mayura.sandbox')
  local runtime = require('mayura.runtime')
  local out = { pools = {}, per_run = {}, tools = {}, tool_pool = {}, hooks = {}, agents = {} }
  for _, d in ipairs(policy._decls.pool) do
    local def = d.def
    local provider = provider_of(d, policy._host_options, checking)
    local opts = { warm_start = 'first_use' }
    for _, k in ipairs(pool_options) do opts[k] = def[k] end
    local pool = as_problem(d, sandbox.create_sandboxes, provider, opts)
    local create = def.sandbox and copy(def.sandbox) or {}
    if create.lifetime_ms == nil then create.lifetime_ms = pool.max_lifetime_ms end
    if create.lifetime_ms < 1 or create.lifetime_ms > pool.max_lifetime_ms then
      fail(d, 'lifetime_ms must be from 1 to the pool\'s max_lifetime_ms (' .. pool.max_lifetime_ms
        .. ") in 'sandbox.lifetime_ms'", 'sandbox.lifetime_ms')
    end
    local kind = create.network
    if type(kind) == 'table' then kind = 'allowlist' end
    if kind ~= nil and not pool.network[kind] then
      fail(d, "network '" .. kind .. "' is not in the pool's network in 'sandbox.network'", 'sandbox.network')
    end
    out.pools[d.name] = pool
    out.per_run[d.name] = sandbox.sandbox_per_run(pool, function() return copy(create) end)
  end
  for _, d in ipairs(policy._decls.tools) do
    local opts = { name = d.name }
    for _, k in ipairs(tools_options) do opts[k] = d.def[k] end
    local pool_name = d.def.pool or d.name
    out.tools[d.name] = as_problem(d, sandbox.sandbox_tools, out.per_run[pool_name].source, opts)
    out.tool_pool[d.name] = pool_name
  end
  for _, d in ipairs(policy._decls.tool) do
    local t = copy(d.def)
    t.id = d.name
    local agent = as_problem(d, runtime.define_agent, { id = 'check', model = function() end, tools = { t } })
    out.tools[d.name] = { agent.tools[1] }
  end
  for _, d in ipairs(policy._decls.hook) do
    local h = copy(d.def)
    h.id = d.name
    out.hooks[d.name] = as_problem(d, runtime.define_hook, h)
  end
  for _, d in ipairs(policy._decls.agent) do
    local def = d.def
    local tools, used = {}, {}
    for _, name in ipairs(def.tools or {}) do
      for _, t in ipairs(out.tools[name]) do tools[#tools + 1] = t end
      local pool_name = out.tool_pool[name]
      if pool_name and not used[pool_name] then
        used[pool_name] = true
        used[#used + 1] = pool_name
      end
    end
    local hooks = {}
    for _, name in ipairs(def.hooks or {}) do hooks[#hooks + 1] = out.hooks[name] end
    if #used > 0 then
      local per_run = out.per_run
      hooks[#hooks + 1] = runtime.define_hook({
        id = 'policy.release', stage = 'on_finally', timeout_ms = 60000,
        handler = function(_, context)
          for _, pool_name in ipairs(used) do per_run[pool_name].release(context.run_id) end
        end,
      })
    end
    local limits = copy(def.limits or {})
    if def.budget then limits.max_cost_micros = def.budget.max_cost_micros end
    local parts = {
      agent = { id = d.name, version = def.version, description = def.description, instructions = def.instructions,
        input = def.input, output = def.output, tools = tools, hooks = hooks },
      runtime = { permissions = { allow = copy(def.allow or {}) }, limits = limits },
    }
    local check_agent = copy(parts.agent)
    check_agent.model = function() end
    as_problem(d, runtime.define_agent, check_agent)
    as_problem(d, runtime.create_runtime, parts.runtime)
    out.agents[d.name] = parts
  end
  return out
end

-- The cross references and the grants, then a build of everything.
local function check_all(policy)
  local decls, names = policy._decls, policy._names
  for _, d in ipairs(policy._list) do
    check_shape(d, d.def, d.kind)
    if d.kind == 'pool' and d.def.sandbox then check_shape(d, d.def.sandbox, 'sandbox', 'sandbox') end
    if d.kind == 'agent' then
      if d.def.limits then check_shape(d, d.def.limits, 'limits', 'limits') end
      if d.def.budget then check_shape(d, d.def.budget, 'budget', 'budget') end
    end
  end
  for _, d in ipairs(decls.tools) do
    local pool_name = d.def.pool or d.name
    if not names.pool[pool_name] then fail(d, "unknown pool '" .. pool_name .. "' in 'pool'", 'pool') end
  end
  for _, d in ipairs(decls.tool) do
    if d.def.effect ~= 'read' and d.def.effect ~= 'write' then
      fail(d, "effect must be 'read' or 'write' in 'effect'", 'effect')
    end
  end
  for _, d in ipairs(decls.hook) do
    if not STAGES[d.def.stage] then fail(d, "unknown stage '" .. d.def.stage .. "' in 'stage'", 'stage') end
  end
  for _, d in ipairs(decls.agent) do
    for _, name in ipairs(d.def.tools or {}) do
      if not names.tool[name] then fail(d, "unknown tool '" .. name .. "' in 'tools'", 'tools') end
    end
    for _, name in ipairs(d.def.hooks or {}) do
      if not names.hook[name] then fail(d, "unknown hook '" .. name .. "' in 'hooks'", 'hooks') end
    end
  end
  if policy.serve_decl then
    local d = policy.serve_decl
    check_shape(d, d.def, 'serve')
    local agent = d.def.agent
    if agent == nil then
      if #decls.agent ~= 1 then fail(d, "missing key 'agent' (the policy declares " .. #decls.agent
        .. ' agents)', 'agent') end
      agent = decls.agent[1].name
    elseif not names.agent[agent] then
      fail(d, "unknown agent '" .. agent .. "' in 'agent'", 'agent')
    end
    local max = d.def.max_sessions or MAX_SESSIONS
    if max < 1 or max > 100000 then fail(d, "max_sessions must be from 1 to 100000 in 'max_sessions'",
      'max_sessions') end
    policy.serve = { agent = agent, max_sessions = max, file = d.file, line = d.line }
  end

  local built = build(policy, true)
  for _, pool in pairs(built.pools) do pool:close() end   -- they hold nothing: closed all the same

  -- Grants: each names something the agent has.
  for _, d in ipairs(decls.agent) do
    local ids, groups = {}, {}
    for _, name in ipairs(d.def.tools or {}) do
      for _, t in ipairs(built.tools[name]) do ids[t.id] = true end
      if names.tool[name].kind == 'tools' then groups[name] = names.tool[name] end
    end
    local all_ids = {}
    for _, list in pairs(built.tools) do
      for _, t in ipairs(list) do all_ids[t.id] = true end
    end
    for _, g in ipairs(d.def.allow or {}) do
      local kind, rest = g:match('^(%a+):(.+)$')
      if kind == 'tool' then
        if not all_ids[rest] then
          fail(d, "grant for unknown tool '" .. g .. "'", 'allow')
        elseif not ids[rest] then
          fail(d, "grant for a tool not in its tools '" .. g .. "'", 'allow')
        end
      elseif kind == 'sandbox' then
        local group, power = rest:match('^([%w_%-]+):(%a+)$')
        local def = group and groups[group] and groups[group].def
        if not def or not POWERS[power] or (power ~= 'read' and def[POWERS[power]] ~= true) then
          fail(d, "grant for unknown sandbox tools '" .. g .. "'", 'allow')
        end
      elseif kind == 'effect' then
        if rest ~= 'read' and rest ~= 'write' then fail(d, "grant for unknown effect '" .. g .. "'", 'allow') end
      elseif kind ~= 'model' then
        fail(d, "unknown grant '" .. g .. "'", 'allow')
      end
    end
  end
end

-- }======================================================

-- {======================================================
-- The policy, and its environment
-- =======================================================

local Policy = {}
Policy.__index = Policy

local Env = {}
Env.__index = Env

--- Loads and checks policy files: a path, a list of paths, or `{ name = 'x.lua', source = '...' }`
-- items (a source given as text). Returns the policy; raises INVALID_CONFIG (see the module comment).
-- `options.provider_options` (by provider name: `{ docker = { run_dir = ... } }`) are the host
-- program's own options of each provider, under the policy's: the only place for the options that
-- name a host program or path. Loading and checking run, make and start nothing.
local load_keys = { provider_options = true }

function M.load_policy(files, options)
  options = options or {}
  if type(options) ~= 'table' then errors.raise('INVALID_CONFIG', 'load_policy options must be a table', nil, 2) end
  for k in pairs(options) do
    if not load_keys[k] then errors.raise('INVALID_CONFIG', 'unknown load_policy option ' .. tostring(k), nil, 2) end
  end
  local host_options = options.provider_options
  if host_options ~= nil then
    if type(host_options) ~= 'table' then
      errors.raise('INVALID_CONFIG', 'provider_options must be a table of tables by provider name', nil, 2)
    end
    for name, o in pairs(host_options) do
      if type(name) ~= 'string' or type(o) ~= 'table' then
        errors.raise('INVALID_CONFIG', 'provider_options must be a table of tables by provider name', nil, 2)
      end
    end
  end
  if type(files) == 'string' or (type(files) == 'table' and files.source ~= nil) then files = { files } end
  if type(files) ~= 'table' or #files == 0 then
    errors.raise('INVALID_CONFIG', 'load_policy expects a path, a list of paths or { name, source } items', nil, 2)
  end
  local reg = { list = {}, pending = {}, names = { pool = {}, tool = {}, hook = {}, agent = {} } }
  local paths = {}
  for i, f in ipairs(files) do
    local path, text
    if type(f) == 'string' then
      path, text = f, read_text(f)
    elseif type(f) == 'table' and type(f.source) == 'string' then
      path, text = type(f.name) == 'string' and f.name or ('policy ' .. i), f.source
    else
      errors.raise('INVALID_CONFIG', 'load_policy: item ' .. i .. ' is not a path or { name, source }', nil, 2)
    end
    paths[i] = path
    run_file(reg, path, text)
  end
  reg.loaded = true
  local decls = { pool = {}, tools = {}, tool = {}, hook = {}, agent = {} }
  for _, d in ipairs(reg.list) do table.insert(decls[d.kind], d) end
  local policy = setmetatable({
    files = paths,
    _list = reg.list,
    _decls = decls,
    _names = reg.names,
    _host_options = host_options,
    serve_decl = reg.serve,
  }, Policy)
  check_all(policy)
  local agents, pools = {}, {}
  for _, d in ipairs(decls.agent) do agents[#agents + 1] = d.name end
  for _, d in ipairs(decls.pool) do pools[#pools + 1] = d.name end
  policy.agents, policy.pools = agents, pools
  policy.serve_decl = nil
  return policy
end

local current

--- The policy the host program loaded with --policy (nil without one).
function M.policy()
  return current
end

--- Used by the host program: loads the --policy files and keeps the policy for `mayura.policy()`.
function M._host_load(files)
  current = M.load_policy(files)
  return current
end

--- Where a declaration was made: `{ kind, name, file, line }`, or nil.
function Policy:where(kind, name)
  local key = (kind == 'tools' or kind == 'tool') and 'tool' or kind
  local d = self._names[key] and self._names[key][name]
  if not d then return nil end
  return { kind = d.kind, name = d.name, file = d.file, line = d.line }
end

--- Makes the pools (no sandbox: each comes on first use) and returns the environment.
function Policy:open()
  if getmetatable(self) ~= Policy then errors.raise('INVALID_INPUT', 'call open with a colon: policy:open()') end
  local built = build(self)
  return setmetatable({ policy = self, _built = built, _runtimes = {}, _closed = false }, Env)
end

local function agent_parts(env, name, level)
  if name == nil then
    if env.policy.serve then name = env.policy.serve.agent
    elseif #env.policy.agents == 1 then name = env.policy.agents[1] end
  end
  local parts = type(name) == 'string' and env._built.agents[name]
  if not parts then errors.raise('NOT_FOUND', 'the policy has no agent ' .. tostring(name), nil, level + 1) end
  return parts, name
end

local function make_agent(parts, model)
  local def = copy(parts.agent)
  def.model = model
  return require('mayura.runtime').define_agent(def)
end

local function runtime_of(env, name, parts)
  local rt = env._runtimes[name]
  if not rt then
    rt = require('mayura.runtime').create_runtime(parts.runtime)
    env._runtimes[name] = rt
  end
  return rt
end

local session_keys = { agent = true, on_event = true }

-- The sessions of the environment that are open (each runtime keeps its own).
local function open_sessions(env)
  local list = {}
  for _, rt in pairs(env._runtimes) do
    for s in pairs(rt._sessions or {}) do list[#list + 1] = s end
  end
  return list
end

--- A session of the serve agent (or `options.agent`): the runtime's own session (Runtime:session),
-- `{ id, agent_id, tools, declared, usage, call(tool_id, input, { signal, call_id, progress }),
-- close() }`. A call goes through the runtime's checks and raises coded errors; `close` releases
-- the session's sandboxes (the agent's on_finally hooks). More than max_sessions open: LIMIT_EXCEEDED.
function Env:session(id, options)
  if getmetatable(self) ~= Env then errors.raise('INVALID_INPUT', 'call session with a colon: env:session(...)') end
  if self._closed then errors.raise('INVALID_INPUT', 'the policy environment is closed') end
  if type(id) ~= 'string' or id == '' or #id > 256 then
    errors.raise('INVALID_INPUT', 'the session id must be a non-empty string (at most 256 bytes)')
  end
  options = options or {}
  if type(options) ~= 'table' then errors.raise('INVALID_INPUT', 'session options must be a table') end
  for k in pairs(options) do
    if not session_keys[k] then
      errors.raise('INVALID_INPUT', 'unknown option ' .. tostring(k) .. ' in session options')
    end
  end
  local open = open_sessions(self)
  for _, s in ipairs(open) do
    if s.id == id then errors.raise('INVALID_INPUT', 'there is already a session ' .. id) end
  end
  local max = self.policy.serve and self.policy.serve.max_sessions or MAX_SESSIONS
  if #open >= max then
    errors.raise('LIMIT_EXCEEDED', 'max_sessions (' .. max .. ') sessions are open; try again once one ends')
  end
  local parts, name = agent_parts(self, options.agent, 2)
  local agent = make_agent(parts, function()
    errors.raise('MODEL_ERROR', 'a session has no model')
  end)
  local rt = runtime_of(self, name, parts)
  local ok, s = pcall(rt.session, rt, agent, { id = id, on_event = options.on_event })
  if not ok then error(s, 2) end
  return s
end

--- Starts a run of agent `name` with `model`: `options` are `{ input, on_event, signal }` as for
-- runtime:submit. Returns the run.
function Env:submit(name, model, options)
  if getmetatable(self) ~= Env then errors.raise('INVALID_INPUT', 'call submit with a colon: env:submit(...)') end
  if self._closed then errors.raise('INVALID_INPUT', 'the policy environment is closed') end
  local parts = agent_parts(self, name, 2)
  local agent = make_agent(parts, model)
  return runtime_of(self, name, parts):submit(agent, options)
end

--- Runs agent `name` on `input` with `model` and returns the outcome (runtime:submit, then result).
function Env:run(name, input, model, options)
  local opts = options and copy(options) or {}
  opts.input = input
  return self:submit(name, model, opts):result()
end

--- The pool of a pool declaration (to make a sandbox outside the agents, or to read its count).
function Env:pool(name)
  return self._built.pools[name]
end

--- Closes every session and run, then every pool (releasing every sandbox).
function Env:close()
  if self._closed then return end
  self._closed = true
  for _, s in ipairs(open_sessions(self)) do pcall(s.close) end
  for _, rt in pairs(self._runtimes) do rt:close() end
  for _, pool in pairs(self._built.pools) do pool:close() end
end

M.Policy = Policy
M.Env = Env

return M
