/* Writes machine code at run time, as a JIT does: mmap (RW), copy, mprotect (RX), call it
 * from jit_caller() in a loop. Usage: jit SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "work.h"

/* mov ecx, 200000 ; 1: dec ecx ; jnz 1b ; ret  -- a leaf that never touches the stack */
static const unsigned char CODE[] = {0xb9, 0x40, 0x0d, 0x03, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};

__attribute__((noinline)) void jit_caller(void (*fn)(void), double seconds) {
    double t0 = cpu_s();
    while (cpu_s() - t0 < seconds)
        for (int i = 0; i < 100; i++) fn();
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.3;
    unsigned char *p = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    memcpy(p, CODE, sizeof CODE);
    if (mprotect(p, 4096, PROT_READ | PROT_EXEC)) return 3;
    jit_caller((void (*)(void))p, seconds);
    printf("jit code at %p\n", (void *)p);
    return 0;
}
