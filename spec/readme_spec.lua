-- README.md: every ```lua block runs, in order, as one program with build/mayura, against the
-- local provider and (no OPENAI_API_KEY in its environment) the scripted model, so the tour
-- cannot rot. Lines outside the blocks become empty lines, so an error's line number is the
-- README's own. The pages of docs/ have spec/docs_spec.lua.
local markdown = require('support.markdown')

local README = 'README.md'
local read = markdown.read

describe('README.md', function()
  local text = read(README)
  local blocks, program = markdown.lua_program(text)

  it('keeps its two commands near the top, the layout and a pointer to every page of docs/', function()
    local top = text:sub(1, (text:find('\n## A tour', 1, true)))
    assert.truthy(top:find('make demo', 1, true))
    assert.truthy(top:find('make test', 1, true))
    assert.truthy(text:find('\n## Layout\n', 1, true))
    local linked = {}
    for _, link in ipairs(markdown.links(text)) do linked[link.target] = true end
    local pages = require('support.compat').shell('ls docs/*.md')
    local n = 0
    for page in pages:gmatch('[^\n]+') do
      n = n + 1
      assert.is_true(linked[page] == true, 'README.md points to ' .. page)
    end
    assert.is_true(n >= 9, 'found ' .. n .. ' pages in docs/')
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
    assert.is_true(#blocks >= 7, 'found ' .. #blocks .. ' lua blocks')
    for _, b in ipairs(blocks) do
      local fn, err = load(b.code, '@README.md block at line ' .. b.first, 't')
      assert.is_not_nil(fn, err)
    end
  end)

  it('runs every lua block, in order, as one program', function()
    local r = markdown.run(README, program)
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    -- section 6: the agent's run succeeded and its files passed the re-check
    assert.truthy(r.stdout:find('Tests pass.', 1, true), r.stdout .. r.stderr)
  end)
end)
