/*
** abuse.c: the hostile program the abuse specs run inside sandboxes.
**
** Built static by spec/security/common.lua (`common.abuse_binary()`),
** written into each sandbox with write_file, so the same attempts run in a
** busybox container and in a local sandbox alike. Every subcommand bounds
** its own run time, prints what it got as `key=value` lines on stdout, and
** never needs anything from the image.
**
**   abuse threads N          start up to N sleeping threads; threads=<started> err=<errno name>
**   abuse forks N            fork up to N sleeping children; forks=<started> err=<errno name>
**   abuse bomb               a fork bomb: every process forks for ever (retrying); never ends
**   abuse mem MIB            allocate and touch MIB MiB, 1 MiB at a time; touched=<MiB>
**   abuse spin MS THREADS    busy-loop THREADS threads for MS ms; cpu_ms=<used> wall_ms=<elapsed>
**   abuse inodes DIR MS      make empty files in DIR until failure or MS ms; files=<made> err=<name>
**   abuse tiocsti            TIOCSTI on fds 0..2, /dev/tty and a new pty; one line each
**   abuse ptrace PID         attach, seize, /proc/PID/mem, process_vm_readv; one line each
**   abuse swap A B MS        swap A and B with RENAME_EXCHANGE until MS ms; swaps=<count>
**   abuse flood BYTES        write BYTES of 'x' to stdout, no newline; wrote=<bytes> (on stderr)
**   abuse sysctl             try writing kernel knobs under /proc/sys and /sys; one line each
**   abuse net NAME T...      per target (tcp:ADDR:PORT, udp:ADDR:PORT, raw:ADDR, unix:PATH or
**                            unix:@ABSTRACT) connect, send a DNS query for NAME, or open a raw socket,
**                            all at once (each connect waits 1.5 s at most, the same 1.5 s);
**                            <target>=CONNECTED|SENT|OPENED|<errno>, in the targets' order
**   abuse serve T MS TEXT    listen on T (tcp:ADDR:PORT or unix:...) and answer every connection
**                            with an HTTP response whose body is TEXT, for MS ms, from a child in a
**                            session of its own; serve=LISTENING pid=<child> or serve=<errno>
**   abuse get ADDR:PORT      an HTTP GET of /; get=CONNECTED|<errno> body=<the body's first line>
**   abuse send ADDR:PORT FILE CONNS CHUNK GAP_US MS
**                            open CONNS connections, send each FILE's bytes in writes of CHUNK bytes
**                            (no Nagle), taking turns, GAP_US µs between turns, then hold them MS ms
**                            without reading a byte;
**                            conns=<opened> sent=<bytes, all connections> ended=<connections the
**                            peer closed before all was sent>
**   abuse syscalls           every system call class the agent's filter refuses, one line each,
**                            deny.<name>=<errno name>; what must still work, allow.<name>=OK|<errno>;
**                            filters=<seccomp filters on this process> subreaper=<0|1>
**   abuse agent PATH         connect to the agent's socket and send hello, setup, exec as the host
**                            does; connect=<OK|errno> then <op>=ANSWERED|CLOSED|<errno> per request
**   abuse names DIR N LEN    make DIR and a file DIR/f, then N-1 hard links to it, names of LEN bytes;
**                            names=<made> err=<errno name>
**   abuse seccomp-fill CMD.. install allow-all seccomp filters until the kernel's budget of filter
**                            instructions is used up, then exec CMD (no further filter fits in it)
**
** The probes of `syscalls` pass arguments that make each call fail or do
** nothing where it is not filtered, even run as root on a host (bad
** pointers, bad descriptors, values read back first), so the errno says
** who refused: EPERM from the filter, another from the kernel.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *ename(int e) {
    switch (e) {
    case 0: return "0";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EAGAIN: return "EAGAIN";
    case ENOMEM: return "ENOMEM";
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case ENOTTY: return "ENOTTY";
    case ENXIO: return "ENXIO";
    case ENOENT: return "ENOENT";
    case EROFS: return "EROFS";
    case EIO: return "EIO";
    case ESRCH: return "ESRCH";
    case EINVAL: return "EINVAL";
    case EBADF: return "EBADF";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOSYS: return "ENOSYS";
    case EFBIG: return "EFBIG";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ECONNREFUSED: return "ECONNREFUSED";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
    case EFAULT: return "EFAULT";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case ENOTSOCK: return "ENOTSOCK";
    case ECONNRESET: return "ECONNRESET";
    case EPIPE: return "EPIPE";
    case EEXIST: return "EEXIST";
    case EMLINK: return "EMLINK";
    case ESOCKTNOSUPPORT: return "ESOCKTNOSUPPORT";
    default: return "other";
    }
}

static void *sleeper(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

static int cmd_threads(long n) {
    long i;
    int e = 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 65536);
    for (i = 0; i < n; i++) {
        pthread_t t;
        e = pthread_create(&t, &a, sleeper, NULL);
        if (e != 0) break;
    }
    printf("threads=%ld err=%s\n", i, ename(e));
    fflush(stdout);
    _exit(0);   /* ends every thread */
}

static int cmd_forks(long n) {
    long i;
    int e = 0;
    for (i = 0; i < n; i++) {
        pid_t p = fork();
        if (p < 0) { e = errno; break; }
        if (p == 0) { for (;;) pause(); }
    }
    printf("forks=%ld err=%s\n", i, ename(e));
    fflush(stdout);
    kill(0, SIGKILL);   /* the children share our process group */
    return 0;
}

/* Every process forks for ever, retrying when it cannot: ends only when it is killed. */
static int cmd_bomb(void) {
    for (;;) {
        pid_t p = fork();
        if (p < 0) usleep(2000);
    }
    return 0;
}

static int cmd_mem(long mib) {
    long i;
    for (i = 0; i < mib; i++) {
        char *p = (char *)malloc(1 << 20);
        if (p == NULL) break;
        memset(p, (int)(i & 0x7f) + 1, 1 << 20);
        if (i % 16 == 0) { fprintf(stderr, "touched=%ld\n", i); }
    }
    printf("touched=%ld\n", i);
    return 0;
}

static volatile int spinning = 1;

static void *spinner(void *arg) {
    volatile unsigned long x = 0;
    (void)arg;
    while (spinning) x++;
    return NULL;
}

static long long cpu_ms(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

static int cmd_spin(long ms, long nthreads) {
    pthread_t t[64];
    long i;
    long long start = now_ms(), c0 = cpu_ms();
    if (nthreads > 64) nthreads = 64;
    for (i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, spinner, NULL);
    while (now_ms() - start < ms) usleep(10000);
    spinning = 0;
    for (i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
    printf("cpu_ms=%lld wall_ms=%lld\n", cpu_ms() - c0, now_ms() - start);
    return 0;
}

static int cmd_inodes(const char *dir, long ms) {
    long long end = now_ms() + ms;
    long i;
    int e = 0;
    char path[4096];
    for (i = 0;; i++) {
        int fd;
        if ((i & 1023) == 0 && now_ms() > end) { e = ETIMEDOUT; break; }
        snprintf(path, sizeof path, "%s/i%ld", dir, i);
        fd = open(path, O_CREAT | O_WRONLY | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) { e = errno; break; }
        close(fd);
    }
    printf("files=%ld err=%s\n", i, e == ETIMEDOUT ? "timeout" : ename(e));
    return 0;
}

static void try_sti(const char *what, int fd) {
    char c = '#';
    int rc = ioctl(fd, TIOCSTI, &c);
    printf("tiocsti %s=%s\n", what, rc == 0 ? "INJECTED" : ename(errno));
}

static int cmd_tiocsti(void) {
    int fd, m;
    try_sti("fd0", 0);
    try_sti("fd1", 1);
    try_sti("fd2", 2);
    fd = open("/dev/tty", O_RDWR | O_NOCTTY);
    if (fd < 0) printf("open /dev/tty=%s\n", ename(errno));
    else { try_sti("devtty", fd); close(fd); }
    fd = open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd < 0) printf("open /dev/console=%s\n", ename(errno));
    else { try_sti("console", fd); close(fd); }
    /* a pty of the sandbox's own, never made our controlling terminal */
    m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0) printf("open ptmx=%s\n", ename(errno));
    else {
        int s = -1;
        if (grantpt(m) == 0 && unlockpt(m) == 0) s = open(ptsname(m), O_RDWR | O_NOCTTY);
        if (s >= 0) { try_sti("pty", s); close(s); }
        else printf("open pts=%s\n", ename(errno));
        close(m);
    }
    {
        int ttys = 0;
        for (fd = 0; fd < 1024; fd++) if (isatty(fd)) ttys++;
        printf("ttys=%d\n", ttys);
    }
    printf("sid=%d pgid=%d pid=%d\n", (int)getsid(0), (int)getpgid(0), (int)getpid());
    return 0;
}

static int cmd_ptrace(pid_t pid) {
    char path[64], buf[16];
    struct iovec local = { buf, sizeof buf }, remote = { (void *)0x400000, sizeof buf };
    long rc;
    int fd;
    rc = ptrace(PTRACE_ATTACH, pid, NULL, NULL);
    printf("attach=%s\n", rc == 0 ? "ATTACHED" : ename(errno));
    if (rc == 0) { waitpid(pid, NULL, __WALL); ptrace(PTRACE_DETACH, pid, NULL, NULL); }
    rc = ptrace(PTRACE_SEIZE, pid, NULL, NULL);
    printf("seize=%s\n", rc == 0 ? "SEIZED" : ename(errno));
    if (rc == 0) ptrace(PTRACE_DETACH, pid, NULL, NULL);
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    fd = open(path, O_RDONLY);
    printf("mem=%s\n", fd >= 0 ? "OPENED" : ename(errno));
    if (fd >= 0) close(fd);
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    fd = open(path, O_RDONLY);
    printf("environ=%s\n", fd >= 0 ? "OPENED" : ename(errno));
    if (fd >= 0) close(fd);
    rc = syscall(SYS_process_vm_readv, pid, &local, 1, &remote, 1, 0);
    printf("vm_readv=%s\n", rc >= 0 ? "READ" : ename(errno));
    rc = syscall(SYS_pidfd_open, pid, 0);
    if (rc >= 0) {
        long g = syscall(SYS_pidfd_getfd, (int)rc, 0, 0);
        printf("getfd=%s\n", g >= 0 ? "GOT" : ename(errno));
        close((int)rc);
    } else {
        printf("getfd=%s\n", ename(errno));
    }
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    {
        DIR *d = opendir(path);
        printf("fd_dir=%s\n", d != NULL ? "OPENED" : ename(errno));
        if (d != NULL) closedir(d);
    }
    snprintf(path, sizeof path, "/proc/%d/root/", (int)pid);
    {
        DIR *d = opendir(path);
        printf("root=%s\n", d != NULL ? "OPENED" : ename(errno));
        if (d != NULL) closedir(d);
    }
    rc = kill(pid, SIGKILL);
    printf("kill=%s\n", rc == 0 ? "SENT" : ename(errno));
    return 0;
}

static int cmd_swap(const char *a, const char *b, long ms) {
    long long end = now_ms() + ms;
    long n = 0;
    while (now_ms() < end) {
        if (syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */) == 0) n++;
        else { printf("swap_err=%s\n", ename(errno)); break; }
    }
    printf("swaps=%ld\n", n);
    return 0;
}

static int cmd_flood(long long bytes) {
    static char buf[1 << 16];
    long long done = 0;
    memset(buf, 'x', sizeof buf);
    signal(SIGPIPE, SIG_IGN);
    while (done < bytes) {
        size_t want = bytes - done < (long long)sizeof buf ? (size_t)(bytes - done) : sizeof buf;
        ssize_t n = write(1, buf, want);
        if (n <= 0) { if (n < 0 && errno == EINTR) continue; break; }
        done += n;
    }
    fprintf(stderr, "wrote=%lld\n", done);
    return 0;
}

static int cmd_sysctl(void) {
    static const char *knobs[] = {
        "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches",
        "/proc/sys/kernel/panic", "/proc/sysrq-trigger", "/proc/sys/net/ipv4/ip_forward",
        "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/fs/cgroup/pids/pids.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/cgroup.procs",
        "/sys/class/net/lo/mtu", "/proc/self/oom_score_adj",
    };
    size_t i;
    for (i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        int fd = open(knobs[i], O_WRONLY | O_NOCTTY);
        if (fd < 0) { printf("%s=%s\n", knobs[i], ename(errno)); continue; }
        /* write nothing that would matter if it took: -1000 is refused to an unprivileged user */
        if (strcmp(knobs[i], "/proc/self/oom_score_adj") == 0) {
            printf("%s=%s\n", knobs[i], write(fd, "-1000", 5) == 5 ? "WRITTEN" : ename(errno));
        } else {
            printf("%s=OPENED\n", knobs[i]);
        }
        close(fd);
    }
    return 0;
}

/* A DNS query for `name` (A record) into buf; returns its length. */
static size_t dns_query(unsigned char *buf, const char *name) {
    size_t n = 0;
    const char *p = name;
    static const unsigned char head[12] = {0x4d, 0x59, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    memcpy(buf, head, sizeof head);
    n = sizeof head;
    while (*p != '\0') {
        const char *dot = strchr(p, '.');
        size_t len = dot != NULL ? (size_t)(dot - p) : strlen(p);
        buf[n++] = (unsigned char)len;
        memcpy(buf + n, p, len);
        n += len;
        p += len;
        if (*p == '.') p++;
    }
    buf[n++] = 0;
    buf[n++] = 0; buf[n++] = 1;   /* A */
    buf[n++] = 0; buf[n++] = 1;   /* IN */
    return n;
}

/* A unix socket address of PATH, or of an abstract NAME written @NAME; its length, 0 when too long. */
static socklen_t unix_addr(struct sockaddr_storage *ss, const char *name) {
    struct sockaddr_un *a = (struct sockaddr_un *)ss;
    size_t len = strlen(name);
    memset(ss, 0, sizeof *ss);
    a->sun_family = AF_UNIX;
    if (len == 0 || len >= sizeof a->sun_path) return 0;
    memcpy(a->sun_path, name, len);
    if (name[0] == '@') a->sun_path[0] = '\0';
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
}

/* An IPv4 or IPv6 address of ADDR:PORT (the port after the last colon); its length, 0 when bad. */
static socklen_t inet_addr_port(struct sockaddr_storage *ss, const char *s) {
    char addr[128] = {0};
    const char *c = strrchr(s, ':');
    memset(ss, 0, sizeof *ss);
    if (c == NULL || (size_t)(c - s) >= sizeof addr) return 0;
    memcpy(addr, s, (size_t)(c - s));
    if (strchr(addr, ':') != NULL) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((unsigned short)atoi(c + 1));
        return inet_pton(AF_INET6, addr, &a->sin6_addr) == 1 ? (socklen_t)sizeof *a : 0;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((unsigned short)atoi(c + 1));
        return inet_pton(AF_INET, addr, &a->sin_addr) == 1 ? (socklen_t)sizeof *a : 0;
    }
}

/* Connects fd to the address, waiting up to ms; 0 or an errno. */
static int connect_wait(int fd, const struct sockaddr_storage *ss, socklen_t sl, int ms) {
    int err = 0;
    socklen_t el = sizeof err;
    struct pollfd pf = { fd, POLLOUT, 0 };
    if (connect(fd, (const struct sockaddr *)ss, sl) == 0) return 0;
    if (errno != EINPROGRESS) return errno;
    if (poll(&pf, 1, ms) <= 0) return ETIMEDOUT;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    return err;
}

/* One target of `net`: its answer once known, else the socket whose connect is under way. */
typedef struct probe {
    const char *target;
    const char *answer;
    int fd;
} probe;

/* Starts a connect of a stream socket fd: the answer when it is known at once, else fd stays pending. */
static void probe_connect(probe *p, int fd, const struct sockaddr_storage *ss, socklen_t sl) {
    if (connect(fd, (const struct sockaddr *)ss, sl) == 0) p->answer = "CONNECTED";
    else if (errno == EINPROGRESS) { p->fd = fd; return; }
    else p->answer = ename(errno);
    close(fd);
}

/* unix:PATH or unix:@NAME: a connect to a unix stream socket. */
static void start_unix(probe *p, const char *name) {
    struct sockaddr_storage ss;
    socklen_t sl = unix_addr(&ss, name);
    int fd;
    if (sl == 0) { p->answer = "BADADDR"; return; }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) { p->answer = ename(errno); return; }
    probe_connect(p, fd, &ss, sl);
}

/* kind:addr:port, e.g. tcp:1.1.1.1:80, udp:::1:53 (the port after the last colon); raw:addr; unix:name.
** A datagram is sent and a raw socket opened at once; a connect is left under way (p->fd). */
static void start_net(probe *p, const char *name) {
    const char *target = p->target;
    char kind[8] = {0}, addr[128] = {0};
    const char *c1 = strchr(target, ':'), *c2 = strrchr(target, ':');
    struct sockaddr_storage ss;
    socklen_t sl;
    int fd, v6, port = 0;
    memset(&ss, 0, sizeof ss);
    if (c1 == NULL || (size_t)(c1 - target) >= sizeof kind) { p->answer = "BADTARGET"; return; }
    memcpy(kind, target, (size_t)(c1 - target));
    if (strcmp(kind, "unix") == 0) { start_unix(p, c1 + 1); return; }
    if (strcmp(kind, "raw") == 0) {
        snprintf(addr, sizeof addr, "%s", c1 + 1);
    } else {
        if (c2 == c1 || (size_t)(c2 - c1 - 1) >= sizeof addr) { p->answer = "BADTARGET"; return; }
        memcpy(addr, c1 + 1, (size_t)(c2 - c1 - 1));
        port = atoi(c2 + 1);
    }
    v6 = strchr(addr, ':') != NULL;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((unsigned short)port);
        if (inet_pton(AF_INET6, addr, &a->sin6_addr) != 1) { p->answer = "BADADDR"; return; }
        sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((unsigned short)port);
        if (inet_pton(AF_INET, addr, &a->sin_addr) != 1) { p->answer = "BADADDR"; return; }
        sl = sizeof *a;
    }
    if (strcmp(kind, "raw") == 0) {
        fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_RAW, v6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP);
        p->answer = fd >= 0 ? "OPENED" : ename(errno);
        if (fd >= 0) close(fd);
        return;
    }
    fd = socket(v6 ? AF_INET6 : AF_INET, (strcmp(kind, "tcp") == 0 ? SOCK_STREAM : SOCK_DGRAM) | SOCK_NONBLOCK, 0);
    if (fd < 0) { p->answer = ename(errno); return; }
    if (strcmp(kind, "tcp") == 0) { probe_connect(p, fd, &ss, sl); return; }
    {
        unsigned char q[512];
        size_t n = dns_query(q, name);
        ssize_t sent = sendto(fd, q, n, 0, (struct sockaddr *)&ss, sl);
        p->answer = sent >= 0 ? "SENT" : ename(errno);
    }
    close(fd);
}

/* `net`: every target tried at once, each connect given 1.5 s from the start (as long as when they
** were tried one after another, in a fraction of the time); one line a target, in their order. */
static int cmd_net(const char *name, char **targets, int n) {
    probe *ps = (probe *)calloc((size_t)n, sizeof *ps);
    struct pollfd *pf = (struct pollfd *)calloc((size_t)n, sizeof *pf);
    long long until = now_ms() + 1500;
    int i;
    if (ps == NULL || pf == NULL) { printf("net=ENOMEM\n"); free(ps); free(pf); return 1; }
    for (i = 0; i < n; i++) {
        ps[i].target = targets[i];
        ps[i].fd = -1;
        start_net(&ps[i], name);
    }
    for (;;) {
        int np = 0, j, rc, left = (int)(until - now_ms());
        for (i = 0; i < n; i++) {
            if (ps[i].fd < 0) continue;
            pf[np].fd = ps[i].fd;
            pf[np].events = POLLOUT;
            pf[np].revents = 0;
            np++;
        }
        if (np == 0) break;
        rc = left > 0 ? poll(pf, (nfds_t)np, left) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) {
            for (i = 0; i < n; i++)
                if (ps[i].fd >= 0) { ps[i].answer = "ETIMEDOUT"; close(ps[i].fd); ps[i].fd = -1; }
            break;
        }
        for (j = 0; j < np; j++) {
            int err = 0;
            socklen_t el = sizeof err;
            if (pf[j].revents == 0) continue;
            for (i = 0; i < n && ps[i].fd != pf[j].fd; i++) { }
            getsockopt(pf[j].fd, SOL_SOCKET, SO_ERROR, &err, &el);
            ps[i].answer = err == 0 ? "CONNECTED" : ename(err);
            close(ps[i].fd);
            ps[i].fd = -1;
        }
    }
    for (i = 0; i < n; i++) printf("%s=%s\n", ps[i].target, ps[i].answer);
    free(ps);
    free(pf);
    return 0;
}

/* Answers connections on the listening fd with an HTTP response carrying text, until `until_ms`. */
static void serve_loop(int lfd, const char *text, long long until_ms) {
    char req[1024], resp[512];
    int n = snprintf(resp, sizeof resp, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n", strlen(text) + 1, text);
    if (n < 0 || (size_t)n >= sizeof resp) return;
    for (;;) {
        long long left = until_ms - now_ms();
        struct pollfd pf = { lfd, POLLIN, 0 };
        int c;
        if (left <= 0) return;
        if (poll(&pf, 1, (int)(left > 1000 ? 1000 : left)) <= 0) continue;
        c = accept(lfd, NULL, NULL);
        if (c < 0) continue;
        {
            struct pollfd cf = { c, POLLIN, 0 };
            if (poll(&cf, 1, 500) > 0 && read(c, req, sizeof req) < 0) { /* the request is not needed */ }
        }
        if (write(c, resp, (size_t)n) < 0) { /* the client left */ }
        close(c);
    }
}

static int cmd_serve(const char *target, long ms, const char *text) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    int fd, one = 1, sync[2];
    pid_t pid;
    char b;
    if (strncmp(target, "tcp:", 4) == 0) sl = inet_addr_port(&ss, target + 4);
    else if (strncmp(target, "unix:", 5) == 0) sl = unix_addr(&ss, target + 5);
    if (sl == 0) { printf("serve=BADTARGET\n"); return 1; }
    fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0) { printf("serve=%s\n", ename(errno)); return 1; }
    if (ss.ss_family != AF_UNIX) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 16) != 0) {
        printf("serve=%s\n", ename(errno));
        return 1;
    }
    if (pipe(sync) != 0) { printf("serve=%s\n", ename(errno)); return 1; }
    pid = fork();
    if (pid < 0) { printf("serve=%s\n", ename(errno)); return 1; }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        long long until = now_ms() + ms;
        setsid();
        if (null >= 0) { dup2(null, 0); dup2(null, 1); dup2(null, 2); if (null > 2) close(null); }
        close(sync[0]);
        close(sync[1]);   /* the parent may go */
        serve_loop(fd, text, until);
        _exit(0);
    }
    close(sync[1]);
    if (read(sync[0], &b, 1) < 0) { /* EOF once the child is detached */ }
    printf("serve=LISTENING pid=%ld\n", (long)pid);
    return 0;
}

static int cmd_get(const char *target) {
    struct sockaddr_storage ss;
    socklen_t sl = inet_addr_port(&ss, target);
    char buf[4096];
    size_t len = 0;
    long long until;
    int fd, rc;
    const char *req = "GET / HTTP/1.0\r\n\r\n";
    char *body, *nl;
    if (sl == 0) { printf("get=BADADDR\n"); return 1; }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) { printf("get=%s\n", ename(errno)); return 0; }
    rc = connect_wait(fd, &ss, sl, 1500);
    printf("get=%s\n", rc == 0 ? "CONNECTED" : ename(rc));
    if (rc != 0) { close(fd); return 0; }
    if (write(fd, req, strlen(req)) < 0) { close(fd); return 0; }
    until = now_ms() + 3000;
    while (len < sizeof buf - 1 && now_ms() < until) {
        struct pollfd pf = { fd, POLLIN, 0 };
        ssize_t n;
        if (poll(&pf, 1, 200) <= 0) continue;
        n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    body = strstr(buf, "\r\n\r\n");
    if (body == NULL) { printf("body=NONE\n"); return 0; }
    body += 4;
    nl = strchr(body, '\n');
    if (nl != NULL) *nl = '\0';
    printf("body=%s\n", body);
    return 0;
}

static int cmd_send(const char *target, const char *path, long conns, long chunk, long gap_us, long ms) {
    struct sockaddr_storage ss;
    socklen_t sl = inet_addr_port(&ss, target);
    static int fds[1024];
    static size_t off[1024];
    char *data = NULL;
    size_t len = 0, cap = 0;
    long long sent = 0, until;
    long i, opened = 0, ended = 0, busy;
    FILE *f = fopen(path, "rb");
    if (sl == 0 || f == NULL || conns < 1 || conns > 1024 || chunk < 1) { printf("send=BADARGS\n"); return 1; }
    for (;;) {
        size_t n;
        if (len == cap) {
            char *more = realloc(data, cap = cap * 2 + 65536);
            if (more == NULL) { printf("send=ENOMEM\n"); return 1; }
            data = more;
        }
        n = fread(data + len, 1, cap - len, f);
        if (n == 0) break;
        len += n;
    }
    fclose(f);
    for (i = 0; i < conns; i++) {
        int one = 1;
        fds[i] = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
        off[i] = 0;
        if (fds[i] < 0) break;
        if (connect_wait(fds[i], &ss, sl, 1500) != 0) { close(fds[i]); break; }
        setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        opened++;
    }
    /* each connection a chunk in turn, so the peer has every connection's bytes trickling at once */
    until = now_ms() + 60000;
    do {
        long long before = sent;
        busy = 0;
        for (i = 0; i < opened; i++) {
            size_t n = len - off[i] < (size_t)chunk ? len - off[i] : (size_t)chunk;
            ssize_t w;
            if (fds[i] < 0 || n == 0) continue;
            busy++;
            w = send(fds[i], data + off[i], n, MSG_NOSIGNAL);
            if (w > 0) { off[i] += (size_t)w; sent += w; }
            else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                close(fds[i]);
                fds[i] = -1;
                ended++;
            }
        }
        if (busy > 0 && sent == before) usleep(1000);
        else if (busy > 0 && gap_us > 0) usleep((useconds_t)gap_us);
    } while (busy > 0 && now_ms() < until);
    printf("conns=%ld sent=%lld ended=%ld\n", opened, sent, ended);
    until = now_ms() + ms;
    while (now_ms() < until) usleep(10000);
    for (i = 0; i < opened; i++) if (fds[i] >= 0) close(fds[i]);
    free(data);
    return 0;
}

/* {------------------------------------------------------ syscalls: what the agent's filter refuses */

/* One probe: the result of a raw system call as OK or its errno name. */
static void report(const char *kind, const char *name, long rc) {
    printf("%s.%s=%s\n", kind, name, rc >= 0 ? "OK" : ename(errno));
}

#define DENY(name, ...) report("deny", name, syscall(__VA_ARGS__))

/* A system call through the i386 ABI (int 0x80), from this 64-bit process. */
static long syscall_i386(long nr) {
#if defined(__x86_64__)
    long r;
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(nr) : "memory");
    if (r < 0 && r > -4096) { errno = (int)-r; return -1; }
    return r;
#else
    (void)nr;
    errno = ENOSYS;
    return -1;
#endif
}

/* A clone with a namespace flag; a child it makes (where nothing refuses) exits at once. */
static long clone_ns(unsigned long flag) {
    long rc = syscall(SYS_clone, flag | SIGCHLD, 0, 0, 0, 0);
    if (rc == 0) _exit(0);
    if (rc > 0) waitpid((pid_t)rc, NULL, 0);
    return rc;
}

static void *thread_ok(void *arg) { return arg; }

static int cmd_syscalls(void) {
    static char byte = '#';
    int prio, fd;
    pid_t parent = getppid();
    cpu_set_t cpus;
    struct rlimit rl;
    struct sched_param sp;
    pthread_t t;
    FILE *st;
    char line[256];

    /* what Docker's default profile refuses too */
    DENY("mount", SYS_mount, 0, 0, 0, 0, 0);
    DENY("umount2", SYS_umount2, 0, 0);
    DENY("pivot_root", SYS_pivot_root, 0, 0);
    DENY("chroot", SYS_chroot, 0);
    DENY("fsopen", SYS_fsopen, 0, 0);
    DENY("open_tree", SYS_open_tree, -1, 0, 0);
    DENY("move_mount", SYS_move_mount, -1, 0, -1, 0, 0);
    DENY("swapon", SYS_swapon, 0, 0);
    DENY("swapoff", SYS_swapoff, 0);
    DENY("reboot", SYS_reboot, 0, 0, 0, 0);                     /* bad magic */
    DENY("kexec_load", SYS_kexec_load, 0, 0, 0, 0xffff0000ul);  /* bad flags */
    DENY("kexec_file_load", SYS_kexec_file_load, -1, -1, 0, 0, 0);
    DENY("init_module", SYS_init_module, 0, 0, 0);
    DENY("finit_module", SYS_finit_module, -1, 0, 0);
    DENY("delete_module", SYS_delete_module, 0, 0);
    DENY("acct", SYS_acct, 1);                                  /* a bad pointer */
    DENY("settimeofday", SYS_settimeofday, 1, 0);
    DENY("clock_settime", SYS_clock_settime, CLOCK_MONOTONIC, 0);
    DENY("clock_adjtime", SYS_clock_adjtime, CLOCK_REALTIME, 0);
    DENY("adjtimex", SYS_adjtimex, 0);
    DENY("unshare", SYS_unshare, CLONE_NEWUTS);
    DENY("setns", SYS_setns, -1, 0);
    report("deny", "clone_newuser", clone_ns(CLONE_NEWUSER));
    report("deny", "clone_newns", clone_ns(CLONE_NEWNS));
    report("deny", "clone_newnet", clone_ns(CLONE_NEWNET));
    report("deny", "clone_newpid", clone_ns(CLONE_NEWPID));
    DENY("clone3", SYS_clone3, 0, 0);                           /* ENOSYS: the C library falls back */
    DENY("keyctl", SYS_keyctl, 9999, 0, 0, 0, 0);
    DENY("add_key", SYS_add_key, 0, 0, 0, 0, 0);
    DENY("request_key", SYS_request_key, 0, 0, 0, 0);
    DENY("bpf", SYS_bpf, 9999, 0, 0);
    DENY("perf_event_open", SYS_perf_event_open, 0, 0, -1, -1, 0);
    DENY("userfaultfd", SYS_userfaultfd, 0xffffffffu);          /* bad flags */
    DENY("open_by_handle_at", SYS_open_by_handle_at, -1, 0, 0);
    DENY("name_to_handle_at", SYS_name_to_handle_at, -1, 0, 0, 0, 0);
    DENY("lookup_dcookie", SYS_lookup_dcookie, 0, 0, 0);
    DENY("quotactl", SYS_quotactl, 0, 0, 0, 0);
    DENY("nfsservctl", SYS_nfsservctl, 0, 0, 0);
    DENY("iopl", SYS_iopl, 99);
    DENY("ioperm", SYS_ioperm, 0, 0, 0);
    DENY("syslog", SYS_syslog, 9999, 0, 0);
    DENY("uselib", SYS_uselib, 0);
    DENY("fanotify_init", SYS_fanotify_init, 0xffffffffu, 0);
    DENY("mbind", SYS_mbind, 0, 0, 9999, 0, 0, 0);
    DENY("move_pages", SYS_move_pages, -1, 0, 0, 0, 0, 0);
    DENY("migrate_pages", SYS_migrate_pages, -1, 0, 0, 0);
    DENY("set_mempolicy", SYS_set_mempolicy, 9999, 0, 0);
    DENY("get_mempolicy", SYS_get_mempolicy, 0, 0, 0, 0, 0xffffffffu);
    DENY("kcmp", SYS_kcmp, -1, -1, 9999, 0, 0);
    DENY("pidfd_getfd", SYS_pidfd_getfd, -1, 0, 0);
    DENY("process_madvise", SYS_process_madvise, -1, 0, 0, 0, 0);
    DENY("sethostname", SYS_sethostname, 1, 99999);             /* too long */
    DENY("setdomainname", SYS_setdomainname, 1, 99999);
    DENY("sysfs", SYS_sysfs, 9999, 0, 0);
    DENY("personality", SYS_personality, READ_IMPLIES_EXEC | ADDR_NO_RANDOMIZE);
    DENY("personality_high", SYS_personality, 0x100000000ul | ADDR_NO_RANDOMIZE);
    /* more than Docker */
    DENY("io_uring_setup", SYS_io_uring_setup, 0, 0);
    DENY("io_uring_enter", SYS_io_uring_enter, -1, 0, 0, 0, 0, 0);
    DENY("io_uring_register", SYS_io_uring_register, -1, 0, 0, 0);
    DENY("socket_vsock", SYS_socket, 40 /* AF_VSOCK */, SOCK_STREAM, 0);
    DENY("socket_vsock_high", SYS_socket, 0x100000000ul | 40, SOCK_STREAM, 0);
    DENY("socket_netlink_audit", SYS_socket, AF_NETLINK, SOCK_RAW, 9 /* NETLINK_AUDIT */);
    DENY("socket_netlink_uevent", SYS_socket, AF_NETLINK, SOCK_DGRAM, 15 /* NETLINK_KOBJECT_UEVENT */);
    /* other processes than its own */
    errno = 0;
    prio = getpriority(PRIO_PROCESS, (id_t)parent);
    if (errno == 0) DENY("setpriority_other", SYS_setpriority, PRIO_PROCESS, parent, prio);
    else report("deny", "setpriority_other", -1);
    errno = 0;
    prio = getpriority(PRIO_PGRP, 0);
    DENY("setpriority_group", SYS_setpriority, PRIO_PGRP, 0, prio);
    if (sched_getaffinity(parent, sizeof cpus, &cpus) == 0)
        DENY("sched_setaffinity_other", SYS_sched_setaffinity, parent, sizeof cpus, &cpus);
    else report("deny", "sched_setaffinity_other", -1);
    if (sched_getparam(parent, &sp) == 0)
        DENY("sched_setparam_other", SYS_sched_setparam, parent, &sp);
    else report("deny", "sched_setparam_other", -1);
    if (sched_getparam(parent, &sp) == 0)
        DENY("sched_setscheduler_other", SYS_sched_setscheduler, parent, sched_getscheduler(parent), &sp);
    else report("deny", "sched_setscheduler_other", -1);
    DENY("sched_setattr_other", SYS_sched_setattr, parent, 0, 0);
    if (syscall(SYS_prlimit64, parent, RLIMIT_CORE, 0, &rl) == 0)
        DENY("prlimit_other", SYS_prlimit64, parent, RLIMIT_CORE, &rl, 0);
    else report("deny", "prlimit_other", -1);
    prio = (int)syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, parent);
    if (prio >= 0) DENY("ioprio_set_other", SYS_ioprio_set, 1, parent, prio);
    else report("deny", "ioprio_set_other", -1);
    prio = (int)syscall(SYS_ioprio_get, 1, 0);
    if (prio >= 0) DENY("ioprio_set_group", SYS_ioprio_set, 2 /* IOPRIO_WHO_PGRP */, 0, prio);
    else report("deny", "ioprio_set_group", -1);
    fd = open("/dev/null", O_RDONLY | O_CLOEXEC);   /* no terminal: ENOTTY where nothing refuses */
    DENY("tiocsti", SYS_ioctl, fd, TIOCSTI, &byte);
    DENY("tiocsti_high", SYS_ioctl, fd, 0xffffffff00000000ul | TIOCSTI, &byte);
    if (fd >= 0) close(fd);
    {
        int flag = -1;
        prctl(PR_GET_CHILD_SUBREAPER, &flag, 0, 0, 0);
        printf("subreaper=%d\n", flag);
    }
    DENY("clear_subreaper", SYS_prctl, PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
    report("deny", "abi_i386", syscall_i386(20 /* getpid */));
    DENY("abi_x32", 0x40000000l | SYS_getpid);

    /* what must still work */
    report("allow", "personality_query", syscall(SYS_personality, 0xffffffffu));
    report("allow", "personality_linux", syscall(SYS_personality, PER_LINUX));
    errno = 0;
    prio = getpriority(PRIO_PROCESS, 0);
    report("allow", "setpriority_self", syscall(SYS_setpriority, PRIO_PROCESS, 0, prio < 19 ? prio + 1 : prio));
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0)
        report("allow", "sched_setaffinity_self", syscall(SYS_sched_setaffinity, 0, sizeof cpus, &cpus));
    if (getrlimit(RLIMIT_CORE, &rl) == 0) report("allow", "prlimit_self", syscall(SYS_prlimit64, 0, RLIMIT_CORE, &rl, 0));
    report("allow", "prlimit_read_other", syscall(SYS_prlimit64, parent, RLIMIT_CORE, 0, &rl));
    prio = (int)syscall(SYS_ioprio_get, 1, 0);
    report("allow", "ioprio_set_self", prio >= 0 ? syscall(SYS_ioprio_set, 1, 0, prio) : -1);
    report("allow", "set_subreaper", syscall(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
    fd = socket(AF_INET, SOCK_STREAM, 0);
    report("allow", "socket_inet", fd);
    if (fd >= 0) close(fd);
    fd = socket(AF_INET6, SOCK_DGRAM, 0);
    report("allow", "socket_inet6", fd);
    if (fd >= 0) close(fd);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    report("allow", "socket_unix", fd);
    if (fd >= 0) close(fd);
    fd = socket(AF_NETLINK, SOCK_RAW, 0 /* NETLINK_ROUTE */);
    report("allow", "socket_netlink_route", fd);
    if (fd >= 0) close(fd);
    {
        pid_t p = fork();
        if (p == 0) _exit(0);
        if (p > 0) waitpid(p, NULL, 0);
        report("allow", "fork", p);
    }
    errno = pthread_create(&t, NULL, thread_ok, NULL);
    report("allow", "thread", errno == 0 ? 0 : -1);
    if (errno == 0) pthread_join(t, NULL);
    report("allow", "getpid", syscall(SYS_getpid));

    st = fopen("/proc/self/status", "r");
    while (st != NULL && fgets(line, sizeof line, st) != NULL)
        if (strncmp(line, "Seccomp_filters:", 16) == 0) printf("filters=%d\n", atoi(line + 16));
    if (st != NULL) fclose(st);
    return 0;
}

/* }------------------------------------------------------ */

/* {------------------------------------------------------ agent: the agent's socket from inside */

static void put32(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

/* Appends a bytes field (core/wire.h) to a frame being built. */
static size_t field(unsigned char *f, size_t at, const char *key, const char *val) {
    size_t kl = strlen(key), vl = strlen(val);
    f[at++] = (unsigned char)kl;
    memcpy(f + at, key, kl);
    at += kl;
    f[at++] = 1;   /* bytes */
    put32(f + at, (unsigned)vl);
    at += 4;
    memcpy(f + at, val, vl);
    return at + vl;
}

/* Sends one request and waits up to 2 s for any answer: ANSWERED, CLOSED or the errno. */
static const char *request(int fd, unsigned id, const char *op, const char *k2, const char *v2) {
    unsigned char f[512], in[4096];
    size_t n = 8;
    struct pollfd pf = { fd, POLLIN, 0 };
    ssize_t got;
    put32(f + 4, id);
    n = field(f, n, "op", op);
    if (k2 != NULL) n = field(f, n, k2, v2);
    put32(f, (unsigned)(n - 4));
    if (send(fd, f, n, MSG_NOSIGNAL) != (ssize_t)n) return ename(errno);
    if (poll(&pf, 1, 2000) <= 0) return "SILENT";
    got = recv(fd, in, sizeof in, 0);
    if (got > 0) return "ANSWERED";
    return got == 0 ? "CLOSED" : ename(errno);
}

static int cmd_agent(const char *path) {
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        printf("connect=%s\n", ename(errno));
        return 0;
    }
    printf("connect=OK\n");
    printf("hello=%s\n", request(fd, 1, "hello", NULL, NULL));
    printf("setup=%s\n", request(fd, 2, "setup", "workdir", "/tmp"));
    printf("exec=%s\n", request(fd, 3, "exec", NULL, NULL));
    close(fd);
    return 0;
}

/* }------------------------------------------------------ */

static int cmd_names(const char *dir, long n, long len) {
    char path[4096], first[4096];
    long i;
    int e = 0, fd;
    if (len < 8 || len > 255) len = 8;
    mkdir(dir, 0755);
    snprintf(first, sizeof first, "%s/f", dir);
    fd = open(first, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) { printf("names=0 err=%s\n", ename(errno)); return 0; }
    close(fd);
    for (i = 1; i < n; i++) {
        int k = snprintf(path, sizeof path, "%s/%0*ld", dir, (int)len, i);
        if (k < 0 || (size_t)k >= sizeof path) break;
        if (link(first, path) != 0) { e = errno; break; }
    }
    printf("names=%ld err=%s\n", i, ename(e));
    return 0;
}

static int cmd_seccomp_fill(char **argv) {
    static struct sock_filter allow[4096];
    unsigned short size = 4096;
    size_t i;
    for (i = 0; i < sizeof allow / sizeof allow[0]; i++) {
        struct sock_filter f = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
        allow[i] = f;
    }
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    while (size > 0) {
        struct sock_fprog prog = { size, allow };
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) size /= 2;
    }
    execvp(argv[0], argv);
    perror("abuse: exec");
    return 127;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(c, "threads") == 0 && argc > 2) return cmd_threads(atol(argv[2]));
    if (strcmp(c, "forks") == 0 && argc > 2) return cmd_forks(atol(argv[2]));
    if (strcmp(c, "bomb") == 0) return cmd_bomb();
    if (strcmp(c, "mem") == 0 && argc > 2) return cmd_mem(atol(argv[2]));
    if (strcmp(c, "spin") == 0 && argc > 3) return cmd_spin(atol(argv[2]), atol(argv[3]));
    if (strcmp(c, "inodes") == 0 && argc > 3) return cmd_inodes(argv[2], atol(argv[3]));
    if (strcmp(c, "tiocsti") == 0) return cmd_tiocsti();
    if (strcmp(c, "ptrace") == 0 && argc > 2) return cmd_ptrace((pid_t)atol(argv[2]));
    if (strcmp(c, "swap") == 0 && argc > 4) return cmd_swap(argv[2], argv[3], atol(argv[4]));
    if (strcmp(c, "flood") == 0 && argc > 2) return cmd_flood(atoll(argv[2]));
    if (strcmp(c, "sysctl") == 0) return cmd_sysctl();
    if (strcmp(c, "serve") == 0 && argc > 4) return cmd_serve(argv[2], atol(argv[3]), argv[4]);
    if (strcmp(c, "get") == 0 && argc > 2) return cmd_get(argv[2]);
    if (strcmp(c, "send") == 0 && argc > 7)
        return cmd_send(argv[2], argv[3], atol(argv[4]), atol(argv[5]), atol(argv[6]), atol(argv[7]));
    if (strcmp(c, "syscalls") == 0) return cmd_syscalls();
    if (strcmp(c, "agent") == 0 && argc > 2) return cmd_agent(argv[2]);
    if (strcmp(c, "names") == 0 && argc > 4) return cmd_names(argv[2], atol(argv[3]), atol(argv[4]));
    if (strcmp(c, "seccomp-fill") == 0 && argc > 2) return cmd_seccomp_fill(argv + 2);
    if (strcmp(c, "net") == 0 && argc > 3) {
        return cmd_net(argv[2], argv + 3, argc - 3);
    }
    fprintf(stderr, "usage: abuse threads|forks|bomb|mem|spin|inodes|tiocsti|ptrace|swap|flood|sysctl|net|"
            "serve|get|send|syscalls|agent|names|seccomp-fill ...\n");
    return 2;
}
