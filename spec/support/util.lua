--- Helpers shared by the specs: waiting on callbacks, finding processes, temp dirs.
local core = require('mayura.core')

local M = {}

--- Waits for a callback-style call: `start(done)`; returns what `done` got.
function M.wait(start)
  local done, a, b = false, nil, nil
  start(function(x, y)
    done = true
    a, b = x, y
  end)
  while not done do core.run_once() end
  return a, b
end

--- The pids of live (not zombie) processes whose command line contains `needle`.
function M.procs_matching(needle)
  local found = {}
  local ls = io.popen('ls /proc')
  for name in ls:lines() do
    if name:match('^%d+$') then
      local f = io.open('/proc/' .. name .. '/cmdline', 'rb')
      if f then
        local cmd = (f:read('a') or ''):gsub('%z', ' ')
        f:close()
        local st = io.open('/proc/' .. name .. '/stat', 'r')
        local stat = st and st:read('a') or ''
        if st then st:close() end
        local state = stat:match('%) (%a)')
        if cmd:find(needle, 1, true) and state ~= 'Z' then table.insert(found, tonumber(name)) end
      end
    end
  end
  ls:close()
  return found
end

--- Kills every process whose command line contains `needle`.
function M.kill_matching(needle)
  for _, pid in ipairs(M.procs_matching(needle)) do os.execute('kill -9 ' .. pid .. ' 2>/dev/null') end
end

--- The resident set size of this process, in KiB.
function M.rss_kib()
  local f = assert(io.open('/proc/self/status'))
  local s = f:read('a')
  f:close()
  return tonumber(s:match('VmRSS:%s*(%d+)'))
end

--- A fresh temporary directory; remove it with M.rmdir.
function M.tmpdir()
  local p = io.popen('mktemp -d /tmp/mayura-spec-XXXXXX')
  local dir = p:read('l')
  p:close()
  return dir
end

--- A fresh directory for an image of the local provider: run as root, one that root alone may
--- write, as is every directory above it (the provider refuses an image under /tmp then); else
--- M.tmpdir(). Remove it with M.rmdir.
function M.image_tmpdir()
  local f = io.open('/proc/self/status')
  local s = f and f:read('a') or ''
  if f then f:close() end
  if s:match('\nUid:%s+%d+%s+(%d+)') ~= '0' then return M.tmpdir() end
  local p = io.popen('d=$(mktemp -d /run/mayura-spec-XXXXXX) && chmod 755 "$d" && echo "$d"')
  local dir = p:read('l')
  p:close()
  return dir
end

function M.rmdir(dir)
  assert(dir:match('^/tmp/mayura%-spec%-') or dir:match('^/run/mayura%-spec%-'))
  os.execute("rm -rf '" .. dir .. "'")
end

--- Polls `pred()` up to `ms` milliseconds while running the loop; returns its last value.
function M.eventually(pred, ms)
  local uv = require('luv')
  local deadline = uv.hrtime() / 1e6 + (ms or 2000)
  local v = pred()
  while not v and uv.hrtime() / 1e6 < deadline do
    -- sleep 20 ms on the loop, so callbacks (a process ending, say) still run meanwhile
    M.wait(function(done)
      local t = uv.new_timer()
      t:start(20, 0, function() t:close(); done() end)
    end)
    v = pred()
  end
  return v
end

--- Runs `fn` with the core's error reports (errors of loop callbacks, core.report) collected
-- instead of printed; returns the reports, a list of strings.
function M.capture_reports(fn)
  local reports = {}
  local previous = core.set_reporter(function(msg) reports[#reports + 1] = msg end)
  local ok, err = pcall(fn)
  core.set_reporter(previous)
  if not ok then error(err, 0) end
  return reports
end

--- nil when another user can reach the checkout (every directory from / to it lets others pass,
-- so they can run build/mayura and read the Lua), else the first directory that does not: a
-- clone made in a directory of mode 700 (mktemp -d) is out of their reach.
function M.checkout_closed_to_others()
  local uv = require('luv')
  local at = ''
  for part in assert(uv.fs_realpath('.')):gmatch('[^/]+') do
    at = at .. '/' .. part
    local st = uv.fs_stat(at)
    if not st or st.mode % 2 ~= 1 then return at end   -- no x for others
  end
  return nil
end

--- For a describe block whose specs run build/mayura as users it makes: when the checkout is out of
-- their reach, a pending spec says so (`why`: what those users run; `pending`: the spec file's own,
-- at the describe level) and this returns true, and the block should return.
function M.pending_if_closed_to_others(why, pending)
  local closed = M.checkout_closed_to_others()
  if not closed then return false end
  pending('cannot run here: the checkout is out of other users\' reach (' .. closed .. ' lets no other user pass); ' ..
    why .. ': clone it where others can reach it')
  return true
end

return M
