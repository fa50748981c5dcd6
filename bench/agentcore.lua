--- Benchmark of the AgentCore provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/agentcore.lua [N]
--
-- On the Code Interpreter stand-in (spec/support/agentcore_service.lua, which checks every
-- SigV4 signature; real local sandboxes behind it): time to first command and an exec round trip
-- of `true` through mayura.sandbox.agentcore (libcurl signing each request, event streams read by
-- the core), beside the local sandboxes behind the stand-in used directly (the baseline). The
-- official @aws-sdk/client-bedrock-agentcore is not installed here to compare.
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local agentcore = require('mayura.sandbox.agentcore')
local stand_in = require('support.stand_in')
local agentcore_service = require('support.agentcore_service')
local hosted2 = require('_hosted2')

local N = tonumber(arg and arg[1]) or 10
local ID, SECRET = 'AKIABENCHKEY00000000', 'bench/secret0123456789'
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
agentcore_service.install(svc, backing, { access_key_id = ID, secret_access_key = SECRET, region = 'us-east-1' })
local pool = sandbox.create_sandboxes(agentcore.agentcore_sandboxes({ region = 'us-east-1', endpoint = svc:url(''),
  credentials = { access_key_id = ID, secret_access_key = SECRET } }),
  { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
hosted2.run({ label = 'agentcore', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)
pool:close()
backing:close()
svc:close()
