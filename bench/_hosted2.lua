--- Shared by bench/fly.lua, cloudflare.lua, agentcore.lua and apple_container.lua: time to first
-- command (create, then exec `true`; the release is not timed) and an exec round trip of `true`
-- on a running sandbox, for a pool and for its baseline measured in the same run, in three
-- alternating rounds (the machine is shared: each figure is the median of the rounds' medians),
-- printed with the ratio provider / baseline.
local core = require('mayura.core')
local bench = require('_util')

local M = {}

local function round(pool, create_opts, n)
  local first = {}
  for i = 1, n + 1 do
    local t0 = core.hrtime_ms()
    local sb = pool:create(create_opts)
    assert(sb:exec({ 'true' }).exit_code == 0)
    if i > 1 then first[#first + 1] = core.hrtime_ms() - t0 end   -- the first is a warm-up
    sb:release()
  end
  local sb = pool:create(create_opts)
  local exec = bench.measure(n * 3, function() assert(sb:exec({ 'true' }).exit_code == 0) end, 3)
  sb:release()
  return bench.median(first), exec
end

--- `subject` and `baseline` = { label, pool, create (options) }; `n` repetitions per round.
function M.run(subject, baseline, n)
  local sf, se, bf, be = {}, {}, {}, {}
  for r = 1, 3 do
    sf[r], se[r] = round(subject.pool, subject.create, n)
    bf[r], be[r] = round(baseline.pool, baseline.create, n)
  end
  print(('%-44s %12s %12s %8s'):format('operation (median, ms)', subject.label, baseline.label, 'ratio'))
  for _, row in ipairs({
    { 'time to first command (create + exec true)', bench.median(sf), bench.median(bf) },
    { 'exec round trip (true)', bench.median(se), bench.median(be) },
  }) do
    print(('%-44s %12.2f %12.2f %7.2fx'):format(row[1], row[2], row[3], row[2] / row[3]))
  end
end

return M
