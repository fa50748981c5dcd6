/*
** cgroup.c: mayura-launch's cgroups of a sandbox (MAYURA_CG, MAYURA_CG_SET, MAYURA_CGKILL,
** MAYURA_FREEZER): made with their settings before the sandbox starts (step 0), joined by its
** first process (1a), every process in them killed at its end (3), emptied and removed (4).
*/
#include "launch.h"

/* Joins each cgroup of `dirs`. On cgroup v1 by writing 0 (this thread) to `tasks`: this process
** has one thread, so that moves all of it, and a single thread's move skips the kernel's global
** lock of thread groups, whose taking waits for an RCU grace period (milliseconds, more on a
** loaded machine) when no other move is under way; on v2 (no `tasks`), the pid to cgroup.procs. */
void join_cgroups(const char *dirs) {
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
int held(const char *dir) {
    char path[4200], buf[32];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    return read_small(path, buf, sizeof buf) > 0;
}

/* Every process in the cgroups: v2 cgroup.kill, else v1's freezer (frozen, so no fork races the
** kill; killed; thawed), else each process listed. */
void kill_cgroups(const char *cgs) {
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
void make_cgroups(const char *cgs, const char *set) {
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
