-- Warm sandboxes (`warm = N` on the local and Docker providers): handed out once, with the asked
-- env and labels, inside max_sandboxes, and nothing left behind by a close while refilling or by
-- a host killed with SIGKILL. On local and on Docker's 'api' engine (the warm set is the same code
-- for both engines; only the container's start differs).
local task = require('mayura._task')
local core = require('mayura.core')
local util = require('support.util')
local compat = require('support.compat')
local providers = require('support.providers')

local function random_hex(n)
  local f = assert(io.open('/dev/urandom', 'rb'))
  local s = f:read(n)
  f:close()
  return (s:gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

-- Waits until the provider has `n` warm sandboxes ready.
local function ready(p, n)
  return util.eventually(function() return p:warm_ready() >= n end, 20000)
end

-- What is left on the host of each backend `bs` (the provider's leftovers check).
local function leftovers_of(entry, bs)
  local out = {}
  for _, b in ipairs(bs) do
    for _, l in ipairs(entry.leftovers({ id = b.id, _backend = b })) do out[#out + 1] = l end
  end
  return out
end

local function gone(entry, bs)
  return util.eventually(function() return #leftovers_of(entry, bs) == 0 end, 15000)
end

for _, entry in ipairs(providers.list()) do
  if entry.name ~= 'docker-cli' then
    describe('warm sandboxes on ' .. entry.name, function()
      it('hands each one out once, with the env asked for, and refills', function()
        local pool, p = entry.make_pool({ warm = 2, max_sandboxes = 4 })
        assert.is_true(ready(p, 2))
        local tasks, sbs = {}, {}
        for i = 1, 3 do
          tasks[i] = task.spawn(function()
            sbs[i] = pool:create({ lifetime_ms = 60000, env = { WHO = 'n' .. i } })
          end)
        end
        for _, t in ipairs(tasks) do t:wait() end
        local ids = {}
        for i, sb in ipairs(sbs) do
          assert.is_nil(ids[sb.id], 'one sandbox handed out twice')
          ids[sb.id] = true
          assert.are.equal('n' .. i .. '\n', sb:exec({ 'sh', '-c', 'echo $WHO' }).stdout)
          sb:write_file('mine', sb.id)
        end
        for _, sb in ipairs(sbs) do assert.are.equal(sb.id, sb:read_file('mine')) end
        -- the slots: three handed out, and the provider's warm ones fill only the one left
        assert.are.equal(3, pool:count())
        assert.is_true(pool:count() + p:warm_held() <= 4)
        assert.is_true(ready(p, 1))
        assert.are.equal(1, p:warm_held())
        local last = pool:create({ lifetime_ms = 60000 })
        assert.is_nil(ids[last.id])
        assert.are.equal('', last:exec({ 'sh', '-c', 'echo -n $WHO' }).stdout)
        assert.raises_code('LIMIT_EXCEEDED', pool.create, pool, { lifetime_ms = 60000 })
        -- a released sandbox is destroyed, never put back
        last:release()
        assert.is_true(ready(p, 1))
        local again = pool:create({ lifetime_ms = 60000 })
        assert.are_not.equal(last.id, again.id)
        pool:close()
        assert.are.equal(0, p:warm_held())
      end)

      it('makes room for a create of another shape by destroying a warm one', function()
        local pool, p = entry.make_pool({ warm = 2, max_sandboxes = 2 })
        assert.is_true(ready(p, 2))
        local sb = pool:create({ lifetime_ms = 60000, memory_mib = 64 })
        assert.is_true(pool:count() + p:warm_held() <= 2)
        assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
        pool:close()
        assert.are.equal(0, p:warm_held())
      end)

      if entry.kind == 'docker' then
        it('carries the pool\'s labels; a create with labels of its own gets a cold one with them', function()
          local tag = random_hex(4)
          local pool, p = entry.make_pool({ warm = 1, labels = { warmspec = tag } })
          assert.is_true(ready(p, 1))
          local warm = pool:create({ lifetime_ms = 60000, env = { A = '1' } })
          assert.are.equal(0, p:warm_ready())
          assert.are.equal('1\n', warm:exec({ 'sh', '-c', 'echo $A' }).stdout)
          local function label(sb, key)
            return (providers.host("docker inspect --format '{{index .Config.Labels \"" .. key .. "\"}}' "
              .. sb._backend.container)):match('%S*')
          end
          assert.are.equal(tag, label(warm, 'warmspec'))
          assert.is_true(ready(p, 1))
          local cold = pool:create({ lifetime_ms = 60000, env = { A = '2' }, labels = { mine = 'yes' } })
          assert.are.equal(1, p:warm_ready())
          assert.are.equal('yes', label(cold, 'mine'))
          assert.are.equal(tag, label(cold, 'warmspec'))
          assert.are.equal('2\n', cold:exec({ 'sh', '-c', 'echo $A' }).stdout)
          pool:close()
        end)
      end

      it('close() while refilling leaves nothing', function()
        local pool, p = entry.make_pool({ warm = 3, max_sandboxes = 4 })
        assert.is_true(ready(p, 1))
        -- one handed out: the set is refilling when the pool closes
        local sb = pool:create({ lifetime_ms = 60000 })
        task.sleep(5)
        pool:close()
        assert.are.equal(0, p:warm_held())
        assert.are.equal(0, pool:count())
        local made = p:warm_made()
        assert.is_true(#made >= 3)
        assert.are.same({}, leftovers_of(entry, made))
        assert.are.same({}, entry.leftovers(sb))
      end)

      it('leaves no warm sandbox behind a host killed with SIGKILL', function()
        local dir = util.tmpdir()
        local script = dir .. '/hold.lua'
        local f = assert(io.open(script, 'w'))
        f:write(([[
local sandbox = require('mayura.sandbox')
package.path = 'spec/?.lua;' .. package.path
local entry
for _, e in ipairs(require('support.providers').list()) do if e.name == %q then entry = e end end
local pool, p = entry.make_pool({ warm = 2, max_sandboxes = 2, max_lifetime_ms = 600000 })
while p:warm_ready() < 2 do require('mayura').sleep(20) end
local out = io.open(%q, 'w')
for _, b in ipairs(p:warm_made()) do
  out:write(b.id, ' ', table.concat(b.cg_dirs or {}, ','), ' ', b.container or '-', '\n')
end
out:close()
require('mayura').sleep(600000)
]]):format(entry.name, dir .. '/ids'))
        f:close()
        local proc = assert(core.spawn({ argv = { compat.host, script } }, function() end))
        local text
        util.eventually(function()
          local g = io.open(dir .. '/ids', 'r')
          text = g and g:read('a')
          if g then g:close() end
          return text ~= nil and text:find('\n') ~= nil
        end, 30000)
        local bs = {}
        for id, dirs, container in (text or ''):gmatch('(%S+) (%S*) (%S+)\n') do
          local b = { id = id, cg_dirs = {} }
          for d in dirs:gmatch('[^,]+') do b.cg_dirs[#b.cg_dirs + 1] = d end
          if container ~= '-' then b.container = container end
          bs[#bs + 1] = b
        end
        assert.are.equal(2, #bs)
        assert.are.same({}, leftovers_of(entry, {}))
        os.execute('kill -9 ' .. proc:pid())
        assert.is_true(gone(entry, bs), 'a warm sandbox outlived its host')
        if entry.kind == 'docker' then
          -- the sockets' directories go with the next create's sweep once their time is past; here, now
          for _, b in ipairs(bs) do providers.host('rm -rf /run/mayura/docker/*-' .. b.id) end
        end
        util.rmdir(dir)
      end)
    end)
  end
end
