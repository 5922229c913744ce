/* A program for `callpath run --pid`: loops in hot_loop (4 parts of the work) and cold_loop
 * (1 part) until the file argv[1] exists, then prints "done" and exits 0. SIGUSR1 starts a
 * thread that loops in thread_hot (a thread born while the profiler is attached). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile double sink;
static volatile sig_atomic_t want_thread;
static volatile int stop;

__attribute__((noinline)) void hot_loop(long n) { for (long i = 0; i < n; i++) sink += i * 0.5; }
__attribute__((noinline)) void cold_loop(long n) { for (long i = 0; i < n; i++) sink += i * 0.25; }
__attribute__((noinline)) void thread_hot(long n) { for (long i = 0; i < n; i++) sink += i * 0.75; }

static void *worker(void *arg) {
    (void)arg;
    while (!stop) thread_hot(1000000);
    return NULL;
}

static void on_usr1(int sig) { (void)sig; want_thread = 1; }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    signal(SIGUSR1, on_usr1);
    pthread_t th;
    int started = 0;
    printf("ready\n");
    fflush(stdout);
    while (access(argv[1], F_OK) != 0) {
        hot_loop(400000);
        cold_loop(100000);
        if (want_thread && !started) {
            pthread_create(&th, NULL, worker, NULL);
            started = 1;
        }
    }
    stop = 1;
    if (started) pthread_join(th, NULL);
    printf("done\n");
    return 0;
}
