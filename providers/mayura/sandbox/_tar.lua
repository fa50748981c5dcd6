--- mayura.sandbox._tar: files as a gzip'd tar archive, for services that take
-- uploads that way (Vercel Sandbox's fs/write).
--
--   local tar = require('mayura.sandbox._tar')
--   local body = tar.tar_gz({ { name = 'workspace/a.txt', data = 'hi', mode = tonumber('644', 8) } })
--
-- `tar(entries)` is a POSIX (ustar) archive of regular files: each entry's
-- `name` (relative: no leading '/', no NUL byte, no `.` or `..` part; up to
-- 4096 bytes), `data` and `mode` (0644 by default). A name that fits no ustar
-- header (over 100 bytes, with no '/' splitting it into a prefix of up to 155
-- and a name of up to 100) goes in a pax extended header (`path=`), as GNU
-- tar, BusyBox tar and every pax reader take it. Owner 0:0, mtime `mtime`
-- (seconds; now by default). Intermediate directories are not entries: the
-- extracting side makes them.
--
-- `gzip(data)` is one gzip member (RFC 1952) holding `data` in stored
-- (uncompressed) deflate blocks (RFC 1951, BTYPE 00): no compression, which
-- costs nothing on the wire that carries it to the service next to what
-- deflating in Lua would cost; the CRC-32 comes from the core. `tar_gz` is
-- both.
local core = require('mayura.core')
local errors = require('mayura.errors')

local M = {}

local BLOCK = 512
local MAX_STORED = 65535
local MAX_NAME = 4096
local MAX_SIZE = 8589934591   -- 11 octal digits
local MODE_FILE = tonumber('644', 8)

-- {======================================================
-- Bytes
-- =======================================================

-- `n` (0 <= n < 2^32) as `width` little-endian bytes.
local function le(n, width)
  local out = {}
  for i = 1, width do
    out[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(out)
end

-- A NUL-padded field of `width` bytes.
local function field(s, width)
  return s .. string.rep('\0', width - #s)
end

-- `n` as `digits` octal digits and a NUL.
local function octal(n, digits)
  return string.format('%0' .. digits .. 'o', n) .. '\0'
end

-- }======================================================

-- {======================================================
-- tar
-- =======================================================

local function check_name(name, i)
  if type(name) ~= 'string' or name == '' or #name > MAX_NAME or name:find('\0', 1, true)
    or name:sub(1, 1) == '/' or name:sub(-1) == '/' then
    errors.raise('INVALID_INPUT', 'entry ' .. i .. ': a name must be a relative path of 1..' .. MAX_NAME .. ' bytes',
      nil, 4)
  end
  for part in name:gmatch('[^/]+') do
    if part == '.' or part == '..' then
      errors.raise('INVALID_INPUT', 'entry ' .. i .. ': a name must not hold . or .. parts', nil, 4)
    end
  end
  if name:find('//', 1, true) then
    errors.raise('INVALID_INPUT', 'entry ' .. i .. ': a name must not hold empty parts', nil, 4)
  end
end

-- The ustar (prefix, name) of `path`, or nil when it fits no header.
local function split(path)
  if #path <= 100 then return '', path end
  -- the last '/' that leaves a prefix of at most 155 bytes and a name of at most 100
  local at = nil
  local i = 0
  while true do
    i = path:find('/', i + 1, true)
    if not i then break end
    if i - 1 <= 155 and #path - i <= 100 and #path - i > 0 then at = i end
  end
  if not at then return nil end
  return path:sub(1, at - 1), path:sub(at + 1)
end

local function header(name, prefix, size, mode, mtime, typeflag)
  local h = field(name, 100) .. octal(mode, 7) .. octal(0, 7) .. octal(0, 7) .. octal(size, 11)
    .. octal(mtime, 11) .. '        ' .. typeflag .. string.rep('\0', 100) .. 'ustar\0' .. '00'
    .. field('root', 32) .. field('root', 32) .. octal(0, 7) .. octal(0, 7) .. field(prefix, 155)
  h = field(h, BLOCK)
  local sum = 0
  for k = 1, BLOCK do sum = sum + h:byte(k) end
  return h:sub(1, 148) .. string.format('%06o', sum) .. '\0 ' .. h:sub(157)
end

local function padding(n)
  local r = n % BLOCK
  if r == 0 then return '' end
  return string.rep('\0', BLOCK - r)
end

-- A pax record `<len> key=value\n`, whose length counts its own digits.
local function pax_record(key, value)
  local body = ' ' .. key .. '=' .. value .. '\n'
  local n = #body + 1
  while #tostring(n) + #body ~= n do n = #tostring(n) + #body end
  return n .. body
end

--- A tar archive of regular files (see the module's comment).
function M.tar(entries, mtime)
  if type(entries) ~= 'table' then errors.raise('INVALID_INPUT', 'entries must be a list', nil, 2) end
  mtime = mtime or os.time()
  if type(mtime) ~= 'number' or mtime < 0 or mtime > MAX_SIZE or mtime ~= math.floor(mtime) then
    errors.raise('INVALID_INPUT', 'mtime must be whole seconds from 0', nil, 2)
  end
  local out = {}
  for i, e in ipairs(entries) do
    if type(e) ~= 'table' then errors.raise('INVALID_INPUT', 'entry ' .. i .. ' must be a table', nil, 2) end
    check_name(e.name, i)
    if type(e.data) ~= 'string' or #e.data > MAX_SIZE then
      errors.raise('INVALID_INPUT', 'entry ' .. i .. ': data must be a string', nil, 2)
    end
    local mode = e.mode or MODE_FILE
    if type(mode) ~= 'number' or mode < 0 or mode > 4095 or mode ~= math.floor(mode) then
      errors.raise('INVALID_INPUT', 'entry ' .. i .. ': mode must be permission bits (0..07777)', nil, 2)
    end
    local prefix, name = split(e.name)
    if not prefix then
      local pax = pax_record('path', e.name)
      out[#out + 1] = header('PaxHeaders/' .. i, '', #pax, MODE_FILE, mtime, 'x')
      out[#out + 1] = pax .. padding(#pax)
      prefix, name = '', e.name:sub(-100):gsub('^/+', '')
    end
    out[#out + 1] = header(name, prefix, #e.data, mode, mtime, '0')
    out[#out + 1] = e.data
    out[#out + 1] = padding(#e.data)
  end
  out[#out + 1] = string.rep('\0', 2 * BLOCK)
  return table.concat(out)
end

-- }======================================================

-- {======================================================
-- gzip
-- =======================================================

--- One gzip member holding `data` in stored deflate blocks.
function M.gzip(data)
  if type(data) ~= 'string' then errors.raise('INVALID_INPUT', 'data must be a string', nil, 2) end
  -- magic, deflate, no flags, no mtime, no extra flags, OS unknown
  local out = { '\31\139\8\0\0\0\0\0\0\255' }
  local n = #data
  local at = 1
  repeat
    local len = math.min(MAX_STORED, n - at + 1)
    local final = at + len > n
    out[#out + 1] = (final and '\1' or '\0') .. le(len, 2) .. le(MAX_STORED - len, 2)
    out[#out + 1] = data:sub(at, at + len - 1)
    at = at + len
  until final
  out[#out + 1] = le(core.crc32(data), 4) .. le(n % 4294967296, 4)
  return table.concat(out)
end

--- `gzip(tar(entries, mtime))`.
function M.tar_gz(entries, mtime)
  return M.gzip(M.tar(entries, mtime))
end

-- }======================================================

return M
