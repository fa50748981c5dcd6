-- examples/coding_agent.lua --provider kubernetes: the coding-agent guide's recorded session on
-- Pods of the API server stand-in (support/kube_service.lua: real namespaced processes), with the
-- example pointed at it by a kubeconfig (KUBECONFIG, read by kubectl through
-- examples/kubernetes_kubeconfig.lua). The run's tests fail, then pass, and the example's own
-- re-check in a fresh sandbox passes; both Pods are deleted at the end, with their policies.
local example = require('support.coding_agent_example')
local util = require('support.util')

local TOKEN = 'kubeconfig-token-0123456789SECRET'
local NS = 'sandboxes'

describe('examples/coding_agent.lua --provider kubernetes', function()
  local pods_rt = require('support.kube_pods')
  if not pods_rt.available() then
    pending('needs root, bubblewrap, nsenter, setpriv and build/mayura-launch')
    return
  end
  local svc, state, dir, kubeconfig

  setup(function()
    svc = require('support.stand_in').new()
    state = require('support.kube_service').install(svc, nil, { token = TOKEN, namespace = NS,
      images = { 'node:22-bookworm-slim', 'mayura/agent:1' } })
    dir = util.tmpdir()
    kubeconfig = dir .. '/config'
    local f = assert(io.open(kubeconfig, 'w'))
    f:write(([[
apiVersion: v1
kind: Config
clusters:
- name: stand-in
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: spec
  user:
    token: %s
contexts:
- name: spec
  context:
    cluster: stand-in
    user: spec
    namespace: %s
current-context: spec
]]):format(state.server, state.ca_file, TOKEN, NS))
    f:close()
  end)
  teardown(function()
    svc:close()
    util.rmdir(dir)
    assert.are.same({}, svc.failures)
  end)

  it('needs KUBE_AGENT_IMAGE (exit code 2)', function()
    example.needs('kubernetes', { KUBECONFIG = kubeconfig }, 'KUBE_AGENT_IMAGE')
  end)

  it('plays the recorded session on the stand-in, and the re-check passes', function()
    example.plays('kubernetes', { KUBECONFIG = kubeconfig, KUBE_AGENT_IMAGE = 'mayura/agent:1' }, TOKEN, 'no network')
    -- the run's Pod and the re-check's: both made with a policy refusing all egress, both deleted
    local made = {}
    for _, req in ipairs(svc.requests) do
      if req.method == 'POST' and req.path == '/apis/networking.k8s.io/v1/namespaces/' .. NS .. '/networkpolicies' then
        assert.are.same({}, req.json.spec.egress)
      elseif req.method == 'POST' and req.path == '/api/v1/namespaces/' .. NS .. '/pods' then
        made[#made + 1] = req.json.metadata.name
      end
    end
    assert.are.equal(2, #made)
    local pods = state.objects.pods and state.objects.pods[NS] or {}
    assert.are.same({}, pods)
    assert.are.same({}, state.objects.networkpolicies and state.objects.networkpolicies[NS] or {})
  end)
end)
