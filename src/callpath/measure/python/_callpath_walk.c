/* The Python sampler's stack walk in C: an optional accelerator of sampler.py.
 *
 * Why: the sampler's signal handler runs a thousand times a second inside the measured program,
 * and its cost is dominated by walking the frames: in Python bytecode, with the caches that the
 * program evicted between two samples, about 0.2 us per frame, so 20 us per sample for the 100
 * frames of a program built on a framework. This module does the same walk and gives the same
 * answer, with the GIL held, in the handler's thread (the handler is an ordinary Python signal
 * handler, so nothing here runs in signal context). It decides nothing: on any miss it returns
 * None and the Python slow path interns what is new, exactly as without the accelerator.
 *
 * stack_of(frame, locs_of, stacks[, cache]) -> stacks[(loc, loc, ...)] or None
 *   locs_of: {id(code): {f_lasti: location}}; the key lists the frames' locations leaf first,
 *   following f_back, as sampler.py's Python loop does.
 *
 * With a Cache (one per thread), the walk remembers the previous sample's frames as
 * (code, f_lasti) pairs and their locations: the frames nearer the root that are unchanged,
 * usually all but a few, are compared in a contiguous array instead of looked up in two
 * dictionaries each, and a stack equal to the previous one is answered without building its
 * key. Code objects are compared by address, which is safe because the sampler keeps every
 * code object it has interned alive for as long as the tables it holds (the cache holds those
 * tables, and starts over when given others, as after a fork).
 *
 * Only public C API of CPython 3.11+ (PyFrame_GetCode, PyFrame_GetLasti, PyFrame_GetBack).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000
#error "callpath's stack walk needs CPython 3.11 or newer"
#endif

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

static PyObject *
stack_of(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stack_of(frame, locs_of, stacks[, cache])");
        return NULL;
    }
    PyObject *frame = args[0], *locs_of = args[1], *stacks = args[2];
    Cache *cache = NULL;
    if (!PyFrame_Check(frame) || !PyDict_CheckExact(locs_of) || !PyDict_CheckExact(stacks)) {
        PyErr_SetString(PyExc_TypeError, "stack_of(frame, dict, dict[, Cache])");
        return NULL;
    }
    if (nargs == 4 && args[3] != Py_None) {
        if (!Py_IS_TYPE(args[3], &CacheType)) {
            PyErr_SetString(PyExc_TypeError, "stack_of: the cache must be a Cache");
            return NULL;
        }
        cache = (Cache *)args[3];
        if (cache->locs_of != locs_of || cache->stacks != stacks) {
            cache_clear_stack(cache);
            Py_INCREF(locs_of);
            Py_XSETREF(cache->locs_of, locs_of);
            Py_INCREF(stacks);
            Py_XSETREF(cache->stacks, stacks);
        }
    }

    /* 1. the frames' (code, f_lasti), leaf first */
    Site small_sites[SMALL];
    PyObject *small_locs[SMALL];
    Site *sites = small_sites;
    PyObject **locs = small_locs; /* borrowed from the tables (which the caller holds) */
    Py_ssize_t n = 0, cap = SMALL;
    PyObject *result = NULL;
    PyFrameObject *f = (PyFrameObject *)frame;
    Py_INCREF(f);
    while (f != NULL) {
        if (n == cap && grow(&sites, &locs, &cap, n + 1, sites != small_sites) < 0)
            goto done;
        PyCodeObject *co = PyFrame_GetCode(f);
        sites[n].code = co;
        Py_DECREF(co); /* alive while its frame is; the pointer is only compared */
        sites[n].lasti = PyFrame_GetLasti(f);
        n++;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }

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
        PyObject *key = PyTuple_New(n);
        if (key == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(locs[i]);
            PyTuple_SET_ITEM(key, i, locs[i]);
        }
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
    Py_XDECREF(f);
    if (sites != small_sites) {
        PyMem_Free(sites);
        PyMem_Free(locs);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"stack_of", (PyCFunction)(void (*)(void))stack_of, METH_FASTCALL,
     "stack_of(frame, locs_of, stacks[, cache]) -> stacks[locations of the frames, leaf first] "
     "or None"},
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
    if (PyType_Ready(&CacheType) < 0)
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
    return m;
}
