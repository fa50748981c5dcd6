-- docs/: each page's ```lua blocks run, in order, as one program with build/mayura (the setup
-- of spec/readme_spec.lua: the local provider, no model key), so the reference cannot rot; a
-- page's ```lua host blocks run each on its own under this pass's plain interpreter, the policy it
-- shows is the example file, a ```lua cluster block (it needs a cluster) compiles, and the MCP
-- client configuration it gives is served. Every relative link of the README and of docs/ leads to a file and a heading that exist.
local markdown = require('support.markdown')
local compat = require('support.compat')

local read = markdown.read

local function pages()
  local out = {}
  for page in compat.shell('ls docs/*.md'):gmatch('[^\n]+') do out[#out + 1] = page end
  return out
end

-- What each page's program prints, in part.
local PRINTS = {
  ['docs/host.md'] = { '1\n2\n3\n' },
  ['docs/sandboxes.md'] = { '0\thi from sandbox', 'local\tnone\nfalse\tINVALID_INPUT\t../local\n' },
  ['docs/policies.md'] = { 'hello from a policy\nINVALID_INPUT\ttrue\n',
    "INVALID_CONFIG: typo.lua:1: pool 'w': unknown key 'netwrk'\n" },
  ['docs/snapshots.md'] = { '42\t41\n', 'answer.txt\n' },
  ['docs/writing-a-provider.md'] = { 'hello\nfrom the host\n', 'a.txt\n' },
  ['docs/desktop.md'] = { '800\t600\n', 'PNG\n', ':0\n' },
}

describe('docs/', function()
  it('has a page for each part of the reference', function()
    local have = {}
    for _, page in ipairs(pages()) do have[page] = true end
    for _, name in ipairs({ 'providers', 'network', 'desktop', 'embedding', 'policies', 'serve', 'security',
      'performance', 'known-limits', 'snapshots', 'status' }) do
      assert.is_true(have['docs/' .. name .. '.md'] == true, 'docs/' .. name .. '.md')
    end
  end)

  it('has links that lead to a file and a heading that exist', function()
    local all = pages()
    table.insert(all, 1, 'README.md')
    for _, page in ipairs(all) do
      local dir = page:match('^(.*/)') or ''
      for _, link in ipairs(markdown.links(read(page))) do
        local target = link.target == '' and page or dir .. link.target
        local f = io.open(target, 'rb')
        assert.is_not_nil(f, page .. ' links to ' .. target)
        f:close()
        if link.anchor then
          assert.is_true(markdown.slugs(read(target))[link.anchor] == true,
            page .. ' links to ' .. target .. '#' .. link.anchor)
        end
      end
    end
  end)

  for _, page in ipairs(pages()) do
    local text = read(page)
    local blocks, program = markdown.lua_program(text)
    if #blocks > 0 then
      it(page .. ': its lua blocks run, in order, as one program', function()
        for _, b in ipairs(blocks) do
          local fn, err = load(b.code, '@' .. page .. ' block at line ' .. b.first, 't')
          assert.is_not_nil(fn, err)
        end
        local r = markdown.run(page, program)
        assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
        for _, want in ipairs(PRINTS[page] or {}) do
          assert.truthy(r.stdout:find(want, 1, true), r.stdout)
        end
      end)
    end
  end

  it('compiles the ```lua cluster blocks (code that needs a cluster to run)', function()
    local n = 0
    for _, page in ipairs(pages()) do
      for _, b in ipairs(markdown.tagged(read(page), 'lua cluster')) do
        n = n + 1
        local fn, err = load(b.code, '@' .. page .. ' block at line ' .. b.first, 't')
        assert.is_not_nil(fn, err)
      end
    end
    assert.is_true(n > 0)
  end)

  it('shows the example policy as it is in examples/policies/workspace.lua', function()
    local shown = markdown.tagged(read('docs/policies.md'), 'lua policy')
    assert.are.equal(1, #shown, 'one ```lua policy block')
    local file = read('examples/policies/workspace.lua')
    assert.are.equal(file:sub((file:find("pool 'workspace'", 1, true))), shown[1].code .. '\n')
  end)

  it('runs each embedding example (```lua host) as a program of its own that runs the loop', function()
    local hosted = markdown.tagged(read('docs/embedding.md'), 'lua host')
    assert.is_true(#hosted >= 1, 'docs/embedding.md has a ```lua host block')
    for _, b in ipairs(hosted) do
      local r = markdown.run_plain('docs/embedding.md', b)
      assert.are.equal(0, r.exit_code, 'block at line ' .. b.first .. ':\n' .. r.stdout .. r.stderr)
      assert.truthy(r.stdout:find('false\tINVALID_INPUT\n', 1, true), r.stdout)
      assert.truthy(r.stdout:find('built\ttrue\n', 1, true), r.stdout)
    end
  end)

  it('serves the example policy with the MCP client configuration it gives, through the official client', function()
    local text = read('docs/serve.md')
    assert.truthy(text:find('`examples/policies/workspace.lua`', 1, true))
    local config = markdown.tagged(text, 'json')[1].code
    assert.truthy(config:find('"serve", "--policy", "examples/policies/workspace.lua"', 1, true))
    local f = io.open('spec/npm/node_modules/@modelcontextprotocol/sdk/package.json', 'r')
    if not f then
      pending('needs node and @modelcontextprotocol/sdk in spec/npm (sh scripts/setup.sh installs them)')
      return
    end
    f:close()
    -- the configuration's command, for this pass's build
    config = config:gsub('"build/mayura"', '"' .. compat.host .. '"')
    local r = require('mayura.process').run({ 'node', 'spec/npm/mcp_config_sdk.mjs', config },
      { env = markdown.env_without_keys(), timeout_ms = 60000 })
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    local out = require('mayura.core').json.decode(r.stdout:match('([^\n]+)\n?$'))
    assert.are.same({ 'workspace.exec', 'workspace.list', 'workspace.read', 'workspace.remove', 'workspace.write' },
      out.tools)
    assert.are.equal('hello from the sandbox\nsandbox\n', out.stdout)
    assert.is_false(out.is_error)
  end)

  it('speaks of the project, not of the rounds or phases of its making', function()
    local all = pages()
    all[#all + 1] = 'README.md'
    for _, page in ipairs(all) do
      local text = read(page):lower()
      for _, word in ipairs({ 'this round', 'of this work', 'phase of', 'round of work' }) do
        assert.is_nil(text:find(word, 1, true), page .. ' says "' .. word .. '"')
      end
    end
  end)
end)
