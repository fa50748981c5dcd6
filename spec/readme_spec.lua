-- README.md: every ```lua block runs, in order, as one program with build/mayura, against the
-- local provider and (no OPENAI_API_KEY in its environment) the scripted model, so the tour
-- cannot rot. Lines outside the blocks become empty lines, so an error's line number is the
-- README's own. The blocks marked ```lua host (Embedding: a program that runs the loop itself)
-- run each on its own, under this pass's plain interpreter.
local process = require('mayura.process')

local README = 'README.md'
local HOST = require('support.compat').host
local compat = require('support.compat')

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('a')
  f:close()
  return s
end

-- The README's lua blocks as `{ first = line, code = text }`, and the whole program.
local function extract(text)
  local blocks, program, block = {}, {}, nil
  local n = 0
  for line in (text .. (text:sub(-1) == '\n' and '' or '\n')):gmatch('([^\n]*)\n') do
    n = n + 1
    if block then
      if line:match('^```%s*$') then
        blocks[#blocks + 1] = block
        block = nil
        program[n] = ''
      else
        block.lines[#block.lines + 1] = line
        program[n] = line
      end
    else
      if line:match('^```lua%s*$') then block = { first = n + 1, lines = {} } end
      program[n] = ''
    end
  end
  assert(block == nil, 'the ```lua block starting at line ' .. tostring(block and block.first) .. ' is not closed')
  for _, b in ipairs(blocks) do b.code = table.concat(b.lines, '\n') end
  return blocks, table.concat(program, '\n') .. '\n'
end

-- The environment of this process, without any model key.
local function env_without_keys()
  local env = {}
  for _, name in ipairs({ 'PATH', 'HOME', 'LANG', 'TMPDIR' }) do
    env[name] = os.getenv(name)
  end
  return env
end

describe('README.md', function()
  local text = read(README)
  local blocks, program = extract(text)

  it('keeps its two commands, the layout and the known limits', function()
    assert.truthy(text:find('make demo', 1, true))
    assert.truthy(text:find('make test', 1, true))
    assert.truthy(text:find('\n## Layout\n', 1, true))
    assert.truthy(text:find('\n### Known limits\n', 1, true))
  end)

  it('has the tour in the guide order, each section with its Lua', function()
    local last = 0
    for _, heading in ipairs({
      '### 1. A pool of sandboxes', '### 2. One sandbox per run', '### 3. The agent',
      '### 4. Permissions and limits', '### 5. The model', '### 6. Run it, and check the result yourself',
      '### 7. Test it offline',
    }) do
      local at = text:find('\n' .. heading .. '\n', 1, true)
      assert.truthy(at, heading)
      assert.is_true(at > last, heading .. ' comes after the section before it')
      local next_heading = text:find('\n##', at + 1, true) or #text
      assert.truthy(text:sub(at, next_heading):find('\n```lua\n', 1, true), heading .. ' has a lua block')
      last = at
    end
  end)

  it('has lua blocks that each parse on their own', function()
    assert.is_true(#blocks >= 9, 'found ' .. #blocks .. ' lua blocks')
    for _, b in ipairs(blocks) do
      local fn, err = load(b.code, '@README.md block at line ' .. b.first, 't')
      assert.is_not_nil(fn, err)
    end
  end)

  it('shows the example policy as it is in examples/policies/workspace.lua', function()
    local shown = text:match('\n```lua policy\n(.-)```\n')
    assert.truthy(shown, 'a ```lua policy block')
    local file = read('examples/policies/workspace.lua')
    assert.are.equal(file:sub((file:find("pool 'workspace'", 1, true))), shown)
  end)

  it('runs every lua block, in order, as one program', function()
    local runner = "local f = assert(load(io.read('a'), '@" .. README .. "', 't')); f()"
    local r = process.run({ HOST, '-e', runner }, {
      stdin = program, env = env_without_keys(), timeout_ms = 120000,
    })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    -- section 6: the agent's run succeeded and its files passed the re-check
    assert.truthy(r.stdout:find('Tests pass.', 1, true), r.stdout .. r.stderr)
    -- tasks and waiting, and the sandbox without an agent
    assert.truthy(r.stdout:find('1\n2\n3\n', 1, true), r.stdout)
    assert.truthy(r.stdout:find('0\thi from sandbox', 1, true), r.stdout)
    -- Policies: a session of the example policy, and a mistake with its file, line and key
    assert.truthy(r.stdout:find('hello from a policy\nINVALID_INPUT\ttrue\n', 1, true), r.stdout)
    assert.truthy(r.stdout:find("INVALID_CONFIG: typo.lua:1: pool 'w': unknown key 'netwrk'\n", 1, true), r.stdout)
  end)

  it('runs each embedding example (```lua host) as a program of its own that runs the loop', function()
    local hosted = {}
    local n, block = 0, nil
    for line in text:gmatch('([^\n]*)\n') do
      n = n + 1
      if block then
        if line:match('^```%s*$') then
          hosted[#hosted + 1] = block
          block = nil
        else
          block.lines[#block.lines + 1] = line
        end
      elseif line:match('^```lua host%s*$') then
        block = { first = n + 1, lines = {} }
      end
    end
    assert.is_true(#hosted >= 1, 'the Embedding section has a ```lua host block')
    for _, b in ipairs(hosted) do
      -- blank lines in front, so an error's line number is the README's own
      local code = string.rep('\n', b.first - 1) .. table.concat(b.lines, '\n')
      local r = process.run({ compat.lua, '-e', "local f = assert(load(io.read('*a'), '@README.md', 't')); f()" }, {
        stdin = code, timeout_ms = 60000,
        env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'),
          LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;tools/?.lua;;', LUA_CPATH = compat.cpath .. ';;' },
      })
      assert.are.equal(0, r.exit_code, 'block at line ' .. b.first .. ':\n' .. r.stdout .. r.stderr)
      assert.truthy(r.stdout:find('false\tINVALID_INPUT\n', 1, true), r.stdout)
      assert.truthy(r.stdout:find('built\ttrue\n', 1, true), r.stdout)
    end
  end)

  it('serves the example policy with the MCP client configuration it gives, through the official client', function()
    local at = text:find('\n## Use it from your agent\n', 1, true)
    assert.truthy(at, 'the MCP section')
    local section = text:sub(at, (text:find('\n## ', at + 1, true) or #text))
    assert.truthy(section:find('`examples/policies/workspace.lua`', 1, true))
    local config = section:match('\n```json\n(.-)\n```\n')
    assert.truthy(config:find('"serve", "--policy", "examples/policies/workspace.lua"', 1, true))
    local f = io.open('spec/npm/node_modules/@modelcontextprotocol/sdk/package.json', 'r')
    if not f then
      pending('needs node and @modelcontextprotocol/sdk in spec/npm (sh scripts/setup.sh installs them)')
      return
    end
    f:close()
    -- the configuration's command, for this pass's build
    config = config:gsub('"build/mayura"', '"' .. HOST .. '"')
    local env = env_without_keys()
    local r = process.run({ 'node', 'spec/npm/mcp_config_sdk.mjs', config }, { env = env, timeout_ms = 60000 })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local out = require('mayura.core').json.decode(r.stdout:match('([^\n]+)\n?$'))
    assert.are.same({ 'workspace.exec', 'workspace.list', 'workspace.read', 'workspace.remove', 'workspace.write' },
      out.tools)
    assert.are.equal('hello from the sandbox\nsandbox\n', out.stdout)
    assert.is_false(out.is_error)
  end)
end)
