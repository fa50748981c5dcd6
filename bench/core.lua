--- Benchmark of the core, not a test: medians and ratios measured in one run.
--
--   build/mayura bench/core.lua [N]
--
-- spawn of `true` through mayura.core against os.execute and luv's uv.spawn;
-- an HTTP GET over loopback through mayura.core against the curl command line.
local task = require('mayura._task')
local uv = require('luv')
local http = require('mayura.http')
local process = require('mayura.process')

local N = tonumber(arg and arg[1]) or 200
package.path = 'bench/?.lua;' .. package.path
local bench = require('_util')
local function measure(fn) return bench.measure(N, fn, 5) end

local TRUE = '/bin/true'

local function luv_spawn()
  task.await(function(done)
    local handle
    handle = uv.spawn(TRUE, { args = {} }, function()
      handle:close()
      done()
    end)
  end)
end

-- a loopback server (luv, same loop) answering a fixed body
local server = uv.new_tcp()
server:bind('127.0.0.1', 0)
local port = server:getsockname().port
local body = string.rep('x', 1024)
server:listen(128, function()
  local c = uv.new_tcp()
  server:accept(c)
  c:read_start(function(_, data)
    if not data then c:close(); return end
    c:write('HTTP/1.1 200 OK\r\nContent-Length: ' .. #body .. '\r\nConnection: close\r\n\r\n' .. body,
      function() c:close() end)
  end)
end)
local url = 'http://127.0.0.1:' .. port .. '/'

-- the curl command line runs as a child while the loop serves it
local function curl_cli()
  local r = process.run({ 'curl', '-s', '-o', '/dev/null', url })
  assert(r.exit_code == 0)
end

local rows = {}
local function row(name, ms, base)
  rows[#rows + 1] = { name, ms, base }
end

local m_core = measure(function() assert(process.run({ TRUE }).exit_code == 0) end)
local m_exec = measure(function() os.execute(TRUE) end)
local m_luv = measure(luv_spawn)
row('spawn true: mayura.core', m_core)
row('spawn true: os.execute', m_exec)
row('spawn true: luv uv.spawn', m_luv)

local m_http = measure(function() assert(http.request({ url = url }).status == 200) end)
local m_curl = measure(curl_cli)
row('GET loopback: mayura.core', m_http)
row('GET loopback: curl command line', m_curl)
server:close()

print(('%-36s %12s'):format('operation (median of ' .. N .. ')', 'ms'))
for _, r in ipairs(rows) do print(('%-36s %12.3f'):format(r[1], r[2])) end
print()
print(('mayura.core spawn / os.execute        %.2fx'):format(m_core / m_exec))
print(('mayura.core spawn / luv uv.spawn      %.2fx'):format(m_core / m_luv))
print(('mayura.core GET   / curl command line %.2fx'):format(m_http / m_curl))
