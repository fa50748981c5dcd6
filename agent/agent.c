/*
** agent.c: mayura-agent, the in-sandbox agent.
**
** A small static program put in every sandbox as its PID 1. It serves
** exec and file operations to the host over a unix stream socket, framed
** as in core/wire.h: a command costs a fork+exec and a socket round trip,
** file operations run in the sandbox's own mount view, a command's whole
** tree is stopped reliably, and the sandbox ends at its lifetime when the
** agent exits (PID 1 of a pid namespace takes everything with it).
**
**   mayura-agent (--fd N | --listen PATH [--peer-uid N]) --lifetime-ms MS [--workdir DIR]
**
** It serves one peer, the host: the descriptor of --fd, or the first
** connection to the socket of --listen, whose listener is then closed and
** unlinked. With --peer-uid the socket is made 0666 (the host may be
** another user than the agent's) and a connection whose peer is not that
** uid is closed at once, unanswered; without it the socket is 0600. The
** peer must say hello first and may send setup once (its env and workdir,
** and a lifetime_ms that may only shorten the lifetime: a sandbox started
** ahead of time gets the one asked for when it is handed out); a request out of that
** order, an unknown op or a malformed frame ends the connection, and the
** end of the connection ends the agent.
**
** Each command runs as a child subreaper (its orphans stay below it, so a
** timeout or cancel finds them all, see core/tree.h) under a syscall filter
** (seccomp, built once with libseccomp at start): what Docker's default
** profile refuses and more, each answered with EPERM. The agent itself is
** not filtered: a helper forked at start installs the filter once and
** starts the commands as the agent's children (see "The spawner"); without
** it, each command's process installs the filter just before execve. A
** command whose filter cannot be installed does not run.
**
** One thread, one poll(2) loop, SIGCHLD through a signalfd; every socket
** and pipe non-blocking. File operations run synchronously in the loop:
** they are short, and nothing in them waits on another process.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#ifndef MAYURA_AGENT_NO_FILTER
#include <seccomp.h>
#endif

#include "../core/wire.h"
#include "../core/tree.h"
#include "../core/files.h"

#define AGENT_VERSION "1"
#define TAG_VAR "MAYURA_EXEC"
#define READ_CHUNK 65536
#define DEFAULT_MAX_OUTPUT (1u << 20)
#define MAX_OUTPUT_LIMIT ((int64_t)WIRE_MAX_FRAME / 2 - 65536)
#define MAX_MS ((int64_t)1 << 40)
#define BASE_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

/* {======================================================
** State
** =======================================================*/

typedef struct outq {
    struct outq *next;
    unsigned char *data;
    size_t len, off;
} outq;

typedef struct conn {
    struct conn *next;
    int fd;
    int dead;                 /* closed; freed at the end of the loop turn */
    int pidx;                 /* its slot in this turn's pollfd array, or -1 */
    unsigned char *in;        /* bytes of the frame(s) being received */
    size_t in_len, in_size;
    outq *head, *tail;
    int said_hello, had_setup; /* the order of requests: hello first, setup at most once */
} conn;

typedef struct stream {
    int fd;                   /* -1 once closed */
    int which;                /* 1 stdout, 2 stderr: the `fd` of its chunks */
    unsigned char *data;      /* what is kept for the reply (not when streaming) */
    size_t len, size, cap;    /* len: bytes kept, or sent as chunks when streaming */
    int truncated;
} stream;

typedef struct exec {
    struct exec *next;
    conn *c;                  /* NULL once its connection closed: no reply then */
    uint32_t id;
    pid_t pid;
    char tag[80];             /* value of MAYURA_EXEC */
    stream out, err;
    int in_fd;
    unsigned char *in_data;
    size_t in_len, in_off;
    int exited, status;
    int streaming;            /* output goes to the host as chunks as it comes (see core/wire.h) */
    int timed_out, cancelled, killing;
    int64_t started, ended;   /* ms, CLOCK_MONOTONIC */
    int64_t deadline;         /* ms, 0 = none: timeout, grace or drain by `killing` */
    int64_t grace_ms, drain_ms;
    int pi_out, pi_err, pi_in; /* slots in this turn's pollfd array, or -1 */
} exec;

static conn *conns;
static exec *execs;
static int listen_fd = -1;
static const char *listen_path;
static long long peer_uid = -1; /* --peer-uid: the one uid a --listen peer may have; -1 any */
static int sig_fd = -1;
static char *workdir;
static char **setup_env;      /* "NAME=value" strings from setup */
static size_t setup_n;
static int64_t lifetime_end;
static int fd_mode;           /* serving one connection: its end ends the agent */
static pid_t spawner_pid = -1; /* the helper that starts commands under the filter, or -1 */
static int spawner_fd = -1;
static int shutting_down;
static char tag_prefix[48];   /* unique to this agent: every tag starts with it */
static unsigned long tag_counter;
static unsigned char scratch[READ_CHUNK];

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static const struct { int e; const char *name; } errno_names[] = {
    {EPERM, "EPERM"}, {ENOENT, "ENOENT"}, {ESRCH, "ESRCH"}, {EINTR, "EINTR"}, {EIO, "EIO"},
    {ENXIO, "ENXIO"}, {E2BIG, "E2BIG"}, {ENOEXEC, "ENOEXEC"}, {EBADF, "EBADF"},
    {ECHILD, "ECHILD"}, {EAGAIN, "EAGAIN"}, {ENOMEM, "ENOMEM"}, {EACCES, "EACCES"},
    {EFAULT, "EFAULT"}, {EBUSY, "EBUSY"}, {EEXIST, "EEXIST"}, {EXDEV, "EXDEV"},
    {ENODEV, "ENODEV"}, {ENOTDIR, "ENOTDIR"}, {EISDIR, "EISDIR"}, {EINVAL, "EINVAL"},
    {ENFILE, "ENFILE"}, {EMFILE, "EMFILE"}, {ETXTBSY, "ETXTBSY"}, {EFBIG, "EFBIG"},
    {ENOSPC, "ENOSPC"}, {ESPIPE, "ESPIPE"}, {EROFS, "EROFS"}, {EMLINK, "EMLINK"},
    {EPIPE, "EPIPE"}, {ENAMETOOLONG, "ENAMETOOLONG"}, {ENOTEMPTY, "ENOTEMPTY"},
    {ELOOP, "ELOOP"}, {EOVERFLOW, "EOVERFLOW"}, {EDQUOT, "EDQUOT"}, {ESTALE, "ESTALE"},
    {EOPNOTSUPP, "EOPNOTSUPP"}, {ENOSYS, "ENOSYS"}, {EILSEQ, "EILSEQ"},
};

static const char *errno_name(int e) {
    size_t i;
    for (i = 0; i < sizeof errno_names / sizeof errno_names[0]; i++)
        if (errno_names[i].e == e) return errno_names[i].name;
    return "EIO";
}

/* }====================================================== */

/* {======================================================
** Connections: output queue and replies
** =======================================================*/

static void conn_close(conn *c);

/* Writes what the socket takes now; closes the connection on an error. */
static void conn_flush(conn *c) {
    while (c->head != NULL && !c->dead) {
        outq *q = c->head;
        ssize_t n = write(c->fd, q->data + q->off, q->len - q->off);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_close(c);
            return;
        }
        q->off += (size_t)n;
        if (q->off == q->len) {
            c->head = q->next;
            if (c->head == NULL) c->tail = NULL;
            free(q->data);
            free(q);
        }
    }
}

/* Queues a built frame (takes b->data) and tries to send it at once. */
static void conn_send(conn *c, wire_buf *b) {
    outq *q;
    if (c == NULL || c->dead || wire_end(b) != 0) { free(b->data); b->data = NULL; return; }
    q = (outq *)calloc(1, sizeof *q);
    if (q == NULL) { free(b->data); b->data = NULL; conn_close(c); return; }
    q->data = b->data;
    q->len = b->len;
    b->data = NULL;
    if (c->tail != NULL) c->tail->next = q;
    else c->head = q;
    c->tail = q;
    conn_flush(c);
}

static void reply_error(conn *c, uint32_t id, const char *code, const char *fmt, ...) {
    wire_buf b = {0};
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    wire_begin(&b, id);
    wire_add_str(&b, "error", code);
    wire_add_str(&b, "message", msg);
    conn_send(c, &b);
}

static void reply_errno(conn *c, uint32_t id, int e, const char *what) {
    reply_error(c, id, errno_name(e), "%s: %s", what, strerror(e));
}

/* Sends a built reply, or 'too_large' when it could not be built (past the frame limit, or no memory). */
static void reply_send(conn *c, uint32_t id, wire_buf *b) {
    if (wire_end(b) != 0) {
        free(b->data);
        b->data = NULL;
        reply_error(c, id, "too_large", "the reply does not fit in a frame");
        return;
    }
    conn_send(c, b);
}

static void reply_ok(conn *c, uint32_t id, const char *key) {
    wire_buf b = {0};
    wire_begin(&b, id);
    wire_add_bool(&b, key, 1);
    conn_send(c, &b);
}

/* }====================================================== */

/* {======================================================
** Killing a tree (the same semantics as core/proc.c on the host)
** =======================================================*/

/* The exec's group (and its leader by pid until it has ended: before its setsid it leads no
** group yet), every process carrying the exec's tag, and while the command's own process
** lives, every process below it (it is a child subreaper: its orphans stay below it). */
static int signal_tree(exec *x, int sig) {
    char needle[128];
    size_t nlen = tree_needle(needle, sizeof needle, TAG_VAR, x->tag, 1);
    if (!x->exited) tree_signal_below(x->pid, sig);
    return tree_signal(x->pid, !x->exited, needle, nlen, sig);
}

/*
** SIGKILL the exec's whole tree, in passes until none is left: first, while
** the command's own process lives, everything below it (it is stopped
** meanwhile and takes the orphans: so also a process that cleared its
** environment and left the session is found); then it, its group and the
** tagged. After the command's own process ended (a kill_grace_ms whose
** SIGTERM it obeyed), its orphans have gone to the agent: then only the
** group and the tag find them.
*/
static void kill_tree(exec *x) {
    char needle[128];
    size_t nlen = tree_needle(needle, sizeof needle, TAG_VAR, x->tag, 1);
    if (!x->exited) tree_kill_below(x->pid);
    tree_kill(x->pid, !x->exited, needle, nlen);
}

/* Before exiting: every tree, and every process still carrying any tag of this agent. */
static void kill_everything(void) {
    char needle[96], prefix[64];
    exec *x;
    for (x = execs; x != NULL; x = x->next) {
        if (!x->exited) tree_kill_below(x->pid);   /* not PID 1 (on a host): nothing else ends those */
        tree_signal(x->pid, !x->exited, NULL, 0, SIGKILL);
    }
    /* "\0MAYURA_EXEC=<prefix>.": also processes that outlived a command's normal end */
    snprintf(prefix, sizeof prefix, "%s.", tag_prefix);
    tree_kill(0, 0, needle, tree_needle(needle, sizeof needle, TAG_VAR, prefix, 0));
}

static void listener_close(void) {
    if (listen_fd < 0) return;
    close(listen_fd);
    listen_fd = -1;
    unlink(listen_path);   /* may fail once the host closed the directory: nobody listens on it anyway */
}

static void agent_exit(void) {
    kill_everything();
    listener_close();
    exit(0);
}

/* }====================================================== */

/* {======================================================
** Exec
** =======================================================*/

static void stream_close(stream *s) {
    if (s->fd >= 0) { close(s->fd); s->fd = -1; }
}

static void stdin_close(exec *x) {
    if (x->in_fd >= 0) { close(x->in_fd); x->in_fd = -1; }
    free(x->in_data);
    x->in_data = NULL;
}

/* A chunk of a streaming exec's output, to the host at once (core/wire.h, "Streaming"). */
static void stream_send(exec *x, const stream *s, const unsigned char *p, size_t n) {
    wire_buf b = {0};
    if (x->c == NULL) return;
    wire_begin(&b, x->id);
    wire_add_bool(&b, "more", 1);
    wire_add_int(&b, "fd", s->which);
    wire_add_bytes(&b, "data", p, n);
    conn_send(x->c, &b);
}

/*
** Reads what the pipe has now; keeps up to the cap and drops the rest. A
** streaming exec keeps nothing: what is under the cap goes out as a chunk
** (read into the one static buffer: no allocation per read), the rest is
** dropped and marks the stream truncated.
*/
static void stream_read(exec *x, stream *s) {
    while (s->fd >= 0) {
        ssize_t n;
        if (x->streaming) {
            n = read(s->fd, scratch, sizeof scratch);
            if (n > 0) {
                size_t keep = s->cap - s->len < (size_t)n ? s->cap - s->len : (size_t)n;
                if (keep > 0) stream_send(x, s, scratch, keep);
                s->len += keep;
                if (keep < (size_t)n) s->truncated = 1;
            }
        } else if (s->len < s->cap) {
            size_t want = s->len + READ_CHUNK < s->cap ? s->len + READ_CHUNK : s->cap;
            if (want > s->size) {
                size_t ns = s->size ? s->size : 16384;
                unsigned char *nd;
                while (ns < want) ns *= 2;
                if (ns > s->cap) ns = s->cap;
                nd = (unsigned char *)realloc(s->data, ns);
                if (nd == NULL) { s->cap = s->len; continue; }   /* keep what we have */
                s->data = nd;
                s->size = ns;
            }
            n = read(s->fd, s->data + s->len, s->size - s->len);
            if (n > 0) s->len += (size_t)n;
        } else {
            n = read(s->fd, scratch, sizeof scratch);
            if (n > 0) s->truncated = 1;
        }
        if (n == 0) { stream_close(s); return; }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) stream_close(s);
            return;
        }
    }
}

static void stdin_write(exec *x) {
    while (x->in_fd >= 0 && x->in_off < x->in_len) {
        ssize_t n = write(x->in_fd, x->in_data + x->in_off, x->in_len - x->in_off);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            break;   /* EPIPE: the command stopped reading */
        }
        x->in_off += (size_t)n;
    }
    stdin_close(x);
}

static void exec_begin_kill(exec *x, int64_t now) {
    if (x->exited) return;
    if (x->grace_ms > 0 && x->killing == K_NONE) {
        signal_tree(x, SIGTERM);
        x->killing = K_GRACE;
        x->deadline = now + x->grace_ms;
        return;
    }
    x->killing = K_KILLED;
    x->deadline = 0;
    kill_tree(x);
}

/*
** What a command leaves in its process group after a normal end is killed
** SETTLE_MS later, not at once: a child that is about to move to a session
** of its own (`setsid server &`) may not have done so yet when the command
** returns, and must not be caught in between. A fork that fails for want of
** processes kills the waiting groups at once.
*/
#define SETTLE_MS 500
#define MAX_LEFTOVERS 256

static struct { pid_t pgid; int64_t at; } leftovers[MAX_LEFTOVERS];
static int nleftovers = 0;

/* Kills the groups whose time has come (all of them with until = INT64_MAX). */
static void leftovers_run(int64_t until) {
    int i, j = 0;
    for (i = 0; i < nleftovers; i++) {
        if (leftovers[i].at <= until) kill(-leftovers[i].pgid, SIGKILL);
        else leftovers[j++] = leftovers[i];
    }
    nleftovers = j;
}

static void leftovers_add(pid_t pgid, int64_t now) {
    if (nleftovers == MAX_LEFTOVERS) {   /* full: the oldest goes now */
        kill(-leftovers[0].pgid, SIGKILL);
        memmove(leftovers, leftovers + 1, (MAX_LEFTOVERS - 1) * sizeof leftovers[0]);
        nleftovers--;
    }
    leftovers[nleftovers].pgid = pgid;
    leftovers[nleftovers].at = now + SETTLE_MS;
    nleftovers++;
}

/* The command's own process ended (reaped). */
static void exec_exited(exec *x, int status, int64_t now) {
    x->exited = 1;
    x->status = status;
    x->ended = now;
    /* a timeout or cancel ends all it started; what is left of its group ends a little later */
    if (x->timed_out || x->cancelled) kill_tree(x);
    else leftovers_add(x->pid, now);
    stream_read(x, &x->out);
    stream_read(x, &x->err);
    x->deadline = 0;
    if (x->out.fd >= 0 || x->err.fd >= 0) {
        /* a process that left the group may still hold the pipes: wait a little, then stop */
        if (x->drain_ms > 0) {
            x->killing = K_DRAIN;
            x->deadline = now + x->drain_ms;
        } else {
            stream_close(&x->out);
            stream_close(&x->err);
        }
    }
}

static void exec_free(exec *x) {
    exec **pp;
    for (pp = &execs; *pp != NULL; pp = &(*pp)->next)
        if (*pp == x) { *pp = x->next; break; }
    stream_close(&x->out);
    stream_close(&x->err);
    stdin_close(x);
    free(x->out.data);
    free(x->err.data);
    free(x);
}

static void exec_reply(exec *x) {
    wire_buf b = {0};
    if (x->c == NULL) return;
    wire_begin(&b, x->id);
    if (!x->timed_out && !x->cancelled && WIFEXITED(x->status))
        wire_add_int(&b, "exit_code", WEXITSTATUS(x->status));
    if (WIFSIGNALED(x->status)) wire_add_int(&b, "signal", WTERMSIG(x->status));
    /* streamed, the output went out in chunks already */
    wire_add_bytes(&b, "stdout", x->out.data, x->streaming ? 0 : x->out.len);
    wire_add_bytes(&b, "stderr", x->err.data, x->streaming ? 0 : x->err.len);
    wire_add_bool(&b, "stdout_truncated", x->out.truncated);
    wire_add_bool(&b, "stderr_truncated", x->err.truncated);
    wire_add_bool(&b, "timed_out", x->timed_out);
    wire_add_bool(&b, "cancelled", x->cancelled);
    wire_add_int(&b, "duration_ms", x->ended - x->started);
    reply_send(x->c, x->id, &b);
}

/* Replies and frees every exec that is over: exited and both pipes done. */
static void exec_sweep(void) {
    exec *x = execs, *next;
    for (; x != NULL; x = next) {
        next = x->next;
        if (!x->exited || x->out.fd >= 0 || x->err.fd >= 0) continue;
        exec_reply(x);
        exec_free(x);
    }
}

static void exec_timer(exec *x, int64_t now) {
    if (x->deadline == 0 || now < x->deadline) return;
    x->deadline = 0;
    switch (x->killing) {
    case K_DRAIN:
        stream_read(x, &x->out);
        stream_read(x, &x->err);
        stream_close(&x->out);
        stream_close(&x->err);
        break;
    case K_GRACE:
        x->killing = K_KILLED;
        kill_tree(x);
        break;
    default:
        x->timed_out = 1;
        exec_begin_kill(x, now);
        break;
    }
}

/* Reaps every child that ended: the commands, and when PID 1 every orphan too. */
static void reap(void) {
    struct signalfd_siginfo si;
    int64_t now = now_ms();
    while (read(sig_fd, &si, sizeof si) > 0) {}
    for (;;) {
        int status;
        exec *x;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        if (pid == spawner_pid) {   /* killed from the sandbox: commands are forked here from now on */
            spawner_pid = -1;
            close(spawner_fd);
            spawner_fd = -1;
            continue;
        }
        for (x = execs; x != NULL; x = x->next)
            if (x->pid == pid && !x->exited) { exec_exited(x, status, now); break; }
    }
}

/* }====================================================== */

/* {======================================================
** Request fields
** =======================================================*/

/* Missing fields give def; a field of the wrong type is refused. Return 0 or -1. */
static int field_bytes(const wire_msg *m, const char *key, const unsigned char **p, size_t *len) {
    const wire_field *f = wire_find(m, key);
    if (f == NULL) return 0;
    if (f->type != WIRE_BYTES) return -1;
    *p = f->val;
    *len = f->len;
    return 0;
}

static int field_int(const wire_msg *m, const char *key, int64_t *v, int64_t lo, int64_t hi) {
    const wire_field *f = wire_find(m, key);
    int64_t x;
    if (f == NULL) return 0;
    if (f->type != WIRE_INT) return -1;
    x = wire_get_i64(f->val);
    if (x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

static int field_bool(const wire_msg *m, const char *key, int *v) {
    const wire_field *f = wire_find(m, key);
    if (f == NULL) return 0;
    if (f->type != WIRE_BOOL) return -1;
    *v = f->val[0];
    return 0;
}

/* A NUL-free copy of bytes, or NULL (no memory, or a NUL inside). */
static char *dup_cstr(const unsigned char *p, size_t len) {
    char *s;
    if (memchr(p, '\0', len) != NULL) return NULL;
    s = (char *)malloc(len + 1);
    if (s == NULL) return NULL;
    memcpy(s, p, len);
    s[len] = '\0';
    return s;
}

/*
** A request path as a C string: relative paths are relative to the workdir,
** "" is the workdir itself. Returns NULL with *err set: EINVAL for a NUL
** inside, ENAMETOOLONG, ENOMEM.
*/
static char *request_path(const unsigned char *p, size_t len, int *err) {
    size_t wl = strlen(workdir);
    char *s;
    if (memchr(p, '\0', len) != NULL) { *err = EINVAL; return NULL; }
    if (len > 0 && p[0] == '/') {
        if (len >= PATH_MAX) { *err = ENAMETOOLONG; return NULL; }
        s = dup_cstr(p, len);
    } else {
        if (wl + 1 + len >= PATH_MAX) { *err = ENAMETOOLONG; return NULL; }
        s = (char *)malloc(wl + len + 2);
        if (s != NULL) {
            memcpy(s, workdir, wl);
            s[wl] = '/';
            memcpy(s + wl + 1, p, len);
            s[wl + 1 + len] = '\0';
        }
    }
    if (s == NULL) *err = ENOMEM;
    return s;
}

/* The "path" field, resolved; on failure the reply is sent and NULL returned. */
static char *path_field(conn *c, const wire_msg *m) {
    const wire_field *f = wire_find(m, "path");
    char *s;
    int e = 0;
    if (f == NULL || f->type != WIRE_BYTES) {
        reply_error(c, m->id, "invalid", "field 'path' is missing or not bytes");
        return NULL;
    }
    s = request_path(f->val, f->len, &e);
    if (s == NULL) {
        if (e == EINVAL) reply_error(c, m->id, "invalid", "field 'path' contains a NUL byte");
        else reply_errno(c, m->id, e, "path");
    }
    return s;
}

/* {------------------------------------------------------
** Environments: a list of "NAME=value" where a later name replaces an earlier one
** -------------------------------------------------------*/

typedef struct envlist {
    char **v;
    size_t n, cap;
} envlist;

static void env_free(envlist *e) {
    size_t i;
    for (i = 0; i < e->n; i++) free(e->v[i]);
    free(e->v);
    e->v = NULL;
    e->n = e->cap = 0;
}

/* Adds (takes) s; returns 0 or -1 when out of memory (s is freed then). */
static int env_put(envlist *e, char *s) {
    size_t i, nl = (size_t)(strchr(s, '=') - s);
    for (i = 0; i < e->n; i++)
        if (strncmp(e->v[i], s, nl + 1) == 0) { free(e->v[i]); e->v[i] = s; return 0; }
    if (e->n + 2 > e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 16;
        char **nv = (char **)realloc(e->v, nc * sizeof *nv);
        if (nv == NULL) { free(s); return -1; }
        e->v = nv;
        e->cap = nc;
    }
    e->v[e->n++] = s;
    e->v[e->n] = NULL;
    return 0;
}

static int env_put_str(envlist *e, const char *s) {
    char *d = strdup(s);
    if (d == NULL) return -1;
    return env_put(e, d);
}

/*
** Adds the pairs of a WIRE_MAP field. Returns 0, -1 when a name or value
** is not valid (empty name, '=' in a name, NUL anywhere), -2 out of memory.
** The tag variable cannot be set this way.
*/
static int env_put_map(envlist *e, const wire_field *f) {
    size_t off = 0, kl, vl;
    const unsigned char *k, *v;
    while (wire_next_item(f, &off, &k, &kl)) {
        char *s;
        if (!wire_next_item(f, &off, &v, &vl)) return -1;
        if (kl == 0 || memchr(k, '=', kl) != NULL || memchr(k, '\0', kl) != NULL ||
            memchr(v, '\0', vl) != NULL)
            return -1;
        if (kl == sizeof TAG_VAR - 1 && memcmp(k, TAG_VAR, kl) == 0) continue;
        s = (char *)malloc(kl + vl + 2);
        if (s == NULL) return -2;
        memcpy(s, k, kl);
        s[kl] = '=';
        memcpy(s + kl + 1, v, vl);
        s[kl + 1 + vl] = '\0';
        if (env_put(e, s) != 0) return -2;
    }
    return 0;
}

/* }------------------------------------------------------ */

/* }====================================================== */

/* {======================================================
** The syscall filter of commands
** =======================================================*/

/*
** Built once at start (libseccomp, exported as BPF), installed by the
** spawner for the commands it starts, or by a command's own process just
** before execve, so every command and all it starts run under it while the
** agent does not. Everything is allowed but what is listed here, which gets
** EPERM:
**  - what Docker's default profile refuses to a process without
**    capabilities: mounts, modules, kexec, reboot, swap, clocks, accounting,
**    quotas, keyrings, bpf, perf events, userfaultfd, file handles, raw I/O
**    ports, vm86, the kernel log, NUMA memory policy, new namespaces (unshare,
**    setns, clone with a namespace flag; clone3, whose flags a filter cannot
**    read, answers ENOSYS so that the C library falls back to clone), chroot,
**    host and domain names, kcmp, pidfd_getfd, process_madvise, and
**    personality but for the ordinary values. ptrace and process_vm_* stay,
**    as there (the kernel re-checks the filter after a tracer's changes, and
**    the agent is not dumpable, so it cannot be traced);
**  - io_uring, vsock sockets, netlink sockets but for NETLINK_ROUTE;
**  - what would reach processes a command does not own: setpriority but of
**    itself, sched_set{scheduler,param,attr,affinity} and a new prlimit64
**    but on itself (pid 0), ioprio_set but on itself, TIOCSTI, and clearing
**    its child subreaper flag (see kill_tree);
**  - every system call of another ABI (i386 through int 0x80, x32).
** Arguments the kernel reads as 32-bit ints are compared on their low 32
** bits where a match allows a call the kernel would see as another.
*/
static struct sock_filter *filter_code;   /* NULL when it could not be built */
static const char *filter_why = "it was not built";
static int filter_inherited;              /* in the spawner: its children have the filter already */

#ifndef MAYURA_AGENT_NO_FILTER
static unsigned short filter_len;
#define IOPRIO_WHO_PROCESS_ 1   /* linux/ioprio.h */
/* personality(2) outside its safe values, which one libseccomp rule cannot say: a hand-written
** prefix of the program that allows 0, PER_LINUX32, UNAME26, both, and the query 0xffffffff. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG0_LOW offsetof(struct seccomp_data, args[0])
#else
#define ARG0_LOW (offsetof(struct seccomp_data, args[0]) + 4)
#endif
#define PREFIX_LEN 12

static void filter_prefix(struct sock_filter *f, uint32_t arch) {
    const struct sock_filter prefix[PREFIX_LEN] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, 10),          /* else to the rest */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 0, 8),                       /* else to the rest */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG0_LOW),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x8, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20000, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20008, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    memcpy(f, prefix, sizeof prefix);
}

#define EPERM_ SCMP_ACT_ERRNO(EPERM)
#define LOW32(arg, v) SCMP_CMP(arg, SCMP_CMP_MASKED_EQ, 0xffffffffu, (v))

/* The rules; returns 0 or a negative errno. System calls this architecture lacks are skipped. */
static int filter_rules(scmp_filter_ctx ctx) {
    static const int denied[] = {
        SCMP_SYS(mount), SCMP_SYS(umount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot),
        SCMP_SYS(fsopen), SCMP_SYS(fsconfig), SCMP_SYS(fsmount), SCMP_SYS(fspick), SCMP_SYS(move_mount),
        SCMP_SYS(open_tree), SCMP_SYS(mount_setattr), SCMP_SYS(swapon), SCMP_SYS(swapoff),
        SCMP_SYS(reboot), SCMP_SYS(kexec_load), SCMP_SYS(kexec_file_load), SCMP_SYS(init_module),
        SCMP_SYS(finit_module), SCMP_SYS(delete_module), SCMP_SYS(create_module),
        SCMP_SYS(get_kernel_syms), SCMP_SYS(query_module), SCMP_SYS(acct), SCMP_SYS(settimeofday),
        SCMP_SYS(stime), SCMP_SYS(clock_settime), SCMP_SYS(clock_adjtime), SCMP_SYS(adjtimex),
        SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(keyctl), SCMP_SYS(add_key),
        SCMP_SYS(request_key), SCMP_SYS(bpf), SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd),
        SCMP_SYS(open_by_handle_at), SCMP_SYS(name_to_handle_at), SCMP_SYS(lookup_dcookie),
        SCMP_SYS(quotactl), SCMP_SYS(quotactl_fd), SCMP_SYS(nfsservctl), SCMP_SYS(iopl),
        SCMP_SYS(ioperm), SCMP_SYS(vm86), SCMP_SYS(vm86old), SCMP_SYS(syslog), SCMP_SYS(uselib),
        SCMP_SYS(fanotify_init), SCMP_SYS(mbind), SCMP_SYS(move_pages), SCMP_SYS(migrate_pages),
        SCMP_SYS(set_mempolicy), SCMP_SYS(get_mempolicy), SCMP_SYS(set_mempolicy_home_node),
        SCMP_SYS(_sysctl), SCMP_SYS(sysfs), SCMP_SYS(ustat), SCMP_SYS(vhangup),
        SCMP_SYS(sethostname), SCMP_SYS(setdomainname), SCMP_SYS(kcmp), SCMP_SYS(pidfd_getfd),
        SCMP_SYS(process_madvise), SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter),
        SCMP_SYS(io_uring_register),
    };
    static const unsigned long ns_flags[] = {
        CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP,
    };
    static const int not_others[] = {
        SCMP_SYS(sched_setscheduler), SCMP_SYS(sched_setparam), SCMP_SYS(sched_setattr),
        SCMP_SYS(sched_setaffinity),
    };
    size_t i;
    int rc;
#define ADD(nr, ...) do { if ((nr) >= 0 && (rc = seccomp_rule_add(ctx, __VA_ARGS__)) != 0) return rc; } while (0)
    for (i = 0; i < sizeof denied / sizeof denied[0]; i++) ADD(denied[i], EPERM_, denied[i], 0);
    ADD(SCMP_SYS(clone3), SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    for (i = 0; i < sizeof ns_flags / sizeof ns_flags[0]; i++)
        ADD(SCMP_SYS(clone), EPERM_, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    ADD(SCMP_SYS(socket), EPERM_, SCMP_SYS(socket), 1, LOW32(0, AF_VSOCK));
    ADD(SCMP_SYS(socket), EPERM_, SCMP_SYS(socket), 2, LOW32(0, AF_NETLINK), SCMP_A2(SCMP_CMP_NE, NETLINK_ROUTE));
    ADD(SCMP_SYS(socketpair), EPERM_, SCMP_SYS(socketpair), 1, LOW32(0, AF_VSOCK));
    ADD(SCMP_SYS(ioctl), EPERM_, SCMP_SYS(ioctl), 1, LOW32(1, TIOCSTI));
    ADD(SCMP_SYS(setpriority), EPERM_, SCMP_SYS(setpriority), 1, SCMP_A0(SCMP_CMP_NE, PRIO_PROCESS));
    ADD(SCMP_SYS(setpriority), EPERM_, SCMP_SYS(setpriority), 1, SCMP_A1(SCMP_CMP_NE, 0));
    for (i = 0; i < sizeof not_others / sizeof not_others[0]; i++)
        ADD(not_others[i], EPERM_, not_others[i], 1, SCMP_A0(SCMP_CMP_NE, 0));
    ADD(SCMP_SYS(prlimit64), EPERM_, SCMP_SYS(prlimit64), 2, SCMP_A0(SCMP_CMP_NE, 0), SCMP_A2(SCMP_CMP_NE, 0));
    ADD(SCMP_SYS(ioprio_set), EPERM_, SCMP_SYS(ioprio_set), 1, SCMP_A0(SCMP_CMP_NE, IOPRIO_WHO_PROCESS_));
    ADD(SCMP_SYS(ioprio_set), EPERM_, SCMP_SYS(ioprio_set), 1, SCMP_A1(SCMP_CMP_NE, 0));
    ADD(SCMP_SYS(prctl), EPERM_, SCMP_SYS(prctl), 2, LOW32(0, PR_SET_CHILD_SUBREAPER), SCMP_A1(SCMP_CMP_EQ, 0));
#undef ADD
    return 0;
}

/* Builds the filter program; on failure leaves filter_code NULL and says why in filter_why. */
static void filter_build(void) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    struct sock_filter *code = NULL;
    off_t size;
    int fd = -1;
    if (ctx == NULL) { filter_why = "libseccomp cannot start a filter"; return; }
    if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM)) != 0 ||
        filter_rules(ctx) != 0) {
        filter_why = "libseccomp refused a rule";
        goto done;
    }
    seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);   /* a binary tree of syscalls, where supported */
    fd = memfd_create("mayura-filter", MFD_CLOEXEC);
    if (fd < 0 || seccomp_export_bpf(ctx, fd) != 0 || (size = lseek(fd, 0, SEEK_END)) <= 0 ||
        size % sizeof *code != 0 || size / sizeof *code + PREFIX_LEN > BPF_MAXINSNS ||
        lseek(fd, 0, SEEK_SET) != 0) {
        filter_why = "libseccomp cannot export the filter";
        goto done;
    }
    code = (struct sock_filter *)malloc((size_t)size + PREFIX_LEN * sizeof *code);
    if (code == NULL) { filter_why = "out of memory"; goto done; }
    filter_prefix(code, seccomp_arch_native());
    if (read(fd, code + PREFIX_LEN, (size_t)size) != (ssize_t)size) {
        free(code);
        filter_why = "libseccomp cannot export the filter";
        goto done;
    }
    filter_code = code;
    filter_len = (unsigned short)(size / sizeof *code + PREFIX_LEN);
done:
    if (fd >= 0) close(fd);
    seccomp_release(ctx);
}
#endif

/* In a command's process before execve: installs the filter. Returns 0, or -1 with errno set. */
static int filter_install(void) {
#ifdef MAYURA_AGENT_NO_FILTER
    return 0;   /* a build for the benchmark that measures what the filter costs, never shipped */
#else
    struct sock_fprog prog;
    if (filter_code == NULL) { errno = ENOSYS; return -1; }
    prog.len = filter_len;
    prog.filter = filter_code;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0) return 0;
    if (errno == ENOSYS && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0) return 0;
    return -1;
#endif
}

/* }====================================================== */

/* {======================================================
** Requests
** =======================================================*/

static void op_hello(conn *c, const wire_msg *m) {
    wire_buf b = {0};
    wire_begin(&b, m->id);
    wire_add_str(&b, "version", AGENT_VERSION);
    wire_add_int(&b, "pid", getpid());
    wire_add_int(&b, "uid", getuid());
    conn_send(c, &b);
}

static void op_setup(conn *c, const wire_msg *m) {
    const wire_field *fe = wire_find(m, "env");
    const wire_field *fw = wire_find(m, "workdir");
    envlist e = {0};
    char *wd = NULL;
    size_t i;
    int rc;
    int64_t life = 0;
    if (field_int(m, "lifetime_ms", &life, 1, MAX_MS) != 0) {
        reply_error(c, m->id, "invalid", "field 'lifetime_ms' must be an int from 1");
        return;
    }
    if (fe != NULL && fe->type != WIRE_MAP) {
        reply_error(c, m->id, "invalid", "field 'env' must be a map");
        return;
    }
    if (fw != NULL) {
        int err = 0;
        if (fw->type != WIRE_BYTES || fw->len == 0) {
            reply_error(c, m->id, "invalid", "field 'workdir' must be non-empty bytes");
            return;
        }
        wd = request_path(fw->val, fw->len, &err);
        if (wd == NULL) {
            if (err == EINVAL) reply_error(c, m->id, "invalid", "field 'workdir' contains a NUL byte");
            else reply_errno(c, m->id, err, "workdir");
            return;
        }
    }
    for (i = 0; i < setup_n; i++)
        if (env_put_str(&e, setup_env[i]) != 0) goto nomem;
    if (fe != NULL) {
        rc = env_put_map(&e, fe);
        if (rc == -1) {
            env_free(&e);
            free(wd);
            reply_error(c, m->id, "invalid", "field 'env' has a name or value that is not valid");
            return;
        }
        if (rc != 0) goto nomem;
    }
    for (i = 0; i < setup_n; i++) free(setup_env[i]);
    free(setup_env);
    setup_env = e.v;
    setup_n = e.n;
    if (life > 0 && now_ms() + life < lifetime_end) lifetime_end = now_ms() + life;
    if (wd != NULL) {
        free(workdir);
        workdir = wd;
        if (chdir(workdir) != 0) { /* it may be made later; commands chdir for themselves */ }
    }
    reply_ok(c, m->id, "ok");
    return;
nomem:
    env_free(&e);
    free(wd);
    reply_errno(c, m->id, ENOMEM, "setup");
}

/*
** Signals whose disposition is not the default in the agent (SIG_IGN: what it
** ignores, what its launcher left ignored), found once at start: a command's
** process resets only these (a handler is reset by execve anyway), not all 64.
*/
static int ignored_sigs[NSIG];
static int nignored;

static void ignored_sigs_find(void) {
    int sig;
    nignored = 0;
    for (sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL) ignored_sigs[nignored++] = sig;
    }
}

/* The command's process no longer shielded from the OOM killer (the launcher may shield the agent). */
static void oom_unshield(void) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "0\n", 2) < 0) {}
        close(fd);
    }
}

/*
** The child between fork and exec: never returns. Started by the spawner it
** may share the spawner's memory (clone with CLONE_VM | CLONE_VFORK, the
** spawner waiting meanwhile): so it only changes what is its own (descriptors,
** dispositions, mask, cwd, session) and allocates nothing.
*/
static void child_run(char **argv, char **envp, const char *cwd, int in_fd, int out_fd, int err_fd) {
    sigset_t none;
    int i;
    char msg[512];
    int e, n;
    setsid();
    /* the spawner did this once for itself, and its commands inherit it */
    if (!filter_inherited) oom_unshield();
    for (i = 0; i < nignored; i++) signal(ignored_sigs[i], SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (in_fd < 0) {
        in_fd = open("/dev/null", O_RDONLY);
        if (in_fd < 0) {
            int p[2];   /* no /dev/null in the image: an empty pipe reads as EOF too */
            if (pipe(p) == 0) { close(p[1]); in_fd = p[0]; }
        }
    }
    /* move the sources above 2 first, so that one dup2 cannot clobber another's source */
    if (in_fd >= 0 && in_fd < 3) in_fd = fcntl(in_fd, F_DUPFD, 3);
    if (out_fd < 3) out_fd = fcntl(out_fd, F_DUPFD, 3);
    if (err_fd < 3) err_fd = fcntl(err_fd, F_DUPFD, 3);
    if (in_fd >= 0) dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    if (chdir(cwd) != 0) {
        e = errno;
        n = snprintf(msg, sizeof msg, "mayura-agent: %s: %s\n", cwd, strerror(e));
        if (n > 0 && write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0) {}
        _exit(126);
    }
    if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
        int fd, maxfd = (int)sysconf(_SC_OPEN_MAX);
        if (maxfd < 0 || maxfd > 65536) maxfd = 65536;
        for (fd = 3; fd < maxfd; fd++) close(fd);
    }
    /* its orphans reparent to it, not to the agent (kept across execve; see kill_tree) */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* last: nothing of the agent's own runs under the filter (started by the spawner, it has it) */
    if (!filter_inherited && filter_install() != 0) {
        e = errno;
        n = snprintf(msg, sizeof msg, "mayura-agent: cannot install the syscall filter (%s: %s); "
                     "the command does not run\n", filter_code == NULL ? filter_why : "seccomp", strerror(e));
        if (n > 0 && write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0) {}
        _exit(126);
    }
    /* execvpe looks PATH up in the caller's environment: make it the command's */
    environ = envp;
    execvpe(argv[0], argv, envp);
    e = errno;
    n = snprintf(msg, sizeof msg, "mayura-agent: %s: %s\n", argv[0], strerror(e));
    if (n > 0 && write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0) {}
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

/* {======================================================
** The spawner: commands start under a filter installed once
** =======================================================*/

#ifndef MAYURA_AGENT_NO_FILTER
/*
** Installing a filter costs a process about a tenth of a fork+exec of
** `true` (the kernel compiles, checks and later frees it for each), while a
** filter inherited at fork costs nothing. So a helper forked at start (then
** small) installs the filter on itself and starts each command with
** clone(CLONE_PARENT): the command is the agent's child as if the agent had
** forked it (reaped, signalled and timed alike) and shares the helper's
** filter; the agent stays unfiltered. The helper is not dumpable (nothing
** can trace it) but code in the sandbox, of its uid, can signal it: it is
** sent SIGCONT before each command, and once it is gone (killed, or no
** answer within SPAWN_WAIT_MS) it is not started again: commands are then
** forked by the agent, each installing the filter itself (child_run). A
** command whose start it took but did not confirm is killed by its tag and
** fails with EAGAIN, so that no command ever runs twice.
**
** A job: a spawn_head with the descriptors (stdin when has_in, stdout,
** stderr) attached, then len bytes: the cwd, argc arguments and envc
** variables, each ending in a NUL. The answer: an int32, the pid or -errno.
*/
#define SPAWN_WAIT_MS 2000
#define SPAWN_SLICE_MS 20   /* see spawner_wait */
#define SPAWN_MAX_JOB (4u << 20)   /* a larger one is forked by the agent (execve would refuse it anyway) */

typedef struct spawn_head {
    uint32_t len, argc, envc;
    int32_t has_in;
} spawn_head;

/* Reads exactly len bytes (blocking); 0, or -1 at EOF or an error. */
static int read_full(int fd, void *p, size_t len) {
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p = (char *)p + n;
        len -= (size_t)n;
    }
    return 0;
}

/* Splits n NUL-ended strings off *p (of *left bytes) into v (n + 1 slots). Returns 0 or -1. */
static int split_strings(char **p, size_t *left, char **v, uint32_t n) {
    uint32_t i;
    for (i = 0; i < n; i++) {
        char *end = (char *)memchr(*p, '\0', *left);
        if (end == NULL) return -1;
        v[i] = *p;
        *left -= (size_t)(end - *p) + 1;
        *p = end + 1;
    }
    v[n] = NULL;
    return 0;
}

/*
** buf (of *cap bytes) grown to at least want, or NULL (buf is then left as it
** was). Buffers only grow, so a steady load allocates nothing.
*/
static void *grow(void *buf, size_t *cap, size_t want) {
    void *nb;
    size_t nc;
    if (want <= *cap) return buf;
    nc = *cap ? *cap : 4096;
    while (nc < want) nc *= 2;
    nb = realloc(buf, nc);
    if (nb == NULL) return NULL;
    *cap = nc;
    return nb;
}

/*
** The spawner starts a command with clone(CLONE_VM | CLONE_VFORK | CLONE_PARENT):
** no copy of its page tables, and it waits until the command's execve (or its
** end). The child runs on a stack of its own, mapped once with a guard page
** below it, so an overflow faults instead of writing over the spawner. A job
** with more words than SPAWN_VM_MAX_WORDS (execvpe may put a copy of argv on
** that stack) is started with a plain clone instead.
*/
#define SPAWN_STACK (256u << 10)
#define SPAWN_VM_MAX_WORDS 4096
static unsigned char *spawn_stack;   /* its lowest usable byte; NULL: no such stack, plain clone */

typedef struct spawn_args {
    char **argv, **envp;
    const char *cwd;
    int in_fd, out_fd, err_fd;
} spawn_args;

static int spawn_child(void *p) {
    spawn_args *a = (spawn_args *)p;
    child_run(a->argv, a->envp, a->cwd, a->in_fd, a->out_fd, a->err_fd);
    return 127;
}

static void spawn_stack_map(void) {
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *m;
    if (page <= 0) return;
    m = (unsigned char *)mmap(NULL, SPAWN_STACK + (size_t)page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return;
    if (mprotect(m, (size_t)page, PROT_NONE) != 0) { munmap(m, SPAWN_STACK + (size_t)page); return; }
    spawn_stack = m + page;
}

/* The helper's life: jobs until the agent's end closes. Never returns. */
static void spawner_main(int fd, pid_t agent) __attribute__((noreturn));
static void spawner_main(int fd, pid_t agent) {
    char *data = NULL, **vec = NULL;
    size_t data_cap = 0, vec_cap = 0;
    if (fd != 3 && dup2(fd, 3) != 3) _exit(1);
    fd = 3;
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0) {
        int i;
        for (i = 4; i < 65536; i++) close(i);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    /* once for all its commands, which inherit it: the agent's shield is not theirs */
    oom_unshield();
    spawn_stack_map();
    /* room for a common job at once: the first commands allocate nothing either */
    if ((data = (char *)grow(NULL, &data_cap, 65536)) == NULL ||
        (vec = (char **)grow(NULL, &vec_cap, 1024 * sizeof *vec)) == NULL)
        _exit(1);
    if (getppid() != agent || filter_install() != 0) _exit(1);
    filter_inherited = 1;
    if (write(fd, "R", 1) != 1) _exit(1);   /* ready */
    for (;;) {
        spawn_head h;
        char cbuf[CMSG_SPACE(3 * sizeof(int))], *p, *cwd, **argv, **envp;
        struct iovec iov[2];
        struct msghdr mh;
        struct cmsghdr *cm;
        int fds[3] = { -1, -1, -1 }, nfds = 0, i;
        int32_t answer = -EINVAL;
        size_t left, got;
        ssize_t n;
        memset(&mh, 0, sizeof mh);
        /* the head, and as much of the data as the buffer takes, in one call */
        iov[0].iov_base = &h;
        iov[0].iov_len = sizeof h;
        iov[1].iov_base = data;
        iov[1].iov_len = data_cap;
        mh.msg_iov = iov;
        mh.msg_iovlen = 2;
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof cbuf;
        do n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
        if (n <= 0) _exit(0);   /* the agent is gone */
        for (cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                if (nfds > 3) nfds = 3;
                memcpy(fds, CMSG_DATA(cm), (size_t)nfds * sizeof(int));
            }
        if ((size_t)n < sizeof h || (mh.msg_flags & MSG_CTRUNC) || h.len > SPAWN_MAX_JOB || h.argc == 0 ||
            (size_t)h.argc + h.envc > h.len || nfds != (h.has_in ? 3 : 2) || (size_t)n - sizeof h > h.len)
            _exit(1);   /* not the agent's: nothing of it can be trusted */
        got = (size_t)n - sizeof h;
        if (got < h.len) {
            /* a larger job than the buffer: grow it (keeping what came), read the rest */
            if ((data = (char *)grow(data, &data_cap, h.len)) == NULL || read_full(fd, data + got, h.len - got) != 0)
                _exit(1);
        }
        /* out of memory, it ends: the agent then forks commands itself */
        if ((vec = (char **)grow(vec, &vec_cap, ((size_t)h.argc + h.envc + 2) * sizeof *vec)) == NULL) _exit(1);
        argv = vec;
        envp = vec + h.argc + 1;
        cwd = data;
        p = (char *)memchr(data, '\0', h.len);
        if (p != NULL) {
            left = h.len - (size_t)(p - data) - 1;
            p++;
            if (split_strings(&p, &left, argv, h.argc) == 0 && split_strings(&p, &left, envp, h.envc) == 0) {
                spawn_args a;
                pid_t pid;
                a.argv = argv;
                a.envp = envp;
                a.cwd = cwd;
                a.in_fd = h.has_in ? fds[0] : -1;
                a.out_fd = fds[nfds - 2];
                a.err_fd = fds[nfds - 1];
                if (spawn_stack != NULL && (size_t)h.argc + h.envc <= SPAWN_VM_MAX_WORDS) {
                    pid = clone(spawn_child, spawn_stack + SPAWN_STACK,
                                CLONE_VM | CLONE_VFORK | CLONE_PARENT | SIGCHLD, &a);
                } else {
                    pid = (pid_t)syscall(SYS_clone, (unsigned long)(CLONE_PARENT | SIGCHLD), 0, NULL, NULL, 0);
                    if (pid == 0) spawn_child(&a);
                }
                answer = pid > 0 ? (int32_t)pid : -errno;
            }
        }
        for (i = 0; i < nfds; i++) close(fds[i]);
        if (write(fd, &answer, sizeof answer) != (ssize_t)sizeof answer) _exit(1);
    }
}

/* Waits until fd is ready for ev or the deadline passes; 0 or -1. */
static int wait_fd(int fd, short ev, int64_t deadline) {
    for (;;) {
        struct pollfd pf = { fd, ev, 0 };
        int64_t left = deadline - now_ms();
        int rc;
        if (left <= 0) return -1;
        rc = poll(&pf, 1, (int)left);
        if (rc > 0) return (pf.revents & ev) ? 0 : -1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

static void spawner_stop(void) {
    if (spawner_pid > 0) kill(spawner_pid, SIGKILL);   /* reaped as any child */
    if (spawner_fd >= 0) close(spawner_fd);
    spawner_pid = -1;
    spawner_fd = -1;
}

/* Forks the helper (at start: the agent is small then). */
static void spawner_start(void) {
    int sv[2];
    pid_t agent = getpid(), pid;
    if (filter_code == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    pid = fork();
    if (pid == 0) {
        close(sv[0]);
        spawner_main(sv[1], agent);
    }
    close(sv[1]);
    if (pid < 0) { close(sv[0]); return; }
    {
        /* blocking, SPAWN_SLICE_MS a call at most: the answer is read at once, without a poll first */
        struct timeval tv = { 0, SPAWN_SLICE_MS * 1000 };
        if (setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
            setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
            set_nonblock(sv[0]);
    }
    spawner_pid = pid;
    spawner_fd = sv[0];
    {
        /* it says when its filter is on; one that cannot install it is not used */
        char ready = 0;
        int64_t deadline = now_ms() + SPAWN_WAIT_MS;
        ssize_t n;
        while ((n = read(spawner_fd, &ready, 1)) < 0 && (errno == EINTR ||
               (errno == EAGAIN && wait_fd(spawner_fd, POLLIN, deadline) == 0))) {}
        if (n != 1 || ready != 'R') spawner_stop();
    }
}

/*
** Starts a command through the helper. Returns its pid; -1 with errno when
** it could not start (no process left, say); -2 when the helper is not
** there or did not take the job: the caller forks the command itself.
*/
/*
** Between a job and its answer the helper may be stopped again (the command
** it just started can stop it before it answers: with CLONE_VFORK it answers
** only once the command runs): every SPAWN_SLICE_MS without progress it is
** sent SIGCONT, until SPAWN_WAIT_MS have passed. Returns 0 to go on, -1 past
** the deadline.
*/
static int spawner_wait(short ev, int64_t deadline) {
    int64_t now = now_ms();
    if (now >= deadline) return -1;
    kill(spawner_pid, SIGCONT);
    wait_fd(spawner_fd, ev, now + SPAWN_SLICE_MS < deadline ? now + SPAWN_SLICE_MS : deadline);
    return 0;
}

static char *job_buf;      /* the agent's side of a job, grown as needed, never freed */
static size_t job_cap;

static pid_t spawner_run(char **argv, char **envp, const char *cwd, int in_fd, int out_fd, int err_fd,
                         const char *tag) {
    spawn_head h;
    size_t len = strlen(cwd) + 1, at, i;
    char cbuf[CMSG_SPACE(3 * sizeof(int))], *data;
    struct iovec iov[2];
    struct msghdr mh;
    struct cmsghdr *cm;
    int fds[3], nfds = 0;
    int32_t answer;
    int64_t deadline = now_ms() + SPAWN_WAIT_MS;
    ssize_t n;
    if (spawner_fd < 0) return -2;
    memset(&h, 0, sizeof h);
    for (i = 0; argv[i] != NULL; i++, h.argc++) len += strlen(argv[i]) + 1;
    for (i = 0; envp[i] != NULL; i++, h.envc++) len += strlen(envp[i]) + 1;
    if (len > SPAWN_MAX_JOB || (data = (char *)grow(job_buf, &job_cap, len)) == NULL) return -2;
    job_buf = data;
    at = 0;
    memcpy(data, cwd, strlen(cwd) + 1);
    at += strlen(cwd) + 1;
    for (i = 0; argv[i] != NULL; i++) { memcpy(data + at, argv[i], strlen(argv[i]) + 1); at += strlen(argv[i]) + 1; }
    for (i = 0; envp[i] != NULL; i++) { memcpy(data + at, envp[i], strlen(envp[i]) + 1); at += strlen(envp[i]) + 1; }
    h.len = (uint32_t)len;
    h.has_in = in_fd >= 0;
    if (in_fd >= 0) fds[nfds++] = in_fd;
    fds[nfds++] = out_fd;
    fds[nfds++] = err_fd;
    memset(&mh, 0, sizeof mh);
    memset(cbuf, 0, sizeof cbuf);
    iov[0].iov_base = &h;
    iov[0].iov_len = sizeof h;
    iov[1].iov_base = data;
    iov[1].iov_len = len;
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;   /* the job in one call, when the socket takes it all */
    mh.msg_control = cbuf;
    mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    kill(spawner_pid, SIGCONT);   /* a stop from the sandbox must not hold the agent up */
    do n = sendmsg(spawner_fd, &mh, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    if (n < (ssize_t)sizeof h) {
        /* it never had the job: safe to start the command another way */
        spawner_stop();
        return -2;
    }
    for (at = (size_t)n - sizeof h; at < len;) {
        n = write(spawner_fd, data + at, len - at);
        if (n > 0) { at += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN && spawner_wait(POLLOUT, deadline) == 0) continue;
        break;
    }
    answer = 0;
    if (at == len) {
        for (at = 0; at < sizeof answer;) {
            n = read(spawner_fd, (char *)&answer + at, sizeof answer - at);
            if (n > 0) { at += (size_t)n; continue; }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && errno == EAGAIN && spawner_wait(POLLIN, deadline) == 0) continue;
            break;
        }
        if (at < sizeof answer) answer = 0;
    }
    if (answer > 0) return (pid_t)answer;
    if (answer < 0) { errno = -answer; return -1; }
    /* it took the job and said nothing: whatever of it started ends, and the command fails */
    spawner_stop();
    {
        char needle[128];
        size_t nlen = tree_needle(needle, sizeof needle, TAG_VAR, tag, 1);
        tree_kill(0, 0, needle, nlen);
    }
    errno = EAGAIN;
    return -1;
}
#endif

/* Starts a command: through the helper when it is there, else forked here. Returns its pid, or -1. */
static pid_t start_command(char **argv, char **envp, const char *cwd, int in_fd, int out_fd, int err_fd,
                           const char *tag) {
    pid_t pid;
#ifndef MAYURA_AGENT_NO_FILTER
    pid = spawner_run(argv, envp, cwd, in_fd, out_fd, err_fd, tag);
    if (pid != -2) return pid;
#else
    (void)tag;
#endif
    pid = fork();
    if (pid == 0) child_run(argv, envp, cwd, in_fd, out_fd, err_fd);
    return pid;
}

/* }====================================================== */

static void op_exec(conn *c, const wire_msg *m) {
    const wire_field *fa = wire_find(m, "argv");
    const wire_field *fe = wire_find(m, "env");
    const unsigned char *cwdp = NULL, *inp = NULL;
    size_t cwdl = 0, inl = 0, argc = 0, off = 0, i, il;
    const unsigned char *item;
    int64_t timeout = 0, max_out = DEFAULT_MAX_OUTPUT, grace = 0, drain = 100;
    char **argv = NULL, *cwd = NULL, home[PATH_MAX + 8];
    envlist env = {0};
    int has_stdin, streaming = 0, po[2] = {-1, -1}, pe[2] = {-1, -1}, pi[2] = {-1, -1}, rc;
    struct stat st;
    exec *x = NULL;
    pid_t pid;

    if (fa == NULL || fa->type != WIRE_STRS) {
        reply_error(c, m->id, "invalid", "field 'argv' is missing or not a list of strings");
        return;
    }
    while (wire_next_item(fa, &off, &item, &il)) {
        if (memchr(item, '\0', il) != NULL || (argc == 0 && il == 0)) {
            reply_error(c, m->id, "invalid", "field 'argv' has an empty program or a NUL byte");
            return;
        }
        argc++;
    }
    if (argc == 0) { reply_error(c, m->id, "invalid", "field 'argv' is empty"); return; }
    if (field_bytes(m, "cwd", &cwdp, &cwdl) != 0) { reply_error(c, m->id, "invalid", "field 'cwd' must be bytes"); return; }
    has_stdin = wire_find(m, "stdin") != NULL;
    if (field_bytes(m, "stdin", &inp, &inl) != 0) { reply_error(c, m->id, "invalid", "field 'stdin' must be bytes"); return; }
    if (field_int(m, "timeout_ms", &timeout, 0, MAX_MS) != 0) { reply_error(c, m->id, "invalid", "field 'timeout_ms' must be an int from 0"); return; }
    if (field_int(m, "max_output_bytes", &max_out, 0, MAX_OUTPUT_LIMIT) != 0) { reply_error(c, m->id, "invalid", "field 'max_output_bytes' is out of range"); return; }
    if (field_int(m, "kill_grace_ms", &grace, 0, MAX_MS) != 0) { reply_error(c, m->id, "invalid", "field 'kill_grace_ms' must be an int from 0"); return; }
    if (field_int(m, "drain_ms", &drain, 0, MAX_MS) != 0) { reply_error(c, m->id, "invalid", "field 'drain_ms' must be an int from 0"); return; }
    if (fe != NULL && fe->type != WIRE_MAP) { reply_error(c, m->id, "invalid", "field 'env' must be a map"); return; }
    if (field_bool(m, "stream", &streaming) != 0) { reply_error(c, m->id, "invalid", "field 'stream' must be a bool"); return; }

    /* the cwd must be a directory before anything runs */
    if (cwdp != NULL && cwdl > 0) {
        int err = 0;
        cwd = request_path(cwdp, cwdl, &err);
        if (cwd == NULL) {
            if (err == EINVAL) reply_error(c, m->id, "invalid", "field 'cwd' contains a NUL byte");
            else reply_errno(c, m->id, err, "cwd");
            return;
        }
    } else if ((cwd = strdup(workdir)) == NULL) {
        reply_errno(c, m->id, ENOMEM, "exec");
        return;
    }
    if (stat(cwd, &st) != 0) { reply_errno(c, m->id, errno, "cwd"); goto done; }
    if (!S_ISDIR(st.st_mode)) { reply_errno(c, m->id, ENOTDIR, "cwd"); goto done; }

    x = (exec *)calloc(1, sizeof *x);
    argv = (char **)calloc(argc + 1, sizeof *argv);
    if (x == NULL || argv == NULL) goto nomem;
    x->in_fd = x->out.fd = x->err.fd = -1;
    x->pi_out = x->pi_err = x->pi_in = -1;
    off = 0;
    for (i = 0; wire_next_item(fa, &off, &item, &il); i++)
        if ((argv[i] = dup_cstr(item, il)) == NULL) goto nomem;

    /* base, then setup's, then the exec's (later wins), then the tag */
    snprintf(x->tag, sizeof x->tag, "%s.%lu", tag_prefix, ++tag_counter);
    snprintf(home, sizeof home, "HOME=%s", workdir);
    if (env_put_str(&env, BASE_PATH) != 0 || env_put_str(&env, home) != 0 ||
        env_put_str(&env, "LANG=C.UTF-8") != 0)
        goto nomem;
    for (i = 0; i < setup_n; i++)
        if (env_put_str(&env, setup_env[i]) != 0) goto nomem;
    if (fe != NULL) {
        rc = env_put_map(&env, fe);
        if (rc == -1) { reply_error(c, m->id, "invalid", "field 'env' has a name or value that is not valid"); goto done; }
        if (rc != 0) goto nomem;
    }
    {
        char tagvar[128];
        snprintf(tagvar, sizeof tagvar, "%s=%s", TAG_VAR, x->tag);
        if (env_put_str(&env, tagvar) != 0) goto nomem;
    }
    if (has_stdin && inl > 0) {
        x->in_data = (unsigned char *)malloc(inl);
        if (x->in_data == NULL) goto nomem;
        memcpy(x->in_data, inp, inl);
        x->in_len = inl;
    }

    /* the agent's ends are close-on-exec and non-blocking; the child's get dup2'd to 0..2 */
    if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0 || (has_stdin && pipe2(pi, O_CLOEXEC) != 0)) {
        reply_errno(c, m->id, errno, "pipe");
        goto done;
    }
    x->started = now_ms();
    pid = start_command(argv, env.v, cwd, pi[0], po[1], pe[1], x->tag);
    if (pid < 0 && errno == EAGAIN && nleftovers > 0) {
        /* out of processes: end what earlier commands left behind, then try once more */
        leftovers_run(INT64_MAX);
        reap();
        pid = start_command(argv, env.v, cwd, pi[0], po[1], pe[1], x->tag);
    }
    if (pid < 0) { reply_errno(c, m->id, errno, "fork"); goto done; }

    close(po[1]);
    close(pe[1]);
    if (pi[0] >= 0) close(pi[0]);
    x->c = c;
    x->id = m->id;
    x->pid = pid;
    x->out.fd = po[0];
    x->err.fd = pe[0];
    x->out.cap = x->err.cap = (size_t)max_out;
    x->out.which = 1;
    x->err.which = 2;
    x->streaming = streaming;
    if (streaming) {
        /* the first frame of a streaming exec: it runs, with this pid (in the sandbox's pid namespace) */
        wire_buf b = {0};
        wire_begin(&b, x->id);
        wire_add_bool(&b, "more", 1);
        wire_add_int(&b, "pid", pid);
        conn_send(c, &b);
    }
    x->in_fd = pi[1];
    /* fresh pipe ends: their flags are known, one fcntl each */
    fcntl(x->out.fd, F_SETFL, O_RDONLY | O_NONBLOCK);
    fcntl(x->err.fd, F_SETFL, O_RDONLY | O_NONBLOCK);
    if (x->in_fd >= 0) {
        fcntl(x->in_fd, F_SETFL, O_WRONLY | O_NONBLOCK);
        stdin_write(x);
    }
    x->grace_ms = grace;
    x->drain_ms = drain;
    if (timeout > 0) x->deadline = x->started + timeout;
    x->next = execs;
    execs = x;
    x = NULL;
    po[0] = pe[0] = pi[1] = -1;
    goto done;
nomem:
    reply_errno(c, m->id, ENOMEM, "exec");
done:
    if (po[0] >= 0) { close(po[0]); close(po[1]); }
    if (pe[0] >= 0) { close(pe[0]); close(pe[1]); }
    if (pi[1] >= 0) { close(pi[0]); close(pi[1]); }
    if (x != NULL) { free(x->in_data); free(x); }
    if (argv != NULL) {
        for (i = 0; i < argc; i++) free(argv[i]);
        free(argv);
    }
    env_free(&env);
    free(cwd);
}

static void op_cancel(conn *c, const wire_msg *m) {
    int64_t target = -1;
    exec *x;
    if (wire_find(m, "target") == NULL || field_int(m, "target", &target, 0, UINT32_MAX) != 0) {
        reply_error(c, m->id, "invalid", "field 'target' is missing or not an id");
        return;
    }
    for (x = execs; x != NULL; x = x->next) {
        if (x->c != c || x->id != (uint32_t)target || x->exited || x->cancelled || x->timed_out) continue;
        x->cancelled = 1;
        x->deadline = 0;
        exec_begin_kill(x, now_ms());
        break;
    }
    reply_ok(c, m->id, "ok");
}

/* Sends a signal to a running exec's tree (the pool's start handle's kill): it is not cancelled, its
** reply says how it ended. An exec that is over, or another connection's, is left alone. */
static void op_signal(conn *c, const wire_msg *m) {
    int64_t target = -1, sig = SIGKILL;
    exec *x;
    if (wire_find(m, "target") == NULL || field_int(m, "target", &target, 0, UINT32_MAX) != 0 ||
        field_int(m, "signal", &sig, 1, NSIG - 1) != 0) {
        reply_error(c, m->id, "invalid", "field 'target' or 'signal' is missing or out of range");
        return;
    }
    for (x = execs; x != NULL; x = x->next) {
        if (x->c != c || x->id != (uint32_t)target || x->exited) continue;
        if (sig == SIGKILL) kill_tree(x);
        else signal_tree(x, (int)sig);
        break;
    }
    reply_ok(c, m->id, "ok");
}

/* {------------------------------------------------------
** File operations
** -------------------------------------------------------*/

static void op_read(conn *c, const wire_msg *m) {
    int64_t max = (int64_t)WIRE_MAX_FRAME - 4096;
    char *path;
    int fd, fl, e = 0;
    struct stat st;
    wire_buf b = {0};
    size_t at, len = 0, limit;
    if (field_int(m, "max_bytes", &max, 0, (int64_t)WIRE_MAX_FRAME - 4096) != 0) {
        reply_error(c, m->id, "invalid", "field 'max_bytes' is out of range");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
    /* O_NONBLOCK: opening a fifo with no writer must not hang; it is refused below */
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    free(path);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) reply_ok(c, m->id, "missing");
        else reply_errno(c, m->id, errno, "open");
        return;
    }
    if (fstat(fd, &st) != 0) { reply_errno(c, m->id, errno, "fstat"); close(fd); return; }
    if (S_ISDIR(st.st_mode)) { reply_error(c, m->id, "is_directory", "is a directory"); close(fd); return; }
    if (!S_ISREG(st.st_mode)) { reply_error(c, m->id, "not_regular", "not a regular file"); close(fd); return; }
    limit = (size_t)max;
    if ((uint64_t)st.st_size > (uint64_t)limit) {
        reply_error(c, m->id, "too_large", "the file is larger than %zu bytes", limit);
        close(fd);
        return;
    }
    if ((fl = fcntl(fd, F_GETFL)) >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    /* read straight into the reply; the data field's length is filled in at the end */
    wire_begin(&b, m->id);
    at = wire_open_list(&b, "data", WIRE_BYTES);
    if (wire_reserve(&b, (size_t)st.st_size + 1) != 0) e = ENOMEM;
    /* at most limit + 1 bytes: one byte more than allowed says the file grew since fstat */
    while (e == 0 && len <= limit) {
        size_t room;
        ssize_t n;
        if (b.len == b.size) {
            size_t more = len < 65536 ? 65536 : len;
            if (more > limit + 1 - len) more = limit + 1 - len;
            if (wire_reserve(&b, more) != 0) { e = ENOMEM; break; }
        }
        room = b.size - b.len;
        if (room > limit + 1 - len) room = limit + 1 - len;
        n = read(fd, b.data + b.len, room);
        if (n < 0) {
            if (errno != EINTR) e = errno;
            continue;
        }
        if (n == 0) break;
        b.len += (size_t)n;
        len += (size_t)n;
    }
    close(fd);
    if (e != 0) {
        free(b.data);
        reply_errno(c, m->id, e, "read");
    } else if (len > limit) {
        free(b.data);
        reply_error(c, m->id, "too_large", "the file is larger than %zu bytes", limit);
    } else {
        wire_close_list(&b, at);
        reply_send(c, m->id, &b);
    }
}

/* Whether path names a directory (following symlinks). */
static void op_write(conn *c, const wire_msg *m) {
    const unsigned char *data = NULL;
    size_t dlen = 0;
    int64_t mode = 0644;
    char *path;
    int e;
    if (wire_find(m, "data") == NULL || field_bytes(m, "data", &data, &dlen) != 0) {
        reply_error(c, m->id, "invalid", "field 'data' is missing or not bytes");
        return;
    }
    if (field_int(m, "mode", &mode, 0, 07777) != 0) {
        reply_error(c, m->id, "invalid", "field 'mode' must be an int from 0 to 07777");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
    /* a name ending in '/' is EISDIR; missing parents are made */
    e = files_write_atomic(path, data, dlen, (mode_t)mode, 1);
    free(path);
    if (e != 0) reply_errno(c, m->id, e, "write");
    else reply_ok(c, m->id, "ok");
}

typedef struct entry {
    char *name;
    const char *type;
    int64_t size, mtime;
} entry;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* The most a listing holds: beyond either, the reply is the error 'too_many_entries'. */
#define LIST_MAX_ENTRIES 100000
#define LIST_MAX_NAME_BYTES (16u << 20)

static void op_list(conn *c, const wire_msg *m) {
    char *path;
    int fd, e = 0, over = 0;
    DIR *d;
    struct dirent *de;
    struct stat st;
    entry *ents = NULL;
    size_t n = 0, cap = 0, i, at, name_bytes = 0;
    wire_buf b = {0};
    if ((path = path_field(c, m)) == NULL) return;
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        if (e == ENOENT) reply_ok(c, m->id, "missing");
        else if (e == ENOTDIR && stat(path, &st) == 0) reply_error(c, m->id, "not_directory", "not a directory");
        else if (e == ENOTDIR) reply_ok(c, m->id, "missing");   /* a file in the middle of the path */
        else reply_errno(c, m->id, e, "open");
        free(path);
        return;
    }
    free(path);
    if ((d = fdopendir(fd)) == NULL) { reply_errno(c, m->id, errno, "opendir"); close(fd); return; }
    for (;;) {
        errno = 0;
        de = readdir(d);
        if (de == NULL) { e = errno; break; }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        name_bytes += strlen(de->d_name);
        if (n == LIST_MAX_ENTRIES || name_bytes > LIST_MAX_NAME_BYTES) { over = 1; break; }
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;   /* removed since readdir */
            e = errno;
            break;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            entry *ne = (entry *)realloc(ents, nc * sizeof *ne);
            if (ne == NULL) { e = ENOMEM; break; }
            ents = ne;
            cap = nc;
        }
        if ((ents[n].name = strdup(de->d_name)) == NULL) { e = ENOMEM; break; }
        ents[n].type = files_type_name(st.st_mode);
        ents[n].size = (int64_t)st.st_size;
        ents[n].mtime = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
        n++;
    }
    closedir(d);
    if (over) {
        reply_error(c, m->id, "too_many_entries", "the directory has more than %d entries or %u bytes of names",
                    LIST_MAX_ENTRIES, LIST_MAX_NAME_BYTES);
    } else if (e != 0) {
        reply_errno(c, m->id, e, "list");
    } else {
        if (n > 1) qsort(ents, n, sizeof *ents, entry_cmp);
        wire_begin(&b, m->id);
        at = wire_open_list(&b, "names", WIRE_STRS);
        for (i = 0; i < n; i++) wire_item(&b, ents[i].name, strlen(ents[i].name));
        wire_close_list(&b, at);
        at = wire_open_list(&b, "types", WIRE_STRS);
        for (i = 0; i < n; i++) wire_item(&b, ents[i].type, strlen(ents[i].type));
        wire_close_list(&b, at);
        at = wire_open_list(&b, "sizes", WIRE_INTS);
        for (i = 0; i < n; i++) wire_int_item(&b, ents[i].size);
        wire_close_list(&b, at);
        at = wire_open_list(&b, "modified", WIRE_INTS);
        for (i = 0; i < n; i++) wire_int_item(&b, ents[i].mtime);
        wire_close_list(&b, at);
        reply_send(c, m->id, &b);
    }
    for (i = 0; i < n; i++) free(ents[i].name);
    free(ents);
}

static void op_remove(conn *c, const wire_msg *m) {
    int recursive = 0, e = 0;
    char *path, *slash;
    size_t len;
    struct stat st;
    wire_buf b = {0};
    if (field_bool(m, "recursive", &recursive) != 0) {
        reply_error(c, m->id, "invalid", "field 'recursive' must be a bool");
        return;
    }
    if ((path = path_field(c, m)) == NULL) return;
    len = strlen(path);
    while (len > 1 && path[len - 1] == '/') path[--len] = '\0';
    slash = strrchr(path, '/');
    if (slash != NULL && (strcmp(slash, "/.") == 0 || strcmp(slash, "/..") == 0)) {
        free(path);
        reply_error(c, m->id, "invalid", "field 'path' must not end in . or ..");
        return;
    }
    if (lstat(path, &st) != 0) {
        e = errno;
        free(path);
        if (e == ENOENT || e == ENOTDIR) {
            wire_begin(&b, m->id);
            wire_add_bool(&b, "removed", 0);
            conn_send(c, &b);
        } else {
            reply_errno(c, m->id, e, "lstat");
        }
        return;
    }
    if (strcmp(path, "/") == 0) { free(path); reply_errno(c, m->id, EBUSY, "remove"); return; }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT) e = errno;
    } else if (!recursive) {
        if (rmdir(path) != 0 && errno != ENOENT) e = errno == EEXIST ? ENOTEMPTY : errno;
    } else {
        /* the walk starts from the parent's descriptor, so the last component is never followed */
        int dfd;
        slash = strrchr(path, '/');
        if (slash == path) dfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        else {
            *slash = '\0';
            dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            *slash = '/';
        }
        if (dfd < 0) e = errno;
        else {
            e = files_remove_at(dfd, slash + 1, DT_DIR);
            close(dfd);
        }
    }
    free(path);
    if (e != 0) { reply_errno(c, m->id, e, "remove"); return; }
    wire_begin(&b, m->id);
    wire_add_bool(&b, "removed", 1);
    conn_send(c, &b);
}

/* }------------------------------------------------------ */

static void op_ping(conn *c, const wire_msg *m) {
    reply_ok(c, m->id, "ok");
}

static void op_shutdown(conn *c, const wire_msg *m) {
    reply_ok(c, m->id, "ok");
    shutting_down = 1;
}

/*
** Runs a request. One the host would not send ends the connection, and so
** the agent, unanswered: no op or an unknown one, anything before hello,
** a second setup (the environment and workdir of later commands are set
** once). A request with a bad field is answered 'invalid'.
*/
static void dispatch(conn *c, const wire_msg *m) {
    const wire_field *f = wire_find(m, "op");
    static const struct { const char *name; void (*fn)(conn *, const wire_msg *); } ops[] = {
        {"hello", op_hello}, {"setup", op_setup}, {"exec", op_exec}, {"cancel", op_cancel}, {"signal", op_signal},
        {"read", op_read}, {"write", op_write}, {"list", op_list}, {"remove", op_remove},
        {"ping", op_ping}, {"shutdown", op_shutdown},
    };
    size_t i;
    if (f == NULL || f->type != WIRE_BYTES) { conn_close(c); return; }
    for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strlen(ops[i].name) == f->len && memcmp(ops[i].name, f->val, f->len) == 0) break;
    if (i == sizeof ops / sizeof ops[0]) { conn_close(c); return; }
    if (ops[i].fn == op_hello) c->said_hello = 1;
    else if (!c->said_hello) { conn_close(c); return; }
    if (ops[i].fn == op_setup) {
        if (c->had_setup) { conn_close(c); return; }
        c->had_setup = 1;
    }
    ops[i].fn(c, m);
}

/* }====================================================== */

/* {======================================================
** Connections: reading
** =======================================================*/

static void conn_close(conn *c) {
    exec *x;
    outq *q;
    if (c->dead) return;
    c->dead = 1;
    close(c->fd);
    c->fd = -1;
    while ((q = c->head) != NULL) {
        c->head = q->next;
        free(q->data);
        free(q);
    }
    c->tail = NULL;
    /* c->in is freed by conn_sweep: a request being handled may still point into it */
    /* the host is gone: what it started is cancelled, with nobody to tell */
    for (x = execs; x != NULL; x = x->next) {
        if (x->c != c) continue;
        x->c = NULL;
        if (!x->exited) {
            x->cancelled = 1;
            x->killing = K_KILLED;
            x->deadline = 0;
            kill_tree(x);
        }
    }
    if (fd_mode) agent_exit();
}

/* Reads what the socket has; handles every complete frame. */
static void conn_read(conn *c) {
    for (;;) {
        size_t off = 0, room;
        ssize_t n;
        if (c->in_size - c->in_len < READ_CHUNK) {
            /* grow as bytes arrive, never to a declared length at once */
            size_t ns = c->in_size ? c->in_size * 2 : READ_CHUNK * 2;
            unsigned char *nb = (unsigned char *)realloc(c->in, ns);
            if (nb == NULL) { conn_close(c); return; }
            c->in = nb;
            c->in_size = ns;
        }
        room = c->in_size - c->in_len;
        n = read(c->fd, c->in + c->in_len, room);
        if (n == 0) { conn_close(c); return; }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) conn_close(c);
            return;
        }
        c->in_len += (size_t)n;
        while (!c->dead && c->in_len - off >= 4) {
            uint32_t flen = wire_get_u32(c->in + off);
            wire_msg msg;
            if (flen < 4 || flen > WIRE_MAX_FRAME) { conn_close(c); return; }
            if (c->in_len - off - 4 < flen) break;
            if (wire_parse(c->in + off + 4, flen, &msg) != 0) { conn_close(c); return; }
            dispatch(c, &msg);
            off += 4 + (size_t)flen;
        }
        if (c->dead) return;
        if (off > 0) {
            memmove(c->in, c->in + off, c->in_len - off);
            c->in_len -= off;
            /* a big frame is done: give its buffer back */
            if (c->in_size > 4 * READ_CHUNK && c->in_len < READ_CHUNK) {
                unsigned char *nb = (unsigned char *)realloc(c->in, 2 * READ_CHUNK);
                if (nb != NULL) { c->in = nb; c->in_size = 2 * READ_CHUNK; }
            }
        }
        if ((size_t)n < room) return;   /* drained for now; poll says when more comes */
    }
}

static conn *conn_new(int fd) {
    conn *c = (conn *)calloc(1, sizeof *c);
    if (c == NULL) { close(fd); return NULL; }
    c->fd = fd;
    c->pidx = -1;
    c->next = conns;
    conns = c;
    return c;
}

static void conn_sweep(void) {
    conn **pp = &conns;
    while (*pp != NULL) {
        conn *c = *pp;
        if (c->dead) { *pp = c->next; free(c->in); free(c); }
        else pp = &c->next;
    }
}

/*
** Takes the one peer: the first connection (of --peer-uid's uid when given;
** any other is closed unanswered), after which nobody else can connect: the
** listener is closed and its socket unlinked, and the peer's end ends the
** agent as with --fd.
*/
static void accept_peer(void) {
    while (listen_fd >= 0) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;   /* EAGAIN, or out of descriptors: try again at the next turn */
        }
        if (peer_uid >= 0) {
            struct ucred cr;
            socklen_t len = sizeof cr;
            if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof cr ||
                (long long)cr.uid != peer_uid) {
                close(fd);
                continue;
            }
        }
        if (conn_new(fd) == NULL) continue;
        listener_close();
        fd_mode = 1;
    }
}

/* }====================================================== */

/* {======================================================
** Main loop
** =======================================================*/

static void usage(const char *msg) {
    fprintf(stderr, "mayura-agent: %s\n"
            "usage: mayura-agent (--fd N | --listen PATH [--peer-uid N]) --lifetime-ms MS [--workdir DIR]\n", msg);
    exit(2);
}

static long long parse_num(const char *s, const char *what) {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || end == s || v < 0) {
        fprintf(stderr, "mayura-agent: %s must be a whole number from 0\n", what);
        exit(2);
    }
    return v;
}

static int open_listener(const char *path) {
    struct sockaddr_un sa;
    mode_t old;
    int fd;
    if (strlen(path) >= sizeof sa.sun_path) usage("--listen path is too long");
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) { perror("mayura-agent: socket"); exit(1); }
    unlink(path);
    /* 0600; 0666 with --peer-uid, whose check is then what keeps others out */
    old = umask(peer_uid >= 0 ? 0111 : 0177);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { perror("mayura-agent: bind"); exit(1); }
    umask(old);
    if (listen(fd, 128) != 0) { perror("mayura-agent: listen"); exit(1); }
    return fd;
}

/* After a shutdown request: the replies go out (for a second at most), then everything ends. */
static void finish_shutdown(void) {
    int64_t end = now_ms() + 1000;
    kill_everything();
    for (;;) {
        struct pollfd pf[64];
        nfds_t n = 0;
        conn *c;
        int64_t left = end - now_ms();
        for (c = conns; c != NULL && n < 64; c = c->next)
            if (!c->dead && c->head != NULL) {
                pf[n].fd = c->fd;
                pf[n].events = POLLOUT;
                n++;
            }
        if (n == 0 || left <= 0) break;
        if (poll(pf, n, (int)left) < 0 && errno != EINTR) break;
        fd_mode = 0;   /* a write error closes that connection, not the agent mid-loop */
        for (c = conns; c != NULL; c = c->next)
            if (!c->dead && c->head != NULL) conn_flush(c);
    }
    agent_exit();
}

int main(int argc, char **argv) {
    const char *wd = "/workspace";
    long long fd = -1, lifetime = -1;
    struct pollfd *pfs = NULL;
    size_t pfcap = 0;
    sigset_t chld;
    struct timespec ts;
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage("missing value");
        if (strcmp(a, "--fd") == 0) fd = parse_num(argv[++i], "--fd");
        else if (strcmp(a, "--listen") == 0) listen_path = argv[++i];
        else if (strcmp(a, "--peer-uid") == 0) {
            peer_uid = parse_num(argv[++i], "--peer-uid");
            if (peer_uid > (long long)UINT32_MAX - 1) usage("--peer-uid is not a uid");
        }
        else if (strcmp(a, "--lifetime-ms") == 0) lifetime = parse_num(argv[++i], "--lifetime-ms");
        else if (strcmp(a, "--workdir") == 0) wd = argv[++i];
        else usage("unknown argument");
    }
    if ((fd >= 0) == (listen_path != NULL)) usage("give exactly one of --fd and --listen");
    if (peer_uid >= 0 && listen_path == NULL) usage("--peer-uid goes with --listen");
    if (lifetime <= 0) usage("--lifetime-ms is required and must be above 0");
    if (lifetime > MAX_MS) lifetime = MAX_MS;
    if (wd[0] == '\0' || strlen(wd) >= PATH_MAX) usage("--workdir is not valid");
    if (fd >= 0 && (fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0)) usage("--fd is not an open descriptor");

    /* same-uid code in the sandbox must not ptrace the agent or read its memory */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);   /* also what lets an unprivileged process install a filter */
#ifndef MAYURA_AGENT_NO_FILTER
    filter_build();
    if (filter_code == NULL)
        fprintf(stderr, "mayura-agent: cannot build the syscall filter (%s): commands will not run\n", filter_why);
#endif
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);   /* a write past RLIMIT_FSIZE fails with EFBIG instead */
    ignored_sigs_find();
    umask(022);
    /* 0..2 stay taken (PID 1 may start without them), so pipes never land there */
    for (i = 0; i < 3; i++)
        if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0) {
            int p[2];
            if (pipe(p) != 0) exit(1);
        }
    if (wd[0] == '/') {
        workdir = strdup(wd);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL) usage("cannot resolve a relative --workdir");
        workdir = (char *)malloc(strlen(cwd) + strlen(wd) + 2);
        if (workdir != NULL) sprintf(workdir, "%s/%s", cwd, wd);
    }
    if (workdir == NULL) exit(1);
    if (chdir(workdir) != 0) { /* commands chdir for themselves; a missing cwd is reported per exec */ }
#ifndef MAYURA_AGENT_NO_FILTER
    spawner_start();   /* now, while the agent is small and 0..2 are taken */
#endif

    clock_gettime(CLOCK_MONOTONIC, &ts);
    lifetime_end = now_ms() + lifetime;
    snprintf(tag_prefix, sizeof tag_prefix, "%ld.%lld", (long)getpid(),
             (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);

    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sig_fd < 0) { perror("mayura-agent: signalfd"); exit(1); }

    if (fd >= 0) {
        fd_mode = 1;
        fcntl((int)fd, F_SETFD, FD_CLOEXEC);
        set_nonblock((int)fd);
        if (conn_new((int)fd) == NULL) exit(1);
    } else {
        listen_fd = open_listener(listen_path);
    }
    reap();   /* children this process may have inherited before the signalfd */

    for (;;) {
        size_t n = 0, need = 2;
        int64_t now = now_ms(), wake = lifetime_end;
        int timeout, rc, listen_idx = -1;
        conn *c;
        exec *x;

        if (now >= lifetime_end) agent_exit();
        for (c = conns; c != NULL; c = c->next) need++;
        for (x = execs; x != NULL; x = x->next) need += 3;
        if (need > pfcap) {
            struct pollfd *np = (struct pollfd *)realloc(pfs, need * 2 * sizeof *np);
            if (np == NULL) agent_exit();
            pfs = np;
            pfcap = need * 2;
        }
#define SLOT(fd_, ev_) (pfs[n].fd = (fd_), pfs[n].events = (short)(ev_), pfs[n].revents = 0, (int)n++)
        SLOT(sig_fd, POLLIN);
        if (listen_fd >= 0) listen_idx = SLOT(listen_fd, POLLIN);
        for (c = conns; c != NULL; c = c->next)
            c->pidx = c->dead ? -1 : SLOT(c->fd, POLLIN | (c->head != NULL ? POLLOUT : 0));
        for (x = execs; x != NULL; x = x->next) {
            x->pi_out = x->out.fd >= 0 ? SLOT(x->out.fd, POLLIN) : -1;
            x->pi_err = x->err.fd >= 0 ? SLOT(x->err.fd, POLLIN) : -1;
            x->pi_in = x->in_fd >= 0 ? SLOT(x->in_fd, POLLOUT) : -1;
            if (x->deadline != 0 && x->deadline < wake) wake = x->deadline;
        }
        {
            int k;
            for (k = 0; k < nleftovers; k++)
                if (leftovers[k].at < wake) wake = leftovers[k].at;
        }
#undef SLOT
        timeout = wake <= now ? 0 : (wake - now > 1000000 ? 1000000 : (int)(wake - now));
        rc = poll(pfs, (nfds_t)n, timeout);
        if (rc < 0 && errno != EINTR) agent_exit();

        if (rc > 0) {
            if (pfs[0].revents != 0) reap();
            for (c = conns; c != NULL; c = c->next) {
                short ev;
                if (c->pidx < 0 || c->dead || (ev = pfs[c->pidx].revents) == 0) continue;
                if (ev & POLLOUT) conn_flush(c);
                if (!c->dead && (ev & (POLLIN | POLLHUP | POLLERR))) conn_read(c);
                if (shutting_down) finish_shutdown();
            }
            /* execs started during this turn have no slots yet (-1) */
            for (x = execs; x != NULL; x = x->next) {
                if (x->pi_out >= 0 && pfs[x->pi_out].revents != 0) stream_read(x, &x->out);
                if (x->pi_err >= 0 && pfs[x->pi_err].revents != 0) stream_read(x, &x->err);
                if (x->pi_in >= 0 && pfs[x->pi_in].revents != 0) stdin_write(x);
            }
            if (listen_idx >= 0 && pfs[listen_idx].revents != 0) accept_peer();
        }
        now = now_ms();
        leftovers_run(now);
        for (x = execs; x != NULL; x = x->next) exec_timer(x, now);
        exec_sweep();
        conn_sweep();
    }
}

/* }====================================================== */
