/* The Python sampler's stack walk in C: an optional accelerator of sampler.py.
 *
 * Why: the sampler's signal handler runs a thousand times a second inside the measured program,
 * and its cost is dominated by walking the frames: in Python bytecode, with the caches that the
 * program evicted between two samples, about 0.2 us per frame, so 20 us per sample for the 100
 * frames of a program built on a framework. This module does the same walk and gives the same
 * answer, with the GIL held, in the handler's thread (the handler is an ordinary Python signal
 * handler, so nothing here runs in signal context). On a miss it returns None, and the slow
 * path (intern_stack below, or walk.py's where this module is not built) interns what is new
 * into the same tables, with the same answers.
 *
 * stack_of(frame, locs_of, stacks[, cache]) -> stacks[stack_key(loc, loc, ...)] or None
 *   locs_of: {id(code): {f_lasti: location}}; the key lists the frames' locations leaf first,
 *   following f_back, as walk.py's Python loop does.
 *
 * With a Cache (one per thread), the walk remembers the previous sample's frames as
 * (code, f_lasti) pairs and their locations: the frames nearer the root that are unchanged,
 * usually all but a few, are compared in a contiguous array instead of looked up in two
 * dictionaries each, and a stack equal to the previous one is answered without building its
 * key. Code objects are compared by address, which is safe because the sampler keeps every
 * code object it has interned alive for as long as the tables it holds (the cache holds those
 * tables, and starts over when given others, as after a fork).
 *
 * The walks read CPython's frame records on 3.11 to 3.13 (GIL builds; see frame_sites) and use
 * the public C API elsewhere (PyFrame_GetCode, PyFrame_GetLasti, PyFrame_GetBack).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000
#error "callpath's stack walk needs CPython 3.11 or newer"
#endif

/* The walks read CPython's frame records (3.11 to 3.13, see frame_sites); other_stacks() too
 * (3.12 and 3.13 only, see there). Elsewhere: frame objects. */
#if PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define FRAME_RECORDS 1
#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#if PY_VERSION_HEX >= 0x030D0000
#define RECORD_CODE(f) _PyFrame_GetCode(f)
#else
#define RECORD_CODE(f) ((f)->f_code)
#endif
#if PY_VERSION_HEX >= 0x030C0000
#define RECORD_SKIPPED(f) ((f)->owner == FRAME_OWNED_BY_CSTACK || _PyFrame_IsIncomplete(f))
#else
#define RECORD_SKIPPED(f) _PyFrame_IsIncomplete(f)
#endif
/* a record's offset as PyFrame_GetLasti gives it: bytes, -1 before the first instruction */
static inline int
record_lasti(_PyInterpreterFrame *f)
{
    int lasti = _PyInterpreterFrame_LASTI(f);
    return lasti < 0 ? -1 : lasti * (int)sizeof(_Py_CODEUNIT);
}
#else
#define FRAME_RECORDS 0
#endif
#define OTHER_STACKS (FRAME_RECORDS && PY_VERSION_HEX >= 0x030C0000)

#define SMALL 128

typedef struct {
    void *code; /* identity only */
    int lasti;
} Site;

typedef struct {
    PyObject_HEAD
    PyObject *locs_of;  /* the tables the remembered stack was found in (strong) */
    PyObject *stacks;   /* (strong) */
    Py_ssize_t n, cap;
    Site *sites;        /* leaf first */
    PyObject **locs;    /* strong references, one per site */
    PyObject *value;    /* stacks[key] of the remembered stack (strong) */
} Cache;

static void
cache_clear_stack(Cache *c)
{
    for (Py_ssize_t i = 0; i < c->n; i++)
        Py_CLEAR(c->locs[i]);
    c->n = 0;
    Py_CLEAR(c->value);
}

static void
cache_dealloc(Cache *c)
{
    cache_clear_stack(c);
    Py_CLEAR(c->locs_of);
    Py_CLEAR(c->stacks);
    PyMem_Free(c->sites);
    PyMem_Free(c->locs);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_callpath_walk.Cache",
    .tp_basicsize = sizeof(Cache),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_doc = "The previous stack walked for one thread (see the module's documentation).",
};

/* Grow two parallel arrays to hold at least `need` entries. */
static int
grow(Site **sites, PyObject ***locs, Py_ssize_t *cap, Py_ssize_t need, int owned)
{
    Py_ssize_t cap2 = *cap ? *cap : SMALL;
    while (cap2 < need)
        cap2 *= 2;
    Site *s = PyMem_Malloc(sizeof(Site) * (size_t)cap2);
    PyObject **l = PyMem_Malloc(sizeof(PyObject *) * (size_t)cap2);
    if (s == NULL || l == NULL) {
        PyMem_Free(s);
        PyMem_Free(l);
        PyErr_NoMemory();
        return -1;
    }
    if (*cap) {
        memcpy(s, *sites, sizeof(Site) * (size_t)*cap);
        memcpy(l, *locs, sizeof(PyObject *) * (size_t)*cap);
    }
    if (owned) {
        PyMem_Free(*sites);
        PyMem_Free(*locs);
    }
    *sites = s;
    *locs = l;
    *cap = cap2;
    return 0;
}

/* The key of a stack in the sampler's `stacks`: its locations, leaf first, as 32-bit integers
 * in a bytes object (walk.stack_key). Not a tuple: bytes are no container, so the garbage
 * collector neither counts them nor visits them, and at a program's start most samples make
 * one. NULL with an exception set on an error. */
static PyObject *
stack_key(PyObject *const *locs, Py_ssize_t n)
{
    PyObject *key = PyBytes_FromStringAndSize(NULL, n * 4);
    if (key == NULL)
        return NULL;
    int32_t *out = (int32_t *)PyBytes_AS_STRING(key);
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(locs[i]);
        if (v < 0 || v > INT32_MAX) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "a location outside 0..2**31-1");
            Py_DECREF(key);
            return NULL;
        }
        out[i] = (int32_t)v;
    }
    return key;
}

/* (code, f_lasti) of `frame` and of its callers, leaf first, as PyFrame_GetCode,
 * PyFrame_GetLasti and PyFrame_GetBack give them, into *sites (and *locs grown alike): the
 * count, or -1 with an exception set. The code objects are borrowed from the frames.
 *
 * From the frame records where this interpreter's layout is known: PyFrame_GetBack creates a
 * frame object for every caller that has none, and at a program's start (imports, where the
 * stack changes between any two samples) those were most of the sampler's allocations: they
 * brought the garbage collector's young collections forward, and with them a full one (~70 ms
 * in `import torch`). A record whose frame object has its own f_back (a finished frame's, as
 * PyFrame_GetBack would follow) makes the walk use frame objects instead. */
static Py_ssize_t
frame_sites(PyFrameObject *frame, Site **sites, PyObject ***locs, Py_ssize_t *cap,
            int *owned)
{
    Py_ssize_t n = 0;
#if FRAME_RECORDS
    _PyInterpreterFrame *f = frame->f_frame;
    if (frame->f_back == NULL && f != NULL && f->owner != FRAME_OWNED_BY_FRAME_OBJECT) {
        for (; f != NULL; f = f->previous) {
            if (n > 0 && RECORD_SKIPPED(f))
                continue;
            if (n == *cap) {
                if (grow(sites, locs, cap, n + 1, *owned) < 0)
                    return -1;
                *owned = 1;
            }
            (*sites)[n].code = RECORD_CODE(f);
            (*sites)[n].lasti = record_lasti(f);
            n++;
            if (f->frame_obj != NULL && f->frame_obj->f_back != NULL)
                goto objects;
        }
        return n;
    }
objects:
    n = 0;
#endif
    PyFrameObject *g = (PyFrameObject *)Py_NewRef(frame);
    while (g != NULL) {
        if (n == *cap) {
            if (grow(sites, locs, cap, n + 1, *owned) < 0) {
                Py_DECREF(g);
                return -1;
            }
            *owned = 1;
        }
        PyCodeObject *co = PyFrame_GetCode(g);
        (*sites)[n].code = co;
        Py_DECREF(co); /* alive while its frame is; the pointer is only compared */
        (*sites)[n].lasti = PyFrame_GetLasti(g);
        n++;
        PyFrameObject *back = PyFrame_GetBack(g);
        Py_DECREF(g);
        g = back;
    }
    return n;
}

/* The walk: stacks[locations of the frames, leaf first] (a new reference), Py_None (new
 * reference) on a miss, NULL with an exception set on an error. The caller has checked the
 * types; `cache` may be NULL. */
static PyObject *
walk(PyObject *frame, PyObject *locs_of, PyObject *stacks, Cache *cache)
{
    if (cache != NULL && (cache->locs_of != locs_of || cache->stacks != stacks)) {
        cache_clear_stack(cache);
        Py_INCREF(locs_of);
        Py_XSETREF(cache->locs_of, locs_of);
        Py_INCREF(stacks);
        Py_XSETREF(cache->stacks, stacks);
    }

    /* 1. the frames' (code, f_lasti), leaf first */
    Site small_sites[SMALL];
    PyObject *small_locs[SMALL];
    Site *sites = small_sites;
    PyObject **locs = small_locs; /* borrowed from the tables (which the caller holds) */
    Py_ssize_t cap = SMALL;
    int owned = 0;
    PyObject *result = NULL;
    Py_ssize_t n = frame_sites((PyFrameObject *)frame, &sites, &locs, &cap, &owned);
    if (n < 0)
        goto done;

    /* 2. the frames nearer the root that equal the previous stack's take its locations */
    Py_ssize_t same = 0;
    if (cache != NULL) {
        Py_ssize_t m = cache->n < n ? cache->n : n;
        while (same < m) {
            Site *a = &sites[n - 1 - same], *b = &cache->sites[cache->n - 1 - same];
            if (a->code != b->code || a->lasti != b->lasti)
                break;
            locs[n - 1 - same] = cache->locs[cache->n - 1 - same];
            same++;
        }
    }

    /* 3. the others through the tables */
    for (Py_ssize_t i = 0; i < n - same; i++) {
        PyObject *cid = PyLong_FromVoidPtr(sites[i].code);
        if (cid == NULL)
            goto done;
        PyObject *table = PyDict_GetItemWithError(locs_of, cid);
        Py_DECREF(cid);
        if (table == NULL || !PyDict_CheckExact(table))
            goto miss;
        PyObject *lasti = PyLong_FromLong(sites[i].lasti);
        if (lasti == NULL)
            goto done;
        PyObject *loc = PyDict_GetItemWithError(table, lasti);
        Py_DECREF(lasti);
        if (loc == NULL)
            goto miss;
        locs[i] = loc;
    }

    /* 4. the same locations as the previous stack: the same key, the same value */
    if (cache != NULL && cache->value != NULL && cache->n == n) {
        Py_ssize_t i = 0;
        while (i < n - same && locs[i] == cache->locs[i])
            i++;
        if (i == n - same) {
            Py_INCREF(cache->value);
            result = cache->value;
            goto remember;
        }
    }

    /* 5. the key */
    {
        PyObject *key = stack_key(locs, n);
        if (key == NULL)
            goto done;
        PyObject *v = PyDict_GetItemWithError(stacks, key);
        Py_DECREF(key);
        if (v == NULL)
            goto miss;
        Py_INCREF(v);
        result = v;
    }

remember:
    if (cache != NULL && result != NULL) {
        /* new references first: some locations may come from the cache itself */
        for (Py_ssize_t i = 0; i < n; i++)
            Py_INCREF(locs[i]);
        PyObject *value = result;
        Py_INCREF(value);
        cache_clear_stack(cache);
        if (n > cache->cap && grow(&cache->sites, &cache->locs, &cache->cap, n, 1) < 0) {
            for (Py_ssize_t i = 0; i < n; i++)
                Py_DECREF(locs[i]);
            Py_DECREF(value);
            Py_CLEAR(result);
            goto done;
        }
        memcpy(cache->sites, sites, sizeof(Site) * (size_t)n);
        memcpy(cache->locs, locs, sizeof(PyObject *) * (size_t)n);
        cache->n = n;
        cache->value = value;
    }
    goto done;
miss:
    if (!PyErr_Occurred()) {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    if (owned) {
        PyMem_Free(sites);
        PyMem_Free(locs);
    }
    return result;
}

static PyObject *
stack_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stack_of(frame, locs_of, stacks[, cache])");
        return NULL;
    }
    PyObject *frame = args[0], *locs_of = args[1], *stacks = args[2];
    if (!PyFrame_Check(frame) || !PyDict_CheckExact(locs_of) || !PyDict_CheckExact(stacks)) {
        PyErr_SetString(PyExc_TypeError, "stack_of(frame, dict, dict[, Cache])");
        return NULL;
    }
    Cache *cache = NULL;
    if (nargs == 4 && args[3] != Py_None) {
        if (!Py_IS_TYPE(args[3], &CacheType)) {
            PyErr_SetString(PyExc_TypeError, "stack_of: the cache must be a Cache");
            return NULL;
        }
        cache = (Cache *)args[3];
    }
    return walk(frame, locs_of, stacks, cache);
}

/* ---- the slow path: interning what is new ----------------------------------------------------
 *
 * intern_stack(frame, tables) -> stack << 1 | NATIVE, or -1 for a stack whose leaf is the
 * sampler's own code: walk.py's Walker._stack_of_sites in C, on the same tables, with the same
 * answer. tables = (locs_of, code_index, codes, locs, loc_ids, stacks, line_stacks, stack_paths,
 * own_files, call_flags, loc, cache_max):
 *   locs_of     {id(code): {f_lasti: location}}
 *   code_index  {id(code): code index}; codes [code] keeps each interned code object alive
 *   locs        [code index, line, NATIVE] per location, flat
 *   loc_ids     {(code index << 32 | line) << 1 | NATIVE: location}
 *   stacks      {stack_key(locations): stack << 1 | NATIVE}, cleared at cache_max entries
 *   line_stacks {(code index, line) per frame, leaf first, as 32-bit integers in bytes: stack};
 *               stack_paths [that key] by stack
 *   own_files   the sampler's source files
 *   call_flags  256 bytes, nonzero for the opcodes that call
 *   loc         loc(code, f_lasti) -> location: Python's rule, for offsets without a line
 *
 * Why: at a program's start (imports) nearly every sample's stack is new (~900 of 1,100 samples
 * of `import torch`), so this path, not the walk, is the sampler's cost there; in Python it
 * also allocated enough containers to bring the garbage collector's young and full
 * collections forward. Here it allocates only what it keeps: a table per new code object (and
 * the two keys of a new stack, which are no containers).
 *
 * A line comes from PyCode_Addr2Line, which reads the same location table as co_lines() (what
 * walk.line_table reads); an offset in a range without a line (a loop's back edge on 3.11, a
 * module's RESUME) is left to `loc`, which applies walk.line_table's rules. */

enum { T_LOCS_OF, T_CODE_INDEX, T_CODES, T_LOCS, T_LOC_IDS, T_STACKS, T_LINE_STACKS,
       T_STACK_PATHS, T_OWN_FILES, T_CALL_FLAGS, T_LOC, T_CACHE_MAX, T_N };

/* the location of (code, lasti), a new reference; ci is the code's index */
static PyObject *
new_loc(PyObject *const *t, PyCodeObject *co, int lasti, long ci)
{
    int line, native = 0;
    if (lasti < 0)
        line = co->co_firstlineno;
    else {
        line = PyCode_Addr2Line(co, lasti);
        if (line <= 0 || ci >= (1L << 30))
            return PyObject_CallFunction(t[T_LOC], "Oi", (PyObject *)co, lasti);
        PyObject *ops = PyCode_GetCode(co);
        if (ops == NULL)
            return NULL;
        if (lasti < PyBytes_GET_SIZE(ops)) {
            unsigned char op = (unsigned char)PyBytes_AS_STRING(ops)[lasti];
            native = PyBytes_AS_STRING(t[T_CALL_FLAGS])[op] != 0;
        }
        Py_DECREF(ops);
    }
    unsigned long long k = ((unsigned long long)ci << 32 | (unsigned int)line) << 1 | native;
    PyObject *key = PyLong_FromUnsignedLongLong(k);
    if (key == NULL)
        return NULL;
    PyObject *lid = PyDict_GetItemWithError(t[T_LOC_IDS], key);
    if (lid != NULL) {
        Py_DECREF(key);
        return Py_NewRef(lid);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *locs = t[T_LOCS];
    lid = PyLong_FromSsize_t(PyList_GET_SIZE(locs) / 3);
    PyObject *a = PyLong_FromLong(ci), *b = PyLong_FromLong(line), *c = PyLong_FromLong(native);
    int bad = lid == NULL || a == NULL || b == NULL || c == NULL
              || PyDict_SetItem(t[T_LOC_IDS], key, lid) < 0 || PyList_Append(locs, a) < 0
              || PyList_Append(locs, b) < 0 || PyList_Append(locs, c) < 0;
    Py_DECREF(key);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    if (bad) {
        Py_XDECREF(lid);
        return NULL;
    }
    return lid;
}

/* the location table of a code object (borrowed from locs_of), interning the code if new;
 * *ci gets its index */
static PyObject *
code_table(PyObject *const *t, PyObject *co, long *ci)
{
    PyObject *cid = PyLong_FromVoidPtr(co);
    if (cid == NULL)
        return NULL;
    PyObject *table = PyDict_GetItemWithError(t[T_LOCS_OF], cid);
    PyObject *index = table != NULL ? PyDict_GetItemWithError(t[T_CODE_INDEX], cid) : NULL;
    if (index != NULL) {
        Py_DECREF(cid);
        *ci = PyLong_AsLong(index);
        return *ci < 0 && PyErr_Occurred() ? NULL : table;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(cid);
        return NULL;
    }
    *ci = (long)PyList_GET_SIZE(t[T_CODES]);
    PyObject *idx = PyLong_FromLong(*ci);
    table = PyDict_New();
    int bad = idx == NULL || table == NULL || PyDict_SetItem(t[T_CODE_INDEX], cid, idx) < 0
              || PyList_Append(t[T_CODES], co) < 0 || PyDict_SetItem(t[T_LOCS_OF], cid, table) < 0;
    Py_DECREF(cid);
    Py_XDECREF(idx);
    Py_XDECREF(table); /* locs_of holds it */
    return bad ? NULL : table;
}

/* line_at(code, offset) -> PyCode_Addr2Line(code, offset): the line new_loc takes, exposed so
 * that the tests hold it to co_lines() for every offset of many code objects */
static PyObject *
line_at(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyCode_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "line_at(code, offset)");
        return NULL;
    }
    long offset = PyLong_AsLong(args[1]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    if (offset < INT_MIN || offset > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "line_at: the offset is out of range");
        return NULL;
    }
    return PyLong_FromLong(PyCode_Addr2Line((PyCodeObject *)args[0], (int)offset));
}

static PyObject *
intern_stack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyFrame_Check(args[0]) || !PyTuple_CheckExact(args[1])
        || PyTuple_GET_SIZE(args[1]) != T_N) {
        PyErr_SetString(PyExc_TypeError, "intern_stack(frame, tables)");
        return NULL;
    }
    PyObject *const *t = &PyTuple_GET_ITEM(args[1], 0);
    if (!PyDict_CheckExact(t[T_LOCS_OF]) || !PyDict_CheckExact(t[T_CODE_INDEX])
        || !PyList_CheckExact(t[T_CODES]) || !PyList_CheckExact(t[T_LOCS])
        || !PyDict_CheckExact(t[T_LOC_IDS]) || !PyDict_CheckExact(t[T_STACKS])
        || !PyDict_CheckExact(t[T_LINE_STACKS]) || !PyList_CheckExact(t[T_STACK_PATHS])
        || !PyAnySet_Check(t[T_OWN_FILES]) || !PyBytes_CheckExact(t[T_CALL_FLAGS])
        || PyBytes_GET_SIZE(t[T_CALL_FLAGS]) != 256 || !PyCallable_Check(t[T_LOC])
        || !PyLong_CheckExact(t[T_CACHE_MAX])) {
        PyErr_SetString(PyExc_TypeError, "intern_stack: tables of the wrong types");
        return NULL;
    }
    Py_ssize_t cache_max = PyLong_AsSsize_t(t[T_CACHE_MAX]);
    if (cache_max < 0 && PyErr_Occurred())
        return NULL;

    /* the frames' code objects (strong from here on: `loc` runs Python code), offsets and
     * locations (new references), leaf first */
    Site small_sites[SMALL];
    PyObject *small_locs[SMALL];
    Site *sites = small_sites;
    PyObject **locs = small_locs;
    Py_ssize_t cap = SMALL;
    int owned = 0;
    PyObject *result = NULL, *tkey = NULL, *lkey = NULL;
    Py_ssize_t n = frame_sites((PyFrameObject *)args[0], &sites, &locs, &cap, &owned);
    if (n < 0) {
        n = 0;
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF((PyObject *)sites[i].code);
        locs[i] = NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long ci;
        PyObject *table = code_table(t, (PyObject *)sites[i].code, &ci);
        if (table == NULL)
            goto done;
        PyObject *key = PyLong_FromLong(sites[i].lasti);
        PyObject *lid = key != NULL ? PyDict_GetItemWithError(table, key) : NULL;
        if (lid != NULL)
            Py_INCREF(lid);
        else if (key != NULL && !PyErr_Occurred()) {
            Py_INCREF(table); /* `loc` may run any Python code */
            lid = new_loc(t, (PyCodeObject *)sites[i].code, sites[i].lasti, ci);
            if (lid != NULL && PyDict_SetItem(table, key, lid) < 0)
                Py_CLEAR(lid);
            Py_DECREF(table);
        }
        Py_XDECREF(key);
        if (lid == NULL)
            goto done;
        locs[i] = lid;
    }

    /* the stack: known under these locations, or new */
    tkey = stack_key(locs, n);
    if (tkey == NULL)
        goto done;
    result = PyDict_GetItemWithError(t[T_STACKS], tkey);
    if (result != NULL) {
        Py_INCREF(result);
        goto done;
    }
    if (PyErr_Occurred())
        goto done;
    int own = n > 0 ? PySet_Contains(t[T_OWN_FILES],
                                      ((PyCodeObject *)sites[0].code)->co_filename)
                    : 0;
    if (own < 0)
        goto done;
    if (own)
        result = PyLong_FromLong(-1);
    else {
        PyObject *all = t[T_LOCS];
        lkey = PyBytes_FromStringAndSize(NULL, n * 8);
        if (lkey == NULL)
            goto done;
        int32_t *pairs = (int32_t *)PyBytes_AS_STRING(lkey);
        long native = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t lid = PyLong_AsSsize_t(locs[i]);
            if (lid < 0 || 3 * lid + 2 >= PyList_GET_SIZE(all)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_IndexError, "intern_stack: a location out of range");
                goto done;
            }
            long ci = PyLong_AsLong(PyList_GET_ITEM(all, 3 * lid));
            long line = PyLong_AsLong(PyList_GET_ITEM(all, 3 * lid + 1));
            if ((ci == -1 || line == -1) && PyErr_Occurred())
                goto done;
            pairs[2 * i] = (int32_t)ci;
            pairs[2 * i + 1] = (int32_t)line;
            if (i == 0)
                native = PyLong_AsLong(PyList_GET_ITEM(all, 3 * lid + 2));
        }
        PyObject *sid = PyDict_GetItemWithError(t[T_LINE_STACKS], lkey);
        if (sid != NULL)
            Py_INCREF(sid);
        else if (PyErr_Occurred())
            goto done;
        else {
            sid = PyLong_FromSsize_t(PyList_GET_SIZE(t[T_STACK_PATHS]));
            if (sid == NULL || PyDict_SetItem(t[T_LINE_STACKS], lkey, sid) < 0
                || PyList_Append(t[T_STACK_PATHS], lkey) < 0) {
                Py_XDECREF(sid);
                goto done;
            }
        }
        long long v = PyLong_AsLongLong(sid);
        Py_DECREF(sid);
        if (v < 0)
            goto done;
        result = PyLong_FromLongLong(v << 1 | native);
    }
    if (result == NULL)
        goto done;
    if (PyDict_GET_SIZE(t[T_STACKS]) >= cache_max)
        PyDict_Clear(t[T_STACKS]); /* in place: the handler holds this very dict */
    if (PyDict_SetItem(t[T_STACKS], tkey, result) < 0)
        Py_CLEAR(result);
done:
    Py_XDECREF(tkey);
    Py_XDECREF(lkey);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF((PyObject *)sites[i].code);
        Py_XDECREF(locs[i]);
    }
    if (owned) {
        PyMem_Free(sites);
        PyMem_Free(locs);
    }
    return result;
}

/* ---- the signal handler ---------------------------------------------------------------------
 *
 * Handler(sampler, locs_of, stacks, cache, t, cpu, last_flush, trace, flush_ns, trace_flush,
 *         idle_share, count) is the main thread's SIGPROF handler in C: what walk.py's
 * make_handler() closure does, without running a bytecode on the fast path. Why: at 1 kHz the
 * handler's cost is mostly cache misses, in the handler and in the program after it, and a
 * Python function touches far more memory (its frame, its bytecode, boxed integers, a dict
 * update with new int objects for every sum) than these few C structures. It is still an
 * ordinary Python signal handler, called by the interpreter between bytecodes with the GIL
 * held; nothing runs in signal context.
 *
 * Per sample: the two clocks, the walk above, and one update of an open-addressing table of
 * (key, samples, CPU ns, wall ns) that drain() merges into the thread's aggregate dict when
 * the sampler flushes. Anything new (a miss of the walk), other threads (when _thread._count()
 * says there are some) and the periodic flush call back into the sampler's Python methods.
 */

#include <time.h>

typedef struct {
    long long key, n, cpu, wall;
} Agg;

typedef struct {
    PyObject_HEAD
    PyObject *sampler;
    PyObject *locs_of, *stacks;
    PyObject *cache; /* a Cache or None */
    PyObject *count; /* _thread._count */
    int trace, share, busy;
    long long prev_t, prev_cpu, last_flush, flush_ns, trace_flush;
    Agg *agg;
    Py_ssize_t agg_cap, agg_used;
    long long *tr;
    Py_ssize_t tr_n, tr_cap;
} Handler;

static PyObject *s_busy, *s_dropped, *s_new_stack, *s_others, *s_flush, *s_error;

static long long
clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int
agg_grow(Handler *h)
{
    Py_ssize_t cap = h->agg_cap ? h->agg_cap * 2 : 256;
    Agg *a = PyMem_Malloc(sizeof(Agg) * (size_t)cap);
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++)
        a[i].key = -1;
    for (Py_ssize_t j = 0; j < h->agg_cap; j++) {
        if (h->agg[j].key < 0)
            continue;
        size_t i = (size_t)(((unsigned long long)h->agg[j].key * 0x9E3779B97F4A7C15ULL) >> 32)
                   & (size_t)(cap - 1);
        while (a[i].key >= 0)
            i = (i + 1) & (size_t)(cap - 1);
        a[i] = h->agg[j];
    }
    PyMem_Free(h->agg);
    h->agg = a;
    h->agg_cap = cap;
    return 0;
}

static int
agg_add(Handler *h, long long key, long long cpu, long long wall)
{
    if (h->agg_used * 2 >= h->agg_cap && agg_grow(h) < 0)
        return -1;
    size_t mask = (size_t)(h->agg_cap - 1);
    size_t i = (size_t)(((unsigned long long)key * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
    while (h->agg[i].key >= 0 && h->agg[i].key != key)
        i = (i + 1) & mask;
    Agg *r = &h->agg[i];
    if (r->key < 0) {
        r->key = key;
        r->n = r->cpu = r->wall = 0;
        h->agg_used++;
    }
    r->n++;
    r->cpu += cpu;
    r->wall += wall;
    return 0;
}

static int
trace_add(Handler *h, long long t, long long k)
{
    if (h->tr_n + 2 > h->tr_cap) {
        Py_ssize_t cap = h->tr_cap ? h->tr_cap * 2 : 4096;
        long long *tr = PyMem_Realloc(h->tr, sizeof(long long) * (size_t)cap);
        if (tr == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->tr = tr;
        h->tr_cap = cap;
    }
    h->tr[h->tr_n++] = t;
    h->tr[h->tr_n++] = k;
    return 0;
}

/* sampler.<name>(arg) with this handler marked busy (a signal meanwhile is dropped) */
static PyObject *
callout(Handler *h, PyObject *name, PyObject *arg)
{
    h->busy = 1;
    PyObject *r = arg != NULL ? PyObject_CallMethodOneArg(h->sampler, name, arg)
                              : PyObject_CallMethodNoArgs(h->sampler, name);
    h->busy = 0;
    return r;
}

static void
dropped(Handler *h)
{
    PyObject *d = PyObject_GetAttr(h->sampler, s_dropped);
    long long n = d != NULL ? PyLong_AsLongLong(d) : -1;
    Py_XDECREF(d);
    PyObject *d1 = n >= 0 ? PyLong_FromLongLong(n + 1) : NULL;
    if (d1 == NULL || PyObject_SetAttr(h->sampler, s_dropped, d1) < 0)
        PyErr_Clear();
    Py_XDECREF(d1);
}

static PyObject *
handler_call(Handler *h, PyObject *args, PyObject *kwds)
{
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 2 || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Handler(signum, frame)");
        return NULL;
    }
    PyObject *frame = PyTuple_GET_ITEM(args, 1);
    int busy = h->busy;
    if (!busy) {
        PyObject *b = PyObject_GetAttr(h->sampler, s_busy);
        busy = b == NULL ? 1 : PyObject_IsTrue(b);
        Py_XDECREF(b);
        if (busy < 0) {
            PyErr_Clear();
            busy = 1;
        }
    }
    if (busy || !PyFrame_Check(frame)) {
        dropped(h);
        Py_RETURN_NONE;
    }
    h->busy = 1;
    long long t = clock_ns(CLOCK_MONOTONIC);
    long long c = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    PyObject *v = walk(frame, h->locs_of, h->stacks,
                       h->cache == Py_None ? NULL : (Cache *)h->cache);
    h->busy = 0;
    if (v == Py_None) {
        Py_DECREF(v);
        v = callout(h, s_new_stack, frame);
    }
    if (v == NULL)
        goto error;
    long long sv = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (sv == -1 && PyErr_Occurred())
        goto error;
    if (sv < 0) /* the signal hit the sampler's own code */
        Py_RETURN_NONE;
    long long dc = c - h->prev_cpu, wall = t - h->prev_t;
    long long k = sv << 1 | (dc * h->share < wall);
    if (agg_add(h, k, dc, wall) < 0 || (h->trace && trace_add(h, t, k) < 0))
        goto error;
    h->prev_t = t;
    PyObject *n = PyObject_CallNoArgs(h->count);
    if (n == NULL)
        goto error;
    int others = PyObject_IsTrue(n);
    Py_DECREF(n);
    if (others) {
        PyObject *tt = PyLong_FromLongLong(t);
        PyObject *r = tt != NULL ? callout(h, s_others, tt) : NULL;
        Py_XDECREF(tt);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    if (t - h->last_flush >= h->flush_ns || (h->trace && h->tr_n >= h->trace_flush)) {
        h->last_flush = t;
        PyObject *r = callout(h, s_flush, NULL);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    /* the handler's own CPU time is the profiler's: taken as its wall-clock time (reading a
     * CPU clock costs five times more) */
    h->prev_cpu = c + clock_ns(CLOCK_MONOTONIC) - t;
    Py_RETURN_NONE;
error:
    /* The sampler's own errors are never raised into the program (it counts them and gives
     * up after a few); the program's are: a signal handler of the program that ran inside
     * this one (Ctrl-C's KeyboardInterrupt) must reach it. The sampler's _handler_error(exc)
     * tells which. */
    {
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
#else
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (exc != NULL && tb != NULL)
            PyException_SetTraceback(exc, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
#endif
        PyObject *r = exc != NULL ? callout(h, s_error, exc) : NULL;
        int program = r != NULL && PyObject_IsTrue(r) == 1;
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        if (program) {
#if PY_VERSION_HEX >= 0x030C0000
            PyErr_SetRaisedException(exc);
#else
            PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc,
                          PyException_GetTraceback(exc));
#endif
            return NULL;
        }
        Py_XDECREF(exc);
    }
    Py_RETURN_NONE;
}

/* drain(agg, trace): add the samples aggregated since the last drain to `agg` ({key:
 * [samples, cpu ns, wall ns]}, the thread's dict that the flush reads) and the trace's (time,
 * key) pairs to `trace` (an array('q'), or None), and start over. */
static PyObject *
handler_drain(Handler *h, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "drain(dict, array or None)");
        return NULL;
    }
    PyObject *agg = args[0], *trace = args[1];
    for (Py_ssize_t j = 0; j < h->agg_cap; j++) {
        Agg *a = &h->agg[j];
        if (a->key < 0)
            continue;
        PyObject *key = PyLong_FromLongLong(a->key);
        if (key == NULL)
            return NULL;
        PyObject *row = PyDict_GetItemWithError(agg, key);
        if (row == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
        long long add[3] = {a->n, a->cpu, a->wall};
        if (row != NULL && PyList_Check(row) && PyList_GET_SIZE(row) == 3) {
            for (int i = 0; i < 3; i++) {
                PyObject *x = PyLong_FromLongLong(add[i]);
                PyObject *s = x != NULL ? PyNumber_Add(PyList_GET_ITEM(row, i), x) : NULL;
                Py_XDECREF(x);
                if (s == NULL) {
                    Py_DECREF(key);
                    return NULL;
                }
                PyList_SetItem(row, i, s); /* steals s */
            }
        }
        else {
            PyObject *r = Py_BuildValue("[LLL]", add[0], add[1], add[2]);
            if (r == NULL || PyDict_SetItem(agg, key, r) < 0) {
                Py_XDECREF(r);
                Py_DECREF(key);
                return NULL;
            }
            Py_DECREF(r);
        }
        Py_DECREF(key);
        a->key = -1;
    }
    h->agg_used = 0;
    if (trace != Py_None && h->tr_n) {
        PyObject *r = PyObject_CallMethod(trace, "frombytes", "y#", (const char *)h->tr,
                                          (Py_ssize_t)(h->tr_n * (Py_ssize_t)sizeof(long long)));
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    h->tr_n = 0;
    Py_RETURN_NONE;
}

static PyObject *
handler_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"sampler", "locs_of", "stacks", "cache", "t", "cpu", "last_flush",
                         "trace", "flush_ns", "trace_flush", "idle_share", "count", NULL};
    PyObject *sampler, *locs_of, *stacks, *cache, *count;
    long long t, cpu, last_flush, flush_ns, trace_flush;
    int trace, share;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O!OLLLpLLiO:Handler", kw, &sampler,
                                     &PyDict_Type, &locs_of, &PyDict_Type, &stacks, &cache, &t,
                                     &cpu, &last_flush, &trace, &flush_ns, &trace_flush, &share,
                                     &count))
        return NULL;
    if (cache != Py_None && !Py_IS_TYPE(cache, &CacheType)) {
        PyErr_SetString(PyExc_TypeError, "Handler: the cache must be a Cache or None");
        return NULL;
    }
    if (!PyCallable_Check(count)) {
        PyErr_SetString(PyExc_TypeError, "Handler: count must be callable");
        return NULL;
    }
    Handler *h = (Handler *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    h->sampler = Py_NewRef(sampler);
    h->locs_of = Py_NewRef(locs_of);
    h->stacks = Py_NewRef(stacks);
    h->cache = Py_NewRef(cache);
    h->count = Py_NewRef(count);
    h->prev_t = t;
    h->prev_cpu = cpu;
    h->last_flush = last_flush;
    h->trace = trace;
    h->flush_ns = flush_ns;
    h->trace_flush = trace_flush;
    h->share = share;
    if (agg_grow(h) < 0) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static int
handler_traverse(Handler *h, visitproc visit, void *arg)
{
    Py_VISIT(h->sampler);
    Py_VISIT(h->locs_of);
    Py_VISIT(h->stacks);
    Py_VISIT(h->cache);
    Py_VISIT(h->count);
    return 0;
}

static int
handler_clear(Handler *h)
{
    Py_CLEAR(h->sampler);
    Py_CLEAR(h->locs_of);
    Py_CLEAR(h->stacks);
    Py_CLEAR(h->cache);
    Py_CLEAR(h->count);
    return 0;
}

static void
handler_dealloc(Handler *h)
{
    PyObject_GC_UnTrack(h);
    handler_clear(h);
    PyMem_Free(h->agg);
    PyMem_Free(h->tr);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMethodDef handler_methods[] = {
    {"drain", (PyCFunction)(void (*)(void))handler_drain, METH_FASTCALL,
     "drain(agg, trace): move the samples aggregated since the last drain into agg (and the "
     "trace's pairs into trace)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandlerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_callpath_walk.Handler",
    .tp_basicsize = sizeof(Handler),
    .tp_dealloc = (destructor)handler_dealloc,
    .tp_call = (ternaryfunc)handler_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)handler_traverse,
    .tp_clear = (inquiry)handler_clear,
    .tp_methods = handler_methods,
    .tp_new = handler_new,
    .tp_doc = "The main thread's SIGPROF handler in C (see the module's documentation).",
};

#if OTHER_STACKS
/* other_stacks(main_ident) -> {thread ident: [(code, f_lasti), ...] innermost first} for every
 * thread of the interpreter but main_ident that has a Python frame.
 *
 * Why: walking another thread's frames through frame objects (sys._current_frames() and then
 * f_back, i.e. PyFrame_GetBack) makes CPython 3.12.1 and 3.13.0 create frame objects for its
 * callers, and that corrupts memory in some programs: a fork multiprocessing.Pool sampled at
 * 4 kHz died of SIGSEGV ("deallocated BytesIO object has exported buffers", in a garbage
 * collection) in 2-3 of 10 runs, also with a loop in pure Python doing the same; calling
 * sys._current_frames() alone did not. This reads the frame records themselves and creates no
 * frame object. With the GIL held, the other threads are outside the evaluation loop (they
 * released it, or wait for it), where their chains are consistent. The frames are those that
 * PyFrame_GetBack would give (complete ones; no shim frame of the C stack) with the offsets
 * PyFrame_GetLasti would give, so the sampler's tables answer them as they answer frame
 * objects. */
static PyObject *
other_stacks(PyObject *self, PyObject *arg)
{
    unsigned long main_ident = PyLong_AsUnsignedLong(arg);
    if (main_ident == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        if (ts->thread_id == main_ident)
            continue;
#if PY_VERSION_HEX >= 0x030D0000
        _PyInterpreterFrame *f = ts->current_frame;
#else
        _PyInterpreterFrame *f = ts->cframe != NULL ? ts->cframe->current_frame : NULL;
#endif
        PyObject *sites = NULL;
        for (; f != NULL; f = f->previous) {
            if (RECORD_SKIPPED(f))
                continue;
            PyObject *site = Py_BuildValue("(Oi)", (PyObject *)RECORD_CODE(f), record_lasti(f));
            if (site == NULL || (sites == NULL && (sites = PyList_New(0)) == NULL)
                || PyList_Append(sites, site) < 0) {
                Py_XDECREF(site);
                Py_XDECREF(sites);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(site);
        }
        if (sites == NULL)
            continue;
        PyObject *key = PyLong_FromUnsignedLong(ts->thread_id);
        int bad = key == NULL || PyDict_SetItem(out, key, sites) < 0;
        Py_XDECREF(key);
        Py_DECREF(sites);
        if (bad) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}
#endif

static PyMethodDef methods[] = {
    {"line_at", (PyCFunction)(void (*)(void))line_at, METH_FASTCALL,
     "line_at(code, offset) -> PyCode_Addr2Line(code, offset)"},
    {"intern_stack", (PyCFunction)(void (*)(void))intern_stack, METH_FASTCALL,
     "intern_stack(frame, tables) -> stack << 1 | NATIVE (-1: the sampler's own), interning "
     "what is new"},
    {"stack_of", (PyCFunction)(void (*)(void))stack_of, METH_FASTCALL,
     "stack_of(frame, locs_of, stacks[, cache]) -> stacks[locations of the frames, leaf first] "
     "or None"},
#if OTHER_STACKS
    {"other_stacks", other_stacks, METH_O,
     "other_stacks(main_ident) -> {ident: [(code, f_lasti), ...]} of the other threads, "
     "without frame objects"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_callpath_walk",
    "The Python sampler's stack walk in C (optional accelerator of sampler.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__callpath_walk(void)
{
    if (PyType_Ready(&CacheType) < 0 || PyType_Ready(&HandlerType) < 0)
        return NULL;
    s_busy = PyUnicode_InternFromString("busy");
    s_dropped = PyUnicode_InternFromString("dropped");
    s_new_stack = PyUnicode_InternFromString("_new_stack");
    s_others = PyUnicode_InternFromString("_maybe_others");
    s_flush = PyUnicode_InternFromString("_flush_locked");
    s_error = PyUnicode_InternFromString("_handler_error");
    if (!s_busy || !s_dropped || !s_new_stack || !s_others || !s_flush || !s_error)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CacheType);
    if (PyModule_AddObject(m, "Cache", (PyObject *)&CacheType) < 0) {
        Py_DECREF(&CacheType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&HandlerType);
    if (PyModule_AddObject(m, "Handler", (PyObject *)&HandlerType) < 0) {
        Py_DECREF(&HandlerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
