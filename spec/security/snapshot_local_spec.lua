-- Local native snapshots against a hostile sandbox: what the copy holds of the host's memory is
-- all counted against max_snapshot_bytes, also the path the copier keeps of each file with more
-- than one name (to link the later names to it), which a sandbox can make some 4 KiB long for
-- each of its files.
local providers = require('support.providers')

local MIB = 1048576

local function sh(sb, script)
  local r = sb:exec({ 'sh', '-c', script })
  assert.are.equal(0, r.exit_code, 'the command failed: ' .. r.stderr)
  return r.stdout
end

for _, prov in ipairs(providers.list()) do
  if prov.name == 'local' then
    describe('local native snapshot abuse', function()
      local pool
      setup(function()
        pool = prov.make_pool({ tmp_mib = 16, workspace_mib = 64, max_sandboxes = 2, call_timeout_ms = 60000,
          max_snapshot_bytes = 8 * MIB })
      end)
      teardown(function() pool:close() end)

      it('counts the paths it keeps of hard-linked files against max_snapshot_bytes', function()
        if pool.provider.features.snapshots ~= 'native' then
          pending('local snapshots are native only as root on Linux 6.3 or later')
          return
        end
        local sb = pool:create({ lifetime_ms = 120000 })
        -- 3,000 empty files, each with a second name, some 3,900 bytes down
        sh(sb, 'n=$(printf "d%.0s" $(seq 240)); d=.; for i in $(seq 16); do d=$d/$n; done; '
          .. 'mkdir -p "$d/a" "$d/b" && cd "$d/a" && seq 3000 | xargs touch && ln -t ../b -- *')
        -- about 3 MiB of entries, and 12 MiB of paths held by the copier
        assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
        assert.are.same({ 0, 0 }, { pool:snapshots() })
        sb:release()
      end)
    end)
  end
end
