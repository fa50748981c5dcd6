/*
** game.c: a C host at 60 frames a second that runs a mayura agent while it draws, through the
** embedding API of include/mayura.h.
**
**   build/embed/game [--frames N] [--draw-us US] [--budget-us US] [--own-state] [ROOT] SCRIPT.lua [ARGS...]
**
** ROOT is the mayura checkout (default: the current directory). SCRIPT.lua is run as a task on
** mayura's loop (`mayura.run(chunk, ARGS...)`), which returns at once: every frame the host calls
** mayura_step() with a budget of --budget-us (4000 by default), then "draws" (busy work of
** --draw-us microseconds, 3000 by default, standing in for a renderer) and sleeps to the next
** frame's deadline. The global GAME_FRAME holds the number of the frame being drawn. The state is
** mayura_newstate()'s, or with --own-state one the host made itself (luaL_newstate: the C
** library's allocator, or LuaJIT's own, as in LÖVE or Neovim). It stops when the script's task has
** ended (or after --frames frames) and prints one line of frame statistics:
**
**   frames N  step_us mean M p99 P max X  step_cpu_us p99 C max Y at W  frame_ms max F  late L  over_4ms O
**
** (step_us: the wall time mayura_step took in each frame; step_cpu_us: the CPU time this thread
** spent in it, which leaves out the time other programs had the CPU on a busy machine, W the frame
** where it was largest; frame_ms: from one frame's start to the
** next; late: frames that started more than a frame period after the one before; over_4ms: frames
** whose step took more than 4 ms of this thread's CPU). The exit
** status is 0 when the task succeeded and returned something other than false.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "mayura.h"

#define FRAME_NS 16666667LL

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Stands in for drawing: `us` microseconds of the CPU's time. */
static void draw(long us) {
    long long end = now_ns() + (long long)us * 1000;
    volatile unsigned x = 1;
    while (now_ns() < end) x = x * 1664525u + 1013904223u;
}

static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static int traceback(lua_State *L) {
    luaL_traceback(L, L, lua_tostring(L, 1), 1);
    return 1;
}

/* The task's field `name` (done, ok), as a boolean. */
static int task_flag(lua_State *L, int ref, const char *name) {
    int v;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    lua_getfield(L, -1, name);
    v = lua_toboolean(L, -1);
    lua_pop(L, 2);
    return v;
}

int main(int argc, char **argv) {
    long frames_max = -1, draw_us = 3000, budget_us = 4000;
    int own_state = 0;
    const char *root = ".", *script;
    int i = 1, nargs = 0, ref, status = 1;
    long long *step_ns, *cpu_step_ns, max_frame = 0, late = 0, start, prev = 0, sum = 0;
    long frames = 0, cap = 1 << 16;
    lua_State *L;

    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (strcmp(argv[i], "--own-state") == 0) { own_state = 1; i--; continue; }
        if (i + 1 >= argc) break;
        if (strcmp(argv[i], "--frames") == 0) frames_max = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--draw-us") == 0) draw_us = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--budget-us") == 0) budget_us = atol(argv[i + 1]);
        else { fprintf(stderr, "game: unknown option %s\n", argv[i]); return 2; }
    }
    if (argc - i >= 2 && strstr(argv[i + 1], ".lua") != NULL && strstr(argv[i], ".lua") == NULL) root = argv[i++];
    if (i >= argc) {
        fprintf(stderr, "usage: game [--frames N] [--draw-us US] [--budget-us US] [ROOT] SCRIPT.lua [ARGS...]\n");
        return 2;
    }
    script = argv[i++];
    step_ns = malloc(sizeof *step_ns * (size_t)cap);
    cpu_step_ns = malloc(sizeof *cpu_step_ns * (size_t)cap);
    L = own_state ? luaL_newstate() : mayura_newstate();
    if (step_ns == NULL || cpu_step_ns == NULL || L == NULL) { fprintf(stderr, "game: out of memory\n"); return 1; }
    luaL_openlibs(L);
    if (mayura_open(L, root) != 0) {
        fprintf(stderr, "game: %s\n", lua_tostring(L, -1));
        return 1;
    }

    /* TASK = require('mayura').run(chunk, ARGS...): returns at once, the host drives the loop */
    lua_pushcfunction(L, traceback);
    lua_getglobal(L, "require");
    lua_pushstring(L, "mayura");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "run");
    lua_remove(L, -2);
    if (luaL_loadfile(L, script) != LUA_OK) {
        fprintf(stderr, "game: %s\n", lua_tostring(L, -1));
        return 1;
    }
    for (; i < argc; i++, nargs++) lua_pushstring(L, argv[i]);
    if (lua_pcall(L, nargs + 1, 1, 1) != LUA_OK) {
        fprintf(stderr, "game: %s\n", lua_tostring(L, -1));
        return 1;
    }
    ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);

    start = now_ns();
    while (!task_flag(L, ref, "done") && (frames_max < 0 || frames < frames_max)) {
        long long frame_start = now_ns(), t0, t1, c0, c1, next;
        if (prev != 0) {
            if (frame_start - prev > max_frame) max_frame = frame_start - prev;
            if (frame_start - prev > FRAME_NS + FRAME_NS / 2) late++;
        }
        prev = frame_start;
        lua_pushinteger(L, frames + 1);
        lua_setglobal(L, "GAME_FRAME");
        c0 = cpu_ns();
        t0 = now_ns();
        if (mayura_step(L, budget_us) < 0) { fprintf(stderr, "game: step refused\n"); break; }
        t1 = now_ns();
        c1 = cpu_ns();
        if (frames == cap) {
            long long *more = realloc(step_ns, sizeof *step_ns * (size_t)cap * 2), *more_cpu;
            if (more == NULL) { fprintf(stderr, "game: out of memory\n"); break; }
            step_ns = more;
            more_cpu = realloc(cpu_step_ns, sizeof *cpu_step_ns * (size_t)cap * 2);
            if (more_cpu == NULL) { fprintf(stderr, "game: out of memory\n"); break; }
            cpu_step_ns = more_cpu;
            cap *= 2;
        }
        cpu_step_ns[frames] = c1 - c0;
        step_ns[frames++] = t1 - t0;
        sum += t1 - t0;
        draw(draw_us);
        next = start + frames * FRAME_NS;
        if (next > now_ns()) {
            struct timespec ts = { (time_t)(next / 1000000000LL), (long)(next % 1000000000LL) };
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        } else {
            start = now_ns() - frames * FRAME_NS;   /* a late frame moves the schedule, no catch-up burst */
        }
    }

    if (task_flag(L, ref, "done")) {
        /* the task's result: ok and not false */
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
        lua_getfield(L, -1, "ok");
        if (lua_toboolean(L, -1)) {
            lua_getfield(L, -2, "results");
            lua_rawgeti(L, -1, 1);
            status = (lua_isboolean(L, -1) && !lua_toboolean(L, -1)) ? 1 : 0;
            lua_pop(L, 2);
        } else {
            lua_getfield(L, -2, "traceback");
            fprintf(stderr, "game: the task failed: %s\n", lua_tostring(L, -1));
            lua_pop(L, 1);
        }
        lua_pop(L, 2);
    } else if (frames_max >= 0) {
        status = 0;
    }
    if (frames > 0) {
        long long p99, max, cpu_p99, cpu_max, over = 0;
        long k, worst = 0;
        for (k = 0; k < frames; k++) {
            over += cpu_step_ns[k] > 4000000LL;
            if (cpu_step_ns[k] > cpu_step_ns[worst]) worst = k;
        }
        qsort(step_ns, (size_t)frames, sizeof *step_ns, cmp_ll);
        qsort(cpu_step_ns, (size_t)frames, sizeof *cpu_step_ns, cmp_ll);
        p99 = step_ns[(frames * 99) / 100];
        max = step_ns[frames - 1];
        cpu_p99 = cpu_step_ns[(frames * 99) / 100];
        cpu_max = cpu_step_ns[frames - 1];
        printf("frames %ld  step_us mean %.1f p99 %.1f max %.1f  step_cpu_us p99 %.1f max %.1f at %ld  frame_ms max %.2f"
               "  late %lld  over_4ms %lld\n", frames, (double)sum / frames / 1e3, p99 / 1e3, max / 1e3, cpu_p99 / 1e3,
               cpu_max / 1e3, worst + 1, max_frame / 1e6, late, over);
    }
    fflush(stdout);
    free(step_ns);
    free(cpu_step_ns);
    mayura_close(L);
    return status;
}
