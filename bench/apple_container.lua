--- Benchmark of the Apple container provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/apple_container.lua [N]
--
-- Through the fake `container` CLI (spec/support/fake_container/container, Docker containers of
-- mayura-test/busybox:1 behind it): time to first command and an exec round trip of `true`
-- through mayura.sandbox.apple_container, beside the Docker provider's cli engine on the same
-- image (the baseline). On a Mac the VMs would differ; this measures the provider's own cost.
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local apple = require('mayura.sandbox.apple_container')
local docker = require('mayura.sandbox.docker')
local first_command = require('_first_command')

local N = tonumber(arg and arg[1]) or 5
local pool = sandbox.create_sandboxes(apple.apple_container_sandboxes({
  executable = 'spec/support/fake_container/container' }), { max_sandboxes = 2, max_lifetime_ms = 600000 })
local base = sandbox.create_sandboxes(docker.docker_sandboxes({ image = 'mayura-test/busybox:1' }),
  { max_sandboxes = 2, max_lifetime_ms = 600000 })
first_command.run({ label = 'apple', pool = pool, create = { lifetime_ms = 600000 } },
  { label = 'docker-cli', pool = base, create = { lifetime_ms = 600000 } }, N)
pool:close()
base:close()
