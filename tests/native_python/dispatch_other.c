/* A second library whose kernel dispatch.c's dispatch_other calls through a pointer: a call
 * from one library into another keeps the caller's frame. */
__attribute__((noinline)) double other_kernel(const double *x, long n) {
    double s = 0.0;
    for (long r = 0; r < 32; r++)
        for (long i = 0; i < n; i++)
            s += x[i] * (double)r;
    return s;
}
