--- Shared by the hosted benchmarks (bench/fly.lua, cloudflare.lua, agentcore.lua, codesandbox.lua,
-- apple_container.lua, railway.lua, modal.lua, northflank.lua, vercel.lua): time to first command
-- (create, then exec `true`; the release is not timed) and an exec round trip of `true` on a
-- running sandbox, for a pool and for its baseline measured in the same run (`run`: three
-- alternating rounds, as the machine is shared: each figure is the median of the rounds' medians),
-- printed with the ratio provider / baseline.
local core = require('mayura.core')
local process = require('mayura.process')
local uv = require('luv')
local bench = require('_util')

local M = {}

--- Time to first command and exec round trip on `pool` (`create`: its create options): the median
-- of `first` first commands (create, then exec `true`; the release after it is not timed) and of
-- `exec` execs of `true` in one sandbox, each after two untimed ones; with `count` (a running count
-- of the service's calls), the calls per exec too (the untimed ones counted).
function M.first_and_exec(pool, create, first, exec, count)
  local firsts = {}
  for i = 1, first + 2 do
    local t0 = uv.hrtime()
    local sb = pool:create(create)
    assert(sb:exec({ 'true' }).exit_code == 0)
    if i > 2 then firsts[#firsts + 1] = (uv.hrtime() - t0) / 1e6 end
    sb:release()
  end
  local sb = pool:create(create)
  local before = count and count()
  local m_exec = bench.measure(exec, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
  local calls = count and (count() - before) / (exec + 2)
  sb:release()
  return bench.median(firsts), m_exec, calls
end

--- Prints `rows` ({ operation, subject's ms, baseline's ms }) under a header naming both, with the
-- ratio subject / baseline.
function M.print_rows(subject, baseline, rows)
  print(('%-44s %12s %12s %8s'):format('operation (median, ms)', subject, baseline, 'ratio'))
  for _, row in ipairs(rows) do
    print(('%-44s %12.2f %12.2f %7.2fx'):format(row[1], row[2], row[3], row[2] / row[3]))
  end
end

--- `subject` and `baseline` = { label, pool, create (options) }; `n` repetitions per round.
function M.run(subject, baseline, n)
  local sf, se, bf, be = {}, {}, {}, {}
  for r = 1, 3 do
    sf[r], se[r] = M.first_and_exec(subject.pool, subject.create, n, n * 3)
    bf[r], be[r] = M.first_and_exec(baseline.pool, baseline.create, n, n * 3)
  end
  M.print_rows(subject.label, baseline.label, {
    { 'time to first command (create + exec true)', bench.median(sf), bench.median(bf) },
    { 'exec round trip (true)', bench.median(se), bench.median(be) },
  })
end

--- Beside an official client run against the same stand-in: mayura's time to first command and
-- exec round trip on `pool` (`create` options; medians of `n`, after two warm-ups; the release
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
    mf[r], me[r] = M.first_and_exec(o.pool, o.create, o.n, o.n * 3)
    local res = process.run({ 'node', o.script }, { timeout_ms = 600000, env = env })
    if res.exit_code ~= 0 then error('the client run failed: ' .. res.stderr, 0) end
    local sdk = core.json.decode(res.stdout:match('RESULT (%b{})'))
    sf[r], se[r] = sdk.first_ms, sdk.exec_ms
  end
  M.print_rows(o.label, o.sdk_label, {
    { 'time to first command (create + exec true)', bench.median(mf), bench.median(sf) },
    { 'exec round trip (true)', bench.median(me), bench.median(se) },
  })
end

return M
