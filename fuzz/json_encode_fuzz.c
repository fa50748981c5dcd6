/*
** json_encode_fuzz: core.json.encode on Lua values shaped by the input.
**
** The input is a little program for a stack machine that builds values:
** strings of any bytes, integers (all 64 bits), floats (NaN, infinities,
** subnormals, -0), booleans, null, tables with string / integer / odd keys,
** array_mt and object_mt, shared and cyclic tables, and values JSON has
** no form for. The first byte may ask for a max_depth option.
**
** encode either gives a string or raises an INVALID_INPUT coded error,
** nothing else; the string decodes to the same value (fuzz_json.h).
*/
#include "fuzz_lua.h"
#include "fuzz_json.h"

#define MAX_STACK 200

#include "fuzz_input.h"

static uint64_t take_u64(input *in) {
    const uint8_t *p;
    size_t n = take(in, 8, &p), i;
    uint64_t v = 0;
    for (i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int is_table(lua_State *L, int idx) {
    return idx >= 1 && lua_type(L, idx) == LUA_TTABLE;
}

static int noop(lua_State *L) {
    (void)L;
    return 0;
}

static void build(lua_State *L, input *in) {
    static const double specials[] = {
        0.5, -0.0, 1e300, -1e300, 5e-324, 2.2250738585072014e-308, 9007199254740992.0,
        9007199254740994.0, 1e15 + 0.3, 0.1, 1.0 / 3.0, 123456789012345678.0, 3.0, -7.0,
    };
    int op;
    while ((op = next(in)) >= 0) {
        int top = lua_gettop(L);
        if (top >= MAX_STACK && (op % 16) <= 6) op = 15;
        switch (op % 16) {
        case 0: {   /* a string */
            const uint8_t *p;
            int n = next(in);
            size_t got = take(in, n < 0 ? 0 : (size_t)n % 64, &p);
            lua_pushlstring(L, (const char *)p, got);
            break;
        }
        case 1: lua_pushinteger(L, (lua_Integer)take_u64(in)); break;
        case 2: lua_pushinteger(L, (lua_Integer)next(in) - 128); break;
        case 3: {   /* any double */
            uint64_t bits = take_u64(in);
            double d;
            memcpy(&d, &bits, sizeof d);
            lua_pushnumber(L, d);
            break;
        }
        case 4: lua_pushboolean(L, next(in) & 1); break;
        case 5: lua_pushlightuserdata(L, NULL); break;
        case 6: lua_newtable(L); break;
        case 7:   /* t[#t + 1] = v */
            if (top >= 2 && is_table(L, top - 1)) {
                lua_rawseti(L, top - 1, (lua_Integer)lua_rawlen(L, top - 1) + 1);
            }
            break;
        case 8:   /* t[k] = v with k a string on the stack, or made here */
            if (top >= 3 && is_table(L, top - 2) && lua_type(L, top - 1) == LUA_TSTRING) {
                lua_rawset(L, top - 2);
            } else if (top >= 2 && is_table(L, top - 1)) {
                const uint8_t *p;
                int n = next(in);
                size_t got = take(in, n < 0 ? 0 : (size_t)n % 8, &p);
                lua_pushlstring(L, (const char *)p, got);
                lua_insert(L, -2);
                lua_rawset(L, top - 1);
            }
            break;
        case 9:   /* t[i] = v with a small integer i (holes, 0, negatives) */
            if (top >= 2 && is_table(L, top - 1)) {
                lua_rawseti(L, top - 1, (lua_Integer)next(in) - 2);
            }
            break;
        case 10:
        case 11:
            if (top >= 1 && is_table(L, top)) {
                luaL_getmetatable(L, op % 16 == 10 ? JSON_ARRAY_MT : JSON_OBJECT_MT);
                lua_setmetatable(L, top);
            }
            break;
        case 12:   /* the same value again: shared tables, and cycles once it is stored */
            if (top >= 1 && top < MAX_STACK) {
                int b = next(in);
                lua_pushvalue(L, 1 + (b < 0 ? 0 : b) % top);
            }
            break;
        case 13: {
            int b = next(in);
            size_t k = (b < 0 ? 0 : (size_t)b) % (sizeof specials / sizeof specials[0] + 3);
            if (top >= MAX_STACK) break;
            if (k < sizeof specials / sizeof specials[0]) lua_pushnumber(L, specials[k]);
            else if (k == sizeof specials / sizeof specials[0]) lua_pushnumber(L, (lua_Number)NAN);
            else if (k == sizeof specials / sizeof specials[0] + 1) lua_pushnumber(L, (lua_Number)HUGE_VAL);
            else lua_pushnumber(L, (lua_Number)-HUGE_VAL);
            break;
        }
        case 14: {   /* values JSON has no form for */
            int b = next(in);
            if (top >= MAX_STACK) break;
            if (b < 0 || b % 3 == 0) lua_pushcfunction(L, noop);
            else if (b % 3 == 1) lua_pushlightuserdata(L, (void *)L);
            else lua_pushnumber(L, 1.5);   /* fine as a value; as a key it is refused */
            break;
        }
        default:
            if (top >= 2) lua_pop(L, 1);
            break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = fz_state();
    input in = { data, size };
    int opt = next(&in), base, v, nargs = 1;
    size_t len;
    const char *text;

    luaL_checkstack(L, MAX_STACK + 40, "fuzz");
    fz_core_fn(L, "json", "encode");
    base = lua_gettop(L);
    build(L, &in);
    if (lua_gettop(L) == base) lua_pushnil(L);
    lua_settop(L, base + 1);   /* the first value built is the one encoded */
    v = base + 1;
    lua_pushvalue(L, base);
    lua_pushvalue(L, v);
    if (opt >= 0 && (opt & 0x80)) {
        lua_createtable(L, 0, 1);
        lua_pushinteger(L, (opt & 0x7f) * 9);   /* 0 is refused; 9..1143 crosses the 1000 limit */
        lua_setfield(L, -2, "max_depth");
        nargs = 2;
    }
    if (lua_pcall(L, nargs, 1, 0) != LUA_OK) {
        if (!fz_is_coded(L, -1, "INVALID_INPUT")) fz_fail("json.encode raised something other than INVALID_INPUT: %s", fz_describe(L, -1));
        fz_end(L);
        return 0;
    }
    text = lua_tolstring(L, -1, &len);
    if (text == NULL) fz_fail("json.encode gave no string");
    if (strlen(text) != len) fz_fail("json.encode wrote a NUL byte");

    fz_core_fn(L, "json", "decode");
    lua_pushlstring(L, text, len);
    if (lua_pcall(L, 1, 2, 0) != LUA_OK) fz_fail("json.decode raised: %s", fz_describe(L, -1));
    if (lua_isnil(L, -2)) fz_fail("json.decode refused what json.encode wrote: %s (%.200s)", fz_describe(L, -1), text);
    lua_pop(L, 1);
    if (!fzj_same(L, v, -1)) fz_fail("round trip: %s (text %.200s)", fzj_why, text);
    fz_end(L);
    return 0;
}
