-- Loaded by busted before the specs: shared helpers live in spec/support/util.lua.
package.path = 'spec/?.lua;' .. package.path

-- Debian's luv 1.44 can crash in its loop finalizer when the Lua state is
-- closed after handles were closed from their own callbacks (plain luv shows
-- it, without mayura). The specs end without closing the state, so that the
-- exit status is busted's verdict; the host program is not affected, since
-- its loop is its own and luv installs no finalizer for it.
local exit = os.exit
-- What the core reports (a failed task, an error in a loop callback, a warning about this machine)
-- is kept while the specs run, so a passing run prints only its verdict; a failing one prints it.
local reports = {}
do
  local ok, core = pcall(require, 'mayura.core')
  if ok then core.set_reporter(function(msg) reports[#reports + 1] = msg end) end
end
os.exit = function(code) -- luacheck: ignore 122
  local failed = code ~= 0 and code ~= true
  if failed and #reports > 0 then
    io.stderr:write('\nwhat the core reported during the run:\n')
    for _, msg in ipairs(reports) do io.stderr:write('mayura: ', msg, '\n') end
  end
  io.stdout:flush()
  io.stderr:flush()
  exit(code, false)
end

-- Seeded from the system, so that two runs at once (or two LuaJIT runs, which start from one seed)
-- make different names.
do
  local f = io.open('/dev/urandom', 'rb')
  local b = f and f:read(4) or ''
  if f then f:close() end
  local seed = os.time() % 65536
  for i = 1, #b do seed = (seed * 256 + b:byte(i)) % 2147483647 end
  math.randomseed(seed)
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


-- The slowest spec files of a long run, printed before busted's summary (spec/support/timing.lua).
require('support.timing').install(require('busted'))
