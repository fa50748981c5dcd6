--- mayura in Neovim: module paths, and runs whose progress streams into a buffer, on the editor's loop.
--
-- `setup{ root = checkout }` (plugin/mayura.lua calls it) makes `require` find the modules
-- Neovim does not find itself (Neovim looks only under `lua/` of each runtimepath entry:
-- `providers/` and `tools/` get a searcher here) and the core built for LuaJIT
-- (build/luajit/lib/mayura/core.so). The core then runs on `vim.loop`, the loop Neovim runs
-- (`mayura.driver()` is 'host'), so nothing blocks the editor: `start(title, fn)` runs `fn(run)`
-- as a task (mayura.run) whose waits yield to the editor's loop, in a scratch buffer
-- (`mayura://run/N`) to which `run.say(text)` appends lines as they come (through vim.schedule:
-- the loop's callbacks must not call the editor's API directly). `runs()` lists every run,
-- `{ buf, state = 'running' | 'done' | 'failed', say }`. plugin/mayura.lua defines the example
-- commands :MayuraRun and :MayuraExec on it.
-- luacheck: globals vim
local M = {}

local root
local runs = {}

-- A searcher for the modules under providers/ and tools/ of the checkout.
local function searcher(name)
  local rel = name:gsub('%.', '/')
  local tried = {}
  for _, dir in ipairs({ 'providers', 'tools' }) do
    for _, pattern in ipairs({ '%s/%s/%s.lua', '%s/%s/%s/init.lua' }) do
      local path = string.format(pattern, root, dir, rel)
      local f = io.open(path, 'rb')
      if f then
        f:close()
        local chunk, err = loadfile(path)
        if not chunk then error(err, 0) end
        return chunk, path
      end
      tried[#tried + 1] = '\n\tno file \'' .. path .. '\''
    end
  end
  return table.concat(tried)
end

--- Makes the modules findable. `options.root`: the checkout. Again does nothing.
function M.setup(options)
  if root then return end
  root = assert(options and options.root, 'mayura.nvim.setup needs { root = checkout }')
  local searchers = package.loaders or package.searchers  -- luacheck: ignore 143
  table.insert(searchers, 2, searcher)
  package.cpath = root .. '/build/luajit/lib/?.so;' .. package.cpath
end

--- The checkout setup was given.
function M.root()
  return root
end

-- A scratch buffer in a new window, and the run that appends to it.
local function open_run(title)
  local n = #runs + 1
  local buf = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_buf_set_name(buf, 'mayura://run/' .. n)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { title })
  vim.cmd('botright split')
  vim.api.nvim_win_set_buf(0, buf)
  local run = { buf = buf, state = 'running' }
  runs[n] = run
  function run.say(text)
    vim.schedule(function()
      if not vim.api.nvim_buf_is_valid(buf) then return end
      vim.api.nvim_buf_set_lines(buf, -1, -1, false, vim.split(tostring(text), '\n', { plain = true }))
    end)
  end
  return run
end

--- Runs `fn(run)` as a task in a new buffer titled `title`; its end or its error lands in the
-- buffer (`[done]`, or `error: ...` and `[failed]`). Returns the run at once.
function M.start(title, fn)
  local run = open_run(title)
  require('mayura').run(function()
    local ok, err = pcall(fn, run)
    if not ok then run.say('error: ' .. tostring(err)) end
    run.say(ok and '[done]' or '[failed]')
    vim.schedule(function() run.state = ok and 'done' or 'failed' end)
  end)
  return run
end

--- Every run so far.
function M.runs()
  return runs
end

return M
