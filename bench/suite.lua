--- Benchmark of the spec suite itself, not a test: its wall time under LuaJIT against Lua 5.4,
-- measured in one run (each interpreter with its own build of the core, as `make test` runs them).
--
--   build/mayura bench/suite.lua [N] [PATHS...]
--
-- N runs of each (1 by default; the median is kept), alternating; PATHS are busted's (spec/core and
-- spec/lua by default, the specs that need neither Docker nor sandboxes; `spec` for the whole suite).
-- Needs both builds: `make all` and `make all LUA=luajit`.
local process = require('mayura.process')
local core = require('mayura.core')

package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local n = math.max(1, math.floor(tonumber(arg and arg[1]) or 1))
local paths = {}
for i = 2, arg and #arg or 0 do paths[#paths + 1] = arg[i] end
if #paths == 0 then paths = { 'spec/core', 'spec/lua' } end

local PASSES = {
  { name = 'Lua 5.4', lua = 'lua5.4', build = 'build' },
  { name = 'LuaJIT', lua = 'luajit', build = 'build/luajit' },
}

-- One pass: its wall time in ms and busted's summary line.
local function run(pass)
  local argv = { 'env', 'MAYURA_BUILD=' .. pass.build, pass.lua, 'spec/runner.lua', '-o', 'TAP' }
  for _, p in ipairs(paths) do argv[#argv + 1] = p end
  local t0 = core.hrtime_ms()
  local r = process.run(argv, { max_output_bytes = 64 * 1048576 })
  local ms = core.hrtime_ms() - t0
  local ok_count, not_ok = 0, 0
  for line in r.stdout:gmatch('[^\n]+') do
    if line:match('^ok ') then ok_count = ok_count + 1 elseif line:match('^not ok ') then not_ok = not_ok + 1 end
  end
  return ms, ('%d ok, %d not ok, exit %s'):format(ok_count, not_ok, tostring(r.exit_code))
end

local times, notes = {}, {}
for _, pass in ipairs(PASSES) do times[pass.lua] = {} end
for _ = 1, n do
  for _, pass in ipairs(PASSES) do
    local ms, note = run(pass)
    table.insert(times[pass.lua], ms)
    notes[pass.lua] = note
  end
end

print(('the suite (%s), median of %d'):format(table.concat(paths, ' '), n))
local med = {}
for _, pass in ipairs(PASSES) do
  med[pass.lua] = bench.median(times[pass.lua])
  print(('%-8s %10.1f s   %s'):format(pass.name, med[pass.lua] / 1000, notes[pass.lua]))
end
print(('suite wall time LuaJIT / Lua 5.4      %.2fx'):format(med.luajit / med['lua5.4']))
