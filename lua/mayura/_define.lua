--- mayura._define: hooks and agents as definitions (mayura.runtime's `define_hook` and
-- `define_agent`), each checked whole when it is made: a bad one raises INVALID_CONFIG before
-- anything runs. Also the checks of lists and names `create_runtime` shares.
local core = require('mayura.core')
local errors = require('mayura.errors')
local check = require('mayura._check')
local z = require('mayura.z')

local M = {}

local STAGES = {
  on_start = true, before_model_call = true, after_model_call = true,
  before_tool_call = true, after_tool_call = true, on_finally = true,
}
local DEFAULT_HOOK_TIMEOUT_MS = 30000
local DAY_MS = 86400000

local function cfg(message, level)
  errors.raise('INVALID_CONFIG', message, nil, (level or 2) + 1)
end

local function list_of(v, what, level)
  if v == nil then return {} end
  if type(v) ~= 'table' then cfg(what .. ' must be a list', level + 1) end
  local n, out = #v, {}
  for k in pairs(v) do
    if not check.is_int(k) or k < 1 or k > n then cfg(what .. ' must be a list', level + 1) end
  end
  for i = 1, n do out[i] = v[i] end
  return out
end

local function non_empty_string(v, what, level)
  if type(v) ~= 'string' or v == '' or #v > 256 then cfg(what .. ' must be a non-empty string', level + 1) end
  return v
end

-- {======================================================
-- Hooks
-- =======================================================

local Hook = {}
Hook.__index = Hook

local hook_keys = { id = true, version = true, stage = true, timeout_ms = true, handler = true, description = true }

--- A lifecycle hook: `{ id, version, stage, timeout_ms (30000), handler = function(event, context) }`.
function M.define_hook(def)
  if type(def) ~= 'table' then cfg('define_hook expects a table') end
  check.keys(def, hook_keys, 'define_hook', 'INVALID_CONFIG', 3)
  non_empty_string(def.id, 'hook id', 2)
  if def.version ~= nil then non_empty_string(def.version, 'hook version', 2) end
  if not STAGES[def.stage] then
    cfg('hook stage must be one of on_start, before_model_call, after_model_call, before_tool_call, '
      .. 'after_tool_call, on_finally')
  end
  if type(def.handler) ~= 'function' then cfg('hook handler must be a function') end
  return setmetatable({
    id = def.id,
    version = def.version,
    stage = def.stage,
    description = def.description,
    timeout_ms = check.int(def.timeout_ms, 'timeout_ms', 1, DAY_MS, 'INVALID_CONFIG', 3, DEFAULT_HOOK_TIMEOUT_MS),
    handler = def.handler,
  }, Hook)
end

-- }======================================================

-- {======================================================
-- Agents
-- =======================================================

local Agent = {}
Agent.__index = Agent

local agent_keys = {
  id = true, version = true, instructions = true, input = true, output = true, tools = true,
  model = true, hooks = true, description = true,
}
local tool_keys = {
  id = true, description = true, input = true, capabilities = true, effect = true, run = true,
  exec_cost_micros = true,
}

local function check_tool(t, i)
  local what = 'tools[' .. i .. ']'
  if type(t) ~= 'table' then cfg(what .. ' must be a tool table', 4) end
  check.keys(t, tool_keys, what, 'INVALID_CONFIG', 5)
  if type(t.id) ~= 'string' or not t.id:match('^[%w_%-%.:]+$') or #t.id > 128 then
    cfg(what .. '.id must be a name of letters, digits, _ - . :', 4)
  end
  if t.description ~= nil and type(t.description) ~= 'string' then cfg(what .. '.description must be a string', 4) end
  if t.input ~= nil and not z.is_schema(t.input) then cfg(what .. '.input must be a schema from mayura.z', 4) end
  if t.effect ~= 'read' and t.effect ~= 'write' then cfg(what .. ".effect must be 'read' or 'write'", 4) end
  if type(t.run) ~= 'function' then cfg(what .. '.run must be a function', 4) end
  local caps = list_of(t.capabilities, what .. '.capabilities', 4)
  for j, c in ipairs(caps) do non_empty_string(c, what .. '.capabilities[' .. j .. ']', 4) end
  return {
    id = t.id,
    description = t.description or '',
    input = t.input or z.object({}),
    capabilities = caps,
    effect = t.effect,
    run = t.run,
    exec_cost_micros = check.int(t.exec_cost_micros, what .. '.exec_cost_micros', 0, nil, 'INVALID_CONFIG', 5, 0),
  }
end

local function check_model(m)
  if type(m) == 'function' then
    return { id = 'function', max_cost_micros = 0, call = function(_, request) return m(request) end }
  end
  if type(m) ~= 'table' or type(m.call) ~= 'function' then
    cfg('model must be a model (a table with id and call) or a function', 4)
  end
  non_empty_string(m.id, 'model.id', 4)
  check.int(m.max_cost_micros or 0, 'model.max_cost_micros', 0, nil, 'INVALID_CONFIG', 5)
  return m
end

--- An agent: `{ id, version, instructions, input, output, tools, model, hooks }`.
-- `instructions` is a string or a list of lines; `input` and `output` are
-- schemas from mayura.z (anything goes when left out).
function M.define_agent(def)
  if type(def) ~= 'table' then cfg('define_agent expects a table') end
  check.keys(def, agent_keys, 'define_agent', 'INVALID_CONFIG', 3)
  non_empty_string(def.id, 'agent id', 2)
  if def.version ~= nil then non_empty_string(def.version, 'agent version', 2) end
  local instructions = def.instructions
  if type(instructions) == 'table' then
    local lines = list_of(instructions, 'instructions', 2)
    for i, line in ipairs(lines) do
      if type(line) ~= 'string' then cfg('instructions[' .. i .. '] must be a string') end
    end
    instructions = table.concat(lines, '\n')
  elseif instructions == nil then
    instructions = ''
  elseif type(instructions) ~= 'string' then
    cfg('instructions must be a string or a list of strings')
  end
  if def.input ~= nil and not z.is_schema(def.input) then cfg('input must be a schema from mayura.z') end
  if def.output ~= nil and not z.is_schema(def.output) then cfg('output must be a schema from mayura.z') end
  if def.model == nil then cfg('model is required') end
  local model = check_model(def.model)
  local tools, by_id, defs = {}, {}, {}
  for i, t in ipairs(list_of(def.tools, 'tools', 2)) do
    local tool = check_tool(t, i)
    if by_id[tool.id] then cfg('two tools have the id ' .. tool.id) end
    tools[i], by_id[tool.id] = tool, tool
    defs[i] = { id = tool.id, description = tool.description, input_schema = tool.input:json_schema() }
  end
  local hooks = {}
  for i, h in ipairs(list_of(def.hooks, 'hooks', 2)) do
    if getmetatable(h) ~= Hook then cfg('hooks[' .. i .. '] must be made by define_hook') end
    hooks[h.stage] = hooks[h.stage] or {}
    table.insert(hooks[h.stage], h)
  end
  local output = def.output or z.any()
  return setmetatable({
    id = def.id,
    version = def.version,
    description = def.description,
    instructions = instructions,
    input = def.input or z.any(),
    output = output,
    tools = tools,
    model = model,
    _tool_by_id = by_id,
    _tool_defs = setmetatable(defs, core.json.array_mt),
    _output_schema = output:json_schema(),
    _hooks = hooks,
  }, Agent)
end

-- }======================================================

M.cfg, M.list_of, M.non_empty_string = cfg, list_of, non_empty_string
M.Hook, M.Agent = Hook, Agent

return M
