/* For tests/test_gpu_library.py: a call into the CUPTI library from a thread that runs no
 * Python, under C frames of the program's own (as PyTorch's autograd engine launches a
 * backward pass's kernels): its made-up launches (callpath_cupti_fake_launches), or its
 * unwinding check (callpath_cupti_unwind_check), passed in. */
#include <pthread.h>

typedef int (*fake_launches)(const char *path, int n, int native_depth, int in_thread);
typedef int (*unwind_check)(void **fast, void **slow, int max, int *counts);

struct job {
    int (*body)(struct job *);
    fake_launches launches; const char *path; int n;      /* launch_from_engine_thread */
    unwind_check check; void **fast, **slow; int *counts; /* check_from_engine_thread */
    int depth, rc;
};

__attribute__((noinline)) static int backward_op(struct job *j, int depth) {
    if (depth > 0) {
        int r = backward_op(j, depth - 1);
        __asm__ volatile("" ::: "memory"); /* no tail call: every level a frame */
        return r;
    }
    return j->body(j);
}

static void *engine_thread_main(void *arg) {
    struct job *j = arg;
    j->rc = backward_op(j, j->depth);
    return NULL;
}

static int in_engine_thread(struct job *j) {
    pthread_t t;
    if (pthread_create(&t, NULL, engine_thread_main, j) != 0) return -1;
    pthread_join(t, NULL);
    return j->rc;
}

static int launch(struct job *j) { return j->launches(j->path, j->n, 0, 0); }

static int check(struct job *j) { return j->check(j->fast, j->slow, j->n, j->counts); }

int launch_from_engine_thread(fake_launches fn, const char *path, int n, int depth) {
    struct job j = {.body = launch, .launches = fn, .path = path, .n = n, .depth = depth};
    return in_engine_thread(&j);
}

int check_from_engine_thread(unwind_check fn, void **fast, void **slow, int max, int *counts,
                             int depth) {
    struct job j = {.body = check, .check = fn, .fast = fast, .slow = slow, .n = max,
                    .counts = counts, .depth = depth};
    return in_engine_thread(&j);
}
