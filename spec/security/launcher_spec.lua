-- The local provider run as root, against tenants who choose images and another user of the host:
-- each create's mount table is its own (no file another create's table could be taken for, none
-- left behind), and an image is refused unless nobody but root can change what its path, or any
-- name beneath it, leads to while a sandbox starts; so root never binds a root-only directory.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local core = require('mayura.core')
local providers = require('support.providers')
local util = require('support.util')
local uv = require('luv')

local function is_root()
  local f = io.open('/proc/self/status')
  local s = f and f:read('a') or ''
  if f then f:close() end
  return s:match('\nUid:%s+%d+%s+(%d+)') == '0'
end

local function write(path, text)
  local f = assert(io.open(path, 'wb'))
  f:write(text)
  f:close()
end

-- An image in a directory only root may write: no program, just what the agent's file calls read.
local function image(mark)
  local base = util.image_tmpdir()
  local root = base .. '/img'
  for _, d in ipairs({ root, root .. '/etc', root .. '/data' }) do assert(uv.fs_mkdir(d, tonumber('755', 8))) end
  write(root .. '/mark', mark)
  write(root .. '/data/flag', 'image\n')
  return base, root
end

-- Every regular file right in `dir` (as name = its text).
local function files(dir)
  local found = {}
  local scan = uv.fs_scandir(dir)
  while scan do
    local name, t = uv.fs_scandir_next(scan)
    if not name then break end
    if t == 'file' then
      local f = io.open(dir .. '/' .. name, 'rb')
      found[name] = f and f:read(1048576) or ''
      if f then f:close() end
    end
  end
  return found
end

-- The files of `after` not in `before`, or changed, that hold one of `needles`.
local function new_holding(before, after, needles)
  local found = {}
  for name, text in pairs(after) do
    if before[name] ~= text then
      for _, needle in ipairs(needles) do
        if text:find(needle, 1, true) then found[#found + 1] = name; break end
      end
    end
  end
  return found
end

describe('the local provider as root, its launcher\'s mount tables and images', function()
  local ok, probe = pcall(local_provider.local_sandboxes, {})
  if not is_root() or not ok or not probe.root_table then
    it('cannot run here: needs root, bubblewrap and a launcher that may mount', function()
      pending('needs root, bubblewrap and a launcher that may mount (it builds roots from tables only then)')
    end)
    return
  end

  it('hands each create its own mount table, on a descriptor, and leaves none behind', function()
    -- sizes no other provider on this host asks for, so that a table of this provider's is known
    local before = files('/run/mayura')
    local provider = local_provider.local_sandboxes({ tmp_mib = 13, workspace_mib = 19 })
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 60000 })
    local base_a, root_a = image('A')
    local base_b, root_b = image('B')
    local held = {}
    -- two tenants' images at once, and a sandbox without one: each starts from its own tree
    for _, img in ipairs({ root_a, root_b, false, root_b, root_a }) do
      local sb = pool:create({ lifetime_ms = 60000, image = img or nil })
      held[#held + 1] = sb
      if img then assert.are.equal(img == root_a and 'A' or 'B', sb:read_file('/mark')) end
      -- the launcher names no table file: its table is a descriptor, which no path leads to
      local pid = sb._backend.proc:pid()
      local f = assert(io.open('/proc/' .. pid .. '/environ', 'rb'))
      local environ = f:read('a')
      f:close()
      assert.matches('%zMAYURA_MOUNT=%d%z', '\0' .. environ)
      for _, fd in ipairs({ '3', '4', '5', '6', '7', '8', '9' }) do
        local target = uv.fs_readlink('/proc/' .. pid .. '/fd/' .. fd)
        assert.is_nil(target and target:find('/run/mayura', 1, true), target)
      end
      if #held > 2 then table.remove(held, 1):release() end
    end
    for _, sb in ipairs(held) do sb:release() end
    pool:close()
    -- no file of this provider's tables in the launcher's directory, where another create's table
    -- could be taken for it or the next one replaced: none is ever written
    assert.are.same({}, new_holding(before, files('/run/mayura'), { 'size=13631488', root_a, root_b }))
    util.rmdir(base_a)
    util.rmdir(base_b)
  end)

  it('refuses with INVALID_CONFIG the root, an image holding mayura\'s own tree, and one others can change',
    function()
    local provider = local_provider.local_sandboxes({ tmp_mib = 16, workspace_mib = 16 })
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local base, root = image('A')
    local checkout = assert(uv.fs_realpath('.'))
    local tmp = util.tmpdir()   -- under /tmp, which every user may write
    assert(uv.fs_mkdir(tmp .. '/img', tonumber('755', 8)))
    assert(uv.fs_symlink(root, base .. '/alias'))
    assert(uv.fs_symlink(base, base .. '/up'))
    local cases = {
      { '/' }, { '//' }, { checkout }, { checkout:match('^(.*)/[^/]+$') }, { checkout .. '/build' },
      { tmp .. '/img' },
      { root, 'chown 65534 ' .. root }, { root, 'chmod 775 ' .. root }, { root, 'chmod 757 ' .. base },
      { root, 'chown 0:65534 ' .. base .. ' && chmod 775 ' .. base },
      { base .. '/alias' }, { base .. '/up/img' }, { root .. '/../img' }, { root .. '/./' },
    }
    for _, case in ipairs(cases) do
      if case[2] then assert(os.execute(case[2])) end
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { image = case[1] })
      assert.raises_code('INVALID_CONFIG', pool.create, pool, { lifetime_ms = 60000, image = case[1] })
      assert.are.equal(0, pool:count(), case[1])
      assert(os.execute('chown 0:0 ' .. base .. ' ' .. root .. ' && chmod 755 ' .. base .. ' ' .. root))
    end
    -- and as it was, it runs
    local sb = pool:create({ lifetime_ms = 60000, image = root })
    assert.are.equal('A', sb:read_file('/mark'))
    sb:release()
    pool:close()
    util.rmdir(tmp)
    util.rmdir(base)
  end)

  describe('another user who owns a directory above the image', function()
    local function host_ok(cmd)
      local _, done = providers.host(cmd)
      return done
    end
    if not host_ok('command -v useradd && command -v setpriv && command -v perl') or
        require('mayura.process').run({ 'uname', '-m' }).stdout ~= 'x86_64\n' then
      it('cannot run here: needs useradd, setpriv, perl and x86_64 (renameat2 by its number)', function()
        pending('needs useradd, setpriv, perl and x86_64')
      end)
      return
    end
    local attacker = ('mayura-s%05d'):format(math.random(0, 99999))
    setup(function() assert(host_ok('useradd -M -N -s /usr/sbin/nologin ' .. attacker)) end)
    teardown(function() os.execute('userdel ' .. attacker .. ' 2>/dev/null') end)

    it('swaps it for a link to a root-only directory\'s parent while sandboxes start: root never binds it',
      function()
      -- base (root's) holds `secret`, root's alone, and `d`, the attacker's; the image is d/x/secret,
      -- and d/x swapped for a link to base makes that path name the root-only directory
      local base = util.image_tmpdir()
      local d = base .. '/d'
      for _, dir in ipairs({ base .. '/secret', base .. '/secret/data', d, d .. '/x', d .. '/x/secret',
          d .. '/x/secret/data' }) do
        assert(uv.fs_mkdir(dir, tonumber('755', 8)))
      end
      assert(uv.fs_chmod(base .. '/secret', tonumber('700', 8)))
      write(base .. '/secret/data/flag', 'root only\n')
      write(d .. '/x/secret/data/flag', 'image\n')
      assert(uv.fs_symlink(base, d .. '/l'))
      assert(os.execute('chown -hR ' .. attacker .. ' ' .. d))
      -- the attacker exchanges d/x and the link d/l (renameat2 RENAME_EXCHANGE), over and over
      local swapper = assert(core.spawn({
        argv = { 'setpriv', '--reuid', attacker, '--regid', 'users', '--clear-groups', '--', 'perl', '-e',
          'chdir $ARGV[0] or die; my ($x, $l) = ("x", "l"); while (1) { syscall(316, -100, $x, -100, $l, 2) }', d },
        timeout_ms = 120000,
      }, function() end))
      local provider = local_provider.local_sandboxes({ tmp_mib = 16, workspace_mib = 16 })
      local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000 })
      local leaked, refused, started = 0, 0, 0
      for _ = 1, 40 do
        local okc, sb = pcall(pool.create, pool, { lifetime_ms = 60000, image = d .. '/x/secret' })
        if okc then
          started = started + 1
          local okr, flag = pcall(sb.read_file, sb, '/data/flag')
          if okr and flag == 'root only\n' then leaked = leaked + 1 end
          sb:release()
        elseif sandbox.is_error(sb, 'INVALID_CONFIG') then
          refused = refused + 1
        end
      end
      swapper:cancel()
      pool:close()
      util.rmdir(base)
      assert.are.equal(0, leaked, 'sandboxes that read the root-only directory')
      -- refused outright: a directory above the image is the attacker's
      assert.are.same({ 40, 0 }, { refused, started })
    end)
  end)
end)
