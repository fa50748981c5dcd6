-- Docker snapshots' images against another user of the same daemon: a create from a snapshot
-- starts the image it made, by id, however its tag `mayura-snapshot:<hex>` was moved, and the
-- sweep of a killed host's images leaves alone one that only carries the snapshot label (an image
-- built on a snapshot's image inherits it) without being named in the snapshots' repository, and
-- one whose owner is a process of another pid namespace (a host in a container of its own).
local providers = require('support.providers')
local task = require('mayura._task')

local function host(cmd)
  local out, ok = providers.host(cmd)
  return out, ok
end

for _, prov in ipairs(providers.list()) do
  if prov.name == 'docker-cli' or prov.name == 'docker-api' then
    describe('snapshot images (' .. prov.name .. ')', function()
      local pool
      setup(function()
        pool = prov.make_pool({ tmp_mib = 16, workspace_mib = 16, max_sandboxes = 2, call_timeout_ms = 20000 })
      end)
      teardown(function() pool:close() end)

      it('a create from a snapshot uses its image by id, not a tag another user moved', function()
        local sb = pool:create({ lifetime_ms = 120000 })
        sb:write_file('mine.txt', 'ours')
        local snap = sb:snapshot()
        sb:release()
        local ref = snap._held.native.image
        local tags = host('docker image inspect --format "{{range .RepoTags}}{{.}} {{end}}" ' .. ref)
        local tag = tags:match('mayura%-snapshot:%x+')
        assert.truthy(tag)
        -- another user of the daemon points the tag at an image of theirs
        local _, ok = host('docker tag ' .. providers.BUSYBOX .. ' ' .. tag)
        assert.truthy(ok)
        local ok_create, fork = pcall(pool.create, pool, { lifetime_ms = 60000, snapshot = snap })
        local text = ok_create and fork:read_file('mine.txt')
        if ok_create then fork:release() end
        snap:release()
        host('docker image rm ' .. tag)
        assert.are.equal('ours', text, ok_create and '' or tostring(fork))
        -- their image stays (only the tag they put in our repository may go)
        local _, still = host('docker image inspect ' .. providers.BUSYBOX)
        assert.truthy(still)
      end)

      it('the sweep removes only images named in the snapshots\' repository', function()
        -- an image of another user's, built on a snapshot's (so with its label, of a host long gone),
        -- and one a killed host of ours left
        local r = math.random(1, 1e9)
        local name = 'mayura-spec-foreign:' .. r
        local ours = 'mayura-snapshot:' .. ('%08x'):format(r)
        local function build(tag, extra, owner)
          local _, ok = host('printf "FROM ' .. providers.BUSYBOX .. '\\nLABEL mayura.snapshot.owner=' .. (owner or '1-1')
            .. ' ' .. extra .. '\\n" | docker build -q -t ' .. tag .. ' -')
          assert.truthy(ok)
        end
        build(name, 'foreign=' .. r)
        build(ours, 'ours=' .. r)
        -- and one of a host in another pid namespace (a container of its own on the same daemon), whose
        -- mark names a process this host cannot see (a live one here, so that no other host of this
        -- machine sweeps it while the spec looks)
        local theirs = 'mayura-snapshot:' .. ('%08x'):format(r + 1)
        build(theirs, 'mayura.snapshot.pidns=1 theirs=' .. r, require('mayura.sandbox._host').process_mark())
        local function id_of(ref)
          return (host('docker image inspect --format "{{.Id}}" ' .. ref)):match('sha256:%x+')
        end
        local ids = { name = id_of(name), ours = id_of(ours), theirs = id_of(theirs) }
        -- what the sweep looks at (asked at once: other hosts of the machine sweep the same daemon)
        local p = prov.make_provider({})   -- its sweep runs in the background
        local listed = {}
        for _, im in ipairs(p.engine:list_snapshot_images()) do listed[im.ref] = im end
        assert.is_nil(listed[ids.name])
        assert.truthy(listed[ids.theirs])
        assert.are.equal('1', listed[ids.theirs].pidns)
        assert.are_not.equal('1', require('mayura.sandbox._host').pid_namespace())
        -- and ours is taken
        local gone
        for _ = 1, 100 do
          gone = not select(2, host('docker image inspect ' .. ours))
          if gone then break end
          task.sleep(100)
        end
        host('docker image rm ' .. name .. ' ' .. theirs)
        assert.truthy(gone)
      end)
    end)
  end
end
