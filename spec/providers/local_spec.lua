-- mayura.sandbox.local: the conformance suite, and every isolation promise as a try to break it.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local local_provider = require('mayura.sandbox.local')
local core = require('mayura.core')
local util = require('support.util')
local compat = require('support.compat')
local uv = require('luv')


local function sh(sb, script, opts) return sb:exec({ 'sh', '-c', script }, opts) end

local provider = local_provider.local_sandboxes({ memory_mib = 256, pids = 128, tmp_mib = 16, workspace_mib = 64 })

describe('local_sandboxes', function()
  describe('failure modes', function()
    it('refuses bad options with INVALID_CONFIG', function()
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { nope = 1 })
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { memory_mib = -1 })
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { cpus = 0 })
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { image = 'relative/dir' })
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { image = '/no/such/root' })
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { bwrap = '/no/such/bwrap' })
      assert.raises_code('INVALID_CONFIG', local_provider.local_sandboxes, { workdir = '/elsewhere' })
    end)

    it('refuses ports without network all before anything is created', function()
      local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000, network = { 'none', 'all' } })
      assert.raises_code('INVALID_INPUT', pool.create, pool, { lifetime_ms = 1000, ports = { 8080 } })
      assert.are.equal(0, pool:count())
      pool:close()
    end)
  end)

  it('says what it enforces', function()
    assert.are.same({ 'none', 'all', 'allowlist' }, provider.features.network)
    assert.is_true(provider.features.stdin)
    assert.is_boolean(provider.enforced.memory)
    assert.is_true(provider.enforced.lifetime)
    -- inode caps come with the launcher's own tmpfs, as root; the OOM shield where the kernel allows it
    assert.are.equal(require('mayura.sandbox._host').uid() == 0, provider.enforced.inodes)
    assert.is_boolean(provider.enforced.oom_protected)
  end)
end)

describe('the conformance suite against the local provider', function()
  local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
  local sb = pool:create({ lifetime_ms = 600000 })
  for _, case in ipairs(testing.sandbox_conformance) do
    it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
  end
  teardown(function() pool:close() end)
end)

describe('isolation of a local sandbox', function()
  local pool, sb
  setup(function()
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 600000, network = { 'none', 'all' } })
    sb = pool:create({ lifetime_ms = 600000, env = { SANDBOX_SECRET = 'value-only-inside-7f3a' } })
  end)
  teardown(function() pool:close() end)

  it('runs as uid 1000 with no capabilities and no_new_privs', function()
    local r = sh(sb, 'id -u; id -g; grep -E "^(CapEff|CapPrm|CapBnd|NoNewPrivs):" /proc/self/status')
    assert.are.equal(0, r.exit_code)
    assert.matches('^1000\n1000\n', r.stdout)
    assert.matches('CapEff:%s+0000000000000000', r.stdout)
    assert.matches('CapBnd:%s+0000000000000000', r.stdout)
    assert.matches('NoNewPrivs:%s+1', r.stdout)
  end)

  it('cannot read the host /root, /etc/shadow, /home or /var', function()
    local r = sh(sb, 'cat /etc/shadow; ls /root; ls /home; ls /var; ls /run')
    assert.are_not.equal(0, r.exit_code)
    assert.are.equal('', r.stdout)
    assert.is_nil(sb:read_file('/etc/shadow'))
    assert.is_nil(sb:list_files('/root'))
    assert.is_nil(sb:list_files('/home'))
    local passwd = sb:read_file('/etc/passwd')
    assert.matches('sandbox:x:1000', passwd)
    assert.is_nil(passwd:find('/root:/bin/bash', 1, true))
  end)

  it('cannot write /usr, with exec or write_file', function()
    local r = sh(sb, 'touch /usr/mayura-escape 2>&1; echo x > /usr/bin/mayura-escape 2>&1')
    assert.matches('Read%-only', r.stdout)
    assert.raises_code('PERMISSION_DENIED', sb.write_file, sb, '/usr/mayura-escape', 'x')
    assert.is_nil(io.open('/usr/mayura-escape', 'r'))
  end)

  -- (as root the launcher builds the whole tree and bubblewrap binds it as one; else bubblewrap
  -- makes it: the same tree either way)
  it('gets a tree read-only but for its tmpfs, each without suid or devices, with working devices', function()
    local r = sh(sb, 'cut -d" " -f5,6 /proc/self/mountinfo')
    assert.are.equal(0, r.exit_code)
    local opts = {}
    for point, o in r.stdout:gmatch('(%S+) (%S+)\n') do opts[point] = ',' .. o .. ',' end
    for _, point in ipairs({ '/', '/usr', '/etc/ld.so.cache' }) do
      assert.is_truthy(opts[point] and opts[point]:find(',ro,', 1, true), point .. ' ' .. tostring(opts[point]))
    end
    -- /dev is a read-only mount of its own, or a directory of the read-only root
    assert.is_truthy(not opts['/dev'] or opts['/dev']:find(',ro,', 1, true), tostring(opts['/dev']))
    for _, point in ipairs({ '/workspace', '/tmp', '/dev/shm' }) do
      assert.is_truthy(opts[point] and opts[point]:find(',rw,', 1, true), point .. ' ' .. tostring(opts[point]))
      assert.is_truthy(opts[point]:find(',nodev,', 1, true), point .. ' ' .. opts[point])
    end
    for point, o in pairs(opts) do assert.is_truthy(o:find(',nosuid,', 1, true), point .. ' ' .. o) end
    -- nothing new in /, /etc or /dev, no host file changed, no mount made writable
    r = sh(sb, 'touch /etc/x /dev/x /x 2>/dev/null && echo made; echo x >> /etc/passwd 2>/dev/null && echo wrote; ' ..
      'mount -o remount,rw / 2>/dev/null && echo remounted; mount -o remount,rw /dev 2>/dev/null && echo remounted; ' ..
      'umount /etc/ld.so.cache 2>/dev/null && echo unmounted; true')
    assert.are.equal('', r.stdout)
    r = sh(sb, 'echo x > /dev/null && echo null; head -c 3 /dev/zero | od -An -tx1; ' ..
      'head -c 16 /dev/urandom | wc -c; echo x > /dev/full 2>/dev/null || echo full; ' ..
      'exec 3<>/dev/ptmx && echo ptmx; ls /dev/pts | grep -c ptmx; readlink /dev/fd /dev/stdin; ' ..
      'stat -c "%a %U" /workspace; ls -A /.mayura; test -x /.mayura/agent && echo agent')
    assert.are.equal('null\n 00 00 00\n16\nfull\nptmx\n1\n/proc/self/fd\n/proc/self/fd/0\n755 sandbox\nagent\nagent\n',
      r.stdout)
  end)

  it('cannot reach a TCP server listening on the host, by address or name', function()
    local server = uv.new_tcp()
    server:bind('127.0.0.1', 0)
    local port = server:getsockname().port
    local accepted = 0
    server:listen(8, function() accepted = accepted + 1 end)
    local r = sb:exec({ 'bash', '-c', 'echo hi > /dev/tcp/127.0.0.1/' .. port .. ' && echo connected' },
      { timeout_ms = 5000 })
    assert.is_nil(r.stdout:find('connected', 1, true))
    r = sh(sb, 'getent hosts example.com || echo no-dns')
    assert.matches('no%-dns', r.stdout)
    r = sh(sb, 'cat /proc/net/dev | tail -n +3 | cut -d: -f1')
    assert.are.equal('lo', (r.stdout:gsub('%s', '')))
    server:close()
    assert.are.equal(0, accepted)
  end)

  it('sees no host process and no host secret under /proc', function()
    local secret = 'host-secret-' .. tostring(math.random(1e9))
    local holder = core.spawn({ argv = { 'sleep', '30' }, env = { HOST_SECRET = secret } }, function() end)
    local r = sh(sb, 'ls -d /proc/[0-9]* | wc -l; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr "\\000" "\\n"')
    holder:cancel()
    local count = tonumber(r.stdout:match('^(%d+)'))
    assert.is_true(count < 10, 'the sandbox sees ' .. tostring(count) .. ' processes')
    assert.is_nil(r.stdout:find(secret, 1, true))
    assert.is_nil(r.stdout:find('busted', 1, true))
    r = sh(sb, 'cat /proc/1/cmdline | tr "\\000" " "')
    assert.matches('/.mayura/agent', r.stdout)
  end)

  it('keeps env values off every host command line and host environment listing', function()
    local r = sh(sb, 'echo $SANDBOX_SECRET')
    assert.are.equal('value-only-inside-7f3a\n', r.stdout)
    local leaks = {}
    for name in io.popen('ls /proc'):lines() do
      if name:match('^%d+$') then
        local f = io.open('/proc/' .. name .. '/cmdline', 'rb')
        local cmd = f and f:read('a') or ''
        if f then f:close() end
        if cmd:find('value-only-inside-7f3a', 1, true) then leaks[#leaks + 1] = name end
        if cmd:find('bwrap', 1, true) or cmd:find('mayura-launch', 1, true) or cmd:find('/.mayura/agent', 1, true) then
          local e = io.open('/proc/' .. name .. '/environ', 'rb')
          local env = e and e:read('a') or ''
          if e then e:close() end
          if env:find('value-only-inside-7f3a', 1, true) then leaks[#leaks + 1] = name end
        end
      end
    end
    assert.are.same({}, leaks)
  end)

  it('keeps a symlink to a host file inside the sandbox: read, write, list and remove', function()
    local canary = os.tmpname()
    local f = assert(io.open(canary, 'w'))
    f:write('host canary')
    f:close()
    sh(sb, 'ln -sf ' .. canary .. ' canary-link; ln -sfn /etc canary-dir; ln -sf /root/.bashrc bashrc-link')
    assert.is_nil(sb:read_file('canary-link'))
    assert.is_nil(sb:read_file('bashrc-link'))
    local entries = sb:list_files('canary-dir')
    for _, e in ipairs(entries or {}) do assert.are_not.equal('shadow', e.name) end
    pcall(sb.write_file, sb, 'canary-link', 'overwritten from the sandbox')
    sb:remove_file('canary-link')
    sb:remove_file('canary-dir', { recursive = true })
    local g = assert(io.open(canary, 'r'))
    assert.are.equal('host canary', g:read('a'))
    g:close()
    os.remove(canary)
    assert.is_not_nil(io.open('/etc/hostname', 'r'))
  end)

  -- A root file system directory with a static busybox and none of the sandbox's mount points
  -- (no /dev, /proc, /tmp or agent directory; a /workspace and a /dev of its own to be hidden).
  local function busybox_root()
    local bin
    for _, b in ipairs({ '/bin/busybox', '/usr/bin/busybox' }) do
      local r = require('mayura.process').run({ 'ldd', b })
      if uv.fs_stat(b) and r.exit_code ~= 0 then bin = b; break end   -- static: ldd refuses it
    end
    if not bin then return nil end
    local dir = util.image_tmpdir()
    local root = dir .. '/root'
    for _, d in ipairs({ '', '/bin', '/etc', '/workspace', '/var' }) do assert(uv.fs_mkdir(root .. d, tonumber('755', 8))) end
    assert(uv.fs_copyfile(bin, root .. '/bin/busybox'))
    assert(uv.fs_chmod(root .. '/bin/busybox', tonumber('755', 8)))
    for _, applet in ipairs({ 'sh', 'cat', 'ls', 'touch', 'readlink', 'echo', 'id' }) do
      assert(uv.fs_symlink('busybox', root .. '/bin/' .. applet))
    end
    assert(uv.fs_symlink('bin', root .. '/sbin'))
    -- a link to a host directory (holding a canary) stays a link, read in the sandbox's own root
    assert(uv.fs_mkdir(dir .. '/host', tonumber('755', 8)))
    assert(uv.fs_symlink(dir .. '/host', root .. '/escape'))
    for path, text in pairs({ ['/etc/resolv.conf'] = 'nameserver 192.0.2.53\n', ['/data.txt'] = 'from the image\n',
        ['/workspace/hidden'] = 'x', ['/dev'] = 'not a directory', ['/../host/canary'] = 'host canary' }) do
      local f = assert(io.open(root .. path, 'wb'))
      f:write(text)
      f:close()
    end
    return dir, root
  end

  it('runs an image: a root directory without its mount points, read-only, its workspace its own', function()
    if not provider.root_table then
      return pending('bubblewrap makes the tree here (not root, or no build/mayura-launch): an image needs its own ' ..
        'mount points then, as docs/security.md says')
    end
    local dir, root = busybox_root()
    if not dir then return pending('needs a static busybox (busybox-static; scripts/docker-setup.sh installs it)') end
    local img = pool:create({ lifetime_ms = 60000, image = root })
    local r = img:exec({ 'sh', '-c', 'cat /data.txt /etc/resolv.conf; readlink /sbin; ls -A /workspace; ' ..
      'ls /dev | grep -c "^null$"; touch /data.txt /bin/x /etc/x 2>/dev/null || echo read-only; id -u; ' ..
      'cat /escape/canary 2>/dev/null || echo no-canary' })
    assert.are.equal('from the image\nnameserver 192.0.2.53\nbin\n1\nread-only\n1000\nno-canary\n', r.stdout, r.stderr)
    img:write_file('/workspace/a.txt', 'mine')
    assert.are.equal('mine', img:read_file('/workspace/a.txt'))
    img:release()
    -- with 'all' the stack's resolver stands in for the image's, whose file stays as it was
    if provider.features.network[2] == 'all' then
      img = pool:create({ lifetime_ms = 60000, image = root, network = 'all' })
      r = img:exec({ 'cat', '/etc/resolv.conf' })
      assert.are.equal(0, r.exit_code)
      assert.is_nil(r.stdout:find('192.0.2.53', 1, true))
      assert.matches('^nameserver ', r.stdout)
      img:release()
    end
    local f = assert(io.open(root .. '/etc/resolv.conf', 'rb'))
    assert.are.equal('nameserver 192.0.2.53\n', f:read('a'))
    f:close()
    assert.is_nil(uv.fs_stat(root .. '/.mayura'))
    util.rmdir(dir)
  end)

  it('fills /tmp and the workspace only up to their caps, and goes on working', function()
    local r = sh(sb, 'head -c 64m /dev/zero > /tmp/fill; echo rc=$?; df -k /tmp | tail -1')
    assert.matches('rc=1', r.stdout)
    assert.matches('No space left', r.stderr)
    local err = assert.raises_code('LIMIT_EXCEEDED', sb.write_file, sb, '/tmp/more', string.rep('x', 1048576))
    assert.matches('space', err.message)
    -- (`true`, not `:`: a failed redirection of a special builtin ends the shell)
    r = sh(sb, 'i=0; while [ $i -lt 100000 ]; do true > /tmp/f$i || break; i=$((i+1)); done; echo files=$i')
    assert.matches('files=%d+', r.stdout)
    if provider.enforced.inodes then
      -- /tmp's inodes are capped too (one per 4 KiB of its size)
      assert.is_true(tonumber(r.stdout:match('files=(%d+)')) < 100000, r.stdout)
      assert.matches('No space left', r.stderr)
    end
    sh(sb, 'rm -rf /tmp/*')
    assert.are.equal('still here\n', sb:exec({ 'echo', 'still here' }).stdout)
    r = sh(sb, 'head -c 100m /dev/zero > /workspace/fill; echo rc=$?; rm -f /workspace/fill')
    assert.matches('rc=1', r.stdout)
  end)

  it('keeps the host and a sibling sandbox apart', function()
    local other = pool:create({ lifetime_ms = 60000 })
    sb:write_file('mine.txt', 'private')
    assert.is_nil(other:read_file('mine.txt'))
    local r = sh(other, 'ls /proc | grep -c "^[0-9]"')
    assert.is_true(tonumber(r.stdout) < 10)
    other:release()
  end)

  it('serves a port on a 127.0.0.1 port of its own with network all', function()
    local net = pool:create({ lifetime_ms = 60000, network = 'all', ports = { 18081 } })
    assert.matches('^http://127%.0%.0%.1:%d+$', net:url(18081))
    assert.raises_code('INVALID_INPUT', net.url, net, 18082)
    net:release()
  end)
end)

describe('limits of a local sandbox (cgroups, as root)', function()
  if not provider.enforced.memory then
    it('cannot run here: cgroup limits need root; the docs say the host limits apply', function()
      assert.is_false(provider.enforced.pids)
    end)
    return
  end
  local pool, sb
  setup(function()
    pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })
    sb = pool:create({ lifetime_ms = 600000, memory_mib = 64 })
  end)
  teardown(function() pool:close() end)

  it('stops a fork bomb at pids, and the next command still runs', function()
    local r = sh(sb, 'i=0; while [ $i -lt 400 ]; do sleep 30 & i=$((i+1)); echo $i > /tmp/forked; done',
      { timeout_ms = 15000 })
    assert.are_not.equal(0, r.exit_code)
    assert.matches('fork', r.stderr:lower())
    local n = tonumber(sb:read_file('/tmp/forked'))
    assert.is_true(n ~= nil and n >= 50 and n < 128, 'processes forked: ' .. tostring(n))
    assert.are.equal('after\n', sh(sb, 'echo after').stdout)
  end)

  it('kills a command past memory_mib, reports it as out of memory, and goes on working', function()
    local r = sb:exec({ 'awk', 'BEGIN { s = "x"; while (1) s = s s }' })
    assert.are.equal(9, r.signal)
    assert.is_true(r.oom_killed)
    assert.is_nil(r.exit_code)
    assert.are.equal('ok\n', sh(sb, 'echo ok').stdout)
  end)
end)

describe('a host killed with SIGKILL', function()
  it('leaves no process, mount, cgroup or directory behind after the lifetime', function()
    local script = os.tmpname()
    local f = assert(io.open(script, 'w'))
    f:write([[
local sandbox = require('mayura.sandbox')
local provider = require('mayura.sandbox.local').local_sandboxes()
local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000 })
local sb = pool:create({ lifetime_ms = 3000 })
sb:exec({ 'sh', '-c', 'setsid sleep 4801 >/dev/null 2>&1 </dev/null &' })
print(sb.id)
io.stdout:flush()
require('mayura').sleep(60000)
]])
    f:close()
    local id
    local host = core.spawn({ argv = { compat.host, script } }, function(res) id = res.stdout end)
    assert.is_true(util.eventually(function() return #util.procs_matching('sleep 4801') == 1 end, 10000))
    os.execute('kill -9 ' .. host:pid())
    util.wait(function(done)
      local t = uv.new_timer()
      t:start(200, 0, function() t:close(); done() end)
    end)
    assert.is_true(util.eventually(function() return #util.procs_matching('sleep 4801') == 0 end, 6000),
      'the sandbox outlived its host and its lifetime')
    assert.is_true(util.eventually(function()
      return #util.procs_matching('/.mayura/agent --fd 3 --lifetime-ms 3000 ') == 0
    end, 6000))
    local mounts = io.open('/proc/self/mountinfo'):read('a')
    assert.is_nil(mounts:find('/.mayura', 1, true))
    assert.is_true(util.eventually(function() return id ~= nil end, 3000))
    id = id:match('local%-%x+')
    assert.is_not_nil(id)
    for _, ctrl in ipairs({ 'memory', 'pids', 'cpu' }) do
      local dir = '/sys/fs/cgroup/' .. ctrl .. '/mayura/' .. id
      assert.is_true(util.eventually(function() return io.open(dir .. '/cgroup.procs') == nil end, 3000),
        'cgroup ' .. dir .. ' was left behind')
    end
    os.remove(script)
  end)
end)
