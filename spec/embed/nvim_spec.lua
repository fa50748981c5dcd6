-- Neovim (Debian's 0.7.2, LuaJIT): the checkout as a plugin on the runtimepath, driven in a real
-- `nvim --headless` by spec/embed/nvim_driver.lua as a user would: `:MayuraExec` runs a 3-second
-- command in a local sandbox while the editor keeps taking keys and firing its timers (the core
-- runs on vim.loop, the loop Neovim runs), then `:MayuraRun` plays the coding agent's recorded
-- session and its progress is read back from the buffer. The editor uses build/luajit's core.
local process = require('mayura.process')

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

local have_nvim = process.run({ 'sh', '-c', 'command -v nvim' }).exit_code == 0
local have_core = exists('build/luajit/lib/mayura/core.so')

describe('Neovim plugin', function()
  if not (have_nvim and have_core) then
    pending(not have_nvim and 'nvim is not installed (scripts/setup.sh)'
      or 'build/luajit/lib/mayura/core.so is missing (make LUA=luajit)')
    return
  end

  it('runs a sandbox command and the recorded session on the editor\'s loop, the editor answering meanwhile',
    function()
      local out = os.tmpname()
      local pwd = os.getenv('PWD')
      local r = process.run({ 'nvim', '--headless', '-u', 'NONE', '-i', 'NONE', '--cmd', 'set rtp^=' .. pwd,
        '-c', 'runtime plugin/mayura.lua', '-c', 'luafile spec/embed/nvim_driver.lua' }, {
        env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), MAYURA_NVIM_OUT = out },
        timeout_ms = 90000,
      })
      local f = io.open(out, 'rb')
      local text = f and f:read('*a') or ''
      if f then f:close() end
      os.remove(out)
      assert.are.equal(0, r.exit_code, r.stdout .. r.stderr .. text)
      assert.truthy(text:find('^driver host\n'), text)
      -- the order: the editor ticks and takes keys while the command runs, then the command ends
      local order = {}
      for e in text:gmatch('event ([^\n]+)') do order[#order + 1] = e end
      assert.are.same({ 'tick while the command runs', 'keys typed while the command runs',
        'command ended done' }, { order[1], order[2], order[#order] }, text)
      -- the buffers, as the user reads them
      assert.truthy(text:find('--- run 1 done\nmayura: $ sleep 3; echo finished\nsandbox [^\n]+ started\nfinished\nexit 0\n'),
        text)
      assert.truthy(text:find('--- run 2 done\n', 1, true), text)
      assert.truthy(text:find('$ node --test  -> exit 1\n', 1, true), text)
      assert.truthy(text:find('$ node --test  -> exit 0\n', 1, true), text)
      assert.truthy(text:find('Verdict: the re-check passed (node --test exited 0).\n[done]', 1, true), text)
    end)
end)
