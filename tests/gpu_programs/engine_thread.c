/* For tests/test_gpu_library.py: launches from a thread that runs no Python, under C frames of
 * the program's own (as PyTorch's autograd engine launches a backward pass's kernels), through
 * the CUPTI library's made-up launch path (callpath_cupti_fake_launches, passed in). */
#include <pthread.h>

typedef int (*fake_launches)(const char *path, int n, int native_depth, int in_thread);
struct job { fake_launches fn; const char *path; int n, depth, rc; };

__attribute__((noinline)) static int backward_op(struct job *j, int depth) {
    if (depth > 0) {
        int r = backward_op(j, depth - 1);
        __asm__ volatile("" ::: "memory"); /* no tail call: every level a frame */
        return r;
    }
    return j->fn(j->path, j->n, 0, 0);
}

static void *engine_thread_main(void *arg) {
    struct job *j = arg;
    j->rc = backward_op(j, j->depth);
    return NULL;
}

int launch_from_engine_thread(fake_launches fn, const char *path, int n, int depth) {
    struct job j = {fn, path, n, depth, -1};
    pthread_t t;
    if (pthread_create(&t, NULL, engine_thread_main, &j) != 0) return -1;
    pthread_join(t, NULL);
    return j.rc;
}

/* The same thread and frames, calling the library's unwinding check instead of launching. */
typedef int (*unwind_check)(void **fast, void **slow, int max, int *counts);
struct check_job { unwind_check fn; void **fast, **slow; int max, *counts, depth, rc; };

__attribute__((noinline)) static int backward_check(struct check_job *j, int depth) {
    if (depth > 0) {
        int r = backward_check(j, depth - 1);
        __asm__ volatile("" ::: "memory");
        return r;
    }
    return j->fn(j->fast, j->slow, j->max, j->counts);
}

static void *check_thread_main(void *arg) {
    struct check_job *j = arg;
    j->rc = backward_check(j, j->depth);
    return NULL;
}

int check_from_engine_thread(unwind_check fn, void **fast, void **slow, int max, int *counts,
                             int depth) {
    struct check_job j = {fn, fast, slow, max, counts, depth, -1};
    pthread_t t;
    if (pthread_create(&t, NULL, check_thread_main, &j) != 0) return -1;
    pthread_join(t, NULL);
    return j.rc;
}
