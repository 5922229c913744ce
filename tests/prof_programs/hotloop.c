/* A loop nest calling an inlined helper, and a second function: the test program of
   tests/test_prof_native.py. Lines matter: the test looks for them. */
#include <stdio.h>
#include <stdlib.h>

static inline double mix(double x, int i) {
  return x * 1.0000001 + (double)(i & 7);  /* line 7: inlined body */
}

__attribute__((noinline)) double kernel(int n) {
  double acc = 0.0;
  for (int r = 0; r < n; r++) {        /* line 12: outer loop */
    for (int i = 0; i < 4000; i++) {   /* line 13: inner loop */
      acc = mix(acc, i);               /* line 14: call site of the inlined mix */
    }
  }
  return acc;
}

__attribute__((noinline)) double other(int n) {
  double s = 0.0;
  for (int i = 0; i < n * 1000; i++)  /* line 22 */
    s += (double)i / (double)(i + 1);
  return s;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  double a = kernel(n);
  double b = other(n / 4);
  printf("%g %g\n", a, b);
  return 0;
}
