/*
** list_fuzz: a directory listing from the agent, from the frame to the
** entries the caller gets.
**
** A reply body (given raw when the first byte is odd, else built from the
** input with the wire.h builder so that it parses: names, types, sizes,
** modified, missing, error as their natural types or any other) goes
** through wire_parse and chan_decode (core/chan.c), then through the real
** Lua code: Methods:list_files of mayura.sandbox._agent_backend (its
** channel call stood in for by the reply) under Sandbox:list_files of
** mayura.sandbox (the pool's checks; the sandbox object made here by hand
** with mayura.sandbox._sandbox's new).
** The Lua's line steps count as features too (fz_cover_lua).
**
** The result must be nil, or entries the pool promises (name a non-empty
** string without '/' or NUL, a known type, integer size >= 0, integer
** modified) that are the reply's lists item by item; anything raised must
** be a coded error. A plain Lua error (indexing nil, comparing a table,
** ...) from the decoding is a bug.
*/
#include "fuzz_lua.h"

static const char harness_lua[] =
    "local agent_backend = require('mayura.sandbox._agent_backend')\n"
    "local sandbox = require('mayura.sandbox')\n"
    "local errors = require('mayura.errors')\n"
    "local sandbox_object = require('mayura.sandbox._sandbox')\n"
    "local pool = sandbox.create_sandboxes({ create = function() end },\n"
    "  { max_sandboxes = 1, max_lifetime_ms = 1000 })\n"
    "local Backend = agent_backend.class()\n"
    "local reply\n"
    "function Backend.call() return reply end\n"
    "local backend = setmetatable({ closed = false }, Backend)\n"
    "local sb = sandbox_object.new({ _pool = pool, _backend = backend, _workdir = '/workspace',\n"
    "  _expires_at = math.huge, _released = false,\n"
    "  _call = function(_, _, name, ...) return backend[name](backend, ...) end })\n"
    "local TYPES = { file = true, directory = true, symlink = true, other = true }\n"
    "local function int(v) return math.type(v) == 'integer' end\n"
    "local verbose = os.getenv('FUZZ_VERBOSE')\n"
    "return function(r)\n"
    "  reply = r\n"
    "  local ok, res = pcall(sb.list_files, sb, 'some/dir')\n"
    "  if not ok then\n"
    "    if not errors.is(res) then return 'a plain error: ' .. tostring(res) end\n"
    "    if verbose then io.stderr:write('listing refused: ', tostring(res), '\\n') end\n"
    "    return nil\n"
    "  end\n"
    "  if verbose then io.stderr:write('listing: ', res and #res or 'nil', ' entries\\n') end\n"
    "  if res == nil then return nil end\n"
    "  if type(res) ~= 'table' then return 'the listing is a ' .. type(res) end\n"
    "  if #res ~= #r.names then return 'the listing has ' .. #res .. ' entries for ' .. #r.names .. ' names' end\n"
    "  for i, e in ipairs(res) do\n"
    "    if type(e.name) ~= 'string' or e.name == '' or e.name:find('[/%z]') or not TYPES[e.type]\n"
    "      or not int(e.size) or e.size < 0 or not int(e.modified) then\n"
    "      return 'entry ' .. i .. ' is not what the pool promises'\n"
    "    end\n"
    "    if e.name ~= r.names[i] or e.type ~= r.types[i] or e.size ~= r.sizes[i] or e.modified ~= r.modified[i] then\n"
    "      return 'entry ' .. i .. ' is not the reply\\'s'\n"
    "    end\n"
    "  end\n"
    "  return nil\n"
    "end\n";

static int check_ref = LUA_NOREF;

static void setup(lua_State *L) {
    if (check_ref != LUA_NOREF) return;
    if (luaL_loadbuffer(L, harness_lua, sizeof harness_lua - 1, "=list_fuzz") != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK)
        fz_fail("the harness does not load: %s", lua_tostring(L, -1));
    check_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

#include "fuzz_input.h"

static int64_t some_int(input *in) {
    int b = next(in);
    const uint8_t *p;
    size_t n, i;
    uint64_t v = 0;
    if (b < 0) return 0;
    if (!(b & 0x80)) return (int64_t)b - 16;   /* small, sometimes negative */
    n = take(in, 8, &p);
    for (i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return (int64_t)v;
}

static void some_item(wire_buf *b, input *in, int key) {
    static const char *const types[] = { "file", "directory", "symlink", "other", "", "dir", "file\0x" };
    const uint8_t *p;
    int l = next(in);
    size_t n;
    if (key == 1 && l >= 0 && l < 200) {
        const char *t = types[l % 7];
        wire_item(b, t, l % 7 == 6 ? 6 : strlen(t));
        return;
    }
    n = take(in, l < 0 ? 0 : (size_t)l % 9, &p);
    wire_item(b, p, n);
}

/* Builds a reply body from the input; returns 0 when it is built. */
static int build(input *in, wire_buf *b) {
    static const char *const keys[] = { "names", "types", "sizes", "modified", "missing", "error", "message", "x" };
    static const int natural[] = { WIRE_STRS, WIRE_STRS, WIRE_INTS, WIRE_INTS, WIRE_BOOL, WIRE_BYTES, WIRE_BYTES, WIRE_BYTES };
    int op, nf = 0;
    wire_begin(b, 1);
    while ((op = next(in)) >= 0 && nf < WIRE_MAX_FIELDS) {
        int k = op % 8, sel = (op >> 3) % 8, type = sel < 3 ? natural[k] : sel - 1, cnt, i;
        const uint8_t *p;
        size_t at, n;
        cnt = next(in);
        cnt = cnt < 0 ? 0 : cnt % 7;
        switch (type) {
        case WIRE_BYTES:
            n = take(in, (size_t)cnt * 2, &p);
            wire_add_bytes(b, keys[k], p, n);
            break;
        case WIRE_INT: wire_add_int(b, keys[k], some_int(in)); break;
        case WIRE_BOOL: wire_add_bool(b, keys[k], cnt & 1); break;
        case WIRE_STRS:
        case WIRE_MAP:
            at = wire_open_list(b, keys[k], type);
            for (i = 0; i < cnt * (type == WIRE_MAP ? 2 : 1); i++) some_item(b, in, k);
            wire_close_list(b, at);
            break;
        default:
            at = wire_open_list(b, keys[k], WIRE_INTS);
            for (i = 0; i < cnt; i++) wire_int_item(b, some_int(in));
            wire_close_list(b, at);
            break;
        }
        nf++;
    }
    return wire_end(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    wire_buf b = {0};
    wire_msg m;
    input in;
    const char *why;
    if (size == 0) return 0;
    setup(L);
    fz_cover_lua(L);
    in.p = data + 1;
    in.n = size - 1;
    if (data[0] & 1) {
        if (wire_parse(data + 1, size - 1, &m) != 0) return 0;
    } else {
        if (build(&in, &b) != 0) fz_fail("the builder failed on a small reply");
        if (wire_parse(b.data + 4, b.len - 4, &m) != 0) fz_fail("wire_parse refused a built reply");
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
    lua_pushcfunction(L, chan_decode);
    lua_pushlightuserdata(L, &m);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("chan_decode raised: %s", fz_describe(L, -1));
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) fz_fail("the check raised: %s", fz_describe(L, -1));
    why = lua_tostring(L, -1);
    if (why != NULL) fz_fail("listing: %s", why);
    free(b.data);
    fz_end(L);
    return 0;
}
