/*
** tree.h: finding and signalling every process of a command by the tag in
** its environment, for the host core (core/proc.c) and the in-sandbox agent
** (agent/exec.c). Header-only, every function static.
**
** A command is started with a variable NAME=tag in its environment; its
** children inherit it, also those that move to a session of their own, so a
** scan of /proc finds them all. A process that rewrites its environment is
** found by its parents instead where the command's own process is a child
** subreaper (the agent makes it one): every orphan of the command then
** reparents to it, so while it lives, every process it started has it up
** its chain of parents (tree_kill_below). Elsewhere (the host core) a pid
** namespace's end covers that way out.
*/
#ifndef MAYURA_TREE_H
#define MAYURA_TREE_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define TREE_UNUSED __attribute__((unused))

/*
** Where a kill of a process (and what it started) stands, for the host's
** processes (core/proc.c) and the agent's commands alike: not asked; SIGTERM
** sent, waiting out the grace; SIGKILL sent; the leader gone, its pipes being
** drained for a moment longer.
*/
enum { K_NONE, K_GRACE, K_KILLED, K_DRAIN };

/* Whether /proc/<pid>/environ holds needle ("\0NAME=value" plus "\0" or "."), read in pieces. */
static TREE_UNUSED int environ_has(pid_t pid, const char *needle, size_t nlen) {
    char path[64], buf[16384];
    size_t have = 1;
    int fd, found = 0;
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    buf[0] = '\0';   /* so that the first variable matches "\0NAME=" too */
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof buf - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += (size_t)n;
        if (memmem(buf, have, needle, nlen) != NULL) { found = 1; break; }
        /* keep a tail so that a match split across two reads is seen */
        if (have >= nlen) {
            memmove(buf, buf + have - (nlen - 1), nlen - 1);
            have = nlen - 1;
        }
    }
    close(fd);
    return found;
}

static TREE_UNUSED int is_zombie(pid_t pid) {
    char path[64], buf[512], *rp;
    int fd;
    ssize_t n;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = '\0';
    rp = strrchr(buf, ')');
    return rp == NULL || rp[1] == '\0' || rp[2] == 'Z';
}

/* Signals every live process whose environment holds needle, but those of process group `group`
** (when > 0: signalled through their group already, so a handler runs once); returns how many
** there are, those included. */
static TREE_UNUSED int signal_tagged(const char *needle, size_t nlen, int sig, pid_t group) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t self = getpid();
    int hits = 0;
    if (d == NULL) return 0;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long v;
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        v = strtol(e->d_name, &end, 10);
        if (*end != '\0' || v <= 0 || (pid_t)v == self) continue;
        if (!environ_has((pid_t)v, needle, nlen) || is_zombie((pid_t)v)) continue;
        if (group <= 0 || getpgid((pid_t)v) != group) kill((pid_t)v, sig);
        hits++;
    }
    closedir(d);
    return hits;
}

#define TREE_MAX_PASSES 64

/*
** Writes the needle for var=tag into buf: "\0var=tag\0" when exact (that very
** tag), "\0var=tag" otherwise (any tag starting so). Returns its length, or 0
** when it does not fit.
*/
static TREE_UNUSED size_t tree_needle(char *buf, size_t size, const char *var, const char *tag, int exact) {
    int n;
    if (size < 2) return 0;
    buf[0] = '\0';   /* a variable starts after the NUL that ends the one before */
    n = snprintf(buf + 1, size - 1, "%s=%s", var, tag);
    if (n < 0 || (size_t)n + 2 > size) return 0;
    return (size_t)n + 1 + (exact ? 1 : 0);   /* snprintf wrote the final NUL */
}

/*
** Signals a command's tree once: the process group led by `leader` (when
** above 0; with by_pid, the leader by pid too, as it may not lead its group
** yet) and every live process whose environment holds the needle. Returns
** how many tagged processes were signalled.
*/
static TREE_UNUSED int tree_signal(pid_t leader, int by_pid, const char *needle, size_t nlen, int sig) {
    if (leader > 0) {
        kill(-leader, sig);
        if (by_pid && getpgid(leader) != leader) kill(leader, sig);   /* not in its group yet */
    }
    return nlen > 0 ? signal_tagged(needle, nlen, sig, leader) : 0;
}

/* SIGKILL in passes until no tagged process is left (new ones can only come from live ones). */
static TREE_UNUSED void tree_kill(pid_t leader, int by_pid, const char *needle, size_t nlen) {
    int pass;
    for (pass = 0; pass < TREE_MAX_PASSES; pass++)
        if (tree_signal(leader, by_pid, needle, nlen, SIGKILL) == 0) break;
}

/* {------------------------------------------------------
** Descendants: chains of parents in /proc
** -------------------------------------------------------*/

/*
** The parent and state of a /proc/<pid>/stat text (buf, NUL-terminated):
** "pid (comm) S ppid ...", where comm may hold anything, ')' and spaces
** included, so the fields are read after the last ')'. Returns 0, or -1
** when the text does not have that shape.
*/
static TREE_UNUSED int stat_parent(const char *buf, pid_t *ppid, char *state) {
    const char *rp = strrchr(buf, ')');
    long v = 0;
    int digits = 0;
    if (rp == NULL || rp[1] != ' ' || rp[2] == '\0' || rp[3] != ' ') return -1;
    *state = rp[2];
    for (rp += 4; *rp >= '0' && *rp <= '9'; rp++) {
        if (v > 99999999) return -1;
        v = v * 10 + (*rp - '0');
        digits++;
    }
    if (digits == 0 || (*rp != ' ' && *rp != '\0')) return -1;
    *ppid = (pid_t)v;
    return 0;
}

typedef struct tree_proc { pid_t pid, ppid; int zombie; } tree_proc;

static TREE_UNUSED int tree_proc_cmp(const void *a, const void *b) {
    pid_t x = ((const tree_proc *)a)->pid, y = ((const tree_proc *)b)->pid;
    return x < y ? -1 : x > y;
}

/* Every process of /proc with its parent, sorted by pid, in *out (to free). Returns the count, or -1. */
static TREE_UNUSED int tree_scan(tree_proc **out) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    tree_proc *v = NULL;
    size_t n = 0, cap = 0;
    *out = NULL;
    if (d == NULL) return -1;
    while ((e = readdir(d)) != NULL) {
        char path[64], buf[1024], state;
        char *end;
        long pid;
        pid_t ppid;
        ssize_t len;
        int fd;
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid > 0x3fffffff) continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0) continue;
        buf[len] = '\0';
        if (stat_parent(buf, &ppid, &state) != 0) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            tree_proc *nv = (tree_proc *)realloc(v, nc * sizeof *nv);
            if (nv == NULL) { free(v); closedir(d); return -1; }
            v = nv;
            cap = nc;
        }
        v[n].pid = (pid_t)pid;
        v[n].ppid = ppid;
        v[n].zombie = state == 'Z' || state == 'X';
        n++;
    }
    closedir(d);
    if (n > 1) qsort(v, n, sizeof *v, tree_proc_cmp);
    *out = v;
    return (int)n;
}

/* Whether root is up the chain of parents of v[i] (at most n steps: a chain read while it changes may loop). */
static TREE_UNUSED int tree_below(const tree_proc *v, size_t n, size_t i, pid_t root) {
    size_t steps;
    pid_t p = v[i].ppid;
    for (steps = 0; steps < n && p > 0; steps++) {
        tree_proc key, *up;
        if (p == root) return 1;
        key.pid = p;
        up = (tree_proc *)bsearch(&key, v, n, sizeof *v, tree_proc_cmp);
        if (up == NULL) return 0;
        p = up->ppid;
    }
    return 0;
}

/* Signals every live descendant of root (not root itself); returns how many, or -1 when /proc cannot be read. */
static TREE_UNUSED int tree_signal_below(pid_t root, int sig, pid_t group) {
    tree_proc *v;
    int n = tree_scan(&v), i, hits = 0;
    if (n < 0) return -1;
    for (i = 0; i < n; i++) {
        if (v[i].zombie || v[i].pid == root || !tree_below(v, (size_t)n, (size_t)i, root)) continue;
        if (group <= 0 || getpgid(v[i].pid) != group) kill(v[i].pid, sig);
        hits++;
    }
    free(v);
    return hits;
}

/*
** SIGKILL every descendant of root, a live child subreaper, leaving root
** itself: it is stopped first, so it starts nothing more, and stays to take
** the orphans of the killed; passes go on until no live descendant is left.
** A killed process starts nothing more either, but may take a moment to end
** and hand its children over: later passes wait a millisecond for that.
*/
static TREE_UNUSED void tree_kill_below(pid_t root) {
    int pass;
    if (root <= 0 || kill(root, SIGSTOP) != 0) return;
    for (pass = 0; pass < TREE_MAX_PASSES; pass++) {
        if (tree_signal_below(root, SIGKILL, 0) <= 0) break;
        if (pass >= 2) {
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
        }
    }
}

/* }------------------------------------------------------ */

#endif
