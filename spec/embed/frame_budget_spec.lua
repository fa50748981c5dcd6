-- A host's frame and what mayura may spend of it: a step's budget counts the CPU time of the host's
-- thread; a channel handles no more replies once it is spent; and under a host that brought its
-- own Lua state (its own allocator: LÖVE, a plain interpreter, this spec runner) a large file read
-- readies the memory of its string a part at a time, and a large block freed is given back at the
-- next steps, so that no single step takes the page faults or the unmapping of many MiB. Page
-- faults and resident memory are counted, not timed (bench/embed.lua measures the time).
local mayura = require('mayura')
local core = require('mayura.core')
local uv = require('luv')

local MIB = 1024 * 1024

-- This process's minor page faults (field 10 of /proc/self/stat, after the command's name).
local function faults()
  local f = assert(io.open('/proc/self/stat'))
  local stat = f:read('*a')
  f:close()
  return tonumber(stat:match('%) %S+ ' .. string.rep('%S+ ', 6) .. '(%d+)'))
end

-- Under AddressSanitizer (make asan) the allocator is the sanitizer's: it reallocates by copying
-- and has shadow memory of its own, so page faults tell nothing there (its run checks the memory).
local sanitized = (os.getenv('MAYURA_CPATH') or ''):find('/asan/', 1, true) ~= nil

local function driven_by(who, fn)
  local before = core.set_driver(who)
  local ok, err = pcall(fn)
  core.set_driver(before)
  if not ok then error(err, 0) end
end

-- Sixteen distinct parts of 1 MiB, joined as a file read in parts is (one `..` of them all).
local function parts16(seed)
  local parts = {}
  for i = 1, 16 do parts[i] = string.rep(string.char(65 + (i + seed) % 26), MIB) end
  return parts
end

local function join16(p)
  return p[1] .. p[2] .. p[3] .. p[4] .. p[5] .. p[6] .. p[7] .. p[8] .. p[9] .. p[10] .. p[11] .. p[12]
    .. p[13] .. p[14] .. p[15] .. p[16]
end

-- A function that makes the string of the parts as a file's read does: under LuaJIT from a string
-- buffer filled beforehand (its `..` would first grow a buffer of its own), else with one `..`.
local function maker(parts)
  local ok, buffer = pcall(require, 'string.buffer')
  if not (rawget(_G, 'jit') and ok) then return function() return join16(parts) end end
  local buf = buffer.new(16 * MIB)
  for i = 1, 16 do buf:put(parts[i]) end
  return function() return buf:tostring() end
end

describe('a step\'s budget', function()
  it('counts the CPU time of the host\'s thread, not the time it was off the CPU', function()
    driven_by('step', function()
      local t = mayura.run(function()
        mayura.sleep(0)                               -- from here on, inside the host's steps
        uv.sleep(40)                                  -- 40 ms blocked: off the CPU
        local idle_over = core.over_budget()
        local t0 = core.cpu_ms()
        while core.cpu_ms() - t0 < 40 do end          -- 40 ms on the CPU
        return idle_over, (core.over_budget())
      end)
      while not t.done do mayura.step(20) end
      local idle_over, busy_over = t:wait()
      assert.is_false(idle_over)
      assert.is_true(busy_over)
    end)
  end)
end)

describe('a channel under a host\'s budget', function()
  it('handles no more replies in a step once its budget is spent: the rest wait for the next steps', function()
    local compat = require('support.compat')
    local function frame(id, data)
      local body = compat.pack('<I4', id) .. compat.pack('<s1Bs4', 'data', 1, data)
      return compat.pack('<I4', #body) .. body
    end
    driven_by('step', function()
      local a, b = core.socketpair()
      local ch = core.channel(a)
      local peer = uv.new_pipe(false)
      peer:open(b)
      local step, handled, per_step = 0, 0, {}
      for i = 1, 8 do
        ch:call({ op = 'x', n = i }, function(reply)
          assert(reply and #reply.data == 8192)
          handled = handled + 1
          per_step[step] = (per_step[step] or 0) + 1
          local t0 = core.cpu_ms()
          while core.cpu_ms() - t0 < 3 do end       -- each reply takes 3 ms of this thread's CPU
        end)
      end
      -- all eight replies (64 KiB) are in the socket before the first step
      local replies = {}
      for i = 1, 8 do replies[i] = frame(i, string.rep(string.char(64 + i), 8192)) end
      peer:write(table.concat(replies))
      while handled < 8 and step < 200 do
        step = step + 1
        mayura.step(2)
      end
      ch:close()
      peer:close()
      mayura.step()
      assert.are.equal(8, handled)
      -- a step's budget (2 ms) is spent by the first reply: one a step
      for at, n in pairs(per_step) do assert.are.equal(1, n, 'step ' .. at .. ' handled ' .. n) end
    end)
  end)
end)

describe('core.prepare_bytes', function()
  it('readies a string\'s memory from the state\'s own allocator, a part at a time', function()
    local block = core.prepare_bytes(16 * MIB)
    assert.are.equal('userdata', type(block), 'this runner\'s state has its own allocator')
    for _ = 1, 16 do block:touch(MIB) end
    local parts = parts16(1)
    local make = maker(parts)
    local before = faults()
    local s, extra = block:make(function(x) return make(), x end, 'passed')
    local made = faults() - before
    assert.are.equal(16 * MIB, #s)
    assert.are.equal('passed', extra)
    assert.is_true(s:sub(1, 1) == parts[1]:sub(1, 1) and s:sub(-1) == parts[16]:sub(-1))
    assert.are.equal(s, join16(parts))
    -- 16 MiB made fresh takes a fault a page (4096); in the readied block next to none
    assert.is_true(made < 1024 or sanitized, tostring(made))
    block:free()                                      -- handed out already: nothing to give back
    block:free()
  end)

  it('gives back a block no string took, and keeps the state\'s allocator after an error', function()
    local block = core.prepare_bytes(4 * MIB)
    block:touch(MIB)
    local small = block:make(function() return string.rep('x', 100) end)
    assert.are.equal(100, #small)
    local ok, err = pcall(block.make, block, function() error('in make', 0) end)
    assert.is_false(ok)
    assert.are.equal('in make', err)
    block:free()
    -- the allocator is the state's own again: a large string comes and goes as before
    local big = string.rep('ab', 3 * MIB)
    assert.are.equal(6 * MIB, #big)
    big = nil   -- luacheck: ignore 311
    collectgarbage()
    assert.is_nil(core.prepare_bytes(1000))            -- small strings are not worth it
    assert.raises_code('INVALID_INPUT', core.prepare_bytes, -1)
    assert.raises_code('INVALID_INPUT', core.prepare_bytes, 'many')
  end)
end)

-- This process's resident memory in MiB (/proc/self/statm, in pages).
local function resident_mib()
  local f = assert(io.open('/proc/self/statm'))
  local pages = tonumber(f:read('*a'):match('^%d+ (%d+)'))
  f:close()
  return pages * 4096 / MIB
end

describe('a large block freed under a host\'s budget, in a state of the host\'s own allocator', function()
  it('is given back at the next steps, a few MiB at a time, not in the collector\'s step', function()
    driven_by('step', function()
      local held, freed_in_step
      local t = mayura.run(function()
        mayura.sleep(0)                               -- from here on, inside the host's steps
        -- (under LuaJIT from a string buffer: string.rep would leave a buffer of LuaJIT's own that
        -- its collector shrinks, which is not a free)
        local ok, buffer = pcall(require, 'string.buffer')
        local big
        if rawget(_G, 'jit') and ok then
          local buf = buffer.new(24 * MIB)
          local piece = string.rep('z', MIB)
          for _ = 1, 24 do buf:put(piece) end
          big = buf:tostring()
          buf:free()
        else
          big = string.rep('z', 24 * MIB)
        end
        assert(#big == 24 * MIB)
        held = resident_mib()
        big = nil   -- luacheck: ignore 311
        collectgarbage()
        collectgarbage()
        freed_in_step = resident_mib()
      end)
      while not t.done do mayura.step(4) end
      t:wait()
      local after
      for _ = 1, 40 do
        mayura.step(4)
        after = resident_mib()
        if held - after >= 20 then break end
      end
      -- the collector's step let go of the string: its memory stays until the next steps ...
      assert.is_true(held - freed_in_step < 8,
        ('held %.0f MiB, then %.0f MiB in the step'):format(held, freed_in_step))
      -- ... which give it back
      assert.is_true(held - after >= 20, ('held %.0f MiB, %.0f MiB after the steps'):format(held, after))
    end)
  end)
end)

describe('a 16 MiB file read under a host\'s budget', function()
  it('spreads the faults of its string over the steps that bring its parts', function()
    local sandbox = require('mayura.sandbox')
    local local_provider = require('mayura.sandbox.local')
    driven_by('step', function()
      local pool, sb
      local t = mayura.run(function()
        pool = sandbox.create_sandboxes(local_provider.local_sandboxes({ tmp_mib = 40, memory_mib = 256 }), {
          max_sandboxes = 1, max_lifetime_ms = 120000, max_file_bytes = 16 * MIB,
        })
        sb = pool:create({ lifetime_ms = 120000 })
        local res = sb:exec({ 'sh', '-c', 'head -c 16777216 /dev/urandom > /tmp/big && echo ok' })
        assert(res.stdout == 'ok\n', res.stderr)
      end)
      while not t.done do mayura.step(4) end
      t:wait()
      local r = mayura.run(function() return sb:read_file('/tmp/big', { max_bytes = 16 * MIB }) end)
      local steps, worst = 0, 0
      while not r.done do
        local before = faults()
        mayura.step(4)
        worst = math.max(worst, faults() - before)
        steps = steps + 1
      end
      local data = r:wait()
      t = mayura.run(function() pool:close() end)
      while not t.done do mayura.step(4) end
      t:wait()
      assert.are.equal(16 * MIB, #data)
      assert.is_true(steps >= 16, tostring(steps))
      -- made in one step, its 16 MiB would fault 4096 pages there; a part's step readies 1 MiB of
      -- it (256 pages) beside the part's own copies
      assert.is_true(worst < 1536 or sanitized, 'the worst step took ' .. worst .. ' page faults')
    end)
  end)
end)
