/* The test program of tests/test_compare.py: 'twoinputs N' runs common(N); 'twoinputs N extra'
   also runs only_extra(N), a routine the first input never calls. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

__attribute__((noinline)) double common(int n) {
  double s = 0.0;
  for (int i = 0; i < n * 1000; i++)   /* line 9 */
    s += (double)i / (double)(i + 3);
  return s;
}

__attribute__((noinline)) double only_extra(int n) {
  double s = 1.0;
  for (int i = 0; i < n * 1000; i++)   /* line 16 */
    s = s * 1.0000001 + (double)(i & 3);
  return s;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  double a = common(n);
  double b = argc > 2 && strcmp(argv[2], "extra") == 0 ? only_extra(n) : 0.0;
  printf("%g %g\n", a, b);
  return 0;
}
