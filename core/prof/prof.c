/* The heap profiler's sampling (when the next sample is due, and with what
 * chance) and its table of records; dump.c writes the records out. */
#include "prof/internal.h"

#include "box/diag.h"
#include "box/os.h"
#include "box/secret.h"
#include "box/tier.h"
#include "prof/unwind.h"

#include <execinfo.h>
#include <link.h>
#include <string.h>

#define PROF_SKIP_MAX 16 /* the allocator's own frames above the caller's, at most */
#define PROF_CHUNK    ((size_t)64 << 10) /* records come in mappings of this */
#define PROF_CD_OFF   ((int64_t)1 << 46) /* countdowns with sampling off */
#define PROF_CD_SOON  256                /* countdowns before the settings are read */

HAK_HIDDEN bool prof_on;
HAK_HIDDEN __thread bool prof_busy;

enum { PROF_UNDECIDED, PROF_OFF, PROF_ON };
static _Atomic int prof_state;
static double prof_rate;                  /* HAKMEM_PROF_SAMPLE: mean bytes between samples */
HAK_HIDDEN char prof_file[PROF_FILE_MAX]; /* HAKMEM_PROF_FILE */
static uintptr_t prof_lo, prof_hi;        /* this library's code: its frames are skipped */

HAK_HIDDEN _Atomic uint64_t prof_n_lost; /* prof_lost */

HAK_HIDDEN hak_spin prof_lock = HAK_SPIN_INIT; /* the records */
HAK_HIDDEN struct prof_rec **prof_table;       /* PROF_BUCKETS chains */
static struct prof_rec *prof_spare;

static __thread struct {
    uint64_t rng;
    double next; /* the next gap (prof_gap) */
    bool drawn;  /* next was */
    bool armed;  /* prof_bytes_left was set */
} prof_t;
HAK_HIDDEN __thread int64_t prof_bytes_left;

/* ---- numbers: no libm in an allocator --------------------------------------- */

static uint64_t prof_random(void) {
    uint64_t x = prof_t.rng;
    if (x == 0) x = (hak_secret() ^ ((uintptr_t)&prof_t * 0x9e3779b97f4a7c15ull)) | 1;
    x ^= x >> 12; /* xorshift64* */
    x ^= x << 25;
    x ^= x >> 27;
    prof_t.rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* ln(x) for a normal x > 0: x = m 2^k with m in [sqrt(1/2), sqrt(2)), and
 * ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.172: its series to s^11
 * is good to 1e-9. Subtracting sqrt(1/2)'s bits from x's puts k in the
 * exponent field: no test of m against sqrt(2), mispredicted half the time. */
static double prof_ln(double x) {
    union {
        double d;
        uint64_t u;
    } v = {x};
    int64_t k = (int64_t)(v.u - 0x3fe6a09e667f3bcdull) >> 52; /* (arithmetic shift) */
    v.u -= (uint64_t)k << 52;
    double m = v.d;
    double s = (m - 1) / (m + 1), s2 = s * s, s4 = s2 * s2;
    double series = s * ((2 + s2 * (2.0 / 3)) + /* (by powers of s^4: a shorter chain) */
                         s4 * ((2.0 / 5 + s2 * (2.0 / 7)) + s4 * (2.0 / 9 + s2 * (2.0 / 11))));
    return (double)k * 0.6931471805599453 + series;
}

/* exp(-x) for x >= 0: 2^-k exp(r), |r| <= ln(2)/2, exp(r) by its series
 * to r^9 (the next term is under 1e-11 of it: plenty for a scale), Horner
 * written out. Once per sample: the loop it was cost ~80 instructions. */
static double prof_exp_neg(double x) {
    if (x > 700) return 0;
    const double ln2 = 0.6931471805599453;
    int64_t k = (int64_t)(x * (1 / ln2) + 0.5);
    double r = (double)k * ln2 - x;
    double sum =
        1 +
        r * (1 +
             r * (1.0 / 2 +
                  r * (1.0 / 6 +
                       r * (1.0 / 24 +
                            r * (1.0 / 120 +
                                 r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 +
                                                                         r * (1.0 / 362880)))))))));
    union {
        double d;
        uint64_t u;
    } v = {sum};
    v.u -= (uint64_t)k << 52; /* sum is in [0.7, 1.5]: its exponent stays normal */
    return v.d;
}

/* The probability that an allocation of `size` bytes is sampled. */
static double prof_probability(size_t size) {
    double x = (double)size / prof_rate;
    if (x < 1e-4) return x * (1 - x / 2 * (1 - x / 3)); /* 1 - exp(-x) without the cancellation */
    return 1 - prof_exp_neg(x);
}

/* What a sample chosen with the chance of `size` bytes stands for: 1 /
 * that chance (1 for none: nothing is drawn for 0 bytes, but a record
 * made by hand may say so). */
static double prof_scale(size_t size) {
    return size != 0 ? 1 / prof_probability(size) : 1;
}

struct prof_est prof_estimate(uint64_t n, size_t size) {
    double scale = prof_scale(size);
    return (struct prof_est){(uint64_t)(scale + 0.5), (uint64_t)((double)n * scale + 0.5)};
}

/* An exponential number of bytes, mean prof_rate. */
static double prof_draw(void) {
    double u = (double)((prof_random() >> 11) + 1) * 0x1p-53; /* (0, 1] */
    return -prof_ln(u) * prof_rate;
}

/* Bytes to the next point of the Poisson process. Drawn a gap ahead: the
 * sample that asks goes on while the next one is worked out (a chain of
 * ~60 cycles that nothing waits for), where it would wait for its own. */
static double prof_gap(void) {
    double g = hak_likely(prof_t.drawn) ? prof_t.next : prof_draw();
    prof_t.next = prof_draw();
    prof_t.drawn = true;
    return g;
}

int64_t prof_countdown(size_t size) {
    int state = atomic_load_explicit(&prof_state, memory_order_relaxed);
    if (state == PROF_OFF) return PROF_CD_OFF;
    if (state == PROF_UNDECIDED) return PROF_CD_SOON;
    /* Whole allocations of `size` that fit in the gap pass; the one it ends
     * in is sampled. (The gaps of each class's allocations are those of one
     * byte countdown: the process is memoryless.) */
    double n = prof_gap() / (double)size;
    return n >= (double)PROF_CD_OFF ? PROF_CD_OFF : (int64_t)n;
}

bool prof_bytes_passed(size_t n) {
    if (prof_busy) { /* (the unwinder's own allocation: it would recurse) */
        prof_bytes_left += (int64_t)n;
        return false;
    }
    if (hak_unlikely(!prof_t.armed)) { /* the thread's first: its countdown starts */
        prof_t.armed = true;
        if ((prof_bytes_left = (int64_t)prof_gap() - (int64_t)n) >= 0) return false;
    }
    prof_bytes_left = (int64_t)prof_gap();
    return true;
}

/* ---- start ------------------------------------------------------------------ */

/* dl_iterate_phdr: the code segment holding `arg` (a function of ours). */
static int prof_find_self(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    uintptr_t me = (uintptr_t)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (me < lo || me >= hi) continue;
        /* Linked into the program itself, its code is the program's: no
         * frame can be told apart as ours, and none is skipped. */
        if (info->dlpi_name != NULL && info->dlpi_name[0] != '\0') {
            prof_lo = lo;
            prof_hi = hi;
        }
        return 1;
    }
    return 0;
}

void prof_start(uint64_t sample, const char *file) {
    prof_rate = (double)sample;
    size_t len = strlen(file);
    if (len >= sizeof prof_file) len = sizeof prof_file - 1;
    memcpy(prof_file, file, len);
    prof_file[len] = '\0';
    void *frame[2];
    backtrace(frame, 2); /* loads the unwinder now, while malloc may recurse */
    prof_table = os_map_aligned(PROF_BUCKETS * sizeof *prof_table, HAK_PAGE_SIZE);
    if (prof_table == NULL || !unwind_start()) {
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: no memory for the heap profiler; HAKMEM_PROF is off\n");
        diag_flush(&b, 2);
        prof_decline();
        return;
    }
    dl_iterate_phdr(prof_find_self, (void *)(uintptr_t)prof_start);
    prof_on = true;
    atomic_store_explicit(&prof_state, PROF_ON, memory_order_relaxed);
}

void prof_decline(void) {
    atomic_store_explicit(&prof_state, PROF_OFF, memory_order_relaxed);
}

/* ---- records ---------------------------------------------------------------- */

static inline struct prof_rec **prof_bucket(const void *p) {
    return &prof_table[((uintptr_t)p * 0x9e3779b97f4a7c15ull) >> (64 - 12)];
}
_Static_assert(PROF_BUCKETS == 1 << 12, "prof_bucket's shift");

/* A record off the spare list; a new mapping of them when it is empty. */
static struct prof_rec *prof_new_rec(void) {
    if (prof_spare == NULL) {
        struct prof_rec *c = os_map_aligned(PROF_CHUNK, HAK_PAGE_SIZE);
        if (c == NULL) return NULL;
        for (size_t i = 0; i < PROF_CHUNK / sizeof *c; i++) {
            c[i].next = prof_spare;
            prof_spare = &c[i];
        }
    }
    struct prof_rec *r = prof_spare;
    prof_spare = r->next;
    return r;
}

struct prof_rec *prof_record(const void *p, size_t n, size_t size) {
    if (!prof_on) return NULL;
    prof_busy = true;
    void *pc[PROF_SKIP_MAX + PROF_DEPTH];
    int got = unwind_stack(pc, PROF_SKIP_MAX + PROF_DEPTH);
    if (got < 0) got = backtrace(pc, PROF_SKIP_MAX + PROF_DEPTH); /* a frame it cannot read */
    int skip = 0;
    while (skip < got && skip < PROF_SKIP_MAX && (uintptr_t)pc[skip] >= prof_lo &&
           (uintptr_t)pc[skip] < prof_hi)
        skip++;
    int depth = got - skip > PROF_DEPTH ? PROF_DEPTH : got - skip; /* (skip <= got) */
    hak_spin_lock(&prof_lock);
    struct prof_rec *r = prof_new_rec();
    if (r != NULL) { /* (no memory for it: the sample is lost) */
        r->p = p;
        atomic_store_explicit(&r->n, n, memory_order_relaxed);
        atomic_store_explicit(&r->size, size, memory_order_relaxed);
        r->depth = (uint32_t)depth;
        memcpy(r->pc, pc + skip, r->depth * sizeof *pc);
        struct prof_rec **b = prof_bucket(p);
        r->next = *b;
        *b = r;
    }
    hak_spin_unlock(&prof_lock);
    if (r == NULL) prof_lost();
    prof_busy = false;
    return r;
}

void prof_lost(void) {
    atomic_fetch_add_explicit(&prof_n_lost, 1, memory_order_relaxed);
}

/* Take r out of its chain (the lock held). */
static void prof_unlink(struct prof_rec *r) {
    struct prof_rec **at = prof_bucket(r->p);
    while (*at != r)
        at = &(*at)->next;
    *at = r->next;
}

void prof_forget(struct prof_rec *r) {
    if (r == NULL) return;
    hak_spin_lock(&prof_lock);
    prof_unlink(r);
    r->next = prof_spare;
    prof_spare = r;
    hak_spin_unlock(&prof_lock);
}

void prof_resize(struct prof_rec *r, const void *to, size_t n) {
    if (r == NULL) return;
    /* The size first, and the bytes released after it: a dump that reads
     * the new bytes (acquiring them) reads the new size too, never a small
     * chance scaling up many bytes. */
    if (n > atomic_load_explicit(&r->size, memory_order_relaxed))
        atomic_store_explicit(&r->size, n, memory_order_relaxed);
    atomic_store_explicit(&r->n, n, memory_order_release);
    if (r->p == to) return; /* (only the block's own calls change r->p) */
    hak_spin_lock(&prof_lock);
    prof_unlink(r);
    r->p = to;
    struct prof_rec **b = prof_bucket(to);
    r->next = *b;
    *b = r;
    hak_spin_unlock(&prof_lock);
}

size_t prof_drawn(const struct prof_rec *r) {
    return r != NULL ? atomic_load_explicit(&r->size, memory_order_relaxed) : 0;
}

void prof_fork_prepare(void) {
    hak_spin_lock(&prof_lock);
}

void prof_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    hak_spin_unlock(&prof_lock);
}

const struct tier_ops prof_tier = {
    .name = "prof", .fork_prepare = prof_fork_prepare, .fork_release = prof_fork_release};
