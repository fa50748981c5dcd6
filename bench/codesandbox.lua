--- Benchmark of the CodeSandbox provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/codesandbox.lua [N]
--
-- On the CodeSandbox stand-in (spec/support/codesandbox_service.lua, real local sandboxes
-- behind it, its pitcher behind the Node WebSocket front): time to first command and an exec
-- round trip of `true` through mayura.sandbox.codesandbox (each backend command a shell/create
-- over the pitcher WebSocket, MessagePack both ways), beside the local sandboxes behind the
-- stand-in used directly (the baseline); then the same two figures through the official
-- @codesandbox/sdk (a Node process, bench/codesandbox_sdk.mjs, timing itself, so its start is
-- not counted), mayura's over the client's. Not like for like: mayura's exec is the command
-- backend (started in the background, then polled, each a shell of its own), the client's one
-- commands.run, which waits for the exit.
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local sandbox = require('mayura.sandbox')
local core = require('mayura.core')
local process = require('mayura.process')
local codesandbox = require('mayura.sandbox.codesandbox')
local stand_in = require('support.stand_in')
local util = require('support.util')
local codesandbox_service = require('support.codesandbox_service')
local hosted2 = require('_hosted2')

local N = tonumber(arg and arg[1]) or 10
local TOKEN = 'csb_bench0123456789'
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
local state = codesandbox_service.install(svc, backing, { token = TOKEN })
local dir = util.tmpdir()
state:start_front(dir)
local pool = sandbox.create_sandboxes(codesandbox.codesandbox_sandboxes({ token = TOKEN, base_url = svc:url(''),
  workdir = codesandbox_service.WORKSPACE }), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
hosted2.run({ label = 'codesandbox', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)

local function median_of(fn)
  local xs = {}
  for i = 1, N + 1 do
    local t0 = core.hrtime_ms()
    fn()
    if i > 1 then xs[#xs + 1] = core.hrtime_ms() - t0 end
  end
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end
local first = median_of(function()
  local sb = pool:create({ lifetime_ms = 600000, network = 'all' })
  assert(sb:exec({ 'true' }).exit_code == 0)
  sb:release()
end)
local sb = pool:create({ lifetime_ms = 600000, network = 'all' })
local exec = median_of(function() assert(sb:exec({ 'true' }).exit_code == 0) end)
sb:release()
pool:close()
local sdk_package = io.open('spec/npm/node_modules/@codesandbox/sdk/package.json')
if sdk_package then
  sdk_package:close()
  local r = process.run({ 'node', 'bench/codesandbox_sdk.mjs' }, { timeout_ms = 600000, env = {
    PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), STAND_IN_URL = svc:url(''), CSB_TOKEN = TOKEN,
    N_FIRST = tostring(N), N_EXEC = tostring(N * 3) } })
  if r.exit_code ~= 0 then error('the client run failed: ' .. r.stderr, 0) end
  local sdk = core.json.decode(r.stdout:match('RESULT (%b{})'))
  print(('%-44s %12s %12s %8s'):format('operation (median, ms)', 'codesandbox', 'csb sdk', 'ratio'))
  print(('%-44s %12.2f %12.2f %7.2fx'):format('time to first command (create + exec true)', first, sdk.first_ms,
    first / sdk.first_ms))
  print(('%-44s %12.2f %12.2f %7.2fx'):format('exec round trip (true)', exec, sdk.exec_ms, exec / sdk.exec_ms))
else
  print('@codesandbox/sdk is not installed (sh scripts/setup.sh): no client figures')
end
state.close()
backing:close()
svc:close()
util.rmdir(dir)
