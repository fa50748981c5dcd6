-- Drives a real `nvim --headless` as a user would, for spec/embed/nvim_spec.lua: loaded with
-- `-c 'luafile ...'` after plugin/mayura.lua. It runs `:MayuraExec` with a 3-second sandbox command,
-- types into another buffer while it runs (nvim_input: the keys go through the editor's input queue
-- as typed ones do) and counts the ticks of an editor timer; then runs `:MayuraRun` to its end. It
-- writes what happened, in order, to the file named by $MAYURA_NVIM_OUT (one event a line, then
-- the buffers), and quits.
-- luacheck: globals vim
local out_path = assert(os.getenv('MAYURA_NVIM_OUT'))
local nvim = require('mayura.nvim')

local events = {}
local function note(what)
  if events[#events] ~= what then events[#events + 1] = what end
end

local function buffer_text(run)
  return table.concat(vim.api.nvim_buf_get_lines(run.buf, 0, -1, false), '\n')
end

local function finish()
  local lines = { 'driver ' .. tostring(require('mayura.core').driver()) }
  for _, e in ipairs(events) do lines[#lines + 1] = 'event ' .. e end
  for i, run in ipairs(nvim.runs()) do
    lines[#lines + 1] = '--- run ' .. i .. ' ' .. run.state
    lines[#lines + 1] = buffer_text(run)
  end
  vim.fn.writefile(vim.split(table.concat(lines, '\n'), '\n', { plain = true }), out_path)
  vim.cmd('qa!')
end

-- The scratch buffer the keys go to.
local typed = vim.api.nvim_create_buf(true, true)

vim.cmd('MayuraExec sleep 3; echo finished')
local exec = nvim.runs()[1]
local keys_sent, session = false, nil
local timer = vim.loop.new_timer()
local waited = 0
timer:start(50, 50, vim.schedule_wrap(function()
  waited = waited + 50
  local text = buffer_text(exec)
  if exec.state == 'running' and text:find('sandbox .* started') and not text:find('\nfinished') then
    note('tick while the command runs')
    if not keys_sent then
      keys_sent = true
      vim.api.nvim_set_current_buf(typed)
      vim.api.nvim_input('ihello from the keyboard<Esc>')
    end
  end
  if keys_sent and vim.api.nvim_buf_get_lines(typed, 0, -1, false)[1] == 'hello from the keyboard' then
    note(exec.state == 'running' and 'keys typed while the command runs' or 'keys typed after the command')
  end
  if exec.state ~= 'running' then
    note('command ended ' .. exec.state)
    if not session then vim.cmd('MayuraRun'); session = nvim.runs()[2] end
  end
  if (session and session.state ~= 'running') or waited > 60000 then
    timer:stop()
    timer:close()
    finish()
  end
end))
