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
** off, or takes off those whose host process is gone (see snap_take); the mount table's `overlay`
** step starts a sandbox from one.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/file.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define FAIL 125
#define TABLE_MAX 32768

static void die(const char *what) {
    fprintf(stderr, "mayura-launch: %s: %s\n", what, strerror(errno));
    _exit(FAIL);
}

static int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static int write_file(const char *path, const char *s) {
    int fd = open(path, O_WRONLY | O_CLOEXEC), rc;
    if (fd < 0) return -1;
    rc = write_all(fd, s, strlen(s));
    if (close(fd) != 0) rc = -1;
    return rc;
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : NULL;
}

/* Joins each cgroup of `dirs`. On cgroup v1 by writing 0 (this thread) to `tasks`: this process
** has one thread, so that moves all of it, and a single thread's move skips the kernel's global
** lock of thread groups, whose taking waits for an RCU grace period (milliseconds, more on a
** loaded machine) when no other move is under way; on v2 (no `tasks`), the pid to cgroup.procs. */
static void join_cgroups(const char *dirs) {
    char pid[32], path[4096];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    while (*dirs != '\0') {
        size_t n = strcspn(dirs, " ");
        if (n > 0) {
            if (n + sizeof "/cgroup.procs" > sizeof path) { errno = ENAMETOOLONG; die("cgroup"); }
            memcpy(path, dirs, n);
            memcpy(path + n, "/tasks", sizeof "/tasks");
            if (access(path, F_OK) == 0) {
                if (write_file(path, "0") != 0) die("cgroup");
            } else {
                memcpy(path + n, "/cgroup.procs", sizeof "/cgroup.procs");
                if (write_file(path, pid) != 0) die("cgroup");
            }
        }
        dirs += n;
        while (*dirs == ' ') dirs++;
    }
}

/* Drops the option `tok` from the comma-separated `opts`, in place; says whether it was there. */
static int take_opt(char *opts, const char *tok) {
    size_t n = strlen(tok);
    char *p = opts;
    while ((p = strstr(p, tok)) != NULL) {
        if ((p[n] == '\0' || p[n] == ',') && (p == opts || p[-1] == ',')) {
            if (p != opts) { p--; n++; }
            else if (p[n] == ',') n++;
            memmove(p, p + n, strlen(p + n) + 1);
            return 1;
        }
        p += n;
    }
    return 0;
}

/* The mount flags named in `opts` (taken out of it: what is left is the file system's data). */
static unsigned long take_flags(char *opts) {
    static const struct { const char *name; unsigned long flag; } known[] = {
        { "ro", MS_RDONLY }, { "nosuid", MS_NOSUID }, { "nodev", MS_NODEV }, { "noexec", MS_NOEXEC },
    };
    unsigned long flags = 0;
    size_t i;
    for (i = 0; i < sizeof known / sizeof known[0]; i++)
        while (take_opt(opts, known[i].name)) flags |= known[i].flag;
    return flags;
}

/* Writes all of descriptor `from` (to its end) into `to`. */
static int copy_fd(int from, int to) {
    char buf[65536];
    for (;;) {
        ssize_t r = read(from, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return 0;
        if (write_all(to, buf, (size_t)r) != 0) return -1;
    }
}

/* A new file at `path` (never one that is there, never through a link) given to `uid`, with
** `mode`, holding MAYURA_ETC_<n> and a newline (n >= 1) or, n == 0, all of descriptor 0. */
static void new_file(const char *path, const char *n_s, mode_t mode, uid_t uid) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode), rc;
    if (fd < 0) die(path);
    if (n_s == NULL) {
        rc = copy_fd(0, fd);
    } else {
        char name[32];
        const char *v;
        snprintf(name, sizeof name, "MAYURA_ETC_%.8s", n_s);
        v = getenv(name);
        rc = write_all(fd, v != NULL ? v : "", v != NULL ? strlen(v) : 0) != 0 || write_all(fd, "\n", 1) != 0 ? -1 : 0;
    }
    if (rc != 0 || fchown(fd, uid, uid) != 0 || fchmod(fd, mode) != 0) die(path);
    if (close(fd) != 0) die(path);
}

/* The image of a sandbox's root (the table's `image` step): a descriptor of its directory, opened
** once; every relative source of a bind is resolved beneath it. -1 until then. */
static int image_fd = -1;

/* Opens `path` (O_PATH) from `dir` without following a link at any of its names, the last one
** included (a link is opened as itself): with `beneath`, never out of `dir` either. No `..`, `.`
** or empty name is taken at all. openat2 does it in one call; where the kernel lacks it (ENOSYS,
** or EPERM from a container's seccomp profile that predates it), or with MAYURA_WALK (the specs
** try both), one name at a time with O_NOFOLLOW. -1 and errno. */
static int open_nofollow(int dir, const char *path, int beneath) {
    char name[4096];
    const char *p = path;
    int fd, at;
    if (path[0] == '\0') { errno = EINVAL; return -1; }
    if (strlen(path) >= sizeof name) { errno = ENAMETOOLONG; return -1; }
    while (*p != '\0') {
        size_t n = strcspn(p, "/");
        if ((n == 0 && p != path) || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) {
            errno = EINVAL;
            return -1;
        }
        p += n;
        if (*p == '/') {
            if (p[1] == '\0') { errno = EINVAL; return -1; }
            p++;
        }
    }
    if (beneath != (path[0] != '/')) { errno = EXDEV; return -1; }
    if (env("MAYURA_WALK") == NULL) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
        how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | (beneath ? RESOLVE_BENEATH : 0);
        fd = (int)syscall(SYS_openat2, dir, path, &how, sizeof how);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return fd;
    }
    at = beneath ? dir : open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (at < 0) return -1;
    p = path + (path[0] == '/');
    if (*p == '\0') return at;   /* "/" itself */
    for (;;) {
        size_t n = strcspn(p, "/");
        int last = p[n] == '\0';
        memcpy(name, p, n);
        name[n] = '\0';
        fd = openat(at, name, O_PATH | O_NOFOLLOW | O_CLOEXEC | (last ? 0 : O_DIRECTORY));
        if (at != dir) close(at);
        if (fd < 0) { if (errno == ENOTDIR) errno = ELOOP; return -1; }
        if (last) return fd;
        at = fd;
        p += n + 1;
    }
}

/* Whether the directory `fd` holds this program (it, or a directory above it): an image that
** holds mayura's own tree (the checkout, the installed programs) would hand it to the sandbox. */
static int holds_self(int fd) {
    char self[4096];
    struct stat img, st;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || fstat(fd, &img) != 0) return 1;
    self[n] = '\0';
    for (;;) {
        char *slash = strrchr(self, '/');
        if (slash == NULL) return 0;
        slash[slash == self ? 1 : 0] = '\0';
        if (stat(self, &st) == 0 && st.st_dev == img.st_dev && st.st_ino == img.st_ino) return 1;
        if (slash == self) return 0;
    }
}

/* The table's `image DIR`: DIR opened once, each of its names without following a link, and
** every directory from / to it owned by root and writable by nobody else (as sshd asks of the
** directories of its keys): so nobody but root can change what DIR or any name in it leads to
** while the sandbox starts. The root itself is never an image, nor a directory that holds this
** program, and an image comes once. */
static void open_image(const char *path) {
    const char *p = path;
    int at = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (image_fd >= 0 || path[0] != '/' || path[1] == '\0') { errno = EINVAL; die("image"); }
    for (;;) {
        char name[256];
        size_t n;
        int fd;
        if (at < 0 || fstat(at, &st) != 0) die(path);
        if (!S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
            errno = EPERM;
            die(path);
        }
        while (*p == '/') p++;
        if (*p == '\0') break;
        n = strcspn(p, "/");
        if (n >= sizeof name || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) {
            errno = EINVAL;
            die(path);
        }
        memcpy(name, p, n);
        name[n] = '\0';
        p += n;
        fd = openat(at, name, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
        close(at);
        if (fd < 0 && errno == ENOTDIR) errno = ELOOP;
        at = fd;
    }
    if (holds_self(at)) { errno = EPERM; die(path); }
    image_fd = at;
}

/* A read-only bind of `src` (not what is mounted under it) at `path`: a new directory or an empty
** file as `src` is one or, `over`, the regular file or directory of that kind at `path`. `src` is
** a path of the host's (absolute) or of the image (relative: beneath image_fd); no name of either,
** nor of an `over` path, is ever a link: `src` may lie in an image another user can change while
** the sandbox starts, and this runs as root, so what is bound is the very directory or file looked
** at (through its descriptor), never what a link swapped in would name. */
static void bind_ro(const char *src, const char *path, int over) {
    struct stat st, at;
    char from[64], to[64];
    const char *named = path;
    int fd, tfd = -1;
    if (src[0] != '/' && image_fd < 0) { errno = EINVAL; die(src); }
    fd = open_nofollow(src[0] == '/' ? AT_FDCWD : image_fd, src, src[0] != '/');
    if (fd < 0 || fstat(fd, &st) != 0) die(src);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) { errno = ELOOP; die(src); }
    if (over) {
        tfd = open_nofollow(AT_FDCWD, path, 0);
        if (tfd < 0 || fstat(tfd, &at) != 0) die(path);
        if (!(S_ISDIR(st.st_mode) ? S_ISDIR(at.st_mode) : S_ISREG(at.st_mode))) {
            errno = EINVAL;
            die(path);
        }
        snprintf(to, sizeof to, "/proc/self/fd/%d", tfd);
        path = to;
    } else if (S_ISDIR(st.st_mode)) {
        if (mkdir(path, 0755) != 0) die(path);
    } else {
        int t = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
        if (t < 0 || close(t) != 0) die(path);
    }
    snprintf(from, sizeof from, "/proc/self/fd/%d", fd);
    if (mount(from, path, NULL, MS_BIND, NULL) != 0) die(path);
    if (tfd >= 0) {   /* the new mount is on top of the one the descriptor holds: found by the name */
        close(tfd);
        tfd = open_nofollow(AT_FDCWD, named, 0);
        if (tfd < 0) die(named);
        snprintf(to, sizeof to, "/proc/self/fd/%d", tfd);
    }
    if (mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0) die(named);
    if (tfd >= 0) close(tfd);
    close(fd);
}

/* The mount table (MAYURA_MOUNT), read at the start. */
static char table_text[TABLE_MAX];

/*
** Reads the mount table from the descriptor MAYURA_MOUNT names (5..9): a file in memory the host
** made for this sandbox alone and sealed against writes (core.sealed_fd), so that nobody, not even
** who else may hold it, can change it between the host's write and this read; it has no name in
** any directory, so nothing is left behind. Less than TABLE_MAX bytes. Then closes it.
*/
static void read_table(const char *fd_s) {
    struct stat st;
    size_t got = 0;
    int fd, seals;
    if (fd_s[0] < '5' || fd_s[0] > '9' || fd_s[1] != '\0') { errno = EBADF; die("mount table"); }
    fd = fd_s[0] - '0';
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || fstat(fd, &st) != 0) die("mount table");
    if (!S_ISREG(st.st_mode) || (seals & F_SEAL_WRITE) == 0 || (seals & F_SEAL_SHRINK) == 0) {
        errno = EPERM;
        die("mount table");
    }
    if (st.st_size >= TABLE_MAX) { errno = EFBIG; die("mount table"); }
    while (got < (size_t)st.st_size) {
        ssize_t r = pread(fd, table_text + got, (size_t)st.st_size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("mount table");
        got += (size_t)r;
    }
    table_text[got] = '\0';
    if (strlen(table_text) != got) { errno = EINVAL; die("mount table"); }
    close(fd);
}

/* A user namespace whose uid and gid map is `from` to `to` (one id), for an idmapped mount: its
** descriptor. A child makes it and waits, its maps are written from here, then it ends. */
static int idmap_userns(uid_t from, uid_t to) {
    int ready[2], go[2], fd;
    char path[64], map[64];
    pid_t pid;
    if (pipe2(ready, O_CLOEXEC) != 0) die("pipe");
    if (pipe2(go, O_CLOEXEC) != 0) die("pipe");
    pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        char c = 0;
        close(ready[0]);
        close(go[1]);
        if (unshare(CLONE_NEWUSER) != 0) _exit(1);
        if (write(ready[1], &c, 1) != 1) _exit(1);
        while (read(go[0], &c, 1) < 0 && errno == EINTR) {}
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    {
        char c;
        ssize_t r;
        while ((r = read(ready[0], &c, 1)) < 0 && errno == EINTR) {}
        if (r != 1) { errno = ECHILD; die("userns"); }
    }
    snprintf(map, sizeof map, "%lu %lu 1\n", (unsigned long)from, (unsigned long)to);
    snprintf(path, sizeof path, "/proc/%ld/uid_map", (long)pid);
    if (write_file(path, map) != 0) die(path);
    snprintf(path, sizeof path, "/proc/%ld/gid_map", (long)pid);
    if (write_file(path, map) != 0) die(path);
    snprintf(path, sizeof path, "/proc/%ld/ns/user", (long)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(path);
    close(go[1]);
    close(ready[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    return fd;
}

/* The table's `overlay LOWER PATH OPTIONS UID` (see mount_table). */
static void overlay_snapshot(const char *lower, const char *path, char *opts, const char *from_s, uid_t uid) {
    char up[4200], work[4200], low[4200], *end;
    const char *m;
    unsigned long from, mode = 0755;
    unsigned long flags;
    int own, tree, ns;
    struct mount_attr attr;
    from = strtoul(from_s, &end, 10);
    if (*end != '\0' || from == 0 || from > 0x7fffffffUL || lower[0] != '/' || strlen(lower) > 4000
        || strlen(path) > 4000 || strpbrk(lower, ",:\\") != NULL || strpbrk(path, ",:\\") != NULL) {
        errno = EINVAL;
        die("overlay");
    }
    if (take_opt(opts, "X-mount.mkdir") && mkdir(path, 0755) != 0 && errno != EEXIST) die(path);
    own = take_opt(opts, "X-mayura.own");
    flags = take_flags(opts);
    m = strstr(opts, "mode=");
    if (m != NULL && (m == opts || m[-1] == ',')) mode = strtoul(m + 5, NULL, 8) & 07777;
    if (mount("mayura", path, "tmpfs", flags, opts) != 0) die(path);
    snprintf(up, sizeof up, "%s/.u", path);
    snprintf(work, sizeof work, "%s/.w", path);
    snprintf(low, sizeof low, "%s/.l", path);
    if (mkdir(up, 0700) != 0 || chmod(up, (mode_t)mode) != 0 || (own && chown(up, uid, uid) != 0)) die(up);
    if (mkdir(work, 0700) != 0) die(work);
    if (mkdir(low, 0700) != 0) die(low);
    /* the snapshot's files as the new sandbox's: an idmapped clone of its directory, read-only */
    ns = idmap_userns((uid_t)from, uid);
    tree = (int)syscall(SYS_open_tree, AT_FDCWD, lower, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
    if (tree < 0) die(lower);
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    attr.userns_fd = (uint64_t)ns;
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) die("idmap");
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, low, MOVE_MOUNT_F_EMPTY_PATH) != 0) die(low);
    close(tree);
    close(ns);
    /* named from PATH, so that the sandbox's mount table shows no path of the host's */
    if (chdir(path) != 0) die(path);
    if (mount("overlay", path, "overlay", flags, "lowerdir=.l,upperdir=.u,workdir=.w") != 0) die(path);
    if (chdir("/") != 0) die("chdir");
}

/*
** The provider's mount table (read_table), one step a line, in a mount namespace of its own
** (everything private). A line is an fstab line, `SOURCE TARGET TYPE OPTIONS 0 0`, whose options
** ro, nosuid, nodev and noexec are mount flags, X-mount.mkdir makes TARGET first and
** X-mayura.own gives the new root of the mount to MAYURA_UID; or one of the steps that build a
** sandbox's root (what is made is `uid`'s, and nothing made may be there already):
**   dir PATH           a directory (0755)
**   file PATH N        a file (0644): MAYURA_ETC_<N> and a newline
**   agent PATH         a file (0555): all of descriptor 0 (the agent's bytes)
**   link TARGET PATH   a symbolic link
**   node NAME PATH     a device node like /dev/NAME (a character device), 0666
**   image DIR          DIR the image, beneath which relative SRCs are found (open_image)
**   bind SRC PATH      SRC bound read-only, nosuid, nodev (not what is mounted under it; SRC a
**                      directory or a regular file, a path of the host's or one relative to the
**                      image, no name of it a link)
**   over SRC PATH      the same over what is at PATH: a directory, or a regular file (not a link)
**   ro PATH [FLAGS]    the mount at PATH read-only, with FLAGS (nosuid, nodev, noexec) and no others
**   overlay LOWER PATH OPTIONS UID
**                      a snapshot's directory LOWER (mayura-launch --snapshot made it, its files
**                      UID's) under PATH: the read-only lower layer of an overlay, its files shown
**                      as MAYURA_UID's (an idmapped mount), over a fresh tmpfs of OPTIONS (as an
**                      fstab line's) that holds the upper layer, whose root gets OPTIONS' mode
**                      (and X-mayura.own: MAYURA_UID's)
**   detach PATH        the mount at PATH and all under it taken off this namespace (none: nothing)
** Any failure: exit 125 (the namespace, and all that is mounted in it, ends with the process).
*/
static void mount_table(char *buf, uid_t uid) {
    char *line, *save = NULL;
    mode_t mask;
    if (unshare(CLONE_NEWNS) != 0) die("unshare");
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("mount private");
    mask = umask(0);
    for (line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *f[5] = { NULL, NULL, NULL, NULL, NULL }, *fs = NULL;
        int i, n = 0;
        for (i = 0; i < 5; i++) {
            f[i] = strtok_r(i == 0 ? line : NULL, " \t", &fs);
            if (f[i] == NULL) break;
            n++;
        }
        if (n == 0) continue;
        if (strcmp(f[0], "dir") == 0 && n == 2) {
            if (mkdir(f[1], 0755) != 0 || lchown(f[1], uid, uid) != 0) die(f[1]);
        } else if (strcmp(f[0], "file") == 0 && n == 3) {
            new_file(f[1], f[2], 0644, uid);
        } else if (strcmp(f[0], "agent") == 0 && n == 2) {
            new_file(f[1], NULL, 0555, uid);
        } else if (strcmp(f[0], "link") == 0 && n == 3) {
            if (symlink(f[1], f[2]) != 0 || lchown(f[2], uid, uid) != 0) die(f[2]);
        } else if (strcmp(f[0], "node") == 0 && n == 3) {
            char dev[64];
            struct stat st;
            snprintf(dev, sizeof dev, "/dev/%.40s", f[1]);
            if (strchr(f[1], '/') != NULL || stat(dev, &st) != 0 || !S_ISCHR(st.st_mode)) { errno = EINVAL; die(dev); }
            if (mknod(f[2], S_IFCHR | 0666, st.st_rdev) != 0) die(f[2]);
        } else if (strcmp(f[0], "image") == 0 && n == 2) {
            open_image(f[1]);
        } else if ((strcmp(f[0], "bind") == 0 || strcmp(f[0], "over") == 0) && n == 3) {
            bind_ro(f[1], f[2], f[0][0] == 'o');
        } else if (strcmp(f[0], "ro") == 0 && n >= 2) {
            unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY;
            if (n > 2) {
                flags |= take_flags(f[2]);
                if (f[2][0] != '\0') { errno = EINVAL; die("mount table"); }
            }
            if (mount(NULL, f[1], NULL, flags, NULL) != 0) die(f[1]);
        } else if (strcmp(f[0], "overlay") == 0 && n == 5) {
            overlay_snapshot(f[1], f[2], f[3], f[4], uid);
        } else if (strcmp(f[0], "detach") == 0 && n == 2) {
            if (umount2(f[1], MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) die(f[1]);
        } else if (n == 4 || (n == 5 && strcmp(f[4], "0") == 0)) {
            int own;
            unsigned long flags;
            if (take_opt(f[3], "X-mount.mkdir") && mkdir(f[1], 0755) != 0 && errno != EEXIST) die("mkdir");
            own = take_opt(f[3], "X-mayura.own");
            flags = take_flags(f[3]);
            if (mount(f[0], f[1], f[2], flags, f[3]) != 0) die("mount");
            if (own && chown(f[1], uid, uid) != 0) die("chown");
        } else {
            errno = EINVAL;
            die("mount table");
        }
    }
    umask(mask);
    if (image_fd >= 0) close(image_fd);
}

/* Puts a pipe holding `text` and a newline on descriptor `target`. */
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
        mount_table(table_text, uid);
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

static void nap_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Reads a small file whole (NUL-terminated, at most cap - 1 bytes); its length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap) {
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

/* SIGKILLs every pid listed (one a line or space-separated) in `path`. */
static void kill_listed(const char *path) {
    static char buf[1 << 16];
    char *p = buf;
    if (read_small(path, buf, sizeof buf) <= 0) return;
    while (*p != '\0') {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p) { p++; continue; }
        if (pid > 1) kill((pid_t)pid, SIGKILL);
        p = end;
    }
}

/* Whether a cgroup still holds a process. */
static int held(const char *dir) {
    char path[4200], buf[32];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    return read_small(path, buf, sizeof buf) > 0;
}

/* Each cgroup directory of MAYURA_CG, in turn. */
#define EACH_CG(d, list, body) do { \
    const char *p_ = (list); \
    while (p_ != NULL && *p_ != '\0') { \
        size_t n_ = strcspn(p_, " "); \
        if (n_ > 0 && n_ < 4000) { char d[4001]; memcpy(d, p_, n_); d[n_] = '\0'; body } \
        p_ += n_; \
        while (*p_ == ' ') p_++; \
    } \
} while (0)

/* Every process in the cgroups: v2 cgroup.kill, else v1's freezer (frozen, so no fork races the
** kill; killed; thawed), else each process listed. */
static void kill_cgroups(const char *cgs) {
    const char *v2 = env("MAYURA_CGKILL"), *fz = env("MAYURA_FREEZER");
    char path[4200], state[64];
    if (v2 != NULL) {
        snprintf(path, sizeof path, "%s/cgroup.kill", v2);
        if (access(path, F_OK) == 0) { (void)write_file(path, "1"); return; }
    }
    if (fz != NULL) {
        int i;
        snprintf(path, sizeof path, "%s/freezer.state", fz);
        (void)write_file(path, "FROZEN");
        for (i = 0; i < 40; i++) {
            if (read_small(path, state, sizeof state) <= 0 || strncmp(state, "FREEZING", 8) != 0) break;
            nap_ms(50);
        }
        snprintf(path, sizeof path, "%s/cgroup.procs", fz);
        kill_listed(path);
        snprintf(path, sizeof path, "%s/freezer.state", fz);
        (void)write_file(path, "THAWED");
        return;
    }
    EACH_CG(d, cgs, {
        snprintf(path, sizeof path, "%s/cgroup.procs", d);
        kill_listed(path);
    });
}

/* The children of `pid`, into kids (at most max); their count. */
static int children(pid_t pid, pid_t *kids, int max) {
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

/* Removes the first `made` cgroups of `cgs` (each in a hierarchy of its own: in any order),
** keeping errno for the message that follows. */
static void unmake_cgroups(const char *cgs, int made) {
    int n = 0, e = errno;
    EACH_CG(d, cgs, { if (n++ < made) (void)rmdir(d); });
    errno = e;
}

/* Whether `path` is a file right inside one of the cgroups of `cgs` (DIR/NAME, NAME without a
** slash or a leading dot). */
static int in_cgroup(const char *cgs, const char *path) {
    int ok = 0;
    EACH_CG(d, cgs, {
        size_t k = strlen(d);
        if (strncmp(path, d, k) == 0 && path[k] == '/' && path[k + 1] != '\0' && path[k + 1] != '.'
            && strchr(path + k + 1, '/') == NULL) ok = 1;
    });
    return ok;
}

/*
** Step 0, with MAYURA_CG_SET: makes each cgroup of MAYURA_CG (its parent too; the cgroup itself
** must be new) and writes its settings, one a line: `PATH VALUE`, with a leading `?` for a
** setting the kernel may lack, PATH a file right inside one of them. Any failure removes what was
** made and exits 125.
*/
static void make_cgroups(const char *cgs, const char *set) {
    char line[4300], parent[4001];
    int made = 0;
    EACH_CG(d, cgs, {
        char *slash;
        memcpy(parent, d, sizeof d);
        slash = strrchr(parent, '/');
        if (slash != NULL && slash != parent) {
            *slash = '\0';
            if (mkdir(parent, 0755) != 0 && errno != EEXIST) { unmake_cgroups(cgs, made); die("cgroup"); }
        }
        if (mkdir(d, 0755) != 0) { unmake_cgroups(cgs, made); die("cgroup"); }
        made++;
    });
    while (*set != '\0') {
        size_t n = strcspn(set, "\n");
        int optional = *set == '?';
        char *value;
        if (n >= sizeof line) { errno = ENAMETOOLONG; unmake_cgroups(cgs, made); die("cgroup setting"); }
        memcpy(line, set + optional, n - (size_t)optional);
        line[n - (size_t)optional] = '\0';
        set += n;
        if (*set == '\n') set++;
        if (line[0] == '\0') continue;
        value = strchr(line, ' ');
        if (value == NULL) { errno = EINVAL; unmake_cgroups(cgs, made); die("cgroup setting"); }
        *value++ = '\0';
        if (!in_cgroup(cgs, line)) { errno = EINVAL; unmake_cgroups(cgs, made); die("cgroup setting"); }
        if (write_file(line, value) != 0 && !optional) { unmake_cgroups(cgs, made); die("cgroup setting"); }
    }
}

/* {======================================================
** Snapshots: mayura-launch --snapshot, --snapshot-drop, --snapshot-sweep
** =======================================================*/

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

static int snapshot_main(int argc, char **argv) {
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
