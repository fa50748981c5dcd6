/*
** embed.c: the C embedding API of include/mayura.h, built as libmayura.a from the core's one
** source (it includes mayura_core.c). Only the mayura_* functions and luaopen_mayura_core are
** exported.
*/
#include "mc.h"
#include "../include/mayura.h"

#include "mayura_core.c"

#include <pthread.h>
#include <sys/mman.h>

#define MAYURA_API __attribute__((visibility("default")))

/* {======================================================
** An allocator that keeps frames short (mayura_newstate)
** =======================================================*/

/*
** Blocks of BIG_MIN bytes and more are mappings of their own, with a header of BIG_HEAD bytes in
** front that says how large the mapping is. A freed one is kept, warm, for the next block that
** fits it (big_fits: at most an eighth larger), instead of going back to the system: unmapping
** 16 MiB costs the thread ~1 ms, and a new mapping costs its page faults (~8 ms for 16 MiB) in the
** frame that first writes it. Kept blocks are capped at BIG_KEEP bytes (the oldest go first). When
** a large string is coming (core.expect_bytes: a file read in parts), the allocator's thread maps a
** block of that size and touches every page of it ahead, so making the string costs its copy alone.
** Unmapping happens on that thread too. Smaller blocks are the C library's.
*/
#define BIG_MIN ((size_t)1 << 20)
#define BIG_HEAD ((size_t)16)
#define BIG_KEEP ((size_t)128 << 20)
#define BIG_SLOTS 64
#define BIG_PAGE ((size_t)4096)

typedef struct big_block { char *base; size_t size; } big_block;

typedef struct embed_alloc {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop;
    big_block ready[BIG_SLOTS];     /* mapped and touched, oldest first */
    int nready;
    size_t ready_bytes;
    size_t want[BIG_SLOTS];         /* sizes to map and touch ahead */
    int nwant;
    big_block drop[BIG_SLOTS];      /* to unmap */
    int ndrop;
} embed_alloc;

static size_t big_map_size(size_t n) {
    return (n + BIG_HEAD + BIG_PAGE - 1) & ~(BIG_PAGE - 1);
}

/* Whether a kept block of `size` serves a mapping of `need`: not smaller, and not much larger. */
static int big_fits(size_t size, size_t need) {
    return size >= need && size - need <= need / 8;
}

/* The user pointer of a mapping, whose header holds its size. */
static void *big_user(big_block b) {
    memcpy(b.base, &b.size, sizeof b.size);
    return b.base + BIG_HEAD;
}

static big_block big_of(void *p) {
    big_block b;
    b.base = (char *)p - BIG_HEAD;
    memcpy(&b.size, b.base, sizeof b.size);
    return b;
}

/* A new mapping of `size` bytes (base NULL when there is no memory). */
static big_block big_map(size_t size) {
    big_block b;
    b.size = size;
    b.base = (char *)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b.base == MAP_FAILED) b.base = NULL;
    return b;
}

/* Takes kept block i out of the kept ones, the order of the others unchanged; with a->mu held. */
static big_block big_take(embed_alloc *a, int i) {
    big_block b = a->ready[i];
    a->ready_bytes -= b.size;
    for (; i + 1 < a->nready; i++) a->ready[i] = a->ready[i + 1];
    a->nready--;
    return b;
}

/* Drops the oldest kept blocks over BIG_KEEP into `out`; with a->mu held. Returns how many. */
static int big_trim(embed_alloc *a, big_block *out, int room) {
    int n = 0;
    while (a->nready > 0 && a->ready_bytes > BIG_KEEP && n < room) out[n++] = big_take(a, 0);
    return n;
}

/* Keeps a block, or drops it when there is no slot; with a->mu held. Returns 0 when it was neither. */
static int big_keep(embed_alloc *a, big_block b) {
    if (a->nready < BIG_SLOTS) {
        a->ready[a->nready++] = b;
        a->ready_bytes += b.size;
        return 1;
    }
    if (a->ndrop < BIG_SLOTS) {
        a->drop[a->ndrop++] = b;
        return 1;
    }
    return 0;
}

static void *embed_alloc_thread(void *arg) {
    embed_alloc *a = (embed_alloc *)arg;
    big_block gone[BIG_SLOTS * 2];
    int n, i;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->nwant == 0 && a->ndrop == 0 && a->ready_bytes <= BIG_KEEP)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->stop) break;
        n = 0;
        for (i = 0; i < a->ndrop; i++) gone[n++] = a->drop[i];
        a->ndrop = 0;
        n += big_trim(a, gone + n, BIG_SLOTS);
        if (a->nwant > 0) {
            size_t size = a->want[--a->nwant], off;
            big_block b;
            pthread_mutex_unlock(&a->mu);
            b = big_map(size);
            for (off = 0; b.base != NULL && off < size; off += BIG_PAGE) ((volatile char *)b.base)[off] = 0;
            pthread_mutex_lock(&a->mu);
            if (b.base != NULL && !big_keep(a, b)) gone[n++] = b;
        }
        pthread_mutex_unlock(&a->mu);
        for (i = 0; i < n; i++) munmap(gone[i].base, gone[i].size);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int embed_panic(lua_State *L) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "mayura: unprotected error in Lua: %s\n", msg != NULL ? msg : "(not a string)");
    return 0;   /* Lua aborts */
}

/* A mapping for n bytes: a kept one that fits, else a new one. NULL when there is no memory. */
static void *big_get(embed_alloc *a, size_t n) {
    size_t need = big_map_size(n);
    int i, best = -1;
    big_block b;
    if (need < n) return NULL;   /* n near SIZE_MAX */
    pthread_mutex_lock(&a->mu);
    for (i = 0; i < a->nready; i++)
        if (big_fits(a->ready[i].size, need) && (best < 0 || a->ready[i].size < a->ready[best].size)) best = i;
    if (best >= 0) {
        b = big_take(a, best);
        pthread_mutex_unlock(&a->mu);
        return big_user(b);
    }
    pthread_mutex_unlock(&a->mu);
    b = big_map(need);
    return b.base == NULL ? NULL : big_user(b);
}

static void big_put(embed_alloc *a, void *p) {
    big_block b = big_of(p);
    int kept;
    pthread_mutex_lock(&a->mu);
    kept = big_keep(a, b);
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (!kept) munmap(b.base, b.size);
}

/* The lua_Alloc. Lua gives the old size of every block it frees or resizes. */
static void *embed_alloc_fn(void *ud, void *ptr, size_t osize, size_t nsize) {
    embed_alloc *a = (embed_alloc *)ud;
    int old_big = ptr != NULL && osize >= BIG_MIN;
    void *q;
    if (nsize == 0) {
        if (old_big) big_put(a, ptr);
        else free(ptr);
        return NULL;
    }
    if (!old_big && nsize < BIG_MIN) return realloc(ptr, nsize);
    if (old_big && nsize >= BIG_MIN && big_map_size(nsize) <= big_of(ptr).size) return ptr;
    q = nsize >= BIG_MIN ? big_get(a, nsize) : malloc(nsize);
    if (q == NULL) return NULL;   /* Lua keeps the old block */
    if (ptr != NULL) {
        memcpy(q, ptr, osize < nsize ? osize : nsize);
        if (old_big) big_put(a, ptr);
        else free(ptr);
    }
    return q;
}

/* core.expect_bytes(n) under mayura_newstate: maps and touches a block for a string of n bytes ahead. */
static int embed_expect(lua_State *L) {
    embed_alloc *a = (embed_alloc *)lua_touserdata(L, lua_upvalueindex(1));
    lua_Integer n = luaL_checkinteger(L, 1);
    if (n < (lua_Integer)BIG_MIN || n > (lua_Integer)(BIG_KEEP / 2)) return 0;
    pthread_mutex_lock(&a->mu);
    /* room for a string's header (24 bytes in 5.4 and LuaJIT) and its NUL */
    if (a->nwant < BIG_SLOTS) a->want[a->nwant++] = big_map_size((size_t)n + 64);
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

static void embed_alloc_free(embed_alloc *a) {
    int i;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    for (i = 0; i < a->nready; i++) munmap(a->ready[i].base, a->ready[i].size);
    for (i = 0; i < a->ndrop; i++) munmap(a->drop[i].base, a->drop[i].size);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

MAYURA_API lua_State *mayura_newstate(void) {
    embed_alloc *a = (embed_alloc *)calloc(1, sizeof *a);
    lua_State *L;
    if (a == NULL) return NULL;
    if (pthread_mutex_init(&a->mu, NULL) != 0) { free(a); return NULL; }
    if (pthread_cond_init(&a->cv, NULL) != 0) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    if (pthread_create(&a->thread, NULL, embed_alloc_thread, a) != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    L = lua_newstate(embed_alloc_fn, a);
    if (L == NULL) {
        embed_alloc_free(a);
        return NULL;
    }
    lua_atpanic(L, embed_panic);
    lua_pushlightuserdata(L, a);
    lua_pushcclosure(L, embed_expect, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, MC_EXPECT_KEY);
    return L;
}

/* }====================================================== */

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

MAYURA_API void mayura_close(lua_State *L) {
    uv_loop_t *loop;
    void *ud = NULL;
    embed_alloc *alloc = lua_getallocf(L, &ud) == embed_alloc_fn ? (embed_alloc *)ud : NULL;
    int i;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    loop = (uv_loop_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    /* luv's handles close while the state lives (not from within a run of the loop) */
    if (loop != NULL && mc_run_depth == 0) mc_close_luv_handles(L, loop);
    lua_close(L);
    if (alloc != NULL) embed_alloc_free(alloc);
    if (loop == NULL) return;
    /*
    ** What the state's finalizers closed finishes closing; then nothing is left. A loop that
    ** closed is done with: closing it again reads a loop libuv has already let go of.
    */
    for (i = 0; i < 100; i++) {
        if (uv_loop_close(loop) == 0) {
            free(loop);
            return;
        }
        uv_run(loop, UV_RUN_NOWAIT);
    }
    /* something outlives the state (a request the kernel has not answered): the loop is left, not freed under it */
}
