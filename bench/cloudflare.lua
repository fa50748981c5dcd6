--- Benchmark of the Cloudflare provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/cloudflare.lua [N]
--
-- On the sandbox bridge stand-in (spec/support/cloudflare_service.lua, real local sandboxes
-- behind it): time to first command and an exec round trip of `true` through
-- mayura.sandbox.cloudflare, beside the local sandboxes behind the stand-in used directly (the
-- baseline). @cloudflare/sandbox runs inside a Worker and has no HTTP client to compare.
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local cloudflare = require('mayura.sandbox.cloudflare')
local stand_in = require('support.stand_in')
local cloudflare_service = require('support.cloudflare_service')
local first_command = require('_first_command')

local N = tonumber(arg and arg[1]) or 10
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
cloudflare_service.install(svc, backing, { api_key = 'cfsb_bench' })
local provider = cloudflare.cloudflare_sandboxes({ worker_url = svc:url(''), api_key = 'cfsb_bench' })
local pool = sandbox.create_sandboxes(provider,
  { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
first_command.run({ label = 'cloudflare', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)
pool:close()
backing:close()
svc:close()
