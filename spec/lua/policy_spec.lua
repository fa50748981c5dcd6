-- mayura.policy: policy files checked completely at load (one spec per kind of mistake, each with its
-- exact message), the environment they run in, a policy that grants nothing, `--policy` through the
-- host program, and the session seam end to end on the local provider (real sandboxes).
local mayura = require('mayura')
local policy_mod = require('mayura.policy')
local process = require('mayura.process')
local task = require('mayura._task')

local HOST = require('support.compat').host

-- A policy given as text; `files` may hold several { name, source }.
local function load_src(src, name)
  return mayura.load_policy({ name = name or 'p.lua', source = src })
end

-- The INVALID_CONFIG message loading `src` gives.
local function mistake(src)
  local err = assert.raises_code('INVALID_CONFIG', load_src, src)
  return err.message, err
end

local POOL = [[
pool 'workspace' { provider = 'local', max_sandboxes = 4, max_lifetime_ms = 600000 }
tools 'workspace' { exec = true, write = true }
]]

local ALL_GRANTS = [[
    'tool:workspace.read', 'tool:workspace.list', 'sandbox:workspace:read', 'effect:read',
    'tool:workspace.write', 'tool:workspace.remove', 'sandbox:workspace:write',
    'tool:workspace.exec', 'sandbox:workspace:exec', 'effect:write',
]]

describe('policy files: each mistake stops the load with file, line and key', function()
  it('a syntax error', function()
    assert.are.equal("p.lua:3: syntax error: '}' expected (to close '{' at line 2) near 'max_lifetime_ms'",
      mistake("-- a pool\npool 'w' { provider = 'local', max_sandboxes = 1\n max_lifetime_ms = 1 }"))
  end)

  it('an unknown key, with its line and the key as a field', function()
    local msg, err = mistake(POOL .. "agent 'coder' {\n  tools = { 'workspace' },\n  allwo = {},\n}")
    assert.are.equal("p.lua:3: agent 'coder': unknown key 'allwo'", msg)
    assert.are.same({ 'p.lua', 3, 'allwo' }, { err.file, err.line, err.key })
  end)

  it('an unknown key inside a nested table', function()
    assert.are.equal("p.lua:1: pool 'w': unknown key 'sandbox.lifetime'", mistake(
      "pool 'w' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 1000, sandbox = { lifetime = 1 } }"))
    assert.are.equal("p.lua:3: agent 'a': unknown key 'limits.max_calls'", mistake(POOL
      .. "agent 'a' { limits = { max_calls = 3 } }"))
  end)

  it('a wrong type', function()
    assert.are.equal("p.lua:1: pool 'w': wrong type (a whole number expected, got string) for 'max_sandboxes'",
      mistake("pool 'w' { provider = 'local', max_sandboxes = '4', max_lifetime_ms = 1000 }"))
    assert.are.equal("p.lua:3: tools 'x': wrong type (a boolean expected, got number) for 'exec'",
      mistake(POOL .. "tools 'x' { pool = 'workspace', exec = 1 }"))
    assert.are.equal("p.lua:1: hook 'h': wrong type (a function expected, got string) for 'handler'",
      mistake("hook 'h' { stage = 'on_start', handler = 'print' }"))
  end)

  it('a missing key', function()
    assert.are.equal("p.lua:1: pool 'w': missing key 'max_lifetime_ms'",
      mistake("pool 'w' { provider = 'local', max_sandboxes = 1 }"))
  end)

  it('a grant for a tool that does not exist, or that the agent does not have', function()
    assert.are.equal("p.lua:3: agent 'coder': grant for unknown tool 'tool:workspace.rm'",
      mistake(POOL .. "agent 'coder' { tools = { 'workspace' }, allow = { 'tool:workspace.rm' } }"))
    assert.are.equal("p.lua:4: agent 'coder': grant for a tool not in its tools 'tool:clock'",
      mistake(POOL .. "tool 'clock' { effect = 'read', run = function() return {} end }\n"
        .. "agent 'coder' { tools = { 'workspace' }, allow = { 'tool:clock' } }"))
    assert.are.equal("p.lua:3: agent 'coder': grant for unknown sandbox tools 'sandbox:workspace:delete'",
      mistake(POOL .. "agent 'coder' { tools = { 'workspace' }, allow = { 'sandbox:workspace:delete' } }"))
    assert.are.equal("p.lua:3: agent 'coder': grant for unknown sandbox tools 'sandbox:workspace:ports'",
      mistake(POOL .. "agent 'coder' { tools = { 'workspace' }, allow = { 'sandbox:workspace:ports' } }"))
    assert.are.equal("p.lua:3: agent 'coder': unknown grant 'network:all'",
      mistake(POOL .. "agent 'coder' { tools = { 'workspace' }, allow = { 'network:all' } }"))
  end)

  it('a hook on an unknown stage', function()
    assert.are.equal("p.lua:1: hook 'cleanup': unknown stage 'on_end' in 'stage'",
      mistake("hook 'cleanup' { stage = 'on_end', handler = function() end }"))
  end)

  it('an unknown pool, tool, hook or agent', function()
    assert.are.equal("p.lua:1: tools 'files': unknown pool 'files' in 'pool'",
      mistake("tools 'files' { write = true }"))
    assert.are.equal("p.lua:3: agent 'a': unknown tool 'clock' in 'tools'",
      mistake(POOL .. "agent 'a' { tools = { 'workspace', 'clock' } }"))
    assert.are.equal("p.lua:3: agent 'a': unknown hook 'cleanup' in 'hooks'",
      mistake(POOL .. "agent 'a' { hooks = { 'cleanup' } }"))
    assert.are.equal("p.lua:4: serve: unknown agent 'coder' in 'agent'",
      mistake(POOL .. "agent 'a' {}\nserve { agent = 'coder' }"))
    assert.are.equal("p.lua:1: pool 'w': unknown provider 'nowhere' in 'provider'",
      mistake("pool 'w' { provider = 'nowhere', max_sandboxes = 1, max_lifetime_ms = 1000 }"))
  end)

  it('a value the pool, the provider or the tools refuse', function()
    assert.are.equal("p.lua:1: pool 'w': max_sandboxes must be at least 1",
      mistake("pool 'w' { provider = 'local', max_sandboxes = 0, max_lifetime_ms = 1000 }"))
    assert.are.equal("p.lua:1: pool 'w': unknown option colour in local_sandboxes options",
      mistake("pool 'w' { provider = 'local', provider_options = { colour = 'red' }, max_sandboxes = 1,"
        .. ' max_lifetime_ms = 1000 }'))
    assert.are.equal("p.lua:1: pool 'w': network 'all' is not in the pool's network in 'sandbox.network'",
      mistake("pool 'w' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 1000,"
        .. " sandbox = { network = 'all' } }"))
  end)

  it('a name declared twice, across files', function()
    local err = assert.raises_code('INVALID_CONFIG', mayura.load_policy, {
      { name = 'a.lua', source = POOL },
      { name = 'b.lua', source = "\ntool 'workspace' { effect = 'read', run = function() end }" },
    })
    assert.are.equal("b.lua:2: tool 'workspace': declared twice (first at a.lua:2)", err.message)
  end)

  it('a declaration without its table, and bytecode', function()
    assert.are.equal("p.lua:2: hook 'h': no table after the name", mistake("local x = 1\nhook 'h'"))
    assert.are.equal('p.lua:1: a policy file must be Lua source, not bytecode',
      mistake(string.dump(function() end)))
  end)

  it('a file that cannot be read', function()
    local err = assert.raises_code('INVALID_CONFIG', mayura.load_policy, 'spec/no/such/policy.lua')
    assert.truthy(err.message:find('^spec/no/such/policy.lua: cannot read the policy file'), err.message)
  end)
end)

describe('policy files: the environment they run in', function()
  it('has no os.execute, io, load, debug, package or getmetatable, and requires only mayura.z', function()
    for _, expr in ipairs({ "os.execute('true')", "io.popen('id')", "io.open('/tmp/x', 'w')", "load('x = 1')",
      'debug.getinfo(1)', "package.loadlib('x', 'y')", "getmetatable('').__index.x = 1", "dofile('/etc/passwd')",
      "loadfile('/etc/passwd')", 'collectgarbage()' }) do
      local msg = mistake('local ok = true\n' .. expr)
      assert.truthy(msg:find('^p%.lua:2: '), expr .. ': ' .. msg)
    end
    assert.are.equal("p.lua:1: a policy may require only 'mayura.z', not 'mayura.sandbox'",
      mistake("local s = require('mayura.sandbox')"))
    assert.are.equal("p.lua:1: a policy may require only 'mayura.z', not 'os'", mistake("require('os')"))
    assert.are.equal('p.lua:1: z cannot be changed here', mistake('z.string = nil'))
  end)

  it('keeps its globals and its changes to string, table and math to itself', function()
    load_src("leaked = 1\nstring.leaked = 1\ntable.insert = nil\nmath.pi = 3\nos.getenv = nil\n"
      .. "local s = require('mayura.z').string()\nassert(('x'):upper() == 'X')")
    assert.is_nil(rawget(_G, 'leaked'))
    assert.is_nil(rawget(string, 'leaked'))
    assert.is_function(table.insert)
    assert.is_true(math.pi > 3.14)
    assert.is_function(os.getenv)
  end)

  it('keeps its functions in it when they run: a tool has no io and no os.execute', function()
    local p = load_src(POOL .. [[
tool 'probe' {
  effect = 'read',
  run = function() return { io = type(io), execute = type(os.execute), time = type(os.time()) } end,
}
agent 'a' { tools = { 'probe' }, allow = { 'tool:probe', 'effect:read' } }
]])
    local env = p:open()
    local s = env:session('s1')
    assert.are.same({ io = 'nil', execute = 'nil', time = 'number' }, s.call('probe', {}))
    -- a declaration from a function that runs later is refused
    local q = load_src("tool 'late' { effect = 'read', run = function() pool 'x' {} end }\n"
      .. "agent 'a' { tools = { 'late' }, allow = { 'tool:late', 'effect:read' } }")
    local qenv = q:open()
    local err = assert.raises_code('TOOL_ERROR', qenv:session('q').call, 'late', {})
    assert.truthy(err.message:find('declarations are made only while the policy loads', 1, true), err.message)
    qenv:close()
    s.close()
    env:close()
  end)
end)

describe('policy files: every mistake keeps its file and line', function()
  local dir

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    dir = dir .. '-a-directory-with-a-rather-long-name/and-one-more-level-below-it'
    assert(os.execute('mkdir -p ' .. dir))
  end)

  teardown(function() os.execute('rm -rf ' .. dir:match('^(.-)/and%-one') ) end)

  local function file_mistake(name, text)
    local path = dir .. '/' .. name
    local f = assert(io.open(path, 'w'))
    f:write(text)
    f:close()
    assert.is_true(#path >= 60)
    local err = assert.raises_code('INVALID_CONFIG', mayura.load_policy, path)
    assert.are.equal(path, err.file)
    return err.message:sub(#path + 2), err
  end

  it('at a path of 60 characters or more', function()
    -- (LuaJIT quotes <eof>)
    assert.truthy(file_mistake('syntax.lua', "local a = 1\npool 'x' {\n"):find("^3: syntax error: unexpected symbol near '?<eof>"))
    assert.truthy(file_mistake('index.lua', "local t\nlocal y = t.x\n"):find('^2: attempt to index'))
    assert.are.equal("2: boom", file_mistake('raise.lua', "local function f()\n  error('boom')\nend\nf()\n"))
    assert.are.equal("2: pool 'w': unknown key 'netwrk'", file_mistake('key.lua',
      "-- a pool\npool 'w' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 1000, netwrk = 1 }\n"))
  end)

  it('whatever the policy raised: a table without __tostring, one whose __tostring fails, a coded error', function()
    local msg = file_mistake('table.lua', "local t = {}\n\nerror({})\n")
    assert.are.equal('3: an error without a message (a table)', msg)
    msg = file_mistake('tostring.lua',
      "local x = 1\nerror(setmetatable({ code = 'MY_CODE' }, { __tostring = function() error('no') end }))\n")
    assert.are.equal('2: MY_CODE', msg)
    msg = file_mistake('coded.lua', "local s = z.string()\nlocal t = s:max('x')\n")
    assert.are.equal('2: max expects a whole number at least 0', msg)
    msg = file_mistake('message.lua', "error({ code = 'TIMEOUT', message = 'too slow' })\n")
    assert.are.equal('1: TIMEOUT: too slow', msg)
    msg = file_mistake('number.lua', "error(42)\n")
    assert.are.equal('1: 42', msg)
  end)

  it('a directory or a missing file is a clear error, from load_policy and from mayura serve', function()
    local err = assert.raises_code('INVALID_CONFIG', mayura.load_policy, dir)
    assert.are.equal(dir .. ': cannot read the policy file (Is a directory)', err.message)
    err = assert.raises_code('INVALID_CONFIG', mayura.load_policy, dir .. '/none.lua')
    assert.truthy(err.message:find('cannot read the policy file (No such file or directory)', 1, true), err.message)
    local r = process.run({ HOST, 'serve', '--policy', dir }, { timeout_ms = 30000 })
    assert.are.equal(1, r.exit_code)
    assert.truthy(r.stderr:find('INVALID_CONFIG: ' .. dir .. ': cannot read the policy file (Is a directory)', 1, true),
      r.stderr)
    assert.is_nil(r.stderr:find('traceback', 1, true))
  end)
end)

describe('policy files: a policy that grants nothing', function()
  it('blocks every tool, before any sandbox is made', function()
    local p = load_src(POOL .. "tool 'clock' { effect = 'read', run = function() return { t = 1 } end }\n"
      .. "agent 'a' { tools = { 'workspace', 'clock' } }")
    local env = p:open()
    local s = env:session('nothing')
    assert.are.equal(0, #s.tools)   -- nothing it may call is listed
    assert.are.equal(6, #s.declared)
    for _, t in ipairs(s.declared) do
      local err = assert.raises_code('PERMISSION_DENIED', s.call, t.id, { path = 'x', command = 'true', text = '' })
      assert.truthy(err.message:find('^calling ' .. t.id:gsub('%p', '%%%0') .. ' needs the grant'), err.message)
    end
    assert.are.equal(0, env:pool('workspace'):count())
    -- and a run: its model call needs a grant too
    local outcome = env:run('a', {}, require('mayura.testing').scripted_model({ { type = 'final', output = 'x' } }))
    assert.are.equal('blocked', outcome.status)
    assert.are.equal('PERMISSION_DENIED', outcome.error.code)
    s.close()
    env:close()
  end)
end)

describe('policy files: the session seam on the local provider', function()
  local env
  local events = {}
  local p = load_src(POOL .. [[
tool 'clock' {
  description = 'The time.',
  input = z.object({ plus = z.integer():optional() }),
  effect = 'read',
  exec_cost_micros = 100,
  run = function(input) return { t = 1000 + (input.plus or 0) } end,
}
hook 'no_rm' {
  stage = 'before_tool_call',
  handler = function(event)
    if event.tool_id == 'workspace.exec' and event.input.command:find('rm -rf', 1, true) then
      return { deny = 'no rm -rf' }
    end
  end,
}
local closed = {}
hook 'bye' { stage = 'on_finally', handler = function(_, context) closed[#closed + 1] = context.run_id end }
tool 'closed' { effect = 'read', run = function() return { ids = closed } end }
agent 'coder' {
  tools = { 'workspace', 'clock', 'closed' },
  allow = { 'tool:clock', 'tool:closed', ]] .. ALL_GRANTS .. [[ },
  limits = { max_tool_calls = 8 },
  budget = { max_cost_micros = 250 },
  hooks = { 'no_rm', 'bye' },
}
serve { agent = 'coder', max_sessions = 2 }
]])

  before_each(function() env = p:open() end)
  after_each(function() env:close() end)

  it('lists the tools with their schemas, and serves the serve agent', function()
    assert.are.same({ agent = 'coder', max_sessions = 2, file = 'p.lua', line = 31 }, p.serve)
    local s = env:session('a', { on_event = function(e) events[#events + 1] = e.type end })
    local ids = {}
    for i, t in ipairs(s.tools) do ids[i] = t.id end
    assert.are.same({ 'workspace.read', 'workspace.list', 'workspace.exec', 'workspace.write', 'workspace.remove',
      'clock', 'closed' }, ids)
    assert.are.equal('object', s.tools[6].input_schema.type)
    assert.are.equal('The time.', s.tools[6].description)
    assert.are.same({ t = 1005 }, s:call('clock', { plus = 5 }))
    s.close()
    assert.truthy(#events > 0)
  end)

  it('gives each session a sandbox of its own, released at close', function()
    local a, b = env:session('a'), env:session('b')
    assert.are.equal(11, a.call('workspace.write', { path = 'note.txt', text = 'only for a\n' }).bytes)
    assert.are.equal('only for a\n', a.call('workspace.exec', { command = 'cat note.txt' }).stdout)
    local err = assert.raises_code('NOT_FOUND', b.call, 'workspace.read', { path = 'note.txt' })
    assert.is_true(err.tool_error)
    assert.are.equal(2, env:pool('workspace'):count())
    a.close()
    assert.are.equal(1, env:pool('workspace'):count())
    b.close()
    assert.are.equal(0, env:pool('workspace'):count())
  end)

  it('holds a session to its limits, budget, hooks and max_sessions; a refusal does not end it', function()
    local s = env:session('a')
    assert.are.same({ t = 1000 }, s.call('clock', {}))                                   -- 1 call, 100 spent
    assert.are.same({ t = 1000 }, s.call('clock', {}))                                   -- 2, 200
    local err = assert.raises_code('BUDGET_EXCEEDED', s.call, 'clock', {})               -- 3: 300 > 250
    assert.truthy(err.message:find('max_cost_micros (250)', 1, true), err.message)
    err = assert.raises_code('INVALID_INPUT', s.call, 'clock', { plus = 'x' })           -- 4
    assert.is_true(err.tool_error)
    err = assert.raises_code('PERMISSION_DENIED', s.call, 'workspace.exec', { command = 'rm -rf /tmp/x' })  -- 5
    assert.are.equal('hook no_rm denied the call: no rm -rf', err.message)
    assert.are.equal('ok\n', s.call('workspace.exec', { command = 'echo ok' }).stdout)  -- 6
    assert.are.equal('.', s.call('workspace.list', {}).path)                              -- 7
    assert.raises_code('NOT_FOUND', s.call, 'workspace.read', { path = 'missing' })      -- 8
    err = assert.raises_code('LIMIT_EXCEEDED', s.call, 'workspace.exec', { command = 'true' })
    assert.are.equal('max_tool_calls (8) reached: the call to workspace.exec was not made', err.message)
    assert.are.same({ steps = 0, model_calls = 0, tool_calls = 8, cost_micros = 200 }, s.usage)
    -- max_sessions
    local b = env:session('b')
    assert.raises_code('LIMIT_EXCEEDED', env.session, env, 'c')
    assert.raises_code('INVALID_INPUT', env.session, env, 'b')
    s.close()
    local c = env:session('c')
    local ids = c.call('closed', {}).ids
    assert.are.equal('a', ids[#ids])   -- the on_finally hook ran at close, with the session's id
    b.close()
    c.close()
    assert.raises_code('CANCELLED', c.call, 'clock', {})
  end)

  it('cancels a running command through its signal, and a close stops what is still running', function()
    local s = env:session('a')
    local token = mayura.cancel_token()
    local results = mayura.run(function()
      local slow = task.spawn(function()
        return pcall(s.call, 'workspace.exec', { command = 'sleep 30' }, { signal = token })
      end)
      local other = task.spawn(function()
        return pcall(s.call, 'workspace.exec', { command = 'sleep 31' })
      end)
      task.sleep(300)
      token:cancel()
      local ok1, err1 = slow:wait()
      s.close()
      local ok2, err2 = other:wait()
      return { ok1, err1, ok2, err2 }
    end)
    assert.is_false(results[1])
    assert.are.equal('CANCELLED', results[2].code)
    assert.is_false(results[3])
    assert.are.equal('CANCELLED', results[4].code)
    assert.are.equal(0, env:pool('workspace'):count())
  end)
end)

describe('policy files: --policy in the host program', function()
  local APP = "local p = require('mayura').policy(); print(p and table.concat(p.agents, ',') or 'none')"
  local function host(args)
    return process.run(args, { timeout_ms = 60000 })
  end

  it('loads and merges the files before the script, which has them as mayura.policy()', function()
    assert.are.equal(policy_mod.load_policy, mayura.load_policy)
    assert.is_nil(mayura.policy())   -- no --policy here
    local both = mayura.load_policy({ 'examples/policies/coding.lua',
      { name = 'more.lua', source = "hook 'log' { stage = 'on_start', handler = function() end }" } })
    assert.are.same({ 'examples/policies/coding.lua', 'more.lua' }, both.files)
    assert.are.same({ kind = 'hook', name = 'log', file = 'more.lua', line = 1 }, both:where('hook', 'log'))
    local r = host({ HOST, '--policy', 'examples/policies/workspace.lua', '-e', APP })
    assert.are.equal(0, r.exit_code, r.stderr)
    assert.are.equal('workspace\n', r.stdout)
    r = host({ HOST, '-e', APP })
    assert.are.equal('none\n', r.stdout)
  end)

  it('stops at a mistake with its message and exit code 1, running nothing', function()
    local dir = os.tmpname()
    os.remove(dir)
    local bad = dir .. '.lua'
    local f = assert(io.open(bad, 'w'))
    f:write("agent 'workspace' {}\n")
    f:close()
    local r = host({ HOST, '--policy', 'examples/policies/workspace.lua', '--policy', bad, '-e', "print('ran')" })
    os.remove(bad)
    assert.are.equal(1, r.exit_code)
    assert.are.equal('', r.stdout)
    assert.truthy(r.stderr:find('mayura: INVALID_CONFIG: ' .. bad .. ":1: agent 'workspace': declared twice "
      .. '(first at examples/policies/workspace.lua:25)\n', 1, true), r.stderr)
    r = host({ HOST, '--policy' })
    assert.are.equal(2, r.exit_code)
  end)

  it('runs the coding agent in its policy-file form', function()
    local r = process.run({ HOST, '--policy', 'examples/policies/coding.lua', 'examples/coding_agent.lua' }, {
      env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME') }, timeout_ms = 120000 })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stdout:find('Policy: examples/policies/coding.lua', 1, true), r.stdout)
    assert.truthy(r.stdout:find('\nVerdict: the re%-check passed'), r.stdout)
    assert.truthy(r.stderr:find('policy: ran node --test, exit 0', 1, true), r.stderr)
    r = process.run({ HOST, '--policy', 'examples/policies/coding.lua', 'examples/coding_agent.lua',
      '--provider', 'docker' }, { timeout_ms = 60000 })
    assert.are.equal(2, r.exit_code, r.stdout .. r.stderr)
  end)
end)
