--- Benchmark of the Kubernetes provider, not a test: medians, counts and ratios measured in one run.
--
--   build/mayura bench/kubernetes.lua [N_FIRST] [SCALE_SMALL] [SCALE_LARGE]
--
-- Against the API server stand-in (spec/support/kube_service.lua: HTTPS and WebSockets through its
-- Node front, each Pod a real process in namespaces of its own), served from this process, the
-- same stand-in for both clients (needs root, as its Pods do):
--   * time to a first command (a NetworkPolicy and a Pod made, read until its container runs,
--     then `true` run in it; the deletes after are not timed) and an exec round trip of `true`,
--     through mayura.sandbox.kubernetes and through the official @kubernetes/client-node
--     (bench/kubernetes_sdk.mjs: its CoreV1Api and NetworkingV1Api, and Exec over WebSocket),
--     with the ratio mayura / client. Not like for like, on purpose: mayura's exec is a frame to
--     the agent over the Pod's one attach stream, the client's a new exec stream (a WebSocket
--     handshake through the API server, a process started in the Pod) each time;
--   * the same two figures beside local sandboxes used directly (mayura.sandbox.local: the same
--     agent over a socket pair, no API server between);
--   * scale: SCALE_LARGE (200) sandboxes alive at once against SCALE_SMALL (20), each made by a
--     mayura process of its own (this script again, as `scale-client`, so that its memory and
--     descriptors are mayura's alone, not the stand-in's), creates 10 at a time, then `true` in
--     each, 10 at a time: the time per create and per command, the API requests per create and
--     per command (counted on the stand-in, by kind), and the process's resident memory, open
--     descriptors and sockets per live sandbox, with the ratio large / small.
local core = require('mayura.core')
local uv = require('luv')
local sandbox = require('mayura.sandbox')
local task = require('mayura._task')
local kubernetes = require('mayura.sandbox.kubernetes')
package.path = 'bench/?.lua;spec/?.lua;' .. package.path
local bench = require('_util')

local TOKEN, NS = 'bench-token-0123456789abcdef', 'sandboxes'
local CONCURRENCY = 10

local function options(server, ca_file, extra)
  local o = { server = server, ca_file = ca_file, token = TOKEN, namespace = NS, image = 'busybox:1',
    agent_image = 'mayura/agent:1', memory_mib = 64, cpus = 1 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Runs fn(i) for i = 1..n, `width` at a time, each in a task; waits for all.
local function fan_out(n, width, fn)
  local next_i, running, finished = 1, 0, 0
  local failure
  task.await(function(done)
    local function launch()
      while running < width and next_i <= n do
        local i = next_i
        next_i = next_i + 1
        running = running + 1
        task.spawn(function()
          local ok, err = pcall(fn, i)
          if not ok and not failure then failure = err end
          running, finished = running - 1, finished + 1
          if finished == n then done() else launch() end
        end)
      end
    end
    launch()
  end)
  if failure then error(failure, 0) end
end

-- This process's resident memory (KiB), open descriptors and sockets among them.
local function footprint()
  local f = assert(io.open('/proc/self/status'))
  local rss = tonumber(f:read('a'):match('VmRSS:%s*(%d+)'))
  f:close()
  local fds, sockets = 0, 0
  for name in uv.fs_scandir_next, uv.fs_scandir('/proc/self/fd') do
    fds = fds + 1
    local link = uv.fs_readlink('/proc/self/fd/' .. name)
    if link and link:find('^socket:') then sockets = sockets + 1 end
  end
  return { rss_kib = rss, fds = fds, sockets = sockets }
end

-- {======================================================
-- The scale client: one mayura process holding N sandboxes
-- =======================================================

if arg and arg[1] == 'scale-client' then
  local n = assert(tonumber(arg[2]))
  local p = kubernetes.kubernetes_sandboxes(options(os.getenv('K8S_SERVER'), os.getenv('K8S_CA'),
    { start_timeout_ms = 600000 }))
  local pool = sandbox.create_sandboxes(p, { max_sandboxes = n + 1, max_lifetime_ms = 3600000,
    call_timeout_ms = 600000 })
  local out = {}
  do
    -- one sandbox made and released first: the libraries, TLS and the sweep are then behind us
    local warm = pool:create({ lifetime_ms = 600000 })
    assert(warm:exec({ 'true' }).exit_code == 0)
    warm:release()
    collectgarbage()
    collectgarbage()
    out.before = footprint()
    local sbs, create_ms = {}, {}
    out.create_from = core.hrtime_ms()
    fan_out(n, CONCURRENCY, function(i)
      local t0 = core.hrtime_ms()
      sbs[i] = pool:create({ lifetime_ms = 600000 })
      create_ms[i] = core.hrtime_ms() - t0
    end)
    out.create_to = core.hrtime_ms()
    out.create_median_ms = bench.median(create_ms)
    collectgarbage()
    collectgarbage()
    out.alive = footprint()
    local exec_ms = {}
    out.exec_from = core.hrtime_ms()
    fan_out(n, CONCURRENCY, function(i)
      local t0 = core.hrtime_ms()
      assert(sbs[i]:exec({ 'true' }).exit_code == 0)
      exec_ms[i] = core.hrtime_ms() - t0
    end)
    out.exec_to = core.hrtime_ms()
    out.exec_median_ms = bench.median(exec_ms)
    out.release_from = core.hrtime_ms()
    fan_out(n, CONCURRENCY, function(i) sbs[i]:release() end)
    out.release_to = core.hrtime_ms()
    pool:close()
  end
  io.write('RESULT ', core.json.encode(out), '\n')
  return
end

-- }======================================================

local process = require('mayura.process')
local stand_in = require('support.stand_in')
local kube = require('support.kube_service')
local first_command = require('_first_command')

if not require('support.kube_pods').available() then
  error('the stand-in\'s Pods need root, bubblewrap, nsenter, setpriv and build/mayura-launch', 0)
end

local N_FIRST = tonumber(arg and arg[1]) or 10
local SMALL = tonumber(arg and arg[2]) or 20
local LARGE = tonumber(arg and arg[3]) or 200

local svc = stand_in.new()
local state = kube.install(svc, nil, { token = TOKEN, namespace = NS, images = { 'busybox:1', 'mayura/agent:1' },
  node_cpu = '1000', node_memory = '64Gi' })

local pool = sandbox.create_sandboxes(kubernetes.kubernetes_sandboxes(options(state.server, state.ca_file)),
  { max_sandboxes = 2, max_lifetime_ms = 600000 })

print('time to a first command and an exec round trip, beside @kubernetes/client-node')
first_command.against_sdk({
    label = 'mayura', sdk_label = 'client-node', pool = pool, create = { lifetime_ms = 600000 }, n = N_FIRST,
    package = '@kubernetes/client-node', script = 'bench/kubernetes_sdk.mjs',
    env = { STAND_IN_SERVER = state.server, STAND_IN_CA = state.ca_file, STAND_IN_TOKEN = TOKEN,
      STAND_IN_NAMESPACE = NS },
})

print('\nthe same, beside local sandboxes (the agent without an API server between)')
local local_pool = sandbox.create_sandboxes(require('mayura.sandbox.local').local_sandboxes({ memory_mib = 256 }),
  { max_sandboxes = 2, max_lifetime_ms = 600000 })
first_command.run({ label = 'kubernetes', pool = pool, create = { lifetime_ms = 600000 } },
  { label = 'local', pool = local_pool, create = { lifetime_ms = 600000 } }, N_FIRST)
local_pool:close()
pool:close()

-- The requests the stand-in got from `from` to `to` (ms, the monotonic clock both processes share),
-- by kind.
local function requests(from, to)
  local by = { total = 0 }
  for _, req in ipairs(svc.requests) do
    if req.at >= from and req.at <= to then
      local route = req.route or '?'
      local kind = route:match('/attach$') and 'attach'
        or (route:match('^GET .*/pods/{name}$') and 'get pod')
        or (route:match('^POST .*/pods$') and 'create pod')
        or (route:match('^POST .*/networkpolicies$') and 'create policy')
        or (route:match('^DELETE') and 'delete')
        or (route:match('^GET') and 'list') or 'other'
      by[kind] = (by[kind] or 0) + 1
      by.total = by.total + 1
    end
  end
  return by
end

local function scale(n)
  local r = process.run({ arg[-1] or 'build/mayura', 'bench/kubernetes.lua', 'scale-client', tostring(n) }, {
      timeout_ms = 1800000, max_output_bytes = 1048576,
      env = { PATH = os.getenv('PATH'), HOME = os.getenv('HOME'), MAYURA_BUILD = os.getenv('MAYURA_BUILD'),
        K8S_SERVER = state.server, K8S_CA = state.ca_file },
    })
  if r.exit_code ~= 0 then error('the scale client failed: ' .. tostring(r.stderr), 0) end
  local res = core.json.decode(r.stdout:match('RESULT (%b{})'))
  res.n = n
  res.create_requests = requests(res.create_from, res.create_to)
  res.exec_requests = requests(res.exec_from, res.exec_to)
  res.release_requests = requests(res.release_from, res.release_to)
  return res
end

local small = scale(SMALL)
local large = scale(LARGE)

print(('\nscale: %d sandboxes alive at once against %d (creates and commands %d at a time, one mayura process)')
  :format(LARGE, SMALL, CONCURRENCY))
print(('%-46s %12s %12s %8s'):format('figure', tostring(SMALL), tostring(LARGE), 'ratio'))
local function row(label, a, b, fmt)
  fmt = fmt or '%12.2f'
  local ratio = a ~= 0 and ('%7.2fx'):format(b / a) or '      -'
  print(('%-46s ' .. fmt .. ' ' .. fmt .. ' %s'):format(label, a, b, ratio))
end
local function per(res, field, what) return (res[field][what] or 0) / res.n end
row('wall time per create (ms)', (small.create_to - small.create_from) / SMALL,
  (large.create_to - large.create_from) / LARGE)
row('create latency, median (ms)', small.create_median_ms, large.create_median_ms)
row('wall time per command (ms)', (small.exec_to - small.exec_from) / SMALL, (large.exec_to - large.exec_from) / LARGE)
row('command latency, median (ms)', small.exec_median_ms, large.exec_median_ms)
row('wall time per release (ms)', (small.release_to - small.release_from) / SMALL,
  (large.release_to - large.release_from) / LARGE)
for _, kind in ipairs({ 'total', 'create policy', 'create pod', 'get pod', 'attach', 'list', 'delete' }) do
  row('API requests per create: ' .. kind, per(small, 'create_requests', kind), per(large, 'create_requests', kind))
end
row('API requests per command', per(small, 'exec_requests', 'total'), per(large, 'exec_requests', 'total'))
row('API requests per release', per(small, 'release_requests', 'total'), per(large, 'release_requests', 'total'))
local function delta(res, field) return (res.alive[field] - res.before[field]) / res.n end
row('host RSS per live sandbox (KiB)', delta(small, 'rss_kib'), delta(large, 'rss_kib'))
row('descriptors per live sandbox', delta(small, 'fds'), delta(large, 'fds'))
row('sockets per live sandbox', delta(small, 'sockets'), delta(large, 'sockets'))
row('host RSS with all alive (MiB)', small.alive.rss_kib / 1024, large.alive.rss_kib / 1024)
row('descriptors with all alive', small.alive.fds, large.alive.fds, '%12d')

svc:close()
