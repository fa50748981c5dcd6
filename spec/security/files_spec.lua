-- Symlink, directory-swap and path tricks against read_file, write_file, list_files and remove_file,
-- on every provider here. The file calls are made by the agent inside the sandbox, so every name
-- resolves in the sandbox's own view: host canaries (a file the sandbox names by its host path, and
-- every host file that is bind-mounted into the sandbox) must stay intact, whatever the sandbox does
-- to its names while the host works on them.
local providers = require('support.providers')
local common = require('security.common')
local util = require('support.util')

local sh = common.sh

local function read_host(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('a')
  f:close()
  return s
end

-- Every host file or directory a sandbox can see (bind mounts), with its bytes or listing now;
-- `check()` returns the ones that changed.
local function bound_canaries(prov, sb, provider)
  local list = {}
  local function add(path, kind)
    if kind == 'dir' then
      list[#list + 1] = { path = path, kind = 'dir', was = providers.host("ls -1a '" .. path .. "'") }
    else
      list[#list + 1] = { path = path, kind = 'file', was = read_host(path) }
    end
  end
  -- (a Kubernetes sandbox's agent is a copy in its own tmpfs: no host file of it is bound)
  if provider.agent then add(provider.agent) end
  if prov.kind == 'local' then
    -- its /etc files are copies; these parts of the host's /etc are bound read-only
    for _, name in ipairs({ 'ld.so.cache', 'localtime' }) do
      if read_host('/etc/' .. name) then add('/etc/' .. name) end
    end
    for _, name in ipairs({ 'alternatives', 'ssl/certs', 'ca-certificates' }) do
      if select(2, providers.host("test -d '/etc/" .. name .. "'")) then add('/etc/' .. name, 'dir') end
    end
  elseif prov.kind == 'docker' then
    add(sb._backend.dir, 'dir')
    local info = providers.host("docker inspect --format '{{.ResolvConfPath}} {{.HostsPath}} {{.HostnamePath}}' " ..
      sb._backend.container)
    for path in info:gmatch('%S+') do add(path) end
  end
  return function()
    local changed = {}
    for _, c in ipairs(list) do
      local now = c.kind == 'dir' and providers.host("ls -1a '" .. c.path .. "'") or read_host(c.path)
      if now ~= c.was then changed[#changed + 1] = c.path end
    end
    return changed
  end
end

for _, prov in ipairs(providers.list()) do
  describe('file calls against symlink and path tricks (' .. prov.name .. ')', function()
    local pool, provider, sb, dir, canary, bound
    setup(function()
      pool, provider = prov.make_pool({ max_sandboxes = 2 })
      sb = pool:create({ lifetime_ms = 300000 })
      common.install(sb)
      dir = util.tmpdir()
      canary = common.canary(dir, 'canary.txt')
      bound = bound_canaries(prov, sb, provider)
    end)
    teardown(function()
      if sb then sb:release() end
      pool:close()
      if dir then util.rmdir(dir) end
    end)

    local function intact()
      assert.is_true(canary.check(), 'the host canary changed')
      assert.are.same({ 'canary.txt' }, (function()
        local names = {}
        for n in providers.host("ls -1A '" .. dir .. "'"):gmatch('[^\n]+') do names[#names + 1] = n end
        return names
      end)(), 'a file appeared in the host directory')
      assert.are.same({}, bound(), 'a host file bound into the sandbox changed')
    end

    it('resolves a final-component symlink to a host path inside the sandbox', function()
      sh(sb, 'ln -sf ' .. canary.path .. ' link; ln -sfn ' .. dir .. ' dlink; ln -sf /.mayura/agent alink')
      assert.is_nil(sb:read_file('link'))
      assert.is_nil(sb:list_files('dlink'))
      pcall(sb.write_file, sb, 'link', 'written through a link')
      pcall(sb.write_file, sb, 'alink', 'written through a link')
      pcall(sb.write_file, sb, 'dlink/canary.txt', 'written through a directory link')
      pcall(sb.remove_file, sb, 'dlink', { recursive = true })
      pcall(sb.remove_file, sb, 'dlink/canary.txt')
      intact()
    end)

    it('refuses to write or remove the host files bound into the sandbox, by name or through a link', function()
      local targets = { '/.mayura/agent', '/etc/passwd', '/etc/hosts', '/etc/resolv.conf' }
      -- the Kubernetes stand-in's pods have no /etc/hosts or resolv.conf (a kubelet's are the pod's own)
      if prov.kind == 'kubernetes' then targets = { '/.mayura/agent', '/etc/passwd' } end
      -- the agent's socket is gone once the host connected, and its directory closed to the sandbox
      if prov.kind == 'docker' then assert.raises_code('PERMISSION_DENIED', sb.list_files, sb, '/.mayura/run') end
      for _, t in ipairs(targets) do
        local ok = pcall(sb.write_file, sb, t, 'replaced from the sandbox')
        assert.is_false(ok, t .. ' was written')
        ok = pcall(sb.remove_file, sb, t)
        assert.is_false(ok, t .. ' was removed')
      end
      -- an intermediate directory link to the place of the bound files
      sh(sb, 'ln -sfn /.mayura mlink; ln -sfn /etc elink')
      assert.is_false((pcall(sb.write_file, sb, 'mlink/agent', 'x')))
      assert.is_false((pcall(sb.write_file, sb, 'elink/passwd', 'x')))
      sb:remove_file('mlink')
      assert.is_not_nil(sb:list_files('/.mayura'))
      if prov.kind == 'docker' then
        assert.is_false((pcall(sb.remove_file, sb, '/.mayura/run', { recursive = true })))
        assert.is_false((pcall(sb.write_file, sb, '/.mayura/run/planted', 'x')))
      end
      -- a recursive remove of a link removes the link, never what it points to
      sh(sb, 'mkdir -p keep && echo kept > keep/file && ln -sfn /workspace/keep klink && ln -sfn /.mayura rlink')
      sb:remove_file('klink', { recursive = true })
      sb:remove_file('rlink', { recursive = true })
      assert.are.equal('kept\n', sb:read_file('keep/file'))
      assert.is_nil(sb:read_file('klink'))
      -- hard links across to a bound file are refused by the kernel
      local r = sh(sb, 'ln /.mayura/agent hl 2>/dev/null && echo linked; ln /etc/passwd /tmp/hl 2>/dev/null && echo linked; true')
      assert.are.equal('', r.stdout)
      intact()
      assert.are.equal('alive\n', sb:exec({ 'echo', 'alive' }).stdout)
    end)

    it('keeps .. and absolute paths inside the sandbox, and refuses bad names', function()
      local escape = '/tmp/mayura-escape-' .. tostring(math.random(1e9))
      assert.is_nil(sb:read_file('../../../../../etc/shadow'))
      sb:write_file('../../../../..' .. escape, 'stays inside')
      assert.is_nil(io.open(escape, 'r'), 'a write with .. reached the host')
      assert.are.equal('stays inside', sb:read_file(escape))
      sb:write_file('a/../../../../..' .. escape .. '-2', 'stays inside')
      assert.is_nil(io.open(escape .. '-2', 'r'))
      local root, up = sb:list_files('/'), sb:list_files('../../../..')
      assert.are.same(root, up)
      assert.raises_code('INVALID_INPUT', sb.remove_file, sb, '../../../..', { recursive = true })
      assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'a\0b')
      assert.raises_code('INVALID_INPUT', sb.write_file, sb, string.rep('d/', 2100) .. 'f', 'x')
      local err = select(2, pcall(sb.write_file, sb, string.rep('n', 300), 'x'))
      assert.are.equal('INVALID_INPUT', err.code, tostring(err))
      -- a not-yet-existing path under a link to a host directory is made inside the sandbox
      sh(sb, 'ln -sfn ' .. dir .. ' hostdir')
      pcall(sb.write_file, sb, 'hostdir/sub/new.txt', 'inside')
      intact()
    end)

    it('does not hang or stream for ever on a FIFO, a device or a huge sparse file', function()
      sh(sb, 'mkfifo fifo; ln -sf /dev/zero zero; ln -sf /dev/urandom random; ' ..
        'dd if=/dev/zero of=sparse bs=1 count=0 seek=8G 2>/dev/null || truncate -s 8G sparse')
      local t = common.now()
      assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'fifo')
      assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'zero')
      assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'random')
      assert.raises_code('INVALID_INPUT', sb.read_file, sb, '/dev/zero')
      assert.raises_code('LIMIT_EXCEEDED', sb.read_file, sb, 'sparse')
      assert.is_true(common.now() - t < 3000)
      local kinds = {}
      for _, e in ipairs(sb:list_files('.')) do kinds[e.name] = e.type end
      assert.are.equal('other', kinds.fifo)
      assert.are.equal('symlink', kinds.zero)
      sb:write_file('fifo', 'replaces the fifo, never blocks on it')
      assert.are.equal('replaces the fifo, never blocks on it', sb:read_file('fifo'))
    end)

    it('holds while the sandbox swaps a directory and a symlink under the host\'s calls', function()
      -- a/ is a real directory, b a link to where the bound host files are; the sandbox swaps them
      sh(sb, 'mkdir -p swap/a && ln -sfn /.mayura swap/b && ln -sfn /etc swap/c')
      local swapper = common.spawn(function()
        return sh(sb, common.ABUSE .. ' swap swap/a swap/b 2500 & ' .. common.ABUSE .. ' swap swap/a swap/c 2500; wait',
          { timeout_ms = 10000 })
      end)
      local calls = 0
      local deadline = common.now() + 2000
      while common.now() < deadline do
        pcall(sb.write_file, sb, 'swap/a/agent', 'swapped in')
        pcall(sb.write_file, sb, 'swap/a/passwd', 'swapped in')
        pcall(sb.write_file, sb, 'swap/a/run/agent.sock', 'swapped in')
        pcall(sb.read_file, sb, 'swap/a/agent', { max_bytes = 16 })
        pcall(sb.list_files, sb, 'swap/a')
        pcall(sb.remove_file, sb, 'swap/a/agent')
        pcall(sb.remove_file, sb, 'swap/a/run', { recursive = true })
        pcall(sb.remove_file, sb, 'swap/a/hosts')
        calls = calls + 8
      end
      local r = swapper:wait()
      assert.matches('swaps=%d+', r.stdout)
      assert.is_true(calls > 80, 'only ' .. calls .. ' calls during the swaps')
      intact()
      assert.are.equal('alive\n', sb:exec({ 'echo', 'alive' }).stdout)
    end)
  end)
end
