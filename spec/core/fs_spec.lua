-- Specs of core.fs: asynchronous file operations on the shared loop.
local core = require('mayura.core')
local compat = require('support.compat')
local util = require('support.util')
local fs = core.fs

-- Starts an operation and runs the loop until its callback comes.
local function wait(start)
  local done, a, b = false, nil, nil
  start(function(x, y) done = true; a = x; b = y end)
  while not done do core.run_once() end
  return a, b
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function sh(cmd) assert(compat.execute(cmd), 'command failed: ' .. cmd) end

local function read(path, opts) return wait(function(cb) fs.read(path, opts, cb) end) end
local function write(path, data, opts) return wait(function(cb) fs.write(path, data, opts, cb) end) end
local function list(path) return wait(function(cb) fs.list(path, cb) end) end
local function remove(path, opts) return wait(function(cb) fs.remove(path, opts, cb) end) end
local function stat(path) return wait(function(cb) fs.stat(path, cb) end) end
local function mkdir(path, opts) return wait(function(cb) fs.mkdir(path, opts, cb) end) end

-- A fresh directory under /tmp.
local function tmpdir()
  local name = os.tmpname()
  os.remove(name)
  name = name .. '-fs'
  assert.is_true(mkdir(name))
  return name
end

local function names(dir)
  local entries = assert(list(dir))
  local out = {}
  for i, e in ipairs(entries) do out[i] = e.name end
  return out
end

-- Names in dir that look like a temporary file of write.
local function temps(dir)
  local out = {}
  for _, n in ipairs(names(dir)) do
    if n:find('%.mayura%-') then out[#out + 1] = n end
  end
  return out
end

local function invalid(f)
  local ok, err = pcall(f)
  assert.is_false(ok)
  assert.equals('table', type(err))
  assert.equals('INVALID_INPUT', err.code)
end

local function is_root()
  local p = io.popen('id -u')
  local uid = p and p:read('*l')
  if p then p:close() end
  return uid == '0'
end

describe('core.fs', function()
  local dir

  before_each(function() dir = tmpdir() end)

  after_each(function()
    if dir then
      os.execute('chmod -R u+rwx ' .. q(dir) .. ' 2>/dev/null')
      local ok = remove(dir, { recursive = true })
      if ok ~= true then os.execute('rm -rf ' .. q(dir)) end
      dir = nil
    end
  end)

  describe('misuse raises INVALID_INPUT at once', function()
    it('for wrong argument types, unknown keys, NUL and empty paths; nothing is created', function()
      local called = false
      local cb = function() called = true end
      local p = dir .. '/f'
      -- read
      invalid(function() fs.read(nil, nil, cb) end)
      invalid(function() fs.read(42, nil, cb) end)
      invalid(function() fs.read('', nil, cb) end)
      invalid(function() fs.read(dir .. '/a\0b', nil, cb) end)
      invalid(function() fs.read(p, 'opts', cb) end)
      invalid(function() fs.read(p, { max_byte = 1 }, cb) end)
      invalid(function() fs.read(p, { max_bytes = -1 }, cb) end)
      invalid(function() fs.read(p, { max_bytes = 1.5 }, cb) end)
      invalid(function() fs.read(p, { max_bytes = '10' }, cb) end)
      invalid(function() fs.read(p, { [1] = true }, cb) end)
      invalid(function() fs.read(p, nil, nil) end)
      invalid(function() fs.read(p, cb) end)
      -- write
      invalid(function() fs.write(nil, 'x', nil, cb) end)
      invalid(function() fs.write('', 'x', nil, cb) end)
      invalid(function() fs.write(dir .. '/a\0b', 'x', nil, cb) end)
      invalid(function() fs.write(p, 42, nil, cb) end)
      invalid(function() fs.write(p, nil, nil, cb) end)
      invalid(function() fs.write(p, 'x', { mode = '644' }, cb) end)
      invalid(function() fs.write(p, 'x', { mode = -1 }, cb) end)
      invalid(function() fs.write(p, 'x', { mode = 65536 }, cb) end)
      invalid(function() fs.write(p, 'x', { mkdir = 'yes' }, cb) end)
      invalid(function() fs.write(p, 'x', { atomic = true }, cb) end)
      invalid(function() fs.write(p, 'x', nil, 'cb') end)
      -- list, stat
      invalid(function() fs.list(nil, cb) end)
      invalid(function() fs.list(dir .. '\0', cb) end)
      invalid(function() fs.list(dir) end)
      invalid(function() fs.stat({}, cb) end)
      invalid(function() fs.stat('', cb) end)
      invalid(function() fs.stat(dir, nil) end)
      -- remove
      invalid(function() fs.remove(dir, { recursive = 1 }, cb) end)
      invalid(function() fs.remove(dir, { force = true }, cb) end)
      invalid(function() fs.remove(dir .. '/x\0', nil, cb) end)
      invalid(function() fs.remove(dir, nil) end)
      -- mkdir
      invalid(function() fs.mkdir(dir .. '/d', { mode = 'rwx' }, cb) end)
      invalid(function() fs.mkdir(dir .. '/d', { parents = true }, cb) end)
      invalid(function() fs.mkdir(dir .. '/d\0e', nil, cb) end)
      invalid(function() fs.mkdir('', nil, cb) end)
      invalid(function() fs.mkdir(dir .. '/d', nil, nil) end)

      assert.is_false(core.alive())
      assert.is_false(called)
      assert.same({}, names(dir))
    end)

    it('gives error tables with the shared metatable', function()
      local ok, err = pcall(fs.read, '', nil, function() end)
      assert.is_false(ok)
      assert.equals(core.error_mt, getmetatable(err))
      assert.matches('^INVALID_INPUT: ', tostring(err))
    end)
  end)

  describe('read', function()
    it('gives nil and no error for a missing file or a file in the middle of the path', function()
      local data, err = read(dir .. '/missing')
      assert.is_nil(data); assert.is_nil(err)
      data, err = read(dir .. '/no/such/file')
      assert.is_nil(data); assert.is_nil(err)
      assert.is_true(write(dir .. '/file', 'x'))
      data, err = read(dir .. '/file/inside')
      assert.is_nil(data); assert.is_nil(err)
    end)

    it('refuses a file over max_bytes with LIMIT_EXCEEDED; exactly max_bytes reads', function()
      local p = dir .. '/ten'
      assert.is_true(write(p, '0123456789'))
      assert.equals('0123456789', read(p, { max_bytes = 10 }))
      local data, err = read(p, { max_bytes = 9 })
      assert.is_nil(data)
      assert.equals('LIMIT_EXCEEDED', err.code)
      assert.equals(core.error_mt, getmetatable(err))
      data, err = read(p, { max_bytes = 0 })
      assert.is_nil(data)
      assert.equals('LIMIT_EXCEEDED', err.code)
      assert.is_true(write(p, ''))
      assert.equals('', read(p, { max_bytes = 0 }))
      assert.equals('', read(p))
    end)

    it('refuses a directory with INVALID_INPUT', function()
      local data, err = read(dir)
      assert.is_nil(data)
      assert.equals('INVALID_INPUT', err.code)
    end)

    it('refuses a fifo with INVALID_INPUT without hanging', function()
      local p = dir .. '/fifo'
      sh('mkfifo ' .. q(p))
      local uv = require('luv')
      local timer = uv.new_timer()
      local timed_out = false
      timer:start(10000, 0, function() timed_out = true end)
      local done, data, err = false, nil, nil
      fs.read(p, nil, function(a, b) done = true; data = a; err = b end)
      while not done and not timed_out do core.run_once() end
      timer:stop(); timer:close()
      assert.is_false(timed_out)
      assert.is_nil(data)
      assert.equals('INVALID_INPUT', err.code)
    end)

    it('reports other failures as IO_ERROR with errno', function()
      if is_root() then
        -- root reads anything; a symlink loop gives an errno all the same.
        sh('ln -s loop ' .. q(dir .. '/loop'))
        local data, err = read(dir .. '/loop')
        assert.is_nil(data)
        assert.equals('IO_ERROR', err.code)
        assert.equals('ELOOP', err.errno)
        assert.equals('IO_ERROR: cannot read: ELOOP', tostring(err))
      else
        local p = dir .. '/secret'
        assert.is_true(write(p, 'x', { mode = 0 }))
        local data, err = read(p)
        assert.is_nil(data)
        assert.equals('IO_ERROR', err.code)
        assert.equals('EACCES', err.errno)
      end
    end)
  end)

  describe('write failures', function()
    it('gives ENOTDIR when a parent is a file and leaves nothing behind', function()
      local f = dir .. '/file'
      assert.is_true(write(f, 'keep'))
      local ok, err = write(f .. '/sub/x', 'data')
      assert.is_nil(ok)
      assert.equals('IO_ERROR', err.code)
      assert.equals('ENOTDIR', err.errno)
      assert.equals('IO_ERROR: cannot write: ENOTDIR', tostring(err))
      assert.equals('keep', read(f))
      assert.same({ 'file' }, names(dir))
    end)

    it('gives EISDIR over a non-empty directory, keeps it and leaves no temporary file', function()
      local target = dir .. '/target'
      assert.is_true(write(target .. '/inner', 'old'))
      local ok, err = write(target, 'new')
      assert.is_nil(ok)
      assert.equals('IO_ERROR', err.code)
      assert.equals('EISDIR', err.errno)
      assert.equals('old', read(target .. '/inner'))
      assert.same({ 'target' }, names(dir))
      assert.same({}, temps(dir))
      ok, err = write(dir .. '/slash/', 'x')
      assert.is_nil(ok)
      assert.equals('EISDIR', err.errno)
    end)

    it('gives ENOENT for a missing parent when mkdir = false', function()
      local ok, err = write(dir .. '/a/b', 'x', { mkdir = false })
      assert.is_nil(ok)
      assert.equals('IO_ERROR', err.code)
      assert.equals('ENOENT', err.errno)
      assert.same({}, names(dir))
    end)

    it('keeps the old content in a read-only directory (non-root only)', function()
      if is_root() then
        pending('running as root: chmod does not stop writes')
        return
      end
      local sub = dir .. '/ro'
      assert.is_true(write(sub .. '/f', 'old'))
      sh('chmod 555 ' .. q(sub))
      local ok, err = write(sub .. '/f', 'new')
      sh('chmod 755 ' .. q(sub))
      assert.is_nil(ok)
      assert.equals('EACCES', err.errno)
      assert.equals('old', read(sub .. '/f'))
      assert.same({}, temps(sub))
    end)
  end)

  describe('list failures', function()
    it('gives nil for a missing path and INVALID_INPUT for a file', function()
      local entries, err = list(dir .. '/missing')
      assert.is_nil(entries); assert.is_nil(err)
      assert.is_true(write(dir .. '/f', 'x'))
      entries, err = list(dir .. '/f/x')
      assert.is_nil(entries); assert.is_nil(err)
      entries, err = list(dir .. '/f')
      assert.is_nil(entries)
      assert.equals('INVALID_INPUT', err.code)
    end)
  end)

  describe('remove failures', function()
    it('gives ENOTEMPTY for a non-empty directory without recursive', function()
      assert.is_true(write(dir .. '/d/f', 'x'))
      local ok, err = remove(dir .. '/d')
      assert.is_nil(ok)
      assert.equals('IO_ERROR', err.code)
      assert.equals('ENOTEMPTY', err.errno)
      assert.equals('x', read(dir .. '/d/f'))
    end)

    it('gives false when nothing is there', function()
      assert.is_false(remove(dir .. '/missing'))
      assert.is_false(remove(dir .. '/missing/deeper', { recursive = true }))
    end)
  end)

  describe('mkdir failures', function()
    it('gives EEXIST only when the path is not a directory', function()
      assert.is_true(mkdir(dir))
      assert.is_true(write(dir .. '/f', 'x'))
      local ok, err = mkdir(dir .. '/f')
      assert.is_nil(ok)
      assert.equals('IO_ERROR', err.code)
      assert.equals('EEXIST', err.errno)
      ok, err = mkdir(dir .. '/f/sub')
      assert.is_nil(ok)
      assert.equals('ENOTDIR', err.errno)
    end)
  end)

  describe('behaviour', function()
    it('round-trips all 256 byte values', function()
      local t = {}
      for i = 0, 255 do t[#t + 1] = string.char(i) end
      local bytes = table.concat(t)
      assert.is_true(write(dir .. '/bytes', bytes))
      assert.equals(bytes, read(dir .. '/bytes'))
      assert.equals(bytes, read(dir .. '/bytes', { max_bytes = 256 }))
    end)

    it('round-trips 20 MiB', function()
      local t = {}
      for i = 0, 255 do t[#t + 1] = string.char((i * 7 + 3) % 256) end
      local big = string.rep(table.concat(t), math.floor(20 * 1024 * 1024 / 256))
      assert.is_true(write(dir .. '/big', big))
      local back = read(dir .. '/big')
      assert.equals(#big, #back)
      assert.is_true(big == back)
      local data, err = read(dir .. '/big', { max_bytes = #big - 1 })
      assert.is_nil(data)
      assert.equals('LIMIT_EXCEEDED', err.code)
    end)

    it('creates parent directories and replaces content', function()
      local p = dir .. '/a/b/c/file.txt'
      assert.is_true(write(p, 'first'))
      assert.equals('first', read(p))
      assert.is_true(write(p, 'second, longer'))
      assert.equals('second, longer', read(p))
      assert.is_true(write(p, ''))
      assert.equals('', read(p))
      assert.same({ 'file.txt' }, names(dir .. '/a/b/c'))
      assert.equals('directory', stat(dir .. '/a/b').type)
    end)

    it('applies the mode', function()
      assert.is_true(write(dir .. '/private', 'x', { mode = tonumber('600', 8) }))
      assert.equals(tonumber('600', 8), stat(dir .. '/private').mode)
      assert.is_true(write(dir .. '/plain', 'x'))
      assert.equals(tonumber('644', 8), stat(dir .. '/plain').mode)
      assert.is_true(mkdir(dir .. '/x/y', { mode = tonumber('700', 8) }))
      assert.equals(tonumber('700', 8), stat(dir .. '/x/y').mode)
    end)

    it('lists entries sorted by name with types, sizes and ms mtimes', function()
      assert.is_true(write(dir .. '/b.txt', 'hello'))
      assert.is_true(write(dir .. '/a.bin', string.rep('\0', 1000)))
      assert.is_true(mkdir(dir .. '/c'))
      sh('ln -s b.txt ' .. q(dir .. '/d-link'))
      sh('mkfifo ' .. q(dir .. '/e-fifo'))
      sh('touch -h -d @1700000000.123 ' .. q(dir .. '/b.txt'))
      local entries = assert(list(dir))
      assert.equals(5, #entries)
      local by = {}
      for i, e in ipairs(entries) do
        by[e.name] = e
        if i > 1 then assert.is_true(entries[i - 1].name < e.name) end
        assert.equals('number', type(e.modified))
        assert.equals(compat.math_type(e.modified), 'integer')
      end
      assert.same({ 'a.bin', 'b.txt', 'c', 'd-link', 'e-fifo' }, names(dir))
      assert.equals('file', by['a.bin'].type)
      assert.equals(1000, by['a.bin'].size)
      assert.equals('file', by['b.txt'].type)
      assert.equals(5, by['b.txt'].size)
      assert.equals(1700000000123, by['b.txt'].modified)
      assert.equals('directory', by['c'].type)
      assert.equals('symlink', by['d-link'].type)
      assert.equals(#'b.txt', by['d-link'].size)
      assert.equals('other', by['e-fifo'].type)
      local now = os.time() * 1000
      assert.is_true(math.abs(by['a.bin'].modified - now) < 60000)
      assert.same({}, assert(list(dir .. '/c')))
    end)

    it('stats with lstat semantics', function()
      assert.is_nil(stat(dir .. '/missing'))
      assert.is_true(write(dir .. '/f', 'abc'))
      sh('ln -s f ' .. q(dir .. '/l'))
      local st = assert(stat(dir .. '/f'))
      assert.equals('file', st.type)
      assert.equals(3, st.size)
      assert.equals('number', type(st.modified))
      assert.equals(tonumber('644', 8), st.mode)
      assert.equals('symlink', stat(dir .. '/l').type)
      assert.equals('directory', stat(dir).type)
    end)

    it('removes files, links and empty directories', function()
      assert.is_true(write(dir .. '/f', 'x'))
      sh('ln -s f ' .. q(dir .. '/l'))
      assert.is_true(mkdir(dir .. '/empty'))
      assert.is_true(remove(dir .. '/l'))
      assert.equals('x', read(dir .. '/f'))
      assert.is_true(remove(dir .. '/f'))
      assert.is_true(remove(dir .. '/empty', { recursive = false }))
      assert.same({}, names(dir))
    end)

    it('removes a tree recursively', function()
      assert.is_true(write(dir .. '/t/a/b/c/deep', 'x'))
      assert.is_true(write(dir .. '/t/a/f1', 'x'))
      assert.is_true(mkdir(dir .. '/t/empty'))
      for i = 1, 50 do assert.is_true(write(dir .. '/t/many/' .. i, 'x')) end
      assert.is_true(remove(dir .. '/t', { recursive = true }))
      assert.is_nil(stat(dir .. '/t'))
      assert.is_true(write(dir .. '/plain', 'x'))
      assert.is_true(remove(dir .. '/plain', { recursive = true }))
      assert.same({}, names(dir))
    end)

    it('never follows a symlink to a directory outside when removing', function()
      local outside = tmpdir()
      local ok, err = pcall(function()
        assert.is_true(write(outside .. '/precious', 'keep me'))
        assert.is_true(write(outside .. '/sub/also', 'keep'))
        assert.is_true(write(dir .. '/tree/own', 'x'))
        sh('ln -s ' .. q(outside) .. ' ' .. q(dir .. '/tree/link'))
        sh('ln -s ' .. q(outside .. '/precious') .. ' ' .. q(dir .. '/tree/filelink'))
        local entries = assert(list(dir .. '/tree'))
        local types = {}
        for _, e in ipairs(entries) do types[e.name] = e.type end
        assert.same({ filelink = 'symlink', link = 'symlink', own = 'file' }, types)

        assert.is_true(remove(dir .. '/tree', { recursive = true }))
        assert.is_nil(stat(dir .. '/tree'))
        assert.equals('keep me', read(outside .. '/precious'))
        assert.equals('keep', read(outside .. '/sub/also'))

        -- A link named with a trailing slash is still the link.
        sh('ln -s ' .. q(outside) .. ' ' .. q(dir .. '/link2'))
        assert.is_true(remove(dir .. '/link2/', { recursive = true }))
        assert.is_nil(stat(dir .. '/link2'))
        assert.same({ 'precious', 'sub' }, names(outside))
      end)
      remove(outside, { recursive = true })
      assert(ok, err)
    end)

    it('completes 200 writes and reads started at once, each callback once', function()
      local n, writes, reads = 200, 0, 0
      for i = 1, n do
        fs.write(dir .. '/many/' .. i, 'content ' .. i, nil, function(ok, err)
          assert(ok, err)
          writes = writes + 1
        end)
      end
      while writes < n do core.run_once() end
      local got = {}
      for i = 1, n do
        fs.read(dir .. '/many/' .. i, nil, function(data)
          got[i] = data
          reads = reads + 1
        end)
      end
      while reads < n do core.run_once() end
      core.run()
      assert.equals(n, writes)
      assert.equals(n, reads)
      for i = 1, n do assert.equals('content ' .. i, got[i]) end
      assert.equals(n, #names(dir .. '/many'))
      assert.same({}, temps(dir .. '/many'))
    end)

    it('survives an error in a callback', function()
      local called = 0
      local reports = util.capture_reports(function()
        fs.stat(dir, function()
          called = called + 1
          error('boom from a spec callback')
        end)
        while called == 0 do core.run_once() end
        core.run()
      end)
      assert.equals(1, #reports)
      assert.matches('error in a loop callback: .*boom from a spec callback', reports[1])
      assert.equals(1, called)
      assert.equals('directory', stat(dir).type)
    end)
  end)
end)
