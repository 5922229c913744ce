/* Test program for unwind recipes: frames whose size is only known at run time (alloca) and
 * frames realigned with `and rsp, -64` (an over-aligned local array): both need the frame
 * pointer that gcc sets up for them even under -fomit-frame-pointer.
 *   main -> level1 -> with_alloca -> work
 *   main -> level1 -> aligned_frame -> work
 * Time is spent in work() and in the loops of both frames themselves.
 * Usage: varframe [rounds] */
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noclone))

static volatile double sink;

NOINLINE double work(double *buf, long n) {
    double acc = 0.0;
    for (long k = 0; k < 200; k++)
        for (long i = 0; i < n; i++)
            acc = acc * 0.999 + buf[i];
    return acc;
}

NOINLINE double with_alloca(long n) {
    double *buf = alloca(n * sizeof(double)); /* rsp moves by a run-time amount */
    for (long k = 0; k < 100; k++)
        for (long i = 0; i < n; i++)
            buf[i] = buf[i] * 0.5 + (double)(i & 3) + (double)k;
    return work(buf, n);
}

NOINLINE double aligned_frame(long n) {
    double buf[512] __attribute__((aligned(64))); /* and rsp, -64 */
    if (n > 512)
        n = 512;
    for (long k = 0; k < 100; k++)
        for (long i = 0; i < n; i++)
            buf[i] = (k ? buf[i] * 0.5 : 0.0) + (double)(i & 3);
    return work(buf, n);
}

NOINLINE double level1(long n) {
    double r = with_alloca(n) + aligned_frame(n);
    sink = r;
    return r;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 100;
    long n = 300 + (argc > 2 ? atol(argv[2]) : 0); /* not a compile-time constant */
    for (long k = 0; k < rounds; k++)
        level1(n);
    printf("%f\n", sink);
    return 0;
}
