--- Benchmark of command_sandbox_backend, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/command_backend.lua [N]
--
-- exec of `true` and a 1 MiB file round trip (write_file, then read_file) through the command
-- backend over a transport that runs each command with `sh -c` through a local sandbox's exec
-- (with standard input, 64 KiB commands), against the same calls on a local sandbox directly.
-- The ratio is what running everything as short commands costs over the agent's own calls.
local sandbox = require('mayura.sandbox')
local local_provider = require('mayura.sandbox.local')

local N = tonumber(arg and arg[1]) or 100
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')
local transports = require('support.command_transports')

local MIB = 1048576

local direct_pool = sandbox.create_sandboxes(local_provider.local_sandboxes(),
  { max_sandboxes = 1, max_lifetime_ms = 600000 })
local direct = direct_pool:create({ lifetime_ms = 600000 })
local provider = transports.command_provider({ stdin = true, max_command_bytes = 65536 })
local command_pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
local command = command_pool:create({ lifetime_ms = 600000 })

local data = {}
for i = 1, MIB / 256 do data[i] = string.char(i % 256):rep(256) end
data = table.concat(data)

local function exec_true(sb) return function() assert(sb:exec({ 'true' }).exit_code == 0) end end
local function round_trip(sb)
  return function()
    sb:write_file('bench/file.bin', data)
    assert(sb:read_file('bench/file.bin') == data)
  end
end

local rows = {}
local function row(name, fn_direct, fn_command, n)
  local d = bench.measure(n, fn_direct, 3)
  local c = bench.measure(n, fn_command, 3)
  rows[#rows + 1] = { name, d, c }
end
row('exec true', exec_true(direct), exec_true(command), N)
row('1 MiB write_file + read_file', round_trip(direct), round_trip(command), math.max(5, math.floor(N / 5)))
local calls = provider.transports[1].calls

command:release()
command_pool:close()
provider.pool:close()
direct:release()
direct_pool:close()

print(('%-32s %12s %14s %8s'):format('operation (median)', 'local ms', 'command ms', 'ratio'))
for _, r in ipairs(rows) do print(('%-32s %12.3f %14.3f %7.2fx'):format(r[1], r[2], r[3], r[3] / r[2])) end
print(('transport commands run: %d'):format(calls))
