/* Two native routines with the same work per iteration, for tests/test_run_native_python.py:
 * built with -O2 -g -fomit-frame-pointer and called through ctypes from two Python functions. */
double kernel_a(long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++)
        s += (double)(i & 1023) * 1e-9 / (1.0 + (double)(i & 7));
    return s;
}

double kernel_b(long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++)
        s += (double)(i & 1023) * 1e-9 / (1.0 + (double)(i & 7));
    return s;
}
