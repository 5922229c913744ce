/* The library of dlphase: built twice, as libdla.so (-DNAME=dla_work) and libdlb.so
 * (-DNAME=dlb_work), the same size so that the second loads where the first was. */
#include "work.h"

/* not a tail call: NAME stays a frame between phase and compute */
__attribute__((noinline)) double NAME(double seconds) {
    volatile double r = compute(seconds);
    return r;
}
