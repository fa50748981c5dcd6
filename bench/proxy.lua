--- Benchmark of the allow-list's egress proxy, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/proxy.lua [N]
--
-- The proxy (mayura.sandbox._egress, relaying through the core) listens in this process's own
-- network namespace on a port of the kernel's pick, with an allow-list naming the server, which
-- the test-only resolver override points at a BusyBox httpd on 127.0.0.1 (a process of its own,
-- so the server never shares the proxy's loop). The same curl command fetches the same URLs
-- directly and through the proxy:
--   * latency: one curl fetching a 1 KiB file N times in a row (a connection each), so the
--     proxy's work per request (accept, parse, check, connect, relay) is what differs;
--   * throughput: one 100 MiB download, median and best of 11 (on a machine shared with other
--     work the best is the least disturbed; the proxied path has one more process to schedule).
-- Direct and proxied runs alternate.
-- Printed as ratios proxied / direct (the target for the download is at most 1.2x), as the
-- milliseconds the proxy adds to each request, and as the CPU time the proxy's process spends on
-- one download (which no load elsewhere on the machine changes).
local core = require('mayura.core')
local task = require('mayura._task')
local process = require('mayura.process')
local egress = require('mayura.sandbox._egress')
local uv = require('luv')

local N = tonumber(arg and arg[1]) or 100
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local MIB = 1048576
local NAME = 'files.example.com'

local function sh(cmd)
  local r = process.run({ '/bin/sh', '-c', cmd }, { timeout_ms = 120000, max_output_bytes = 1048576 })
  assert(r.exit_code == 0, cmd .. ': ' .. r.stderr)
  return r.stdout
end

local function free_port()
  local t = uv.new_tcp()
  assert(t:bind('127.0.0.1', 0))
  local port = t:getsockname().port
  t:close()
  return port
end

task.run(function()
  local dir = sh('mktemp -d'):match('%S+')
  sh('head -c ' .. 100 * MIB .. ' /dev/zero > ' .. dir .. '/big && head -c 1024 /dev/zero > ' .. dir .. '/small')
  local port = free_port()
  local server = core.spawn({ argv = { 'busybox', 'httpd', '-f', '-p', '127.0.0.1:' .. port, '-h', dir },
    max_output_bytes = 4096 }, function() end)
  assert(server, 'busybox httpd did not start')
  local proxy = egress.start(uv.fs_open('/proc/self/ns/net', 'r', 0), {
    allow = { NAME }, resolve = { [NAME] = '127.0.0.1:' .. port }, port = 0 })
  local proxy_url = 'http://127.0.0.1:' .. proxy.port
  local direct_base, proxied_base = 'http://127.0.0.1:' .. port, 'http://' .. NAME

  -- wait for the server
  for _ = 1, 100 do
    local r = process.run({ 'curl', '-s', '-o', '/dev/null', direct_base .. '/small' }, { timeout_ms = 5000 })
    if r.exit_code == 0 then break end
    task.sleep(20)
  end

  local function curl(base, path, times, via)
    local argv = { 'curl', '-s', '--fail', '-o', '/dev/null' }
    if via then argv[#argv + 1] = '-x'; argv[#argv + 1] = via end
    for _ = 1, times do argv[#argv + 1] = base .. path end
    -- every URL after the first goes to stdout: into the pipe, which process.run reads
    return function()
      local r = process.run(argv, { timeout_ms = 120000, max_output_bytes = times * 2048 })
      assert(r.exit_code == 0, 'curl failed: ' .. r.stderr)
    end
  end

  local unpack_list = table.unpack or unpack -- luacheck: ignore 143
  -- the two alternate, so that a burst of load elsewhere on the machine weighs on both alike
  local function pair(reps, a, b)
    local xa, xb = {}, {}
    a(); b()
    for i = 1, reps do
      xa[i] = bench.measure(1, a, 0)
      xb[i] = bench.measure(1, b, 0)
    end
    local best_a, best_b = math.min(unpack_list(xa)), math.min(unpack_list(xb))
    return bench.median(xa), bench.median(xb), best_a, best_b
  end

  local ok, err = pcall(function()
    local lat_direct, lat_proxy = pair(5, curl(direct_base, '/small', N), curl(proxied_base, '/small', N, proxy_url))
    local dl_direct, dl_proxy, best_direct, best_proxy = pair(11, curl(direct_base, '/big', 1),
      curl(proxied_base, '/big', 1, proxy_url))
    print(string.format('egress proxy, %d requests of 1 KiB: direct %.1f ms, proxied %.1f ms: %.2fx, %.3f ms added '
      .. 'per request', N, lat_direct, lat_proxy, lat_proxy / lat_direct, (lat_proxy - lat_direct) / N))
    print(string.format('egress proxy, 100 MiB download: direct %.1f ms (%.0f MiB/s), proxied %.1f ms '
      .. '(%.0f MiB/s): %.2fx (target <= 1.2x)', dl_direct, 100 / (dl_direct / 1000), dl_proxy,
      100 / (dl_proxy / 1000), dl_proxy / dl_direct))
    print(string.format('egress proxy, 100 MiB download, best of 11: direct %.1f ms, proxied %.1f ms: %.2fx',
      best_direct, best_proxy, best_proxy / best_direct))
    -- what the proxy itself costs, whatever the scheduling: this process's CPU time per download
    local function cpu_ms()
      local r = uv.getrusage()
      return (r.utime.sec + r.stime.sec) * 1000 + (r.utime.usec + r.stime.usec) / 1000
    end
    local fetch = curl(proxied_base, '/big', 1, proxy_url)
    local c0 = cpu_ms()
    for _ = 1, 5 do fetch() end
    print(string.format('egress proxy, 100 MiB download: %.1f ms of the proxy\'s CPU time (user + system) each',
      (cpu_ms() - c0) / 5))
  end)
  proxy:close()
  server:cancel()
  sh('rm -rf ' .. dir)
  if not ok then error(err, 0) end
end)
