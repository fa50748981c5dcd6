/*
** filter.c: the syscall filter of commands, built with libseccomp: once when the agent is built
** (agent/gen/filter_gen.c writes the program as a C table, MAYURA_FILTER_PROGRAM names it), or,
** without that table, once at the agent's start.
*/
#include "agent.h"

/* {======================================================
** The syscall filter of commands
** =======================================================*/

/*
** Built once at start (libseccomp, exported as BPF), installed by the
** spawner for the commands it starts, or by a command's own process just
** before execve, so every command and all it starts run under it while the
** agent does not. Everything is allowed but what is listed here, which gets
** EPERM:
**  - what Docker's default profile refuses to a process without
**    capabilities: mounts, modules, kexec, reboot, swap, clocks, accounting,
**    quotas, keyrings, bpf, perf events, userfaultfd, file handles, raw I/O
**    ports, vm86, the kernel log, NUMA memory policy, new namespaces (unshare,
**    setns, clone with a namespace flag; clone3, whose flags a filter cannot
**    read, answers ENOSYS so that the C library falls back to clone), chroot,
**    host and domain names, kcmp, pidfd_getfd, process_madvise, and
**    personality but for the ordinary values. ptrace and process_vm_* stay,
**    as there (the kernel re-checks the filter after a tracer's changes, and
**    the agent is not dumpable, so it cannot be traced);
**  - io_uring, vsock sockets, netlink sockets but for NETLINK_ROUTE;
**  - what would reach processes a command does not own: setpriority but of
**    itself, sched_set{scheduler,param,attr,affinity} and a new prlimit64
**    but on itself (pid 0), ioprio_set but on itself, TIOCSTI, and clearing
**    its child subreaper flag (see kill_tree);
**  - every system call of another ABI (i386 through int 0x80, x32).
** Arguments the kernel reads as 32-bit ints are compared on their low 32
** bits where a match allows a call the kernel would see as another.
*/
struct sock_filter *filter_code;
const char *filter_why = "it was not built";
int filter_inherited;

#ifndef MAYURA_AGENT_NO_FILTER
unsigned short filter_len;
#ifdef MAYURA_FILTER_PROGRAM
/* the program made when the agent was built: filter_program[] (agent/gen/filter_gen.c) */
#include MAYURA_FILTER_PROGRAM

void filter_build(void) {
    filter_code = (struct sock_filter *)filter_program;
    filter_len = (unsigned short)(sizeof filter_program / sizeof filter_program[0]);
}
#else
#define IOPRIO_WHO_PROCESS_ 1   /* linux/ioprio.h */
/* personality(2) outside its safe values, which one libseccomp rule cannot say: a hand-written
** prefix of the program that allows 0, PER_LINUX32, UNAME26, both, and the query 0xffffffff. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG0_LOW offsetof(struct seccomp_data, args[0])
#else
#define ARG0_LOW (offsetof(struct seccomp_data, args[0]) + 4)
#endif
#define PREFIX_LEN 12

static void filter_prefix(struct sock_filter *f, uint32_t arch) {
    const struct sock_filter prefix[PREFIX_LEN] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, 10),          /* else to the rest */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 0, 8),                       /* else to the rest */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG0_LOW),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x0, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x8, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20000, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x20008, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    memcpy(f, prefix, sizeof prefix);
}

#define EPERM_ SCMP_ACT_ERRNO(EPERM)
#define LOW32(arg, v) SCMP_CMP(arg, SCMP_CMP_MASKED_EQ, 0xffffffffu, (v))

/* The rules; returns 0 or a negative errno. System calls this architecture lacks are skipped. */
static int filter_rules(scmp_filter_ctx ctx) {
    static const int denied[] = {
        SCMP_SYS(mount), SCMP_SYS(umount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot),
        SCMP_SYS(fsopen), SCMP_SYS(fsconfig), SCMP_SYS(fsmount), SCMP_SYS(fspick), SCMP_SYS(move_mount),
        SCMP_SYS(open_tree), SCMP_SYS(mount_setattr), SCMP_SYS(swapon), SCMP_SYS(swapoff),
        SCMP_SYS(reboot), SCMP_SYS(kexec_load), SCMP_SYS(kexec_file_load), SCMP_SYS(init_module),
        SCMP_SYS(finit_module), SCMP_SYS(delete_module), SCMP_SYS(create_module),
        SCMP_SYS(get_kernel_syms), SCMP_SYS(query_module), SCMP_SYS(acct), SCMP_SYS(settimeofday),
        SCMP_SYS(stime), SCMP_SYS(clock_settime), SCMP_SYS(clock_adjtime), SCMP_SYS(adjtimex),
        SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(keyctl), SCMP_SYS(add_key),
        SCMP_SYS(request_key), SCMP_SYS(bpf), SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd),
        SCMP_SYS(open_by_handle_at), SCMP_SYS(name_to_handle_at), SCMP_SYS(lookup_dcookie),
        SCMP_SYS(quotactl), SCMP_SYS(quotactl_fd), SCMP_SYS(nfsservctl), SCMP_SYS(iopl),
        SCMP_SYS(ioperm), SCMP_SYS(vm86), SCMP_SYS(vm86old), SCMP_SYS(syslog), SCMP_SYS(uselib),
        SCMP_SYS(fanotify_init), SCMP_SYS(mbind), SCMP_SYS(move_pages), SCMP_SYS(migrate_pages),
        SCMP_SYS(set_mempolicy), SCMP_SYS(get_mempolicy), SCMP_SYS(set_mempolicy_home_node),
        SCMP_SYS(_sysctl), SCMP_SYS(sysfs), SCMP_SYS(ustat), SCMP_SYS(vhangup),
        SCMP_SYS(sethostname), SCMP_SYS(setdomainname), SCMP_SYS(kcmp), SCMP_SYS(pidfd_getfd),
        SCMP_SYS(process_madvise), SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter),
        SCMP_SYS(io_uring_register),
    };
    static const unsigned long ns_flags[] = {
        CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP,
    };
    static const int not_others[] = {
        SCMP_SYS(sched_setscheduler), SCMP_SYS(sched_setparam), SCMP_SYS(sched_setattr),
        SCMP_SYS(sched_setaffinity),
    };
    size_t i;
    int rc;
#define ADD(nr, ...) do { if ((nr) >= 0 && (rc = seccomp_rule_add(ctx, __VA_ARGS__)) != 0) return rc; } while (0)
    for (i = 0; i < sizeof denied / sizeof denied[0]; i++) ADD(denied[i], EPERM_, denied[i], 0);
    ADD(SCMP_SYS(clone3), SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    for (i = 0; i < sizeof ns_flags / sizeof ns_flags[0]; i++)
        ADD(SCMP_SYS(clone), EPERM_, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    ADD(SCMP_SYS(socket), EPERM_, SCMP_SYS(socket), 1, LOW32(0, AF_VSOCK));
    ADD(SCMP_SYS(socket), EPERM_, SCMP_SYS(socket), 2, LOW32(0, AF_NETLINK), SCMP_A2(SCMP_CMP_NE, NETLINK_ROUTE));
    ADD(SCMP_SYS(socketpair), EPERM_, SCMP_SYS(socketpair), 1, LOW32(0, AF_VSOCK));
    ADD(SCMP_SYS(ioctl), EPERM_, SCMP_SYS(ioctl), 1, LOW32(1, TIOCSTI));
    ADD(SCMP_SYS(setpriority), EPERM_, SCMP_SYS(setpriority), 1, SCMP_A0(SCMP_CMP_NE, PRIO_PROCESS));
    ADD(SCMP_SYS(setpriority), EPERM_, SCMP_SYS(setpriority), 1, SCMP_A1(SCMP_CMP_NE, 0));
    for (i = 0; i < sizeof not_others / sizeof not_others[0]; i++)
        ADD(not_others[i], EPERM_, not_others[i], 1, SCMP_A0(SCMP_CMP_NE, 0));
    ADD(SCMP_SYS(prlimit64), EPERM_, SCMP_SYS(prlimit64), 2, SCMP_A0(SCMP_CMP_NE, 0), SCMP_A2(SCMP_CMP_NE, 0));
    ADD(SCMP_SYS(ioprio_set), EPERM_, SCMP_SYS(ioprio_set), 1, SCMP_A0(SCMP_CMP_NE, IOPRIO_WHO_PROCESS_));
    ADD(SCMP_SYS(ioprio_set), EPERM_, SCMP_SYS(ioprio_set), 1, SCMP_A1(SCMP_CMP_NE, 0));
    ADD(SCMP_SYS(prctl), EPERM_, SCMP_SYS(prctl), 2, LOW32(0, PR_SET_CHILD_SUBREAPER), SCMP_A1(SCMP_CMP_EQ, 0));
#undef ADD
    return 0;
}

/* Builds the filter program; on failure leaves filter_code NULL and says why in filter_why. */
void filter_build(void) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    struct sock_filter *code = NULL;
    off_t size;
    int fd = -1;
    if (ctx == NULL) { filter_why = "libseccomp cannot start a filter"; return; }
    if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(EPERM)) != 0 ||
        filter_rules(ctx) != 0) {
        filter_why = "libseccomp refused a rule";
        goto done;
    }
    seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);   /* a binary tree of syscalls, where supported */
    fd = memfd_create("mayura-filter", MFD_CLOEXEC);
    if (fd < 0 || seccomp_export_bpf(ctx, fd) != 0 || (size = lseek(fd, 0, SEEK_END)) <= 0 ||
        size % sizeof *code != 0 || size / sizeof *code + PREFIX_LEN > BPF_MAXINSNS ||
        lseek(fd, 0, SEEK_SET) != 0) {
        filter_why = "libseccomp cannot export the filter";
        goto done;
    }
    code = (struct sock_filter *)malloc((size_t)size + PREFIX_LEN * sizeof *code);
    if (code == NULL) { filter_why = "out of memory"; goto done; }
    filter_prefix(code, seccomp_arch_native());
    if (read(fd, code + PREFIX_LEN, (size_t)size) != (ssize_t)size) {
        free(code);
        filter_why = "libseccomp cannot export the filter";
        goto done;
    }
    filter_code = code;
    filter_len = (unsigned short)(size / sizeof *code + PREFIX_LEN);
done:
    fd_close(&fd);
    seccomp_release(ctx);
}
#endif /* MAYURA_FILTER_PROGRAM */
#endif

/* In a command's process before execve: installs the filter. Returns 0, or -1 with errno set. */
int filter_install(void) {
#ifdef MAYURA_AGENT_NO_FILTER
    return 0;   /* a build for the benchmark that measures what the filter costs, never shipped */
#else
    struct sock_fprog prog;
    if (filter_code == NULL) { errno = ENOSYS; return -1; }
    prog.len = filter_len;
    prog.filter = filter_code;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0) return 0;
    if (errno == ENOSYS && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) == 0) return 0;
    return -1;
#endif
}

/* }====================================================== */
