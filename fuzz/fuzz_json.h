/*
** fuzz_json.h: the oracle of the JSON targets. fzj_same(orig, dec) says
** whether dec (what json.decode gave back for json.encode(orig)) is what
** the documented mapping promises:
**   nil and core.json.null -> null; booleans and strings unchanged;
**   numbers equal in value, and an integral value within +-2^53 (not -0)
**   comes back an integer (beyond 2^53 the double nearest the integer);
**   a table encodes as the encoder decides (array_mt: an array of its
**   raw length, object_mt: an object, else string keys: object, keys
**   1..n: array, empty: object) and comes back with array_mt / object_mt.
** orig must be encodable (encode succeeded on it), so it has no cycle.
*/
#ifndef MAYURA_FUZZ_JSON_H
#define MAYURA_FUZZ_JSON_H

static const char *fzj_why = "";

static int fzj_is_null(lua_State *L, int idx) {
    return lua_type(L, idx) == LUA_TLIGHTUSERDATA && lua_touserdata(L, idx) == NULL;
}

static int fzj_has_mt(lua_State *L, int idx, const char *name) {
    int r;
    if (!lua_getmetatable(L, idx)) return 0;
    luaL_getmetatable(L, name);
    r = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return r;
}

/* How the encoder sees the table at idx: 1 = array (*n elements), 0 = object. */
static int fzj_kind(lua_State *L, int idx, lua_Integer *n) {
    lua_Integer max = 0;
    int nstr = 0;
    if (fzj_has_mt(L, idx, JSON_ARRAY_MT)) {
        *n = (lua_Integer)lua_rawlen(L, idx);
        return 1;
    }
    if (fzj_has_mt(L, idx, JSON_OBJECT_MT)) return 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) nstr = 1;
        else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) > max) max = lua_tointeger(L, -1);
    }
    if (nstr || max == 0) return 0;
    *n = max;
    return 1;
}

/* Nesting of tables in the value at idx (a scalar: 0). */
static __attribute__((unused)) int fzj_depth(lua_State *L, int idx) {
    int d = 0;
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE) return 0;
    luaL_checkstack(L, 4, "fzj_depth");
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int s = fzj_depth(L, -1);
        if (s > d) d = s;
        lua_pop(L, 1);
    }
    return d + 1;
}

static int fzj_same(lua_State *L, int o, int d) {
    o = lua_absindex(L, o);
    d = lua_absindex(L, d);
    luaL_checkstack(L, 6, "fzj_same");
    switch (lua_type(L, o)) {
    case LUA_TNIL:
    case LUA_TNONE:
        if (!fzj_is_null(L, d)) { fzj_why = "nil did not come back as null"; return 0; }
        return 1;
    case LUA_TLIGHTUSERDATA:
        if (!fzj_is_null(L, o) || !fzj_is_null(L, d)) { fzj_why = "null did not come back as null"; return 0; }
        return 1;
    case LUA_TBOOLEAN:
        if (lua_type(L, d) != LUA_TBOOLEAN || lua_toboolean(L, o) != lua_toboolean(L, d)) {
            fzj_why = "a boolean changed";
            return 0;
        }
        return 1;
    case LUA_TSTRING: {
        size_t a, b;
        const char *x, *y;
        if (lua_type(L, d) != LUA_TSTRING) { fzj_why = "a string came back as another type"; return 0; }
        x = lua_tolstring(L, o, &a);
        y = lua_tolstring(L, d, &b);
        if (a != b || memcmp(x, y, a) != 0) { fzj_why = "a string changed"; return 0; }
        return 1;
    }
    case LUA_TNUMBER: {
        double v;
        if (lua_type(L, d) != LUA_TNUMBER) { fzj_why = "a number came back as another type"; return 0; }
        v = (double)lua_tonumber(L, d);
        if (lua_isinteger(L, o) && (lua_tointeger(L, o) > MC_MAX_SAFE_INT || lua_tointeger(L, o) < -MC_MAX_SAFE_INT)) {
            if ((double)lua_tointeger(L, o) != v) { fzj_why = "a large integer changed"; return 0; }
        } else if (!lua_rawequal(L, o, d)) {
            fzj_why = "a number changed";
            return 0;
        }
        if (!lua_isinteger(L, d) && v >= -(double)MC_MAX_SAFE_INT && v <= (double)MC_MAX_SAFE_INT &&
            v == (double)(lua_Integer)v && !(v == 0 && signbit(v))) {
            fzj_why = "an integral number within 2^53 came back as a float";
            return 0;
        }
        return 1;
    }
    case LUA_TTABLE: {
        lua_Integer n = 0, i, count = 0, dcount = 0;
        if (lua_type(L, d) != LUA_TTABLE) { fzj_why = "a table came back as another type"; return 0; }
        if (fzj_kind(L, o, &n)) {
            if (!fzj_has_mt(L, d, JSON_ARRAY_MT)) { fzj_why = "an array came back without array_mt"; return 0; }
            if ((lua_Integer)lua_rawlen(L, d) != n) { fzj_why = "an array changed length"; return 0; }
            for (i = 1; i <= n; i++) {
                int ok;
                lua_rawgeti(L, o, i);
                lua_rawgeti(L, d, i);
                ok = fzj_same(L, -2, -1);
                lua_pop(L, 2);
                if (!ok) return 0;
            }
            return 1;
        }
        if (!fzj_has_mt(L, d, JSON_OBJECT_MT)) { fzj_why = "an object came back without object_mt"; return 0; }
        lua_pushnil(L);
        while (lua_next(L, o) != 0) {
            int ok;
            count++;
            lua_pushvalue(L, -2);
            lua_rawget(L, d);
            if (lua_isnil(L, -1)) { lua_pop(L, 3); fzj_why = "an object lost a key"; return 0; }
            ok = fzj_same(L, -2, -1);
            lua_pop(L, 2);
            if (!ok) { lua_pop(L, 1); return 0; }
        }
        lua_pushnil(L);
        while (lua_next(L, d) != 0) {
            dcount++;
            lua_pop(L, 1);
        }
        if (count != dcount) { fzj_why = "an object gained keys"; return 0; }
        return 1;
    }
    default:
        fzj_why = "a value of a type JSON does not have was encoded";
        return 0;
    }
}

#endif
