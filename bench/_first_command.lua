--- Shared by bench/fly.lua, cloudflare.lua, agentcore.lua, codesandbox.lua, apple_container.lua and
-- railway.lua: time to first command (create, then exec `true`; the release is not timed) and an
-- exec round trip of `true` on a running sandbox, for a pool and for its baseline measured in the same run, in three
-- alternating rounds (the machine is shared: each figure is the median of the rounds' medians),
-- printed with the ratio provider / baseline.
local core = require('mayura.core')
local process = require('mayura.process')
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

--- Beside an official client run against the same stand-in: mayura's time to first command and
-- exec round trip on `pool` (`create` options; medians of `n`, after one warm-up; the release
-- after a first command is not timed, as the client's stop is not), then the client's
-- (`script`, a Node program that times itself and prints `RESULT {"first_ms", "exec_ms"}`,
-- given `env` and N_FIRST = n, N_EXEC = 3n), in three alternating rounds (each figure the median
-- of the rounds'), printed with the ratio. Without the client's package (`package`, a path under
-- spec/npm/node_modules) it says so and measures nothing.
function M.against_sdk(o)
  local probe = io.open('spec/npm/node_modules/' .. o.package .. '/package.json')
  if not probe then
    print(o.package .. ' is not installed (sh scripts/setup.sh): no client figures')
    return
  end
  probe:close()
  local env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), N_FIRST = tostring(o.n),
    N_EXEC = tostring(o.n * 3) }
  for k, v in pairs(o.env) do env[k] = v end
  local mf, me, sf, se = {}, {}, {}, {}
  for r = 1, 3 do
    local firsts = {}
    for i = 1, o.n + 1 do
      local t0 = core.hrtime_ms()
      local sb = o.pool:create(o.create)
      assert(sb:exec({ 'true' }).exit_code == 0)
      if i > 1 then firsts[#firsts + 1] = core.hrtime_ms() - t0 end   -- the first is a warm-up
      sb:release()
    end
    mf[r] = bench.median(firsts)
    local sb = o.pool:create(o.create)
    me[r] = bench.measure(o.n * 3, function() assert(sb:exec({ 'true' }).exit_code == 0) end, 2)
    sb:release()
    local res = process.run({ 'node', o.script }, { timeout_ms = 600000, env = env })
    if res.exit_code ~= 0 then error('the client run failed: ' .. res.stderr, 0) end
    local sdk = core.json.decode(res.stdout:match('RESULT (%b{})'))
    sf[r], se[r] = sdk.first_ms, sdk.exec_ms
  end
  local first, exec = bench.median(mf), bench.median(me)
  local sdk_first, sdk_exec = bench.median(sf), bench.median(se)
  print(('%-44s %12s %12s %8s'):format('operation (median, ms)', o.label, o.sdk_label, 'ratio'))
  print(('%-44s %12.2f %12.2f %7.2fx'):format('time to first command (create + exec true)', first, sdk_first,
    first / sdk_first))
  print(('%-44s %12.2f %12.2f %7.2fx'):format('exec round trip (true)', exec, sdk_exec, exec / sdk_exec))
end

return M
