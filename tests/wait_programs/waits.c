/* Where threads wait (tests/test_run_realtime.py): two threads contend for a mutex around a
 * CPU-bound section, a third sleeps in read() on a pipe until main writes to it, and main
 * waits in pthread_join. Every thread prints what it measured of itself: its wall-clock
 * time, its CPU time (CLOCK_THREAD_CPUTIME_ID) and the time it spent in the call that
 * blocks, so the test can hold callpath's REALTIME, CPUTIME and OFFCPU against them. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pipefd[2];
static volatile double sink;
static int rounds = 12;
static long hold_ns = 20000000;  /* CPU time spent holding the lock, per round */

static long now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void report(const char *what, long t0, long waited) {
    printf("%ld %s wall=%ld cpu=%ld wait=%ld\n", (long)syscall(SYS_gettid), what,
           now(CLOCK_MONOTONIC) - t0, now(CLOCK_THREAD_CPUTIME_ID), waited);
    fflush(stdout);
}

__attribute__((noinline)) static void burn(long ns) {
    long end = now(CLOCK_THREAD_CPUTIME_ID) + ns;
    double x = 0;
    while (now(CLOCK_THREAD_CPUTIME_ID) < end)
        for (int i = 0; i < 1000; i++) x += i * 0.5;
    sink = x;
}

__attribute__((noinline)) static long contend(void) {
    long waited = 0;
    for (int r = 0; r < rounds; r++) {
        long t = now(CLOCK_MONOTONIC);
        pthread_mutex_lock(&lock);
        waited += now(CLOCK_MONOTONIC) - t;
        burn(hold_ns);
        pthread_mutex_unlock(&lock);
    }
    return waited;
}

static void *contender(void *arg) {
    long t0 = now(CLOCK_MONOTONIC);
    report("contender", t0, contend());
    return arg;
}

__attribute__((noinline)) static long wait_for_data(void) {
    char c;
    long t = now(CLOCK_MONOTONIC);
    if (read(pipefd[0], &c, 1) != 1) exit(3);
    return now(CLOCK_MONOTONIC) - t;
}

static void *reader(void *arg) {
    long t0 = now(CLOCK_MONOTONIC);
    report("reader", t0, wait_for_data());
    return arg;
}

int main(int argc, char **argv) {
    if (argc > 1) rounds = atoi(argv[1]);
    long t0 = now(CLOCK_MONOTONIC);
    if (pipe(pipefd)) return 2;
    pthread_t c1, c2, r;
    pthread_create(&r, 0, reader, 0);
    pthread_create(&c1, 0, contender, 0);
    pthread_create(&c2, 0, contender, 0);
    long tj = now(CLOCK_MONOTONIC);
    pthread_join(c1, 0);
    pthread_join(c2, 0);
    if (write(pipefd[1], "x", 1) != 1) return 3;
    pthread_join(r, 0);
    report("main", t0, now(CLOCK_MONOTONIC) - tj);
    return 0;
}
