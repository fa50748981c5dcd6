--- What the specs need of Lua 5.4 that LuaJIT 2.1 lacks, the same under both, and which
-- interpreter and build this pass of the suite runs: number kinds, the
-- 64-bit integer limits where they exist, os.execute's and popen's verdicts, and the subset of
-- string.pack/unpack the specs use to build and read binary frames (integers of 1 to 8 bytes,
-- either byte order, length-prefixed strings). Under Lua 5.4 every function is the standard one.
local M = {}

--- Whether the suite runs under LuaJIT (numbers are doubles there, with no integer subtype).
M.luajit = rawget(_G, 'jit') ~= nil

--- This pass's interpreter and build (the Makefile sets MAYURA_BUILD): the host program and the
-- core of the Lua the suite runs under, for specs that start them as subprocesses.
M.lua = M.luajit and 'luajit' or 'lua5.4'
M.build = os.getenv('MAYURA_BUILD') or (M.luajit and 'build/luajit' or 'build')
M.host = M.build .. '/mayura'
M.cpath = M.build .. '/lib/?.so'

--- table.unpack.
M.table_unpack = table.unpack or unpack -- luacheck: ignore 143

--- The 64-bit integer limits. -2^63 is a double too, so LuaJIT has the smallest; the largest is nil
-- there, as no double is 2^63 - 1.
M.maxinteger = math.maxinteger
M.mininteger = math.mininteger or -2 ^ 63

local TWO53 = 2 ^ 53

--- Runs a shell command; returns its stdout and whether it exited 0. Lua 5.4 has that from the
-- popen handle's close; LuaJIT's close says only whether the pipe closed, so there the command
-- prints its status after its output, on a line of its own, which is taken off again.
function M.shell(cmd)
  if not M.luajit then
    local p = assert(io.popen(cmd))
    local out = p:read('a')
    return out, p:close() == true
  end
  local p = assert(io.popen(cmd .. '\nprintf "\\n%d" "$?"'))
  local all = p:read('a')
  p:close()
  local out, status = all:match('^(.*)\n(%d+)$')
  return out or all, status == '0'
end

--- os.execute as Lua 5.4 has it: true or nil, then 'exit' or 'signal' and the number. LuaJIT's
-- returns the raw wait status, a number, which is true even when the command failed.
function M.execute(cmd)
  local a, how, n = os.execute(cmd)
  if type(a) ~= 'number' then return a, how, n end
  if a % 256 == 0 then
    n = math.floor(a / 256)
    return n == 0 or nil, 'exit', n
  end
  return nil, 'signal', a % 128
end

--- math.type: 'integer', 'float' or nil. Under LuaJIT a number counts as an integer when it is a
-- whole number within 2^53, the integers the core hands out as such (as json.decode does).
function M.math_type(v)
  if math.type then return math.type(v) end
  if type(v) ~= 'number' then return nil end
  if v == math.floor(v) and v >= -TWO53 and v <= TWO53 then return 'integer' end
  return 'float'
end

-- One item of a format: kind ('I', 'i' or 's') and size in bytes, and the next position.
local function item(fmt, pos)
  local c = fmt:sub(pos, pos)
  local digits = fmt:match('^%d*', pos + 1)
  local size = tonumber(digits)
  if c == 'B' or c == 'b' then
    return c == 'B' and 'I' or 'i', 1, pos + 1
  elseif c == 'I' or c == 'i' or c == 's' then
    size = size or 8
    if size < 1 or size > 8 then error('compat.pack: size out of [1,8] in ' .. fmt, 3) end
    return c, size, pos + 1 + #digits
  end
  error('compat.pack: unsupported format ' .. fmt, 3)
end

-- An integer as `size` bytes, least significant first; negative ones in two's complement.
local function int_bytes(n, size, signed)
  if type(n) ~= 'number' or n ~= math.floor(n) then error('compat.pack: not an integer: ' .. tostring(n), 4) end
  local lo_limit = signed and -2 ^ (8 * size - 1) or 0
  local hi_limit = signed and 2 ^ (8 * size - 1) or 2 ^ (8 * size)
  if n < lo_limit or n >= hi_limit then error('compat.pack: integer overflow: ' .. tostring(n), 4) end
  -- two halves of 32 bits each keep every step exact for the doubles LuaJIT has
  local hi = math.floor(n / 2 ^ 32)
  local lo = n - hi * 2 ^ 32
  if hi < 0 then hi = hi + 2 ^ 32 end
  local out = {}
  for i = 1, size do
    local b
    if i <= 4 then
      b = lo % 256
      lo = (lo - b) / 256
    else
      b = hi % 256
      hi = (hi - b) / 256
    end
    out[i] = string.char(b)
  end
  return table.concat(out)
end

-- The integer in `s` (bytes least significant first).
local function bytes_int(s, signed)
  local lo, hi = 0, 0
  for i = #s, 1, -1 do
    if i > 4 then hi = hi * 256 + s:byte(i) else lo = lo * 256 + s:byte(i) end
  end
  local n = hi * 2 ^ 32 + lo
  if signed and s:byte(#s) >= 128 then
    if #s > 4 then n = (hi - 2 ^ (8 * (#s - 4))) * 2 ^ 32 + lo else n = lo - 2 ^ (8 * #s) end
  end
  return n
end

local function ordered(bytes, little)
  return little and bytes or bytes:reverse()
end

--- string.pack for formats of B, b, I[n], i[n] and s[n] items after an optional < > or =.
function M.pack(fmt, ...)
  if string.pack then return string.pack(fmt, ...) end
  local args = { n = select('#', ...), ... }
  local little, pos, arg, out = true, 1, 0, {}
  while pos <= #fmt do
    local c = fmt:sub(pos, pos)
    if c == '<' or c == '=' then
      little, pos = true, pos + 1
    elseif c == '>' then
      little, pos = false, pos + 1
    elseif c == ' ' then
      pos = pos + 1
    else
      local kind, size
      kind, size, pos = item(fmt, pos)
      arg = arg + 1
      local v = args[arg]
      if kind == 's' then
        if type(v) ~= 'string' then error('compat.pack: string expected for item ' .. arg, 2) end
        out[#out + 1] = ordered(int_bytes(#v, size, false), little) .. v
      else
        out[#out + 1] = ordered(int_bytes(v, size, kind == 'i'), little)
      end
    end
  end
  return table.concat(out)
end

--- string.unpack for the formats M.pack takes: the values, then the position after them.
function M.unpack(fmt, s, init)
  if string.unpack then return string.unpack(fmt, s, init) end
  local little, pos, at, out = true, 1, init or 1, {}
  while pos <= #fmt do
    local c = fmt:sub(pos, pos)
    if c == '<' or c == '=' then
      little, pos = true, pos + 1
    elseif c == '>' then
      little, pos = false, pos + 1
    elseif c == ' ' then
      pos = pos + 1
    else
      local kind, size
      kind, size, pos = item(fmt, pos)
      if at + size - 1 > #s then error('compat.unpack: data string too short', 2) end
      local n = bytes_int(ordered(s:sub(at, at + size - 1), little), kind == 'i')
      at = at + size
      if kind == 's' then
        if at + n - 1 > #s then error('compat.unpack: data string too short', 2) end
        out[#out + 1] = s:sub(at, at + n - 1)
        at = at + n
      else
        out[#out + 1] = n
      end
    end
  end
  out[#out + 1] = at
  return M.table_unpack(out, 1, #out)
end

return M
