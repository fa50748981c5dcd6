-- Disk abuse, on every provider here: the workdir and /tmp filled by bytes and by inodes, and the
-- places that must not be writable at all (the root, /dev, /etc, /usr). A sandbox gets "no space"
-- at its caps (or, for an inode flood that uses up its memory, is reported gone); the host's disk
-- is untouched, a sibling goes on, and space comes back once the files are removed.
local providers = require('support.providers')
local common = require('security.common')

local MIB = 1048576
local CAP_MIB = 16

local sh = common.sh

-- Free bytes and inodes of the host file system holding `path`.
local function host_free(path)
  local out = providers.host("df -P -k '" .. path .. "' | tail -1; df -P -i '" .. path .. "' | tail -1")
  local kib, inodes = out:match('^%S+%s+%d+%s+%d+%s+(%d+).-\n%S+%s+%d+%s+%d+%s+(%d+)')
  return tonumber(kib), tonumber(inodes)
end

for _, prov in ipairs(providers.list()) do
  describe('disk abuse (' .. prov.name .. ')', function()
    local pool, sb, sibling
    local made = {}
    local function fresh()
      if sb then pcall(sb.release, sb) end
      sb = pool:create({ lifetime_ms = 300000 })
      made[#made + 1] = sb
      common.install(sb)
    end
    -- a flood whose memory ends its sandbox may do so after the flood's own answer (gVisor's tmpfs
    -- has no inode cap, so a flood of files fills the sandbox's memory): the next case then starts
    -- from a fresh one; `gone` is the only failure taken as that
    local function live()
      local ok, err = pcall(sb.exec, sb, { 'true' })
      if not ok then
        assert.is_true(common.is_gone(err), tostring(err))
        fresh()
      end
    end
    setup(function()
      pool = prov.make_pool({ tmp_mib = CAP_MIB, workspace_mib = CAP_MIB, max_sandboxes = 4 })
      fresh()
      sibling = pool:create({ lifetime_ms = 300000 })
      made[#made + 1] = sibling
    end)
    teardown(function() pool:close() end)

    for _, dir in ipairs({ '/workspace', '/tmp' }) do
      it('fills ' .. dir .. ' by bytes only up to its cap, then space comes back', function()
        local kib, inodes = host_free('/')
        local r = sh(sb, 'head -c ' .. (CAP_MIB * 4 * MIB) .. ' /dev/zero > ' .. dir .. '/fill; echo rc=$?; ' ..
          'wc -c < ' .. dir .. '/fill', { timeout_ms = 20000 })
        local rc, size = r.stdout:match('rc=(%d+)%s+(%d+)')
        assert.is_not_nil(rc, r.stdout .. r.stderr)
        assert.are_not.equal('0', rc, 'the fill did not fail')
        assert.is_true(tonumber(size) <= CAP_MIB * MIB, dir .. ' took ' .. size .. ' bytes')
        -- the file API says so too, in its own words
        local err = assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, dir .. '/more', string.rep('y', 2 * MIB))
        assert.matches('space', err.message)
        -- and leaves no temporary file behind
        for _, e in ipairs(sb:list_files(dir)) do
          assert.is_nil(e.name:find('mayura', 1, true), 'a temporary file was left: ' .. e.name)
        end
        -- the host's disk did not pay for it
        local kib2, inodes2 = host_free('/')
        assert.is_true(kib - kib2 < 8 * 1024, 'the host lost ' .. (kib - kib2) .. ' KiB')
        assert.is_true(inodes - inodes2 < 1000)
        assert.are.equal('sibling\n', sibling:exec({ 'echo', 'sibling' }).stdout)
        sb:remove_file(dir .. '/fill')
        sb:write_file(dir .. '/more', string.rep('y', 2 * MIB))
        sb:remove_file(dir .. '/more')
      end)
    end

    for _, dir in ipairs({ '/workspace', '/tmp' }) do
      it('fills ' .. dir .. ' by inodes: stopped ("no space", out of memory) or the sandbox gone', function()
        live()
        sh(sb, 'mkdir -p ' .. dir .. '/inodes')
        local ok, r = pcall(common.abuse, sb, { 'inodes', dir .. '/inodes', '4000' }, { timeout_ms = 20000 })
        if ok then
          -- it made files until something said no (or its time was up), and the sandbox goes on
          local kv = common.kv(r.stdout)
          assert.is_true(r.oom_killed == true or kv.err ~= nil, r.stdout .. r.stderr)
          local cleaned, c = pcall(sh, sb, 'rm -rf ' .. dir .. '/inodes; echo cleaned', { timeout_ms = 20000 })
          if cleaned then
            assert.are.equal('cleaned\n', c.stdout)
          else
            assert.is_true(common.is_gone(c), tostring(c))
            fresh()
          end
        else
          assert.is_true(common.is_gone(r), tostring(r))
          -- gone means gone for every call, and the pool makes a new one
          assert.is_true(common.is_gone(select(2, pcall(sb.exec, sb, { 'true' }))))
          fresh()
        end
        assert.are.equal('sibling\n', sibling:exec({ 'echo', 'sibling' }).stdout)
        assert.are.equal('fresh\n', sb:exec({ 'echo', 'fresh' }).stdout)
      end)
    end

    it('cannot write the root, /dev, /etc or /usr (no uncapped place to fill)', function()
      live()
      local r = sh(sb, 'for p in /fill /dev/fill /etc/fill /usr/fill /bin/fill /.mayura/fill; do ' ..
        'echo x > $p 2>/dev/null && echo wrote=$p; done; true')
      assert.are.equal('', r.stdout)
      for _, p in ipairs({ '/fill', '/dev/fill', '/etc/fill', '/usr/fill' }) do
        local ok, err = pcall(sb.write_file, sb, p, 'x')
        assert.is_false(ok, p .. ' was written')
        assert.are.equal('PERMISSION_DENIED', err.code, p .. ': ' .. tostring(err))
      end
    end)

    it('leaves nothing behind once released', function()
      local left = {}
      for _, s in ipairs(made) do
        s:release()
        common.eventually(function() return #prov.leftovers(s) == 0 end, 5000)
        for _, l in ipairs(prov.leftovers(s)) do left[#left + 1] = s.id .. ': ' .. l end
      end
      assert.are.same({}, left)
    end)
  end)
end

-- The local provider's own guarantees: run as root it caps the inodes of its tmpfs too (one per
-- 4 KiB of their size), so a flood of empty files ends with "no space" in the command and the
-- sandbox goes on; and its agent is shielded from the OOM killer, so tmpfs filled past memory_mib
-- (their caps may add up to more) never take it down.
for _, prov in ipairs(providers.list()) do
  if prov.kind == 'local' then
    describe('tmpfs of a local sandbox', function()
      local pool, provider
      setup(function()
        pool, provider = prov.make_pool({ workspace_mib = CAP_MIB, tmp_mib = CAP_MIB, memory_mib = 64 })
      end)
      teardown(function() pool:close() end)

      it('ends an inode flood in /workspace with "no space" in the command, and the sandbox goes on', function()
        if not provider.enforced.inodes then
          return pending('inodes are not capped by this provider here (not root: bubblewrap\'s tmpfs)')
        end
        local sb = pool:create({ lifetime_ms = 120000 })
        common.install(sb)
        sh(sb, 'mkdir /workspace/flood')
        local _, kv = common.abuse(sb, { 'inodes', '/workspace/flood', '60000' }, { timeout_ms = 90000 })
        assert.are.equal('ENOSPC', kv.err)
        assert.is_true(tonumber(kv.files) <= CAP_MIB * MIB / 4096, kv.files .. ' files')
        -- the sandbox goes on: a command, and the file API saying "no space" in its own words
        assert.are.equal('after\n', sb:exec({ 'echo', 'after' }).stdout)
        local err = assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, '/workspace/one-more', 'x')
        assert.matches('space', err.message)
        assert.are.equal('cleaned\n', sh(sb, 'rm -rf /workspace/flood; echo cleaned', { timeout_ms = 60000 }).stdout)
        sb:write_file('/workspace/one-more', 'x')
        sb:release()
        assert.are.same({}, prov.leftovers(sb))
      end)

      it('keeps its agent when /workspace, /tmp and /dev/shm are filled past memory_mib', function()
        if not provider.enforced.oom_protected then
          return pending('the kernel here refuses to shield the agent from the OOM killer ' ..
            '(provider.enforced.oom_protected is false)')
        end
        local sb = pool:create({ lifetime_ms = 120000, memory_mib = 32 })
        -- shielded, and its commands cannot take the shield for themselves
        local r = sh(sb, 'cat /proc/1/oom_score_adj /proc/self/oom_score_adj; ' ..
          'echo -1000 > /proc/self/oom_score_adj 2>/dev/null && echo lowered; true')
        assert.are.equal('-1000\n0\n', r.stdout)
        -- 3 x 16 MiB of tmpfs against 32 MiB of memory
        for _, d in ipairs({ '/workspace', '/tmp', '/dev/shm' }) do
          pcall(sh, sb, 'head -c ' .. CAP_MIB .. 'm /dev/zero > ' .. d .. '/fill-$$', { timeout_ms = 60000 })
        end
        assert.are.equal('alive\n', sb:exec({ 'echo', 'alive' }).stdout)
        sh(sb, 'rm -f /workspace/fill-* /tmp/fill-* /dev/shm/fill-*')
        assert.are.equal('alive\n', sb:exec({ 'echo', 'alive' }).stdout)
        sb:release()
      end)
    end)
  end
end
