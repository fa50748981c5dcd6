-- HTTP servers that misbehave: a reset, a stall, a response cut short, 429 and 500, nobody listening.
-- First through mayura.http against a luv loopback server (each a coded error, or a status that
-- sandbox_http_failure maps to its reason); then through the Docker provider's Engine API client
-- pointed at a fake daemon on a unix socket (each create a SANDBOX_ERROR with the right reason, in
-- the pool's words, with no socket directory left and the pool still usable).
local sandbox = require('mayura.sandbox')
local docker = require('mayura.sandbox.docker')
local http = require('mayura.http')
local uv = require('luv')
local common = require('security.common')
local util = require('support.util')

-- {======================================================
-- A misbehaving server
-- =======================================================

-- A server on `handle` (a bound tcp or pipe); `route(path, method)` gives the behaviour of a request:
-- 'reset', 'stall', 'cut', or { status, body }.
local function serve(handle, new_client, route)
  local s = { clients = {}, seen = {} }
  assert(handle:listen(64, function()
    local c = new_client()
    handle:accept(c)
    s.clients[c] = true
    local buf = ''
    c:read_start(function(err, data)
      if err or not data then
        s.clients[c] = nil
        if not c:is_closing() then c:close() end
        return
      end
      buf = buf .. data
      local head_end = buf:find('\r\n\r\n', 1, true)
      if not head_end then return end
      local len = tonumber(buf:match('[Cc]ontent%-[Ll]ength:%s*(%d+)') or '0')
      if #buf < head_end + 3 + len then return end
      c:read_stop()
      local method, target = buf:match('^(%u+) (%S+)')
      s.seen[#s.seen + 1] = method .. ' ' .. target
      local how = route(target:match('^[^?]*'), method)
      if how == 'reset' then
        s.clients[c] = nil
        if c.close_reset then c:close_reset() else c:close() end
      elseif how == 'stall' then
        c:read_start(function(e2, d2)
          if e2 or not d2 then
            s.clients[c] = nil
            if not c:is_closing() then c:close() end
          end
        end)
      elseif how == 'cut' then
        c:write('HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\nonly a part', function()
          s.clients[c] = nil
          if not c:is_closing() then c:close() end
        end)
      else
        local body = how[2] or ''
        c:write(('HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n' ..
          'Retry-After: 1\r\n\r\n%s'):format(how[1], #body, body), function()
          s.clients[c] = nil
          if not c:is_closing() then c:close() end
        end)
      end
    end)
  end))
  function s.drop_clients()
    for c in pairs(s.clients) do if not c:is_closing() then c:close() end end
    s.clients = {}
  end
  function s.close()
    s.drop_clients()
    if not handle:is_closing() then handle:close() end
  end
  return s
end

local function open_fds()
  local n = 0
  for _ in io.popen('ls /proc/self/fd'):lines() do n = n + 1 end
  return n
end

-- }======================================================

describe('mayura.http against a server that misbehaves', function()
  local server, base, fds
  setup(function()
    local tcp = uv.new_tcp()
    assert(tcp:bind('127.0.0.1', 0))
    base = 'http://127.0.0.1:' .. tcp:getsockname().port
    server = serve(tcp, uv.new_tcp, function(path)
      if path == '/reset' then return 'reset' end
      if path == '/stall' then return 'stall' end
      if path == '/cut' then return 'cut' end
      local status = tonumber(path:match('^/status/(%d+)$'))
      return { status or 404, '{"message":"server words with /host/secret/path"}' }
    end)
  end)
  teardown(function() server.close() end)

  it('fails a reset with NETWORK_ERROR', function()
    local err = assert.raises_code('NETWORK_ERROR', http.request, { url = base .. '/reset', timeout_ms = 5000 })
    assert.is_string(err.message)
  end)

  it('fails a stall with TIMEOUT at its timeout_ms', function()
    local t = common.now()
    assert.raises_code('TIMEOUT', http.request, { url = base .. '/stall', timeout_ms = 400 })
    local took = common.now() - t
    assert.is_true(took >= 350, 'the stalled request took ' .. took .. ' ms')
  end)

  it('fails a response cut short with NETWORK_ERROR', function()
    assert.raises_code('NETWORK_ERROR', http.request, { url = base .. '/cut', timeout_ms = 5000 })
  end)

  it('fails nobody listening with CONNECT_FAILED', function()
    local tcp = uv.new_tcp()
    assert(tcp:bind('127.0.0.1', 0))
    local port = tcp:getsockname().port
    tcp:close()
    assert.raises_code('CONNECT_FAILED', http.request, { url = 'http://127.0.0.1:' .. port .. '/', timeout_ms = 5000 })
  end)

  it('returns 429 and 500 as statuses, which sandbox_http_failure maps to rate_limited and unavailable', function()
    local res = http.request({ url = base .. '/status/429', timeout_ms = 5000 })
    assert.are.equal(429, res.status)
    local e = sandbox.sandbox_http_failure(res.status)
    assert.are.equal('SANDBOX_ERROR', e.code)
    assert.are.equal('rate_limited', e.reason)
    res = http.request({ url = base .. '/status/500', timeout_ms = 5000 })
    assert.are.equal(500, res.status)
    e = sandbox.sandbox_http_failure(res.status)
    assert.are.equal('unavailable', e.reason)
    assert.is_nil(e.message:find('secret', 1, true))
  end)

  it('cancels a stalled request through its signal, and keeps no descriptor', function()
    -- the baseline after one plain request (the listener and libcurl's own descriptors are there then)
    assert.are.equal(200, http.request({ url = base .. '/status/200', timeout_ms = 5000 }).status)
    server.drop_clients()
    fds = open_fds()
    local token = require('mayura').cancel_token()
    local t = common.spawn(function()
      return pcall(http.request, { url = base .. '/stall', timeout_ms = 30000, signal = token })
    end)
    common.sleep(200)
    token:cancel()
    local ok, err = t:wait()
    assert.is_false(ok)
    assert.are.equal('CANCELLED', err.code, tostring(err))
    server.drop_clients()
    assert.is_true(util.eventually(function() return open_fds() <= fds end, 3000),
      'descriptors: ' .. open_fds() .. ' now, ' .. fds .. ' before')
  end)
end)

describe('the Docker Engine API client against a daemon that misbehaves', function()
  local dir, sock, server, run_dir
  local behaviour = { 200 }
  setup(function()
    dir = util.tmpdir()
    sock = dir .. '/docker.sock'
    run_dir = dir .. '/run'
    local pipe = uv.new_pipe(false)
    assert(pipe:bind(sock))
    server = serve(pipe, function() return uv.new_pipe(false) end, function(path, method)
      if method == 'GET' and path:match('^/[^/]*/?images/.+/json$') then
        return { 200, '{"Config":{"Env":["PATH=/bin"]}}' }
      end
      if method == 'DELETE' then return { 404, '{}' } end
      if type(behaviour.how) == 'function' then return behaviour.how(path, method) end
      return behaviour.how
    end)
  end)
  teardown(function()
    server.close()
    util.rmdir(dir)
  end)

  local function pool_for(call_timeout_ms)
    local p = docker.docker_sandboxes({ image = 'mayura-test/fake:1', engine = 'api', host = 'unix://' .. sock,
      run_dir = run_dir })
    return sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000,
      call_timeout_ms = call_timeout_ms or 5000 })
  end

  local function left_dirs()
    local names = {}
    local out = io.popen("ls -1A '" .. run_dir .. "' 2>/dev/null")
    -- the provider's copy of the agent (agent-<sha256>) stays in the base by design: not a sandbox's
    for n in out:lines() do
      if not n:match('^agent%-%x+$') then names[#names + 1] = n end
    end
    out:close()
    return names
  end

  local cases = {
    { name = '429', how = { 429, '{"message":"slow down, from /var/lib/docker"}' }, reason = 'rate_limited' },
    { name = '500', how = { 500, '{"message":"daemon words /var/lib/docker"}' }, reason = 'unavailable' },
    { name = '503', how = { 503, '' }, reason = 'unavailable' },
    { name = 'a reset', how = 'reset', reason = 'unavailable' },
    { name = 'a body cut short', how = 'cut', reason = 'unavailable' },
    { name = 'a stall', how = 'stall', reason = 'timeout', call_timeout_ms = 800 },
  }
  for _, c in ipairs(cases) do
    it('maps ' .. c.name .. ' of containers/create to SANDBOX_ERROR ' .. c.reason .. ', leaving nothing', function()
      behaviour.how = c.how
      local pool = pool_for(c.call_timeout_ms)
      local first = #server.seen + 1
      local t = common.now()
      local err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
      assert.are.equal(c.reason, err.reason, tostring(err))
      assert.is_true(common.now() - t < 5000, 'the create took ' .. (common.now() - t) .. ' ms')
      local reached = false
      for i = first, #server.seen do
        if server.seen[i]:match('^POST .*/containers/create') then reached = true end
      end
      assert.is_true(reached, 'the fault was not met at containers/create: ' .. table.concat(server.seen, ', '))
      assert.is_nil(err.message:find('/var/lib/docker', 1, true), 'the daemon\'s words came through')
      -- a create the pool gave up on holds its slot until it has ended (a stall: below)
      if c.how ~= 'stall' then assert.are.equal(0, pool:count()) end
      -- a stalled request ends when its connection does: then its directory and its slot go too
      server.drop_clients()
      assert.is_true(util.eventually(function() return #left_dirs() == 0 end, 5000),
        'socket directories left: ' .. table.concat(left_dirs(), ' '))
      assert.is_true(util.eventually(function() return pool:count() == 0 end, 5000))
      -- the pool is not stuck: the next create reaches the daemon again
      behaviour.how = { 429, '{}' }
      local seen = #server.seen
      local err2 = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
      assert.are.equal('rate_limited', err2.reason)
      assert.is_true(#server.seen > seen)
      pool:close()
    end)
  end

  it('tries a start again when the runtime fails for a passing reason, and gives a start refused for '
    .. 'good as an error whose cause is the daemon\'s reason (not in its message)', function()
    local starts = 0
    local function daemon(answers)
      starts = 0
      behaviour.how = function(path, method)
        if method == 'POST' and path:match('/containers/create') then return { 201, '{"Id":"abc123"}' } end
        if method == 'POST' and path:match('/containers/abc123/start$') then
          starts = starts + 1
          return answers[math.min(starts, #answers)]
        end
        return { 404, '{}' }
      end
    end
    local busy = { 500, '{"message":"failed to create shim task: OCI runtime create failed: runc create failed: '
      .. 'unable to start container process: fork/exec /proc/self/exe: resource temporarily unavailable: unknown"}' }
    local refused = { 400, '{"message":"failed to create shim task: OCI runtime create failed: runc create failed: '
      .. 'unable to start container process: exec: \\"/.mayura/agent\\": permission denied: unknown"}' }
    -- busy twice, then refused for good (and once more without the OOM score, which a runtime may
    -- refuse): four starts, and the refusal's reason kept as the cause
    daemon({ busy, busy, refused })
    local pool = pool_for(10000)
    local err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(4, starts)
    assert.truthy(err.message:find('HTTP 400', 1, true), err.message)
    assert.is_nil(err.message:find('permission denied', 1, true))
    assert.truthy(tostring(err.cause):find('permission denied', 1, true))
    -- always busy: tried a bounded number of times, then the error says so
    daemon({ busy })
    err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(6, starts)
    assert.truthy(tostring(err.cause):find('resource temporarily unavailable', 1, true))
    assert.are.equal(0, pool:count())
    assert.is_true(util.eventually(function() return #left_dirs() == 0 end, 5000))
    -- runc losing its child: with the OOM score that is the runtime refusing it (once more without);
    -- without a score it is runc under load, tried again like any passing failure
    local lost = { 400, '{"message":"failed to create shim task: OCI runtime create failed: runc create failed: '
      .. 'unable to start container process: can\'t get final child\'s PID from pipe: EOF: unknown"}' }
    daemon({ lost })
    err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal(7, starts)
    assert.truthy(tostring(err.cause):find('final child', 1, true))
    assert.are.equal(0, pool:count())
    pool:close()
  end)

  it('maps a daemon that is not there to SANDBOX_ERROR unavailable', function()
    local p = docker.docker_sandboxes({ image = 'mayura-test/fake:1', engine = 'api',
      host = 'unix://' .. dir .. '/nobody.sock', run_dir = run_dir })
    local pool = sandbox.create_sandboxes(p, { max_sandboxes = 1, max_lifetime_ms = 60000 })
    local err = assert.raises_code('SANDBOX_ERROR', pool.create, pool, { lifetime_ms = 60000 })
    assert.are.equal('unavailable', err.reason, tostring(err))
    assert.are.same({}, left_dirs())
    pool:close()
  end)
end)
