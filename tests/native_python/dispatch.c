/* The shape of an operator library with a dispatcher, as PyTorch's ATen (c10's dispatcher) is
 * built: Python calls the library's entry (op_call, as torch's binding THPVariable_linear),
 * which calls a dispatcher (op_dispatch, as at::_ops::addmm::call: it picks the kernel from a
 * table and calls it through a pointer; no loop), which calls a wrapper of a few instructions
 * (op_wrapper, as c10::impl::wrap_kernel_functor_unboxed_::call), which calls the operator's
 * implementation (op_impl) that runs the kernel (kernel_loop, as the BLAS kernel).
 *
 * Frames that must stay whatever the elision does: run_callbacks calls through pointers in a
 * loop (a driver, not a trampoline); dispatch_other calls through a pointer into another
 * library (libdispatch_other.so). Built with -O2 -fomit-frame-pointer by the test. */
#include <stddef.h>

typedef double (*kernel_fn)(const double *, long);

volatile int profiling_on;           /* a dispatcher's "is a profiler attached" check */
volatile long dispatched, checked;
static kernel_fn table[4];
static kernel_fn other;

__attribute__((noinline)) double kernel_loop(const double *x, long n) {
    double s = 0.0;
    for (long r = 0; r < 8; r++)
        for (long i = 0; i < n; i++)
            s += x[i] * x[(i + r) % n];
    return s;
}

__attribute__((noinline)) double op_impl(const double *x, long n) {
    double s = 0.0;
    for (long k = 0; k < 4; k++)
        s += kernel_loop(x, n) * (double)(k + 1);
    return s;
}

__attribute__((noinline)) double op_wrapper(const double *x, long n) {
    double r = op_impl(x, n);
    dispatched++;
    return r;
}

__attribute__((noinline)) static void record(int key) { checked += key; }

__attribute__((noinline)) double op_dispatch(int key, const double *x, long n) {
    if (key < 0 || key > 3)
        return -1.0;
    if (profiling_on)
        record(key);
    kernel_fn f = table[key];
    double r = f(x, n);
    dispatched += key;
    return r;
}

__attribute__((noinline)) double op_call(const double *x, long n) {
    /* what a binding does before it dispatches: check its arguments, pick a key */
    if (x == NULL || n <= 0)
        return -1.0;
    int key = n > 100000 ? 1 : 0;
    if (x[0] != x[0])
        key = 2;
    double r = op_dispatch(key, x, n);
    checked += (long)n;
    return r;
}

__attribute__((noinline)) double run_callbacks(const double *x, long n, int times) {
    double s = 0.0;
    for (int t = 0; t < times; t++)
        s += table[t & 1](x, n);
    checked++;
    return s;
}

__attribute__((noinline)) double dispatch_other(int key, const double *x, long n) {
    if (key < 0 || other == NULL)
        return -1.0;
    double r = other(x, n);
    dispatched += key;
    return r;
}

void setup(kernel_fn from_other) {
    table[0] = table[1] = table[2] = table[3] = op_wrapper;
    other = from_other;
}
