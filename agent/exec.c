/*
** exec.c: commands that run: their output streams (kept, or sent as
** streaming frames), stdin, timeouts, kill grace and drain, killing the
** whole tree, reaping, the reply; the exec, cancel and signal requests.
*/
#include "agent.h"

exec *execs;
char tag_prefix[48];
static unsigned long tag_counter;
static unsigned char scratch[READ_CHUNK];   /* a streaming exec's reads, and what is dropped */

/* {======================================================
** Killing a tree (the same semantics as core/proc.c on the host)
** =======================================================*/

/* The exec's group (and its leader by pid until it has ended: before its setsid it leads no
** group yet), every process carrying the exec's tag, and while the command's own process
** lives, every process below it (it is a child subreaper: its orphans stay below it); each
** once: those in the group get it through the group alone, so a handler runs once. */
static int signal_tree(exec *x, int sig) {
    char needle[128];
    size_t nlen = tree_needle(needle, sizeof needle, TAG_VAR, x->tag, 1);
    int hits = tree_signal(x->pid, !x->exited, needle, nlen, sig);
    if (!x->exited) tree_signal_below(x->pid, sig, x->pid);
    return hits;
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
void kill_tree(exec *x) {
    char needle[128];
    size_t nlen = tree_needle(needle, sizeof needle, TAG_VAR, x->tag, 1);
    if (!x->exited) tree_kill_below(x->pid);
    tree_kill(x->pid, !x->exited, needle, nlen);
}

/* Before exiting: every tree, and every process still carrying any tag of this agent. */
void kill_everything(void) {
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

/* }====================================================== */

/* {======================================================
** Exec
** =======================================================*/

static void stream_close(stream *s) {
    fd_close(&s->fd);
}

static void stdin_close(exec *x) {
    fd_close(&x->in_fd);
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
void stream_read(exec *x, stream *s) {
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

void stdin_write(exec *x) {
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
void leftovers_run(int64_t until) {
    int i, j = 0;
    for (i = 0; i < nleftovers; i++) {
        if (leftovers[i].at <= until) kill(-leftovers[i].pgid, SIGKILL);
        else leftovers[j++] = leftovers[i];
    }
    nleftovers = j;
}

/* The earlier of wake and the time of the next group to kill. */
int64_t leftovers_wake(int64_t wake) {
    int i;
    for (i = 0; i < nleftovers; i++)
        if (leftovers[i].at < wake) wake = leftovers[i].at;
    return wake;
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
void exec_sweep(void) {
    exec *x = execs, *next;
    for (; x != NULL; x = next) {
        next = x->next;
        if (!x->exited || x->out.fd >= 0 || x->err.fd >= 0) continue;
        exec_reply(x);
        exec_free(x);
    }
}

void exec_timer(exec *x, int64_t now) {
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
void reap(void) {
    struct signalfd_siginfo si;
    int64_t now = now_ms();
    while (read(sig_fd, &si, sizeof si) > 0) {}
    for (;;) {
        int status;
        exec *x;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        if (spawner_reaped(pid)) continue;
        for (x = execs; x != NULL; x = x->next)
            if (x->pid == pid && !x->exited) { exec_exited(x, status, now); break; }
    }
}

/* }====================================================== */

/* {======================================================
** Requests: exec, cancel, signal
** =======================================================*/

/* What an exec request asks, read and checked before anything is allocated. */
typedef struct exec_req {
    const wire_field *argv, *env;
    size_t argc;
    const unsigned char *cwd, *in;
    size_t cwd_len, in_len;
    int has_stdin, streaming;
    int64_t timeout, max_out, grace, drain;
} exec_req;

/* Reads the fields of an exec request; a missing or bad one is answered 'invalid' and gives -1. */
static int exec_fields(conn *c, const wire_msg *m, exec_req *r) {
    size_t off = 0, il;
    const unsigned char *item;
    memset(r, 0, sizeof *r);
    r->max_out = DEFAULT_MAX_OUTPUT;
    r->drain = 100;
    r->argv = wire_find(m, "argv");
    r->env = wire_find(m, "env");
    if (r->argv == NULL || r->argv->type != WIRE_STRS) {
        reply_error(c, m->id, "invalid", "field 'argv' is missing or not a list of strings");
        return -1;
    }
    while (wire_next_item(r->argv, &off, &item, &il)) {
        if (memchr(item, '\0', il) != NULL || (r->argc == 0 && il == 0)) {
            reply_error(c, m->id, "invalid", "field 'argv' has an empty program or a NUL byte");
            return -1;
        }
        r->argc++;
    }
    if (r->argc == 0) { reply_error(c, m->id, "invalid", "field 'argv' is empty"); return -1; }
    if (field_bytes(m, "cwd", &r->cwd, &r->cwd_len) != 0) { reply_error(c, m->id, "invalid", "field 'cwd' must be bytes"); return -1; }
    r->has_stdin = wire_find(m, "stdin") != NULL;
    if (field_bytes(m, "stdin", &r->in, &r->in_len) != 0) { reply_error(c, m->id, "invalid", "field 'stdin' must be bytes"); return -1; }
    if (field_int(m, "timeout_ms", &r->timeout, 0, MAX_MS) != 0) { reply_error(c, m->id, "invalid", "field 'timeout_ms' must be an int from 0"); return -1; }
    if (field_int(m, "max_output_bytes", &r->max_out, 0, MAX_OUTPUT_LIMIT) != 0) { reply_error(c, m->id, "invalid", "field 'max_output_bytes' is out of range"); return -1; }
    if (field_int(m, "kill_grace_ms", &r->grace, 0, MAX_MS) != 0) { reply_error(c, m->id, "invalid", "field 'kill_grace_ms' must be an int from 0"); return -1; }
    if (field_int(m, "drain_ms", &r->drain, 0, MAX_MS) != 0) { reply_error(c, m->id, "invalid", "field 'drain_ms' must be an int from 0"); return -1; }
    if (r->env != NULL && r->env->type != WIRE_MAP) { reply_error(c, m->id, "invalid", "field 'env' must be a map"); return -1; }
    if (field_bool(m, "stream", &r->streaming) != 0) { reply_error(c, m->id, "invalid", "field 'stream' must be a bool"); return -1; }
    return 0;
}

/* The command's cwd, a directory, or NULL with the reply sent. */
static char *exec_cwd(conn *c, const wire_msg *m, const exec_req *r) {
    struct stat st;
    char *cwd;
    int err = 0;
    if (r->cwd != NULL && r->cwd_len > 0) {
        cwd = request_path(r->cwd, r->cwd_len, &err);
        if (cwd == NULL) {
            if (err == EINVAL) reply_error(c, m->id, "invalid", "field 'cwd' contains a NUL byte");
            else reply_errno(c, m->id, err, "cwd");
            return NULL;
        }
    } else if ((cwd = strdup(workdir)) == NULL) {
        reply_errno(c, m->id, ENOMEM, "exec");
        return NULL;
    }
    if (stat(cwd, &st) != 0) err = errno;
    else if (!S_ISDIR(st.st_mode)) err = ENOTDIR;
    if (err != 0) {
        reply_errno(c, m->id, err, "cwd");
        free(cwd);
        return NULL;
    }
    return cwd;
}

/*
** The command's environment: base, then setup's, then the exec's (a later
** name wins), then the tag. Returns 0, -1 when the exec's env is not valid,
** -2 out of memory.
*/
static int exec_env(envlist *env, const exec_req *r, const char *tag) {
    char home[PATH_MAX + 8], tagvar[128];
    size_t i;
    int rc;
    snprintf(home, sizeof home, "HOME=%s", workdir);
    if (env_put_str(env, BASE_PATH) != 0 || env_put_str(env, home) != 0 ||
        env_put_str(env, "LANG=C.UTF-8") != 0)
        return -2;
    for (i = 0; i < setup_n; i++)
        if (env_put_str(env, setup_env[i]) != 0) return -2;
    if (r->env != NULL && (rc = env_put_map(env, r->env)) != 0) return rc;
    snprintf(tagvar, sizeof tagvar, "%s=%s", TAG_VAR, tag);
    return env_put_str(env, tagvar) != 0 ? -2 : 0;
}

/* The argv list as C strings (argc + 1 slots, NULL-ended), or NULL when out of memory. */
static char **exec_argv(const exec_req *r) {
    char **argv = (char **)calloc(r->argc + 1, sizeof *argv);
    size_t off = 0, i, il;
    const unsigned char *item;
    if (argv == NULL) return NULL;
    for (i = 0; wire_next_item(r->argv, &off, &item, &il); i++)
        if ((argv[i] = dup_cstr(item, il)) == NULL) {
            while (i > 0) free(argv[--i]);
            free(argv);
            return NULL;
        }
    return argv;
}

/* The exec that runs: its pipes' agent ends (the child's are closed), its fields from the request. */
static void exec_run(exec *x, conn *c, const wire_msg *m, const exec_req *r, pid_t pid, int fds[6]) {
    x->c = c;
    x->id = m->id;
    x->pid = pid;
    x->out.fd = fds[0];
    x->err.fd = fds[2];
    x->in_fd = fds[5];
    fds[0] = fds[2] = fds[5] = -1;
    x->out.cap = x->err.cap = (size_t)r->max_out;
    x->out.which = 1;
    x->err.which = 2;
    x->streaming = r->streaming;
    if (x->streaming) {
        /* the first frame of a streaming exec: it runs, with this pid (in the sandbox's pid namespace) */
        wire_buf b = {0};
        wire_begin(&b, x->id);
        wire_add_bool(&b, "more", 1);
        wire_add_int(&b, "pid", pid);
        conn_send(c, &b);
    }
    /* fresh pipe ends: their flags are known, one fcntl each */
    fcntl(x->out.fd, F_SETFL, O_RDONLY | O_NONBLOCK);
    fcntl(x->err.fd, F_SETFL, O_RDONLY | O_NONBLOCK);
    if (x->in_fd >= 0) {
        fcntl(x->in_fd, F_SETFL, O_WRONLY | O_NONBLOCK);
        stdin_write(x);
    }
    x->grace_ms = r->grace;
    x->drain_ms = r->drain;
    if (r->timeout > 0) x->deadline = x->started + r->timeout;
    x->next = execs;
    execs = x;
}

/*
** exec: checks the request, then starts the command with its pipes and
** environment. Whatever fails on the way is let go in one place: the
** descriptors by fd_close (fds: stdout, stderr and stdin pipes, each
** [read, write]; -1 once closed or given to the exec), the rest freed.
*/
void op_exec(conn *c, const wire_msg *m) {
    exec_req r;
    char **argv = NULL, *cwd;
    envlist env = {0};
    int fds[6] = { -1, -1, -1, -1, -1, -1 }, rc, i;
    exec *x = NULL;
    pid_t pid;

    if (exec_fields(c, m, &r) != 0) return;
    /* the cwd must be a directory before anything runs */
    if ((cwd = exec_cwd(c, m, &r)) == NULL) return;
    x = (exec *)calloc(1, sizeof *x);
    if (x == NULL || (argv = exec_argv(&r)) == NULL) goto nomem;
    x->in_fd = x->out.fd = x->err.fd = -1;
    x->pi_out = x->pi_err = x->pi_in = -1;
    snprintf(x->tag, sizeof x->tag, "%s.%lu", tag_prefix, ++tag_counter);
    rc = exec_env(&env, &r, x->tag);
    if (rc == -1) { reply_error(c, m->id, "invalid", "field 'env' has a name or value that is not valid"); goto done; }
    if (rc != 0) goto nomem;
    if (r.has_stdin && r.in_len > 0) {
        if ((x->in_data = (unsigned char *)malloc(r.in_len)) == NULL) goto nomem;
        memcpy(x->in_data, r.in, r.in_len);
        x->in_len = r.in_len;
    }

    /* the agent's ends are close-on-exec and non-blocking; the child's get dup2'd to 0..2 */
    if (pipe2(fds, O_CLOEXEC) != 0 || pipe2(fds + 2, O_CLOEXEC) != 0 || (r.has_stdin && pipe2(fds + 4, O_CLOEXEC) != 0)) {
        reply_errno(c, m->id, errno, "pipe");
        goto done;
    }
    x->started = now_ms();
    pid = start_command(argv, env.v, cwd, fds[4], fds[1], fds[3], x->tag);
    if (pid < 0 && errno == EAGAIN && nleftovers > 0) {
        /* out of processes: end what earlier commands left behind, then try once more */
        leftovers_run(INT64_MAX);
        reap();
        pid = start_command(argv, env.v, cwd, fds[4], fds[1], fds[3], x->tag);
    }
    if (pid < 0) { reply_errno(c, m->id, errno, "fork"); goto done; }
    fd_close(&fds[1]);
    fd_close(&fds[3]);
    fd_close(&fds[4]);
    exec_run(x, c, m, &r, pid, fds);
    x = NULL;
    goto done;
nomem:
    reply_errno(c, m->id, ENOMEM, "exec");
done:
    for (i = 0; i < 6; i++) fd_close(&fds[i]);
    if (x != NULL) { free(x->in_data); free(x); }
    if (argv != NULL) {
        for (i = 0; argv[i] != NULL; i++) free(argv[i]);
        free(argv);
    }
    env_free(&env);
    free(cwd);
}

void op_cancel(conn *c, const wire_msg *m) {
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
void op_signal(conn *c, const wire_msg *m) {
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

/* }====================================================== */
