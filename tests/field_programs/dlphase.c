/* dlopen and dlclose between phases: phase 1 runs libdla.so's dla_work, unloads it, phase 2
 * loads libdlb.so (at the same address when the kernel reuses it: printed) and runs dlb_work.
 * Usage: dlphase DIR SECONDS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) double phase(const char *lib, const char *sym, double seconds) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); exit(2); }
    double (*fn)(double) = (double (*)(double))dlsym(h, sym);
    Dl_info info;
    dladdr((void *)fn, &info);
    printf("%s at %p\n", sym, info.dli_fbase);
    double r = fn(seconds);
    dlclose(h);
    return r;
}

static char a[4096], b[4096];

int main(int argc, char **argv) {
    double seconds = argc > 2 ? atof(argv[2]) : 0.2;
    snprintf(a, sizeof a, "%s/libdla.so", argv[1]);
    snprintf(b, sizeof b, "%s/libdlb.so", argv[1]);
    double r = phase(a, "dla_work", seconds) + phase(b, "dlb_work", seconds);
    return r < 0;
}
