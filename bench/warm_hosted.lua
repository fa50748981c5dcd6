--- Benchmark of warm sandboxes on a hosted provider, not a test: medians and ratios measured in
-- one run, against the official `e2b` SDK's create on the same E2B stand-in
-- (spec/support/e2b_service.lua, real local sandboxes behind it, served by this process).
--
--   build/mayura bench/warm_hosted.lua [CREATES] [CREATE_DELAY_MS]
--
-- The stand-in answers each create CREATE_DELAY_MS (200) after it made the sandbox, for the
-- time a service takes to boot one (E2B's published figure is about 150 ms; a local sandbox
-- alone starts in a few): the SDK and the cold creates wait for it, a warm create does not.
-- Rows: create + a first command (exec `true`) through mayura with `warm = 2` (the set refilled
-- between creates, untimed), through mayura cold (no warm), and through the SDK
-- (bench/e2b_sdk.mjs: Sandbox.create, then commands.run('true'), timed inside Node);
-- and an exec round trip through mayura, what a warm create is set against. A ratio below 1 is
-- the row faster than the SDK. Needs local sandboxes, and node with the npm clients of spec/npm.
local core = require('mayura.core')
local task = require('mayura._task')
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local e2b = require('mayura.sandbox.e2b')

local CREATES = tonumber(arg and arg[1]) or 8
local CREATE_DELAY_MS = tonumber(arg and arg[2]) or 200
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')

local KEY = 'e2b_bench_0123456789abcdef'

local svc = stand_in.new()
local backing = stand_in.local_backing({ max_sandboxes = 6 })
local state = e2b_service.install(svc, backing, { api_key = KEY })
state.create_delay_ms = CREATE_DELAY_MS

local function provider(warm)
  return e2b.e2b_sandboxes({ api_key = KEY, api_url = svc:url(''), sandbox_url = svc:url(''),
    workdir = '/workspace', warm = warm })
end

-- the median time to a first command over CREATES creates (two more first, untimed); `before`
-- runs untimed ahead of each
local function firsts(pool, before)
  local out = {}
  for i = 1, CREATES + 2 do
    if before then before() end
    local t0 = core.hrtime_ms()
    local sb = pool:create({ lifetime_ms = 300000 })   -- within a warm one's lifetime left
    assert(sb:exec({ 'true' }).exit_code == 0)
    local ms = core.hrtime_ms() - t0
    sb:release()
    if i > 2 then out[#out + 1] = ms end
  end
  return bench.median(out)
end

local warm_provider = provider(2)
local warm_pool = sandbox.create_sandboxes(warm_provider, { max_sandboxes = 3, max_lifetime_ms = 600000 })
local m_warm = firsts(warm_pool, function()
  local deadline = core.hrtime_ms() + 60000
  while warm_provider:warm_ready() < 2 and core.hrtime_ms() < deadline do task.sleep(10) end
end)
local sb = warm_pool:create({ lifetime_ms = 600000 })
local m_exec = bench.measure(40, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
sb:release()
warm_pool:close()

local cold_pool = sandbox.create_sandboxes(provider(0), { max_sandboxes = 2, max_lifetime_ms = 600000 })
local m_cold = firsts(cold_pool)
cold_pool:close()

local r = process.run({ 'node', 'bench/e2b_sdk.mjs' }, {
  env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), E2B_API_KEY = KEY, E2B_API_URL = svc:url(''),
    E2B_SANDBOX_URL = svc:url(''), N_FIRST = tostring(CREATES), N_EXEC = '4' },
  timeout_ms = 600000,
})
local sdk = r.exit_code == 0 and core.json.decode(r.stdout:match('RESULT (%b{})') or '') or nil

backing:close()
svc:close()

if not sdk then
  io.stderr:write('bench/warm_hosted.lua: the SDK side failed: ', r.stdout, r.stderr, '\n')
  os.exit(1)
end

print(('stand-in create delay: %d ms'):format(CREATE_DELAY_MS))
print(('%-48s %10s %10s %8s'):format('create + first exec `true` (median)', 'mayura ms', 'SDK ms', 'ratio'))
local function row(name, m, s)
  print(('%-48s %10.2f %10.2f %7.2fx'):format(name, m, s, m / s))
end
row('e2b, warm = 2', m_warm, sdk.first_ms)
row('e2b, cold', m_cold, sdk.first_ms)
print(('%-48s %10.2f %10s %7.2fx'):format('exec `true` on a live sandbox (vs warm create)', m_exec, '',
  m_warm / m_exec))
