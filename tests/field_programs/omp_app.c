/* OpenMP: every thread of a parallel region computes. Usage: omp_app SECONDS */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "work.h"

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.3, sum = 0;
#pragma omp parallel reduction(+ : sum)
    sum += compute(seconds);
    printf("threads %d sum %g\n", omp_get_max_threads(), sum);
    return 0;
}
