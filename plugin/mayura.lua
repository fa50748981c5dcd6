--- Neovim plugin entry: with this checkout on the runtimepath (`set rtp^=/path/to/mayura`, or a
-- plugin manager), mayura's modules load in Neovim (lua/mayura/nvim.lua) and two example
-- commands exist, each streaming its progress into a scratch buffer while the editor goes on:
--
--   :MayuraRun          plays the coding agent's recorded session in a local sandbox
--                       (examples/embed/coding_session.lua)
--   :MayuraExec {cmd}   runs `sh -c {cmd}` in a fresh local sandbox
--
-- Build the core for Neovim's LuaJIT first: `make LUA=luajit` (build/luajit/lib/mayura/core.so).
-- luacheck: globals vim
if vim.g.loaded_mayura then return end
vim.g.loaded_mayura = 1

local source = debug.getinfo(1, 'S').source:gsub('^@', '')
local root = vim.fn.fnamemodify(source, ':p:h:h')
local nvim = require('mayura.nvim')
nvim.setup({ root = root })

vim.api.nvim_create_user_command('MayuraRun', function()
  nvim.start('mayura: the coding agent\'s recorded session, local sandbox', function(run)
    dofile(root .. '/examples/embed/coding_session.lua').run({ root = root, print = run.say })
  end)
end, { desc = 'mayura: play the coding agent\'s recorded session in a local sandbox' })

vim.api.nvim_create_user_command('MayuraExec', function(cmd)
  nvim.start('mayura: $ ' .. cmd.args, function(run)
    local sandbox = require('mayura.sandbox')
    local pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes(),
      { max_sandboxes = 1, max_lifetime_ms = 10 * 60000 })
    local ok, err = pcall(function()
      local sb = pool:create({ lifetime_ms = 10 * 60000 })
      run.say('sandbox ' .. sb.id .. ' started')
      local res = sb:exec({ 'sh', '-c', cmd.args }, { timeout_ms = 5 * 60000 })
      if res.stdout ~= '' then run.say((res.stdout:gsub('\n$', ''))) end
      if res.stderr ~= '' then run.say((res.stderr:gsub('\n$', ''))) end
      run.say('exit ' .. tostring(res.exit_code))
    end)
    pool:close()
    if not ok then error(err, 0) end
  end)
end, { nargs = '+', desc = 'mayura: run a shell command in a fresh local sandbox' })
