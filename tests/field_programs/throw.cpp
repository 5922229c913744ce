// C++ exceptions unwinding through frames: level3 computes, then throws; main catches.
// Usage: throw ITERATIONS SECONDS_EACH
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
extern "C" {
#include "work.h"
}

__attribute__((noinline)) void level3(double s) {
    volatile double r = compute(s);
    if (r >= 0) throw std::runtime_error("done");
}
__attribute__((noinline)) void level2(double s) { level3(s); std::puts("unreachable"); }
__attribute__((noinline)) void level1(double s) { level2(s); std::puts("unreachable"); }

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 2000;
    double s = argc > 2 ? std::atof(argv[2]) : 0.0001;
    int caught = 0;
    for (int i = 0; i < n; i++) {
        try { level1(s); } catch (const std::runtime_error &) { caught++; }
    }
    std::printf("caught %d\n", caught);
    return caught != n;
}
