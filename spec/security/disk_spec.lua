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
