/* A frame that gcc describes with DWARF expressions: a 64-byte aligned local array next to a
 * variable-length allocation makes the prologue realign the stack through a pointer to the
 * incoming frame (DRAP), so that the CFA is `DW_CFA_def_cfa_expression: DW_OP_breg6 N;
 * DW_OP_deref` and rbp's save `DW_CFA_expression: DW_OP_breg6 0` (what vectorised numpy
 * and BLAS code compiled for AVX-512 looks like). Samples in leaf() must unwind through
 * aligned_frame() to main.
 * Usage: realign [rounds] */
#include <stdlib.h>

#define NOINLINE __attribute__((noinline, noclone))

NOINLINE double leaf(const double *p, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += p[i] * 1.0000001;
    return s;
}

NOINLINE double aligned_frame(int n) {
    double buf[64] __attribute__((aligned(64)));
    int m = n % 8 + 8;
    double *v = __builtin_alloca(sizeof(double) * (size_t)m);
    for (int i = 0; i < 64; i++)
        buf[i] = i + n;
    for (int i = 0; i < m; i++)
        v[i] = i;
    double s = 0;
    for (int k = 0; k < 20000; k++)
        s += leaf(buf, 56 + (k & 7)) + leaf(v, m - (k & 1));  /* k: not hoisted */
    return s;
}

int main(int argc, char **argv) {
    double t = 0;
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    for (int i = 0; i < rounds; i++)
        t += aligned_frame(i);
    return t == 42.0;
}
