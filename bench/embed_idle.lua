--- The cost of an idle step(), run by bench/embed.lua under a plain interpreter (lua5.4 or luajit)
-- acting as a host that drives the loop: with nothing on the loop, then with 4 local sandboxes
-- alive and idle (their channels open, their timers set). Prints `idle_step_us EMPTY BUSY`.
local mayura = require('mayura')
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')

local N = tonumber(arg and arg[1]) or 100000
mayura.set_driver('step')

local function per_step_us()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = core.hrtime_ms()
    for _ = 1, N do mayura.step() end
    best = math.min(best, (core.hrtime_ms() - t0) * 1000 / N)
  end
  return best
end

local empty = per_step_us()
local pool
local boxes = {}   -- kept alive (and idle) while the steps are measured
local t = mayura.run(function()
  -- the local provider checks the host when it is made: that waits, so inside the task too
  pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes(), {
    max_sandboxes = 4, max_lifetime_ms = 10 * 60000,
  })
  for i = 1, 4 do boxes[i] = pool:create({ lifetime_ms = 10 * 60000 }) end
end)
while not t.done do mayura.step(1) end
t:wait()
local busy = per_step_us()
assert(#boxes == 4)
t = mayura.run(function() pool:close() end)
while not t.done do mayura.step(1) end
t:wait()
print(string.format('idle_step_us %.3f %.3f', empty, busy))
