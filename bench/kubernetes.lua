--- Benchmark of the Kubernetes provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/kubernetes.lua [N]
--
-- On the API server stand-in (spec/support/kube_service.lua: TLS through its front, Pods as real
-- namespaced processes): time to first command and an exec round trip of `true` through
-- mayura.sandbox.kubernetes (the agent reached by an attach over a WebSocket), beside local
-- sandboxes used directly (the baseline: the same agent over a socket pair, no API server between).
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local kubernetes = require('mayura.sandbox.kubernetes')
local stand_in = require('support.stand_in')
local kube = require('support.kube_service')
local first_command = require('_first_command')

local N = tonumber(arg and arg[1]) or 10
local TOKEN = 'bench-token-0123456789'
local svc = stand_in.new()
local state = kube.install(svc, nil, { token = TOKEN, namespace = 'bench', images = { 'busybox:1', 'mayura/agent:1' },
  start_ms = 0 })
local pool = sandbox.create_sandboxes(kubernetes.kubernetes_sandboxes({ server = state.server, ca_file = state.ca_file,
  token = TOKEN, namespace = 'bench', image = 'busybox:1', agent_image = 'mayura/agent:1', memory_mib = 256 }),
  { max_sandboxes = 2, max_lifetime_ms = 600000 })
local local_pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes({ memory_mib = 256 }),
  { max_sandboxes = 2, max_lifetime_ms = 600000 })
first_command.run({ label = 'kubernetes', pool = pool, create = { lifetime_ms = 600000 } },
  { label = 'local', pool = local_pool, create = { lifetime_ms = 600000 } }, N)
pool:close()
local_pool:close()
svc:close()
