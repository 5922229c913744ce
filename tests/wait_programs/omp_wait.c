/* An OpenMP region with imbalance (tests/test_run_realtime.py): thread i works (i+1) units
 * of CPU time, then all meet at an explicit barrier; with OMP_WAIT_POLICY=passive the early
 * ones sleep there. Each thread prints its tid, its CPU time and its time in the barrier. */
#define _GNU_SOURCE
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile double sink;

static long now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

__attribute__((noinline)) static void burn(long ns) {
    long end = now(CLOCK_THREAD_CPUTIME_ID) + ns;
    double x = 0;
    while (now(CLOCK_THREAD_CPUTIME_ID) < end)
        for (int i = 0; i < 1000; i++) x += i * 0.5;
    sink = x;
}

/* the barrier in a procedure of its own (an orphaned directive), so that its call path is
 * named whatever libgomp's symbols are (GOMP_barrier tail-calls a local function) */
__attribute__((noinline)) static void meet(void) {
#pragma omp barrier
    __asm__ volatile("" ::: "memory");  /* not a tail call: meet keeps its frame */
}

__attribute__((noinline)) static void imbalanced(long unit) {
#pragma omp parallel
    {
        int me = omp_get_thread_num();
        burn(unit * (me + 1));
        long t = now(CLOCK_MONOTONIC);
        meet();
        long waited = now(CLOCK_MONOTONIC) - t;
#pragma omp critical
        printf("%ld barrier cpu=%ld wait=%ld\n", (long)syscall(SYS_gettid),
               now(CLOCK_THREAD_CPUTIME_ID), waited);
    }
}

int main(int argc, char **argv) {
    imbalanced(argc > 1 ? atol(argv[1]) : 80000000L);
    return 0;
}
