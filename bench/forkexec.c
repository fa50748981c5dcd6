/*
** forkexec.c: the baseline of bench/sandbox.lua, not a test: the median time
** of a fork + execve + waitpid of /bin/true from a C program, the least a
** command can cost on this machine.
**
**   build/bench/forkexec [N]    prints the median in ms
**   build/bench/forkexec stamp  prints the wall clock (ns since the epoch), then
**                               after a second "b": bench/stream.lua runs it in a
**                               sandbox (it is static) to time the first byte
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int n, i;
    char *args[] = { "/bin/true", NULL };
    double *xs;
    if (argc > 1 && strcmp(argv[1], "stamp") == 0) {
        struct timespec ts;
        char line[64];
        int len;
        clock_gettime(CLOCK_REALTIME, &ts);
        len = snprintf(line, sizeof line, "%lld%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
        if (write(1, line, (size_t)len) != len) return 1;
        sleep(1);
        return write(1, "b\n", 2) == 2 ? 0 : 1;
    }
    n = argc > 1 ? atoi(argv[1]) : 200;
    if (n < 1) n = 1;
    xs = (double *)malloc((size_t)n * sizeof *xs);
    if (xs == NULL) return 1;
    for (i = -3; i < n; i++) {
        double t0 = now_ms();
        int status;
        pid_t pid = fork();
        if (pid == 0) {
            execve(args[0], args, environ);
            _exit(127);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
        if (i >= 0) xs[i] = now_ms() - t0;
    }
    qsort(xs, (size_t)n, sizeof *xs, cmp);
    printf("%.4f\n", n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2);
    free(xs);
    return 0;
}
