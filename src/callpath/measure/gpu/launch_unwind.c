/* The native return addresses of a launch, fast: included by cupti_inject.c.
 *
 * glibc's backtrace() (libgcc's CFI unwinder) finds and interprets each frame's FDE anew at
 * every call: about 0.2 us a frame here, 20-30 us for the 100-300 frames of a PyTorch launch
 * from Python, and the autograd engine's launches always need it. A launch is made from the
 * same few hundred call sites over and over, so each return address's rule (how to find the
 * caller's frame: the CFA as rsp or rbp plus an offset, the return address at CFA-8, rbp kept
 * or saved at CFA-8k) is computed once, from the same FDE libgcc would use
 * (_Unwind_Find_FDE), and kept in a table that threads share without a lock (see
 * rule_table). An address whose rule this does not cover (a CFA expression, a signal frame,
 * the return address or rbp kept elsewhere than the stack) hands the whole walk to
 * backtrace(), so the result is never worse than before; every read of the stack stays
 * between the frame's sp and the thread's stack top. (A library unloaded and another loaded at
 * its addresses would keep the old one's rules: the bounds catch most such walks.) x86-64
 * only; elsewhere backtrace() as before. */
#if defined(__x86_64__) && defined(__linux__)
#include <stdint.h>
#include <string.h>

struct cp_eh_bases { void *tbase, *dbase, *func; };
static const void *(*find_fde)(void *pc, struct cp_eh_bases *bases);
static int fast_unwind_ok = -1; /* -1 not resolved yet, 0 no, 1 yes */

#define RULE_SLOTS (1 << 14)
/* an entry: the address (bit 63 set: in use), then the rule in the low 32 bits of the second
 * word with the address's low 32 bits above it, so that a reader never takes one address's
 * rule for another's while a thread rewrites the entry. A rule: bit 0 the CFA's register
 * (0 rsp, 1 rbp), bits 1-21 the CFA's offset / 8, bits 22-26 where rbp is saved (0 kept, k at
 * CFA - 8k); RULE_FALLBACK: not covered (backtrace()); RULE_END: the outermost frame. */
static struct { uint64_t key, rule; } rule_table[RULE_SLOTS];
#define RULE_FALLBACK 0xffffffffu
#define RULE_END 0xfffffffeu

static uint64_t uleb(const uint8_t **p, const uint8_t *end) {
    uint64_t v = 0;
    int shift = 0;
    while (*p < end) {
        uint8_t b = *(*p)++;
        if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) break;
    }
    return v;
}

static int64_t sleb(const uint8_t **p, const uint8_t *end) {
    int64_t v = 0;
    int shift = 0;
    uint8_t b = 0;
    while (*p < end) {
        b = *(*p)++;
        if (shift < 64) v |= (int64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) break;
    }
    if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
    return v;
}

/* bytes of a pointer of DWARF encoding enc (0 where variable or unknown) */
static int enc_size(uint8_t enc) {
    switch (enc & 0x0f) {
    case 0x00: case 0x04: case 0x0c: return 8;
    case 0x02: case 0x0a: return 2;
    case 0x03: case 0x0b: return 4;
    default: return 0;
    }
}

struct cfa_row { int reg; int64_t off; int rbp_k; int ra_ok; int end; };

/* register reg saved at CFA + off: the two the walk follows (rbp: k = -off / 8, -1 where it
 * cannot say; the return address: only at CFA - 8) */
static void saved_at(struct cfa_row *row, uint64_t reg, int64_t off) {
    if (reg == 6) row->rbp_k = off < 0 && off % 8 == 0 && -off / 8 < 32 ? (int)(-off / 8) : -1;
    else if (reg == 16) row->ra_ok = off == -8;
}

/* register reg back to its rule at the FDE's start (init: the CIE's row) */
static void restored(struct cfa_row *row, uint64_t reg, const struct cfa_row *init) {
    if (reg == 6) row->rbp_k = init ? init->rbp_k : 0;
    else if (reg == 16) row->ra_ok = init ? init->ra_ok : 1;
}

/* Run CFA instructions [p, end) from loc until the row holding target; 0 where an
 * instruction is not covered. */
static int run_cfa(const uint8_t *p, const uint8_t *end, uint64_t *loc, uint64_t target,
                   uint64_t code_align, int64_t data_align, struct cfa_row *row,
                   const struct cfa_row *init) {
    struct cfa_row stack[8];
    int depth = 0;
    while (p < end) {
        uint8_t op = *p++;
        uint64_t delta = 0;
        int advance = 0;
        if ((op & 0xc0) == 0x40) { delta = op & 0x3f; advance = 1; }
        else if ((op & 0xc0) == 0x80) {
            uint64_t reg = op & 0x3f;
            saved_at(row, reg, (int64_t)uleb(&p, end) * data_align);
        } else if ((op & 0xc0) == 0xc0) restored(row, op & 0x3f, init);
        else switch (op) {
        case 0x00: break;                                        /* nop */
        case 0x02: delta = p < end ? *p : 0; p += 1; advance = 1; break;
        case 0x03: if (end - p < 2) return 0; delta = (uint64_t)p[0] | (uint64_t)p[1] << 8;
                   p += 2; advance = 1; break;
        case 0x04: if (end - p < 4) return 0; { uint32_t d; memcpy(&d, p, 4); delta = d; }
                   p += 4; advance = 1; break;
        case 0x05: {                                             /* offset_extended */
            uint64_t reg = uleb(&p, end);
            saved_at(row, reg, (int64_t)uleb(&p, end) * data_align);
            break;
        }
        case 0x06: restored(row, uleb(&p, end), init); break;    /* restore_extended */
        case 0x07: {                                             /* undefined */
            uint64_t reg = uleb(&p, end);
            if (reg == 16) row->end = 1;
            else if (reg == 6) row->rbp_k = 0;
            break;
        }
        case 0x08: {                                             /* same_value */
            uint64_t reg = uleb(&p, end);
            if (reg == 6) row->rbp_k = 0;
            else if (reg == 16) return 0;
            break;
        }
        case 0x09: {                                             /* register */
            uint64_t reg = uleb(&p, end);
            (void)uleb(&p, end);
            if (reg == 6 || reg == 16) return 0;
            break;
        }
        case 0x0a: if (depth == 8) return 0; stack[depth++] = *row; break;
        case 0x0b: if (depth == 0) return 0; *row = stack[--depth]; break;
        case 0x10: case 0x16: {                   /* expression, val_expression: not ours */
            uint64_t reg = uleb(&p, end);
            uint64_t n = uleb(&p, end);
            if (reg == 6 || reg == 7 || reg == 16 || n > (uint64_t)(end - p)) return 0;
            p += n;
            break;
        }
        case 0x0c: row->reg = (int)uleb(&p, end); row->off = (int64_t)uleb(&p, end); break;
        case 0x0d: row->reg = (int)uleb(&p, end); break;
        case 0x0e: row->off = (int64_t)uleb(&p, end); break;
        case 0x12: row->reg = (int)uleb(&p, end); row->off = sleb(&p, end) * data_align; break;
        case 0x13: row->off = sleb(&p, end) * data_align; break;
        case 0x11: {                                             /* offset_extended_sf */
            uint64_t reg = uleb(&p, end);
            saved_at(row, reg, sleb(&p, end) * data_align);
            break;
        }
        case 0x2e: (void)uleb(&p, end); break;                   /* GNU_args_size */
        default: return 0; /* expressions, set_loc, val_offset ...: not covered */
        }
        if (advance) {
            *loc += delta * code_align;
            if (*loc > target) return 1;
        }
    }
    return 1;
}

/* The rule of the frame whose return address (or, first, current address) is pc. */
static uint32_t compute_rule(uint64_t pc) {
    struct cp_eh_bases bases;
    const uint8_t *fde = find_fde((void *)(uintptr_t)(pc - 1), &bases);
    if (fde == NULL) return RULE_FALLBACK;
    uint32_t len32;
    memcpy(&len32, fde, 4);
    if (len32 == 0 || len32 == 0xffffffffu) return RULE_FALLBACK;
    const uint8_t *fend = fde + 4 + len32, *p = fde + 4;
    uint32_t cie_off;
    memcpy(&cie_off, p, 4);
    const uint8_t *cie = p - cie_off;
    p += 4;
    uint32_t clen;
    memcpy(&clen, cie, 4);
    if (clen == 0 || clen == 0xffffffffu) return RULE_FALLBACK;
    const uint8_t *cend = cie + 4 + clen, *c = cie + 8;
    uint8_t version = *c++;
    if (version != 1 && version != 3) return RULE_FALLBACK; /* .eh_frame's versions */
    const char *aug = (const char *)c;
    size_t auglen = strnlen(aug, (size_t)(cend - c));
    c += auglen + 1;
    if (aug[0] == 'e' && aug[1] == 'h') return RULE_FALLBACK;
    uint64_t code_align = uleb(&c, cend);
    int64_t data_align = sleb(&c, cend);
    uint64_t ra_reg = version == 1 ? *c++ : uleb(&c, cend);
    if (ra_reg != 16) return RULE_FALLBACK;
    uint8_t fde_enc = 0;
    const uint8_t *cie_insns = c;
    if (aug[0] == 'z') {
        uint64_t n = uleb(&c, cend);
        cie_insns = c + n;
        for (const char *a = aug + 1; *a; a++) {
            if (*a == 'R') fde_enc = *c++;
            else if (*a == 'L') c++;
            else if (*a == 'P') {
                uint8_t penc = *c++;
                int sz = enc_size(penc);
                if (sz == 0 || (penc & 0x70) == 0x50) return RULE_FALLBACK;
                c += sz;
            } else if (*a == 'S') return RULE_FALLBACK; /* a signal frame */
            else if (*a != 'B') return RULE_FALLBACK;
        }
    }
    int sz = enc_size(fde_enc);
    if (sz == 0 || (fde_enc & 0x70) == 0x50) return RULE_FALLBACK; /* variable or aligned */
    p += 2 * sz; /* pc_begin (bases.func holds it decoded), pc_range */
    if (aug[0] == 'z') { uint64_t n = uleb(&p, fend); p += n; }
    uint64_t loc = (uint64_t)(uintptr_t)bases.func, target = pc - 1;
    struct cfa_row row = {7, 8, 0, 1, 0}, init;
    uint64_t cie_loc = loc;
    if (!run_cfa(cie_insns, cend, &cie_loc, UINT64_MAX, code_align, data_align, &row, NULL))
        return RULE_FALLBACK;
    init = row;
    if (!run_cfa(p, fend, &loc, target, code_align, data_align, &row, &init))
        return RULE_FALLBACK;
    if (row.end) return RULE_END;
    if (!row.ra_ok || row.rbp_k < 0 || (row.reg != 7 && row.reg != 6) || row.off < 8 ||
        row.off % 8 || row.off / 8 >= (1 << 21))
        return RULE_FALLBACK;
    return (row.reg == 6 ? 1u : 0u) | (uint32_t)(row.off / 8) << 1 | (uint32_t)row.rbp_k << 22;
}

static uint32_t rule_of(uint64_t pc) {
    uint64_t key = pc | (1ull << 63), tag = (pc & 0xffffffffull) << 32;
    uint32_t h = (uint32_t)((pc * 0x9E3779B97F4A7C15ull) >> 50), at = h;
    int free_at = -1;
    for (int probe = 0; probe < 4; probe++) {
        uint32_t i = (h + (uint32_t)probe) & (RULE_SLOTS - 1);
        uint64_t k = __atomic_load_n(&rule_table[i].key, __ATOMIC_ACQUIRE);
        if (k == key) {
            uint64_t w = __atomic_load_n(&rule_table[i].rule, __ATOMIC_ACQUIRE);
            if ((w & 0xffffffff00000000ull) == tag) return (uint32_t)w;
        }
        if (k == 0) { free_at = (int)i; break; }
    }
    uint32_t rule = compute_rule(pc);
    if (free_at >= 0) at = (uint32_t)free_at;
    at &= RULE_SLOTS - 1;
    __atomic_store_n(&rule_table[at].rule, tag | rule, __ATOMIC_RELEASE);
    __atomic_store_n(&rule_table[at].key, key, __ATOMIC_RELEASE);
    return rule;
}

/* the thread's stack, [stack_lo, stack_top): a walk starts on it or not at all (a fiber's
 * or a signal stack's frames go to backtrace()), so every address it reads is mapped */
static __thread uintptr_t stack_lo, stack_top;
static __thread int walk_fell_back;   /* the thread's last walk handed over to backtrace() */
static unsigned long long n_walks_fell_back;

static int fall_back(void **pcs, int max) {
    __atomic_add_fetch(&n_walks_fell_back, 1, __ATOMIC_RELAXED);
    return backtrace(pcs, max);
}

static void find_stack_top(uintptr_t sp) {
    pthread_attr_t attr;
    void *lo = NULL;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        if (pthread_attr_getstack(&attr, &lo, &size) != 0) size = 0;
        pthread_attr_destroy(&attr);
    }
    uintptr_t top = (uintptr_t)lo + size;
    stack_top = size && sp >= (uintptr_t)lo && sp < top ? top : 1;
    stack_lo = (uintptr_t)lo;
}

/* CALLPATH_GPU_UNWIND=backtrace: backtrace() for every launch, as before this walk */
static void resolve_fast_unwind(void) {
    const char *how = getenv("CALLPATH_GPU_UNWIND");
    void *h = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL);
    *(void **)(&find_fde) = h ? dlsym(h, "_Unwind_Find_FDE") : NULL;
    fast_unwind_ok = find_fde != NULL && !(how && strcmp(how, "backtrace") == 0);
}

/* The return addresses of the calling thread's frames into pcs, innermost first (its
 * caller's return address first, as backtrace() gives them); backtrace() where a frame is
 * not covered. */
__attribute__((noinline, optimize("no-omit-frame-pointer")))
static int native_frames(void **pcs, int max) {
    if (fast_unwind_ok < 0) resolve_fast_unwind();
    uintptr_t *fp = __builtin_frame_address(0);
    uint64_t pc = (uint64_t)(uintptr_t)__builtin_return_address(0);
    uintptr_t sp = (uintptr_t)fp + 16, rbp = fp[0];
    walk_fell_back = 1;
    if (!fast_unwind_ok) return backtrace(pcs, max);
    if (stack_top == 0) find_stack_top(sp);
    if (stack_top == 1 || sp < stack_lo || sp >= stack_top) return fall_back(pcs, max);
    int n = 0;
    while (n < max && pc != 0) {
        pcs[n++] = (void *)(uintptr_t)pc;
        uint32_t rule = rule_of(pc);
        if (rule == RULE_END) break;
        if (rule == RULE_FALLBACK) return fall_back(pcs, max);
        uintptr_t cfa = ((rule & 1) ? rbp : sp) + (uintptr_t)((rule >> 1) & 0x1fffff) * 8;
        int k = (int)((rule >> 22) & 0x1f);
        /* the frame's slots (return address, saved rbp) lie between its sp and its CFA */
        if (cfa <= sp || cfa > stack_top || cfa - 8 * (uintptr_t)(k > 1 ? k : 1) < sp)
            return fall_back(pcs, max);
        if (k) rbp = *(uintptr_t *)(cfa - 8 * (uintptr_t)k);
        pc = *(uint64_t *)(cfa - 8);
        sp = cfa;
    }
    walk_fell_back = 0;
    return n;
}
#else
static __thread int walk_fell_back = 1;
static unsigned long long n_walks_fell_back;
static void resolve_fast_unwind(void) {}
static int native_frames(void **pcs, int max) { return backtrace(pcs, max); }
#endif
