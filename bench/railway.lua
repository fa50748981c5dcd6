--- Benchmark of the Railway provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/railway.lua [N_EXEC] [N_FIRST]
--
-- Against the Railway stand-in (spec/support/railway_service.lua, over real local sandboxes)
-- served from this process:
--   * time to a first command: create a sandbox, then exec `true` (the release after it is
--     not timed), over N_FIRST runs;
--   * exec round trip: `true` in one sandbox, over N_EXEC runs;
-- through mayura.sandbox.railway, and, as the baseline, through the local sandboxes the
-- stand-in runs on (the same pool, called directly). The ratio is the provider's time over the
-- baseline's: what the GraphQL calls and the command backend (a command started in the
-- background, then polled) add. The official `railway` SDK runs commands over a WebSocket
-- bridge the stand-in does not serve, so it is not timed here. The sandboxExec calls per exec
-- are counted too. The stand-in answers every request on its own connection (Connection:
-- close) and shares this process's loop with the provider's client.
local sandbox = require('mayura.sandbox')
local uv = require('luv')
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')
local stand_in = require('support.stand_in')
local railway_service = require('support.railway_service')
local railway = require('mayura.sandbox.railway')

local N_EXEC = tonumber(arg and arg[1]) or 50
local N_FIRST = tonumber(arg and arg[2]) or 10
local TOKEN, ENV = 'rw_bench0123456789', 'env-bench'

local svc = stand_in.new()
local backing = stand_in.local_backing({ max_sandboxes = 4 })
local state = railway_service.install(svc, backing, { token = TOKEN, environment_id = ENV })

local function measure(pool, create_options)
  local function first_command()
    local t0 = uv.hrtime()
    local sb = pool:create(create_options)
    assert(sb:exec({ 'true' }).exit_code == 0)
    local ms = (uv.hrtime() - t0) / 1e6
    sb:release()
    return ms
  end
  for _ = 1, 2 do first_command() end
  local xs = {}
  for i = 1, N_FIRST do xs[i] = first_command() end
  local sb = pool:create(create_options)
  local before = #state:calls('sandboxExec')
  local m_exec = bench.measure(N_EXEC, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
  local calls = #state:calls('sandboxExec') - before
  sb:release()
  return bench.median(xs), m_exec, calls
end

local pool = sandbox.create_sandboxes(railway.railway_sandboxes({
  token = TOKEN, environment_id = ENV, endpoint = svc:url(railway_service.PATH),
}), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
local r_first, r_exec, r_calls = measure(pool, { lifetime_ms = 600000, network = 'all' })
pool:close()
local l_first, l_exec = measure(backing.pool, { lifetime_ms = 600000, network = 'all' })

state.close()
backing:close()
svc:close()

print(('%-40s %12s %12s %8s'):format('operation (median)', 'railway ms', 'local ms', 'ratio'))
print(('%-40s %12.3f %12.3f %7.2fx'):format('first command (create + exec true)', r_first, l_first, r_first / l_first))
print(('%-40s %12.3f %12.3f %7.2fx'):format('exec true (round trip)', r_exec, l_exec, r_exec / l_exec))
print(('sandboxExec calls per exec: %.1f'):format(r_calls / (N_EXEC + 2)))   -- the 2 warm-up runs count
