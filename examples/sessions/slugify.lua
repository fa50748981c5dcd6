--- A recorded session of the coding agent, as data: the model's steps for the slugify task.
--
--   local session = dofile('examples/sessions/slugify.lua')
--   local model = require('mayura.testing').scripted_model(session.steps, { max_cost_micros = 40000 })
--
-- Written by hand in the shape of a real session: the model writes slugify.js
-- with a real bug (every separator becomes its own "-", and the ends are not
-- trimmed) and its tests, runs `node --test`, reads the failure, fixes the
-- function, runs the tests again and answers with a summary and its files.
--
-- The steps that come after a command are functions: they read the command's
-- real result in `request.messages` (the sandbox, the tools and node are
-- real) and raise when it is not what the session expects, so the session
-- cannot claim a failure or a pass that did not happen. Raising inside a
-- model step ends the run failed with MODEL_ERROR and this message.
--
-- `usage.cost_micros` of each step is illustrative: about what a step of that
-- size costs at the guide's example prices ($1.25 and $10 per million input
-- and output tokens). The run's budget counts it like a real model's cost.
--
-- Returns `{ task = ..., steps = { ... }, files = { ... } }`; `files` are the
-- final files, as the session's answer gives them.

local TASK = 'Write slugify(text) in slugify.js: lowercase, words joined by "-", only a-z and 0-9 kept.'
  .. ' Test it in slugify.test.js.'

local PACKAGE_JSON = [[
{
  "name": "slugify",
  "private": true,
  "type": "module"
}
]]

-- The first version: each character outside a-z and 0-9 becomes its own "-".
local SLUGIFY_FIRST = [[
/** Turns text into a slug: lowercase, only a-z and 0-9, words joined by "-". */
export function slugify(text) {
  return String(text).toLowerCase().replace(/[^a-z0-9]/g, '-');
}
]]

-- The fix: a run of other characters is one "-", and none is kept at either end.
local SLUGIFY_FIXED = [[
/** Turns text into a slug: lowercase, only a-z and 0-9, words joined by "-". */
export function slugify(text) {
  return String(text)
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '');
}
]]

local TESTS = [[
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { slugify } from './slugify.js';

test('lowercases and joins words with "-"', () => {
  assert.equal(slugify('Hello World'), 'hello-world');
});

test('keeps digits', () => {
  assert.equal(slugify('Route 66'), 'route-66');
});

test('collapses runs of separators', () => {
  assert.equal(slugify('Fish  &  Chips'), 'fish-chips');
});

test('trims separators at both ends', () => {
  assert.equal(slugify('  Hello, World!  '), 'hello-world');
});

test('gives an empty slug for text without letters or digits', () => {
  assert.equal(slugify('!?!'), '');
});
]]

local FILES = {
  { path = 'package.json', content = PACKAGE_JSON },
  { path = 'slugify.js', content = SLUGIFY_FIXED },
  { path = 'slugify.test.js', content = TESTS },
}

local function write(id, path, text)
  return { id = id, tool_id = 'workspace.write', input = { path = path, text = text } }
end

local function run_tests(id)
  return { id = id, tool_id = 'workspace.exec', input = { command = 'node --test' } }
end

local function calls(cost, list)
  return { type = 'tool_calls', usage = { cost_micros = cost }, calls = list }
end

local function fail(message)
  error('the recorded session expected ' .. message, 0)
end

-- The tool results the model was given since its last step, in order.
local function new_results(request)
  local out = {}
  local messages = request.messages
  for i = #messages, 1, -1 do
    local m = messages[i]
    if m.role ~= 'tool' then break end
    table.insert(out, 1, m)
  end
  return out
end

-- The result of the one command of the last step.
local function command_result(request)
  local results = new_results(request)
  local last = results[#results]
  if #results ~= 1 or last.tool_id ~= 'workspace.exec' or type(last.result) ~= 'table' then
    fail('the result of one workspace.exec call')
  end
  local r = last.result
  if r.error then fail('the tests to run, but the call failed: ' .. tostring(r.error.message)) end
  if r.timed_out then fail('the tests to finish, but they timed out') end
  return r, (r.stdout or '') .. '\n' .. (r.stderr or '')
end

local steps = {
  -- 1. A first version of the module, its tests and a package.json that makes .js files ES modules.
  calls(1900, {
    write('c1', 'package.json', PACKAGE_JSON),
    write('c2', 'slugify.js', SLUGIFY_FIRST),
    write('c3', 'slugify.test.js', TESTS),
  }),

  -- 2. The three files were written: run the tests.
  function(request)
    local results = new_results(request)
    if #results ~= 3 then fail('three write results, got ' .. #results) end
    for _, m in ipairs(results) do
      if type(m.result) ~= 'table' or m.result.error then
        fail('every write to succeed, but ' .. tostring(m.result and m.result.error and m.result.error.message))
      end
    end
    return calls(1100, { run_tests('c4') })
  end,

  -- 3. The tests fail: "Fish  &  Chips" gives "fish-----chips". Fix the function.
  function(request)
    local r, output = command_result(request)
    if r.exit_code == 0 then fail('the first test run to fail, but node --test exited 0') end
    if not output:find('collapses runs of separators', 1, true) or not output:find('fail [1-9]') then
      fail('the failing test "collapses runs of separators" in the output of node --test')
    end
    return calls(2600, { write('c5', 'slugify.js', SLUGIFY_FIXED) })
  end,

  -- 4. Run the tests again.
  function(request)
    local results = new_results(request)
    if #results ~= 1 or type(results[1].result) ~= 'table' or results[1].result.error then
      fail('the fixed slugify.js to be written')
    end
    return calls(1200, { run_tests('c6') })
  end,

  -- 5. They pass: answer with a summary and the final files.
  function(request)
    local r, output = command_result(request)
    if r.exit_code ~= 0 then fail('the second test run to pass, but node --test exited ' .. tostring(r.exit_code)) end
    if not output:find('pass 5', 1, true) or not output:find('fail 0', 1, true) then
      fail('five passing tests and none failing in the output of node --test')
    end
    return {
      type = 'final',
      usage = { cost_micros = 3400 },
      output = {
        summary = 'Wrote slugify(text) in slugify.js with five tests in slugify.test.js (node:test, node:assert).'
          .. ' The first version turned every character outside a-z and 0-9 into its own "-", so "Fish  &  Chips"'
          .. ' gave "fish-----chips" and the ends kept their dashes; three tests failed. It now replaces each run'
          .. ' of such characters with one "-" and trims them from both ends. All five tests pass with node --test.',
        files = FILES,
      },
    }
  end,
}

return { task = TASK, steps = steps, files = FILES }
