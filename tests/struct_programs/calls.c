/* Call sites with known lines and targets, for the structure-recovery tests.
 * The markers in comments name the lines the tests expect. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) double step(double x)
{
    return x * 0.5 + 1.0;
}

__attribute__((noinline)) double twice(double x)
{
    return 2.0 * x;
}

__attribute__((noinline)) double run(double (*f)(double), int n)
{
    double t = 0;
    for (int i = 0; i < n; i++) { /* LOOP_RUN */
        t = step(t); /* CALL_STEP */
        t += f(t); /* CALL_INDIRECT */
    }
    return t;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100; /* CALL_ATOI */
    double r = run(argc > 2 ? step : twice, n); /* CALL_RUN */
    printf("%f\n", r); /* CALL_PRINTF */
    return 0;
}
