/*
** tree_fuzz: the /proc readers of core/tree.h (the host core's and the
** agent's tree kill), on contents a process in the sandbox controls: its
** environment (/proc/<pid>/environ) and its command name, which shows in
** /proc/<pid>/stat.
**
** open is replaced so that any path gives a memfd with the input's bytes,
** and read so that it returns pieces of sizes the input chooses (as a
** pipe or a slow file might), which drives environ_has's window that keeps
** a match split across two reads.
**
** Input: byte 0 = n (1..64), n bytes that follow a NUL to make the
** needle (as "\0NAME=tag" does), byte n+1 picks the piece sizes, the rest
** is the file.
**  - environ_has(pid, needle) finds the needle exactly when it occurs in
**    "\0" followed by the file (a reference search here);
**  - is_zombie on the same file (read at once, as /proc/<pid>/stat is)
**    says zombie exactly when the byte two after the last ')' of its first
**    511 bytes (up to a NUL) is 'Z', or there is no such ')'.
**  - stat_parent on that text takes it exactly when the last ')' is
**    followed by a space, a state byte, a space and a run of digits of a
**    value up to 999999999 that ends the text or a space, and then gives
**    that state and value.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t *file_data;
static size_t file_len;
static unsigned piece_seed, piece_no;
static int whole_reads;

static int fz_open(const char *path, int flags) {
    int fd = memfd_create("tree_fuzz", MFD_CLOEXEC);
    (void)path;
    (void)flags;
    if (fd < 0) return -1;
    if (file_len > 0 && write(fd, file_data, file_len) != (ssize_t)file_len) { close(fd); return -1; }
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static ssize_t fz_read(int fd, void *buf, size_t n) {
    static const size_t sizes[8] = { 1, 2, 3, 7, 16, 61, 512, 16384 };
    size_t want = sizes[(piece_seed + piece_no * (piece_seed | 1)) % 8];
    piece_no++;
    if (whole_reads || want > n) want = n;
    return read(fd, buf, want);
}

#define open(p, f) fz_open(p, f)
#define read(fd, b, n) fz_read(fd, b, n)
#include "../core/tree.h"
#undef open
#undef read

static void fail(const char *what) __attribute__((noreturn));
static void fail(const char *what) {
    fprintf(stderr, "\n*** fuzz invariant broken: %s\n", what);
    fflush(stderr);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t nlen, i;
    unsigned char needle[66];
    unsigned char *whole, stat[512], *rp = NULL;
    int expect, got;
    if (size < 2) return 0;
    nlen = 1 + data[0] % 64;
    if (size < 2 + nlen) return 0;
    /* as the callers' needles do, it starts with the NUL that ends the variable before */
    needle[0] = '\0';
    memcpy(needle + 1, data + 1, nlen);
    piece_seed = data[1 + nlen];
    file_data = data + 2 + nlen;
    file_len = size - 2 - nlen;
    nlen++;

    /* environ_has against a search of "\0" + the file */
    whole = (unsigned char *)malloc(file_len + 1);
    if (whole == NULL) return 0;
    whole[0] = '\0';
    memcpy(whole + 1, file_data, file_len);
    expect = memmem(whole, file_len + 1, needle, nlen) != NULL;
    free(whole);
    piece_no = 0;
    whole_reads = 0;
    got = environ_has(1, (const char *)needle, nlen);
    if (got != expect) fail(expect ? "environ_has missed the needle" : "environ_has found a needle that is not there");

    /* is_zombie: one read of at most 511 bytes, cut at a NUL */
    whole_reads = 1;
    i = file_len < 511 ? file_len : 511;
    memcpy(stat, file_data, i);
    stat[i] = '\0';
    for (i = 0; stat[i] != '\0'; i++)
        if (stat[i] == ')') rp = stat + i;
    expect = file_len == 0 || rp == NULL || rp[1] == '\0' || rp[2] == 'Z';
    got = is_zombie(1);
    if (got != expect) fail("is_zombie disagrees with the reference");

    /* stat_parent against a reading with strtoull */
    {
        pid_t ppid = -1;
        char state = 0, *end = NULL;
        unsigned long long v = 0;
        expect = 0;
        if (rp != NULL && rp[1] == ' ' && rp[2] != '\0' && rp[3] == ' ' && rp[4] >= '0' && rp[4] <= '9') {
            errno = 0;
            v = strtoull((const char *)rp + 4, &end, 10);
            expect = errno == 0 && v <= 999999999ull && (*end == ' ' || *end == '\0');
        }
        got = stat_parent((const char *)stat, &ppid, &state) == 0;
        if (got != expect) fail(expect ? "stat_parent refused a stat line" : "stat_parent took a stat line");
        if (got && (state != (char)rp[2] || (unsigned long long)ppid != v)) fail("stat_parent read another parent");
    }
    return 0;
}
