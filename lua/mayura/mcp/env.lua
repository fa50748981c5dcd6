--- mayura.mcp.env: tool sessions over a pool, with grants, limits and a budget per session.
--
--   local env = require('mayura.mcp.env').open({
--     pool = sandboxes,                                  -- from create_sandboxes
--     sandbox = { lifetime_ms = 600000 },                -- create options of each session's sandbox
--     tools = { name = 'workspace', exec = true, write = true },   -- sandbox_tools options (or a list)
--     extra = { tool, ... },                             -- Lua tools ({ id, description, input, run, ... })
--     grants = { 'tool:workspace.read', 'sandbox:workspace:read', 'effect:read', ... },
--     limits = { max_tool_calls = 100, max_cost_micros = 1000000 },
--   })
--   local s = env:session(id)      -- { tools, call(tool_id, input, opts), close() }
--   env:close()
--
-- The shape `mayura serve` hands to `mayura.mcp`: each session gets a sandbox
-- of its own the first time one of its tools needs it (sandbox_per_run keyed
-- by the session id), released by `close`. A call is checked as a run checks
-- one: the grants `tool:<id>`, each capability and `effect:<effect>` (a
-- missing one is PERMISSION_DENIED naming it), `max_tool_calls`, the input
-- against the tool's schema (INVALID_INPUT), and the tool's
-- `exec_cost_micros` against `max_cost_micros` (BUDGET_EXCEEDED). `opts.signal`
-- (a cancel token) reaches the tool, so a cancel stops its command.
local errors = require('mayura.errors')
local sandbox = require('mayura.sandbox')

local M = {}

local Env = {}
Env.__index = Env

--- An environment of tool sessions (see above).
function M.open(options)
  if type(options) ~= 'table' then errors.raise('INVALID_CONFIG', 'mcp env expects options', nil, 2) end
  local self = setmetatable({ options = options, sessions = {}, tools = {} }, Env)
  local allow = {}
  for _, g in ipairs(options.grants or {}) do allow[g] = true end
  self.allow = allow
  self.limits = options.limits or {}
  if options.pool then
    self.per_run = sandbox.sandbox_per_run(options.pool, options.sandbox or { lifetime_ms = 600000 })
    local specs = options.tools or {}
    if specs.name then specs = { specs } end
    for _, spec in ipairs(specs) do
      for _, t in ipairs(sandbox.sandbox_tools(self.per_run.source, spec)) do self.tools[#self.tools + 1] = t end
    end
  end
  for _, t in ipairs(options.extra or {}) do self.tools[#self.tools + 1] = t end
  return self
end

local function missing_grants(allow, tool)
  local missing = {}
  local g = 'tool:' .. tool.id
  if not allow[g] then missing[#missing + 1] = g end
  for _, c in ipairs(tool.capabilities or {}) do
    if not allow[c] then missing[#missing + 1] = c end
  end
  g = 'effect:' .. (tool.effect or 'write')
  if not allow[g] then missing[#missing + 1] = g end
  return missing
end

--- The tool session of `id`.
function Env:session(id)
  if type(id) ~= 'string' or id == '' then errors.raise('INVALID_INPUT', 'a session needs an id', nil, 2) end
  local env = self
  local by_id = {}
  for _, t in ipairs(self.tools) do by_id[t.id] = t end
  local usage = { tool_calls = 0, cost_micros = 0 }
  local s = { tools = self.tools, usage = usage }
  function s.call(tool_id, input, opts)
    opts = opts or {}
    local tool = by_id[tool_id]
    if not tool then errors.raise('INVALID_INPUT', 'there is no tool ' .. tostring(tool_id)) end
    local missing = missing_grants(env.allow, tool)
    if #missing > 0 then
      errors.raise('PERMISSION_DENIED', 'calling ' .. tool.id .. ' needs the grant'
        .. (#missing > 1 and 's ' or ' ') .. table.concat(missing, ', '))
    end
    local max_calls = env.limits.max_tool_calls
    if max_calls and usage.tool_calls >= max_calls then
      errors.raise('LIMIT_EXCEEDED', 'the session has made max_tool_calls (' .. max_calls .. ') calls')
    end
    local ok, parsed, err = tool.input:safe_parse(input)
    if not ok then errors.raise('INVALID_INPUT', err.message) end
    local cost = tool.exec_cost_micros or 0
    local budget = env.limits.max_cost_micros
    if budget and usage.cost_micros + cost > budget then
      errors.raise('BUDGET_EXCEEDED', 'the call to ' .. tool.id .. ' costs ' .. cost .. ' micros; '
        .. usage.cost_micros .. ' of max_cost_micros (' .. budget .. ') spent')
    end
    usage.tool_calls = usage.tool_calls + 1
    usage.cost_micros = usage.cost_micros + cost
    local result = tool.run(parsed, { run_id = id, tool_id = tool.id, call_id = opts.call_id, signal = opts.signal,
      progress = opts.progress })
    if type(result) == 'table' and cost > 0 then result.cost_micros = cost end
    return result
  end
  function s.close()
    env.sessions[id] = nil
    if env.per_run then env.per_run.release(id) end
  end
  self.sessions[id] = s
  return s
end

--- Closes every session (releasing their sandboxes).
function Env:close()
  local list = {}
  for _, s in pairs(self.sessions) do list[#list + 1] = s end
  for _, s in ipairs(list) do s.close() end
end

return M
