-- core.crc32: the CRC-32 of gzip, zip and PNG (core/crc.c), checked against the published check
-- value and against gzip's own trailer for the same bytes.
local core = require('mayura.core')
local process = require('mayura.process')
local util = require('support.util')

describe('core.crc32', function()
  it('gives the check value of CRC-32/ISO-HDLC and 0 for nothing', function()
    assert.are.equal(0xCBF43926, core.crc32('123456789'))
    assert.are.equal(0, core.crc32(''))
    assert.are.equal(0xD202EF8D, core.crc32('\0'))
  end)

  it('continues over data given in parts', function()
    local data = string.rep('mayura\0\255', 5000)
    local crc = 0
    for i = 1, #data, 777 do crc = core.crc32(data:sub(i, i + 776), crc) end
    assert.are.equal(core.crc32(data), crc)
  end)

  it('agrees with the trailer gzip writes', function()
    local dir = util.tmpdir()
    local bytes = {}
    for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
    local data = table.concat(bytes):rep(300)
    local f = assert(io.open(dir .. '/d', 'wb'))
    f:write(data)
    f:close()
    assert.are.equal(0, process.run({ 'gzip', '-n', dir .. '/d' }).exit_code)
    f = assert(io.open(dir .. '/d.gz', 'rb'))
    local gz = f:read('a')
    f:close()
    util.rmdir(dir)
    local b = { gz:byte(#gz - 7, #gz - 4) }
    assert.are.equal(b[1] + b[2] * 256 + b[3] * 65536 + b[4] * 16777216, core.crc32(data))
  end)

  it('refuses what is not a string or a CRC', function()
    for _, args in ipairs({ { nil }, { 42 }, { 'x', -1 }, { 'x', 2 ^ 32 }, { 'x', 1.5 }, { 'x', 'y' } }) do
      assert.raises_code('INVALID_INPUT', core.crc32, args[1], args[2])
    end
  end)
end)
