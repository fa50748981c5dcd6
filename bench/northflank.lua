--- Benchmark of the Northflank provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/northflank.lua [N_EXEC] [N_FIRST]
--
-- Against the Northflank stand-in (spec/support/northflank_service.lua, over real local
-- sandboxes) served from this process, the same stand-in for both clients:
--   * time to a first command: create a sandbox (a service, read until its deployment is
--     COMPLETED), then exec `true` (the release after it is not timed), over N_FIRST runs;
--   * exec round trip: `true` in one sandbox, over N_EXEC runs;
-- through mayura.sandbox.northflank, and through the official @northflank/js-client (a Node
-- process, bench/northflank_sdk.mjs, timing itself, so its start is not counted). The ratio is
-- mayura's time over the client's. Not like for like: mayura's exec is the command backend (the
-- command started in the background, then polled, each step an NDJSON exec call over HTTP/2 to
-- the stand-in's exec host, a hop in Node on a connection of its own), the client's one
-- WebSocket exec through the stand-in's front (a hop in Node).
-- The exec calls per mayura exec are counted too. The stand-in answers every request on its own
-- connection and shares this process's loop with mayura's client.
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local core = require('mayura.core')
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local timing = require('_first_command')
local stand_in = require('support.stand_in')
local northflank_service = require('support.northflank_service')
local northflank = require('mayura.sandbox.northflank')

local N_EXEC = tonumber(arg and arg[1]) or 50
local N_FIRST = tonumber(arg and arg[2]) or 10
local TOKEN, PROJECT = 'nf_bench0123456789', 'bench'

local sdk_package = io.open('spec/npm/node_modules/@northflank/js-client/package.json')
if not sdk_package then error('the client is not installed: run sh scripts/setup.sh', 0) end
sdk_package:close()

local svc = stand_in.new()
local backing = stand_in.local_backing({ max_sandboxes = 4 })
local state = northflank_service.install_with_exec_host(svc, backing, { token = TOKEN, project_id = PROJECT })

local pool = sandbox.create_sandboxes(northflank.northflank_sandboxes({
  token = TOKEN, project_id = PROJECT, api_url = svc:url(''), exec_url = state.exec_url,
}), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })

local m_first, m_exec, exec_calls = timing.first_and_exec(pool, { lifetime_ms = 600000, network = 'all' },
  N_FIRST, N_EXEC, function() return #svc:calls('POST', '/exec') end)
pool:close()

local r = process.run({ 'node', 'bench/northflank_sdk.mjs' }, {
  timeout_ms = 600000,
  env = {
    PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), STAND_IN_URL = svc:url(''), STAND_IN_TOKEN = TOKEN,
    STAND_IN_PROJECT = PROJECT, N_FIRST = tostring(N_FIRST), N_EXEC = tostring(N_EXEC),
  },
})
if r.exit_code ~= 0 then error('the client run failed: ' .. r.stderr, 0) end
local sdk = core.json.decode(r.stdout:match('RESULT (%b{})'))

state.close_all()
backing:close()
svc:close()

timing.print_rows('mayura', 'client', {
  { 'time to first command (create + exec true)', m_first, sdk.first_ms },
  { 'exec round trip (true)', m_exec, sdk.exec_ms },
})
print(('exec calls per mayura exec: %.1f'):format(exec_calls))
