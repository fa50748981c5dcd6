--- Benchmark of embedding, not a test: what mayura costs a host that drives the loop itself.
--
--   build/mayura bench/embed.lua [ROUNDS] [RUNS]
--
-- 1. An idle step() (bench/embed_idle.lua under lua5.4 and luajit): target at most 20 µs, with
--    nothing on the loop and with 4 idle sandboxes.
-- 2. The C game host (examples/embed/game.c, 60 frames/s, 3 ms of drawing a frame, mayura_step
--    with a budget of 4 ms) while 4 local sandboxes are created, run commands and move 16 MiB files
--    in and out (bench/embed_load.lua, ROUNDS files each), RUNS times under each Lua, with a state
--    from mayura_newstate() and with one of the host's own (luaL_newstate, as LÖVE or Neovim have):
--    the CPU time of the host's thread in mayura_step per frame (target: no frame over 4 ms; on a
--    machine other programs load, this is mayura's own work, where the wall time is not), its 99th
--    percentile and worst, and the frame of the worst, against the same host's idle frames
--    measured in the same run (the baseline).
local process = require('mayura.process')

local ROUNDS = tonumber(arg and arg[1]) or 2

local function run(argv, env)
  local r = process.run(argv, { env = env, timeout_ms = 300000 })
  if r.exit_code ~= 0 then error(table.concat(argv, ' ') .. ' failed:\n' .. r.stdout .. r.stderr, 0) end
  return r.stdout
end

local function env(build)
  return {
    PATH = os.getenv('PATH'),
    LUA_PATH = 'lua/?.lua;lua/?/init.lua;providers/?.lua;tools/?.lua;;',
    LUA_CPATH = build .. '/lib/?.so;;',
  }
end

print('embedding: idle step() (target <= 20 us)')
for _, v in ipairs({ { 'lua5.4', 'build' }, { 'luajit', 'build/luajit' } }) do
  local out = run({ v[1], 'bench/embed_idle.lua' }, env(v[2]))
  local empty, busy = out:match('idle_step_us ([%d.]+) ([%d.]+)')
  print(string.format('  %-7s empty loop %7.3f us   4 idle sandboxes %7.3f us   %s', v[1], tonumber(empty),
    tonumber(busy), tonumber(busy) <= 20 and 'ok' or 'OVER TARGET'))
end

local RUNS = tonumber(arg and arg[2]) or 3

local function stats(out)
  local s = {}
  s.frames, s.mean, s.p99, s.max, s.cpu_p99, s.cpu_max, s.worst_at, s.frame_max, s.late, s.over = out:match(
    'frames (%d+)  step_us mean ([%d.]+) p99 ([%d.]+) max ([%d.]+)  step_cpu_us p99 ([%d.]+) max ([%d.]+) at (%d+)'
    .. '  frame_ms max ([%d.]+)  late (%d+)  over_4ms (%d+)')
  assert(s.frames, 'no statistics in:\n' .. out)
  for k, v in pairs(s) do s[k] = tonumber(v) end
  return s
end

local function range(list, key)
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(list) do
    lo, hi = math.min(lo, s[key]), math.max(hi, s[key])
  end
  return lo, hi
end

print(string.format('embedding: the C game host at 60 fps, 4 sandboxes running commands and moving 16 MiB files, '
  .. '%d runs each (target: no frame over 4 ms of mayura_step CPU)', RUNS))
local cases = {
  { 'lua5.4', 'build', false }, { 'lua5.4', 'build', true },
  { 'luajit', 'build/luajit', false }, { 'luajit', 'build/luajit', true },
}
local results = {}
for _, c in ipairs(cases) do results[c] = {} end
-- the cases take turns, run after run, so that what else loads the machine falls on them all alike
for _ = 1, RUNS do
  for _, c in ipairs(cases) do
    local argv = { c[2] .. '/embed/game' }
    if c[3] then argv[#argv + 1] = '--own-state' end
    argv[#argv + 1] = 'bench/embed_load.lua'
    argv[#argv + 1] = tostring(ROUNDS)
    table.insert(results[c], stats(run(argv, env(c[2]))))
  end
end
for _, build in ipairs({ 'build', 'build/luajit' }) do
  local idle = stats(run({ build .. '/embed/game', '--frames', '120', 'bench/embed_idle_frames.lua' }, env(build)))
  print(string.format('  %s: idle frames (baseline): step CPU max %.1f us', build .. '/embed/game', idle.cpu_max))
  for _, c in ipairs(cases) do
    if c[2] == build then
      local list = results[c]
      local over = 0
      for _, s in ipairs(list) do over = over + s.over end
      local p99_lo, p99_hi = range(list, 'cpu_p99')
      local max_lo, max_hi = range(list, 'cpu_max')
      local worst_at = {}
      for i, s in ipairs(list) do worst_at[i] = s.worst_at end
      local idle_us = math.max(idle.cpu_max, 1)
      print(string.format('    %-6s %-17s step CPU p99 %.0f-%.0f us, worst %.0f-%.0f us'
        .. ' (%.0f-%.0fx idle, at frames %s); frames over 4 ms: %s', c[1],
        c[3] and 'host\'s own state' or 'mayura_newstate', p99_lo, p99_hi, max_lo, max_hi, max_lo / idle_us,
        max_hi / idle_us, table.concat(worst_at, ','),
        over == 0 and 'none' or over .. ' in ' .. #list .. ' runs (over target)'))
    end
  end
end
