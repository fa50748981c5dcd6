--- Benchmark of streamed output, not a test: how long after a command writes its first line the
-- host's on_stdout has it, on a local sandbox and on Docker (both engines, when a daemon answers).
--
--   build/mayura bench/stream.lua [N]
--
-- The command is the shape of `sh -c 'echo a; sleep 1; echo b'`, as build/bench/forkexec stamp (made
-- by `make bench`; static, so it runs in any image): it prints the wall clock just before it
-- writes, sleeps a second, then prints "b". Host and sandbox share the kernel's clock, so the
-- first chunk's arrival minus the stamp in it is the delay after the write. Each turn starts the
-- command with sandbox:start, takes the first chunk, and kills it (no waiting out the second).
local sandbox = require('mayura.sandbox')
local process = require('mayura.process')
local task = require('mayura._task')
local uv = require('luv')

local N = tonumber(arg and arg[1]) or 30
local STAMP = 'build/bench/forkexec'
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local f = io.open(STAMP, 'rb')
if not f then error(STAMP .. ' is missing: run make bench', 0) end
local stamp_bin = f:read('a')
f:close()

local function now_ns()
  local s, us = uv.gettimeofday()
  return s * 1e9 + us * 1e3
end

-- The delays (ms) from the stamp to its arrival, N turns on sandbox `sb`.
local function first_byte(sb)
  sb:write_file('/tmp/stamp', stamp_bin)
  assert(sb:exec({ 'chmod', '755', '/tmp/stamp' }).exit_code == 0)
  local xs = {}
  for i = -2, N do
    local got
    local p = sb:start({ '/tmp/stamp', 'stamp' }, { on_stdout = function(chunk)
      if not got then got = { now_ns(), chunk } end
    end })
    while not got do task.sleep(1) end
    p:kill()
    pcall(p.wait, p)
    local at = tonumber(got[2]:match('^(%d+)\n'))
    if i > 0 then xs[#xs + 1] = (got[1] - at) / 1e6 end
  end
  return bench.median(xs)
end

local rows = {}
local function run(name, provider)
  local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 1, max_lifetime_ms = 600000 })
  local sb = pool:create({ lifetime_ms = 600000 })
  rows[#rows + 1] = { name, first_byte(sb) }
  sb:release()
  pool:close()
end

run('local', require('mayura.sandbox.local').local_sandboxes())
if process.run({ 'docker', 'info' }, { timeout_ms = 30000 }).exit_code == 0 then
  local docker = require('mayura.sandbox.docker')
  for _, engine in ipairs({ 'cli', 'api' }) do
    run('docker (' .. engine .. ')', docker.docker_sandboxes({ engine = engine, image = 'mayura-test/busybox:1' }))
  end
end

print(('%-28s %12s'):format('first byte after the write', 'ms (median)'))
for _, r in ipairs(rows) do
  print(('%-28s %12.3f   (target <= 5 ms)'):format(r[1], r[2]))
end
