local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local transports = require('support.command_transports')

for _, kind in ipairs({
  { name = 'with standard input (dash)', opts = { stdin = true, max_command_bytes = 65536 } },
  { name = 'without standard input, 4096-byte commands (BusyBox sh)',
    opts = { stdin = false, max_command_bytes = 4096, shell = { '/usr/bin/busybox', 'sh' } } },
}) do
  describe('the conformance suite through command_sandbox_backend ' .. kind.name, function()
    local provider = transports.command_provider(kind.opts)
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
    local sb = pool:create({ lifetime_ms = 600000 })
    for _, case in ipairs(testing.sandbox_conformance) do
      it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
    end
    teardown(function() pool:close(); provider.pool:close() end)
  end)
end
