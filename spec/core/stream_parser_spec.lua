-- core.stream_parser: Connect envelopes, NDJSON and server-sent events, fed whole, cut at
-- every byte, and past their size limits.
local core = require('mayura.core')
local compat = require('support.compat')

-- Feeds `pieces` (a list of strings) and finishes; returns every event and the error, if any.
local function run(kind, pieces, opts)
  local p = core.stream_parser(kind, opts)
  local all = {}
  for _, piece in ipairs(pieces) do
    local events, err = p:feed(piece)
    for _, e in ipairs(events) do all[#all + 1] = e end
    if err then return all, err, p end
  end
  local events, err = p:finish()
  for _, e in ipairs(events) do all[#all + 1] = e end
  return all, err, p
end

local function bytes_of(s)
  local t = {}
  for i = 1, #s do t[i] = s:sub(i, i) end
  return t
end

-- The same stream fed at once and one byte at a time gives the same events and error.
local function same_cut_any_way(kind, stream, opts)
  local whole, werr = run(kind, { stream }, opts)
  local split, serr = run(kind, bytes_of(stream), opts)
  assert.are.same(whole, split)
  assert.are.equal(werr and werr.code, serr and serr.code)
  return whole, werr
end

local function envelope(flags, msg)
  return string.char(flags) .. compat.pack('>I4', #msg) .. msg
end

describe('core.stream_parser', function()
  it('refuses an unknown kind and bad options', function()
    for _, bad in ipairs({ { 'json' }, { nil }, { 'sse', { max_bytes = 0 } }, { 'sse', { nope = 1 } }, { 'sse', 7 } }) do
      local ok, err = pcall(core.stream_parser, bad[1], bad[2])
      assert.is_false(ok)
      assert.are.equal('INVALID_INPUT', err.code)
    end
    local p = core.stream_parser('ndjson')
    assert.has_error(function() p:feed(12) end)
    p:finish()
    local ok, err = pcall(p.feed, p, 'x')
    assert.is_false(ok)
    assert.are.equal('INVALID_INPUT', err.code)
  end)

  describe('connect', function()
    local stream = envelope(0, '{"event":{"start":{"pid":7}}}') .. envelope(0, '') ..
      envelope(0, '{"event":{"data":{"stdout":"aGk="}}}') .. envelope(2, '{"metadata":{}}')

    it('gives each envelope, and the end-of-stream one marked, cut at every byte', function()
      local events, err = same_cut_any_way('connect', stream)
      assert.is_nil(err)
      assert.are.same({
        { data = '{"event":{"start":{"pid":7}}}' },
        { data = '' },
        { data = '{"event":{"data":{"stdout":"aGk="}}}' },
        { data = '{"metadata":{}}', end_stream = true },
      }, events)
    end)

    it('gives the trailer that carries an error', function()
      local events, err = same_cut_any_way('connect', envelope(2, '{"error":{"code":"not_found"}}'))
      assert.is_nil(err)
      assert.are.equal('{"error":{"code":"not_found"}}', events[1].data)
      assert.is_true(events[1].end_stream)
    end)

    it('refuses compressed and unknown flags, bytes after the end, and a cut stream', function()
      local cases = {
        { envelope(1, 'zz') .. envelope(2, '{}'), 0 },
        { envelope(4, 'x') .. envelope(2, '{}'), 0 },
        { envelope(0, 'a') .. envelope(2, '{}') .. 'x', 2 },
        { envelope(2, '{}') .. envelope(2, '{}'), 1 },
        { envelope(0, 'abc'):sub(1, 7), 0 },   -- inside a message
        { envelope(0, 'abc'), 1 },             -- no end-of-stream
        { '', 0 },
      }
      for _, c in ipairs(cases) do
        local events, err = same_cut_any_way('connect', c[1])
        assert.are.equal(c[2], #events)
        assert.are.equal('INVALID_INPUT', err and err.code)
      end
    end)

    it('fails with LIMIT_EXCEEDED once a header announces a message above max_bytes', function()
      local p = core.stream_parser('connect', { max_bytes = 10 })
      local events, err = p:feed(envelope(0, '0123456789') .. string.char(0) .. compat.pack('>I4', 11))
      assert.are.equal(1, #events)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
      -- failed for good: nothing more comes out and nothing is kept
      events, err = p:feed(envelope(2, '{}'))
      assert.are.same({}, events)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
      assert.are.equal(0, p:pending())
      -- a 4 GiB announcement is refused without waiting for any of it
      events, err = core.stream_parser('connect'):feed(string.char(0) .. '\255\255\255\255')
      assert.are.same({}, events)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
    end)
  end)

  describe('ndjson', function()
    it('gives each line without its LF or CRLF, skips blank lines, and takes a last line without LF', function()
      local events, err = same_cut_any_way('ndjson', '{"a":1}\n\n  \r\n{"b":2}\r\n[3]')
      assert.is_nil(err)
      assert.are.same({ { data = '{"a":1}' }, { data = '{"b":2}' }, { data = '[3]' } }, events)
    end)

    it('fails with LIMIT_EXCEEDED for a line above max_bytes, before its end arrives', function()
      local events, err = same_cut_any_way('ndjson', '1234\r\n12345\n', { max_bytes = 4 })
      assert.are.same({ { data = '1234' } }, events)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
      local p = core.stream_parser('ndjson', { max_bytes = 4 })
      for _ = 1, 4 do assert.is_nil(select(2, p:feed('y'))) end
      local _, e2 = p:feed('y')
      assert.are.equal('LIMIT_EXCEEDED', e2.code)
      assert.are.equal(0, p:pending())
    end)

    it('never holds more than max_bytes of an endless line fed in pieces', function()
      local p = core.stream_parser('ndjson', { max_bytes = 1000 })
      local err
      for _ = 1, 100 do
        local _, e = p:feed(string.rep('z', 64))
        if e then err = e break end
        assert.is_true(p:pending() <= 1001)
      end
      assert.are.equal('LIMIT_EXCEEDED', err.code)
    end)
  end)

  describe('sse', function()
    local stream = '\239\187\191: a comment\r\n' ..
      'event: stdout\r\ndata: one\r\ndata:two\r\nid: 4\r\n\r\n' ..   -- CRLF
      'data\n\n' ..                                                 -- empty data still dispatches
      'retry: 300\nretry: 3x\nid: bad\0id\nnope: x\ndata:  two spaces\n\n' ..
      'event: only-a-type\n\n' ..                                   -- no data: nothing, type reset
      'data: cr\rdata: lines\r\r' ..                                -- CR alone ends lines
      'id\ndata: after empty id\n\n' ..
      'data: never dispatched\n'                                     -- no blank line at the end

    it('reads fields, comments and every line end, cut at every byte', function()
      local events, err = same_cut_any_way('sse', stream)
      assert.is_nil(err)
      local _, _, p = run('sse', { stream })
      assert.are.same({
        { event = 'stdout', data = 'one\ntwo', id = '4' },
        { event = 'message', data = '', id = '4' },
        { event = 'message', data = ' two spaces', id = '4' },
        { event = 'message', data = 'cr\nlines', id = '4' },
        { event = 'message', data = 'after empty id', id = '' },
      }, events)
      assert.are.equal(300, p:retry_ms())
      assert.are.equal('', p:last_event_id())
    end)

    it('keeps a BOM that is not at the start, and a partial BOM that is not one', function()
      local events = same_cut_any_way('sse', 'data: x\n\n\239\187\191data: y\n\n')
      assert.are.equal(1, #events)   -- the second block's field is named "\239\187\191data"
      events = same_cut_any_way('sse', '\239\187data: z\n\n')
      assert.are.equal(0, #events)
      events = same_cut_any_way('sse', '\239\187\191\239\187\191data: z\n\n')
      assert.are.equal(0, #events)   -- only one BOM is dropped
    end)

    it('fails with LIMIT_EXCEEDED for a line or an event\'s data above max_bytes', function()
      local events, err = same_cut_any_way('sse', 'data: 0123\n\n: ' .. string.rep('c', 30) .. '\n', { max_bytes = 10 })
      assert.are.same({ { event = 'message', data = '0123', id = '' } }, events)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
      -- many short data lines that add up past the limit
      events, err = same_cut_any_way('sse', string.rep('data: abc\n', 3) .. '\n', { max_bytes = 10 })
      assert.are.same({}, events)
      assert.are.equal('LIMIT_EXCEEDED', err.code)
      -- exactly the limit passes: 'abc\nabc' is 7 bytes
      events, err = same_cut_any_way('sse', 'data: abc\ndata: abc\n\n', { max_bytes = 7 })
      assert.is_nil(err)
      assert.are.equal('abc\nabc', events[1].data)
    end)
  end)
end)
