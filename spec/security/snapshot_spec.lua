-- Snapshots of hostile sandboxes, on every provider here: a sparse file of a terabyte is cut at
-- max_snapshot_bytes (tar ends at once, not after reading a terabyte of zeros within the call
-- timeout), a sandbox whose disk is full is still snapshotted and forked (the archive is streamed
-- out and in through the agent, never written into a sandbox's /tmp), links to what the sandbox
-- cannot read (the agent's environment, the host's /proc) come back as links with nothing of
-- their targets, and nothing is kept, left in the sandbox, or leaked to a sibling.
local providers = require('support.providers')

local MIB = 1048576

local function sh(sb, script)
  local r = sb:exec({ 'sh', '-c', script })
  assert.are.equal(0, r.exit_code, 'the command failed: ' .. r.stderr)
  return r.stdout
end

for _, prov in ipairs(providers.list()) do
  describe('snapshot abuse (' .. prov.name .. ')', function()
    local pool
    setup(function()
      pool = prov.make_pool({ tmp_mib = 16, workspace_mib = 16, max_sandboxes = 3, call_timeout_ms = 15000,
        max_snapshot_bytes = 64 * MIB })
    end)
    teardown(function() pool:close() end)

    it('a sparse file of a terabyte is cut at max_snapshot_bytes, and nothing is kept', function()
      local sb = pool:create({ lifetime_ms = 120000 })
      sh(sb, 'dd if=/dev/zero of=huge bs=1 count=0 seek=1099511627776 2>/dev/null; ls -l huge')
      local err = assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
      assert.truthy(err.message:find('max_snapshot_bytes', 1, true))
      assert.are.same({ 0, 0 }, { pool:snapshots() })
      -- the sandbox goes on, with nothing of the snapshot in it or running
      assert.are.equal('huge\n', sh(sb, 'ls -A'))
      assert.are.equal('', sh(sb, 'ls -A /tmp'))
      assert.are.equal('', sh(sb, 'ps -o args 2>/dev/null | grep "[t]ar -c" || true'))
      sb:release()
    end)

    it('a sandbox whose disk is full is still snapshotted, and its fork has the same files', function()
      local sb = pool:create({ lifetime_ms = 120000 })
      sb:exec({ 'sh', '-c', 'head -c 20000000 /dev/urandom > /tmp/fill; head -c 20000000 /dev/urandom > fill' })
      local used = sh(sb, 'wc -c < /tmp/fill; wc -c < fill')
      assert.truthy(sb:exec({ 'sh', '-c', 'echo x > /tmp/more' }).exit_code ~= 0)
      local snap = sb:snapshot()
      local sum = sh(sb, 'md5sum < /tmp/fill; md5sum < fill')
      sb:release()
      -- the fork is as full: the archive goes on the agent's standard input, not into its /tmp
      local fork = pool:create({ lifetime_ms = 60000, snapshot = snap })
      assert.are.equal(sum, sh(fork, 'md5sum < /tmp/fill; md5sum < fill'))
      assert.are.equal(used, sh(fork, 'wc -c < /tmp/fill; wc -c < fill'))
      fork:release()
      snap:release()
    end)

    it('links to what the sandbox cannot read come back as links, with nothing of their targets', function()
      local a = pool:create({ lifetime_ms = 120000 })
      local secret = 'sibling-secret-' .. math.random(1, 1e9)
      local sibling = pool:create({ lifetime_ms = 120000 })
      sibling:write_file('secret.txt', secret)
      sh(a, 'ln -s /proc/1/environ env && ln -s /proc/1/root root && ln -s /proc/self/cwd cwd && ' ..
        'ln -s /proc/1/fd fds')
      local snap = a:snapshot()
      -- what the snapshot holds, as an archive: the generic one, or the one a native snapshot gives back
      local held = snap._held
      local archive = held.archive or held.native:archive()
      assert.are.equal('string', type(archive))
      assert.falsy(archive:find(secret, 1, true))
      assert.falsy(archive:find('MAYURA', 1, true))
      a:release()
      local fork = pool:create({ lifetime_ms = 120000, snapshot = snap })
      assert.are.equal('/proc/1/environ\n/proc/1/root\n/proc/self/cwd\n/proc/1/fd\n',
        sh(fork, 'for l in env root cwd fds; do readlink "$l"; done'))
      for _, e in ipairs(fork:list_files('.')) do assert.are.equal('symlink', e.type) end
      assert.is_nil(fork:read_file('secret.txt'))
      fork:release()
      sibling:release()
      snap:release()
    end)
  end)
end
