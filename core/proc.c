/*
** proc.c: processes for mayura.core.
**
** core.spawn(opts, cb) runs an argv (never a shell) on the shared loop with
** a cwd, an environment, standard input, a timeout and a cancel. stdout and
** stderr are each kept up to a byte cap (the rest is read and dropped, so
** host memory stays bounded whatever the command prints).
**
** Every command runs as the leader of a new session and process group, and
** carries a tag in its environment (MAYURA_TREE). When it ends normally,
** what it started keeps running (a server started with setsid, say); the
** result waits at most drain_ms for such a process to let go of the output
** pipes. At a timeout or a cancel, every process of its group and every
** process carrying its tag is killed, in passes until none is left, so a
** double fork or a setsid does not escape.
**
** With `outlive = true` the command carries no tag and is not stopped when
** the state closes (a keeper that must clean up after the host, such as a
** local sandbox's launcher); a timeout or a cancel still kills its group.
**
** Commands start through posix_spawn, which the C library does with a
** vfork-style clone: the host's memory is shared, not copied, so starting a
** command costs the same in a host of 10 MiB and of 1 GiB (libuv's uv_spawn
** forks, and a fork copies the page tables of the whole host while the loop
** waits). The end is seen through a pidfd on the loop. The child keeps only
** its three standard streams and the `fds` asked for: every other
** descriptor of the host is closed, close-on-exec or not. Where the kernel
** has no pidfd_open (before Linux 5.3), or with MAYURA_SPAWN=fork in the
** host's environment, uv_spawn is used as before.
*/
#include "mc.h"
#include "tree.h"
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROC_MT "mayura.process"
#define PROC_TAG_VAR "MAYURA_TREE"
#define PROC_READ_CHUNK 65536

typedef struct proc_stream {
    uv_pipe_t pipe;
    char *data;          /* kept bytes, up to cap */
    size_t len, size;    /* kept length, allocated size */
    size_t cap;
    int truncated;
    int open;            /* the read side is still open */
    struct mc_proc *owner;
} proc_stream;

typedef struct mc_proc {
    lua_State *L;        /* main thread; NULL once the state is closing */
    uv_process_t process;     /* started by uv_spawn (fast == 0) */
    uv_poll_t exitw;          /* or by posix_spawn (fast == 1): watches pidfd */
    int fast, pidfd;
    uv_timer_t timer;    /* timeout, then grace, then drain */
    uv_pipe_t in;
    uv_write_t write_req;
    uv_shutdown_t shutdown_req;
    proc_stream out, err;
    int cb_ref, self_ref, stdin_ref;
    mc_life life;        /* uv: the uv handles not yet closed; holds: 1 until the command is finished */
    int exited, finished, timed_out, cancelled;
    int killing;              /* K_NONE, K_GRACE, K_KILLED or K_DRAIN (core/tree.h) */
    int outlive;              /* untagged, and left running when the state closes */
    int64_t exit_status;
    int term_signal;
    pid_t pid;
    uint64_t started, ended;
    uint64_t kill_grace_ms, drain_ms;
    char tag[128];
    char scratch[PROC_READ_CHUNK];
} mc_proc;

typedef struct { mc_proc *p; } proc_box;

static const mc_class proc_class;   /* at the end of the file */

static void proc_finish(mc_proc *p);

/* {======================================================
** Killing a tree
** =======================================================*/

/* Signals the command's group and every live process carrying its tag; returns the tagged ones. */
static int proc_signal_tree(mc_proc *p, int sig) {
    char needle[192];
    size_t nlen = tree_needle(needle, sizeof needle, PROC_TAG_VAR, p->tag, 1);
    return tree_signal(p->pid, 0, needle, nlen, sig);
}

/* SIGKILL the command's whole tree, in passes until none is left. */
static void proc_kill_tree(mc_proc *p) {
    char needle[192];
    size_t nlen = tree_needle(needle, sizeof needle, PROC_TAG_VAR, p->tag, 1);
    tree_kill(p->pid, 0, needle, nlen);
}

/* }====================================================== */

/* {======================================================
** Handles
** =======================================================*/

/* The command is over for its caller: from here only its open uv handles keep p. Once. */
static void proc_set_finished(mc_proc *p) {
    if (p->finished) return;
    p->finished = 1;
    p->life.holds--;
}

static void proc_free_if_done(mc_proc *p) {
    if (!mc_life_over(&p->life)) return;
    free(p->out.data);
    free(p->err.data);
    free(p);
}

static void proc_on_close(uv_handle_t *h) {
    mc_proc *p = (mc_proc *)h->data;
    p->life.uv--;
    proc_free_if_done(p);
}

static void proc_close(mc_proc *p, uv_handle_t *h) {
    (void)p;   /* kept for symmetry: every close counts against p->life.uv */
    if (!uv_is_closing(h)) uv_close(h, proc_on_close);
}

/* The handle that sees the command end: the exit watch or libuv's process. */
static uv_handle_t *proc_exit_handle(mc_proc *p) {
    return p->fast ? (uv_handle_t *)&p->exitw : (uv_handle_t *)&p->process;
}

/* The exit watch does not own its pidfd: it is closed once the watch is. */
static void proc_on_exitw_close(uv_handle_t *h) {
    mc_proc *p = (mc_proc *)h->data;
    if (p->pidfd >= 0) close(p->pidfd);
    p->pidfd = -1;
    proc_on_close(h);
}

static void proc_close_exit(mc_proc *p) {
    uv_handle_t *h = proc_exit_handle(p);
    if (!uv_is_closing(h)) uv_close(h, p->fast ? proc_on_exitw_close : proc_on_close);
}

static void proc_stream_close(proc_stream *s) {
    if (s->open) {
        s->open = 0;
        uv_read_stop((uv_stream_t *)&s->pipe);
    }
}

/* Reads land in one scratch buffer per process; proc_keep copies what the cap allows. */
static void proc_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    mc_proc *p = (mc_proc *)h->data;
    (void)suggested;
    buf->base = p->scratch;
    buf->len = sizeof p->scratch;
}

static void proc_keep(proc_stream *s, const char *data, size_t n) {
    size_t room, take;
    if (s->len >= s->cap) { if (n > 0) s->truncated = 1; return; }
    room = s->cap - s->len;
    take = n < room ? n : room;
    if (take < n) s->truncated = 1;
    if (s->len + take > s->size) {
        size_t want = s->size ? s->size : 4096;
        char *nd;
        while (want < s->len + take) want *= 2;
        if (want > s->cap) want = s->cap;
        nd = (char *)realloc(s->data, want);
        if (nd == NULL) { s->truncated = 1; return; }   /* keep what we have */
        s->data = nd;
        s->size = want;
    }
    memcpy(s->data + s->len, data, take);
    s->len += take;
}

static void proc_check_done(mc_proc *p) {
    if (p->finished || !p->exited) return;
    if (!p->out.open && !p->err.open) proc_finish(p);
}

static void proc_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
    mc_proc *p = (mc_proc *)stream->data;
    proc_stream *s = (uv_pipe_t *)stream == &p->out.pipe ? &p->out : &p->err;
    if (nread > 0) {
        proc_keep(s, buf->base, (size_t)nread);
    } else if (nread < 0) {
        proc_stream_close(s);
        proc_check_done(p);
    }
}

static void proc_on_timer(uv_timer_t *t);

/* The command's own process has ended. */
static void proc_exited(mc_proc *p, int64_t status, int sig) {
    p->exited = 1;
    p->ended = uv_hrtime();
    p->exit_status = status;
    p->term_signal = sig;
    /* A timeout or cancel ends all it started; after a normal end what it left running stays. */
    if (p->timed_out || p->cancelled) proc_kill_tree(p);
    uv_timer_stop(&p->timer);
    if (p->out.open || p->err.open) {
        /* a process that left the group may still hold the pipes: wait a little, then stop reading */
        p->killing = K_DRAIN;
        uv_timer_start(&p->timer, proc_on_timer, p->drain_ms, 0);
    }
    proc_check_done(p);
}

static void proc_on_exit(uv_process_t *h, int64_t status, int sig) {
    proc_exited((mc_proc *)h->data, status, sig);
}

/* The pidfd is readable: the command has ended; reaps it. */
static void proc_on_pidfd(uv_poll_t *h, int status, int events) {
    mc_proc *p = (mc_proc *)h->data;
    siginfo_t info;
    (void)status;
    (void)events;
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, (id_t)p->pid, &info, WEXITED | WNOHANG) != 0) {
        if (errno == EINTR) return;
        /* ECHILD: reaped by someone else (a host that ignores SIGCHLD); its status is lost */
        info.si_pid = p->pid;
        info.si_code = CLD_EXITED;
        info.si_status = -1;
    } else if (info.si_pid == 0) {
        return;   /* not yet */
    }
    uv_poll_stop(h);
    if (info.si_code == CLD_EXITED) proc_exited(p, info.si_status, 0);
    else proc_exited(p, 0, info.si_status);
}

static void proc_begin_kill(mc_proc *p) {
    if (p->exited) return;
    if (p->kill_grace_ms > 0 && p->killing == K_NONE) {
        proc_signal_tree(p, SIGTERM);
        p->killing = K_GRACE;
        uv_timer_stop(&p->timer);
        uv_timer_start(&p->timer, proc_on_timer, p->kill_grace_ms, 0);
        return;
    }
    p->killing = K_KILLED;
    proc_kill_tree(p);
}

static void proc_on_timer(uv_timer_t *t) {
    mc_proc *p = (mc_proc *)t->data;
    if (p->killing == K_DRAIN) {     /* drain over */
        proc_stream_close(&p->out);
        proc_stream_close(&p->err);
        proc_check_done(p);
        return;
    }
    if (p->killing == K_GRACE) {     /* grace over */
        p->killing = K_KILLED;
        proc_kill_tree(p);
        return;
    }
    p->timed_out = 1;               /* timeout */
    proc_begin_kill(p);
}

static void proc_on_shutdown(uv_shutdown_t *req, int status) {
    mc_proc *p = (mc_proc *)req->data;
    (void)status;
    proc_close(p, (uv_handle_t *)&p->in);
}

static void proc_on_write(uv_write_t *req, int status) {
    mc_proc *p = (mc_proc *)req->data;
    if (p->L != NULL && p->stdin_ref != LUA_NOREF) {
        luaL_unref(p->L, LUA_REGISTRYINDEX, p->stdin_ref);
        p->stdin_ref = LUA_NOREF;
    }
    if (status < 0 || uv_is_closing((uv_handle_t *)&p->in)) {
        proc_close(p, (uv_handle_t *)&p->in);
        return;
    }
    p->shutdown_req.data = p;
    if (uv_shutdown(&p->shutdown_req, (uv_stream_t *)&p->in, proc_on_shutdown) != 0)
        proc_close(p, (uv_handle_t *)&p->in);
}

/* }====================================================== */

/* Pushes the result table and calls the Lua callback once; closes every handle. */
static void proc_finish(mc_proc *p) {
    lua_State *L = p->L;
    proc_set_finished(p);
    uv_timer_stop(&p->timer);
    proc_close(p, (uv_handle_t *)&p->timer);
    proc_close_exit(p);
    proc_close(p, (uv_handle_t *)&p->out.pipe);
    proc_close(p, (uv_handle_t *)&p->err.pipe);
    proc_close(p, (uv_handle_t *)&p->in);
    if (L != NULL) {
        int cb = p->cb_ref, self = p->self_ref;
        p->cb_ref = LUA_NOREF;
        p->self_ref = LUA_NOREF;
        if (p->stdin_ref != LUA_NOREF) {
            luaL_unref(L, LUA_REGISTRYINDEX, p->stdin_ref);
            p->stdin_ref = LUA_NOREF;
        }
        lua_rawgeti(L, LUA_REGISTRYINDEX, cb);
        luaL_unref(L, LUA_REGISTRYINDEX, cb);
        lua_createtable(L, 0, 12);
        if (!p->timed_out && !p->cancelled && p->term_signal == 0) {
            lua_pushinteger(L, (lua_Integer)p->exit_status);
            lua_setfield(L, -2, "exit_code");
        }
        if (p->term_signal != 0) {
            lua_pushinteger(L, p->term_signal);
            lua_setfield(L, -2, "signal");
        }
        lua_pushlstring(L, p->out.data ? p->out.data : "", p->out.len);
        lua_setfield(L, -2, "stdout");
        lua_pushlstring(L, p->err.data ? p->err.data : "", p->err.len);
        lua_setfield(L, -2, "stderr");
        lua_pushboolean(L, p->out.truncated);
        lua_setfield(L, -2, "stdout_truncated");
        lua_pushboolean(L, p->err.truncated);
        lua_setfield(L, -2, "stderr_truncated");
        lua_pushboolean(L, p->out.truncated || p->err.truncated);
        lua_setfield(L, -2, "truncated");
        lua_pushboolean(L, p->timed_out);
        lua_setfield(L, -2, "timed_out");
        lua_pushboolean(L, p->cancelled);
        lua_setfield(L, -2, "cancelled");
        lua_pushinteger(L, (lua_Integer)((p->ended - p->started) / 1000000u));
        lua_setfield(L, -2, "duration_ms");
        lua_pushinteger(L, p->pid);
        lua_setfield(L, -2, "pid");
        /* the result is built: free the buffers now, not when the handles close */
        free(p->out.data);
        free(p->err.data);
        p->out.data = p->err.data = NULL;
        /* unanchor before the call, so a callback error cannot keep the box alive */
        if (self != LUA_NOREF) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, self);
            if (lua_touserdata(L, -1) != NULL) ((proc_box *)lua_touserdata(L, -1))->p = NULL;
            lua_pop(L, 1);
            luaL_unref(L, LUA_REGISTRYINDEX, self);
        }
        mc_call(L, 1);
    }
    proc_free_if_done(p);
}

/* {======================================================
** Lua API
** =======================================================*/

static const char *const proc_keys[] = {
    "argv", "cwd", "env", "stdin", "timeout_ms", "max_output_bytes",
    "kill_grace_ms", "drain_ms", "fds", "outlive", NULL
};

#define PROC_MAX_FDS 8

/*
** Builds the NULL-terminated environment: the env table (or the inherited
** one) plus the tag. Pushes an anchor table that keeps the strings alive
** and the pointer array (a userdata); both stay on the stack until spawned.
*/
static char **proc_build_env(lua_State *L, int opts, const char *tagvar) {
    size_t n = 0, i = 0;
    char **envp;
    int t, anchor;
    lua_newtable(L);
    anchor = lua_gettop(L);
    lua_getfield(L, opts, "env");
    t = lua_gettop(L);
    if (lua_isnil(L, t)) {
        extern char **environ;
        char **e;
        for (e = environ; *e != NULL; e++) n++;
        envp = (char **)lua_newuserdatauv(L, (n + 2) * sizeof(char *), 0);
        for (e = environ; *e != NULL; e++)
            if (strncmp(*e, PROC_TAG_VAR "=", sizeof PROC_TAG_VAR) != 0) envp[i++] = *e;
    } else {
        if (lua_type(L, t) != LUA_TTABLE) mc_raise(L, "INVALID_INPUT", "option 'env' must be a table");
        lua_pushnil(L);
        while (lua_next(L, t) != 0) { n++; lua_pop(L, 1); }
        envp = (char **)lua_newuserdatauv(L, (n + 2) * sizeof(char *), 0);
        lua_pushnil(L);
        while (lua_next(L, t) != 0) {
            size_t kl, vl;
            const char *k, *v;
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
                mc_raise(L, "INVALID_INPUT", "env names and values must be strings");
            k = lua_tolstring(L, -2, &kl);
            v = lua_tolstring(L, -1, &vl);
            if (kl == 0 || strlen(k) != kl || strchr(k, '=') != NULL)
                mc_raise(L, "INVALID_INPUT", "env name '%s' is not valid", k);
            if (strlen(v) != vl) mc_raise(L, "INVALID_INPUT", "env value of '%s' contains a NUL byte", k);
            if (strcmp(k, PROC_TAG_VAR) != 0) {
                lua_pushfstring(L, "%s=%s", k, v);
                envp[i++] = (char *)lua_tostring(L, -1);
                lua_rawseti(L, anchor, (lua_Integer)i);
            }
            lua_pop(L, 1);
        }
    }
    if (tagvar != NULL) envp[i++] = (char *)tagvar;
    envp[i] = NULL;
    return envp;
}

/* What core.spawn's options table says, read and checked before anything starts. */
typedef struct proc_spawn_opts {
    char **args, **envp;
    const char *cwd, *stdin_data;
    size_t stdin_len;
    lua_Integer timeout_ms, max_out, grace, drain;
    int nfds, fdv[PROC_MAX_FDS];
    int outlive;
    char tagvar[128];
} proc_spawn_opts;

/*
** Reads and checks the options table at index 1 into so. The strings it
** points at stay alive in the options table and in values pushed onto the
** stack (argv and environment arrays), so the caller keeps the stack as it
** is until the process has started. Raises INVALID_INPUT on a bad option.
*/
static void proc_read_opts(lua_State *L, proc_spawn_opts *so) {
    static unsigned long counter = 0;
    size_t argc, i;
    memset(so, 0, sizeof *so);
    mc_check_keys(L, 1, proc_keys);
    so->timeout_ms = mc_opt_int(L, 1, "timeout_ms", 0, 0, (lua_Integer)1 << 40);
    so->max_out = mc_opt_int(L, 1, "max_output_bytes", 1 << 20, 0, (lua_Integer)1 << 40);
    so->grace = mc_opt_int(L, 1, "kill_grace_ms", 0, 0, 3600000);
    so->drain = mc_opt_int(L, 1, "drain_ms", 100, 0, 3600000);
    so->stdin_data = mc_opt_lstr(L, 1, "stdin", &so->stdin_len);
    lua_getfield(L, 1, "outlive");
    so->outlive = lua_toboolean(L, -1);
    lua_pop(L, 1);

    lua_getfield(L, 1, "cwd");
    if (!lua_isnil(L, -1)) so->cwd = mc_check_path(L, -1, "cwd");
    lua_pop(L, 1);

    lua_getfield(L, 1, "argv");
    if (lua_type(L, -1) != LUA_TTABLE) mc_raise(L, "INVALID_INPUT", "option 'argv' must be a list of strings");
    argc = lua_rawlen(L, -1);
    if (argc == 0) mc_raise(L, "INVALID_INPUT", "option 'argv' is empty");
    if (argc > 65536) mc_raise(L, "INVALID_INPUT", "option 'argv' is too long");
    so->args = (char **)lua_newuserdatauv(L, (argc + 1) * sizeof(char *), 0);
    for (i = 0; i < argc; i++) {
        size_t l;
        lua_rawgeti(L, -2, (lua_Integer)i + 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            mc_raise(L, "INVALID_INPUT", "argv[%d] must be a string", (int)i + 1);
        so->args[i] = (char *)lua_tolstring(L, -1, &l);
        if (strlen(so->args[i]) != l) mc_raise(L, "INVALID_INPUT", "argv[%d] contains a NUL byte", (int)i + 1);
        if (i == 0 && l == 0) mc_raise(L, "INVALID_INPUT", "argv[1] is empty");
        lua_pop(L, 1);   /* the string stays alive in the argv table */
    }
    so->args[argc] = NULL;

    snprintf(so->tagvar, sizeof so->tagvar, "%s=%ld.%lu.%llu", PROC_TAG_VAR, (long)getpid(), ++counter,
             (unsigned long long)uv_hrtime());
    /* fds = { a, b, ... }: host descriptors the command inherits as 3, 4, ... */
    lua_getfield(L, 1, "fds");
    if (!lua_isnil(L, -1)) {
        int k;
        if (lua_type(L, -1) != LUA_TTABLE) mc_raise(L, "INVALID_INPUT", "option 'fds' must be a list of descriptors");
        so->nfds = (int)lua_rawlen(L, -1);
        if (so->nfds > PROC_MAX_FDS)
            mc_raise(L, "INVALID_INPUT", "option 'fds' has more than %d entries", PROC_MAX_FDS);
        for (k = 0; k < so->nfds; k++) {
            lua_Integer fd;
            lua_rawgeti(L, -1, k + 1);
            fd = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : -1;
            if (fd < 0 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0)
                mc_raise(L, "INVALID_INPUT", "fds[%d] is not an open descriptor", k + 1);
            so->fdv[k] = (int)fd;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    so->envp = proc_build_env(L, 1, so->outlive ? NULL : so->tagvar);
}

/*
** Pushes nil and a SPAWN_FAILED error after the start was refused; every
** handle is closed (uv_spawn's process handle too, which it opens even when
** it fails).
*/
static int proc_start_failed(lua_State *L, mc_proc *p, const char *file, int rc, int uv_process_open) {
    proc_set_finished(p);
    p->L = NULL;
    if (uv_process_open) {
        p->life.uv++;
        proc_close(p, (uv_handle_t *)&p->process);
    }
    proc_close(p, (uv_handle_t *)&p->timer);
    proc_close(p, (uv_handle_t *)&p->out.pipe);
    proc_close(p, (uv_handle_t *)&p->err.pipe);
    proc_close(p, (uv_handle_t *)&p->in);
    lua_pushnil(L);
    mc_push_error(L, "SPAWN_FAILED", "cannot start '%s': %s", file, uv_strerror(rc));
    mc_error_field(L, "errno", uv_err_name(rc));
    return 2;
}

/* Starts writing the stdin bytes (kept alive by a reference to the options' string), or closes stdin. */
static void proc_start_stdin(lua_State *L, mc_proc *p, const proc_spawn_opts *so) {
    if (so->stdin_data != NULL) {
        uv_buf_t b = uv_buf_init((char *)so->stdin_data, (unsigned int)so->stdin_len);
        lua_getfield(L, 1, "stdin");
        p->stdin_ref = luaL_ref(L, LUA_REGISTRYINDEX);   /* keeps the bytes alive while written */
        p->write_req.data = p;
        if (so->stdin_len > UINT_MAX || uv_write(&p->write_req, (uv_stream_t *)&p->in, &b, 1, proc_on_write) != 0) {
            luaL_unref(L, LUA_REGISTRYINDEX, p->stdin_ref);
            p->stdin_ref = LUA_NOREF;
            proc_close(p, (uv_handle_t *)&p->in);
        }
    } else {
        proc_close(p, (uv_handle_t *)&p->in);
    }
}

/* {======================================================
** Starting a command: posix_spawn, or uv_spawn where the kernel has no pidfd_open
** =======================================================*/

/* The lowest descriptor the parent's spare copies use: above every descriptor the child is given. */
#define PROC_SPARE_FD (3 + PROC_MAX_FDS)

/* 1 when the kernel has pidfd_open and the host did not ask for uv_spawn; found out once. */
static int proc_fast_ok = -1;

static int proc_pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/*
** Whether a command may start through posix_spawn now. Not while the host ignores SIGCHLD (SIG_IGN
** or SA_NOCLDWAIT, a host's own choice or inherited across its exec): the kernel then reaps every
** child at once, and a pidfd finds no status to read. uv_spawn installs libuv's SIGCHLD handler
** first (as it always did), after which the kernel keeps children for their parent again.
*/
static int proc_can_start_fast(void) {
    struct sigaction sa;
    if (proc_fast_ok < 0) {
        const char *how = getenv("MAYURA_SPAWN");
        int fd = how != NULL && strcmp(how, "fork") == 0 ? -1 : proc_pidfd_open(getpid());
        proc_fast_ok = fd >= 0;
        if (fd >= 0) close(fd);
    }
    if (proc_fast_ok && sigaction(SIGCHLD, NULL, &sa) == 0 &&
        (sa.sa_handler == SIG_IGN || (sa.sa_flags & SA_NOCLDWAIT) != 0))
        return 0;
    return proc_fast_ok;
}

/*
** execvp's search, done before the start: file itself when it has a slash,
** else the first executable regular file named file in the PATH of the
** command's own environment (as under uv_spawn, whose child took the new
** environment before its execvp), or of /bin:/usr/bin when it has none. A
** relative entry (an empty one is ".") is looked at from cwd, as execvp did
** after its chdir; out gets the path as the child, in cwd, will use it.
** Returns 0 with the path in out, or an errno.
*/
static int proc_find(const char *file, char *const *envp, const char *cwd, char *out, size_t size) {
    const char *path = "/bin:/usr/bin", *dir, *end;
    char seen[PATH_MAX];   /* the candidate as the host sees it */
    size_t flen = strlen(file);
    int err = ENOENT;
    if (strchr(file, '/') != NULL) {
        if (flen >= size) return ENAMETOOLONG;
        memcpy(out, file, flen + 1);
        return 0;
    }
    for (; *envp != NULL; envp++)
        if (strncmp(*envp, "PATH=", 5) == 0) { path = *envp + 5; break; }
    for (dir = path;; dir = end + 1) {
        struct stat st;
        size_t dlen;
        int n;
        end = strchr(dir, ':');
        if (end == NULL) end = dir + strlen(dir);
        dlen = (size_t)(end - dir);
        n = snprintf(out, size, "%.*s/%s", dlen > 0 ? (int)dlen : 1, dlen > 0 ? dir : ".", file);
        if (n > 0 && (size_t)n < size) {
            const char *at = out;
            if (cwd != NULL && out[0] != '/') {
                n = snprintf(seen, sizeof seen, "%s/%s", cwd, out);
                at = n > 0 && (size_t)n < sizeof seen ? seen : NULL;
            }
            if (at != NULL && stat(at, &st) == 0 && S_ISREG(st.st_mode)) {
                if (access(at, X_OK) == 0) return 0;
                err = EACCES;
            }
        }
        if (*end == '\0') return err;
    }
}

/*
** A file that is not a program the kernel runs (a script without #!): run by /bin/sh with the
** path as its first argument, as execvp does. 0 or an errno.
*/
static int proc_spawn_script(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                             const posix_spawnattr_t *attr, const struct proc_spawn_opts *so) {
    size_t argc = 0, i;
    char **argv;
    int rc;
    while (so->args[argc] != NULL) argc++;
    argv = (char **)malloc((argc + 2) * sizeof *argv);
    if (argv == NULL) return ENOMEM;
    argv[0] = (char *)"/bin/sh";
    argv[1] = (char *)path;
    for (i = 1; i <= argc; i++) argv[i + 1] = so->args[i];   /* with the NULL at the end */
    rc = posix_spawn(pid, "/bin/sh", fa, attr, argv, so->envp);
    free(argv);
    return rc;
}

/* A close-on-exec copy of fd at PROC_SPARE_FD or above (the original is closed), or -1. */
static int proc_spare(int fd) {
    int hi;
    if (fd < 0) return -1;
    hi = fcntl(fd, F_DUPFD_CLOEXEC, PROC_SPARE_FD);
    close(fd);
    return hi;
}

/* A socket pair for one standard stream: [0] the host's end, [1] the child's (a spare); 0 or an errno. */
static int proc_pair(int sv[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return errno;
    sv[1] = proc_spare(sv[1]);
    if (sv[1] < 0) {
        int e = errno;
        close(sv[0]);
        sv[0] = -1;
        return e;
    }
    return 0;
}

static void proc_close_fds(int *fds, int n) {
    int i;
    for (i = 0; i < n; i++) {
        if (fds[i] >= 0) close(fds[i]);
        fds[i] = -1;
    }
}

/*
** Starts so's command with posix_spawn: its own session, signals at their
** defaults and none blocked, standard streams on new socket pairs (stdin on
** /dev/null without stdin bytes), fds as 3, 4, ..., nothing else open. The
** child's descriptors are first copied above PROC_SPARE_FD, so no dup2 of
** the child overwrites one that a later dup2 reads. On success the exit
** watch and the host's ends of the streams are open on p; returns 0 or a
** negative errno (a libuv error code), with nothing left open.
*/
static int proc_spawn_fast(uv_loop_t *loop, mc_proc *p, const proc_spawn_opts *so) {
    char path[PATH_MAX];
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, spare[PROC_MAX_FDS];
    int i, rc = 0, pidfd;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, all;
    pid_t pid;

    for (i = 0; i < PROC_MAX_FDS; i++) spare[i] = -1;
    rc = proc_find(so->args[0], so->envp, so->cwd, path, sizeof path);
    if (rc == 0 && so->stdin_data != NULL) rc = proc_pair(in);
    if (rc == 0) rc = proc_pair(out);
    if (rc == 0) rc = proc_pair(err);
    for (i = 0; rc == 0 && i < so->nfds; i++) {
        spare[i] = fcntl(so->fdv[i], F_DUPFD_CLOEXEC, PROC_SPARE_FD);
        if (spare[i] < 0) rc = errno;
    }
    if (rc != 0) goto fail;

    if ((rc = posix_spawn_file_actions_init(&fa)) != 0) goto fail;
    if ((rc = posix_spawnattr_init(&attr)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        goto fail;
    }
    if (so->stdin_data != NULL) rc = posix_spawn_file_actions_adddup2(&fa, in[1], 0);
    else rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    for (i = 0; rc == 0 && i < so->nfds; i++) rc = posix_spawn_file_actions_adddup2(&fa, spare[i], 3 + i);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&fa, 3 + so->nfds);
#endif
    if (rc == 0 && so->cwd != NULL) rc = posix_spawn_file_actions_addchdir_np(&fa, so->cwd);
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
#ifdef __GLIBC__
    /* glibc keeps 32 and 33 for itself: its sigfillset leaves them out, and its spawned child would
       then ignore them, and so would every program the command starts. Named in the raw set (bit
       n-1 of the kernel's layout), the child puts them back to their default. */
    all.__val[0] |= (1UL << 31) | (1UL << 32);
#endif
    if (rc == 0) rc = posix_spawnattr_setsigmask(&attr, &none);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
    if (rc == 0) rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK
                                                        | POSIX_SPAWN_SETSIGDEF);
    if (rc == 0) rc = posix_spawn(&pid, path, &fa, &attr, so->args, so->envp);
    if (rc == ENOEXEC) rc = proc_spawn_script(&pid, path, &fa, &attr, so);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) goto fail;

    proc_close_fds(&in[1], 1);
    proc_close_fds(&out[1], 1);
    proc_close_fds(&err[1], 1);
    proc_close_fds(spare, so->nfds);
    pidfd = proc_pidfd_open(pid);
    if (pidfd < 0 || (rc = uv_poll_init(loop, &p->exitw, pidfd)) != 0) {
        /* it cannot be watched: stop it before anything of it is handed out */
        rc = pidfd < 0 ? -errno : rc;
        if (pidfd >= 0) close(pidfd);
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        goto fail_negative;
    }
    p->fast = 1;
    p->pidfd = pidfd;
    p->pid = pid;
    p->exitw.data = p;
    uv_poll_start(&p->exitw, UV_READABLE, proc_on_pidfd);
    /* the host's ends: uv_pipe_open takes each over (it is closed with its handle) */
    if (so->stdin_data != NULL) uv_pipe_open(&p->in, in[0]);
    uv_pipe_open(&p->out.pipe, out[0]);
    uv_pipe_open(&p->err.pipe, err[0]);
    return 0;

fail:
    rc = -rc;
fail_negative:
    proc_close_fds(in, 2);
    proc_close_fds(out, 2);
    proc_close_fds(err, 2);
    proc_close_fds(spare, PROC_MAX_FDS);
    return rc;
}

/*
** Starts so's command with uv_spawn (kernels without pidfd_open, or MAYURA_SPAWN=fork): libuv
** forks, makes the stream pipes and watches the end. Returns 0 or a libuv error code; the
** process handle is open either way.
*/
static int proc_spawn_uv(uv_loop_t *loop, mc_proc *p, const proc_spawn_opts *so) {
    uv_process_options_t o;
    uv_stdio_container_t stdio[3 + PROC_MAX_FDS];
    int i, rc;
    memset(&o, 0, sizeof o);
    stdio[0].flags = so->stdin_data != NULL ? (uv_stdio_flags)(UV_CREATE_PIPE | UV_READABLE_PIPE) : UV_IGNORE;
    stdio[0].data.stream = (uv_stream_t *)&p->in;
    stdio[1].flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
    stdio[1].data.stream = (uv_stream_t *)&p->out.pipe;
    stdio[2].flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
    stdio[2].data.stream = (uv_stream_t *)&p->err.pipe;
    o.exit_cb = proc_on_exit;
    o.file = so->args[0];
    o.args = so->args;
    o.env = so->envp;
    o.cwd = so->cwd;
    o.flags = UV_PROCESS_DETACHED;   /* setsid: the command leads its own group */
    for (i = 0; i < so->nfds; i++) {
        stdio[3 + i].flags = UV_INHERIT_FD;
        stdio[3 + i].data.fd = so->fdv[i];
    }
    o.stdio_count = 3 + so->nfds;
    o.stdio = stdio;
    p->process.data = p;
    rc = uv_spawn(loop, &p->process, &o);
    if (rc == 0) p->pid = p->process.pid;
    return rc;
}

/* }====================================================== */

/*
** core.spawn(opts, cb) -> process, or nil, err when the program cannot be
** started (err.code 'SPAWN_FAILED', err.errno e.g. 'ENOENT'). The options
** are read first (proc_read_opts); then the process object is made, born
** with its handles open but nothing started, and only then is the program
** started, so every failure after the options leaves nothing behind.
*/
static int l_spawn(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    proc_spawn_opts so;
    mc_proc *p;
    proc_box *box;
    int rc, top, boxidx, fast;

    if (lua_type(L, 1) != LUA_TTABLE) return mc_raise(L, "INVALID_INPUT", "spawn expects an options table");
    if (lua_type(L, 2) != LUA_TFUNCTION) return mc_raise(L, "INVALID_INPUT", "spawn expects a callback");
    top = lua_gettop(L);
    proc_read_opts(L, &so);

    /* The box first, born empty: from here on its __gc cleans up whatever a raise leaves. */
    box = (proc_box *)mc_handle_new(L, &proc_class);
    boxidx = lua_gettop(L);
    p = (mc_proc *)calloc(1, sizeof *p);
    if (p == NULL) return mc_raise_oom(L);
    snprintf(p->tag, sizeof p->tag, "%s", so.tagvar + sizeof PROC_TAG_VAR);
    p->L = mc_main(L);
    p->cb_ref = p->self_ref = p->stdin_ref = LUA_NOREF;
    p->pidfd = -1;
    p->out.cap = p->err.cap = (size_t)so.max_out;
    p->kill_grace_ms = (uint64_t)so.grace;
    p->drain_ms = (uint64_t)so.drain;
    p->outlive = so.outlive;
    p->life.holds = 1;   /* until proc_set_finished */

    uv_pipe_init(loop, &p->out.pipe, 0);
    uv_pipe_init(loop, &p->err.pipe, 0);
    uv_pipe_init(loop, &p->in, 0);
    uv_timer_init(loop, &p->timer);
    p->life.uv = 4;
    p->out.pipe.data = p->err.pipe.data = p->in.data = p->timer.data = p;

    p->started = uv_hrtime();
    fast = proc_can_start_fast();
    rc = fast ? proc_spawn_fast(loop, p, &so) : proc_spawn_uv(loop, p, &so);
    if (rc != 0) {
        lua_settop(L, top);   /* argv[1] stays alive in the options table */
        return proc_start_failed(L, p, so.args[0], rc, !fast);
    }
    box->p = p;
    lua_pushvalue(L, boxidx);
    lua_replace(L, top + 1);   /* the box; the option scratch above it is dropped */
    lua_settop(L, top + 1);
    p->life.uv++;   /* the process handle or the exit watch */
    p->out.open = p->err.open = 1;
    uv_read_start((uv_stream_t *)&p->out.pipe, proc_alloc, proc_read);
    uv_read_start((uv_stream_t *)&p->err.pipe, proc_alloc, proc_read);

    lua_pushvalue(L, -1);
    p->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, 2);
    p->cb_ref = luaL_ref(L, LUA_REGISTRYINDEX);

    proc_start_stdin(L, p, &so);
    if (so.timeout_ms > 0) uv_timer_start(&p->timer, proc_on_timer, (uint64_t)so.timeout_ms, 0);
    return 1;
}

static mc_proc *proc_get(lua_State *L) {
    proc_box *box = (proc_box *)luaL_checkudata(L, 1, PROC_MT);
    return box->p;
}

/* process:cancel(): stops the command and everything it started; the result says cancelled. */
static int l_proc_cancel(lua_State *L) {
    mc_proc *p = proc_get(L);
    if (p == NULL || p->finished || p->exited || p->cancelled) { lua_pushboolean(L, 0); return 1; }
    p->cancelled = 1;
    uv_timer_stop(&p->timer);
    proc_begin_kill(p);
    lua_pushboolean(L, 1);
    return 1;
}

/* process:kill(sig): sends a signal (a number, default SIGTERM) to the command's process group. */
static int l_proc_kill(lua_State *L) {
    mc_proc *p = proc_get(L);
    int sig = (int)luaL_optinteger(L, 2, SIGTERM);
    if (sig < 0 || sig > 64) return mc_raise(L, "INVALID_INPUT", "signal %d is not valid", sig);
    if (p == NULL || p->exited) { lua_pushboolean(L, 0); return 1; }
    lua_pushboolean(L, kill(-p->pid, sig) == 0);
    return 1;
}

static int l_proc_index_pid(lua_State *L) {
    mc_proc *p = proc_get(L);
    if (p == NULL) lua_pushnil(L);
    else lua_pushinteger(L, p->pid);
    return 1;
}

static int l_proc_running(lua_State *L) {
    mc_proc *p = proc_get(L);
    lua_pushboolean(L, p != NULL && !p->finished);
    return 1;
}

static int l_proc_tostring(lua_State *L) {
    mc_proc *p = proc_get(L);
    if (p == NULL) lua_pushstring(L, PROC_MT " (ended)");
    else lua_pushfstring(L, PROC_MT " (pid %d)", (int)p->pid);
    return 1;
}

/*
** Only reached while the state closes (a running process is anchored): the
** command is stopped, and no callback may reach the closing state.
*/
static int l_proc_gc(lua_State *L) {
    proc_box *box = (proc_box *)luaL_checkudata(L, 1, PROC_MT);
    mc_proc *p = box->p;
    if (p == NULL) return 0;
    box->p = NULL;
    p->L = NULL;
    if (!p->exited && !p->outlive) proc_kill_tree(p);
    proc_set_finished(p);
    proc_close(p, (uv_handle_t *)&p->timer);
    proc_close_exit(p);
    proc_close(p, (uv_handle_t *)&p->out.pipe);
    proc_close(p, (uv_handle_t *)&p->err.pipe);
    proc_close(p, (uv_handle_t *)&p->in);
    return 0;
}

/*
** core.socketpair() -> fd_a, fd_b: a connected pair of unix stream sockets,
** close-on-exec (a command gets one through spawn's fds, which clears it).
*/
static int l_socketpair(lua_State *L) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return mc_fail(L, "IO_ERROR", "socketpair: %s", strerror(errno));
    lua_pushinteger(L, sv[0]);
    lua_pushinteger(L, sv[1]);
    return 2;
}

/*
** core.sealed_fd(text) -> fd: a file in memory (memfd) holding `text`, close-on-exec and sealed
** (no write, growth, shrink or further seal), read from offset 0 by whoever inherits it through
** spawn's fds: a private hand-over with no name in any directory, that nobody can change.
*/
static int l_sealed_fd(lua_State *L) {
    size_t n, off = 0;
    const char *s;
    int fd;
    if (lua_type(L, 1) != LUA_TSTRING) return mc_raise(L, "INVALID_INPUT", "sealed_fd takes a string");
    s = lua_tolstring(L, 1, &n);
    fd = (int)syscall(SYS_memfd_create, "mayura", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return mc_fail(L, "IO_ERROR", "memfd_create: %s", strerror(errno));
    while (off < n) {
        ssize_t w = write(fd, s + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            return mc_fail(L, "IO_ERROR", "memfd write: %s", strerror(e));
        }
        off += (size_t)w;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0
        || lseek(fd, 0, SEEK_SET) != 0) {
        int e = errno;
        close(fd);
        return mc_fail(L, "IO_ERROR", "memfd seal: %s", strerror(e));
    }
    lua_pushinteger(L, fd);
    return 1;
}

/* core.close_fd(fd): closes a descriptor from socketpair or sealed_fd. */
static int l_close_fd(lua_State *L) {
    lua_Integer fd = luaL_checkinteger(L, 1);
    if (fd < 3 || fd > INT_MAX) return mc_raise(L, "INVALID_INPUT", "not a descriptor the core handed out");
    lua_pushboolean(L, close((int)fd) == 0);
    return 1;
}

static const luaL_Reg proc_methods[] = {
    {"cancel", l_proc_cancel},
    {"kill", l_proc_kill},
    {"pid", l_proc_index_pid},
    {"running", l_proc_running},
    {NULL, NULL}
};

static const mc_class proc_class = { PROC_MT, sizeof(proc_box), l_proc_gc, l_proc_tostring, proc_methods, NULL };

static void mc_open_proc(lua_State *L) {
    mc_class_register(L, &proc_class);
    /* A command that closes its stdin early must not end the host with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    lua_pushcfunction(L, l_spawn);
    lua_setfield(L, -2, "spawn");
    lua_pushcfunction(L, l_socketpair);
    lua_setfield(L, -2, "socketpair");
    lua_pushcfunction(L, l_close_fd);
    lua_setfield(L, -2, "close_fd");
    lua_pushcfunction(L, l_sealed_fd);
    lua_setfield(L, -2, "sealed_fd");
}

/* }====================================================== */
