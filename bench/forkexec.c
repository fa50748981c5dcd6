/*
** forkexec.c: the baseline of bench/sandbox.lua, not a test: the median time
** of a fork + execve + waitpid of /bin/true from a C program, the least a
** command can cost on this machine.
**
**   build/bench/forkexec [N]    prints the median in ms
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
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
    int n = argc > 1 ? atoi(argv[1]) : 200, i;
    char *args[] = { "/bin/true", NULL };
    double *xs;
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
