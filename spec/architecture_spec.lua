-- Keeps ARCHITECTURE.md's dependency rules true: scans every `require` of the Lua layers and every
-- `#include` of the C parts, and fails on a dependency the rules do not allow.

local compat = require('support.compat')
local function read(path)
  local f = assert(io.open(path, 'r'))
  local s = f:read('a')
  f:close()
  return s
end

local function files(dir, ext)
  local out = {}
  local p = io.popen('find ' .. dir .. " -type f -name '*." .. ext .. "' | sort")
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

-- The code of a Lua file without its comments, so a module's doc comment may name any module.
local function strip_comments(src)
  src = src:gsub('%-%-%[(=*)%[.-%]%1%]', '')
  src = src:gsub('%-%-[^\n]*', '')
  return src
end

local function requires(path)
  local out = {}
  local code = strip_comments(read(path))
  for name in code:gmatch('require%s*%(?%s*[\'"]([%w_.]+)[\'"]') do out[#out + 1] = name end
  return out
end

local function includes(path)
  local out = {}
  for name in read(path):gmatch('#include%s*"([^"]+)"') do out[#out + 1] = name end
  return out
end

local function is_private(name)
  return name:match('%._[%w_]*$') ~= nil or name:match('^_') ~= nil
end

local function exists(path)
  local f = io.open(path, 'r')
  if f then f:close() end
  return f ~= nil
end

-- Whether `name` is a module of `dir` (a file `dir/a/b.lua` or `dir/a/b/init.lua`).
local function module_in(dir, name)
  local path = dir .. '/' .. name:gsub('%.', '/')
  return exists(path .. '.lua') or exists(path .. '/init.lua')
end

local function is_runtime(name)   -- a module of lua/mayura, the core or luv
  return name == 'luv' or name == 'mayura.core' or module_in('lua', name)
end

local function is_sandbox_provider(name)
  return name:match('^mayura%.sandbox%.') ~= nil and module_in('providers', name)
end
local function is_model_adapter(name) return name:match('^mayura%.provider%.') ~= nil end
local function is_tool(name) return module_in('tools', name) end

-- Which modules a file of each folder may require; returns nil when allowed, else the reason.
local RULES = {
  { dir = 'lua', check = function(name)
    if is_sandbox_provider(name) or is_model_adapter(name) then return 'the runtime never requires a provider' end
    if is_tool(name) and name ~= 'mayura.sandbox.tools' then return 'only mayura.sandbox.tools is re-exported' end
  end },
  { dir = 'tools', check = function(name)
    if is_sandbox_provider(name) or is_model_adapter(name) then return 'tools never require a provider' end
  end },
  { dir = 'providers/mayura/sandbox', check = function(name, file)
    if is_tool(name) then return 'a provider never requires the tools' end
    if is_model_adapter(name) then return 'a sandbox provider never requires a model adapter' end
    if is_sandbox_provider(name) and not is_private(name) then
      local own = 'mayura.sandbox.' .. file:match('([%w_]+)%.lua$')
      if name ~= own then return 'a provider never requires another public provider' end
    end
  end },
  { dir = 'providers/mayura/provider', check = function(name)
    if is_tool(name) then return 'an adapter never requires the tools' end
    if is_sandbox_provider(name) then return 'an adapter never requires a sandbox provider' end
  end },
  { dir = 'examples', check = function(name)
    if is_private(name) then return 'examples use public modules only' end
  end },
}

describe('ARCHITECTURE.md dependency rules', function()
  for _, rule in ipairs(RULES) do
    it(rule.dir .. ' requires only what it may', function()
      local bad = {}
      local seen = 0
      for _, file in ipairs(files(rule.dir, 'lua')) do
        for _, name in ipairs(requires(file)) do
          seen = seen + 1
          local why = rule.check(name, file)
          if why then bad[#bad + 1] = file .. ' requires ' .. name .. ': ' .. why end
        end
      end
      assert.is_true(seen > 0, 'no require found under ' .. rule.dir)
      assert.are.same({}, bad)
    end)
  end

  it('every module the runtime requires is a runtime module, luv or the core', function()
    local bad = {}
    for _, file in ipairs(files('lua', 'lua')) do
      for _, name in ipairs(requires(file)) do
        if not is_runtime(name) and name ~= 'mayura.sandbox.tools' then bad[#bad + 1] = file .. ': ' .. name end
      end
    end
    assert.are.same({}, bad)
  end)

  it('the agent includes only the shared headers of the core, through agent/agent.h', function()
    -- its pieces include only agent.h (one program, one header); agent.h includes the core's shared
    -- headers and nothing else of the core
    local bad, pieces = {}, 0
    for _, file in ipairs(files('agent', 'c')) do
      pieces = pieces + 1
      local names = includes(file)
      if #names ~= 1 or names[1] ~= 'agent.h' then
        bad[#bad + 1] = file .. ' includes ' .. table.concat(names, ', ') .. ' (only agent.h)'
      end
    end
    assert.is_true(pieces > 1, 'the agent is one file again')
    for _, file in ipairs(files('agent', 'h')) do
      for _, name in ipairs(includes(file)) do
        local shared = name == '../core/wire.h' or name == '../core/tree.h' or name == '../core/files.h'
        if not shared and name:find('/', 1, true) then bad[#bad + 1] = file .. ' includes ' .. name end
      end
    end
    assert.are.same({}, bad)
  end)

  it('the core never includes the agent', function()
    local bad = {}
    for _, ext in ipairs({ 'c', 'h' }) do
      for _, file in ipairs(files('core', ext)) do
        for _, name in ipairs(includes(file)) do
          if name:find('agent', 1, true) then bad[#bad + 1] = file .. ' includes ' .. name end
        end
      end
    end
    assert.are.same({}, bad)
  end)

  it('a rule that is broken is found (the scanner sees a forbidden require)', function()
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(compat.execute('mkdir -p ' .. dir) == true)
    local f = assert(io.open(dir .. '/x.lua', 'w'))
    f:write("-- require('mayura.sandbox._host') in a comment does not count\n",
      "local h = require('mayura.sandbox._host')\nreturn h\n")
    f:close()
    local names = requires(dir .. '/x.lua')
    os.execute('rm -rf ' .. dir)
    assert.are.same({ 'mayura.sandbox._host' }, names)
    assert.is_truthy(RULES[5].check(names[1]))
  end)
end)
