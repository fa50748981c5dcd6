/*
** mount.c: mayura-launch's mount table (MAYURA_MOUNT, step 1c): read whole at the start from its
** sealed descriptor, then taken step by step in the sandbox's first process, in a mount namespace
** of its own: the tmpfs with their caps, an image's entries opened beneath it and never through a
** link, the steps that build a whole root, a native snapshot's overlay.
*/
#include "launch.h"

#define TABLE_MAX 32768

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
int open_nofollow(int dir, const char *path, int beneath) {
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
void read_table(const char *fd_s) {
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

/* Takes the steps of the mount table read at the start (read_table), giving what it makes to `uid`. */
void take_table(uid_t uid) {
    mount_table(table_text, uid);
}
