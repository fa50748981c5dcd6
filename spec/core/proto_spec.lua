-- core.proto: protocol buffers through protobuf-c for the methods of proto/*/*.proto. Round trips
-- of every kind of field the messages use (strings, bytes with NULs, integers at their ends,
-- floats, booleans, enums, nested and repeated messages, maps, a oneof), the bytes Modal's
-- definitions give on the wire, refusals that change nothing, and bytes that are not the message.
local core = require('mayura.core')

local P = core.proto
local API = '/modal.client.ModalClient/'
local ROUTER = '/modal.task_command_router.TaskCommandRouter/'

local function hex(s)
  return (s:gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

describe('core.proto', function()
  it('lists the methods of both services', function()
    local set = {}
    for _, m in ipairs(P.methods()) do set[m] = true end
    assert.is_true(set[API .. 'SandboxCreateV2'])
    assert.is_true(set[ROUTER .. 'TaskExecStdioRead'])
    assert.is_nil(set[API .. 'Nope'])
  end)

  it('puts fields on the wire by their numbers, as Modal defines them', function()
    -- TaskExecStdinWriteRequest: task_id 1, exec_id 2, offset 3 (uint64), data 4 (bytes), eof 5
    local b = P.encode(ROUTER .. 'TaskExecStdinWrite', 'request',
      { task_id = 'ta', exec_id = 'ex', offset = 300, data = 'a\0b', eof = true })
    assert.are.equal('0a027461' .. '12026578' .. '18ac02' .. '2203610062' .. '2801', hex(b))
    -- proto3: zero values are not sent
    assert.are.equal('', P.encode(ROUTER .. 'TaskExecStdinWrite', 'request', { offset = 0, eof = false, data = '' }))
    -- secret_sources 6 > env 2 > contents 1, a map: entries of key 1 and value 2
    assert.are.equal('320c' .. '120a' .. '0a08' .. '0a0161' .. '1203626364', hex(P.encode(API .. 'SandboxCreateV2',
      'request', { secret_sources = { { env = { contents = { a = 'bcd' } } } } })))
  end)

  it('reads back what it wrote, for every kind of field', function()
    local m = API .. 'SandboxCreateV2'
    local v = {
      app_id = 'ap-\u{e9}', tags = { { tag_name = 'k1', tag_value = 'v1' }, { tag_name = 'k2', tag_value = '' } },
      definition = { entrypoint_args = { 'a', '', 'c d' }, timeout_secs = 4294967295, workdir = '/w',
        block_network = true, resources = { milli_cpu = 250, memory_mb = 1 },
        open_ports = { ports = { { port = 1 }, { port = 65535, unencrypted = true } } },
        network_access = { network_access_type = 3, allowed_domains = { 'a.com', 'b.org' } } },
      secret_sources = { { env = { contents = { X = '1', Y = 'two words' } } }, { secret_id = 'st-1' } },
    }
    local back = P.decode(m, 'request', P.encode(m, 'request', v))
    assert.are.equal(v.app_id, back.app_id)
    assert.are.same(v.tags, back.tags)
    assert.are.same(v.definition.entrypoint_args, back.definition.entrypoint_args)
    assert.are.equal(4294967295, back.definition.timeout_secs)
    assert.is_true(back.definition.block_network)
    assert.are.equal(250, back.definition.resources.milli_cpu)
    assert.are.equal(65535, back.definition.open_ports.ports[2].port)
    assert.is_true(back.definition.open_ports.ports[2].unencrypted)
    assert.are.same({ 'a.com', 'b.org' }, back.definition.network_access.allowed_domains)
    assert.are.same({ X = '1', Y = 'two words' }, back.secret_sources[1].env.contents)
    assert.are.equal('st-1', back.secret_sources[2].secret_id)
    assert.is_nil(back.secret_sources[2].env)          -- a message not sent is absent
    assert.are.equal('', back.definition.image_id)      -- a plain field not sent is its zero
    -- floats, 64-bit integers, bytes with every byte value
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    all = table.concat(all)
    local w = P.decode(ROUTER .. 'TaskExecStdinWrite', 'request', P.encode(ROUTER .. 'TaskExecStdinWrite', 'request',
      { offset = 9007199254740991, data = all }))
    assert.are.equal(9007199254740991, w.offset)
    assert.are.equal(all, w.data)
    local t = P.decode(API .. 'SandboxWaitV2', 'request', P.encode(API .. 'SandboxWaitV2', 'request', { timeout = 2.5 }))
    assert.are.equal(2.5, t.timeout)
  end)

  it('keeps a oneof to the member that was set, zero included', function()
    local m = ROUTER .. 'TaskExecPoll'
    assert.are.same({ code = 0 }, P.decode(m, 'response', P.encode(m, 'response', { code = 0 })))
    assert.are.same({ signal = 9 }, P.decode(m, 'response', P.encode(m, 'response', { signal = 9 })))
    assert.are.same({}, P.decode(m, 'response', ''))
    assert.raises_code('INVALID_INPUT', P.encode, m, 'response', { code = 1, signal = 2 })
    local a = API .. 'SandboxGetCommandRouterAccess'
    assert.are.same({ task_id = 'ta-1' }, P.decode(a, 'request', P.encode(a, 'request', { task_id = 'ta-1' })))
  end)

  it('refuses what the message cannot hold, and a method it does not know', function()
    local m = API .. 'SandboxCreateV2'
    local bad = {
      { nope = 1 }, { app_id = 1 }, { app_id = 'a\0b' }, { tags = 'x' }, { tags = { 'x' } },
      { definition = { timeout_secs = -1 } }, { definition = { timeout_secs = 4294967296 } },
      { definition = { timeout_secs = 1.5 } }, { definition = { timeout_secs = 0 / 0 } },
      { definition = { timeout_secs = 1e300 } }, { definition = { block_network = 1 } },
      { definition = { entrypoint_args = { 'a', 2 } } }, { definition = { entrypoint_args = { 'a', nil, 'c' } } },
      { secret_sources = { { env = { contents = { a = 1 } } } } },
      { secret_sources = { { env = { contents = { [1] = 'x' } } } } },
      { [1] = 'x' }, { definition = { open_ports = { ports = { { port = 1 }, { port = 'x' } } } } },
      { tags = { { tag_name = 'a' }, { tag_name = 'b', nope = true } } },
    }
    for i, v in ipairs(bad) do
      local ok, err = pcall(P.encode, m, 'request', v)
      assert.is_false(ok, 'case ' .. i)
      assert.are.equal('INVALID_INPUT', err.code, 'case ' .. i .. ': ' .. tostring(err))
    end
    assert.raises_code('INVALID_INPUT', P.encode, API .. 'SandboxWaitV2', 'request', { timeout = 1e300 })
    assert.raises_code('INVALID_INPUT', P.encode, '/modal.client.ModalClient/Nope', 'request', {})
    assert.raises_code('INVALID_INPUT', P.encode, 'SandboxCreateV2', 'request', {})
    assert.raises_code('INVALID_INPUT', P.encode, m, 'sideways', {})
    assert.raises_code('INVALID_INPUT', P.encode, m, 'request', 'x')
    assert.raises_code('INVALID_INPUT', P.decode, m, 'request', {})
  end)

  it('answers nil and INVALID_OUTPUT for bytes that are not the message, and never more', function()
    local m = API .. 'SandboxCreateV2'
    for _, b in ipairs({ '\255', '\10\5ab', '\10', '\18\200\1x', '\8\128\128\128\128\128\128\128\128\128\128\1' }) do
      local v, err = P.decode(m, 'request', b)
      assert.is_nil(v)
      assert.are.equal('INVALID_OUTPUT', err.code)
    end
    -- random bytes: an answer or a refusal, never a crash
    math.randomseed(7)
    for _ = 1, 2000 do
      local n = math.random(0, 40)
      local t = {}
      for i = 1, n do t[i] = string.char(math.random(0, 255)) end
      local ok = pcall(P.decode, m, 'response', table.concat(t))
      assert.is_true(ok)
    end
    -- a field of a number it does not know is skipped
    assert.are.same({ sandbox_id = 'sb' }, P.decode(API .. 'SandboxCreate', 'response', '\10\2sb' .. '\160\6\1'))
  end)
end)
