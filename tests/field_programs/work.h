/* Shared by the field programs: a compute routine whose time is known, kept out of line so
 * that it is a frame of its own, and a clock for the phases. */
#include <time.h>

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* spins for `seconds` of wall time doing floating-point work (no calls inside the loop body
 * other than the clock every 4096 iterations) */
__attribute__((noinline)) static double compute(double seconds) {
    double s = 0, t0 = now_s();
    for (long i = 1;; i++) {
        s += 1.0 / (double)i;
        if (!(i & 4095) && now_s() - t0 >= seconds) break;
    }
    return s;
}
