/* An OpenMP loop for tests/test_run_native_python.py: its worker threads never run Python. */
double omp_work(long n)
{
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (long i = 0; i < n; i++)
        s += (double)(i % 13) * 1e-9 / (1.0 + (double)(i & 3));
    return s;
}
