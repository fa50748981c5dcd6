-- Snapshots and forks (sandbox:snapshot(), create{ snapshot }) on every provider that runs here
-- (support/providers.lua: local, Docker with the CLI and the Engine API, the generic way through
-- the agent) and on the command backend over local sandboxes (the generic way through short
-- commands): a fork has exactly the files of its snapshot (contents, modes, links, times, in the
-- working directory and /tmp), is its own copy, and can be made many times and after the source
-- was released; a link out of the sandbox stays a link and what it points to is not taken; the
-- pool's max_snapshots and max_snapshot_bytes hold at their edges, leaving nothing past them;
-- another pool's, a released or a made-up snapshot is INVALID_INPUT; close() releases them (these
-- four, the pool's own, once per kind of provider: local, Docker); a fork without room for the
-- files fails and leaves no sandbox.
local task = require('mayura._task')
local providers = require('support.providers')
local transports = require('support.command_transports')

local MIB = 1048576

-- Everything under the given directories (relative to /), one line each, sorted: name, mode,
-- and a link's target, a directory's time, or a file's size, time, type and digest. The
-- backends' own names under /tmp (.mayura-*) are left out.
local MANIFEST = [=[
cd / || exit 1
find "$@" -mindepth 1 ! -path 'tmp/.mayura-*' | sort | while IFS= read -r p; do
  if [ -h "$p" ]; then
    printf '%s|%s|link|%s\n' "$p" "$(stat -c '%a' "$p")" "$(readlink "$p")"
  elif [ -d "$p" ]; then
    printf '%s|%s|dir|%s\n' "$p" "$(stat -c '%a' "$p")" "$(stat -c '%Y' "$p")"
  elif [ -p "$p" ]; then
    printf '%s|%s|fifo|%s\n' "$p" "$(stat -c '%a' "$p")" "$(stat -c '%Y' "$p")"
  else
    printf '%s|%s|%s|%s\n' "$p" "$(stat -c '%a|%s|%Y|%F' "$p")" "$(md5sum < "$p")"
  fi
done
]=]

-- A tree of what a prepared repository holds, in the working directory and /tmp.
local PREPARE = [=[
set -e
mkdir -p src/deep/er empty ro/inner /tmp/cache/x
printf '#!/bin/sh\necho run\n' > src/run.sh
chmod 751 src/run.sh
printf 'secret' > src/private
chmod 600 src/private
printf 'a b' > "src/with space 'quoted'"
printf 'hidden' > .hidden
printf 'x' > src/deep/er/file
touch -d '2020-01-02 03:04:05' src/deep/er/file
head -c 300000 /dev/urandom > src/blob.bin
ln -s run.sh src/rel-link
ln -s ../../nowhere src/dangling
ln src/run.sh src/hard
mkfifo src/pipe
echo inner > ro/inner/f
chmod 555 ro/inner
chmod 500 ro
chmod 700 empty
printf 'in tmp' > /tmp/in-tmp
ln -s "$PWD/src" /tmp/to-src
n=x
for i in 1 2 3 4 5 6 7; do n="$n$n"; done
mkdir -p "long/$n/$n"
echo deep > "long/$n/$n/file"
chmod 555 "long/$n/$n" "long/$n"
touch -d '2019-05-06 07:08:09' src/deep src
]=]

local function sh(sb, script, ...)
  local argv = { 'sh', '-c', script, 'sh', ... }
  local r = sb:exec(argv)
  assert.are.equal(0, r.exit_code, 'the command failed: ' .. r.stderr)
  return r.stdout
end

local function manifest(sb)
  return sh(sb, MANIFEST, sb._workdir:sub(2), 'tmp')
end

local function prepare(sb)
  sh(sb, PREPARE)
end

-- The cases on a provider's pools: `make_pool(opts)` (opts: the pool's and the provider's options),
-- `o.limits`: also the pool's limits, refusals and failures (they are the pool's, the same on all;
-- `o.pool_limits`: the four that are the pool's alone, run on the first provider of each kind).
local function cases(make_pool, o)
  local pools = {}
  local function pool(opts)
    local p = make_pool(opts or {})
    pools[#pools + 1] = p
    return p
  end
  after_each(function()
    for _, p in ipairs(pools) do p:close() end
    pools = {}
  end)

  it('a fork has exactly the snapshot\'s files, modes, links and times, and is its own copy', function()
    local p = pool({ max_sandboxes = 3 })
    local base = p:create({ lifetime_ms = 120000 })
    prepare(base)
    local want = manifest(base)
    assert.truthy(want:find('ro|500|dir', 1, true))
    local snap = base:snapshot()
    assert.are.equal('string', type(snap.id))
    assert.are.equal(p.provider.id, snap.provider)
    assert.is_true(snap.size_bytes > 300000 and snap.size_bytes < 2 * MIB)
    assert.are.same({ 1, snap.size_bytes }, { p:snapshots() })
    local fork = p:create({ lifetime_ms = 120000, snapshot = snap })
    assert.are.equal(want, manifest(fork))
    assert.are.equal('secret', fork:read_file('src/private'))
    assert.are.equal('run\n', sh(fork, './src/rel-link'))
    local by = {}
    for _, e in ipairs(fork:list_files('src')) do by[e.name] = e.type end
    assert.are.equal('symlink', by['rel-link'])
    assert.are.equal('other', by['pipe'])
    -- the hard link is one file again
    assert.are.equal(sh(fork, 'stat -c %i src/run.sh'), sh(fork, 'stat -c %i src/hard'))
    -- nothing of the restore is left in the fork's /tmp
    assert.are.equal('', sh(fork, 'ls -A /tmp | grep "^.mayura-restore" || true'))
    -- each its own: a change in the fork is not in the source, and the other way round
    fork:write_file('src/private', 'changed')
    base:write_file('src/new', 'new')
    assert.are.equal('secret', base:read_file('src/private'))
    assert.is_nil(fork:read_file('src/new'))
  end)

  it('a snapshot serves many creates, also after its sandbox was released', function()
    local p = pool({ max_sandboxes = 3 })
    local base = p:create({ lifetime_ms = 120000 })
    base:write_file('repo/answer.txt', '41')
    base:write_file('repo/odd\nname', 'newline')
    base:write_file('/tmp/state', 'kept')
    local snap = base:snapshot()
    base:release()
    local forks = {}
    for i = 1, 3 do
      forks[i] = p:create({ lifetime_ms = 120000, snapshot = snap, env = { N = tostring(i) } })
    end
    for i, f in ipairs(forks) do
      assert.are.equal('41', f:read_file('repo/answer.txt'))
      assert.are.equal('newline', f:read_file('repo/odd\nname'))
      assert.are.equal('kept', f:read_file('/tmp/state'))
      assert.are.equal(tostring(i) .. '\n', sh(f, 'echo $N'))
      f:write_file('repo/answer.txt', tostring(i))
    end
    forks[1]:release()
    assert.are.equal('2', forks[2]:read_file('repo/answer.txt'))
    local again = p:create({ lifetime_ms = 120000, snapshot = snap })
    assert.are.equal('41', again:read_file('repo/answer.txt'))
  end)

  it('a link out of the sandbox stays a link, and what it points to is not in the snapshot', function()
    local p = pool({ max_sandboxes = 2 })
    local base = p:create({ lifetime_ms = 120000 })
    -- a large file the sandbox can read but not write: its tar program (BusyBox's sh names an applet
    -- without its path)
    local tar = sh(base, 'for c in "$(command -v tar)" /bin/busybox; do [ -f "$c" ] && exec readlink -f "$c"; done')
      :gsub('%s+$', '')
    local tar_size = tonumber((sh(base, 'wc -c < "$1"', tar):match('%d+')))
    assert.is_true(tar_size > 100000)
    sh(base, 'ln -s "$1" out-file && ln -s /etc out-dir && ln -s ../../../../../etc/passwd up && ' ..
      'ln -s /workspace/nowhere/../../etc loop', tar)
    local snap = base:snapshot()
    assert.is_true(snap.size_bytes < tar_size)
    local fork = p:create({ lifetime_ms = 120000, snapshot = snap })
    assert.are.equal(tar .. '\n/etc\n../../../../../etc/passwd\n/workspace/nowhere/../../etc\n',
      sh(fork, 'for l in out-file out-dir up loop; do readlink "$l"; done'))
    for _, e in ipairs(fork:list_files('.')) do assert.are.equal('symlink', e.type) end
  end)

  it('restore puts a sandbox back to a snapshot, emptying what came after', function()
    local p = pool({ max_sandboxes = 2 })
    local sb = p:create({ lifetime_ms = 120000 })
    prepare(sb)
    local want = manifest(sb)
    local snap = sb:snapshot()
    sh(sb, 'echo changed > src/private; rm -rf src/deep; mkdir -p new/ro && chmod 500 new/ro new; ' ..
      'echo x > /tmp/extra; ln -s /etc out; chmod 700 ro')
    sb:restore(snap)
    assert.are.equal(want, manifest(sb))
    local other = p:create({ lifetime_ms = 120000 })
    other:write_file('mine.txt', 'mine')
    other:restore(snap)
    assert.are.equal(want, manifest(other))
    snap:release()
    assert.raises_code('INVALID_INPUT', sb.restore, sb, snap)
    assert.raises_code('INVALID_INPUT', sb.restore, sb, {})
  end)

  if not o.limits then return end
  local pool_it = o.pool_limits and it or function() end

  pool_it('holds max_snapshots at its edge, also for snapshots made at once', function()
    local p = pool({ max_sandboxes = 1, max_snapshots = 2 })
    local base = p:create({ lifetime_ms = 120000 })
    base:write_file('a.txt', 'a')
    local first, second = base:snapshot(), base:snapshot()
    assert.raises_code('LIMIT_EXCEEDED', base.snapshot, base)
    assert.are.equal(2, (p:snapshots()))
    first:release()
    first:release()
    local third = base:snapshot()
    assert.are.same({ 2, second.size_bytes + third.size_bytes }, { p:snapshots() })
    second:release()
    third:release()
    assert.are.same({ 0, 0 }, { p:snapshots() })
    -- two at once with one slot left: one is made, the other refused
    local keep = base:snapshot()
    local a = task.spawn(function() return pcall(base.snapshot, base) end)
    local b = task.spawn(function() return pcall(base.snapshot, base) end)
    local ok_a, res_a = a:wait()
    local ok_b, res_b = b:wait()
    assert.is_true(ok_a ~= ok_b)
    assert.are.equal('LIMIT_EXCEEDED', (ok_a and res_b or res_a).code)
    assert.are.same({ 2, keep.size_bytes * 2 }, { p:snapshots() })
    local none = pool({ max_sandboxes = 1, max_snapshots = 0 })
    local sb = none:create({ lifetime_ms = 60000 })
    assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
  end)

  pool_it('holds max_snapshot_bytes at its edge, keeping nothing past it', function()
    local function filled(p)
      local sb = p:create({ lifetime_ms = 120000 })
      sh(sb, 'head -c 100000 /dev/zero > data.bin')
      return sb
    end
    local probe = pool({ max_sandboxes = 1 })
    local size = filled(probe):snapshot().size_bytes
    local p = pool({ max_sandboxes = 1, max_snapshot_bytes = 2 * size })
    local sb = filled(p)
    local first = sb:snapshot()
    local second = sb:snapshot()
    assert.are.equal(size, first.size_bytes)
    assert.are.same({ 2, 2 * size }, { p:snapshots() })
    local err = assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
    assert.truthy(err.message:find('max_snapshot_bytes', 1, true))
    assert.are.same({ 2, 2 * size }, { p:snapshots() })
    second:release()
    assert.are.equal(size, sb:snapshot().size_bytes)
    first:release()
    local short = pool({ max_sandboxes = 1, max_snapshot_bytes = size - 1 })
    local s2 = filled(short)
    assert.raises_code('LIMIT_EXCEEDED', s2.snapshot, s2)
    assert.are.same({ 0, 0 }, { short:snapshots() })
    -- the sandbox is as it was: nothing was written into it
    assert.are.equal('data.bin\n', sh(s2, 'ls -A'))
    assert.are.equal('', sh(s2, 'ls -A /tmp | grep "^.mayura-" || true'))
  end)

  pool_it('refuses another pool\'s snapshot, a released one and anything else, creating nothing', function()
    local p = pool({ max_sandboxes = 2 })
    local other = pool({ max_sandboxes = 1 })
    local theirs = other:create({ lifetime_ms = 60000 }):snapshot()
    local mine = p:create({ lifetime_ms = 60000 }):snapshot()
    mine:release()
    local fake = {}
    for k, v in pairs(theirs) do fake[k] = v end
    for _, bad in ipairs({ theirs, mine, fake, 'snapshot-1', 42 }) do
      assert.raises_code('INVALID_INPUT', p.create, p, { lifetime_ms = 60000, snapshot = bad })
    end
    assert.are.equal(1, p:count())
    assert.are.same({ 0, 0 }, { p:snapshots() })
    -- a snapshot of a closed pool is that pool's still
    other:close()
    assert.is_true(theirs._released)
    assert.raises_code('INVALID_INPUT', p.create, p, { lifetime_ms = 60000, snapshot = theirs })
  end)

  pool_it('close releases every snapshot', function()
    local p = make_pool({ max_sandboxes = 1 })
    local sb = p:create({ lifetime_ms = 60000 })
    sb:write_file('a', 'a')
    local s1, s2 = sb:snapshot(), sb:snapshot()
    p:close()
    assert.are.same({ 0, 0 }, { p:snapshots() })
    assert.is_true(s1._released and s2._released)
    assert.is_nil(s1._held)
    s1:release()
    assert.raises_code('SANDBOX_ERROR', p.create, p, { lifetime_ms = 60000, snapshot = s2 })
  end)

  it('a released sandbox, or a file its user cannot read, makes no snapshot', function()
    local p = pool({ max_sandboxes = 2 })
    local sb = p:create({ lifetime_ms = 60000 })
    sb:write_file('locked', 'x')
    sh(sb, 'chmod 000 locked')
    local err = assert.raises_code('SANDBOX_ERROR', sb.snapshot, sb)
    assert.are.equal('failed', err.reason)
    assert.are.same({ 0, 0 }, { p:snapshots() })
    sb:release()
    err = assert.raises_code('SANDBOX_ERROR', sb.snapshot, sb)
    assert.are.equal('gone', err.reason)
  end)

  it('a fork without room for the files fails and leaves no sandbox; the snapshot stays', function()
    local label = 'snap' .. math.random(1, 1e9)
    local p = pool({ max_sandboxes = 2, tmp_mib = 32, workspace_mib = 32, labels = { ['mayura.spec'] = label } })
    local base = p:create({ lifetime_ms = 120000 })
    sh(base, 'head -c 24000000 /dev/urandom > big.bin')
    local sum = sh(base, 'md5sum < big.bin')
    local snap = base:snapshot()
    base:release()
    if base.features.snapshots == 'native' and o.kind == 'local' then
      -- a native local fork's files are the snapshot's (an overlay's lower layer), not its memory:
      -- it starts in 16 MiB
      local small = p:create({ lifetime_ms = 60000, snapshot = snap, memory_mib = 16 })
      assert.are.equal(sum, sh(small, 'md5sum < big.bin'))
      return
    end
    -- 24 MB of files (tmpfs, counted as memory) in a sandbox of 16 MiB of memory
    local err = select(2, pcall(p.create, p, { lifetime_ms = 60000, snapshot = snap, memory_mib = 16 }))
    assert.truthy(err.code == 'SANDBOX_ERROR' or err.code == 'LIMIT_EXCEEDED', tostring(err))
    assert.truthy(err.message:find('snapshot', 1, true), err.message)
    assert.are.equal(0, p:count())
    if o.kind == 'docker' then
      assert.are.equal('', providers.host('docker ps -aq --filter label=mayura.spec=' .. label))
    end
    assert.are.same({ 1, snap.size_bytes }, { p:snapshots() })
    local fork = p:create({ lifetime_ms = 60000, snapshot = snap })
    assert.are.equal(sum, sh(fork, 'md5sum < big.bin'))
  end)
end

local kinds_seen = {}
for _, entry in ipairs(providers.list()) do
  local first_of_kind = not kinds_seen[entry.kind]
  kinds_seen[entry.kind] = true
  describe('snapshots on ' .. entry.name, function()
    cases(function(opts)
      local pool = entry.make_pool(opts)
      return pool
    end, { limits = true, pool_limits = first_of_kind, kind = entry.kind })
  end)
end

describe('snapshots on the command backend (through short commands)', function()
  local provider
  setup(function() provider = transports.command_provider({ stdin = true, max_command_bytes = 65536 }) end)
  teardown(function() if provider then provider.pool:close() end end)
  cases(function(opts)
    local pool_opts = { max_sandboxes = opts.max_sandboxes or 2, max_lifetime_ms = 600000 }
    return require('mayura.sandbox').create_sandboxes(provider, pool_opts)
  end, { limits = false })
end)

describe('features.snapshots', function()
  it('is generic unless a provider says otherwise, and false refuses snapshot()', function()
    local sandbox = require('mayura.sandbox')
    local dir = require('support.dir_provider')
    local p = sandbox.create_sandboxes(dir.dir_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = p:create({ lifetime_ms = 60000 })
    assert.is_false(sb.features.snapshots)
    local err = assert.raises_code('INVALID_INPUT', sb.snapshot, sb)
    assert.truthy(err.message:find('no snapshots', 1, true))
    p:close()
    for _, entry in ipairs(providers.list()) do
      local pool = entry.make_pool({ max_sandboxes = 1 })
      -- local run as root (its launcher mounts the sandbox's file systems) and Docker make their own
      local own = entry.kind == 'docker' or entry.name == 'local' and pool.provider.staged
      assert.are.equal(own and 'native' or 'generic', pool:create({ lifetime_ms = 60000 }).features.snapshots)
      pool:close()
    end
  end)

  it('checks max_snapshots and max_snapshot_bytes where the pool is made', function()
    local sandbox = require('mayura.sandbox')
    local dir = require('support.dir_provider')
    for _, bad in ipairs({ { max_snapshots = -1 }, { max_snapshots = 1.5 }, { max_snapshot_bytes = 'x' },
      { max_snapshot_bytes = 65536 * MIB + 1 } }) do
      bad.max_sandboxes, bad.max_lifetime_ms = 1, 60000
      assert.raises_code('INVALID_CONFIG', sandbox.create_sandboxes, dir.dir_sandboxes(), bad)
    end
    local p = sandbox.create_sandboxes(dir.dir_sandboxes(), { max_sandboxes = 1, max_lifetime_ms = 60000 })
    assert.are.equal(16, p.max_snapshots)
    assert.are.equal(1024 * MIB, p.max_snapshot_bytes)
    p:close()
  end)
end)

describe('the tools\' checkpoints (workspace.checkpoint, workspace.restore)', function()
  local mayura = require('mayura')
  local sandbox = require('mayura.sandbox')
  local testing = require('mayura.testing')
  local z = mayura.z
  local GRANTS = { 'model:scripted', 'effect:read', 'effect:write', 'tool:workspace.write', 'tool:workspace.exec',
    'tool:workspace.read', 'tool:workspace.checkpoint', 'tool:workspace.restore', 'sandbox:workspace:write',
    'sandbox:workspace:exec', 'sandbox:workspace:read', 'sandbox:workspace:snapshot' }

  -- A run of a model that makes `calls` one at a time (keeping each result) in a sandbox of `pool`.
  local function run(pool, calls, grants)
    local per_run = sandbox.sandbox_per_run(pool, { lifetime_ms = 120000 })
    local tools = sandbox.sandbox_tools(per_run.source, { name = 'workspace', exec = true, write = true,
      snapshots = true })
    local release = mayura.define_hook({ id = 'release', version = '1', stage = 'on_finally', timeout_ms = 30000,
      handler = function(_, context) per_run.release(context.run_id) end })
    local results, steps = {}, {}
    for i, c in ipairs(calls) do
      steps[i] = function(request)
        if i > 1 then results[i - 1] = request.messages[#request.messages].result end
        return { type = 'tool_calls', usage = { cost_micros = 0 },
          calls = { { id = 'c' .. i, tool_id = 'workspace.' .. c[1], input = c[2] } } }
      end
    end
    steps[#steps + 1] = function(request)
      results[#calls] = request.messages[#request.messages].result
      return { type = 'final', output = { summary = 'done' }, usage = { cost_micros = 0 } }
    end
    local agent = mayura.define_agent({ id = 'coder', version = '1', instructions = 'Try it.', tools = tools,
      model = testing.scripted_model(steps), hooks = { release },
      input = z.object({ task = z.string() }), output = z.object({ summary = z.string() }) })
    local runtime = mayura.create_runtime({ profile = 'ephemeral', permissions = { allow = grants or GRANTS } })
    local outcome = runtime:submit(agent, { input = { task = 't' } }):result()
    runtime:close()
    return outcome, results
  end

  it('a model saves the workspace, breaks it, goes back, and its checkpoints end with the run', function()
    local pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes(),
      { max_sandboxes = 1, max_lifetime_ms = 600000, max_snapshots = 2 })
    local outcome, results = run(pool, {
      { 'exec', { command = 'mkdir -p src && echo v1 > src/a.txt && chmod 640 src/a.txt && ln -s a.txt src/l' } },
      { 'checkpoint', {} },
      { 'exec', { command = 'echo v2 > src/a.txt; rm src/l; mkdir -p junk/ro; chmod 500 junk/ro junk; '
        .. 'echo t > /tmp/t; ln -s /etc src/etc' } },
      { 'restore', { checkpoint = 'checkpoint-1' } },
      { 'exec', { command = 'cat src/a.txt; stat -c %a src/a.txt; readlink src/l; ls -A; ls -A src /tmp' } },
      { 'checkpoint', {} },
      { 'checkpoint', {} },
      { 'restore', { checkpoint = 'checkpoint-9' } },
      { 'restore', { checkpoint = 'checkpoint-2', drop = true } },
      { 'checkpoint', {} },
    })
    assert.are.equal('succeeded', outcome.status, outcome.error and tostring(outcome.error))
    assert.are.equal('checkpoint-1', results[2].checkpoint)
    assert.is_true(results[2].size_bytes > 0)
    assert.is_true(results[4].restored)
    assert.are.equal('v1\n640\na.txt\nsrc\n/tmp:\n\nsrc:\na.txt\nl\n', results[5].stdout)
    assert.are.equal('checkpoint-2', results[6].checkpoint)
    -- past the pool's max_snapshots, and a checkpoint that is not there: the model is told
    assert.are.equal('LIMIT_EXCEEDED', results[7].error.code)
    assert.are.equal('NOT_FOUND', results[8].error.code)
    assert.is_true(results[9].dropped)
    assert.are.equal('checkpoint-3', results[10].checkpoint)
    -- the run's sandbox is released, and its checkpoints with it
    assert.are.equal(0, pool:count())
    assert.are.same({ 0, 0 }, { pool:snapshots() })
    pool:close()
  end)

  it('needs the grant sandbox:<name>:snapshot', function()
    local pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes(),
      { max_sandboxes = 1, max_lifetime_ms = 600000 })
    local grants = {}
    for _, g in ipairs(GRANTS) do if g ~= 'sandbox:workspace:snapshot' then grants[#grants + 1] = g end end
    local outcome = run(pool, { { 'checkpoint', {} } }, grants)
    assert.are.equal('blocked', outcome.status)
    assert.are.equal('PERMISSION_DENIED', outcome.error.code)
    assert.are.same({ 0, 0 }, { pool:snapshots() })
    pool:close()
  end)
end)

describe('a provider\'s own (native) snapshots, through the pool', function()
  local sandbox = require('mayura.sandbox')
  local dir = require('support.dir_provider')

  -- The host-directory provider with snapshots of its own: each a token the pool must pass to its
  -- create and release once.
  local function native_provider()
    local p = dir.dir_sandboxes({ features = { stdin = true, ports = false, desktop = false, network = { 'none' },
      snapshots = 'native' } })
    p.made, p.released = {}, {}
    local create = p.create
    function p.create(self, spec)
      local b = create(self, spec)
      b.from = spec.snapshot
      function b.snapshot(_, o)
        if p.slow then task.sleep(p.slow) end
        local s = { size_bytes = 1000, max_bytes = o.max_bytes }
        function s.release(me) p.released[#p.released + 1] = me end
        p.made[#p.made + 1] = s
        return s
      end
      return b
    end
    return p
  end

  it('passes the provider\'s snapshot to its create, bounds it, and releases it once', function()
    local p = native_provider()
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 3, max_lifetime_ms = 60000, max_snapshot_bytes = 2500 })
    local sb = pool:create({ lifetime_ms = 60000 })
    assert.are.equal('native', sb.features.snapshots)
    local a = sb:snapshot()
    assert.are.equal(1000, a.size_bytes)
    assert.are.equal(2500, p.made[1].max_bytes)
    local b = sb:snapshot()
    assert.are.equal(1500, p.made[2].max_bytes)
    -- a third is past max_snapshot_bytes: the provider's own is released at once, nothing is held
    assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
    assert.are.equal(500, p.made[3].max_bytes)
    assert.are.same({ p.made[3] }, p.released)
    assert.are.same({ 2, 2000 }, { pool:snapshots() })
    local fork = pool:create({ lifetime_ms = 60000, snapshot = a })
    assert.are.equal(p.made[1], fork._backend.from)
    -- a native snapshot only starts new sandboxes
    assert.raises_code('INVALID_INPUT', fork.restore, fork, a)
    a:release()
    a:release()
    assert.are.same({ p.made[3], p.made[1] }, p.released)
    pool:close()
    assert.are.same({ p.made[3], p.made[1], p.made[2] }, p.released)
    assert.is_true(b._released)
  end)

  it('makes one held with its sandbox (a checkpoint) the generic way, so that restore puts it back', function()
    -- local sandboxes that say their snapshots are their own
    local p = require('mayura.sandbox.local').local_sandboxes()
    local features = {}
    for k, v in pairs(p.features) do features[k] = v end
    features.snapshots = 'native'
    p.features, p.made = features, {}
    local create = p.create
    function p.create(self, spec, ...)
      local b = create(self, spec, ...)
      function b.snapshot() p.made[#p.made + 1] = true error('not this way') end
      return b
    end
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local sb = pool:create({ lifetime_ms = 60000 })
    sb:write_file('kept.txt', 'before')
    local cp = sb:snapshot({ until_release = true })
    assert.are.equal(0, #p.made)
    assert.is_true(cp.size_bytes > 0)
    sb:write_file('kept.txt', 'after')
    sb:restore(cp)
    assert.are.equal('before', sb:read_file('kept.txt'))
    pool:close()
  end)

  it('a snapshot the provider makes after the call timeout is released when it comes', function()
    local p = native_provider()
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000, call_timeout_ms = 100 })
    local sb = pool:create({ lifetime_ms = 60000 })
    p.slow = 300
    local err = assert.raises_code('SANDBOX_ERROR', sb.snapshot, sb)
    assert.are.equal('timeout', err.reason)
    task.sleep(400)
    assert.are.equal(1, #p.made)
    assert.are.same({ p.made[1] }, p.released)
    assert.are.same({ 0, 0 }, { pool:snapshots() })
    pool:close()
  end)
end)

describe('a create from a snapshot on a warm provider', function()
  it('takes a warm sandbox and gives it the snapshot\'s files', function()
    local sandbox = require('mayura.sandbox')
    local provider = require('mayura.sandbox.local').local_sandboxes({ warm = 1 })
    local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 3, max_lifetime_ms = 600000 })
    local base = pool:create({ lifetime_ms = 60000 })
    base:write_file('kept.txt', 'kept')
    local snap = base:snapshot()
    for _ = 1, 500 do
      if provider:warm_ready() >= 1 then break end
      task.sleep(10)
    end
    assert.are.equal(1, provider:warm_ready())
    local fork = pool:create({ lifetime_ms = 60000, snapshot = snap })
    local was_warm = false
    for _, b in ipairs(provider:warm_made()) do was_warm = was_warm or b == fork._backend end
    -- a native fork's file systems are made as it starts (an overlay over the snapshot): never a warm one
    assert.are.equal(base.features.snapshots ~= 'native', was_warm)
    assert.are.equal('kept', fork:read_file('kept.txt'))
    pool:close()
  end)
end)

describe('a policy file', function()
  it('sets the pool\'s snapshot limits and the tools\' checkpoints, and checks the snapshot grant', function()
    local policy = require('mayura.policy')
    local p = policy.load_policy({ { name = 'p.lua', source = [[
pool 'w' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000, max_snapshots = 2,
  max_snapshot_bytes = 1048576 }
tools 'w' { exec = true, snapshots = true }
agent 'a' { instructions = 'x', tools = { 'w' }, allow = { 'tool:w.checkpoint', 'tool:w.restore',
  'sandbox:w:snapshot', 'effect:read', 'effect:write' } }
]] } })
    assert.truthy(p)
    local err = assert.raises_code('INVALID_CONFIG', policy.load_policy, { { name = 'q.lua', source = [[
pool 'w' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000 }
tools 'w' { exec = true }
agent 'a' { instructions = 'x', tools = { 'w' }, allow = { 'sandbox:w:snapshot' } }
]] } })
    assert.truthy(err.message:find('sandbox:w:snapshot', 1, true))
    assert.raises_code('INVALID_CONFIG', policy.load_policy, { { name = 'r.lua', source = [[
pool 'w' { provider = 'local', max_sandboxes = 1, max_lifetime_ms = 60000, max_snapshots = -1 }
]] } })
  end)
end)

describe('native snapshots on local', function()
  local sandbox = require('mayura.sandbox')
  local local_provider = require('mayura.sandbox.local')
  local SNAPROOT = '/run/mayura-snap'
  local provider = local_provider.local_sandboxes({ memory_mib = 256, workspace_mib = 64, tmp_mib = 32 })
  -- run as root (the launcher mounts the sandbox's file systems) on Linux 6.3 or later: native
  local major, minor = (require('luv').os_uname().release or ''):match('^(%d+)%.(%d+)')
  local native = provider.staged and (tonumber(major) > 6 or tonumber(major) == 6 and tonumber(minor) >= 3)
  local pools = {}
  local function pool(opts)
    opts.max_lifetime_ms = 600000
    local p = sandbox.create_sandboxes(provider, opts)
    pools[#pools + 1] = p
    return p
  end
  after_each(function()
    for _, p in ipairs(pools) do p:close() end
    pools = {}
  end)
  -- the names of the snapshots on the host
  local function kept()
    local out = providers.host('ls -A ' .. SNAPROOT)
    local set = {}
    for n in out:gmatch('%S+') do set[n] = true end
    return set
  end
  local function name_of(snap) return snap._held.native.name end

  it('is native here, and a fork shares the snapshot\'s pages instead of copying them', function()
    if not native then return pending('overlayfs over an idmapped tmpfs needs root and Linux 6.3') end
    assert.are.equal('native', provider.features.snapshots)
    local p = pool({ max_sandboxes = 3 })
    local base = p:create({ lifetime_ms = 120000 })
    sh(base, 'head -c 24000000 /dev/urandom > big.bin && echo t > /tmp/t')
    local sum = sh(base, 'md5sum < big.bin')
    local snap = base:snapshot()
    base:release()
    assert.truthy(kept()[name_of(snap)])
    local a = p:create({ lifetime_ms = 120000, snapshot = snap })
    local b = p:create({ lifetime_ms = 120000, snapshot = snap })
    for _, f in ipairs({ a, b }) do
      assert.are.equal(sum, sh(f, 'md5sum < big.bin'))
      -- the fork's own tmpfs holds none of the 24 MB: they are the snapshot's
      local used = tonumber(sh(f, "df -k /workspace | tail -1 | awk '{print $3}'"):match('%d+'))
      assert.is_true(used < 1024, 'the fork holds ' .. used .. ' KiB of its own')
      -- its mount table names no path of the host's snapshot
      assert.falsy(sh(f, 'cat /proc/self/mountinfo'):find('mayura-snap', 1, true))
    end
    -- a change is the fork's own (copied up), the snapshot stays as it was
    sh(a, 'echo changed > big.bin && rm /tmp/t')
    assert.are.equal(sum, sh(b, 'md5sum < big.bin'))
    assert.are.equal('t\n', b:read_file('/tmp/t'))
    local c = p:create({ lifetime_ms = 120000, snapshot = snap })
    assert.are.equal(sum, sh(c, 'md5sum < big.bin'))
    -- released, it is off the host; the forks keep their files
    local name = name_of(snap)
    snap:release()
    assert.falsy(kept()[name])
    assert.are.equal(sum, sh(c, 'md5sum < big.bin'))
  end)

  it('a snapshot released while a sandbox is being made from it stays until that one has it', function()
    if not native then return pending('native snapshots') end
    local p = pool({ max_sandboxes = 2 })
    local base = p:create({ lifetime_ms = 120000 })
    base:write_file('kept.txt', 'kept')
    local snap = base:snapshot()
    local name = name_of(snap)
    local making = task.spawn(function() return p:create({ lifetime_ms = 60000, snapshot = snap }) end)
    task.sleep(1)
    snap:release()
    local fork = making:wait()
    assert.are.equal('kept', fork:read_file('kept.txt'))
    assert.falsy(kept()[name])
  end)

  it('holds max_snapshot_bytes at its edge, and a snapshot past it leaves nothing on the host', function()
    if not native then return pending('native snapshots') end
    local p = pool({ max_sandboxes = 1 })
    local sb = p:create({ lifetime_ms = 120000 })
    sh(sb, 'head -c 100000 /dev/zero > data.bin && mkdir d && ln -s data.bin d/l')
    local size = sb:snapshot().size_bytes
    p:close()
    local before = kept()
    local edge = pool({ max_sandboxes = 1, max_snapshot_bytes = size })
    sb = edge:create({ lifetime_ms = 120000 })
    sh(sb, 'head -c 100000 /dev/zero > data.bin && mkdir d && ln -s data.bin d/l')
    local snap = sb:snapshot()
    assert.are.equal(size, snap.size_bytes)
    snap:release()
    local short = pool({ max_sandboxes = 1, max_snapshot_bytes = size - 1 })
    sb = short:create({ lifetime_ms = 120000 })
    sh(sb, 'head -c 100000 /dev/zero > data.bin && mkdir d && ln -s data.bin d/l')
    local err = assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
    assert.truthy(err.message:find('max_snapshot_bytes', 1, true))
    -- what is counted is what the snapshot holds of the host's memory: small files take pages
    local tiny = pool({ max_sandboxes = 1 })
    local t = tiny:create({ lifetime_ms = 120000 })
    sh(t, 'mkdir many && cd many && for i in $(seq 1 300); do echo $i > f$i; done')
    local small = t:snapshot()
    local used = tonumber(providers.host('df -B1 --output=used ' .. SNAPROOT .. '/' .. name_of(small) .. ' | tail -1')
      :match('%d+'))
    assert.is_true(used >= 300 * 4096 and used <= small.size_bytes, used .. ' bytes held, ' .. small.size_bytes
      .. ' counted')
    small:release()
    -- a sparse file of a terabyte is refused at once, not read
    sh(sb, 'rm -rf d data.bin && truncate -s 1T sparse')
    assert.raises_code('LIMIT_EXCEEDED', sb.snapshot, sb)
    assert.are.same(before, kept())
  end)

  it('never follows a link, also when the sandbox swaps a directory for one while it is taken', function()
    if not native then return pending('native snapshots') end
    local p = pool({ max_sandboxes = 3 })
    local sb = p:create({ lifetime_ms = 120000 })
    sh(sb, 'mkdir -p d/sub && for i in $(seq 1 200); do echo $i > d/sub/f$i; done && ln -s / root && ' ..
      'ln -s /etc/passwd pw')
    -- a loop that keeps replacing d with a link to / (and back) while snapshots are taken
    local swapper = sb:start({ 'sh', '-c', 'while :; do mv d d.real; ln -s / d; rm d; mv d.real d; done' })
    local made, failed = 0, 0
    for _ = 1, 6 do
      local ok, snap = pcall(sb.snapshot, sb)
      if ok then
        made = made + 1
        local fork = p:create({ lifetime_ms = 60000, snapshot = snap })
        -- whatever was taken is the sandbox's own: links as links, never the host's files behind them
        local listing = sh(fork, 'find /workspace /tmp -xdev | sort')
        assert.falsy(listing:find('/workspace/d/etc', 1, true) or listing:find('/workspace/d.real/etc', 1, true)
          or listing:find('/workspace/d/usr', 1, true), listing)
        assert.are.equal('/\n/etc/passwd\n', sh(fork, 'readlink root pw'))
        fork:release()
        snap:release()
      else
        failed = failed + 1
        assert.are.equal('SANDBOX_ERROR', snap.code, tostring(snap))
      end
    end
    swapper:kill(9)
    assert.are.equal(6, made + failed)
    assert.are.same({ 0, 0 }, { p:snapshots() })
  end)

  it('leaves nothing on the host after close, nor after the host process was killed', function()
    if not native then return pending('native snapshots') end
    local p = pool({ max_sandboxes = 1 })
    local sb = p:create({ lifetime_ms = 120000 })
    sb:write_file('a.txt', 'a')
    local s1, s2 = sb:snapshot(), sb:snapshot()
    local names = { name_of(s1), name_of(s2) }
    assert.truthy(kept()[names[1]] and kept()[names[2]])
    p:close()
    assert.falsy(kept()[names[1]] or kept()[names[2]])
    -- a host killed with its snapshot held: the next provider sweeps it
    local script = os.tmpname()
    local f = assert(io.open(script, 'w'))
    f:write([[
local sandbox = require('mayura.sandbox')
local pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes({ tmp_mib = 16,
  workspace_mib = 16 }), { max_sandboxes = 1, max_lifetime_ms = 60000 })
local sb = pool:create({ lifetime_ms = 60000 })
sb:write_file('a', 'a')
local snap = sb:snapshot()
io.stdout:write(snap._held.native.name, '\n')
io.stdout:flush()
os.execute('kill -9 $PPID')
]])
    f:close()
    local out = providers.host((os.getenv('MAYURA_BUILD') or 'build') .. '/mayura ' .. script)
    os.remove(script)
    local name = out:match('(%d+%-%d+%-%x+)')
    assert.truthy(name, out)
    assert.truthy(kept()[name])
    local again = local_provider.local_sandboxes({ tmp_mib = 16, workspace_mib = 16 })
    assert.are.equal('native', again.features.snapshots)
    assert.falsy(kept()[name])
  end)
end)

describe('native snapshots on Docker', function()
  for _, entry in ipairs(providers.list()) do
    if entry.kind == 'docker' then
      local function has_image(ref)
        return (providers.host('docker image inspect --format {{.Id}} ' .. ref)):find('sha256:', 1, true) ~= nil
      end

      it('on ' .. entry.name .. ' is an image the daemon keeps until the snapshot and its sandboxes are gone',
        function()
        local p = entry.make_pool({ max_sandboxes = 2 })
        local base = p:create({ lifetime_ms = 120000 })
        assert.are.equal('native', base.features.snapshots)
        sh(base, 'mkdir -p repo && echo 41 > repo/a && ln -s /etc/shadow repo/s && echo t > /tmp/t')
        local snap = base:snapshot()
        local ref = snap._held.native.image
        -- used by its id (a tag another user of the daemon could move), named in our repository
        assert.truthy(ref:match('^sha256:%x+$'), ref)
        assert.truthy(has_image(ref))
        assert.truthy(providers.host('docker image inspect --format "{{json .RepoTags}}" ' .. ref)
          :match('"mayura%-snapshot:%x+"'))
        -- labelled with this host process's mark, never with a path of the host's
        local owner = providers.host('docker image inspect --format \'{{index .Config.Labels "mayura.snapshot.owner"}}\' '
          .. ref):gsub('%s+$', '')
        assert.truthy(owner:match('^%d+%-%d+$'), owner)
        base:release()
        local fork = p:create({ lifetime_ms = 120000, snapshot = snap })
        assert.are.equal('41\n', fork:read_file('repo/a'))
        assert.are.equal('/etc/shadow\n', sh(fork, 'readlink repo/s'))
        assert.are.equal('t\n', fork:read_file('/tmp/t'))
        -- released while a sandbox made from it runs: the image stays until that one is gone
        snap:release()
        assert.truthy(has_image(ref))
        fork:release()
        assert.falsy(has_image(ref))
        p:close()
      end)

      it('on ' .. entry.name .. ' leaves no image after close, nor after the host process was killed', function()
        local p = entry.make_pool({ max_sandboxes = 1 })
        local sb = p:create({ lifetime_ms = 120000 })
        sb:write_file('a', 'a')
        local ref = sb:snapshot()._held.native.image
        p:close()
        assert.falsy(has_image(ref))
        local script = os.tmpname()
        local f = assert(io.open(script, 'w'))
        f:write(([[
local sandbox = require('mayura.sandbox')
local pool = sandbox.create_sandboxes(require('mayura.sandbox.docker').docker_sandboxes({ image = %q,
  engine = %q }), { max_sandboxes = 1, max_lifetime_ms = 60000 })
local sb = pool:create({ lifetime_ms = 60000 })
sb:write_file('a', 'a')
io.stdout:write(sb:snapshot()._held.native.image, '\n')
io.stdout:flush()
os.execute('kill -9 $PPID')
]]):format(entry.make_provider({}).image, entry.engine))
        f:close()
        local out = providers.host((os.getenv('MAYURA_BUILD') or 'build') .. '/mayura ' .. script)
        os.remove(script)
        local left = out:match('(sha256:%x+)')
        assert.truthy(left, out)
        assert.truthy(has_image(left))
        -- the next provider made sweeps it
        entry.make_provider({})
        task.sleep(100)
        for _ = 1, 100 do
          if not has_image(left) then break end
          task.sleep(100)
        end
        assert.falsy(has_image(left))
      end)
    end
  end
end)
