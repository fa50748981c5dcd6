--- Benchmark of the AgentCore provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/agentcore.lua [N]
--
-- On the Code Interpreter stand-in (spec/support/agentcore_service.lua, which checks every
-- SigV4 signature; real local sandboxes behind it): time to first command and an exec round trip
-- of `true` through mayura.sandbox.agentcore (libcurl signing each request, event streams read by
-- the core), beside the local sandboxes behind the stand-in used directly (the baseline); then
-- the same two figures through the official @aws-sdk/client-bedrock-agentcore (a Node process,
-- bench/agentcore_sdk.mjs, timing itself, so its start is not counted), mayura's over the
-- client's. Not like for like: mayura's exec is the command backend (started in the background,
-- then polled), the client's one executeCommand.
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local agentcore = require('mayura.sandbox.agentcore')
local stand_in = require('support.stand_in')
local agentcore_service = require('support.agentcore_service')
local hosted2 = require('_hosted2')
local core = require('mayura.core')
local process = require('mayura.process')

local N = tonumber(arg and arg[1]) or 10
local ID, SECRET = 'AKIABENCHKEY00000000', 'bench/secret0123456789'
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
agentcore_service.install(svc, backing, { access_key_id = ID, secret_access_key = SECRET, region = 'us-east-1' })
local pool = sandbox.create_sandboxes(agentcore.agentcore_sandboxes({ region = 'us-east-1', endpoint = svc:url(''),
  credentials = { access_key_id = ID, secret_access_key = SECRET } }),
  { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
hosted2.run({ label = 'agentcore', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)

local function median_of(fn)
  local xs = {}
  for i = 1, N + 1 do
    local t0 = core.hrtime_ms()
    fn()
    if i > 1 then xs[#xs + 1] = core.hrtime_ms() - t0 end
  end
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end
local first = median_of(function()
  local sb = pool:create({ lifetime_ms = 600000, network = 'all' })
  assert(sb:exec({ 'true' }).exit_code == 0)
  sb:release()
end)
local sb = pool:create({ lifetime_ms = 600000, network = 'all' })
local exec = median_of(function() assert(sb:exec({ 'true' }).exit_code == 0) end)
sb:release()
local sdk_package = io.open('spec/npm/node_modules/@aws-sdk/client-bedrock-agentcore/package.json')
if sdk_package then
  sdk_package:close()
  local r = process.run({ 'node', 'bench/agentcore_sdk.mjs' }, { timeout_ms = 600000, env = {
    PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), STAND_IN_URL = svc:url(''), AWS_KEY_ID = ID,
    AWS_SECRET = SECRET, AWS_REGION = 'us-east-1', N_FIRST = tostring(N), N_EXEC = tostring(N * 3) } })
  if r.exit_code ~= 0 then error('the client run failed: ' .. r.stderr, 0) end
  local sdk = core.json.decode(r.stdout:match('RESULT (%b{})'))
  print(('%-44s %12s %12s %8s'):format('operation (median, ms)', 'agentcore', 'aws sdk', 'ratio'))
  print(('%-44s %12.2f %12.2f %7.2fx'):format('time to first command (create + exec true)', first, sdk.first_ms,
    first / sdk.first_ms))
  print(('%-44s %12.2f %12.2f %7.2fx'):format('exec round trip (true)', exec, sdk.exec_ms, exec / sdk.exec_ms))
else
  print('@aws-sdk/client-bedrock-agentcore is not installed (sh scripts/setup.sh): no client figures')
end
pool:close()
backing:close()
svc:close()
