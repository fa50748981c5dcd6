--- Benchmark of mayura.sandbox.e2b, not a test: medians and ratios measured in one run, against
-- the official `e2b` SDK on the same E2B stand-in (spec/support/e2b_service.lua, real local
-- sandboxes behind it, served by this process).
--
--   build/mayura bench/e2b.lua [EXECS] [CREATES]
--
-- Rows: the time to a first command (create, then exec `true`), and a command's round trip
-- (exec `true` on a live sandbox), through mayura and through the SDK (a Node process:
-- bench/e2b_sdk.mjs, timed inside it). The SDK runs every command as `/bin/bash -l -c`, so
-- mayura's exec of that same argv is a row too. A ratio below 1 is mayura faster. Needs local
-- sandboxes, and node with the npm clients of spec/npm (sh scripts/setup.sh).
local core = require('mayura.core')
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local e2b = require('mayura.sandbox.e2b')

local EXECS = tonumber(arg and arg[1]) or 40
local CREATES = tonumber(arg and arg[2]) or 8
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')
local stand_in = require('support.stand_in')
local e2b_service = require('support.e2b_service')

local KEY = 'e2b_bench_0123456789abcdef'

local svc = stand_in.new()
local backing = stand_in.local_backing({ max_sandboxes = 4 })
e2b_service.install(svc, backing, { api_key = KEY })

local pool = sandbox.create_sandboxes(e2b.e2b_sandboxes({ api_key = KEY, api_url = svc:url(''),
  sandbox_url = svc:url(''), workdir = '/workspace' }), { max_sandboxes = 2, max_lifetime_ms = 600000 })

local function first_command()
  local sb = pool:create({ lifetime_ms = 600000 })
  assert(sb:exec({ 'true' }).exit_code == 0)
  return sb
end

-- the time to a first command, without the release
local firsts = {}
for i = 1, CREATES + 2 do
  local t0 = core.hrtime_ms()
  local sb = first_command()
  local ms = core.hrtime_ms() - t0
  sb:release()
  if i > 2 then firsts[#firsts + 1] = ms end
end
local m_first = bench.median(firsts)

local sb = pool:create({ lifetime_ms = 600000 })
local m_exec = bench.measure(EXECS, function() assert(sb:exec({ 'true' }).exit_code == 0) end)
local m_bash = bench.measure(EXECS, function()
  assert(sb:exec({ '/bin/bash', '-l', '-c', 'true' }).exit_code == 0)
end)
sb:release()

local r = process.run({ 'node', 'bench/e2b_sdk.mjs' }, {
  env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), E2B_API_KEY = KEY, E2B_API_URL = svc:url(''),
    E2B_SANDBOX_URL = svc:url(''), N_FIRST = tostring(CREATES), N_EXEC = tostring(EXECS) },
  timeout_ms = 600000,
})
local sdk = r.exit_code == 0 and core.json.decode(r.stdout:match('RESULT (%b{})')) or nil

pool:close()
backing:close()
svc:close()

if not sdk then
  io.stderr:write('bench/e2b.lua: the SDK side failed: ', r.stdout, r.stderr, '\n')
  os.exit(1)
end

print(('%-44s %10s %10s %8s'):format('operation (median)', 'mayura ms', 'SDK ms', 'ratio'))
local function row(name, m, s)
  print(('%-44s %10.2f %10.2f %7.2fx'):format(name, m, s, m / s))
end
row('create + first exec `true`', m_first, sdk.first_ms)
row('exec `true` (SDK: bash -l -c true)', m_exec, sdk.exec_ms)
row('exec bash -l -c true (both the same argv)', m_bash, sdk.exec_ms)
