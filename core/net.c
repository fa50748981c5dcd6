/*
** net.c: sockets in a sandbox's network namespace and a byte relay, for mayura.core.
**
** core.netns_socket(ns_fd, 'listen' | 'connect', port) -> fd: a TCP socket
** of 127.0.0.1:port made inside the network namespace `ns_fd` names (an open
** /proc/<pid>/ns/net, as root): listening there, or connecting there
** (non-blocking: the connect may still be under way). The socket stays in
** that namespace while this process keeps working in its own: the egress
** proxy of an allow-listed sandbox listens in the sandbox's namespace (which
** has nothing but its loopback) and makes its own connections from the
** host's; url(port) connects into it the same way. The thread goes back to
** its own namespace before anything else runs (and the process aborts if it
** cannot: it must never go on in a sandbox's namespace).
**
** core.relay(fd_a, fd_b, opts, cb) -> relay: copies bytes both ways between
** two connected stream sockets on the loop (splice(2) through a pipe per
** direction, so the bytes never enter this process; a buffer of its own
** where splice cannot serve; never a Lua string per chunk), passing on each
** side's end of stream as a shutdown of the other. Both descriptors are
** duplicated: the caller keeps and closes its own. opts: `to_b` (bytes sent
** to b before anything read from a), `connecting_b` (b's connect is under
** way: its result is awaited first), `max_from_a` (the bytes a may send after
** to_b: one byte more ends the relay with err 'excess', that byte unread).
** cb(a_to_b_bytes, b_to_a_bytes, err) once both directions are over or one
** failed (err a message); relay:close() ends it early (no callback).
**
** What one relay holds is bounded, whatever its peers do: a side that does
** not read makes the relay stop reading the other (one pipe or buffer of
** RELAY_PIPE bytes per direction in flight), and each socket's kernel
** buffers are fixed at RELAY_SOCKBUF (the kernel doubles it for its own
** bookkeeping) instead of growing to the system's maxima (megabytes each):
** four socket buffers of 2 * RELAY_SOCKBUF and two pipes of RELAY_PIPE,
** 1.5 MiB at most, where the kernel's own sizing let one relay whose sandbox
** never read hold about 18 MiB. (Smaller sizes cost throughput: with 64 KiB
** of each a download through the proxy took twice as long.)
*/
#include "mc.h"
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#define RELAY_MT "mayura.relay"
#define RELAY_BUF ((size_t)64 * 1024)      /* the buffer of each direction without splice */
#define RELAY_PIPE ((size_t)256 * 1024)    /* the pipe of each direction with it */
#define RELAY_SOCKBUF (128 * 1024)         /* SO_SNDBUF and SO_RCVBUF of both sockets */

/* {======================================================
** Sockets in another network namespace
** =======================================================*/

static int l_netns_socket(lua_State *L) {
    lua_Integer ns;
    if (!lua_isinteger(L, 1)) return mc_raise(L, "INVALID_INPUT", "netns_socket expects a namespace descriptor");
    ns = lua_tointeger(L, 1);
    const char *kind = luaL_checkstring(L, 2);
    lua_Integer port = luaL_checkinteger(L, 3);
    int listen_kind = strcmp(kind, "listen") == 0;
    int self, fd, rc, err = 0;
    struct sockaddr_in sa;
    if (ns < 0 || ns > INT_MAX) return mc_raise(L, "INVALID_INPUT", "not a descriptor");
    if (!listen_kind && strcmp(kind, "connect") != 0)
        return mc_raise(L, "INVALID_INPUT", "kind must be 'listen' or 'connect'");
    if (port < (listen_kind ? 0 : 1) || port > 65535) return mc_raise(L, "INVALID_INPUT", "port out of range");
    self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0) return mc_fail(L, "IO_ERROR", "cannot open this thread's namespace: %s", strerror(errno));
    if (setns((int)ns, CLONE_NEWNET) != 0) {
        err = errno;
        close(self);
        return mc_fail(L, "IO_ERROR", "cannot enter the namespace: %s", strerror(err));
    }
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        err = errno;
    } else if (listen_kind) {
        /* connections of an earlier listener may linger in TIME_WAIT on the port */
        int one = 1;
        rc = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (rc == 0) rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
        if (rc == 0) rc = listen(fd, 128);
        if (rc != 0) err = errno;
    } else {
        rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        if (rc != 0 && errno != EINPROGRESS) err = errno;
    }
    /* back home before anything else, or not at all */
    if (setns(self, CLONE_NEWNET) != 0) abort();
    close(self);
    if (err != 0) {
        if (fd >= 0) close(fd);
        return mc_fail(L, "IO_ERROR", "%s: %s", listen_kind ? "listen" : "connect", strerror(err));
    }
    lua_pushinteger(L, fd);
    return 1;
}

/* }====================================================== */

/* {======================================================
** The relay
** =======================================================*/

typedef struct relay_dir {
    char *buf;
    size_t len, off;      /* pending bytes: buf[off, len) */
    int eof;              /* the source has ended */
    int shut;             /* the destination was told */
    int pipe[2];          /* splice(2)'s pipe, -1 when there is none (then buf carries everything) */
    size_t inpipe;        /* bytes in the pipe not yet passed on */
    uint64_t bytes;
} relay_dir;

typedef struct mc_relay {
    lua_State *L;         /* main thread; NULL once the state is closing */
    uv_poll_t poll[2];
    int fd[2];
    int live[2];          /* poll handle initialised and not yet closed back (each counted in life.uv) */
    int events[2];
    int connecting;       /* side 1's connect is under way */
    int limited;          /* side 0 may send no more than `left` bytes */
    uint64_t left;
    relay_dir dir[2];     /* dir[0]: side 0 -> side 1 */
    int cb_ref, self_ref;
    int finished;
    mc_life life;         /* uv: the live poll handles; holds: the Lua userdata */
} mc_relay;

typedef struct { mc_relay *r; } relay_box;

static const mc_class relay_class;   /* at the end of the file */

static void relay_maybe_free(mc_relay *r) {
    int i, j;
    if (!mc_life_over(&r->life)) return;
    for (i = 0; i < 2; i++)
        for (j = 0; j < 2; j++)
            if (r->dir[i].pipe[j] >= 0) close(r->dir[i].pipe[j]);
    free(r->dir[0].buf);
    free(r->dir[1].buf);
    free(r);
}

static void relay_on_close(uv_handle_t *h) {
    mc_relay *r = (mc_relay *)h->data;
    int i = h == (uv_handle_t *)&r->poll[0] ? 0 : 1;
    r->live[i] = 0;
    r->life.uv--;
    close(r->fd[i]);
    r->fd[i] = -1;
    relay_maybe_free(r);
}

/* Ends the relay once; calls back (when `notify` and a state is there) with the counts and err. */
static void relay_finish(mc_relay *r, const char *err, int notify) {
    int i, cb = r->cb_ref, self = r->self_ref;
    lua_State *L = r->L;
    if (r->finished) return;
    r->finished = 1;
    r->cb_ref = r->self_ref = LUA_NOREF;
    for (i = 0; i < 2; i++) {
        if (r->live[i] && !uv_is_closing((uv_handle_t *)&r->poll[i])) {
            uv_poll_stop(&r->poll[i]);
            uv_close((uv_handle_t *)&r->poll[i], relay_on_close);
        } else if (!r->live[i] && r->fd[i] >= 0) {
            close(r->fd[i]);
            r->fd[i] = -1;
        }
    }
    if (L == NULL) return;
    if (cb != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, cb);
        luaL_unref(L, LUA_REGISTRYINDEX, cb);
        if (notify) {
            lua_pushnumber(L, (lua_Number)r->dir[0].bytes);
            lua_pushnumber(L, (lua_Number)r->dir[1].bytes);
            if (err) lua_pushstring(L, err); else lua_pushnil(L);
            mc_call(L, 3);
        } else {
            lua_pop(L, 1);
        }
    }
    if (self != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, self);
}

static void relay_on_poll(uv_poll_t *h, int status, int events);

/* Polls each side for what it waits for now. */
static void relay_arm(mc_relay *r) {
    int i;
    for (i = 0; i < 2; i++) {
        int want = 0;
        relay_dir *in = &r->dir[i], *out = &r->dir[1 - i];
        if (i == 1 && r->connecting) want = UV_WRITABLE;
        else {
            if (!in->eof && in->len == 0 && in->inpipe == 0) want |= UV_READABLE;
            if (out->len > out->off || out->inpipe > 0) want |= UV_WRITABLE;
        }
        if (want != r->events[i]) {
            r->events[i] = want;
            if (want == 0) uv_poll_stop(&r->poll[i]);
            else uv_poll_start(&r->poll[i], want, relay_on_poll);
        }
    }
}

/* Writes what dir `d` holds to its destination. 0, or -1 with errno. */
static int relay_flush(mc_relay *r, int d) {
    relay_dir *x = &r->dir[d];
    int dst = r->fd[1 - d];
    if (d == 0 && r->connecting) return 0;
    while (x->off < x->len) {
        ssize_t n = send(dst, x->buf + x->off, x->len - x->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        x->off += (size_t)n;
        x->bytes += (uint64_t)n;
    }
    x->len = x->off = 0;
    while (x->inpipe > 0) {
        ssize_t n = splice(x->pipe[0], NULL, dst, NULL, x->inpipe, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        x->inpipe -= (size_t)n;
        x->bytes += (uint64_t)n;
    }
    if (x->eof && !x->shut) {
        x->shut = 1;
        shutdown(dst, SHUT_WR);
    }
    return 0;
}

/* Reads from side `s` into its direction's buffer. 0, -1 with errno, or -2 when side 0 sent more
** than it may. */
static int relay_read(mc_relay *r, int s) {
    relay_dir *x = &r->dir[s];
    int rounds;
    /* a bounded number of rounds, so a fast stream cannot hold the loop */
    for (rounds = 0; rounds < 16; rounds++) {
        ssize_t n;
        size_t want = x->pipe[0] >= 0 ? RELAY_PIPE : RELAY_BUF;
        if (x->eof || x->len > 0 || x->inpipe > 0) return 0;
        if (s == 0 && r->limited) {
            if (r->left == 0) {
                /* nothing more may come: an end of stream is fine, a byte is not */
                char c;
                n = recv(r->fd[0], &c, 1, MSG_PEEK);
                if (n < 0) {
                    if (errno == EINTR) continue;
                    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
                    return -1;
                }
                if (n > 0) return -2;
                x->eof = 1;
                if (relay_flush(r, s) != 0) return -1;
                return 0;
            }
            if (r->left < (uint64_t)want) want = (size_t)r->left;
        }
        if (x->pipe[0] >= 0) {
            /* in the kernel: socket to pipe to socket, no copy through this process */
            n = splice(r->fd[s], NULL, x->pipe[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (n < 0 && errno == EINVAL) {
                close(x->pipe[0]);
                close(x->pipe[1]);
                x->pipe[0] = x->pipe[1] = -1;
                continue;
            }
        } else {
            n = recv(r->fd[s], x->buf, want, 0);
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        if (n > 0 && s == 0 && r->limited) r->left -= (uint64_t)n;
        if (n == 0) x->eof = 1;
        else if (x->pipe[0] >= 0) x->inpipe = (size_t)n;
        else { x->len = (size_t)n; x->off = 0; }
        if (relay_flush(r, s) != 0) return -1;
    }
    return 0;
}

static void relay_on_poll(uv_poll_t *h, int status, int events) {
    mc_relay *r = (mc_relay *)h->data;
    int s = h == &r->poll[0] ? 0 : 1;
    char msg[128];
    if (r->finished) return;
    if (status < 0) {
        /* libuv tells an error on the socket (a refused connect, a reset) as EBADF: ask the socket */
        int e = 0;
        socklen_t len = sizeof e;
        if (getsockopt(r->fd[s], SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e != 0)
            snprintf(msg, sizeof msg, "%s: %s", s == 1 && r->connecting ? "connect" : "socket", strerror(e));
        else
            snprintf(msg, sizeof msg, "poll: %s", uv_strerror(status));
        relay_finish(r, msg, 1);
        return;
    }
    if (s == 1 && r->connecting) {
        int e = 0;
        socklen_t len = sizeof e;
        if (getsockopt(r->fd[1], SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
        if (e != 0) {
            snprintf(msg, sizeof msg, "connect: %s", strerror(e));
            relay_finish(r, msg, 1);
            return;
        }
        r->connecting = 0;
        events |= UV_WRITABLE;
    }
    if (events & UV_WRITABLE) {
        if (relay_flush(r, 1 - s) != 0) goto fail;
    }
    if (events & (UV_READABLE | UV_DISCONNECT)) {
        int rc = relay_read(r, s);
        if (rc == -2) {
            relay_finish(r, "excess", 1);
            return;
        }
        if (rc != 0) goto fail;
    }
    /* the other side may have become writable meanwhile: keep reading whatever it can take */
    if (relay_flush(r, 0) != 0 || relay_flush(r, 1) != 0) goto fail;
    if (r->dir[0].shut && r->dir[1].shut) {
        relay_finish(r, NULL, 1);
        return;
    }
    relay_arm(r);
    return;
fail:
    snprintf(msg, sizeof msg, "%s", strerror(errno));
    relay_finish(r, msg, 1);
}

static int l_relay_close(lua_State *L) {
    relay_box *box = (relay_box *)luaL_checkudata(L, 1, RELAY_MT);
    if (box->r != NULL && !box->r->finished) relay_finish(box->r, NULL, 0);
    return 0;
}

static int l_relay_tostring(lua_State *L) {
    relay_box *box = (relay_box *)luaL_checkudata(L, 1, RELAY_MT);
    lua_pushfstring(L, RELAY_MT " (%s)", box->r == NULL || box->r->finished ? "finished" : "running");
    return 1;
}

/*
** __gc and __close. A running relay is anchored, so __gc runs for one only while the state closes:
** it ends without a callback, and none may reach the closing state.
*/
static int l_relay_gc(lua_State *L) {
    relay_box *box = (relay_box *)luaL_checkudata(L, 1, RELAY_MT);
    mc_relay *r = box->r;
    if (r == NULL) return 0;
    box->r = NULL;
    r->life.holds--;   /* the userdata's */
    r->L = NULL;
    if (!r->finished) relay_finish(r, NULL, 0);
    relay_maybe_free(r);
    return 0;
}

static const char *const relay_keys[] = { "to_b", "connecting_b", "max_from_a", NULL };

static int relay_dup(lua_State *L, int idx) {
    lua_Integer fd = luaL_checkinteger(L, idx);
    int d, size = RELAY_SOCKBUF;
    if (fd < 0 || fd > INT_MAX) mc_raise(L, "INVALID_INPUT", "not a descriptor");
    d = fcntl((int)fd, F_DUPFD_CLOEXEC, 3);
    if (d < 0) return -1;
    if (fcntl(d, F_SETFL, fcntl(d, F_GETFL) | O_NONBLOCK) != 0) { close(d); return -1; }
    /* fixed buffers: what a peer that never reads can make the kernel hold for this relay */
    if (setsockopt(d, SOL_SOCKET, SO_SNDBUF, &size, sizeof size) != 0 ||
        setsockopt(d, SOL_SOCKET, SO_RCVBUF, &size, sizeof size) != 0) {
        int e = errno;
        close(d);
        errno = e;
        return -1;
    }
    return d;
}

/* core.relay(fd_a, fd_b, opts, cb) -> relay (see the top of this file). */
static int l_relay(lua_State *L) {
    uv_loop_t *loop = mc_loop(L);
    size_t prefix_len = 0;
    const char *prefix = NULL;
    int connecting = 0, i, rc;
    lua_Integer max_a = -1;
    relay_box *box;
    mc_relay *r;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        mc_check_keys(L, 3, relay_keys);
        prefix = mc_opt_lstr(L, 3, "to_b", &prefix_len);
        connecting = mc_opt_bool(L, 3, "connecting_b", 0);
        max_a = mc_opt_int(L, 3, "max_from_a", -1, 0, LLONG_MAX);
    }
    luaL_checktype(L, 4, LUA_TFUNCTION);
    box = (relay_box *)mc_handle_new(L, &relay_class);
    r = (mc_relay *)calloc(1, sizeof *r);
    if (r == NULL) return mc_raise_oom(L);
    r->fd[0] = r->fd[1] = -1;
    for (i = 0; i < 2; i++) {
        r->dir[i].pipe[0] = r->dir[i].pipe[1] = -1;
        if (pipe2(r->dir[i].pipe, O_NONBLOCK | O_CLOEXEC) == 0)
            (void)fcntl(r->dir[i].pipe[0], F_SETPIPE_SZ, (int)RELAY_PIPE);
        else
            r->dir[i].pipe[0] = r->dir[i].pipe[1] = -1;
    }
    r->cb_ref = r->self_ref = LUA_NOREF;
    r->life.holds++;   /* the userdata's */
    box->r = r;
    r->dir[0].buf = (char *)malloc(prefix_len > RELAY_BUF ? prefix_len : RELAY_BUF);
    r->dir[1].buf = (char *)malloc(RELAY_BUF);
    if (r->dir[0].buf == NULL || r->dir[1].buf == NULL) return mc_raise_oom(L);
    if (prefix_len > 0) {
        memcpy(r->dir[0].buf, prefix, prefix_len);
        r->dir[0].len = prefix_len;
    }
    r->connecting = connecting;
    if (max_a >= 0) {
        r->limited = 1;
        r->left = (uint64_t)max_a;
    }
    r->fd[0] = relay_dup(L, 1);
    if (r->fd[0] >= 0) r->fd[1] = relay_dup(L, 2);
    if (r->fd[0] < 0 || r->fd[1] < 0) {
        int e = errno;
        relay_finish(r, NULL, 0);
        return mc_fail(L, "IO_ERROR", "cannot take the descriptors: %s", strerror(e));
    }
    for (i = 0; i < 2; i++) {
        rc = uv_poll_init_socket(loop, &r->poll[i], r->fd[i]);
        if (rc != 0) {
            relay_finish(r, NULL, 0);
            return mc_fail(L, "IO_ERROR", "poll: %s", uv_strerror(rc));
        }
        r->poll[i].data = r;
        r->live[i] = 1;
        r->life.uv++;
    }
    r->L = mc_main(L);
    lua_pushvalue(L, 4);
    r->cb_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, -1);
    r->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    relay_arm(r);
    return 1;
}

static const luaL_Reg relay_methods[] = {
    {"close", l_relay_close},
    {NULL, NULL}
};

static const mc_class relay_class = { RELAY_MT, sizeof(relay_box), l_relay_gc, l_relay_tostring, relay_methods, NULL };

static void mc_open_net(lua_State *L) {
    mc_class_register(L, &relay_class);
    lua_pushcfunction(L, l_netns_socket);
    lua_setfield(L, -2, "netns_socket");
    lua_pushcfunction(L, l_relay);
    lua_setfield(L, -2, "relay");
}

/* }====================================================== */
