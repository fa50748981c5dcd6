/*
** crc.c: core.crc32(data [, crc]), the CRC-32 of gzip, zip and PNG
** (IEEE 802.3: reflected polynomial 0xEDB88320, initial and final XOR
** 0xFFFFFFFF). `crc` continues a checksum over data given in parts:
** crc32(b, crc32(a)) == crc32(a .. b). Returns an integer in [0, 2^32).
** Providers use it to frame a gzip member (mayura.sandbox.vercel sends
** files as a gzip'd tar); core.stream_parser('eventstream') checks AWS
** event-stream messages with mc_crc32.
*/
#include "mc.h"
#include "crc.h"

static int l_crc32(lua_State *L) {
    size_t len, i;
    const unsigned char *s;
    lua_Number start = 0;
    uint32_t c;
    if (lua_type(L, 1) != LUA_TSTRING)
        return mc_raise(L, "INVALID_INPUT", "crc32: expected a string, got %s", luaL_typename(L, 1));
    s = (const unsigned char *)lua_tolstring(L, 1, &len);
    if (!lua_isnoneornil(L, 2)) {
        if (lua_type(L, 2) != LUA_TNUMBER)
            return mc_raise(L, "INVALID_INPUT", "crc32: crc must be a number, got %s", luaL_typename(L, 2));
        start = lua_tonumber(L, 2);
        if (!(start >= 0 && start <= 4294967295.0) || start != (lua_Number)(uint32_t)start)
            return mc_raise(L, "INVALID_INPUT", "crc32: crc must be a whole number in [0, 2^32)");
    }
    if (!crc_table_ready) crc_init();
    c = ~(uint32_t)start;
    for (i = 0; i < len; i++) c = crc_table[(c ^ s[i]) & 0xff] ^ (c >> 8);
    c = ~c;
    lua_pushinteger(L, (lua_Integer)c);
    return 1;
}

static void mc_open_crc(lua_State *L) {
    lua_pushcfunction(L, l_crc32);
    lua_setfield(L, -2, "crc32");
}
