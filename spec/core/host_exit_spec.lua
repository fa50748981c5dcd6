-- The host program's end (build/mayura, core/host.c): luv handles a script leaves open (timers,
-- sockets, unref'd so that they do not hold the loop) are closed through luv while the Lua state
-- still lives, so that luv's close callbacks never run on a state lua_close freed.
local compat = require('support.compat')
local process = require('mayura.process')

describe('the host program at its end', function()
  it('closes the luv handles a script left open before the state goes', function()
    local script = table.concat({
      "local uv = require('luv')",
      "local keep = {}",
      "for i = 1, 2000 do",
      "  local t = uv.new_timer()",
      "  t:start(600000, 0, function() end)",
      "  t:unref()",
      "  local c = uv.new_tcp()",
      "  c:bind('127.0.0.1', 0)",
      "  c:unref()",
      "  keep[#keep + 1], keep[#keep + 2] = t, c",
      "end",
      "print('left ' .. #keep)",
    }, '\n')
    for _ = 1, 3 do
      local r = process.run({ compat.host, '-e', script }, { timeout_ms = 30000, env = {
        PATH = os.getenv('PATH'), LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;tools/?.lua;;',
        LUA_CPATH = compat.cpath .. ';;' } })
      assert.are.equal('left 4000\n', r.stdout, r.stderr)
      assert.are.equal(0, r.exit_code, 'signal ' .. tostring(r.signal))
    end
  end)
end)
