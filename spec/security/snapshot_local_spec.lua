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

      it('snapshots made at once hold at most max_snapshot_bytes of the host memory together', function()
        if pool.provider.features.snapshots ~= 'native' then
          pending('local snapshots are native only as root on Linux 6.3 or later')
          return
        end
        local uv = require('luv')
        local task = require('mayura._task')
        local mark = require('mayura.sandbox._host').process_mark() .. '-'
        -- what this process's snapshots hold in the host's memory now (their tmpfs, each its own)
        local function held()
          local sum, dir = 0, uv.fs_scandir('/run/mayura-snap')
          while dir do
            local n = uv.fs_scandir_next(dir)
            if not n then break end
            if n:sub(1, #mark) == mark then
              local st = uv.fs_statfs('/run/mayura-snap/' .. n)
              if st then sum = sum + (st.blocks - st.bfree) * st.bsize end
            end
          end
          return sum
        end
        local sbs = {}
        for i = 1, 2 do
          sbs[i] = pool:create({ lifetime_ms = 120000 })
          sh(sbs[i], 'head -c 6000000 /dev/urandom > data')
        end
        -- each fits the cap (8 MiB) alone; both do not
        local peak, running = 0, 2
        local results = {}
        for i = 1, 2 do
          task.spawn(function()
            results[i] = { pcall(sbs[i].snapshot, sbs[i]) }
            running = running - 1
          end)
        end
        while running > 0 do
          peak = math.max(peak, held())
          task.sleep(2)
        end
        local made = 0
        for i = 1, 2 do
          if results[i][1] then
            made = made + 1
            results[i][2]:release()
          else
            assert.are.equal('LIMIT_EXCEEDED', results[i][2].code)
          end
        end
        assert.are.equal(1, made)
        assert.is_true(peak > 5 * MIB and peak <= 8 * MIB, 'the snapshots being made held ' .. peak .. ' bytes at once')
        for i = 1, 2 do sbs[i]:release() end
      end)
    end)
  end
end
