-- What hostile code in a Kubernetes sandbox finds of the cluster (the `kubernetes` entry of
-- support/providers.lua, on the API server stand-in; it runs when MAYURA_SPEC_PROVIDERS names it):
-- its Pod as the API server recorded it is locked down (no privilege, no capabilities, no host
-- namespace or path, RuntimeDefault seccomp, a read-only root, the cluster's deadline), no
-- service-account token and no service links are mounted or set, and the host's credential for the
-- API server never reaches the sandbox: not in its environment, its files, its processes' command
-- lines or what the attach carried in.
local providers = require('support.providers')
local common = require('security.common')

for _, prov in ipairs(providers.list()) do
  if prov.kind == 'kubernetes' then
    describe('what a Kubernetes sandbox finds of its cluster (' .. prov.name .. ')', function()
      local pool, sb
      setup(function()
        pool = prov.make_pool({ max_sandboxes = 1 })
        sb = pool:create({ lifetime_ms = 120000, env = { HOST_GAVE = 'this' } })
      end)
      teardown(function() if pool then pool:close() end end)

      it('runs in a Pod the API server recorded as locked down', function()
        local p = sb._backend.api:json('GET', sb._backend.path)
        local s = p.spec
        assert.is_false(s.automountServiceAccountToken)
        assert.is_false(s.enableServiceLinks)
        assert.is_falsy(s.hostNetwork or s.hostPID or s.hostIPC)
        assert.is_true(s.activeDeadlineSeconds > 0 and s.activeDeadlineSeconds <= 121)
        assert.is_true(s.securityContext.runAsNonRoot)
        for _, v in ipairs(s.volumes or {}) do
          assert.is_nil(v.hostPath, 'a host path volume: ' .. v.name)
          assert.is_nil(v.projected, 'a projected volume (a token?): ' .. v.name)
          assert.is_nil(v.secret, 'a secret volume: ' .. v.name)
        end
        for _, c in ipairs(s.containers) do
          local sc = c.securityContext
          assert.is_true(sc.runAsNonRoot)
          assert.is_true(sc.runAsUser > 0)
          assert.is_false(sc.privileged)
          assert.is_false(sc.allowPrivilegeEscalation)
          assert.is_true(sc.readOnlyRootFilesystem)
          assert.are.same({ 'ALL' }, sc.capabilities.drop)
          assert.is_nil(sc.capabilities.add)
          assert.are.equal('RuntimeDefault', sc.seccompProfile.type)
          assert.is_nil(c.env, 'the Pod carries an env: the create\'s goes through the agent alone')
          assert.are.same(c.resources.limits, c.resources.requests)
        end
        -- inside, as recorded: the uid of no account, no capabilities, no new privileges
        local r = common.sh(sb, 'id -u; grep -E "^(CapEff|CapPrm|CapBnd|NoNewPrivs)" /proc/self/status')
        assert.are.equal(tostring(s.containers[1].securityContext.runAsUser), r.stdout:match('^(%d+)'))
        assert.truthy(r.stdout:find('CapEff:%s+0+\n'), r.stdout)
        assert.truthy(r.stdout:find('CapBnd:%s+0+\n'), r.stdout)
        assert.truthy(r.stdout:find('NoNewPrivs:%s+1'), r.stdout)
      end)

      it('finds no service-account token, no service links and nothing of the host\'s credential', function()
        local r = common.sh(sb, 'ls -a /var/run/secrets /run/secrets 2>&1; env; true')
        assert.is_falsy(r.stdout:find('serviceaccount', 1, true), r.stdout)
        assert.is_falsy(r.stdout:find('KUBERNETES_', 1, true), r.stdout)
        assert.truthy(r.stdout:find('HOST_GAVE=this', 1, true))   -- the create's env did arrive
        -- the token the host authenticates with: in no environment, command line or file the
        -- sandbox's code can read, and not in what the agent received through the attach
        local token = prov.token
        assert.is_string(token)
        -- the needle in a file of its own, read by grep -f: no command line holds it
        sb:write_file('/tmp/.n', token:sub(1, 12))
        local found = common.sh(sb, 'for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do ' ..
          'grep -l -a -F -f /tmp/.n "$f" 2>/dev/null; done; ' ..
          'grep -r -l -a -F -f /tmp/.n --exclude=.n / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null; ' ..
          'rm -f /tmp/.n; true', { timeout_ms = 60000 })
        assert.are.equal('', found.stdout)
      end)
    end)
  end
end
