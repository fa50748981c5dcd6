--- Benchmark of the Daytona provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/daytona.lua [N]
--
-- On one Daytona stand-in (spec/support/daytona_service.lua, real local sandboxes behind it):
-- time to first command (create, then exec `true`; the release is not timed) and an exec round
-- trip of `true` on a running sandbox, through mayura.sandbox.daytona and through the official
-- SDK (@daytonaio/sdk: `create` then `process.executeCommand('true')`, in Node, timed there), in
-- three alternating rounds each (the machine is shared: each figure is the median of the rounds'
-- medians).
-- The ratio is mayura's time over the SDK's. What each does differs: the SDK's execute runs the
-- string in the daemon's shell (`true` is a builtin there) and answers the merged output; mayura
-- starts the command detached and tagged, with stdout, stderr and the exit status apart, in one
-- call too.
local sandbox = require('mayura.sandbox')
local daytona = require('mayura.sandbox.daytona')
local process = require('mayura.process')
local core = require('mayura.core')

local N = tonumber(arg and arg[1]) or 10
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')
local daytona_service = require('support.daytona_service')

local KEY = 'dtn_bench_0123456789abcdef'
local svc = daytona_service.new({ api_key = KEY })
local provider = daytona.daytona_sandboxes({ api_key = KEY, base_url = svc:url('/api') })
local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000 })

local function mayura_round()
  local first = {}
  for i = 1, N + 1 do
    local t0 = core.hrtime_ms()
    local sb = pool:create({ lifetime_ms = 600000 })
    assert(sb:exec({ 'true' }).exit_code == 0)
    if i > 1 then first[#first + 1] = core.hrtime_ms() - t0 end   -- the first is a warm-up
    sb:release()
  end
  local sb = pool:create({ lifetime_ms = 600000 })
  local exec = bench.measure(N * 3, function() assert(sb:exec({ 'true' }).exit_code == 0) end, 3)
  sb:release()
  return bench.median(first), exec
end

local have_sdk = io.open('spec/npm/node_modules/@daytonaio/sdk/package.json', 'r')
if have_sdk then have_sdk:close() end

local function sdk_round()
  local r = process.run({ 'node', 'spec/npm/daytona_sdk.js', 'bench', svc:url('/api'), tostring(N) }, {
    env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), DAYTONA_API_KEY = KEY }, timeout_ms = 600000,
  })
  if r.exit_code ~= 0 then error('the SDK run failed: ' .. r.stderr, 0) end
  local v = core.json.decode(r.stdout)
  return v.first_ms, v.exec_ms
end

local m_first, m_exec, s_first, s_exec = {}, {}, {}, {}
for round = 1, 3 do
  m_first[round], m_exec[round] = mayura_round()
  if have_sdk then s_first[round], s_exec[round] = sdk_round() end
end
pool:close()
svc:close()

local function middle(xs) return bench.median(xs) end

print(('%-44s %10s %10s %8s'):format('operation (median, ms)', 'mayura', 'SDK', 'ratio'))
local rows = {
  { 'time to first command (create + exec true)', middle(m_first), have_sdk and middle(s_first) },
  { 'exec round trip (true)', middle(m_exec), have_sdk and middle(s_exec) },
}
for _, r in ipairs(rows) do
  if r[3] then
    print(('%-44s %10.2f %10.2f %7.2fx'):format(r[1], r[2], r[3], r[2] / r[3]))
  else
    print(('%-44s %10.2f %10s %8s'):format(r[1], r[2], 'n/a', ''))
  end
end
if not have_sdk then print('(no @daytonaio/sdk in spec/npm: sh scripts/setup.sh installs it)') end
