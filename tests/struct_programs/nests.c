/* Known loop nests and an inlined function, for the structure-recovery tests.
 * The markers in comments name the lines the tests expect. */
#include <stdio.h>
#include <stdlib.h>

volatile double sink;

static inline __attribute__((always_inline)) double inner_sum(const double *a, int n)
{
    double s = 0;
    for (int k = 0; k < n; k++) /* LOOP_K */
        s += a[k] * a[k];
    return s;
}

__attribute__((noinline)) double nest3(double *a, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++) { /* LOOP_I */
        for (int j = 0; j < n; j++) { /* LOOP_J */
            t += inner_sum(a + j, n) * i; /* CALL_INNER */
        }
    }
    return t;
}

__attribute__((noinline)) double single(double *a, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++) /* LOOP_S */
        t += a[i] * 0.5 + sink;
    return t;
}

__attribute__((noinline)) int classify(int x)
{
    switch (x) { /* SWITCH */
    case 0: return 11;
    case 1: return 23;
    case 2: return 37;
    case 3: return 41;
    case 4: return 53;
    case 5: return 67;
    case 6: return 79;
    default: return -1;
    }
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 50;
    double *a = calloc(2 * (size_t)n + 1, sizeof *a);
    if (!a)
        abort();
    for (int i = 0; i < 2 * n; i++) /* LOOP_MAIN */
        a[i] = i % 7;
    int c = 0;
    for (int i = 0; i < n; i++)
        c += classify(i % 9);
    printf("%f %f %d\n", nest3(a, n), single(a, n), c);
    free(a);
    return 0;
}
