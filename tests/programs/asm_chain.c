/* Test program for unwind recipes: hand-written assembly without call-frame information
 * (asm_middle.s) in the middle of the call chain
 *   main -> level1 -> asm_fp -> level2 -> asm_nofp -> level3 -> asm_badcfi -> kernel
 * (asm_badcfi has CFI, but wrong). Time is spent in the three assembly routines and in kernel,
 * so samples fall inside the assembly too.
 * Usage: asm_chain [rounds] */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noclone))

long asm_fp(long n, long (*fn)(long));
long asm_nofp(long n, long (*fn)(long));
long asm_badcfi(long n, long (*fn)(long));

static volatile double sink;

NOINLINE long kernel(long n) {
    double acc = 0.0;
    for (long i = 0; i < n * 1000; i++)
        acc = acc * 0.999 + (double)(i & 7);
    sink = acc;
    return n;
}

NOINLINE long level3(long n) { long r = asm_badcfi(n, kernel); sink = sink + 1.0; return r + 1; }
NOINLINE long level2(long n) { long r = asm_nofp(n, level3); sink = sink + 1.0; return r + 1; }
NOINLINE long level1(long n) { long r = asm_fp(n, level2); sink = sink + 1.0; return r + 1; }

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200;
    long total = 0;
    for (long k = 0; k < rounds; k++)
        total += level1(100);
    printf("total %ld\n", total);
    return 0;
}
