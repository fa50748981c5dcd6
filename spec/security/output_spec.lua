-- Output abuse, on every provider here: a 1 GiB flood, one 100 MiB line with no newline on both
-- streams at once, output from a grandchild after its command ended, and streams that stall. The
-- host keeps only max_output_bytes per stream (its own memory stays bounded: VmRSS and its peak are
-- measured), marks the result truncated, and every call ends at its timeout.
local providers = require('support.providers')
local common = require('security.common')
local util = require('support.util')

local MIB = 1048576
local GIB = 1024 * MIB

local sh = common.sh

-- This process's peak resident size (KiB) since the last reset_peak().
local function peak_kib()
  local f = assert(io.open('/proc/self/status'))
  local s = f:read('a')
  f:close()
  return tonumber(s:match('VmHWM:%s*(%d+)'))
end

local function reset_peak()
  local f = io.open('/proc/self/clear_refs', 'w')
  if f then
    f:write('5')
    f:close()
  end
end

local function settle()
  collectgarbage()
  collectgarbage()
  return util.rss_kib()
end

for _, prov in ipairs(providers.list()) do
  describe('output abuse (' .. prov.name .. ')', function()
    local pool, sb
    setup(function()
      pool = prov.make_pool({ max_sandboxes = 2 })
      sb = pool:create({ lifetime_ms = 300000 })
      common.install(sb)
    end)
    teardown(function()
      if sb then sb:release() end
      pool:close()
    end)

    it('keeps 1 MiB of a 1 GiB flood, marks it truncated, and the host memory stays bounded', function()
      local before = settle()
      reset_peak()
      local r = common.abuse(sb, { 'flood', tostring(GIB) }, { timeout_ms = 60000 })
      local peak = peak_kib()
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.is_false(r.timed_out)
      assert.is_true(r.truncated)
      assert.are.equal(MIB, #r.stdout)
      assert.is_nil(r.stdout:find('[^x]'), 'the kept output is not the flood\'s')
      assert.are.equal('wrote=' .. GIB .. '\n', r.stderr, 'the flood was cut short')
      r = nil -- luacheck: ignore 311
      local after = settle()
      assert.is_true(after - before < 32 * 1024, ('VmRSS went from %d to %d KiB'):format(before, after))
      assert.is_true(peak - before < 64 * 1024, ('VmRSS peaked at %d KiB from %d'):format(peak, before))
      assert.are.equal('after\n', sb:exec({ 'echo', 'after' }).stdout)
    end)

    it('keeps 1 MiB of a 100 MiB line with no newline, on stdout and stderr at once', function()
      local before = settle()
      reset_peak()
      local n = tostring(100 * MIB)
      local r = sh(sb, common.ABUSE .. ' flood ' .. n .. ' 2>/dev/null & ' .. common.ABUSE .. ' flood ' .. n ..
        ' >&2 2>/dev/null; wait', { timeout_ms = 60000 })
      local peak = peak_kib()
      assert.are.equal(0, r.exit_code)
      assert.is_true(r.truncated)
      assert.are.equal(MIB, #r.stdout)
      assert.are.equal(MIB, #r.stderr)
      assert.is_nil(r.stdout:find('\n', 1, true))
      r = nil -- luacheck: ignore 311
      local after = settle()
      assert.is_true(after - before < 32 * 1024, ('VmRSS went from %d to %d KiB'):format(before, after))
      assert.is_true(peak - before < 64 * 1024, ('VmRSS peaked at %d KiB from %d'):format(peak, before))
    end)

    it('does not wait for output a grandchild writes after its command ended', function()
      local r = sh(sb, '(sleep 0.3; ' .. common.ABUSE .. ' flood ' .. (64 * MIB) .. ') & echo done',
        { timeout_ms = 20000 })
      assert.are.equal(0, r.exit_code)
      assert.matches('^done\n', r.stdout)
      -- had the exec waited for the grandchild, its 64 MiB would have filled stdout to the cap
      assert.is_false(r.truncated, 'the exec waited for a grandchild')
      -- what the command left in its group ends soon after; the sandbox goes on
      assert.is_true(common.eventually(function()
        return not sh(sb, 'ps -o args 2>/dev/null || cat /proc/[0-9]*/cmdline', { timeout_ms = 5000 })
          .stdout:find('flood', 1, true)
      end, 5000), 'the grandchild is still running')
    end)

    it('ends a call whose stream stalls at its timeout, keeping what came before', function()
      local t = common.now()
      local r = sh(sb, 'printf partial; exec sleep 30', { timeout_ms = 1000 })
      local took = common.now() - t
      assert.is_true(r.timed_out)
      assert.is_nil(r.exit_code)
      assert.are.equal('partial', r.stdout)
      assert.is_true(took >= 900 and took < 4000, 'the stalled call took ' .. took .. ' ms')
      -- a grandchild that keeps the pipes open but never writes does not hold the call either
      t = common.now()
      r = sh(sb, 'sleep 30 & printf held', { timeout_ms = 1500 })
      took = common.now() - t
      assert.are.equal('held', r.stdout)
      assert.is_true(took < 4000, 'a silent grandchild held the call for ' .. took .. ' ms')
      assert.are.equal('after\n', sb:exec({ 'echo', 'after' }).stdout)
    end)
  end)
end
