/*
** stage.c: mayura-stage, the first step of a local sandbox (providers/mayura/sandbox/local.lua).
**
** The launcher shell runs it where it ran a shell, unshare(1), mount(8), chown(1) and setpriv(1)
** one after the other: one static program instead of five, the same steps in the same order.
**
**   mayura-stage BWRAP [ARG...]
**
**   1. joins each cgroup of MAYURA_CG (space-separated directories; any failure: exit 125);
**   2. shields itself from the OOM killer through the legacy knob (oom_adj -17; refused: ignored);
**   3. with MAYURA_MOUNT (the provider's mount table, root's alone): a mount namespace of its own,
**      everything private, each line mounted (`source target type options 0 0`; X-mount.mkdir
**      makes the target), then MAYURA_STAGE/root and MAYURA_STAGE/w given to MAYURA_UID (125);
**   4. with MAYURA_UID: no supplementary groups, then that gid and uid, real, effective and saved;
**   5. descriptors: with MAYURA_INFO, 7 becomes 4 (bubblewrap's --info-fd); the agent's bytes on
**      5 become 0; with MAYURA_ETC_FDS, MAYURA_ETC_1..5 are read by bubblewrap from pipes on 5..9
**      (each with a newline at the end), else with MAYURA_RESOLV that one on 5;
**   6. becomes BWRAP (127 when it cannot).
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define FAIL 125

static void die(const char *what) {
    fprintf(stderr, "mayura-stage: %s: %s\n", what, strerror(errno));
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

static void join_cgroups(const char *dirs) {
    char pid[32], path[4096];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    while (*dirs != '\0') {
        size_t n = strcspn(dirs, " ");
        if (n > 0) {
            if (n + sizeof "/cgroup.procs" > sizeof path) { errno = ENAMETOOLONG; die("cgroup"); }
            memcpy(path, dirs, n);
            memcpy(path + n, "/cgroup.procs", sizeof "/cgroup.procs");
            if (write_file(path, pid) != 0) die("cgroup");
        }
        dirs += n;
        while (*dirs == ' ') dirs++;
    }
}

/* Drops ",X-mount.mkdir" (and a leading one) from options, in place; says whether it was there. */
static int take_mkdir(char *opts) {
    static const char tok[] = "X-mount.mkdir";
    char *p = strstr(opts, tok);
    size_t n = sizeof tok - 1;
    if (p == NULL || (p[n] != '\0' && p[n] != ',') || (p != opts && p[-1] != ',')) return 0;
    if (p != opts) { p--; n++; }
    else if (p[n] == ',') n++;
    memmove(p, p + n, strlen(p + n) + 1);
    return 1;
}

static void mount_table(const char *table) {
    char buf[8192], *line, *save = NULL;
    ssize_t got = 0, r;
    int fd = open(table, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) die("mount table");
    while ((r = read(fd, buf + got, sizeof buf - 1 - (size_t)got)) > 0) got += r;
    if (r < 0) die("mount table");
    close(fd);
    buf[got] = '\0';
    if (unshare(CLONE_NEWNS) != 0) die("unshare");
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die("mount private");
    for (line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *f[4], *fs = NULL;
        int i;
        for (i = 0; i < 4; i++) {
            f[i] = strtok_r(i == 0 ? line : NULL, " \t", &fs);
            if (f[i] == NULL) { errno = EINVAL; die("mount table"); }
        }
        if (take_mkdir(f[3]) && mkdir(f[1], 0755) != 0 && errno != EEXIST) die("mkdir");
        if (mount(f[0], f[1], f[2], 0, f[3]) != 0) die("mount");
    }
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

int main(int argc, char **argv) {
    const char *cg = env("MAYURA_CG"), *table = env("MAYURA_MOUNT"), *uid_s = env("MAYURA_UID");
    uid_t uid = 0;
    if (argc < 2) { errno = EINVAL; die("usage: mayura-stage BWRAP [ARG...]"); }
    if (uid_s != NULL) {
        char *end;
        unsigned long v = strtoul(uid_s, &end, 10);
        if (*end != '\0' || v == 0 || v > 0x7fffffffUL) { errno = EINVAL; die("MAYURA_UID"); }
        uid = (uid_t)v;
    }
    if (cg != NULL) join_cgroups(cg);
    (void)write_file("/proc/self/oom_adj", "-17");
    if (table != NULL) {
        const char *stage = env("MAYURA_STAGE");
        char root[4096], w[4096];
        if (stage == NULL || uid_s == NULL) { errno = EINVAL; die("MAYURA_STAGE"); }
        mount_table(table);
        snprintf(root, sizeof root, "%s/root", stage);
        snprintf(w, sizeof w, "%s/w", stage);
        if (chown(root, uid, uid) != 0 || chown(w, uid, uid) != 0) die("chown");
        if (chdir("/") != 0) die("chdir");
    }
    if (uid_s != NULL) {
        if (setgroups(0, NULL) != 0) die("setgroups");
        if (setresgid(uid, uid, uid) != 0) die("setresgid");
        if (setresuid(uid, uid, uid) != 0) die("setresuid");
    }
    if (env("MAYURA_INFO") != NULL) {
        if (dup2(7, 4) < 0) die("dup2");
        close(7);
    }
    if (dup2(5, 0) < 0) die("dup2");
    close(5);
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
    execv(argv[1], argv + 1);
    fprintf(stderr, "mayura-stage: %s: %s\n", argv[1], strerror(errno));
    return 127;
}
