-- fuzz/make_corpus.lua: writes the seed corpus of every target to fuzz/corpus/<target>/.
--
--   lua5.4 fuzz/make_corpus.lua
--
-- The seeds are committed; this only says how each was made. Each target's
-- comment (fuzz/<target>_fuzz.c) describes the input format used here.
local dir = arg and arg[0] and arg[0]:match('^(.*)/[^/]*$') or 'fuzz'

local function write(target, name, bytes)
  os.execute('mkdir -p ' .. dir .. '/corpus/' .. target)
  local f = assert(io.open(dir .. '/corpus/' .. target .. '/' .. name, 'wb'))
  f:write(bytes)
  f:close()
end

-- {------------------------------------------------------ core/wire.h
local function u32(n) return string.pack('<I4', n) end
local function i64(n) return string.pack('<i8', n) end
local function field(key, typ, val) return string.char(#key) .. key .. string.char(typ) .. u32(#val) .. val end
local function bytes(k, v) return field(k, 1, v) end
local function int(k, v) return field(k, 2, i64(v)) end
local function bool(k, v) return field(k, 3, v and '\1' or '\0') end
local function items(list)
  local t = {}
  for i, s in ipairs(list) do t[i] = u32(#s) .. s end
  return table.concat(t)
end
local function strs(k, list) return field(k, 4, items(list)) end
local function map(k, list) return field(k, 5, items(list)) end   -- list: k1, v1, k2, v2, ...
local function ints(k, list)
  local t = {}
  for i, v in ipairs(list) do t[i] = i64(v) end
  return field(k, 6, table.concat(t))
end
local function body(id, ...) return u32(id) .. table.concat({ ... }) end
local function frame(id, ...)
  local b = body(id, ...)
  return u32(#b) .. b
end
-- }------------------------------------------------------

-- json: texts, valid and not
write('json', 'object', '{"a":[1,2.5,-0,1e300,"x\\u0000y\255"],"b":null,"c":true,"d":{"":false}}')
write('json', 'empty_array', '[]')
write('json', 'empty_object', ' {}\r\n')
write('json', 'surrogates', '["\\ud83d\\ude00","\\u00e9\\n\\t\\"\\\\\\/"]')
write('json', 'deep', string.rep('[', 60) .. string.rep(']', 60))
write('json', 'numbers', '[0,-0.0,9007199254740993,-9007199254740992,1E-7,5e-324,123.456e+2]')
write('json', 'bad_trailing_comma', '[1,]')
write('json', 'bad_leading_zero', '01')
write('json', 'bad_escape', '"\\u12"')
write('json', 'bad_control', '"a\1b"')
write('json', 'bom', '\239\187\191{"k":"v"}')
write('json', 'nul_key', '{"a\\u0000b":1}')

-- json_encode: programs for the value builder (see json_encode_fuzz.c)
write('json_encode', 'object', '\0' .. '\6' .. '\0\1k' .. '\2\130' .. '\8')
write('json_encode', 'array', '\0' .. '\6' .. '\2\129\7' .. '\2\130\7' .. '\0\3abc\7' .. '\5\7')
write('json_encode', 'nested', '\0' .. '\6\6\6\0\2hi\7\7\7')
write('json_encode', 'floats', '\0' .. '\6' .. '\13\0\7\13\1\7\13\4\7\13\5\7\13\8\7')
write('json_encode', 'nan', '\0' .. '\6' .. '\13\14\7')
write('json_encode', 'cycle', '\0' .. '\6\12\1\7')
write('json_encode', 'sparse', '\0' .. '\6\2\1\9\5')
write('json_encode', 'array_mt', '\0' .. '\6\10\2\1\9\3')
write('json_encode', 'max_depth', '\129' .. '\6\6\6\6\6\6\6\6\6\6\6\7\7\7\7\7\7\7\7\7\7')
write('json_encode', 'nul_string', '\0' .. '\0\5a\0b\255c')

-- b64: text
write('b64', 'padded', 'aGVsbG8gd29ybGQ=')
write('b64', 'unpadded', 'aGVsbG8')
write('b64', 'wrapped', 'Zm9v\r\nYmFy\n YmF6 ')
write('b64', 'bad_char', 'Zm9v*mFy')
write('b64', 'bad_padding', 'Zm9=v')
write('b64', 'lone', 'Zm9vY')
write('b64', 'only_padding', '====')
write('b64', 'nonzero_bits', 'Zh==')

-- wire: frame bodies
write('wire', 'every_type', body(7, bytes('op', 'exec'), int('n', -5), bool('b', true),
  strs('argv', { 'sh', '-c', '' }), map('env', { 'A', '1', 'B', '' }), ints('sizes', { 1, -1, 0x7fffffffffffffff })))
write('wire', 'empty', body(0))
write('wire', 'dup_keys', body(1, bytes('k', 'a'), bytes('k', 'b')))
write('wire', 'bad_bool', body(1, field('b', 3, '\2')))
write('wire', 'bad_strs', body(1, field('l', 4, u32(9) .. 'abc')))
write('wire', 'odd_map', body(1, map('m', { 'k' })))

-- chan: mode 0 (a reply body), 1 (a stream for pending calls), 2 (a request program)
write('chan', 'body', '\0' .. body(3, bytes('stdout', 'out'), int('exit_code', 0), bool('timed_out', false),
  strs('names', { 'a', 'b' }), ints('sizes', { 1, 2 }), map('m', { 'k', 'v', 'k', 'w' })))
write('chan', 'stream', '\1' .. '\200' .. '\0' .. '\3'
  .. frame(2, bytes('x', 'y')) .. frame(1, bool('ok', true)) .. frame(3, int('n', 1)))
write('chan', 'stream_chunked', '\1' .. '\200' .. '\1' .. '\11' .. frame(1, strs('l', { 'abc', '' })) .. frame(2, bytes('p', 'q')))
write('chan', 'stream_unknown_id', '\1' .. '\200' .. '\5' .. '\2' .. frame(9, bool('ok', true)))
write('chan', 'stream_too_big', '\1' .. '\0' .. '\6' .. '\1' .. frame(1, bytes('data', string.rep('z', 80))))
write('chan', 'stream_partial', '\1' .. '\200' .. '\7' .. '\2' .. frame(1, bool('ok', true)) .. u32(100) .. 'abc')
-- mode 2: key byte, then value: kind byte, n byte, then the kind's bytes (see push_value)
write('chan', 'request', '\2'
  .. '\0' .. '\0\0' .. '\4exec'                       -- op = 'exec'
  .. '\2' .. '\3\2' .. '\2sh' .. '\4true'             -- argv = { 'sh', 'true' }
  .. '\3' .. '\5\1' .. '\1A' .. '\1B'                 -- env = { A = 'B' }
  .. '\7' .. '\1\0' .. '\16\39\0\0\0\0\0\0'           -- timeout_ms = 10000
  .. '\6' .. '\2\1')                                  -- stdin = true
write('chan', 'request_ints', '\2' .. '\0' .. '\4\3' .. '\1\0\0\0\0\0\0\0' .. '\2\0\0\0\0\0\0\0' .. '\3\0\0\0\0\0\0\0')
write('chan', 'request_bad', '\2' .. '\0' .. '\6\0' .. '\1' .. '\7\1' .. '\9' .. '\0\0' .. '\10' .. '\0\0\1x')

-- agent: oracle length, oracle bytes, then request frames (see agent_fuzz.c), after the hello
-- the agent wants first
local function agent(oracle, ...)
  return string.char(#oracle) .. oracle .. frame(99, bytes('op', 'hello')) .. table.concat({ ... })
end
write('agent', 'hello_ping', agent('', frame(1, bytes('op', 'hello')), frame(2, bytes('op', 'ping'))))
write('agent', 'no_hello', string.char(0) .. frame(1, bytes('op', 'ping')))
write('agent', 'setup_twice', agent('', frame(1, bytes('op', 'setup'), bytes('workdir', 'a')),
  frame(2, bytes('op', 'setup'), bytes('workdir', 'b'))))
write('agent', 'setup', agent('', frame(1, bytes('op', 'setup'), map('env', { 'A', '1', 'PATH', '/x' }), bytes('workdir', 'w'))))
write('agent', 'exec', agent('\1\0', frame(5, bytes('op', 'exec'), strs('argv', { 'sh', '-c', 'echo hi' }),
  map('env', { 'K', 'V' }), bytes('cwd', 'sub'), bytes('stdin', 'in'), int('timeout_ms', 1000),
  int('max_output_bytes', 100), int('kill_grace_ms', 10), int('drain_ms', 5))))
write('agent', 'exec_bad', agent('', frame(5, bytes('op', 'exec'), strs('argv', { '' })),
  frame(6, bytes('op', 'exec'), bytes('argv', 'sh')), frame(7, bytes('op', 'exec'), strs('argv', { 'a' }), int('timeout_ms', -1))))
write('agent', 'read', agent('\25', frame(3, bytes('op', 'read'), bytes('path', 'a.txt'), int('max_bytes', 4))))
write('agent', 'read_devnull', agent('\9', frame(3, bytes('op', 'read'), bytes('path', 'x'))))
write('agent', 'read_big', agent('\4\3', frame(3, bytes('op', 'read'), bytes('path', '/abs/file'))))
write('agent', 'write', agent('\1\0', frame(4, bytes('op', 'write'), bytes('path', 'd/f.txt'), bytes('data', 'hello'), int('mode', 384))))
write('agent', 'read_range', agent('\25', frame(3, bytes('op', 'read'), bytes('path', 'a.txt'), int('max_bytes', 6),
  int('offset', 2), int('length', 3)), frame(4, bytes('op', 'read'), bytes('path', 'a.txt'), int('offset', 9), int('length', 1))))
write('agent', 'write_parts', agent('\1\0\1', frame(4, bytes('op', 'write'), bytes('path', 'd/f'), bytes('data', 'ab'),
  bool('more', true)), frame(5, bytes('op', 'write'), int('upload', 1), bytes('data', 'cd'), bool('more', true)),
  frame(6, bytes('op', 'write'), int('upload', 1), bytes('data', 'e')), frame(7, bytes('op', 'write'), int('upload', 1),
  bytes('data', 'x')), frame(8, bytes('op', 'write'), bytes('path', 'g'), bytes('data', ''), bool('more', true)),
  frame(9, bytes('op', 'write'), int('upload', 2), bool('abort', true))))
write('agent', 'write_mkdir', agent('\0\0\1\0', frame(4, bytes('op', 'write'), bytes('path', '/x/y/z'), bytes('data', ''))))
write('agent', 'list', agent('\1', frame(8, bytes('op', 'list'), bytes('path', '.'))))
write('agent', 'remove', agent('\1\1\0\0', frame(9, bytes('op', 'remove'), bytes('path', 'sub'), bool('recursive', true))))
write('agent', 'remove_file', agent('\0\0', frame(9, bytes('op', 'remove'), bytes('path', '/a/b/'))))
write('agent', 'cancel_shutdown', agent('', frame(10, bytes('op', 'cancel'), int('target', 5)), frame(11, bytes('op', 'shutdown'))))
write('agent', 'unknown_and_bad', agent('', frame(12, bytes('op', 'nope')), frame(13, int('op', 1)), u32(3) .. 'abc'))

-- http: mode 0 (a response head, flags in the first byte), 1 (a header table program)
write('http', 'head', '\0HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\r\nx-a: 2\r\nX-Long: a\r\n  b  \r\n\r\n')
write('http', 'continue', '\2HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nServer: t\r\n\r\nTrailer: x\r\n')
write('http', 'odd_lines', '\4HTTP/2 204\r\nno colon here\r\n\tfold\r\n: empty name\r\nName  :  v \r\n\n')
write('http', 'request_headers', '\1' .. '\0\0\3' .. '\3\2\7' .. '\0\6\5')
write('http', 'request_bad', '\1' .. '\0\200' .. '\5\255' .. '\6' .. '\7\1')

-- list: raw list replies (odd first byte) and builder programs (even)
write('list', 'raw', '\1' .. body(1, strs('names', { 'a', 'b.txt' }), strs('types', { 'directory', 'file' }),
  ints('sizes', { 4096, 5 }), ints('modified', { 1700000000000, 1 })))
write('list', 'raw_missing', '\1' .. body(1, bool('missing', true)))
write('list', 'raw_error', '\1' .. body(1, bytes('error', 'ENOTDIR'), bytes('message', 'x')))
write('list', 'built', '\0' .. '\0\2\1a\2bc' .. '\1\2\0\1' .. '\2\2\20\30' .. '\3\2\17\18')
write('list', 'built_bad', '\0' .. '\0\1\1/' .. '\1\1\5' .. '\2\1\1' .. '\3\1\200\0\0\0\0\0\0\0\128')

-- tree: needle length - 1, needle (after the NUL the harness puts), piece sizes, then /proc/<pid>/environ or stat contents
local tag = 'MAYURA_EXEC=4242.17.3\0'   -- the harness puts the leading NUL
write('tree', 'environ_hit', string.char(#tag - 1) .. tag .. '\3' .. 'PATH=/bin\0HOME=/w\0MAYURA_EXEC=4242.17.3\0LANG=C\0')
write('tree', 'environ_first', string.char(#tag - 1) .. tag .. '\0' .. 'MAYURA_EXEC=4242.17.3\0')
write('tree', 'environ_prefix', string.char(#tag - 1) .. tag .. '\5' .. 'MAYURA_EXEC=4242.17.30\0')
write('tree', 'stat_zombie', '\0' .. 'x' .. '\7' .. '123 (sh) Z 1 123 123 0 -1')
write('tree', 'stat_paren_name', '\0' .. 'x' .. '\7' .. '77 (a) R (b)) S 1 77 77 0 -1 4194560')

-- connect, ndjson, sse (fuzz/stream_fuzz.h): a limit byte (0 default, 1 small, 2 byte 1 + 1, 3 64),
-- a cutting seed, then the stream
local function env(flags, msg) return string.char(flags) .. string.pack('>I4', #msg) .. msg end
write('connect', 'stream', '\0\7' .. env(0, '{"event":{"start":{"pid":7}}}') .. env(0, '{"event":{"data":{"stdout":"aGk="}}}')
  .. env(0, '{}') .. env(2, '{}'))
write('connect', 'end_error', '\0\1' .. env(2, '{"error":{"code":"not_found","message":"gone"}}'))
write('connect', 'compressed', '\0\2' .. env(1, 'zz') .. env(2, '{}'))
write('connect', 'after_end', '\0\3' .. env(2, '') .. env(0, 'x'))
write('connect', 'cut', '\0\4' .. env(0, 'abc'):sub(1, 6))
write('connect', 'too_big', '\3\5' .. env(0, string.rep('x', 65)) .. env(2, '{}'))
-- eventstream: the same limit byte (bit 2 set: the harness writes the right CRCs), a seed, then messages
local function es(headers, payload)
  local hs = {}
  for _, h in ipairs(headers) do
    hs[#hs + 1] = string.char(#h[1]) .. h[1] .. string.char(7) .. string.pack('>I2', #h[2]) .. h[2]
  end
  local head = table.concat(hs)
  return string.pack('>I4I4I4', 16 + #head + #payload, #head, 0) .. head .. payload .. '\0\0\0\0'
end
local result = es({ { ':message-type', 'event' }, { ':event-type', 'result' }, { ':content-type', 'application/json' } },
  '{"structuredContent":{"stdout":"hi","exitCode":0}}')
write('eventstream', 'result', '\4\7' .. result .. es({ { ':message-type', 'exception' },
  { ':exception-type', 'throttlingException' } }, '{"message":"x"}'))
write('eventstream', 'typed', '\4\1' .. string.pack('>I4I4I4', 16 + 10, 10, 0) .. '\1a\0' .. '\1b\4\0\0\0\5' .. '\0\0\0\0')
write('eventstream', 'bad_crc', '\0\2' .. result)
write('eventstream', 'cut', '\4\3' .. result:sub(1, 30))
write('eventstream', 'too_big', '\7\5' .. result)
write('ndjson', 'lines', '\0\7{"type":"stdout","data":"x"}\n\n  \r\n{"a":1}\r\n{"exit":0}')
write('ndjson', 'long_line', '\1\3' .. string.rep('y', 20) .. '\nok\n')
write('ndjson', 'crs', '\2\9a\r\r\nb\rc\n\r\n')
write('sse', 'events', '\0\7\239\187\191: hello\r\nevent: stdout\r\ndata: one\r\ndata:two\r\nid: 4\r\n\r\n'
  .. 'retry: 300\ndata\n\nid\0x\ndata: z\r\r')
write('sse', 'cr_only', '\0\9data: a\rdata: b\r\revent: e\rdata\r\r')
write('sse', 'limits', '\1\2data: ' .. string.rep('d', 30) .. '\n\n: ' .. string.rep('c', 30) .. '\n')
write('sse', 'no_blank_end', '\0\1data: x\nevent: y\nid: 1')

-- listing: the text of sandbox_scripts.list (odd first byte) and builder programs (even; see listing_fuzz.c)
write('listing', 'raw', '\1' .. 'L\n81a4 5 1700000000.123 66696c652e747874\n41ed 4096 1700000000 737562\n' ..
  'a1ff 8 -5 6e65770a6c696e65\nend\n')
write('listing', 'raw_empty', '\1' .. 'L\nend\n')
write('listing', 'raw_missing', '\1' .. 'N\n')
write('listing', 'raw_error', '\1' .. 'E not_directory\n')
write('listing', 'raw_bad_name', '\1' .. 'L\n81a4 5 1 2e2e\n81a4 1 2 612f62\nend\n')
write('listing', 'raw_cut', '\1' .. 'L\n81a4 5 17000')
write('listing', 'raw_modes', '\1' .. 'L\n11a4 0 1 6669666f\nc1ed 0 1 736f636b\n61b0 0 1 626c6b\n' ..
  '21b0 0 1 636872\n81a4 0 -1.5 0a0d\nend\n')
write('listing', 'raw_eacces', '\1' .. 'E EACCES\n')
write('listing', 'raw_enospc', '\1' .. 'E ENOSPC\n')
write('listing', 'built', '\0' .. '\0\5\6\3abc' .. '\129\1\2\3\2\10\255' .. '\2\0\0\1z')
write('listing', 'built_bad', '\0' .. '\0\1\1\1/' .. '\3\1\1\2..' .. '\4\0\0\0')

-- {------------------------------------------------------ msgpack
-- msgpack: the bytes themselves: pitcher frames (a request, an answer with bin, a notification),
-- every scalar kind, and a count past the input.
write('msgpack', 'request', '\131\162id\1\166method\172shell/create\166params\130\167command\164true\163cwd\161/')
write('msgpack', 'answer_bin', '\132\162id\2\166method\171fs/readFile\166status\0\166result\129\167content\196\3a\0b')
write('msgpack', 'notification', '\130\166method\169shell/out\166params\130\167shellId\161s\163out\163hi\n')
write('msgpack', 'scalars', '\157\192\194\195\127\224\204\255\205\1\0\206\0\1\0\0\207\0\0\0\1\0\0\0\0'
  .. '\208\128\209\128\0\202\63\192\0\0\203\63\248\0\0\0\0\0\0\217\1x')
write('msgpack', 'ext', '\212\1\0')
write('msgpack', 'huge_count', '\221\221\221\221\221\221\221\194')
