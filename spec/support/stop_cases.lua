--- Cases for how a provider stops a command (its timeout, a cancel): once the stop begins, no
-- process of the command runs another statement, whatever order its pids fall in. A stop that
-- kills one process at a time in /proc's order kills pid 100 before pid 99, so a shell at 99
-- whose child at 100 died first runs its next statement; these cases put such pairs across a
-- power of ten on purpose (the sandbox's pids are made to run up to just below one by forking
-- short-lived processes) and have each shell write a line if it ever gets to run on.
--
--   stop_cases.describe(function() return sb end)   -- inside a describe of a provider's spec
--
-- Each case makes a fresh sandbox of the same provider (a pool of its own) and stops its first
-- command; the sandbox needs a pid namespace of its own (as a stand-in's local sandboxes and
-- Docker containers have), whose pids start small.
local busted = require('busted')
local assert = require('luassert')
local task = require('mayura._task')
local errors = require('mayura.errors')

local it = busted.it

local M = {}

local function sh(sb, script, o)
  return sb:exec({ 'sh', '-c', script }, o)
end

-- Sets b to the next power of ten at least `margin` pids away and forks until the next pid is
-- within `margin` of it (when b is past pid_max, first until the pids start again from below).
local function spin(margin)
  return ': & p=$!;wait\nm=$(cat /proc/sys/kernel/pid_max 2>/dev/null)||m=32768\n' ..
    'while :;do b=10;while [ $b -le $((p+' .. margin .. ')) ];do b=$((b*10));done\n' ..
    '[ $b -lt "$m" ]&&break\no=$p;while [ $p -ge $o ];do : & p=$!;wait;done;done\n' ..
    'while [ $p -lt $((b-' .. margin .. ')) ];do : & p=$!;wait;done\n'
end

-- A pool of one sandbox of the provider of `sb`, asking for a kind of network it has when it
-- cannot keep sandboxes offline; returns the pool and a fresh sandbox.
local function fresh(sb)
  local sandbox = require('mayura.sandbox')
  local provider = sb._pool.provider
  local kinds = provider.features and provider.features.network or {}
  local offline = false
  for _, k in ipairs(kinds) do offline = offline or k == 'none' end
  local po = { max_sandboxes = 1, max_lifetime_ms = 600000 }
  local co = { lifetime_ms = 600000 }
  if not offline and kinds[1] then po.network, co.network = { kinds[1] }, kinds[1] end
  local pool = sandbox.create_sandboxes(provider, po)
  return pool, pool:create(co)
end

-- A shell below b that forks until its forks pass b, then starts `sleep <mark>` (above b: listed
-- before it in /proc), notes the sleep in `ready` and waits for it; it writes `survived` to the
-- marker if it ever runs on after the sleep.
local function straddler(dir, mark)
  return 'sh -c \'b=$1;: & p=$!;while [ $p -le $b ];do : & p=$!;wait;done\n' ..
    'sleep ' .. mark .. ' & s=$!;echo "$$ $s" >>' .. dir .. '/ready;wait $s;echo survived >>' .. dir .. '/marker\' sh "$b"'
end

local function lines(s)
  local n = 0
  for _ in (s or ''):gmatch('[^\n]+') do n = n + 1 end
  return n
end

-- Whether a process whose command line holds `marker` is alive (not a zombie) in the sandbox.
local function running(sb, marker)
  local r = sh(sb, 'for p in /proc/[0-9]*;do read -r s 2>/dev/null <$p/stat||continue;s=${s##*) };' ..
    'case $s in Z*) continue;;esac;tr "\\000" " " <$p/cmdline 2>/dev/null;echo;done')
  return r.stdout:find(marker, 1, true) ~= nil
end

local function gone_soon(sb, marker)
  for _ = 1, 60 do
    if not running(sb, marker) then return true end
    task.sleep(50)
  end
  return false
end

-- Waits until `path` has `n` lines (the tree is in place), at most 30 s.
local function wait_lines(sb, path, n)
  for _ = 1, 300 do
    if lines(sb:read_file(path)) >= n then return true end
    task.sleep(100)
  end
  return false
end

-- The pairs in `dir/ready` that really straddle a power of ten (the shell's pid listed after its
-- child's), and what `ready` holds.
local function straddling(sb, dir)
  local ready = sb:read_file(dir .. '/ready') or ''
  local pairs_seen = 0
  for shell, child in ready:gmatch('(%d+) (%d+)') do
    if #child > #shell and child < shell then pairs_seen = pairs_seen + 1 end
  end
  return pairs_seen, ready
end

-- Checks some pairs in `dir/ready` straddle a power of ten and that no shell ran on; and that
-- no `sleep <mark>` is left.
local function check(sb, dir, mark, n)
  local pairs_seen, ready = straddling(sb, dir)
  assert.is_true(pairs_seen >= 1, 'no shell and child straddle a power of ten: ' .. ready)
  task.sleep(300)
  assert.is_nil(sb:read_file(dir .. '/marker'), 'a shell ran on after its child was killed')
  assert.is_true(gone_soon(sb, 'sleep ' .. mark), 'a process of the stopped command is left')
  if n then assert.are.equal(n, lines(ready)) end
end

--- Adds the cases, run on sandbox_of(), to the enclosing describe. `title_prefix` (optional)
-- starts each case's name.
function M.describe(sandbox_of, title_prefix)
  local p = title_prefix or ''
  local N = 6

  it(p .. 'a cancel stops every process before any dies, whatever order its pids fall in', function()
    local pool, sb = fresh(sandbox_of())
    local ok, err = pcall(function()
      local mark = tostring(math.random(100000, 999999))
      local dir = 'stop-cancel-' .. mark
      sb:write_file(dir .. '/.keep', '')
      local script = spin(40) .. 'for i in 1 2 3 4 5 6;do ' .. straddler(dir, mark) .. ' & done\nwait\n'
      local token = task.cancel_token()
      local t = task.spawn(function()
        return pcall(sh, sb, script, { signal = token, timeout_ms = 120000 })
      end)
      assert.is_true(wait_lines(sb, dir .. '/ready', N), 'the tree was not made in time')
      token:cancel()
      local stopped, why = t:wait()
      assert.is_false(stopped, 'the command was not stopped')
      assert.is_true(errors.is(why, 'CANCELLED'), tostring(why))
      check(sb, dir, mark, N)
    end)
    pool:close()
    if not ok then error(err, 0) end
  end)

  -- The timeout is short, and longer only when the tree was not in place by its end (a slow
  -- machine): then the case runs again on a fresh sandbox, its checks made on the run that had it.
  it(p .. 'a timeout stops every process before any dies, whatever order its pids fall in', function()
    local timeouts = { 500, 1500, 4000, 10000 }
    for i, timeout_ms in ipairs(timeouts) do
      local pool, sb = fresh(sandbox_of())
      local in_place = false
      local ok, err = pcall(function()
        local mark = tostring(math.random(100000, 999999))
        local dir = 'stop-timeout-' .. mark
        sb:write_file(dir .. '/.keep', '')
        -- the pids are first run up to 200 below a power of ten; the command's own shells fork past it
        local r = sh(sb, spin(200) .. 'echo "$b"')
        local script = 'b=' .. r.stdout:match('%d+') .. '\nfor i in 1 2 3 4 5 6;do ' .. straddler(dir, mark) .. ' & done\n' ..
          'wait\n'
        r = sh(sb, script, { timeout_ms = timeout_ms })
        assert.is_true(r.timed_out)
        in_place = straddling(sb, dir) >= 1
        if in_place or i == #timeouts then check(sb, dir, mark) end
      end)
      pool:close()
      if not ok then error(err, 0) end
      if in_place then break end
    end
  end)

  it(p .. 'a command given the tag\'s variable in its env is stopped at its timeout all the same', function()
    local sb = sandbox_of()
    local mark = tostring(math.random(100000, 999999))
    local r = sh(sb, 'sleep ' .. mark, { timeout_ms = 300, env = { MAYURA_EXEC = 'not.its.tag' } })
    assert.is_true(r.timed_out)
    assert.is_true(gone_soon(sb, 'sleep ' .. mark), 'the command outlived its timeout')
  end)

  it(p .. 'a tree that forks while it is stopped is stopped whole, across a power of ten', function()
    local pool, sb = fresh(sandbox_of())
    local ok, err = pcall(function()
      local mark = tostring(math.random(100000, 999999))
      local dir = 'stop-forks-' .. mark
      sb:write_file(dir .. '/.keep', '')
      -- three shells straddle b, as above, while a shell forks without end: 20 pairs of a waiting
      -- subshell and its sleep, then short-lived processes (within a sandbox's process cap)
      local script = spin(40) .. 'for i in 1 2 3;do ' .. straddler(dir, mark) .. ' & done\n' ..
        'k=0;while :;do if [ $k -lt 20 ];then (sleep ' .. mark .. ' & wait $!;echo survived >>' .. dir .. '/marker) & ' ..
        'k=$((k+1));fi;: & sleep 0.02;done\n'
      local token = task.cancel_token()
      local t = task.spawn(function()
        return pcall(sh, sb, script, { signal = token, timeout_ms = 120000 })
      end)
      assert.is_true(wait_lines(sb, dir .. '/ready', 3), 'the tree was not made in time')
      token:cancel()
      local stopped, res = t:wait()
      assert.is_false(stopped, 'the command was not stopped: ' .. tostring(stopped and res.exit_code))
      check(sb, dir, mark, 3)
    end)
    pool:close()
    if not ok then error(err, 0) end
  end)
end

return M
