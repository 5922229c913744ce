/* The level loop of callpath's post-mortem unwinder (measure/unwind.py) in C.
 *
 * Why: unwind.py's numpy loop advances every active sample one frame per step, about a hundred
 * numpy calls per step. A PyTorch run's stacks are up to 278 frames deep with a few hundred
 * samples still active at the deep end, so its cost is the calls' fixed overhead (1.5-1.8 ms a
 * step), not the arithmetic. Here each sample is unwound to its end in one go, by the same rules
 * as unwind.py's ``step`` and ``load`` (same integer wrap-around, same words read, same codes),
 * and the frames are put in unwind.py's order (by depth, then sample) at the end.
 *
 * Rows are not compiled here: a session holds the row contents (kind, CFA rule, seven register
 * rules and offsets, source) that Python gave it per (file id, link-time pc) key, and a sample
 * whose key it lacks is *parked* (status NEED_ROW / NEED_RECIPE, the key's mapping and pc in
 * want_m / want_lk) before anything of that frame is written. Python compiles the missing rows
 * (cfi.Compiler.row_source / procedure_recipe_row), adds them, and calls walk() again on the
 * parked samples, which start that frame over. Frames in code without a file (JIT code, a pc in
 * no mapping at depth 0) are parked after their frame is written (status FILELESS) for
 * unwind.py's _leave_fileless_code, which sets the caller's registers or the stop code itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* as in cfi.py and unwind.py */
enum { KIND_NONE = 0, KIND_CFA = 1, KIND_SIGNAL = 2, KIND_CFA_DEREF = 3 };
enum { RULE_SAME = 0, RULE_OFFSET = 1, RULE_UNDEF = 2, RULE_UNKNOWN = 3, RULE_AT_RBP = 4 };
enum { SRC_CFI = 1, SRC_RECIPE_FIX = 3, SRC_SIGNAL = 4 };
enum { PARTIAL_NO_INFO = 1, PARTIAL_STACK = 2, PARTIAL_NO_MODULE = 3, PARTIAL_LOOP = 4,
       PARTIAL_REGISTER = 5, PARTIAL_DEPTH = 6 };
enum { ST_ACTIVE = 0, ST_DONE = 1, ST_NEED_ROW = 2, ST_NEED_RECIPE = 3, ST_FILELESS = 4 };
#define NSAVED 6                 /* rbx rbp r12 r13 r14 r15 (cfi.SAVED) */
#define NTRACK 7                 /* the same and the return address (cfi.TRACKED) */
#define NVAL (3 + 2 * NTRACK + 1) /* kind, cfa_reg, cfa_off, rules, offsets, source */
#define RSP 7
#define COL_RBP 1
#define UC_GREGS 40
#define MAX_DEPTH 2048
#define LANES 8     /* samples unwound in turn */
static const int saved_reg[NSAVED] = {3, 6, 12, 13, 14, 15};  /* DWARF numbers */
/* ucontext greg index of rbx rbp r12 r13 r14 r15, then rsp and rip (cfi.GREG) */
static const int greg[NSAVED + 2] = {11, 10, 4, 5, 6, 7, 15, 16};

/* ---- (file id, pc) key -> row contents: open addressing, values in a dense array ---- */
typedef struct {
    uint64_t key;
    int64_t val;     /* value index + 1, 0 for an empty slot */
} Slot;

typedef struct {
    Slot *slot;      /* key and value index side by side: one cache line per probe */
    size_t cap;      /* a power of two */
    int64_t *vals;   /* NVAL per entry */
    size_t n, vcap;
} Map;

static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

static const int64_t *map_get(const Map *m, uint64_t key) {
    if (!m->cap) return NULL;
    for (size_t i = hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slot[i].val) return NULL;
        if (m->slot[i].key == key) return m->vals + (size_t)(m->slot[i].val - 1) * NVAL;
    }
}

static int map_grow(Map *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    Slot *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slot[i].val) continue;
        size_t j = hash(m->slot[i].key) & (cap - 1);
        while (slot[j].val) j = (j + 1) & (cap - 1);
        slot[j] = m->slot[i];
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return 0;
}

static int map_put(Map *m, uint64_t key, const int64_t *val) {
    if ((m->n + 1) * 2 > m->cap && map_grow(m) < 0) return -1;
    size_t i = hash(key) & (m->cap - 1);
    while (m->slot[i].val) {
        if (m->slot[i].key == key) return 0;  /* the same key again: the first contents */
        i = (i + 1) & (m->cap - 1);
    }
    if (m->n == m->vcap) {
        size_t vcap = m->vcap ? m->vcap * 2 : 1024;
        int64_t *v = realloc(m->vals, vcap * NVAL * sizeof *v);
        if (!v) return -1;
        m->vals = v;
        m->vcap = vcap;
    }
    memcpy(m->vals + m->n * NVAL, val, NVAL * sizeof *val);
    m->slot[i].key = key;
    m->slot[i].val = (int64_t)++m->n;
    return 0;
}

static void map_free(Map *m) {
    free(m->slot);
    free(m->vals);
}

/* ---- a session: the two maps and the frames written so far, in the order found ---- */
typedef struct {  /* one frame, its fields together in 24 bytes: finish() reads it once */
    uint64_t address;
    int32_t sample, module;
    int16_t depth;   /* < MAX_DEPTH */
    int8_t source;   /* cfi.SRC_* */
    uint8_t exact;
} Frame;

typedef struct {
    Map rows, recipes;
    Frame *log;
    size_t n, cap;
} Session;

static void session_free(PyObject *cap) {
    Session *s = PyCapsule_GetPointer(cap, "callpath_unwind_session");
    if (!s) return;
    map_free(&s->rows);
    map_free(&s->recipes);
    free(s->log);
    free(s);
}

static Session *session_of(PyObject *cap) {
    return PyCapsule_GetPointer(cap, "callpath_unwind_session");
}

static int log_grow(Session *s) {
    size_t cap = s->cap ? s->cap * 2 : 65536;
    Frame *p = realloc(s->log, cap * sizeof *p);
    if (!p) return -1;
    s->log = p;
    s->cap = cap;
    return 0;
}

/* ---- the arrays of one walk() ---- */
typedef struct {
    /* read-only */
    const uint64_t *words; Py_ssize_t nw;
    const int64_t *stack0, *nwords; const uint64_t *sp0;
    const int64_t *hat, *hn, *hfirst; int high;
    const uint64_t *starts, *ends; const int64_t *bias, *fids; const uint8_t *noelf;
    Py_ssize_t nm;
    /* per sample, read and written */
    uint64_t *pc, *sp, *saved; uint8_t *valid, *exact, *complete;
    int64_t *found, *reason, *nframes, *want_m, *want_lk;
    int8_t *status;
    int recipes;
    int bad_index;  /* a word index outside ``words`` (numpy would raise IndexError) */
} Walk;

/* unwind.py's load(): the word at addr in sample i's stack copies, and whether it is there */
static int load(Walk *w, Py_ssize_t i, uint64_t addr, uint64_t *out) {
    int64_t k = (int64_t)(addr - w->sp0[i]);
    int64_t q = k >> 3;
    int aligned = k >= 0 && (k & 7) == 0;
    int ok = aligned && q < w->nwords[i];
    int64_t at = ok ? w->stack0[i] + q : 0;
    if (w->high) {
        int64_t kh = q - w->hat[i];
        if (!ok && aligned && kh >= 0 && kh < w->hn[i]) {
            at = w->hfirst[i] + kh;
            ok = 1;
        }
    }
    if (!w->nw) {
        *out = 0;
        return 0;
    }
    if (at < 0 || at >= w->nw) {
        w->bad_index = 1;
        *out = 0;
        return 0;
    }
    *out = w->words[at];
    return ok;
}

/* The mapping holding look (-1: none), as unwind.py finds it (searchsorted(starts, look,
 * "right") - 1, then look < its end); hint, the mapping of the frame below, is tried first. */
static Py_ssize_t module_of(const Walk *w, uint64_t look, Py_ssize_t hint) {
    /* the caller is often in the callee's module: searchsorted's answer if so, in 3 tests */
    if (hint >= 0 && w->starts[hint] <= look && look < w->ends[hint]
            && (hint + 1 == w->nm || w->starts[hint + 1] > look))
        return hint;
    Py_ssize_t lo = 0, hi = w->nm;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (w->starts[mid] <= look) lo = mid + 1; else hi = mid;
    }
    return lo > 0 && look < w->ends[lo - 1] ? lo - 1 : -1;
}

/* unwind.py's in_module(): whether a return address follows a call in a mapped module (its
 * pc - 1 in one: the caller's own lookup, when it is not exact) */
static int in_module(const Walk *w, uint64_t p, Py_ssize_t hint) {
    return p > 0 && module_of(w, p - 1, hint) >= 0;
}

typedef struct {
    int64_t st;
    int root;
    uint64_t pc, sp, saved[NSAVED];
    uint8_t valid[NSAVED];
} Step;

/* unwind.py's step(): one frame up for sample i by a row's contents */
static void step(Walk *w, Py_ssize_t i, const int64_t *row, Step *o) {
    int64_t kind = row[0], creg = row[1], cfa_off = row[2];
    const int64_t *ru = row + 3, *ro = row + 3 + NTRACK;
    const uint64_t *old_s = w->saved + i * NSAVED;
    const uint8_t *old_v = w->valid + i * NSAVED;
    uint64_t sp = w->sp[i];
    uint64_t base = sp;
    int base_ok = creg == RSP;
    for (int c = 0; c < NSAVED; c++) {
        if (creg == saved_reg[c]) {
            base = old_s[c];
            base_ok |= old_v[c];
        }
    }
    uint64_t cfa = base + (uint64_t)cfa_off;
    if (kind == KIND_CFA_DEREF) {  /* the CFA is kept in memory */
        uint64_t v;
        int ok = load(w, i, cfa, &v);
        cfa = v;
        base_ok &= ok;
    }
    int64_t ra_rule = ru[NTRACK - 1];
    uint64_t ra;
    int ra_ok = load(w, i, cfa + (uint64_t)ro[NTRACK - 1], &ra);
    int bad_reg = !base_ok;
    int root = ra_rule == RULE_UNDEF && base_ok;
    int64_t st = bad_reg ? PARTIAL_REGISTER : 0;
    if (!root && !bad_reg && (ra_rule != RULE_OFFSET || !ra_ok)) st = PARTIAL_STACK;
    if (st == 0 && !root && cfa <= sp) st = PARTIAL_LOOP;
    root |= st == 0 && ra == 0;
    for (int c = 0; c < NSAVED; c++) {
        int64_t rule = ru[c];
        uint64_t addr = cfa + (uint64_t)ro[c], v = 0;
        int ok = 0;
        int is_off = rule == RULE_OFFSET;
        if (is_off) {  /* (unwind.py reads the word of every rule; only these use it) */
            ok = load(w, i, addr, &v);
        } else if (rule == RULE_AT_RBP) {  /* saved relative to the frame's own rbp */
            addr = old_s[COL_RBP] + (uint64_t)ro[c];
            ok = load(w, i, addr, &v) && old_v[COL_RBP];
            is_off = 1;
        }
        /* a save slot below the stack pointer (epilogue rows) is stale */
        int stale = is_off && (int64_t)addr < (int64_t)sp;
        int take = is_off && !stale;
        o->saved[c] = take ? v : old_s[c];
        o->valid[c] = take ? (uint8_t)ok : (uint8_t)((rule == RULE_SAME || stale) && old_v[c]);
    }
    o->st = st;
    o->root = root;
    o->pc = root ? 0 : ra;
    o->sp = cfa;
}

static int emit(Session *s, Py_ssize_t i, int64_t d, int64_t m, uint64_t addr, uint8_t ex,
                int64_t src) {
    if (s->n == s->cap && log_grow(s) < 0) return -1;
    Frame *f = &s->log[s->n++];
    f->sample = (int32_t)i;
    f->depth = (int16_t)d;
    f->module = (int32_t)m;
    f->address = addr;
    f->exact = ex;
    f->source = (int8_t)src;
    return 0;
}

#define MASK48 ((1ULL << 48) - 1)

enum { STEP_ON = 0, STEP_PARKED = 1, STEP_ENDED = 2 };

/* Start reading what sample i's next frame needs: the words just above its new sp (the
 * caller's return address and saves lie there) and the hash slot of its row. The stack
 * copies are read once, sparsely, so nearly every frame's first word is a cache miss; walk()
 * steps several samples in turn, so the miss is served while the others' frames run. */
static void prefetch_next(const Session *se, const Walk *w, Py_ssize_t i, Py_ssize_t hint) {
    int64_t k = (int64_t)(w->sp[i] - w->sp0[i]);
    if (k >= 0) {
        int64_t q = k >> 3;
        for (int64_t a = q; a < q + 64; a += 8)
            if (a < w->nwords[i] && w->stack0[i] + a < w->nw)
                __builtin_prefetch(w->words + w->stack0[i] + a);
    }
    uint64_t look = w->pc[i] - (w->exact[i] ? 0 : 1);
    Py_ssize_t m = module_of(w, look, hint);
    if (m >= 0 && !w->noelf[m] && se->rows.cap) {
        uint64_t lk = look + (uint64_t)w->bias[m];
        uint64_t key = ((uint64_t)w->fids[m] << 48) | (lk & MASK48);
        __builtin_prefetch(&se->rows.slot[hash(key) & (se->rows.cap - 1)]);
    }
}

/* One frame of sample i: STEP_ON (the caller's registers are set), STEP_PARKED (status says
 * why), STEP_ENDED, or -1 (out of memory). hint: the module of the frame below, updated. */
static int frame_step(Session *se, Walk *w, Py_ssize_t i, Py_ssize_t *hintp) {
    {
        int64_t d = w->nframes[i];
        uint64_t p = w->pc[i];
        uint8_t ex = w->exact[i];
        uint64_t look = p - (ex ? 0 : 1);
        Py_ssize_t m = module_of(w, look, *hintp);
        *hintp = m;
        int inmod = m >= 0;
        int64_t bias = inmod ? w->bias[m] : 0;
        uint64_t link = inmod ? p + (uint64_t)bias : p;
        int64_t lk = (int64_t)(look + (uint64_t)bias);
        uint64_t key = 0;
        const int64_t *row = NULL;
        int64_t kind = KIND_NONE, src = 0;
        if (inmod && !w->noelf[m]) {
            key = ((uint64_t)w->fids[m] << 48) | ((uint64_t)lk & MASK48);
            row = map_get(&se->rows, key);
            if (!row) {
                w->want_m[i] = m;
                w->want_lk[i] = lk;
                w->status[i] = ST_NEED_ROW;
                return STEP_PARKED;
            }
            kind = row[0];
            src = row[NVAL - 1];
        }
        int64_t stop = !inmod ? PARTIAL_NO_MODULE : kind == KIND_NONE ? PARTIAL_NO_INFO : 0;
        int done_ok = 0;
        Step o;
        o.pc = 0;
        o.sp = w->sp[i];
        memcpy(o.saved, w->saved + i * NSAVED, sizeof o.saved);
        memcpy(o.valid, w->valid + i * NSAVED, sizeof o.valid);
        uint8_t new_exact = 0;
        if (stop == 0 && (kind == KIND_CFA || kind == KIND_CFA_DEREF)) {
            step(w, i, row, &o);
            if (w->recipes && src == SRC_CFI && o.st != PARTIAL_STACK
                    && (o.st != 0 || (!o.root && !in_module(w, o.pc, m)))) {
                /* CFI that finds no return address in any module: the recipe's frame */
                const int64_t *rr = map_get(&se->recipes, key);
                if (!rr) {
                    w->want_m[i] = m;
                    w->want_lk[i] = lk;
                    w->status[i] = ST_NEED_RECIPE;
                    return STEP_PARKED;
                }
                if (rr[0] != KIND_NONE) {
                    Step o2;
                    step(w, i, rr, &o2);
                    if (o2.st == 0 && (o2.root || in_module(w, o2.pc, m))) {
                        o = o2;
                        src = SRC_RECIPE_FIX;
                    }
                }
            }
            stop = o.st;
            done_ok = o.root && o.st == 0;
        } else if (stop == 0 && kind == KIND_SIGNAL) {
            /* registers from the ucontext the kernel pushed at sp */
            uint64_t base = w->sp[i], v[NSAVED + 2];
            int oks = 1;
            for (int g = 0; g < NSAVED + 2; g++)
                oks &= load(w, i, base + (uint64_t)(UC_GREGS + 8 * greg[g]), &v[g]);
            for (int c = 0; c < NSAVED; c++) {
                o.saved[c] = v[c];
                o.valid[c] = (uint8_t)oks;
            }
            o.pc = v[NSAVED + 1];
            o.sp = v[NSAVED];
            new_exact = 1;
            stop = oks ? 0 : PARTIAL_STACK;
        }
        if (emit(se, i, d, inmod ? m : -1, link, ex, w->found[i]) < 0) return -1;
        w->nframes[i] = d + 1;
        if ((stop == PARTIAL_NO_INFO && inmod && w->noelf[m])
                || (stop == PARTIAL_NO_MODULE && d == 0)) {
            w->want_m[i] = inmod ? m : -1;
            w->reason[i] = stop;
            w->status[i] = ST_FILELESS;
            return STEP_PARKED;
        }
        if (stop) {
            w->reason[i] = stop;
            w->status[i] = ST_DONE;
            return STEP_ENDED;
        }
        if (done_ok) {
            w->complete[i] = 1;
            w->status[i] = ST_DONE;
            return STEP_ENDED;
        }
        w->pc[i] = o.pc;
        w->sp[i] = o.sp;
        memcpy(w->saved + i * NSAVED, o.saved, sizeof o.saved);
        memcpy(w->valid + i * NSAVED, o.valid, sizeof o.valid);
        w->exact[i] = new_exact;
        w->found[i] = kind == KIND_SIGNAL ? SRC_SIGNAL : src;
        if (d + 1 >= MAX_DEPTH) {
            w->reason[i] = PARTIAL_DEPTH;
            w->status[i] = ST_DONE;
            return STEP_ENDED;
        }
        prefetch_next(se, w, i, m);
        return STEP_ON;
    }
}

/* ---- buffers ---- */
typedef struct { Py_buffer b[32]; int n; } Bufs;

static void release(Bufs *bs) {
    for (int k = 0; k < bs->n; k++) PyBuffer_Release(&bs->b[k]);
    bs->n = 0;
}

/* item k of a tuple as a C-contiguous buffer of at least n items of the given size */
static void *buf(Bufs *bs, PyObject *t, Py_ssize_t k, int writable, Py_ssize_t size,
                 Py_ssize_t n, Py_ssize_t *len) {
    PyObject *o = PyTuple_GetItem(t, k);
    if (!o) return NULL;
    Py_buffer *b = &bs->b[bs->n];
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return NULL;
    bs->n++;
    if (b->len % size || b->len / size < n) {
        PyErr_Format(PyExc_ValueError, "array %zd: %zd bytes, expected %zd items of %zd",
                     k, b->len, n, size);
        return NULL;
    }
    if (len) *len = b->len / size;
    static int64_t none[1];  /* an empty array may have no data pointer: NULL means failure */
    return b->buf ? b->buf : (void *)none;
}

static PyObject *new_session(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    Session *s = calloc(1, sizeof *s);
    if (!s) return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(s, "callpath_unwind_session", session_free);
    if (!cap) free(s);
    return cap;
}

/* add_rows(session, which, keys int64[k], values int64[k * NVAL]); which 0: rows, 1: recipes */
static PyObject *add_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap, *t;
    int which;
    if (!PyArg_ParseTuple(args, "OiO!", &cap, &which, &PyTuple_Type, &t)) return NULL;
    Session *s = session_of(cap);
    if (!s) return NULL;
    Bufs bs = {.n = 0};
    Py_ssize_t nk;
    const int64_t *keys = buf(&bs, t, 0, 0, 8, 0, &nk);
    const int64_t *vals = keys ? buf(&bs, t, 1, 0, 8 * NVAL, nk, NULL) : NULL;
    if (!vals) { release(&bs); return NULL; }
    Map *m = which ? &s->recipes : &s->rows;
    for (Py_ssize_t k = 0; k < nk; k++) {
        if (map_put(m, (uint64_t)keys[k], vals + k * NVAL) < 0) {
            release(&bs);
            return PyErr_NoMemory();
        }
    }
    release(&bs);
    Py_RETURN_NONE;
}

/* walk(session, todo, (words, stack0, nwords, sp0, hat, hn, hfirst, starts, ends, bias, fids,
 *       noelf), (pc, sp, saved, valid, exact, complete, found, reason, nframes, want_m,
 *       want_lk, status, parked), high, recipes) -> number of samples parked (their indices
 *       in parked[:k], their status in status) */
static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap, *ro, *rw;
    int high, recipes;
    Py_buffer todo_b;
    if (!PyArg_ParseTuple(args, "Oy*O!O!pp", &cap, &todo_b, &PyTuple_Type, &ro, &PyTuple_Type,
                          &rw, &high, &recipes))
        return NULL;
    Session *se = session_of(cap);
    Bufs bs = {.n = 0};
    Walk w;
    memset(&w, 0, sizeof w);
    Py_ssize_t n = 0, ntodo = todo_b.len / 8;
    const int64_t *todo = todo_b.buf;
    int ok = se != NULL && PyTuple_Size(ro) == 12 && PyTuple_Size(rw) == 13;
    if (se && !ok) PyErr_SetString(PyExc_ValueError, "walk: 12 inputs and 13 states expected");
    int64_t *parked = NULL;
    if (ok) {
        ok = (w.pc = buf(&bs, rw, 0, 1, 8, 0, &n)) != NULL
            && (w.sp = buf(&bs, rw, 1, 1, 8, n, NULL)) != NULL
            && (w.saved = buf(&bs, rw, 2, 1, 8 * NSAVED, n, NULL)) != NULL
            && (w.valid = buf(&bs, rw, 3, 1, NSAVED, n, NULL)) != NULL
            && (w.exact = buf(&bs, rw, 4, 1, 1, n, NULL)) != NULL
            && (w.complete = buf(&bs, rw, 5, 1, 1, n, NULL)) != NULL
            && (w.found = buf(&bs, rw, 6, 1, 8, n, NULL)) != NULL
            && (w.reason = buf(&bs, rw, 7, 1, 8, n, NULL)) != NULL
            && (w.nframes = buf(&bs, rw, 8, 1, 8, n, NULL)) != NULL
            && (w.want_m = buf(&bs, rw, 9, 1, 8, n, NULL)) != NULL
            && (w.want_lk = buf(&bs, rw, 10, 1, 8, n, NULL)) != NULL
            && (w.status = buf(&bs, rw, 11, 1, 1, n, NULL)) != NULL
            && (parked = buf(&bs, rw, 12, 1, 8, n, NULL)) != NULL
            && (w.words = buf(&bs, ro, 0, 0, 8, 0, &w.nw)) != NULL
            && (w.stack0 = buf(&bs, ro, 1, 0, 8, n, NULL)) != NULL
            && (w.nwords = buf(&bs, ro, 2, 0, 8, n, NULL)) != NULL
            && (w.sp0 = buf(&bs, ro, 3, 0, 8, n, NULL)) != NULL
            && (w.hat = buf(&bs, ro, 4, 0, 8, high ? n : 0, NULL)) != NULL
            && (w.hn = buf(&bs, ro, 5, 0, 8, high ? n : 0, NULL)) != NULL
            && (w.hfirst = buf(&bs, ro, 6, 0, 8, high ? n : 0, NULL)) != NULL
            && (w.starts = buf(&bs, ro, 7, 0, 8, 0, &w.nm)) != NULL
            && (w.ends = buf(&bs, ro, 8, 0, 8, w.nm, NULL)) != NULL
            && (w.bias = buf(&bs, ro, 9, 0, 8, w.nm, NULL)) != NULL
            && (w.fids = buf(&bs, ro, 10, 0, 8, w.nm, NULL)) != NULL
            && (w.noelf = buf(&bs, ro, 11, 0, 1, w.nm, NULL)) != NULL;
    }
    if (ok && (n > INT32_MAX || w.nm > INT32_MAX)) {  /* (Frame's 32-bit fields) */
        PyErr_SetString(PyExc_ValueError, "walk: more than 2**31 samples or mappings");
        ok = 0;
    }
    w.high = high;
    w.recipes = recipes;
    Py_ssize_t np_ = 0;
    int err = 0;
    if (ok) {
        /* LANES samples in turn, a frame each (see prefetch_next) */
        Py_ssize_t lane[LANES], hint[LANES], nl = 0, k = 0;
        for (;;) {
            while (nl < LANES && k < ntodo) {
                int64_t i = todo[k++];
                if (i < 0 || i >= n) { err = 2; break; }
                w.status[i] = ST_ACTIVE;
                lane[nl] = i;
                hint[nl++] = -1;
            }
            if (err || !nl) break;
            for (Py_ssize_t l = 0; l < nl;) {
                int r = frame_step(se, &w, lane[l], &hint[l]);
                if (r == STEP_ON) { l++; continue; }
                if (r < 0) { err = 1; break; }
                if (r == STEP_PARKED) parked[np_++] = lane[l];
                lane[l] = lane[nl - 1];  /* ended: the lane goes to the last one */
                hint[l] = hint[--nl];
            }
            if (err) break;
        }
    }
    release(&bs);
    PyBuffer_Release(&todo_b);
    if (!ok) return NULL;
    if (err == 1) return PyErr_NoMemory();
    if (err == 2) {
        PyErr_SetString(PyExc_IndexError, "walk: sample index out of range");
        return NULL;
    }
    if (w.bad_index) {
        PyErr_SetString(PyExc_IndexError, "walk: stack word index outside the captured words");
        return NULL;
    }
    return PyLong_FromSsize_t(np_);
}

/* finish(session, (nframes, sample, depth, module, address, exact, source)): the frames in
 * unwind.py's order, by depth and within a depth by sample */
static PyObject *finish(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap, *t;
    if (!PyArg_ParseTuple(args, "OO!", &cap, &PyTuple_Type, &t)) return NULL;
    Session *se = session_of(cap);
    if (!se) return NULL;
    if (PyTuple_Size(t) != 7) {
        PyErr_SetString(PyExc_ValueError, "finish: 7 arrays expected");
        return NULL;
    }
    Bufs bs = {.n = 0};
    Py_ssize_t n, total = (Py_ssize_t)se->n;
    const int64_t *nf = buf(&bs, t, 0, 0, 8, 0, &n);
    int64_t *o_s = nf ? buf(&bs, t, 1, 1, 8, total, NULL) : NULL;
    int64_t *o_d = o_s ? buf(&bs, t, 2, 1, 8, total, NULL) : NULL;
    int64_t *o_m = o_d ? buf(&bs, t, 3, 1, 8, total, NULL) : NULL;
    uint64_t *o_a = o_m ? buf(&bs, t, 4, 1, 8, total, NULL) : NULL;
    uint8_t *o_x = o_a ? buf(&bs, t, 5, 1, 1, total, NULL) : NULL;
    int64_t *o_src = o_x ? buf(&bs, t, 6, 1, 8, total, NULL) : NULL;
    if (!o_src) { release(&bs); return NULL; }
    int64_t sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (nf[i] < 0 || nf[i] > MAX_DEPTH) { sum = -1; break; }
        sum += nf[i];
    }
    if (sum != total) {
        release(&bs);
        PyErr_SetString(PyExc_ValueError, "finish: frame counts do not match the frames");
        return NULL;
    }
    /* at[base[i] + d]: where sample i's frame d is in the log (sample-major) */
    int64_t *base = malloc(((size_t)n + 1) * sizeof *base);
    int64_t *at = malloc(((size_t)total + 1) * sizeof *at);
    Py_ssize_t *alive = malloc(((size_t)n + 1) * sizeof *alive);
    if (!base || !at || !alive) {
        free(base); free(at); free(alive);
        release(&bs);
        return PyErr_NoMemory();
    }
    memset(at, 0xff, ((size_t)total + 1) * sizeof *at);  /* -1: no frame there yet */
    int64_t b = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        base[i] = b;
        b += nf[i];
    }
    int bad = 0;
    for (size_t k = 0; k < se->n; k++) {
        int64_t i = se->log[k].sample, d = se->log[k].depth;
        if (i < 0 || i >= n || d < 0 || d >= nf[i] || at[base[i] + d] >= 0) { bad = 1; break; }
        at[base[i] + d] = (int64_t)k;
    }
    /* depth by depth, the samples that reach it in order (as unwind.py's active set) */
    Py_ssize_t na = 0, j = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (nf[i] > 0) alive[na++] = i;
    for (int64_t d = 0; !bad && na; d++) {
        Py_ssize_t keep = 0;
        for (Py_ssize_t a = 0; a < na; a++) {
            Py_ssize_t i = alive[a];
            if (a + 16 < na)  /* the log is read out of order: a miss each, started early */
                __builtin_prefetch(&se->log[at[base[alive[a + 16]] + d]]);
            const Frame *f = &se->log[at[base[i] + d]];
            o_s[j] = i;
            o_d[j] = d;
            o_m[j] = f->module;
            o_a[j] = f->address;
            o_x[j] = f->exact;
            o_src[j] = f->source;
            j++;
            if (nf[i] > d + 1) alive[keep++] = i;
        }
        na = keep;
    }
    free(base); free(at); free(alive);
    release(&bs);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "finish: a frame outside its sample's count");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"new_session", new_session, METH_NOARGS, "An empty session: no rows, no frames."},
    {"add_rows", add_rows, METH_VARARGS, "Add row contents per key (0: rows, 1: recipes)."},
    {"walk", walk, METH_VARARGS, "Unwind samples until they end or need Python."},
    {"finish", finish, METH_VARARGS, "The frames in unwind.py's order."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_callpath_unwind",
                                    "The post-mortem unwinder's level loop in C.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__callpath_unwind(void) { return PyModule_Create(&module); }
