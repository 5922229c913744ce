/* Length and control flow of x86-64 instructions, for callpath struct (structure/cfg.py).
 *
 * callpath needs four numbers per instruction (address, end, flow kind, direct target) for
 * tens of millions of instructions (libtorch_cpu.so: ~70 M); iced-x86 driven from Python costs
 * about a microsecond and a half each. This decodes the legacy encodings (one-byte, 0F, 0F 38,
 * 0F 3A maps) and VEX from tables that scripts/gen_x86_table.py reads off iced-x86 itself, and
 * stops at the first instruction the tables do not vouch for (EVEX, XOP, LOCK, unusual prefix
 * mixes, anything iced-x86 would call invalid): cfg.decode gives that one to iced-x86 and
 * resumes here after it, so the rows are iced-x86's on every instruction.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_x86_table.h"

static unsigned char x86_flags[X86_FLAGS_N], x86_imm[X86_IMM_N];
static unsigned char vex_flags[VEX_FLAGS_N], vex_imm[VEX_IMM_N];

/* Expand one run-length-encoded table; -1 if its runs do not add up to its size. */
static int expand(unsigned char *out, size_t n, const unsigned char *rle, size_t len) {
    size_t k = 0;
    for (size_t j = 0; j + 1 < len; j += 2) {
        if (k + rle[j + 1] > n) return -1;
        memset(out + k, rle[j], rle[j + 1]);
        k += rle[j + 1];
    }
    return k == n ? 0 : -1;
}

/* ModRM, SIB, displacement and immediate of an instruction whose opcode ends at p[i]:
 * its full length, or 0 to leave it to iced. */
static int operands(const unsigned char *p, Py_ssize_t avail, int i, int f, int m, int mem,
                    int imm) {
    if (f & 2) {
        if (m < 0) return 0;
        i++;
        if (mem) {
            int mod = m >> 6, rm = m & 7;
            if (rm == 4) {
                if (i >= avail) return 0;
                if (mod == 0 && (p[i] & 7) == 5) i += 4;
                i++;
            }
            if (mod == 1) i += 1;
            else if (mod == 2) i += 4;
            else if (rm == 5) i += 4;
        }
    }
    i += imm;
    if (i > 15 || i > avail) return 0;
    return i;
}

/* A VEX instruction (C4/C5 at p[i], no 66/F2/F3/LOCK/REX before it): its length, or 0. */
static int vex(const unsigned char *p, Py_ssize_t avail, int i) {
    int map, pp, lbit, w, vvvv;
    if (p[i] == 0xC5) {
        if (i + 2 >= avail) return 0;
        unsigned char b = p[i + 1];
        map = 1; w = 0; vvvv = (b >> 3) & 15; lbit = (b >> 2) & 1; pp = b & 3;
        i += 2;
    } else {
        if (i + 3 >= avail) return 0;
        unsigned char b1 = p[i + 1], b2 = p[i + 2];
        map = b1 & 0x1F;
        if (map < 1 || map > 3) return 0;
        w = b2 >> 7; vvvv = (b2 >> 3) & 15; lbit = (b2 >> 2) & 1; pp = b2 & 3;
        i += 3;
    }
    int op = p[i++];
    int reg = 0, mem = 0, m = -1;
    if (i < avail) {
        m = p[i];
        reg = (m >> 3) & 7;
        mem = (m >> 6) != 3;
    }
    size_t idx = ((((((size_t)(map - 1) * 4 + pp) * 2 + lbit) * 2 + w) * 256 + op) * 8 + reg)
                 * 2 + mem;
    int f = vex_flags[idx];
    if (!f || ((f & 0x40) && vvvv != 15)) return 0;
    if (((f >> 2) & 7) != 0) return 0; /* only NEXT rows are expected here */
    return operands(p, avail, i, f, m, mem, vex_imm[idx]);
}

/* Decode one instruction at p[0..avail). Returns its length, or 0 to leave it to iced. */
static int one(const unsigned char *p, Py_ssize_t avail, uint64_t ip, int *kind,
               uint64_t *target) {
    int i = 0, has66 = 0, f23 = 0, has67 = 0, rex = 0;
    Py_ssize_t lim = avail < 15 ? avail : 15;
    for (; i < lim; i++) {
        unsigned char b = p[i];
        if (b == 0x66) has66 = 1;
        else if (b == 0xF2 || b == 0xF3) f23 = b;
        else if (b == 0x67) has67 = 1;
        else if (b == 0x26 || b == 0x2E || b == 0x36 || b == 0x3E || b == 0x64 || b == 0x65) ;
        else if (b == 0xF0) return 0; /* LOCK: validity depends on the operand: iced decides */
        else break;
    }
    if (i >= lim) return 0;
    if ((p[i] == 0xC4 || p[i] == 0xC5) && !has66 && !f23) {
        int len = vex(p, avail, i);
        if (len) { *kind = 0; *target = 0; }
        return len;
    }
    if ((p[i] & 0xF0) == 0x40) {
        rex = p[i++];
        if (i >= lim) return 0;
        unsigned char b = p[i];
        /* a prefix after REX cancels it: left to iced */
        if ((b & 0xF0) == 0x40 || b == 0x66 || b == 0x67 || b == 0xF0 || b == 0xF2 ||
            b == 0xF3 || b == 0x26 || b == 0x2E || b == 0x36 || b == 0x3E || b == 0x64 ||
            b == 0x65)
            return 0;
    }
    int map = 0;
    if (p[i] == 0x0F) {
        if (++i >= lim) return 0;
        if (p[i] == 0x38) { map = 2; i++; }
        else if (p[i] == 0x3A) { map = 3; i++; }
        else map = 1;
        if (i >= lim) return 0;
    }
    int op = p[i++];
    if (has66 && f23) return 0;
    int cls = f23 == 0xF3 ? 2 : f23 == 0xF2 ? 3 : has66 ? 1 : 0;
    int reg = 0, mem = 0, m = -1;
    if (i < avail) {
        m = p[i];
        reg = (m >> 3) & 7;
        mem = (m >> 6) != 3;
    }
    size_t idx = (((((size_t)(map * 4 + cls) * 2 + ((rex >> 3) & 1)) * 256 + op) * 8 + reg) * 2
                  + mem);
    int f = x86_flags[idx];
    if (!f) return 0;
    int imm = x86_imm[idx];
    i = operands(p, avail, i, f, m, mem, imm);
    if (!i) return 0;
    int direct = (f >> 5) & 1;
    if (direct && has67) return 0;
    *kind = (f >> 2) & 7;
    *target = 0;
    if (direct) {
        int64_t rel;
        if (imm == 1) rel = (int8_t)p[i - 1];
        else {
            int32_t r32;
            memcpy(&r32, p + i - 4, 4);
            rel = r32;
        }
        *target = ip + (uint64_t)i + (uint64_t)rel;
    }
    return i;
}

static int append_u64(PyObject *list, uint64_t v) {
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (o == NULL) return -1;
    int r = PyList_Append(list, o);
    Py_DECREF(o);
    return r;
}

/* decode(buf, start, ip, ips, ends, kinds, targets, flows) -> offset where it stopped
 * Appends a row per instruction of buf[start:] (buf's first byte is at address ip) to the
 * four lists, and the row number of each control transfer (kind != NEXT) to flows, up to the
 * end of buf or the first instruction left to iced-x86. */
static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    unsigned long long base;
    PyObject *ips, *ends, *kinds, *targets, *flows;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nKO!O!O!O!O!", &buf, &start, &base, &PyList_Type, &ips,
                          &PyList_Type, &ends, &PyList_Type, &kinds, &PyList_Type, &targets,
                          &PyList_Type, &flows))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len, off = start < 0 ? 0 : start;
    static PyObject *small[8];
    for (int k = 0; k < 8; k++)
        if (small[k] == NULL && (small[k] = PyLong_FromLong(k)) == NULL) goto fail;
    while (off < n) {
        int kind;
        uint64_t target;
        int len = one(p + off, n - off, base + (uint64_t)off, &kind, &target);
        if (len == 0) break;
        if (kind != 0 && append_u64(flows, (uint64_t)PyList_GET_SIZE(ips)) < 0) goto fail;
        if (append_u64(ips, base + (uint64_t)off) < 0 ||
            append_u64(ends, base + (uint64_t)off + (uint64_t)len) < 0 ||
            PyList_Append(kinds, small[kind]) < 0 || append_u64(targets, target) < 0)
            goto fail;
        off += len;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(off);
fail:
    PyBuffer_Release(&buf);
    return NULL;
}

/* -- Havlak's loop nesting forest (structure/havlak.py's find_loops, the same answer) ------ */

typedef struct {
    Py_ssize_t *a, n, cap;
} vec;

static int vpush(vec *v, Py_ssize_t x) {
    if (v->n == v->cap) {
        Py_ssize_t c = v->cap ? 2 * v->cap : 4;
        Py_ssize_t *p = PyMem_Realloc(v->a, (size_t)c * sizeof *p);
        if (p == NULL) return -1;
        v->a = p;
        v->cap = c;
    }
    v->a[v->n++] = x;
    return 0;
}

static Py_ssize_t uf_find(Py_ssize_t *uf, Py_ssize_t x) {
    Py_ssize_t root = x;
    while (uf[root] != root) root = uf[root];
    while (uf[x] != root) {
        Py_ssize_t nx = uf[x];
        uf[x] = root;
        x = nx;
    }
    return root;
}

static PyObject *int_list(const Py_ssize_t *a, Py_ssize_t n, const Py_ssize_t *map) {
    PyObject *l = PyList_New(n);
    if (l == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = PyLong_FromSsize_t(map ? map[a[k]] : a[k]);
        if (o == NULL) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, k, o);
    }
    return l;
}

/* loops(succ, entry) -> (loops, innermost): succ a list of successor lists; loops a list of
 * (header, parent, reducible, nodes, back_sources) tuples, inner loops first; innermost the
 * innermost loop of each node (-1: none or unreachable). Exactly find_loops's steps, on
 * arrays: nodes by DFS preorder number, union-find, a pool per header. */
static PyObject *loops(PyObject *self, PyObject *args) {
    PyObject *succ;
    Py_ssize_t entry;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &succ, &entry)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(succ), ne = 0;
    if (n == 0) return Py_BuildValue("([][])");
    if (entry < 0 || entry >= n) {
        PyErr_SetString(PyExc_ValueError, "entry outside the graph");
        return NULL;
    }
    PyObject *result = NULL, *out = NULL, *inn = NULL;
    Py_ssize_t *soff = NULL, *sdat = NULL, *ibuf = NULL, *poff = NULL, *pdat = NULL;
    vec *nonback = NULL, *lnodes = NULL, pool = {0}, work = {0};
    Py_ssize_t nloops = 0;
    for (Py_ssize_t v = 0; v < n; v++) {
        PyObject *l = PyList_GET_ITEM(succ, v);
        if (!PyList_Check(l)) {
            PyErr_SetString(PyExc_TypeError, "successors must be lists");
            return NULL;
        }
        ne += PyList_GET_SIZE(l);
    }
    soff = PyMem_Malloc((size_t)(n + 1) * sizeof *soff);
    sdat = PyMem_Malloc((size_t)(ne + 1) * sizeof *sdat);
    /* number, order, last, stack node, stack index, uf, loop_of_header, inner, mark, lparent,
     * lhdr, lred, lw (header preorder number of each loop) */
    ibuf = PyMem_Malloc((size_t)n * 13 * sizeof *ibuf);
    poff = PyMem_Calloc((size_t)n + 1, sizeof *poff);
    pdat = PyMem_Malloc((size_t)(ne + 1) * sizeof *pdat);
    nonback = PyMem_Calloc((size_t)n, sizeof *nonback);
    lnodes = PyMem_Calloc((size_t)n, sizeof *lnodes);
    if (!soff || !sdat || !ibuf || !poff || !pdat || !nonback || !lnodes) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *number = ibuf, *order = ibuf + n, *last = ibuf + 2 * n, *stv = ibuf + 3 * n,
               *sti = ibuf + 4 * n, *uf = ibuf + 5 * n, *lofh = ibuf + 6 * n,
               *inner = ibuf + 7 * n, *mark = ibuf + 8 * n, *lparent = ibuf + 9 * n,
               *lhdr = ibuf + 10 * n, *lred = ibuf + 11 * n, *lw = ibuf + 12 * n;
    Py_ssize_t k = 0;
    for (Py_ssize_t v = 0; v < n; v++) {
        PyObject *l = PyList_GET_ITEM(succ, v);
        soff[v] = k;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(l); j++) {
            Py_ssize_t w = PyLong_AsSsize_t(PyList_GET_ITEM(l, j));
            if (w == -1 && PyErr_Occurred()) goto done;
            if (w < 0 || w >= n) {
                PyErr_SetString(PyExc_ValueError, "successor outside the graph");
                goto done;
            }
            sdat[k++] = w;
        }
    }
    soff[n] = k;
    for (Py_ssize_t v = 0; v < n; v++) {
        number[v] = -1;
        lofh[v] = -1;
        inner[v] = -1;
        mark[v] = -1;
    }
    /* iterative DFS: preorder numbers and the last preorder number of each subtree */
    Py_ssize_t m = 1, sp = 1;
    number[entry] = 0;
    order[0] = entry;
    stv[0] = entry;
    sti[0] = 0;
    while (sp > 0) {
        Py_ssize_t v = stv[sp - 1], i = sti[sp - 1];
        if (i < soff[v + 1] - soff[v]) {
            sti[sp - 1] = i + 1;
            Py_ssize_t w = sdat[soff[v] + i];
            if (number[w] == -1) {
                number[w] = m;
                order[m++] = w;
                stv[sp] = w;
                sti[sp++] = 0;
            }
        } else {
            sp--;
            last[number[v]] = m - 1;
        }
    }
    /* predecessors by preorder number, in the order find_loops appends them */
    for (Py_ssize_t pn = 0; pn < m; pn++) {
        Py_ssize_t v = order[pn];
        for (Py_ssize_t j = soff[v]; j < soff[v + 1]; j++) poff[number[sdat[j]] + 1]++;
    }
    for (Py_ssize_t w = 0; w < m; w++) poff[w + 1] += poff[w];
    for (Py_ssize_t w = 0; w < m; w++) sti[w] = poff[w];
    for (Py_ssize_t pn = 0; pn < m; pn++) {
        Py_ssize_t v = order[pn];
        for (Py_ssize_t j = soff[v]; j < soff[v + 1]; j++) pdat[sti[number[sdat[j]]]++] = pn;
    }
    /* preds split: back edges stay in pdat (compacted to the front of each row: sti[w] is
     * their end), the others go to nonback[w] */
    for (Py_ssize_t w = 0; w < m; w++) {
        Py_ssize_t e = poff[w];
        for (Py_ssize_t j = poff[w]; j < poff[w + 1]; j++) {
            Py_ssize_t v = pdat[j];
            if (w <= v && v <= last[w])
                pdat[e++] = v;
            else if (vpush(&nonback[w], v) < 0) {
                PyErr_NoMemory();
                goto done;
            }
        }
        sti[w] = e;
        uf[w] = w;
    }
    for (Py_ssize_t w = m - 1; w >= 0; w--) {
        int self_loop = 0;
        pool.n = 0;
        for (Py_ssize_t j = poff[w]; j < sti[w]; j++) {
            Py_ssize_t v = pdat[j];
            if (v != w) {
                Py_ssize_t r = uf_find(uf, v);
                if (mark[r] != w) {
                    mark[r] = w;
                    if (vpush(&pool, r) < 0) goto nomem;
                }
            } else {
                self_loop = 1;
            }
        }
        if (pool.n == 0 && !self_loop) continue;
        int reducible = 1;
        Py_ssize_t lwv = last[w];
        work.n = 0;
        for (Py_ssize_t j = 0; j < pool.n; j++)
            if (vpush(&work, pool.a[j]) < 0) goto nomem;
        while (work.n > 0) {
            Py_ssize_t x = work.a[--work.n];
            for (Py_ssize_t j = 0; j < nonback[x].n; j++) {
                Py_ssize_t yd = uf_find(uf, nonback[x].a[j]);
                if (!(w <= yd && yd <= lwv)) {
                    reducible = 0;
                    if (vpush(&nonback[w], yd) < 0) goto nomem;
                } else if (yd != w && mark[yd] != w) {
                    mark[yd] = w;
                    if (vpush(&pool, yd) < 0 || vpush(&work, yd) < 0) goto nomem;
                }
            }
        }
        Py_ssize_t li = nloops++;
        lhdr[li] = order[w];
        lparent[li] = -1;
        lred[li] = reducible;
        lw[li] = w;
        if (vpush(&lnodes[li], w) < 0) goto nomem;
        lofh[w] = li;
        inner[w] = li;
        for (Py_ssize_t j = 0; j < pool.n; j++) {
            Py_ssize_t x = pool.a[j];
            uf[x] = w;
            Py_ssize_t sub = lofh[x];
            if (sub >= 0) {
                if (lparent[sub] < 0) lparent[sub] = li;
            } else {
                if (vpush(&lnodes[li], x) < 0) goto nomem;
                inner[x] = li;
            }
        }
    }
    out = PyList_New(nloops);
    inn = PyList_New(n);
    if (out == NULL || inn == NULL) goto done;
    for (Py_ssize_t li = 0; li < nloops; li++) {
        Py_ssize_t w = lw[li];
        PyObject *nodes = int_list(lnodes[li].a, lnodes[li].n, order);
        PyObject *back = nodes ? int_list(pdat + poff[w], sti[w] - poff[w], order) : NULL;
        PyObject *t = back ? Py_BuildValue("nnONN", lhdr[li], lparent[li],
                                           lred[li] ? Py_True : Py_False, nodes, back)
                           : NULL;
        if (t == NULL) {
            if (back == NULL) Py_XDECREF(nodes);
            goto done;
        }
        PyList_SET_ITEM(out, li, t);
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        Py_ssize_t pn = number[v];
        PyObject *o = PyLong_FromSsize_t(pn >= 0 ? inner[pn] : -1);
        if (o == NULL) goto done;
        PyList_SET_ITEM(inn, v, o);
    }
    result = PyTuple_Pack(2, out, inn);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(out);
    Py_XDECREF(inn);
    if (nonback)
        for (Py_ssize_t v = 0; v < n; v++) PyMem_Free(nonback[v].a);
    if (lnodes)
        for (Py_ssize_t v = 0; v < n; v++) PyMem_Free(lnodes[v].a);
    PyMem_Free(nonback);
    PyMem_Free(lnodes);
    PyMem_Free(pool.a);
    PyMem_Free(work.a);
    PyMem_Free(soff);
    PyMem_Free(sdat);
    PyMem_Free(ibuf);
    PyMem_Free(poff);
    PyMem_Free(pdat);
    return result;
}

/* -- basic blocks and successors (structure/cfg.py's build_cfg, the same answer) ---------- */

enum { K_NEXT, K_JUMP, K_COND, K_INDIRECT, K_RETURN, K_CALL, K_ICALL, K_STOP };

typedef struct {
    uint64_t *a;
    Py_ssize_t n, cap;
} u64vec;

static int upush(u64vec *v, uint64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t c = v->cap ? 2 * v->cap : 16;
        uint64_t *p = PyMem_Realloc(v->a, (size_t)c * sizeof *p);
        if (p == NULL) return -1;
        v->a = p;
        v->cap = c;
    }
    v->a[v->n++] = x;
    return 0;
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* item k of a list of ints as uint64; sets *err on failure */
static uint64_t u64_at(PyObject *list, Py_ssize_t k, int *err) {
    uint64_t v = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(list, k));
    if (v == (uint64_t)-1 && PyErr_Occurred()) *err = 1;
    return v;
}

/* first index of a sorted list of ints whose value is >= x */
static Py_ssize_t lower_bound(PyObject *list, Py_ssize_t n, uint64_t x, int *err) {
    Py_ssize_t a = 0, b = n;
    while (a < b) {
        Py_ssize_t m = a + (b - a) / 2;
        if (u64_at(list, m, err) < x)
            a = m + 1;
        else
            b = m;
        if (*err) return -1;
    }
    return a;
}

/* the block starting at x (starts sorted), or -1 */
static Py_ssize_t block_at(const uint64_t *starts, Py_ssize_t nb, uint64_t x) {
    Py_ssize_t a = 0, b = nb;
    while (a < b) {
        Py_ssize_t m = a + (b - a) / 2;
        if (starts[m] < x)
            a = m + 1;
        else
            b = m;
    }
    return a < nb && starts[a] == x ? a : -1;
}

/* cfg(ips, ends, kinds, targets, flow, tables, lo, hi, no_return, memo)
 *   -> (starts, ends, first, last, succ) */
static PyObject *cfg(PyObject *self, PyObject *args) {
    PyObject *ips, *ends, *kinds, *targets, *flow, *tables, *noret, *memo;
    unsigned long long lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!KKOO", &PyList_Type, &ips, &PyList_Type, &ends,
                          &PyList_Type, &kinds, &PyList_Type, &targets, &PyList_Type, &flow,
                          &PyDict_Type, &tables, &lo, &hi, &noret, &memo))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ips);
    if (PyList_GET_SIZE(ends) != n || PyList_GET_SIZE(kinds) != n ||
        PyList_GET_SIZE(targets) != n) {
        PyErr_SetString(PyExc_ValueError, "instruction columns of different lengths");
        return NULL;
    }
    if (n == 0) return Py_BuildValue("([][][][][])");
    if (memo != Py_None && !PyDict_Check(memo)) {
        PyErr_SetString(PyExc_TypeError, "memo must be a dict or None");
        return NULL;
    }
    int err = 0;
    PyObject *result = NULL, *o_starts = NULL, *o_ends = NULL, *o_first = NULL,
             *o_last = NULL, *o_succ = NULL;
    u64vec lead = {0}, starts = {0}, first = {0};
    unsigned char *stop = PyMem_Calloc((size_t)n, 1);
    if (stop == NULL) return PyErr_NoMemory();
    if (upush(&lead, u64_at(ips, 0, &err)) < 0) goto nomem;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(flow); j++) {
        PyObject *fi = PyList_GET_ITEM(flow, j);
        Py_ssize_t i = PyLong_AsSsize_t(fi);
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_ValueError, "flow row outside the instructions");
            goto done;
        }
        long k = PyLong_AsLong(PyList_GET_ITEM(kinds, i));
        if (k == -1 && PyErr_Occurred()) goto done;
        if (k == K_JUMP || k == K_COND) {
            uint64_t t = u64_at(targets, i, &err);
            if (err) goto done;
            if (lo <= t && t < hi && upush(&lead, t) < 0) goto nomem;
        } else if (k == K_INDIRECT) {
            PyObject *tl = PyDict_GetItemWithError(tables, fi);
            if (tl == NULL && PyErr_Occurred()) goto done;
            if (tl != NULL) {
                PyObject *seq = PySequence_Fast(tl, "jump table targets must be a sequence");
                if (seq == NULL) goto done;
                for (Py_ssize_t q = 0; q < PySequence_Fast_GET_SIZE(seq); q++) {
                    uint64_t t = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, q));
                    if (t == (uint64_t)-1 && PyErr_Occurred()) {
                        Py_DECREF(seq);
                        goto done;
                    }
                    if (upush(&lead, t) < 0) {
                        Py_DECREF(seq);
                        goto nomem;
                    }
                }
                Py_DECREF(seq);
            }
        } else if (k == K_CALL) {
            PyObject *to = PyList_GET_ITEM(targets, i);
            int never = 0;
            if (noret != Py_None && PyObject_IsTrue(to)) {
                PyObject *got = memo != Py_None ? PyDict_GetItemWithError(memo, to) : NULL;
                if (got == NULL && PyErr_Occurred()) goto done;
                if (got != NULL) {
                    never = PyObject_IsTrue(got);
                } else {
                    PyObject *r = PyObject_CallOneArg(noret, to);
                    if (r == NULL) goto done;
                    never = PyObject_IsTrue(r);
                    Py_DECREF(r);
                }
                if (never < 0) goto done;
            }
            if (!never) continue;
            stop[i] = 1;
        } else if (k == K_ICALL) {
            continue;
        }
        if (i + 1 < n && upush(&lead, u64_at(ips, i + 1, &err)) < 0) goto nomem;
        if (err) goto done;
    }
    if (err) goto done;
    qsort(lead.a, (size_t)lead.n, sizeof *lead.a, cmp_u64);
    for (Py_ssize_t q = 0; q < lead.n; q++) {
        uint64_t a = lead.a[q];
        if (q > 0 && a == lead.a[q - 1]) continue;
        Py_ssize_t j = lower_bound(ips, n, a, &err);
        if (err) goto done;
        if (j < n && u64_at(ips, j, &err) == a) {
            if (upush(&starts, a) < 0 || upush(&first, (uint64_t)j) < 0) goto nomem;
        }
        if (err) goto done;
    }
    Py_ssize_t nb = starts.n;
    o_starts = PyList_New(nb);
    o_ends = PyList_New(nb);
    o_first = PyList_New(nb);
    o_last = PyList_New(nb);
    o_succ = PyList_New(nb);
    if (!o_starts || !o_ends || !o_first || !o_last || !o_succ) goto done;
    for (Py_ssize_t b = 0; b < nb; b++) {
        Py_ssize_t i = (b + 1 < nb ? (Py_ssize_t)first.a[b + 1] : n) - 1;
        PyObject *e = PyList_GET_ITEM(ends, i);
        uint64_t end = u64_at(ends, i, &err);
        if (err) goto done;
        long k = PyLong_AsLong(PyList_GET_ITEM(kinds, i));
        if (k == -1 && PyErr_Occurred()) goto done;
        Py_ssize_t fall = b + 1 < nb && end == starts.a[b + 1] ? b + 1 : -1;
        Py_ssize_t s[2], ns = 0;
        PyObject *sl = NULL;
        if (k == K_NEXT || k == K_CALL || k == K_ICALL) {
            if (!stop[i] && fall >= 0) s[ns++] = fall;
        } else if (k == K_COND || k == K_JUMP) {
            if (k == K_COND && fall >= 0) s[ns++] = fall;
            uint64_t t = u64_at(targets, i, &err);
            if (err) goto done;
            Py_ssize_t tb = block_at(starts.a, nb, t);
            if (tb >= 0 && !(ns == 1 && s[0] == tb)) s[ns++] = tb;
        } else if (k == K_INDIRECT) {
            PyObject *key = PyLong_FromSsize_t(i);
            if (key == NULL) goto done;
            PyObject *tl = PyDict_GetItemWithError(tables, key);
            Py_DECREF(key);
            if (tl == NULL && PyErr_Occurred()) goto done;
            sl = PyList_New(0);
            if (sl == NULL) goto done;
            if (tl != NULL) {
                PyObject *seq = PySequence_Fast(tl, "jump table targets must be a sequence");
                if (seq == NULL) {
                    Py_DECREF(sl);
                    goto done;
                }
                for (Py_ssize_t q = 0; q < PySequence_Fast_GET_SIZE(seq); q++) {
                    uint64_t t = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, q));
                    if (t == (uint64_t)-1 && PyErr_Occurred()) {
                        Py_DECREF(seq);
                        Py_DECREF(sl);
                        goto done;
                    }
                    Py_ssize_t tb = block_at(starts.a, nb, t);
                    if (tb < 0) continue;
                    PyObject *tbo = PyLong_FromSsize_t(tb);
                    int has = tbo ? PySequence_Contains(sl, tbo) : -1;
                    if (has < 0 || (!has && PyList_Append(sl, tbo) < 0)) {
                        Py_XDECREF(tbo);
                        Py_DECREF(seq);
                        Py_DECREF(sl);
                        goto done;
                    }
                    Py_DECREF(tbo);
                }
                Py_DECREF(seq);
            }
        }
        if (sl == NULL) {
            sl = PyList_New(ns);
            if (sl == NULL) goto done;
            for (Py_ssize_t q = 0; q < ns; q++) {
                PyObject *x = PyLong_FromSsize_t(s[q]);
                if (x == NULL) {
                    Py_DECREF(sl);
                    goto done;
                }
                PyList_SET_ITEM(sl, q, x);
            }
        }
        PyList_SET_ITEM(o_succ, b, sl);
        Py_INCREF(e);
        PyList_SET_ITEM(o_ends, b, e);
        PyObject *x1 = PyLong_FromUnsignedLongLong(starts.a[b]);
        PyObject *x2 = PyLong_FromSsize_t((Py_ssize_t)first.a[b]);
        PyObject *x3 = PyLong_FromSsize_t(i);
        if (!x1 || !x2 || !x3) {
            Py_XDECREF(x1);
            Py_XDECREF(x2);
            Py_XDECREF(x3);
            goto done;
        }
        PyList_SET_ITEM(o_starts, b, x1);
        PyList_SET_ITEM(o_first, b, x2);
        PyList_SET_ITEM(o_last, b, x3);
    }
    result = PyTuple_Pack(5, o_starts, o_ends, o_first, o_last, o_succ);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(o_starts);
    Py_XDECREF(o_ends);
    Py_XDECREF(o_first);
    Py_XDECREF(o_last);
    Py_XDECREF(o_succ);
    PyMem_Free(stop);
    PyMem_Free(lead.a);
    PyMem_Free(starts.a);
    PyMem_Free(first.a);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(buf, start, ip, ips, ends, kinds, targets, flows) -> offset: append address, end, "
     "flow kind and direct target of each instruction of buf[start:] (buf[0] at address ip) "
     "to the lists and the row of each control transfer to flows, stopping at the end or at "
     "the first instruction to leave to iced-x86."},
    {"cfg", cfg, METH_VARARGS,
     "cfg(ips, ends, kinds, targets, flow, tables, lo, hi, no_return, memo) -> (starts, ends, "
     "first, last, succ): basic blocks and successors of one procedure's decoded rows, as "
     "structure/cfg.py's build_cfg gives them (no_return: a callable or None; memo: a dict "
     "of its answers by target, or None)."},
    {"loops", loops, METH_VARARGS,
     "loops(succ, entry) -> (loops, innermost): Havlak's loop nesting forest of the graph of "
     "successor lists, as structure/havlak.py's find_loops gives it (loops as (header, "
     "parent, reducible, nodes, back_sources) tuples)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_callpath_decode",
                                    "x86-64 instruction lengths and control flow for "
                                    "callpath struct (see structure/cfg.py).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__callpath_decode(void) {
    if (expand(x86_flags, X86_FLAGS_N, x86_flags_rle, sizeof x86_flags_rle) ||
        expand(x86_imm, X86_IMM_N, x86_imm_rle, sizeof x86_imm_rle) ||
        expand(vex_flags, VEX_FLAGS_N, vex_flags_rle, sizeof vex_flags_rle) ||
        expand(vex_imm, VEX_IMM_N, vex_imm_rle, sizeof vex_imm_rle)) {
        PyErr_SetString(PyExc_ImportError, "_callpath_decode: corrupt opcode tables");
        return NULL;
    }
    return PyModule_Create(&module);
}
