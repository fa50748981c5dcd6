--- Neovim plugin entry: with this checkout on the runtimepath (`set rtp^=/path/to/mayura`, or a
-- plugin manager), mayura's modules load in Neovim and `:MayuraRun` / `:MayuraExec` exist.
-- Build the core for Neovim's LuaJIT first: `make LUA=luajit` (build/luajit/lib/mayura/core.so).
-- luacheck: globals vim
if vim.g.loaded_mayura then return end
vim.g.loaded_mayura = 1

local source = debug.getinfo(1, 'S').source:gsub('^@', '')
local root = vim.fn.fnamemodify(source, ':p:h:h')
require('mayura.nvim').setup({ root = root })
