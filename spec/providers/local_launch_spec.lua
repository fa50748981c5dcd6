-- The local provider's cold-create pieces: mayura-launch (launcher/launch.c, the keeper of one
-- sandbox), the host-linked agent of sandboxes without an image, and core.spawn's `outlive`.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local core = require('mayura.core')
local task = require('mayura._task')
local uv = require('luv')
local util = require('support.util')

local LAUNCH = 'build/mayura-launch'
local AGENT_HOST = 'build/mayura-agent-host'
local root = require('mayura.sandbox._host').uid() == 0

-- Runs mayura-launch over `argv` (in place of bubblewrap's) with `env`, the agent's bytes `bytes`
-- on its standard input; `hold(control)` may keep the host's end of the control socket (closed
-- once the launcher has ended otherwise); `table_fd`, a mount table's descriptor, goes on 5 (as
-- MAYURA_MOUNT says, unless `env` names another). Returns the result and how long it took.
local function launch(env, argv, bytes, hold, table_fd)
  local a, b = core.socketpair()
  local c, d = core.socketpair()
  local full = { LAUNCH }
  for _, x in ipairs(argv) do full[#full + 1] = x end
  env.MAYURA_LIFE = env.MAYURA_LIFE or '60.000'
  if table_fd then env.MAYURA_MOUNT = env.MAYURA_MOUNT or '5' end
  local t0 = core.hrtime_ms()
  local res = task.await(function(done)
    assert(core.spawn({ argv = full, env = env, fds = { b, d, table_fd }, stdin = bytes, outlive = true }, done))
    core.close_fd(b)
    core.close_fd(d)
    if table_fd then core.close_fd(table_fd) end
    if hold then hold(c) end
  end)
  core.close_fd(a)
  pcall(core.close_fd, c)
  return res, core.hrtime_ms() - t0
end

describe('mayura-launch', function()
  it('hands bubblewrap the agent on 0 and the /etc texts on 5..9, each with its newline', function()
    local res = launch({ PATH = '/usr/bin:/bin', MAYURA_ETC_FDS = '1', MAYURA_ETC_1 = 'one',
      MAYURA_ETC_2 = 'two\nlines', MAYURA_ETC_3 = '', MAYURA_ETC_4 = '$HOME \\n', MAYURA_ETC_5 = 'five' },
      { '/bin/sh', '-c', 'cat; echo "|"; for f in 5 6 7 8 9; do cat <&$f; done; ' ..
        'for f in 0 3 4 5 9 10 11 12 20 251; do [ -e /proc/$$/fd/$f ] && printf "$f "; done; true' },
      'AGENT')
    assert.are.equal(0, res.exit_code)
    -- and nothing else: the control socket (4) stays the keeper's
    assert.are.equal('AGENT|\none\ntwo\nlines\n\n$HOME \\n\nfive\n0 3 5 9 ', res.stdout)
  end)

  it('does not run the sandbox when it cannot join a cgroup', function()
    local res = launch({ MAYURA_CG = '/nonexistent/cgroup' }, { '/bin/sh', '-c', 'echo ran' }, '')
    assert.are.equal(125, res.exit_code)
    assert.are.equal('', res.stdout)
  end)

  -- cgroup v1 as on this kind of machine, or v2: one directory each way, with a setting of each kind
  local function cgroup_case()
    local id = 'mayura-spec-' .. require('mayura.sandbox._host').random_hex(4)
    if uv.fs_stat('/sys/fs/cgroup/cgroup.controllers') then
      local d = '/sys/fs/cgroup/mayura/' .. id
      return { d }, d .. '/pids.max 37\n?' .. d .. '/no.such.knob 1', d .. '/pids.max'
    end
    local d = '/sys/fs/cgroup/pids/mayura/' .. id
    return { d }, d .. '/pids.max 37\n?' .. d .. '/no.such.knob 1', d .. '/pids.max'
  end

  it('makes its cgroups, sets them before the sandbox joins, and removes them at the end', function()
    if not root then return pending('needs root: cgroups are made only as root') end
    local dirs, set, knob = cgroup_case()
    local res = launch({ MAYURA_CG = dirs[1], MAYURA_CG_SET = set },
      { '/bin/sh', '-c', 'cat ' .. knob .. '; grep -c "' .. dirs[1]:match('[^/]+$') .. '" /proc/self/cgroup' }, '')
    assert.are.equal(0, res.exit_code, res.stderr)
    assert.are.equal('37\n1\n', res.stdout)
    assert.is_nil(uv.fs_stat(dirs[1]))
  end)

  it('refuses a setting outside its cgroups, or a cgroup that is already there, and leaves nothing', function()
    if not root then return pending('needs root: cgroups are made only as root') end
    local dirs = cgroup_case()
    for _, set in ipairs({ '/tmp/mayura-not-a-cgroup 1', dirs[1] .. '/../pids.max 1', dirs[1] .. '/.x 1',
        dirs[1] .. '/pids.max', dirs[1] .. '/pids.max not-a-number' }) do
      local res = launch({ MAYURA_CG = dirs[1], MAYURA_CG_SET = set }, { '/bin/sh', '-c', 'echo ran' }, '')
      assert.are.equal(125, res.exit_code, set)
      assert.are.equal('', res.stdout)
      assert.is_nil(uv.fs_stat(dirs[1]), set)
    end
    assert.is_nil(uv.fs_stat('/tmp/mayura-not-a-cgroup'))
    -- one that someone else made is not ours: refused, and left as it was
    assert(uv.fs_mkdir(dirs[1], tonumber('755', 8)))
    local res = launch({ MAYURA_CG = dirs[1], MAYURA_CG_SET = dirs[1] .. '/pids.max 5' },
      { '/bin/sh', '-c', 'echo ran' }, '')
    assert.are.equal(125, res.exit_code)
    assert.truthy(uv.fs_stat(dirs[1]))
    assert(uv.fs_rmdir(dirs[1]))
  end)

  it('takes the sandbox uid without groups or capabilities before it becomes bubblewrap', function()
    if not root then return pending('needs root: the provider takes a host uid only as root') end
    local res = launch({ MAYURA_UID = '1299999' },
      { '/bin/sh', '-c', 'id -u; id -g; id -G; grep -E "^(CapPrm|CapEff):" /proc/self/status' }, '')
    assert.are.equal(0, res.exit_code)
    assert.are.equal('1299999\n1299999\n1299999\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n', res.stdout)
  end)

  -- a mount table of the steps that build a sandbox's root, in a directory of the spec's own: its
  -- descriptor, as the provider hands it over (a sealed file in memory)
  local function table_case(lines)
    local dir = '/tmp/mayura-spec-root-' .. require('mayura.sandbox._host').random_hex(4)
    assert(uv.fs_mkdir(dir, tonumber('700', 8)))
    -- R alone as a word (an image's random directory name may hold the letter too)
    return dir, assert(core.sealed_fd((table.concat(lines, '\n'):gsub('%f[%w]R%f[%W]', dir)) .. '\n'))
  end

  local function clean(dir)
    assert(uv.fs_rmdir(dir))   -- empty: what was mounted and made there went with the namespace
  end

  it('builds a root from its table: files, the agent, links, device nodes, read-only binds', function()
    if not root then return pending('needs root: the launcher mounts only as root') end
    local dir, path = table_case({
      'mayura R tmpfs size=65536,nr_inodes=64,mode=0755,nosuid,nodev,X-mayura.own 0 0',
      'dir R/etc', 'file R/etc/passwd 1', 'file R/etc/empty 2', 'agent R/agent', 'link usr/bin R/bin',
      'file R/etc/over 1', 'over /etc/hostname R/etc/over',
      'bind /usr R/usr', 'bind /etc/hostname R/hostname',
      'mayura R/dev tmpfs size=65536,nr_inodes=64,mode=0755,nosuid,X-mount.mkdir 0 0', 'node null R/dev/null',
      'ro R/dev nosuid',
      'mayura R/w tmpfs size=65536,nr_inodes=64,mode=0755,nosuid,nodev,X-mount.mkdir,X-mayura.own 0 0',
      'ro R nosuid,nodev',
    })
    local res = launch({ MAYURA_UID = '1299998', MAYURA_ETC_1 = 'one\ntwo' },
      { '/bin/sh', '-c', 'cd ' .. dir .. ' && cat etc/passwd etc/empty agent && echo && ' ..
        'cmp etc/over /etc/hostname && ' ..
        'stat -c "%n %a %u" . etc etc/passwd agent w && readlink bin && test -c dev/null && echo > dev/null && ' ..
        'test -x usr/bin/env && touch x w/y usr/z dev/x 2>&1 | grep -c "Read-only"; ' ..
        'grep " ' .. dir .. '[/ ]" /proc/self/mountinfo | cut -d" " -f5,6; umask' },
      'AGENT', nil, path)
    assert.are.equal(0, res.exit_code, res.stderr)
    assert.are.equal(table.concat({
      'one', 'two', '', 'AGENT',
      '. 755 1299998', 'etc 755 1299998', 'etc/passwd 644 1299998', 'agent 555 1299998', 'w 755 1299998',
      'usr/bin', '3',
      dir .. ' ro,nosuid,nodev,relatime', dir .. '/etc/over ro,nosuid,nodev,relatime',
      dir .. '/usr ro,nosuid,nodev,relatime', dir .. '/hostname ro,nosuid,nodev,relatime',
      dir .. '/dev ro,nosuid,relatime', dir .. '/w rw,nosuid,nodev,relatime',
      '0022', '' }, '\n'),
      res.stdout)
    clean(dir)
  end)

  it('refuses a mount table with a bad step, and runs nothing', function()
    if not root then return pending('needs root: the launcher mounts only as root') end
    local head = 'mayura R tmpfs size=65536,nr_inodes=64,mode=0755 0 0'
    -- a table past 32 KiB, each of its steps good on its own (as the shorter table shows)
    local big = ('\nro R'):rep(1000)
    local dir, path = table_case({ head, ('ro R'):rep(500, '\n') })
    local res = launch({ MAYURA_UID = '1299998' }, { '/bin/sh', '-c', 'echo ran' }, 'AGENT', nil, path)
    assert.are.same({ 0, 'ran\n' }, { res.exit_code, res.stdout })
    clean(dir)
    for _, bad in ipairs({
      'node sda R/sda', 'node ../etc/passwd R/p', 'node loop0 R/l',          -- not a character device of /dev
      'file R/x 1\nfile R/x 1', 'link /etc/passwd R/l\nfile R/l 1',         -- never over what is there
      'dir R/d\ndir R/d', 'ro R bogus', 'ro R nosuid,ro,exec', 'mkdir R/x', 'dir', 'file R/x',
      'bind /no/such/path R/x', 'mayura R/t tmpfs', big,
      'link /etc/hostname R/l\nover /etc/hostname R/l', 'dir R/d\nover /etc/hostname R/d', 'over /etc/hostname R/x',
      -- a link as the source is never followed (an image's entry swapped for one while the sandbox
      -- starts would name a host path of root's choosing), nor is anything but a directory or a file
      'link /root R/to-root\nbind R/to-root R/x', 'bind /dev/null R/n',
    }) do
      dir, path = table_case({ head, bad })
      res = launch({ MAYURA_UID = '1299998' }, { '/bin/sh', '-c', 'echo ran' }, 'AGENT', nil, path)
      assert.are.equal(125, res.exit_code, bad:sub(1, 60))
      assert.are.equal('', res.stdout)
      clean(dir)
    end
  end)

  it('takes its mount table only from a sealed descriptor of its own, and runs nothing otherwise', function()
    if not root then return pending('needs root: the launcher mounts only as root') end
    local dir, fd = table_case({ 'mayura R tmpfs size=65536,nr_inodes=64,mode=0755 0 0' })
    local path = dir .. '.table'
    local f = assert(io.open(path, 'wb'))
    f:write((('mayura R tmpfs size=65536,nr_inodes=64,mode=0755 0 0\n'):gsub('%f[%w]R%f[%W]', dir)))
    f:close()
    local a, b = core.socketpair()
    -- a file's path (anyone who can write it, or its directory, could change it before the
    -- read), a descriptor that is not a sealed file (a socket), one out of range, none at all
    for _, case in ipairs({ { path }, { '5', b }, { '3' }, { '5' }, { '55', fd } }) do
      local res = launch({ MAYURA_UID = '1299998', MAYURA_MOUNT = case[1] }, { '/bin/sh', '-c', 'echo ran' },
        'AGENT', nil, case[2])
      assert.are.same({ 125, '' }, { res.exit_code, res.stdout }, case[1])
    end
    core.close_fd(a)
    os.remove(path)
    clean(dir)
  end)

  -- An image in a directory only root may write, as the provider asks: a directory, a file, a link
  -- to the host's /etc and a directory holding a link to /root.
  local function image_case()
    local base = util.image_tmpdir()
    local img = base .. '/img'
    for _, d in ipairs({ img, img .. '/etc', img .. '/sub' }) do assert(uv.fs_mkdir(d, tonumber('755', 8))) end
    for name, text in pairs({ ['/etc/hostname'] = 'image host\n', ['/data'] = 'image data\n' }) do
      local f = assert(io.open(img .. name, 'wb'))
      f:write(text)
      f:close()
    end
    assert(uv.fs_symlink('/etc', img .. '/lnk'))
    assert(uv.fs_symlink('/root', img .. '/sub/up'))
    assert(uv.fs_symlink(img, base .. '/alias'))
    assert(uv.fs_symlink(base, base .. '/up'))
    return base, img
  end

  it('binds an image\'s entries from beneath its directory, never through a link at any name', function()
    if not root then return pending('needs root: the launcher mounts only as root') end
    local base, img = image_case()
    local head = 'mayura R tmpfs size=65536,nr_inodes=64,mode=0755 0 0'
    -- openat2, and the walk one name at a time that stands in for it where the kernel lacks it
    for _, walk in ipairs({ '', '1' }) do
      local dir, fd = table_case({ head, 'image ' .. img, 'bind etc R/etc', 'bind data R/data', 'bind sub R/sub',
        'file R/r 1', 'over R/r R/etc/hostname', 'ro R' })
      local res = launch({ MAYURA_UID = '1299998', MAYURA_WALK = walk, MAYURA_ETC_1 = 'over it' },
        { '/bin/sh', '-c', 'cat ' .. dir .. '/etc/hostname ' .. dir .. '/data; readlink ' .. dir .. '/sub/up' },
        'AGENT', nil, fd)
      assert.are.equal(0, res.exit_code, res.stderr)
      assert.are.equal('over it\nimage data\n/root\n', res.stdout)
      clean(dir)
      for _, bad in ipairs({
        'image ' .. img .. '\nbind lnk R/x',                 -- an entry that is a link
        'image ' .. img .. '\nbind lnk/passwd R/x',          -- a link on the way
        'image ' .. img .. '\nbind sub/up R/x',
        'image ' .. img .. '\nbind sub/up/.bashrc R/x',
        'image ' .. img .. '\nbind ../img/data R/x',         -- out of the image, or back in
        'image ' .. img .. '\nbind ./data R/x', 'image ' .. img .. '\nbind etc//hostname R/x',
        'bind data R/x',                                      -- no image to find it in
        'image ' .. img .. '\nimage ' .. img,                 -- one image a table
        'image /', 'image ' .. base .. '/alias', 'image ' .. base .. '/up/img', 'image ' .. img .. '/../img',
        'image ' .. img .. '/data',                           -- not a directory
        'image ' .. assert(uv.fs_realpath('build')),          -- mayura's own tree
        'link /etc R/e\nover /etc/hostname R/e/hostname',     -- an `over` path through a link
      }) do
        dir, fd = table_case({ head, bad })
        res = launch({ MAYURA_UID = '1299998', MAYURA_WALK = walk }, { '/bin/sh', '-c', 'echo ran' }, 'AGENT', nil, fd)
        assert.are.same({ 125, '' }, { res.exit_code, res.stdout }, bad)
        clean(dir)
      end
    end
    util.rmdir(base)
  end)

  it('refuses an image whose directory, or one above it, anyone but root may write', function()
    if not root then return pending('needs root: the launcher mounts only as root') end
    local base, img = image_case()
    local tmp = util.tmpdir()   -- under /tmp, which everyone may write
    local head = 'mayura R tmpfs size=65536,nr_inodes=64,mode=0755 0 0'
    for _, case in ipairs({
      { tmp }, { img, 'chown 65534 ' .. img }, { img, 'chmod 775 ' .. img }, { img, 'chmod 757 ' .. base },
      { img, 'chown 0:65534 ' .. base .. ' && chmod 775 ' .. base },
    }) do
      if case[2] then assert(os.execute(case[2])) end
      local dir, fd = table_case({ head, 'image ' .. case[1], 'bind etc R/etc' })
      local res = launch({ MAYURA_UID = '1299998' }, { '/bin/sh', '-c', 'echo ran' }, 'AGENT', nil, fd)
      assert.are.same({ 125, '' }, { res.exit_code, res.stdout }, case[2] or case[1])
      clean(dir)
      assert(os.execute('chown 0:0 ' .. base .. ' ' .. img .. ' && chmod 755 ' .. base .. ' ' .. img))
    end
    util.rmdir(tmp)
    util.rmdir(base)
  end)

  it('ends the sandbox at its lifetime and when the host closes its control socket', function()
    -- the shell stands for bubblewrap (the first process): killed, it never says "late"
    local res = launch({ MAYURA_LIFE = '0.300' }, { '/bin/sh', '-c', 'sleep 30; echo late' }, '', function() end)
    assert.are.same({ 137, '' }, { res.exit_code, res.stdout })
    res = launch({}, { '/bin/sh', '-c', 'sleep 30; echo late' }, '', function(c)
      task.spawn(function() task.sleep(100); core.close_fd(c) end)
    end)
    assert.are.same({ 137, '' }, { res.exit_code, res.stdout })
  end)
end)

describe('mayura-launch with the file systems bubblewrap binds', function()
  -- the tree bubblewrap makes (an image no table can name): the launcher mounts only the capped
  -- file systems, from the short table
  it('mounts them from the table on its descriptor (5, or 6 after the info one)', function()
    if not root then return pending('needs root: the launcher mounts only as root') end
    local provider = local_provider.local_sandboxes({ tmp_mib = 11, workspace_mib = 16 })
    if not provider.staged then return pending('the launcher cannot mount here') end
    provider.root_table = nil   -- as for an image a table cannot hold
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 60000,
      network = { 'none', 'all' } })
    local nets = { 'none' }
    if provider.features.network[2] == 'all' then nets[2] = 'all' end
    for _, net in ipairs(nets) do
      local sb = pool:create({ lifetime_ms = 60000, network = net })
      local r = sb:exec({ 'sh', '-c', 'df -k /tmp | tail -1; ls /proc/self/fd | tr "\\n" " "' })
      assert.are.equal(0, r.exit_code, r.stderr)
      assert.matches('^%S+%s+11264 ', r.stdout)   -- the cap from the table (11 MiB)
      assert.are.equal('0 1 2 3 ', r.stdout:match('\n(.*)$'))
      sb:release()
    end
    pool:close()
  end)
end)

describe('the local provider without mayura-launch', function()
  it('is refused with INVALID_CONFIG, and starts nothing', function()
    -- an agent found where no launcher was built beside it
    local dir = util.tmpdir()
    local agent = dir .. '/mayura-agent'
    assert(uv.fs_copyfile('build/mayura-agent', agent))
    local host = os.getenv('MAYURA_BUILD') or 'build'
    local code = "local ok, e = pcall(require('mayura.sandbox.local').local_sandboxes); " ..
      "io.write(tostring(ok), ' ', tostring(e))"
    local res = require('mayura.process').run({ host .. '/mayura', '-e', code },
      { env = { MAYURA_AGENT = agent, PATH = os.getenv('PATH') }, timeout_ms = 20000 })
    util.rmdir(dir)
    assert.are.equal(0, res.exit_code, res.stderr)
    assert.matches('^false INVALID_CONFIG: the sandbox launcher %(mayura%-launch%) is not built', res.stdout)
  end)
end)

describe('a local sandbox without an image', function()
  it('runs the agent linked against the host\'s libraries, and its launcher outlives nothing of the host', function()
    local want = uv.fs_stat(AGENT_HOST)
    if not want then return pending(AGENT_HOST .. ' is not built') end
    local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal(tostring(want.size) .. '\n', sb:exec({ 'sh', '-c', 'wc -c < /.mayura/agent' }).stdout)
    -- the launcher carries no tag of the host's process tree (core.spawn's outlive)
    local env = io.open('/proc/' .. sb._backend.proc:pid() .. '/environ', 'rb')
    local text = env and env:read('a') or ''
    if env then env:close() end
    assert.is_nil(text:find('MAYURA_TREE=', 1, true))
    assert.is_truthy(text:find('MAYURA_LIFE=', 1, true))
    pool:close()
  end)
end)

describe('core.spawn with outlive', function()
  -- a host that starts a process and closes its state at once: the process goes with it, unless
  -- it was started with `outlive` (as a local sandbox's launcher is)
  local function survivor(outlive)
    local code = ("local core = require('mayura.core'); local p = core.spawn({ argv = { 'sleep', '30' }, " ..
      "outlive = %s }, function() end); io.write(p:pid()); io.stdout:flush(); os.exit(0, true)"):format(outlive)
    local host = os.getenv('MAYURA_BUILD') or 'build'
    local res = require('mayura.process').run({ host .. '/mayura', '-e', code }, { timeout_ms = 20000 })
    local pid = tonumber(res.stdout)
    assert.is_number(pid)
    -- running, not a zombie left to whoever adopted it
    local f = io.open('/proc/' .. pid .. '/stat', 'r')
    local stat = f and f:read('a') or ''
    if f then f:close() end
    local alive = stat:match('^%d+ %(.-%) (%a)') ~= nil and stat:match('^%d+ %(.-%) (%a)') ~= 'Z'
    if alive then uv.kill(pid, 'sigkill') end
    return alive
  end

  it('leaves the process running when the state closes, and only then', function()
    assert.is_true(survivor(true))
    assert.is_false(survivor(false))
  end)
end)
