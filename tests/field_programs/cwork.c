/* A C library called from Python through ctypes (ctypes_app.py). */
#include "work.h"

double c_compute(double seconds) { return compute(seconds); }
