--- mayura.mcp.policy: the tool sessions `mayura serve` gives, from policy files (mayura.policy).
--
--   local env = require('mayura.mcp.policy').open({ 'examples/policies/workspace.lua' })
--   env.max_sessions; env:session(id) -> { tools, call, close, usage }; env:close()
--
-- The files are loaded and checked completely (`mayura.load_policy`) before
-- anything listens; their `serve { agent = ..., max_sessions = n }` names the
-- agent whose tools, grants, limits and budget every MCP session gets (a
-- policy without `serve` and with one agent serves that agent). Each session
-- is `env:session(id)` of the policy: a sandbox of its own on first use,
-- released by `close`. A command's output as it comes (the run's `tool_output`
-- events) reaches its call's progress notifications as their `message`.
local errors = require('mayura.errors')
local policy_mod = require('mayura.policy')

local M = {}

--- Opens the environment of one or more policy files.
function M.open(paths)
  if type(paths) == 'string' then paths = { paths } end
  if type(paths) ~= 'table' or #paths == 0 then
    errors.raise('INVALID_CONFIG', 'mayura serve needs at least one policy file', nil, 2)
  end
  local policy = policy_mod.load_policy(#paths == 1 and paths[1] or paths)
  local env = policy:open()
  local max = policy.serve and policy.serve.max_sessions or 16
  return {
    max_sessions = max,
    session = function(_, id)
      -- a command's output as it comes (the run's tool_output events) goes to its call's progress
      local progress_of = {}
      local s = env:session(id, { on_event = function(event)
        local progress = event.type == 'tool_output' and progress_of[event.call_id]
        if progress then progress(nil, nil, event.text) end
      end })
      return {
        tools = s.tools, declared = s.declared, usage = s.usage,
        call = function(tool_id, input, opts)
          local call_id = opts and opts.call_id
          if call_id and opts.progress then progress_of[call_id] = opts.progress end
          local ok, res = pcall(s.call, tool_id, input, { signal = opts and opts.signal, call_id = call_id })
          if call_id then progress_of[call_id] = nil end
          if not ok then error(res, 0) end
          return res
        end,
        close = function() return s.close() end,
      }
    end,
    close = function() env:close() end,
  }
end

return M
