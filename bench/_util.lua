--- Shared by the benchmarks: medians of timed repetitions (milliseconds, monotonic clock).
local uv = require('luv')

local M = {}

function M.median(xs)
  table.sort(xs)
  local n = #xs
  if n % 2 == 1 then return xs[(n + 1) / 2] end
  return (xs[n / 2] + xs[n / 2 + 1]) / 2
end

--- Runs `fn` `warmup` times (2 by default) untimed, then `n` times; returns the median in ms.
function M.measure(n, fn, warmup)
  n = math.max(1, math.floor(n))
  for _ = 1, warmup or 2 do fn() end
  local xs = {}
  for i = 1, n do
    local t0 = uv.hrtime()
    fn()
    xs[i] = (uv.hrtime() - t0) / 1e6
  end
  return M.median(xs)
end

return M
