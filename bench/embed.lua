--- Benchmark of embedding, not a test: what mayura costs a host that drives the loop itself.
--
--   build/mayura bench/embed.lua [ROUNDS]
--
-- 1. An idle step() (bench/embed_idle.lua under lua5.4 and luajit): target at most 20 µs, with
--    nothing on the loop and with 4 idle sandboxes.
-- 2. The C game host (examples/embed/game.c, 60 frames/s, 3 ms of drawing a frame) while 4 local
--    sandboxes are created, run commands and move 16 MiB files in and out (bench/embed_load.lua):
--    the time mayura_step takes in a frame, wall and this thread's CPU (target: none over 4 ms; on a
--    machine other programs load, the CPU time is mayura's own work and the wall time is not),
--    against the same host's idle frames measured in the same run (the baseline; the ratio is of
--    the worst frames).
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

local function stats(out)
  local s = {}
  s.frames, s.mean, s.p99, s.max, s.cpu_p99, s.cpu_max, s.frame_max, s.late, s.over = out:match(
    'frames (%d+)  step_us mean ([%d.]+) p99 ([%d.]+) max ([%d.]+)  step_cpu_us p99 ([%d.]+) max ([%d.]+)'
    .. '  frame_ms max ([%d.]+)  late (%d+)  over_4ms (%d+)')
  assert(s.frames, 'no statistics in:\n' .. out)
  for k, v in pairs(s) do s[k] = tonumber(v) end
  return s
end

print('embedding: the C game host at 60 fps, 4 sandboxes running commands and moving 16 MiB files '
  .. '(target: no frame over 4 ms of mayura work)')
for _, build in ipairs({ 'build', 'build/luajit' }) do
  local game = build .. '/embed/game'
  local idle = stats(run({ game, '--frames', '120', 'bench/embed_idle_frames.lua' }, env(build)))
  local busy = stats(run({ game, 'bench/embed_load.lua', tostring(ROUNDS) }, env(build)))
  print(string.format('  %-23s idle frames: step max %.1f us\n    loaded: %d frames, step wall mean %.1f us'
    .. ' p99 %.1f us max %.1f us (%.0fx idle); step CPU p99 %.1f us max %.1f us; frames over 4 ms of mayura'
    .. ' CPU: %s; worst frame %.1f ms, late frames %d',
    game, idle.max, busy.frames, busy.mean, busy.p99, busy.max, busy.max / math.max(idle.max, 0.001),
    busy.cpu_p99, busy.cpu_max, busy.over == 0 and 'none' or busy.over .. ' (over target)', busy.frame_max,
    busy.late))
end
