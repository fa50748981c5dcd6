--- mayura.sandbox._agent_files: files over the in-sandbox agent's channel, and its error replies.
--
-- The file methods every backend of mayura.sandbox._agent_backend has (`read_file`, `write_file`,
-- `list_files`, `remove_file`, in `methods`), over the backend's `call`; and `reply_error`, the
-- agent's error replies in our words, which its exec uses too.
--
-- Files move in parts of FILE_PART_BYTES (1 MiB), each its own request, so
-- the host's loop handles at most one part in a callback and runs other work
-- between parts (an embedding host's frame stays short): read_file asks for
-- ranges until `eof`, write_file uploads to a temporary file that the last
-- part renames over the path, all or nothing (core/wire.h, agent/fileops.c).
-- The memory of a large file's string is readied while its parts come: off
-- the host's thread under mayura_newstate (core.expect_bytes), else taken from
-- the state's own allocator at once and written a part at a time
-- (core.prepare_bytes), so the step that makes the string pays for its copy
-- alone.
--
-- What the agent answers is untrusted (code in the sandbox runs as its user
-- and may replace it): its error strings are mapped to our own messages and
-- never passed on. A listing is capped on both sides (LIST_MAX_ENTRIES,
-- LIST_MAX_NAME_BYTES: beyond them LIMIT_EXCEEDED), its reply frame too, so
-- one call cannot grow the host by more than a few tens of MiB.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local MIB = 1048576

--- The largest frame the host accepts from an agent: a file of the pool's
-- largest max_file_bytes (512 MiB) and output caps, with room to spare.
M.MAX_FRAME_BYTES = 1024 * MIB

--- The most a listing holds (the agent's own caps, agent/fileops.c): entries, and bytes of names.
M.LIST_MAX_ENTRIES = 100000
M.LIST_MAX_NAME_BYTES = 16 * MIB
-- A listing's reply frame at those caps: names with their lengths, types, sizes and times.
local LIST_MAX_REPLY_BYTES = 20 * MIB

local function too_many_entries()
  return errors.new('LIMIT_EXCEEDED', ('the directory has more than %d entries or %d MiB of names')
    :format(M.LIST_MAX_ENTRIES, math.floor(M.LIST_MAX_NAME_BYTES / MIB)))
end

local function nonsense()
  return errors.sandbox('failed', 'the sandbox agent answered nonsense')
end

--- An agent's reply that is none of the answers it may give.
M.nonsense = nonsense

--- Maps an agent's error reply to a coded error about `what`, in our words: the one table of the
-- agent's error names (mayura.sandbox.scripts' script_error, which the command backends' scripts
-- use too), and a listing past the agent's caps.
function M.reply_error(reply, what)
  if reply.error == 'too_many_entries' then return too_many_entries() end
  return scripts.script_error(reply.error, what)
end

local Methods = {}

--- The file methods of a backend (see the top of this module).
M.methods = Methods

-- A part of a file read or written in parts: each is its own request and reply, so the host's
-- loop handles at most this much of a file in one callback and runs other work between parts.
M.FILE_PART_BYTES = MIB

-- Joins the parts of a file read in parts into one string. table.concat grows its buffer by
-- doubling, copying the bytes several times over (about 18 ms for 16 MiB here, in one callback);
-- one `..` expression over all the parts makes the string in one allocation and one copy. A
-- function per count of parts is made once (an expression takes at most JOIN_MAX operands: more
-- parts are joined JOIN_MAX at a time first).
local JOIN_MAX = 128
local joiners = {}
local function join(parts)
  local n = #parts
  if n == 1 then return parts[1] end
  if n > JOIN_MAX then
    local groups = {}
    for i = 1, n, JOIN_MAX do
      groups[#groups + 1] = join({ (table.unpack or unpack)(parts, i, math.min(i + JOIN_MAX - 1, n)) })
    end
    return join(groups)
  end
  local f = joiners[n]
  if not f then
    local terms = {}
    for i = 1, n do terms[i] = 'p[' .. i .. ']' end
    f = assert(load('local p = ... return ' .. table.concat(terms, '..'), '=join', 't', {}))
    joiners[n] = f
  end
  return f(parts)
end

local function file_changed()
  return errors.sandbox('failed', 'the file kept changing while it was read')
end

-- LuaJIT's string buffers (nil elsewhere). LuaJIT's `..` copies its operands into a buffer of its
-- own before the string: with one of these, sized ahead, each part is copied in as it comes, in
-- the step that received it, and the step that ends the read copies the file once.
local string_buffer = rawget(_G, 'jit') and select(2, pcall(require, 'string.buffer'))
if type(string_buffer) ~= 'table' then string_buffer = nil end

-- One pass of read_parts: the file's bytes, nil when missing, or false when it changed in between.
local function read_pass(self, path, max)
  local parts, got, first, buf, block = {}, 0, nil, nil, nil
  -- what is left when the pass ends without its string (a changed file, an error)
  local function drop()
    if buf then buf:free() end
    if block then block:free() end
  end
  while true do
    local ok, reply = pcall(self.call, self, { op = 'read', path = path, max_bytes = max, offset = got,
      length = M.FILE_PART_BYTES })
    if not ok then
      drop()
      error(reply, 0)
    end
    if reply.missing then
      drop()
      return got > 0 and false or nil
    end
    if reply.error then
      drop()
      error(M.reply_error(reply, 'the file'), 0)
    end
    -- no file is said with `missing`: a reply with neither is nonsense, not "no file"
    if type(reply.data) ~= 'string' or type(reply.size) ~= 'number' or type(reply.eof) ~= 'boolean' then
      drop()
      error(nonsense(), 0)
    end
    if first == nil then
      first = reply
      -- a file of several parts: the host's allocator may ready the memory of the whole string
      -- ahead (the size is the agent's word: only one that could be read is taken as a hint)
      if not reply.eof and reply.size >= M.FILE_PART_BYTES and reply.size <= (max or M.MAX_FRAME_BYTES) then
        core.expect_bytes(math.floor(reply.size))
        -- under the host's own allocator: the string's block, taken now and written a part at a time
        block = core.prepare_bytes(math.floor(reply.size))
        -- (sized for at most 64 MiB ahead: past that it grows as the parts come; its memory is
        -- announced too, or it could take the block readied for the string)
        if string_buffer then
          local size = math.min(math.floor(reply.size), 64 * MIB)
          core.expect_bytes(size)
          local made, b = pcall(string_buffer.new, size)
          buf = made and b or nil
        end
      end
    elseif reply.size ~= first.size or reply.ino ~= first.ino or reply.mtime_ns ~= first.mtime_ns then
      drop()
      return false
    end
    got = got + #reply.data
    if max and got > max then
      drop()
      error(M.reply_error({ error = 'too_large' }, 'the file'), 0)
    end
    -- copying a part into the buffer and readying as much of the string's memory costs up to a
    -- millisecond (page faults, under the host's own allocator): under a host's budget it starts
    -- only with a quarter of the step left
    if buf or block then task.fresh_step(0.75) end
    if buf then buf:put(reply.data) else parts[#parts + 1] = reply.data end
    if block then block:touch(#reply.data) end
    if reply.eof then
      -- the copy of a large file into one string cannot be cut: under a host's budget it begins a step
      if not buf and not block and #parts < 4 then return join(parts) end
      task.fresh_step(0.25)
      local function make()
        return buf and buf:tostring() or join(parts)
      end
      local data = block and block:make(make) or make()
      core.end_step()   -- nothing more piles onto this frame
      -- what is let go of (many MiB given back to the system) begins the next step
      task.fresh_step(0.25)
      drop()
      return data
    end
    if #reply.data == 0 then
      drop()
      error(nonsense(), 0)
    end
  end
end

-- Reads the whole file in parts (`offset`, `length`); nil when missing. Every part must come from
-- the same file (inode, size, mtime): when it changed in between, the read starts again, three
-- times at most.
local function read_parts(self, path, max)
  for _ = 1, 3 do
    local data = read_pass(self, path, max)
    if data ~= false then return data end
  end
  error(file_changed(), 0)
end

function Methods:read_file(path, o)
  return read_parts(self, path, o.max_bytes)
end

-- Writes data in parts of FILE_PART_BYTES: the first begins an upload (a temporary file beside the
-- path), each next one appends, the last renames it over the path: all or nothing. A write that
-- fails part way drops the upload (the agent removes its temporary file).
function Methods:write_file(path, data)
  local part = M.FILE_PART_BYTES
  if #data <= part then
    local reply = self:call({ op = 'write', path = path, data = data })
    if reply.error then error(M.reply_error(reply, 'the file'), 0) end
    if reply.ok ~= true then error(nonsense(), 0) end
    return
  end
  -- Each part is a copy of 1 MiB and its frame: under a host's budget one starts only with a quarter
  -- of the step left, and the memory of the next one is readied while it is sent.
  local function part_at(at, more)
    task.fresh_step(0.75)
    local chunk = data:sub(at, at + part - 1)
    if more then core.expect_bytes(part) end
    return chunk
  end
  local reply = self:call({ op = 'write', path = path, data = part_at(1, true), more = true })
  if reply.error then error(M.reply_error(reply, 'the file'), 0) end
  local upload = reply.upload
  if reply.ok ~= true or type(upload) ~= 'number' then error(nonsense(), 0) end
  local ok, err = pcall(function()
    for at = part + 1, #data, part do
      local last = at + part > #data
      local r = self:call({ op = 'write', upload = upload, data = part_at(at, not last), more = not last or nil })
      if r.error then error(M.reply_error(r, 'the file'), 0) end
      if r.ok ~= true then error(nonsense(), 0) end
    end
  end)
  if not ok then
    -- an agent that failed a part dropped the upload already; one we stopped is dropped now
    if not self.closed then
      pcall(self.ch.call, self.ch, { op = 'write', upload = upload, abort = true }, function() end)
    end
    error(err, 0)
  end
end

function Methods:list_files(path)
  -- the agent caps a listing (too_many_entries); one that says more is not read past the frame cap
  local reply = self:call({ op = 'list', path = path }, nil, LIST_MAX_REPLY_BYTES)
  if reply.missing then return nil end
  if reply.error then error(M.reply_error(reply, 'the path'), 0) end
  local names, types, sizes, times = reply.names, reply.types, reply.sizes, reply.modified
  if type(names) ~= 'table' or type(types) ~= 'table' or type(sizes) ~= 'table' or type(times) ~= 'table'
    or #types ~= #names or #sizes ~= #names or #times ~= #names then
    error(nonsense(), 0)
  end
  if #names > M.LIST_MAX_ENTRIES then error(too_many_entries(), 0) end
  local bytes = 0
  for _, name in ipairs(names) do bytes = bytes + (type(name) == 'string' and #name or 0) end
  if bytes > M.LIST_MAX_NAME_BYTES then error(too_many_entries(), 0) end
  local out = {}
  for i, name in ipairs(names) do
    out[i] = { name = name, type = types[i], size = sizes[i], modified = times[i] }
  end
  return out
end

function Methods:remove_file(path, o)
  local reply = self:call({ op = 'remove', path = path, recursive = o.recursive == true })
  if reply.error then error(M.reply_error(reply, 'the path'), 0) end
  if type(reply.removed) ~= 'boolean' then error(nonsense(), 0) end
end

return M
