--- mayura in LÖVE 11 (LuaJIT): the game runs the coding agent's recorded session in a local
-- sandbox (examples/embed/coding_session.lua) from love.update, while it keeps drawing frames.
--
--   make LUA=luajit && love examples/embed/love [--quit-when-done]
--
-- love.load points `require` at the checkout (three directories up) and its LuaJIT build of the
-- core, makes the game the loop's driver and starts the agent as a task; love.update gives
-- mayura.step() a budget of 4 ms a frame; love.draw shows the progress. With --quit-when-done the
-- game quits when the agent has ended (exit 0 when the re-check passed) and prints one line of
-- frame statistics, as the spec under Xvfb runs it.
-- luacheck: globals love
local mayura, core
local lines = {}
local task
local quit_when_done = false
local frames, step_max_us, frame_max_ms, last = 0, 0, 0, nil

local function checkout()
  local source = love.filesystem.getSource()
  return (source:gsub('/+$', ''):gsub('/[^/]+/[^/]+/[^/]+$', ''))
end

function love.load(args)
  for _, a in ipairs(args or {}) do
    if a == '--quit-when-done' then quit_when_done = true end
  end
  if quit_when_done then
    -- unattended: an error ends the game with its message, not LÖVE's error screen
    love.errorhandler = function(msg)
      print('error: ' .. debug.traceback(tostring(msg)))
      os.exit(1)
    end
  end
  local root = checkout()
  package.path = root .. '/lua/?.lua;' .. root .. '/lua/?/init.lua;' .. root .. '/providers/?.lua;'
    .. root .. '/tools/?.lua;' .. package.path
  package.cpath = root .. '/build/luajit/lib/?.so;' .. package.cpath
  mayura = require('mayura')
  core = require('mayura.core')
  mayura.set_driver('step')   -- the game runs the loop: from here on every wait is inside a task
  io.stdout:setvbuf('line')
  task = mayura.run(function()
    return dofile(root .. '/examples/embed/coding_session.lua').run({
      root = root,
      print = function(line)
        lines[#lines + 1] = line
        if #lines > 20 then table.remove(lines, 1) end
        print(string.format('[frame %d] %s', frames, line))
      end,
    })
  end)
end

function love.update()
  local t0 = core.hrtime_ms()
  if last then frame_max_ms = math.max(frame_max_ms, t0 - last) end
  last = t0
  mayura.step(4)
  step_max_us = math.max(step_max_us, (core.hrtime_ms() - t0) * 1000)
  frames = frames + 1
  if task.done and quit_when_done then
    local ok, passed = pcall(task.wait, task)
    if not ok then print('the agent failed: ' .. tostring(passed)) end
    print(string.format('love frames %d step_us max %.1f frame_ms max %.1f', frames, step_max_us, frame_max_ms))
    love.event.quit((ok and passed) and 0 or 1)
  end
end

function love.draw()
  love.graphics.print(string.format('frame %d   mayura step max %.0f us', frames, step_max_us), 10, 10)
  for i, line in ipairs(lines) do love.graphics.print(line, 10, 20 + 16 * i) end
end
