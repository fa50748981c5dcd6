--- Benchmark of the Fly provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/fly.lua [N]
--
-- On the Fly Machines stand-in (spec/support/fly_service.lua, real local sandboxes behind it):
-- time to first command and an exec round trip of `true` through mayura.sandbox.fly, beside the
-- local sandboxes behind the stand-in used directly (the baseline: what the service's calls and
-- command_sandbox_backend's start-and-poll add). Fly has no official SDK with exec to compare.
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local fly = require('mayura.sandbox.fly')
local stand_in = require('support.stand_in')
local fly_service = require('support.fly_service')
local first_command = require('_first_command')

local N = tonumber(arg and arg[1]) or 10
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
fly_service.install(svc, backing, { token = 'fm2_bench', app = 'bench' })
local pool = sandbox.create_sandboxes(fly.fly_sandboxes({ token = 'fm2_bench', app = 'bench', base_url = svc:url('') }),
  { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
first_command.run({ label = 'fly', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)
pool:close()
backing:close()
svc:close()
