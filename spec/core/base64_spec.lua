-- core.base64: standard base64 (RFC 4648) over any bytes (core/b64.c).
local core = require('mayura.core')
local base64 = core.base64

local function assert_invalid(v, err, fragment)
  assert.is_nil(v)
  assert.are.equal('table', type(err))
  assert.are.equal('INVALID_INPUT', err.code)
  assert.are.equal('INVALID_INPUT: ', tostring(err):sub(1, 15))
  if fragment then
    assert.is_truthy(err.message:find(fragment, 1, true),
      'expected "' .. fragment .. '" in "' .. err.message .. '"')
  end
end

local function assert_raises(fn, fragment)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  assert_invalid(nil, err, fragment)
end

describe('core.base64', function()
  describe('failure modes', function()
    it('raises on wrong argument types', function()
      for _, f in ipairs({ base64.encode, base64.decode }) do
        assert_raises(function() f() end, 'expected a string')
        assert_raises(function() f(nil) end, 'expected a string')
        assert_raises(function() f(42) end, 'expected a string, got number')
        assert_raises(function() f({}) end, 'expected a string, got table')
        assert_raises(function() f(true) end, 'expected a string')
      end
    end)

    it('returns nil, err for characters outside the alphabet', function()
      local cases = {
        ['Zm9v!'] = "character '!' at byte 5",
        ['Zm9v-YmFy'] = "character '-' at byte 5", -- the URL-safe alphabet is not accepted
        ['Zm9v_w=='] = "character '_' at byte 5",
        ['Zm9v\0'] = 'byte 0x00 at byte 5',
        ['Zm9v\v'] = 'byte 0x0b at byte 5', -- only space, \t, \r and \n are whitespace
        ['\255Zm9v'] = 'byte 0xff at byte 1',
        ['é'] = 'byte 0xc3 at byte 1',
        ['Zm.9'] = "character '.' at byte 3",
      }
      for s, fragment in pairs(cases) do
        local v, err = base64.decode(s)
        assert_invalid(v, err, fragment)
      end
    end)

    it('returns nil, err for a wrong length or wrong padding', function()
      local cases = {
        'Z', 'Zm9vY', 'Z===', '=', '==', '====', 'Zg=', 'Zg===', 'Zm8==', 'Zm9v=', 'Zm9v==',
        'Zg==Zg==', 'Zg=a', 'Zm8=Y', '=Zm9v', 'Zm9vY\n',
      }
      for _, s in ipairs(cases) do
        local v, err = base64.decode(s)
        assert.is_nil(v, 'decoded: ' .. string.format('%q', s))
        assert_invalid(v, err, 'invalid base64')
      end
      local _, err = base64.decode('Zg==Zg==')
      assert_invalid(nil, err, 'data after padding at byte 5')
      _, err = base64.decode('Zg=')
      assert_invalid(nil, err, 'wrong padding')
    end)
  end)

  describe('encode and decode', function()
    it('gives the RFC 4648 test vectors', function()
      local vectors = {
        { '', '' }, { 'f', 'Zg==' }, { 'fo', 'Zm8=' }, { 'foo', 'Zm9v' },
        { 'foob', 'Zm9vYg==' }, { 'fooba', 'Zm9vYmE=' }, { 'foobar', 'Zm9vYmFy' },
      }
      for _, v in ipairs(vectors) do
        assert.are.equal(v[2], base64.encode(v[1]))
        assert.are.equal(v[1], base64.decode(v[2]))
      end
    end)

    it('uses the standard alphabet', function()
      assert.are.equal('+/+/', base64.encode('\251\255\191'))
      assert.are.equal('\251\255\191', base64.decode('+/+/'))
      assert.are.equal('AAAA', base64.encode('\0\0\0'))
    end)

    it('round-trips all 256 byte values', function()
      local bytes = {}
      for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
      local s = table.concat(bytes)
      local e = base64.encode(s)
      assert.are.equal(344, #e)
      assert.is_nil(e:find('[^A-Za-z0-9+/=]'))
      assert.are.equal(s, base64.decode(e))
      for i = 0, 255 do
        local one = string.char(i)
        assert.are.equal(one, base64.decode(base64.encode(one)))
        assert.are.equal(one .. '\0' .. one, base64.decode(base64.encode(one .. '\0' .. one)))
      end
    end)

    it('takes padding as optional', function()
      assert.are.equal('f', base64.decode('Zg'))
      assert.are.equal('fo', base64.decode('Zm8'))
      assert.are.equal('foob', base64.decode('Zm9vYg'))
    end)

    it('ignores ASCII whitespace', function()
      assert.are.equal('foobar', base64.decode('Zm9v\r\nYmFy'))
      assert.are.equal('foobar', base64.decode(' Zm9v YmFy '))
      assert.are.equal('f', base64.decode('\tZg==\n'))
      assert.are.equal('f', base64.decode('Zg = ='))
      assert.are.equal('', base64.decode(' \r\n\t'))
      local wrapped = base64.encode(string.rep('x', 300)):gsub('(' .. string.rep('.', 76) .. ')', '%1\n')
      assert.are.equal(string.rep('x', 300), base64.decode(wrapped))
    end)

    it('accepts non-zero bits in the last partial group', function()
      assert.are.equal('f', base64.decode('Zh=='))
      assert.are.equal('fo', base64.decode('Zm9='))
    end)

    it('round-trips 10 MiB', function()
      local chunk = {}
      for i = 0, 255 do chunk[#chunk + 1] = string.char((i * 7 + 3) % 256) end
      local s = string.rep(table.concat(chunk), 10 * 1024 * 4)
      assert.are.equal(10 * 1024 * 1024, #s)
      local e = base64.encode(s)
      assert.are.equal(math.ceil(#s / 3) * 4, #e)
      assert.are.equal(s, base64.decode(e))
    end)
  end)
end)
