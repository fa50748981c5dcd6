--- mayura.sandbox.testing: the sandbox conformance suite.
--
-- `sandbox_conformance` is a list of cases `{ name = ..., run = function(ctx) ... end }`.
-- Each runs against a real sandbox, `ctx.sandbox`, made by `create_sandboxes`, and
-- returns 'passed' or a string that says what failed. Cases that need sandboxes
-- of their own (the pool limit, the lifetime, release, snapshots) make them from the same
-- provider in a small pool of their own, so the shared sandbox stays usable.
--
--   for _, case in ipairs(sandbox_conformance) do
--     it(case.name, function() assert.are.equal('passed', case.run({ sandbox = sandbox })) end)
--   end
local errors = require('mayura.errors')
local task = require('mayura._task')

local M = {}

local function fail(fmt, ...)
  error({ conformance = string.format(fmt, ...) }, 0)
end

local function expect(cond, fmt, ...)
  if not cond then fail(fmt, ...) end
end

local function equal(want, got, what)
  if want ~= got then
    fail('%s: expected %q, got %q', what, tostring(want), tostring(got))
  end
end

-- Runs fn and expects a coded error; returns it.
local function raises(code, reason, fn, ...)
  local ok, err = pcall(fn, ...)
  expect(not ok, 'expected %s%s, but the call succeeded', code, reason and (' (' .. reason .. ')') or '')
  expect(errors.is(err), 'expected a coded error, got %s', tostring(err))
  equal(code, err.code, 'error code')
  if reason then equal(reason, err.reason, 'error reason') end
  return err
end

local function sh(sandbox, script, opts)
  return sandbox:exec({ 'sh', '-c', script }, opts)
end

-- Whether a process whose command line holds `marker` is alive in the sandbox.
local function running(sandbox, marker)
  local r = sh(sandbox, 'for p in /proc/[0-9]*; do tr "\\000" " " < $p/cmdline 2>/dev/null; echo; done')
  return r.stdout:find(marker, 1, true) ~= nil
end

-- A small pool of its own over the same provider, for cases that end sandboxes. A provider that
-- cannot keep a sandbox offline (network { 'all' } only) gets a pool of its first kind, whose
-- creates ask for that kind (asking for nothing means 'none', which such a provider cannot give).
local function own_pool(ctx, max, extra)
  local sandbox = require('mayura.sandbox')
  local provider = ctx.provider or ctx.sandbox._pool.provider
  local kinds = provider.features and provider.features.network or {}
  local offline = false
  for _, k in ipairs(kinds) do offline = offline or k == 'none' end
  local options = { max_sandboxes = max or 1, max_lifetime_ms = 600000 }
  for k, v in pairs(extra or {}) do options[k] = v end
  if offline or not kinds[1] then
    return sandbox.create_sandboxes(provider, options)
  end
  local kind = kinds[1]
  options.network = { kind }
  local pool = sandbox.create_sandboxes(provider, options)
  local create = pool.create
  pool.create = function(self, o)
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    if c.network == nil then c.network = kind end
    return create(self, c)
  end
  return pool
end

local cases = {}

local function case(name, run)
  cases[#cases + 1] = { name = name, run = run }
end

case('exec runs a command and returns its output', function(ctx)
  local r = ctx.sandbox:exec({ 'echo', 'hello' })
  equal(0, r.exit_code, 'exit_code')
  equal('hello\n', r.stdout, 'stdout')
  equal(false, r.timed_out, 'timed_out')
  equal(false, r.truncated, 'truncated')
  expect(type(r.duration_ms) == 'number' and r.duration_ms >= 0, 'duration_ms is not a number')
end)

case('exec passes arguments without a shell', function(ctx)
  local r = ctx.sandbox:exec({ 'echo', '$HOME', '*', '; exit 3', '"q"' })
  equal(0, r.exit_code, 'exit_code')
  equal('$HOME * ; exit 3 "q"\n', r.stdout, 'stdout')
end)

case('exec reports exit codes and stderr', function(ctx)
  local r = sh(ctx.sandbox, 'echo out; echo oops >&2; exit 3')
  equal(3, r.exit_code, 'exit_code')
  equal('out\n', r.stdout, 'stdout')
  equal('oops\n', r.stderr, 'stderr')
  r = ctx.sandbox:exec({ 'false' })
  equal(1, r.exit_code, 'exit_code of false')
end)

case('exec feeds standard input', function(ctx)
  local sb = ctx.sandbox
  if not sb.features.stdin then
    raises('INVALID_INPUT', nil, sb.exec, sb, { 'cat' }, { stdin = 'x' })
    return
  end
  local data = string.rep('line of input\n', 20000)
  local r = sb:exec({ 'wc', '-c' }, { stdin = data })
  equal(0, r.exit_code, 'exit_code')
  equal(tostring(#data), r.stdout:match('%d+'), 'bytes the command read')
  r = sb:exec({ 'cat' }, { stdin = 'first\0second\n' })
  equal('first\0second\n', r.stdout, 'stdin echoed')
end)

case('exec uses cwd and env', function(ctx)
  local sb = ctx.sandbox
  sb:write_file('conformance/cwd/marker.txt', 'here')
  local r = sh(sb, 'cat marker.txt; echo " $GREETING"', { cwd = 'conformance/cwd', env = { GREETING = 'hi there' } })
  equal(0, r.exit_code, 'exit_code')
  equal('here hi there\n', r.stdout, 'stdout')
end)

case('a timeout stops the command and everything it started', function(ctx)
  local sb = ctx.sandbox
  local r = sh(sb, 'sleep 61 & setsid sleep 62 >/dev/null 2>&1 </dev/null & sleep 63', { timeout_ms = 500 })
  equal(true, r.timed_out, 'timed_out')
  equal(nil, r.exit_code, 'exit_code')
  for _ = 1, 50 do
    if not running(sb, 'sleep 61') and not running(sb, 'sleep 62') and not running(sb, 'sleep 63') then break end
    task.sleep(50)
  end
  expect(not running(sb, 'sleep 61'), 'a child outlived the timeout')
  expect(not running(sb, 'sleep 62'), 'a setsid child outlived the timeout')
  equal('ok\n', sh(sb, 'echo ok').stdout, 'a command after the timeout')
end)

case('a process started with setsid outlives its command', function(ctx)
  local sb = ctx.sandbox
  local r = sh(sb, 'setsid sleep 64 >/dev/null 2>&1 </dev/null & echo started')
  equal(0, r.exit_code, 'exit_code')
  equal('started\n', r.stdout, 'stdout')
  task.sleep(100)
  expect(running(sb, 'sleep 64'), 'the setsid process did not survive its command')
  sh(sb, 'for p in /proc/[0-9]*; do if tr "\\000" " " < $p/cmdline 2>/dev/null | grep -q "^sleep 64"; then ' ..
    'kill -9 ${p#/proc/}; fi; done')
end)

case('output beyond max_output_bytes is dropped and truncated is set', function(ctx)
  local sb = ctx.sandbox
  local cap = sb._pool.max_output_bytes
  local r = sh(sb, 'head -c ' .. (cap + 4096) .. ' /dev/zero | tr "\\000" a; head -c 10 /dev/zero | tr "\\000" b >&2')
  equal(0, r.exit_code, 'exit_code')
  equal(cap, #r.stdout, 'bytes of stdout kept')
  equal(true, r.truncated, 'truncated')
  equal('bbbbbbbbbb', r.stderr, 'stderr')
end)

case('cancelling stops the command and fails with CANCELLED', function(ctx)
  local sb = ctx.sandbox
  local token = task.cancel_token()
  task.after(200, function() token:cancel() end)
  raises('CANCELLED', nil, sh, sb, 'sleep 65', { signal = token, timeout_ms = 20000 })
  for _ = 1, 50 do
    if not running(sb, 'sleep 65') then break end
    task.sleep(50)
  end
  expect(not running(sb, 'sleep 65'), 'the cancelled command is still running')
end)

case('binary files round trip', function(ctx)
  local sb = ctx.sandbox
  local bytes = {}
  for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
  local data = table.concat(bytes):rep(64)
  sb:write_file('conformance/binary.bin', data)
  local back = sb:read_file('conformance/binary.bin')
  expect(back == data, 'the bytes read differ from the bytes written')
  local r = sb:exec({ 'wc', '-c', 'conformance/binary.bin' })
  expect(r.stdout:match('^%s*(%d+)') == tostring(#data), 'the command saw %s bytes', r.stdout)
end)

case('missing files read and list as nil', function(ctx)
  local sb = ctx.sandbox
  equal(nil, sb:read_file('conformance/no/such/file'), 'read_file of a missing file')
  equal(nil, sb:list_files('conformance/no/such/dir'), 'list_files of a missing directory')
end)

case('write_file creates directories and replaces files', function(ctx)
  local sb = ctx.sandbox
  sb:write_file('conformance/deep/a/b/c.txt', 'first')
  sb:write_file('conformance/deep/a/b/c.txt', 'second')
  equal('second', sb:read_file('conformance/deep/a/b/c.txt'), 'content')
  local entries = sb:list_files('conformance/deep/a')
  expect(entries and #entries == 1, 'expected one entry in conformance/deep/a')
  equal('b', entries[1].name, 'name')
  equal('directory', entries[1].type, 'type')
  local abs = sb:read_file(sb._workdir .. '/conformance/deep/a/b/c.txt')
  equal('second', abs, 'the same file by its absolute path')
end)

case('remove_file needs recursive for a directory with files', function(ctx)
  local sb = ctx.sandbox
  sb:write_file('conformance/tree/x/y.txt', 'y')
  sb:write_file('conformance/tree/z.txt', 'z')
  local ok = pcall(sb.remove_file, sb, 'conformance/tree')
  expect(not ok, 'removing a non-empty directory without recursive succeeded')
  expect(sb:read_file('conformance/tree/z.txt') == 'z', 'a refused remove changed the directory')
  sb:remove_file('conformance/tree/z.txt')
  equal(nil, sb:read_file('conformance/tree/z.txt'), 'removed file')
  sb:remove_file('conformance/tree', { recursive = true })
  equal(nil, sb:list_files('conformance/tree'), 'removed directory')
end)

case('list_files gives names, types, sizes and times', function(ctx)
  local sb = ctx.sandbox
  sb:write_file('conformance/list/file.txt', '12345')
  sb:write_file('conformance/list/sub/inner.txt', 'x')
  sh(sb, 'ln -s file.txt conformance/list/link')
  local entries = sb:list_files('conformance/list')
  expect(entries ~= nil, 'no listing')
  local by = {}
  for _, e in ipairs(entries) do by[e.name] = e end
  expect(by['file.txt'] and by['sub'] and by['link'], 'entries missing from the listing')
  equal('file', by['file.txt'].type, 'type of file.txt')
  equal(5, by['file.txt'].size, 'size of file.txt')
  equal('directory', by['sub'].type, 'type of sub')
  equal('symlink', by['link'].type, 'type of link')
  local now = os.time() * 1000
  local m = by['file.txt'].modified
  expect(type(m) == 'number' and math.abs(m - now) < 86400000, 'modified is not in ms since the epoch: %s', tostring(m))
end)

case('read_file refuses files larger than max_bytes', function(ctx)
  local sb = ctx.sandbox
  sb:write_file('conformance/ten.txt', '0123456789')
  equal('0123456789', sb:read_file('conformance/ten.txt', { max_bytes = 10 }), 'a file of exactly max_bytes')
  raises('LIMIT_EXCEEDED', nil, sb.read_file, sb, 'conformance/ten.txt', { max_bytes = 9 })
end)

case('commands and file calls see the same files', function(ctx)
  local sb = ctx.sandbox
  sh(sb, 'mkdir -p conformance/shared && printf made-by-exec > conformance/shared/out.txt')
  equal('made-by-exec', sb:read_file('conformance/shared/out.txt'), 'file written by a command')
  sb:write_file('conformance/shared/in.txt', 'made-by-write')
  equal('made-by-write', sh(sb, 'cat conformance/shared/in.txt').stdout, 'file read by a command')
end)

case('the pool refuses sandboxes past max_sandboxes', function(ctx)
  local pool = own_pool(ctx, 1)
  local first = pool:create({ lifetime_ms = 60000 })
  local ok, err = pcall(pool.create, pool, { lifetime_ms = 60000 })
  first:release()
  local again = pool:create({ lifetime_ms = 60000 })
  again:release()
  pool:close()
  expect(not ok, 'a second sandbox was created past max_sandboxes = 1')
  equal('LIMIT_EXCEEDED', errors.is(err) and err.code, 'error code')
end)

case('after its lifetime every call fails with gone', function(ctx)
  local pool = own_pool(ctx, 1)
  local sb = pool:create({ lifetime_ms = 1000 })
  equal('alive\n', sb:exec({ 'echo', 'alive' }).stdout, 'stdout before the lifetime')
  task.sleep(1300)
  raises('SANDBOX_ERROR', 'gone', sb.exec, sb, { 'echo', 'late' })
  raises('SANDBOX_ERROR', 'gone', sb.read_file, sb, 'x')
  raises('SANDBOX_ERROR', 'gone', sb.write_file, sb, 'x', 'y')
  raises('SANDBOX_ERROR', 'gone', sb.list_files, sb, '.')
  raises('SANDBOX_ERROR', 'gone', sb.remove_file, sb, 'x')
  sb:release()
  pool:close()
end)

case('after release every call fails with gone, and release again does nothing', function(ctx)
  local pool = own_pool(ctx, 1)
  local sb = pool:create({ lifetime_ms = 60000 })
  sb:write_file('x.txt', 'x')
  sb:release()
  sb:release()
  raises('SANDBOX_ERROR', 'gone', sb.exec, sb, { 'true' })
  raises('SANDBOX_ERROR', 'gone', sb.read_file, sb, 'x.txt')
  local again = pool:create({ lifetime_ms = 60000 })
  equal(nil, again:read_file('x.txt'), 'a new sandbox sees a released one\'s file')
  again:release()
  pool:close()
end)

case('a desktop, when the provider has one, is seen and used', function(ctx)
  local sb = ctx.sandbox
  local pool = own_pool(ctx)
  if not sb.features.desktop then
    raises('INVALID_INPUT', nil, pool.create, pool, { lifetime_ms = 60000, desktop = true })
    pool:close()
    return
  end
  local ok, err = pcall(function()
    local d = pool:create({ lifetime_ms = 60000, desktop = true }).desktop
    expect(type(d) == 'table', 'a sandbox created with desktop = true has no desktop')
    local size = d:size()
    local png = d:screenshot()
    local function u32(i)
      local a, b, c, e = png:byte(i, i + 3)
      return ((a * 256 + b) * 256 + c) * 256 + e
    end
    equal(size.width, u32(17), 'the screenshot\'s width')
    equal(size.height, u32(21), 'the screenshot\'s height')
    d:move({ x = math.floor(size.width / 2), y = math.floor(size.height / 2) })
    d:click({})
    d:scroll({ direction = 'down' })
    d:type('a')
    d:key('Escape')
    local vok, url = pcall(d.view_url, d)
    expect(vok and type(url) == 'string' or errors.is(url, 'INVALID_INPUT'),
      'view_url gives a URL or says there is none: %s', tostring(url))
  end)
  pool:close()
  if not ok then error(err, 0) end
end)

case('a snapshot starts new sandboxes with the same files, within the pool\'s limits', function(ctx)
  local sb = ctx.sandbox
  if not sb.features.snapshots then
    raises('INVALID_INPUT', nil, sb.snapshot, sb)
    return
  end
  local pool = own_pool(ctx, 2, { max_snapshots = 1 })
  local other = own_pool(ctx, 1)
  local ok, err = pcall(function()
    local base = pool:create({ lifetime_ms = 120000 })
    base:write_file('snap/a.txt', 'one')
    local r = sh(base, 'cd snap && mkdir d && chmod 700 d && printf x > run && chmod 751 run && ln -s a.txt link && '
      .. 'ln -s /etc out')
    equal(0, r.exit_code, 'exit_code of making the files')
    local snap = base:snapshot()
    expect(type(snap.id) == 'string' and snap.id ~= '', 'the snapshot has no id')
    -- (a provider's own snapshot may have no size the service says: 0)
    expect(type(snap.size_bytes) == 'number' and (snap.size_bytes > 0
      or (sb.features.snapshots == 'native' and snap.size_bytes == 0)), 'the snapshot has no size_bytes')
    equal(pool.provider.id, snap.provider, 'the snapshot\'s provider')
    raises('LIMIT_EXCEEDED', nil, base.snapshot, base)
    base:release()
    local fork = pool:create({ lifetime_ms = 120000, snapshot = snap })
    equal('one', fork:read_file('snap/a.txt'), 'a file of the snapshot')
    equal('700 751\n', sh(fork, 'cd snap && echo $(stat -c %a d run)').stdout, 'modes')
    equal('a.txt /etc\n', sh(fork, 'cd snap && echo $(readlink link) $(readlink out)').stdout, 'link targets')
    local types = {}
    for _, e in ipairs(fork:list_files('snap')) do types[e.name] = e.type end
    equal('symlink', types.out, 'the type of a link out of the sandbox')
    fork:write_file('snap/a.txt', 'two')
    local again = pool:create({ lifetime_ms = 120000, snapshot = snap })
    equal('one', again:read_file('snap/a.txt'), 'a second sandbox from the snapshot')
    raises('INVALID_INPUT', nil, other.create, other, { lifetime_ms = 60000, snapshot = snap })
    snap:release()
    again:release()
    raises('INVALID_INPUT', nil, pool.create, pool, { lifetime_ms = 60000, snapshot = snap })
    local kept = fork:snapshot()
    pool:close()
    expect(kept._released, 'close() did not release the pool\'s snapshot')
  end)
  pool:close()
  other:close()
  if not ok then error(err, 0) end
end)

--- The cases, each `{ name, run }`; `run(ctx)` returns 'passed' or what failed.
M.sandbox_conformance = {}
for i, c in ipairs(cases) do
  M.sandbox_conformance[i] = {
    name = c.name,
    run = function(ctx)
      if type(ctx) ~= 'table' or type(ctx.sandbox) ~= 'table' then
        return 'the case needs { sandbox = ... }'
      end
      local ok, err = pcall(c.run, ctx)
      if ok then return 'passed' end
      if type(err) == 'table' and err.conformance then return err.conformance end
      return 'raised ' .. tostring(err)
    end,
  }
end

return M
