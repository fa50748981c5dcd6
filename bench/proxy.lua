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
--
-- Then, where this process may run the allow-list (root), two local sandboxes of one pool, and one
-- floods the proxy with spec/security/abuse.c's `send` while the other runs `true` again and again:
--   * 48 connections each sending a CONNECT and a ClientHello of 16000 one-byte records, anew
--     for 5 seconds;
--   * 64 connections each asking for a 64 MiB body and never reading it.
-- Printed as the median and the worst exec of `true` during each, as ratios to the idle median
-- (the target: at most 2x), and the host memory the proxy's sockets hold per relayed connection
-- (their queues, from /proc/net/tcp of both namespaces; its pipes add at most 128 KiB each).
local core = require('mayura.core')
local task = require('mayura._task')
local process = require('mayura.process')
local egress = require('mayura.sandbox._egress')
local uv = require('luv')

local N = tonumber(arg and arg[1]) or 100
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')

local MIB = 1048576
local unpack_list = table.unpack or unpack -- luacheck: ignore 143
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

-- {======================================================
-- One sandbox floods, another runs true
-- =======================================================

local function flood_bench()
  package.path = 'spec/?.lua;' .. package.path
  local sandbox = require('mayura.sandbox')
  local common = require('security.common')
  local http_server = require('support.http_server')
  -- the server of the 64 MiB body, a process of its own as above
  local dir = sh('mktemp -d'):match('%S+')
  sh('head -c ' .. 64 * MIB .. ' /dev/zero > ' .. dir .. '/big')
  local port = free_port()
  local server = core.spawn({ argv = { 'busybox', 'httpd', '-f', '-p', '127.0.0.1:' .. port, '-h', dir },
    max_output_bytes = 4096 }, function() end)
  local stall = { port = port, close = function()
    server:cancel()
    sh('rm -rf ' .. dir)
  end }
  -- a server that takes connections and waits (for a request head, which TLS never sends)
  local quiet = http_server.tcp(function() end)
  local provider = require('mayura.sandbox.local').local_sandboxes({ proxy_resolve = {
    ['stall.example.com'] = '127.0.0.1:' .. stall.port, ['tls.example.com'] = '127.0.0.1:' .. quiet.port } })
  local has = false
  for _, n in ipairs(provider.features.network) do has = has or n == 'allowlist' end
  if not has then
    stall.close()
    quiet:close()
    print('egress proxy flood: skipped (the allow-list needs root here)')
    return
  end
  local pool = sandbox.create_sandboxes(provider, { max_sandboxes = 2, max_lifetime_ms = 600000,
    network = { 'none', 'allowlist' } })
  local allow = { allow = { 'stall.example.com', 'tls.example.com' } }
  local a = pool:create({ lifetime_ms = 600000, network = allow })
  local b = pool:create({ lifetime_ms = 600000, network = allow })
  local ok, err = pcall(function()
    common.install(a)
    local function u16(n) return string.char(math.floor(n / 256), n % 256) end
    local name = 'tls.example.com'
    local entry = '\0' .. u16(#name) .. name
    local ext = u16(0) .. u16(#entry + 2) .. u16(#entry) .. entry .. u16(21) .. u16(16000) .. ('\0'):rep(16000)
    local body = '\3\3' .. ('\7'):rep(32) .. '\0' .. u16(2) .. '\0\47' .. '\1\0' .. u16(#ext) .. ext
    local hs = '\1\0' .. u16(#body) .. body
    local records = {}
    for i = 1, #hs do records[i] = '\22\3\1\0\1' .. hs:sub(i, i) end
    a:write_file('/tmp/hello', 'CONNECT tls.example.com:443 HTTP/1.1\r\n\r\n' .. table.concat(records))
    a:write_file('/tmp/get', 'GET http://stall.example.com/big HTTP/1.1\r\n\r\n')
    local function exec_ms()
      local t0 = uv.hrtime()
      assert(b:exec({ 'true' }).exit_code == 0)
      return (uv.hrtime() - t0) / 1e6
    end
    local idle = bench.measure(30, exec_ms)
    -- b's execs while a's command runs (again and again for `again_ms`), and the most `probe()` saw
    local function during(args, probe, again_ms)
      local done, most, xs = false, 0, {}
      local t0 = uv.hrtime()
      local t = task.spawn(function()
        repeat
          common.abuse(a, args, { timeout_ms = 120000 })
        until (uv.hrtime() - t0) / 1e6 > (again_ms or 0)
        done = true
      end)
      while not done do
        xs[#xs + 1] = exec_ms()
        if probe and (uv.hrtime() - t0) / 1e6 > 1000 then most = math.max(most, probe()) end
        task.sleep(20)
      end
      t:wait()
      local worst = math.max(0, unpack_list(xs))
      return bench.median(xs), worst, #xs, most
    end
    local med, worst, n = during({ 'send', '127.0.0.1:3128', '/tmp/hello', '48', '6', '200', '0' }, nil, 5000)
    print(string.format('egress proxy, exec true of one sandbox while another sends ClientHellos of one-byte '
      .. 'records (48 connections): median %.2f ms (%.2fx idle %.2f ms), worst %.1f ms (%.1fx), %d execs',
      med, med / idle, idle, worst, worst / idle, n))
    local function read_all(path)
      local f = assert(io.open(path, 'rb'))
      local text = f:read('a')
      f:close()
      return text
    end
    local function held()
      local total = 0
      local function add(text, pick)
        for l, r, tx, rx in text:gmatch('%d+: %x+:(%x+) %x+:(%x+) %x+ (%x+):(%x+)') do
          if pick(tonumber(l, 16), tonumber(r, 16)) then total = total + tonumber(tx, 16) + tonumber(rx, 16) end
        end
      end
      add(common.sh(a, 'cat /proc/net/tcp').stdout, function(l) return l == 3128 end)
      add(read_all('/proc/net/tcp'), function(_, r) return r == stall.port end)
      return total
    end
    local most
    med, worst, n, most = during({ 'send', '127.0.0.1:3128', '/tmp/get', '64', '4096', '0', '6000' }, held)
    print(string.format('egress proxy, exec true of one sandbox while another holds 64 relayed connections it '
      .. 'never reads: median %.2f ms (%.2fx idle), worst %.1f ms (%.1fx), %d execs', med, med / idle, worst,
      worst / idle, n))
    print(string.format('egress proxy, host memory per relayed connection never read: %.0f KiB in its sockets\' '
      .. 'queues (64 connections: %.1f MiB)', most / 64 / 1024, most / MIB))
  end)
  pool:close()
  stall.close()
  quiet:close()
  if not ok then error(err, 0) end
end

-- }======================================================

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
  flood_bench()
end)
