/*
** tree.h: finding and signalling every process of a command by the tag in
** its environment, for the host core (core/proc.c) and the in-sandbox agent
** (agent/agent.c). Header-only, every function static.
**
** A command is started with a variable NAME=tag in its environment; its
** children inherit it, also those that move to a session of their own, so a
** scan of /proc finds them all (a process that rewrites its environment is
** the one way out, which a pid namespace's end covers).
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
#include <unistd.h>

#define TREE_UNUSED __attribute__((unused))

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

/* Signals every live process whose environment holds needle; returns how many. */
static TREE_UNUSED int signal_tagged(const char *needle, size_t nlen, int sig) {
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
        kill((pid_t)v, sig);
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
        if (by_pid) kill(leader, sig);
    }
    return nlen > 0 ? signal_tagged(needle, nlen, sig) : 0;
}

/* SIGKILL in passes until no tagged process is left (new ones can only come from live ones). */
static TREE_UNUSED void tree_kill(pid_t leader, int by_pid, const char *needle, size_t nlen) {
    int pass;
    for (pass = 0; pass < TREE_MAX_PASSES; pass++)
        if (tree_signal(leader, by_pid, needle, nlen, SIGKILL) == 0) break;
}

#endif
