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
local codesandbox = require('mayura.sandbox.codesandbox')
local stand_in = require('support.stand_in')
local util = require('support.util')
local codesandbox_service = require('support.codesandbox_service')
local first_command = require('_first_command')

local N = tonumber(arg and arg[1]) or 10
local TOKEN = 'csb_bench0123456789'
local svc, backing = stand_in.new(), stand_in.local_backing({ max_sandboxes = 4 })
local state = codesandbox_service.install(svc, backing, { token = TOKEN })
local dir = util.tmpdir()
state:start_front(dir)
local pool = sandbox.create_sandboxes(codesandbox.codesandbox_sandboxes({ token = TOKEN, base_url = svc:url(''),
  workdir = codesandbox_service.WORKSPACE }), { max_sandboxes = 2, max_lifetime_ms = 600000, network = { 'all' } })
first_command.run({ label = 'codesandbox', pool = pool, create = { lifetime_ms = 600000, network = 'all' } },
  { label = 'local', pool = backing.pool, create = { lifetime_ms = 600000 } }, N)

first_command.against_sdk({ label = 'codesandbox', sdk_label = 'csb sdk', pool = pool, n = N,
  create = { lifetime_ms = 600000, network = 'all' }, package = '@codesandbox/sdk',
  script = 'bench/codesandbox_sdk.mjs', env = { STAND_IN_URL = svc:url(''), CSB_TOKEN = TOKEN } })
pool:close()
state.close()
backing:close()
svc:close()
util.rmdir(dir)
