/*
** launch.h: what the pieces of mayura-launch (the .c files of launcher/: one static program) share. Every
** function of a piece is static but those declared here.
**
**   launch.c    the flow: the sandbox's first process (stage), the keeper, main
**   cgroup.c    the sandbox's cgroups: made with their settings, joined, killed
**   mount.c     the mount table: read from its sealed descriptor, each step taken, an image's
**               entries resolved beneath it
**   snapshot.c  --snapshot, --snapshot-drop, --snapshot-sweep: native snapshots
*/
#ifndef MAYURA_LAUNCH_H
#define MAYURA_LAUNCH_H

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

/* launch.c */
void die(const char *what) __attribute__((noreturn));
int write_all(int fd, const char *s, size_t n);
int write_file(const char *path, const char *s);
const char *env(const char *name);
void nap_ms(long ms);
ssize_t read_small(const char *path, char *buf, size_t cap);
int children(pid_t pid, pid_t *kids, int max);

/* cgroup.c */
void join_cgroups(const char *dirs);
int held(const char *dir);
void kill_cgroups(const char *cgs);
void make_cgroups(const char *cgs, const char *set);

/* mount.c */
int open_nofollow(int dir, const char *path, int beneath);
void read_table(const char *fd_s);
void take_table(uid_t uid);

/* snapshot.c */
int snapshot_main(int argc, char **argv);

#endif
