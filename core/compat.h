/*
** compat.h: every Lua-version difference of the C core lives here.
** The core is written against the Lua 5.4 API; these shims let the same
** source build for LuaJIT 2.1 (the Lua 5.1 ABI, with the few 5.2 functions
** LuaJIT adds) and plain Lua 5.1. Each shim is chosen by what the headers
** define, not by a version check alone, so that a LuaJIT that adds a
** function (luaL_setfuncs, luaL_traceback, lua_tointegerx) keeps its own.
*/
#ifndef MAYURA_COMPAT_H
#define MAYURA_COMPAT_H

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#if LUA_VERSION_NUM < 504
/* Before 5.4 a userdata has exactly one user value. */
#define lua_newuserdatauv(L, sz, nuv) lua_newuserdata((L), (sz))
#endif

#if LUA_VERSION_NUM < 504
/*
** lua_resume as 5.4 has it, the number of results through nres. Before 5.4
** the results are the whole stack of the coroutine (5.2 and 5.3 take the
** thread resuming it too; 5.1 does not).
*/
static inline int mc_compat_resume(lua_State *L, lua_State *from, int nargs, int *nres) {
#if LUA_VERSION_NUM < 502
    int rc = lua_resume(L, nargs);
    (void)from;
#else
    int rc = lua_resume(L, from, nargs);
#endif
    *nres = lua_gettop(L);
    return rc;
}
#define lua_resume(L, from, nargs, nres) mc_compat_resume((L), (from), (nargs), (nres))
#endif

#if LUA_VERSION_NUM < 503
/*
** 5.1/5.2 have no integer subtype: integers travel as doubles, and a number
** counts as an integer when it is one exactly and fits lua_Integer (the
** range check comes first: casting a double out of range is undefined).
*/
static inline int mc_compat_isinteger(lua_State *L, int i) {
    lua_Number n;
    if (lua_type(L, i) != LUA_TNUMBER) return 0;
    n = lua_tonumber(L, i);
    return n >= -9223372036854775808.0 && n < 9223372036854775808.0 &&
           n == (lua_Number)(long long)n;
}
#define lua_isinteger(L, i) mc_compat_isinteger((L), (i))
#endif

#if LUA_VERSION_NUM < 502
#define lua_rawlen(L, i) lua_objlen((L), (i))
#define lua_absindex(L, i) ((i) > 0 || (i) <= LUA_REGISTRYINDEX ? (i) : lua_gettop(L) + (i) + 1)

/* The length of the value at i, its __len first (as 5.2 has it, for tables too). */
static inline lua_Integer mc_compat_len(lua_State *L, int i) {
    lua_Integer n;
    int isnum = 0;
    i = lua_absindex(L, i);
    if (luaL_callmeta(L, i, "__len")) {
        n = lua_tointeger(L, -1);
        isnum = lua_isnumber(L, -1);
        lua_pop(L, 1);
        if (!isnum) luaL_error(L, "object length is not an integer");
        return n;
    }
    return (lua_Integer)lua_objlen(L, i);
}
#define luaL_len(L, i) mc_compat_len((L), (i))

/* tostring() of the value at i pushed on the stack, its text returned (and its length through len). */
static inline const char *mc_compat_tolstring(lua_State *L, int i, size_t *len) {
    i = lua_absindex(L, i);
    if (luaL_callmeta(L, i, "__tostring")) {
        if (!lua_isstring(L, -1)) luaL_error(L, "'__tostring' must return a string");
    } else {
        switch (lua_type(L, i)) {
        case LUA_TNUMBER:
        case LUA_TSTRING: lua_pushvalue(L, i); break;
        case LUA_TBOOLEAN: lua_pushstring(L, lua_toboolean(L, i) ? "true" : "false"); break;
        case LUA_TNIL: lua_pushliteral(L, "nil"); break;
        default:
            lua_pushfstring(L, "%s: %p", luaL_typename(L, i), lua_topointer(L, i));
            break;
        }
    }
    return lua_tolstring(L, -1, len);
}
#define luaL_tolstring(L, i, len) mc_compat_tolstring((L), (i), (len))

#ifndef LUA_OK
#define LUA_OK 0
#endif

/*
** Plain 5.1 lacks what LuaJIT 2.1 took from 5.2: lua_tointegerx,
** luaL_setmetatable, luaL_testudata, luaL_setfuncs and luaL_newlib (LuaJIT
** defines luaL_newlib as a macro over its own luaL_setfuncs) and luaL_traceback.
*/
#ifndef luaL_newlib
/* lua_tointeger, and whether the value is a number (LuaJIT has its own). */
static inline lua_Integer mc_compat_tointegerx(lua_State *L, int i, int *isnum) {
    if (isnum != NULL) *isnum = lua_isnumber(L, i);
    return lua_tointeger(L, i);
}
#define lua_tointegerx(L, i, isnum) mc_compat_tointegerx((L), (i), (isnum))

#define luaL_setmetatable(L, tname) (luaL_getmetatable((L), (tname)), (void)lua_setmetatable((L), -2))

/* The userdata at i when its metatable is tname's, else NULL. */
static inline void *mc_compat_testudata(lua_State *L, int i, const char *tname) {
    void *p = lua_touserdata(L, i);
    int same;
    if (p == NULL || !lua_getmetatable(L, i)) return NULL;
    luaL_getmetatable(L, tname);
    same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same ? p : NULL;
}
#define luaL_testudata(L, i, tname) mc_compat_testudata((L), (i), (tname))

static inline void mc_compat_setfuncs(lua_State *L, const luaL_Reg *l, int nup) {
    luaL_checkstack(L, nup + 1, "too many upvalues");
    for (; l->name != NULL; l++) {
        int i;
        for (i = 0; i < nup; i++) lua_pushvalue(L, -nup);
        lua_pushcclosure(L, l->func, nup);
        lua_setfield(L, -(nup + 2), l->name);
    }
    lua_pop(L, nup);
}
#define luaL_setfuncs(L, l, nup) mc_compat_setfuncs((L), (l), (nup))
#define luaL_newlib(L, l) (lua_newtable(L), luaL_setfuncs((L), (l), 0))

/* luaL_traceback through debug.traceback; the bare message when that fails. */
static inline void mc_compat_traceback(lua_State *L, lua_State *L1, const char *msg, int level) {
    lua_getglobal(L, "debug");
    lua_getfield(L, -1, "traceback");
    lua_remove(L, -2);
    if (L1 != L) {
        lua_pushthread(L1);
        lua_xmove(L1, L, 1);
    }
    lua_pushstring(L, msg);
    /* called from here, debug.traceback is one level deeper in L */
    lua_pushinteger(L, level + (L1 == L ? 1 : 0));
    if (lua_pcall(L, L1 != L ? 3 : 2, 1, 0) != 0) {
        lua_pop(L, 1);
        lua_pushstring(L, msg);
    }
}
#define luaL_traceback(L, L1, msg, level) mc_compat_traceback((L), (L1), (msg), (level))
#endif

/*
** A buffer of a known size: 5.1 buffers grow in LUAL_BUFFERSIZE steps only,
** so the block is a userdata kept on top of the stack until the result is
** pushed (lua_newuserdata raises the memory error as luaL_buffinitsize does).
** Nothing may be pushed in between, as with 5.4's sized buffers.
*/
static inline char *mc_compat_buffinitsize(lua_State *L, luaL_Buffer *B, size_t sz) {
    B->L = L;
    return (char *)lua_newuserdata(L, sz > 0 ? sz : 1);
}
static inline void mc_compat_pushresultsize(luaL_Buffer *B, size_t sz) {
    lua_State *L = B->L;
    lua_pushlstring(L, (const char *)lua_touserdata(L, -1), sz);
    lua_remove(L, -2);
}
#define luaL_buffinitsize(L, B, sz) mc_compat_buffinitsize((L), (B), (sz))
#define luaL_pushresultsize(B, sz) mc_compat_pushresultsize((B), (sz))

/*
** The main thread: 5.1 has no LUA_RIDX_MAINTHREAD, so the core keeps it
** under its own registry key (MC_MAIN_KEY), set from the main thread.
*/
#define MC_NO_RIDX_MAINTHREAD 1
#endif

#endif
