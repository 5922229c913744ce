/* callpath's CUPTI library: GPU operations and the calling contexts that launched them.
 *
 * Loaded into every CUDA process of a measured program through CUDA_INJECTION64_PATH (the
 * driver calls InitializeInjection at cuInit), so C/C++ programs need no change and Python
 * programs (PyTorch, CuPy, JAX) are measured the same way. Two CUPTI interfaces:
 *
 *  - the Callback API: at the ENTER of every runtime/driver call that launches GPU work
 *    (launches, copies, memsets, synchronizations, graph launches) it records the call's
 *    correlation id, the thread, and the calling context: the native return addresses
 *    (glibc's backtrace(), i.e. libgcc's CFI unwinder; mapped to modules after the run) and,
 *    when the thread holds the GIL of a Python interpreter in this process, the Python frames
 *    (code object and line, through the public C API found with dlsym). That is about what
 *    one sample costs the samplers: no symbolisation or interning here.
 *  - the Activity API: kernels, memcpy, memset and synchronization records with their GPU
 *    start/end times, joined to the launch by the correlation id after the run.
 *
 * Everything goes to CALLPATH_GPU_DIR/gpu-<pid>.raw as tagged little-endian records (see
 * convert.py, which turns them into the measurement directory's format). A write failure
 * stops recording, never the program.
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
#include <sys/syscall.h>
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

enum { R_API = 1, R_CODE = 2, R_KERNEL = 3, R_MEMCPY = 4, R_MEMSET = 5, R_SYNC = 6,
       R_MAPS = 7, R_INFO = 8 };
#define MAX_NATIVE 256
#define MAX_PY 256
#define OUT_BUF (1 << 20)

static int out_fd = -1;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static char out_buf[OUT_BUF];
static size_t out_len;
static int with_native = 0;  /* CALLPATH_GPU_NATIVE=1: native frames also under Python ones */
static int with_python = 1;
static unsigned long long n_launch, n_dropped_records;
static CUpti_SubscriberHandle subscriber;
static signed char decision[2][4096]; /* domain (0 driver, 1 runtime) x cbid: 1 yes, -1 no */
static __thread int in_runtime_launch;

static void flush_locked(void) {
    size_t off = 0;
    while (out_fd >= 0 && off < out_len) {
        ssize_t w = write(out_fd, out_buf + off, out_len - off);
        if (w <= 0) { close(out_fd); out_fd = -1; break; }
        off += (size_t)w;
    }
    out_len = 0;
}

/* One record: u32 tag, u32 payload length, then the payload pieces. */
static void emit(uint32_t tag, const void *a, size_t na, const void *b, size_t nb,
                 const void *c, size_t nc) {
    uint32_t head[2] = {tag, (uint32_t)(na + nb + nc)};
    size_t total = sizeof head + na + nb + nc;
    pthread_mutex_lock(&out_lock);
    if (out_fd >= 0) {
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
    pthread_mutex_unlock(&out_lock);
}

/* ---------------------------------------------------------------- Python frames (dlsym) */
typedef void PyObj;
static int (*py_IsInitialized)(void);
static int (*py_GILState_Check)(void);
static void *(*py_ThreadState_Get)(void);
static PyObj *(*py_ThreadState_GetFrame)(void *);
static PyObj *(*py_Frame_GetBack)(PyObj *);
static PyObj *(*py_Frame_GetCode)(PyObj *);
static int (*py_Frame_GetLineNumber)(PyObj *);
static void (*py_DecRef)(PyObj *);
static void (*py_IncRef)(PyObj *);
static PyObj *(*py_Object_GetAttrString)(PyObj *, const char *);
static const char *(*py_Unicode_AsUTF8)(PyObj *);
static long (*py_Long_AsLong)(PyObj *);
static void (*py_Err_Clear)(void);

#define CODE_SLOTS 8192
static PyObj *known_code[CODE_SLOTS]; /* code objects already described (kept alive) */

static void resolve_python(void) {
#define SYM(v, n) *(void **)(&v) = dlsym(RTLD_DEFAULT, n)
    SYM(py_IsInitialized, "Py_IsInitialized");
    SYM(py_GILState_Check, "PyGILState_Check");
    SYM(py_ThreadState_Get, "PyThreadState_Get");
    SYM(py_ThreadState_GetFrame, "PyThreadState_GetFrame");
    SYM(py_Frame_GetBack, "PyFrame_GetBack");
    SYM(py_Frame_GetCode, "PyFrame_GetCode");
    SYM(py_Frame_GetLineNumber, "PyFrame_GetLineNumber");
    SYM(py_DecRef, "Py_DecRef");
    SYM(py_IncRef, "Py_IncRef");
    SYM(py_Object_GetAttrString, "PyObject_GetAttrString");
    SYM(py_Unicode_AsUTF8, "PyUnicode_AsUTF8");
    SYM(py_Long_AsLong, "PyLong_AsLong");
    SYM(py_Err_Clear, "PyErr_Clear");
#undef SYM
}

static int python_ready(void) {
    return py_IsInitialized && py_GILState_Check && py_ThreadState_Get &&
           py_ThreadState_GetFrame && py_Frame_GetBack && py_Frame_GetCode &&
           py_Frame_GetLineNumber && py_DecRef && py_IncRef && py_Object_GetAttrString &&
           py_Unicode_AsUTF8 && py_Long_AsLong && py_Err_Clear && py_IsInitialized() &&
           py_GILState_Check();
}

static const char *attr_text(PyObj *o, const char *name, PyObj **hold) {
    PyObj *v = py_Object_GetAttrString(o, name);
    const char *s = v ? py_Unicode_AsUTF8(v) : NULL;
    if (!s) { py_Err_Clear(); if (v) py_DecRef(v); *hold = NULL; return ""; }
    *hold = v;
    return s;
}

/* Describe a code object once (file, qualified name, first line) in a CODE record; the
 * table keeps a reference so that its address is never reused for another code object. */
static void describe_code(PyObj *code) {
    uintptr_t h = ((uintptr_t)code >> 4) % CODE_SLOTS;
    for (int probe = 0; probe < 16; probe++, h = (h + 1) % CODE_SLOTS) {
        if (known_code[h] == code) return;
        if (known_code[h] == NULL) {
            known_code[h] = code;
            py_IncRef(code);
            break;
        }
    }
    PyObj *hf, *hn;
    const char *file = attr_text(code, "co_filename", &hf);
    const char *name = attr_text(code, "co_qualname", &hn);
    if (!*name) { if (hn) py_DecRef(hn); name = attr_text(code, "co_name", &hn); }
    PyObj *fl = py_Object_GetAttrString(code, "co_firstlineno");
    long first = fl ? py_Long_AsLong(fl) : 0;
    if (!fl) py_Err_Clear(); else py_DecRef(fl);
    uint64_t key = (uint64_t)(uintptr_t)code;
    uint32_t lens[3] = {(uint32_t)first, (uint32_t)strlen(file), (uint32_t)strlen(name)};
    uint8_t head[sizeof key + sizeof lens];
    memcpy(head, &key, sizeof key);
    memcpy(head + sizeof key, lens, sizeof lens);
    emit(R_CODE, head, sizeof head, file, lens[1], name, lens[2]);
    if (hf) py_DecRef(hf);
    if (hn) py_DecRef(hn);
}

/* The thread's Python frames, innermost first: (code key, line) pairs. */
static int python_frames(uint64_t *out) {
    if (!with_python || !python_ready()) return 0;
    int n = 0;
    PyObj *f = py_ThreadState_GetFrame(py_ThreadState_Get());
    while (f && n < MAX_PY) {
        PyObj *code = py_Frame_GetCode(f);
        describe_code(code);
        out[2 * n] = (uint64_t)(uintptr_t)code;
        out[2 * n + 1] = (uint64_t)(uint32_t)py_Frame_GetLineNumber(f);
        py_DecRef(code);
        n++;
        PyObj *back = py_Frame_GetBack(f);
        py_DecRef(f);
        f = back;
    }
    if (f) py_DecRef(f);
    return n;
}

/* ---------------------------------------------------------------------------- callbacks */
static int wanted(int runtime, const char *fn) {
    if (!fn) return 0;
    static const char *rt[] = {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
                               "cudaStreamSynchronize", "cudaDeviceSynchronize",
                               "cudaEventSynchronize", "cudaStreamWaitEvent",
                               "cudaThreadSynchronize", NULL};
    static const char *dr[] = {"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch",
                               "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
                               "cuStreamWaitEvent", NULL};
    for (const char **p = runtime ? rt : dr; *p; p++)
        if (strncmp(fn, *p, strlen(*p)) == 0) return 1;
    return 0;
}

static void CUPTIAPI on_api(void *ud, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                            const void *data) {
    (void)ud;
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    int runtime = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
    signed char *d = cbid < 4096 ? &decision[runtime][cbid] : NULL;
    int yes = d && *d ? *d > 0 : wanted(runtime, cb->functionName);
    if (d && !*d) *d = yes ? 1 : -1;
    if (!yes) return;
    if (cb->callbackSite == CUPTI_API_EXIT) {
        if (runtime) in_runtime_launch = 0;
        return;
    }
    if (runtime) in_runtime_launch = 1;
    else if (in_runtime_launch) return; /* the driver call inside a recorded runtime call */
    uint64_t py[2 * MAX_PY];
    int npy = python_frames(py);
    void *pcs[MAX_NATIVE];
    int nnat = (with_native || npy == 0) ? backtrace(pcs, MAX_NATIVE) : 0;
    uint64_t head[4];
    head[0] = cb->correlationId;
    head[1] = (uint64_t)syscall(SYS_gettid) | ((uint64_t)(runtime ? 2 : 1) << 32) |
              ((uint64_t)(cbid & 0xffff) << 40);
    head[2] = 0;
    cuptiGetTimestamp(&head[2]);
    head[3] = (uint64_t)(uint32_t)nnat | ((uint64_t)(uint32_t)npy << 32);
    emit(R_API, head, sizeof head, pcs, sizeof(void *) * (size_t)nnat, py,
         sizeof(uint64_t) * 2 * (size_t)npy);
    __atomic_add_fetch(&n_launch, 1, __ATOMIC_RELAXED);
}

/* ----------------------------------------------------------------------- activity records */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 8 << 20;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void record(CUpti_Activity *r) {
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
        const char *name = k->name ? k->name : "";
        emit(R_KERNEL, v, 10 * sizeof(uint64_t), name, strlen(name), NULL, 0);
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
    CUpti_Activity *r = NULL;
    while (valid && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) record(r);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        n_dropped_records += dropped;
    free(buffer);
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

static void at_exit(void) {
    if (getpid() != owner) return; /* a forked child without its own CUDA */
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    char text[160];
    snprintf(text, sizeof text, "end launches=%llu dropped=%llu", n_launch, n_dropped_records);
    info(text);
    copy_maps();
    pthread_mutex_lock(&out_lock);
    flush_locked();
    if (out_fd >= 0) close(out_fd);
    out_fd = -1;
    pthread_mutex_unlock(&out_lock);
}

int InitializeInjection(void) {
    const char *dir = getenv("CALLPATH_GPU_DIR");
    if (!dir || out_fd >= 0) return 1;
    owner = getpid();
    char path[4096];
    snprintf(path, sizeof path, "%s/gpu-%d.raw", dir, (int)owner);
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) return 1;
    const char *nat = getenv("CALLPATH_GPU_NATIVE");
    with_native = nat && nat[0] == '1';
    resolve_python();
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
    cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    static const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION};
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
    return 1;
}
