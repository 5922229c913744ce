/* Mixed Python/native sampling for `callpath run --native`: the capture half, in signal context.
 *
 * Why a real (sigaction) handler: Python runs its signal handlers between bytecodes, so by the
 * time sampler.py's handler runs, the native code that was interrupted (a BLAS kernel, a ctypes
 * call) has returned. The native stack and the Python stack of the same instant can only be
 * read in the signal handler itself. This handler runs first and then hands the signal to
 * Python's own handler (main thread only), so the Python-level sampler still runs as before.
 *
 * Per sample it copies, into a ring of fixed slots (lock-free reservation, any thread):
 *   - thread id, CLOCK_MONOTONIC and the thread's CPU clock;
 *   - the interrupted registers from the ucontext (ip, sp, bp, bx, r12-r15: what the CFI
 *     unwinder of callpath.measure.unwind needs);
 *   - the thread's Python frame chain, read from its PyThreadState (CPython frame records:
 *     code object address, byte offset of the instruction, first of its activation, owned
 *     by a generator or not); every record is read through read_mem (a copy that cannot
 *     fault: see "Reading the interpreter's memory" below), no code object is read;
 *   - a bounded slice of the native stack from sp, copied with process_vm_readv on ourselves
 *     page by page, so that a copy that runs off the end of a thread's stack stops at the
 *     fault instead of crashing; when the frames down to the outermost evaluation frame do
 *     not fit, two windows: one at sp and one that ends at that frame.
 * A plain pthread (no Python thread state, never sampled) drains the ring to a file every 20 ms
 * (at once when a handler finds it a quarter full) and every 100 ms gives each thread of the process that has none its own POSIX timer
 * (CLOCK_MONOTONIC, SIGEV_THREAD_ID), so threads that native libraries start (OpenMP, BLAS)
 * are sampled too. Unwinding and merging are post-mortem (callpath.measure.python.native_merge).
 *
 * Only CPython 3.11, 3.12 and 3.13 with the GIL (their frame records; walk_frames has one
 * branch for 3.11/3.12, which find the current frame through _PyCFrame, and one for 3.13,
 * which has none) on x86-64 Linux: elsewhere, free-threaded builds (Py_GIL_DISABLED) included,
 * `supported()` names the reason and the sampler falls back to Python-only paths.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && defined(__x86_64__) \
    && defined(__linux__) && !defined(Py_GIL_DISABLED)
#define CAPTURE 1
#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#else
#define CAPTURE 0
#endif

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define MAGIC 0x4e4d5043u /* "CPMN" */
#define MAX_PY 256
#define EVAL_MARGIN 1024  /* stack kept above the outermost evaluation frame's _PyCFrame
                              (3.11, 3.12) or shim frame (3.13) */
#define MAX_CHAIN 4096    /* frames walked in search of the outermost shim frame (3.13) */
#define HIGH_MIN 4096     /* the least stack copy that is split into two windows, halved */
#define MAX_EXTENT (64u << 20)  /* a _PyCFrame (3.13: shim frame) farther than this from sp
                                   is not on its stack */
#define MAX_TIMERS 512
#define PAGE 4096

/* one record, 8-byte aligned; the layout is repeated in merge.py (RECORD) */
typedef struct {
    uint32_t magic, size;     /* size of the whole record in bytes */
    uint32_t tid, flags;      /* flags: 1 main thread, 2 no thread state, 4 frames cut short,
                                 8 repeat: the thread has not run since its previous sample */
    uint64_t time, cpu;
    uint64_t regs[8];         /* ip sp bp bx r12 r13 r14 r15 */
    uint32_t npy, nstack;     /* Python frames (16 bytes each), stack bytes (from sp) */
    uint32_t nhigh, high_at;  /* a second window of the stack, after the first: nhigh bytes
                                 from sp + high_at (0, 0: none) */
} Head;

typedef struct {
    uint64_t code;            /* address of the code object (id(code) in Python) */
    int32_t offset;           /* byte offset of the last instruction in co_code */
    uint32_t flags;           /* 1 is_entry (first frame of its activation); 4 not a
                                 generator's frame: it has not started (not a real frame yet)
                                 while its offset is before its code's first RESUME, which
                                 the merge decides (the handler reads no code object) */
} PyRec;

/* A thread that used under REPEAT_CPU_NS of CPU since the end of its previous sample's
 * handler (the signal's delivery, a blocking call restarted, this handler's start), sits at
 * the same pc and sp, and whose first FINGERPRINT bytes of stack from sp are the same (a hash)
 * has not moved: its stacks are those of its previous sample, and the record says so instead
 * of copying them again (a thread blocked in a wait: 104 bytes a sample instead of 32 KiB). */
#define REPEAT_CPU_NS 50000
#define FINGERPRINT 512
typedef struct {
    uint64_t cpu, ip, sp, print;
    uint32_t gen, valid;
    uint32_t tid_gen;         /* tid below is this thread's for install() number tid_gen */
    pid_t tid;
} Last;
static __thread Last last_sample __attribute__((tls_model("initial-exec")));

static struct {
    int installed;
    uint32_t gen;             /* install() count: a forked child's threads start anew */
    int fd;
    pid_t pid, main_tid, writer_tid;
    size_t stack_bytes, slot_size, nslots;
    char *ring;
    uint32_t *state;          /* per slot: 0 free, 1 being written, 2 ready */
    uint64_t head, tail;      /* head: next slot to reserve (atomic); tail: next to drain */
    uint64_t lost, written, bytes;
    uint64_t handler_ns, handled;  /* CPU time in this handler (its own cost), samples */
    uint64_t writer_ns;       /* CPU time of the writer thread, when it ended */
    uintptr_t main_top;       /* end of the main thread's stack ([stack] in /proc/self/maps) */
    int64_t period_ns;
    struct sigaction old;
    pthread_t writer;
    sem_t wake;
    volatile int stop;
    pid_t ttid[MAX_TIMERS];
    timer_t tid_timer[MAX_TIMERS];
    int ntimers;
} G;

#if CAPTURE
static uint64_t
fingerprint(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;  /* FNV-1a over words */
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    return h;
}

/* The thread's control block, %fs:0 (glibc's tcbhead_t.tcb points at itself) */
static uintptr_t
thread_block(void)
{
    uintptr_t p;
    __asm__ volatile("mov %%fs:0, %0" : "=r"(p));
    return p;
}

static size_t
copy_stack(char *dst, uintptr_t sp, size_t want)
{
    struct iovec local = {dst, want};
    struct iovec remote[16];
    int n = 0;
    uintptr_t a = sp, end = sp + want;
    while (a < end && n < 16) {
        uintptr_t next = (a | (PAGE - 1)) + 1;
        if (next > end)
            next = end;
        remote[n].iov_base = (void *)a;
        remote[n].iov_len = next - a;
        n++;
        a = next;
    }
    ssize_t got = syscall(SYS_process_vm_readv, G.pid, &local, 1, remote, n, 0);
    return got > 0 ? (size_t)got : 0;
}

/* Reading the interpreter's memory from a signal handler. The handler can interrupt the
 * thread anywhere, also between two stores of the interpreter that only make sense together:
 * 3.11 and 3.12 point tstate->cframe at a new _PyCFrame (a local of _PyEval_EvalFrameDefault)
 * before they write its current_frame, so for a few instructions of every call from C into
 * Python that field holds whatever the C stack held there before (seen as SIGSEGV/SIGBUS of
 * the measured program under `map(lambda ...)`); a frame being pushed or popped, a data-stack
 * chunk just allocated or about to be freed, a stale frame's code object, are the same kind of
 * thing. So no pointer read from the interpreter is dereferenced as such: every read of a frame
 * record or _PyCFrame goes through read_mem, which copies in place only from memory that is
 * mapped at this instant for certain, and otherwise with process_vm_readv on this process,
 * which fails with EFAULT instead of faulting. What is read may still be stale (a frame that
 * was popped but whose memory is intact): the walk checks that each record is plausible and
 * stops at the first that is not, and the merge names code objects only by the addresses that
 * the sampler interned (a stale address is an unknown frame, never a dereference). Code
 * objects are not read at all here: whether a frame has started (its first RESUME) is decided
 * post-mortem from its offset (flag 4 below).
 *
 * Memory mapped for certain, read with memcpy:
 *   - the thread's data-stack chunks (where 3.11+ allocate every frame that is not a
 *     generator's), from tstate->datastack_chunk back through ->previous: the interpreter
 *     unlinks a chunk before it frees it, links it only after allocating it (from mmap: a
 *     field not yet written reads 0), and the current one's size must agree with
 *     tstate->datastack_limit (between the free of a popped chunk and the update of the limit
 *     it does not: then nothing is read in place);
 *   - the main thread's stack from sp to its end (_PyCFrame and 3.12/3.13 shim frames are
 *     locals of C frames), when sp lies in it.
 * Everything else (generator frames, the C stack of other threads, a stale pointer) is read
 * with process_vm_readv: about a microsecond a read, once per generator frame or activation. */
#define MAX_RANGES 10
#define CHUNK_MIN 16384              /* CPython's DATA_STACK_CHUNK_SIZE: chunks are powers of 2 */
#define MAIN_STACK_MAX (8u << 20)    /* sp this close below the main stack's end is on it */
typedef struct {
    int n;
    uintptr_t lo[MAX_RANGES], hi[MAX_RANGES];
} Ranges;

static int
read_mem(const Ranges *r, void *dst, uintptr_t src, size_t n)
{
    if (src == 0 || (src & 7) != 0 || src + n < src)
        return 0;
    for (int i = 0; i < r->n; i++) {
        if (src >= r->lo[i] && src + n <= r->hi[i]) {
            memcpy(dst, (const void *)src, n);
            return 1;
        }
    }
    struct iovec local = {dst, n}, remote = {(void *)src, n};
    return syscall(SYS_process_vm_readv, G.pid, &local, 1, &remote, 1, 0) == (ssize_t)n;
}

static int
chunk_size_ok(size_t size)
{
    return size >= CHUNK_MIN && size <= (1u << 30) && (size & (size - 1)) == 0;
}

/* The ranges of the thread's memory that can be read in place (see above). */
static void
safe_ranges(PyThreadState *ts, uintptr_t sp, int main, Ranges *r)
{
    r->n = 0;
    r->lo[r->n] = (uintptr_t)ts;  /* the thread's own state, live while it runs */
    r->hi[r->n++] = (uintptr_t)ts + sizeof *ts;
    if (main && G.main_top > sp && G.main_top - sp < MAIN_STACK_MAX) {
        r->lo[r->n] = sp;
        r->hi[r->n++] = G.main_top;
    }
    _PyStackChunk *c = ts->datastack_chunk;
    uintptr_t limit = (uintptr_t)ts->datastack_limit;
    if (c == NULL || ((uintptr_t)c & (PAGE - 1)) != 0 || !chunk_size_ok(c->size)
        || limit != (uintptr_t)c + c->size)
        return;
    r->lo[r->n] = (uintptr_t)c->data;
    r->hi[r->n++] = limit;
    /* older chunks: their headers are read with process_vm_readv (a pointer not written yet
     * reads 0 from fresh mmap memory, but an arena allocator of the program's own need not
     * give fresh memory); a chunk stays mapped while a newer one is linked after it */
    uintptr_t prev = (uintptr_t)c->previous;
    while (prev != 0 && r->n < MAX_RANGES && (prev & (PAGE - 1)) == 0) {
        _PyStackChunk head;
        struct iovec local = {&head, offsetof(_PyStackChunk, data)};
        struct iovec remote = {(void *)prev, offsetof(_PyStackChunk, data)};
        if (syscall(SYS_process_vm_readv, G.pid, &local, 1, &remote, 1, 0)
                != (ssize_t)offsetof(_PyStackChunk, data)
            || !chunk_size_ok(head.size))
            break;
        r->lo[r->n] = prev + offsetof(_PyStackChunk, data);
        r->hi[r->n++] = prev + head.size;
        prev = (uintptr_t)head.previous;
    }
}

/* The first bytes of a frame record, what the walk reads of it */
#define FRAME_HEAD offsetof(_PyInterpreterFrame, localsplus)
#define MAX_OFFSET (1 << 26)         /* a larger instruction offset is not a real frame's */

/* The thread's Python frames, innermost first, into py[0..*npy) (at most MAX_PY), and in
 * *outer the address of a local of the outermost evaluation activation's C frame (0: not
 * found): the stack above it (the interpreter's entry, which the merge leaves out) need not
 * be copied, only the rest of that frame (EVAL_MARGIN). Returns -1 when the thread has no
 * Python state, 1 when the frames were cut short (MAX_PY, or a record that could not be read
 * or is not plausible), else 0. Signal context: only the thread state is read directly, every
 * other read goes through read_mem. */
static int
walk_frames(PyThreadState *ts_, uintptr_t sp, int main, PyRec *py, uint32_t *npy_out,
            uintptr_t *outer_out)
{
    uint32_t npy = 0;
    *npy_out = 0;
    *outer_out = 0;
    if (ts_ == NULL)
        return -1;
    Ranges rg;
    safe_ranges(ts_, sp, main, &rg);
    const uintptr_t code_off = offsetof(PyCodeObject, co_code_adaptive);
    union {
        _PyInterpreterFrame f;
        char bytes[FRAME_HEAD];
    } fr;
#if PY_VERSION_HEX >= 0x030D0000
    /* 3.13: no _PyCFrame; the thread state points at the innermost frame itself. Each
     * evaluation activation links a shim frame owned by the C stack (a local of
     * _PyEval_EvalFrameDefault's C frame) below its first frame: that marks the activation's
     * entry, and the outermost shim's address bounds the stack copy as the outermost
     * _PyCFrame did in 3.11 and 3.12. The walk goes on past MAX_PY recorded frames (up to
     * MAX_CHAIN) only to find that shim. */
    uintptr_t f = (uintptr_t)ts_->current_frame, shim = 0;
    int guard = 0, cut = 0;
    for (; f != 0 && guard < MAX_CHAIN; guard++) {
        if (!read_mem(&rg, fr.bytes, f, FRAME_HEAD)
            || (unsigned char)fr.f.owner > FRAME_OWNED_BY_CSTACK)
            break;
        if (fr.f.owner == FRAME_OWNED_BY_CSTACK) {
            if (npy > 0 && !cut)
                py[npy - 1].flags |= 1u;
            shim = f;
            f = (uintptr_t)fr.f.previous;
            continue;
        }
        /* f_executable is the code object for Python frames (its type is not checked: that
         * would read the object; an address the sampler never interned is an unknown frame
         * in the merge); None is no Python code to record */
        uintptr_t co = (uintptr_t)fr.f.f_executable;
        intptr_t off = (intptr_t)fr.f.instr_ptr - (intptr_t)(co + code_off);
        if (co == 0 || (co & 7) != 0)
            break;
        if (co != (uintptr_t)Py_None) {
            if (off < -2 || off > MAX_OFFSET)
                break;
            if (npy >= MAX_PY) {
                cut = 1;
            } else {
                py[npy].code = (uint64_t)co;
                /* instr_ptr is the instruction being executed (a caller's: its CALL, while
                 * the callee runs), so its byte offset falls in the call's line */
                py[npy].offset = (int32_t)off;
                py[npy].flags = fr.f.owner != FRAME_OWNED_BY_GENERATOR ? 4u : 0u;
                npy++;
            }
        }
        f = (uintptr_t)fr.f.previous;
    }
    *npy_out = npy;
    *outer_out = f == 0 && shim != 0 ? shim : 0;
    return cut || f != 0;
#else
    _PyCFrame cf;
    uintptr_t cfa = (uintptr_t)ts_->cframe;
    if (cfa == 0 || !read_mem(&rg, &cf, cfa, sizeof cf))
        return -1;
    /* In the window described above cf.current_frame is stale: the walk below reads it
     * safely, and the records it gives fail the checks or are a popped frame's */
    uintptr_t f = (uintptr_t)cf.current_frame;
    int guard = 0;
    for (; f != 0 && npy < MAX_PY && guard < 2 * MAX_PY; guard++) {
        if (!read_mem(&rg, fr.bytes, f, FRAME_HEAD))
            break;
#if PY_VERSION_HEX >= 0x030C0000
        /* 3.12: each evaluation activation pushes a shim frame owned by the C stack below
         * its first frame, instead of marking that one is_entry */
        if ((unsigned char)fr.f.owner > FRAME_OWNED_BY_CSTACK)
            break;
        if (fr.f.owner == FRAME_OWNED_BY_CSTACK) {
            if (npy > 0)
                py[npy - 1].flags |= 1u;
            f = (uintptr_t)fr.f.previous;
            continue;
        }
        unsigned entry = 0;
#else
        if ((unsigned char)fr.f.owner > FRAME_OWNED_BY_FRAME_OBJECT)
            break;
        unsigned entry = fr.f.is_entry ? 1u : 0u;
#endif
        uintptr_t co = (uintptr_t)fr.f.f_code;
        intptr_t off = (intptr_t)fr.f.prev_instr - (intptr_t)(co + code_off);
        if (co == 0 || (co & 7) != 0 || off < -2 || off > MAX_OFFSET)
            break;
        py[npy].code = (uint64_t)co;
        py[npy].offset = (int32_t)off;
        py[npy].flags = entry | (fr.f.owner != FRAME_OWNED_BY_GENERATOR ? 4u : 0u);
        npy++;
        f = (uintptr_t)fr.f.previous;
    }
    *npy_out = npy;
    /* The outermost evaluation activation's _PyCFrame is a local of its C frame (the rest
     * of that frame: 336 bytes in 3.11.7's libpython). The chain goes outwards on the C
     * stack: each must lie above the last, within MAX_EXTENT of sp, and end at the thread
     * state's root_cframe; otherwise (a _PyCFrame whose previous is not written yet) no
     * bound: the whole stack_bytes are copied. */
    uintptr_t root = (uintptr_t)&ts_->root_cframe, outer = 0, at = cfa;
    for (int i = 0; at != 0 && at != root && i < 4096; i++) {
        if (at <= sp || at - sp >= MAX_EXTENT || (outer != 0 && at <= outer)
            || !read_mem(&rg, &cf, at, sizeof cf))
            break;
        outer = at;
        at = (uintptr_t)cf.previous;
    }
    *outer_out = at == root ? outer : 0;
    return f != 0 ? 1 : 0;
#endif
}

static void
on_signal(int sig, siginfo_t *info, void *ucv)
{
    int saved = errno;
    Last *ls = &last_sample;
    if (ls->tid_gen != G.gen || ls->tid == 0) {  /* a system call once per thread */
        ls->tid = (pid_t)syscall(SYS_gettid);
        ls->tid_gen = G.gen;
    }
    pid_t tid = ls->tid;
    int main = tid == G.main_tid;
    if (G.installed && G.ring != NULL && tid != G.writer_tid) {
        uint64_t h = __atomic_load_n(&G.head, __ATOMIC_RELAXED);
        int ok = 0;
        while (h - __atomic_load_n(&G.tail, __ATOMIC_ACQUIRE) < G.nslots) {
            if (__atomic_compare_exchange_n(&G.head, &h, h + 1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                ok = 1;
                break;
            }
        }
        if (!ok) {
            __atomic_fetch_add(&G.lost, 1, __ATOMIC_RELAXED);
            last_sample.valid = 0;  /* the next record must stand on its own */
        } else {
            size_t slot = (size_t)(h % G.nslots);
            char *p = G.ring + slot * G.slot_size;
            if (h - __atomic_load_n(&G.tail, __ATOMIC_RELAXED) == G.nslots / 4)
                sem_post(&G.wake);  /* async-signal-safe: the writer drains now */
            Head *hd = (Head *)p;
            ucontext_t *uc = (ucontext_t *)ucv;
            struct timespec ts;
            hd->magic = MAGIC;
            hd->tid = (uint32_t)tid;
            hd->flags = main ? 1 : 0;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            hd->time = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            hd->cpu = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            greg_t *gr = uc->uc_mcontext.gregs;
            hd->regs[0] = (uint64_t)gr[REG_RIP];
            hd->regs[1] = (uint64_t)gr[REG_RSP];
            hd->regs[2] = (uint64_t)gr[REG_RBP];
            hd->regs[3] = (uint64_t)gr[REG_RBX];
            hd->regs[4] = (uint64_t)gr[REG_R12];
            hd->regs[5] = (uint64_t)gr[REG_R13];
            hd->regs[6] = (uint64_t)gr[REG_R14];
            hd->regs[7] = (uint64_t)gr[REG_R15];
            int same = 0;
            if (ls->valid && ls->gen == G.gen && ls->ip == hd->regs[0] && ls->sp == hd->regs[1]
                && hd->cpu - ls->cpu < REPEAT_CPU_NS) {
                char top[FINGERPRINT];
                size_t n = copy_stack(top, (uintptr_t)hd->regs[1], sizeof top) & ~(size_t)7;
                same = fingerprint(top, n) == ls->print;
            }
            if (same) {
                hd->flags |= 8;
                hd->npy = hd->nstack = 0;
                hd->size = (uint32_t)sizeof(Head);
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
                ls->cpu = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
                __atomic_fetch_add(&G.handler_ns, ls->cpu - hd->cpu, __ATOMIC_RELAXED);
                __atomic_fetch_add(&G.handled, 1, __ATOMIC_RELAXED);
                __atomic_store_n(&G.state[slot], 2, __ATOMIC_RELEASE);
                goto forward;
            }
            PyRec *py = (PyRec *)(p + sizeof(Head));
            uint32_t npy = 0;
            size_t want = G.stack_bytes;
            size_t need = 0;  /* bytes from sp to the end of the outermost evaluation frame */
            /* pthread_getspecific: the thread's own state, also while it released the GIL */
            PyThreadState *ts_ = PyGILState_GetThisThreadState();
            uintptr_t outer = 0;
            int walked = walk_frames(ts_, (uintptr_t)hd->regs[1], main, py, &npy, &outer);
            if (walked < 0)
                hd->flags |= 2;
            else if (walked > 0)
                hd->flags |= 4;
            uintptr_t sp0 = (uintptr_t)hd->regs[1];
            if (outer > sp0 && outer - sp0 < MAX_EXTENT) {
                need = (outer - sp0 + EVAL_MARGIN) & ~(size_t)7;
                if (need < want)
                    want = need;
            } else if (!main) {
                /* No evaluation frame bounds the copy (a thread that runs no Python: an
                 * OpenMP or BLAS worker). glibc puts a thread's control block (what %fs
                 * points at) right above its stack, so nothing above it is stack: a worker
                 * a few KiB deep copies those instead of the whole stack_bytes (which made
                 * its records 32 KiB and their copy and writing most of the capture's cost
                 * in programs with many such threads). */
                uintptr_t tcb = thread_block();
                if (tcb > sp0 && tcb - sp0 < want)
                    want = (tcb - sp0) & ~(size_t)7;
            }
            hd->npy = npy;
            hd->nhigh = hd->high_at = 0;
            /* the stack follows the frames actually recorded */
            char *dst = p + sizeof(Head) + (size_t)npy * sizeof(PyRec);
            uintptr_t sp = (uintptr_t)hd->regs[1];
            size_t got;
            size_t high = 0, high_at = 0;
            if (need > want && want >= 2 * HIGH_MIN) {
                /* Too deep to copy whole (a native frame of hundreds of KiB between sp and
                 * the evaluation loop: OpenBLAS's gemm driver keeps its job array on the
                 * stack). Copy the frames near sp and, separately, those below the
                 * outermost evaluation frame: the unwinder steps over the big frame by its
                 * CFA and finds its return address in the second window. */
                high = want / 2 & ~(size_t)7;
                want -= high;
                high_at = (need - high) & ~(size_t)7;
            }
            if (main && G.main_top > sp && sp + 65536 > G.main_top) {
                /* the main thread's stack is mapped from sp to its known end: plain copy */
                got = G.main_top - sp < want ? G.main_top - sp : want;
                memcpy(dst, (const void *)sp, got);
            } else {
                got = copy_stack(dst, sp, want);
            }
            got &= ~(size_t)7;
            hd->nstack = (uint32_t)got;
            if (high && got == want) {
                size_t got2 = copy_stack(dst + got, sp + high_at, high) & ~(size_t)7;
                if (got2) {
                    hd->nhigh = (uint32_t)got2;
                    hd->high_at = (uint32_t)high_at;
                }
            }
            hd->size = (uint32_t)(sizeof(Head) + npy * sizeof(PyRec) + got + hd->nhigh);
            ls->ip = hd->regs[0];
            ls->sp = hd->regs[1];
            ls->print = fingerprint(dst, got < FINGERPRINT ? got : FINGERPRINT);
            ls->gen = G.gen;
            ls->valid = 1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);  /* after the copy: its cost is ours */
            ls->cpu = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            __atomic_fetch_add(&G.handler_ns, ls->cpu - hd->cpu, __ATOMIC_RELAXED);
            __atomic_fetch_add(&G.handled, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&G.state[slot], 2, __ATOMIC_RELEASE);
        }
    }
forward:
    errno = saved;
    if (main) {  /* Python's own handler: the Python-level sampler runs as before */
        if (G.old.sa_flags & SA_SIGINFO) {
            if (G.old.sa_sigaction != NULL)
                G.old.sa_sigaction(sig, info, ucv);
        } else if (G.old.sa_handler != SIG_IGN && G.old.sa_handler != SIG_DFL
                   && G.old.sa_handler != NULL) {
            G.old.sa_handler(sig);
        }
    }
}
#endif

/* Write every ready record in order, up to BATCH records a system call; stops at a slot still
 * being written. */
#define BATCH 64
static void
drain(void)
{
    for (;;) {
        struct iovec iov[BATCH];
        int n = 0;
        uint64_t t = G.tail;
        uint64_t head = __atomic_load_n(&G.head, __ATOMIC_ACQUIRE);
        size_t total = 0;
        while (n < BATCH && t + (uint64_t)n != head) {
            size_t slot = (size_t)((t + (uint64_t)n) % G.nslots);
            if (__atomic_load_n(&G.state[slot], __ATOMIC_ACQUIRE) != 2)
                break;
            Head *hd = (Head *)(G.ring + slot * G.slot_size);
            iov[n].iov_base = hd;
            iov[n].iov_len = hd->size;
            total += hd->size;
            n++;
        }
        if (n == 0)
            return;
        int k = 0;
        size_t off = 0;  /* bytes of iov[k] already written */
        while (k < n) {
            iov[k].iov_base = (char *)iov[k].iov_base + off;
            iov[k].iov_len -= off;
            ssize_t w = writev(G.fd, iov + k, n - k);
            if (w < 0) {
                if (errno == EINTR) {
                    off = 0;
                    continue;
                }
                break;  /* disk full: these records are lost, the program goes on */
            }
            off = 0;
            while (k < n && (size_t)w >= iov[k].iov_len) {
                w -= (ssize_t)iov[k].iov_len;
                k++;
            }
            if (k < n)
                off = (size_t)w;
        }
        for (int i = 0; i < n; i++)
            __atomic_store_n(&G.state[(size_t)((t + (uint64_t)i) % G.nslots)], 0,
                             __ATOMIC_RELAXED);
        G.written += (uint64_t)n;
        G.bytes += total;
        __atomic_store_n(&G.tail, t + (uint64_t)n, __ATOMIC_RELEASE);
    }
}

static int
arm_timer(pid_t tid, timer_t *out)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev.sigev_notify_thread_id = tid;
    if (timer_create(CLOCK_MONOTONIC, &sev, out) != 0)
        return -1;
    struct itimerspec it;
    it.it_interval.tv_sec = G.period_ns / 1000000000;
    it.it_interval.tv_nsec = G.period_ns % 1000000000;
    it.it_value = it.it_interval;
    if (timer_settime(*out, 0, &it, NULL) != 0) {
        timer_delete(*out);
        return -1;
    }
    return 0;
}

/* Give every thread but the main one (the sampler's timer) and the writer a timer; forget the
 * timers of threads that ended. */
static void
scan_threads(void)
{
    pid_t seen[MAX_TIMERS];
    int nseen = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && nseen < MAX_TIMERS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid == G.main_tid || tid == G.writer_tid)
            continue;
        seen[nseen++] = tid;
    }
    closedir(d);
    for (int i = 0; i < G.ntimers;) {
        int alive = 0;
        for (int j = 0; j < nseen; j++)
            alive |= seen[j] == G.ttid[i];
        if (!alive) {
            timer_delete(G.tid_timer[i]);
            G.ntimers--;
            G.ttid[i] = G.ttid[G.ntimers];
            G.tid_timer[i] = G.tid_timer[G.ntimers];
        } else {
            i++;
        }
    }
    for (int j = 0; j < nseen && G.ntimers < MAX_TIMERS; j++) {
        int have = 0;
        for (int i = 0; i < G.ntimers; i++)
            have |= G.ttid[i] == seen[j];
        if (!have && arm_timer(seen[j], &G.tid_timer[G.ntimers]) == 0)
            G.ttid[G.ntimers++] = seen[j];
    }
}

static void *
writer_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    G.writer_tid = (pid_t)syscall(SYS_gettid);
    int n = 0;
    while (!G.stop) {
        /* every 20 ms, or at once when a handler finds the ring a quarter full */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        while (sem_timedwait(&G.wake, &ts) != 0 && errno == EINTR)
            ;
        drain();
        if (n++ % 5 == 0)
            scan_threads();
    }
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    G.writer_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return NULL;
}

static void
stop_all(void)
{
    if (!G.installed)
        return;
    G.stop = 1;
    sem_post(&G.wake);
    pthread_join(G.writer, NULL);  /* first: it would arm timers for threads again */
    for (int i = 0; i < G.ntimers; i++)
        timer_delete(G.tid_timer[i]);
    G.ntimers = 0;
    drain();
}

/* The end of the main thread's stack, read from /proc/self/maps (not in signal context). */
static uintptr_t
main_stack_top(void)
{
    uintptr_t top = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL)
        return 0;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        if (strstr(line, "[stack]") != NULL) {
            unsigned long lo, hi;
            if (sscanf(line, "%lx-%lx", &lo, &hi) == 2)
                top = (uintptr_t)hi;
            break;
        }
    }
    fclose(f);
    return top;
}

static PyObject *
py_supported(PyObject *self, PyObject *noargs)
{
#if CAPTURE
    Py_RETURN_NONE;
#elif defined(Py_GIL_DISABLED)
    return PyUnicode_FromString("native capture is not built for free-threaded CPython "
                                "(Py_GIL_DISABLED): only for builds with the GIL");
#else
    return PyUnicode_FromString("native capture is built only for CPython 3.11, 3.12 and 3.13 "
                                "on x86-64 Linux");
#endif
}

/* install(fd, period_ns, stack_bytes, slots): after signal.signal(SIGPROF, ...) in the main
 * thread. Also after fork in the child (the writer thread and the timers did not survive). */
static PyObject *
py_install(PyObject *self, PyObject *args)
{
#if CAPTURE
    int fd;
    long long period;
    Py_ssize_t stack_bytes, nslots;
    if (!PyArg_ParseTuple(args, "iLnn", &fd, &period, &stack_bytes, &nslots))
        return NULL;
    if (stack_bytes < 0 || stack_bytes > 16 * PAGE - PAGE || nslots < 2 || period <= 0) {
        PyErr_SetString(PyExc_ValueError, "stack bytes in 0..61440, at least 2 slots");
        return NULL;
    }
    G.installed = 0;
    if (G.ring != NULL)
        munmap(G.ring, G.slot_size * G.nslots);
    free(G.state);
    uint32_t gen = G.gen + 1;
    memset(&G, 0, sizeof G);
    G.gen = gen;
    G.fd = fd;
    G.pid = getpid();
    G.main_tid = (pid_t)syscall(SYS_gettid);
    G.writer_tid = -1;
    G.main_top = main_stack_top();
    sem_init(&G.wake, 0, 0);
    G.period_ns = period;
    G.stack_bytes = (size_t)stack_bytes & ~(size_t)7;
    G.slot_size = (sizeof(Head) + MAX_PY * sizeof(PyRec) + G.stack_bytes + 63) & ~(size_t)63;
    G.nslots = (size_t)nslots;
    G.ring = mmap(NULL, G.slot_size * G.nslots, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    G.state = calloc(G.nslots, sizeof(uint32_t));
    if (G.ring == MAP_FAILED || G.state == NULL) {
        G.ring = NULL;
        return PyErr_NoMemory();
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    if (sigaction(SIGPROF, NULL, &G.old) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = (G.old.sa_flags & SA_RESTART) | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGPROF);
    G.installed = 1;
    if (pthread_create(&G.writer, NULL, writer_main, NULL) != 0) {
        G.installed = 0;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    while (__atomic_load_n(&G.writer_tid, __ATOMIC_ACQUIRE) == -1)
        sched_yield();
    if (sigaction(SIGPROF, &sa, NULL) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "native capture is not built for this interpreter");
    return NULL;
#endif
}

/* stop(): timers off, last records written; the handler stays (it forwards to Python's). */
static PyObject *
py_stop(PyObject *self, PyObject *noargs)
{
    Py_BEGIN_ALLOW_THREADS
    stop_all();
    Py_END_ALLOW_THREADS
    G.installed = 0;
    return Py_BuildValue("KKKKKK", (unsigned long long)G.written, (unsigned long long)G.lost,
                         (unsigned long long)G.bytes, (unsigned long long)G.handler_ns,
                         (unsigned long long)G.handled, (unsigned long long)G.writer_ns);
}

/* forget(): in a forked child, before install(): the parent's writer thread is not there */
static PyObject *
py_forget(PyObject *self, PyObject *noargs)
{
    G.installed = 0;
    G.ntimers = 0;
    Py_RETURN_NONE;
}

static PyObject *
py_stats(PyObject *self, PyObject *noargs)
{
    return Py_BuildValue("KKKi", (unsigned long long)G.written, (unsigned long long)G.lost,
                         (unsigned long long)G.bytes, G.ntimers);
}

static PyObject *
py_layout(PyObject *self, PyObject *noargs)
{
    return Py_BuildValue("nnnn", (Py_ssize_t)sizeof(Head), (Py_ssize_t)sizeof(PyRec),
                         (Py_ssize_t)MAX_PY,
#if CAPTURE
                         (Py_ssize_t)offsetof(PyCodeObject, co_code_adaptive)
#else
                         (Py_ssize_t)-1
#endif
                         );
}

static PyMethodDef methods[] = {
    {"supported", py_supported, METH_NOARGS, "None, or why native capture is not built"},
    {"install", py_install, METH_VARARGS, "install(fd, period_ns, stack_bytes, slots)"},
    {"stop", py_stop, METH_NOARGS, "stop() -> (records, lost, bytes, handler ns, samples, writer ns)"},
    {"forget", py_forget, METH_NOARGS, "after fork, before install"},
    {"stats", py_stats, METH_NOARGS, "(records, lost, bytes, thread timers)"},
    {"layout", py_layout, METH_NOARGS, "(head bytes, frame bytes, max frames, code offset)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_callpath_native",
    "Signal-time capture of Python and native stacks (callpath run --native).", -1, methods,
};

PyMODINIT_FUNC
PyInit__callpath_native(void)
{
    return PyModule_Create(&module_def);
}
