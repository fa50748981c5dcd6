--- mayura.sandbox._command_files: files over command_sandbox_backend's commands: a write as base64
-- in chunks (on standard input when the transport takes it, else in the command line) to a
-- temporary file renamed into place, reads in parts that fit the transport's answers, listings
-- (read back in parts when large) and removes. Its methods are the backend's.
local core = require('mayura.core')
local errors = require('mayura.errors')
local scripts = require('mayura.sandbox.scripts')
local run = require('mayura.sandbox._command_run')

local M = {}

local KIB, MIB = 1024, 1048576
local STDIN_CHUNK = 768 * KIB     -- raw bytes per write on standard input (1 MiB of base64)
local MAX_LISTING = 64 * MIB      -- the longest listing text read back
local MIN_ROOM = 512              -- the least base64 worth a chunk of its own command
local HEAD_ROOM = run.HEAD_ROOM

local q = scripts.quote
local nonsense, int_of, decode, expect_ok = run.nonsense, run.int_of, run.decode, run.expect_ok

local Backend = {}

-- Writes `data` to `path`: one command when it fits, else chunks appended through a short link.
function Backend:_put(path, data)
  local id = self:_id()
  local tmp = scripts.temp_name(path, self._prefix:sub(1, 8) .. id)
  local begin, commit = scripts.write_begin(path, tmp), scripts.write_commit(tmp, path)
  local b64 = core.base64.encode
  if self._stdin and #data <= STDIN_CHUNK then
    return expect_ok(self:_run(begin .. scripts.write_chunk(tmp, nil) .. commit, b64(data)), 3, 'the file')
  end
  if not self._stdin and math.ceil(#data / 3) * 4 < self._max then
    local one = begin .. scripts.write_chunk(tmp, b64(data)) .. commit
    if #one <= self._max then return expect_ok(self:_run(one), 3, 'the file') end
  end
  local link = self._state .. '/w' .. id
  begin, commit = scripts.write_begin(path, tmp, link), scripts.write_commit(tmp, path, link)
  local ok, err = pcall(function()
    local pending, parts = begin, 1
    local bare = #scripts.write_chunk(link, '')
    if #pending + bare + MIN_ROOM > self._max then
      expect_ok(self:_run(pending), 1, 'the file')
      pending, parts = '', 0
    end
    local off, committed = 0, false
    repeat
      local take = STDIN_CHUNK
      if not self._stdin then take = math.floor((self._max - #pending - bare) / 4) * 3 end
      take = math.min(take, #data - off)
      local piece = b64(data:sub(off + 1, off + take))
      local script, stdin
      if self._stdin then
        script, stdin = pending .. scripts.write_chunk(link, nil), piece
      else
        script = pending .. scripts.write_chunk(link, piece)
      end
      off = off + take
      parts = parts + 1
      if off >= #data and #script + #commit <= self._max then
        script, parts, committed = script .. commit, parts + 1, true
      end
      expect_ok(self:_run(script, stdin), parts, 'the file')
      pending, parts = '', 0
    until off >= #data
    if not committed then expect_ok(self:_run(commit), 1, 'the file') end
  end)
  if not ok then
    if not self._closed then pcall(self._run, self, scripts.write_abort(tmp, link)) end
    error(err, 0)
  end
end

-- One read: nil for no file, else the size the header gave and the bytes.
function Backend:_read_part(path, offset, length)
  local out = self:_run(scripts.read(path, offset, length))
  local head, rest = out:match('^([^\n]*)\n?(.*)$')
  if head == 'N' then return nil end
  local code = head:match('^E ([%w_]+)$')
  if code then error(scripts.script_error(code, 'the file'), 0) end
  local size = int_of(head:match('^F (%d+)$'))
  if not size then error(nonsense(), 0) end
  return size, decode(rest)
end

-- Rounds up to whole 4 KiB pages (so that dd reads whole blocks), at most a read's chunk.
function Backend:_read_len(n)
  return math.min(self._read_chunk, math.ceil(n / 4096) * 4096)
end

-- The first `limit` bytes of a file (nil when there is none), and its size; with `refuse`, a file
-- larger than `limit` is LIMIT_EXCEEDED as soon as its size is known.
function Backend:_read_upto(path, limit, refuse)
  local size, data = self:_read_part(path, 0, self:_read_len(math.min(limit, self._read_chunk)))
  if not size then return nil end
  local function check_size(s)
    if refuse and s > limit then errors.raise('LIMIT_EXCEEDED', 'the file is larger than max_bytes', nil, 0) end
  end
  check_size(size)
  local parts, got = { data }, #data
  local want = math.min(size, limit)
  while got < want and #parts[#parts] > 0 do
    local s, more = self:_read_part(path, got, self:_read_len(want - got))
    if not s then break end
    check_size(s)
    if s > size then size = s end
    parts[#parts + 1] = more
    got = got + #more
  end
  local all = table.concat(parts)
  if #all > want then all = all:sub(1, want) end
  return all, size
end

function Backend:read_file(path, o)
  return (self:_read_upto(path, o and o.max_bytes or 16 * MIB, true))
end

function Backend:write_file(path, data)
  self:_put(path, data)
end

function Backend:list_files(path)
  -- the listing goes to a file; it comes back with the answer when it fits, else read in parts
  local name = self._state .. '/l' .. self:_id()
  local f = q(name)
  local out = self:_run('(' .. scripts.list(path) .. ') >' .. f .. '\n' ..
    's=$(stat -c %s -- ' .. f .. ')||s=0\nif [ "$s" -le ' .. (self._out - HEAD_ROOM) .. ' ];then ' ..
    'cat -- ' .. f .. ';rm -f -- ' .. f .. ';else echo "S $s";fi\n')
  local big = int_of(out:match('^S (%d+)\n$'))
  if big then
    if big > MAX_LISTING then
      pcall(self._run, self, 'rm -f -- ' .. f .. '\n')
      errors.raise('LIMIT_EXCEEDED', 'the listing is too large', nil, 0)
    end
    local ok, text = pcall(self._read_upto, self, name, big)
    pcall(self._run, self, 'rm -f -- ' .. f .. '\n')
    if not ok then error(text, 0) end
    out = text or ''
  end
  local ok, res = pcall(scripts.parse_listing, out)
  if not ok then error(res, 0) end
  return res
end

function Backend:remove_file(path, o)
  scripts.remove_result(self:_run(scripts.remove(path, o and o.recursive)), nonsense)
end

M.methods = Backend

return M
