-- The error vocabulary: one shape, a closed list of codes (ARCHITECTURE.md, Errors).
local errors = require('mayura.errors')
local core = require('mayura.core')

describe('mayura.errors', function()
  it('makes coded errors that print as CODE: message and keep a cause', function()
    local cause = errors.new('NETWORK_ERROR', 'reset')
    local err = errors.sandbox('unavailable', 'the service did not answer', cause)
    assert.are.equal('SANDBOX_ERROR: the service did not answer', tostring(err))
    assert.are.equal('unavailable', err.reason)
    assert.are.equal(cause, err.cause)
    assert.is_true(errors.is(err, 'SANDBOX_ERROR'))
  end)

  it('refuses to make or raise an error with a code that is not in the list', function()
    local ok, err = pcall(errors.new, 'SANDBOX_EROR', 'typo')
    assert.is_false(ok)
    assert.matches('unknown error code SANDBOX_EROR', err)
    ok, err = pcall(errors.raise, 'NOPE', 'x')
    assert.is_false(ok)
    assert.matches('unknown error code NOPE', err)
    assert.has_error(function() return errors.codes.NOPE end)
    assert.has_error(function() errors.new(nil, 'x') end)
  end)

  it('lists every code the C core raises', function()
    local seen = {}
    for _, file in ipairs({ 'core/proc.c', 'core/fs.c', 'core/http.c', 'core/chan.c', 'core/json.c', 'core/b64.c',
      'core/mayura_core.c', 'core/mc.h' }) do
      local f = assert(io.open(file, 'r'))
      local src = f:read('a')
      f:close()
      for code in src:gmatch('mc_[%w_]+%(L, "([A-Z_]+)"') do seen[code] = true end
      for code in src:gmatch('_fail%(r, "([A-Z_]+)"') do seen[code] = true end
      for code in src:gmatch('#define MC_OOM_CODE "([A-Z_]+)"') do seen[code] = true end
    end
    assert.is_true(seen.INVALID_INPUT and seen.NO_MEMORY, 'the scan found the core\'s codes')
    for code in pairs(seen) do assert.are.equal(code, errors.codes[code]) end
  end)

  it('is the shape the C core raises too', function()
    local value, err = core.json.decode('{')
    assert.is_nil(value)
    assert.is_true(errors.is(err, 'INVALID_INPUT'))
    assert.are.equal('INVALID_INPUT: invalid JSON near byte 1', tostring(err))
    assert.are.equal(errors.mt, getmetatable(err))
  end)
end)
