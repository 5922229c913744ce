/* Two threads pass a token through pipes (bench/offcpu.py): every pass blocks the passer in
 * read(), so each round trip is two context switches; WORK_NS of busy work per pass sets the
 * rate. Prints its own elapsed time, the switches it caused and each thread's CPU time. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int a[2], b[2];
static long iters, work_ns;

static long now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

__attribute__((noinline)) static void work(void) {
    long end = now(CLOCK_MONOTONIC) + work_ns;
    while (work_ns && now(CLOCK_MONOTONIC) < end) {}
}

static void cpu_line(void) {
    printf("thread %ld %ld\n", (long)syscall(SYS_gettid), now(CLOCK_THREAD_CPUTIME_ID));
}

static void *pong(void *arg) {
    char c;
    for (long i = 0; i < iters; i++) {
        if (read(a[0], &c, 1) != 1) break;
        work();
        if (write(b[1], &c, 1) != 1) break;
    }
    cpu_line();
    return arg;
}

int main(int argc, char **argv) {
    iters = argc > 1 ? atol(argv[1]) : 100000;
    work_ns = argc > 2 ? atol(argv[2]) : 0;
    if (pipe(a) || pipe(b)) return 1;
    pthread_t t;
    long t0 = now(CLOCK_MONOTONIC);
    pthread_create(&t, 0, pong, 0);
    char c = 'x';
    for (long i = 0; i < iters; i++) {
        if (write(a[1], &c, 1) != 1) break;
        work();
        if (read(b[0], &c, 1) != 1) break;
    }
    pthread_join(t, 0);
    printf("elapsed %ld\nswitches %ld\n", now(CLOCK_MONOTONIC) - t0, 2 * iters);
    cpu_line();
    return 0;
}
