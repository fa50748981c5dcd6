/*
** embed.c: the C embedding API of include/mayura.h, built as libmayura.a from the core's one
** source (it includes mayura_core.c). Only the mayura_* functions and luaopen_mayura_core are
** exported.
*/
#include "mc.h"
#include "../include/mayura.h"

#include "mayura_core.c"

#define MAYURA_API __attribute__((visibility("default")))

static int embed_preload_luv(lua_State *L) {
    return luaopen_luv(L);
}

/* Puts `prefix` in front of package[field]. */
static void embed_prepend(lua_State *L, const char *field, const char *prefix) {
    lua_getglobal(L, "package");
    lua_pushstring(L, prefix);
    lua_getfield(L, -2, field);
    lua_concat(L, 2);
    lua_setfield(L, -2, field);
    lua_pop(L, 1);
}

static int embed_open(lua_State *L) {
    const char *root = lua_tostring(L, 1);
    uv_loop_t *loop = (uv_loop_t *)lua_touserdata(L, 2);
    luv_set_loop(L, loop);
    luv_set_callback(L, mc_luv_pcall);
    lua_pushlightuserdata(L, loop);
    lua_setfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    mc_set_driver(L, "step");
    lua_getglobal(L, "package");
    if (!lua_istable(L, -1)) return luaL_error(L, "mayura_open: open the standard libraries first");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, embed_preload_luv);
    lua_setfield(L, -2, "luv");
    lua_pushcfunction(L, luaopen_mayura_core);
    lua_setfield(L, -2, "mayura.core");
    lua_pop(L, 2);
    if (root != NULL) {
        lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s/providers/?.lua;%s/tools/?.lua;",
                        root, root, root, root);
    } else {
        lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", MAYURA_LUADIR, MAYURA_LUADIR);
    }
    embed_prepend(L, "path", lua_tostring(L, -1));
    return 0;
}

MAYURA_API int mayura_open(lua_State *L, const char *root) {
    uv_loop_t *loop;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    loop = (uv_loop_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (loop != NULL) {
        lua_pushstring(L, "mayura_open: mayura is already open in this state");
        return -1;
    }
    loop = (uv_loop_t *)malloc(sizeof *loop);
    if (loop == NULL) {
        lua_pushstring(L, MC_OOM_MSG);
        return -1;
    }
    if (uv_loop_init(loop) != 0) {
        free(loop);
        lua_pushstring(L, "mayura_open: cannot start a libuv loop");
        return -1;
    }
    lua_pushcfunction(L, embed_open);
    if (root != NULL) lua_pushstring(L, root); else lua_pushnil(L);
    lua_pushlightuserdata(L, loop);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        lua_pushnil(L);
        lua_setfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
        (void)uv_loop_close(loop);
        free(loop);
        return -1;
    }
    return 0;
}

MAYURA_API int mayura_step(lua_State *L, long budget_us) {
    return mc_step(L, budget_us < 0 ? 0 : budget_us);
}

MAYURA_API int mayura_backend_fd(lua_State *L) {
    return uv_backend_fd(mc_loop(L));
}

MAYURA_API int mayura_backend_timeout(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    uv_update_time(loop);
    return uv_backend_timeout(loop);
}

#include <luv/lhandle.h>

struct embed_walk {
    lua_State *L;
    luv_ctx_t *ctx;
    int closed;     /* how many this walk closed */
};

/*
** Closes a luv handle (a timer a task still waits on, say) through luv's own close while the
** state is alive: luv's close callback uses the state, so it must run before lua_close.
** The core's handles are closed by their own finalizers in lua_close.
*/
static void embed_close_luv(uv_handle_t *h, void *arg) {
    struct embed_walk *w = (struct embed_walk *)arg;
    luv_handle_t *d = (luv_handle_t *)h->data;
    if (d == NULL || uv_is_closing(h) || d->ctx != w->ctx) return;
    lua_rawgeti(w->L, LUA_REGISTRYINDEX, d->ref);
    lua_getfield(w->L, -1, "close");
    lua_insert(w->L, -2);
    if (lua_pcall(w->L, 1, 0, 0) != LUA_OK) lua_pop(w->L, 1);
    w->closed++;
}

MAYURA_API void mayura_close(lua_State *L) {
    struct embed_walk w;
    uv_loop_t *loop;
    int i;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    loop = (uv_loop_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (loop != NULL && mc_run_depth == 0) {
        w.L = L;
        lua_getfield(L, LUA_REGISTRYINDEX, "luv_context");
        w.ctx = (luv_ctx_t *)lua_touserdata(L, -1);
        lua_pop(L, 1);
        /*
        ** The pass that finishes those closes also runs what is due (a reply that resumes a task,
        ** which may start a timer): walk again until a walk finds nothing of luv's open.
        */
        for (i = 0; w.ctx != NULL && i < 100; i++) {
            w.closed = 0;
            uv_walk(loop, embed_close_luv, &w);
            mc_run_depth++;
            uv_run(loop, UV_RUN_NOWAIT);
            mc_run_depth--;
            if (w.closed == 0) break;
        }
    }
    lua_close(L);
    if (loop == NULL) return;
    /* what the state's finalizers closed finishes closing; then nothing is left */
    for (i = 0; i < 100 && uv_loop_close(loop) != 0; i++) uv_run(loop, UV_RUN_NOWAIT);
    if (uv_loop_close(loop) == 0) free(loop);
    /* else something outlives the state (a request the kernel has not answered): the loop is left, not freed under it */
}
