--- Benchmark of the Railway provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/railway.lua [N_EXEC] [N_FIRST]
--
-- Against the Railway stand-in (spec/support/railway_service.lua, over real local sandboxes)
-- served from this process:
--   * time to a first command: create a sandbox, then exec `true` (the release after it is
--     not timed), over N_FIRST runs;
--   * exec round trip: `true` in one sandbox, over N_EXEC runs;
-- through mayura.sandbox.railway with commands over the stand-in's WebSocket bridge (a Node
-- process, spec/npm/railway_front.mjs) and over the GraphQL sandboxExec, and, as the baseline,
-- through the local sandboxes the stand-in runs on (the same pool, called directly). The ratio
-- is the provider's time over the baseline's: what the calls and the command backend (a command
-- started in the background, then waited for) add; then the websocket path beside the official
-- `railway` SDK (bench/railway_sdk.mjs, a Node process timing itself), mayura's over the SDK's.
-- The stand-in answers every request on its own connection (Connection: close) and shares this
-- process's loop with the provider's client.
local sandbox = require('mayura.sandbox')
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local stand_in = require('support.stand_in')
local railway_service = require('support.railway_service')
local railway = require('mayura.sandbox.railway')
local util = require('support.util')

local N_EXEC = tonumber(arg and arg[1]) or 50
local N_FIRST = tonumber(arg and arg[2]) or 10
local TOKEN, ENV = 'rw_bench0123456789', 'env-bench'

local svc = stand_in.new()
local backing = stand_in.local_backing({ max_sandboxes = 4 })
local state = railway_service.install(svc, backing, { token = TOKEN, environment_id = ENV })

local dir = util.tmpdir()
local ws_url = state:start_front(dir)

local timing = require('_first_command')
local function measure(pool, create_options)
  return timing.first_and_exec(pool, create_options, N_FIRST, N_EXEC, function() return #svc.requests end)
end

local results = {}
for _, exec in ipairs({ 'websocket', 'graphql' }) do
  local pool = sandbox.create_sandboxes(railway.railway_sandboxes({
    token = TOKEN, environment_id = ENV, endpoint = svc:url(railway_service.PATH), ws_url = ws_url, exec = exec,
    exec_rate = { per_second = 1000, burst = 1000 },   -- the stand-in's: the service's would pace the bench
  }), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
  results[exec] = { measure(pool, { lifetime_ms = 600000, network = 'all' }) }
  pool:close()
end
local l_first, l_exec = measure(backing.pool, { lifetime_ms = 600000, network = 'all' })

-- beside the official `railway` SDK on the same stand-in and bridge (bench/railway_sdk.mjs)
local ws_pool = sandbox.create_sandboxes(railway.railway_sandboxes({
  token = TOKEN, environment_id = ENV, endpoint = svc:url(railway_service.PATH), ws_url = ws_url,
}), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
timing.against_sdk({ label = 'railway', sdk_label = 'railway sdk', pool = ws_pool, n = N_FIRST,
  create = { lifetime_ms = 600000, network = 'all' }, package = 'railway', script = 'bench/railway_sdk.mjs',
  env = { STAND_IN_URL = svc:url(railway_service.PATH), STAND_IN_WS = ws_url, STAND_IN_TOKEN = TOKEN,
    STAND_IN_ENV = ENV } })
ws_pool:close()

state.close()
backing:close()
svc:close()
util.rmdir(dir)

print(('%-48s %12s %12s %8s'):format('operation (median)', 'railway ms', 'local ms', 'ratio'))
for _, exec in ipairs({ 'websocket', 'graphql' }) do
  local r = results[exec]
  print(('%-48s %12.3f %12.3f %7.2fx'):format('first command (create + exec true), ' .. exec, r[1], l_first,
    r[1] / l_first))
  print(('%-48s %12.3f %12.3f %7.2fx'):format('exec true (round trip), ' .. exec, r[2], l_exec, r[2] / l_exec))
  print(('stand-in requests per exec, %s: %.1f'):format(exec, r[3]))
end
