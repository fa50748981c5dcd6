/*
** mc.h: shared helpers of the mayura.core C module.
**
** The core is one translation unit (core/mayura_core.c includes every
** piece), so every function here and in the pieces is static and only
** luaopen_mayura_core is exported.
**
** Conventions every piece follows:
**  - Misuse (a wrong type, an unknown option key, NUL in a path, an absurd
**    number) raises a coded error table at once: mc_raise(L, "INVALID_INPUT", ...).
**  - Expected failures of asynchronous work reach the callback as
**    cb(nil, err), success as cb(result); err is a coded error table.
**  - Error tables share one metatable (registry key MC_ERROR_MT) whose
**    __tostring gives "CODE: message"; the Lua layer uses the same one.
**  - Callbacks run on the main thread through mc_call, which catches and
**    reports errors: an error in a callback never ends the process.
*/
#ifndef MAYURA_MC_H
#define MAYURA_MC_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uv.h>
#include "compat.h"

/* Helpers a piece may or may not use. */
#define MC_FN static __attribute__((unused))
#define MC_VAR static __attribute__((unused))

#define MC_ERROR_MT "mayura.error"
#define MC_LOOP_KEY "mayura.core.loop"
/* The registry's function that readies the allocator for a large string (core.expect_bytes). */
#define MC_EXPECT_KEY "mayura.core.expect"
#define MC_MAIN_KEY "mayura.core.main"
#define MC_REPORT_KEY "mayura.core.reporter"

/* 2^53: the largest integer every JSON peer holds exactly. */
#define MC_MAX_SAFE_INT 9007199254740992LL

/* {======================================================
** Errors
** =======================================================*/

/* A growable byte buffer, for the core's pieces that gather bytes (HTTP bodies, stream parsers). */
typedef struct mc_buf {
    char *p;
    size_t len, cap;
} mc_buf;

/*
** Appends n bytes, growing by doubling from first_cap; the buffer never
** grows beyond limit (SIZE_MAX: no limit but memory). Returns -1 when the
** bytes would pass limit or memory runs out; the buffer is then unchanged.
*/
MC_FN int mc_buf_add(mc_buf *b, const char *p, size_t n, size_t limit, size_t first_cap) {
    if (n == 0) return 0;
    if (n > limit || b->len > limit - n) return -1;
    if (b->len + n > b->cap) {
        size_t need = b->len + n;
        size_t cap = b->cap ? b->cap : first_cap;
        char *np;
        while (cap < need && cap <= SIZE_MAX / 2) cap *= 2;
        if (cap < need) cap = need;
        if (cap > limit) cap = limit;
        np = (char *)realloc(b->p, cap);
        if (np == NULL) return -1;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

MC_FN void mc_buf_free(mc_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Pushes a new error table { code = code, message = msg } with the shared metatable. */
MC_FN void mc_push_error(lua_State *L, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, code);
    lua_setfield(L, -2, "code");
    lua_pushstring(L, msg);
    lua_setfield(L, -2, "message");
    luaL_getmetatable(L, MC_ERROR_MT);
    lua_setmetatable(L, -2);
}

/* Raises a coded error table. Never returns. */
MC_FN int mc_raise(lua_State *L, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mc_push_error(L, code, "%s", msg);
    return lua_error(L);
}

/* Out of memory, the one way the core says it (code NO_MEMORY). */
#define MC_OOM_CODE "NO_MEMORY"
#define MC_OOM_MSG "out of memory"

/* Raises the out-of-memory error. Never returns. */
MC_FN int mc_raise_oom(lua_State *L) {
    return mc_raise(L, MC_OOM_CODE, MC_OOM_MSG);
}

/* Pushes nil and an error table; returns 2 for `return mc_fail(...)`. */
MC_FN int mc_fail(lua_State *L, const char *code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lua_pushnil(L);
    mc_push_error(L, code, "%s", msg);
    return 2;
}

/* Adds field `name` = string `value` to the error table on top of the stack. */
MC_FN void mc_error_field(lua_State *L, const char *name, const char *value) {
    lua_pushstring(L, value);
    lua_setfield(L, -2, name);
}

/* }====================================================== */

/* {======================================================
** Argument checks
** =======================================================*/

/* A string argument or field with no NUL byte and at most maxlen bytes. */
MC_FN const char *mc_check_path(lua_State *L, int idx, const char *what) {
    size_t len;
    const char *s;
    if (lua_type(L, idx) != LUA_TSTRING)
        mc_raise(L, "INVALID_INPUT", "%s must be a string", what);
    s = lua_tolstring(L, idx, &len);
    if (len == 0) mc_raise(L, "INVALID_INPUT", "%s is empty", what);
    if (strlen(s) != len) mc_raise(L, "INVALID_INPUT", "%s contains a NUL byte", what);
    if (len >= PATH_MAX) mc_raise(L, "INVALID_INPUT", "%s is longer than %d bytes", what, PATH_MAX - 1);
    return s;
}

/*
** Refuses keys of the options table at idx that are not in `allowed`
** (a NULL-terminated list), so a misspelt option is an error, not a no-op.
*/
MC_FN void mc_check_keys(lua_State *L, int idx, const char *const allowed[]) {
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int ok = 0;
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) {
            const char *k = lua_tostring(L, -1);
            const char *const *a;
            for (a = allowed; *a != NULL; a++)
                if (strcmp(*a, k) == 0) { ok = 1; break; }
            if (!ok) mc_raise(L, "INVALID_INPUT", "unknown option '%s'", k);
        } else {
            mc_raise(L, "INVALID_INPUT", "option keys must be strings");
        }
    }
}

/* Integer option `key` of the table at idx within [lo, hi], or def when absent. */
MC_FN lua_Integer mc_opt_int(lua_State *L, int idx, const char *key, lua_Integer def,
                              lua_Integer lo, lua_Integer hi) {
    lua_Integer v = def;
    lua_getfield(L, idx, key);
    if (!lua_isnil(L, -1)) {
        if (!lua_isinteger(L, -1)) {
            if (lua_type(L, -1) == LUA_TNUMBER) {
                lua_Number n = lua_tonumber(L, -1);
                /* 2^63 is refused before the cast: (lua_Number)LLONG_MAX rounds up to it */
                if (n != n || n < (lua_Number)lo || n > (lua_Number)hi || n >= 9223372036854775808.0 ||
                    n != (lua_Number)(lua_Integer)n)
                    mc_raise(L, "INVALID_INPUT", "option '%s' must be a whole number from %lld to %lld",
                             key, (long long)lo, (long long)hi);
                v = (lua_Integer)n;
            } else {
                mc_raise(L, "INVALID_INPUT", "option '%s' must be a number", key);
            }
        } else {
            v = lua_tointeger(L, -1);
        }
        if (v < lo || v > hi)
            mc_raise(L, "INVALID_INPUT", "option '%s' must be from %lld to %lld", key,
                     (long long)lo, (long long)hi);
    }
    lua_pop(L, 1);
    return v;
}

/* Boolean option `key`, or def when absent. */
MC_FN int mc_opt_bool(lua_State *L, int idx, const char *key, int def) {
    int v = def;
    lua_getfield(L, idx, key);
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TBOOLEAN)
            mc_raise(L, "INVALID_INPUT", "option '%s' must be a boolean", key);
        v = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* String option `key` (NUL allowed, length in *len), or NULL when absent. Stays valid while the table lives. */
MC_FN const char *mc_opt_lstr(lua_State *L, int idx, const char *key, size_t *len) {
    const char *s = NULL;
    lua_getfield(L, idx, key);
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING)
            mc_raise(L, "INVALID_INPUT", "option '%s' must be a string", key);
        s = lua_tolstring(L, -1, len);
    }
    lua_pop(L, 1);
    return s;
}

/* Function option `key`: returns a registry ref, or LUA_NOREF when absent. */
MC_FN int mc_opt_func_ref(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1)) { lua_pop(L, 1); return LUA_NOREF; }
    if (lua_type(L, -1) != LUA_TFUNCTION)
        mc_raise(L, "INVALID_INPUT", "option '%s' must be a function", key);
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* }====================================================== */

/* {======================================================
** Handles: the one recipe of the core's userdata
** =======================================================*/

/*
** Every userdata the core hands out (a process, a channel, an HTTP request, a relay, a WebSocket,
** a parser, the scratch boxes of the encoders) is a handle of a class registered once with
** mc_class_register, which always installs:
**   __gc and __close  the class's `release`, one function: it frees what the handle owns and
**                     leaves it empty, so a second call, or __gc after __close, finds nothing left;
**                     it also copes with a handle still empty (made, its resource not yet);
**   __tostring        the class's, or "<name> (<address>)";
**   __index           the class's methods (a table, empty when it has none);
**   __name            the class's name (the registry key, "mayura.<what>").
** A handle is made first, empty (mc_handle_new: zeroed, with its metatable), then the resource is
** made and owned by it, so a raise at any later point is cleaned up by __gc. The registry table
** MC_CLASSES_KEY maps each name to its class (core._handle(name) makes an empty one, for specs).
** LuaJIT has no __close: the field is then only read by whoever calls it. (A plain scratch buffer
** that owns nothing, such as spawn's argv or a URL copy, is a userdata without a metatable: Lua frees it.)
*/
#define MC_CLASSES_KEY "mayura.core.classes"

typedef struct mc_class {
    const char *name;          /* registry key and __name */
    size_t size;               /* the userdata's bytes */
    lua_CFunction release;     /* __gc and __close: idempotent, copes with an empty handle */
    lua_CFunction tostring;    /* __tostring, or NULL for "<name> (<address>)" */
    const luaL_Reg *methods;   /* __index, or NULL for none */
    void (*init)(void *h);     /* makes the zeroed bytes an empty handle (registry refs to LUA_NOREF),
                                  or NULL when zeroed is empty */
} mc_class;

MC_FN int mc_handle_tostring(lua_State *L) {
    lua_pushfstring(L, "%s (%p)", lua_tostring(L, lua_upvalueindex(1)), lua_touserdata(L, 1));
    return 1;
}

/* Registers class c once: its metatable in the registry under c->name, and c in MC_CLASSES_KEY. */
MC_FN void mc_class_register(lua_State *L, const mc_class *c) {
    if (luaL_newmetatable(L, c->name)) {
        lua_pushcfunction(L, c->release);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, "__gc");
        lua_setfield(L, -2, "__close");
        if (c->tostring != NULL) {
            lua_pushcfunction(L, c->tostring);
        } else {
            lua_pushstring(L, c->name);
            lua_pushcclosure(L, mc_handle_tostring, 1);
        }
        lua_setfield(L, -2, "__tostring");
        lua_newtable(L);
        if (c->methods != NULL) luaL_setfuncs(L, c->methods, 0);
        lua_setfield(L, -2, "__index");
        lua_pushstring(L, c->name);
        lua_setfield(L, -2, "__name");
    }
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, MC_CLASSES_KEY);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, MC_CLASSES_KEY);
    }
    lua_pushlightuserdata(L, (void *)c);
    lua_setfield(L, -2, c->name);
    lua_pop(L, 1);
}

/*
** The life of an object a handle points to (a process, a channel, a relay), whose C memory
** outlives the handle until libuv has closed back every handle of its own: `uv` counts those
** libuv handles (initialised, close callback not yet run), `holds` what else still needs the
** object (its Lua handle, a callback into Lua under way, a command not yet finished). Its one
** free function runs when mc_life_over says both are zero, and only then.
*/
typedef struct mc_life {
    int uv, holds;
} mc_life;

MC_FN int mc_life_over(const mc_life *l) {
    return l->uv == 0 && l->holds == 0;
}

/* Pushes a new, empty handle of class c (c->size zeroed bytes, with its metatable) and returns it. */
MC_FN void *mc_handle_new(lua_State *L, const mc_class *c) {
    void *h = lua_newuserdatauv(L, c->size, 0);
    memset(h, 0, c->size);
    if (c->init != NULL) c->init(h);
    luaL_setmetatable(L, c->name);
    return h;
}

/* }====================================================== */

/* {======================================================
** Loop and callbacks
** =======================================================*/

/* The libuv loop shared with luv (set up by luaopen_mayura_core). */
MC_FN uv_loop_t *mc_loop(lua_State *L) {
    uv_loop_t *loop;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    loop = (uv_loop_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (loop == NULL) mc_raise(L, "INVALID_INPUT", "mayura.core is not initialised");
    return loop;
}

/*
** The main thread of L's state: loop callbacks run there, never in a coroutine that may be dead.
** Without LUA_RIDX_MAINTHREAD (5.1), it is remembered the first time a call comes from it.
*/
MC_FN lua_State *mc_main(lua_State *L) {
    lua_State *M;
#ifdef MC_NO_RIDX_MAINTHREAD
    lua_getfield(L, LUA_REGISTRYINDEX, MC_MAIN_KEY);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        if (lua_pushthread(L)) {
            lua_pushvalue(L, -1);
            lua_setfield(L, LUA_REGISTRYINDEX, MC_MAIN_KEY);
        }
    }
#else
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
#endif
    M = lua_tothread(L, -1);
    lua_pop(L, 1);
    return M != NULL ? M : L;
}

MC_FN int mc_traceback(lua_State *L) {
    const char *msg = NULL;
    if (lua_type(L, 1) == LUA_TSTRING) msg = lua_tostring(L, 1);
    else if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
    if (msg == NULL) msg = "(error object is not a string)";
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/*
** Reports the message on top of L's stack (and pops it): to the function
** set with core.set_reporter when there is one, else to stderr after "mayura: ".
** Errors in loop callbacks end up here; the loop goes on.
*/
MC_FN void mc_report(lua_State *L) {
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(no message)";
    lua_getfield(L, LUA_REGISTRYINDEX, MC_REPORT_KEY);
    if (lua_isfunction(L, -1)) {
        lua_pushstring(L, msg);
        if (lua_pcall(L, 1, 0, 0) == LUA_OK) { lua_pop(L, 1); return; }
        msg = "(the reporter failed)";
    }
    lua_pop(L, 1);
    fprintf(stderr, "mayura: %s\n", msg);
    fflush(stderr);
    lua_pop(L, 1);
}

/*
** Calls the function below nargs arguments on L's stack in protected mode,
** keeping nresults results (LUA_MULTRET for all). An error is reported with
** a traceback (mc_report) and the process goes on. Returns the lua_pcall code.
*/
MC_FN int mc_pcall_report(lua_State *L, int nargs, int nresults) {
    int base = lua_gettop(L) - nargs;
    int rc;
    lua_pushcfunction(L, mc_traceback);
    lua_insert(L, base);
    rc = lua_pcall(L, nargs, nresults, base);
    if (rc != LUA_OK) {
        lua_pushfstring(L, "error in a loop callback: %s",
                        lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(no message)");
        lua_remove(L, -2);
        mc_report(L);
    }
    lua_remove(L, base);
    return rc;
}

/* mc_pcall_report discarding results: 0 on success, -1 on error. */
MC_FN int mc_call(lua_State *L, int nargs) {
    return mc_pcall_report(L, nargs, 0) == LUA_OK ? 0 : -1;
}

/*
** A step with a budget (core.step, mayura_step) counts the CPU time of the host's thread
** (CLOCK_THREAD_CPUTIME_ID), not the wall clock: what the host's frame pays, whatever else the
** machine runs. mc_step_deadline is where it stops starting work (0 when no step with a budget
** runs), mc_step_start where it began, both in that clock's nanoseconds.
*/
MC_VAR uint64_t mc_step_deadline = 0;
MC_VAR uint64_t mc_step_start = 0;
/* How many steps have begun, which tells one step from the next. */
MC_VAR lua_Integer mc_step_count = 0;

/* This thread's CPU time in nanoseconds. */
MC_FN uint64_t mc_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return uv_hrtime();
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether a step with a budget is running and has spent it: work that can wait should (chan.c). */
MC_FN int mc_step_over(void) {
    return mc_step_deadline != 0 && mc_cpu_ns() >= mc_step_deadline;
}

/* Milliseconds from a uv_hrtime() difference. */
MC_FN double mc_ms(uint64_t ns) { return (double)ns / 1e6; }

/* }====================================================== */

#endif
