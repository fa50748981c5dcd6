--- The work bench/embed.lua has the C game host (examples/embed/game.c) run while it draws: 4 local
-- sandboxes at once, each created, running commands, and moving a 16 MiB file in and out.
--
--   build/embed/game . bench/embed_load.lua [ROUNDS]
local mayura = require('mayura')
local sandbox = require('mayura.sandbox')

local rounds = tonumber((...)) or 2
local MIB = 1024 * 1024
local data = string.rep('0123456789abcdef', MIB)   -- 16 MiB

local pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes(), {
  max_sandboxes = 4, max_lifetime_ms = 10 * 60000, max_file_bytes = 16 * MIB,
})
-- The bench's own check of what came back (comparing 16 MiB, about 1.5 ms) is the app's work, not
-- mayura's: it waits for the host's next frame, so the frame that finished the read shows mayura's
-- time alone. Outside the game host (no GAME_FRAME) it runs at once.
local function next_frame()
  local frame = rawget(_G, 'GAME_FRAME')
  if frame == nil then return end
  repeat mayura.sleep(1) until rawget(_G, 'GAME_FRAME') ~= frame
end

local function worker(i)
  local sb = pool:create({ lifetime_ms = 10 * 60000 })
  for r = 1, rounds do
    local res = sb:exec({ 'sh', '-c', 'i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; echo ' .. i })
    assert(res.exit_code == 0 and res.stdout == i .. '\n', 'command failed')
    sb:write_file('/tmp/big' .. r, data)
    local back = sb:read_file('/tmp/big' .. r, { max_bytes = 16 * MIB })
    next_frame()
    assert(back == data, 'the file came back different')
    sb:remove_file('/tmp/big' .. r)
  end
  sb:release()
end
local tasks = {}
for i = 1, 4 do tasks[i] = mayura.run(worker, i) end
local ok, err = true, nil
for _, t in ipairs(tasks) do
  local fine, e = pcall(t.wait, t)
  if not fine then ok, err = false, e end
end
pool:close()
if not ok then error(err, 0) end
return true
