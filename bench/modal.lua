--- Benchmark of the Modal provider, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/modal.lua [N_EXEC] [N_FIRST]
--
-- Against the Modal stand-in (spec/npm/modal_stand_in.mjs: Modal's gRPC services over bubblewrap
-- containers, a Node process), the same stand-in for both clients:
--   * time to a first command: create a sandbox, then exec `true` (the release after it is not
--     timed), over N_FIRST runs;
--   * exec round trip: `true` in one sandbox, over N_EXEC runs;
-- through mayura.sandbox.modal (gRPC over HTTP/2 through libcurl, one connection per call, as
-- libcurl 7.88 cannot reuse a prior-knowledge one; and once more over TLS, where HTTP/2 comes by
-- ALPN and connections are reused, against the stand-in served over TLS), and through the
-- official `modal` SDK (a Node process, bench/modal_sdk.mjs, timing itself, so its start is not
-- counted; over h2c, where grpc-js keeps one connection). The ratio is
-- mayura's time over the SDK's. Not like for like: mayura's exec is the command backend (the
-- command started in the background, then polled, each step a TaskExecStart, stdin, stdout read
-- and wait on the command service), the SDK's one exec and its wait. The command-service calls
-- per mayura exec are counted too.
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local core = require('mayura.core')
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')
local timing = require('_first_command')
local modal_stand_in = require('support.modal_stand_in')
local modal = require('mayura.sandbox.modal')

local N_EXEC = tonumber(arg and arg[1]) or 50
local N_FIRST = tonumber(arg and arg[2]) or 10
local TOKEN_ID, TOKEN_SECRET = 'ak-bench0123456789', 'as-bench0123456789'

local sdk_package = io.open('spec/npm/node_modules/modal/package.json')
if not sdk_package or not modal_stand_in.available() then
  error('the SDK or the stand-in\'s packages are not installed: run sh scripts/setup.sh', 0)
end
sdk_package:close()

local stand = modal_stand_in.start({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET })

local pool = sandbox.create_sandboxes(modal.modal_sandboxes({
  token_id = TOKEN_ID, token_secret = TOKEN_SECRET, server_url = stand.url,
}), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'none' } })

local m_first, m_exec, exec_calls = timing.first_and_exec(pool, { lifetime_ms = 600000, network = 'none' },
  N_FIRST, N_EXEC, function() return #stand:calls('TaskExecStart') end)
pool:close()

-- mayura over TLS (HTTP/2 by ALPN, connections reused) against the same stand-in served over TLS
local tls = modal_stand_in.start({ token_id = TOKEN_ID, token_secret = TOKEN_SECRET, tls = true })
local tls_pool = sandbox.create_sandboxes(modal.modal_sandboxes({
  token_id = TOKEN_ID, token_secret = TOKEN_SECRET, server_url = tls.url, ca_file = tls.cert,
}), { max_sandboxes = 1, max_lifetime_ms = 600000, network = { 'none' } })
local tsb = tls_pool:create({ lifetime_ms = 600000, network = 'none' })
local m_exec_tls = bench.measure(N_EXEC, function() assert(tsb:exec({ 'true' }).exit_code == 0) end)
tsb:release()
tls_pool:close()
tls:stop()

local r = process.run({ 'node', 'bench/modal_sdk.mjs' }, {
  timeout_ms = 600000,
  env = {
    PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), MODAL_SERVER_URL = stand.url, MODAL_TOKEN_ID = TOKEN_ID,
    MODAL_TOKEN_SECRET = TOKEN_SECRET, MODAL_CONFIG_PATH = '/nonexistent/.modal.toml',
    N_FIRST = tostring(N_FIRST), N_EXEC = tostring(N_EXEC),
  },
})
stand:stop()
if r.exit_code ~= 0 then error('the SDK run failed: ' .. r.stderr, 0) end
local sdk = core.json.decode(r.stdout:match('RESULT (%b{})'))

timing.print_rows('mayura', 'SDK', {
  { 'time to first command (create + exec true)', m_first, sdk.first_ms },
  { 'exec round trip (true)', m_exec, sdk.exec_ms },
  { 'exec round trip (true), mayura over TLS', m_exec_tls, sdk.exec_ms },   -- h2 by ALPN, connections reused
})
print(('command runs (TaskExecStart) per mayura exec: %.1f'):format(exec_calls))
