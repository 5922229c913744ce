/* fork + exec chains: `chain N SECONDS` computes, then forks a child that execs `chain N-1`,
 * and waits for it. Every process of the chain is measured. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "work.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    const char *secs = argc > 2 ? argv[2] : "0.2";
    double s = compute(atof(secs));
    if (n > 1) {
        pid_t pid = fork();
        if (pid == 0) {
            char arg[16];
            snprintf(arg, sizeof arg, "%d", n - 1);
            execl("/proc/self/exe", argv[0], arg, secs, (char *)0);
            _exit(127);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) return 1;
    }
    return s < 0;
}
