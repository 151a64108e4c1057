#include "prof/prof.h"

#include "box/diag.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/secret.h"
#include "box/tier.h"
#include "prof/unwind.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define PROF_DEPTH    64 /* frames kept per sample */
#define PROF_SKIP_MAX 16 /* the allocator's own frames above the caller's, at most */
#define PROF_BUCKETS  4096
#define PROF_CHUNK    ((size_t)64 << 10) /* records come in mappings of this */
#define PROF_CD_OFF   ((int64_t)1 << 46) /* countdowns with sampling off */
#define PROF_CD_SOON  256                /* countdowns before the settings are read */

struct prof_rec {
    struct prof_rec *next; /* in its bucket, or on the spare list */
    const void *p;
    /* The block's own calls change these with no lock held (prof_resize):
     * the dump reads them as they are. */
    _Atomic uint64_t n;    /* bytes asked */
    _Atomic uint64_t size; /* sampled with the probability of so many bytes
                            * (the dump scales by its inverse: no exp per
                            * sample or resize) */
    uint32_t depth;
    void *pc[PROF_DEPTH]; /* return addresses, the caller of malloc first */
};

HAK_HIDDEN bool prof_on;
HAK_HIDDEN __thread bool prof_busy;

enum { PROF_UNDECIDED, PROF_OFF, PROF_ON };
static _Atomic int prof_state;
static double prof_rate;           /* HAKMEM_PROF_SAMPLE: mean bytes between samples */
static char prof_file[4096];       /* HAKMEM_PROF_FILE */
static uintptr_t prof_lo, prof_hi; /* this library's code: its frames are skipped */

static _Atomic uint64_t prof_n_lost; /* prof_lost */

static hak_spin prof_lock = HAK_SPIN_INIT; /* the records */
static struct prof_rec **prof_table;       /* PROF_BUCKETS chains */
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

/* A record's estimate: the allocations and bytes in use it stands for, n
 * bytes sampled with the chance of `size`. */
struct prof_est {
    uint64_t count, bytes;
};
static struct prof_est prof_estimate(uint64_t n, size_t size) {
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

/* ---- the dump ----------------------------------------------------------------
 * pprof's heap-profile text (gperftools' heap-profiler): a header with the
 * totals, a line per stack (pprof adds up lines of the same stack), then
 * /proc/self/maps for the symbols. "heapprofile" says the figures are
 * estimates already: pprof does not scale them again. The bracketed
 * allocated totals are not kept (0): only the in-use views mean anything. */

/* Empty b into fd when what comes next might not fit: every piece the dump
 * appends at once (a number, an address, a literal) is under PROF_PIECE. */
#define PROF_PIECE 64
static void prof_room(struct diag_buf *b, int fd, bool *ok) {
    if (b->n + PROF_PIECE > sizeof b->s && !diag_flush(b, fd)) *ok = false;
}

/* "N: BYTES [0: 0] @" */
static void prof_put_counts(struct diag_buf *b, int fd, bool *ok, uint64_t n, uint64_t bytes) {
    prof_room(b, fd, ok);
    diag_u64(b, n);
    diag_str(b, ": ");
    diag_u64(b, bytes);
    diag_str(b, " [0: 0] @");
}

static void prof_put_maps(struct diag_buf *b, int fd, bool *ok) {
    diag_str(b, "\nMAPPED_LIBRARIES:\n");
    if (!diag_flush(b, fd)) *ok = false;
    int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        *ok = false;
        return;
    }
    char buf[8192]; /* few reads: the kernel makes the text again for each */
    ssize_t got;
    while ((got = read(in, buf, sizeof buf)) > 0)
        if (!diag_write(fd, buf, (size_t)got)) *ok = false;
    if (got < 0) *ok = false;
    close(in);
}

/* path with each %p replaced by the process id (and %% by %), into out
 * (len bytes); false when it does not fit. */
static bool prof_expand(const char *path, char *out, size_t len) {
    struct diag_buf pid = {.n = 0};
    diag_u64(&pid, (uint64_t)getpid());
    size_t n = 0;
    for (const char *c = path; *c; c++) {
        const char *piece = c;
        size_t k = 1;
        if (c[0] == '%' && c[1] == 'p') {
            piece = pid.s;
            k = pid.n;
            c++;
        } else if (c[0] == '%' && c[1] == '%') {
            c++;
        }
        if (k >= len - n) return false; /* (room for the '\0' kept) */
        memcpy(out + n, piece, k);
        n += k;
    }
    out[n] = '\0';
    return true;
}

/* Take the records' lock for a dump, waiting a second at most: at exit (or
 * in a signal handler) it may be held by code this thread interrupted,
 * which never gives it back. */
static bool prof_lock_dump(void) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (hak_spin_trylock(&prof_lock)) return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) >= 1000000000) {
            errno = EDEADLK;
            return false;
        }
        struct timespec nap = {0, 50000}; /* 50 us (raw: no cancellation point) */
        syscall(SYS_nanosleep, &nap, NULL);
    }
}

/* A record as the dump writes it. */
struct prof_line {
    uint64_t n, size;
    uint32_t depth;
    void *pc[PROF_DEPTH];
};
#define PROF_BATCH 8 /* lines copied at a time: on the stack, ~4 KiB */

/* The dump copies the records a few at a time, under the lock, into its
 * own frame, and writes them with no lock held: a write is a cancellation
 * point, and a preloaded wrapper of it may allocate (and sample, which
 * takes the lock). No memory to ask for: a dump near a memory limit still
 * works. The cursor: bucket *b, past the first *skip records of its chain.
 * The lines copied (0 at the end); -1 with errno when the lock stayed held. */
static int prof_copy_lines(uint32_t *b, uint32_t *skip, struct prof_line *out) {
    if (!prof_lock_dump()) return -1;
    int n = 0;
    for (; *b < PROF_BUCKETS; ++*b, *skip = 0) {
        const struct prof_rec *r = prof_table[*b];
        for (uint32_t k = 0; r != NULL && k < *skip; k++)
            r = r->next;
        for (; r != NULL; r = r->next, ++*skip) {
            if (n == PROF_BATCH) goto full;
            if (r->depth == 0) continue; /* no stack: nothing pprof could show */
            out[n].n = atomic_load_explicit(&r->n, memory_order_acquire);
            out[n].size = atomic_load_explicit(&r->size, memory_order_relaxed);
            out[n].depth = r->depth;
            memcpy(out[n].pc, r->pc, r->depth * sizeof r->pc[0]);
            n++;
        }
    }
full:
    hak_spin_unlock(&prof_lock);
    return n;
}

/* The header's totals (a pass of their own: lines may come and go before
 * they are written, as the program runs on). false when the lock stayed
 * held. */
static bool prof_totals(uint64_t *count, uint64_t *bytes) {
    if (!prof_lock_dump()) return false;
    *count = *bytes = 0;
    for (uint32_t i = 0; i < PROF_BUCKETS; i++)
        for (const struct prof_rec *r = prof_table[i]; r != NULL; r = r->next) {
            if (r->depth == 0) continue;
            uint64_t n = atomic_load_explicit(&r->n, memory_order_acquire);
            struct prof_est e =
                prof_estimate(n, atomic_load_explicit(&r->size, memory_order_relaxed));
            *count += e.count;
            *bytes += e.bytes;
        }
    hak_spin_unlock(&prof_lock);
    return true;
}

static int prof_dump_to(const char *path) {
    char name[sizeof prof_file];
    if (!prof_expand(path != NULL ? path : prof_file, name, sizeof name)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    uint64_t total_n, total_bytes;
    if (!prof_totals(&total_n, &total_bytes)) return -1;
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    struct diag_buf b = {.n = 0};
    bool ok = true;
    diag_str(&b, "heap profile: ");
    prof_put_counts(&b, fd, &ok, total_n, total_bytes);
    diag_str(&b, " heapprofile\n");
    struct prof_line line[PROF_BATCH];
    uint32_t bucket = 0, skip = 0;
    int got;
    while ((got = prof_copy_lines(&bucket, &skip, line)) > 0)
        for (int i = 0; i < got; i++) {
            const struct prof_line *r = &line[i];
            struct prof_est e = prof_estimate(r->n, r->size);
            prof_put_counts(&b, fd, &ok, e.count, e.bytes);
            for (uint32_t f = 0; f < r->depth; f++) {
                prof_room(&b, fd, &ok);
                diag_str(&b, " ");
                diag_hex(&b, (uintptr_t)r->pc[f]);
            }
            diag_str(&b, "\n"); /* (the last piece left room for it) */
        }
    int err = got < 0 ? errno : 0; /* (EDEADLK: the lock stayed held) */
    if (got < 0) ok = false;
    prof_put_maps(&b, fd, &ok);
    if (!ok && err == 0) err = errno != 0 ? errno : EIO;
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        errno = err;
        return -1;
    }
    return 0;
}

/* The dump, not cancelled halfway (a file cut short, its snapshot's
 * mapping lost): a cancel that comes meanwhile waits. */
static int prof_dump_whole(const char *path) {
    if (!prof_on) {
        errno = EINVAL;
        return -1;
    }
    int state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    int rc = prof_dump_to(path);
    int saved = errno;
    pthread_setcancelstate(state, NULL);
    errno = saved;
    return rc;
}

int prof_dump(const char *path) {
    int rc = prof_dump_whole(path);
    /* A cancellation point still (its writes were), now at its end: a
     * thread that dumps in a loop can be cancelled. */
    int saved = errno;
    pthread_testcancel();
    errno = saved;
    return rc;
}

void prof_exit(void) {
    if (!prof_on) return;
    uint64_t lost = atomic_load_explicit(&prof_n_lost, memory_order_relaxed);
    if (lost != 0) {
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: heap profile: ");
        diag_u64(&b, lost);
        diag_str(&b, " sampled allocations were not recorded (too many sampled blocks in use at "
                     "once, or no memory for one); the profile undercounts: a larger "
                     "HAKMEM_PROF_SAMPLE takes fewer\n");
        diag_flush(&b, 2);
    }
    if (prof_dump_whole(NULL) == 0) return;
    int err = errno;
    /* The file it tried: %p as the process id (the setting itself when
     * that is too long). */
    char name[sizeof prof_file];
    if (!prof_expand(prof_file, name, sizeof name)) memcpy(name, prof_file, sizeof name);
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: could not write the heap profile to '");
    diag_flush(&b, 2);
    diag_write(2, name, strlen(name)); /* (a path may not fit in b) */
    diag_str(&b, "' (errno ");
    diag_u64(&b, (uint64_t)err);
    diag_str(&b, ")\n");
    diag_flush(&b, 2);
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
