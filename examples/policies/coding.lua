--- The coding agent's policy: its pool, its workspace tools, its grants, limits and budget.
--
--   build/mayura --policy examples/policies/coding.lua examples/coding_agent.lua
--
-- examples/coding_agent.lua then takes all of this from the policy instead of its own code; the
-- model (a real one with OPENAI_API_KEY, else the recorded session) still comes from the script,
-- and so does the grant for it: the policy grants both model ids the script may use.

pool 'workspace' {
  provider = 'local',
  max_sandboxes = 4,               -- at most four alive at once
  max_lifetime_ms = 30 * 60000,    -- no sandbox lives longer than 30 minutes
  max_exec_timeout_ms = 5 * 60000,
  network = { 'none' },            -- no sandbox of this pool reaches the network
  sandbox = { lifetime_ms = 15 * 60000 },
}

tools 'workspace' {
  exec = true,                     -- workspace.exec: run shell commands
  write = true,                    -- workspace.write and workspace.remove
  exec_timeout_ms = 120000,        -- no command runs longer than 2 minutes
  exec_cost_micros = 2000,         -- each command is charged $0.002 against the run's budget
}

hook 'log_commands' {
  stage = 'after_tool_call',
  timeout_ms = 1000,
  handler = function(event)
    if event.tool_id == 'workspace.exec' then
      print('policy: ran ' .. tostring(event.input.command) .. ', exit ' .. tostring(event.result.exit_code))
    end
  end,
}

local z = require('mayura.z')

agent 'coder' {
  version = '1',
  input = z.object({ task = z.string():max(4000) }),
  output = z.object({
    summary = z.string():max(2000),
    files = z.array(z.object({ path = z.string():max(200), content = z.string():max(50000) })):min(1):max(10),
  }),
  instructions = {
    'You write small JavaScript modules and their tests in the workspace sandbox, an isolated Linux machine'
      .. ' with Node.js.',
    'Write ES modules with the .js extension, and tests in files ending .test.js that use node:test and'
      .. ' node:assert.',
    'Run the tests with workspace.exec and the command "node --test". Read the output, fix the code, and run'
      .. ' them again until they pass.',
    'The sandbox has no network: do not try to install packages; use only the Node.js standard library.',
    'Answer with a short summary and the final content of every file you wrote.',
  },
  tools = { 'workspace' },
  hooks = { 'log_commands' },
  allow = {
    'model:scripted', 'model:openai.responses', 'model:openai.chat',
    'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read',
    'tool:workspace.write', 'tool:workspace.remove', 'sandbox:workspace:write',
    'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
  },
  limits = { max_steps = 24, max_model_calls = 24, max_tool_calls = 40, max_duration_ms = 10 * 60000 },
  budget = { max_cost_micros = 600000 },   -- at most $0.60 per run, model calls and commands together
}
