-- Faults of a sandbox itself, on every provider here: removed behind the pool's back (a container
-- removed with `docker rm -f`, a local sandbox's bubblewrap killed), and a full working directory.
-- Each maps to a coded error, leaves nothing behind, and the pool stays usable.
local providers = require('support.providers')
local common = require('security.common')

local MIB = 1048576

local sh = common.sh

-- Removes the sandbox from under the pool, the way an operator or a crash would.
local function remove_behind(prov, sb)
  if prov.remove_behind then return prov.remove_behind(sb) end   -- an entry's own way (Kubernetes: the Pod deleted)
  if prov.kind == 'docker' then
    local _, ok = providers.host('docker rm -f ' .. sb._backend.container)
    return ok
  end
  -- a local sandbox: every process in its cgroup (bubblewrap, the agent, its commands)
  local procs = io.open((sb._backend.cg_dirs[1] or '/nonexistent') .. '/cgroup.procs')
  if not procs then return false end
  local pids = {}
  for pid in procs:lines() do pids[#pids + 1] = pid end
  procs:close()
  os.execute('kill -9 ' .. table.concat(pids, ' '))
  return #pids > 0
end

for _, prov in ipairs(providers.list()) do
  describe('sandbox faults (' .. prov.name .. ')', function()
    local pool
    setup(function() pool = prov.make_pool({ max_sandboxes = 3, workspace_mib = 16 }) end)
    teardown(function() pool:close() end)

    it('maps a sandbox removed behind the pool\'s back to gone, on every call, and leaves nothing', function()
      local sb = pool:create({ lifetime_ms = 120000 })
      if prov.kind == 'local' and #sb._backend.cg_dirs == 0 then
        sb:release()
        return pending('a local sandbox is found by its cgroup, which needs root')
      end
      local sibling = pool:create({ lifetime_ms = 120000 })
      sb:write_file('kept.txt', 'x')
      assert.is_true(remove_behind(prov, sb), 'could not remove ' .. sb.id)
      local t = common.now()
      local calls = {
        function() return sb:exec({ 'echo', 'hi' }) end,
        function() return sb:read_file('kept.txt') end,
        function() return sb:write_file('new.txt', 'y') end,
        function() return sb:list_files('.') end,
        function() return sb:remove_file('kept.txt') end,
      }
      for i, call in ipairs(calls) do
        local ok, err = pcall(call)
        assert.is_false(ok, 'call ' .. i .. ' succeeded on a removed sandbox')
        assert.is_true(common.is_gone(err), 'call ' .. i .. ': ' .. tostring(err))
      end
      assert.is_true(common.now() - t < 10000, 'the calls took ' .. (common.now() - t) .. ' ms')
      assert.are.equal('sibling\n', sibling:exec({ 'echo', 'sibling' }).stdout)
      sb:release()
      sibling:release()
      assert.are.equal(0, pool:count())
      assert.is_true(common.eventually(function() return #prov.leftovers(sb) == 0 end, 5000))
      assert.are.same({}, prov.leftovers(sb))
      local again = pool:create({ lifetime_ms = 60000 })
      assert.are.equal('again\n', again:exec({ 'echo', 'again' }).stdout)
      again:release()
    end)

    it('maps a full workdir to LIMIT_EXCEEDED, leaves no temporary file, and recovers once space is freed', function()
      local sb = pool:create({ lifetime_ms = 120000 })
      local r = sh(sb, 'mkdir -p sub && head -c ' .. (64 * MIB) .. ' /dev/zero > fill; echo rc=$?')
      assert.is_nil(r.stdout:find('rc=0', 1, true), 'the workdir did not fill up')
      local big = string.rep('z', 2 * MIB)
      local err = assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, 'new.txt', big)
      assert.matches('space', err.message)
      assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, 'sub/new.txt', big)
      assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, 'fill', big)
      -- nothing half-written was left, in the workdir or where the parent directories were made
      for _, d in ipairs({ '.', 'sub' }) do
        for _, e in ipairs(sb:list_files(d)) do
          assert.is_nil(e.name:find('mayura', 1, true), 'a temporary file was left: ' .. d .. '/' .. e.name)
          assert.are_not.equal('new.txt', e.name)
        end
      end
      -- the rest of the sandbox works: commands, reads, listings; writes in the command fail cleanly
      assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
      assert.is_not_nil(sb:read_file('/etc/passwd'))
      r = sh(sb, 'echo more >> fill; echo rc=$?')
      assert.is_nil(r.stdout:find('rc=0', 1, true))
      -- space comes back
      sb:remove_file('fill')
      sb:write_file('new.txt', big)
      assert.are.equal(#big, #sb:read_file('new.txt'))
      sb:release()
      assert.is_true(common.eventually(function() return #prov.leftovers(sb) == 0 end, 5000))
      assert.are.same({}, prov.leftovers(sb))
    end)
  end)
end
