-- mayura.sandbox.scripts and mayura.sandbox.command: the scripts under dash and BusyBox sh
-- on real files and processes, the listing parser against malformed text, and the command
-- backend (the conformance suite and its edge cases) over transports that run each command
-- through a local sandbox's exec: one with standard input (dash), one without and with
-- 4096-byte commands (BusyBox sh and its applets), so chunking and staging are exercised.
local sandbox = require('mayura.sandbox')
local testing = require('mayura.sandbox.testing')
local errors = require('mayura.errors')
local task = require('mayura._task')
local process = require('mayura.process')
local transports = require('support.command_transports')
local providers = require('support.providers')
local util = require('support.util')
local stop_cases = require('support.stop_cases')

local scripts = sandbox.sandbox_scripts
local MIB = 1048576

local BUSYBOX = '/usr/bin/busybox'

-- A directory with a grep that refuses -z (as a BusyBox built without it does), before the real one.
local NO_Z_GREP = os.tmpname()
os.remove(NO_Z_GREP)
assert(os.execute('mkdir -p ' .. NO_Z_GREP))
do
  local f = assert(io.open(NO_Z_GREP .. '/grep', 'w'))
  f:write('#!/bin/sh\nfor a in "$@";do case $a in -*z*) echo "grep: no -z" >&2;exit 2;;esac;done\nexec /bin/grep "$@"\n')
  f:close()
  assert(os.execute('chmod 755 ' .. NO_Z_GREP .. '/grep'))
end

-- The shells the scripts must work with; BusyBox with no PATH, so only its applets run.
local SHELLS = {
  { name = 'dash', argv = { 'dash' }, env = { PATH = '/usr/bin:/bin' } },
  { name = 'BusyBox sh', argv = { BUSYBOX, 'sh' }, env = { PATH = '/nonexistent' } },
  { name = 'dash, with a grep that has no -z', argv = { 'dash' }, env = { PATH = NO_Z_GREP .. ':/usr/bin:/bin' } },
}

local function run_sh(shell, script, stdin)
  local argv = {}
  for i, a in ipairs(shell.argv) do argv[i] = a end
  argv[#argv + 1] = '-c'
  argv[#argv + 1] = script
  return process.run(argv, { env = shell.env, stdin = stdin, timeout_ms = 20000 })
end

local function temp_dir()
  local r = process.run({ 'mktemp', '-d' })
  return (r.stdout:gsub('\n$', ''))
end

local function bytes(n, seed)
  local t, x = {}, seed or 7
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[i] = string.char(math.floor(x / 65536) % 256)
  end
  return table.concat(t)
end

-- Names no shell should mangle: newlines, quotes, expansions, a leading dash, any byte.
local NASTY = {
  'new\nline', "it's", '$(touch pwned)', '`touch pwned`', 'back\\slash', '-rf', ' lead', 'tab\there',
  '\1\2\127\255', 'caf\195\169', '*', '.hidden', '..two', 'end\n', string.rep('n', 255),
}

describe('sandbox_scripts', function()
  teardown(function() os.execute('rm -rf ' .. NO_Z_GREP) end)
  it('quote refuses NUL bytes and kill refuses tags it could not match exactly', function()
    assert.raises_code('INVALID_INPUT', scripts.quote, 'a\0b')
    assert.raises_code('INVALID_INPUT', scripts.kill, 'a b')
    assert.raises_code('INVALID_INPUT', scripts.kill, '')
    assert.raises_code('INVALID_INPUT', scripts.kill, 'tag', 'NOT A NAME')
    assert.raises_code('INVALID_INPUT', scripts.read, '/x', -1, 1)
    assert.raises_code('INVALID_INPUT', scripts.write_chunk, '/x', "a'b")
    assert.are.equal([['it'\''s']], scripts.quote("it's"))
  end)

  it('names errors as the agent backend does', function()
    local agent_backend = require('mayura.sandbox._agent_backend')
    for _, name in ipairs({ 'too_large', 'is_directory', 'EISDIR', 'not_directory', 'ENOTDIR', 'not_regular',
      'ENOTEMPTY', 'ENOENT', 'ENAMETOOLONG', 'ELOOP', 'EACCES', 'EPERM', 'EROFS', 'ENOSPC', 'EDQUOT', 'EFBIG',
      'failed', 'EIO', 'made_up', '__index' }) do
      local mine, theirs = scripts.script_error(name, 'the file'), agent_backend.reply_error({ error = name }, 'the file')
      assert.are.same({ theirs.code, theirs.reason, theirs.message }, { mine.code, mine.reason, mine.message }, name)
    end
  end)

  for _, shell in ipairs(SHELLS) do
    describe('under ' .. shell.name, function()
      local dir
      before_each(function() dir = temp_dir() end)
      after_each(function() process.run({ 'rm', '-rf', dir }) end)

      local function sh(script, stdin)
        local r = run_sh(shell, script, stdin)
        assert.are.equal(0, r.exit_code, r.stderr)
        return r.stdout
      end

      it('lists names of any bytes, with types, sizes and times', function()
        for i, name in ipairs(NASTY) do
          local f = assert(io.open(dir .. '/' .. name, 'wb'))
          f:write(string.rep('x', i))
          f:close()
        end
        process.run({ 'mkdir', dir .. '/sub' })
        process.run({ 'ln', '-s', 'nowhere', dir .. '/dangling' })
        process.run({ 'mkfifo', dir .. '/fifo' })
        local entries = sandbox.parse_sandbox_listing(sh(scripts.list(dir)))
        local by = {}
        for _, e in ipairs(entries) do by[e.name] = e end
        assert.are.equal(#NASTY + 3, #entries)
        for i, name in ipairs(NASTY) do
          assert.is_table(by[name], ('%q is missing'):format(name))
          assert.are.same({ 'file', i }, { by[name].type, by[name].size })
        end
        assert.are.equal('directory', by.sub.type)
        assert.are.equal('symlink', by.dangling.type)
        assert.are.equal('other', by.fifo.type)
        assert.is_true(math.abs(by['it\'s'].modified - os.time() * 1000) < 3600000)
        assert.is_nil(io.open(dir .. '/sub/pwned') or io.open('pwned'))
        assert.is_nil(sandbox.parse_sandbox_listing(sh(scripts.list(dir .. '/none'))))
        assert.is_nil(sandbox.parse_sandbox_listing(sh(scripts.list(dir .. '/it\'s/below'))))
        assert.raises_code('INVALID_INPUT', sandbox.parse_sandbox_listing, sh(scripts.list(dir .. '/it\'s')))
        assert.are.same({}, sandbox.parse_sandbox_listing(sh(scripts.list(dir .. '/sub'))))
      end)

      it('reads any range of a file as base64 after its size', function()
        local data = bytes(70000)
        local f = assert(io.open(dir .. '/$f', 'wb'))
        f:write(data)
        f:close()
        for _, r in ipairs({ { 0, 70000 }, { 0, 10 }, { 65536, 4464 }, { 5, 3 }, { 69999, 100 }, { 80000, 10 },
          { 4096, 0 } }) do
          local out = sh(scripts.read(dir .. '/$f', r[1], r[2]))
          local size, b64 = out:match('^F (%d+)\n(.*)$')
          assert.are.equal('70000', size)
          assert.are.equal(data:sub(r[1] + 1, r[1] + r[2]), require('mayura.core').base64.decode(b64))
        end
        assert.are.equal('N\n', sh(scripts.read(dir .. '/none', 0, 1)))
        assert.are.equal('E is_directory\n', sh(scripts.read(dir, 0, 1)))
        process.run({ 'mkfifo', dir .. '/fifo' })
        assert.are.equal('E not_regular\n', sh(scripts.read(dir .. '/fifo', 0, 1)))
      end)

      it('writes through a temporary file and a link, from arguments and standard input', function()
        local path = dir .. "/new dir/it's $(x)/file"
        local tmp = scripts.temp_name(path, 'test1')
        local link = dir .. '/link'
        local b64 = require('mayura.core').base64.encode
        assert.are.equal('OK\n', sh(scripts.write_begin(path, tmp, link)))
        assert.are.equal('OK\n', sh(scripts.write_chunk(link, b64('first\0'))))
        assert.are.equal('OK\n', sh(scripts.write_chunk(link, nil), b64('\255second')))
        assert.is_nil(io.open(path))   -- nothing at the path before the commit
        assert.are.equal('OK\n', sh(scripts.write_commit(tmp, path, link)))
        local f = assert(io.open(path, 'rb'))
        assert.are.equal('first\0\255second', f:read('a'))
        f:close()
        assert.is_nil(io.open(tmp))
        assert.is_nil(io.open(link))
        -- replacing a symlink to a directory replaces the link, and a directory is refused
        process.run({ 'mkdir', dir .. '/d' })
        process.run({ 'ln', '-s', 'd', dir .. '/l' })
        assert.are.equal('OK\nOK\nOK\n', sh(scripts.write_begin(dir .. '/l', dir .. '/t') ..
          scripts.write_chunk(dir .. '/t', b64('x')) .. scripts.write_commit(dir .. '/t', dir .. '/l')))
        local by = {}
        for _, e in ipairs(sandbox.parse_sandbox_listing(sh(scripts.list(dir)))) do by[e.name] = e.type end
        assert.are.same({ 'file', 'directory' }, { by.l, by.d })
        assert.are.equal('E EISDIR\n', sh(scripts.write_begin(dir .. '/d', dir .. '/t2')))
        assert.are.equal('E ENOTDIR\n', sh(scripts.write_begin(dir .. '/l/below', dir .. '/l/.below.t')))
        -- the error is named by the system's words, not by words in a path
        local liar = dir .. '/x: No space left on device'
        process.run({ 'touch', liar })
        assert.are.equal('E ENOTDIR\n', sh(scripts.write_begin(liar .. '/f', liar .. '/.f.t')))
        process.run({ 'mkdir', '-p', dir .. '/Permission denied: /full' })
        process.run({ 'touch', dir .. '/Permission denied: /full/f' })
        assert.are.equal('E ENOTEMPTY\n', sh(scripts.remove(dir .. '/Permission denied: /full')))
      end)

      it('removes files, links and directories, refusing a full one without recursive', function()
        process.run({ 'mkdir', '-p', dir .. '/a/b' })
        process.run({ 'touch', dir .. '/a/b/c' })
        process.run({ 'ln', '-s', dir .. '/a', dir .. '/link' })
        assert.are.equal('OK\n', sh(scripts.remove(dir .. '/link')))
        assert.truthy(io.open(dir .. '/a/b/c'))   -- the link went, not what it named
        assert.are.equal('E ENOTEMPTY\n', sh(scripts.remove(dir .. '/a')))
        assert.are.equal('OK\n', sh(scripts.remove(dir .. '/a', true)))
        assert.are.equal('N\n', sh(scripts.remove(dir .. '/a', true)))
      end)

      it('kill stops every process with the tag, also in other sessions, and no other', function()
        local n = math.random(100000, 999999)
        local tag = 'spec' .. n
        local function s(i) return 'sleep ' .. i .. n end   -- sleeps no other test starts
        finally(function()
          process.run({ 'sh', '-c', scripts.kill(tag) .. scripts.kill(tag .. '0') })
        end)
        local job = s(1) .. ' & setsid ' .. s(2) .. ' </dev/null >/dev/null 2>&1 & (while :; do ' .. s(3) ..
          '; done) & ' .. s(4)
        process.run({ 'sh', '-c', 'setsid sh -c "$1" </dev/null >/dev/null 2>&1 &', 'sh', job },
          { env = { PATH = '/usr/bin:/bin', MAYURA_EXEC = tag } })
        process.run({ 'sh', '-c', 'setsid ' .. s(5) .. ' </dev/null >/dev/null 2>&1 &' },
          { env = { PATH = '/usr/bin:/bin', MAYURA_EXEC = tag .. '0' } })
        for _ = 1, 100 do
          if #util.procs_matching(s(4)) > 0 and #util.procs_matching(s(2)) > 0 then break end
          task.sleep(20)
        end
        assert.is_true(#util.procs_matching(s(2)) > 0)
        assert.are.equal('OK\n', sh(scripts.kill(tag)))
        for i = 1, 4 do assert.are.same({}, util.procs_matching(s(i))) end
        assert.are.equal(1, #util.procs_matching(s(5)))
      end)

      it('kill with prefix stops every tag that starts so, and no other', function()
        local n = math.random(100000, 999999)
        local prefix = 'p' .. n .. '.'
        local function s(i) return 'sleep ' .. i .. n end
        finally(function()
          process.run({ 'sh', '-c', scripts.kill(prefix, nil, true) .. scripts.kill('p' .. n .. 'x3') })
        end)
        for i, tag in ipairs({ prefix .. '1', prefix .. '22', 'p' .. n .. 'x3' }) do
          process.run({ 'sh', '-c', 'setsid ' .. s(i) .. ' </dev/null >/dev/null 2>&1 &' },
            { env = { PATH = '/usr/bin:/bin', MAYURA_EXEC = tag } })
        end
        for _ = 1, 100 do
          if #util.procs_matching(s(1)) + #util.procs_matching(s(2)) + #util.procs_matching(s(3)) == 3 then break end
          task.sleep(20)
        end
        assert.are.equal(1, #util.procs_matching(s(2)))
        assert.are.equal('OK\n', sh(scripts.kill(prefix, nil, true)))
        assert.are.same({}, util.procs_matching(s(1)))
        assert.are.same({}, util.procs_matching(s(2)))
        assert.are.equal(1, #util.procs_matching(s(3)))   -- 'x' is not the prefix's '.'
      end)
    end)
  end
end)

describe('parse_sandbox_listing', function()
  local parse = sandbox.parse_sandbox_listing

  local function refused(text)
    local ok, err = pcall(parse, text)
    assert.is_false(ok, ('accepted %q'):format(tostring(text)))
    assert.is_true(errors.is(err), 'a plain error: ' .. tostring(err))
    return err
  end

  it('reads entries, types and times', function()
    local got = parse('L\n81a4 5 1700000000 612062\n41ed 4096 1700000000.5 64\na1ff 3 -2 6c\n' ..
      '11a4 0 1700000000.123456789 66\nc1ed 0 0 73\nend\n')
    assert.are.same({
      { name = 'a b', type = 'file', size = 5, modified = 1700000000000 },
      { name = 'd', type = 'directory', size = 4096, modified = 1700000000500 },
      { name = 'l', type = 'symlink', size = 3, modified = -2000 },
      { name = 'f', type = 'other', size = 0, modified = 1700000000123 },
      { name = 's', type = 'other', size = 0, modified = 0 },
    }, got)
    assert.are.same({}, parse('L\nend\n'))
    assert.is_nil(parse('N\n'))
    assert.are.equal('INVALID_INPUT', refused('E not_directory\n').code)
    assert.are.equal('PERMISSION_DENIED', refused('E EACCES\n').code)
    local e = refused('E /host/secret/path\n')
    assert.are.same({ 'SANDBOX_ERROR', 'failed' }, { e.code, e.reason })
    e = refused('E made_up\n')
    assert.are.same({ 'SANDBOX_ERROR', 'failed' }, { e.code, e.reason })
  end)

  it('refuses malformed listings with SANDBOX_ERROR failed, whatever the bytes', function()
    local bad = {
      '', 'L', 'L\n', 'L\nend', 'N', 'N\nN\n', 'L\n\nend\n', 'end\n', 'L\n81a4 5 1 2f\nend\n', 'L\n81a4 5 1 2e\nend\n',
      'L\n81a4 5 1 2e2e\nend\n', 'L\n81a4 5 1 6100\nend\n', 'L\n81a4 5 1 616\nend\n', 'L\n81a4 5 1 \nend\n',
      'L\n81a4 5 1\nend\n', 'L\n81a4 -5 1 61\nend\n', 'L\n81a4 99999999999999999999 1 61\nend\n',
      'L\n81a4 5 1e3 61\nend\n', 'L\n81a4 5 1.2.3 61\nend\n', 'L\nxyz 5 1 61\nend\n', 'L\n123456789 5 1 61\nend\n',
      'L\n81a4  5 1 61\nend\n', 'L\n81a4 5 1 61 \nend\n', 'L\n81a4 5 1 61\nend\nmore\n', 'L\r\nend\r\n',
      'L\n81a4 5 9999999999999 61\nend\n', 'L\n81a4 5 1 ' .. string.rep('61', 1025) .. '\nend\n',
      'E \n', 'E a b\n', 'L\n81a4 5 1 61\0\nend\n',
    }
    for _, text in ipairs(bad) do
      local err = refused(text)
      assert.are.same({ 'SANDBOX_ERROR', 'failed' }, { err.code, err.reason }, ('%q'):format(text))
    end
    for _, v in ipairs({ 5, true, {} }) do refused(v) end
    refused(nil)
  end)

  it('never raises a plain error on mutations of a valid listing', function()
    local valid = 'L\n81a4 5 1700000000.123 66696c65\n41ed 4096 1700000000 737562\nend\n'
    local seed = 1
    local function rnd(n)
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed % n
    end
    local alphabet = 'L\nend0123456789abcdef. -E'
    for _ = 1, 5000 do
      local t = valid
      for _ = 1, 1 + rnd(4) do
        local at, op = 1 + rnd(#t), rnd(3)
        local c = rnd(2) == 0 and string.char(rnd(256)) or alphabet:sub(1 + rnd(#alphabet), 1 + rnd(#alphabet) - 1)
        if c == '' then c = 'x' end
        if op == 0 then t = t:sub(1, at - 1) .. c .. t:sub(at + 1)
        elseif op == 1 then t = t:sub(1, at - 1) .. c .. t:sub(at)
        else t = t:sub(1, at - 1) .. t:sub(at + 1) end
      end
      local ok, res = pcall(parse, t)
      if ok then
        assert.is_true(res == nil or type(res) == 'table')
        for _, e in ipairs(res or {}) do
          assert.is_true(type(e.name) == 'string' and e.name ~= '' and not e.name:find('[/%z]'))
        end
      else
        assert.is_true(errors.is(res), ('a plain error for %q: %s'):format(t, tostring(res)))
      end
    end
  end)
end)

-- Whether a process whose command line holds `marker` runs in the sandbox: seen through the
-- local sandbox under the backend when there is one, else through the sandbox itself.
local function running(sb, marker)
  local target = sb._backend.inner or sb
  local r = target:exec({ 'sh', '-c', 'for p in /proc/[0-9]*; do tr "\\000" " " < $p/cmdline 2>/dev/null; echo; done' })
  return r.stdout:find(marker, 1, true) ~= nil
end

local function gone_soon(sb, marker)
  for _ = 1, 100 do
    if not running(sb, marker) then return true end
    task.sleep(50)
  end
  return false
end

local EXAMPLE = 'examples/providers/docker_exec.lua'
local _, docker_answers = providers.host('docker info')
local _, busybox_image = providers.host('docker image inspect ' .. providers.BUSYBOX)

local KINDS = {
  { name = 'with standard input (dash)', opts = { stdin = true, max_command_bytes = 65536 }, conformance = true },
  { name = 'without standard input, 4096-byte commands (BusyBox sh)', conformance = true,
    opts = { stdin = false, max_command_bytes = 4096, shell = { BUSYBOX, 'sh' } } },
  -- over local sandboxes with the pool's default caps: every answer within 1 MiB (the default)
  { name = 'with standard input, over sandboxes that give at most 1 MiB of output', conformance = true,
    opts = { stdin = true, max_command_bytes = 65536, pool_options = {} } },
  { name = 'without standard input, over sandboxes that give at most 1 MiB of output', conformance = true,
    opts = { stdin = false, max_command_bytes = 65536, pool_options = {} } },
  -- short commands run by the call itself (every command without stdin within the default timeout)
  { name = 'running short commands in the call itself (direct_ms)', conformance = true,
    opts = { stdin = false, max_command_bytes = 65536, wait_ms = 20000, direct_ms = 60000 } },
  -- a transport that says it answers at most 16 KiB (and cuts there)
  { name = 'with answers of at most 16 KiB', opts = { stdin = true, max_output_bytes = 16384, cut_at = 16384 } },
  -- the conformance suite runs on it in spec/examples/docker_exec_spec.lua
  { name = 'over docker exec in the BusyBox image (only BusyBox sh and applets)', docker = true },
}

for _, kind in ipairs(KINDS) do
  describe('command_sandbox_backend ' .. kind.name, function()
    if kind.docker and not (docker_answers and busybox_image) then
      pending('needs a Docker daemon and ' .. providers.BUSYBOX .. ' (scripts/docker-setup.sh)')
      return
    end
    local provider
    if kind.docker then
      provider = dofile(EXAMPLE).docker_exec_sandboxes({ image = providers.BUSYBOX })
    else
      provider = transports.command_provider(kind.opts)
    end
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 4, max_lifetime_ms = 600000 })
    local sb = pool:create({ lifetime_ms = 600000, env = { FROM_CREATE = 'created' } })
    teardown(function()
      pool:close()
      if provider.pool then provider.pool:close() end
    end)

    if kind.conformance then
      describe('passes the conformance suite', function()
        for _, case in ipairs(testing.sandbox_conformance) do
          it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sb })) end)
        end
      end)

      it('keeps every command within the transport\'s max_command_bytes', function()
        local transport = provider.transports[1]
        assert.is_true(transport.longest <= kind.opts.max_command_bytes)
        assert.is_true(transport.calls > 0)
      end)
    end

    if not kind.docker then
      teardown(function()
        -- every answer the backend asked for fit in what the transport said it gives (1 MiB if unsaid)
        local cap = kind.opts.max_output_bytes or MIB
        for _, t in ipairs(provider.transports) do
          if not t.mangle then assert.is_true(t.longest_answer <= cap, t.longest_answer .. ' > ' .. cap) end
        end
      end)
    end

    it('round-trips a 1 MiB file of every byte value', function()
      local data = bytes(MIB, 3)
      sb:write_file('big/file.bin', data)
      assert.is_true(sb:read_file('big/file.bin') == data, 'the bytes read differ')
      assert.are.equal(tostring(MIB), sb:exec({ 'wc', '-c', 'big/file.bin' }).stdout:match('%d+'))
      assert.are.equal(MIB, sb:list_files('big')[1].size)
      assert.raises_code('LIMIT_EXCEEDED', sb.read_file, sb, 'big/file.bin', { max_bytes = MIB - 1 })
    end)

    it('gives binary output and takes binary standard input', function()
      local all = bytes(256 * 4, 11)
      sb:write_file('bin/all', all)
      local r = sb:exec({ 'sh', '-c', 'cat bin/all; cat bin/all >&2' })
      assert.is_true(r.stdout == all and r.stderr == all)
      r = sb:exec({ 'sh', '-c', 'cat; printf "\\000"' }, { stdin = all })
      assert.is_true(r.stdout == all .. '\0')
    end)

    it('lists names with newlines and other bytes, and reads and removes them', function()
      for _, name in ipairs(NASTY) do sb:write_file('names/' .. name, name) end
      local by = {}
      for _, e in ipairs(sb:list_files('names')) do by[e.name] = e end
      for _, name in ipairs(NASTY) do
        assert.is_table(by[name], ('%q is missing'):format(name))
        assert.are.equal(#name, by[name].size)
        assert.are.equal(name, sb:read_file('names/' .. name))
      end
      assert.is_nil(sb:read_file('pwned'))
      sb:remove_file('names/new\nline')
      assert.is_nil(sb:read_file('names/new\nline'))
    end)

    it('passes long arguments and env values of any bytes (staging what does not fit)', function()
      local long = string.rep('x\'"$`\\ ', 3000)
      local odd = 'a\nb\'c"d$(e)`f`\\g\255'
      local r = sb:exec({ 'sh', '-c', 'printf %s "$1"; printf %s "$ODD" >&2; printf %s "$FROM_CREATE" >&2', 'sh', long },
        { env = { ODD = odd } })
      assert.are.equal(0, r.exit_code)
      assert.is_true(r.stdout == long, 'the argument changed')
      assert.are.equal(odd .. 'created', r.stderr)
      r = sb:exec({ 'cat' }, { stdin = long })
      assert.is_true(r.stdout == long)
    end)

    it('reports exit codes, a signal as 128 + n, and a missing program as 127', function()
      assert.are.equal(7, sb:exec({ 'sh', '-c', 'exit 7' }).exit_code)
      assert.are.equal(137, sb:exec({ 'sh', '-c', 'kill -9 $$' }).exit_code)
      assert.are.equal(127, sb:exec({ 'no-such-program' }).exit_code)
    end)

    it('refuses a missing cwd or a file as cwd with INVALID_INPUT', function()
      assert.raises_code('INVALID_INPUT', sb.exec, sb, { 'true' }, { cwd = 'no/such/dir' })
      sb:write_file('plain.txt', 'x')
      assert.raises_code('INVALID_INPUT', sb.exec, sb, { 'true' }, { cwd = 'plain.txt' })
    end)

    it('maps file failures to coded errors, never the sandbox\'s text', function()
      sb:write_file('errs/file', 'x')
      assert.raises_code('INVALID_INPUT', sb.read_file, sb, 'errs')
      assert.raises_code('INVALID_INPUT', sb.write_file, sb, 'errs', 'x')
      assert.raises_code('INVALID_INPUT', sb.write_file, sb, 'errs/file/below', 'x')
      assert.raises_code('INVALID_INPUT', sb.list_files, sb, 'errs/file')
      assert.raises_code('PERMISSION_DENIED', sb.write_file, sb, '/usr/not-allowed', 'x')
      sb:exec({ 'chmod', '000', 'errs/file' })
      assert.raises_code('PERMISSION_DENIED', sb.read_file, sb, 'errs/file')
      local ok, err = pcall(sb.write_file, sb, '/proc/1/not-here', 'x')
      assert.is_false(ok)
      assert.is_true(errors.is(err))
      assert.is_nil(tostring(err):find('/proc', 1, true))
    end)

    it('a timeout kills a setsid child and everything else the command started', function()
      local r = sb:exec({ 'sh', '-c', 'echo partial; setsid sh -c "sleep 81; true" </dev/null >/dev/null 2>&1 & ' ..
        'sleep 82 & sleep 83' }, { timeout_ms = 700 })
      assert.is_true(r.timed_out)
      assert.is_nil(r.exit_code)
      assert.are.equal('partial\n', r.stdout)
      for _, m in ipairs({ 'sleep 81', 'sleep 82', 'sleep 83' }) do assert.is_true(gone_soon(sb, m), m) end
    end)

    it('a cancel kills the command and everything it started', function()
      local token = task.cancel_token()
      local t = task.spawn(function()
        return pcall(sb.exec, sb, { 'sh', '-c', 'setsid sleep 84 </dev/null >/dev/null 2>&1 & sleep 85' },
          { signal = token, timeout_ms = 30000 })
      end)
      for _ = 1, 100 do
        if running(sb, 'sleep 85') then break end
        task.sleep(20)
      end
      assert.is_true(running(sb, 'sleep 84'))
      token:cancel()
      local ok, err = t:wait()
      assert.is_false(ok)
      assert.are.equal('CANCELLED', err.code)
      assert.is_true(gone_soon(sb, 'sleep 84'))
      assert.is_true(gone_soon(sb, 'sleep 85'))
    end)

    stop_cases.describe(function() return sb end)

    it('ends what a command left in its group after it ends; setsid processes stay', function()
      local r = sb:exec({ 'sh', '-c', 'sleep 86 & setsid sleep 87 </dev/null >/dev/null 2>&1 & echo ok' })
      assert.are.equal('ok\n', r.stdout)
      assert.is_true(gone_soon(sb, 'sleep 86'))
      assert.is_true(running(sb, 'sleep 87'))
      sb:exec({ 'sh', '-c', 'for p in /proc/[0-9]*; do ' ..
        'if tr "\\000" " " < $p/cmdline 2>/dev/null | grep -q "^sleep 87"; then kill -9 ${p#/proc/}; fi; done' })
    end)

    it('gives a bounded answer when the command swaps its output file for /dev/zero', function()
      -- (every output file there: earlier commands' small ones wait for a later call's rm)
      local r = sb:exec({ 'sh', '-c', 'for f in /tmp/.mayura-*/x*.out; do rm -f "$f"; ln -s /dev/zero "$f"; ' ..
        'done; echo swapped >&2' })
      assert.are.equal(0, r.exit_code)
      assert.are.equal('swapped\n', r.stderr)
      assert.is_true(#r.stdout <= 49152 and not r.stdout:find('[^%z]'))
    end)

    for _, cap in ipairs({ 1000, 100000 }) do
      it('keeps output exactly at max_output_bytes = ' .. cap .. ' and truncates one byte more', function()
        local p2 = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000,
          max_output_bytes = cap })
        local s2 = p2:create({ lifetime_ms = 600000 })
        local fill = 'head -c %d /dev/zero | tr "\\000" a'
        for _, stream in ipairs({ 'stdout', 'stderr' }) do
          local redirect = stream == 'stderr' and ' >&2' or ''
          local r = s2:exec({ 'sh', '-c', fill:format(cap) .. redirect })
          assert.are.same({ cap, false }, { #r[stream], r.truncated })
          r = s2:exec({ 'sh', '-c', fill:format(cap + 1) .. redirect })
          assert.are.same({ cap, true }, { #r[stream], r.truncated })
          assert.are.equal(string.rep('a', cap), r[stream])
        end
        p2:close()
      end)
    end

    it('a release during a command ends the command with gone', function()
      local p2 = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
      local s2 = p2:create({ lifetime_ms = 600000 })
      local t = task.spawn(function() return pcall(s2.exec, s2, { 'sleep', '30' }) end)
      task.sleep(300)
      s2:release()
      local ok, err = t:wait()
      assert.is_false(ok)
      assert.are.same({ 'SANDBOX_ERROR', 'gone' }, { err.code, err.reason })
      p2:close()
    end)

    if kind.docker then return end

    it('fails with coded errors, never plain ones, when the sandbox answers nonsense', function()
      local p2 = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
      local s2 = p2:create({ lifetime_ms = 600000 })
      local t = provider.transports[#provider.transports]
      local answers = { '', 'OK', 'OK\nOK\n', 'D\n', 'D\nx\n', 'D\n0\n1 1\n!!\n-\n.\n', 'F 10\n***\n', 'F 99999999999\n',
        'L\nzz\nend\n', 'E\n', 'R\nR\n', 'X\n', '\255\0\n', string.rep('A', 10000) }
      local calls = {
        function() return s2:exec({ 'true' }, { timeout_ms = 300 }) end,
        function() return s2:read_file('f') end,
        function() return s2:write_file('f', 'data') end,
        function() return s2:list_files('.') end,
        function() return s2:remove_file('f') end,
      }
      for _, answer in ipairs(answers) do
        t.mangle = function() return { exit_code = 0, stdout = answer } end
        for _, call in ipairs(calls) do
          local ok, err = pcall(call)
          assert.is_true(ok or errors.is(err), ('a plain error for %q: %s'):format(answer, tostring(err)))
        end
      end
      for _, res in ipairs({ { exit_code = 1, stdout = 'OK\n' }, { exit_code = 'x', stdout = '' }, { stdout = 1 }, 7 }) do
        t.mangle = function() return res end
        assert.raises_code('SANDBOX_ERROR', s2.remove_file, s2, 'f')
      end
      t.mangle = nil
      assert.are.equal('fine\n', s2:exec({ 'echo', 'fine' }).stdout)
      p2:close()
    end)

    it('lists a directory whose listing is longer than one answer (16 KiB)', function()
      sb:exec({ 'sh', '-c', 'mkdir -p many && cd many && i=0; while [ $i -lt 400 ]; do ' ..
        ': > "a-file-with-a-rather-long-name-$i"; i=$((i+1)); done' })
      local entries = sb:list_files('many')
      assert.are.equal(400, #entries)
      local seen = {}
      for _, e in ipairs(entries) do seen[e.name] = e.type end
      assert.are.equal('file', seen['a-file-with-a-rather-long-name-399'])
      -- no listing file is left in the backend's state directory
      assert.are.equal('0\n', sb:exec({ 'sh', '-c', 'ls /tmp/.mayura-*/ | grep -c "^l"' }).stdout)
      sb:remove_file('many', { recursive = true })
    end)

    it('tells an answer the transport cut short as SANDBOX_ERROR truncated, never as nonsense', function()
      -- a transport that says nothing of its cap and cuts at 200000 bytes, as some exec APIs do
      local cutting = transports.command_provider({ stdin = kind.opts.stdin, max_command_bytes = kind.opts.max_command_bytes,
        shell = kind.opts.shell, cut_at = 200000 })
      local p2 = sandbox.create_sandboxes(cutting, { max_sandboxes = 1, max_lifetime_ms = 600000, max_output_bytes = 2 * MIB })
      local s2 = p2:create({ lifetime_ms = 600000 })
      s2:write_file('big.bin', bytes(256 * 1024, 5))
      local err = assert.raises_code('SANDBOX_ERROR', s2.read_file, s2, 'big.bin')
      assert.are.same({ 'truncated', false }, { err.reason, err.message:find('nonsense', 1, true) ~= nil })
      err = assert.raises_code('SANDBOX_ERROR', s2.exec, s2, { 'sh', '-c', 'head -c 1000000 /dev/zero' })
      assert.are.equal('truncated', err.reason)
      -- what fits still works
      assert.are.equal('small\n', s2:exec({ 'echo', 'small' }).stdout)
      s2:write_file('small.txt', 'fits')
      assert.are.equal('fits', s2:read_file('small.txt'))
      p2:close()
      cutting.pool:close()
    end)

    it('fails with gone once the sandbox under it is gone', function()
      local p2 = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
      local s2 = p2:create({ lifetime_ms = 600000 })
      s2._backend.inner:release()
      local err = assert.raises_code('SANDBOX_ERROR', s2.exec, s2, { 'true' })
      assert.are.equal('gone', err.reason)
      p2:close()
    end)

  end)
end

describe('command_sandbox_backend with direct_ms', function()
  local provider = transports.command_provider({ stdin = false, max_command_bytes = 65536, wait_ms = 20000,
    direct_ms = 10000 })
  local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
  local sb = pool:create({ lifetime_ms = 600000 })
  teardown(function()
    pool:close()
    provider.pool:close()
  end)
  -- whether the command's parent is the call's own shell (the script that answers 'D') or a command shell
  local PARENT = { 'sh', '-c', 'if tr "\\000" " " </proc/$PPID/cmdline | grep -q "echo [D]";then echo 1;else echo 0;fi' }

  it('runs a command within direct_ms in the call\'s own shell, in one call', function()
    local t = provider.transports[1]
    sb:exec({ 'true' })
    local before = t.calls
    local r = sb:exec(PARENT, { timeout_ms = 10000, env = { K = 'v w' } })
    assert.are.same({ 0, '1\n', 1 }, { r.exit_code, r.stdout, t.calls - before })
    assert.are.equal('v w|' .. scripts.TAG_VAR, sb:exec({ 'sh', '-c',
      'printf "%s|" "$K"; env | grep -o "^' .. scripts.TAG_VAR .. '"' }, { env = { K = 'v w' } }).stdout:gsub('\n', ''))
  end)

  it('starts a longer command, one with standard input or one that streams in a session of its own', function()
    assert.are.equal('0\n', sb:exec(PARENT, { timeout_ms = 10001 }).stdout)
    assert.are.equal('0\n', sb:exec(PARENT, { stdin = 'x' }).stdout)
    local seen = {}
    assert.are.equal('0\n', sb:exec(PARENT, { on_stdout = function(b) seen[#seen + 1] = b end }).stdout)
    assert.are.equal('0\n', table.concat(seen))
  end)

  it('stops a direct command at its timeout with what it wrote, and nothing of it runs on', function()
    local t = provider.transports[1]
    local before = t.calls
    local r = sb:exec({ 'sh', '-c', 'echo early; echo err >&2; sleep 91 & sleep 92' }, { timeout_ms = 400 })
    assert.are.same({ true, nil, 'early\n', 'err\n' }, { r.timed_out, r.exit_code, r.stdout, r.stderr })
    assert.are.equal(2, t.calls - before)   -- the command's call and the stop's
    assert.is_true(gone_soon(sb, 'sleep 91'))
    assert.is_true(gone_soon(sb, 'sleep 92'))
  end)

  it('makes its state directory (0700) and the workdir (default mode) with its first call, or says which failed',
    function()
    local inner = provider.pool:create({ lifetime_ms = 60000 })
    local function backend(workdir, state)
      local t = transports.local_exec(inner, { stdin = false })
      t.workdir, t.state_dir, t.make_workdir = workdir, state, true
      return sandbox.command_sandbox_backend('setup', t)
    end
    local b = backend('/tmp/made/work', '/tmp/made/state')
    assert.are.equal('700 755\n', b:exec({ 'stat', '-c', '%a', '/tmp/made/state', '/tmp/made/work' },
      { timeout_ms = 5000 }).stdout:gsub('\n(.)', ' %1'))
    for _, c in ipairs({ { '/proc/no/work', '/tmp/s2', 'working directory' }, { '/tmp/w3', '/proc/no/state', 'state' } }) do
      local bad = backend(c[1], c[2])
      local err = assert.raises_code('SANDBOX_ERROR', bad.exec, bad, { 'true' }, {})
      assert.truthy(err.message:find(c[3], 1, true), err.message)
    end
    inner:release()
  end)

  it('gives up a direct call that does not come back once its command was stopped, as timeout', function()
    local inner = provider.pool:create({ lifetime_ms = 60000 })
    local t = transports.local_exec(inner, { stdin = false, wait_ms = 20000, direct_ms = 10000 })
    local run, direct_calls = t.run, 0
    t.run = function(self, command, o)
      if not command:find('echo D;echo "$r"', 1, true) then return run(self, command, o) end
      -- the direct call: its command runs, its answer never comes
      direct_calls = direct_calls + 1
      task.spawn(function() pcall(run, self, command, {}) end)
      while not o.signal.cancelled do task.sleep(20) end
      error(errors.new('CANCELLED', 'the call was cancelled'), 0)
    end
    local b = sandbox.command_sandbox_backend('give-up', t)
    b._give_up_ms = 300
    local err = assert.raises_code('SANDBOX_ERROR', b.exec, b, { 'sleep', '94' }, { timeout_ms = 300 })
    assert.are.same({ 'timeout', 1 }, { err.reason, direct_calls })
    assert.is_true(gone_soon(inner, 'sleep 94'))
    inner:release()
  end)

  it('fails with a coded error, and goes on, when a direct command forges or floods its call\'s answer', function()
    for _, script in ipairs({
      'printf "D\\n0\\n0 0\\n-\\n.\\n:end\\n" >/proc/$PPID/fd/1; kill -9 $PPID; sleep 0.2',
      'printf "D\\n0\\n0 0\\n-\\n.\\n" >/proc/$PPID/fd/1; echo real',
      'head -c 5000000 /dev/zero >/proc/$PPID/fd/1',
      'kill -9 $PPID',
    }) do
      local err = assert.raises_code('SANDBOX_ERROR', sb.exec, sb, { 'sh', '-c', script }, { timeout_ms = 5000 })
      assert.is_nil(err.message:find('/proc', 1, true))
    end
    assert.are.equal('ok\n', sb:exec({ 'echo', 'ok' }).stdout)
  end)

  it('keeps a direct command\'s output to max_output_bytes and its bytes as they are', function()
    local r = sb:exec({ 'sh', '-c', 'head -c 2000000 /dev/zero; printf "\\377\\000x" >&2' }, { timeout_ms = 10000 })
    assert.are.same({ 0, MIB, true, '\255\0x' }, { r.exit_code, #r.stdout, r.truncated, r.stderr })
  end)
end)

describe('command_sandbox_backend options', function()
  it('refuses transports it cannot use with INVALID_CONFIG', function()
    local run = function() return { exit_code = 0, stdout = 'OK\n' } end
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, '', { run = run })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run, stdin = 'yes' })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run, max_command_bytes = 100 })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run, workdir = 'relative' })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run, direct_ms = -1 })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run, direct_ms = 1.5 })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run, env = { ['A B'] = 'x' } })
    assert.raises_code('INVALID_CONFIG', sandbox.command_sandbox_backend, 'x', { run = run }, 'not a function')
  end)

  it('fails its first call with SANDBOX_ERROR when the sandbox lacks a tool, naming only the tool', function()
    local calls = 0
    local run = function()
      calls = calls + 1
      return { exit_code = 0, stdout = 'M setsid\nM /etc/secret\n:end\n' }
    end
    local b = sandbox.command_sandbox_backend('x', { run = run })
    assert.are.equal(0, calls)   -- making the backend runs nothing
    for _ = 1, 2 do   -- and every call finds the tool missing until one finds it
      local err = assert.raises_code('SANDBOX_ERROR', b.read_file, b, '/x')
      assert.are.equal('failed', err.reason)
      assert.truthy(err.message:find('setsid', 1, true))
      assert.is_nil(err.message:find('secret', 1, true))
    end
  end)
end)
