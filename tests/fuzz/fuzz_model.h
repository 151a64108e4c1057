/* Shared engine of the hakmem fuzz targets (fuzz_api.c, fuzz_badptr.c).
 *
 * A fuzz input is a program: a stream of operations on a table of slots,
 * decoded so that every byte string is a valid program (reads past the end
 * give zeros and the program ends). The program runs against the hak_ entry
 * points (the library is built with -DHAK_NO_OVERRIDE, so libFuzzer, ASan and
 * this file keep libc's malloc) and a shadow model checks every result:
 *
 *   - every live block keeps the pattern written over its whole usable size
 *     (the touched block fully after each step, the first and last bytes of
 *     every other live block after each step, all of them fully at the end);
 *   - calloc memory is zero; realloc keeps the old prefix;
 *   - alignment (16 always, more when asked for), malloc_usable_size >= the
 *     request and stable while the block lives;
 *   - no two live blocks overlap (usable ranges);
 *   - impossible requests fail with glibc's errno (ENOMEM, EINVAL), and with
 *     OS calls failing on purpose (os_fault_arm, core/box/os.h) a call may
 *     only fail as NULL + ENOMEM (realloc: old block intact), and only when a
 *     failure was injected during that call;
 *   - free, free_sized and free_aligned_sized leave errno alone.
 *
 * A second thread (the worker) runs operations synchronously (a mailbox and
 * a condition variable), so runs are deterministic: it frees, reallocates or
 * allocates slots, and exits; the next worker operation starts a new thread.
 *
 * On a violation the engine prints what went wrong and the last operations
 * and calls abort(): libFuzzer records the input. */
#ifndef HAK_FUZZ_MODEL_H
#define HAK_FUZZ_MODEL_H

#include "hakmem.h"

/* out/fuzz/libhakmem.a is built with -DHAK_FAULT_INJECT; the target's own
 * compile line does not say so. */
#ifndef HAK_FAULT_INJECT
#define HAK_FAULT_INJECT 1
#endif
#include "box/os.h"
#include "box/rmap.h"
#include "large/large.h"
#include "sizeclass.h"
#include "superslab/ss.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FZ_UNUSED __attribute__((unused))
/* Pattern loops: no ASan checks (hakmem's memory is not poisoned anyway) and
 * no coverage feedback (comparisons of pattern words are no signal). */
#define FZ_NOSAN __attribute__((no_sanitize("address", "undefined", "coverage")))

#define FZ_KiB  ((size_t)1024)
#define FZ_MiB  (FZ_KiB * 1024)
#define FZ_PAGE ((size_t)4096)

/* Requests up to this are expected to succeed (unless a fault was injected
 * during the call); bigger ones up to PTRDIFF_MAX may succeed or fail with
 * ENOMEM (depends on the machine's overcommit policy). */
#define FZ_NORMAL_MAX (64 * FZ_MiB)
/* Alignments up to this are expected to succeed. */
#define FZ_ALIGN_OK_MAX ((size_t)1 << 28)
/* errno planted before calls that must leave it alone. */
#define FZ_ERRNO_MARK 4242

#define FZ_MAX_SLOTS 64

/* Checks named in FUZZ_KNOWN (comma-separated) are skipped: a way to fuzz on
 * past a known, unfixed failure. Names: free-errno. */
static FZ_UNUSED bool fz_known(const char *name) {
    static const char *known;
    static bool read;
    if (!read) {
        known = getenv("FUZZ_KNOWN");
        read = true;
    }
    if (known == NULL) return false;
    size_t n = strlen(name);
    for (const char *k = known; (k = strstr(k, name)) != NULL; k += n)
        if ((k == known || k[-1] == ',') && (k[n] == '\0' || k[n] == ',')) return true;
    return false;
}

/* ---- input ---------------------------------------------------------------- */

struct fz_in {
    const uint8_t *d;
    size_t n, i;
};

static inline bool fz_more(const struct fz_in *in) {
    return in->i < in->n;
}
static inline uint8_t fz_u8(struct fz_in *in) {
    return in->i < in->n ? in->d[in->i++] : 0;
}
static inline uint16_t fz_u16(struct fz_in *in) {
    uint16_t lo = fz_u8(in);
    return (uint16_t)(lo | (uint16_t)fz_u8(in) << 8);
}
static inline uint32_t fz_u32(struct fz_in *in) {
    uint32_t lo = fz_u16(in);
    return lo | (uint32_t)fz_u16(in) << 16;
}

/* ---- tiers ------------------------------------------------------------------ */

enum fz_tier { T_NONE, T_TINY, T_POOL, T_L25, T_LARGE };
static const char *const fz_tier_name[] = {"none", "tiny", "pool", "l25", "large"};

/* Which tier owns p right now (hakmem's own O(1) lookups). */
static inline enum fz_tier fz_tier_of(const void *p) {
    if (ss_contains(p)) return T_TINY;
    switch (rmap_kind_of(rmap_get(p))) {
    case TIER_POOL:
        return T_POOL;
    case TIER_L25:
        return T_L25;
    case TIER_LARGE:
        return T_LARGE;
    default:
        return T_NONE;
    }
}

/* ---- fault injection --------------------------------------------------------- */

static inline uint64_t fz_faults_failed(void) {
    uint64_t n = 0;
    for (int s = 0; s < OS_NSITES; s++)
        n += os_fault_site_failed((enum os_site)s);
    return n;
}

/* ---- calls, run by the main thread or the worker ------------------------------ */

enum fz_fn {
    F_MALLOC,
    F_CALLOC,
    F_REALLOC,
    F_REALLOCARRAY,
    F_ALIGNED_ALLOC,
    F_POSIX_MEMALIGN,
    F_MEMALIGN,
    F_VALLOC,
    F_PVALLOC,
    F_FREE,
    F_FREE_SIZED,
    F_FREE_ALIGNED_SIZED,
    F_USABLE,
    F_TRIM,
    F_FUNC, /* run fn(arg) (fuzz_badptr: fork from this thread) */
    F_EXIT,
};
static const char *const fz_fn_name[] = {
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "aligned_alloc",
    "posix_memalign",
    "memalign",
    "valloc",
    "pvalloc",
    "free",
    "free_sized",
    "free_aligned_sized",
    "malloc_usable_size",
    "malloc_trim",
    "func",
    "exit",
};

struct fz_call {
    enum fz_fn fn;
    void *p;
    size_t a, b;
    /* results */
    void *ret;
    size_t usable;
    int rc;
    int err;      /* errno after the call */
    uint64_t inj; /* OS failures injected during the call */
    void (*func)(void *);
    void *arg;
};

static void fz_exec(struct fz_call *c) {
    uint64_t f0 = fz_faults_failed();
    c->ret = NULL;
    c->rc = 0;
    switch (c->fn) {
    case F_FREE:
    case F_FREE_SIZED:
    case F_FREE_ALIGNED_SIZED:
        errno = FZ_ERRNO_MARK;
        if (c->fn == F_FREE)
            hak_free(c->p);
        else if (c->fn == F_FREE_SIZED)
            hak_free_sized(c->p, c->b);
        else
            hak_free_aligned_sized(c->p, c->a, c->b);
        break;
    default:
        errno = 0;
        break;
    }
    switch (c->fn) {
    case F_MALLOC:
        c->ret = hak_malloc(c->b);
        break;
    case F_CALLOC:
        c->ret = hak_calloc(c->a, c->b);
        break;
    case F_REALLOC:
        c->ret = hak_realloc(c->p, c->b);
        break;
    case F_REALLOCARRAY:
        c->ret = hak_reallocarray(c->p, c->a, c->b);
        break;
    case F_ALIGNED_ALLOC:
        c->ret = hak_aligned_alloc(c->a, c->b);
        break;
    case F_POSIX_MEMALIGN: {
        void *out = (void *)(uintptr_t)0x5eed;
        c->rc = hak_posix_memalign(&out, c->a, c->b);
        c->ret = out;
        break;
    }
    case F_MEMALIGN:
        c->ret = hak_memalign(c->a, c->b);
        break;
    case F_VALLOC:
        c->ret = hak_valloc(c->b);
        break;
    case F_PVALLOC:
        c->ret = hak_pvalloc(c->b);
        break;
    case F_USABLE:
        c->usable = hak_malloc_usable_size(c->p);
        break;
    case F_TRIM:
        c->rc = hak_malloc_trim(0);
        break;
    case F_FUNC:
        c->func(c->arg);
        break;
    default:
        break;
    }
    c->err = errno;
    c->inj = fz_faults_failed() - f0;
}

/* ---- the worker thread --------------------------------------------------------- */

struct fz_worker {
    pthread_t t;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase; /* 0 idle, 1 job posted, 2 job done */
    struct fz_call job;
    unsigned starts;
};

static struct fz_worker fz_w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *fz_worker_main(void *arg) {
    struct fz_worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (w->phase != 1)
            pthread_cond_wait(&w->cv, &w->mu);
        struct fz_call c = w->job;
        pthread_mutex_unlock(&w->mu);
        if (c.fn != F_EXIT) fz_exec(&c);
        pthread_mutex_lock(&w->mu);
        w->job = c;
        w->phase = 2;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        if (c.fn == F_EXIT) return NULL;
    }
}

/* Run c on the worker (started if needed) and wait for it. */
static void fz_worker_call(struct fz_call *c) {
    struct fz_worker *w = &fz_w;
    if (!w->running) {
        w->phase = 0;
        if (pthread_create(&w->t, NULL, fz_worker_main, w) != 0) {
            fprintf(stderr, "fuzz harness: pthread_create failed\n");
            abort();
        }
        w->running = true;
        w->starts++;
    }
    pthread_mutex_lock(&w->mu);
    w->job = *c;
    w->phase = 1;
    pthread_cond_broadcast(&w->cv);
    while (w->phase != 2)
        pthread_cond_wait(&w->cv, &w->mu);
    *c = w->job;
    w->phase = 0;
    pthread_mutex_unlock(&w->mu);
}

/* The worker exits (its thread-exit hook runs) and is joined. */
static FZ_UNUSED void fz_worker_exit(void) {
    if (!fz_w.running) return;
    struct fz_call c = {.fn = F_EXIT};
    fz_worker_call(&c);
    pthread_join(fz_w.t, NULL);
    fz_w.running = false;
}

/* ---- mappings leaked by injected munmap failures ---------------------------------
 * When an injected failure makes os_unmap skip its munmap, hakmem has already
 * forgotten the mapping (as it must: the kernel said no): a Large block of
 * tens of MiB stays resident for good, and a long run dies of its RSS limit.
 * The harness remembers the Large mappings of the blocks it frees (as the
 * tier tells them: large_span_of) and, after a call during
 * which a munmap was failed on purpose, unmaps those hakmem no longer knows
 * (no TIER_LARGE entry) that are still mapped in full. */
struct fz_cand {
    uintptr_t h;
    size_t size;
};
#define FZ_NCANDS 512
static struct fz_cand fz_cands[FZ_NCANDS];
static unsigned fz_ncands;
static uint64_t fz_reclaimed, fz_reclaimed_bytes, fz_unmap_failed_seen;

/* p, a live Large block, is about to be freed or reallocated. */
static void fz_note_large(const void *p) {
    uint32_t e = rmap_get(p);
    void *start;
    size_t size;
    if (rmap_kind_of(e) != TIER_LARGE || !large_span_of(p, e, &start, &size)) return;
    uintptr_t h = (uintptr_t)start;
    unsigned k = 0; /* drop any that overlaps (stale) */
    for (unsigned i = 0; i < fz_ncands; i++)
        if (fz_cands[i].h + fz_cands[i].size <= h || h + size <= fz_cands[i].h)
            fz_cands[k++] = fz_cands[i];
    fz_ncands = k;
    if (fz_ncands == FZ_NCANDS) { /* forget the oldest */
        memmove(fz_cands, fz_cands + 1, (FZ_NCANDS - 1) * sizeof fz_cands[0]);
        fz_ncands--;
    }
    fz_cands[fz_ncands++] = (struct fz_cand){h, size};
}

/* Is [h, h+size) mapped from end to end? */
static bool fz_mapped(uintptr_t h, size_t size) {
    static unsigned char vec[16384];
    const size_t step = sizeof vec * FZ_PAGE;
    for (size_t off = 0; off < size; off += step) {
        size_t n = size - off < step ? size - off : step;
        if (mincore((void *)(h + off), n, vec) != 0) return false;
    }
    return true;
}

/* After every call: a candidate hakmem still has (its region entry names a
 * Large mapping starting there) stays, its size refreshed from the header
 * unless the pages were decommitted; any other is dropped, and unmapped if a
 * munmap was failed on purpose during the call (`leaked`) and the whole
 * range is still mapped. */
static void fz_reclaim(bool leaked) {
    unsigned k = 0;
    for (unsigned i = 0; i < fz_ncands; i++) {
        struct fz_cand c = fz_cands[i];
        size_t size;
        if (large_mapping_at((void *)c.h, rmap_get((void *)c.h), &size)) {
            if (size && size % FZ_PAGE == 0) c.size = size;
            fz_cands[k++] = c; /* hakmem's still: live or cached */
            continue;
        }
        /* Only when no region of the range belongs to hakmem now (a
         * mapping made during the call may cover part of it). */
        bool anyones = false;
        for (uintptr_t r = c.h; r < c.h + c.size && !anyones; r += HAK_REGION_SIZE)
            anyones = rmap_get((void *)r) != 0;
        if (leaked && !anyones && fz_mapped(c.h, c.size)) {
            if (getenv("FUZZ_DEBUG_RECLAIM"))
                fprintf(stderr, "fuzz harness: unmapping leaked %#lx + %zu\n", (unsigned long)c.h,
                        c.size);
            munmap((void *)c.h, c.size);
            fz_reclaimed++;
            fz_reclaimed_bytes += c.size;
        }
    }
    fz_ncands = k;
}

static void fz_call_on(struct fz_call *c, bool worker) {
    uint64_t unmap_failed = os_fault_site_failed(OS_SITE_MUNMAP);
    if (c->p && (c->fn == F_FREE || c->fn == F_FREE_SIZED || c->fn == F_FREE_ALIGNED_SIZED ||
                 c->fn == F_REALLOC || c->fn == F_REALLOCARRAY))
        fz_note_large(c->p);
    if (worker)
        fz_worker_call(c);
    else
        fz_exec(c);
    bool leaked = os_fault_site_failed(OS_SITE_MUNMAP) != unmap_failed;
    if (leaked) fz_unmap_failed_seen++;
    static int off = -1;
    if (off < 0) off = getenv("FUZZ_NO_RECLAIM") != NULL;
    if (fz_ncands) fz_reclaim(leaked && !off);
}

/* ---- the model ------------------------------------------------------------------ */

enum fz_kind { K_MALLOC, K_CALLOC, K_REALLOC, K_ALIGNED, K_POSIX, K_MEMALIGN, K_VALLOC, K_PVALLOC };
static const char *const fz_kind_name[] = {"malloc",         "calloc",   "realloc", "aligned_alloc",
                                           "posix_memalign", "memalign", "valloc",  "pvalloc"};

struct fz_blk {
    uint8_t *p; /* NULL: slot empty */
    size_t req, usable, align;
    uint64_t seed;
    uint8_t kind, tier;
    bool by_worker;
};

/* A block the program freed (fuzz_badptr picks stale pointers from these). */
struct fz_freed {
    uint8_t *p;
    size_t req, usable, align;
    uint8_t tier, kind;
    bool by_worker;
};
#define FZ_NFREED 32

struct fz {
    int nslots;
    size_t budget; /* bound on the live blocks' usable bytes */
    size_t live_bytes;
    int max_ops, ops;
    bool armed;
    bool faults; /* the program may arm faults */
    uint64_t gen;
    struct fz_blk s[FZ_MAX_SLOTS];
    struct fz_freed freed[FZ_NFREED];
    unsigned nfreed; /* total ever; ring index nfreed % FZ_NFREED */
    char trace[64][120];
    unsigned ntrace;
    /* counters for the stats line */
    uint64_t n_ops, n_inj_fail, n_maybe_ok, n_skip;
};

static void fz_trace(struct fz *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fz_trace(struct fz *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->trace[m->ntrace % 64], sizeof m->trace[0], fmt, ap);
    va_end(ap);
    static int print = -1; /* FUZZ_TRACE=1: every operation on stderr */
    if (print < 0) print = getenv("FUZZ_TRACE") != NULL;
    if (print) fprintf(stderr, "fuzz: #%u %s\n", m->ntrace, m->trace[m->ntrace % 64]);
    m->ntrace++;
}

static _Noreturn void fz_fail(struct fz *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static _Noreturn void fz_fail(struct fz *m, const char *fmt, ...) {
    fprintf(stderr, "\n==== hakmem fuzz: MODEL VIOLATION ====\n");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nlast operations (oldest first):\n");
    unsigned first = m->ntrace > 64 ? m->ntrace - 64 : 0;
    for (unsigned i = first; i < m->ntrace; i++)
        fprintf(stderr, "  #%u %s\n", i, m->trace[i % 64]);
    fprintf(stderr, "live blocks:\n");
    for (int i = 0; i < m->nslots; i++) {
        const struct fz_blk *b = &m->s[i];
        if (b->p)
            fprintf(stderr, "  slot %d: %p req %zu usable %zu align %zu %s tier %s%s\n", i,
                    (void *)b->p, b->req, b->usable, b->align, fz_kind_name[b->kind],
                    fz_tier_name[b->tier], b->by_worker ? " (worker)" : "");
    }
    fflush(stderr);
    abort();
}

/* ---- patterns ------------------------------------------------------------------------ */

__attribute__((always_inline)) static inline uint64_t fz_word(uint64_t seed, size_t k) {
    uint64_t x = (seed ^ (uint64_t)k) * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 31);
}
__attribute__((always_inline)) static inline uint8_t fz_byte(uint64_t seed, size_t i) {
    return (uint8_t)(fz_word(seed, i >> 3) >> ((i & 7) * 8));
}

FZ_NOSAN static void fz_fill(uint8_t *p, size_t n, uint64_t seed) {
    size_t w = n / 8;
    uint64_t *q = (uint64_t *)(void *)p; /* blocks are 16-byte aligned */
    for (size_t k = 0; k < w; k++)
        q[k] = fz_word(seed, k);
    for (size_t i = w * 8; i < n; i++)
        p[i] = fz_byte(seed, i);
}

/* Offset of the first byte of [from, to) that does not hold the pattern, or
 * SIZE_MAX. */
FZ_NOSAN static size_t fz_find_bad(const uint8_t *p, size_t from, size_t to, uint64_t seed) {
    size_t i = from;
    for (; i < to && (i & 7); i++)
        if (p[i] != fz_byte(seed, i)) return i;
    const uint64_t *q = (const uint64_t *)(const void *)p;
    for (; i + 8 <= to; i += 8)
        if (q[i / 8] != fz_word(seed, i / 8)) break;
    for (; i < to; i++)
        if (p[i] != fz_byte(seed, i)) return i;
    return SIZE_MAX;
}

FZ_NOSAN static size_t fz_find_nonzero(const uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (*(const uint64_t *)(const void *)(p + i)) break;
    for (; i < n; i++)
        if (p[i]) return i;
    return SIZE_MAX;
}

static void fz_check_range(struct fz *m, int slot, const uint8_t *p, size_t from, size_t to,
                           uint64_t seed, const char *what) {
    size_t bad = fz_find_bad(p, from, to, seed);
    if (bad != SIZE_MAX)
        fz_fail(m, "slot %d block %p: byte %zu is 0x%02x, expected 0x%02x (%s; checked %zu..%zu)",
                slot, (const void *)p, bad, p[bad], fz_byte(seed, bad), what, from, to);
}

/* The block's pattern: fully, or its first and last 16 bytes. */
static void fz_check_blk(struct fz *m, int slot, bool full) {
    const struct fz_blk *b = &m->s[slot];
    if (!b->p) return;
    if (full || b->usable <= 32) {
        fz_check_range(m, slot, b->p, 0, b->usable, b->seed, "full check");
    } else {
        fz_check_range(m, slot, b->p, 0, 16, b->seed, "head check");
        fz_check_range(m, slot, b->p, b->usable - 16, b->usable, b->seed, "tail check");
    }
}

static void fz_check_all(struct fz *m, bool full) {
    for (int i = 0; i < m->nslots; i++)
        fz_check_blk(m, i, full);
}

/* ---- decoding sizes and alignments ------------------------------------------------- */

static const size_t fz_edges[] = {
    0,
    1,
    8,
    15,
    16,
    17,
    31,
    32,
    33,
    48,
    64,
    100,
    128,
    129,
    256,
    512,
    1000,
    1023,
    1024,
    1025,
    1280,
    2048,
    4095,
    4096,
    4097,
    8191,
    8192,
    8193,
    10240,
    12288,
    16384,
    24576,
    32768,
    49152,
    53247,
    53248,
    53249,
    57344,
    65536,
    65537,
    131072,
    262144,
    262145,
    524288,
    786432,
    917504,
    1048575,
    1048576,
    1048577,
    1048576 + 4096,
    (2 << 20) - 64,
    2 << 20,
    (2 << 20) + 1,
    (4 << 20) - 4096 - 64,
    4 << 20,
    8 << 20,
    (16 << 20) + 12345,
    32 << 20,
    48 << 20,
};
#define FZ_NEDGES (sizeof fz_edges / sizeof fz_edges[0])

static const size_t fz_huge[] = {
    SIZE_MAX,
    SIZE_MAX - 1,
    SIZE_MAX - 4095,
    SIZE_MAX / 2 + 1, /* PTRDIFF_MAX + 1 */
    SIZE_MAX / 2 + 2,
    (size_t)PTRDIFF_MAX,
    (size_t)PTRDIFF_MAX - 1,
    (size_t)PTRDIFF_MAX - 63,
    (size_t)PTRDIFF_MAX - 4095,
    (size_t)PTRDIFF_MAX - 4096 - 64,
    (size_t)1 << 62,
    (size_t)1 << 56,
    (size_t)1 << 48,
    (size_t)1 << 47,
    (size_t)1 << 44,
    (size_t)1 << 40,
    (size_t)1 << 37,
    (size_t)3 << 35,
    ((size_t)1 << 30) + 1, /* 1 GiB: past the BigCache classes */
    ((size_t)128 << 20) + 4096,
};
#define FZ_NHUGE (sizeof fz_huge / sizeof fz_huge[0])

static size_t fz_delta(struct fz_in *in, size_t base) {
    int d = (int)(fz_u8(in) % 7) - 3;
    if (d < 0 && base < (size_t)-d) return 0;
    return base + (size_t)(ptrdiff_t)d;
}

static size_t fz_size(struct fz_in *in) {
    uint8_t m = fz_u8(in);
    switch (m % 10) {
    case 0:
        return fz_u8(in);
    case 1:
        return fz_u16(in) % 1025;
    case 2: /* a size class, +-3 */
        return fz_delta(in, small_class_size[fz_u8(in) % SMALL_NCLASSES]);
    case 3: /* a tier edge, +-3 */
        return fz_delta(in, fz_edges[fz_u8(in) % FZ_NEDGES]);
    case 4: { /* log-uniform to 64 MiB */
        unsigned lg = fz_u8(in) % 26;
        size_t base = (size_t)1 << lg;
        return base + (fz_u32(in) & (base - 1));
    }
    case 5: { /* a Large (BigCache) class edge: 4 per power of two, 64-byte header */
        unsigned lg = 20 + fz_u8(in) % 6;
        uint8_t q = fz_u8(in);
        size_t base = ((size_t)1 << lg) + (size_t)(q & 3) * ((size_t)1 << (lg - 2));
        static const size_t sub[] = {0, 64, 65, 4096, 4096 + 64, 63, 8192};
        return fz_delta(in, base - sub[(q >> 2) % 7]);
    }
    case 6: /* page multiples to 8 MiB */
        return fz_delta(in, (size_t)(fz_u16(in) % 2048) * FZ_PAGE);
    case 7: /* 8 KiB .. 1 MiB, uniform */
        return 8192 + fz_u32(in) % (1048576 - 8192 + 16);
    case 8:
        return fz_huge[fz_u8(in) % FZ_NHUGE];
    default:
        return fz_u16(in) % 16384;
    }
}

static size_t fz_align(struct fz_in *in) {
    uint8_t m = fz_u8(in);
    uint8_t v = fz_u8(in);
    switch (m % 6) {
    case 0:
    case 1: /* powers of two to 2 MiB */
        return (size_t)1 << (v % 22);
    case 2: /* any power of two */
        return (size_t)1 << (v % 64);
    case 3: { /* powers of two, +-1, three of them */
        size_t a = (size_t)1 << (v % 24);
        return (m >> 4) % 3 == 0 ? a - 1 : (m >> 4) % 3 == 1 ? a + 1 : 3 * a;
    }
    case 4: {
        static const size_t odd[] = {0,
                                     1,
                                     2,
                                     3,
                                     4,
                                     5,
                                     6,
                                     7,
                                     8,
                                     12,
                                     24,
                                     48,
                                     100,
                                     4095,
                                     SIZE_MAX,
                                     SIZE_MAX / 2,
                                     SIZE_MAX / 2 + 1,
                                     SIZE_MAX / 2 + 2,
                                     (size_t)1 << 62,
                                     ((size_t)1 << 62) + 1,
                                     1u << 20,
                                     1u << 21};
        return odd[v % (sizeof odd / sizeof odd[0])];
    }
    default:
        return (size_t)fz_u16(in);
    }
}

/* ---- expectations --------------------------------------------------------------------- */

enum fz_exp { E_OK, E_MAYBE, E_ENOMEM, E_EINVAL };

static enum fz_exp fz_exp_size(size_t n) {
    if (n > (size_t)PTRDIFF_MAX) return E_ENOMEM;
    if (n > ((size_t)1 << 47)) return E_ENOMEM; /* more than the address space */
    if (n > FZ_NORMAL_MAX) return E_MAYBE;
    return E_OK;
}

/* An aligned request once the alignment is valid (a power of two). */
static enum fz_exp fz_exp_aligned(size_t align, size_t n) {
    if (align > ((size_t)1 << 46)) return E_ENOMEM; /* offset alone is past the address space */
    enum fz_exp e = fz_exp_size(n);
    if (e == E_OK && align > FZ_ALIGN_OK_MAX) e = E_MAYBE;
    if (e == E_MAYBE && n > ((size_t)1 << 46)) return E_ENOMEM;
    return e;
}

static inline bool fz_pow2(size_t a) {
    return a && !(a & (a - 1));
}

/* ---- blocks ------------------------------------------------------------------------------- */

static void fz_record_freed(struct fz *m, const struct fz_blk *b, bool by_worker) {
    struct fz_freed *f = &m->freed[m->nfreed++ % FZ_NFREED];
    f->p = b->p;
    f->req = b->req;
    f->usable = b->usable;
    f->align = b->align;
    f->tier = b->tier;
    f->kind = b->kind;
    f->by_worker = by_worker;
}

static void fz_forget(struct fz *m, int slot, bool by_worker) {
    struct fz_blk *b = &m->s[slot];
    fz_record_freed(m, b, by_worker);
    m->live_bytes -= b->usable;
    memset(b, 0, sizeof *b);
}

/* Free a slot's block (full pattern check first) with one of the free calls. */
static void fz_free_slot(struct fz *m, int slot, int how, bool worker) {
    struct fz_blk *b = &m->s[slot];
    struct fz_call c = {.fn = F_FREE, .p = b->p};
    if (b->p == NULL) {
        /* free(NULL) and friends: no-ops that keep errno */
        c.fn = how == 1 ? F_FREE_SIZED : how == 2 ? F_FREE_ALIGNED_SIZED : F_FREE;
        c.a = 16;
        fz_trace(m, "%s %s(NULL)", worker ? "worker" : "main", fz_fn_name[c.fn]);
        fz_call_on(&c, worker);
        if (c.err != FZ_ERRNO_MARK && !fz_known("free-errno"))
            fz_fail(m, "%s(NULL) changed errno to %d", fz_fn_name[c.fn], c.err);
        return;
    }
    fz_check_blk(m, slot, true);
    if (how == 1 && (b->kind == K_MALLOC || b->kind == K_CALLOC || b->kind == K_REALLOC)) {
        c.fn = F_FREE_SIZED;
        c.b = b->req;
    } else if (how == 2 && b->kind == K_ALIGNED) {
        c.fn = F_FREE_ALIGNED_SIZED;
        c.a = b->align;
        c.b = b->req;
    }
    fz_trace(m, "%s %s(slot %d %p req %zu)", worker ? "worker" : "main", fz_fn_name[c.fn], slot,
             (void *)b->p, b->req);
    fz_call_on(&c, worker);
    if (c.err != FZ_ERRNO_MARK && !fz_known("free-errno"))
        fz_fail(m, "%s(%p) changed errno from %d to %d (injected OS failures during it: %llu)",
                fz_fn_name[c.fn], (void *)b->p, FZ_ERRNO_MARK, c.err, (unsigned long long)c.inj);
    fz_forget(m, slot, worker);
}

/* A new block p of req bytes came back for slot (empty now): check it and
 * take it into the model. `zero`: calloc's first req bytes must be zero;
 * `keep`/`old_seed`: realloc's first `keep` bytes must hold the old pattern. */
static void fz_take(struct fz *m, int slot, uint8_t *p, size_t req, size_t align, int kind,
                    bool zero, size_t keep, uint64_t old_seed, bool worker, bool maybe) {
    size_t want_align = align > 16 ? align : 16;
    if ((uintptr_t)p & (want_align - 1))
        fz_fail(m, "%s block %p (req %zu) is not aligned to %zu", fz_kind_name[kind], (void *)p,
                req, want_align);
    size_t usable = hak_malloc_usable_size(p);
    if (usable < req)
        fz_fail(m, "malloc_usable_size(%p) = %zu < requested %zu", (void *)p, usable, req);
    if (keep) {
        size_t bad = fz_find_bad(p, 0, keep, old_seed);
        if (bad != SIZE_MAX)
            fz_fail(m,
                    "realloc to %p (req %zu) lost the old contents: byte %zu is 0x%02x, "
                    "expected 0x%02x (kept %zu)",
                    (void *)p, req, bad, p[bad], fz_byte(old_seed, bad), keep);
    }
    if (zero) {
        size_t nz = SIZE_MAX;
        if (!maybe)
            nz = fz_find_nonzero(p, req);
        else if (req && (p[0] || p[req - 1]))
            nz = p[0] ? 0 : req - 1;
        if (nz != SIZE_MAX)
            fz_fail(m, "calloc block %p (req %zu): byte %zu is 0x%02x, not zero", (void *)p, req,
                    nz, p[nz]);
    }
    /* No overlap with any other live block. */
    uintptr_t lo = (uintptr_t)p, hi = lo + usable;
    if (hi < lo) fz_fail(m, "block %p usable %zu wraps around", (void *)p, usable);
    for (int i = 0; i < m->nslots; i++) {
        const struct fz_blk *o = &m->s[i];
        if (!o->p || i == slot) continue;
        uintptr_t olo = (uintptr_t)o->p, ohi = olo + o->usable;
        if (lo < ohi && olo < hi)
            fz_fail(m, "new block %p..+%zu (req %zu, %s) overlaps slot %d %p..+%zu (req %zu)",
                    (void *)p, usable, req, fz_kind_name[kind], i, (void *)o->p, o->usable, o->req);
    }
    if (maybe) {
        /* A huge block: touch its ends, then give it back at once. */
        m->n_maybe_ok++;
        if (req) {
            volatile uint8_t *v = p;
            v[0] = 0x5a;
            v[req - 1] = 0xa5;
            if (v[req - 1] != 0xa5 || (req > 1 && v[0] != 0x5a))
                fz_fail(m, "huge block %p not writable", (void *)p);
        }
        struct fz_call c = {.fn = F_FREE, .p = p};
        fz_call_on(&c, worker);
        if (c.err != FZ_ERRNO_MARK && !fz_known("free-errno"))
            fz_fail(m, "free(%p) changed errno to %d", (void *)p, c.err);
        return;
    }
    if (usable > FZ_MiB &&
        !fz_mapped((uintptr_t)p & ~(FZ_PAGE - 1), ((uintptr_t)p & (FZ_PAGE - 1)) + usable))
        fz_fail(m, "%s block %p: usable %zu (req %zu) is not all mapped", fz_kind_name[kind],
                (void *)p, usable, req);
    struct fz_blk *b = &m->s[slot];
    b->p = p;
    b->req = req;
    b->usable = usable;
    b->align = align;
    b->kind = (uint8_t)kind;
    b->tier = (uint8_t)fz_tier_of(p);
    b->by_worker = worker;
    b->seed = ((uint64_t)slot << 48) ^ ++m->gen ^ ((uint64_t)(uintptr_t)p << 8);
    fz_fill(p, usable, b->seed);
    m->live_bytes += usable;
}

/* A call that returned NULL (or an error code): was that allowed? */
static void fz_check_failure(struct fz *m, const struct fz_call *c, enum fz_exp exp, int err) {
    switch (exp) {
    case E_EINVAL:
        if (err != EINVAL)
            fz_fail(m, "%s(a=%zu, b=%zu) failed with errno %d, expected EINVAL", fz_fn_name[c->fn],
                    c->a, c->b, err);
        return;
    case E_ENOMEM:
    case E_MAYBE:
        if (err != ENOMEM)
            fz_fail(m, "%s(a=%zu, b=%zu) failed with errno %d, expected ENOMEM", fz_fn_name[c->fn],
                    c->a, c->b, err);
        return;
    case E_OK:
        if (err != ENOMEM)
            fz_fail(m, "%s(p=%p, a=%zu, b=%zu) failed with errno %d (injected OS failures: %llu)",
                    fz_fn_name[c->fn], c->p, c->a, c->b, err, (unsigned long long)c->inj);
        if (c->inj == 0)
            fz_fail(m,
                    "%s(p=%p, a=%zu, b=%zu) failed (ENOMEM) although no OS call failed during it",
                    fz_fn_name[c->fn], c->p, c->a, c->b);
        m->n_inj_fail++;
        return;
    }
}

/* Success where failure was required? */
static void fz_check_success(struct fz *m, const struct fz_call *c, enum fz_exp exp) {
    if (exp == E_ENOMEM || exp == E_EINVAL)
        fz_fail(m, "%s(a=%zu, b=%zu) returned %p, expected failure with %s", fz_fn_name[c->fn],
                c->a, c->b, c->ret, exp == E_EINVAL ? "EINVAL" : "ENOMEM");
}

static bool fz_fits(struct fz *m, size_t n, size_t freed) {
    if (n > FZ_NORMAL_MAX) return true; /* huge ones are freed at once */
    return m->live_bytes - freed + n <= m->budget;
}

/* ---- operations ------------------------------------------------------------------------------ */

enum fz_op {
    OP_MALLOC,
    OP_CALLOC,
    OP_REALLOC,
    OP_REALLOC0,
    OP_REALLOCARRAY,
    OP_ALIGNED_ALLOC,
    OP_POSIX_MEMALIGN,
    OP_MEMALIGN,
    OP_VALLOC,
    OP_PVALLOC,
    OP_FREE,
    OP_FREE_SIZED,
    OP_FREE_ALIGNED_SIZED,
    OP_USABLE,
    OP_TRIM,
    OP_W_FREE,
    OP_W_REALLOC,
    OP_W_ALLOC,
    OP_W_EXIT,
    OP_FAULT_ARM,
    OP_FAULT_DISARM,
    OP_MALLINFO,
    OP_CHECK_ALL,
    OP_MALLOC_SMALL, /* malloc of 0..1 KiB: the common case, cheap to encode */
    OP_N
};

/* An allocation of kind `fn` into slot (its old block freed first). */
static void fz_alloc(struct fz *m, int slot, struct fz_call *c, bool worker) {
    enum fz_exp exp = E_OK;
    size_t req = c->b, align = 16;
    int kind = K_MALLOC;
    bool zero = false;
    switch (c->fn) {
    case F_MALLOC:
        exp = fz_exp_size(c->b);
        break;
    case F_CALLOC: {
        size_t n;
        kind = K_CALLOC;
        zero = true;
        if (__builtin_mul_overflow(c->a, c->b, &n)) {
            exp = E_ENOMEM;
            req = 0;
        } else {
            exp = fz_exp_size(n);
            req = n;
        }
        break;
    }
    case F_ALIGNED_ALLOC:
    case F_POSIX_MEMALIGN:
        kind = c->fn == F_ALIGNED_ALLOC ? K_ALIGNED : K_POSIX;
        align = c->a;
        if (!fz_pow2(c->a) || (c->fn == F_POSIX_MEMALIGN && c->a % sizeof(void *)))
            exp = E_EINVAL;
        else
            exp = fz_exp_aligned(c->a, c->b);
        break;
    case F_MEMALIGN:
        kind = K_MEMALIGN;
        if (c->a > ((size_t)1 << 63)) {
            exp = E_EINVAL;
        } else {
            align = c->a == 0 ? 1 : fz_pow2(c->a) ? c->a : (size_t)1 << (64 - __builtin_clzl(c->a));
            exp = fz_exp_aligned(align, c->b);
        }
        break;
    case F_VALLOC:
        kind = K_VALLOC;
        align = FZ_PAGE;
        exp = fz_exp_aligned(align, c->b);
        break;
    case F_PVALLOC:
        kind = K_PVALLOC;
        align = FZ_PAGE;
        if (c->b > (size_t)PTRDIFF_MAX - (FZ_PAGE - 1)) {
            exp = E_ENOMEM;
        } else {
            req = c->b ? (c->b + FZ_PAGE - 1) & ~(FZ_PAGE - 1) : FZ_PAGE;
            exp = fz_exp_aligned(align, req);
        }
        break;
    default:
        abort();
    }
    if ((exp == E_OK || exp == E_MAYBE) && !fz_fits(m, req, m->s[slot].p ? m->s[slot].usable : 0)) {
        m->n_skip++;
        fz_trace(m, "skip %s(a=%zu, b=%zu): over the live-bytes budget", fz_fn_name[c->fn], c->a,
                 c->b);
        return;
    }
    if (m->s[slot].p) fz_free_slot(m, slot, 0, worker);
    fz_trace(m, "%s %s(a=%zu, b=%zu) -> slot %d", worker ? "worker" : "main", fz_fn_name[c->fn],
             c->a, c->b, slot);
    fz_call_on(c, worker);
    if (c->fn == F_POSIX_MEMALIGN) {
        if (c->rc != 0) {
            if (c->ret != (void *)(uintptr_t)0x5eed)
                fz_fail(m, "posix_memalign failed (%d) but changed *memptr to %p", c->rc, c->ret);
            fz_check_failure(m, c, exp, c->rc);
            return;
        }
        if (c->ret == NULL) fz_fail(m, "posix_memalign(%zu, %zu) returned 0 and NULL", c->a, c->b);
    } else if (c->ret == NULL) {
        fz_check_failure(m, c, exp, c->err);
        return;
    }
    fz_check_success(m, c, exp);
    fz_trace(m, "  = %p", c->ret);
    fz_take(m, slot, c->ret, req, align, kind, zero, 0, 0, worker, exp == E_MAYBE);
}

/* realloc / reallocarray of slot to n bytes (nmemb*size for reallocarray). */
static void fz_realloc(struct fz *m, int slot, struct fz_call *c, bool worker) {
    struct fz_blk *b = &m->s[slot];
    struct fz_blk old = *b;
    size_t n = c->b;
    enum fz_exp exp;
    bool overflow = false;
    if (c->fn == F_REALLOCARRAY) {
        overflow = __builtin_mul_overflow(c->a, c->b, &n);
    }
    exp = overflow ? E_ENOMEM : fz_exp_size(n);
    if (!overflow && (exp == E_OK || exp == E_MAYBE) && !fz_fits(m, n, old.usable)) {
        m->n_skip++;
        fz_trace(m, "skip %s(slot %d, %zu): over the live-bytes budget", fz_fn_name[c->fn], slot,
                 n);
        return;
    }
    c->p = old.p;
    if (old.p) fz_check_blk(m, slot, true);
    fz_trace(m, "%s %s(slot %d %p req %zu, a=%zu, b=%zu)", worker ? "worker" : "main",
             fz_fn_name[c->fn], slot, (void *)old.p, old.req, c->a, c->b);
    fz_call_on(c, worker);
    fz_trace(m, "  = %p errno %d", c->ret, c->err);
    if (!overflow && n == 0 && old.p) {
        /* glibc: realloc(p, 0) frees p and returns NULL */
        if (c->ret != NULL)
            fz_fail(m, "%s(%p, 0) returned %p, expected NULL (block freed)", fz_fn_name[c->fn],
                    (void *)old.p, c->ret);
        fz_forget(m, slot, worker);
        return;
    }
    if (c->ret == NULL) {
        fz_check_failure(m, c, exp, c->err);
        if (old.p) fz_check_blk(m, slot, true); /* the old block is intact */
        return;
    }
    fz_check_success(m, c, exp);
    /* The old block is gone (or is the new one). */
    if (old.p) {
        fz_record_freed(m, &old, worker);
        m->live_bytes -= old.usable;
        memset(b, 0, sizeof *b);
    }
    size_t keep = old.p ? (old.req < n ? old.req : n) : 0;
    fz_take(m, slot, c->ret, n, 16, K_REALLOC, false, keep, old.seed, worker, exp == E_MAYBE);
}

/* Read a size for calloc: (nmemb, size) pairs that hit every tier and overflow. */
static void fz_calloc_args(struct fz_in *in, size_t *a, size_t *b) {
    uint8_t mode = fz_u8(in) % 4;
    switch (mode) {
    case 0:
        *a = 1;
        *b = fz_size(in);
        break;
    case 1:
        *a = fz_size(in);
        *b = 1;
        break;
    case 2: {
        size_t k = (size_t)(fz_u8(in) % 64) + 1;
        *a = k;
        *b = fz_size(in) / k;
        break;
    }
    default:
        *a = fz_size(in);
        *b = fz_size(in);
        break;
    }
}

static void fz_step(struct fz *m, struct fz_in *in) {
    uint8_t opb = fz_u8(in);
    enum fz_op op = (enum fz_op)(opb % OP_N);
    int slot = fz_u8(in) % m->nslots;
    struct fz_call c = {.fn = F_MALLOC};
    m->n_ops++;
    switch (op) {
    case OP_MALLOC:
        c.b = fz_size(in);
        fz_alloc(m, slot, &c, false);
        break;
    case OP_MALLOC_SMALL:
        c.b = fz_u16(in) % 1025;
        fz_alloc(m, slot, &c, false);
        break;
    case OP_CALLOC:
        c.fn = F_CALLOC;
        fz_calloc_args(in, &c.a, &c.b);
        fz_alloc(m, slot, &c, false);
        break;
    case OP_REALLOC:
        c.fn = F_REALLOC;
        c.b = fz_size(in);
        fz_realloc(m, slot, &c, false);
        break;
    case OP_REALLOC0:
        c.fn = F_REALLOC;
        c.b = 0;
        fz_realloc(m, slot, &c, false);
        break;
    case OP_REALLOCARRAY:
        c.fn = F_REALLOCARRAY;
        fz_calloc_args(in, &c.a, &c.b);
        fz_realloc(m, slot, &c, false);
        break;
    case OP_ALIGNED_ALLOC:
    case OP_POSIX_MEMALIGN:
    case OP_MEMALIGN:
        c.fn = op == OP_ALIGNED_ALLOC    ? F_ALIGNED_ALLOC
               : op == OP_POSIX_MEMALIGN ? F_POSIX_MEMALIGN
                                         : F_MEMALIGN;
        c.a = fz_align(in);
        c.b = fz_size(in);
        fz_alloc(m, slot, &c, false);
        break;
    case OP_VALLOC:
    case OP_PVALLOC:
        c.fn = op == OP_VALLOC ? F_VALLOC : F_PVALLOC;
        c.b = fz_size(in);
        fz_alloc(m, slot, &c, false);
        break;
    case OP_FREE:
    case OP_FREE_SIZED:
    case OP_FREE_ALIGNED_SIZED:
        fz_free_slot(m, slot, (int)(op - OP_FREE), false);
        break;
    case OP_USABLE: {
        struct fz_blk *b = &m->s[slot];
        c.fn = F_USABLE;
        c.p = b->p;
        fz_exec(&c);
        fz_trace(m, "main malloc_usable_size(slot %d %p) = %zu", slot, (void *)b->p, c.usable);
        if (b->p == NULL && c.usable != 0) fz_fail(m, "malloc_usable_size(NULL) = %zu", c.usable);
        if (b->p && c.usable != b->usable)
            fz_fail(m, "malloc_usable_size(%p) = %zu, was %zu when allocated", (void *)b->p,
                    c.usable, b->usable);
        break;
    }
    case OP_TRIM:
        fz_trace(m, "main malloc_trim(0)");
        c.fn = F_TRIM;
        fz_call_on(&c, false);
        break;
    case OP_W_FREE:
        fz_free_slot(m, slot, fz_u8(in) % 3, true);
        break;
    case OP_W_REALLOC:
        c.fn = F_REALLOC;
        c.b = fz_size(in);
        fz_realloc(m, slot, &c, true);
        break;
    case OP_W_ALLOC: {
        uint8_t v = fz_u8(in);
        switch (v % 4) {
        case 0:
            c.b = fz_size(in);
            break;
        case 1:
            c.fn = F_CALLOC;
            fz_calloc_args(in, &c.a, &c.b);
            break;
        case 2:
            c.fn = F_MEMALIGN;
            c.a = fz_align(in);
            c.b = fz_size(in);
            break;
        default:
            c.b = fz_u16(in) % 1025;
            break;
        }
        fz_alloc(m, slot, &c, true);
        break;
    }
    case OP_W_EXIT:
        fz_trace(m, "worker exits");
        fz_worker_exit();
        break;
    case OP_FAULT_ARM: {
        static const uint64_t counts[] = {1, 1, 1, 2, 2, 3, 4, 6, 8, 16, 64, UINT64_MAX};
        uint64_t skip = fz_u8(in) % 48;
        uint64_t count = counts[fz_u8(in) % (sizeof counts / sizeof counts[0])];
        if (!m->faults) break;
        fz_trace(m, "fault arm skip %llu count %llu", (unsigned long long)skip,
                 (unsigned long long)count);
        os_fault_arm(skip, count);
        m->armed = true;
        break;
    }
    case OP_FAULT_DISARM:
        if (!m->armed) break;
        fz_trace(m, "fault disarm");
        os_fault_disarm();
        m->armed = false;
        break;
    case OP_MALLINFO: {
        struct mallinfo2 mi = hak_mallinfo2();
        fz_trace(m, "mallinfo2: arena %zu uord %zu hblkhd %zu", mi.arena, mi.uordblks, mi.hblkhd);
        if (mi.uordblks > mi.arena)
            fz_fail(m, "mallinfo2: uordblks %zu > arena %zu", mi.uordblks, mi.arena);
        break;
    }
    case OP_CHECK_ALL:
        fz_check_all(m, true);
        break;
    case OP_N:
        break;
    }
    /* Every step: the touched and the other live blocks' ends. */
    fz_check_all(m, false);
}

/* Resident memory now, in MiB (libFuzzer reports the peak). */
static FZ_UNUSED long fz_rss_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return rss * (long)sysconf(_SC_PAGESIZE) / (1024 * 1024);
}

/* An injected munmap failure leaks the mapping (hakmem has forgotten it, as
 * it must when the kernel refuses): a long run piles them up. Past this much
 * resident memory the process stops arming faults (run.sh restarts the
 * fuzzer every FUZZ_SEGMENT seconds, so each segment starts with them on). */
#define FZ_FAULTS_RSS_MB 1536

static void fz_init(struct fz *m, int nslots, size_t budget, int max_ops, bool faults) {
    static bool faults_off;
    static unsigned calls;
    if (faults && !faults_off && ++calls % 16 == 0 && fz_rss_mb() > FZ_FAULTS_RSS_MB) {
        faults_off = true;
        fprintf(stderr,
                "fuzz harness: %ld MiB resident (mappings leaked by injected munmap failures): "
                "no more fault injection in this process\n",
                fz_rss_mb());
    }
    faults = faults && !faults_off;
    fz_reclaim(false);
    /* Start every input from the same kind of state: caches of earlier
     * inputs given back (BigCache entries, empty bundles, spare chunks), so an
     * input that fails fails again when replayed alone. */
    hak_malloc_trim(0);
    memset(m, 0, sizeof *m);
    m->nslots = nslots;
    m->budget = budget;
    m->max_ops = max_ops;
    m->faults = faults;
}

/* Run the program in `in` (until it ends or max_ops). */
static void fz_run(struct fz *m, struct fz_in *in) {
    while (fz_more(in) && m->ops < m->max_ops) {
        m->ops++;
        fz_step(m, in);
    }
}

/* Full check, faults off, everything freed, the worker gone. */
static void fz_finish(struct fz *m) {
    if (m->armed) {
        os_fault_disarm();
        m->armed = false;
    }
    /* Every block is checked fully before it is freed. */
    for (int i = 0; i < m->nslots; i++)
        if (m->s[i].p) fz_free_slot(m, i, i % 3, false);
    fz_worker_exit();
    if (m->live_bytes != 0) fz_fail(m, "harness: live bytes %zu after freeing all", m->live_bytes);
}

/* A target built with -DFUZZ_CHECKED (out/fuzz/<target>_check) runs its programs in
 * checked mode. HAKMEM_CHECK is read once, by the library's constructor,
 * before LLVMFuzzerInitialize: set it and start the process again (libFuzzer's
 * own arguments unchanged; its worker processes inherit the setting). */
static FZ_UNUSED void fz_checked_mode(char **argv) {
#ifdef FUZZ_CHECKED
    const char *e = getenv("HAKMEM_CHECK");
    if (e == NULL || strcmp(e, "1") != 0) {
        setenv("HAKMEM_CHECK", "1", 1);
        execv("/proc/self/exe", argv);
        perror("fuzz harness: execv /proc/self/exe");
        _exit(2);
    }
    /* Only the checked tier gives the size asked as the usable size. */
    void *p = hak_malloc(100);
    if (p == NULL || hak_malloc_usable_size(p) != 100) {
        fprintf(stderr, "fuzz harness: HAKMEM_CHECK=1 is set but checked mode is off\n");
        abort();
    }
    hak_free(p);
#else
    (void)argv;
#endif
}

/* One block from every tier and back, so the process starts from the state a
 * program has after its first allocations (the arena reserved, heaps made). */
static FZ_UNUSED void fz_warm_up(void) {
    static const size_t sizes[] = {16, 2000, 20000, 200000, 3 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = hak_malloc(sizes[i]);
        if (p == NULL) {
            fprintf(stderr, "fuzz harness: warm-up malloc(%zu) failed\n", sizes[i]);
            abort();
        }
        memset(p, 1, sizes[i]);
        hak_free(p);
    }
}

#endif
