--- Benchmark of the agent runtime, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/runtime.lua [N] [M]
--
-- 1. The runtime's overhead per tool call: one run whose scripted model asks
--    for a trivial in-process tool N times (one call per step), against the
--    same model function and tool called directly in a loop. An iteration
--    is one model step plus one tool call with everything the runtime does
--    around them (grants, limits, schemas, budget, events, messages).
-- 2. The same for the exec tool against a bare `sandbox:exec` of the same
--    command, M times, in a sandbox of the local provider (or of the
--    host-directory provider of spec/support when the local one cannot run here).
package.path = package.path .. ';spec/?.lua'

local mayura = require('mayura')
local sandbox = require('mayura.sandbox')
local testing = require('mayura.testing')
local uv = require('luv')

local z = mayura.z
local N = tonumber(arg and arg[1]) or 5000
local M = tonumber(arg and arg[2]) or 300

package.path = 'bench/?.lua;' .. package.path
local median = require('_util').median

-- Runs `tool` `n` times through a runtime; returns the median time of an iteration, in µs.
local function through_runtime(tool, input, n, grants)
  local stamps = {}
  local i = 0
  local step = { type = 'tool_calls', usage = { cost_micros = 1 },
    calls = { { id = 'c', tool_id = tool.id, input = input } } }
  local final = { type = 'final', output = { done = true }, usage = { cost_micros = 1 } }
  local model = testing.scripted_model({})
  model.call = function(_, _)
    i = i + 1
    stamps[i] = uv.hrtime()
    if i > n then return final end
    return step
  end
  local agent = mayura.define_agent({
    id = 'bench', version = '1', instructions = 'Call the tool.', tools = { tool }, model = model,
    input = z.object({ task = z.string() }), output = z.object({ done = z.boolean() }),
  })
  local runtime = mayura.create_runtime({
    permissions = { allow = grants },
    limits = { max_steps = n + 1, max_tool_calls = n, max_cost_micros = 10 * n + 10, max_duration_ms = 600000 },
  })
  local outcome = runtime:submit(agent, { input = { task = 'go' } }):result()
  runtime:close()
  assert(outcome.status == 'succeeded', outcome.error and tostring(outcome.error))
  local deltas = {}
  for k = 2, #stamps do deltas[#deltas + 1] = (stamps[k] - stamps[k - 1]) / 1e3 end
  return median(deltas)
end

-- The same model function and tool called directly; median µs of an iteration.
local function bare(tool, input, n)
  local step = { type = 'tool_calls', usage = { cost_micros = 1 },
    calls = { { id = 'c', tool_id = tool.id, input = input } } }
  local model = function() return step end
  local xs = {}
  local last = uv.hrtime()
  for k = 1, n do
    local s = model()
    tool.run(s.calls[1].input, {})
    local now = uv.hrtime()
    xs[k] = (now - last) / 1e3
    last = now
  end
  return median(xs)
end

local rows = {}
local function row(name, us) rows[#rows + 1] = { name, us } end

-- 1. a trivial in-process tool
local trivial = {
  id = 'noop', description = 'Does nothing.', effect = 'read', capabilities = { 'bench:noop' },
  input = z.object({ text = z.string():max(100) }),
  run = function(input) return { text = input.text } end,
}
local grants = { 'model:scripted', 'tool:noop', 'bench:noop', 'effect:read' }
through_runtime(trivial, { text = 'hi' }, 200, grants)   -- warm up
local rt_trivial = through_runtime(trivial, { text = 'hi' }, N, grants)
local bare_trivial = bare(trivial, { text = 'hi' }, N)
row('in-process tool: through the runtime', rt_trivial)
row('in-process tool: called directly', bare_trivial)

-- 2. the exec tool against a bare sandbox:exec
local provider_name, provider = 'local', nil
local ok = pcall(function()
  provider = require('mayura.sandbox.local').local_sandboxes()
  local probe = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000 })
  probe:create({ lifetime_ms = 60000 }):release()
  probe:close()
end)
if not ok then
  provider_name = 'dir (spec/support, no isolation)'
  provider = require('support.dir_provider').dir_sandboxes()
end
local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
local sb = pool:create({ lifetime_ms = 600000 })
local exec = sandbox.sandbox_tools(sb, { name = 'workspace', exec = true })[3]
local exec_grants = { 'model:scripted', 'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write' }
for _ = 1, 10 do sb:exec({ 'sh', '-c', 'true' }) end
local xs = {}
for k = 1, M do
  local t0 = uv.hrtime()
  sb:exec({ 'sh', '-c', 'true' })
  xs[k] = (uv.hrtime() - t0) / 1e3
end
local bare_exec = median(xs)
local rt_exec = through_runtime(exec, { command = 'true' }, M, exec_grants)
row('exec tool: through the runtime', rt_exec)
row('exec: bare sandbox:exec', bare_exec)
sb:release()
pool:close()

print(('runtime benchmark: %d in-process calls, %d exec calls; sandbox provider: %s'):format(N, M, provider_name))
print(('%-44s %12s'):format('operation (median per call)', 'µs'))
for _, r in ipairs(rows) do print(('%-44s %12.1f'):format(r[1], r[2])) end
print()
print(('runtime overhead per in-process tool call  %8.1f µs   (%.1fx the direct call)'):format(
  rt_trivial - bare_trivial, rt_trivial / bare_trivial))
print(('runtime overhead per exec tool call        %8.1f µs   (%.3fx a bare sandbox:exec)'):format(
  rt_exec - bare_exec, rt_exec / bare_exec))
