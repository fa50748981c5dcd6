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
local first_command = require('_first_command')

local N = tonumber(arg and arg[1]) or 10
local ID, SECRET = 'AKIABENCHKEY00000000', 'bench/secret0123456789'
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
agentcore_service.install(svc, backing, { access_key_id = ID, secret_access_key = SECRET, region = 'us-east-1' })
local pool = sandbox.create_sandboxes(agentcore.agentcore_sandboxes({ region = 'us-east-1', endpoint = svc:url(''),
  credentials = { access_key_id = ID, secret_access_key = SECRET },
  exec_rate = { per_second = 1000, burst = 1000 } }),   -- the stand-in's: AWS's quota would pace the bench
  { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
first_command.run({ label = 'agentcore', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)

first_command.against_sdk({ label = 'agentcore', sdk_label = 'aws sdk', pool = pool, n = N,
  create = { lifetime_ms = 600000, network = 'all' }, package = '@aws-sdk/client-bedrock-agentcore',
  script = 'bench/agentcore_sdk.mjs',
  env = { STAND_IN_URL = svc:url(''), AWS_KEY_ID = ID, AWS_SECRET = SECRET, AWS_REGION = 'us-east-1' } })
pool:close()
backing:close()
svc:close()
