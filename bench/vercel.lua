--- Benchmark of the Vercel provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/vercel.lua [N_EXEC] [N_FIRST]
--
-- Against the Vercel stand-in (spec/support/vercel_service.lua, over real local sandboxes) served
-- from this process, the same stand-in for both clients:
--   * time to a first command: create a sandbox, then exec `true` (the release after it is
--     not timed), over N_FIRST runs;
--   * exec round trip: `true` in one sandbox, over N_EXEC runs;
-- through mayura.sandbox.vercel, and through the official @vercel/sandbox SDK (a Node process,
-- bench/vercel_sdk.mjs, timing itself, so its start is not counted). The ratio is mayura's time
-- over the SDK's. The requests each client sent the stand-in per operation are counted too.
-- The stand-in answers every request on its own connection (Connection: close), so neither
-- client can reuse one here; and it shares this process's loop with mayura's client, while the
-- SDK runs in a process of its own. Needs local sandboxes and `sh scripts/setup.sh` (the SDK).
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local core = require('mayura.core')
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local timing = require('_first_command')
local stand_in = require('support.stand_in')
local vercel_service = require('support.vercel_service')
local vercel = require('mayura.sandbox.vercel')

local N_EXEC = tonumber(arg and arg[1]) or 50
local N_FIRST = tonumber(arg and arg[2]) or 10
local TOKEN, TEAM, PROJECT = 'vcp_bench0123456789', 'team_bench', 'prj_bench'

local sdk_package = io.open('spec/npm/node_modules/@vercel/sandbox/package.json')
if not sdk_package then error('the SDK is not installed: run sh scripts/setup.sh', 0) end
sdk_package:close()

local svc = stand_in.new()
local backing = stand_in.local_backing({ max_sandboxes = 4 })
vercel_service.install(svc, backing, { token = TOKEN, team_id = TEAM, project_id = PROJECT })

-- {======================================================
-- mayura
-- =======================================================

local pool = sandbox.create_sandboxes(vercel.vercel_sandboxes({
  token = TOKEN, team_id = TEAM, project_id = PROJECT, base_url = svc:url('/api'), workdir = '/workspace',
}), { max_sandboxes = 2, max_lifetime_ms = 600000 })

-- the routes that begin and end a sandbox, to count what each client sent in between
local CREATE, STOP = 'POST /api/v3/sandboxes', 'POST /api/v2/sandboxes/sessions/{sid}/stop'

local m_first, m_exec = timing.first_and_exec(pool, { lifetime_ms = 600000 }, N_FIRST, N_EXEC)
pool:close()
local mayura_end = #svc.requests

-- }======================================================

-- {======================================================
-- The official SDK, on the same stand-in
-- =======================================================

local r = process.run({ 'node', 'bench/vercel_sdk.mjs' }, {
  timeout_ms = 600000,
  env = {
    PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), VERCEL_SANDBOX_TELEMETRY_DISABLED = '1',
    STAND_IN_URL = svc:url('/api'), STAND_IN_TOKEN = TOKEN, STAND_IN_TEAM = TEAM, STAND_IN_PROJECT = PROJECT,
    N_FIRST = tostring(N_FIRST), N_EXEC = tostring(N_EXEC),
  },
})
if r.exit_code ~= 0 then error('the SDK run failed: ' .. r.stderr, 0) end
local sdk = core.json.decode(r.stdout:match('RESULT (%b{})'))
-- Requests per first command (from a create to the stop after it) and per exec (in the last
-- sandbox, the one the execs ran in), for each client.
local function per_operation(from, to, execs)
  local creates = {}
  for i = from, to do
    if svc.requests[i].route == CREATE then creates[#creates + 1] = i end
  end
  local function until_stop(i)
    local n = 0
    for j = i, to do
      if svc.requests[j].route == STOP then return n, j end
      n = n + 1
    end
    return n, to
  end
  local first = until_stop(creates[1])
  local in_last = until_stop(creates[#creates])
  return first, (in_last - 1) / execs
end
local m_first_n, m_exec_n = per_operation(1, mayura_end, N_EXEC + 2)
local s_first_n, s_exec_n = per_operation(mayura_end + 1, #svc.requests, N_EXEC + 2)

backing:close()
svc:close()

-- }======================================================

timing.print_rows('mayura', 'SDK', {
  { 'time to first command (create + exec true)', m_first, sdk.first_ms },
  { 'exec round trip (true)', m_exec, sdk.exec_ms },
})
print(('requests per first command: mayura %d, the SDK %d; per exec: mayura %.1f, the SDK %.1f'):format(
  m_first_n, s_first_n, m_exec_n, s_exec_n))
