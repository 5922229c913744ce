/* The test program of tests/test_lines_measured.py: an OpenMP region in which thread k does
   k+1 units of work on one source line (line 12), then three serial procedures of known
   relative weight (4 : 2 : 1) for the ranked-procedure table. Lines matter: the test looks
   for them. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) double imbalance(long unit, double *out) {
#pragma omp parallel
  { int k = omp_get_thread_num(); double x = 1.0; long n = (k + 1) * unit;
    for (long i = 0; i < n; i++) x = x * 1.0000001 + 1e-9; /* line 12: the work */
    out[k] = x; }
  return out[0];
}

__attribute__((noinline)) double heavy(long n) {
  double x = 1.0;
  for (long i = 0; i < n; i++) x = x * 1.0000001 + 2e-9; /* line 19 */
  return x;
}

__attribute__((noinline)) double medium(long n) {
  double x = 1.0;
  for (long i = 0; i < n; i++) x = x * 1.0000002 + 3e-9; /* line 25 */
  return x;
}

__attribute__((noinline)) double light(long n) {
  double x = 1.0;
  for (long i = 0; i < n; i++) x = x * 1.0000003 + 4e-9; /* line 31 */
  return x;
}

__attribute__((noinline)) double by_rank(long unit);

int main(int argc, char **argv) {
  long unit = argc > 1 ? atol(argv[1]) : 20000000;
  double out[256] = {0};
  if (argc > 2) return by_rank(unit) < 0; /* under mpirun: rank k does k+1 units */
  double s = imbalance(unit, out);
  s += heavy(4 * unit) + medium(2 * unit) + light(unit);
  printf("%g\n", s);
  return 0;
}

/* rank k of an MPI launch (the launcher's environment) does k+1 units on line 52 */
__attribute__((noinline)) double by_rank(long unit) {
  const char *r = getenv("PMI_RANK");
  if (!r) r = getenv("OMPI_COMM_WORLD_RANK");
  long k = r ? atol(r) : 0, n = (k + 1) * unit; double x = 1.0;
  for (long i = 0; i < n; i++) x = x * 1.0000001 + 5e-9; /* line 52: the work by rank */
  return x;
}
