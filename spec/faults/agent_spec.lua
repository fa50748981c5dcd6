-- The in-sandbox agent faulting: answering garbage, answering nothing, closing; and, on every real
-- provider here, killed with SIGKILL from the host in the middle of a command. Each maps to a coded
-- error (SANDBOX_ERROR `failed`, `timeout` or `gone`; never the agent's own words), leaves nothing
-- behind (no process, descriptor, container or cgroup), and the pool stays usable.
--
-- The garbage comes from a provider of this file whose backend is the real one the local and Docker
-- providers share (mayura.sandbox._agent_backend) over one end of core.socketpair(); the other end
-- is a fake agent here that answers the handshake properly and then misbehaves as told (the
-- sandbox's label `mode`).
local sandbox = require('mayura.sandbox')
local agent_backend = require('mayura.sandbox._agent_backend')
local core = require('mayura.core')
local uv = require('luv')
local providers = require('support.providers')
local common = require('security.common')
local util = require('support.util')

local BYTES, INT, BOOL = 1, 2, 3
local MIB = 1048576

-- {======================================================
-- The wire, spoken by hand (core/wire.h)
-- =======================================================

-- Little-endian words by hand, so the specs stay in the subset of Lua 5.4 that LuaJIT runs.
local function u32(n)
  local b = {}
  for i = 1, 4 do
    b[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(b)
end

local function get_u32(s, pos)
  local a, b, c, d = s:byte(pos, pos + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end

local function frame(id, fields)
  local parts = { u32(id) }
  for _, f in ipairs(fields) do
    local key, kind, v = f[1], f[2], f[3]
    local val
    if kind == BYTES then val = v
    elseif kind == INT then val = u32(v) .. u32(0)   -- small non-negative values only
    else val = v and '\1' or '\0' end
    parts[#parts + 1] = string.char(#key) .. key .. string.char(kind) .. u32(#val) .. val
  end
  local body = table.concat(parts)
  return u32(#body) .. body
end

-- The request frames complete in `buf`: a list of { id, op }, and what is left over.
local function requests(buf)
  local out, pos = {}, 1
  while #buf - pos + 1 >= 8 do
    local len = get_u32(buf, pos)
    if #buf - pos + 1 < 4 + len then break end
    local id = get_u32(buf, pos + 4)
    local p, stop, op = pos + 8, pos + 4 + len, nil
    while p < stop do
      local klen = buf:byte(p)
      local key = buf:sub(p + 1, p + klen)
      local kind = buf:byte(p + 1 + klen)
      local vlen = get_u32(buf, p + 2 + klen)
      if key == 'op' and kind == BYTES then op = buf:sub(p + 6 + klen, p + 5 + klen + vlen) end
      p = p + 6 + klen + vlen
    end
    out[#out + 1] = { id = id, op = op }
    pos = stop
  end
  return out, buf:sub(pos)
end

-- }======================================================

-- {======================================================
-- A fake agent, and a provider over it
-- =======================================================

-- What the fake agent answers to the first request after the handshake, by mode.
local ANSWERS = {
  not_a_frame = function() return '\3\0\0\0xyz' end,
  oversized = function() return u32(0x7fffffff) .. string.rep('z', 4096) end,
  wrong_id = function(id) return frame(id + 1000, { { 'exit_code', INT, 0 } }) end,
  wrong_types = function(id)
    return frame(id, { { 'exit_code', BYTES, 'zero' }, { 'stdout', INT, 7 }, { 'stderr', BOOL, true } })
  end,
  no_exit = function(id) return frame(id, { { 'stdout', BYTES, 'x' } }) end,
  bad_listing = function(id)
    return frame(id, { { 'names', BYTES, 'not a list' } })
  end,
  bad_file = function(id) return frame(id, { { 'data', INT, 42 } }) end,
  own_words = function(id)
    return frame(id, { { 'error', BYTES, 'EWHATEVER' }, { 'message', BYTES, 'leaked /secret/host/path' } })
  end,
  huge_output = function(id)
    return frame(id, { { 'exit_code', INT, 0 }, { 'stdout', BYTES, string.rep('o', 8 * MIB) },
      { 'stderr', BYTES, '' }, { 'duration_ms', INT, 1 } })
  end,
  half_frame = function(id)
    local f = frame(id, { { 'exit_code', INT, 0 }, { 'stdout', BYTES, 'never finished' } })
    return f:sub(1, 10)
  end,
  silence = function() return '' end,
  close = function() return nil end,
}

local peers = {}

local function start_peer(fd, mode)
  local pipe = uv.new_pipe(false)
  assert(pipe:open(fd))
  local peer = { pipe = pipe, requests = 0 }
  peers[#peers + 1] = peer
  local buf = ''
  pipe:read_start(function(err, data)
    if err or not data then
      if not pipe:is_closing() then pipe:close() end
      return
    end
    buf = buf .. data
    local reqs
    reqs, buf = requests(buf)
    for _, r in ipairs(reqs) do
      if pipe:is_closing() then return end
      peer.requests = peer.requests + 1
      if r.op == 'hello' then
        pipe:write(frame(r.id, { { 'version', BYTES, '1' }, { 'pid', INT, 1 }, { 'uid', INT, 1000 } }))
      elseif r.op == 'setup' or r.op == 'shutdown' or r.op == 'cancel' then
        pipe:write(frame(r.id, { { 'ok', BOOL, true } }))
      else
        local answer = ANSWERS[mode](r.id)
        if answer == nil then
          pipe:close()
          return
        end
        if answer ~= '' then pipe:write(answer) end
      end
    end
  end)
  function peer.close()
    if not pipe:is_closing() then pipe:close() end
  end
  return peer
end

local Backend = agent_backend.class()
function Backend.url() return 'http://127.0.0.1:1' end
function Backend:release()
  if self.released then return end
  self.released = true
  if not self.closed then
    self.closed = true
    pcall(self.ch.close, self.ch)
  end
  self.peer.close()
end

local function fake_provider()
  local counter = 0
  return {
    id = 'fake-agent',
    features = { stdin = true, ports = false, desktop = false, network = { 'none' } },
    workdir = '/workspace',
    create = function(_, spec)
      local a, b = core.socketpair()
      assert(a, 'no socket pair')
      counter = counter + 1
      local backend = setmetatable({ id = 'fake-' .. counter, closed = false }, Backend)
      backend.ch = core.channel(a, {
        max_frame_bytes = 16 * MIB,
        on_close = function() backend.closed = true end,
      })
      backend.peer = start_peer(b, spec.labels.mode)
      agent_backend.handshake(backend, spec.env, '/workspace')
      return backend
    end,
  }
end

local function open_fds()
  local n = 0
  for _ in io.popen('ls /proc/self/fd'):lines() do n = n + 1 end
  return n
end

-- }======================================================

describe('an agent that answers garbage', function()
  local pool
  local fds_before
  setup(function()
    fds_before = open_fds()
    pool = sandbox.create_sandboxes(fake_provider(), { max_sandboxes = 2, max_lifetime_ms = 60000,
      call_timeout_ms = 500, exec_timeout_ms = 200 })
  end)
  teardown(function() pool:close() end)

  local function with(mode, fn)
    local sb = pool:create({ lifetime_ms = 60000, labels = { mode = mode } })
    local ok, err = pcall(fn, sb)
    sb:release()
    assert.are.equal(0, pool:count())
    if not ok then error(err, 0) end
  end

  local cases = {
    { mode = 'not_a_frame', reason = 'failed' },
    { mode = 'oversized', reason = 'failed' },
    { mode = 'wrong_id', reason = 'failed' },
    { mode = 'wrong_types', reason = 'failed' },
    { mode = 'no_exit', reason = 'failed' },
    { mode = 'own_words', reason = 'failed' },
    { mode = 'half_frame', reason = 'timeout' },
    { mode = 'silence', reason = 'timeout' },
    { mode = 'close', reason = 'gone' },
  }
  for _, c in ipairs(cases) do
    it('maps ' .. c.mode .. ' in an exec to SANDBOX_ERROR ' .. c.reason .. ', in its own words', function()
      with(c.mode, function(sb)
        local t = common.now()
        local err = assert.raises_code('SANDBOX_ERROR', sb.exec, sb, { 'echo', 'hi' })
        assert.are.equal(c.reason, err.reason, tostring(err))
        assert.is_true(common.now() - t < 3000, 'the call took ' .. (common.now() - t) .. ' ms')
        assert.is_nil(err.message:find('secret', 1, true), 'the agent\'s words came through: ' .. err.message)
        assert.is_nil(err.message:find('zero', 1, true))
        if c.reason ~= 'timeout' then
          -- every later call fails too: gone when the channel is done with, or the same garbage again
          for _, call in ipairs({ { sb.read_file, 'x' }, { sb.write_file, 'x', 'y' }, { sb.remove_file, 'x' } }) do
            local err2 = assert.raises_code('SANDBOX_ERROR', call[1], sb, call[2], call[3])
            assert.is_true(err2.reason == 'gone' or err2.reason == c.reason, tostring(err2))
          end
        end
      end)
    end)
  end

  it('maps a listing or a file of the wrong shape to SANDBOX_ERROR failed', function()
    with('bad_listing', function(sb)
      local err = assert.raises_code('SANDBOX_ERROR', sb.list_files, sb, '.')
      assert.are.equal('failed', err.reason)
    end)
    with('bad_file', function(sb)
      local err = assert.raises_code('SANDBOX_ERROR', sb.read_file, sb, 'f')
      assert.are.equal('failed', err.reason)
    end)
  end)

  it('keeps only max_output_bytes of an agent that sends more', function()
    with('huge_output', function(sb)
      local r = sb:exec({ 'echo' })
      assert.are.equal(MIB, #r.stdout)
      assert.is_true(r.truncated)
    end)
  end)

  it('leaves no descriptor behind, and the pool still makes sandboxes', function()
    for _, p in ipairs(peers) do p.close() end
    collectgarbage()
    collectgarbage()
    assert.is_true(util.eventually(function() return open_fds() <= fds_before end, 2000),
      'descriptors: ' .. open_fds() .. ' now, ' .. fds_before .. ' before')
    with('silence', function(sb) assert.are.equal('fake-agent', sb._pool.provider.id) end)
  end)
end)

-- The host's pid of the agent of a real sandbox.
local function agent_pid(prov, sb)
  if prov.kind == 'docker' then
    return tonumber((providers.host("docker inspect --format '{{.State.Pid}}' " .. sb._backend.container)))
  end
  -- the local agent is a descendant of the launcher: the process in the sandbox's cgroup running it
  for _, pid in ipairs(util.procs_matching('/.mayura/agent --fd 3')) do
    local f = io.open('/proc/' .. pid .. '/cgroup')
    local cg = f and f:read('a') or ''
    if f then f:close() end
    local exe = io.open('/proc/' .. pid .. '/comm')
    local comm = exe and exe:read('l') or ''
    if exe then exe:close() end
    if cg:find('/mayura/' .. sb.id, 1, true) and comm == 'agent' then return pid end
  end
  return nil
end

for _, prov in ipairs(providers.list()) do
  describe('the agent killed with SIGKILL from the host (' .. prov.name .. ')', function()
    it('fails the command in flight and every later call with gone; nothing is left; the pool goes on', function()
      local pool = prov.make_pool({ max_sandboxes = 2 })
      local sb = pool:create({ lifetime_ms = 120000 })
      local pid = agent_pid(prov, sb)
      assert.is_not_nil(pid, 'no agent found for ' .. sb.id)
      local running = common.spawn(function()
        return pcall(sb.exec, sb, { 'sh', '-c', 'setsid sleep 39171 >/dev/null 2>&1 </dev/null & exec sleep 39172' },
          { timeout_ms = 60000 })
      end)
      common.sleep(300)
      os.execute('kill -9 ' .. pid)
      local t = common.now()
      local ok, err = running:wait()
      assert.is_false(ok)
      assert.is_true(common.now() - t < 5000)
      assert.is_true(common.is_gone(err), tostring(err))
      assert.is_true(common.is_gone(select(2, pcall(sb.write_file, sb, 'x', 'y'))))
      sb:release()
      assert.is_true(common.eventually(function() return #prov.leftovers(sb) == 0 end, 5000))
      assert.are.same({}, prov.leftovers(sb))
      assert.are.same({}, util.procs_matching('sleep 3917'))
      local again = pool:create({ lifetime_ms = 60000 })
      assert.are.equal('again\n', again:exec({ 'echo', 'again' }).stdout)
      pool:close()
      assert.are.equal(0, pool:count())
    end)
  end)
end
