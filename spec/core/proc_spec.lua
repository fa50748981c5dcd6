-- core.spawn and mayura.process: processes, caps, timeouts, cancels, trees.
local core = require('mayura.core')
local compat = require('support.compat')
local process = require('mayura.process')
local mayura = require('mayura')
local util = require('support.util')

-- valgrind runs a vfork-style clone as a fork, keeps descriptors and signal 32 for itself, and
-- emulates close_range: what a command is started with is valgrind's, not the core's, there.
local under_valgrind = (os.getenv('LD_PRELOAD') or ''):find('vgpreload', 1, true) ~= nil

local function spawn(opts)
  return util.wait(function(done)
    local p, err = core.spawn(opts, done)
    if not p then done(nil, err) end
  end)
end

describe('core.spawn', function()
  describe('failure modes', function()
    it('refuses bad arguments with INVALID_INPUT and starts nothing', function()
      local cb = function() error('must not be called') end
      assert.raises_code('INVALID_INPUT', core.spawn, nil, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' } }, nil)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = {} }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = 'true' }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true', 3 } }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'tr\0ue' } }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { '' } }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, bogus = 1 }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, timeout_ms = -1 }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, timeout_ms = 1.5 }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, max_output_bytes = 'x' }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, env = { A = 1 } }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, env = { ['A=B'] = 'x' } }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, env = { A = 'x\0y' } }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, cwd = '/tmp\0x' }, cb)
      assert.raises_code('INVALID_INPUT', core.spawn, { argv = { 'true' }, stdin = 42 }, cb)
    end)

    it('reports a missing program or cwd as SPAWN_FAILED with its errno', function()
      local res, err = spawn({ argv = { '/no/such/program' } })
      assert.is_nil(res)
      assert.are.equal('SPAWN_FAILED', err.code)
      assert.are.equal('ENOENT', err.errno)
      assert.matches('^SPAWN_FAILED: ', tostring(err))
      res, err = spawn({ argv = { 'true' }, cwd = '/no/such/dir' })
      assert.is_nil(res)
      assert.are.equal('SPAWN_FAILED', err.code)
    end)

    it('raises CANCELLED through mayura.process for a token cancelled before the start', function()
      local token = mayura.cancel_token()
      token:cancel()
      assert.raises_code('CANCELLED', process.run, { 'true' }, { signal = token })
      assert.raises_code('INVALID_INPUT', process.run, { 'true' }, { signal = {} })
      assert.raises_code('INVALID_INPUT', process.run, { 'true' }, { nope = true })
    end)
  end)

  describe('how a command starts', function()
    it('hands a command a sealed file in memory (sealed_fd) that it can read and nobody can change', function()
      local fd = assert(core.sealed_fd('one\ntwo\n'))
      -- read twice, from the start each time (a reopen through /proc); every write refused
      local r = spawn({ argv = { 'sh', '-c', 'cat /proc/self/fd/3; cat /proc/self/fd/3; ' ..
        'echo x >> /proc/self/fd/3 || echo refused; true > /proc/self/fd/3 || echo refused; ' ..
        'test -e /proc/self/fd/4 || echo one-descriptor' }, fds = { fd } })
      core.close_fd(fd)
      assert.are.equal('one\ntwo\none\ntwo\nrefused\nrefused\none-descriptor\n', r.stdout)
      -- close-on-exec in the host: a command gets it only through fds
      fd = assert(core.sealed_fd(''))
      r = spawn({ argv = { 'sh', '-c', 'test -e /proc/self/fd/' .. fd .. ' && echo leaked; true' } })
      core.close_fd(fd)
      assert.are.equal('', r.stdout)
      assert.raises_code('INVALID_INPUT', core.sealed_fd, {})
    end)

    it('hands the command its three streams and the fds asked for, and no other descriptor of the host', function()
      if under_valgrind then return pending('under valgrind, the descriptors and signals a command starts with are valgrind\'s') end
      local dir = util.tmpdir()
      -- io.open leaves its descriptor inheritable (no close-on-exec), as many libraries do
      local stray = assert(io.open(dir .. '/stray-host-file', 'w'))
      local a, b = core.socketpair()
      local ok, err = pcall(function()
        local r = spawn({ argv = { 'sh', '-c', 'for f in /proc/$$/fd/*; do echo "${f##*/} $(readlink $f)"; done' },
          fds = { b } })
        assert.are.equal(0, r.exit_code)
        assert.is_nil(r.stdout:find('stray-host-file', 1, true), 'the host file reached the command:\n' .. r.stdout)
        local seen = {}
        for fd in r.stdout:gmatch('(%d+) ') do seen[#seen + 1] = tonumber(fd) end
        table.sort(seen)
        -- 0, 1, 2, the one fd given (as 3), and the one the shell's glob of /proc/$$/fd opened
        assert.are.same({ 0, 1, 2, 3 }, { seen[1], seen[2], seen[3], seen[4] })
        assert.matches('\n3 socket:', '\n' .. r.stdout)
        assert.is_true(#seen <= 5, r.stdout)
      end)
      stray:close()
      core.close_fd(a)
      core.close_fd(b)
      util.rmdir(dir)
      assert(ok, err)
    end)

    it('looks the program up in the PATH of the environment it is given', function()
      local dir = util.tmpdir()
      assert(os.execute('mkdir ' .. dir .. '/a ' .. dir .. '/b'))
      for _, sub in ipairs({ 'a', 'b' }) do
        local f = assert(io.open(dir .. '/' .. sub .. '/mayura-path-probe', 'w'))
        f:write('#!/bin/sh\necho found ' .. sub .. ' "$1"\n')
        f:close()
      end
      local ok, err = pcall(function()
        assert(os.execute('chmod 755 ' .. dir .. '/b/mayura-path-probe'))
        -- a/ holds one that is not executable: passed over, as execvp does
        local r, e = spawn({ argv = { 'mayura-path-probe', 'x' }, env = { PATH = '/nowhere:' .. dir .. '/a:' .. dir .. '/b' } })
        assert(r, e and tostring(e))
        assert.are.equal('found b x\n', r.stdout)
        r, e = spawn({ argv = { 'mayura-path-probe' }, env = { PATH = dir .. '/a' } })
        assert.is_nil(r)
        assert.are.equal('SPAWN_FAILED', e.code)
        assert.are.equal('EACCES', e.errno)
        r, e = spawn({ argv = { 'mayura-path-probe' }, env = { PATH = '/nowhere' } })
        assert.is_nil(r)
        assert.are.equal('ENOENT', e.errno)
        -- a relative entry is looked up from the command's cwd, where execvp looked after its chdir
        r, e = spawn({ argv = { 'mayura-path-probe', 'z' }, env = { PATH = '.' }, cwd = dir .. '/b' })
        assert(r, e and tostring(e))
        assert.are.equal('found b z\n', r.stdout)
        r, e = spawn({ argv = { 'mayura-path-probe', 'w' }, env = { PATH = ':/nowhere' }, cwd = dir .. '/b' })
        assert(r, e and tostring(e))
        assert.are.equal('found b w\n', r.stdout)
        -- no PATH at all: /bin and /usr/bin, as execvp
        r = spawn({ argv = { 'sh', '-c', 'exit 3' }, env = {} })
        assert.are.equal(3, r.exit_code)
      end)
      util.rmdir(dir)
      assert(ok, err)
    end)

    it('runs an executable file without #! through /bin/sh, as execvp does', function()
      local dir = util.tmpdir()
      local f = assert(io.open(dir .. '/no-shebang', 'w'))
      f:write('echo "no shebang: $0 $1"\n')
      f:close()
      assert(os.execute('chmod 755 ' .. dir .. '/no-shebang'))
      local ok, err = pcall(function()
        local r, e = spawn({ argv = { dir .. '/no-shebang', 'x' } })
        assert(r, e and tostring(e))
        assert.are.equal(0, r.exit_code)
        assert.are.equal('no shebang: ' .. dir .. '/no-shebang x\n', r.stdout)
        r, e = spawn({ argv = { 'no-shebang', 'y' }, env = { PATH = dir } })
        assert(r, e and tostring(e))
        assert.are.equal('no shebang: ' .. dir .. '/no-shebang y\n', r.stdout)
      end)
      util.rmdir(dir)
      assert(ok, err)
    end)

    it('starts the command with no signal blocked or ignored, though the host ignores SIGPIPE', function()
      if under_valgrind then return pending('under valgrind, the descriptors and signals a command starts with are valgrind\'s') end
      local r = spawn({ argv = { 'cat', '/proc/self/status' } })
      assert.are.equal('0000000000000000', r.stdout:match('\nSigBlk:%s*(%x+)'))
      assert.are.equal('0000000000000000', r.stdout:match('\nSigIgn:%s*(%x+)'))
    end)

    it('leads its own session, in the cwd given, with stdin on /dev/null when no bytes are given', function()
      local r = spawn({ argv = { 'sh', '-c', 'echo "$$ $(cut -d" " -f6 /proc/$$/stat) $(pwd) $(readlink /proc/$$/fd/0)"' },
        cwd = '/usr' })
      local pid, sid, cwd, stdin = r.stdout:match('^(%d+) (%d+) (%S+) (%S+)\n$')
      assert.are.equal(pid, sid)
      assert.are.equal('/usr', cwd)
      assert.are.equal('/dev/null', stdin)
    end)

    it('works the same through uv_spawn, the way kept for kernels without pidfd_open (MAYURA_SPAWN=fork)', function()
      if under_valgrind then return pending('under valgrind, the descriptors and signals a command starts with are valgrind\'s') end
      local script = table.concat({
        "local core = require('mayura.core')",
        "local function run(o)",
        "  local res",
        "  local p, err = core.spawn(o, function(r) res = r end)",
        "  if not p then return nil, err end",
        "  while not res do core.run_once() end",
        "  return res",
        "end",
        "local r = run({ argv = { 'sh', '-c', 'cat; echo err >&2; exit 5' }, stdin = 'in' })",
        "assert(r.exit_code == 5 and r.stdout == 'in' and r.stderr == 'err\\n', 'run')",
        "local a, b = core.socketpair()",
        "r = run({ argv = { 'sh', '-c', 'echo via-fd >&3' }, fds = { b } })",
        "assert(r.exit_code == 0, 'fds')",
        "r = run({ argv = { 'cat', '/proc/self/status' } })",
        "assert(r.stdout:match('SigIgn:%s*(%x+)') == '0000000000000000', 'signals')",
        "local t0 = core.hrtime_ms()",
        "r = run({ argv = { 'sh', '-c', 'sleep 30 & sleep 30' }, timeout_ms = 200 })",
        "assert(r.timed_out and core.hrtime_ms() - t0 < 5000, 'timeout')",
        "local none, err = run({ argv = { '/no/such/program' } })",
        "assert(none == nil and err.code == 'SPAWN_FAILED' and err.errno == 'ENOENT', 'missing')",
        "core.close_fd(a)",
        "print('fallback fine')",
      }, '\n')
      local r = spawn({ argv = { compat.host, '-e', script }, env = {
        PATH = os.getenv('PATH'), MAYURA_SPAWN = 'fork',
        LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;tools/?.lua;;', LUA_CPATH = compat.cpath .. ';;',
      } })
      assert.are.equal('fallback fine\n', r.stdout, r.stderr)
      assert.are.equal(0, r.exit_code)
    end)

    -- the kernel reaps the children of a process that ignores SIGCHLD at once: a pidfd would find no
    -- status, so such a host starts through uv_spawn (whose SIGCHLD handler ends the ignoring)
    it('gives the exit code in a host that ignores SIGCHLD (inherited across its exec)', function()
      local perl = require('luv').fs_stat('/usr/bin/perl') and '/usr/bin/perl'
      if not perl then return pending('needs perl (perl-base) to start a host with SIGCHLD ignored') end
      local script = table.concat({
        "local core = require('mayura.core')",
        "local function ignored()",
        "  for l in io.lines('/proc/self/status') do",
        "    local m = l:match('^SigIgn:%s*(%x+)')",
        "    if m then return math.floor(tonumber(m:sub(-5), 16) / 65536) % 2 == 1 end",   -- bit 16: SIGCHLD (17)
        "  end",
        "end",
        "local was = ignored()",
        "local codes = {}",
        "for i = 1, 3 do",
        "  local res",
        "  assert(core.spawn({ argv = { 'sh', '-c', 'exit ' .. (6 + i) } }, function(r) res = r end))",
        "  while not res do core.run_once() end",
        "  codes[i] = res.exit_code",
        "end",
        "print(tostring(was) .. ' ' .. table.concat(codes, ' '))",
      }, '\n')
      local r = spawn({ argv = { perl, '-e', '$SIG{CHLD} = "IGNORE"; exec @ARGV or die', compat.host, '-e', script },
        env = { PATH = os.getenv('PATH'), LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;tools/?.lua;;',
          LUA_CPATH = compat.cpath .. ';;' } })
      assert.are.equal('true 7 8 9\n', r.stdout, r.stderr)
    end)
  end)

  it('gives the exit code, both streams and the duration', function()
    local r = spawn({ argv = { 'sh', '-c', 'printf out; printf err >&2; exit 7' } })
    assert.are.equal(7, r.exit_code)
    assert.are.equal('out', r.stdout)
    assert.are.equal('err', r.stderr)
    assert.is_false(r.truncated)
    assert.is_false(r.timed_out)
    assert.is_true(compat.math_type(r.duration_ms) == 'integer')
  end)

  it('runs an argv without a shell', function()
    local r = spawn({ argv = { 'echo', '$HOME; rm -rf /', '*' } })
    assert.are.equal('$HOME; rm -rf / *\n', r.stdout)
  end)

  it('reports a signal and no exit code for a command killed by one', function()
    local r = spawn({ argv = { 'sh', '-c', 'kill -9 $$' } })
    assert.is_nil(r.exit_code)
    assert.are.equal(9, r.signal)
  end)

  it('passes exactly the env given, and the cwd', function()
    local r = spawn({ argv = { 'sh', '-c', 'echo "$FOO|$HOME"; pwd' }, env = { FOO = 'bar baz' }, cwd = '/usr' })
    assert.are.equal('bar baz|\n/usr\n', r.stdout)
  end)

  it('keeps at most max_output_bytes of a 200 MiB flood, with bounded host memory', function()
    local before = util.rss_kib()
    local r = spawn({
      argv = { 'sh', '-c', 'head -c 209715200 /dev/zero; head -c 209715200 /dev/zero >&2' },
      max_output_bytes = 1048576,
    })
    assert.are.equal(0, r.exit_code)
    assert.are.equal(1048576, #r.stdout)
    assert.are.equal(1048576, #r.stderr)
    assert.is_true(r.truncated and r.stdout_truncated and r.stderr_truncated)
    assert.is_true(util.rss_kib() - before < 64 * 1024, 'host RSS grew by more than 64 MiB')
  end)

  it('keeps output at exactly the cap without calling it truncated', function()
    local r = spawn({ argv = { 'head', '-c', '1000', '/dev/zero' }, max_output_bytes = 1000 })
    assert.are.equal(1000, #r.stdout)
    assert.is_false(r.truncated)
    r = spawn({ argv = { 'head', '-c', '1001', '/dev/zero' }, max_output_bytes = 1000 })
    assert.are.equal(1000, #r.stdout)
    assert.is_true(r.truncated)
  end)

  it('feeds standard input larger than the pipe buffer', function()
    local data = {}
    for i = 1, 4 * 1024 * 16 do data[i] = string.format('%015d\n', i) end
    data = table.concat(data)   -- 4 MiB
    local r = spawn({ argv = { 'cat' }, stdin = data, max_output_bytes = 8 * 1048576 })
    assert.are.equal(#data, #r.stdout)
    assert.are.equal(data, r.stdout)
  end)

  it('survives a command that never reads its large stdin', function()
    local r = spawn({ argv = { 'true' }, stdin = string.rep('x', 4 * 1048576) })
    assert.are.equal(0, r.exit_code)
  end)

  it('stops a command that ignores SIGTERM at its timeout', function()
    local r = spawn({ argv = { 'sh', '-c', 'trap "" TERM; sleep 30' }, timeout_ms = 200, kill_grace_ms = 100 })
    assert.is_true(r.timed_out)
    assert.is_nil(r.exit_code)
    -- ended by SIGKILL after the grace, not by its 30 s sleep ending
    assert.are.equal(9, r.signal)
  end)

  it('stops every process a timed-out command started, grandchildren and setsid included', function()
    local r = spawn({
      argv = { 'sh', '-c', '(sleep 4711 &); setsid sleep 4712 >/dev/null 2>&1 </dev/null & sleep 4713 & sleep 4714' },
      timeout_ms = 300,
    })
    assert.is_true(r.timed_out)
    for _, n in ipairs({ '4711', '4712', '4713', '4714' }) do
      assert.is_true(util.eventually(function() return #util.procs_matching('sleep ' .. n) == 0 end),
        'sleep ' .. n .. ' outlived the timeout')
    end
  end)

  it('lets a setsid process outlive a command that ended normally', function()
    -- a name of this run's own: other runs on the machine may have their sleeps too
    local name = 'sleep 4721.' .. math.random(100000, 999999)
    local r = spawn({ argv = { 'sh', '-c', 'setsid ' .. name .. ' >/dev/null 2>&1 </dev/null & echo done' } })
    assert.are.equal(0, r.exit_code)
    assert.are.equal('done\n', r.stdout)
    assert.is_true(util.eventually(function() return #util.procs_matching(name) == 1 end))
    util.kill_matching(name)
  end)

  it('does not wait forever for a setsid process that keeps the output pipe', function()
    local r = spawn({ argv = { 'sh', '-c', 'setsid sleep 4731 & echo hi' }, drain_ms = 50 })
    assert.are.equal('hi\n', r.stdout)
    util.kill_matching('sleep 4731')
  end)

  it('cancels a command and its tree, and mayura.process raises CANCELLED', function()
    local token = mayura.cancel_token()
    local uv = require('luv')
    local timer = uv.new_timer()
    timer:start(150, 0, function() timer:close(); token:cancel() end)
    local err = assert.raises_code('CANCELLED', process.run,
      { 'sh', '-c', 'setsid sleep 4741 >/dev/null 2>&1 </dev/null & sleep 4742' }, { signal = token })
    assert.matches('cancelled', err.message)
    assert.is_true(util.eventually(function()
      return #util.procs_matching('sleep 4741') == 0 and #util.procs_matching('sleep 4742') == 0
    end))
  end)

  it('cancel after the end does nothing', function()
    local proc
    local r = util.wait(function(done) proc = core.spawn({ argv = { 'true' } }, done) end)
    assert.are.equal(0, r.exit_code)
    assert.is_false(proc:cancel())
    assert.is_false(proc:running())
  end)

  it('closes through __close like __gc: the tree is stopped, and closing again does nothing', function()
    local called = false
    local proc = assert(core.spawn({ argv = { 'sh', '-c', 'sleep 4743 & sleep 4744' } }, function() called = true end))
    local close = getmetatable(proc).__close
    close(proc)
    close(proc)
    assert.is_true(util.eventually(function()
      return #util.procs_matching('sleep 4743') == 0 and #util.procs_matching('sleep 4744') == 0
    end))
    assert.is_false(called)
    assert.is_false(proc:cancel())
  end)

  it('runs 200 processes at once on one loop', function()
    local results, pending = {}, 200
    for i = 1, 200 do
      assert(core.spawn({ argv = { 'sh', '-c', 'echo $0', tostring(i) } }, function(r)
        results[i] = r.stdout
        pending = pending - 1
      end))
    end
    while pending > 0 do core.run_once() end
    for i = 1, 200 do assert.are.equal(i .. '\n', results[i]) end
  end)

  it('keeps going when a callback raises', function()
    local stderr = io.stderr
    local reports = util.capture_reports(function()
      util.wait(function(done)
        core.spawn({ argv = { 'true' } }, function() done(); error('callback failure on purpose') end)
      end)
    end)
    assert.are.equal(1, #reports)
    assert.matches('error in a loop callback: .*callback failure on purpose', reports[1])
    assert.matches('stack traceback', reports[1])
    local r = spawn({ argv = { 'echo', 'still here' } })
    assert.are.equal('still here\n', r.stdout)
    assert.are.equal(stderr, io.stderr)
  end)
end)
