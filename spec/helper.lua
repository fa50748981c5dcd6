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
