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
-- The file read back is marked first by the sandbox (its first bytes say which worker and round),
-- so that each read makes a string of its own (LuaJIT would otherwise find the one sent already
-- among its strings and make none). The bench's check of it looks at its length and at its two ends
-- (comparing 16 MiB whole is the app's work, ~2 ms, not mayura's).
local function same(back, tag)
  local n = #tag
  return #back == #data and back:sub(1, n) == tag and back:sub(n + 1, 65536) == data:sub(n + 1, 65536)
    and back:sub(-65536) == data:sub(-65536)
end

local function worker(i)
  local sb = pool:create({ lifetime_ms = 10 * 60000 })
  for r = 1, rounds do
    local res = sb:exec({ 'sh', '-c', 'i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; echo ' .. i })
    assert(res.exit_code == 0 and res.stdout == i .. '\n', 'command failed')
    local path, tag = '/tmp/big' .. r, 'worker ' .. i .. ' round ' .. r
    sb:write_file(path, data)
    res = sb:exec({ 'sh', '-c', 'printf %s "$1" | dd of="$2" conv=notrunc 2>/dev/null', 'sh', tag, path })
    assert(res.exit_code == 0, 'marking the file failed')
    local back = sb:read_file(path, { max_bytes = 16 * MIB })
    assert(same(back, tag), 'the file came back different')
    sb:remove_file(path)
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
