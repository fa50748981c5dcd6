/*
** abuse.c: the hostile program the abuse specs run inside sandboxes.
**
** Built static by spec/support/providers.lua (`providers.abuse_binary()`),
** written into each sandbox with write_file, so the same attempts run in a
** busybox container and in a local sandbox alike. Every subcommand bounds
** its own run time, prints what it got as `key=value` lines on stdout, and
** never needs anything from the image.
**
**   abuse threads N          start up to N sleeping threads; threads=<started> err=<errno name>
**   abuse forks N            fork up to N sleeping children; forks=<started> err=<errno name>
**   abuse mem MIB            allocate and touch MIB MiB, 1 MiB at a time; touched=<MiB>
**   abuse spin MS THREADS    busy-loop THREADS threads for MS ms; cpu_ms=<used> wall_ms=<elapsed>
**   abuse inodes DIR MS      make empty files in DIR until failure or MS ms; files=<made> err=<name>
**   abuse tiocsti            TIOCSTI on fds 0..2, /dev/tty and a new pty; one line each
**   abuse ptrace PID         attach, seize, /proc/PID/mem, process_vm_readv; one line each
**   abuse swap A B MS        swap A and B with RENAME_EXCHANGE until MS ms; swaps=<count>
**   abuse flood BYTES        write BYTES of 'x' to stdout, no newline; wrote=<bytes> (on stderr)
**   abuse sysctl             try writing kernel knobs under /proc/sys and /sys; one line each
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
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

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(c, "threads") == 0 && argc > 2) return cmd_threads(atol(argv[2]));
    if (strcmp(c, "forks") == 0 && argc > 2) return cmd_forks(atol(argv[2]));
    if (strcmp(c, "mem") == 0 && argc > 2) return cmd_mem(atol(argv[2]));
    if (strcmp(c, "spin") == 0 && argc > 3) return cmd_spin(atol(argv[2]), atol(argv[3]));
    if (strcmp(c, "inodes") == 0 && argc > 3) return cmd_inodes(argv[2], atol(argv[3]));
    if (strcmp(c, "tiocsti") == 0) return cmd_tiocsti();
    if (strcmp(c, "ptrace") == 0 && argc > 2) return cmd_ptrace((pid_t)atol(argv[2]));
    if (strcmp(c, "swap") == 0 && argc > 4) return cmd_swap(argv[2], argv[3], atol(argv[4]));
    if (strcmp(c, "flood") == 0 && argc > 2) return cmd_flood(atoll(argv[2]));
    if (strcmp(c, "sysctl") == 0) return cmd_sysctl();
    fprintf(stderr, "usage: abuse threads|forks|mem|spin|inodes|tiocsti|ptrace|swap|flood|sysctl ...\n");
    return 2;
}
