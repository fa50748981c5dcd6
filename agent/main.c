/*
** main.c: mayura-agent's entry: its arguments, its start, the poll loop that
** runs it all, and the one peer's accept (see agent.h for the whole program).
*/
#include "agent.h"

static int listen_fd = -1;
static const char *listen_path;
static int no_spawner;
static int stdio_mode;   /* --stdio: the peer is standard input and output */   /* --no-spawner: each command's process installs the filter itself */
static long long peer_uid = -1; /* --peer-uid: the one uid a --listen peer may have; -1 any */
int sig_fd = -1;
char *workdir;
int64_t lifetime_end;
int fd_mode;
int shutting_down;

/* {======================================================
** Helpers of every piece, and the peer
** =======================================================*/

int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Closes *fd when open and marks it closed (-1): how the agent lets go of every descriptor it owns. */
void fd_close(int *fd) {
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static void listener_close(void) {
    if (listen_fd < 0) return;
    fd_close(&listen_fd);
    unlink(listen_path);   /* may fail once the host closed the directory: nobody listens on it anyway */
}

void agent_exit(void) {
    kill_everything();
    uploads_drop(NULL);
    listener_close();
    exit(0);
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
        if (conn_new(fd, fd) == NULL) continue;
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
            "usage: mayura-agent (--fd N | --stdio | --listen PATH [--peer-uid N]) --lifetime-ms MS [--workdir DIR] "
            "[--no-spawner 1]\n", msg);
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
                pf[n].fd = c->wfd;
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

/* The command line: --fd, --stdio or --listen (listen_path, peer_uid), the lifetime and the workdir. */
typedef struct args {
    const char *wd;
    long long fd, lifetime;
} args;

static void parse_args(int argc, char **argv, args *a) {
    int i;
    a->wd = "/workspace";
    a->fd = a->lifetime = -1;
    for (i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (strcmp(k, "--stdio") == 0) {
            stdio_mode = 1;
            continue;
        }
        if (i + 1 >= argc) usage("missing value");
        if (strcmp(k, "--fd") == 0) a->fd = parse_num(argv[++i], "--fd");
        else if (strcmp(k, "--listen") == 0) listen_path = argv[++i];
        else if (strcmp(k, "--peer-uid") == 0) {
            peer_uid = parse_num(argv[++i], "--peer-uid");
            if (peer_uid > (long long)UINT32_MAX - 1) usage("--peer-uid is not a uid");
        }
        else if (strcmp(k, "--lifetime-ms") == 0) a->lifetime = parse_num(argv[++i], "--lifetime-ms");
        else if (strcmp(k, "--workdir") == 0) a->wd = argv[++i];
        /* a kernel whose clone(CLONE_PARENT) children never reach PID 1's wait (gVisor's) */
        else if (strcmp(k, "--no-spawner") == 0) no_spawner = parse_num(argv[++i], "--no-spawner") != 0;
        else usage("unknown argument");
    }
    if ((a->fd >= 0) + (listen_path != NULL) + stdio_mode != 1) usage("give exactly one of --fd, --stdio and --listen");
    if (peer_uid >= 0 && listen_path == NULL) usage("--peer-uid goes with --listen");
    if (a->lifetime <= 0) usage("--lifetime-ms is required and must be above 0");
    if (a->lifetime > MAX_MS) a->lifetime = MAX_MS;
    if (a->wd[0] == '\0' || strlen(a->wd) >= PATH_MAX) usage("--workdir is not valid");
    if (a->fd >= 0 && (a->fd > INT_MAX || fcntl((int)a->fd, F_GETFD) < 0)) usage("--fd is not an open descriptor");
}

/* --stdio: standard input and output become the peer, moved above 2 (close-on-exec, so no command
** holds them), and 0 and 1 become /dev/null (taken still: pipes never land there). */
static void stdio_start(void) {
    int rfd = fcntl(0, F_DUPFD_CLOEXEC, 3), wfd = fcntl(1, F_DUPFD_CLOEXEC, 3), null;
    if (rfd < 0 || wfd < 0) { perror("mayura-agent: --stdio"); exit(1); }
    null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0) { perror("mayura-agent: /dev/null"); exit(1); }
    if (null > 2) close(null);
    fd_mode = 1;
    set_nonblock(rfd);
    set_nonblock(wfd);
    if (conn_new(rfd, wfd) == NULL) exit(1);
}

/* Everything before the loop: the process's own protections, the filter, the workdir, the spawner,
** SIGCHLD's signalfd and the peer's descriptor or listener. */
static void agent_start(const args *a) {
    sigset_t chld;
    struct timespec ts;
    int i;
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
    if (a->wd[0] == '/') {
        workdir = strdup(a->wd);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL) usage("cannot resolve a relative --workdir");
        workdir = (char *)malloc(strlen(cwd) + strlen(a->wd) + 2);
        if (workdir != NULL) sprintf(workdir, "%s/%s", cwd, a->wd);
    }
    if (workdir == NULL) exit(1);
    if (chdir(workdir) != 0) { /* commands chdir for themselves; a missing cwd is reported per exec */ }
#ifndef MAYURA_AGENT_NO_FILTER
    if (!no_spawner) spawner_start();   /* now, while the agent is small and 0..2 are taken */
#endif

    clock_gettime(CLOCK_MONOTONIC, &ts);
    lifetime_end = now_ms() + a->lifetime;
    snprintf(tag_prefix, sizeof tag_prefix, "%ld.%lld", (long)getpid(),
             (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);

    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sig_fd < 0) { perror("mayura-agent: signalfd"); exit(1); }

    if (a->fd >= 0) {
        fd_mode = 1;
        fcntl((int)a->fd, F_SETFD, FD_CLOEXEC);
        set_nonblock((int)a->fd);
        if (conn_new((int)a->fd, (int)a->fd) == NULL) exit(1);
    } else if (stdio_mode) {
        stdio_start();
    } else {
        listen_fd = open_listener(listen_path);
    }
}

/* One turn of the loop: a poll over every descriptor until the next deadline, then what is ready,
** the timers, and the sweeps of what ended. *pfs grows (never shrinks) to the descriptors' count. */
static void loop_turn(struct pollfd **pfs, size_t *pfcap) {
    size_t n = 0, need = 2;
    int64_t now = now_ms(), wake = lifetime_end;
    int timeout, rc, listen_idx = -1;
    struct pollfd *pf;
    conn *c;
    exec *x;

    if (now >= lifetime_end) agent_exit();
    for (c = conns; c != NULL; c = c->next) need += 2;
    for (x = execs; x != NULL; x = x->next) need += 3;
    if (need > *pfcap) {
        struct pollfd *np = (struct pollfd *)realloc(*pfs, need * 2 * sizeof *np);
        if (np == NULL) agent_exit();
        *pfs = np;
        *pfcap = need * 2;
    }
    pf = *pfs;
#define SLOT(fd_, ev_) (pf[n].fd = (fd_), pf[n].events = (short)(ev_), pf[n].revents = 0, (int)n++)
    SLOT(sig_fd, POLLIN);
    if (listen_fd >= 0) listen_idx = SLOT(listen_fd, POLLIN);
    for (c = conns; c != NULL; c = c->next) {
        int both = c->wfd == c->fd;
        c->pidx = c->dead ? -1 : SLOT(c->fd, POLLIN | (both && c->head != NULL ? POLLOUT : 0));
        c->pidx_w = c->dead || both || c->head == NULL ? -1 : SLOT(c->wfd, POLLOUT);
    }
    for (x = execs; x != NULL; x = x->next) {
        x->pi_out = x->out.fd >= 0 ? SLOT(x->out.fd, POLLIN) : -1;
        x->pi_err = x->err.fd >= 0 ? SLOT(x->err.fd, POLLIN) : -1;
        x->pi_in = x->in_fd >= 0 ? SLOT(x->in_fd, POLLOUT) : -1;
        if (x->deadline != 0 && x->deadline < wake) wake = x->deadline;
    }
#undef SLOT
    wake = uploads_wake(leftovers_wake(wake));
    timeout = wake <= now ? 0 : (wake - now > 1000000 ? 1000000 : (int)(wake - now));
    rc = poll(pf, (nfds_t)n, timeout);
    if (rc < 0 && errno != EINTR) agent_exit();

    if (rc > 0) {
        if (pf[0].revents != 0) reap();
        for (c = conns; c != NULL; c = c->next) {
            short ev;
            if (c->pidx_w >= 0 && !c->dead && pf[c->pidx_w].revents != 0) {
                if (pf[c->pidx_w].revents & POLLOUT) conn_flush(c);
                else conn_close(c);   /* the reader of our output is gone */
                if (shutting_down) finish_shutdown();
            }
            if (c->pidx < 0 || c->dead || (ev = pf[c->pidx].revents) == 0) continue;
            if (ev & POLLOUT) conn_flush(c);
            if (!c->dead && (ev & (POLLIN | POLLHUP | POLLERR))) conn_read(c);
            if (shutting_down) finish_shutdown();
        }
        /* execs started during this turn have no slots yet (-1) */
        for (x = execs; x != NULL; x = x->next) {
            if (x->pi_out >= 0 && pf[x->pi_out].revents != 0) stream_read(x, &x->out);
            if (x->pi_err >= 0 && pf[x->pi_err].revents != 0) stream_read(x, &x->err);
            if (x->pi_in >= 0 && pf[x->pi_in].revents != 0) stdin_write(x);
        }
        if (listen_idx >= 0 && pf[listen_idx].revents != 0) accept_peer();
    }
    now = now_ms();
    leftovers_run(now);
    uploads_expire(now);
    for (x = execs; x != NULL; x = x->next) exec_timer(x, now);
    exec_sweep();
    conn_sweep();
}

int main(int argc, char **argv) {
    struct pollfd *pfs = NULL;
    size_t pfcap = 0;
    args a;
    parse_args(argc, argv, &a);
    agent_start(&a);
    reap();   /* children this process may have inherited before the signalfd */
    for (;;) loop_turn(&pfs, &pfcap);
}

/* }====================================================== */
