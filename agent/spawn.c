/*
** spawn.c: starting a command: the child's set-up between fork and exec,
** and the spawner, the helper that starts commands under the filter.
*/
#include "agent.h"

static pid_t spawner_pid = -1;   /* the helper that starts commands under the filter, or -1 */
static int spawner_fd = -1;
static int spawner_unconfirmed;   /* started, its word that the filter is on not read yet */

/* Whether pid was the spawner, reaped (killed from the sandbox): commands are forked by the agent
** from now on. */
int spawner_reaped(pid_t pid) {
    if (pid <= 0 || pid != spawner_pid) return 0;
    spawner_pid = -1;
    fd_close(&spawner_fd);
    return 1;
}

/*
** Signals whose disposition is not the default in the agent (SIG_IGN: what it
** ignores, what its launcher left ignored), found once at start: a command's
** process resets only these (a handler is reset by execve anyway), not all 64.
*/
static int ignored_sigs[NSIG];
static int nignored;

void ignored_sigs_find(void) {
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
    /* gVisor refuses a last descriptor above INT_MAX (EINVAL): that one next, before a loop of
    ** thousands of close calls (about 300 ms there) */
    if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0 && syscall(SYS_close_range, 3u, (unsigned)INT_MAX, 0u) != 0) {
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
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0 && syscall(SYS_close_range, 4u, (unsigned)INT_MAX, 0u) != 0) {
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
    fd_close(&spawner_fd);
    spawner_pid = -1;
}

/* Forks the helper (at start: the agent is small then). */
void spawner_start(void) {
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
    spawner_unconfirmed = 1;   /* its word is read before its first job, not before the hello */
}

/* The helper says when its filter is on; one that cannot install it is not used. */
static void spawner_confirm(void) {
    char ready = 0;
    int64_t deadline = now_ms() + SPAWN_WAIT_MS;
    ssize_t n;
    spawner_unconfirmed = 0;
    if (spawner_fd < 0) return;
    while ((n = read(spawner_fd, &ready, 1)) < 0 && (errno == EINTR ||
           (errno == EAGAIN && wait_fd(spawner_fd, POLLIN, deadline) == 0))) {}
    if (n != 1 || ready != 'R') spawner_stop();
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
    if (spawner_unconfirmed) spawner_confirm();
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
pid_t start_command(char **argv, char **envp, const char *cwd, int in_fd, int out_fd, int err_fd,
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
