/*
** msgpack_fuzz: core.msgpack.decode and encode through a real lua_State.
**
**  - decode(input) never raises: a value, or nil + INVALID_INPUT;
**  - an accepted input is one whole value: msgpack-c's own unpacker, run
**    here on the same bytes, consumes all of them;
**  - encode(decode(input)) gives bytes that decode to a value equal to the
**    first (deep equality, done in Lua: map order may differ), and encoding
**    that again gives the same length (str and bin both come back as str).
*/
#include "fuzz_lua.h"

static const char *fz_equal_src =
    "local function eq(a, b)\n"
    "  if type(a) ~= type(b) then return false end\n"
    "  if type(a) ~= 'table' then return a == b or (a ~= a and b ~= b) end\n"
    "  if getmetatable(a) ~= getmetatable(b) then return false end\n"
    "  for k, v in pairs(a) do if not eq(v, b[k]) then return false end end\n"
    "  for k in pairs(b) do if a[k] == nil then return false end end\n"
    "  return true\n"
    "end\n"
    "return eq\n";

static void fz_call(lua_State *L, const char *fn, int nargs, int nres) {
    if (lua_pcall(L, nargs, nres, 0) != LUA_OK) fz_fail("msgpack.%s raised: %s", fn, fz_describe(L, -1));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    int eq, first;
    size_t len, len2;
    const char *enc;

    if (luaL_loadstring(L, fz_equal_src) != LUA_OK) fz_fail("the equality helper does not load");
    fz_call(L, "helper", 0, 1);
    eq = lua_gettop(L);

    fz_core_fn(L, "msgpack", "decode");
    lua_pushlstring(L, (const char *)data, size);
    fz_call(L, "decode", 1, 2);
    if (lua_isnil(L, -2)) {
        if (!fz_is_coded(L, -1, "INVALID_INPUT")) fz_fail("msgpack.decode failed without INVALID_INPUT");
        fz_end(L);
        return 0;
    }
    lua_pop(L, 1);
    first = lua_gettop(L);
    {
        msgpack_unpacked res;
        size_t off = 0;
        msgpack_unpacked_init(&res);
        if (msgpack_unpack_next(&res, (const char *)data, size, &off) != MSGPACK_UNPACK_SUCCESS || off != size)
            fz_fail("msgpack.decode took what is not one whole value");
        msgpack_unpacked_destroy(&res);
    }

    fz_core_fn(L, "msgpack", "encode");
    lua_pushvalue(L, first);
    fz_call(L, "encode", 1, 1);
    enc = lua_tolstring(L, -1, &len);
    if (enc == NULL) fz_fail("msgpack.encode gave no string");
    fz_core_fn(L, "msgpack", "decode");
    lua_pushvalue(L, -2);
    fz_call(L, "decode", 1, 2);
    if (lua_isnil(L, -2)) fz_fail("decode refused encode's bytes: %s", fz_describe(L, -1));
    lua_pop(L, 1);
    lua_pushvalue(L, eq);
    lua_pushvalue(L, first);
    lua_pushvalue(L, -3);
    fz_call(L, "equality", 2, 1);
    if (!lua_toboolean(L, -1)) fz_fail("decode(encode(decode(x))) differs from decode(x)");
    lua_pop(L, 1);
    fz_core_fn(L, "msgpack", "encode");
    lua_pushvalue(L, -2);
    fz_call(L, "encode", 1, 1);
    lua_tolstring(L, -1, &len2);
    if (len2 != len) fz_fail("encoding the same value twice gave %zu and %zu bytes", len, len2);
    fz_end(L);
    return 0;
}
