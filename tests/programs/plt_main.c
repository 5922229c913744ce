/* Calls a shared-library function and the vdso's clock_gettime in tight loops, so that many
 * samples land in PLT stubs and in the vdso. Usage: plt_main plt|vdso [milliseconds]
 *
 * The PLT loop carries its value in a register: with a volatile store and load around each call
 * (an earlier version), the store-to-load dependency held nearly every sample and well under
 * 1% of them fell on the stub's jump; this way the call, the stub's jump, the callee and the
 * loop's branch share the samples (25-35% on the stub, measured over 900 samples). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

int plt_step(int x);
static volatile int sink;

__attribute__((noinline)) void call_plt(long ms) {
    struct timespec t0, t;
    int x = sink;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 1000000; i++) x = plt_step(x);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
    sink = x + 1;
}

__attribute__((noinline)) void call_vdso(long ms) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
    sink += 1;
}

int main(int argc, char **argv) {
    long ms = argc > 2 ? atol(argv[2]) : 300;
    if (argc > 1 && !strcmp(argv[1], "vdso"))
        call_vdso(ms);
    else
        call_plt(ms);
    return 0;
}
