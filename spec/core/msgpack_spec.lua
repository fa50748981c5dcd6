-- core.msgpack: MessagePack through msgpack-c, with core.json's conventions (null, array_mt,
-- object_mt): known encodings from the MessagePack specification, round trips, bin, and what
-- decode refuses (cut input, trailing bytes, ext values, repeated or nil keys, max_bytes, a count
-- past the bytes there are, which msgpack-c alone would allocate for).
local core = require('mayura.core')
local mp, json = core.msgpack, core.json

local function hex(s) return (s:gsub('.', function(c) return ('%02x'):format(c:byte()) end)) end
local function unhex(h) return (h:gsub('%x%x', function(x) return string.char(tonumber(x, 16)) end)) end

describe('core.msgpack', function()
  it('encodes as the MessagePack specification says', function()
    assert.are.equal('c0', hex(mp.encode(nil)))
    assert.are.equal('c0', hex(mp.encode(json.null)))
    assert.are.equal('c3c2', hex(mp.encode(true) .. mp.encode(false)))
    assert.are.equal('7f', hex(mp.encode(127)))
    assert.are.equal('e0', hex(mp.encode(-32)))
    assert.are.equal('cd0100', hex(mp.encode(256)))
    assert.are.equal('d0df', hex(mp.encode(-33)))
    assert.are.equal('cb3ff8000000000000', hex(mp.encode(1.5)))
    assert.are.equal('05', hex(mp.encode(5.0)))
    assert.are.equal('a3616263', hex(mp.encode('abc')))
    assert.are.equal('c403000aff', hex(mp.encode(mp.bin('\0\10\255'))))
    assert.are.equal('93010203', hex(mp.encode({ 1, 2, 3 })))
    assert.are.equal('90', hex(mp.encode(setmetatable({}, json.array_mt))))
    assert.are.equal('80', hex(mp.encode({})))
    assert.are.equal('81a16101', hex(mp.encode({ a = 1 })))
    assert.are.equal('81a16190', hex(mp.encode({ a = setmetatable({}, json.array_mt) })))
  end)

  it('decodes what it encodes, bytes exact, with core.json\'s metatables and null', function()
    local v = { id = 7, method = 'shell/create', params = { command = 'echo "x"', size = { cols = 128, rows = 24 },
      flags = { true, false }, ratio = 0.25, big = 2 ^ 40, neg = -5, bytes = mp.bin('\0\1\2\255') } }
    local back = assert(mp.decode(mp.encode(v)))
    assert.are.equal(7, back.id)
    assert.are.equal('shell/create', back.method)
    assert.are.equal('echo "x"', back.params.command)
    assert.are.same({ cols = 128, rows = 24 }, back.params.size)
    assert.are.same({ true, false }, back.params.flags)
    assert.are.equal(json.array_mt, getmetatable(back.params.flags))
    assert.are.equal(json.object_mt, getmetatable(back.params))
    assert.are.equal(0.25, back.params.ratio)
    assert.are.equal(2 ^ 40, back.params.big)
    assert.are.equal(-5, back.params.neg)
    assert.are.equal('\0\1\2\255', back.params.bytes)
    assert.are.equal(json.null, mp.decode(unhex('c0')))
    assert.are.equal('x', mp.decode(unhex('c40178')))              -- bin 8
    assert.are.equal(4294967295, mp.decode(unhex('ceffffffff')))  -- uint 32
    assert.are.equal(1.5, mp.decode(unhex('ca3fc00000')))          -- float 32
  end)

  it('refuses what is not one whole MessagePack value, and raises for values it cannot encode', function()
    for _, bad in ipairs({ '', 'c1', '93 01 02', '01 02', 'd4 01 00', '82 a1 61 01 a1 61 02', '81 c0 01',
      '81 90 01', 'dc', 'dd dd dd dd dd dd dd c2' }) do
      local v, err = mp.decode(unhex(bad:gsub(' ', '')))
      assert.is_nil(v, bad)
      assert.are.equal('INVALID_INPUT', err.code, bad)
    end
    local _, err = mp.decode(mp.encode(string.rep('x', 100)), { max_bytes = 10 })
    assert.are.equal('LIMIT_EXCEEDED', err.code)
    local deep = {}
    for _ = 1, 40 do deep = { deep } end
    assert.are.equal('INVALID_INPUT', select(2, mp.decode(mp.encode(deep))).code)
    local cycle = {}
    cycle.self = cycle
    assert.raises_code('INVALID_INPUT', mp.encode, cycle)
    assert.raises_code('INVALID_INPUT', mp.encode, { f = print })
    assert.raises_code('INVALID_INPUT', mp.encode, { [{}] = 1 })
    assert.raises_code('INVALID_INPUT', mp.decode, 1)
    assert.raises_code('INVALID_INPUT', mp.bin, 1)
  end)
end)
