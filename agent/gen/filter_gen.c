/*
** filter_gen.c: makes the agent's syscall filter when the agent is built. Linked with
** agent/filter.c, it builds the program as the agent would at its start (with libseccomp) and
** writes it to standard output as a C table, filter_program[], which the agent then includes
** (MAYURA_FILTER_PROGRAM): the agent starts without building it, and without libseccomp. The
** program is for the architecture this runs on, the agent's.
**
**   filter_gen > build/gen/filter_program.h
*/
#include "agent.h"

void fd_close(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

int main(void) {
    unsigned short i;
    filter_build();
    if (filter_code == NULL) {
        fprintf(stderr, "filter_gen: cannot build the syscall filter (%s)\n", filter_why);
        return 1;
    }
    printf("/* made by agent/gen/filter_gen.c when the agent was built: do not edit */\n");
    printf("static const struct sock_filter filter_program[%u] = {\n", (unsigned)filter_len);
    for (i = 0; i < filter_len; i++)
        printf("    { 0x%04x, %u, %u, 0x%08lxu },\n", (unsigned)filter_code[i].code, (unsigned)filter_code[i].jt,
               (unsigned)filter_code[i].jf, (unsigned long)filter_code[i].k);
    printf("};\n");
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
