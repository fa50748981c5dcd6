-- A directory too large to list, on every provider here: list_files of more entries than the cap
-- (100,000), or of more bytes of names than the cap (16 MiB), is LIMIT_EXCEEDED, and the host
-- process does not grow by the listing (its RSS, read before and after). The entries are hard links
-- to one empty file; tmpfs still counts a link against its inode cap (one per 4 to 8 KiB of its
-- size), so /tmp and the workspace here are each large enough for one case's links (100,001 in
-- /tmp, 70,000 in the workspace; the links take no pages), which stay until the sandbox's release
-- (removed one by one, they would take seconds under gVisor).
local providers = require('support.providers')
local common = require('security.common')
local util = require('support.util')


for _, prov in ipairs(providers.list()) do
  describe('listing a directory over the caps (' .. prov.name .. ')', function()
    local pool, sb
    setup(function()
      pool = prov.make_pool({ max_sandboxes = 1, memory_mib = 256, workspace_mib = 1024, tmp_mib = 1024 })
      sb = pool:create({ lifetime_ms = 300000 })
      common.install(sb)
    end)
    teardown(function()
      if sb then sb:release() end
      pool:close()
    end)

    -- Makes n names of len bytes in dir; lists it; returns the error and the host's growth.
    local function list_over(dir, n, len)
      local r, kv = common.abuse(sb, { 'names', dir, tostring(n), tostring(len) }, { timeout_ms = 120000 })
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.are.equal(tostring(n), kv.names, r.stdout)
      collectgarbage()
      collectgarbage()
      local before = util.rss_kib()
      local err = assert.raises_code('LIMIT_EXCEEDED', sb.list_files, sb, dir)
      collectgarbage()
      collectgarbage()
      local grew = util.rss_kib() - before
      return err, grew
    end

    it('refuses more than 100,000 entries with LIMIT_EXCEEDED', function()
      local err, grew = list_over('/tmp/many', 100001, 8)
      assert.matches('100000 entries', err.message)
      assert.is_true(grew < 32 * 1024, 'the host grew by ' .. grew .. ' KiB')
    end)

    it('refuses more than 16 MiB of names with LIMIT_EXCEEDED, the host not growing by them', function()
      -- 70,000 names of 250 bytes: 17.5 MB of names, which the host never receives
      local err, grew = list_over('long', 70000, 250)
      assert.matches('16 MiB of names', err.message)
      assert.is_true(grew < 16 * 1024, 'the host grew by ' .. grew .. ' KiB, about a listing\'s size')
      -- a listing under the caps still comes
      sb:write_file('few/a', 'x')
      assert.are.equal(1, #sb:list_files('few'))
    end)
  end)
end
