-- Run by spec/embed/game_spec.lua in the C game host, whose state comes from mayura_newstate():
-- large strings and tables come and go through the allocator correctly, and a string announced
-- with core.expect_bytes is made in memory the allocator's thread touched ahead (few page faults),
-- where one of a size nobody announced takes a fault a page. Prints `alloc ok` and the counts.
local mayura = require('mayura')
local core = require('mayura.core')

local MIB = 1024 * 1024

-- This process's minor page faults (field 10 of /proc/self/stat, after the command's name).
local function faults()
  local f = assert(io.open('/proc/self/stat'))
  local stat = f:read('*a')
  f:close()
  return tonumber(stat:match('%) %S+ ' .. string.rep('%S+ ', 6) .. '(%d+)'))
end

-- Parts of n bytes in all.
local function parts_of(n, byte)
  local parts, piece = {}, string.rep(byte, MIB)
  for i = 1, n / MIB do parts[i] = piece end
  return parts
end

-- Joined as a file read in parts is (one `..` of them all: a single string made, no buffer).
local function join(parts)
  local terms = {}
  for i = 1, #parts do terms[i] = 'p[' .. i .. ']' end
  return assert(load('local p = ... return ' .. table.concat(terms, '..')))(parts)
end

-- Strings and tables over and under the allocator's 1 MiB line, grown, shrunk and freed.
local small = {}
do
  local big = string.rep('ab', 10 * MIB)
  assert(#big == 20 * MIB and big:sub(-2) == 'ab' and big:sub(MIB, MIB + 1) == 'ba')
  local t = {}
  for i = 1, 300000 do t[i] = i end            -- an array part of several MiB, grown by realloc
  for i = 1, 300000 do assert(t[i] == i) end
  for i = 1, 2000 do small[i] = string.rep(string.char(65 + i % 26), i) end
end
collectgarbage()                               -- the big string and table are freed
collectgarbage()
for i = 1, 2000 do assert(#small[i] == i) end
local again = table.concat(parts_of(4 * MIB, 'z'))
assert(#again == 4 * MIB and again:find('^z+$'))

local n = 24 * MIB
local ready = parts_of(n, 'r')
core.expect_bytes(n)
mayura.sleep(300)                               -- the allocator's thread maps and touches it
local f0 = faults()
local made = join(ready)
local announced = faults() - f0
assert(#made == n)

local cold_parts = parts_of(n + 3 * MIB, 'c')   -- a size nobody announced
f0 = faults()
local cold = join(cold_parts)
local unannounced = faults() - f0
assert(#cold == n + 3 * MIB)
print(('alloc ok announced_faults %d unannounced_faults %d'):format(announced, unannounced))
return true
