/* Misbehaving targets: misbehave MODE [milliseconds]
 *   segv   burn CPU, then dereference NULL       abort  burn CPU, then abort()
 *   exit7  burn CPU, then exit(7)                spin   burn CPU until a signal arrives
 *   ok     burn CPU, then exit(0)
 *   signal burn CPU in main while a SIGALRM handler also burns CPU (signal frames)
 *   deep   burn CPU 3000 calls deep in a recursion (deeper than any stack copy)
 *   threads  start 300 short threads, one after another, each burning a little CPU
 *   orphan   fork a child that outlives the parent briefly (reaped by callpath run) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/time.h>
#include <unistd.h>

static volatile double sink;

__attribute__((noinline)) static void burn(long ms) {
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 20000; i++) sink = sink * 0.5 + i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

__attribute__((noinline)) void spin_forever(void) {
    printf("spinning\n");
    fflush(stdout);
    for (;;) burn(10);
}

static void *short_thread(void *arg) { (void)arg; burn(1); return NULL; }

/* Burns 3 ms of CPU per signal, several sampling periods: a handler that took about one
 * period could fall between two samples every time (the interval timer and the sampling
 * timer tick in phase) and get none. */
__attribute__((noinline)) static void in_handler(int sig) {
    (void)sig;
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 2000; i++) sink = sink * 0.5 + i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 3000000L);
}

__attribute__((noinline)) double deep(int n, long ms) {
    volatile char pad[64];
    pad[0] = (char)n;
    if (n == 0) { burn(ms); return pad[0]; }
    return deep(n - 1, ms) + pad[0];
}

__attribute__((noinline)) void signal_work(long ms) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = in_handler;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 10000}, {0, 10000}};
    setitimer(ITIMER_REAL, &it, NULL);
    burn(ms);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    sink += 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "exit7";
    long ms = argc > 2 ? atol(argv[2]) : 200;
    if (!strcmp(mode, "spin")) spin_forever();
    if (!strcmp(mode, "threads")) {
        for (int i = 0; i < 300; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, short_thread, NULL)) return 1;
            pthread_join(t, NULL);
        }
        return 0;
    }
    if (!strcmp(mode, "orphan")) {
        if (fork() == 0) { burn(ms); _exit(0); }
        return 0;
    }
    if (!strcmp(mode, "signal")) { signal_work(ms); return 0; }
    if (!strcmp(mode, "deep")) { sink += deep(3000, ms); return 0; }
    burn(ms);
    if (!strcmp(mode, "segv")) { volatile int *p = NULL; *p = 1; }
    if (!strcmp(mode, "abort")) abort();
    if (!strcmp(mode, "ok")) return 0;
    return 7;
}
