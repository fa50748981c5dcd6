--- mayura.sandbox._host: small host-side helpers shared by the local and Docker providers.
--
-- Finding programs and the in-sandbox agent, reading and writing small host
-- files (cgroup knobs, /proc), random ids, and a waiting wrapper for the core's
-- callback-style calls.
local core = require('mayura.core')
local task = require('mayura._task')

local M = {}

--- Waits for a callback-style core call: `start(cb)`; returns what `cb` got.
function M.await(start)
  return task.await(function(done) start(function(...) done(...) end) end)
end

function M.exists(path)
  local f = io.open(path, 'r')
  if f then f:close() return true end
  return false
end

--- The whole of a small file, or nil.
function M.read_plain(path)
  local f = io.open(path, 'r')
  if not f then return nil end
  local s = f:read('a')
  f:close()
  return s
end

--- Writes a small file in place (cgroup knobs cannot be replaced by a rename); returns success.
function M.write_plain(path, text)
  local f = io.open(path, 'w')
  if not f then return false end
  local ok = f:write(text)
  local closed = f:close()
  return ok ~= nil and closed ~= nil
end

function M.absolute(path)
  if path:sub(1, 1) == '/' then return path end
  path = path:gsub('^%./', '')
  return (os.getenv('PWD') or '.') .. '/' .. path
end

--- The path of a program: `name` itself when it has a slash, else the first match on PATH.
function M.find_in_path(name)
  if name:find('/', 1, true) then return M.exists(name) and M.absolute(name) or nil end
  for dir in (os.getenv('PATH') or '/usr/local/bin:/usr/bin:/bin'):gmatch('[^:]+') do
    local p = dir .. '/' .. name
    if M.exists(p) then return p end
  end
  return nil
end

--- The agent binary: MAYURA_AGENT, this checkout's build/, beside an installed core (a rock), or the
-- installed tree.
function M.find_agent()
  local env = os.getenv('MAYURA_AGENT')
  if env and env ~= '' and M.exists(env) then return M.absolute(env) end
  local src = debug.getinfo(1, 'S').source
  if src:sub(1, 1) == '@' then
    local file = src:sub(2)
    local root = file:match('^(.*)/providers/mayura/sandbox/_host%.lua$')
    if root == nil and file == 'providers/mayura/sandbox/_host.lua' then root = '.' end
    if root then
      local p = root .. '/build/mayura-agent'
      if M.exists(p) then return M.absolute(p) end
    end
  end
  -- A rock keeps its programs beside the core it installed (<libdir>/mayura/).
  local so = package.searchpath('mayura.core', package.cpath)
  local beside = so and so:match('^(.*)/core%.[^/]*$')
  if beside and M.exists(beside .. '/mayura-agent') then return M.absolute(beside .. '/mayura-agent') end
  for _, p in ipairs({ '/usr/local/lib/mayura/mayura-agent', '/usr/lib/mayura/mayura-agent' }) do
    if M.exists(p) then return p end
  end
  return nil
end

--- `n` random bytes as hex.
function M.random_hex(n)
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(n)
  if f then f:close() end
  if not bytes or #bytes ~= n then
    bytes = (tostring(core.hrtime_ms()) .. tostring(math.random())):sub(1, n)
  end
  return (bytes:gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

--- This process's effective uid (from /proc).
function M.uid()
  local st = M.read_plain('/proc/self/status') or ''
  local _, euid = st:match('\nUid:%s+(%d+)%s+(%d+)')
  return tonumber(euid)
end

--- This host process's mark: `PID-START` (its start time in /proc/PID/stat, in clock ticks since
-- boot), so that what it leaves on the host (a snapshot) can be told from what a live one holds.
local own_mark
function M.process_mark()
  if not own_mark then
    local pid = ('%d'):format(require('luv').os_getpid())
    own_mark = pid .. '-' .. (M.start_time(pid) or '0')
  end
  return own_mark
end

--- This process's pid namespace (the number of /proc/self/ns/pid), or nil: a process mark names a
-- process of that namespace alone.
function M.pid_namespace()
  local ok, link = pcall(require('luv').fs_readlink, '/proc/self/ns/pid')
  return ok and type(link) == 'string' and link:match('^pid:%[(%d+)%]$') or nil
end

--- The start time of process `pid` (/proc/PID/stat's 22nd field, a string), or nil.
function M.start_time(pid)
  local stat = M.read_plain('/proc/' .. pid .. '/stat')
  local rest = stat and stat:match('.*%)%s+(.*)$')
  if not rest then return nil end
  local fields = {}
  for f in rest:gmatch('%S+') do fields[#fields + 1] = f end
  return fields[20]
end

--- Whether the process a mark names (process_mark) is still running.
function M.mark_alive(mark)
  local pid, start = tostring(mark):match('^(%d+)%-(%d+)$')
  return pid ~= nil and M.start_time(pid) == start
end

return M
