/* Statements of another file without inlining: the loop's body is a file of its own,
   included into the function (as glibc's brk.c includes brk_call.h). */
#include <stdio.h>
#include <stdlib.h>

static double acc;

__attribute__((noinline)) static void work(int n) {
    for (int i = 0; i < n; i++) {
#include "included_body.h"
    }
}

int main(int argc, char **argv) {
    work(argc > 1 ? atoi(argv[1]) : 1000);
    printf("%f\n", acc);
    return 0;
}
