/*
** compat.h: every Lua-version difference of the C core lives here.
** The core is written against the Lua 5.4 API; these shims let the same
** source build for Lua 5.1/LuaJIT 2.1 (5.2 and 5.3 need only the first two).
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

#if LUA_VERSION_NUM < 503
/* 5.1/5.2 have no integer subtype: integers travel as doubles. */
#define lua_isinteger(L, i) (lua_type((L), (i)) == LUA_TNUMBER && \
    lua_tonumber((L), (i)) == (lua_Number)(long long)lua_tonumber((L), (i)))
#endif

#if LUA_VERSION_NUM < 502
#define lua_rawlen(L, i) lua_objlen((L), (i))
#define lua_absindex(L, i) ((i) > 0 || (i) <= LUA_REGISTRYINDEX ? (i) : lua_gettop(L) + (i) + 1)
#define LUA_OK 0
static void mc_compat_setfuncs(lua_State *L, const luaL_Reg *l, int nup) {
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
/* The main thread: 5.1 has no LUA_RIDX_MAINTHREAD, the core keeps its own. */
#define MC_NO_RIDX_MAINTHREAD 1
#endif

#endif
