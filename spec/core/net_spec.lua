-- core.relay and core.netns_socket: the byte relay under the allow-list's proxy, and sockets made
-- in a network namespace (here this process's own, which any process may enter).
local core = require('mayura.core')
local task = require('mayura._task')
local uv = require('luv')
local util = require('support.util')

-- A luv pipe over one end of a socket pair, and the other end's descriptor.
local function pair()
  local a, b = core.socketpair()
  local p = uv.new_pipe(false)
  p:open(a)
  return p, b
end

-- Reads `p` to its end (or `n` bytes); returns the text.
local function read_all(p, n)
  local chunks, got = {}, 0
  return task.await(function(done)
    p:read_start(function(err, chunk)
      if err or not chunk then p:read_stop(); return done(table.concat(chunks)) end
      chunks[#chunks + 1] = chunk
      got = got + #chunk
      if n and got >= n then p:read_stop(); done(table.concat(chunks)) end
    end)
  end)
end

describe('core.relay', function()
  it('carries bytes both ways, the prefix first, passes each end on, and counts', function()
    local left, l_fd = pair()
    local right, r_fd = pair()
    local counts
    local finished = task.await(function(done)
      local relay = core.relay(l_fd, r_fd, { to_b = 'PREFIX:' }, function(up, down, err)
        counts = { up, down, err }
        done(true)
      end)
      assert.truthy(relay)
      -- the relay holds copies: ours go
      core.close_fd(l_fd)
      core.close_fd(r_fd)
      local big = string.rep('0123456789abcdef', 65536)   -- 1 MiB, more than a pipe's worth
      task.spawn(function()
        left:write(big)
        left:shutdown()
        local got = read_all(right)
        assert.are.equal('PREFIX:' .. big, got)
        right:write('answer')
        right:shutdown()
        assert.are.equal('answer', read_all(left))
      end)
    end)
    assert.is_true(finished)
    assert.are.same({ 7 + 16 * 65536, 6 }, { counts[1], counts[2] })
    assert.is_nil(counts[3])
    left:close()
    right:close()
  end)

  it('passes at most max_from_a bytes of a: its end there is fine, one byte more ends the relay', function()
    local function run(send_more)
      local left, l_fd = pair()
      local right, r_fd = pair()
      local result
      local got = task.await(function(done)
        core.relay(l_fd, r_fd, { to_b = 'HEAD:', max_from_a = 5 }, function(_, _, err) result = err end)
        core.close_fd(l_fd)
        core.close_fd(r_fd)
        left:write('hello')
        task.spawn(function() done(read_all(right, 10)) end)
      end)
      assert.are.equal('HEAD:hello', got)
      if send_more then left:write('X') else left:shutdown() end
      -- the far side sees the relay end (an excess) or the end passed on
      local rest = read_all(right)
      if not send_more then right:shutdown() end
      assert.is_true(util.eventually(function() return result ~= nil or not send_more end, 2000))
      left:close()
      right:close()
      return rest, result
    end
    assert.are.same({ '', 'excess' }, { run(true) })
    assert.are.same({ '' }, { run(false) })
  end)

  it('ends at close() without a callback, closing its copies', function()
    local left, l_fd = pair()
    local _, r_fd = pair()
    local relay = core.relay(l_fd, r_fd, nil, function() error('must not be called') end)
    core.close_fd(l_fd)
    core.close_fd(r_fd)
    relay:close()
    relay:close()
    -- the far end sees the relay's copy of its peer go
    assert.are.equal('', read_all(left))
    left:close()
  end)

  it('refuses what is not a descriptor', function()
    assert.raises_code('INVALID_INPUT', core.relay, -1, 5, nil, function() end)
    local r, err = core.relay(1000000, 1000001, nil, function() end)
    assert.is_nil(r)
    assert.are.equal('IO_ERROR', err.code)
  end)
end)

describe('core.netns_socket', function()
  it('listens and connects on 127.0.0.1 of a namespace, and the relay awaits a connect under way', function()
    local ns = uv.fs_open('/proc/self/ns/net', 'r', 0)
    local lfd = assert(core.netns_socket(ns, 'listen', 0))
    local server = uv.new_tcp()
    server:open(lfd)
    local port = server:getsockname().port
    local accepted = {}
    server:listen(4, function()
      local c = uv.new_tcp()
      server:accept(c)
      accepted[#accepted + 1] = c
      c:read_start(function(_, chunk)
        if chunk then c:write('echo:' .. chunk) else c:close() end
      end)
    end)
    local cfd = assert(core.netns_socket(ns, 'connect', port))
    local client, c_fd = pair()
    local relay = core.relay(c_fd, cfd, { connecting_b = true }, function() end)
    core.close_fd(c_fd)
    core.close_fd(cfd)
    client:write('hi')
    assert.are.equal('echo:hi', read_all(client, 7))
    relay:close()
    client:close()
    server:close()
    -- nothing listens on a closed port: the connect fails, at once or in the relay
    local closed = require('support.http_server').closed_port()
    local fd2 = core.netns_socket(ns, 'connect', closed)
    if fd2 then
      local c2, c2_fd = pair()
      local err = task.await(function(done)
        core.relay(c2_fd, fd2, { connecting_b = true }, function(_, _, e) done(e) end)
      end)
      assert.truthy(tostring(err):find('connect', 1, true))
      core.close_fd(c2_fd)
      core.close_fd(fd2)
      c2:close()
    end
    assert.raises_code('INVALID_INPUT', core.netns_socket, ns, 'bind', 80)
    assert.raises_code('INVALID_INPUT', core.netns_socket, ns, 'connect', 0)
    uv.fs_close(ns)
  end)
end)
