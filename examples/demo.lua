--- The foundation demo: processes and a loopback HTTP fetch, all at once on one loop.
--
-- Starts a tiny HTTP server on 127.0.0.1 (luv, same loop), then runs five
-- commands and five GETs concurrently as tasks, and prints what each gave
-- and how long the whole took: about the time of the slowest, not the sum.
local mayura = require('mayura')
local process = require('mayura.process')
local http = require('mayura.http')
local core = require('mayura.core')
local uv = require('luv')

-- A loopback server that answers every request with its path after 200 ms.
local server = uv.new_tcp()
server:bind('127.0.0.1', 0)
local port = server:getsockname().port
server:listen(64, function()
  local client = uv.new_tcp()
  server:accept(client)
  client:read_start(function(_, data)
    if not data then client:close(); return end
    local path = data:match('^GET (%S+)') or '/'
    local timer = uv.new_timer()
    timer:start(200, 0, function()
      timer:close()
      local body = 'you asked for ' .. path
      client:write('HTTP/1.1 200 OK\r\nContent-Length: ' .. #body .. '\r\nConnection: close\r\n\r\n' .. body,
        function() client:close() end)
    end)
  end)
end)

local started = core.hrtime_ms()
local jobs = {}
for i = 1, 5 do
  jobs[#jobs + 1] = mayura.run(function()
    local r = process.run({ 'sh', '-c', 'sleep 0.2; echo "command $0 ran in $(pwd)"', tostring(i) })
    return ('exec  %d: exit %d, %s'):format(i, r.exit_code, r.stdout:gsub('\n$', ''))
  end)
  jobs[#jobs + 1] = mayura.run(function()
    local res = http.request({ url = ('http://127.0.0.1:%d/item/%d'):format(port, i), timeout_ms = 5000 })
    return ('fetch %d: HTTP %d, %s'):format(i, res.status, res.body)
  end)
end
for _, job in ipairs(jobs) do print(job:wait()) end
local took = math.floor(core.hrtime_ms() - started)
print(('10 jobs, each waiting 200 ms, finished together in %d ms on one loop'):format(took))
server:close()
