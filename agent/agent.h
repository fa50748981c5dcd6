/*
** agent.h: mayura-agent, the in-sandbox agent: what its pieces share.
**
**
** A small static program put in every sandbox as its PID 1. It serves
** exec and file operations to the host over a unix stream socket, framed
** as in core/wire.h: a command costs a fork+exec and a socket round trip,
** file operations run in the sandbox's own mount view, a command's whole
** tree is stopped reliably, and the sandbox ends at its lifetime when the
** agent exits (PID 1 of a pid namespace takes everything with it).
**
**   mayura-agent (--fd N | --stdio | --listen PATH [--peer-uid N]) --lifetime-ms MS [--workdir DIR]
**
** It serves one peer, the host: the descriptor of --fd, its standard input
** and output with --stdio (frames in on 0, out on 1: a container attached
** to through an orchestrator's API, which carries the two streams; both are
** moved above 2 at start and 0 and 1 become /dev/null), or the first
** connection to the socket of --listen, whose listener is then closed and
** unlinked. With --peer-uid the socket is made 0666 (the host may be
** another user than the agent's) and a connection whose peer is not that
** uid is closed at once, unanswered; without it the socket is 0600. The
** peer must say hello first and may send setup once (its env and workdir,
** and a lifetime_ms that may only shorten the lifetime: a sandbox started
** ahead of time gets the one asked for when it is handed out); a request out of that
** order, an unknown op or a malformed frame ends the connection, and the
** end of the connection ends the agent.
**
** Each command runs as a child subreaper (its orphans stay below it, so a
** timeout or cancel finds them all, see core/tree.h) under a syscall filter
** (seccomp, made by libseccomp when the agent is built, agent/gen/filter_gen.c;
** without that table, once at start): what Docker's default
** profile refuses and more, each answered with EPERM. The agent itself is
** not filtered: a helper forked at start installs the filter once and
** starts the commands as the agent's children (see "The spawner"); without
** it (or with --no-spawner, for gVisor, whose CLONE_PARENT children never
** reach PID 1's wait), each command's process installs the filter just before execve. A
** command whose filter cannot be installed does not run.
**
** One thread, one poll(2) loop, SIGCHLD through a signalfd; every socket
** and pipe non-blocking. File operations run synchronously in the loop:
** they are short, and nothing in them waits on another process.
**
** The pieces (one program, linked from them all; everything not named here
** stays static in its file):
**   main.c     the entry: arguments, start-up, the poll loop, the peer's accept
**   conn.c     a connection: send queue, replies, framing, dispatch, hello/setup
**   exec.c     exec: a command's streams, timers, tree kill, reaping, its reply
**   spawn.c    starting a command: the child's set-up, the spawner helper
**   filter.c   the syscall filter of commands (libseccomp; its program made at build time by
**              agent/gen/filter_gen.c, a tool of the build, not a piece of the agent)
**   request.c  request fields, paths, environment lists
**   fileops.c  read, write, list, remove over core/files.h
*/
#ifndef MAYURA_AGENT_H
#define MAYURA_AGENT_H

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
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#if !defined(MAYURA_AGENT_NO_FILTER) && !defined(MAYURA_FILTER_PROGRAM)
#include <seccomp.h>
#endif

#include "../core/wire.h"
#include "../core/tree.h"
#include "../core/files.h"

#define AGENT_VERSION "1"
#define TAG_VAR "MAYURA_EXEC"
#define READ_CHUNK 65536
#define DEFAULT_MAX_OUTPUT (1u << 20)
#define MAX_OUTPUT_LIMIT ((int64_t)WIRE_MAX_FRAME / 2 - 65536)
#define MAX_MS ((int64_t)1 << 40)
#define MAX_FILE_OFFSET ((int64_t)1 << 62)
#define BASE_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

/* {======================================================
** State
** =======================================================*/

extern char **environ;

/* {======================================================
** State
** =======================================================*/

typedef struct outq {
    struct outq *next;
    unsigned char *data;
    size_t len, off;
} outq;

typedef struct conn {
    struct conn *next;
    int fd;                   /* what is read (and written, unless wfd differs) */
    int wfd;                  /* what is written: fd, or stdout's with --stdio */
    int dead;                 /* closed; freed at the end of the loop turn */
    int pidx, pidx_w;         /* its slots in this turn's pollfd array (reading, writing), or -1 */
    unsigned char *in;        /* bytes of the frame(s) being received */
    size_t in_len, in_size;
    outq *head, *tail;
    int said_hello, had_setup; /* the order of requests: hello first, setup at most once */
} conn;

typedef struct stream {
    int fd;                   /* -1 once closed */
    int which;                /* 1 stdout, 2 stderr: the `fd` of its chunks */
    unsigned char *data;      /* what is kept for the reply (not when streaming) */
    size_t len, size, cap;    /* len: bytes kept, or sent as chunks when streaming */
    int truncated;
} stream;

typedef struct exec {
    struct exec *next;
    conn *c;                  /* NULL once its connection closed: no reply then */
    uint32_t id;
    pid_t pid;
    char tag[80];             /* value of MAYURA_EXEC */
    stream out, err;
    int in_fd;
    unsigned char *in_data;
    size_t in_len, in_off;
    int exited, status;
    int streaming;            /* output goes to the host as chunks as it comes (see core/wire.h) */
    int timed_out, cancelled, killing;
    int64_t started, ended;   /* ms, CLOCK_MONOTONIC */
    int64_t deadline;         /* ms, 0 = none: timeout, grace or drain by `killing` */
    int64_t grace_ms, drain_ms;
    int pi_out, pi_err, pi_in; /* slots in this turn's pollfd array, or -1 */
} exec;

typedef struct envlist {
    char **v;
    size_t n, cap;
} envlist;

/* main.c */
extern int sig_fd;                /* SIGCHLD, through a signalfd */
extern char *workdir;
extern int64_t lifetime_end;
extern int fd_mode;               /* serving one connection: its end ends the agent */
extern int shutting_down;
int64_t now_ms(void);
void set_nonblock(int fd);
void fd_close(int *fd);
void agent_exit(void) __attribute__((noreturn));

/* conn.c */
extern conn *conns;
extern char **setup_env;          /* "NAME=value" strings from setup */
extern size_t setup_n;
void conn_flush(conn *c);
void conn_send(conn *c, wire_buf *b);
void conn_close(conn *c);
void conn_read(conn *c);
conn *conn_new(int fd, int wfd);
void conn_sweep(void);
void reply_error(conn *c, uint32_t id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void reply_errno(conn *c, uint32_t id, int e, const char *what);
void reply_send(conn *c, uint32_t id, wire_buf *b);
void reply_ok(conn *c, uint32_t id, const char *key);

/* exec.c */
extern exec *execs;
extern char tag_prefix[48];       /* unique to this agent: every tag starts with it */
void kill_tree(exec *x);
void kill_everything(void);
void stream_read(exec *x, stream *s);
void stdin_write(exec *x);
void leftovers_run(int64_t until);
int64_t leftovers_wake(int64_t wake);
void exec_timer(exec *x, int64_t now);
void exec_sweep(void);
void reap(void);
void op_exec(conn *c, const wire_msg *m);
void op_cancel(conn *c, const wire_msg *m);
void op_signal(conn *c, const wire_msg *m);

/* spawn.c */
void ignored_sigs_find(void);
void spawner_start(void);
int spawner_reaped(pid_t pid);
pid_t start_command(char **argv, char **envp, const char *cwd, int in_fd, int out_fd, int err_fd,
                    const char *tag);

/* filter.c */
extern struct sock_filter *filter_code;   /* NULL when it could not be built */
extern unsigned short filter_len;         /* its count of instructions */
extern const char *filter_why;
extern int filter_inherited;              /* in the spawner: its children have the filter already */
void filter_build(void);
int filter_install(void);

/* request.c */
int field_bytes(const wire_msg *m, const char *key, const unsigned char **p, size_t *len);
int field_int(const wire_msg *m, const char *key, int64_t *v, int64_t lo, int64_t hi);
int field_bool(const wire_msg *m, const char *key, int *v);
char *dup_cstr(const unsigned char *p, size_t len);
char *request_path(const unsigned char *p, size_t len, int *err);
char *path_field(conn *c, const wire_msg *m);
void env_free(envlist *e);
int env_put_str(envlist *e, const char *s);
int env_put_map(envlist *e, const wire_field *f);

/* fileops.c */
void op_read(conn *c, const wire_msg *m);
void op_write(conn *c, const wire_msg *m);
void op_list(conn *c, const wire_msg *m);
void op_remove(conn *c, const wire_msg *m);
void uploads_drop(const conn *c);          /* c's uploads (NULL: all), each with its temporary file */
int64_t uploads_wake(int64_t wake);
void uploads_expire(int64_t now);

/* }====================================================== */

#endif
