--- mayura.testing: a model that plays back scripted steps, for tests without a model key.
--
--   local model = testing.scripted_model({
--     { type = 'tool_calls', usage = { cost_micros = 0 },
--       calls = { { id = 'c1', tool_id = 'workspace.exec', input = { command = 'id' } } } },
--     function(request)
--       local last = request.messages[#request.messages]   -- { role = 'tool', result = { ... } }
--       return { type = 'final', output = { summary = 'done' }, usage = { cost_micros = 0 } }
--     end,
--   }, { max_cost_micros = 0 })
--
-- Its id is 'scripted', so a run needs the grant `model:scripted`. Each call
-- plays the next step: a table is given as a copy, a function is called with
-- the request and gives the step. A call past the last step fails with
-- MODEL_ERROR. `max_cost_micros` (0 by default) is what each call reserves
-- against a run's budget. `model.calls` counts the calls made, and
-- `model.requests` keeps each request.
local errors = require('mayura.errors')
local check = require('mayura._check')

local M = {}

local function copy(v)
  if type(v) ~= 'table' then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = copy(x) end
  return setmetatable(out, getmetatable(v))
end

local Scripted = {}
Scripted.__index = Scripted

--- Plays the next step.
function Scripted:call(request)
  local i = self.calls + 1
  self.calls = i
  self.requests[i] = request
  local step = self.steps[i]
  if step == nil then
    errors.raise('MODEL_ERROR', 'the scripted model has no step ' .. i .. ' (it has ' .. #self.steps .. ')')
  end
  if type(step) == 'function' then return step(request) end
  return copy(step)
end

--- A model that plays `steps` in order; options `{ max_cost_micros = 0, id = 'scripted' }`.
function M.scripted_model(steps, options)
  if type(steps) ~= 'table' then errors.raise('INVALID_CONFIG', 'scripted_model expects a list of steps') end
  local n = #steps
  for k in pairs(steps) do
    if not check.is_int(k) or k < 1 or k > n then
      errors.raise('INVALID_CONFIG', 'scripted_model expects a list of steps')
    end
  end
  local list = {}
  for i, step in ipairs(steps) do
    if type(step) ~= 'table' and type(step) ~= 'function' then
      errors.raise('INVALID_CONFIG', 'step ' .. i .. ' must be a table or a function')
    end
    list[i] = step
  end
  options = options or {}
  check.keys(options, { max_cost_micros = true, id = true }, 'scripted_model options', 'INVALID_CONFIG', 3)
  local id = options.id or 'scripted'
  if type(id) ~= 'string' or id == '' then errors.raise('INVALID_CONFIG', 'id must be a non-empty string') end
  return setmetatable({
    id = id,
    max_cost_micros = check.int(options.max_cost_micros, 'max_cost_micros', 0, nil, 'INVALID_CONFIG', 3, 0),
    steps = list,
    calls = 0,
    requests = {},
  }, Scripted)
end

return M
