-- The in-sandbox agent (build/mayura-agent) driven through core.channel, run
-- directly on the host (not PID 1, no namespace); and core.channel itself
-- against a hostile peer played by the spec.
local core = require('mayura.core')
local compat = require('support.compat')
local uv = require('luv')
local util = require('support.util')

local AGENT = os.getenv('MAYURA_AGENT') or 'build/mayura-agent'

--- Runs the loop until pred() holds or ms pass; returns pred().
local function run_until(pred, ms)
  if pred() then return true end
  local timer = uv.new_timer()
  local expired = false
  timer:start(ms or 20000, 0, function() expired = true end)
  while not pred() and not expired do core.run_once() end
  timer:stop()
  timer:close()
  core.run_once()   -- lets the close finish, so no handle is left half-closed
  return pred()
end

local function sleep(ms)
  run_until(function() return false end, ms)
end

local started = {}

local call

--- Starts an agent serving one end of a socketpair and says hello (unless opts.hello is false);
-- opts: lifetime_ms, wrap(argv), channel options.
local function start(opts)
  opts = opts or {}
  local ag = { dir = util.tmpdir(), closes = {} }
  local a, b = core.socketpair()
  local argv = { AGENT, '--fd', '3', '--lifetime-ms', tostring(opts.lifetime_ms or 60000), '--workdir', ag.dir }
  if opts.wrap then argv = opts.wrap(argv) end
  ag.proc = assert(core.spawn({ argv = argv, fds = { b } }, function(r) ag.result = r end))
  core.close_fd(b)
  ag.pid = ag.proc:pid()
  ag.ch = core.channel(a, {
    max_frame_bytes = opts.max_frame_bytes,
    on_close = function(err) table.insert(ag.closes, err) end,
  })
  table.insert(started, ag)
  if opts.hello ~= false then assert(call(ag, { op = 'hello' }).version) end
  return ag
end

--- Sends a request and waits for its reply: returns reply or nil, err.
function call(ag, req, ms)
  local done, r, e = false, nil, nil
  local ch = ag.ch or ag
  assert(ch:call(req, function(x, y) done, r, e = true, x, y end))
  assert(run_until(function() return done end, ms or 30000), 'no reply to ' .. tostring(req.op))
  return r, e
end

local function exec(ag, req)
  req.op = 'exec'
  return call(ag, req)
end

local function exited(ag, ms)
  return run_until(function() return ag.result ~= nil end, ms or 5000)
end

local function gone(needle)
  return util.eventually(function() return #util.procs_matching(needle) == 0 end, 3000)
end

local function read_file(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('a')
  f:close()
  return s
end

local function write_file(path, data)
  local f = assert(io.open(path, 'wb'))
  f:write(data)
  f:close()
end

local function ls(dir)
  local names = {}
  local p = io.popen("ls -A '" .. dir .. "'")
  for n in p:lines() do names[#names + 1] = n end
  p:close()
  table.sort(names)
  return names
end

--- Frames as on the wire (core/wire.h), built and taken apart by hand.
local W = { BYTES = 1, INT = 2, BOOL = 3, STRS = 4, MAP = 5, INTS = 6 }

local function field(key, typ, val)
  return compat.pack('<s1Bs4', key, typ, val)
end

local function frame(id, fields)
  local body = compat.pack('<I4', id) .. table.concat(fields or {})
  return compat.pack('<I4', #body) .. body
end

local function items(list, fmt)
  local out = {}
  for i, v in ipairs(list) do out[i] = compat.pack(fmt, v) end
  return table.concat(out)
end

--- Parses one frame at the start of s: id, { key = { type, raw value } }, rest.
local function parse_frame(s)
  if #s < 4 then return nil end
  local len = compat.unpack('<I4', s)
  if #s < 4 + len then return nil end
  local id, pos = compat.unpack('<I4', s, 5)
  local fields = {}
  while pos <= 4 + len do
    local key, typ, val
    key, typ, val, pos = compat.unpack('<s1Bs4', s, pos)
    fields[key] = { typ, val }
  end
  return id, fields, s:sub(5 + len)
end

--- A channel whose peer is played by the spec through a luv pipe.
local function fake_peer(opts)
  local a, b = core.socketpair()
  local fp = { closes = {}, got = '' }
  fp.ch = core.channel(a, {
    max_frame_bytes = opts and opts.max_frame_bytes,
    on_close = function(err) table.insert(fp.closes, err) end,
  })
  fp.peer = uv.new_pipe(false)
  fp.peer:open(b)
  fp.peer:read_start(function(err, data)
    if data then fp.got = fp.got .. data end
    if err or not data then fp.eof = true end
  end)
  function fp.send(s)
    local done = false
    fp.peer:write(s, function() done = true end)
    run_until(function() return done end, 5000)
  end
  function fp.close()
    if not fp.peer:is_closing() then fp.peer:close() end
    core.run_once()
  end
  table.insert(started, { fake = fp })
  return fp
end

--- Calls that record their callback's arguments.
local function recorder()
  local rec = { calls = {} }
  function rec.cb(name)
    return function(r, e) table.insert(rec.calls, { name = name, r = r, e = e }) end
  end
  return rec
end

describe('mayura-agent', function()
  after_each(function()
    for _, s in ipairs(started) do
      if s.fake then
        s.fake.ch:close()
        s.fake.close()
      else
        s.ch:close()
        if not exited(s, 3000) then s.proc:kill(9); exited(s, 3000) end
        util.rmdir(s.dir)
      end
    end
    started = {}
  end)

  describe('failure modes', function()
    it('refuses bad command lines with exit code 2', function()
      for _, argv in ipairs({
        { AGENT },
        { AGENT, '--fd', '3' },
        { AGENT, '--lifetime-ms', '100' },
        { AGENT, '--fd', '99', '--lifetime-ms', '100' },
        { AGENT, '--fd', '0', '--listen', '/tmp/x', '--lifetime-ms', '100' },
        { AGENT, '--fd', '0', '--lifetime-ms', 'soon' },
        { AGENT, '--bogus', '1' },
      }) do
        local r
        core.spawn({ argv = argv }, function(x) r = x end)
        assert(run_until(function() return r ~= nil end, 5000))
        assert.are.equal(2, r.exit_code, table.concat(argv, ' '))
        assert.matches('mayura%-agent: ', r.stderr)
      end
    end)

    it("answers malformed requests with 'invalid' naming the field", function()
      local ag = start()
      local r = call(ag, { op = 'exec' })
      assert.are.equal('invalid', r.error)
      assert.matches('argv', r.message)
      r = call(ag, { op = 'exec', argv = 'ls -l' })
      assert.are.equal('invalid', r.error)
      assert.matches('argv', r.message)
      r = call(ag, { op = 'exec', argv = { '' } })
      assert.are.equal('invalid', r.error)
      r = call(ag, { op = 'exec', argv = { 'true' }, timeout_ms = 'soon' })
      assert.are.equal('invalid', r.error)
      assert.matches('timeout_ms', r.message)
      r = call(ag, { op = 'exec', argv = { 'true' }, timeout_ms = -1 })
      assert.are.equal('invalid', r.error)
      r = call(ag, { op = 'exec', argv = { 'true' }, env = { 'A=B' } })
      assert.are.equal('invalid', r.error)
      assert.matches('env', r.message)
      r = call(ag, { op = 'exec', argv = { 'true' }, env = { ['A=B'] = 'x' } })
      assert.are.equal('invalid', r.error)
      r = call(ag, { op = 'read' })
      assert.are.equal('invalid', r.error)
      assert.matches('path', r.message)
      r = call(ag, { op = 'read', path = 'a\0b' })
      assert.are.equal('invalid', r.error)
      r = call(ag, { op = 'write', path = 'x' })
      assert.are.equal('invalid', r.error)
      assert.matches('data', r.message)
      r = call(ag, { op = 'write', path = 'x', data = 'y', mode = 99999 })
      assert.are.equal('invalid', r.error)
      r = call(ag, { op = 'remove', path = 'x', recursive = 'yes' })
      assert.are.equal('invalid', r.error)
      r = call(ag, { op = 'cancel' })
      assert.are.equal('invalid', r.error)
      assert.matches('target', r.message)
      assert.is_string(r.message)
      -- the connection is still fine
      assert.is_true(call(ag, { op = 'ping' }).ok)
    end)

    it('ends the connection, and itself, unanswered, on a request the host would not send', function()
      local cases = {
        { name = 'an unknown op', reqs = { { op = 'frobnicate' } } },
        { name = 'no op', reqs = { { path = 'x' } } },
        { name = 'an op that is not bytes', reqs = { { op = 7 } } },
        { name = 'an exec before hello', hello = false, reqs = { { op = 'exec', argv = { 'touch', 'ran' } } } },
        { name = 'a ping before hello', hello = false, reqs = { { op = 'ping' } } },
        { name = 'a second setup', reqs = { { op = 'setup', workdir = 'a' }, { op = 'setup', workdir = 'b' } } },
      }
      for _, case in ipairs(cases) do
        local ag = start({ hello = case.hello })
        local last = #case.reqs
        for i = 1, last - 1 do assert.is_true(call(ag, case.reqs[i]).ok, case.name) end
        local r, e = call(ag, case.reqs[last])
        assert.is_nil(r, case.name)
        assert.are.equal('gone', e.reason, case.name)
        assert.is_true(exited(ag), case.name .. ': the agent did not exit')
        assert.are.equal(0, ag.result.exit_code)
        assert.is_nil(read_file(ag.dir .. '/ran'), case.name .. ': a command ran')
      end
      -- what is expected goes on as before: hello again, setup once, then anything
      local ag = start()
      assert.are.equal('1', call(ag, { op = 'hello' }).version)
      assert.is_true(call(ag, { op = 'setup', env = { A = 'b' } }).ok)
      assert.are.equal('b\n', exec(ag, { argv = { 'sh', '-c', 'echo $A' } }).stdout)
    end)

    it('refuses requests it cannot encode with INVALID_INPUT, sending nothing', function()
      local ag = start()
      local cb = function() error('must not be called') end
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, 'hello', cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = 'hello' }, nil)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = 1.5 }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = { 'a', 1 } }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = { a = 1 } }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = { { 'nested' } } }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = { 'a', nil, 'c' } }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { [1] = 'x' }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { [string.rep('k', 65)] = 'x' }, cb)
      assert.raises_code('INVALID_INPUT', ag.ch.call, ag.ch, { op = print }, cb)
      assert.raises_code('INVALID_INPUT', core.channel, -1)
      assert.raises_code('INVALID_INPUT', core.channel, 12345)
      local a, b = core.socketpair()
      core.close_fd(b)
      assert.raises_code('INVALID_INPUT', core.channel, a, { bogus = true })
      assert.raises_code('INVALID_INPUT', core.channel, a, { max_frame_bytes = 0 })
      assert.raises_code('INVALID_INPUT', core.channel, a, { on_close = 'x' })
      core.close_fd(a)
      assert.are.equal(0, ag.ch:pending())
      assert.are.equal('1', call(ag, { op = 'hello' }).version)
    end)

    it('runs no command whose syscall filter cannot be installed, and says so', function()
      -- the agent under allow-all filters that use up the kernel's budget of filter instructions
      local dir = util.tmpdir()
      local abuse = dir .. '/abuse'
      write_file(abuse, require('security.common').abuse_binary())
      compat.execute("chmod 755 '" .. abuse .. "'")
      local ag = start({ wrap = function(argv)
        table.insert(argv, 1, 'seccomp-fill')
        table.insert(argv, 1, abuse)
        return argv
      end })
      for _ = 1, 2 do
        local r = exec(ag, { argv = { 'touch', 'ran' } })
        assert.are.equal(126, r.exit_code)
        assert.matches('^mayura%-agent: cannot install the syscall filter %(seccomp: .*%); the command does not run',
          r.stderr)
      end
      assert.is_nil(read_file(ag.dir .. '/ran'))
      util.rmdir(dir)
    end)

    it('refuses a cwd that is missing or not a directory, running nothing', function()
      local ag = start()
      local r = exec(ag, { argv = { 'touch', 'ran' }, cwd = 'nope' })
      assert.are.equal('ENOENT', r.error)
      assert.is_string(r.message)
      write_file(ag.dir .. '/f', 'x')
      r = exec(ag, { argv = { 'touch', 'ran' }, cwd = 'f' })
      assert.are.equal('ENOTDIR', r.error)
      assert.is_nil(read_file(ag.dir .. '/ran'))
    end)

    it('reads a missing file as missing, and refuses a directory, a fifo and a file over max_bytes', function()
      local ag = start()
      assert.is_true(call(ag, { op = 'read', path = 'none' }).missing)
      write_file(ag.dir .. '/f', 'hello')
      assert.is_true(call(ag, { op = 'read', path = 'f/under-a-file' }).missing)
      compat.execute("mkdir '" .. ag.dir .. "/d' && mkfifo '" .. ag.dir .. "/fifo'")
      assert.are.equal('is_directory', call(ag, { op = 'read', path = 'd' }).error)
      local t0 = core.hrtime_ms()
      local r = call(ag, { op = 'read', path = 'fifo' })
      assert.are.equal('not_regular', r.error)
      assert.is_true(core.hrtime_ms() - t0 < 2000)
      -- exactly max_bytes is fine, one byte more is too large
      assert.are.equal('hello', call(ag, { op = 'read', path = 'f', max_bytes = 5 }).data)
      r = call(ag, { op = 'read', path = 'f', max_bytes = 4 })
      assert.are.equal('too_large', r.error)
      assert.is_nil(r.data)
      assert.are.equal('too_large', call(ag, { op = 'read', path = 'd/../f', max_bytes = 0 }).error)
      write_file(ag.dir .. '/empty', '')
      assert.are.equal('', call(ag, { op = 'read', path = 'empty', max_bytes = 0 }).data)
    end)

    it('fails a write under a file with ENOTDIR, and onto a directory with EISDIR, leaving nothing', function()
      local ag = start()
      write_file(ag.dir .. '/f', 'keep')
      local r = call(ag, { op = 'write', path = 'f/x', data = 'y' })
      assert.are.equal('ENOTDIR', r.error)
      r = call(ag, { op = 'write', path = 'f/deeper/x', data = 'y' })
      assert.are.equal('ENOTDIR', r.error)
      compat.execute("mkdir -p '" .. ag.dir .. "/d/inner'")
      r = call(ag, { op = 'write', path = 'd', data = 'y' })
      assert.are.equal('EISDIR', r.error)
      r = call(ag, { op = 'write', path = 'd/', data = 'y' })
      assert.are.equal('EISDIR', r.error)
      assert.are.same({ 'd', 'f' }, ls(ag.dir))
      assert.are.same({ 'inner' }, ls(ag.dir .. '/d'))
      assert.are.equal('keep', read_file(ag.dir .. '/f'))
    end)

    it('keeps the old content and leaves no temporary file when a write fails', function()
      -- a file size limit of 8 blocks makes the big write fail with EFBIG half way
      local ag = start({ wrap = function(argv)
        return { 'sh', '-c', 'ulimit -f 8; exec "$@"', 'sh', compat.table_unpack(argv) }
      end })
      assert.is_true(call(ag, { op = 'write', path = 'f', data = 'old content' }).ok)
      local r = call(ag, { op = 'write', path = 'f', data = string.rep('n', 1048576) })
      assert.are.equal('EFBIG', r.error)
      assert.are.equal('old content', call(ag, { op = 'read', path = 'f' }).data)
      assert.are.same({ 'f' }, ls(ag.dir))
    end)

    it("refuses to remove a non-empty directory without recursive, and to list a file", function()
      local ag = start()
      compat.execute("mkdir -p '" .. ag.dir .. "/d' && touch '" .. ag.dir .. "/d/x'")
      assert.are.equal('ENOTEMPTY', call(ag, { op = 'remove', path = 'd' }).error)
      assert.are.same({ 'x' }, ls(ag.dir .. '/d'))
      assert.are.equal('not_directory', call(ag, { op = 'list', path = 'd/x' }).error)
      assert.is_true(call(ag, { op = 'list', path = 'nope' }).missing)
      assert.is_true(call(ag, { op = 'list', path = 'd/x/y' }).missing)
      assert.is_false(call(ag, { op = 'remove', path = 'nope' }).removed)
    end)
  end)

  describe('channel failure modes', function()
    it('closes with reason failed on garbage, failing every pending call once', function()
      local fp = fake_peer()
      local rec = recorder()
      local id1 = fp.ch:call({ op = 'ping' }, rec.cb('a'))
      local id2 = fp.ch:call({ op = 'ping' }, rec.cb('b'))
      assert.is_true(id2 > id1 and id1 > 0)
      assert.are.equal(2, fp.ch:pending())
      -- a declared length within limits, then bytes that are no valid body
      local junk = {}
      math.randomseed(42)
      for i = 1, 300 do junk[i] = string.char(math.random(0, 255)) end
      junk = table.concat(junk)
      fp.send(compat.pack('<I4', #junk) .. junk)
      assert(run_until(function() return #rec.calls == 2 end, 5000))
      for _, c in ipairs(rec.calls) do
        assert.is_nil(c.r)
        assert.are.equal('SANDBOX_ERROR', c.e.code)
        assert.are.equal('failed', c.e.reason)
      end
      assert.are.equal('a', rec.calls[1].name)
      assert.are.equal(1, #fp.closes)
      assert.are.equal('failed', fp.closes[1].reason)
      assert.is_true(fp.ch:is_closed())
      assert.are.equal(0, fp.ch:pending())
      -- a closed channel refuses further calls without calling back
      local id, err = fp.ch:call({ op = 'ping' }, function() error('must not be called') end)
      assert.is_nil(id)
      assert.are.equal('gone', err.reason)
      fp.ch:close()
      assert.are.equal(1, #fp.closes)
      assert(run_until(function() return fp.eof end, 5000), 'the channel did not close its socket')
    end)

    it('closes with reason failed on random bytes, a short frame, a bad field or an unknown id', function()
      local bad = {
        (function()
          local t = {}
          for i = 1, 4096 do t[i] = string.char((i * 7919 + 13) % 256) end
          return table.concat(t)
        end)(),
        compat.pack('<I4', 2) .. 'xx',
        frame(1, { field('k', 9, 'v') }),
        frame(1, { field('k', W.INT, 'short') }),
        frame(1, { field('k', W.BOOL, '\2') }),
        frame(1, { field('k', W.STRS, compat.pack('<I4', 100) .. 'x') }),
        frame(1, { compat.pack('<s1', 'k') }),
        frame(77, { field('ok', W.BOOL, '\1') }),
        frame(0, { field('ok', W.BOOL, '\1') }),
      }
      for i, s in ipairs(bad) do
        local fp = fake_peer()
        local rec = recorder()
        fp.ch:call({ op = 'ping' }, rec.cb('a'))
        fp.send(s)
        assert(run_until(function() return #rec.calls == 1 end, 5000), 'case ' .. i)
        assert.are.equal('failed', rec.calls[1].e.reason, 'case ' .. i)
        assert.are.equal(1, #fp.closes)
        assert.are.equal('failed', fp.closes[1].reason)
      end
    end)

    it('closes with reason failed on a frame declaring more than max_frame_bytes', function()
      local fp = fake_peer({ max_frame_bytes = 1024 })
      local rec = recorder()
      fp.ch:call({ op = 'ping' }, rec.cb('a'))
      fp.send(compat.pack('<I4I4', 1025, 1))   -- only the header: the size alone closes it
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.are.equal('failed', rec.calls[1].e.reason)
      fp = fake_peer()
      rec = recorder()
      fp.ch:call({ op = 'ping' }, rec.cb('b'))
      fp.send(compat.pack('<I4', 0xffffffff))
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.are.equal('failed', rec.calls[1].e.reason)
    end)

    it("closes with reason failed on a reply over its call's max_reply_bytes, told by its id first", function()
      local fp = fake_peer()
      local rec = recorder()
      local small = fp.ch:call({ op = 'list' }, rec.cb('small'), 64)
      local big = fp.ch:call({ op = 'read' }, rec.cb('big'))
      -- a reply to the call without a cap of its own, larger than the other's cap, is taken
      fp.send(frame(big, { field('data', W.BYTES, string.rep('x', 200)) }))
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.are.equal('big', rec.calls[1].name)
      assert.are.equal(200, #rec.calls[1].r.data)
      -- the capped call's reply: its header and id alone close the channel
      fp.send(compat.pack('<I4I4', 65, small))
      assert(run_until(function() return #rec.calls == 2 end, 5000))
      assert.are.equal('small', rec.calls[2].name)
      assert.are.equal('failed', rec.calls[2].e.reason)
      assert.are.equal('failed', fp.closes[1].reason)
      -- within the cap, it is answered; the cap is forgotten with its call
      fp = fake_peer()
      rec = recorder()
      local id = fp.ch:call({ op = 'list' }, rec.cb('fits'), 64)
      fp.send(frame(id, { field('ok', W.BOOL, '\1') }))
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.is_true(rec.calls[1].r.ok)
      assert.raises_code('INVALID_INPUT', fp.ch.call, fp.ch, { op = 'x' }, function() end, 3)
      assert.raises_code('INVALID_INPUT', fp.ch.call, fp.ch, { op = 'x' }, function() end, 'big')
    end)

    it('encodes requests and decodes every field type of a reply', function()
      local fp = fake_peer({ max_frame_bytes = 1024 })
      local reply
      local id = fp.ch:call({
        op = 'x', n = -5, yes = true, no = false, l = { 'a', '', 'b\0c' }, m = { K = 'v' },
        i = { 1, -2, 3 }, e = {}, bin = '\0\255',
      }, function(r, e) reply = r or e end)
      assert(run_until(function() return parse_frame(fp.got) ~= nil end, 5000))
      local got_id, f = parse_frame(fp.got)
      assert.are.equal(id, got_id)
      assert.are.same({ W.BYTES, 'x' }, f.op)
      assert.are.same({ W.INT, compat.pack('<i8', -5) }, f.n)
      assert.are.same({ W.BOOL, '\1' }, f.yes)
      assert.are.same({ W.BOOL, '\0' }, f.no)
      assert.are.same({ W.STRS, items({ 'a', '', 'b\0c' }, '<s4') }, f.l)
      assert.are.same({ W.MAP, items({ 'K', 'v' }, '<s4') }, f.m)
      assert.are.same({ W.INTS, items({ 1, -2, 3 }, '<i8') }, f.i)
      assert.are.same({ W.STRS, '' }, f.e)
      assert.are.same({ W.BYTES, '\0\255' }, f.bin)
      fp.send(frame(id, {
        field('s', W.BYTES, 'a\0b'), field('n', W.INT, compat.pack('<i8', compat.mininteger)),
        field('t', W.BOOL, '\1'), field('f', W.BOOL, '\0'),
        field('l', W.STRS, items({ 'x', 'yy' }, '<s4')), field('m', W.MAP, items({ 'A', '1', 'B', '' }, '<s4')),
        field('i', W.INTS, items({ 7, -8 }, '<i8')), field('z', W.STRS, ''),
      }))
      assert(run_until(function() return reply ~= nil end, 5000))
      assert.are.same({
        s = 'a\0b', n = compat.mininteger, t = true, f = false, l = { 'x', 'yy' }, m = { A = '1', B = '' },
        i = { 7, -8 }, z = {},
      }, reply)
      assert.are.equal(0, fp.ch:pending())
      assert.is_false(fp.ch:is_closed())
      -- the peer going away is 'gone'
      local rec = recorder()
      fp.ch:call({ op = 'ping' }, rec.cb('a'))
      fp.close()
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.are.equal('gone', rec.calls[1].e.reason)
      assert.are.equal('gone', fp.closes[1].reason)
    end)

    it('takes frames split at every byte and several frames in one read', function()
      local fp = fake_peer()
      local got = {}
      local ids = {}
      for i = 1, 3 do ids[i] = fp.ch:call({ op = 'ping' }, function(r) got[i] = r end) end
      local s = frame(ids[1], { field('v', W.BYTES, 'one') })
      for k = 1, #s do fp.send(s:sub(k, k)) end
      fp.send(frame(ids[2], { field('v', W.BYTES, 'two') }) .. frame(ids[3], { field('v', W.BYTES, 'three') }))
      assert(run_until(function() return got[3] ~= nil end, 5000))
      assert.are.same({ 'one', 'two', 'three' }, { got[1].v, got[2].v, got[3].v })
    end)

    it('lets callbacks call and close re-entrantly', function()
      local fp = fake_peer()
      local rec = recorder()
      local id1 = fp.ch:call({ op = 'a' }, function(r)
        rec.cb('first')(r)
        local again = fp.ch:call({ op = 'b' }, rec.cb('again'))
        assert.is_number(again)
        fp.ch:close()   -- fails 'again' and the third call at once
        assert.is_nil(fp.ch:call({ op = 'c' }, rec.cb('never')))
      end)
      fp.ch:call({ op = 'x' }, rec.cb('third'))
      fp.send(frame(id1, { field('ok', W.BOOL, '\1') }))
      assert(run_until(function() return #rec.calls == 3 end, 5000))
      assert.are.equal('first', rec.calls[1].name)
      assert.are.equal('third', rec.calls[2].name)
      assert.are.equal('again', rec.calls[3].name)
      assert.are.equal('gone', rec.calls[2].e.reason)
      assert.are.equal('gone', rec.calls[3].e.reason)
      assert.are.equal(0, #fp.closes)   -- closed by its owner: no on_close
      sleep(50)
      assert.are.equal(3, #rec.calls)
    end)

    it('fails the pending call with gone and fires on_close when the agent is killed mid-exec', function()
      local ag = start()
      local rec = recorder()
      ag.ch:call({ op = 'exec', argv = { 'sleep', '4801' } }, rec.cb('exec'))
      assert.is_true(util.eventually(function() return #util.procs_matching('sleep 4801') == 1 end))
      ag.proc:kill(9)
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.is_nil(rec.calls[1].r)
      assert.are.equal('SANDBOX_ERROR', rec.calls[1].e.code)
      assert.are.equal('gone', rec.calls[1].e.reason)
      assert.are.equal(1, #ag.closes)
      assert.are.equal('gone', ag.closes[1].reason)
      assert.is_true(ag.ch:is_closed())
      util.kill_matching('sleep 4801')   -- not PID 1 here: its orphans outlive it
    end)

    it('makes the agent exit, killing its commands, when the host end closes', function()
      local ag = start()
      local rec = recorder()
      ag.ch:call({ op = 'exec', argv = { 'sh', '-c', 'setsid sleep 4811 & sleep 4812' } }, rec.cb('exec'))
      assert.is_true(util.eventually(function()
        return #util.procs_matching('sleep 4811') >= 1 and #util.procs_matching('sleep 4812') >= 1
      end))
      ag.ch:close()
      assert.is_true(exited(ag), 'the agent did not exit')
      assert.are.equal(0, ag.result.exit_code)
      assert.are.equal('gone', rec.calls[1].e.reason)
      assert.is_true(gone('sleep 4811'))
      assert.is_true(gone('sleep 4812'))
    end)

    it('is closed safely when the Lua state closes with calls pending', function()
      local script = [[
        package.cpath = CPATH .. ';' .. package.cpath
        local core = require('mayura.core')
        local a, b = core.socketpair()
        core.spawn({ argv = { AGENT, '--fd', '3', '--lifetime-ms', '60000', '--workdir', '/tmp' }, fds = { b } },
          function() end)
        core.close_fd(b)
        local ch = core.channel(a, { on_close = function() error('on_close during lua_close') end })
        local hello
        ch:call({ op = 'hello' }, function(r) hello = r end)
        while not hello do core.run_once() end
        ch:call({ op = 'exec', argv = { 'sleep', '4881' } }, function() error('callback during lua_close') end)
        core.channel_connect('/tmp/mayura-no-such-agent.sock', nil, function() error('connect during lua_close') end)
        print('hello ' .. hello.version)
      ]]
      local r
      local argv = { compat.lua, '-e', string.format('local AGENT, CPATH = %q, %q\n', AGENT, compat.cpath) .. script }
      core.spawn({ argv = argv }, function(x) r = x end)
      assert(run_until(function() return r ~= nil end, 10000))
      assert.are.equal('', r.stderr)
      assert.are.equal('hello 1\n', r.stdout)
      assert.are.equal(0, r.exit_code)
      util.kill_matching('sleep 4881')
    end)

    it('reports a socket path nobody listens on as unavailable', function()
      local r, e = nil, nil
      local done = false
      core.channel_connect('/tmp/mayura-no-such-agent.sock', nil, function(x, y) done, r, e = true, x, y end)
      assert(run_until(function() return done end, 5000))
      assert.is_nil(r)
      assert.are.equal('SANDBOX_ERROR', e.code)
      assert.are.equal('unavailable', e.reason)
      assert.raises_code('INVALID_INPUT', core.channel_connect, '/tmp/' .. string.rep('x', 200), nil, function() end)
      assert.raises_code('INVALID_INPUT', core.channel_connect, '/tmp/x', nil, nil)
    end)
  end)

  describe('behaviour', function()
    it('says hello', function()
      local ag = start()
      local r = call(ag, { op = 'hello' })
      assert.are.equal('1', r.version)
      assert.are.equal(ag.pid, r.pid)
      assert.is_true(compat.math_type(r.uid) == 'integer')
      assert.is_true(call(ag, { op = 'ping' }).ok)
    end)

    it('gives exit codes, both streams and signals, without a shell', function()
      local ag = start()
      local r = exec(ag, { argv = { 'sh', '-c', 'printf out; printf err >&2; exit 7' } })
      assert.are.equal(7, r.exit_code)
      assert.are.equal('out', r.stdout)
      assert.are.equal('err', r.stderr)
      assert.is_false(r.stdout_truncated or r.stderr_truncated or r.timed_out or r.cancelled)
      assert.is_true(compat.math_type(r.duration_ms) == 'integer')
      r = exec(ag, { argv = { 'echo', '$HOME; rm -rf /', '*' } })
      assert.are.equal('$HOME; rm -rf / *\n', r.stdout)
      assert.are.equal(0, r.exit_code)
      r = exec(ag, { argv = { 'sh', '-c', 'kill -9 $$' } })
      assert.is_nil(r.exit_code)
      assert.are.equal(9, r.signal)
      r = exec(ag, { argv = { 'sh', '-c', 'ls /proc/self/fd; cat' } })
      assert.are.equal('0\n1\n2\n3\n', r.stdout)   -- 3 is ls's own directory; nothing leaks in
    end)

    it('reports a program that cannot run as 127 or 126', function()
      local ag = start()
      local r = exec(ag, { argv = { 'no-such-program-4711' } })
      assert.are.equal(127, r.exit_code)
      assert.are.equal('mayura-agent: no-such-program-4711: No such file or directory\n', r.stderr)
      write_file(ag.dir .. '/script', 'echo hi\n')   -- not executable
      r = exec(ag, { argv = { './script' } })
      assert.are.equal(126, r.exit_code)
      assert.matches('^mayura%-agent: %./script: ', r.stderr)
    end)

    it('builds the environment from the base, setup and the exec, keeping setup values off command lines', function()
      local ag = start()
      local env = { SECRET = 's3cr3t-4711', A = 'setup', PATH = '/bin:/usr/bin' }
      assert.is_true(call(ag, { op = 'setup', env = env }).ok)
      local r = exec(ag, {
        argv = { 'sh', '-c', 'echo "$SECRET|$A|$B|$HOME|$LANG|$PATH"; echo "$MAYURA_EXEC"' },
        env = { A = 'exec', B = 'b', MAYURA_EXEC = 'forged' },
      })
      local first, tag = r.stdout:match('^(.-)\n(.-)\n$')
      assert.are.equal('s3cr3t-4711|exec|b|' .. ag.dir .. '|C.UTF-8|/bin:/usr/bin', first)
      assert.is_truthy(tag:match('^%d+%.%d+%.%d+$'), tag)
      local r2 = exec(ag, { argv = { 'sh', '-c', 'echo "$MAYURA_EXEC"' } })
      assert.are_not.equal(tag .. '\n', r2.stdout)
      local cmdline = read_file('/proc/' .. ag.pid .. '/cmdline')
      assert.is_truthy(cmdline:find('--fd', 1, true))
      assert.is_nil(cmdline:find('s3cr3t', 1, true))
      -- the default PATH when nobody sets one, and PATH lookup through the command's PATH
      local ag2 = start()
      r = exec(ag2, { argv = { 'sh', '-c', 'echo "$PATH"' } })
      assert.are.equal('/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n', r.stdout)
      compat.execute("mkdir -p '" .. ag2.dir .. "/bin' && printf '#!/bin/sh\\necho mine\\n' > '" .. ag2.dir ..
        "/bin/mytool' && chmod +x '" .. ag2.dir .. "/bin/mytool'")
      r = exec(ag2, { argv = { 'mytool' }, env = { PATH = ag2.dir .. '/bin:/bin' } })
      assert.are.equal('mine\n', r.stdout)
    end)

    it('runs in a cwd relative to the workdir, or in the workdir', function()
      local ag = start()
      compat.execute("mkdir -p '" .. ag.dir .. "/sub/deeper'")
      assert.are.equal(ag.dir .. '/sub/deeper\n', exec(ag, { argv = { 'pwd' }, cwd = 'sub/deeper' }).stdout)
      assert.are.equal(ag.dir .. '\n', exec(ag, { argv = { 'pwd' } }).stdout)
      assert.are.equal('/usr\n', exec(ag, { argv = { 'pwd' }, cwd = '/usr' }).stdout)
      assert.is_true(call(ag, { op = 'setup', workdir = 'sub' }).ok)
      assert.are.equal(ag.dir .. '/sub\n', exec(ag, { argv = { 'pwd' } }).stdout)
    end)

    it('feeds 4 MiB of standard input, and /dev/null without one', function()
      local ag = start()
      local data = {}
      for i = 1, 4 * 1024 * 16 do data[i] = string.format('%015d\n', i) end
      data = table.concat(data)
      local r = exec(ag, { argv = { 'cat' }, stdin = data, max_output_bytes = 8 * 1048576 })
      assert.are.equal(#data, #r.stdout)
      assert.is_true(r.stdout == data)
      r = exec(ag, { argv = { 'true' }, stdin = data })
      assert.are.equal(0, r.exit_code)
      r = exec(ag, { argv = { 'wc', '-c' } })
      assert.are.equal('0\n', r.stdout)
      r = exec(ag, { argv = { 'wc', '-c' }, stdin = '' })
      assert.are.equal('0\n', r.stdout)
    end)

    it('keeps at most max_output_bytes of a 200 MiB flood and says truncated', function()
      local ag = start()
      local r = exec(ag, {
        argv = { 'sh', '-c', 'head -c 209715200 /dev/zero; head -c 209715200 /dev/zero >&2' },
        max_output_bytes = 1048576,
      })
      assert.are.equal(0, r.exit_code)
      assert.are.equal(1048576, #r.stdout)
      assert.are.equal(1048576, #r.stderr)
      assert.is_true(r.stdout_truncated and r.stderr_truncated)
      local status = read_file('/proc/' .. ag.pid .. '/status')
      assert.is_true(tonumber(status:match('VmHWM:%s*(%d+)')) < 64 * 1024, 'the agent grew past 64 MiB')
      r = exec(ag, { argv = { 'head', '-c', '1000', '/dev/zero' }, max_output_bytes = 1000 })
      assert.are.equal(1000, #r.stdout)
      assert.is_false(r.stdout_truncated)
      r = exec(ag, { argv = { 'head', '-c', '1001', '/dev/zero' }, max_output_bytes = 1000 })
      assert.is_true(r.stdout_truncated)
      r = exec(ag, { argv = { 'echo', 'x' }, max_output_bytes = 0 })
      assert.are.equal('', r.stdout)
      assert.is_true(r.stdout_truncated)
    end)

    it('stops every process of a timed-out command, grandchildren and setsid included', function()
      local ag = start()
      local r = exec(ag, {
        argv = { 'sh', '-c', '(sleep 4821 &); setsid sleep 4822 >/dev/null 2>&1 </dev/null & sleep 4823 & sleep 4824' },
        timeout_ms = 300,
      })
      assert.is_true(r.timed_out)
      assert.is_nil(r.exit_code)
      assert.is_true(r.duration_ms >= 250 and r.duration_ms < 5000)
      for _, n in ipairs({ '4821', '4822', '4823', '4824' }) do
        assert.is_true(gone('sleep ' .. n), 'sleep ' .. n .. ' outlived the timeout')
      end
      -- a command that ignores SIGTERM is killed after the grace
      r = exec(ag, { argv = { 'sh', '-c', 'trap "" TERM; sleep 4825' }, timeout_ms = 200, kill_grace_ms = 200 })
      assert.is_true(r.timed_out)
      assert.is_true(r.duration_ms >= 350 and r.duration_ms < 5000)
      assert.is_true(gone('sleep 4825'))
    end)

    it('lets a setsid process outlive a normal end, ends the rest of its group, and does not wait for it', function()
      local ag = start()
      local r = exec(ag, { argv = { 'sh', '-c',
        'setsid sleep 4831 >/dev/null 2>&1 </dev/null & sleep 4832 & sleep 0.3; echo done' } })
      assert.are.equal(0, r.exit_code)
      assert.are.equal('done\n', r.stdout)
      assert.are.equal(1, #util.procs_matching('sleep 4831'))
      assert.is_true(gone('sleep 4832'))
      local t0 = core.hrtime_ms()
      r = exec(ag, { argv = { 'sh', '-c', 'setsid sleep 4833 & echo hi' }, drain_ms = 50 })
      assert.are.equal('hi\n', r.stdout)
      assert.is_true(core.hrtime_ms() - t0 < 3000)
      util.kill_matching('sleep 4831')
      util.kill_matching('sleep 4833')
    end)

    it('cancels an exec and its tree; a cancel of an ended or unknown exec is ok', function()
      local ag = start()
      local rec = recorder()
      local id = ag.ch:call({ op = 'exec', argv = { 'sh', '-c',
        'setsid sleep 4841 >/dev/null 2>&1 </dev/null & sleep 4842' } }, rec.cb('exec'))
      assert.is_true(util.eventually(function() return #util.procs_matching('sleep 4841') >= 1 end))
      assert.is_true(call(ag, { op = 'cancel', target = id }).ok)
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      local r = rec.calls[1].r
      assert.is_true(r.cancelled)
      assert.is_false(r.timed_out)
      assert.is_nil(r.exit_code)
      assert.is_true(gone('sleep 4841'))
      assert.is_true(gone('sleep 4842'))
      assert.is_true(call(ag, { op = 'cancel', target = id }).ok)
      assert.is_true(call(ag, { op = 'cancel', target = 999999 }).ok)
    end)

    it('runs 100 execs at once on one channel', function()
      local ag = start()
      local results, left = {}, 100
      for i = 1, 100 do
        ag.ch:call({ op = 'exec', argv = { 'sh', '-c', 'echo $0', tostring(i) } }, function(r)
          results[i] = r.stdout
          left = left - 1
        end)
      end
      assert.are.equal(100, ag.ch:pending())
      assert(run_until(function() return left == 0 end, 30000))
      for i = 1, 100 do assert.are.equal(i .. '\n', results[i]) end
      assert.are.equal(0, ag.ch:pending())
    end)

    it('writes and reads back every byte value, and 16 MiB, creating directories', function()
      local ag = start()
      local all = {}
      for i = 0, 255 do all[#all + 1] = string.char(i) end
      all = table.concat(all)
      assert.is_true(call(ag, { op = 'write', path = 'a/b/c/bytes', data = all }).ok)
      assert.are.equal(all, read_file(ag.dir .. '/a/b/c/bytes'))
      assert.are.equal(all, call(ag, { op = 'read', path = 'a/b/c/bytes' }).data)
      local chunk = {}
      for i = 1, 4096 do chunk[i] = string.char((i * 31) % 256) end
      local big = string.rep(table.concat(chunk), 4096)   -- 16 MiB
      assert.is_true(call(ag, { op = 'write', path = 'big', data = big, mode = 384 }).ok)
      local r = call(ag, { op = 'read', path = 'big' })
      assert.are.equal(#big, #r.data)
      assert.is_true(r.data == big)
      r = exec(ag, { argv = { 'stat', '-c', '%a', 'big', 'a', 'a/b/c' } })
      assert.are.equal('600\n755\n755\n', r.stdout)
      -- a replace is whole: no temporary file is left behind
      assert.is_true(call(ag, { op = 'write', path = 'big', data = 'small' }).ok)
      assert.are.equal('small', read_file(ag.dir .. '/big'))
      assert.are.same({ 'a', 'big' }, ls(ag.dir))
    end)

    it('reads a file in ranges (offset, length) with its size, inode, mtime and eof', function()
      local ag = start()
      write_file(ag.dir .. '/f', '0123456789')
      local r = call(ag, { op = 'read', path = 'f', offset = 0, length = 4 })
      assert.are.equal('0123', r.data)
      assert.are.equal(10, r.size)
      assert.is_false(r.eof)
      assert.is_number(r.ino)
      assert.is_number(r.mtime_ns)
      r = call(ag, { op = 'read', path = 'f', offset = 4, length = 6 })
      assert.are.equal('456789', r.data)
      assert.is_true(r.eof)
      r = call(ag, { op = 'read', path = 'f', offset = 8, length = 100 })
      assert.are.equal('89', r.data)
      assert.is_true(r.eof)
      r = call(ag, { op = 'read', path = 'f', offset = 50, length = 4 })
      assert.are.equal('', r.data)
      assert.is_true(r.eof)
      -- max_bytes is the file's, not the range's
      assert.are.equal('too_large', call(ag, { op = 'read', path = 'f', max_bytes = 9, offset = 0, length = 2 }).error)
      assert.is_true(call(ag, { op = 'read', path = 'nope', offset = 0, length = 2 }).missing)
      assert.are.equal('invalid', call(ag, { op = 'read', path = 'f', offset = -1, length = 2 }).error)
      assert.are.equal('invalid', call(ag, { op = 'read', path = 'f', length = 0 }).error)
      -- without a range, the reply is the whole file as before
      r = call(ag, { op = 'read', path = 'f' })
      assert.are.equal('0123456789', r.data)
      assert.is_nil(r.eof)
    end)

    it('writes a file in parts: nothing changes until the last part renames the whole over it', function()
      local ag = start()
      write_file(ag.dir .. '/f', 'old')
      local r = call(ag, { op = 'write', path = 'f', data = 'ab', more = true, mode = 384 })
      assert.is_true(r.ok)
      local id = r.upload
      assert.is_number(id)
      assert.is_true(call(ag, { op = 'write', upload = id, data = 'cd', more = true }).ok)
      assert.are.equal('old', read_file(ag.dir .. '/f'))
      assert.are.equal(2, #ls(ag.dir))   -- f and its temporary file
      assert.is_true(call(ag, { op = 'write', upload = id, data = 'e' }).ok)
      assert.are.equal('abcde', read_file(ag.dir .. '/f'))
      assert.are.same({ 'f' }, ls(ag.dir))
      assert.are.equal('600\n', exec(ag, { argv = { 'stat', '-c', '%a', 'f' } }).stdout)
      -- the upload is over: its id names nothing now
      assert.are.equal('invalid', call(ag, { op = 'write', upload = id, data = 'x' }).error)
      -- missing parents are made by the first part
      r = call(ag, { op = 'write', path = 'a/b/g', data = '1', more = true })
      assert.is_true(call(ag, { op = 'write', upload = r.upload, data = '2' }).ok)
      assert.are.equal('12', read_file(ag.dir .. '/a/b/g'))
    end)

    it('drops an upload that is aborted, fails, or is left when the connection ends, with its temporary file', function()
      local ag = start({ wrap = function(argv)
        return { 'sh', '-c', 'ulimit -f 8; exec "$@"', 'sh', compat.table_unpack(argv) }
      end })
      write_file(ag.dir .. '/f', 'old')
      local r = call(ag, { op = 'write', path = 'f', data = 'new', more = true })
      assert.is_true(call(ag, { op = 'write', upload = r.upload, abort = true }).ok)
      assert.are.same({ 'f' }, ls(ag.dir))
      assert.are.equal('invalid', call(ag, { op = 'write', upload = r.upload, data = 'x' }).error)
      -- a part past the file size limit (8 blocks) fails: the old file stays, nothing else
      r = call(ag, { op = 'write', path = 'f', data = 'new', more = true })
      assert.are.equal('EFBIG', call(ag, { op = 'write', upload = r.upload, data = string.rep('n', 1048576) }).error)
      assert.are.equal('invalid', call(ag, { op = 'write', upload = r.upload, data = 'x' }).error)
      assert.are.same({ 'f' }, ls(ag.dir))
      assert.are.equal('old', read_file(ag.dir .. '/f'))
      -- abort goes with upload
      assert.are.equal('invalid', call(ag, { op = 'write', path = 'f', data = 'x', abort = true }).error)
      -- an upload left open when the host's end closes: the agent ends, and removes it
      r = call(ag, { op = 'write', path = 'g', data = 'part', more = true })
      assert.is_true(r.ok)
      assert.are.equal(2, #ls(ag.dir))
      ag.ch:close()
      assert.is_true(exited(ag))
      assert.are.same({ 'f' }, ls(ag.dir))
    end)

    it('lists names, types, sizes and modification times sorted, without following symlinks', function()
      local ag = start()
      local before = core.now_ms()
      assert.is_true(call(ag, { op = 'write', path = 'd/zz', data = '12345' }).ok)
      compat.execute("cd '" .. ag.dir .. "/d' && mkdir sub && ln -s /etc lnk && mkfifo fifo && touch -d @1000000000 old")
      local r = call(ag, { op = 'list', path = 'd' })
      assert.are.same({ 'fifo', 'lnk', 'old', 'sub', 'zz' }, r.names)
      assert.are.same({ 'other', 'symlink', 'file', 'directory', 'file' }, r.types)
      assert.are.equal(5, r.sizes[5])
      assert.are.equal(4, r.sizes[2])   -- the link's own size: "/etc"
      assert.are.equal(1000000000000, r.modified[3])
      assert.is_true(r.modified[5] >= before - 2000 and r.modified[5] <= core.now_ms() + 2000)
      r = call(ag, { op = 'list', path = 'd/sub' })
      assert.are.same({}, r.names)
      assert.are.same({}, r.sizes)
      r = call(ag, { op = 'list', path = '' })
      assert.are.same({ 'd' }, r.names)
    end)

    it('removes recursively without following a symlink to a directory outside', function()
      local ag = start()
      local outside = util.tmpdir()
      write_file(outside .. '/precious', 'keep me')
      compat.execute("cd '" .. ag.dir .. "' && mkdir -p t/a/b && touch t/a/b/f t/x && ln -s '" .. outside ..
        "' t/a/link && ln -s '" .. outside .. "' top")
      local r = call(ag, { op = 'remove', path = 't/', recursive = true })
      assert.is_true(r.removed)
      assert.are.same({ 'top' }, ls(ag.dir))
      assert.are.equal('keep me', read_file(outside .. '/precious'))
      -- a symlink to a directory is removed as a link, recursive or not
      assert.is_true(call(ag, { op = 'remove', path = 'top/', recursive = true }).removed)
      assert.are.same({}, ls(ag.dir))
      assert.are.equal('keep me', read_file(outside .. '/precious'))
      assert.is_false(call(ag, { op = 'remove', path = 'top' }).removed)
      write_file(ag.dir .. '/f', 'x')
      assert.is_true(call(ag, { op = 'remove', path = 'f' }).removed)
      compat.execute("mkdir '" .. ag.dir .. "/empty'")
      assert.is_true(call(ag, { op = 'remove', path = 'empty' }).removed)
      util.rmdir(outside)
    end)

    it('ends at its lifetime, killing its commands, setsid ones included', function()
      local ag = start({ lifetime_ms = 300 })
      local rec = recorder()
      ag.ch:call({ op = 'exec', argv = { 'sh', '-c', 'setsid sleep 4851 >/dev/null 2>&1 </dev/null & sleep 4852' } },
        rec.cb('exec'))
      local seen = util.eventually(function() return #util.procs_matching('sleep 4851') >= 1 end, 250)
      assert.is_true(seen, 'the command did not start before the lifetime')
      assert.is_true(exited(ag, 5000), 'the agent outlived its lifetime')
      assert.are.equal(0, ag.result.exit_code)
      assert(run_until(function() return #rec.calls == 1 end, 5000))
      assert.are.equal('gone', rec.calls[1].e.reason)
      assert.are.equal('gone', ag.closes[1].reason)
      assert.is_true(gone('sleep 4851'))
      assert.is_true(gone('sleep 4852'))
    end)

    it('takes a shorter lifetime from its setup, never a longer one', function()
      local ag = start({ lifetime_ms = 60000 })
      assert.is_true(call(ag, { op = 'setup', lifetime_ms = 200 }).ok)
      assert.is_true(exited(ag, 5000), 'the agent outlived the lifetime of its setup')
      local other = start({ lifetime_ms = 300 })
      assert.is_true(call(other, { op = 'setup', lifetime_ms = 600000 }).ok)
      assert.is_true(exited(other, 5000), 'the setup lengthened the lifetime')
      local bad = start()
      assert.are.equal('invalid', call(bad, { op = 'setup', lifetime_ms = 0 }).error)
    end)

    it('shuts down on request', function()
      local ag = start()
      exec(ag, { argv = { 'sh', '-c', 'setsid sleep 4861 >/dev/null 2>&1 </dev/null & sleep 0.2' } })
      assert.are.equal(1, #util.procs_matching('sleep 4861'))
      assert.is_true(call(ag, { op = 'shutdown' }).ok)
      assert.is_true(exited(ag))
      assert.are.equal(0, ag.result.exit_code)
      assert.is_true(gone('sleep 4861'))   -- what outlived its command ends with the agent
    end)
  end)

  describe('--listen', function()
    -- An agent listening at dir/agent.sock, with `extra` arguments; waits for its socket.
    local function listening(extra)
      local dir = util.tmpdir()
      local path = dir .. '/agent.sock'
      local ag = { dir = dir, closes = {}, path = path }
      local argv = { AGENT, '--listen', path, '--lifetime-ms', '60000', '--workdir', dir }
      for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
      ag.proc = assert(core.spawn({ argv = argv }, function(r) ag.result = r end))
      ag.pid = ag.proc:pid()
      ag.ch = { close = function() end }
      table.insert(started, ag)
      assert.is_true(util.eventually(function() return compat.execute("test -S '" .. path .. "'") end, 3000))
      return ag
    end

    -- A channel to the agent's socket, or nil and the error.
    local function connect(ag)
      local ch, err
      local done = false
      core.channel_connect(ag.path, { on_close = function(e) table.insert(ag.closes, e) end },
        function(c, e) done, ch, err = true, c, e end)
      assert(run_until(function() return done end, 5000))
      return ch, err
    end

    local function mode(path)
      local p = io.popen("stat -c '%a' '" .. path .. "'")
      local m = p:read('l')
      p:close()
      return m
    end

    local function my_uid()
      local p = io.popen('id -u')
      local uid = tonumber(p:read('l'))
      p:close()
      return uid
    end

    it('serves one peer: the first connection; then nobody else can connect, and its end ends the agent', function()
      local ag = listening()
      assert.are.equal('600', mode(ag.path))
      local c1 = assert(connect(ag))
      assert.are.equal(ag.pid, call(c1, { op = 'hello' }).pid)
      -- the listener is closed and its socket gone: a second peer cannot connect
      assert.is_falsy(compat.execute("test -e '" .. ag.path .. "'"))
      local c2, err = connect(ag)
      assert.is_nil(c2)
      assert.are.equal('unavailable', err.reason)
      assert.is_true(call(c1, { op = 'setup', env = { A = 'one' } }).ok)
      assert.are.equal('one\n', exec(c1, { argv = { 'sh', '-c', 'echo $A' } }).stdout)
      -- the peer's end ends the agent and what it runs
      c1:call({ op = 'exec', argv = { 'sleep', '4871' } }, function() end)
      assert.is_true(util.eventually(function() return #util.procs_matching('sleep 4871') == 1 end))
      c1:close()
      assert.is_true(exited(ag), 'the agent did not exit')
      assert.are.equal(0, ag.result.exit_code)
      assert.is_true(gone('sleep 4871'))
    end)

    it('with --peer-uid, makes the socket 0666 and closes a peer of another uid unanswered, listening on', function()
      local me = my_uid()
      local ag = listening({ '--peer-uid', tostring(me + 1) })
      assert.are.equal('666', mode(ag.path))
      for _ = 1, 2 do
        local ch = assert(connect(ag))
        -- closed before the call is sent, or with it pending: never answered
        local done, r, e = false, nil, nil
        local id, err = ch:call({ op = 'hello' }, function(x, y) done, r, e = true, x, y end)
        if id then
          assert(run_until(function() return done end, 5000))
        else
          e = err
        end
        assert.is_nil(r)
        assert.are.equal('gone', e.reason)
      end
      -- still listening, for the peer it waits for
      assert.is_nil(ag.result)
      assert.is_true(compat.execute("test -S '" .. ag.path .. "'"))
      -- the uid it waits for is served
      local ok = listening({ '--peer-uid', tostring(me) })
      local ch = assert(connect(ok))
      assert.are.equal('1', call(ch, { op = 'hello' }).version)
      assert.is_falsy(compat.execute("test -e '" .. ok.path .. "'"))
      assert.is_true(call(ch, { op = 'shutdown' }).ok)
      assert.is_true(exited(ok), 'the agent did not exit')
      ag.proc:kill(9)
    end)

    it('refuses --peer-uid without --listen, and one that is not a uid', function()
      for _, argv in ipairs({
        { AGENT, '--fd', '0', '--peer-uid', '0', '--lifetime-ms', '100' },
        { AGENT, '--listen', '/tmp/x.sock', '--peer-uid', '-1', '--lifetime-ms', '100' },
        { AGENT, '--listen', '/tmp/x.sock', '--peer-uid', '4294967295', '--lifetime-ms', '100' },
      }) do
        local r
        core.spawn({ argv = argv }, function(x) r = x end)
        assert(run_until(function() return r ~= nil end, 5000))
        assert.are.equal(2, r.exit_code, table.concat(argv, ' '))
        assert.matches('mayura%-agent: ', r.stderr)
      end
    end)
  end)
end)
