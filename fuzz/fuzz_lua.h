/*
** fuzz_lua.h: what the libFuzzer targets that go through Lua share.
**
** The whole core is included, so a target reaches its static functions
** (json_scan, chan_decode, mc_http_on_header, ...) as well as the module.
** One lua_State lives for the whole run: the core is opened into it with
** luaopen_mayura_core (the loop pointer is put in the registry first, the
** way a host program does, so luv is not needed), and each input ends with
** a full collection, so the __gc paths run for every input too.
**
** An invariant that does not hold is reported with fz_fail, which aborts:
** libFuzzer keeps the input as a crash artifact.
**
** The Lua interpreter is a library built without coverage instrumentation,
** so libFuzzer sees none of the Lua a target drives. A target whose parser
** is Lua calls fz_cover_lua for each input: a line hook then counts each step from one Lua
** line to the next in libFuzzer's extra counters, so those steps are
** features ('ft', not 'cov', in libFuzzer's output) that steer the search.
*/
#ifndef MAYURA_FUZZ_LUA_H
#define MAYURA_FUZZ_LUA_H

#include "../core/mayura_core.c"

#include <stdarg.h>

#ifndef MAYURA_FUZZ_ROOT
#define MAYURA_FUZZ_ROOT "."
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lua_State *fz_L = NULL;

static void fz_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fz_fail(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "\n*** fuzz invariant broken: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

/* The shared state: the core opened as package.loaded['mayura.core'], the repository's Lua on package.path. */
static lua_State *fz_state(void) {
    lua_State *L;
    if (fz_L != NULL) return fz_L;
    L = luaL_newstate();
    if (L == NULL) fz_fail("no lua_State");
    luaL_openlibs(L);
    lua_pushlightuserdata(L, uv_default_loop());
    lua_setfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    luaL_requiref(L, "mayura.core", luaopen_mayura_core, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_pushstring(L, MAYURA_FUZZ_ROOT "/lua/?.lua;" MAYURA_FUZZ_ROOT "/lua/?/init.lua;"
                      MAYURA_FUZZ_ROOT "/providers/?.lua;" MAYURA_FUZZ_ROOT "/tools/?.lua");
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    fz_L = L;
    return L;
}

/* The steps between Lua lines, hashed: libFuzzer reads this section as features of each input. */
#define FZ_LUA_COUNTERS 65536
static uint8_t fz_lua_counters[FZ_LUA_COUNTERS] __attribute__((used, section("__libfuzzer_extra_counters")));
static uintptr_t fz_lua_prev;

static void fz_lua_line(lua_State *L, lua_Debug *ar) {
    uintptr_t here;
    size_t i;
    if (!lua_getinfo(L, "S", ar)) return;
    /* a line of a loaded chunk: its source string stays alive, so its address names it */
    here = ((uintptr_t)ar->source * 2654435761u) ^ ((uintptr_t)ar->currentline * 40503u);
    i = (size_t)((here ^ (fz_lua_prev >> 1)) % FZ_LUA_COUNTERS);
    if (fz_lua_counters[i] != UINT8_MAX) fz_lua_counters[i]++;
    fz_lua_prev = here;
}

/* Lua line-to-line steps become libFuzzer features; called at the start of each input, so that
   the first step of one input does not depend on the last line of the one before. */
static void fz_cover_lua(lua_State *L) {
    fz_lua_prev = 0;
    lua_sethook(L, fz_lua_line, LUA_MASKLINE, 0);
}

/* Pushes core[sub][name] (sub may be NULL for core[name]). */
MC_FN void fz_core_fn(lua_State *L, const char *sub, const char *name) {
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_getfield(L, -1, "mayura.core");
    lua_remove(L, -2);
    if (sub != NULL) {
        lua_getfield(L, -1, sub);
        lua_remove(L, -2);
    }
    lua_getfield(L, -1, name);
    lua_remove(L, -2);
    if (lua_type(L, -1) != LUA_TFUNCTION && lua_type(L, -1) != LUA_TTABLE)
        fz_fail("core.%s%s%s is missing", sub ? sub : "", sub ? "." : "", name);
}

/* Whether the value at idx is a coded error of the core (the shared metatable) with this code (NULL: any). */
MC_FN int fz_is_coded(lua_State *L, int idx, const char *code) {
    int ok;
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE || !lua_getmetatable(L, idx)) return 0;
    luaL_getmetatable(L, MC_ERROR_MT);
    ok = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    if (!ok) return 0;
    lua_getfield(L, idx, "code");
    ok = lua_type(L, -1) == LUA_TSTRING && (code == NULL || strcmp(lua_tostring(L, -1), code) == 0);
    lua_pop(L, 1);
    return ok;
}

/* A printable description of an error value, for fz_fail. */
MC_FN const char *fz_describe(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TSTRING) return lua_tostring(L, idx);
    if (lua_type(L, idx) == LUA_TTABLE) {
        const char *s;
        lua_getfield(L, idx, "message");
        s = lua_tostring(L, -1);
        lua_pop(L, 1);   /* the string stays alive in the table */
        if (s != NULL) return s;
    }
    return luaL_typename(L, idx);
}

/* Ends an input: back to an empty stack, then a full collection. */
static void fz_end(lua_State *L) {
    lua_settop(L, 0);
    lua_gc(L, LUA_GCCOLLECT, 0);
}

#endif
