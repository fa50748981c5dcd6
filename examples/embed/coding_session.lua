--- The coding agent's recorded session as a piece any host can run: Neovim's :MayuraRun, the C
-- game host (examples/embed/game.c) and the LÖVE game (examples/embed/love/) all load this file.
--
--   local session = dofile(root .. '/examples/embed/coding_session.lua')
--   local verdict = session.run({ root = root, print = function(line) ... end })  -- inside a task
--
-- The same pieces as examples/coding_agent.lua with the recorded session of
-- examples/sessions/slugify.lua played by the scripted model: a pool of local
-- sandboxes, one sandbox per run, the workspace tools, the permissions and
-- the budget, then a re-check of the returned files in a fresh sandbox.
-- `run` waits, so it must be called inside a task (mayura.run): under a host
-- that runs the loop it never blocks the host. Each line of progress goes to
-- `options.print` as soon as it happens. Returns true when the re-check passed.
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')

local z = mayura.z

local M = {}

local EXEC_COST_MICROS = 2000

local function dollars(micros)
  return string.format('$%.4f', micros / 1e6)
end

-- The run's events as lines of progress.
local function progress(say)
  local pending, spent = {}, 0
  return function(event)
    local t = event.type
    if t == 'model_call_ended' then
      spent = event.total_cost_micros or spent
      say(string.format('model call: %s, so far %s', event.step_type == 'final' and 'final answer'
        or event.ok and 'asked for tools' or 'failed', dollars(spent)))
    elseif t == 'tool_call_started' then
      local input = type(event.input) == 'table' and event.input or {}
      pending[event.call_id or ''] = event.tool_id == 'workspace.exec' and ('$ ' .. tostring(input.command))
        or (event.tool_id .. (input.path and (' ' .. tostring(input.path)) or ''))
      say(pending[event.call_id or ''] .. ' ...')
    elseif t == 'tool_call_ended' then
      local what = pending[event.call_id or ''] or event.tool_id
      local result = event.exit_code ~= nil and ('exit ' .. tostring(event.exit_code))
        or (event.ok and 'ok' or tostring(event.summary))
      say(what .. '  -> ' .. result)
    end
  end
end

--- Runs the recorded session once; see the file's comment. Options: `root` (the checkout),
-- `print` (a function given each line), `provider` (a sandbox provider; the local one by default).
function M.run(options)
  local say = options.print or print
  local session = assert(loadfile(options.root .. '/examples/sessions/slugify.lua', 't'))()
  local model = require('mayura.testing').scripted_model(session.steps, { max_cost_micros = 40000 })
  local provider = options.provider or require('mayura.sandbox.local').local_sandboxes()
  local sandboxes = sandbox.create_sandboxes(provider, {
    max_sandboxes = 2, max_lifetime_ms = 10 * 60000, max_exec_timeout_ms = 5 * 60000,
  })
  local per_run = sandbox.sandbox_per_run(sandboxes, function(ctx)
    return { lifetime_ms = 5 * 60000, labels = { run = ctx.run_id } }
  end)
  local tools = sandbox.sandbox_tools(per_run.source, {
    name = 'workspace', exec = true, write = true, exec_timeout_ms = 120000, exec_cost_micros = EXEC_COST_MICROS,
  })
  local release = mayura.define_hook({
    id = 'workspace.release', version = '1', stage = 'on_finally', timeout_ms = 30000,
    handler = function(_, context) per_run.release(context.run_id) end,
  })
  local coder = mayura.define_agent({
    id = 'coder', version = '1', tools = tools, model = model, hooks = { release },
    input = z.object({ task = z.string():max(4000) }),
    output = z.object({
      summary = z.string():max(2000),
      files = z.array(z.object({ path = z.string():max(200), content = z.string():max(50000) })):min(1):max(10),
    }),
    instructions = { 'You write small JavaScript modules and their tests in the workspace sandbox.' },
  })
  local runtime = mayura.create_runtime({
    profile = 'ephemeral',
    permissions = { allow = {
      'model:' .. model.id, 'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read',
      'tool:workspace.write', 'tool:workspace.remove', 'sandbox:workspace:write',
      'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
    } },
    limits = { max_steps = 24, max_model_calls = 24, max_tool_calls = 40, max_duration_ms = 10 * 60000,
      max_cost_micros = 600000 },
  })
  say('Task: ' .. session.task)
  local passed = false
  local ok, err = pcall(function()
    local outcome = runtime:submit(coder, { input = { task = session.task }, on_event = progress(say) }):result()
    say(string.format('Run %s: %d model calls, %d tool calls, %s.', outcome.status, outcome.usage.model_calls,
      outcome.usage.tool_calls, dollars(outcome.usage.cost_micros)))
    if outcome.status ~= 'succeeded' then
      say('Verdict: the run did not succeed (' .. tostring(outcome.error and outcome.error.code) .. ').')
      return
    end
    -- the agent's word does not count: its files, a fresh sandbox, a fixed command, no model
    local sb = sandboxes:create({ lifetime_ms = 5 * 60000 })
    local checked, res = pcall(function()
      for _, file in ipairs(outcome.output.files) do sb:write_file(file.path, file.content) end
      return sb:exec({ 'node', '--test' }, { timeout_ms = 60000 })
    end)
    sb:release()
    if not checked then error(res, 0) end
    passed = res.exit_code == 0
    say(passed and 'Verdict: the re-check passed (node --test exited 0).'
      or ('Verdict: the re-check failed (node --test exited ' .. tostring(res.exit_code) .. ').'))
  end)
  runtime:close()
  sandboxes:close()
  if not ok then error(err, 0) end
  return passed
end

return M
