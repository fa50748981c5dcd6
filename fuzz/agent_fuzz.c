/*
** agent_fuzz: the in-sandbox agent's request handling (the pieces of agent/),
** driven as the host drives it but without running anything.
**
** The agent is included whole, piece by piece (its main renamed). Before
** that, the calls through which a request could change anything outside the process are
** replaced by stand-ins whose outcome the input chooses (an "oracle"
** string of bytes): fork always fails (no command ever runs); mkdir,
** rmdir, unlink, unlinkat, rename, chdir and kill do nothing and succeed or
** fail with an errno; stat and lstat report a file, directory, link, fifo
** or an errno; open gives a memfd with contents, a fixed scratch directory
** (build/fuzz/agent-root), /dev/null or an errno; mkostemp gives a memfd;
** openat opens only directories below the scratch directory, never
** following a link. So every op (hello, setup, exec, cancel, read, write,
** list, remove, ping, shutdown, signal, unknown) runs its field extraction, path
** handling and reply building on whatever the input sends.
**
** Input: byte 0 = n, the next n bytes are the oracle, the rest is the byte
** stream from the host. It is written to one end of a socketpair whose
** other end is the agent's connection, and conn_read handles it (frame
** accumulation, wire_parse, dispatch). A model walks the same stream: each
** complete frame that parses and is a request the host would send gets
** exactly one reply, in order, with its id; the first frame out of bounds
** or malformed, or one the host would not send (no op, an unknown op,
** anything before hello, a second setup) closes the connection (the
** replies to the frames before it may then be cut short, the last one
** even in the middle, as the close drops what was not sent yet). Every
** reply must be a frame wire_parse takes, and an error reply has 'error'
** and 'message' as bytes. The syscall filter is left out of the build
** (MAYURA_AGENT_NO_FILTER): no command ever runs here.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MAYURA_FUZZ_ROOT
#define MAYURA_FUZZ_ROOT "."
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* {------------------------------------------------------ the stand-ins */

static const uint8_t *oracle;
static size_t oracle_n;
static int root_fd = -1;
static char root_path[PATH_MAX];

/* The next oracle byte, or -1 when there is none (the stand-ins then fail with EACCES). */
static int ask(void) {
    if (oracle_n == 0) return -1;
    oracle_n--;
    return *oracle++;
}

static int fail_errno(int b) {
    static const int errs[] = { ENOENT, EACCES, ENOTDIR, EISDIR, ENOSPC, EEXIST, ENAMETOOLONG, ELOOP,
                                EROFS, ENOTEMPTY, EPERM, EIO, EAGAIN, EBUSY, EXDEV, EINVAL };
    errno = b < 0 ? EACCES : errs[b % 16];
    return -1;
}

/* A memfd of len bytes: the byte pattern fill, or a hole when fill < 0. */
static int memfd_of(size_t len, int fill) {
    int fd = memfd_create("agent_fuzz", MFD_CLOEXEC);
    if (fd < 0) return fail_errno(11);
    if (fill >= 0) {
        char buf[512];
        size_t done = 0;
        memset(buf, fill, sizeof buf);
        while (done < len) {
            size_t n = len - done < sizeof buf ? len - done : sizeof buf;
            if (write(fd, buf, n) != (ssize_t)n) break;
            done += n;
        }
        lseek(fd, 0, SEEK_SET);
    } else if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return fail_errno(11);
    }
    return fd;
}

static int fz_open(const char *path, int flags, ...) {
    int b = ask();
    (void)path;
    if (flags & O_DIRECTORY) {
        if (b < 0 || b % 4 == 0) return fail_errno(b >> 2);
        return openat(root_fd, b % 4 == 1 ? "." : "sub", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if ((flags & O_ACCMODE) != O_RDONLY || b < 0) return fail_errno(b);
    switch (b % 6) {
    case 1: return memfd_of((size_t)(b >> 3) * 7, b);
    case 2: return openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    case 3: return open("/dev/null", O_RDONLY | O_CLOEXEC);
    case 4: { int s = ask(); return memfd_of((size_t)(s < 0 ? 0 : s) * 1024, -1); }
    case 5: return memfd_of(0, 0);
    default: return fail_errno(b >> 3);
    }
}

static int fz_openat(int dfd, const char *name, int flags, ...) {
    if (!(flags & O_DIRECTORY) || strchr(name, '/') != NULL || strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
        return fail_errno(1);
    return openat(dfd, name, flags | O_NOFOLLOW | O_RDONLY);
}

static int fake_stat(struct stat *st) {
    int b = ask();
    static const mode_t modes[] = { S_IFREG | 0644, S_IFDIR | 0755, S_IFLNK | 0777, S_IFIFO | 0600 };
    if (b < 0 || b % 5 == 4) return fail_errno(b >> 3);
    memset(st, 0, sizeof *st);
    st->st_mode = modes[b % 5];
    st->st_size = (off_t)(b * 13);
    return 0;
}

static int fz_stat(const char *path, struct stat *st) { (void)path; return fake_stat(st); }
static int fz_lstat(const char *path, struct stat *st) { (void)path; return fake_stat(st); }

static int outcome(void) {
    int b = ask();
    if (b >= 0 && b % 2 == 0) return 0;
    return fail_errno(b < 0 ? -1 : b >> 1);
}

static int fz_mkdir(const char *p, mode_t m) { (void)p; (void)m; return outcome(); }
static int fz_rmdir(const char *p) { (void)p; return outcome(); }
static int fz_unlink(const char *p) { (void)p; return outcome(); }
static int fz_unlinkat(int d, const char *p, int f) { (void)d; (void)p; (void)f; return outcome(); }
static int fz_rename(const char *a, const char *b) { (void)a; (void)b; return outcome(); }
static int fz_chdir(const char *p) { (void)p; return 0; }
static int fz_kill(pid_t pid, int sig) { (void)pid; (void)sig; return 0; }
static DIR *fz_opendir(const char *p) { (void)p; errno = EACCES; return NULL; }

static int fz_mkostemp(char *tmpl, int flags) {
    size_t n = strlen(tmpl);
    int b = ask();
    (void)flags;
    if (n >= 6) memcpy(tmpl + n - 6, "fuzzed", 6);
    if (b >= 0 && b % 3 != 0) return memfd_of(0, 0);
    return fail_errno(b < 0 ? -1 : b / 3);
}

static pid_t fz_fork(void) {
    int b = ask();
    errno = b >= 0 && b % 2 == 0 ? EAGAIN : ENOMEM;
    return -1;
}

#define open(...) fz_open(__VA_ARGS__)
#define openat(...) fz_openat(__VA_ARGS__)
#define stat(p, s) fz_stat(p, s)
#define lstat(p, s) fz_lstat(p, s)
#define mkdir(p, m) fz_mkdir(p, m)
#define rmdir(p) fz_rmdir(p)
#define unlink(p) fz_unlink(p)
#define unlinkat(d, p, f) fz_unlinkat(d, p, f)
#define rename(a, b) fz_rename(a, b)
#define chdir(p) fz_chdir(p)
#define kill(p, s) fz_kill(p, s)
#define opendir(p) fz_opendir(p)
#define mkostemp(t, f) fz_mkostemp(t, f)
#define fork() fz_fork()
#define main agent_main
#define MAYURA_AGENT_NO_FILTER

/* }------------------------------------------------------ */

/* every piece of the agent, as one translation unit (the Makefile links the same files) */
#include "../agent/main.c"
#include "../agent/conn.c"
#include "../agent/exec.c"
#include "../agent/spawn.c"
#include "../agent/filter.c"
#include "../agent/request.c"
#include "../agent/fileops.c"

#undef open
#undef openat
#undef stat
#undef lstat
#undef mkdir
#undef rmdir
#undef unlink
#undef unlinkat
#undef rename
#undef chdir
#undef kill
#undef opendir
#undef mkostemp
#undef fork
#undef main

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "\n*** fuzz invariant broken: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

/* The scratch tree: a.txt, sub/b, link -> a.txt. Only ever read. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    int fd;
    (void)argc;
    (void)argv;
    snprintf(root_path, sizeof root_path, "%s/build/fuzz/agent-root", MAYURA_FUZZ_ROOT);
    mkdir(MAYURA_FUZZ_ROOT "/build", 0755);
    mkdir(MAYURA_FUZZ_ROOT "/build/fuzz", 0755);
    mkdir(root_path, 0755);
    root_fd = open(root_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) fail("cannot open %s", root_path);
    mkdirat(root_fd, "sub", 0755);
    fd = openat(root_fd, "a.txt", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) { if (write(fd, "hello\n", 6) < 0) {} close(fd); }
    fd = openat(root_fd, "sub/b", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    symlinkat("a.txt", root_fd, "link");
    signal(SIGPIPE, SIG_IGN);
    snprintf(tag_prefix, sizeof tag_prefix, "fuzz");
    return 0;
}

/* What the model makes of a request: 1 answered, 0 ends the connection; *hello and *setup follow it. */
static int model_request(const wire_msg *m, int *hello, int *setup) {
    static const char *const ops[] = { "hello", "setup", "exec", "cancel", "read", "write", "list", "remove",
                                       "ping", "shutdown", "signal" };
    const wire_field *f = wire_find(m, "op");
    size_t i;
    if (f == NULL || f->type != WIRE_BYTES) return 0;
    for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strlen(ops[i]) == f->len && memcmp(ops[i], f->val, f->len) == 0) break;
    if (i == sizeof ops / sizeof ops[0]) return 0;
    if (i == 0) { *hello = 1; return 1; }
    if (!*hello) return 0;
    if (i == 1) {
        if (*setup) return 0;
        *setup = 1;
    }
    return 1;
}

/* Global state of the agent back to a fresh start. */
static void reset(void) {
    size_t i;
    for (i = 0; i < setup_n; i++) free(setup_env[i]);
    free(setup_env);
    setup_env = NULL;
    setup_n = 0;
    free(workdir);
    workdir = strdup(root_path);
    if (workdir == NULL) abort();
    shutting_down = 0;
    fd_mode = 0;
}

/* Reads what the agent sent; flushes its queue until everything is out. */
static void drain(conn *c, int peer, unsigned char **buf, size_t *len, size_t *cap) {
    long rounds = 0;
    for (;;) {
        ssize_t n;
        if (*cap - *len < 65536) {
            *cap = *cap * 2 + 65536;
            *buf = (unsigned char *)realloc(*buf, *cap);
            if (*buf == NULL) abort();
        }
        n = read(peer, *buf + *len, *cap - *len);
        if (n > 0) { *len += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (!c->dead && c->head != NULL && rounds++ < 100000) {
            conn_flush(c);
            continue;
        }
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t expect[4096];
    size_t nexp = 0, off, nreplies = 0, wrote = 0, rlen = 0, rcap = 0;
    unsigned char *replies = NULL;
    int closes = 0, sv[2], hello = 0, setup = 0;
    conn *c;
    if (size == 0) return 0;
    oracle_n = data[0] < size - 1 ? data[0] : size - 1;
    oracle = data + 1;
    data += 1 + oracle_n;
    size -= 1 + oracle_n;
    reset();

    /* the model */
    for (off = 0; size - off >= 4;) {
        uint32_t flen = wire_get_u32(data + off);
        wire_msg m;
        if (flen < 4 || flen > WIRE_MAX_FRAME) { closes = 1; break; }
        if (size - off - 4 < flen) break;
        if (wire_parse(data + off + 4, flen, &m) != 0) { closes = 1; break; }
        if (!model_request(&m, &hello, &setup)) { closes = 1; break; }
        if (nexp == sizeof expect / sizeof expect[0]) return 0;
        expect[nexp++] = m.id;
        off += 4 + (size_t)flen;
    }

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    c = conn_new(sv[0], sv[0]);
    if (c == NULL) { close(sv[1]); return 0; }
    while (wrote < size && !c->dead) {
        ssize_t n = write(sv[1], data + wrote, size - wrote);
        if (n > 0) wrote += (size_t)n;
        else if (n < 0 && errno != EAGAIN && errno != EINTR) break;
        conn_read(c);
        if (!c->dead) drain(c, sv[1], &replies, &rlen, &rcap);
    }
    if (!c->dead) conn_read(c);
    drain(c, sv[1], &replies, &rlen, &rcap);
    if (c->dead != closes) fail("the connection is %s, the model says %s", c->dead ? "closed" : "open", closes ? "closed" : "open");

    /* the replies */
    for (off = 0; off < rlen;) {
        uint32_t flen;
        wire_msg m;
        const wire_field *e;
        if (rlen - off < 4) {
            if (closes) break;   /* the close dropped the rest of a reply being sent */
            fail("a reply cut short");
        }
        flen = wire_get_u32(replies + off);
        if (flen < 4) fail("a reply frame of %u bytes", flen);
        if (rlen - off - 4 < flen) {
            if (closes) break;
            fail("a reply frame of %u bytes with %zu left", flen, rlen - off - 4);
        }
        if (wire_parse(replies + off + 4, flen, &m) != 0) fail("wire_parse refuses reply %zu", nreplies);
        if (nreplies >= nexp) fail("more replies than requests");
        if (m.id != expect[nreplies]) fail("reply %zu has id %u, expected %u", nreplies, m.id, expect[nreplies]);
        if (getenv("FUZZ_VERBOSE") != NULL) {
            int i;
            fprintf(stderr, "reply %u:", m.id);
            for (i = 0; i < m.nfields; i++)
                fprintf(stderr, " %.*s=%.*s", (int)m.fields[i].key_len, m.fields[i].key,
                        m.fields[i].type == WIRE_BYTES ? (int)(m.fields[i].len > 60 ? 60 : m.fields[i].len) : 1,
                        m.fields[i].type == WIRE_BYTES ? (const char *)m.fields[i].val : "#");
            fprintf(stderr, "\n");
        }
        if ((e = wire_find(&m, "error")) != NULL) {
            const wire_field *msg = wire_find(&m, "message");
            if (e->type != WIRE_BYTES || msg == NULL || msg->type != WIRE_BYTES) fail("an error reply without error and message");
        } else if (m.nfields == 0) {
            fail("an empty reply");
        }
        nreplies++;
        off += 4 + (size_t)flen;
    }
    if (!closes && nreplies != nexp) fail("%zu replies for %zu requests", nreplies, nexp);

    if (!c->dead) conn_close(c);
    conn_sweep();
    close(sv[1]);
    free(replies);
    return 0;
}
