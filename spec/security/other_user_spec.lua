-- Another user of the host against the local provider run by an unprivileged user. The provider
-- keeps nothing in a shared place another user could take first (each sandbox gets its agent and
-- /etc as copies from the provider itself), so a /tmp/mayura-<user> planted before it runs, as a
-- directory or as a symbolic link to one of the victim's own directories, is never used: nothing
-- is written there, nothing is loosened through the link. And run unprivileged, sandboxes start
-- (bubblewrap with an unprivileged user namespace). The users are made here and removed after.
local providers = require('support.providers')
local util = require('support.util')

local function host_ok(cmd)
  local _, ok = providers.host(cmd)
  return ok
end

local function local_entry()
  for _, p in ipairs(providers.list()) do
    if p.kind == 'local' then return p end
  end
end

local function is_root()
  local f = io.open('/proc/self/status')
  local s = f and f:read('a') or ''
  if f then f:close() end
  return s:match('\nUid:%s+%d+%s+(%d+)') == '0'
end

describe('the local provider run by an unprivileged user, another user against it', function()
  if not local_entry() or not is_root() or not host_ok('command -v useradd && command -v setpriv') then
    it('cannot run here: needs root (to make the users), useradd, setpriv and the local provider', function()
      pending('needs root, useradd, setpriv and the local provider')
    end)
    return
  end
  if util.pending_if_closed_to_others('the users it makes run build/mayura from the checkout', pending) then return end

  local tag = ('%05d'):format(math.random(0, 99999))
  local victim, attacker = 'mayura-v' .. tag, 'mayura-a' .. tag
  local planted = '/tmp/mayura-' .. victim
  local dir, script

  setup(function()
    assert(host_ok('useradd -M -N -s /usr/sbin/nologin ' .. victim))
    assert(host_ok('useradd -M -N -s /usr/sbin/nologin ' .. attacker))
    dir = util.tmpdir()
    script = dir .. '/victim.lua'
    local f = assert(io.open(script, 'w'))
    f:write([[
package.path = 'spec/?.lua;' .. package.path
local L = require('mayura.sandbox.local')
local p = L.local_sandboxes({ tmp_mib = 16, workspace_mib = 16 })
local sb = p:create({ lifetime_ms = 30000, network = 'none' })
local r = sb:exec({ 'sh', '-c', 'echo started; id -u; cat /proc/self/mountinfo' },
  { timeout_ms = 10000, max_output_bytes = 1048576 })
io.write(r.stdout)
sb:release()
io.write('released ', tostring(sb.exited), '\n')
]])
    f:close()
    os.execute("chmod 755 '" .. dir .. "'; chmod 644 '" .. script .. "'")
  end)

  teardown(function()
    os.execute("rm -rf '" .. planted .. "' /tmp/mayura-victim-" .. tag)
    util.rmdir(dir)
    os.execute('userdel ' .. victim .. ' 2>/dev/null; userdel ' .. attacker .. ' 2>/dev/null')
  end)

  local function as(user, cmd)
    return providers.host('setpriv --reuid ' .. user .. ' --regid users --clear-groups -- sh -c ' ..
      "'" .. cmd:gsub("'", "'\\''") .. "'")
  end

  -- The victim's run: a sandbox made and released by the victim, with what it saw.
  local function victim_run()
    local out = providers.host('setpriv --reuid ' .. victim .. ' --regid users --clear-groups -- ' ..
      'env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ USER=' .. victim .. ' LOGNAME=' .. victim ..
      " build/mayura '" .. script .. "'")
    assert.matches('^started\n', out)
    assert.matches('released true\n', out)
    assert.is_nil(out:find('/tmp/mayura', 1, true), out)
    return out
  end

  it('starts sandboxes, and never uses a /tmp/mayura-<user> directory another user made first', function()
    as(attacker, 'mkdir -m 0777 ' .. planted .. ' && echo planted > ' .. planted .. '/planted')
    local before = providers.host("ls -la --time-style=+ '" .. planted .. "'")
    local out = victim_run()
    -- inside, the sandbox user; behind it, the victim's own uid
    assert.matches('^started\n1000\n', out)
    assert.are.equal(before, providers.host("ls -la --time-style=+ '" .. planted .. "'"))
    os.execute("rm -rf '" .. planted .. "'")
  end)

  it('never follows a /tmp/mayura-<user> symbolic link another user planted to a directory of the victim', function()
    local private = '/tmp/mayura-victim-' .. tag
    as(victim, 'mkdir -m 0700 ' .. private)
    as(attacker, 'ln -s ' .. private .. ' ' .. planted)
    victim_run()
    assert.are.equal('700 ' .. victim .. '\n', providers.host("stat -c '%a %U' '" .. private .. "'"))
    assert.are.equal('', providers.host("ls -A '" .. private .. "'"))
    assert.is_true(host_ok("test -L '" .. planted .. "'"))
  end)
end)
