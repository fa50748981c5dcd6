/*
** conn.c: the agent's connection to the host: the send queue, replies,
** reading frames (core/wire.h) and dispatching requests; the session
** requests (hello, setup, ping, shutdown) are here too.
*/
#include "agent.h"

conn *conns;
char **setup_env;
size_t setup_n;

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

/* {======================================================
** Connections: output queue and replies
** =======================================================*/


/* Writes what the socket takes now; closes the connection on an error. */
void conn_flush(conn *c) {
    while (c->head != NULL && !c->dead) {
        outq *q = c->head;
        ssize_t n = write(c->wfd, q->data + q->off, q->len - q->off);
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
void conn_send(conn *c, wire_buf *b) {
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

void reply_error(conn *c, uint32_t id, const char *code, const char *fmt, ...) {
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

void reply_errno(conn *c, uint32_t id, int e, const char *what) {
    reply_error(c, id, errno_name(e), "%s: %s", what, strerror(e));
}

/* Sends a built reply, or 'too_large' when it could not be built (past the frame limit, or no memory). */
void reply_send(conn *c, uint32_t id, wire_buf *b) {
    if (wire_end(b) != 0) {
        free(b->data);
        b->data = NULL;
        reply_error(c, id, "too_large", "the reply does not fit in a frame");
        return;
    }
    conn_send(c, b);
}

void reply_ok(conn *c, uint32_t id, const char *key) {
    wire_buf b = {0};
    wire_begin(&b, id);
    wire_add_bool(&b, key, 1);
    conn_send(c, &b);
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

void conn_close(conn *c) {
    exec *x;
    outq *q;
    if (c->dead) return;
    c->dead = 1;
    if (c->wfd == c->fd) c->wfd = -1;
    fd_close(&c->fd);
    fd_close(&c->wfd);
    while ((q = c->head) != NULL) {
        c->head = q->next;
        free(q->data);
        free(q);
    }
    c->tail = NULL;
    /* c->in is freed by conn_sweep: a request being handled may still point into it */
    uploads_drop(c);   /* its unfinished writes leave nothing */
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
void conn_read(conn *c) {
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

/* A connection reading fd and writing wfd (the same descriptor but with --stdio); takes both. */
conn *conn_new(int fd, int wfd) {
    conn *c = (conn *)calloc(1, sizeof *c);
    if (c == NULL) {
        close(fd);
        if (wfd != fd) close(wfd);
        return NULL;
    }
    c->fd = fd;
    c->wfd = wfd;
    c->pidx = c->pidx_w = -1;
    c->next = conns;
    conns = c;
    return c;
}

void conn_sweep(void) {
    conn **pp = &conns;
    while (*pp != NULL) {
        conn *c = *pp;
        if (c->dead) { *pp = c->next; free(c->in); free(c); }
        else pp = &c->next;
    }
}

/* }====================================================== */
