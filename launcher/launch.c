/*
** launch.c: mayura-launch, the keeper of one local sandbox (providers/mayura/sandbox/local.lua).
**
** The provider's one launcher, built by make and installed beside the agent: one static program
** that starts, holds and ends a sandbox, with no shell, no sleep(1) for the lifetime, no subshells,
** no unshare(1), mount(8), chown(1), setpriv(1) or rmdir(1) per sandbox.
**
**   mayura-launch BWRAP [ARG...]
**
** Descriptors: 0 the agent's bytes, 3 the agent's socket, 4 the host's control socket, 5 with
** MAYURA_INFO bubblewrap's info descriptor, the one MAYURA_MOUNT names (5..9) the mount table.
** It runs outside the sandbox's cgroups, a session of its own (the host spawns it so), and:
**
**   -. with MAYURA_MOUNT, reads the mount table whole from that descriptor and closes it (any
**      failure: exit 125, nothing made);
**   0. with MAYURA_CG_SET, makes the cgroups of MAYURA_CG and writes their settings (make_cgroups;
**      any failure: exit 125, nothing left);
**   1. forks the sandbox's first process, which
**      a. joins each cgroup of MAYURA_CG (space-separated directories; any failure: exit 125;
**         v1: `tasks`, see join_cgroups);
**      b. shields itself from the OOM killer through the legacy knob (oom_adj -17; refused: ignored);
**      c. with MAYURA_MOUNT (the provider's mount table, read at the start, see read_table): a
**         mount namespace of its own, everything private, each line's step taken (mount_table:
**         fstab lines, and the steps that build a whole root for bubblewrap to bind as one), what
**         it makes given to MAYURA_UID (125);
**      d. with MAYURA_UID: no supplementary groups, then that gid and uid, real, effective, saved;
**      e. descriptors: the control socket closed; with MAYURA_INFO, 5 becomes 4 (bubblewrap's
**         --info-fd); with MAYURA_ETC_FDS, MAYURA_ETC_1..5 are read by bubblewrap from pipes on
**         5..9 (each with a newline at the end), else with MAYURA_RESOLV that one on 5;
**      f. becomes BWRAP (127 when it cannot);
**   2. waits for the first of: the lifetime (MAYURA_LIFE, seconds), that process's end, a word
**      from the host or the end of the control socket;
**   3. kills the sandbox's PID 1 (bubblewrap's child: the kernel ends the pid namespace with it,
**      and bubblewrap exits once it is empty), or what is still starting it, every half second
**      until it has ended, from the second pass the cgroups' processes too (MAYURA_CGKILL: v2's
**      cgroup.kill; MAYURA_FREEZER: v1's freezer, frozen, every process killed, thawed; else
**      each process of MAYURA_CG);
**   4. empties the cgroups (for 10 s at most) and removes them; exits with the process's status
**      (128 + the signal when killed).
** Descriptors of the host's beyond these are closed, in the keeper and in the sandbox.
**
**   mayura-launch --snapshot LAUNCHER UID NAME MAX PATH... | --snapshot-drop NAME | --snapshot-sweep
**
** takes a native snapshot of a running sandbox into a tmpfs of its own under SNAPROOT, takes one
** off, or takes off those whose host process is gone (snapshot.c); the mount table's `overlay`
** step starts a sandbox from one.
**
** This file holds the flow (the sandbox's first process, the keeper, main); the cgroups
** (cgroup.c), the mount table (mount.c) and the snapshots (snapshot.c) are pieces of their own
** over launch.h, the one header they share.
*/
#include "launch.h"

void die(const char *what) {
    fprintf(stderr, "mayura-launch: %s: %s\n", what, strerror(errno));
    _exit(FAIL);
}

int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

int write_file(const char *path, const char *s) {
    int fd = open(path, O_WRONLY | O_CLOEXEC), rc;
    if (fd < 0) return -1;
    rc = write_all(fd, s, strlen(s));
    if (close(fd) != 0) rc = -1;
    return rc;
}

const char *env(const char *name) {
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : NULL;
}

static void pipe_text(int target, const char *text) {
    int p[2];
    if (pipe(p) != 0) die("pipe");
    if (write_all(p[1], text, strlen(text)) != 0 || write_all(p[1], "\n", 1) != 0) die("pipe");
    close(p[1]);
    if (p[0] != target) {
        if (dup2(p[0], target) < 0) die("dup2");
        close(p[0]);
    }
}

/* The sandbox's first process: steps 1a..1f. Never returns. */
static void stage(char **argv) __attribute__((noreturn));
static void stage(char **argv) {
    const char *cg = env("MAYURA_CG"), *table = env("MAYURA_MOUNT"), *uid_s = env("MAYURA_UID");
    uid_t uid = 0;
    if (uid_s != NULL) {
        char *end;
        unsigned long v = strtoul(uid_s, &end, 10);
        if (*end != '\0' || v == 0 || v > 0x7fffffffUL) { errno = EINVAL; die("MAYURA_UID"); }
        uid = (uid_t)v;
    }
    if (cg != NULL) join_cgroups(cg);
    (void)write_file("/proc/self/oom_adj", "-17");
    if (table != NULL) {
        if (uid_s == NULL) { errno = EINVAL; die("MAYURA_UID"); }
        take_table(uid);
        if (chdir("/") != 0) die("chdir");
    }
    if (uid_s != NULL) {
        if (setgroups(0, NULL) != 0) die("setgroups");
        if (setresgid(uid, uid, uid) != 0) die("setresgid");
        if (setresuid(uid, uid, uid) != 0) die("setresuid");
    }
    close(4);
    if (env("MAYURA_INFO") != NULL) {
        if (dup2(5, 4) < 0) die("dup2");
        close(5);
    }
    if (env("MAYURA_ETC_FDS") != NULL) {
        int i;
        for (i = 1; i <= 5; i++) {
            char name[32];
            const char *v;
            snprintf(name, sizeof name, "MAYURA_ETC_%d", i);
            v = getenv(name);
            pipe_text(4 + i, v != NULL ? v : "");
        }
    } else if (env("MAYURA_RESOLV") != NULL) {
        pipe_text(5, env("MAYURA_RESOLV"));
    }
    /* nothing else of the host's goes in */
    if (syscall(SYS_close_range, 10u, ~0u, 0u) != 0) {
        int fd;
        for (fd = 10; fd < 65536; fd++) close(fd);
    }
    execv(argv[0], argv);
    fprintf(stderr, "mayura-launch: %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* {======================================================
** The keeper
** =======================================================*/

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void nap_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Reads a small file whole (NUL-terminated, at most cap - 1 bytes); its length, or -1. */
ssize_t read_small(const char *path, char *buf, size_t cap) {
    ssize_t got = 0, r;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    while ((size_t)got < cap - 1 && (r = read(fd, buf + got, cap - 1 - (size_t)got)) != 0) {
        if (r < 0) { if (errno == EINTR) continue; close(fd); return -1; }
        got += r;
    }
    close(fd);
    buf[got] = '\0';
    return got;
}

/* The children of `pid`, into kids (at most max); their count. */
int children(pid_t pid, pid_t *kids, int max) {
    char path[64], buf[4096], *p = buf;
    int n = 0;
    snprintf(path, sizeof path, "/proc/%ld/task/%ld/children", (long)pid, (long)pid);
    if (read_small(path, buf, sizeof buf) >= 0) {
        while (*p != '\0' && n < max) {
            char *end;
            long k = strtol(p, &end, 10);
            if (end == p) { p++; continue; }
            kids[n++] = (pid_t)k;
            p = end;
        }
        return n;
    } else {
        /* without /proc/PID/task/TID/children: every process's parent */
        DIR *dir = opendir("/proc");
        struct dirent *e;
        if (dir == NULL) return 0;
        while ((e = readdir(dir)) != NULL && n < max) {
            char *rp;
            long k = strtol(e->d_name, &rp, 10);
            if (*rp != '\0' || k <= 0) continue;
            snprintf(path, sizeof path, "/proc/%ld/stat", k);
            if (read_small(path, buf, sizeof buf) <= 0 || (rp = strrchr(buf, ')')) == NULL) continue;
            if (strtol(rp + 3, NULL, 10) == (long)pid) kids[n++] = (pid_t)k;   /* ") S PPID" */
        }
        closedir(dir);
        return n;
    }
}

/* The sandbox's PID 1 (bubblewrap's child), or whatever is still starting it. */
static void end_sandbox(pid_t first) {
    char path[64], comm[64];
    pid_t kids[64];
    int n, i;
    snprintf(path, sizeof path, "/proc/%ld/comm", (long)first);
    if (read_small(path, comm, sizeof comm) < 0) return;
    n = children(first, kids, 64);
    if (strcmp(comm, "bwrap\n") != 0) kill(first, SIGKILL);
    else if (n == 0) kill(first, SIGKILL);
    for (i = 0; i < n; i++) kill(kids[i], SIGKILL);
}

/* Whether `pid` has ended (and is reaped now, its status in *status), or is not ours to wait for. */
static int reap(pid_t pid, int *status) {
    pid_t r = waitpid(pid, status, WNOHANG);
    return r == pid || (r < 0 && errno == ECHILD);
}

int main(int argc, char **argv) {
    const char *cgs = env("MAYURA_CG"), *life_s = env("MAYURA_LIFE");
    int64_t deadline;
    int status = 0, pidfd, devnull, reaped = 0, n;
    pid_t first;
    char *end;
    double life;
    struct pollfd pf[2];
    if (argc >= 2 && strncmp(argv[1], "--snapshot", 10) == 0) return snapshot_main(argc, argv);
    if (argc < 2 || life_s == NULL) { errno = EINVAL; die("usage: MAYURA_LIFE=SECONDS mayura-launch BWRAP [ARG...]"); }
    life = strtod(life_s, &end);
    if (*end != '\0' || !(life > 0) || life > 1e9) { errno = EINVAL; die("MAYURA_LIFE"); }
    signal(SIGPIPE, SIG_IGN);
    if (env("MAYURA_MOUNT") != NULL) read_table(env("MAYURA_MOUNT"));
    deadline = now_ms() + (int64_t)(life * 1000.0);
    if (cgs != NULL && env("MAYURA_CG_SET") != NULL) make_cgroups(cgs, env("MAYURA_CG_SET"));

    first = fork();
    if (first < 0) die("fork");
    if (first == 0) stage(argv + 1);

    /* the sandbox's descriptors are its own; the keeper reads nothing but the control socket */
    close(3);
    if (syscall(SYS_close_range, 5u, ~0u, 0u) != 0) {
        int fd;
        for (fd = 5; fd < 65536; fd++) close(fd);
    }
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) { dup2(devnull, 0); close(devnull); }
    pidfd = (int)syscall(SYS_pidfd_open, first, 0);

    /* until the lifetime, the sandbox's own end or the host's word (or its end) */
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) break;
        if (reap(first, &status)) { reaped = 1; break; }
        pf[0].fd = 4;
        pf[0].events = POLLIN;
        pf[1].fd = pidfd;
        pf[1].events = POLLIN;
        n = poll(pf, pidfd >= 0 ? 2 : 1, (int)(pidfd >= 0 ? (left > 3600000 ? 3600000 : left) : (left > 50 ? 50 : left)));
        if (n < 0 && errno != EINTR) break;
        if (n > 0 && pf[0].revents != 0) break;
    }
    close(4);

    /* kill, then wait for the sandbox to end; every half second, again and the cgroups too */
    for (n = 0; !reaped; n++) {
        int64_t until;
        if (reap(first, &status)) break;
        end_sandbox(first);
        if (n > 0) kill_cgroups(cgs);
        until = now_ms() + 500;
        while (now_ms() < until) {
            if (reap(first, &status)) { reaped = 1; break; }
            if (pidfd >= 0) {
                pf[0].fd = pidfd;
                pf[0].events = POLLIN;
                if (poll(pf, 1, (int)(until - now_ms())) > 0) continue;
            } else {
                nap_ms(5);
            }
        }
    }
    if (pidfd >= 0) close(pidfd);

    /* what is left in the cgroups (nothing, as a rule), for 10 s at most; then they go */
    EACH_CG(d, cgs, {
        int i;
        for (i = 0; i < 200 && held(d); i++) { kill_cgroups(cgs); nap_ms(50); }
    });
    EACH_CG(d, cgs, { (void)rmdir(d); });
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 0;
}
