--- mayura.sandbox._command_run: how command_sandbox_backend runs one script through its
-- transport: the setup its first call carries (the state directory, the workdir, the tools), the
-- end line that tells a whole answer from a cut one, the transport's rate as a token bucket per
-- `rate` table, a script longer than one command written to a file and sourced, the small files of
-- ended commands removed in batches, and the errors of an answer. Its methods are the backend's.
local core = require('mayura.core')
local errors = require('mayura.errors')
local task = require('mayura._task')
local check = require('mayura._check')
local scripts = require('mayura.sandbox.scripts')

local M = {}

local HEAD_ROOM = 256             -- an answer's lines besides its base64 (headers, sizes, the end)
local END = ':end'                -- the last line of every answer: without it, it was cut
local READY = ':ready'            -- the setup's last line (it then goes on with the call's script)
local TRAP = "trap 'echo " .. END .. "' EXIT\n"   -- starts every command (its room is kept)
local TRASH_BATCH = 16            -- ended commands whose small files one rm removes, with a later call
local TOOLS = { 'base64', 'stat', 'dd', 'od', 'awk', 'tr', 'grep', 'mkdir', 'mv', 'rm', 'rmdir', 'ln', 'kill',
  'sleep', 'setsid', 'head', 'tail' }

local q = scripts.quote

local function gone()
  return errors.sandbox('gone', 'the sandbox is gone')
end

local function nonsense()
  return errors.sandbox('failed', 'the sandbox answered a backend command with nonsense')
end

local function cut()
  return errors.sandbox('truncated', 'the transport cut the answer of a backend command short')
end

local lines_of = scripts.lines

local function int_of(s)
  if type(s) ~= 'string' or not s:match('^%d+$') or #s > 15 then return nil end
  return math.tointeger and math.tointeger(tonumber(s)) or tonumber(s)
end

local function decode(b64)
  local data = core.base64.decode(b64)
  if not data then error(nonsense(), 0) end
  return data
end

local Backend = {}

-- The calls' buckets, one per `transport.rate` table (a provider that gives every sandbox of an
-- account the same table keeps them all within the account's rate together).
local buckets = setmetatable({}, { __mode = 'k' })

-- Waits `ms`, or less when rec.wake() is called (a cancel, a release).
local function nap(rec, ms)
  local uv = require('luv')
  task.await(function(done)
    local timer = uv.new_timer()
    local fired = false
    local function fire()
      if fired then return end
      fired = true
      rec.wake = nil
      if not timer:is_closing() then
        timer:stop()
        timer:close()
      end
      done()
    end
    rec.wake = fire
    timer:start(math.max(1, math.ceil(ms)), 0, fire)
  end)
end

-- {======================================================
-- Running scripts
-- =======================================================

function Backend:_id()
  self._seq = self._seq + 1
  return self._seq
end

-- The setup's answer at the start of `out` (see _raw): raises what it says went wrong, else
-- returns the rest.
local KNOWN_TOOLS = {}
for _, t in ipairs(TOOLS) do KNOWN_TOOLS[t] = true end
local function after_setup(out)
  local head, rest = out:match('^(.-)' .. READY .. '\n(.*)$')
  if head == '' then return rest end
  for line in ((head or out) .. '\n'):gmatch('([^\n]*)\n') do
    local tool = line:match('^M (%S+)$')
    if tool and KNOWN_TOOLS[tool] then
      error(errors.sandbox('failed', 'the sandbox has no ' .. tool .. ', which the command backend needs'), 0)
    end
    if line == 'E state' then error(errors.sandbox('failed', 'cannot make the backend\'s state directory'), 0) end
    if line == 'E workdir' then error(errors.sandbox('failed', 'cannot make the working directory'), 0) end
  end
  error(nonsense(), 0)
end

-- Runs one script through the transport (raw: also after release, `bare`: without the setup);
-- returns its stdout. `wait_ms`: the call runs a command itself and may take that long for it.
-- Until one call has run the setup (made the state directory, found the tools), each call runs
-- it first (alone first when the two would not fit in one command).
function Backend:_raw(script, stdin, signal, bare, wait_ms)
  local t = self._transport
  local setup = not bare and self._setup
  if setup and #setup + #script > self._max then
    after_setup(self:_raw(setup, nil, signal, true))
    self._setup, setup = nil, nil
  end
  if setup then script = setup .. script end
  self:_take()
  -- the shell says it ended, whichever way it exits (a subshell does not inherit the trap)
  local ok, res = pcall(t.run, t, TRAP .. script, { stdin = stdin, signal = signal, wait_ms = wait_ms })
  if not ok then
    if errors.is(res) then
      if getmetatable(res) == nil then setmetatable(res, errors.mt) end
      error(res, 0)
    end
    error(errors.sandbox('failed', 'the transport failed'), 0)
  end
  if type(res) ~= 'table' or not check.is_int(res.exit_code) or type(res.stdout) ~= 'string' then
    error(errors.sandbox('failed', 'the transport returned an invalid result'), 0)
  end
  if res.exit_code ~= 0 then error(errors.sandbox('failed', 'a backend command failed in the sandbox'), 0) end
  local out = res.stdout
  -- the end line (a transport may drop the last newline); nothing may follow it
  if out:sub(-#END - 1) == END .. '\n' then out = out:sub(1, -#END - 2)
  elseif out:sub(-#END) == END and (#out == #END or out:sub(-#END - 1, -#END - 1) == '\n') then
    out = out:sub(1, -#END - 1)
  else
    error(cut(), 0)
  end
  if res.truncated == true then error(cut(), 0) end
  if setup then
    out = after_setup(out)
    self._setup = nil
  end
  return out
end

-- Waits until the transport's rate allows one more call (a token of its bucket: `burst` at most,
-- `per_second` more each second), then takes it; a stop waits too (the service would refuse it).
function Backend:_take()
  local r = self._rate
  if not r then return end
  local b = buckets[r]
  if not b then
    b = { tokens = r.burst, at = core.hrtime_ms() }
    buckets[r] = b
  end
  while true do
    local now = core.hrtime_ms()
    b.tokens = math.min(r.burst, b.tokens + (now - b.at) * r.per_second / 1000)
    b.at = now
    if b.tokens >= 1 then
      b.tokens = b.tokens - 1
      return
    end
    nap({}, (1 - b.tokens) * 1000 / r.per_second)
  end
end

-- Runs a script (`wait_ms` as for _raw); one longer than max_command_bytes is written to a file in
-- chunks, then sourced.
function Backend:_run(script, stdin, signal, wait_ms)
  if self._closed then error(gone(), 0) end
  local trash = self._trash
  if #trash >= TRASH_BATCH then
    local names = {}
    for i, base in ipairs(trash) do names[i] = q(base) .. '.*' end
    local rm = 'rm -f -- ' .. table.concat(names, ' ') .. ' </dev/null >/dev/null 2>&1 &\n'
    if #rm + #script <= self._max then
      self._trash = {}
      script = rm .. script
    end
  end
  if #script > self._max then
    local name = self._state .. '/s' .. self:_id()
    self:_put(name, 'rm -f -- ' .. q(name) .. '\n' .. script)
    script = '. ' .. q(name) .. '\n'
  end
  local out = self:_raw(script, stdin, signal, nil, wait_ms)
  if self._closed then error(gone(), 0) end
  return out
end

-- Expects `n` lines 'OK'; an 'E <name>' line is raised as the error it names about `what`.
local function expect_ok(out, n, what)
  local lines = lines_of(out)
  for _, line in ipairs(lines) do
    local code = line:match('^E ([%w_]+)$')
    if code then error(scripts.script_error(code, what), 0) end
  end
  if #lines ~= n then error(nonsense(), 0) end
  for _, line in ipairs(lines) do
    if line ~= 'OK' then error(nonsense(), 0) end
  end
end

-- }======================================================

M.methods = Backend
M.HEAD_ROOM, M.READY, M.TRAP, M.TOOLS = HEAD_ROOM, READY, TRAP, TOOLS
M.gone, M.nonsense, M.int_of, M.decode, M.expect_ok, M.nap = gone, nonsense, int_of, decode, expect_ok, nap

return M
