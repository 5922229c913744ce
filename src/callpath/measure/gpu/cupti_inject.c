/* callpath's CUPTI library: GPU operations and the calling contexts that launched them.
 *
 * Loaded into every CUDA process of a measured program through CUDA_INJECTION64_PATH (the
 * driver calls InitializeInjection at cuInit), so C/C++ programs need no change and Python
 * programs (PyTorch, CuPy, JAX) are measured the same way. Two CUPTI interfaces:
 *
 *  - the Callback API: at the ENTER of every runtime/driver call that launches GPU work
 *    (launches, copies, memsets, synchronizations, graph launches) it records the call's
 *    correlation id, the thread, and the calling context: the native return addresses
 *    (libgcc's CFI rules, each return address's computed once: launch_unwind.c; mapped to
 *    modules after the run) and,
 *    when the thread holds the GIL of a Python interpreter in this process, the Python frames
 *    (code object and line, through the public C API found with dlsym). That is about what
 *    one sample costs the samplers: no symbolisation or interning here.
 *  - the Activity API: kernels, memcpy, memset and synchronization records with their GPU
 *    start/end times, joined to the launch by the correlation id after the run.
 *
 * Everything goes to CALLPATH_GPU_DIR/gpu-<pid>.raw as tagged little-endian records (see
 * convert.py, which turns them into the measurement directory's format). A write failure
 * stops recording, never the program. A program launches from the same few hundred calling
 * contexts and the same few hundred kernels over and over: each distinct context and kernel
 * name is written once, and each launch and kernel names it by number (interning below).
 */
#define _GNU_SOURCE
/* not cupti.h: its generated API-parameter headers must match cuda.h exactly */
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef CP_KERNEL_T
#define CP_KERNEL_T CUpti_ActivityKernel9
#endif
#ifndef CP_MEMCPY_T
#define CP_MEMCPY_T CUpti_ActivityMemcpy5
#endif
#ifndef CP_MEMSET_T
#define CP_MEMSET_T CUpti_ActivityMemset4
#endif
#ifndef CP_SYNC_T
#define CP_SYNC_T CUpti_ActivitySynchronization
#endif
#ifndef CP_MEMORY_T
#define CP_MEMORY_T CUpti_ActivityMemory4
#endif

enum { R_API = 1, R_CODE = 2, R_KERNEL = 3, R_MEMCPY = 4, R_MEMSET = 5, R_SYNC = 6,
       R_MAPS = 7, R_INFO = 8, R_CUBIN = 9, R_MEMORY = 10, R_API_END = 11,
       R_CORR = 12, R_STACK = 13, R_LAUNCH = 14, R_NAME = 15, R_KERNEL_N = 16 };
/* what a chosen API call does: launches work (its activity records time it), or allocates
 * or frees memory (timed by the call itself: its ENTER and EXIT, an R_API_END record) */
enum { CALL_WORK = 1, CALL_ALLOC = 2, CALL_FREE = 3 };
#define MAX_NATIVE 512 /* a PyTorch launch from Python: 100-300 frames */
#define MAX_PY 256
static void emit(uint32_t tag, const void *a, size_t na, const void *b, size_t nb,
                 const void *c, size_t nc);
#define OUT_BUF (1 << 20)

static int out_fd = -1;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static char out_buf[OUT_BUF];
static size_t out_len;
static int with_native = 0;  /* CALLPATH_GPU_NATIVE=1: native frames also under Python ones */
static unsigned long long n_launch, n_dropped_records;
/* What measuring costs, reported at exit (a "cost" note; callpath run prints it): the time
 * spent in the chosen calls' callbacks (in the program's threads, at every launch), in the
 * activity buffers' records (CUPTI's thread), in saving GPU binaries (at module loads),
 * CUPTI's start and the flush at exit. CLOCK_MONOTONIC, read through the vDSO (~20 ns). */
static unsigned long long n_calls, ns_calls, n_records, ns_records, n_bins, bins_bytes,
    bins_saved, ns_bins, ns_start, ns_exit;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#define ADD(var, v) __atomic_add_fetch(&(var), (unsigned long long)(v), __ATOMIC_RELAXED)
static CUpti_SubscriberHandle subscriber;
static signed char decision[2][4096]; /* domain (0 driver, 1 runtime) x cbid: CALL_*, -1 no */
static __thread int in_runtime_launch;
static __thread uint32_t runtime_corr; /* the recorded runtime call's correlation id */

static void flush_locked(void) {
    size_t off = 0;
    while (out_fd >= 0 && off < out_len) {
        ssize_t w = write(out_fd, out_buf + off, out_len - off);
        if (w <= 0) { close(out_fd); out_fd = -1; break; }
        off += (size_t)w;
    }
    out_len = 0;
}

/* One record: u32 tag, u32 payload length, then the payload pieces. out_lock held. */
static void emit_locked(uint32_t tag, const void *a, size_t na, const void *b, size_t nb,
                        const void *c, size_t nc) {
    uint32_t head[2] = {tag, (uint32_t)(na + nb + nc)};
    size_t total = sizeof head + na + nb + nc;
    if (out_fd < 0) return;
    if (out_len + total > OUT_BUF) flush_locked();
    if (total > OUT_BUF) { /* too big for the buffer: straight to the file */
        if (write(out_fd, head, sizeof head) < 0 || (na && write(out_fd, a, na) < 0) ||
            (nb && write(out_fd, b, nb) < 0) || (nc && write(out_fd, c, nc) < 0)) {
            close(out_fd); out_fd = -1;
        }
    } else {
        memcpy(out_buf + out_len, head, sizeof head); out_len += sizeof head;
        if (na) { memcpy(out_buf + out_len, a, na); out_len += na; }
        if (nb) { memcpy(out_buf + out_len, b, nb); out_len += nb; }
        if (nc) { memcpy(out_buf + out_len, c, nc); out_len += nc; }
    }
}

static void emit(uint32_t tag, const void *a, size_t na, const void *b, size_t nb,
                 const void *c, size_t nc) {
    pthread_mutex_lock(&out_lock);
    emit_locked(tag, a, na, b, nb, c, nc);
    pthread_mutex_unlock(&out_lock);
}

/* --------------------------------------------------------------------------- interning
 * Distinct calling contexts and kernel names, each written once (R_STACK, R_NAME: its
 * number, then its bytes) before the first record that names it (R_LAUNCH, R_KERNEL_N), so
 * that a launch costs a 40-byte record where a copy of its frames took 1-2 KB (100 native
 * and 40 Python frames) and a kernel record keeps its 88 bytes without the name. Known by a
 * 128-bit hash of their bytes (two 64-bit multiply-xorshift lanes: the chance that two of a
 * million distinct contexts share one is about 10^-27). Looked up under out_lock, which the
 * record's write takes anyway, so the definition and its first use reach the file in that
 * order. A full table (far more distinct contexts than any program seen) writes launches
 * whole, as R_API records, which the conversion reads as well. */
#define STACK_SLOTS (1 << 16)
#define NAME_SLOTS (1 << 14)
struct interned { uint64_t h1, h2, id; };
static struct interned stack_table[STACK_SLOTS], name_table[NAME_SLOTS];
static uint64_t n_stack_ids, n_name_ids;

static void hash_words(const uint64_t *w, size_t n, uint64_t *h1, uint64_t *h2) {
    for (size_t i = 0; i < n; i++) {
        *h1 = (*h1 ^ w[i]) * 0xff51afd7ed558ccdull; *h1 ^= *h1 >> 29;
        *h2 = (*h2 ^ w[i]) * 0xc4ceb9fe1a85ec53ull; *h2 ^= *h2 >> 31;
    }
}

static void hash_bytes(const char *p, size_t n, uint64_t *h1, uint64_t *h2) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        hash_words(&w, 1, h1, h2);
    }
    uint64_t tail = (uint64_t)n << 56;
    memcpy(&tail, p + i, n - i); /* n - i < 8: the tail's bytes below the length */
    hash_words(&tail, 1, h1, h2);
}

/* The number of the entry with this hash (1, 2, ...), *fresh set where this call made it;
 * 0 where the table is full. out_lock held. */
static uint64_t intern_locked(struct interned *table, size_t slots, uint64_t *count,
                              uint64_t h1, uint64_t h2, int *fresh) {
    *fresh = 0;
    size_t at = (size_t)(h1 ^ (h1 >> 32)) & (slots - 1);
    for (size_t probe = 0; probe < 64; probe++, at = (at + 1) & (slots - 1)) {
        struct interned *e = &table[at];
        if (e->id == 0) {
            if (*count >= slots / 4 * 3) return 0;
            e->h1 = h1; e->h2 = h2; e->id = ++*count;
            *fresh = 1;
            return e->id;
        }
        if (e->h1 == h1 && e->h2 == h2) return e->id;
    }
    return 0;
}

/* A launch: head = correlation id, thread and call, time, frame counts; its native return
 * addresses and Python frames. */
static void emit_launch(const uint64_t head[4], void *const *pcs, int nnat, const uint64_t *py,
                        int npy) {
    size_t nb = sizeof(void *) * (size_t)nnat, nc = 2 * sizeof(uint64_t) * (size_t)npy;
    uint64_t h1 = 0x9E3779B97F4A7C15ull, h2 = 0x27D4EB2F165667C5ull;
    hash_words(&head[3], 1, &h1, &h2);
    hash_words((const uint64_t *)pcs, (size_t)nnat, &h1, &h2);
    hash_words(py, 2 * (size_t)npy, &h1, &h2);
    pthread_mutex_lock(&out_lock);
    int fresh;
    uint64_t id = intern_locked(stack_table, STACK_SLOTS, &n_stack_ids, h1, h2, &fresh);
    if (id == 0) {
        emit_locked(R_API, head, 4 * sizeof(uint64_t), pcs, nb, py, nc);
    } else {
        if (fresh) {
            uint64_t def[2] = {id, head[3]};
            emit_locked(R_STACK, def, sizeof def, pcs, nb, py, nc);
        }
        uint64_t rec[4] = {head[0], head[1], head[2], id};
        emit_locked(R_LAUNCH, rec, sizeof rec, NULL, 0, NULL, 0);
    }
    pthread_mutex_unlock(&out_lock);
}

/* A kernel's activity record: ten words, then its name. */
static void emit_kernel(const uint64_t v[10], const char *name) {
    size_t len = strlen(name);
    uint64_t h1 = 0x165667B19E3779F9ull, h2 = 0xC2B2AE3D27D4EB4Full;
    hash_bytes(name, len, &h1, &h2);
    pthread_mutex_lock(&out_lock);
    int fresh;
    uint64_t id = intern_locked(name_table, NAME_SLOTS, &n_name_ids, h1, h2, &fresh);
    if (id == 0) {
        emit_locked(R_KERNEL, v, 10 * sizeof(uint64_t), name, len, NULL, 0);
    } else {
        if (fresh) emit_locked(R_NAME, &id, sizeof id, name, len, NULL, 0);
        emit_locked(R_KERNEL_N, v, 10 * sizeof(uint64_t), &id, sizeof id, NULL, 0);
    }
    pthread_mutex_unlock(&out_lock);
}

/* A new output file defines its contexts and names anew (the tests' runs, each to a file of
 * its own; a real process opens one file). */
static void forget_interned(void) {
    pthread_mutex_lock(&out_lock);
    memset(stack_table, 0, sizeof stack_table);
    memset(name_table, 0, sizeof name_table);
    n_stack_ids = n_name_ids = 0;
    pthread_mutex_unlock(&out_lock);
}

/* ------------------------------------------------------------------------ Python frames
 * Read from the thread's own CPython frame records, without the GIL: PyTorch (like most C
 * extensions) releases the GIL around the work that launches kernels, so the GIL-holding
 * C API is unusable exactly there. While this thread is inside our callback its frames cannot
 * change, and every object read (frame records, code objects, their name strings) is held by
 * a strong reference of a live frame; nothing is allocated and no reference count is touched.
 * Built only against the headers of the interpreter that runs callpath (CP_PYTHON, the same
 * layouts as the --native sampler's _callpath_native.c), and used only where the process's
 * interpreter has that version (Py_Version). Every CPython symbol is looked up with dlsym so
 * that the library loads in processes without Python. */
#ifdef CP_PYTHON
#define Py_BUILD_CORE 1
#include <Python.h>
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE

static PyThreadState *(*py_this_thread)(void);
static PyTypeObject *py_code_type;
static int (*py_addr2line)(PyCodeObject *, int);
static int python_ok;

static void resolve_python(void) {
    const unsigned long *version = dlsym(RTLD_DEFAULT, "Py_Version");
    *(void **)(&py_this_thread) = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    py_code_type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    *(void **)(&py_addr2line) = dlsym(RTLD_DEFAULT, "PyCode_Addr2Line");
    python_ok = version && (*version >> 16) == ((unsigned long)PY_VERSION_HEX >> 16) &&
                py_this_thread && py_code_type && py_addr2line;
}

/* An immutable str's UTF-8 text without calling CPython: compact ASCII data, else the
 * cached UTF-8 form, else a stand-in. */
static const char *str_text(PyObject *o) {
    if (o == NULL || !PyUnicode_Check(o)) return "?";
    PyASCIIObject *a = (PyASCIIObject *)o;
    if (a->state.compact && a->state.ascii) return (const char *)(a + 1);
    PyCompactUnicodeObject *c = (PyCompactUnicodeObject *)o;
    return c->utf8 ? c->utf8 : "<non-ASCII name>";
}

#define CODE_SLOTS 8192
static struct { PyCodeObject *code; PyObject *file, *name; int first; uint64_t key; }
    known_code[CODE_SLOTS];
static pthread_mutex_t code_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t code_generation;

/* The key of a code object, describing it (file, qualified name, first line) in a CODE
 * record the first time; a new code object at a freed one's address gets a new key. */
static uint64_t code_key(PyCodeObject *co) { /* code_lock held */
    uint64_t key;
    uintptr_t h = ((uintptr_t)co >> 4) % CODE_SLOTS;
    int slot = -1;
    for (int probe = 0; probe < 32; probe++, h = (h + 1) % CODE_SLOTS) {
        if (known_code[h].code == co || known_code[h].code == NULL) { slot = (int)h; break; }
    }
    if (slot >= 0 && known_code[slot].code == co && known_code[slot].file == co->co_filename &&
        known_code[slot].name == co->co_qualname && known_code[slot].first == co->co_firstlineno) {
        return known_code[slot].key;
    }
    key = (uint64_t)(uintptr_t)co | (++code_generation << 48);
    if (slot < 0) slot = (int)(((uintptr_t)co >> 4) % CODE_SLOTS); /* table full: evict */
    known_code[slot].code = co;
    known_code[slot].file = co->co_filename;
    known_code[slot].name = co->co_qualname;
    known_code[slot].first = co->co_firstlineno;
    known_code[slot].key = key;
    const char *file = str_text(co->co_filename), *name = str_text(co->co_qualname);
    uint32_t lens[3] = {(uint32_t)co->co_firstlineno, (uint32_t)strlen(file),
                        (uint32_t)strlen(name)};
    uint8_t head[sizeof key + sizeof lens];
    memcpy(head, &key, sizeof key);
    memcpy(head + sizeof key, lens, sizeof lens);
    emit(R_CODE, head, sizeof head, file, lens[1], name, lens[2]);
    return key;
}

/* The line of an instruction: PyCode_Addr2Line decodes the line table from its start, a
 * cost per frame that a training loop's launches repeat from the same few hundred places, so
 * (code, offset) -> line is remembered. */
#define LINE_SLOTS 16384
static struct { uint64_t key; int offset, line; } line_cache[LINE_SLOTS];

/* key: code_key(co), which changes when a new code object takes a freed one's address */
static int line_of(uint64_t key, PyCodeObject *co, int offset) { /* code_lock held */
    uintptr_t h = ((uintptr_t)(key >> 4) * 31u + (uintptr_t)offset) % LINE_SLOTS;
    if (line_cache[h].key == key && line_cache[h].offset == offset) return line_cache[h].line;
    int line = py_addr2line(co, offset);
    line_cache[h].key = key;
    line_cache[h].offset = offset;
    line_cache[h].line = line;
    return line;
}

/* The thread's Python frames, innermost first: (code key, line | entry << 32) pairs, entry
 * marking the first frame of an activation of the evaluation loop (3.11: is_entry; 3.12+: the
 * frame above a shim frame owned by the C stack), where --native's merge cuts the frames into
 * one group per _PyEval_EvalFrameDefault frame of the native stack. A skipped frame (not
 * started yet) that began an activation hands its mark to the frame recorded before it. */
#define PY_ENTRY (1ull << 32)
static int python_frames(uint64_t *out) {
    if (!python_ok) return 0;
    PyThreadState *ts = py_this_thread();
    if (ts == NULL) return 0;
    int n = 0;
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
#else
    if (ts->cframe == NULL) return 0;
    _PyInterpreterFrame *f = ts->cframe->current_frame;
#endif
    pthread_mutex_lock(&code_lock); /* once per walk: the code and line tables */
    for (int guard = 0; f != NULL && n < MAX_PY && guard < 4 * MAX_PY; guard++, f = f->previous) {
#if PY_VERSION_HEX >= 0x030C0000
        if (f->owner == FRAME_OWNED_BY_CSTACK) {
            if (n > 0) out[2 * n - 1] |= PY_ENTRY;
            continue;
        }
        int entry = 0;
#else
        int entry = f->is_entry;
#endif
#if PY_VERSION_HEX >= 0x030D0000
        PyObject *ex = f->f_executable;
        if (ex == NULL || Py_TYPE(ex) != py_code_type) continue;
        PyCodeObject *co = (PyCodeObject *)ex;
        _Py_CODEUNIT *at = f->instr_ptr;
#else
        PyCodeObject *co = f->f_code;
        if (co == NULL) break;
        _Py_CODEUNIT *at = f->prev_instr;
#endif
        _Py_CODEUNIT *first = _PyCode_CODE(co);
        if (f->owner != FRAME_OWNED_BY_GENERATOR && at < first + co->_co_firsttraceable) {
            if (entry && n > 0) out[2 * n - 1] |= PY_ENTRY;
            continue; /* not started yet (_PyFrame_IsIncomplete) */
        }
        uint64_t key = code_key(co);
        int line = line_of(key, co, (int)((char *)at - (char *)first));
        out[2 * n] = key;
        out[2 * n + 1] = (uint64_t)(uint32_t)(line < 0 ? 0 : line) | (entry ? PY_ENTRY : 0);
        n++;
    }
    pthread_mutex_unlock(&code_lock);
    return n;
}

/* A new output file describes its code objects anew (the tests' launches, each to a file of
 * its own; a real process opens one file). */
static void forget_codes(void) {
    pthread_mutex_lock(&code_lock);
    memset(known_code, 0, sizeof known_code);
    pthread_mutex_unlock(&code_lock);
}
#else
static void resolve_python(void) {}
static int python_frames(uint64_t *out) { (void)out; return 0; }
static void forget_codes(void) {}
#endif

#include "launch_unwind.c"

/* ---------------------------------------------------------------------------- callbacks */
/* whether fn starts with one of names (NULL-terminated) */
static int prefixed(const char *fn, const char *const *names) {
    for (; *names; names++)
        if (strncmp(fn, *names, strlen(*names)) == 0) return 1;
    return 0;
}

static int wanted(int runtime, const char *fn) {
    if (!fn) return 0;
    static const char *const rt_alloc[] = {"cudaMalloc", "cudaHostAlloc", NULL};
    static const char *const rt_free[] = {"cudaFree", NULL};
    static const char *const dr_alloc[] = {"cuMemAlloc", "cuMemHostAlloc", NULL};
    static const char *const dr_free[] = {"cuMemFree", NULL};
    static const char *const rt[] = {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
                                     "cudaStreamSynchronize", "cudaDeviceSynchronize",
                                     "cudaEventSynchronize", "cudaStreamWaitEvent",
                                     "cudaThreadSynchronize", NULL};
    static const char *const dr[] = {"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch",
                                     "cuStreamSynchronize", "cuCtxSynchronize",
                                     "cuEventSynchronize", "cuStreamWaitEvent", NULL};
    if (prefixed(fn, runtime ? rt_alloc : dr_alloc)) return CALL_ALLOC;
    if (prefixed(fn, runtime ? rt_free : dr_free)) return CALL_FREE;
    return prefixed(fn, runtime ? rt : dr) ? CALL_WORK : 0;
}

/* GPU binaries (by default; CALLPATH_GPU_BINS=0 turns it off): the cubin of every module a
 * process loads, saved once per content as CALLPATH_GPU_DIR/gpubins/<bin_hash>.gpubin (as
 * hpcrun's gpubins/), for naming kernels by their binary and `callpath struct`'s functions,
 * source lines and loops. The cost is one pass over each module's bytes when it is loaded,
 * and one write per distinct module. */
static int save_binaries;

/* A 64-bit hash of a binary's bytes, for its file name: four independent multiply-xorshift
 * lanes over 32-byte blocks (12 GB/s here, against 0.9 GB/s for byte-wise FNV-1a: PyTorch
 * loads modules of many MiB), the tail byte by byte, then a final mix. */
static uint64_t bin_hash(const uint8_t *p, size_t n) {
    const uint64_t k = 0xff51afd7ed558ccdull;
    uint64_t a = 0x9E3779B97F4A7C15ull ^ n, b = 0xC2B2AE3D27D4EB4Full, c = 0x165667B19E3779F9ull,
             d = 0x27D4EB2F165667C5ull;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a = (a ^ w[0]) * k; a ^= a >> 29;
        b = (b ^ w[1]) * k; b ^= b >> 29;
        c = (c ^ w[2]) * k; c ^= c >> 29;
        d = (d ^ w[3]) * k; d ^= d >> 29;
    }
    uint64_t h = a ^ (b * 3) ^ (c * 5) ^ (d * 7);
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ull; h ^= h >> 33;
    return h;
}

/* the cubin's file in gpubins/, unless one of the same content is there */
static void store_cubin(const CUpti_ModuleResourceData *m) {
    uint64_t h = bin_hash((const uint8_t *)m->pCubin, m->cubinSize);
    const char *dir = getenv("CALLPATH_GPU_DIR");
    if (!dir) return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/gpubins", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/gpubins/%016llx.gpubin", dir, (unsigned long long)h);
    uint64_t rec[3] = {m->moduleId, h, m->cubinSize};
    emit(R_CUBIN, rec, sizeof rec, NULL, 0, NULL, 0);
    if (access(path, F_OK) == 0) return;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t off = 0;
    while (off < m->cubinSize) {
        ssize_t w = write(fd, m->pCubin + off, m->cubinSize - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(fd);
    if (off == m->cubinSize && rename(tmp, path) == 0) ADD(bins_saved, 1);
    else unlink(tmp);
}

/* a module's cubin saved (see above), and the time it took counted */
static void save_cubin(const CUpti_ModuleResourceData *m) {
    if (m == NULL || m->pCubin == NULL || m->cubinSize == 0) return;
    uint64_t t0 = now_ns();
    store_cubin(m);
    ADD(n_bins, 1);
    ADD(bins_bytes, m->cubinSize);
    ADD(ns_bins, now_ns() - t0);
}

/* ENTER or EXIT of a launching, allocating or freeing call (what: CALL_*) */
static void chosen_call(int runtime, int what, CUpti_CallbackId cbid,
                        const CUpti_CallbackData *cb) {
    if (cb->callbackSite == CUPTI_API_EXIT) {
        /* an allocation's or free's end, unless it is the driver call inside a runtime one */
        if (what != CALL_WORK && (runtime || !in_runtime_launch)) {
            uint64_t end[3] = {cb->correlationId, 0, (uint64_t)what};
            cuptiGetTimestamp(&end[1]);
            emit(R_API_END, end, sizeof end, NULL, 0, NULL, 0);
        }
        if (runtime) in_runtime_launch = 0;
        return;
    }
    if (runtime) {
        in_runtime_launch = 1;
        runtime_corr = cb->correlationId;
    } else if (in_runtime_launch) { /* the driver call inside a recorded runtime call */
        if (what != CALL_WORK) {
            /* CUPTI's memory record may name either call: the driver's id maps to the
             * runtime's */
            uint64_t pair[2] = {cb->correlationId, runtime_corr};
            emit(R_CORR, pair, sizeof pair, NULL, 0, NULL, 0);
        }
        return;
    }
    uint64_t py[2 * MAX_PY];
    int npy = python_frames(py);
    void *pcs[MAX_NATIVE];
    int nnat = (with_native || npy == 0) ? native_frames(pcs, MAX_NATIVE) : 0;
    uint64_t head[4];
    head[0] = cb->correlationId;
    head[1] = (uint64_t)syscall(SYS_gettid) | ((uint64_t)(runtime ? 2 : 1) << 32) |
              ((uint64_t)(cbid & 0xffff) << 40);
    head[2] = 0;
    cuptiGetTimestamp(&head[2]);
    head[3] = (uint64_t)(uint32_t)nnat | ((uint64_t)(uint32_t)npy << 32);
    emit_launch(head, pcs, nnat, py, npy);
    ADD(n_launch, 1);
}

static void CUPTIAPI on_api(void *ud, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                            const void *data) {
    (void)ud;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
        if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED)
            save_cubin((const CUpti_ModuleResourceData *)
                       ((const CUpti_ResourceData *)data)->resourceDescriptor);
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    int runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
    signed char *d = cbid < 4096 ? &decision[runtime][cbid] : NULL;
    int what = d && *d ? (*d > 0 ? *d : 0) : wanted(runtime, cb->functionName);
    if (d && !*d) *d = what ? (signed char)what : -1;
    if (!what) return;
    uint64_t t0 = now_ns();
    chosen_call(runtime, what, cbid, cb);
    ADD(n_calls, 1);
    ADD(ns_calls, now_ns() - t0);
}

/* ----------------------------------------------------------------------- activity records */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 8 << 20;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void record(CUpti_Activity *r) {
    ADD(n_records, 1);
    uint64_t v[16];
    memset(v, 0, sizeof v);
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        CP_KERNEL_T *k = (CP_KERNEL_T *)r;
        v[0] = k->correlationId; v[1] = k->start; v[2] = k->end;
        v[3] = k->deviceId | ((uint64_t)k->contextId << 32);
        v[4] = k->streamId;
        v[5] = (uint64_t)(uint32_t)k->gridX * (uint32_t)k->gridY * (uint32_t)k->gridZ;
        v[6] = (uint64_t)(uint32_t)k->blockX * (uint32_t)k->blockY * (uint32_t)k->blockZ;
        v[7] = k->registersPerThread;
        v[8] = k->staticSharedMemory | ((uint64_t)k->dynamicSharedMemory << 32);
        v[9] = k->localMemoryTotal;
        emit_kernel(v, k->name ? k->name : "");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CP_MEMCPY_T *m = (CP_MEMCPY_T *)r;
        v[0] = m->correlationId; v[1] = m->start; v[2] = m->end;
        v[3] = m->deviceId | ((uint64_t)m->contextId << 32);
        v[4] = m->streamId; v[5] = m->bytes; v[6] = m->copyKind;
        emit(R_MEMCPY, v, 7 * sizeof(uint64_t), NULL, 0, NULL, 0);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        CP_MEMSET_T *m = (CP_MEMSET_T *)r;
        v[0] = m->correlationId; v[1] = m->start; v[2] = m->end;
        v[3] = m->deviceId | ((uint64_t)m->contextId << 32);
        v[4] = m->streamId; v[5] = m->bytes; v[6] = m->memoryKind;
        emit(R_MEMSET, v, 7 * sizeof(uint64_t), NULL, 0, NULL, 0);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
        CP_MEMORY_T *m = (CP_MEMORY_T *)r;
        v[0] = m->correlationId; v[1] = m->timestamp; v[2] = m->bytes;
        v[3] = m->deviceId | ((uint64_t)m->contextId << 32);
        v[4] = m->streamId;
        v[5] = (uint64_t)m->memoryKind | ((uint64_t)m->memoryOperationType << 32);
        emit(R_MEMORY, v, 6 * sizeof(uint64_t), NULL, 0, NULL, 0);
        break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        CP_SYNC_T *s = (CP_SYNC_T *)r;
        v[0] = s->correlationId; v[1] = s->start; v[2] = s->end;
        v[3] = (uint64_t)s->contextId << 32;
        v[4] = s->streamId; v[5] = 0; v[6] = s->type;
        emit(R_SYNC, v, 7 * sizeof(uint64_t), NULL, 0, NULL, 0);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
    (void)ctx; (void)stream; (void)size;
    uint64_t t0 = now_ns();
    CUpti_Activity *r = NULL;
    while (valid && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) record(r);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        n_dropped_records += dropped;
    free(buffer);
    ADD(ns_records, now_ns() - t0);
}

/* -------------------------------------------------------------------------- start, end */
static void info(const char *text) { emit(R_INFO, text, strlen(text), NULL, 0, NULL, 0); }

static void copy_maps(void) {
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0) return;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)got;
        if (len == cap) { char *b = realloc(buf, cap * 2); if (!b) break; buf = b; cap *= 2; }
    }
    close(fd);
    if (buf) emit(R_MAPS, buf, len, NULL, 0, NULL, 0);
    free(buf);
}

static pid_t owner;

static void cost_note(void) {
    char text[320];
    snprintf(text, sizeof text,
             "cost start_ns=%llu calls=%llu calls_ns=%llu launches=%llu records=%llu "
             "records_ns=%llu bins=%llu bins_bytes=%llu bins_saved=%llu bins_ns=%llu "
             "exit_ns=%llu unwind_fallbacks=%llu", ns_start, n_calls, ns_calls, n_launch,
             n_records, ns_records, n_bins, bins_bytes, bins_saved, ns_bins, ns_exit,
             n_walks_fell_back);
    info(text);
}

/* Only the calls that launch work call back (a few dozen of CUDA's ~1400 runtime and driver
 * entry points): PyTorch makes many other calls per launch (device and stream queries),
 * each of which would otherwise cost a callback. The names come from the CUPTI in use
 * (cuptiGetCallbackName, looked up at run time); returns how many were enabled, or -1
 * where the names cannot be had. */
static int enable_launch_callbacks(void) {
    CUptiResult (*name_of)(CUpti_CallbackDomain, uint32_t, const char **);
    *(void **)(&name_of) = dlsym(RTLD_DEFAULT, "cuptiGetCallbackName");
    if (name_of == NULL) return -1;
    int n = 0;
    for (int runtime = 0; runtime <= 1; runtime++) {
        CUpti_CallbackDomain dom = runtime ? CUPTI_CB_DOMAIN_RUNTIME_API
                                           : CUPTI_CB_DOMAIN_DRIVER_API;
        for (uint32_t cbid = 1; cbid < 4096; cbid++) {
            const char *name = NULL;
            if (name_of(dom, cbid, &name) != CUPTI_SUCCESS || name == NULL) continue;
            int what = wanted(runtime, name);
            if (what && cuptiEnableCallback(1, subscriber, dom, cbid) == CUPTI_SUCCESS) {
                decision[runtime][cbid] = (signed char)what;
                n++;
            }
        }
    }
    return n;
}

/* CUPTI's timestamps against CLOCK_MONOTONIC, the clock of both samplers' traces: a CUPTI
 * reading on each side of a monotonic one, so that the conversion can put GPU operations on
 * the CPU threads' time line. */
static void clock_note(const char *when) {
    uint64_t a = 0, b = 0;
    struct timespec ts;
    cuptiGetTimestamp(&a);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    cuptiGetTimestamp(&b);
    char text[160];
    snprintf(text, sizeof text, "clock %s cupti=%llu mono=%llu", when,
             (unsigned long long)(a / 2 + b / 2 + (a % 2 + b % 2) / 2),
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    info(text);
}

static void at_exit(void) {
    if (getpid() != owner) return; /* a forked child without its own CUDA */
    uint64_t t0 = now_ns();
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    clock_note("end");
    char text[160];
    snprintf(text, sizeof text, "end launches=%llu dropped=%llu", n_launch, n_dropped_records);
    info(text);
    copy_maps();
    ns_exit = now_ns() - t0;
    cost_note();
    pthread_mutex_lock(&out_lock);
    flush_locked();
    if (out_fd >= 0) close(out_fd);
    out_fd = -1;
    pthread_mutex_unlock(&out_lock);
}

int InitializeInjection(void) {
    const char *dir = getenv("CALLPATH_GPU_DIR");
    if (!dir || out_fd >= 0) return 1;
    uint64_t t0 = now_ns();
    owner = getpid();
    char path[4096];
    snprintf(path, sizeof path, "%s/gpu-%d.raw", dir, (int)owner);
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) return 1;
    const char *nat = getenv("CALLPATH_GPU_NATIVE");
    with_native = nat && nat[0] == '1';
    resolve_python();
    resolve_fast_unwind();
    uint32_t version = 0;
    cuptiGetVersion(&version);
    char text[160];
    CUptiResult res = cuptiSubscribe(&subscriber, (CUpti_CallbackFunc)on_api, NULL);
    if (res != CUPTI_SUCCESS) {
        const char *msg = "?";
        cuptiGetResultString(res, &msg);
        snprintf(text, sizeof text, "subscribe-failed %d %s", (int)res, msg);
        info(text);
        pthread_mutex_lock(&out_lock);
        flush_locked();
        pthread_mutex_unlock(&out_lock);
        return 1;
    }
    snprintf(text, sizeof text, "start cupti=%u pid=%d", version, (int)owner);
    info(text);
    clock_note("start");
    int chosen = enable_launch_callbacks();
    snprintf(text, sizeof text, "callbacks %d", chosen);
    info(text);
    if (chosen <= 0) { /* no names to choose by: every call, filtered in on_api */
        cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
        cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    }
    const char *bins = getenv("CALLPATH_GPU_BINS");
    save_binaries = !(bins && bins[0] == '0');
    if (save_binaries)
        cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                            CUPTI_CBID_RESOURCE_MODULE_LOADED);
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    static const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
        CUPTI_ACTIVITY_KIND_MEMORY2};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        res = cuptiActivityEnable(kinds[i]);
        if (res != CUPTI_SUCCESS) {
            const char *msg = "?";
            cuptiGetResultString(res, &msg);
            snprintf(text, sizeof text, "activity-failed %d %d %s", (int)kinds[i], (int)res, msg);
            info(text);
        }
    }
    atexit(at_exit);
    ns_start = now_ns() - t0;
    return 1;
}

/* For the tests: the calling thread's Python frames as a launch would record them, into
 * frames[] (2 words each), with their CODE records written to the file at path. Called
 * through ctypes, which releases the GIL as PyTorch does around a launch. */
int callpath_cupti_selftest(const char *path, uint64_t *frames) {
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) return -1;
    resolve_python();
    int n = python_frames(frames);
    pthread_mutex_lock(&out_lock);
    flush_locked();
    close(out_fd);
    out_fd = -1;
    pthread_mutex_unlock(&out_lock);
    return n;
}

/* The tests' made-up runs: a file of their own, as a process's start opens it (the
 * CALLPATH_GPU_NATIVE setting read as InitializeInjection reads it), and what exit writes. */
static int fake_open(const char *path) {
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) return -1;
    const char *nat = getenv("CALLPATH_GPU_NATIVE");
    with_native = nat && nat[0] == '1';
    resolve_python();
    resolve_fast_unwind();
    forget_codes();
    forget_interned();
    n_launch = n_calls = ns_calls = n_records = ns_records = 0;
    n_bins = bins_bytes = bins_saved = ns_bins = n_walks_fell_back = 0;
    return 0;
}

/* A made-up runtime call (ENTER, then EXIT) with the driver call it makes inside it. */
static void fake_call(const char *rt, uint32_t rt_cbid, uint32_t corr, const char *dr,
                      uint32_t dr_cbid, uint32_t dr_corr) {
    CUpti_CallbackData cb;
    memset(&cb, 0, sizeof cb);
    cb.callbackSite = CUPTI_API_ENTER;
    cb.functionName = rt;
    cb.correlationId = corr;
    on_api(NULL, CUPTI_CB_DOMAIN_RUNTIME_API, rt_cbid, &cb);
    CUpti_CallbackData inner = cb;
    inner.functionName = dr;
    inner.correlationId = dr_corr;
    on_api(NULL, CUPTI_CB_DOMAIN_DRIVER_API, dr_cbid, &inner);
    inner.callbackSite = CUPTI_API_EXIT;
    on_api(NULL, CUPTI_CB_DOMAIN_DRIVER_API, dr_cbid, &inner);
    cb.callbackSite = CUPTI_API_EXIT;
    on_api(NULL, CUPTI_CB_DOMAIN_RUNTIME_API, rt_cbid, &cb);
}

/* A made-up launch of the kernel named name (the runtime call's correlation id corr, the
 * driver call's corr + 1) and its activity record. */
static void fake_kernel(const char *name, uint32_t corr) {
    fake_call("cudaLaunchKernel_v7000", 211, corr, "cuLaunchKernel", 307, corr + 1);
    CP_KERNEL_T k;
    memset(&k, 0, sizeof k);
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.correlationId = corr;
    k.start = 1000;
    k.end = 4000;
    k.contextId = 1;
    k.streamId = 7;
    k.gridX = 4; k.gridY = 2; k.gridZ = 1;
    k.blockX = 128; k.blockY = 1; k.blockZ = 1;
    k.registersPerThread = 32;
    k.name = name;
    record((CUpti_Activity *)&k);
}

static void fake_close(void) {
    copy_maps();
    cost_note();
    pthread_mutex_lock(&out_lock);
    flush_locked();
    close(out_fd);
    out_fd = -1;
    pthread_mutex_unlock(&out_lock);
}

/* For the tests, without a GPU: an allocation and a free as the library records them, CUPTI's
 * side made up: cudaMalloc (correlation 8, 1 MiB of device memory) with the driver's
 * cuMemAlloc_v2 inside it (not recorded: the runtime call is), then cudaFree (correlation 9),
 * each with its memory record (the free's naming the driver call); then the load map.
 * Written to the file at path. */
int callpath_cupti_fake_alloc(const char *path) {
    if (fake_open(path) < 0) return -1;
    static const struct { const char *rt, *dr; uint32_t corr, op; } calls[] = {
        {"cudaMalloc_v3020", "cuMemAlloc_v2", 8, CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION},
        {"cudaFree_v3020", "cuMemFree_v2", 9, CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE}};
    for (int i = 0; i < 2; i++) {
        fake_call(calls[i].rt, 20 + i, calls[i].corr, calls[i].dr, 300 + i, 100 + calls[i].corr);
        CP_MEMORY_T m;
        memset(&m, 0, sizeof m);
        m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
        m.memoryOperationType = (CUpti_ActivityMemoryOperationType)calls[i].op;
        m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
        /* the allocation's record names the runtime call, the free's the driver call
         * inside it: CUPTI's documentation allows either */
        m.correlationId = i == 0 ? calls[i].corr : 100 + calls[i].corr;
        m.bytes = 1 << 20;
        m.contextId = 1;
        record((CUpti_Activity *)&m);
    }
    fake_close();
    return 0;
}

/* For bench/gpu_launch_cost.py, without a GPU: n made-up launches (each a runtime call with
 * the driver call inside it, as callpath_cupti_fake_launch makes) from under native_depth more
 * C frames, in the calling thread or (in_thread) in a new thread that runs no Python, as
 * PyTorch's autograd engine launches backward kernels; into the file at path, whose cost
 * note gives their time. */
static __attribute__((noinline)) void fake_many(int depth, int n) {
    if (depth > 0) {
        fake_many(depth - 1, n);
        __asm__ volatile("" ::: "memory"); /* no tail call: every level a frame */
        return;
    }
    for (int i = 0; i < n; i++) fake_kernel("_Z4axpyPfPKffi", 5 + 2 * (uint32_t)i);
}

struct fake_job { int depth, n; };

static void *fake_thread(void *arg) {
    struct fake_job *job = arg;
    fake_many(job->depth, job->n);
    return NULL;
}

int callpath_cupti_fake_launches(const char *path, int n, int native_depth, int in_thread) {
    if (fake_open(path) < 0) return -1;
    if (in_thread) {
        struct fake_job job = {native_depth, n};
        pthread_t t;
        if (pthread_create(&t, NULL, fake_thread, &job) != 0) {
            fake_close();
            return -1;
        }
        pthread_join(t, NULL);
    } else {
        fake_many(native_depth, n);
    }
    fake_close();
    return 0;
}

/* For the tests: the calling thread's return addresses by the fast walk and by backtrace(),
 * from the same frame; counts[0], counts[1] how many of each, counts[2] 1 where the walk
 * handed over to backtrace(). The first address differs (the two call sites here); the rest
 * must be the same. */
__attribute__((noinline)) int callpath_cupti_unwind_check(void **fast, void **slow, int max,
                                                          int *counts) {
    counts[0] = native_frames(fast, max);
    counts[2] = walk_fell_back;
    counts[1] = backtrace(slow, max);
    __asm__ volatile("" ::: "memory");
    return fast_unwind_ok;
}

/* For the tests: the rule the walk computes for the frame whose return address is pc
 * (0xffffffff: not covered, 0xfffffffe: the outermost frame), without the table. */
uint32_t callpath_cupti_rule_of(uint64_t pc) {
#if defined(__x86_64__) && defined(__linux__)
    if (fast_unwind_ok < 0) resolve_fast_unwind();
    return find_fde ? compute_rule(pc) : 0xffffffffu;
#else
    (void)pc;
    return 0xffffffffu;
#endif
}

/* For the tests: how many runtime and driver calls the library would call back for, by the
 * names this CUPTI gives (no driver needed), and whether cudaLaunchKernel is among them. */
int callpath_cupti_wanted(const char *name, int runtime) { return wanted(runtime, name); }

/* For the tests, without a GPU: the library's own path from a launch to its records, with
 * CUPTI's side made up. A runtime cudaLaunchKernel enters (correlation 5) with a driver
 * cuLaunchKernel inside it (skipped: the work is the runtime call's), then CUPTI delivers the
 * kernel's activity record; then what the library does at exit (clock readings, the load
 * map). Everything is written to the file at path, as at a real run. */
int callpath_cupti_fake_launch(const char *path) {
    if (fake_open(path) < 0) return -1;
    fake_kernel("_Z4axpyPfPKffi", 5);
    fake_close();
    return 0;
}

/* For the tests, without a GPU: a process that loads a module (CUPTI's module-loaded
 * callback, with the cubin's bytes, into CALLPATH_GPU_DIR/gpubins/ as at a real run), then
 * launches the kernel named kernel from it, as callpath_cupti_fake_launch does. */
int callpath_cupti_fake_module(const char *path, const char *cubin, size_t size,
                               const char *kernel) {
    if (fake_open(path) < 0) return -1;
    CUpti_ModuleResourceData m;
    memset(&m, 0, sizeof m);
    m.moduleId = 3;
    m.pCubin = cubin;
    m.cubinSize = size;
    CUpti_ResourceData rd;
    memset(&rd, 0, sizeof rd);
    rd.resourceDescriptor = &m;
    on_api(NULL, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, &rd);
    fake_kernel(kernel, 5);
    fake_close();
    return 0;
}
