-- core.json: JSON encode/decode over cJSON (core/json.c).
local core = require('mayura.core')
local compat = require('support.compat')
local json = core.json

-- nil, err from decode: err is a coded error table.
local function assert_invalid(v, err, fragment)
  assert.is_nil(v)
  assert.are.equal('table', type(err))
  assert.are.equal('INVALID_INPUT', err.code)
  assert.are.equal('INVALID_INPUT: ', tostring(err):sub(1, 15))
  if fragment then
    assert.is_truthy(err.message:find(fragment, 1, true),
      'expected "' .. fragment .. '" in "' .. err.message .. '"')
  end
  return err
end

-- A call that must raise a coded INVALID_INPUT error.
local function assert_raises(fn, fragment)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  return assert_invalid(nil, err, fragment)
end

local function nest(n)
  local t = {}
  for _ = 2, n do t = { t } end
  return t
end

describe('core.json', function()
  describe('failure modes', function()
    it('raises on wrong argument types', function()
      assert_raises(function() json.decode() end, 'expected a string')
      assert_raises(function() json.decode(nil) end, 'expected a string')
      assert_raises(function() json.decode(42) end, 'expected a string')
      assert_raises(function() json.decode({}) end, 'expected a string')
      assert_raises(function() json.decode(true) end, 'expected a string')
      assert_raises(function() json.decode('1', 'opts') end, 'options must be a table')
      assert_raises(function() json.encode(1, 5) end, 'options must be a table')
    end)

    it('raises on unknown or invalid option keys', function()
      assert_raises(function() json.decode('1', { max_depht = 3 }) end, "unknown option 'max_depht'")
      assert_raises(function() json.encode(1, { pretty = true }) end, "unknown option 'pretty'")
      assert_raises(function() json.decode('1', { [1] = 3 }) end, 'option keys must be strings')
      assert_raises(function() json.decode('1', { max_depth = 0 }) end, 'max_depth')
      assert_raises(function() json.decode('1', { max_depth = 1001 }) end, 'max_depth')
      assert_raises(function() json.encode(1, { max_depth = 1.5 }) end, 'max_depth')
      assert_raises(function() json.encode(1, { max_depth = 'deep' }) end, 'max_depth')
    end)

    it('returns nil, err for invalid JSON of many kinds', function()
      local cases = {
        '', '   ', '\n\t', '[', ']', '{', '[1,', '{"a":', '{"a"', '[1,]', '{"a":1,}',
        '[1] x', '{} {}', '1 2', '[1]]', 'nul', 'tru', 'True', 'NULL', 'undefined', 'NaN',
        'Infinity', '-Infinity', "'single'", '"abc', '"a\\x"', '"\\u12"', '"\\u12G4"', '"\\ud800"',
        '"\\udc00\\ud800"', '01', '-01', '1.', '.5', '-', '-.5', '+1', '1e', '1e+', '0x10', '1.5.5',
        '{a:1}', '{"a" 1}', '{"a":1 "b":2}', '[1 2]', '[,1]', '{,}', '"tab\there"', '"nl\nhere"',
        '\1[]', '[1]\0', '\0', '[1,\0 2]', '/* c */ 1', '[1] // c', '\239\187',
      }
      for _, s in ipairs(cases) do
        local v, err = json.decode(s)
        assert.is_nil(v, 'decoded: ' .. string.format('%q', s))
        assert_invalid(v, err, 'invalid JSON')
      end
    end)

    it('returns nil, err instead of crashing on 100000-deep nesting', function()
      local v, err = json.decode(string.rep('[', 100000))
      assert_invalid(v, err, 'deeper than max_depth 1000')
      v, err = json.decode(string.rep('[', 100000) .. string.rep(']', 100000))
      assert_invalid(v, err, 'deeper')
      v, err = json.decode(string.rep('{"a":', 100000) .. '1' .. string.rep('}', 100000))
      assert_invalid(v, err, 'deeper')
      v, err = json.decode(string.rep('[', 100000), { max_depth = 5 })
      assert_invalid(v, err, 'deeper than max_depth 5 near byte 6')
    end)

    it('decodes up to max_depth and refuses one level more', function()
      assert.are.equal('[[[]]]', json.encode(json.decode('[[[]]]', { max_depth = 3 })))
      assert_invalid(json.decode('[[[[]]]]', { max_depth = 3 }))
      local _, err = json.decode('[[[[]]]]', { max_depth = 3 })
      assert_invalid(nil, err, 'deeper than max_depth 3')
      assert.is_table(json.decode('{"a":{"b":{"c":1}}}', { max_depth = 3 }))
      assert_invalid(json.decode('{"a":{"b":{"c":[]}}}', { max_depth = 3 }))
      assert.are.equal(1, json.decode('1', { max_depth = 1 }))
      assert.is_table(json.decode('[]', { max_depth = 1 }))
      -- the default is 1000
      assert.is_table(json.decode(string.rep('[', 1000) .. string.rep(']', 1000)))
      assert_invalid(json.decode(string.rep('[', 1001) .. string.rep(']', 1001)))
      -- brackets inside strings do not count
      assert.are.equal('[[[', json.decode('"[[["', { max_depth = 1 }))
    end)

    it('encodes up to max_depth and refuses one level more', function()
      assert.are.equal('[[{}]]', json.encode(nest(3), { max_depth = 3 }))
      assert_raises(function() json.encode(nest(4), { max_depth = 3 }) end, 'deeper than max_depth 3')
      assert.are.equal('{"a":{"b":{}}}', json.encode({ a = { b = {} } }, { max_depth = 3 }))
      assert_raises(function() json.encode({ a = { b = { c = {} } } }, { max_depth = 3 }) end, 'max_depth')
      assert.are.equal('1', json.encode(1, { max_depth = 1 }))
      assert.are.equal(2000, #json.encode(nest(1000))) -- '[[...{}...]]'
      assert_raises(function() json.encode(nest(1001)) end, 'deeper than max_depth 1000')
    end)

    it('raises on cycles', function()
      local t = {}
      t.self = t
      assert_raises(function() json.encode(t) end, 'cycle')
      local a = {}
      a[1] = a
      assert_raises(function() json.encode(a) end, 'cycle')
      local x, y = {}, {}
      x.y, y.x = y, x
      assert_raises(function() json.encode({ x }) end, 'cycle')
    end)

    it('raises on NaN and infinities', function()
      assert_raises(function() json.encode(0 / 0) end, 'NaN')
      assert_raises(function() json.encode(math.huge) end, 'infinity')
      assert_raises(function() json.encode({ x = -math.huge }) end, 'infinity')
      assert_raises(function() json.encode({ 1, 0 / 0 }) end, 'NaN')
    end)

    it('raises on sparse arrays', function()
      assert_raises(function() json.encode({ 1, nil, 3 }) end, 'sparse array')
      assert_raises(function() json.encode({ [2] = 1 }) end, 'sparse array')
      assert_raises(function() json.encode({ [0] = 1 }) end, 'sparse array')
      assert_raises(function() json.encode({ [-1] = 'x', 'y' }) end, 'sparse array')
    end)

    it('raises on mixed tables and bad keys', function()
      assert_raises(function() json.encode({ 1, 2, a = 3 }) end, 'mixes string and integer keys')
      assert_raises(function() json.encode({ [0] = 1, a = 3 }) end, 'mixes')
      assert_raises(function() json.encode({ [true] = 1 }) end, 'key of type boolean')
      assert_raises(function() json.encode({ [{}] = 1 }) end, 'key of type table')
      assert_raises(function() json.encode({ [1.5] = 1 }) end, 'not an integer or a string')
      assert_raises(function() json.encode(setmetatable({ 1 }, json.object_mt)) end, 'object key of type number')
      assert_raises(function() json.encode({ ['a\0b'] = 1 }) end, 'NUL')
    end)

    it('raises on values JSON cannot hold', function()
      assert_raises(function() json.encode(print) end, 'cannot encode a function')
      assert_raises(function() json.encode(io.stdout) end, 'cannot encode a userdata')
      assert_raises(function() json.encode(coroutine.create(print)) end, 'cannot encode a thread')
      assert_raises(function() json.encode({ f = print }) end, 'function')
    end)

    it('refuses bad \\u escapes and numbers out of range', function()
      local _, err = json.decode('"\\u12G4"')
      assert_invalid(nil, err, 'bad \\u escape')
      _, err = json.decode('["\\u00"]')
      assert_invalid(nil, err, 'near byte 3')
      _, err = json.decode('1e400')
      assert_invalid(nil, err, 'out of range')
      _, err = json.decode('[-1e400]')
      assert_invalid(nil, err, 'out of range')
    end)
  end)

  describe('error positions', function()
    it('names the byte where the input goes wrong', function()
      local _, err = json.decode('[1] x')
      assert_invalid(nil, err, 'near byte 5')
      _, err = json.decode('[1,]')
      assert_invalid(nil, err, 'near byte 4')
      _, err = json.decode('{"a":1,}')
      assert_invalid(nil, err, 'near byte 8')
      _, err = json.decode('[1, 01]')
      assert_invalid(nil, err, 'near byte 5')
      _, err = json.decode('')
      assert_invalid(nil, err, 'empty input')
    end)
  end)

  describe('values', function()
    it('has a null sentinel', function()
      assert.are.equal('userdata', type(json.null))
      assert.are.equal(json.null, json.decode('null'))
      assert.are.equal(json.null, json.decode('[null]')[1])
      assert.are.equal(json.null, json.decode('{"a":null}').a)
      assert.are.equal('null', json.encode(json.null))
      assert.are.equal('null', json.encode(nil))
      assert.are.equal('null', json.encode())
      assert.are.equal('{"a":null}', json.encode({ a = json.null }))
      assert.are.equal('[1,null,3]', json.encode({ 1, json.null, 3 }))
    end)

    it('decodes scalars', function()
      assert.are.equal(true, json.decode('true'))
      assert.are.equal(false, json.decode(' false '))
      assert.are.equal(42, json.decode('\t42\r\n'))
      assert.are.equal('x', json.decode('"x"'))
      assert.are.equal('', json.decode('""'))
      assert.are.equal('true', json.encode(true))
      assert.are.equal('false', json.encode(false))
    end)

    it('round-trips [] and {} with their metatables', function()
      local a, o = json.decode('[]'), json.decode('{}')
      assert.are.equal(json.array_mt, getmetatable(a))
      assert.are.equal(json.object_mt, getmetatable(o))
      assert.are.equal('[]', json.encode(a))
      assert.are.equal('{}', json.encode(o))
      assert.are.equal('[]', json.encode(setmetatable({}, json.array_mt)))
      assert.are.equal('{}', json.encode(setmetatable({}, json.object_mt)))
      assert.are.equal('{}', json.encode({}))
    end)

    it('chooses array or object for plain tables', function()
      assert.are.equal('[1,2,3]', json.encode({ 1, 2, 3 }))
      assert.are.equal('{"a":1}', json.encode({ a = 1 }))
      assert.are.equal('[[1],{"b":[]}]', json.encode({ { 1 }, { b = setmetatable({}, json.array_mt) } }))
      -- array_mt: 1..#t, holes as null, other keys ignored
      local t = setmetatable({ 1, 2, 3 }, json.array_mt)
      t.n = 3
      assert.are.equal('[1,2,3]', json.encode(t))
      -- other metatables do not matter
      assert.are.equal('[1]', json.encode(setmetatable({ 1 }, { __index = function() return 1 end })))
    end)

    it('round-trips nested structures', function()
      local s = '{"a":[1,2.5,"x",true,false,null,{"b":[[],{}]}]}'
      assert.are.equal(s, json.encode(json.decode(s)))
      local v = json.decode('{"a":[1,{"b":{"c":[null,"d"]}}],"e":{}}')
      assert.are.equal(1, v.a[1])
      assert.are.equal('d', v.a[2].b.c[2])
      assert.are.equal(json.null, v.a[2].b.c[1])
      assert.are.same(v, json.decode(json.encode(v)))
    end)

    it('keeps the last of repeated keys', function()
      assert.are.equal(2, json.decode('{"a":1,"a":2}').a)
    end)
  end)

  describe('numbers', function()
    it('decodes integral numbers within 2^53 as integers', function()
      assert.are.equal('integer', compat.math_type(json.decode('0')))
      assert.are.equal('integer', compat.math_type(json.decode('-7')))
      assert.are.equal('integer', compat.math_type(json.decode('1.0')))
      assert.are.equal(1000, json.decode('1e3'))
      assert.are.equal('integer', compat.math_type(json.decode('1e3')))
      assert.are.equal('float', compat.math_type(json.decode('1.5')))
      assert.are.equal('float', compat.math_type(json.decode('1e300')))
      assert.are.equal('float', compat.math_type(json.decode('9007199254740994')))
    end)

    it('keeps 2^53 and -2^53 exact both ways', function()
      local max, min = 9007199254740992, -9007199254740992
      assert.are.equal(max, json.decode('9007199254740992'))
      assert.are.equal('integer', compat.math_type(json.decode('9007199254740992')))
      assert.are.equal(min, json.decode('-9007199254740992'))
      assert.are.equal('integer', compat.math_type(json.decode('-9007199254740992')))
      assert.are.equal('9007199254740992', json.encode(max))
      assert.are.equal('-9007199254740992', json.encode(min))
      assert.are.equal(max - 1, json.decode(json.encode(max - 1)))
    end)

    it('encodes every 64-bit integer exactly', function()
      if not compat.maxinteger then
        return pending('LuaJIT numbers are doubles: no 64-bit integer beyond 2^53 to encode (-2^63 is checked)')
      end
      assert.are.equal('9223372036854775807', json.encode(compat.maxinteger))
      assert.are.equal('-9223372036854775808', json.encode(compat.mininteger))
      assert.are.equal('[0,-1,123456789012345678]', json.encode({ 0, -1, 123456789012345678 }))
    end)

    it('encodes the whole numbers of a double exactly, -2^63 included', function()
      assert.are.equal('-9223372036854775808', json.encode(compat.mininteger))
      assert.are.equal('[0,-1,4503599627370497]', json.encode({ 0, -1, 2 ^ 52 + 1 }))
    end)

    it('encodes floats in the shortest form that reads back the same', function()
      assert.are.equal('0.1', json.encode(0.1))
      assert.are.equal('1.5', json.encode(1.5))
      assert.are.equal('3', json.encode(3.0)) -- integral floats print without a fraction
      -- a float in Lua 5.4 keeps its sign; LuaJIT has no float kind and encodes the whole number 0
      assert.are.equal(compat.math_type(-0.0) == 'float' and '-0' or '0', json.encode(-0.0))
      assert.are.equal('1e+300', json.encode(1e300))
      for _, f in ipairs({ 1 / 3, 2 / 3, 0.1 + 0.2, 5e-324, 1.7976931348623157e308, math.pi, -2.5e-8 }) do
        assert.are.equal(f, json.decode(json.encode(f)))
      end
    end)
  end)

  describe('strings', function()
    it('escapes quotes, backslashes and control characters, NUL included', function()
      assert.are.equal('"a\\"b\\\\c/"', json.encode('a"b\\c/'))
      assert.are.equal('"\\b\\f\\n\\r\\t"', json.encode('\b\f\n\r\t'))
      assert.are.equal('"a\\u0000b\\u0001\\u001f"', json.encode('a\0b\1\31'))
      assert.are.equal('{"k\\n\\"":"v"}', json.encode({ ['k\n"'] = 'v' }))
    end)

    it('round-trips every control character and NUL', function()
      local chars = {}
      for i = 0, 31 do chars[#chars + 1] = string.char(i) end
      local s = table.concat(chars) .. '"\\/\127 end'
      assert.are.equal(s, json.decode(json.encode(s)))
      assert.are.equal('x\0y', json.decode(json.encode({ 'x\0y' }))[1])
    end)

    it('passes bytes >= 0x80 through unchanged', function()
      assert.are.equal('"é\255"', json.encode('é\255'))
      assert.are.equal('é', json.decode('"é"'))
      assert.are.equal(1, json.decode('{"é":1}')['é'])
    end)

    it('decodes escapes, \\u00e9 and surrogate pairs to UTF-8', function()
      assert.are.equal('é', json.decode('"\\u00e9"'))
      assert.are.equal('é', json.decode('"\\u00E9"'))
      assert.are.equal('\u{1F600}', json.decode('"\\ud83d\\ude00"'))
      assert.are.equal('"\\/\b\f\n\r\t', json.decode('"\\"\\\\\\/\\b\\f\\n\\r\\t"'))
      assert.are.equal('\1', json.decode('"\\u0001"'))
    end)

    it('decodes \\u0000 to a NUL byte, in values and keys', function()
      assert.are.equal('a\0b', json.decode('"a\\u0000b"'))
      assert.are.equal('\0\0', json.decode('"\\u0000\\u0000"'))
      assert.are.equal(1, json.decode('{"k\\u0000":1}')['k\0'])
      -- raw bytes 0xff next to it are kept as they are
      assert.are.equal('\255\0\255\2550', json.decode('"\255\\u0000\255\2550"'))
      assert.are.equal('\\u0000', json.decode('"\\\\u0000"'))
      assert.are.same({ 'x\0', '\255' }, json.decode('["x\\u0000","\255"]'))
    end)
  end)

  describe('large input', function()
    it('encodes and decodes a 20 MiB array', function()
      local parts = {}
      for i = 1, 20 * 1024 do parts[i] = string.rep(string.char(65 + i % 26), 1024) end
      local s = json.encode(parts)
      assert.is_true(#s > 20 * 1024 * 1024)
      local v = json.decode(s)
      assert.are.equal(#parts, #v)
      assert.are.equal(parts[1], v[1])
      assert.are.equal(parts[#parts], v[#v])
      assert.are.equal(s, json.encode(v))
    end)

    it('handles an array of a million integers', function()
      local n = {}
      for i = 1, 1000000 do n[i] = i * 1000003 end
      local v = json.decode(json.encode(n))
      assert.are.equal(#n, #v)
      assert.are.equal(n[1000000], v[1000000])
      assert.are.equal('integer', compat.math_type(v[1000000]))
    end)
  end)
end)
