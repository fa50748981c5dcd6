--- mayura.sandbox.per_run: a sandbox for each run, made the first time one of its tools needs it.
--
--   local per_run = sandbox.sandbox_per_run(sandboxes, function(ctx)
--     return { lifetime_ms = 900000, labels = { run = ctx.run_id } }
--   end)
--   local tools = sandbox.sandbox_tools(per_run.source, { name = 'workspace', exec = true })
--   local release = mayura.define_hook{ id = 'workspace.release', version = '1', stage = 'on_finally',
--     handler = function(_, context) per_run.release(context.run_id) end }
--
-- `source:get(context)` gives the sandbox of `context.run_id`, creating it
-- (with the options, or what the function gives for `{ run_id = ... }`) the
-- first time; calls that come while it is being created wait for that one
-- creation. `release(run_id)` releases the run's sandbox and forgets the run
-- (after a creation under way has finished); an unknown run does nothing.
-- `runs` is a plain list of the run ids that have a sandbox now; `source.pool`
-- is the pool (sandbox_tools reads its limits).
-- `release` and `source.get` may be called with `.` or `:`.
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

local function remove_value(list, v)
  for i = #list, 1, -1 do
    if list[i] == v then table.remove(list, i) end
  end
end

--- `{ source, release(run_id), runs }` over the pool `sandboxes`.
function M.sandbox_per_run(sandboxes, options)
  if type(sandboxes) ~= 'table' or type(sandboxes.create) ~= 'function' then
    errors.raise('INVALID_CONFIG', 'sandbox_per_run expects a pool from create_sandboxes', nil, 2)
  end
  local make
  if type(options) == 'function' then
    make = options
  elseif type(options) == 'table' then
    local fixed = {}
    for k, v in pairs(options) do fixed[k] = v end
    make = function() return fixed end
  else
    errors.raise('INVALID_CONFIG', 'sandbox_per_run expects create options (with lifetime_ms) or a function', nil, 2)
  end

  local self = { runs = {} }
  local entries = {}   -- run_id -> { sandbox, waiters, creating }

  local function create(run_id, entry)
    local ok, res = pcall(function()
      local opts = make({ run_id = run_id })
      if type(opts) ~= 'table' then
        errors.raise('INVALID_CONFIG', 'the sandbox_per_run function must return create options')
      end
      return sandboxes:create(opts)
    end)
    entry.creating = false
    if ok then
      entry.sandbox = res
      table.insert(self.runs, run_id)
    else
      entry.error = res
      if entries[run_id] == entry then entries[run_id] = nil end
    end
    local waiters = entry.waiters
    entry.waiters = {}
    for _, w in ipairs(waiters) do w() end
    if not ok then error(res, 0) end
    return res
  end

  local function wait_for(entry)
    if entry.creating then
      task.await(function(done) table.insert(entry.waiters, done) end)
    end
  end

  local source = { pool = sandboxes }

  --- The sandbox of `context.run_id`, created on first use.
  function source.get(a, b)
    local context = b
    if a ~= source then context = a end
    if type(context) ~= 'table' or type(context.run_id) ~= 'string' or context.run_id == '' then
      errors.raise('INVALID_INPUT', 'a per-run sandbox needs context.run_id', nil, 2)
    end
    local run_id = context.run_id
    local entry = entries[run_id]
    if entry then
      wait_for(entry)
      if entry.sandbox then return entry.sandbox end
      if entry.error then error(entry.error, 0) end
    end
    entry = { creating = true, waiters = {} }
    entries[run_id] = entry
    return create(run_id, entry)
  end

  --- Releases the run's sandbox and forgets the run. An unknown run does nothing.
  function self.release(a, b)
    local run_id = b
    if a ~= self then run_id = a end
    local entry = entries[run_id]
    if not entry then return end
    wait_for(entry)
    if entries[run_id] == entry then entries[run_id] = nil end
    remove_value(self.runs, run_id)
    if entry.sandbox then entry.sandbox:release() end
  end

  --- The run's sandbox when it has one, without creating it.
  function self.sandbox_of(a, b)
    local run_id = b
    if a ~= self then run_id = a end
    local entry = entries[run_id]
    return entry and entry.sandbox or nil
  end

  self.source = source
  return self
end

return M
