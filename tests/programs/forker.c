/* Forks without exec; parent and child both burn CPU in their own function, then the parent
 * waits. Usage: forker [milliseconds]. */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile double sink;

__attribute__((noinline)) static void burn(long ms) {
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 100000; i++) sink = sink * 0.5 + i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

__attribute__((noinline)) void child_work(long ms) { burn(ms); sink += 1; }
__attribute__((noinline)) void parent_work(long ms) { burn(ms); sink += 2; }

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 300;
    pid_t pid = fork();
    if (pid == 0) {
        child_work(ms);
        _exit(3);
    }
    parent_work(ms);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
