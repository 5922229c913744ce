/* The bundled example of `make demo`: a 2-D heat-diffusion stencil with an inlined update,
   a reduction, and a recursive refinement step, so that the report shows loop nests, inlined
   code and recursion. Build: gcc -O2 -g -o heat examples/heat.c */
#include <stdio.h>
#include <stdlib.h>

#define N 512

static inline double update(const double *u, int i, int j) {
  return 0.25 * (u[(i - 1) * N + j] + u[(i + 1) * N + j] + u[i * N + j - 1] + u[i * N + j + 1]);
}

__attribute__((noinline)) static void sweep(const double *u, double *v) {
  for (int i = 1; i < N - 1; i++)          /* the stencil's outer loop */
    for (int j = 1; j < N - 1; j++)        /* inner loop: the hot spot */
      v[i * N + j] = update(u, i, j);
}

__attribute__((noinline)) static double residual(const double *u, const double *v) {
  double r = 0.0;
  for (int k = 0; k < N * N; k++) {
    double d = u[k] - v[k];
    r += d * d;
  }
  return r;
}

__attribute__((noinline)) static double refine(const double *u, int lo, int hi, int depth) {
  if (depth == 0 || hi - lo < 2) {
    double s = 0.0;
    for (int k = lo; k < hi; k++) s += u[k] * u[k];
    return s;
  }
  int mid = lo + (hi - lo) / 2;
  return refine(u, lo, mid, depth - 1) + refine(u, mid, hi, depth - 1);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 8000;
  double *u = calloc((size_t)N * N, sizeof *u), *v = calloc((size_t)N * N, sizeof *v);
  if (!u || !v) return 1;
  for (int j = 0; j < N; j++) u[j] = v[j] = 100.0;  /* a hot edge */
  double r = 0.0, e = 0.0;
  for (int s = 0; s < steps; s++) {
    sweep(u, v);
    if (s % 10 == 0) r = residual(u, v);
    if (s % 50 == 0) e += refine(v, 0, N * N, 8);
    double *t = u; u = v; v = t;
  }
  printf("residual %.6g energy %.6g\n", r, e);
  free(u);
  free(v);
  return 0;
}
