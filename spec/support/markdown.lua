--- The code blocks of a Markdown page, for the specs that run the README's and docs/'s Lua:
-- `lua_program` gives the ```lua blocks (the tag alone) as one program, in order, with every other
-- line empty so that an error's line number is the page's own; `tagged` gives the blocks of one
-- tag (```lua host, ```lua policy, ```json) each on its own; `run` runs a program with the host
-- program of this pass, without any model key in its environment. `links` gives a page's relative
-- links, `slugs` its headings' anchors as GitHub makes them.
local process = require('mayura.process')
local compat = require('support.compat')

local M = {}

--- The text of a file.
function M.read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('a')
  f:close()
  return s
end

local function lines(text)
  return (text .. (text:sub(-1) == '\n' and '' or '\n')):gmatch('([^\n]*)\n')
end

--- The blocks of `tag` (the text after the fence's backticks), each `{ first = line, code = text }`.
function M.tagged(text, tag)
  local blocks, block, n = {}, nil, 0
  for line in lines(text) do
    n = n + 1
    if block then
      if line:match('^```%s*$') then
        block.code = table.concat(block.lines, '\n')
        blocks[#blocks + 1] = block
        block = nil
      else
        block.lines[#block.lines + 1] = line
      end
    elseif line:match('^```') and line:match('^```(.-)%s*$') == tag then
      block = { first = n + 1, lines = {} }
    end
  end
  assert(block == nil, 'the ```' .. tag .. ' block starting at line ' .. tostring(block and block.first)
    .. ' is not closed')
  return blocks
end

--- The ```lua blocks, and the whole program: those blocks at their own lines, every other line empty.
function M.lua_program(text)
  local blocks = M.tagged(text, 'lua')
  local program, n = {}, 0
  for _ in lines(text) do
    n = n + 1
    program[n] = ''
  end
  for _, b in ipairs(blocks) do
    for i, line in ipairs(b.lines) do program[b.first + i - 1] = line end
  end
  return blocks, table.concat(program, '\n') .. '\n'
end

--- The environment of this process, without any model key.
function M.env_without_keys()
  local env = {}
  for _, name in ipairs({ 'PATH', 'HOME', 'LANG', 'TMPDIR' }) do
    env[name] = os.getenv(name)
  end
  return env
end

--- Runs `program` (named `name` in its errors) with this pass's build/mayura; the process's result.
function M.run(name, program, timeout_ms)
  local runner = "local f = assert(load(io.read('a'), '@" .. name .. "', 't')); f()"
  return process.run({ compat.host, '-e', runner }, {
    stdin = program, env = M.env_without_keys(), timeout_ms = timeout_ms or 120000,
  })
end

--- Runs a ```lua host block on its own, under this pass's plain interpreter, with the checkout's
-- module paths; blank lines in front, so an error's line number is the page's own.
function M.run_plain(name, block)
  local code = string.rep('\n', block.first - 1) .. block.code
  return process.run({ compat.lua, '-e', "local f = assert(load(io.read('*a'), '@" .. name .. "', 't')); f()" }, {
    stdin = code, timeout_ms = 60000,
    env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'),
      LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;tools/?.lua;;', LUA_CPATH = compat.cpath .. ';;' },
  })
end

--- The relative links of a page, outside code: `{ { target = 'docs/x.md', anchor = 'y' or nil } }`.
function M.links(text)
  local out, fence = {}, false
  for line in lines(text) do
    if line:match('^```') then fence = not fence end
    if not fence then
      for target in line:gmatch('%]%(([^)%s]+)%)') do
        if not target:match('^%a[%w+.-]*:') then
          local file, anchor = target:match('^([^#]*)#(.*)$')
          out[#out + 1] = { target = file or target, anchor = anchor }
        end
      end
    end
  end
  return out
end

--- The anchors of a page's headings: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
function M.slugs(text)
  local out, fence = {}, false
  for line in lines(text) do
    if line:match('^```') then fence = not fence end
    local heading = not fence and line:match('^#+%s+(.-)%s*$')
    if heading then
      out[heading:lower():gsub('[^%w%s_-]', ''):gsub('%s', '-')] = true
    end
  end
  return out
end

return M
