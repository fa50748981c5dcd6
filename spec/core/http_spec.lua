-- core.http.request against a loopback HTTP/1.1 server (spec/support/http_server.lua)
-- that runs on the same loop as the core.
local core = require('mayura.core')
local uv = require('luv')

local spec_dir = (debug.getinfo(1, 'S').source:match('^@(.*)/core/[^/]*$')) or 'spec'
package.path = spec_dir .. '/?.lua;' .. package.path
local server = require('support.http_server')
local util = require('support.util')

-- Timers below start from uv.update_time(): a timer already due when
-- run_once starts fires before the poll, which may then block.

-- Runs the loop until the callback given to start has been called (10 s at most).
local function wait(start, limit_ms)
    local done, a, b = false, nil, nil
    start(function(x, y) done = true; a = x; b = y end)
    local expired = false
    local guard = uv.new_timer()
    uv.update_time()
    guard:start(limit_ms or 10000, 0, function() expired = true end)
    while not done and not expired do core.run_once() end
    guard:close()
    assert(done, 'timed out waiting for the callback')
    return a, b
end

-- Runs the loop for about ms milliseconds.
local function sleep(ms)
    local over = false
    local t = uv.new_timer()
    uv.update_time()
    t:start(ms, 0, function() over = true end)
    while not over do core.run_once() end
    t:close()
end

local function request(opts)
    return wait(function(cb) core.http.request(opts, cb) end)
end

local function raises_invalid(opts, cb)
    return assert.raises_code('INVALID_INPUT', core.http.request, opts, cb or function() end)
end

local function tmp_socket_path()
    local p = os.tmpname()
    os.remove(p)
    return p .. '.sock'
end

describe('core.http', function()
    local srv

    before_each(function() srv = server.tcp() end)

    after_each(function()
        srv:close()
        -- Runs the pending close callbacks (the helpers' timers too): luv
        -- 1.44 crashes at lua_close on a handle still closing.
        uv.new_timer():close() -- a pending close keeps run_once from blocking
        core.run_once()
    end)

    describe('failure modes', function()
        it('refuses bad arguments at once', function()
            raises_invalid({})
            raises_invalid({ url = 42 })
            raises_invalid({ url = '' })
            raises_invalid({ url = 'http://127.0.0.1/\0x' })
            raises_invalid({ url = srv:url('/echo'), methd = 'GET' })
            raises_invalid({ url = srv:url('/echo'), method = 'GE T' })
            raises_invalid({ url = srv:url('/echo'), method = 7 })
            raises_invalid({ url = srv:url('/echo'), http_version = 'yes' })
            raises_invalid({ url = srv:url('/echo'), ca_file = 1 })
            raises_invalid({ url = srv:url('/echo'), ca_file = '' })
            raises_invalid({ url = srv:url('/echo'), ca_file = '/a\0b' })
            raises_invalid({ url = srv:url('/echo'), ca_pem = 1 })
            raises_invalid({ url = srv:url('/echo'), ca_pem = '' })
            raises_invalid({ url = srv:url('/echo'), ca_pem = 'x', ca_file = '/ca.pem' })
            raises_invalid({ url = srv:url('/echo'), client_cert = '/c.pem' })
            raises_invalid({ url = srv:url('/echo'), client_key = 2, client_cert = '/c.pem' })
            raises_invalid({ url = srv:url('/echo'), headers = 'x' })
            raises_invalid({ url = srv:url('/echo'), headers = { ['X-A'] = 'a\r\nX-B: b' } })
            raises_invalid({ url = srv:url('/echo'), headers = { ['X-A'] = 'a\nb' } })
            raises_invalid({ url = srv:url('/echo'), headers = { 'X-A: a\r\nX-B: b' } })
            raises_invalid({ url = srv:url('/echo'), headers = { ['X-A'] = 5 } })
            raises_invalid({ url = srv:url('/echo'), headers = { ['Bad Name'] = 'v' } })
            raises_invalid({ url = srv:url('/echo'), headers = { 'no colon here' } })
            raises_invalid({ url = srv:url('/echo'), http_version = '3' })
            raises_invalid({ url = srv:url('/echo'), http_version = 2 })
            raises_invalid({ url = srv:url('/echo'), body = {} })
            raises_invalid({ url = srv:url('/echo'), timeout_ms = -1 })
            raises_invalid({ url = srv:url('/echo'), timeout_ms = 1.5 })
            raises_invalid({ url = srv:url('/echo'), timeout_ms = 2 ^ 63 }) -- above every 64-bit integer
            raises_invalid({ url = srv:url('/echo'), connect_timeout_ms = 2 ^ 64 })
            raises_invalid({ url = srv:url('/echo'), timeout_ms = 'soon' })
            raises_invalid({ url = srv:url('/echo'), max_body_bytes = -1 })
            raises_invalid({ url = srv:url('/echo'), on_data = 'f' })
            raises_invalid({ url = srv:url('/echo'), on_headers = true })
            raises_invalid({ url = srv:url('/echo'), unix_socket = '/tmp/x\0y' })
            raises_invalid({ url = srv:url('/echo'), unix_socket = '/' .. string.rep('x', 200) })
            raises_invalid({ url = srv:url('/echo') }, 'not a function')
            local ok, err = pcall(core.http.request, 'http://x', function() end)
            assert.is_false(ok)
            assert.equal('INVALID_INPUT', err.code)
            -- nothing was started: the server saw no request
            sleep(20)
            assert.equal(0, #srv.requests)
        end)

        it('reports a refused connection as CONNECT_FAILED', function()
            local res, err = request({ url = 'http://127.0.0.1:' .. server.closed_port() .. '/' })
            assert.is_nil(res)
            assert.equal('CONNECT_FAILED', err.code)
            assert.is_string(err.curl)
            assert.is_string(err.message)
            assert.matches('^CONNECT_FAILED: ', tostring(err))
        end)

        it('reports a missing unix socket as CONNECT_FAILED', function()
            local res, err = request({ url = 'http://localhost/echo', unix_socket = tmp_socket_path() })
            assert.is_nil(res)
            assert.equal('CONNECT_FAILED', err.code)
        end)

        it('reports a malformed URL or another protocol as INVALID_INPUT', function()
            local res, err = request({ url = 'http://[bad/' })
            assert.is_nil(res)
            assert.equal('INVALID_INPUT', err.code)
            res, err = request({ url = 'file:///etc/passwd' })
            assert.is_nil(res)
            assert.equal('INVALID_INPUT', err.code)
        end)

        it('times out a stalled request after timeout_ms', function()
            local t0 = core.hrtime_ms()
            local res, err = request({ url = srv:url('/stall'), timeout_ms = 300 })
            local took = core.hrtime_ms() - t0
            assert.is_nil(res)
            assert.equal('TIMEOUT', err.code)
            assert.is_true(took >= 250, 'took ' .. took .. ' ms')
        end)

        it('reports a reset connection as NETWORK_ERROR', function()
            local res, err = request({ url = srv:url('/reset') })
            assert.is_nil(res)
            assert.equal('NETWORK_ERROR', err.code)
            assert.is_string(err.curl)
        end)

        it('cancels a stalled request: CANCELLED, exactly once', function()
            local calls, got_res, got_err = 0, nil, nil
            local h = core.http.request({ url = srv:url('/stall') }, function(res, err)
                calls = calls + 1
                got_res, got_err = res, err
            end)
            assert.matches('mayura.http_request', tostring(h))
            while #srv.requests == 0 do core.run_once() end -- the request reached the server
            h:cancel()
            while calls == 0 do core.run_once() end
            h:cancel()
            sleep(50)
            assert.equal(1, calls)
            assert.is_nil(got_res)
            assert.equal('CANCELLED', got_err.code)
        end)

        it('leaves none of its sockets to a command started during a transfer', function()
            -- the descriptors a command gets from this process before any transfer (its own 0, 1,
            -- 2 and whatever the test runner left open)
            local function fds_of_a_command()
                local res = wait(function(cb)
                    assert(core.spawn({ argv = { 'sh', '-c', 'ls /proc/$$/fd' } }, cb))
                end)
                local set = {}
                for fd in res.stdout:gmatch('%d+') do set[#set + 1] = fd end
                table.sort(set)
                return table.concat(set, ' ')
            end
            local before = fds_of_a_command()
            local h = core.http.request({ url = srv:url('/stall') }, function() end)
            while #srv.requests == 0 do core.run_once() end   -- the connection is open
            -- libcurl's connection and its multi handle's wake-up pair stay the host's
            assert.equal(before, fds_of_a_command())
            h:cancel()
            sleep(20)
        end)

        it('drops an in-flight request through __close: no callback, and closing again does nothing', function()
            local calls = 0
            local h = core.http.request({ url = srv:url('/stall') }, function() calls = calls + 1 end)
            while #srv.requests == 0 do core.run_once() end
            local close = getmetatable(h).__close
            close(h)
            close(h)
            h:cancel()
            sleep(50)
            assert.equal(0, calls)
            local res = request({ url = srv:url('/echo') })   -- the loop and the client go on
            assert.equal(200, res.status)
        end)

        it('cancels a request before the loop ever ran', function()
            local calls, got_err = 0, nil
            local h = core.http.request({ url = srv:url('/echo') }, function(_, err)
                calls = calls + 1
                got_err = err
            end)
            h:cancel()
            h:cancel()
            sleep(50)
            assert.equal(1, calls)
            assert.equal('CANCELLED', got_err.code)
        end)

        it('does nothing when cancelled after completion', function()
            local calls = 0
            local h
            wait(function(done)
                h = core.http.request({ url = srv:url('/echo') }, function(res, err)
                    calls = calls + 1
                    done(res, err)
                end)
            end)
            h:cancel()
            sleep(20)
            assert.equal(1, calls)
        end)

        it('fails with LIMIT_EXCEEDED past max_body_bytes', function()
            local res, err = request({ url = srv:url('/big?n=100000'), max_body_bytes = 1000 })
            assert.is_nil(res)
            assert.equal('LIMIT_EXCEEDED', err.code)
            -- exactly at the limit is fine
            res = request({ url = srv:url('/big?n=1000'), max_body_bytes = 1000 })
            assert.equal(server.pattern(1000), res.body)
        end)

        it('survives a callback that raises an error', function()
            local fired = false
            local reports = util.capture_reports(function()
                core.http.request({ url = srv:url('/echo') }, function()
                    fired = true
                    error('boom from an http callback')
                end)
                while not fired do core.run_once() end
            end)
            assert.equal(1, #reports)
            assert.matches('error in a loop callback: .*boom from an http callback', reports[1])
            local res = request({ url = srv:url('/status/201') })
            assert.equal(201, res.status)
        end)
    end)

    describe('requests', function()
        it('sends a GET with headers (map and array forms)', function()
            local res = request({
                url = srv:url('/echo?a=1&b=two'),
                headers = { ['X-Map'] = 'map value', ['X-Empty'] = '' },
            })
            assert.equal(200, res.status)
            assert.equal('text/plain', res.headers['content-type'])
            local got = server.parse_echo(res.body)
            assert.equal('GET', got.method)
            assert.equal('/echo?a=1&b=two', got.target)
            assert.equal('map value', got.headers['x-map'])
            assert.equal('', got.headers['x-empty'])
            assert.equal('', got.body)

            res = request({ url = srv:url('/echo'), headers = { 'X-Line: one', 'X-Line2: two' } })
            got = server.parse_echo(res.body)
            assert.equal('one', got.headers['x-line'])
            assert.equal('two', got.headers['x-line2'])
        end)

        it('speaks the HTTP version asked for: 1.1, or 2 with prior knowledge in the clear', function()
            local res = request({ url = srv:url('/echo'), http_version = '1.1' })
            assert.equal(200, res.status)
            assert.equal('GET', server.parse_echo(res.body).method)
            -- an HTTP/1.1 server cannot answer HTTP/2's connection preface (it fails or waits)
            local none, err = request({ url = srv:url('/echo'), http_version = '2', timeout_ms = 1500 })
            assert.is_nil(none)
            assert.is_truthy(err.code == 'NETWORK_ERROR' or err.code == 'TIMEOUT', err.code)
        end)

        it('sends a POST body with NUL bytes exactly', function()
            local body = 'a\0b\0\0c\r\n\0' .. string.rep('\0', 10) .. 'end'
            local res = request({
                url = srv:url('/echo'),
                method = 'POST',
                headers = { ['Content-Type'] = 'application/octet-stream', ['X-Token'] = 'abc' },
                body = body,
            })
            assert.equal(200, res.status)
            local got = server.parse_echo(res.body)
            assert.equal('POST', got.method)
            assert.equal(body, got.body)
            assert.equal(tostring(#body), got.headers['content-length'])
            assert.equal('application/octet-stream', got.headers['content-type'])
            assert.equal('abc', got.headers['x-token'])
            local req = srv.requests[#srv.requests]
            assert.equal(body, req.body)
        end)

        it('sends no form Content-Type of its own, and other methods', function()
            local res = request({ url = srv:url('/echo'), method = 'PUT', body = '{"a":1}' })
            local got = server.parse_echo(res.body)
            assert.equal('PUT', got.method)
            assert.equal('{"a":1}', got.body)
            assert.is_nil(got.headers['content-type'])

            res = request({ url = srv:url('/echo'), method = 'DELETE' })
            assert.equal('DELETE', server.parse_echo(res.body).method)

            res = request({ url = srv:url('/echo'), method = 'POST' })
            got = server.parse_echo(res.body)
            assert.equal('POST', got.method)
            assert.equal('0', got.headers['content-length'])

            res = request({ url = srv:url('/echo'), method = 'HEAD' })
            assert.equal(200, res.status)
            assert.equal('', res.body)
        end)

        it('returns status codes and joins repeated headers', function()
            local res = request({ url = srv:url('/status/503') })
            assert.equal(503, res.status)
            assert.equal('7', res.headers['retry-after'])
            assert.equal('a, b', res.headers['x-multi'])
            assert.equal('status 503', res.body)

            res = request({ url = srv:url('/status/404') })
            assert.equal(404, res.status)
            res = request({ url = srv:url('/status/204') })
            assert.equal(204, res.status)
            assert.equal('', res.body)
        end)

        it('keeps only the final head after 100 Continue, and sends a large body', function()
            local body = server.pattern(2 * 1024 * 1024 + 7)
            local res = request({ url = srv:url('/echo'), method = 'POST', body = body })
            assert.equal(200, res.status)
            assert.is_nil(res.headers['x-interim'])
            local got = server.parse_echo(res.body)
            assert.equal('100-continue', got.headers['expect'])
            assert.equal(#body, #got.body)
            assert.equal(body, got.body)
        end)

        it('receives a 5 MiB body', function()
            local n = 5 * 1024 * 1024
            local res = request({ url = srv:url('/big?n=' .. n) })
            assert.equal(200, res.status)
            assert.equal(n, #res.body)
            assert.equal(server.pattern(n), res.body)
            assert.equal(tostring(n), res.headers['content-length'])
        end)

        it('decodes a chunked body', function()
            local res = request({ url = srv:url('/chunked') })
            assert.equal(200, res.status)
            assert.equal('chunked', res.headers['transfer-encoding'])
            assert.equal(server.CHUNKED_BODY, res.body)
        end)

        it('gives the trailers after a chunked body apart from the head', function()
            local res = request({ url = srv:url('/trailers') })
            assert.equal(server.CHUNKED_BODY, res.body)
            assert.are.same({ ['grpc-status'] = '7', ['x-trail'] = 'yes' }, res.trailers)
            assert.is_nil(res.headers['grpc-status'])
            assert.are.same({}, request({ url = srv:url('/chunked') }).trailers)
        end)

        it('speaks HTTP/2 with prior knowledge to an h2c server, with its trailers, request after request', function()
            -- a node:http2 server without TLS, which refuses HTTP/1.1
            local port_file = os.tmpname()
            local src = "const h = require('node:http2'); const fs = require('node:fs');"
                .. "const s = h.createServer((q, r) => { let n = 0; q.on('data', (d) => { n += d.length; });"
                .. " q.on('end', () => { r.addTrailers({ 'grpc-status': '0', 'x-n': String(n) });"
                .. " r.setHeader('content-type', 'application/grpc'); r.end('v' + q.httpVersion); }); });"
                .. "s.listen(0, '127.0.0.1', () => fs.writeFileSync(process.argv[1], String(s.address().port)));"
                .. "setTimeout(() => process.exit(0), 20000);"
            local node = core.spawn({ argv = { 'node', '-e', src, port_file }, timeout_ms = 30000 }, function() end)
            if not node then pending('node is not installed'); return end
            local port
            for _ = 1, 200 do
                local f = io.open(port_file)
                port = f and f:read('a')
                if f then f:close() end
                if port and port ~= '' then break end
                sleep(20)
            end
            for i = 1, 3 do
                local res = request({ url = 'http://127.0.0.1:' .. port .. '/x', method = 'POST',
                    body = string.rep('b', i), http_version = '2', timeout_ms = 5000 })
                assert.equal(200, res.status)
                assert.equal('v2.0', res.body)
                assert.are.same({ ['grpc-status'] = '0', ['x-n'] = tostring(i) }, res.trailers)
            end
            node:kill(9)
            os.remove(port_file)
        end)

        it('streams to on_data in order, after on_headers', function()
            local events, chunks = {}, {}
            local res = request({
                url = srv:url('/slow'),
                on_headers = function(status, headers)
                    events[#events + 1] = 'headers'
                    assert.equal(200, status)
                    assert.equal('close', headers['connection'])
                end,
                on_data = function(chunk)
                    events[#events + 1] = 'data'
                    chunks[#chunks + 1] = chunk
                end,
            })
            assert.equal(200, res.status)
            assert.equal('', res.body)
            assert.equal('headers', events[1])
            assert.equal(1, #(table.concat(events, ' '):gsub('[^h]', '')))
            assert.is_true(#chunks >= 2, 'expected several chunks, got ' .. #chunks)
            assert.equal(table.concat(server.SLOW_CHUNKS), table.concat(chunks))
        end)

        it('streams a large body without accumulating it', function()
            local n = 3 * 1024 * 1024
            local chunks, calls = {}, 0
            local res = request({
                url = srv:url('/big?n=' .. n),
                max_body_bytes = 1024, -- applies to the accumulated body only
                on_data = function(chunk) calls = calls + 1; chunks[#chunks + 1] = chunk end,
            })
            assert.equal(200, res.status)
            assert.equal('', res.body)
            assert.equal(server.pattern(n), table.concat(chunks))
        end)

        it('cancels when on_data returns false', function()
            local calls = 0
            local res, err = request({
                url = srv:url('/slow'),
                on_data = function() calls = calls + 1; return false end,
            })
            assert.is_nil(res)
            assert.equal('CANCELLED', err.code)
            assert.equal(1, calls)
        end)

        it('lets on_data cancel its own request', function()
            local h, calls = nil, 0
            local res, err = wait(function(cb)
                h = core.http.request({
                    url = srv:url('/slow'),
                    on_data = function()
                        calls = calls + 1
                        h:cancel()
                    end,
                }, cb)
            end)
            assert.is_nil(res)
            assert.equal('CANCELLED', err.code)
            assert.equal(1, calls)
        end)

        it('lets a completion callback start the next request', function()
            local res = wait(function(cb)
                core.http.request({ url = srv:url('/status/201') }, function(first)
                    assert.equal(201, first.status)
                    core.http.request({ url = srv:url('/echo'), method = 'PATCH' }, cb)
                end)
            end)
            assert.equal('PATCH', server.parse_echo(res.body).method)
        end)

        it('talks over a unix socket', function()
            local path = tmp_socket_path()
            local usrv = server.unix(path)
            local ok, e = pcall(function()
                local res = request({
                    url = usrv:url('/echo'),
                    unix_socket = path,
                    method = 'POST',
                    body = 'over\0unix',
                    headers = { ['Content-Type'] = 'application/json' },
                })
                assert.equal(200, res.status)
                local got = server.parse_echo(res.body)
                assert.equal('POST', got.method)
                assert.equal('/echo', got.target)
                assert.equal('over\0unix', got.body)
                assert.equal('localhost', got.headers['host'])
                res = request({ url = usrv:url('/big?n=200000'), unix_socket = path })
                assert.equal(server.pattern(200000), res.body)
            end)
            usrv:close()
            assert(ok, e)
        end)

        it('runs 100 requests at once on one loop', function()
            local n, done, results = 100, 0, {}
            for i = 1, n do
                local opts
                if i % 2 == 0 then
                    opts = { url = srv:url('/echo?i=' .. i), method = 'POST', body = 'payload-' .. i }
                else
                    opts = { url = srv:url('/big?n=' .. (1000 + i * 97)) }
                end
                core.http.request(opts, function(res, err)
                    done = done + 1
                    results[i] = { res = res, err = err }
                end)
            end
            local expired = false
            local guard = uv.new_timer()
            uv.update_time()
            guard:start(20000, 0, function() expired = true end)
            while done < n and not expired do core.run_once() end
            guard:close()
            assert.equal(n, done)
            for i = 1, n do
                local r = results[i]
                assert.is_nil(r.err, r.err and tostring(r.err))
                assert.equal(200, r.res.status)
                if i % 2 == 0 then
                    local got = server.parse_echo(r.res.body)
                    assert.equal('/echo?i=' .. i, got.target)
                    assert.equal('payload-' .. i, got.body)
                else
                    assert.equal(server.pattern(1000 + i * 97), r.res.body)
                end
            end
        end)
    end)
end)
