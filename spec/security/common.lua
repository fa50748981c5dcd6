--- What the abuse specs share: the hostile program, running it in a sandbox, host measurements.
--
--   local common = require('security.common')
--   common.install(sb)                         -- puts the abuse program at common.ABUSE
--   local r, kv = common.abuse(sb, { 'forks', '1000' }, { timeout_ms = 5000 })
--   kv.forks, kv.err                           -- its key=value lines
local core = require('mayura.core')
local task = require('mayura._task')
local util = require('support.util')
local compat = require('support.compat')

local M = {}

M.ABUSE = '/tmp/.abuse'
M.SOURCE = 'spec/security/abuse.c'

local binary

--- The abuse program, built static from spec/security/abuse.c (once per run).
function M.abuse_binary()
  if binary then return binary end
  local dir = util.tmpdir()
  local out = dir .. '/abuse'
  local ok = compat.execute('cc -static -O2 -o ' .. out .. ' ' .. M.SOURCE .. ' -lpthread 2>' .. dir .. '/cc.log')
  local f = io.open(out, 'rb')
  if not ok or not f then
    local log = io.open(dir .. '/cc.log'):read('a')
    util.rmdir(dir)
    error('cannot build ' .. M.SOURCE .. ' (a C compiler and a static libc are needed): ' .. log, 0)
  end
  binary = f:read('a')
  f:close()
  util.rmdir(dir)
  return binary
end

--- Runs a shell script in the sandbox.
function M.sh(sb, script, opts)
  return sb:exec({ 'sh', '-c', script }, opts)
end

--- Puts the abuse program in the sandbox (again when it is not there).
function M.install(sb)
  local r = sb:exec({ 'test', '-x', M.ABUSE })
  if r.exit_code == 0 then return end
  sb:write_file(M.ABUSE, M.abuse_binary())
  r = sb:exec({ 'chmod', '755', M.ABUSE })
  assert(r.exit_code == 0, 'chmod of the abuse program failed: ' .. r.stderr)
end

--- The key=value pairs of a text (one per line, or several separated by spaces).
function M.kv(text)
  local t = {}
  -- token by token (a pattern over the whole text would backtrack for ever on a flood's output)
  for token in text:gmatch('%S+') do
    local eq = token:find('=', 1, true)
    if eq and eq > 1 and #token < 4096 then
      local k = token:sub(1, eq - 1)
      if k:match('^[%w_/%.%-]+$') then t[k] = token:sub(eq + 1) end
    end
  end
  return t
end

--- Runs the abuse program with `args`; returns the exec result and its key=value output.
function M.abuse(sb, args, opts)
  local argv = { M.ABUSE }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local r = sb:exec(argv, opts)
  return r, M.kv(r.stdout)
end

--- Expects `fn(...)` to raise a coded error of `code`; returns it.

--- Whether the error is SANDBOX_ERROR reason gone.
function M.is_gone(err)
  return type(err) == 'table' and err.code == 'SANDBOX_ERROR' and err.reason == 'gone'
end

--- Waits ms on the loop.
function M.sleep(ms)
  task.sleep(ms)
end

--- How many processes the host has (all of them, sandboxes' included).
function M.host_processes()
  local n = 0
  local ls = io.popen('ls /proc')
  for name in ls:lines() do
    if name:match('^%d+$') then n = n + 1 end
  end
  ls:close()
  return n
end

function M.pid_max()
  local f = io.open('/proc/sys/kernel/pid_max')
  local n = f and tonumber(f:read('l')) or 32768
  if f then f:close() end
  return n
end

function M.mem_available_kib()
  local f = assert(io.open('/proc/meminfo'))
  local s = f:read('a')
  f:close()
  return tonumber(s:match('MemAvailable:%s*(%d+)'))
end

--- Runs `fn` in a task and returns the task (its errors come out of :wait()).
function M.spawn(fn)
  return task.spawn(fn)
end

--- Milliseconds since some point (monotonic).
function M.now()
  return core.hrtime_ms()
end

--- Polls `pred` for up to `ms`.
function M.eventually(pred, ms)
  return util.eventually(pred, ms)
end

--- A host file with known bytes, outside every sandbox; `check()` says whether it is intact.
function M.canary(dir, name)
  local path = dir .. '/' .. name
  local text = 'host canary ' .. name .. ' ' .. tostring(math.random(1e9))
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
  return {
    path = path,
    check = function()
      local g = io.open(path, 'r')
      if not g then return false end
      local got = g:read('a')
      g:close()
      return got == text
    end,
  }
end

return M
