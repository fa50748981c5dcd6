-- mayura.sandbox.tools and mayura.sandbox.per_run, run by the runtime with a
-- scripted model against real sandboxes: the coding-agent guide's tests, each
-- limit, each missing grant, cancellation, isolation and the tools' results.
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')
local testing = require('mayura.testing')
local tools_mod = require('mayura.sandbox.tools')
local core = require('mayura.core')

local z = mayura.z
local json = core.json

-- The provider the sandboxes come from: the local namespace provider, or with
-- MAYURA_SPEC_PROVIDER=dir the one-file host-directory provider of
-- spec/support (no isolation, but real commands and files).
local PROVIDER = os.getenv('MAYURA_SPEC_PROVIDER') or 'local'

local function provider()
  if PROVIDER == 'local' then return require('mayura.sandbox.local').local_sandboxes() end
  return require('support.dir_provider').dir_sandboxes()
end

local pools = {}
local function pool(max)
  local p = sandbox.create_sandboxes(provider(), { max_sandboxes = max or 4, max_lifetime_ms = 600000 })
  pools[#pools + 1] = p
  return p
end

teardown(function()
  for _, p in ipairs(pools) do p:close() end
end)


local function includes(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

local function ids(tools)
  local out = {}
  for i, t in ipairs(tools) do out[i] = t.id end
  return out
end

-- Whether a process whose command line contains `pattern` is running on this machine.
-- Live processes only: a process killed when its sandbox ended may stay a zombie until the host's init reaps it.
local function running(pattern)
  return #require('support.util').procs_matching(pattern) > 0
end

-- A killed process can take a moment to leave the process table (its namespace is dying).
local function stopped(pattern)
  for _ = 1, 100 do
    if not running(pattern) then return true end
    mayura.sleep(20)
  end
  return false
end

local function exec_call(id, command, extra)
  local input = { command = command }
  for k, v in pairs(extra or {}) do input[k] = v end
  return { type = 'tool_calls', usage = { cost_micros = 0 },
    calls = { { id = id, tool_id = 'workspace.exec', input = input } } }
end

local function final(summary)
  return { type = 'final', output = { summary = summary or 'done' }, usage = { cost_micros = 0 } }
end

-- A model that runs `command` forever.
local function exec_forever(command, cost)
  local steps = {}
  for i = 1, 100 do
    steps[i] = exec_call('c' .. i, command)
    steps[i].usage.cost_micros = cost or 0
  end
  return steps
end

local GRANTS = {
  'model:scripted', 'tool:workspace.write', 'sandbox:workspace:write', 'tool:workspace.exec',
  'sandbox:workspace:exec', 'effect:write', 'tool:workspace.read', 'tool:workspace.list',
  'sandbox:workspace:read', 'effect:read',
}

local function without(grant)
  local out = {}
  for _, g in ipairs(GRANTS) do if g ~= grant then out[#out + 1] = g end end
  return out
end

local function with_grant(grant)
  local out = { grant }
  for _, g in ipairs(GRANTS) do out[#out + 1] = g end
  return out
end

-- A workspace: a pool, a per-run source, the tools and the hook that releases the run's sandbox.
local function workspace(options)
  options = options or {}
  local sandboxes = options.sandboxes or pool(options.max_sandboxes)
  local per_run = sandbox.sandbox_per_run(sandboxes, function(ctx)
    return { lifetime_ms = 600000, labels = { run = ctx.run_id } }
  end)
  local tool_options = { name = 'workspace', exec = true, write = true }
  for k, v in pairs(options.tools or {}) do tool_options[k] = v end
  local released = {}
  local release = mayura.define_hook({
    id = 'workspace.release', version = '1', stage = 'on_finally', timeout_ms = 30000,
    handler = function(event, context)
      released[#released + 1] = event.outcome.status
      per_run.release(context.run_id)
    end,
  })
  return {
    sandboxes = sandboxes,
    per_run = per_run,
    tools = sandbox.sandbox_tools(per_run.source, tool_options),
    release = release,
    released = released,
  }
end

local function coder(ws, model)
  return mayura.define_agent({
    id = 'coder', version = '1', instructions = 'Write and test code.', tools = ws.tools, model = model,
    hooks = { ws.release },
    input = z.object({ task = z.string() }), output = z.object({ summary = z.string() }),
  })
end

-- Runs `model` as the coder with `grants` and `limits`; returns the outcome, the run and its events.
local function run_coder(ws, model, grants, limits)
  local runtime = mayura.create_runtime({ profile = 'ephemeral', permissions = { allow = grants or GRANTS },
    limits = limits })
  local events = {}
  local run = runtime:submit(coder(ws, model), { input = { task = 't' }, on_event = function(e)
    events[#events + 1] = e
  end })
  local outcome = run:result()
  runtime:close()
  return outcome, run, events
end

local function count(events, type_, tool_id)
  local n = 0
  for _, e in ipairs(events) do
    if e.type == type_ and (tool_id == nil or e.tool_id == tool_id) then n = n + 1 end
  end
  return n
end

describe('sandbox_tools', function()
  describe('failure modes', function()
    it('refuses a bad source or bad options with INVALID_CONFIG', function()
      local sb = pool():create({ lifetime_ms = 60000 })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, nil, { name = 'w' })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, {}, { name = 'w' })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, nil)
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, {})
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'a.b' })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'a:b' })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = '' })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'w', execTimeoutMs = 5 })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'w', exec = 'yes' })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'w', exec_timeout_ms = 0 })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'w', exec_cost_micros = -1 })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, sb, { name = 'w', max_output_bytes = 0 })
      sb:release()
    end)
  end)

  it('gives reading tools by default and each further power by its option', function()
    local sb = pool():create({ lifetime_ms = 60000 })
    assert.are.same({ 'w.read', 'w.list' }, ids(sandbox.sandbox_tools(sb, { name = 'w' })))
    local all = sandbox.sandbox_tools(sb, { name = 'w', exec = true, write = true, ports = true, desktop = true,
      exec_cost_micros = 2000 })
    assert.are.same({ 'w.read', 'w.list', 'w.exec', 'w.write', 'w.remove', 'w.url', 'w.screenshot', 'w.click',
      'w.scroll', 'w.type', 'w.key' }, ids(all))
    local want = {
      ['w.read'] = { 'read', 'read' }, ['w.list'] = { 'read', 'read' }, ['w.exec'] = { 'exec', 'write' },
      ['w.write'] = { 'write', 'write' }, ['w.remove'] = { 'write', 'write' }, ['w.url'] = { 'ports', 'read' },
      ['w.screenshot'] = { 'desktop', 'read' }, ['w.click'] = { 'desktop', 'write' },
      ['w.scroll'] = { 'desktop', 'write' }, ['w.type'] = { 'desktop', 'write' }, ['w.key'] = { 'desktop', 'write' },
    }
    for _, t in ipairs(all) do
      assert.are.same({ 'sandbox:w:' .. want[t.id][1] }, t.capabilities)
      assert.are.equal(want[t.id][2], t.effect, t.id)
      assert.is_string(t.description)
      assert.are.equal('object', json.decode(json.encode(t.input:json_schema())).type)
    end
    assert.are.equal(2000, all[3].exec_cost_micros)
    -- tools from the per-run object itself, too
    local per_run = sandbox.sandbox_per_run(pool(), { lifetime_ms = 1000 })
    assert.are.equal(2, #sandbox.sandbox_tools(per_run, { name = 'w' }))
    sb:release()
  end)

  describe("the exec timeout and the pool's max_exec_timeout_ms", function()
    local function capped_pool(max)
      local p = sandbox.create_sandboxes(provider(), { max_sandboxes = 2, max_lifetime_ms = 600000,
        max_exec_timeout_ms = max })
      pools[#pools + 1] = p
      return p
    end
    local function exec_tool(tools)
      for _, t in ipairs(tools) do if t.id:match('%.exec$') then return t end end
    end

    it('an exec_timeout_ms given above the maximum is INVALID_CONFIG, at setup', function()
      local p = capped_pool(2000)
      local sb = p:create({ lifetime_ms = 60000 })
      local per_run = sandbox.sandbox_per_run(p, { lifetime_ms = 60000 })
      for _, source in ipairs({ sb, per_run.source, per_run }) do
        local err = assert.raises_code('INVALID_CONFIG', sandbox.sandbox_tools, source, { name = 'w', exec = true,
          exec_timeout_ms = 2001 })
        assert.matches('max_exec_timeout_ms %(2000%)', err.message)
        assert.are.equal(2000, exec_tool(sandbox.sandbox_tools(source, { name = 'w', exec = true,
          exec_timeout_ms = 2000 })).input:json_schema().properties.timeout_ms.maximum)
      end
      assert.are.equal(0, #per_run.runs)
      sb:release()
    end)

    it('the default of 5 minutes comes down to the maximum, and commands run', function()
      local p = capped_pool(2000)
      local sb = p:create({ lifetime_ms = 60000 })
      local tool = exec_tool(sandbox.sandbox_tools(sb, { name = 'w', exec = true }))
      assert.are.equal(2000, tool.input:json_schema().properties.timeout_ms.maximum)
      assert.matches('2000 by default', tool.input:json_schema().properties.timeout_ms.description)
      local r = tool.run(tool.input:parse({ command = 'echo ran' }), {})
      assert.are.same({ 0, 'ran\n', false }, { r.exit_code, r.stdout, r.timed_out })
      -- a pool with a larger maximum leaves the default alone
      local wide = capped_pool(600000)
      local per_run = sandbox.sandbox_per_run(wide, { lifetime_ms = 60000 })
      local wide_tool = exec_tool(sandbox.sandbox_tools(per_run.source, { name = 'w', exec = true }))
      assert.are.equal(300000, wide_tool.input:json_schema().properties.timeout_ms.maximum)
      sb:release()
    end)

    it('a source of your own is held to its pool at each call', function()
      local p = capped_pool(300)
      local sb = p:create({ lifetime_ms = 60000 })
      local own = { get = function() return sb end }
      local tool = exec_tool(sandbox.sandbox_tools(own, { name = 'w', exec = true }))
      local r = tool.run(tool.input:parse({ command = 'echo ran' }), { run_id = 'r' })
      assert.are.equal('ran\n', r.stdout)
      -- asked for 10 s, run for the pool's 300 ms at most
      r = tool.run(tool.input:parse({ command = 'sleep 5', timeout_ms = 10000 }), { run_id = 'r' })
      assert.is_true(r.timed_out)
      sb:release()
    end)

    it('in a run, the default exec tool works under a pool maximum of one minute', function()
      local ws = workspace({ sandboxes = capped_pool(60000) })
      local seen
      local outcome = run_coder(ws, testing.scripted_model({
        exec_call('c1', 'echo fine'),
        function(request)
          seen = request.messages[#request.messages].result
          return final()
        end,
      }))
      assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
      assert.are.equal('fine\n', seen.stdout)
    end)
  end)

  describe('against one sandbox', function()
    local sb, by_id
    local function call(id, input, context)
      local tool = by_id[id]
      return tool.run(tool.input:parse(input), context or {})
    end
    before_each(function()
      sb = pool():create({ lifetime_ms = 60000 })
      by_id = {}
      for _, t in ipairs(sandbox.sandbox_tools(sb, { name = 'w', exec = true, write = true, ports = true,
        max_output_bytes = 1000, max_read_bytes = 400, max_write_bytes = 5000, exec_timeout_ms = 2000 })) do
        by_id[t.id] = t
      end
    end)
    after_each(function() sb:release() end)

    describe('failure modes', function()
      it('refuses what the model can fix with INVALID_INPUT or NOT_FOUND', function()
        assert.raises_code('NOT_FOUND', call, 'w.read', { path = 'missing.txt' })
        assert.raises_code('NOT_FOUND', call, 'w.list', { path = 'missing' })
        assert.raises_code('INVALID_INPUT', call, 'w.write', { path = 'a' })
        assert.raises_code('INVALID_INPUT', call, 'w.write', { path = 'a', text = 'x', base64 = 'eA==' })
        assert.raises_code('INVALID_INPUT', call, 'w.write', { path = 'a', base64 = '!!' })
        assert.raises_code('INVALID_INPUT', call, 'w.write', { path = 'a', base64 = core.base64.encode(string.rep('x', 5001)) })
        call('w.write', { path = 'small', text = 'abc' })
        assert.raises_code('INVALID_INPUT', call, 'w.read', { path = 'small', offset = 4 })
        -- schemas refuse before anything runs
        local exec_input = by_id['w.exec'].input
        assert.raises_code('INVALID_INPUT', exec_input.parse, exec_input, { command = 'x', timeout_ms = 2001 })
        assert.raises_code('INVALID_INPUT', by_id['w.read'].input.parse, by_id['w.read'].input, { path = 'x', length = 401 })
        assert.raises_code('INVALID_INPUT', by_id['w.url'].input.parse, by_id['w.url'].input, { port = 0 })
      end)

      it('gives timed_out for a command past its timeout', function()
        local r = call('w.exec', { command = 'sleep 5', timeout_ms = 200 })
        assert.is_true(r.timed_out)
        assert.is_nil(r.exit_code)
      end)
    end)

    it('writes, reads, lists and removes files', function()
      assert.are.same({ path = 'd/a.txt', bytes = 5 }, call('w.write', { path = 'd/a.txt', text = 'hello' }))
      local r = call('w.read', { path = 'd/a.txt' })
      assert.are.same({ path = 'd/a.txt', size = 5, offset = 0, length = 5, eof = true, encoding = 'text',
        text = 'hello' }, r)
      local listing = call('w.list', { path = 'd' })
      assert.are.equal(1, #listing.entries)
      assert.are.equal('a.txt', listing.entries[1].name)
      assert.are.equal('file', listing.entries[1].type)
      assert.are.equal(5, listing.entries[1].size)
      assert.are.equal('d', call('w.list', {}).entries[1].name)
      assert.is_false(pcall(call, 'w.remove', { path = 'd' }))   -- not empty
      assert.are.same({ path = 'd', removed = true }, call('w.remove', { path = 'd', recursive = true }))
      assert.is_nil(sb:read_file('d/a.txt'))
    end)

    it('reads binary files as base64, in parts', function()
      local bytes = {}
      for i = 0, 1023 do bytes[#bytes + 1] = string.char(i % 256) end
      local data = table.concat(bytes)
      call('w.write', { path = 'blob.bin', base64 = core.base64.encode(data) })
      local parts, offset, reads = {}, 0, 0
      repeat
        local r = call('w.read', { path = 'blob.bin', offset = offset })
        reads = reads + 1
        assert.are.equal('base64', r.encoding)
        assert.is_nil(r.text)
        assert.are.equal(1024, r.size)
        assert.is_true(r.length <= 400)
        parts[#parts + 1] = core.base64.decode(r.base64)
        offset = r.next_offset
        assert.are.equal(r.eof, offset == nil)
      until r.eof
      assert.are.equal(3, reads)
      assert.are.equal(data, table.concat(parts))
      -- a length of its own
      local r = call('w.read', { path = 'blob.bin', offset = 1000, length = 10 })
      assert.are.same({ 1000, 10, false, 1010 }, { r.offset, r.length, r.eof, r.next_offset })
    end)

    it('reads text in parts that end between characters', function()
      local text = string.rep('é', 300)   -- 600 bytes
      call('w.write', { path = 'accents.txt', text = text })
      local r = call('w.read', { path = 'accents.txt', length = 201 })
      assert.are.equal('text', r.encoding)
      assert.are.equal(200, r.length)
      assert.are.equal(string.rep('é', 100), r.text)
      local rest = call('w.read', { path = 'accents.txt', offset = r.next_offset, length = 201 })
      assert.are.equal('text', rest.encoding)
      assert.are.equal(400, rest.next_offset)
      -- an offset inside a character gives bytes, as base64
      local odd = call('w.read', { path = 'accents.txt', offset = 1, length = 10 })
      assert.are.equal('base64', odd.encoding)
    end)

    it('cuts the middle out of long output, keeping its start and end', function()
      local r = call('w.exec', { command = 'printf "START"; head -c 5000 /dev/zero | tr "\\0" x; printf "END"; '
        .. 'echo oops >&2' })
      assert.are.equal(0, r.exit_code)
      assert.is_true(r.truncated)
      assert.are.equal('START', r.stdout:sub(1, 5))
      assert.are.equal('END', r.stdout:sub(-3))
      assert.matches('%[%.%.%. 4008 bytes left out %.%.%.%]', r.stdout)
      assert.is_true(#r.stdout < 1100)
      assert.are.equal('oops\n', r.stderr)
      call('w.write', { path = 'sub/x', text = '' })
      local short = call('w.exec', { command = 'echo hi; pwd', cwd = 'sub' })
      assert.are.equal('hi\n', short.stdout:sub(1, 3))
      assert.matches('/sub\n$', short.stdout)
      assert.are.same({ 0, '', false, false }, { short.exit_code, short.stderr, short.timed_out, short.truncated })
    end)

    it('gives text the model can read: invalid UTF-8 replaced, cuts between characters', function()
      assert.are.equal('a\239\191\189b', tools_mod.to_text('a\255b'))
      assert.are.equal('é', tools_mod.to_text('é'))
      local cut = tools_mod.cut_middle(string.rep('é', 100), 11)
      assert.is_true(tools_mod.is_text(cut))
      assert.is_false(tools_mod.is_text('a\0b'))
      assert.is_false(tools_mod.is_text('\237\160\128'))   -- a surrogate
    end)

    it('gives the URL of a port', function()
      local open = sandbox.create_sandboxes(provider(), { max_sandboxes = 1, max_lifetime_ms = 60000,
        network = { 'none', 'all' } })
      local server = open:create({ lifetime_ms = 60000, network = 'all', ports = { 3000 } })
      local url = sandbox.sandbox_tools(server, { name = 'w', ports = true })[3]
      assert.are.equal(server:url(3000), url.run({ port = 3000 }, {}).url)
      open:close()
    end)
  end)
end)

describe('sandbox_per_run', function()
  describe('failure modes', function()
    it('refuses a bad pool or bad options with INVALID_CONFIG', function()
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_per_run, nil, { lifetime_ms = 1000 })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_per_run, {}, { lifetime_ms = 1000 })
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_per_run, pool(), nil)
      assert.raises_code('INVALID_CONFIG', sandbox.sandbox_per_run, pool(), 'long')
    end)

    it('needs a run id, and shares a failed creation with everyone waiting for it', function()
      local p = pool()
      local per_run = sandbox.sandbox_per_run(p, { lifetime_ms = 600001 })   -- above the pool's maximum
      assert.raises_code('INVALID_INPUT', per_run.source.get, per_run.source, {})
      assert.raises_code('LIMIT_EXCEEDED', per_run.source.get, per_run.source, { run_id = 'r1' })
      assert.are.same({}, per_run.runs)
      local bad = sandbox.sandbox_per_run(p, function() return 'options' end)
      assert.raises_code('INVALID_CONFIG', bad.source.get, bad.source, { run_id = 'r1' })
      assert.are.equal(0, p:count())
    end)

    it('does nothing for the release of an unknown run', function()
      local per_run = sandbox.sandbox_per_run(pool(), { lifetime_ms = 60000 })
      per_run.release('nobody')
      per_run:release('nobody')
      assert.are.same({}, per_run.runs)
    end)
  end)

  it('creates the sandbox once, on first use, even for uses at the same time', function()
    local p = pool()
    local asked = {}
    local per_run = sandbox.sandbox_per_run(p, function(ctx)
      asked[#asked + 1] = ctx.run_id
      return { lifetime_ms = 60000 }
    end)
    assert.are.equal(0, p:count())
    local got = mayura.run(function()
      local tasks = {}
      for i = 1, 5 do tasks[i] = mayura.run(function() return per_run.source:get({ run_id = 'r1' }) end) end
      local out = {}
      for i, t in ipairs(tasks) do out[i] = t:wait() end
      return out
    end)
    for i = 2, 5 do assert.are.equal(got[1], got[i]) end
    assert.are.same({ 'r1' }, asked)
    assert.are.same({ 'r1' }, per_run.runs)
    assert.are.equal(1, p:count())
    local other = per_run.source.get({ run_id = 'r2' })
    assert.are_not.equal(got[1], other)
    assert.are.same({ 'r1', 'r2' }, per_run.runs)
    assert.are.equal(other, per_run.sandbox_of('r2'))
    per_run.release('r1')
    assert.are.same({ 'r2' }, per_run.runs)
    assert.is_nil(per_run.sandbox_of('r1'))
    assert.raises_code('SANDBOX_ERROR', got[1].exec, got[1], { 'true' })
    per_run:release('r2')
    assert.are.same({}, per_run.runs)
    assert.are.equal(0, p:count())
  end)
end)

describe('the coding-agent guide, section 7', function()
  local sandboxes = pool(2)
  local per_run = sandbox.sandbox_per_run(sandboxes, { lifetime_ms = 600000 })
  local tools = sandbox.sandbox_tools(per_run.source, { name = 'workspace', exec = true, write = true })
  local grants = { 'model:scripted', 'tool:workspace.write', 'sandbox:workspace:write', 'tool:workspace.exec',
    'sandbox:workspace:exec', 'effect:write' }
  local function agent(model)
    return mayura.define_agent({
      id = 'coder', version = '1', instructions = 'Write and test code.', tools = tools, model = model,
      input = z.object({ task = z.string() }), output = z.object({ summary = z.string() }),
    })
  end

  it('writes a file, runs it in the sandbox and reads the output', function()
    local last
    local model = testing.scripted_model({
      { type = 'tool_calls', usage = { cost_micros = 0 },
        calls = { { id = 'c1', tool_id = 'workspace.write',
          input = { path = 'add.js', text = 'console.log(2 + 3)' } } } },
      { type = 'tool_calls', usage = { cost_micros = 0 },
        calls = { { id = 'c2', tool_id = 'workspace.exec', input = { command = 'node add.js' } } } },
      function(request)
        last = request.messages[#request.messages]
        assert.are.equal('tool', last.role)
        assert.is_truthy(json.encode(last.result):find('"stdout":"5\\n"', 1, true))
        return { type = 'final', output = { summary = 'Printed 5.' }, usage = { cost_micros = 0 } }
      end,
    })
    local runtime = mayura.create_runtime({ profile = 'ephemeral', permissions = { allow = grants } })
    local run = runtime:submit(agent(model), { input = { task = 'Print 2 + 3.' } })
    local ok, err = pcall(function()
      local outcome = run:result()
      assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
      assert.are.equal('5\n', last.result.stdout)
      assert.is_true(includes(per_run.runs, run.id))
    end)
    runtime:close()
    per_run.release(run.id)
    assert(ok, err)
    assert.is_false(includes(per_run.runs, run.id))
    assert.are.equal(0, sandboxes:count())
  end)

  it('cannot run commands without the exec grant, and never creates a sandbox', function()
    local model = testing.scripted_model({
      { type = 'tool_calls', usage = { cost_micros = 0 },
        calls = { { id = 'c1', tool_id = 'workspace.exec', input = { command = 'id' } } } },
    })
    local allow = {}
    for _, g in ipairs(grants) do if g ~= 'sandbox:workspace:exec' then allow[#allow + 1] = g end end
    local runtime = mayura.create_runtime({ profile = 'ephemeral', permissions = { allow = allow } })
    local run = runtime:submit(agent(model), { input = { task = 'Who am I?' } })
    local ok, err = pcall(function()
      local outcome = run:result()
      assert.are.equal('blocked', outcome.status)
      assert.are.equal('PERMISSION_DENIED', outcome.error.code)
      assert.is_false(includes(per_run.runs, run.id))
    end)
    runtime:close()
    assert(ok, err)
    assert.are.equal(0, sandboxes:count())
  end)
end)

describe('a run in a sandbox', function()
  describe('failure modes: each missing grant ends it blocked, before any sandbox is made', function()
    local cases = {
      ['the tool'] = 'tool:workspace.exec',
      ['the capability'] = 'sandbox:workspace:exec',
      ['the effect'] = 'effect:write',
      ['the model'] = 'model:scripted',
    }
    for what, grant in pairs(cases) do
      it(what .. ' (' .. grant .. ')', function()
        local ws = workspace()
        local outcome, run, events = run_coder(ws, testing.scripted_model({ exec_call('c1', 'id'), final() }),
          without(grant))
        assert.are.equal('blocked', outcome.status)
        assert.are.equal('PERMISSION_DENIED', outcome.error.code)
        assert.matches(grant, outcome.error.message, 1, true)
        assert.is_false(includes(ws.per_run.runs, run.id))
        assert.are.equal(0, ws.sandboxes:count())
        assert.are.equal(0, count(events, 'tool_call_started'))
        assert.are.same({ 'blocked' }, ws.released)
      end)
    end

    it('a tool input that does not match goes back to the model, and no sandbox is made for it', function()
      local ws = workspace()
      local seen
      local outcome, run = run_coder(ws, testing.scripted_model({
        exec_call('c1', 42),
        function(request)
          seen = request.messages[#request.messages].result
          return final()
        end,
      }))
      assert.are.equal('succeeded', outcome.status)
      assert.are.same({ error = { code = 'INVALID_INPUT', message = 'command: expected a string, got number' } }, seen)
      assert.is_false(includes(ws.per_run.runs, run.id))
      assert.are.equal(0, ws.sandboxes:count())
    end)

    it('a final answer that does not match is rejected, and the sandbox still released', function()
      local ws = workspace()
      local outcome = run_coder(ws, testing.scripted_model({
        exec_call('c1', 'echo hi'),
        { type = 'final', output = { summary = 5 } },
      }))
      assert.are.equal('failed', outcome.status)
      assert.are.equal('INVALID_OUTPUT', outcome.error.code)
      assert.is_nil(outcome.output)
      assert.are.equal(0, ws.sandboxes:count())
      assert.are.same({ 'failed' }, ws.released)
    end)
  end)

  describe('limits', function()
    it('max_steps: a model that keeps running commands is stopped', function()
      local ws = workspace()
      local outcome, _, events = run_coder(ws, testing.scripted_model(exec_forever('true')), nil, { max_steps = 4 })
      assert.are.equal('failed', outcome.status)
      assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
      assert.matches('max_steps', outcome.error.message)
      assert.are.equal(4, count(events, 'tool_call_ended', 'workspace.exec'))
      assert.are.equal(0, ws.sandboxes:count())
    end)

    it('max_model_calls', function()
      local ws = workspace()
      local model = testing.scripted_model(exec_forever('true'))
      local outcome = run_coder(ws, model, nil, { max_model_calls = 3 })
      assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
      assert.matches('max_model_calls', outcome.error.message)
      assert.are.equal(3, model.calls)
      assert.are.equal(0, ws.sandboxes:count())
    end)

    it('max_tool_calls: the call that would pass it is not made', function()
      local ws = workspace()
      local outcome, _, events = run_coder(ws, testing.scripted_model(exec_forever('echo run >> log')), nil,
        { max_tool_calls = 5 })
      assert.are.equal('failed', outcome.status)
      assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
      assert.matches('max_tool_calls', outcome.error.message)
      assert.are.equal(5, count(events, 'tool_call_started', 'workspace.exec'))
      assert.are.equal(5, outcome.usage.tool_calls)
      local reached
      for _, e in ipairs(events) do if e.type == 'limit_reached' then reached = e.limit end end
      assert.are.equal('max_tool_calls', reached)
      assert.are.equal(0, ws.sandboxes:count())
    end)

    it('max_duration_ms: the running command is stopped and the sandbox released by on_finally', function()
      local ws = workspace()
      local marker = 'sleep 30.' .. math.random(100000, 999999)
      local started = core.hrtime_ms()
      local outcome, _, events = run_coder(ws, testing.scripted_model({ exec_call('c1', marker), final() }), nil,
        { max_duration_ms = 500 })
      local took = core.hrtime_ms() - started
      assert.are.equal('failed', outcome.status)
      assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
      assert.matches('max_duration_ms', outcome.error.message)
      assert.is_true(took >= 490, 'took ' .. took)
      assert.are.equal(1, count(events, 'tool_call_started', 'workspace.exec'))
      local gone = stopped(marker)
      assert.is_true(gone)
      assert.are.equal(0, ws.sandboxes:count())
      assert.are.same({}, ws.per_run.runs)
      assert.are.same({ 'failed' }, ws.released)
    end)

    it('max_cost_micros: a model call whose reservation would pass the limit is not made', function()
      local ws = workspace()
      -- each model call reserves 1500 and costs 1000: the fifth would reserve up to 5500 of 5000
      local model = testing.scripted_model(exec_forever('true', 1000), { max_cost_micros = 1500 })
      local outcome, _, events = run_coder(ws, model, nil, { max_cost_micros = 5000 })
      assert.are.equal('failed', outcome.status)
      assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
      assert.matches('model call', outcome.error.message)
      assert.are.equal(4, model.calls)
      assert.are.equal(4000, outcome.usage.cost_micros)
      assert.are.equal(4, count(events, 'tool_call_ended', 'workspace.exec'))
      assert.are.equal(0, ws.sandboxes:count())
    end)

    it('max_cost_micros: a command whose exec_cost_micros would pass the limit is not run', function()
      local ws = workspace({ tools = { exec_cost_micros = 2000 } })
      local outcome, _, events = run_coder(ws, testing.scripted_model(exec_forever('echo once >> log')), nil,
        { max_cost_micros = 5000 })
      assert.are.equal('failed', outcome.status)
      assert.are.equal('BUDGET_EXCEEDED', outcome.error.code)
      assert.matches('workspace.exec', outcome.error.message)
      assert.are.equal(2, count(events, 'tool_call_started', 'workspace.exec'))
      assert.are.equal(4000, outcome.usage.cost_micros)
      assert.are.equal(0, ws.sandboxes:count())
    end)
  end)

  it('a command\'s output reaches the run\'s listeners as it comes (tool_output events), within max_output_bytes',
    function()
      local ws = workspace({ tools = { max_output_bytes = 6 } })
      local outcome, _, events = run_coder(ws, testing.scripted_model({
        exec_call('c1', 'echo one; sleep 0.1; echo two >&2; echo three'), final() }))
      assert.are.equal('succeeded', outcome.status)
      local kinds, out, err = {}, {}, {}
      for _, e in ipairs(events) do
        if e.type == 'tool_output' then
          assert.are.equal('workspace.exec', e.tool_id)
          assert.are.equal('c1', e.call_id)
          table.insert(e.stream == 'stdout' and out or err, e.text)
        end
        if e.type:match('^tool_') then kinds[#kinds + 1] = e.type end
      end
      assert.are.equal('one\nth', table.concat(out))
      assert.are.equal('two\n', table.concat(err))
      assert.are.equal('tool_call_started', kinds[1])
      assert.are.equal('tool_output', kinds[2])
      assert.are.equal('tool_call_ended', kinds[#kinds])
    end)

  it('run:cancel() during a command stops it, ends cancelled, and on_finally releases the sandbox', function()
    local ws = workspace()
    local marker = 'sleep 31.' .. math.random(100000, 999999)
    local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
    local started_command = false
    local run = runtime:submit(coder(ws, testing.scripted_model({ exec_call('c1', marker), final() })),
      { input = { task = 't' }, on_event = function(e)
        if e.type == 'tool_call_started' then started_command = true end
      end })
    while not started_command do mayura.sleep(10) end
    mayura.sleep(200)
    assert.is_true(running(marker))
    run:cancel()
    local outcome = run:result()
    assert.are.equal('cancelled', outcome.status)
    assert.are.equal('CANCELLED', outcome.error.code)
    assert.is_true(stopped(marker))
    assert.are.equal(0, ws.sandboxes:count())
    assert.are.same({ 'cancelled' }, ws.released)
    runtime:close()
  end)

  describe('what the sandbox refuses goes back to the model, and the run goes on', function()
    -- a model that makes `calls` one step at a time, keeping the result each gave, then answers
    local function one_by_one(calls, results)
      local steps = {}
      for i, c in ipairs(calls) do
        steps[i] = function(request)
          if i > 1 then results[i - 1] = request.messages[#request.messages].result end
          return { type = 'tool_calls', usage = { cost_micros = 0 },
            calls = { { id = 'c' .. i, tool_id = 'workspace.' .. c[1], input = c[2] } } }
        end
      end
      steps[#steps + 1] = function(request)
        results[#calls] = request.messages[#request.messages].result
        return final('reacted')
      end
      return testing.scripted_model(steps)
    end

    it('a read-only path, a full workspace, a missing and an unreadable file', function()
      if PROVIDER ~= 'local' then
        pending('needs the local provider: a read-only root and a workspace of a given size')
        return
      end
      local sized = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes({ workspace_mib = 1 }),
        { max_sandboxes = 1, max_lifetime_ms = 600000 })
      pools[#pools + 1] = sized
      local ws = workspace({ sandboxes = sized })
      local results = {}
      local outcome, _, events = run_coder(ws, one_by_one({
        { 'write', { path = '/usr/x', text = 'x' } },
        { 'exec', { command = 'head -c 700000 /dev/zero > fill && echo filled' } },
        { 'write', { path = 'big.txt', text = string.rep('y', 500000) } },
        { 'read', { path = 'missing.txt' } },
        { 'exec', { command = 'echo secret > locked && chmod 000 locked' } },
        { 'read', { path = 'locked' } },
        { 'remove', { path = '/usr/bin/env' } },
        { 'exec', { command = 'rm fill && echo still here' } },
      }, results), with_grant('tool:workspace.remove'))
      assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
      assert.are.same({ summary = 'reacted' }, outcome.output)
      -- each refusal came back as the call's result, with its code and our message
      assert.are.equal('PERMISSION_DENIED', results[1].error.code)
      assert.matches('does not allow', results[1].error.message)
      assert.are.equal('filled\n', results[2].stdout)
      assert.are.equal('LIMIT_EXCEEDED', results[3].error.code)
      assert.matches('no space left', results[3].error.message)
      assert.are.equal('NOT_FOUND', results[4].error.code)
      assert.are.equal(0, results[5].exit_code)
      assert.are.equal('PERMISSION_DENIED', results[6].error.code)
      assert.are.equal('PERMISSION_DENIED', results[7].error.code)
      -- and the sandbox went on working after them
      assert.are.equal('still here\n', results[8].stdout)
      assert.is_nil(results[1].error.tool_error)   -- the mark stays between the tools and the run
      assert.are.equal(8, outcome.usage.tool_calls)
      local failed = 0
      for _, e in ipairs(events) do
        if e.type == 'tool_call_ended' and not e.ok then failed = failed + 1 end
      end
      assert.are.equal(5, failed)
      assert.are.same({ 'succeeded' }, ws.released)
    end)

    it('a pool at max_sandboxes is a tool error too; the run limits still end the run', function()
      local full = pool(1)
      local holder = full:create({ lifetime_ms = 60000 })
      local ws = workspace({ sandboxes = full })
      local results = {}
      local outcome = run_coder(ws, one_by_one({ { 'exec', { command = 'true' } } }, results))
      assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
      assert.are.equal('LIMIT_EXCEEDED', results[1].error.code)
      assert.matches('max_sandboxes', results[1].error.message)
      holder:release()
      -- the run's own limit, reached while the sandbox answers, is still the run's outcome
      outcome = run_coder(ws, testing.scripted_model(exec_forever('true')), nil, { max_tool_calls = 2 })
      assert.are.equal('failed', outcome.status)
      assert.are.equal('LIMIT_EXCEEDED', outcome.error.code)
      assert.matches('max_tool_calls', outcome.error.message)
    end)
  end)

  it('succeeds and releases its sandbox', function()
    local ws = workspace()
    local outcome = run_coder(ws, testing.scripted_model({
      { type = 'tool_calls', calls = {
        { id = 'w', tool_id = 'workspace.write', input = { path = 'src/a.txt', text = 'alpha' } },
        { id = 'r', tool_id = 'workspace.read', input = { path = 'src/a.txt' } },
        { id = 'l', tool_id = 'workspace.list', input = { path = 'src' } },
      } },
      function(request)
        local m = request.messages
        assert.are.equal('alpha', m[#m - 1].result.text)
        assert.are.equal('a.txt', m[#m].result.entries[1].name)
        return final('read it')
      end,
    }))
    assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
    assert.are.same({ summary = 'read it' }, outcome.output)
    assert.are.equal(0, ws.sandboxes:count())
    assert.are.same({ 'succeeded' }, ws.released)
  end)

  it('20 runs at once each get a sandbox of their own, and their commands run at the same time', function()
    local ws = workspace({ max_sandboxes = 25 })
    local function model(n)
      local me = 'run ' .. n
      return testing.scripted_model({
        { type = 'tool_calls', calls = { { id = 'w', tool_id = 'workspace.write',
          input = { path = 'mine.txt', text = me } } } },
        exec_call('e', 'sleep 1; ls -A; cat mine.txt'),
        function(request)
          local r = request.messages[#request.messages].result
          -- only its own file, with its own content
          assert.are.equal('mine.txt\n' .. me, r.stdout)
          return final(me)
        end,
      })
    end
    -- how many of the runs' commands were running at once, from the order of their events
    local at_once, most = 0, 0
    local function go(n)
      local runtime = mayura.create_runtime({ permissions = { allow = GRANTS } })
      local runs = {}
      for i = 1, n do
        runs[i] = runtime:submit(coder(ws, model(i)), { input = { task = 't' }, on_event = function(e)
          if e.tool_id == 'workspace.exec' and e.type == 'tool_call_started' then
            at_once = at_once + 1
            most = math.max(most, at_once)
          elseif e.tool_id == 'workspace.exec' and e.type == 'tool_call_ended' then
            at_once = at_once - 1
          end
        end })
      end
      local outcomes = {}
      for i, r in ipairs(runs) do outcomes[i] = r:result() end
      runtime:close()
      return outcomes
    end
    local outcomes = go(20)
    for i, o in ipairs(outcomes) do
      assert.are.equal('succeeded', o.status, o.error and tostring(o.error))
      assert.are.equal('run ' .. i, o.output.summary)
    end
    -- nothing serialises the runs: their one-second commands overlap (the timing itself is bench/'s)
    assert.are.equal(0, at_once)
    assert.is_true(most >= 10, most .. ' commands at most ran at once')
    assert.are.equal(0, ws.sandboxes:count())
    assert.are.same({}, ws.per_run.runs)
  end)
end)
