-- Loaded by busted before the specs: shared helpers live in spec/support/util.lua.
package.path = 'spec/?.lua;' .. package.path

-- Debian's luv 1.44 can crash in its loop finalizer when the Lua state is
-- closed after handles were closed from their own callbacks (plain luv shows
-- it, without mayura). The specs end without closing the state, so that the
-- exit status is busted's verdict; the host program is not affected, since
-- its loop is its own and luv installs no finalizer for it.
local exit = os.exit
os.exit = function(code) -- luacheck: ignore 122
  io.stdout:flush()
  io.stderr:flush()
  exit(code, false)
end

-- assert.raises_code(code, fn, ...): fn(...) raises a coded error (a table) of `code`; returns the
-- error, so a spec can look at its message and fields.
local luassert = require('luassert')
local say = require('say')
say:set('assertion.raises_code.positive', 'Expected a coded error %s, got:\n%s')
say:set('assertion.raises_code.negative', 'Expected anything but a coded error %s, got:\n%s')
luassert:register('assertion', 'raises_code', function(_, args)
  local code, fn = args[1], args[2]
  local ok, err = pcall(fn, (table.unpack or unpack)(args, 3, args.n))
  local got = ok and 'no error' or (type(err) == 'table' and tostring(err.code) .. ': ' .. tostring(err.message))
    or tostring(err)
  args[1], args[2], args.n = code, got, 2
  return not ok and type(err) == 'table' and err.code == code, { err }
end, 'assertion.raises_code.positive', 'assertion.raises_code.negative')
