/*
** mayura_core.c: the mayura.core Lua module.
**
** The mechanism under the mayura Lua layer: the libuv loop shared with luv,
** processes, files, HTTP through libcurl, JSON through cJSON, MessagePack through
** msgpack-c, protocol buffers through protobuf-c, base64, CRC-32 and
** incremental parsers for streamed HTTP answers (Connect, NDJSON, SSE).
** It has no opinion about limits, permissions or providers: it checks its
** arguments and returns results. Every piece is included here so that the
** module is one translation unit and only luaopen_mayura_core is exported.
*/
#include "mc.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <luv/luv.h>
#include <luv/lhandle.h>
#pragma GCC diagnostic pop

#include <sys/mman.h>

/* Nesting of mc_run_* calls, to refuse running the loop from inside itself. */
static int mc_run_depth = 0;
/*
** Frees put off to the next step, in a state of the host's own allocator (LÖVE's, Neovim's, a
** plain interpreter's): giving a block of many MiB back to the system costs the thread its
** unmapping (~1.5 ms for 16 MiB), and the collector may free several in one of its steps, in
** whatever frame it runs. When a host first steps with a budget, the state's allocator is wrapped
** by one that keeps the frees of blocks of DEFER_MIN bytes and more (at most DEFER_SLOTS of them,
** DEFER_MAX bytes in all) and makes them at the start of the next step, the first at once and the
** others within the first quarter of its budget (all at once in a step without a budget, or when
** the loop is run otherwise): a block's pages are given back a few MiB a step before it is freed,
** so that its free costs little whatever the allocator does then (glibc may give back a heap's
** whole top with it: tens of MiB at once). Blocks are freed by the allocator that made them, on the same
** thread; nothing else changes. When the state closes, the wrapper lets go (defer_gc).
*/
#define DEFER_MIN ((size_t)1 << 20)
#define DEFER_MAX ((size_t)256 << 20)
#define DEFER_SLOTS 64
#define DEFER_KEY "mayura.core.defer"

typedef struct mc_defer {
    lua_Alloc f;              /* the host's allocator */
    void *ud;
    struct { void *p; size_t n, zapped; } q[DEFER_SLOTS];   /* the frees put off, oldest first */
    int nq;
    size_t bytes;
    int closing;              /* the state is closing: frees happen at once */
} mc_defer;

/*
** Gives back up to DEFER_ZAP bytes more of the pages inside the block put off (MADV_DONTNEED),
** those of its first and last page excepted, where the allocator keeps what it needs of a freed
** block. Returns whether none are left: its free is then cheap, whatever the allocator does with
** it (unmaps it, or gives a heap's top back to the system with it).
*/
#define DEFER_ZAP ((size_t)4 << 20)
#define DEFER_PAGE ((size_t)4096)
static int defer_zap(mc_defer *d, int i) {
    uintptr_t lo = ((uintptr_t)d->q[i].p + 2 * DEFER_PAGE - 1) & ~(uintptr_t)(DEFER_PAGE - 1);
    uintptr_t hi = ((uintptr_t)d->q[i].p + d->q[i].n - DEFER_PAGE) & ~(uintptr_t)(DEFER_PAGE - 1);
    uintptr_t from = lo + d->q[i].zapped, to;
    if (hi <= from) return 1;
    to = hi - from > DEFER_ZAP ? from + DEFER_ZAP : hi;
    if (madvise((void *)from, to - from, MADV_DONTNEED) != 0) return 1;
    d->q[i].zapped += to - from;
    return to == hi;
}

/*
** Makes the frees put off: all at once when until is 0; else, oldest first, a block's pages given
** back a few MiB at a time and then its free, while this thread's CPU clock is before `until`
** (something is always done).
*/
static void defer_flush(mc_defer *d, uint64_t until) {
    int i = 0, k, first = 1;
    while (i < d->nq && (first || until == 0 || mc_cpu_ns() < until)) {
        first = 0;
        if (until != 0 && !defer_zap(d, i)) continue;
        (void)d->f(d->ud, d->q[i].p, d->q[i].n, 0);
        d->bytes -= d->q[i].n;
        i++;
    }
    for (k = 0; k + i < d->nq; k++) d->q[k] = d->q[k + i];
    d->nq -= i;
}

static void *defer_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    mc_defer *d = (mc_defer *)ud;
    void *q;
    if (ptr != NULL && nsize == 0 && osize >= DEFER_MIN && !d->closing && d->nq < DEFER_SLOTS
        && d->bytes + osize <= DEFER_MAX) {
        d->q[d->nq].p = ptr;
        d->q[d->nq].n = osize;
        d->q[d->nq].zapped = 0;
        d->nq++;
        d->bytes += osize;
        return NULL;
    }
    q = d->f(d->ud, ptr, osize, nsize);
    if (q == NULL && nsize > 0 && d->nq > 0) {
        /* no memory: what is put off goes back first, then once more */
        defer_flush(d, 0);
        q = d->f(d->ud, ptr, osize, nsize);
    }
    return q;
}

/* The state's defer wrapper, or NULL. */
static mc_defer *defer_of(lua_State *L) {
    void *ud;
    return lua_getallocf(L, &ud) == defer_alloc ? (mc_defer *)ud : NULL;
}

/* At the state's close (the registry's sentinel is finalized before the state's blocks are freed). */
static int defer_gc(lua_State *L) {
    mc_defer **box = (mc_defer **)lua_touserdata(L, 1);
    mc_defer *d = box != NULL ? *box : NULL;
    if (d == NULL) return 0;
    *box = NULL;
    defer_flush(d, 0);
    d->closing = 1;
    if (defer_of(L) == d) {
        lua_setallocf(L, d->f, d->ud);
        free(d);
    }
    /* else something wrapped the allocator over this one and may still call it: it stays, and frees at once */
    return 0;
}

/* defer_install's work, in protected mode: the sentinel (its box empty until d is made), then d. */
static int defer_install_p(lua_State *L) {
    mc_defer *d, **box = (mc_defer **)lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    lua_newtable(L);
    lua_pushcfunction(L, defer_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, DEFER_KEY);
    d = (mc_defer *)calloc(1, sizeof *d);
    if (d == NULL) return 0;   /* no memory: frees happen at once, as before */
    d->f = lua_getallocf(L, &d->ud);
    *box = d;
    lua_setallocf(L, defer_alloc, d);
    return 0;
}

/*
** Wraps the state's allocator, once (not mayura_newstate's, which keeps its own blocks). Called
** from mayura_step too, outside any protected call: what can raise runs in one.
*/
static void defer_install(lua_State *L) {
    int skip;
    if (defer_of(L) != NULL || !lua_checkstack(L, 4)) return;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_EXPECT_KEY);
    lua_getfield(L, LUA_REGISTRYINDEX, DEFER_KEY);
    /* mayura_newstate's; or let go of once already (the state is closing) */
    skip = lua_type(L, -2) == LUA_TFUNCTION || !lua_isnil(L, -1);
    lua_pop(L, 2);
    if (skip) return;
    lua_pushcfunction(L, defer_install_p);
    if (lua_pcall(L, 0, 0, 0) != LUA_OK) lua_pop(L, 1);
}

#include "b64.c"
#include "json.c"
#include "proc.c"
#include "fs.c"
#include "http.c"
#include "chan.c"
#include "crc.c"
#include "stream.c"
#include "sha.c"
#include "net.c"
#include "ws.c"
#include "msgpack.c"
#include "proto.c"

#define MAYURA_VERSION "0.1.0"


/* {======================================================
** The shared loop
** =======================================================*/

/*
** luv's event callbacks are called through this in place of luv's default,
** which ends the process on an error: here an error is reported and the
** loop goes on.
*/
static int mc_luv_pcall(lua_State *L, int nargs, int nresult, int flags) {
    int base = lua_gettop(L) - nargs;
    int rc;
    if ((flags & LUVF_CALLBACK_NOERRMSG) == 0) {
        rc = mc_pcall_report(L, nargs, nresult);
        if (rc != LUA_OK) return -rc;
    } else {
        lua_pushcfunction(L, mc_traceback);
        lua_insert(L, base);
        rc = lua_pcall(L, nargs, nresult, base);
        if (rc != LUA_OK) lua_pop(L, 1);
        lua_remove(L, base);
        if (rc != LUA_OK) return -rc;
    }
    return nresult == LUA_MULTRET ? lua_gettop(L) - base + 1 : nresult;
}

/*
** Who runs the loop (registry MC_DRIVER_KEY): MC_DRIVER_SELF (unset: a
** waiting call made from top-level code runs the loop until it is done),
** "step" (the host calls step() from its own loop: its frame, its poll on
** backend_fd()) or "host" (the loop is the host's and the host runs it, as
** Neovim runs vim.loop). Under a host no call runs the loop from top-level
** code: a waiting call must be made inside a task.
*/
#define MC_DRIVER_KEY "mayura.core.driver"
#define MC_DRIVER_SELF "mayura"

static const char *mc_driver(lua_State *L) {
    const char *who;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_DRIVER_KEY);
    who = lua_tostring(L, -1);   /* the registry holds the interned string */
    lua_pop(L, 1);
    return who != NULL ? who : MC_DRIVER_SELF;
}

static void mc_set_driver(lua_State *L, const char *who) {
    if (strcmp(who, MC_DRIVER_SELF) == 0) lua_pushnil(L); else lua_pushstring(L, who);
    lua_setfield(L, LUA_REGISTRYINDEX, MC_DRIVER_KEY);
}

/* Whether a loop run is under way (ours or luv's uv.run). */
static int mc_loop_busy(lua_State *L) {
    luv_ctx_t *ctx;
    if (mc_run_depth > 0) return 1;
    lua_getfield(L, LUA_REGISTRYINDEX, "luv_context");
    ctx = (luv_ctx_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    return ctx != NULL && ctx->mode != -1;
}

struct mc_luv_walk {
    lua_State *L;
    luv_ctx_t *ctx;
    int closed;     /* how many this walk closed */
};

/* Closes a luv handle (a timer a task still waits on, say) through luv's own close. */
static void mc_close_one_luv(uv_handle_t *h, void *arg) {
    struct mc_luv_walk *w = (struct mc_luv_walk *)arg;
    luv_handle_t *d = (luv_handle_t *)h->data;
    if (d == NULL || uv_is_closing(h) || d->ctx != w->ctx) return;
    lua_rawgeti(w->L, LUA_REGISTRYINDEX, d->ref);
    lua_getfield(w->L, -1, "close");
    lua_insert(w->L, -2);
    if (lua_pcall(w->L, 1, 0, 0) != LUA_OK) lua_pop(w->L, 1);
    w->closed++;
}

/*
** Closes every luv handle of `L` still open on `loop` while the state is alive (for a host that is
** about to lua_close it): luv's close callback uses the state, so it must run before lua_close.
** The core's handles are closed by their own finalizers in lua_close. The pass that finishes those
** closes also runs what is due (a reply that resumes a task, which may start a timer): walk again
** until a walk finds nothing of luv's open. Inline: only the programs that end a state use it.
*/
static inline void mc_close_luv_handles(lua_State *L, uv_loop_t *loop) {
    struct mc_luv_walk w;
    int i;
    w.L = L;
    lua_getfield(L, LUA_REGISTRYINDEX, "luv_context");
    w.ctx = (luv_ctx_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    for (i = 0; w.ctx != NULL && i < 100; i++) {
        w.closed = 0;
        uv_walk(loop, mc_close_one_luv, &w);
        mc_run_depth++;
        uv_run(loop, UV_RUN_NOWAIT);
        mc_run_depth--;
        if (w.closed == 0) break;
    }
}

/* Refuses to run the loop from top-level code when a host runs it. */
static void mc_check_self_driven(lua_State *L) {
    const char *who = mc_driver(L);
    if (strcmp(who, MC_DRIVER_SELF) != 0)
        mc_raise(L, "INVALID_INPUT", "the host runs the loop (driver '%s'): wait from inside a task (mayura.run)", who);
}

/* core.run_once(): runs the loop once, waiting for one event; returns whether anything is still pending. */
static int l_run_once(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    int alive;
    mc_check_self_driven(L);
    if (mc_loop_busy(L))
        return mc_raise(L, "INVALID_INPUT", "the loop is already running: wait from inside a task (mayura.run)");
    /*
    ** UV_RUN_ONCE runs the timers already due and then may block in poll
    ** although one of them ended the wait: when something is due now, run
    ** without blocking, and the caller looks at its condition again.
    */
    if (defer_of(L) != NULL) defer_flush(defer_of(L), 0);
    uv_update_time(loop);
    mc_run_depth++;
    chan_resume_reads();
    alive = uv_run(loop, uv_backend_timeout(loop) == 0 ? UV_RUN_NOWAIT : UV_RUN_ONCE);
    /*
    ** UV_RUN_ONCE runs the timers that fell due during poll after the
    ** pass's closes: a handle one of them closed (a one-shot timer closes
    ** itself) stays half-closed until the next run. A plain interpreter's
    ** script that ends here would leave it to luv's finalizer at lua_close,
    ** which crashes on it; a pass without waiting finishes those closes.
    */
    if (loop->closing_handles != NULL) alive = uv_run(loop, UV_RUN_NOWAIT);
    mc_run_depth--;
    lua_pushboolean(L, alive != 0);
    return 1;
}

/* core.run(): runs the loop until nothing is pending. */
static int l_run(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    mc_check_self_driven(L);
    if (mc_loop_busy(L))
        return mc_raise(L, "INVALID_INPUT", "the loop is already running");
    if (defer_of(L) != NULL) defer_flush(defer_of(L), 0);
    mc_run_depth++;
    chan_resume_reads();
    uv_run(loop, UV_RUN_DEFAULT);
    mc_run_depth--;
    return 0;
}

/* core.loop_running(): whether the loop is being run now, or by a host (a waiting call must then yield). */
static int l_loop_running(lua_State *L) {
    lua_pushboolean(L, mc_loop_busy(L) || strcmp(mc_driver(L), MC_DRIVER_SELF) != 0);
    return 1;
}

/*
** Runs what is due on the loop without waiting: one pass of UV_RUN_NOWAIT, then more passes while
** work is still due at once and the budget (µs of this thread's CPU time, 0 for one pass) is not
** spent (core.end_step spends it at once). Work is started only within the first three quarters
** of the budget: the last quarter is room for what a pass cannot cut (a channel's read, a task's
** run up to its next wait), so that the step as a whole stays within it. Returns whether anything
** is still pending, or -1 when the loop is already being run (the caller says so).
*/
static int mc_step(lua_State *L, long budget_us) {
    uv_loop_t *loop = mc_loop(L);
    uint64_t start, limit;
    mc_defer *d;
    int alive;
    if (mc_loop_busy(L)) return -1;
    limit = budget_us > 0 ? (uint64_t)budget_us * 1000u : 0;
    limit -= limit / 4;
    start = limit > 0 ? mc_cpu_ns() : 0;
    if (limit > 0) defer_install(L);
    d = defer_of(L);
    if (d != NULL && d->nq > 0) defer_flush(d, limit > 0 ? start + limit / 4 : 0);
    mc_step_deadline = limit > 0 ? start + limit : 0;
    mc_step_start = start;
    mc_step_count++;
    mc_run_depth++;
    chan_resume_reads();
    do {
        alive = uv_run(loop, UV_RUN_NOWAIT);
    } while (alive && limit > 0 && uv_backend_timeout(loop) == 0 && mc_cpu_ns() < mc_step_deadline);
    mc_run_depth--;
    mc_step_deadline = 0;
    return alive != 0;
}

/*
** core.over_budget([share]): whether a step with a budget (core.step, mayura_step) is running and
** its time is spent (with share, a number in (0, 1]: that part of it; the time is this thread's
** CPU time, of the part of the budget in which work starts, see mc_step), the number of that step
** (one step from the next), and whether a step with a budget is running. Work that can wait for
** the next step (a task's resumption, mayura._task) asks this before running, so completions
** that arrive together are spread over frames.
*/
static int l_over_budget(lua_State *L) {
    lua_Number share = luaL_optnumber(L, 1, 1);
    uint64_t at = mc_step_deadline;
    if (!(share > 0 && share <= 1)) return mc_raise(L, "INVALID_INPUT", "over_budget's share must be in (0, 1]");
    if (at != 0 && share < 1) at = mc_step_start + (uint64_t)((lua_Number)(mc_step_deadline - mc_step_start) * share);
    lua_pushboolean(L, at != 0 && mc_cpu_ns() >= at);
    lua_pushinteger(L, mc_step_count);
    lua_pushboolean(L, at != 0);
    return 3;
}

/*
** core.end_step(): when a step with a budget is running, counts its budget as spent: the step
** ends after the loop's current pass, and what waits to be resumed goes to the next steps. Work
** that took a large share of a frame at once (making a string of many MiB) calls it, so nothing
** else piles onto that frame. Elsewhere it does nothing.
*/
static int l_end_step(lua_State *L) {
    (void)L;
    if (mc_step_deadline != 0) mc_step_deadline = mc_cpu_ns();
    return 0;
}

/*
** core.expect_bytes(n): says that a string of about n bytes is about to be made (the parts of a
** file being read are coming in). A state whose allocator can prepare for it (include/mayura.h,
** mayura_newstate) maps and touches the memory ahead on a thread of its own, so the frame that
** makes the string does not take its page faults; elsewhere this does nothing.
*/
static int l_expect_bytes(lua_State *L) {
    lua_Integer n = lua_isinteger(L, 1) ? lua_tointeger(L, 1) : -1;
    if (n < 0 || n > (lua_Integer)1 << 40) return mc_raise(L, "INVALID_INPUT", "expect_bytes expects a byte count");
    lua_getfield(L, LUA_REGISTRYINDEX, MC_EXPECT_KEY);
    if (lua_type(L, -1) != LUA_TFUNCTION) return 0;
    lua_pushinteger(L, n);
    lua_call(L, 1, 0);
    return 0;
}

/*
** core.prepare_bytes(n) -> block | nil: readies the memory of a string of about n bytes that is
** about to be made (a file read in parts) in a state of the host's own allocator (LÖVE's,
** Neovim's, a plain interpreter's luaL_newstate), whose large blocks come fresh from the system
** and cost their page faults in the frame that first writes them (~6 ms for 16 MiB). The block is
** taken from the state's own allocator at once, untouched; block:touch(bytes) writes the next
** `bytes` of it (a share of the faults in each frame that brings a part), and
** block:make(fn, ...) returns fn(...), with the block handed to the first allocation of n + 1 to n +
** PREP_SLACK bytes that fn makes (the string, sized exactly by the same allocator: afterwards it
** is the allocator's block like any other). A block that was not handed out is given back by
** block:free() (or when collected). nil under mayura_newstate (core.expect_bytes readies the
** memory there, off the host's thread) and for n under 1 MiB.
*/
#define PREP_MT "mayura.core.prepared"
#define PREP_SLACK ((size_t)64)   /* a string's header and its NUL, in 5.4 and LuaJIT */
#define PREP_PAGE ((size_t)4096)

typedef struct mc_prep {
    lua_Alloc f;          /* the allocator the block came from (the host's, under defer_alloc) */
    void *ud;
    lua_Alloc pf;         /* while make runs: the state's allocator, to which the rest passes */
    void *pud;
    char *p;              /* NULL once handed out or given back */
    size_t want, size;    /* the string's length; the block's size (want + PREP_SLACK) */
    size_t touched;       /* how much of it was written */
} mc_prep;

/* The state's allocator while block:make runs fn: the block goes to the string, the rest passes. */
static void *prep_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    mc_prep *b = (mc_prep *)ud;
    /* a string of `want` bytes is more than that (its header, its NUL): a buffer of just that many is not it */
    if (ptr == NULL && b->p != NULL && nsize > b->want && nsize <= b->size) {
        /* to its exact size, in place: later the allocator frees it with the size Lua says */
        void *q = b->f(b->ud, b->p, b->size, nsize);
        if (q != NULL) {
            b->p = NULL;
            return q;
        }
    }
    return b->pf(b->pud, ptr, osize, nsize);
}

/* The allocator a state's blocks come from: the host's under defer_alloc. */
static lua_Alloc prep_owner(lua_State *L, void **ud) {
    mc_defer *d = defer_of(L);
    if (d != NULL) {
        *ud = d->ud;
        return d->f;
    }
    return lua_getallocf(L, ud);
}

static const mc_class prep_class;   /* below its methods */

static mc_prep *prep_check(lua_State *L) {
    return (mc_prep *)luaL_checkudata(L, 1, PREP_MT);
}

static int l_prep_free(lua_State *L) {
    mc_prep *b = prep_check(L);
    if (b->p != NULL) (void)b->f(b->ud, b->p, b->size, 0);
    b->p = NULL;
    return 0;
}

/* block:touch(bytes): writes the next `bytes` of the block, a byte a page. */
static int l_prep_touch(lua_State *L) {
    mc_prep *b = prep_check(L);
    lua_Integer n = luaL_checkinteger(L, 2);
    size_t end;
    if (b->p == NULL || n <= 0) return 0;
    end = (size_t)n >= b->size - b->touched ? b->size : b->touched + (size_t)n;
    for (; b->touched < end; b->touched += PREP_PAGE) ((volatile char *)b->p)[b->touched] = 0;
    if (b->touched > b->size) b->touched = b->size;
    return 0;
}

/* block:make(fn, ...) -> fn(...), the block handed to the string fn makes. */
static int l_prep_make(lua_State *L) {
    mc_prep *b = prep_check(L);
    void *ud, *oud;
    lua_Alloc f = lua_getallocf(L, &ud), owner = prep_owner(L, &oud);
    int use, rc;
    luaL_checktype(L, 2, LUA_TFUNCTION);
    use = b->p != NULL && owner == b->f && oud == b->ud;
    b->pf = f;
    b->pud = ud;
    if (use) lua_setallocf(L, prep_alloc, b);
    rc = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
    if (use) lua_setallocf(L, f, ud);
    if (rc != LUA_OK) return lua_error(L);
    return lua_gettop(L) - 1;
}

static int l_prepare_bytes(lua_State *L) {
    lua_Integer n = lua_isinteger(L, 1) ? lua_tointeger(L, 1) : -1;
    mc_prep *b;
    void *ud;
    lua_Alloc f;
    if (n < 0 || n > (lua_Integer)1 << 40) return mc_raise(L, "INVALID_INPUT", "prepare_bytes expects a byte count");
    lua_getfield(L, LUA_REGISTRYINDEX, MC_EXPECT_KEY);
    if (lua_type(L, -1) == LUA_TFUNCTION || n < (lua_Integer)1 << 20) return 0;
    lua_pop(L, 1);
    b = (mc_prep *)mc_handle_new(L, &prep_class);
    f = prep_owner(L, &ud);
    b->f = f;
    b->ud = ud;
    b->want = (size_t)n;
    b->size = (size_t)n + PREP_SLACK;
    b->p = (char *)f(ud, NULL, 0, b->size);
    if (b->p == NULL) return 0;   /* no memory now: the string is made without it */
    return 1;
}

static const luaL_Reg prep_methods[] = {
    {"touch", l_prep_touch}, {"make", l_prep_make}, {"free", l_prep_free}, {NULL, NULL}
};

/* The block is a handle of the recipe: free (also __gc and __close) gives its memory back once. */
static const mc_class prep_class = { PREP_MT, sizeof(mc_prep), l_prep_free, NULL, prep_methods, NULL };

static void mc_open_prep(lua_State *L) {
    mc_class_register(L, &prep_class);
}

/*
** core.step([budget_ms]): for a host that drives the loop from its own (a game's frame, an
** editor's poll of backend_fd()): runs the work that is due and returns at once, never waiting;
** with a budget, goes on while more is due at once, up to that many milliseconds of this thread's
** CPU time (see mc_step). Makes the host
** the loop's driver ('step'). Returns whether anything is still pending.
*/
static int l_step(lua_State *L) {
    lua_Number budget = luaL_optnumber(L, 1, 0);
    const char *who = mc_driver(L);
    int alive;
    if (!(budget >= 0 && budget <= 60000))
        return mc_raise(L, "INVALID_INPUT", "step: budget_ms must be a number from 0 to 60000");
    if (strcmp(who, "host") == 0)
        return mc_raise(L, "INVALID_INPUT", "step: the host runs this loop itself");
    if (strcmp(who, "step") != 0) mc_set_driver(L, "step");
    alive = mc_step(L, (long)(budget * 1000));
    if (alive < 0) return mc_raise(L, "INVALID_INPUT", "step: the loop is already running (step from the host's loop, not from a callback)");
    lua_pushboolean(L, alive);
    return 1;
}

/* core.backend_fd(): the loop's file descriptor, readable when the loop has work: a host polls it, then calls step(). */
static int l_backend_fd(lua_State *L) {
    lua_pushinteger(L, uv_backend_fd(mc_loop(L)));
    return 1;
}

/* core.backend_timeout(): milliseconds until the loop's next timer is due (0: work is due now; -1: no timer). */
static int l_backend_timeout(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    uv_update_time(loop);
    lua_pushinteger(L, uv_backend_timeout(loop));
    return 1;
}

/*
** core.set_driver(who): who runs the loop: 'mayura' (the default: a top-level waiting call runs
** it), 'step' (the host calls step()) or 'host' (the host runs the loop itself). Returns the
** previous one. core.driver() tells the current one.
*/
static int l_set_driver(lua_State *L) {
    static const char *const whos[] = {MC_DRIVER_SELF, "step", "host"};
    const char *who = lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : "";
    size_t i;
    for (i = 0; i < sizeof whos / sizeof whos[0]; i++) {
        if (strcmp(who, whos[i]) == 0) {
            lua_pushstring(L, mc_driver(L));
            mc_set_driver(L, whos[i]);
            return 1;
        }
    }
    return mc_raise(L, "INVALID_INPUT", "set_driver: expected 'mayura', 'step' or 'host'");
}

static int l_driver(lua_State *L) {
    lua_pushstring(L, mc_driver(L));
    return 1;
}

/* core.alive(): whether the loop has active handles or requests. */
static int l_alive(lua_State *L) {
    lua_pushboolean(L, uv_loop_alive(mc_loop(L)) != 0);
    return 1;
}

/* core.hrtime_ms(): a monotonic clock in milliseconds (fractional). */
static int l_hrtime_ms(lua_State *L) {
    lua_pushnumber(L, mc_ms(uv_hrtime()));
    return 1;
}

/* core.cpu_ms(): this thread's CPU time in milliseconds (fractional): what a step's budget counts. */
static int l_cpu_ms(lua_State *L) {
    lua_pushnumber(L, mc_ms(mc_cpu_ns()));
    return 1;
}

/* core.now_ms(): wall-clock time in milliseconds since the epoch. */
static int l_now_ms(lua_State *L) {
    uv_timeval64_t tv;
    if (uv_gettimeofday(&tv) != 0) return mc_raise(L, "SANDBOX_ERROR", "no clock");
    lua_pushinteger(L, (lua_Integer)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    return 1;
}

/* Error metatable: __tostring gives "CODE: message". */
static int l_error_tostring(lua_State *L) {
    const char *code, *msg;
    lua_getfield(L, 1, "code");
    lua_getfield(L, 1, "message");
    code = lua_tostring(L, -2);
    msg = lua_tostring(L, -1);
    lua_pushfstring(L, "%s: %s", code ? code : "ERROR", msg ? msg : "");
    return 1;
}

/*
** Finds the loop: one a host program put in the registry before loading the
** core, or luv's (required here), so the core and luv always share one loop.
*/
static void mc_setup_loop(lua_State *L) {
    luv_ctx_t *ctx;
    lua_getfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    if (lua_touserdata(L, -1) != NULL) { lua_pop(L, 1); return; }
    lua_pop(L, 1);
    lua_getglobal(L, "require");
    lua_pushstring(L, "luv");
    lua_call(L, 1, 1);
    /*
    ** luv's loop is owned by its module: when the module is dropped and
    ** collected (a test runner that unloads modules between files does
    ** this) its finalizer closes every handle on the loop, ours included.
    ** The registry keeps the first module alive for as long as the state.
    */
    lua_setfield(L, LUA_REGISTRYINDEX, "mayura.core.luv");
    lua_getfield(L, LUA_REGISTRYINDEX, "luv_context");
    ctx = (luv_ctx_t *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (ctx == NULL || ctx->loop == NULL) luaL_error(L, "mayura.core: luv has no loop");
    if (ctx->cb_pcall == luv_cfpcall) ctx->cb_pcall = mc_luv_pcall;
    lua_pushlightuserdata(L, ctx->loop);
    lua_setfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);
    /* Neovim: luv is its vim.loop, which the editor runs; a wait must never run it from a callback. */
    lua_getglobal(L, "vim");
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "loop");
        lua_getfield(L, LUA_REGISTRYINDEX, "mayura.core.luv");
        if (lua_rawequal(L, -1, -2)) mc_set_driver(L, "host");
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
}

/* }====================================================== */

/* core.set_reporter(fn | nil): where errors of loop callbacks go (stderr when nil); returns the previous one. */
static int l_set_reporter(lua_State *L) {
    if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, MC_REPORT_KEY);
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, MC_REPORT_KEY);
    return 1;
}

/* core.report(message): reports an error the way loop callbacks' errors are. */
static int l_report(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_settop(L, 1);
    mc_report(L);
    return 0;
}

/*
** core.report_once(message): reports `message` unless this Lua state reported the same text
** before; returns whether it did. The texts said are kept in the registry, so a test runner
** that unloads modules between files still hears a warning about this machine once.
*/
static int l_report_once(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "mayura.core.reported");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "mayura.core.reported");
    }
    lua_pushvalue(L, 1);
    lua_rawget(L, 2);
    if (!lua_isnil(L, -1)) {
        lua_pushboolean(L, 0);
        return 1;
    }
    lua_pop(L, 1);
    lua_pushvalue(L, 1);
    lua_pushboolean(L, 1);
    lua_rawset(L, 2);
    lua_settop(L, 1);
    mc_report(L);
    lua_pushboolean(L, 1);
    return 1;
}

/*
** core._handle(name) -> a new, empty handle of the registered class `name` (its resource never
** made): what a raise right after mc_handle_new leaves to __gc. For the specs of the handle recipe.
*/
static int l_handle(lua_State *L) {
    const mc_class *c;
    const char *name;
    if (lua_type(L, 1) != LUA_TSTRING) return mc_raise(L, "INVALID_INPUT", "_handle expects a class name");
    name = lua_tostring(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, MC_CLASSES_KEY);
    if (!lua_istable(L, -1)) return mc_raise(L, "INVALID_INPUT", "no class is registered");
    lua_getfield(L, -1, name);
    c = (const mc_class *)lua_touserdata(L, -1);
    if (c == NULL) return mc_raise(L, "INVALID_INPUT", "no class is named '%s'", name);
    lua_pop(L, 2);
    mc_handle_new(L, c);
    return 1;
}

static const luaL_Reg core_funcs[] = {
    {"_handle", l_handle},
    {"set_reporter", l_set_reporter},
    {"report", l_report},
    {"report_once", l_report_once},
    {"run_once", l_run_once},
    {"run", l_run},
    {"loop_running", l_loop_running},
    {"step", l_step},
    {"over_budget", l_over_budget},
    {"expect_bytes", l_expect_bytes},
    {"prepare_bytes", l_prepare_bytes},
    {"end_step", l_end_step},
    {"backend_fd", l_backend_fd},
    {"backend_timeout", l_backend_timeout},
    {"set_driver", l_set_driver},
    {"driver", l_driver},
    {"alive", l_alive},
    {"hrtime_ms", l_hrtime_ms},
    {"cpu_ms", l_cpu_ms},
    {"now_ms", l_now_ms},
    {NULL, NULL}
};

__attribute__((visibility("default"))) int luaopen_mayura_core(lua_State *L);

int luaopen_mayura_core(lua_State *L) {
#ifdef MAYURA_SANITIZED
    /* The sanitizer build runs in an interpreter the sanitizer runtime was preloaded into
    ** (make asan); the programs it starts must not inherit that preload, which can hang them. */
    unsetenv("LD_PRELOAD");
#endif
#ifdef MC_NO_RIDX_MAINTHREAD
    mc_main(L);
#endif
    if (luaL_newmetatable(L, MC_ERROR_MT)) {
        lua_pushcfunction(L, l_error_tostring);
        lua_setfield(L, -2, "__tostring");
    }
    lua_pop(L, 1);
    mc_setup_loop(L);

    luaL_newlib(L, core_funcs);
    luaL_getmetatable(L, MC_ERROR_MT);
    lua_setfield(L, -2, "error_mt");
    lua_pushstring(L, MAYURA_VERSION);
    lua_setfield(L, -2, "version");
    mc_open_b64(L);
    mc_open_json(L);
    mc_open_proc(L);
    mc_open_fs(L);
    mc_open_http(L);
    mc_open_chan(L);
    mc_open_stream(L);
    mc_open_crc(L);
    mc_open_sha(L);
    mc_open_net(L);
    mc_open_ws(L);
    mc_open_msgpack(L);
    mc_open_proto(L);
    mc_open_prep(L);
    return 1;
}
