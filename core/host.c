/*
** host.c: the mayura host program.
**
**   mayura FILE.lua [ARGS...]   runs FILE as a task on the loop, `arg` set as lua5.4 sets it
**   mayura -e 'CODE' [ARGS...]  runs a chunk the same way
**   mayura --policy P.lua [--policy Q.lua ...] FILE.lua|-e CODE [ARGS...]
**                               first loads and checks the policy files (mayura.policy), which
**                               the script then has as require('mayura').policy(); a policy
**                               that does not pass its check prints the error and exits 1
**                               before the script runs
**   mayura serve ARGS...        the MCP server (mayura.mcp.cli)
**
** Lua 5.4 (or LuaJIT 2.1: build/luajit/mayura, from the same source) with
** luv and mayura.core linked in, sharing one libuv loop, and
** the module paths set to this checkout (or to the installed tree). The
** program exits when the script's task has ended and nothing it started is
** still pending; an uncaught error prints a traceback and exits 1.
*/
#include "mc.h"
#include <libgen.h>
#include <unistd.h>
#include <sys/stat.h>

#include "mayura_core.c"

static void usage(void) {
    fprintf(stderr, "usage: mayura [--policy FILE.lua ...] FILE.lua [ARGS...]\n"
                    "       mayura [--policy FILE.lua ...] -e 'CODE' [ARGS...]\n"
                    "       mayura serve --policy FILE.lua [--http [HOST:]PORT] (see mayura.mcp.cli)\n");
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/*
** Points package.path and package.cpath at this checkout when the program
** runs from build/ (or build/luajit/) of one, else at the installed tree.
** The cpath is the lib/ beside the program: the core of its own Lua.
*/
static void set_paths(lua_State *L) {
    char exe[PATH_MAX], dir[PATH_MAX], root[PATH_MAX], parent[PATH_MAX], probe[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *lpath = NULL, *cpath = NULL;
    char lbuf[4 * PATH_MAX + 256], cbuf[PATH_MAX + 64];
    int up;
    if (n > 0) {
        exe[n] = '\0';
        snprintf(dir, sizeof dir, "%s", dirname(exe));
        snprintf(root, sizeof root, "%s", dir);
        for (up = 0; up < 2 && lpath == NULL; up++) {
            snprintf(parent, sizeof parent, "%s", dirname(root));
            snprintf(root, sizeof root, "%s", parent);
            snprintf(probe, sizeof probe, "%s/lua/mayura/init.lua", root);
            if (file_exists(probe)) {
                snprintf(lbuf, sizeof lbuf, "%s/lua/?.lua;%s/lua/?/init.lua;%s/providers/?.lua;%s/tools/?.lua;",
                         root, root, root, root);
                snprintf(cbuf, sizeof cbuf, "%s/lib/?.so;", dir);
                lpath = lbuf;
                cpath = cbuf;
            }
        }
    }
    if (lpath == NULL) {
        snprintf(lbuf, sizeof lbuf, "%s/?.lua;%s/?/init.lua;", MAYURA_LUADIR, MAYURA_LUADIR);
        snprintf(cbuf, sizeof cbuf, "%s/?.so;", MAYURA_LIBDIR);
        lpath = lbuf;
        cpath = cbuf;
    }
    lua_getglobal(L, "package");
    lua_pushstring(L, lpath);
    lua_getfield(L, -2, "path");
    lua_concat(L, 2);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, cpath);
    lua_getfield(L, -2, "cpath");
    lua_concat(L, 2);
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
}

/* Sets the global `arg` as lua5.4 does: script at 0, its arguments from 1, the program before. */
static void set_arg(lua_State *L, char **argv, int argc, int script) {
    int i;
    lua_createtable(L, argc - script - 1, script + 1);
    for (i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

static int l_preload_luv(lua_State *L) {
    return luaopen_luv(L);
}

/*
** Long because it is the program's whole life in order: its arguments (`serve`, `--policy`,
** `-e`), the loop and the Lua state with luv and the core on it, the policies checked before
** anything runs, the script as a task, the loop run to its end, and the exit status.
*/
int main(int argc, char **argv) {
    uv_loop_t loop;
    lua_State *L;
    int script, status = 0, nargs, i, first = 1, npolicies = 0;
    const char *code = NULL, *file = NULL;

    /* --policy FILE, any number of times, before the script */
    while (first < argc && strcmp(argv[first], "--policy") == 0) {
        if (first + 1 >= argc) { usage(); return 2; }
        npolicies++;
        first += 2;
    }
    if (argc < first + 1) { usage(); return 2; }
    if (strcmp(argv[first], "-e") == 0) {
        if (argc < first + 2) { usage(); return 2; }
        code = argv[first + 1];
        script = first + 1;
    } else if (first == 1 && strcmp(argv[1], "serve") == 0) {
        /* the MCP server: mayura.mcp.cli.main(ARGS...) loads its own --policy files */
        code = "return require('mayura.mcp.cli').main(...)";
        script = 1;
    } else if (strcmp(argv[first], "-h") == 0 || strcmp(argv[first], "--help") == 0) {
        usage();
        return 0;
    } else {
        file = argv[first];
        script = first;
    }

    if (uv_loop_init(&loop) != 0) { fprintf(stderr, "mayura: cannot start the loop\n"); return 1; }
    L = luaL_newstate();
    if (L == NULL) { fprintf(stderr, "mayura: out of memory\n"); return 1; }
    luaL_openlibs(L);

    /* One loop: luv gets ours, and its callbacks never end the process on an error. */
    luv_set_loop(L, &loop);
    luv_set_callback(L, mc_luv_pcall);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, l_preload_luv);
    lua_setfield(L, -2, "luv");
    lua_pushcfunction(L, luaopen_mayura_core);
    lua_setfield(L, -2, "mayura.core");
    lua_pop(L, 2);
    lua_pushlightuserdata(L, &loop);
    lua_setfield(L, LUA_REGISTRYINDEX, MC_LOOP_KEY);

    set_paths(L);
    set_arg(L, argv, argc, script);

    /* require('mayura._task').main(chunk, ...) runs the chunk as a task to its end. */
    lua_pushcfunction(L, mc_traceback);
    lua_getglobal(L, "require");
    lua_pushstring(L, "mayura._task");
    if (lua_pcall(L, 1, 1, 1) != LUA_OK) {
        fprintf(stderr, "mayura: %s\n", lua_tostring(L, -1));
        status = 1;
        goto done;
    }
    lua_getfield(L, -1, "main");
    lua_remove(L, -2);
    if (npolicies > 0) {
        /* require('mayura.policy')._host_load({ files }): checked before the script is even read */
        lua_getglobal(L, "require");
        lua_pushstring(L, "mayura.policy");
        if (lua_pcall(L, 1, 1, 1) != LUA_OK) {
            fprintf(stderr, "mayura: %s\n", lua_tostring(L, -1));
            status = 1;
            goto done;
        }
        lua_getfield(L, -1, "_host_load");
        lua_remove(L, -2);
        lua_createtable(L, npolicies, 0);
        for (i = 0; i < npolicies; i++) {
            lua_pushstring(L, argv[2 + 2 * i]);
            lua_rawseti(L, -2, i + 1);
        }
        if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
            /* a coded error prints as CODE: message (its __tostring) */
            const char *msg = luaL_tolstring(L, -1, NULL);
            fprintf(stderr, "mayura: %s\n", msg ? msg : "(error object is not a string)");
            status = 1;
            goto done;
        }
    }
    if ((code != NULL ? luaL_loadbuffer(L, code, strlen(code), "=(command line)")
                      : luaL_loadfile(L, file)) != LUA_OK) {
        fprintf(stderr, "mayura: %s\n", lua_tostring(L, -1));
        status = 1;
        goto done;
    }
    nargs = 0;
    for (i = script + 1; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        nargs++;
    }
    /* main() raises the task's own traceback: no second one here */
    lua_remove(L, 1);
    if (lua_pcall(L, nargs + 1, 0, 0) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        fprintf(stderr, "mayura: %s\n", msg ? msg : "(error object is not a string)");
        status = 1;
        goto done;
    }
    /* The script's task has ended: let what it started finish. */
    mc_run_depth++;
    uv_run(&loop, UV_RUN_DEFAULT);
    mc_run_depth--;

done:
    fflush(stdout);
    if (status != 0) _exit(status);
    /* luv's handles the script left open close while the state lives: their callbacks use it */
    mc_close_luv_handles(L, &loop);
    lua_close(L);
    uv_run(&loop, UV_RUN_NOWAIT);
    if (uv_loop_close(&loop) != 0) uv_run(&loop, UV_RUN_DEFAULT);
    return status;
}
