--- Benchmark of a local cold create, not a test: the median of create+release of a local sandbox
-- against a one-shot `bwrap --unshare-all true`, turn by turn in the same run (for A/B runs of two
-- checkouts: `build/mayura bench/cold.lua [N]` in each).
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')
local process = require('mayura.process')
local core = require('mayura.core')
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local N = tonumber(arg and arg[1]) or 30
local pool = sandbox.create_sandboxes(local_provider.local_sandboxes(), { max_sandboxes = 4, max_lifetime_ms = 600000 })
pool:create({ lifetime_ms = 60000 }):release()
local cold, bw = {}, {}
for _ = 1, N do
  local t0 = core.hrtime_ms()
  assert(process.run({ 'bwrap', '--ro-bind', '/', '/', '--unshare-all', '--die-with-parent', '/bin/true' })
    .exit_code == 0)
  local t1 = core.hrtime_ms()
  pool:create({ lifetime_ms = 60000 }):release()
  local t2 = core.hrtime_ms()
  bw[#bw + 1], cold[#cold + 1] = t1 - t0, t2 - t1
end
pool:close()
local c, b = bench.median(cold), bench.median(bw)
print(('cold create+release %.2f ms, bwrap one-shot %.2f ms, ratio %.2fx'):format(c, b, c / b))
