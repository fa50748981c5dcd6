/*
** snapshot.c: mayura-launch's native snapshots (features.snapshots 'native', see
** providers/mayura/sandbox/_local_snap.lua):
**
**   mayura-launch --snapshot LAUNCHER UID NAME MAX PATH... | --snapshot-drop NAME | --snapshot-sweep
**
** takes a snapshot of a running sandbox into a tmpfs of its own under SNAPROOT, takes one off, or
** takes off those whose host process is gone; the mount table's `overlay` step (mount.c) starts a
** sandbox from one.
*/
#include "launch.h"

/* Where snapshots are kept: a small tmpfs, root's alone (0700), that holds one tmpfs of each
** snapshot, named OWNERPID-OWNERSTART-HEX (the host process that made it, and when it started). */
#define SNAPROOT "/run/mayura-snap"

/* Exit statuses of --snapshot (the provider maps them to its errors). */
#define SNAP_LIMIT 3     /* past the byte cap */
#define SNAP_ROOM 4      /* the host has no room (memory) */
#define SNAP_UNREADABLE 5
#define SNAP_CHANGED 6   /* changed while read, or the sandbox is gone */

static void snap_die(int code, const char *what) {
    fprintf(stderr, "mayura-launch: %s: %s\n", what, strerror(errno));
    _exit(code);
}

/* The status for a failed write to the snapshot, or read of the sandbox. */
static int write_status(int e) { return e == ENOSPC || e == EDQUOT || e == ENOMEM || e == EFBIG ? SNAP_ROOM : FAIL; }
static int read_status(int e) { return e == EACCES || e == EPERM ? SNAP_UNREADABLE : e == ENOMEM ? SNAP_ROOM : SNAP_CHANGED; }

/* Whether NAME is a snapshot's name (digits-digits-hex). */
static int snap_name(const char *name) {
    const char *p = name;
    int part;
    for (part = 0; part < 3; part++) {
        const char *start = p;
        while (part < 2 ? (*p >= '0' && *p <= '9') : ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) p++;
        if (p == start || p - start > 32) return 0;
        if (part < 2 && *p++ != '-') return 0;
    }
    return *p == '\0';
}

/* SNAPROOT, made (a tmpfs of its own, root's, 0700) when missing; refused when not root's. */
static void snap_root(void) {
    struct stat st, run;
    int lock;
    if (mkdir(SNAPROOT, 0700) != 0 && errno != EEXIST) die(SNAPROOT);
    /* one mount however many hosts start at once: whoever holds the lock looks, and mounts */
    lock = open(SNAPROOT, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) die(SNAPROOT);
    if (lstat(SNAPROOT, &st) != 0 || lstat("/run", &run) != 0) die(SNAPROOT);
    if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 077) != 0) { errno = EPERM; die(SNAPROOT); }
    if (st.st_dev == run.st_dev
        && mount("mayura", SNAPROOT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1048576,nr_inodes=4096,mode=0700") != 0)
        die(SNAPROOT);
    close(lock);
}

/* Takes a snapshot off the host: its tmpfs, then its directory. */
static int snap_drop(const char *name) {
    char path[512];
    if (!snap_name(name)) { errno = EINVAL; return -1; }
    snprintf(path, sizeof path, SNAPROOT "/%s", name);
    if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) != 0 && errno != EINVAL && errno != ENOENT) return -1;
    if (rmdir(path) != 0 && errno != ENOENT) return -1;
    return 0;
}

/* When process `pid` started (/proc/PID/stat's 22nd field), or 0. */
static unsigned long long start_time(long pid) {
    char path[64], buf[1024], *p;
    int i;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if (read_small(path, buf, sizeof buf) <= 0 || (p = strrchr(buf, ')')) == NULL) return 0;
    for (i = 0; i < 20 && p != NULL; i++) p = strchr(p + 1, ' ');   /* field 3 follows ") " */
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

/* Every snapshot whose host process is gone (a host killed before it released them). */
static int snap_sweep(void) {
    DIR *dir = opendir(SNAPROOT);
    struct dirent *e;
    int rc = 0;
    if (dir == NULL) return errno == ENOENT ? 0 : FAIL;
    while ((e = readdir(dir)) != NULL) {
        char *p;
        long pid;
        unsigned long long started;
        if (!snap_name(e->d_name)) continue;
        pid = strtol(e->d_name, &p, 10);
        started = strtoull(p + 1, NULL, 10);
        if (start_time(pid) == started) continue;
        if (snap_drop(e->d_name) != 0) rc = FAIL;
    }
    closedir(dir);
    return rc;
}

/* What a copy has taken of its cap so far. */
static unsigned long long snap_used, snap_max;

/* Counts `n` more bytes against the cap (each entry 512, a file's data the 4 KiB pages the
** snapshot's tmpfs gives it, a long link's target one page): past it, the copy ends. What is
** counted is what the snapshot holds of the host's memory, so the cap bounds it. */
static void snap_count(unsigned long long n) {
    snap_used += n;
    if (snap_used > snap_max) { errno = EFBIG; snap_die(SNAP_LIMIT, "max_snapshot_bytes"); }
}

static void copy_times(int dst, const char *name, const struct stat *st, int flags) {
    struct timespec ts[2];
    ts[0] = st->st_atim;
    ts[1] = st->st_mtim;
    if (utimensat(dst, name, ts, flags) != 0) snap_die(write_status(errno), name);
}

/* The files with more than one name copied so far: their first copy's path in the snapshot, so
** that a later name is linked to it (a hard link stays one). A table hashed by inode (a sandbox
** can have a hundred thousand of them: no list scanned for each), whose paths are counted against
** the cap like the snapshot's own memory. */
struct snap_link { dev_t dev; ino_t ino; char *path; };
static struct snap_link *snap_links;   /* snap_caplinks slots (a power of 2), path NULL when free */
static size_t snap_nlinks, snap_caplinks;
static int snap_top = -1;          /* the snapshot's directory */
static char snap_path[8192];       /* where the copy is, relative to snap_top */

/* The slot of (dev, ino) in the table: its own, or the free one where it would go. */
static size_t link_slot(struct snap_link *t, size_t cap, dev_t dev, ino_t ino) {
    size_t i = (size_t)((((unsigned long long)ino ^ ((unsigned long long)dev << 32)) * 0x9E3779B97F4A7C15ULL) >> 32)
        & (cap - 1);
    while (t[i].path != NULL && !(t[i].dev == dev && t[i].ino == ino)) i = (i + 1) & (cap - 1);
    return i;
}

/* Links NAME in `dst` to an earlier copy of the same file; whether it did. */
static int copy_link(int dst, const char *name, const struct stat *st) {
    size_t i;
    if (snap_caplinks == 0) return 0;
    i = link_slot(snap_links, snap_caplinks, st->st_dev, st->st_ino);
    return snap_links[i].path != NULL && linkat(snap_top, snap_links[i].path, dst, name, 0) == 0;
}

static void note_link(const char *name, const struct stat *st) {
    size_t n = strlen(snap_path) + strlen(name) + 2, i;
    char *path;
    snap_count(n + 2 * sizeof *snap_links);
    if (2 * (snap_nlinks + 1) > snap_caplinks) {
        size_t cap = snap_caplinks ? 2 * snap_caplinks : 64, j;
        struct snap_link *more = calloc(cap, sizeof *more);
        if (more == NULL) return;   /* the next name is copied, not linked */
        for (j = 0; j < snap_caplinks; j++)
            if (snap_links[j].path != NULL)
                more[link_slot(more, cap, snap_links[j].dev, snap_links[j].ino)] = snap_links[j];
        free(snap_links);
        snap_links = more;
        snap_caplinks = cap;
    }
    i = link_slot(snap_links, snap_caplinks, st->st_dev, st->st_ino);
    if (snap_links[i].path != NULL) return;
    path = malloc(n);
    if (path == NULL) return;
    snprintf(path, n, "%s/%s", snap_path, name);
    snap_links[i].dev = st->st_dev;
    snap_links[i].ino = st->st_ino;
    snap_links[i].path = path;
    snap_nlinks++;
}

/* Copies the regular file NAME of `src` (looked at as `st`) into `dst`. */
static void copy_file(int src, int dst, const char *name, const struct stat *st) {
    static char buf[1 << 20];
    struct stat now;
    off_t left = st->st_size;
    int in, out;
    if (st->st_nlink > 1 && copy_link(dst, name, st)) {
        snap_count(512);
        return;
    }
    snap_count(512 + (((unsigned long long)st->st_size + 4095) / 4096) * 4096);
    in = openat(src, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (in < 0) snap_die(read_status(errno), name);
    if (fstat(in, &now) != 0 || !S_ISREG(now.st_mode) || now.st_ino != st->st_ino || now.st_dev != st->st_dev) {
        errno = ESTALE;
        snap_die(SNAP_CHANGED, name);
    }
    out = openat(dst, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out < 0) snap_die(write_status(errno), name);
    while (left > 0) {
        ssize_t r = read(in, buf, left < (off_t)sizeof buf ? (size_t)left : sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) snap_die(read_status(errno), name);
        if (r == 0) { errno = ESTALE; snap_die(SNAP_CHANGED, name); }   /* shorter than it was */
        if (write_all(out, buf, (size_t)r) != 0) snap_die(write_status(errno), name);
        left -= r;
    }
    if (fchmod(out, st->st_mode & 07777) != 0) snap_die(write_status(errno), name);
    close(in);
    if (close(out) != 0) snap_die(write_status(errno), name);
    copy_times(dst, name, st, AT_SYMLINK_NOFOLLOW);
    if (st->st_nlink > 1) note_link(name, st);
}

/* Copies the directory `src` into the (new, empty) directory `dst`, never following a link and
** never leaving `src`'s file system; at `top`, not the backends' own names under /tmp. */
static void copy_dir(int src, int dst, int depth, int top_tmp) {
    DIR *dir;
    struct dirent *e;
    int fd = dup(src);
    if (depth > 256) { errno = ELOOP; snap_die(SNAP_CHANGED, "depth"); }
    if (fd < 0 || (dir = fdopendir(fd)) == NULL) snap_die(read_status(errno), "directory");
    for (;;) {
        struct stat st;
        const char *n;
        errno = 0;
        if ((e = readdir(dir)) == NULL) {
            if (errno != 0) snap_die(read_status(errno), "directory");
            break;
        }
        n = e->d_name;
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0) continue;
        if (top_tmp && (strncmp(n, ".mayura-", 8) == 0 || strcmp(n, ".X11-unix") == 0)) continue;
        if (fstatat(src, n, &st, AT_SYMLINK_NOFOLLOW) != 0) snap_die(read_status(errno), n);
        if (S_ISDIR(st.st_mode)) {
            struct stat now, here;
            int s, d;
            snap_count(512);
            s = openat(src, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (s < 0) snap_die(read_status(errno), n);
            if (fstat(s, &now) != 0 || fstat(src, &here) != 0 || now.st_ino != st.st_ino || now.st_dev != here.st_dev) {
                errno = EXDEV;
                snap_die(SNAP_CHANGED, n);
            }
            if (mkdirat(dst, n, 0700) != 0) snap_die(write_status(errno), n);
            d = openat(dst, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (d < 0) snap_die(write_status(errno), n);
            {
                size_t at = strlen(snap_path);
                if (at + strlen(n) + 2 > sizeof snap_path) { errno = ENAMETOOLONG; snap_die(SNAP_CHANGED, n); }
                snprintf(snap_path + at, sizeof snap_path - at, "/%s", n);
                copy_dir(s, d, depth + 1, 0);
                snap_path[at] = '\0';
            }
            if (fchmod(d, st.st_mode & 07777) != 0) snap_die(write_status(errno), n);
            close(s);
            close(d);
            copy_times(dst, n, &st, AT_SYMLINK_NOFOLLOW);
        } else if (S_ISREG(st.st_mode)) {
            copy_file(src, dst, n, &st);
        } else if (S_ISLNK(st.st_mode)) {
            char target[4097];
            ssize_t k;
            snap_count(512 + (st.st_size > 100 ? 4096 : 0));
            k = readlinkat(src, n, target, sizeof target - 1);
            if (k < 0) snap_die(read_status(errno), n);
            target[k] = '\0';
            if (symlinkat(target, dst, n) != 0) snap_die(write_status(errno), n);
            copy_times(dst, n, &st, AT_SYMLINK_NOFOLLOW);
        } else if (S_ISFIFO(st.st_mode)) {
            snap_count(512);
            if (mkfifoat(dst, n, st.st_mode & 07777) != 0) snap_die(write_status(errno), n);
            copy_times(dst, n, &st, AT_SYMLINK_NOFOLLOW);
        }
        /* sockets (and devices, which a nodev tmpfs cannot have) are not kept */
    }
    closedir(dir);
}

/*
** mayura-launch --snapshot LAUNCHER UID NAME MAX PATH...: copies the sandbox's PATHs (absolute
** directories, the working directory and /tmp) into a new tmpfs at SNAPROOT/NAME, each under its
** own name (/workspace to NAME/workspace), and prints the bytes it counted. LAUNCHER is the pid of
** that sandbox's mayura-launch; its bubblewrap's child, the sandbox's PID 1, must run as UID. A
** child joins that process's mount namespace and takes UID (so it reads what the sandbox's user
** can, and finds every name in the sandbox's own view), then copies through descriptors only, no
** link followed (a link is copied as a link), nothing past MAX bytes. Any failure takes the
** snapshot off (nothing is left) and exits with one of the SNAP_ statuses, or 125.
*/
static int snap_take(char **a, int n) {
    const char *name = a[2];
    char *end, path[512];
    unsigned long long max;
    unsigned long uid;
    long launcher;
    pid_t kids[8], first = 0, pid, child;
    int nk, i, status, mnt, dst;
    char opts[128];
    struct stat st;
    launcher = strtol(a[0], &end, 10);
    if (*end != '\0' || launcher <= 1) { errno = EINVAL; die("launcher"); }
    uid = strtoul(a[1], &end, 10);
    if (*end != '\0' || uid == 0 || uid > 0x7fffffffUL) { errno = EINVAL; die("uid"); }
    max = strtoull(a[3], &end, 10);
    if (*end != '\0' || max > (1ULL << 40)) { errno = EINVAL; die("max"); }
    if (!snap_name(name)) { errno = EINVAL; die("name"); }
    for (i = 4; i < n; i++)
        if (a[i][0] != '/' || a[i][1] == '\0' || strchr(a[i] + 1, '/') != NULL) { errno = EINVAL; die(a[i]); }
    /* the sandbox's PID 1: the child of its launcher's child (bubblewrap), running as UID */
    nk = children((pid_t)launcher, kids, 8);
    if (nk == 1) first = kids[0];
    nk = first > 0 ? children(first, kids, 8) : 0;
    if (nk != 1) { errno = ESRCH; snap_die(SNAP_CHANGED, "sandbox"); }
    pid = kids[0];
    snprintf(path, sizeof path, "/proc/%ld/ns/mnt", (long)pid);
    mnt = open(path, O_RDONLY | O_CLOEXEC);
    if (mnt < 0 || fstat(mnt, &st) != 0) snap_die(SNAP_CHANGED, "sandbox");
    snprintf(path, sizeof path, "/proc/%ld", (long)pid);
    if (stat(path, &st) != 0 || st.st_uid != (uid_t)uid) { errno = ESRCH; snap_die(SNAP_CHANGED, "sandbox"); }
    snap_root();
    snprintf(path, sizeof path, SNAPROOT "/%s", name);
    if (mkdir(path, 0700) != 0) die(path);
    /* its pages are the host's memory, counted against MAX as they are copied (snap_count): this
    ** size is met only when the host's memory runs out first */
    snprintf(opts, sizeof opts, "size=%llu,nr_inodes=%llu,mode=0700", max + 16777216ULL,
        max / 512 + 1024);
    if (mount("mayura", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
        int e = errno;
        (void)rmdir(path);
        errno = e;
        snap_die(write_status(errno), path);
    }
    dst = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dst < 0 || fchown(dst, (uid_t)uid, (uid_t)uid) != 0) { (void)snap_drop(name); die(path); }
    child = fork();
    if (child < 0) { (void)snap_drop(name); die("fork"); }
    if (child == 0) {
        snap_max = max;
        if (setns(mnt, CLONE_NEWNS) != 0) snap_die(SNAP_CHANGED, "setns");
        if (chdir("/") != 0) snap_die(SNAP_CHANGED, "chdir");
        if (setgroups(0, NULL) != 0 || setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0
            || setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) die("setuid");
        umask(0);
        for (i = 4; i < n; i++) {
            int s = open_nofollow(AT_FDCWD, a[i], 0), d;
            if (s >= 0) {   /* O_PATH: opened again, as a directory to read (this /proc is the sandbox's) */
                int r = openat(s, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                close(s);
                s = r;
            }
            if (s < 0) {
                if (errno == ENOENT) continue;
                snap_die(read_status(errno), a[i]);
            }
            if (mkdirat(dst, a[i] + 1, 0700) != 0) snap_die(write_status(errno), a[i]);
            d = openat(dst, a[i] + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (d < 0) snap_die(write_status(errno), a[i]);
            snap_top = dst;
            snprintf(snap_path, sizeof snap_path, "%s", a[i] + 1);
            copy_dir(s, d, 0, strcmp(a[i], "/tmp") == 0);
            close(s);
            close(d);
        }
        printf("%llu\n", snap_used);
        if (fflush(stdout) != 0) _exit(FAIL);
        _exit(0);
    }
    close(mnt);
    close(dst);
    while (waitpid(child, &status, 0) < 0) if (errno != EINTR) { status = FAIL << 8; break; }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    (void)snap_drop(name);
    return WIFEXITED(status) ? WEXITSTATUS(status) : FAIL;
}

int snapshot_main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(argv[1], "--snapshot") == 0 && argc >= 6) return snap_take(argv + 2, argc - 2);
    if (strcmp(argv[1], "--snapshot-drop") == 0 && argc == 3) {
        if (snap_drop(argv[2]) != 0) die(argv[2]);
        return 0;
    }
    if (strcmp(argv[1], "--snapshot-sweep") == 0 && argc == 2) return snap_sweep();
    errno = EINVAL;
    die("usage: mayura-launch --snapshot LAUNCHER UID NAME MAX PATH... | --snapshot-drop NAME | --snapshot-sweep");
    return FAIL;
}
