/*
** mayura.h: mayura embedded in a C program that has a loop of its own (a game, an editor).
**
** Link with build/lib/libmayura.a (build/luajit/lib/libmayura.a for LuaJIT), the Lua the
** library was built for, luv, libuv, libcurl and cJSON (see the Makefile's embed target).
**
**     lua_State *L = mayura_newstate();   // or the host's own state (luaL_newstate, ...)
**     luaL_openlibs(L);
**     if (mayura_open(L, "/path/to/mayura") != 0) { ... lua_tostring(L, -1) ... }
**     ... luaL_dostring(L, "TASK = require('mayura').run(function() ... end)") ...
**     for (;;) {                        // the host's frame
**         mayura_step(L, 2000);         // at most ~2 ms of mayura's due work, never waits
**         draw();
**     }
**     mayura_close(L);
**
** mayura_open gives mayura a libuv loop of its own and makes the host its driver: from then on
** `require('mayura').run(fn)` returns the task at once, every waiting call happens inside a
** task and a waiting call made at top level raises INVALID_INPUT instead of blocking the host.
** The host runs the loop's due work by calling mayura_step (each frame, or when
** mayura_backend_fd() is readable / mayura_backend_timeout() has passed). All calls from the
** thread that opened the state.
*/
#ifndef MAYURA_H
#define MAYURA_H

#include <lua.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
** A new Lua state whose allocator keeps a host's frames short when large strings come and go
** (a 16 MiB file read back from a sandbox): blocks of 1 MiB and more are mappings of their own,
** a freed one is kept for the next that fits (up to 128 MiB kept, the oldest let go first) and
** unmapped off the host's thread, and when mayura knows a large string is coming it has a thread
** map and touch the memory ahead, so the frame that makes the string pays for its copy and not
** for its page faults. Smaller blocks are malloc's. Its standard libraries are not open yet. NULL
** when there is no memory. Close it with mayura_close, which also ends the allocator's thread.
*/
lua_State *mayura_newstate(void);

/*
** Opens mayura into L (whose standard libraries are open): a libuv loop of its own, luv and
** mayura.core preloaded, package.path set to the Lua of the checkout at `root` (NULL: the
** installed tree). Returns 0, or -1 with an error message pushed on L.
*/
int mayura_open(lua_State *L, const char *root);

/*
** Runs the loop's due work without waiting: one pass, then more while work is due at once
** and `budget_us` microseconds are not spent (0: one pass). The budget counts this thread's CPU
** time (CLOCK_THREAD_CPUTIME_ID), not the wall clock: what the frame pays, whatever else the
** machine runs. Work starts only within its first three quarters, the rest being room for what
** cannot be cut (a task's run up to its next wait). Once that is spent, tasks whose waits end are
** resumed at the next steps (at least one a step), and the sandboxes' channels handle no more
** replies until the next step, so completions that arrive together are spread over frames.
** Returns 1 when anything is still pending, 0 when nothing is, -1 when called from inside the
** loop (from a callback).
*/
int mayura_step(lua_State *L, long budget_us);

/* The loop's file descriptor: readable when the loop has work for mayura_step. */
int mayura_backend_fd(lua_State *L);

/* Milliseconds until the loop's next timer is due: 0 when work is due now, -1 with no timer. */
int mayura_backend_timeout(lua_State *L);

/* Closes L (ending what mayura started in it) and then mayura's loop. */
void mayura_close(lua_State *L);

#ifdef __cplusplus
}
#endif

#endif
