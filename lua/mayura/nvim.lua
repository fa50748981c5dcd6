--- mayura in Neovim: module paths, and the example commands on the editor's own loop.
--
-- `setup{ root = checkout }` (plugin/mayura.lua calls it) makes `require` find the modules
-- Neovim does not find itself (Neovim looks only under `lua/` of each runtimepath entry:
-- `providers/` and `tools/` get a searcher here) and the core built for LuaJIT
-- (build/luajit/lib/mayura/core.so). The core then runs on `vim.loop`, the loop Neovim runs,
-- so nothing here ever blocks the editor: each command runs as a task (mayura.run) and its
-- waits yield to the editor's loop. Commands:
--
--   :MayuraRun          plays the coding agent's recorded session in a local sandbox
--   :MayuraExec {cmd}   runs `sh -c {cmd}` in a fresh local sandbox
--
-- Each opens a scratch buffer (`mayura://run/N`) and appends its progress as it happens
-- (through vim.schedule: the loop's callbacks must not call the editor's API directly).
-- `runs()` lists every command's state, `{ buf, state = 'running' | 'done' | 'failed', lines }`.
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

--- Makes the modules findable and defines the commands. `options.root`: the checkout.
function M.setup(options)
  if root then return end
  root = assert(options and options.root, 'mayura.nvim.setup needs { root = checkout }')
  local searchers = package.loaders or package.searchers  -- luacheck: ignore 143
  table.insert(searchers, 2, searcher)
  package.cpath = root .. '/build/luajit/lib/?.so;' .. package.cpath
  vim.api.nvim_create_user_command('MayuraRun', function() M.run_session() end,
    { desc = 'mayura: play the coding agent\'s recorded session in a local sandbox' })
  vim.api.nvim_create_user_command('MayuraExec', function(cmd) M.exec(cmd.args) end,
    { nargs = '+', desc = 'mayura: run a shell command in a fresh local sandbox' })
end

-- A scratch buffer in a new window and a function appending lines to it from anywhere.
local function open_run(title)
  local n = #runs + 1
  local buf = vim.api.nvim_create_buf(true, true)
  vim.api.nvim_buf_set_name(buf, 'mayura://run/' .. n)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { title })
  vim.cmd('botright split')
  vim.api.nvim_win_set_buf(0, buf)
  local run = { buf = buf, state = 'running', lines = 1 }
  runs[n] = run
  function run.say(text)
    vim.schedule(function()
      if not vim.api.nvim_buf_is_valid(buf) then return end
      local lines = vim.split(tostring(text), '\n', { plain = true })
      vim.api.nvim_buf_set_lines(buf, -1, -1, false, lines)
      run.lines = run.lines + #lines
    end)
  end
  return run
end

-- Runs fn(run) as a task; its end or its error lands in the buffer.
local function start(title, fn)
  local run = open_run(title)
  require('mayura').run(function()
    local ok, err = pcall(fn, run)
    if not ok then run.say('error: ' .. tostring(err)) end
    vim.schedule(function() run.state = ok and 'done' or 'failed' end)
    run.say(ok and '[done]' or '[failed]')
  end)
  return run
end

--- :MayuraRun: the coding agent's recorded session (examples/embed/coding_session.lua).
function M.run_session()
  return start('mayura: the coding agent\'s recorded session, local sandbox', function(run)
    local session = dofile(root .. '/examples/embed/coding_session.lua')
    session.run({ root = root, print = run.say })
  end)
end

--- :MayuraExec {cmd}: `sh -c cmd` in a fresh local sandbox, then its output.
function M.exec(command)
  return start('mayura: $ ' .. command, function(run)
    local sandbox = require('mayura.sandbox')
    local pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes(),
      { max_sandboxes = 1, max_lifetime_ms = 10 * 60000 })
    local ok, err = pcall(function()
      local sb = pool:create({ lifetime_ms = 10 * 60000 })
      run.say('sandbox ' .. sb.id .. ' started')
      local res = sb:exec({ 'sh', '-c', command }, { timeout_ms = 5 * 60000 })
      if res.stdout ~= '' then run.say((res.stdout:gsub('\n$', ''))) end
      if res.stderr ~= '' then run.say((res.stderr:gsub('\n$', ''))) end
      run.say('exit ' .. tostring(res.exit_code))
    end)
    pool:close()
    if not ok then error(err, 0) end
  end)
end

--- Every command's run so far.
function M.runs()
  return runs
end

return M
