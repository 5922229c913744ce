/* Shared by the field programs: a compute routine whose cost is known, kept out of line so
 * that it is a frame of its own, and a clock for the phases. */
#include <time.h>

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* CPU time of the calling thread: the work asked for is the same however loaded the machine */
static inline double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* spins for `seconds` of this thread's CPU time doing floating-point work (no calls inside
 * the loop body other than the clock every 4096 iterations) */
__attribute__((noinline)) static double compute(double seconds) {
    double s = 0, t0 = cpu_s();
    for (long i = 1;; i++) {
        s += 1.0 / (double)i;
        if (!(i & 4095) && cpu_s() - t0 >= seconds) break;
    }
    return s;
}
