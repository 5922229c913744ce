/* Test program for `callpath run`: nested calls, a recursive function, an inlined function, a
 * loop nest, and two extra pthreads. Every thread spends its time in
 *   <thread entry> -> level1 -> level2 -> recurse x (DEPTH + 1) -> kernel_loop
 * (no tail calls: each level does work after its call returns)
 * and prints "thread <tid> <cpu ns>" when done, so tests can check both the call chains and
 * the number of samples against each thread's CPU time; then "elapsed <wall ns>" of main.
 * Usage: callchain [iterations [extra threads (default 2, at most 8)]]. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 5
#define NOINLINE __attribute__((noinline, noclone))

static volatile double sink;

static inline double mix(double x, int i) { /* inlined into the loop nest */
    return x * 0.999 + (double)(i & 7) * 0.5;
}

NOINLINE double kernel_loop(int n) {
    double acc = 0.0;
    for (int i = 0; i < n; i++)          /* loop nest: outer */
        for (int j = 0; j < 1000; j++)   /* inner */
            acc = mix(acc, i ^ j);
    return acc;
}

NOINLINE double recurse(int depth, int n) {
    double r = depth == 0 ? kernel_loop(n) : recurse(depth - 1, n);
    sink = sink + r; /* not a tail call */
    return r + 1.0;
}

NOINLINE double level2(int n) { return recurse(DEPTH, n) + 1.0; }
NOINLINE double level1(int n) { double r = level2(n); sink = r; return r * 2.0; }

static long iterations = 400;

static void report(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    printf("thread %d %lld\n", (int)gettid(), (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    fflush(stdout);
}

NOINLINE void *thread_main(void *arg) {
    (void)arg;
    for (long k = 0; k < iterations; k++)
        level1(1000);
    report();
    return NULL;
}

int main(int argc, char **argv) {
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    if (argc > 1)
        iterations = atol(argv[1]);
    int nthreads = argc > 2 ? atoi(argv[2]) : 2;
    if (nthreads < 0 || nthreads > 8)
        nthreads = 2;
    pthread_t t[8];
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, thread_main, NULL);
    for (long k = 0; k < iterations; k++)
        level1(1000);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    report();
    clock_gettime(CLOCK_MONOTONIC, &w1);
    printf("elapsed %lld\n", (long long)(w1.tv_sec - w0.tv_sec) * 1000000000LL + (w1.tv_nsec - w0.tv_nsec));
    return 0;
}
