/* pthreads: main and two threads compute. Usage: threads_app SECONDS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "work.h"

static double seconds;

__attribute__((noinline)) void *worker(void *arg) {
    *(double *)arg = compute(seconds);
    return 0;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 0.3;
    pthread_t t[2];
    double r[3];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, worker, &r[i]);
    r[2] = compute(seconds);
    for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
    printf("%g\n", r[0] + r[1] + r[2]);
    return 0;
}
