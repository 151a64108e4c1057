/* Multi-threaded allocator soak with content checks.
 *
 *   soak_mt [THREADS [SECONDS [SEED]]]
 *
 * THREADS (default 4) worker lanes run for SECONDS (default $SOAK_SECONDS,
 * else 300). Each lane keeps a table of slots and does random malloc, calloc,
 * realloc (grow, shrink, across tiers, reallocarray, realloc(p, 0)),
 * aligned_alloc, posix_memalign, memalign, valloc and free over sizes that hit
 * every hakmem tier (Tiny <= 8 KiB (in two bands: 1 KiB, 8 KiB), Pool <= 52 KiB, L2.5
 * <= 1 MiB, Large up to 16 MiB; weighted to small, with every tier edge +-1).
 * Every block is filled, up to malloc_usable_size, with a pattern derived from
 * its tag (lane, serial) and its offset, and checked before every free and
 * realloc, when it changes hands and in periodic sweeps; realloc is checked to
 * keep the old prefix, calloc to return zeroes, every block its alignment.
 * Blocks are handed to other lanes through lock-free queues and freed or
 * adopted there (cross-thread frees, frees after the allocating thread
 * exited). Lanes exit after a few seconds and are replaced by a new thread
 * that inherits part of the table; short-lived burst threads allocate and hand
 * everything off before they exit. Lanes call malloc_trim now and then and
 * fork(): the child checks and frees the forking lane's blocks, allocates
 * across the tiers, starts a thread, and exits 0. Live memory stays under
 * SOAK_MT_MAX_MB (default 512) MiB.
 *
 * Progress every SOAK_MT_REPORT seconds (default 10) on stdout; a final
 * "soak_mt: PASS ..." or "soak_mt: FAIL ..." line. Exit 0 only when no check
 * failed. A content mismatch prints the details and aborts; so does a lane
 * that makes no progress for 120 s (a hang).
 *
 * Plain C on the standard allocation API: runs on any malloc (glibc without a
 * preload, hakmem with LD_PRELOAD=out/release/libhakmem.so). No stdio: output
 * goes through snprintf + write, so reporting never allocates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LANES   64
#define SLOTS       4096              /* per lane */
#define MAX_BLOCK   ((size_t)16 << 20) /* largest block */
#define NS          1000000000ull
#define STUCK_NS    (120 * NS)         /* a lane without progress this long: hang */
#define FORK_WAIT_S 60                 /* a fork child must exit within this */
#define BURST_LANE  62                 /* tags of burst threads' blocks */
#define CHILD_LANE  63                 /* tags of the fork child's thread */

/* ---- output without stdio ------------------------------------------------ */

static void out_fd(int fd, const char *fmt, va_list ap) {
    char buf[2048];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, (size_t)n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        p += w;
        n -= (int)w;
    }
}

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    out_fd(1, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 1, 2))) static void err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    out_fd(2, fmt, ap);
    va_end(ap);
}

/* ---- time, random -------------------------------------------------------- */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t rnd(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static uint64_t rnd_below(uint64_t *s, uint64_t n) {
    return n ? rnd(s) % n : 0;
}

/* Log-uniform in [lo, hi]. */
static size_t rnd_log(uint64_t *s, size_t lo, size_t hi) {
    if (lo < 1) lo = 1;
    int blo = 63 - __builtin_clzll(lo), bhi = 63 - __builtin_clzll(hi);
    for (;;) {
        int b = blo + (int)rnd_below(s, (uint64_t)(bhi - blo + 1));
        size_t base = (size_t)1 << b;
        size_t v = base + (size_t)rnd_below(s, base);
        if (v >= lo && v <= hi) return v;
    }
}

/* ---- blocks and their pattern --------------------------------------------- */

enum how {
    H_MALLOC,
    H_CALLOC,
    H_REALLOC_NULL,
    H_ALIGNED_ALLOC,
    H_POSIX_MEMALIGN,
    H_MEMALIGN,
    H_VALLOC,
    H_REALLOC,
    H_REALLOCARRAY,
    H_COUNT
};
static const char *const how_name[H_COUNT] = {
    "malloc",   "calloc", "realloc(NULL)", "aligned_alloc", "posix_memalign",
    "memalign", "valloc", "realloc",       "reallocarray",
};

struct block {
    unsigned char *p;
    size_t n;      /* requested size */
    size_t fill;   /* bytes filled with the pattern: malloc_usable_size */
    uint32_t tag;  /* lane << 26 | serial */
    uint32_t align; /* alignment asked for (0: none) */
    uint8_t how;
    uint8_t origin; /* lane that allocated it */
    uint8_t adopted; /* came from another lane's queue */
};

/* Cross-thread hand-off record (itself a small malloc freed by the receiver). */
struct msg {
    struct msg *next;
    struct block b;
    uint32_t from_lane;
};

/* Word i of a block with tag t: the tag in the high half, the word index
 * (mixed with the tag) in the low half, so a foreign word names its block
 * and offset. Bytes past the last whole word are the bytes of the word that
 * would be there: the pattern depends only on (tag, offset), so any prefix
 * can be checked. */
static inline uint64_t pat_word(uint32_t tag, size_t i) {
    return (uint64_t)tag << 32 | (uint32_t)((uint32_t)i ^ (tag * 0x9e3779b1u));
}

/* The fill and the checks are most of the run time: vectorised. */
#define HOT __attribute__((optimize("O3")))

HOT static void pat_fill(unsigned char *p, size_t len, uint32_t tag) {
    uint64_t *w = (uint64_t *)p; /* blocks are at least 8-byte aligned */
    size_t nw = len / 8;
    uint64_t hi = (uint64_t)tag << 32;
    uint32_t lomix = tag * 0x9e3779b1u;
    for (size_t i = 0; i < nw; i++) w[i] = hi | (uint32_t)((uint32_t)i ^ lomix);
    if (len % 8) {
        uint64_t last = pat_word(tag, nw);
        memcpy(p + nw * 8, &last, len % 8);
    }
}

/* Offset of the first byte of [0, len) that differs from the pattern, or
 * (size_t)-1 when all match. */
HOT static size_t pat_find_bad(const unsigned char *p, size_t len, uint32_t tag) {
    const uint64_t *w = (const uint64_t *)p;
    size_t nw = len / 8;
    uint64_t hi = (uint64_t)tag << 32;
    uint32_t lomix = tag * 0x9e3779b1u;
    uint64_t diff = 0;
    size_t i = 0;
    /* Fast scan in chunks; locate precisely only on a difference. */
    for (; i + 8 <= nw; i += 8) {
        diff = 0;
        for (size_t k = 0; k < 8; k++) diff |= w[i + k] ^ (hi | (uint32_t)((uint32_t)(i + k) ^ lomix));
        if (diff) break;
    }
    for (; i < nw; i++)
        if (w[i] != (hi | (uint32_t)((uint32_t)i ^ lomix))) {
            uint64_t x = w[i] ^ pat_word(tag, i);
            return i * 8 + (size_t)(__builtin_ctzll(x) / 8);
        }
    if (len % 8) {
        uint64_t last = pat_word(tag, nw);
        const unsigned char *e = (const unsigned char *)&last;
        for (size_t k = 0; k < len % 8; k++)
            if (p[nw * 8 + k] != e[k]) return nw * 8 + k;
    }
    return (size_t)-1;
}

/* Offset of the first non-zero byte of p[0, n), or n. */
HOT static size_t first_nonzero(const void *p, size_t n) {
    const uint64_t *w = p;
    size_t nw = n / 8, i = 0;
    for (; i + 8 <= nw; i += 8) {
        uint64_t o = 0;
        for (size_t k = 0; k < 8; k++) o |= w[i + k];
        if (o) break;
    }
    for (size_t k = i * 8; k < n; k++)
        if (((const unsigned char *)p)[k]) return k;
    return n;
}

/* ---- global state ---------------------------------------------------------- */

struct lane {
    _Alignas(64) _Atomic(struct msg *) inbox;
    _Alignas(64) atomic_ulong ops;
    atomic_ulong allocs, frees, reallocs, xsent, xrecv, forks, trims, sweeps;
    atomic_int state; /* LANE_* */
    pthread_t th;
    unsigned idx;
    unsigned incarnation;
    uint64_t serial;
    uint64_t rng;
    uint64_t next_fork, next_trim, next_sweep;
    struct block slot[SLOTS];
};
enum { LANE_IDLE, LANE_RUNNING, LANE_DONE };

static struct lane lanes[MAX_LANES];
static unsigned nlanes = 4;
static uint64_t t_start, t_deadline;
static uint64_t run_seed;   /* for the rerun line of a report */
static double run_seconds;
static size_t cap_bytes = (size_t)512 << 20;
static atomic_long live_bytes;
static atomic_ulong failures;
static atomic_ulong threads_started, bursts_started;
static atomic_ulong burst_ops;
static int in_child; /* set in fork children: mismatches exit instead of abort */

static const char *tier_of(size_t n) {
    if (n <= 1024) return "Tiny";
    if (n <= 8192) return "tiny>1k";
    if (n <= 53248) return "Pool";
    if (n <= ((size_t)1 << 20)) return "L2.5";
    return "Large";
}

static void check_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void check_failed(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    err("soak_mt: CHECK FAILED%s: %s\n", in_child ? " (fork child)" : "", buf);
    atomic_fetch_add(&failures, 1);
}

static void hexdump(const char *label, const unsigned char *p, size_t from, size_t to) {
    char line[160];
    for (size_t o = from & ~(size_t)15; o < to; o += 16) {
        int k = snprintf(line, sizeof line, "  %s +%#9zx:", label, o);
        for (size_t j = 0; j < 16 && o + j < to; j++)
            k += snprintf(line + k, sizeof line - (size_t)k, " %02x", p[o + j]);
        err("%s\n", line);
    }
}

/* A pattern mismatch: everything we know, then abort (a fork child exits 3). */
static void mismatch(const struct block *b, const char *what, unsigned lane, size_t off,
                     size_t checked_len, uint32_t tag) {
    err("soak_mt: CONTENT MISMATCH%s during %s in lane %u (thread %lu)\n",
        in_child ? " (fork child)" : "", what, lane, (unsigned long)pthread_self());
    err("  block %p: requested %zu B (%s tier), usable/filled %zu B, alignment %u, allocated by "
        "%s in lane %u%s, tag %#x (lane %u serial %u)\n",
        (void *)b->p, b->n, tier_of(b->n), b->fill, b->align,
        b->how < H_COUNT ? how_name[b->how] : "?", b->origin, b->adopted ? ", handed over" : "",
        tag, tag >> 26, tag & 0x3ffffff);
    size_t bad = 0, first = off, last = off;
    for (size_t o = off; o < checked_len; o++) {
        uint64_t ew = pat_word(tag, o / 8);
        unsigned char e = ((const unsigned char *)&ew)[o % 8];
        if (b->p[o] != e) {
            bad++;
            last = o;
        }
    }
    err("  first bad byte at offset %zu (%#zx), last at %zu, %zu bad bytes of %zu checked\n", first,
        first, last, bad, checked_len);
    size_t wi = first / 8;
    if (wi * 8 + 8 <= checked_len) {
        uint64_t got;
        memcpy(&got, b->p + wi * 8, 8);
        uint64_t want = pat_word(tag, wi);
        uint32_t gtag = (uint32_t)(got >> 32);
        uint32_t gidx = (uint32_t)got ^ (gtag * 0x9e3779b1u);
        err("  word %zu: expected %#018llx, found %#018llx", wi, (unsigned long long)want,
            (unsigned long long)got);
        if (got == 0) err(" (zeroes: memory was decommitted or zeroed)\n");
        else if (gidx < (MAX_BLOCK >> 3))
            err(" (a pattern word of tag %#x = lane %u serial %u, word %u%s)\n", gtag, gtag >> 26,
                gtag & 0x3ffffff, gidx, gtag == tag ? ": this block's own tag" : "");
        else
            err(" (not a pattern word: bytes changed in place, or foreign data)\n");
        /* A block in this lane's table with that tag? */
        if (gtag != tag && got != 0 && gidx < (MAX_BLOCK >> 3) && lane < MAX_LANES)
            for (unsigned s = 0; s < SLOTS; s++) {
                const struct block *o = &lanes[lane].slot[s];
                if (o->p && o->tag == gtag)
                    err("  that tag is live in lane %u slot %u: %p, %zu B (%s), usable %zu\n", lane,
                        s, (void *)o->p, o->n, tier_of(o->n), o->fill);
            }
    }
    size_t from = first > 64 ? first - 64 : 0, to = first + 64 < checked_len ? first + 64 : checked_len;
    hexdump("found", b->p, from, to);
    err("  lane ops %lu, %.1f s into the soak; rerun: soak_mt %u %.0f %#llx (threads interleave "
        "differently each time)\n",
        lane < MAX_LANES ? atomic_load(&lanes[lane].ops) : 0ul,
        (double)(now_ns() - t_start) / (double)NS, nlanes, run_seconds,
        (unsigned long long)run_seed);
    if (in_child) _exit(3);
    abort();
}

static void verify_len(const struct block *b, size_t len, uint32_t tag, const char *what, unsigned lane) {
    size_t off = pat_find_bad(b->p, len, tag);
    if (off != (size_t)-1) mismatch(b, what, lane, off, len, tag);
}

static void verify(const struct block *b, const char *what, unsigned lane) {
    verify_len(b, b->fill, b->tag, what, lane);
}

/* ---- sizes and allocation ------------------------------------------------- */

static const size_t edges[] = {
    0,     1,     15,    16,    17,    1023,  1024,  1025,   8191,   8192,   8193,
    53247, 53248, 53249, 65536, 65537, 262144, 524288, 1048575, 1048576, 1048577, 2097152,
};

static size_t pick_size(uint64_t *r) {
    uint64_t x = rnd_below(r, 10000);
    if (x < 100) return edges[rnd_below(r, sizeof edges / sizeof edges[0])];
    if (x < 4000) return (size_t)rnd_below(r, 129);           /* Tiny, small */
    if (x < 6500) return rnd_log(r, 129, 1024);               /* Tiny */
    if (x < 8500) return rnd_log(r, 1025, 8192);              /* Tiny above 1 KiB */
    if (x < 9560) return rnd_log(r, 8193, 53248);             /* Pool */
    if (x < 9990) return rnd_log(r, 53249, (size_t)1 << 20);  /* L2.5 */
    return rnd_log(r, ((size_t)1 << 20) + 1, MAX_BLOCK);      /* Large */
}

static size_t pick_align(uint64_t *r) {
    static const size_t al[] = {16, 32, 64, 128, 256, 512, 1024, 4096, 8192, 16384, 65536};
    if (rnd_below(r, 200) == 0) return (size_t)2 << 20;
    return al[rnd_below(r, sizeof al / sizeof al[0])];
}

/* Reserve n bytes of the live budget; 0 when over it. */
static int budget_take(size_t n) {
    long after = atomic_fetch_add(&live_bytes, (long)n) + (long)n;
    if ((size_t)after > cap_bytes) {
        atomic_fetch_sub(&live_bytes, (long)n);
        return 0;
    }
    return 1;
}
static void budget_adjust(long d) {
    atomic_fetch_add(&live_bytes, d);
}

static size_t usable(const void *p, size_t n, unsigned lane, const char *how) {
    size_t u = malloc_usable_size((void *)p);
    if (u < n) {
        check_failed("lane %u: malloc_usable_size(%p) = %zu < %zu requested (%s, %s tier)", lane, p, u,
                     n, how, tier_of(n));
        return n;
    }
    /* Never fill wildly past the request: a lie would show as corruption. */
    return u;
}

/* Allocate into *b (empty). 0: over the budget, nothing done. */
static int alloc_block(struct lane *L, struct block *b) {
    uint64_t *r = &L->rng;
    size_t n = pick_size(r);
    if (!budget_take(n)) return 0;
    uint64_t x = rnd_below(r, 100);
    size_t align = 0;
    unsigned how;
    void *p = NULL;
    errno = 0;
    if (x < 55) {
        how = H_MALLOC;
        p = malloc(n);
    } else if (x < 70) {
        how = H_CALLOC;
        if (n % 16 == 0 && n && rnd_below(r, 2)) p = calloc(n / 16, 16);
        else if (rnd_below(r, 2)) p = calloc(n, 1);
        else p = calloc(1, n);
    } else if (x < 75) {
        how = H_REALLOC_NULL;
        p = realloc(NULL, n);
    } else if (x < 82) {
        how = H_ALIGNED_ALLOC;
        align = pick_align(r);
        p = aligned_alloc(align, n);
    } else if (x < 92) {
        how = H_POSIX_MEMALIGN;
        align = pick_align(r);
        void *q = NULL;
        int rc = posix_memalign(&q, align, n);
        if (rc != 0) {
            check_failed("lane %u: posix_memalign(%zu, %zu) = %d", L->idx, align, n, rc);
            q = NULL;
        }
        p = q;
    } else if (x < 98) {
        how = H_MEMALIGN;
        align = pick_align(r);
        p = memalign(align, n);
    } else {
        how = H_VALLOC;
        align = 4096;
        p = valloc(n);
    }
    if (p == NULL) {
        if (how != H_POSIX_MEMALIGN)
            check_failed("lane %u: %s(%zu%s) returned NULL (errno %d) with %ld B live", L->idx,
                         how_name[how], n, align ? ", aligned" : "", errno,
                         atomic_load(&live_bytes));
        budget_adjust(-(long)n);
        return 1;
    }
    size_t need = align > 16 ? align : 16;
    if ((uintptr_t)p % need != 0)
        check_failed("lane %u: %s(%zu) = %p is not %zu-byte aligned", L->idx, how_name[how], n, p,
                     need);
    size_t fill = usable(p, n, L->idx, how_name[how]);
    if (how == H_CALLOC) {
        size_t i = first_nonzero(p, n);
        if (i < n)
            check_failed("lane %u: calloc(%zu) = %p: byte %zu is %#x, not zero (%s tier)", L->idx, n,
                         p, i, ((unsigned char *)p)[i], tier_of(n));
    }
    budget_adjust((long)fill - (long)n);
    b->p = p;
    b->n = n;
    b->fill = fill;
    b->tag = (uint32_t)(L->idx << 26 | (L->serial++ & 0x3ffffff));
    b->align = (uint32_t)align;
    b->how = (uint8_t)how;
    b->origin = (uint8_t)L->idx;
    b->adopted = 0;
    pat_fill(b->p, fill, b->tag);
    atomic_fetch_add_explicit(&L->allocs, 1, memory_order_relaxed);
    return 1;
}

static void free_block(struct lane *L, struct block *b, const char *what) {
    verify(b, what, L->idx);
    free(b->p);
    budget_adjust(-(long)b->fill);
    b->p = NULL;
    atomic_fetch_add_explicit(&L->frees, 1, memory_order_relaxed);
}

static void realloc_block(struct lane *L, struct block *b) {
    uint64_t *r = &L->rng;
    verify(b, "realloc (before)", L->idx);
    size_t nn;
    uint64_t x = rnd_below(r, 100);
    if (x < 45) nn = b->n + 1 + (size_t)rnd_below(r, b->n + 64);     /* grow */
    else if (x < 80) nn = b->n ? (size_t)rnd_below(r, b->n) : 0;    /* shrink */
    else if (x < 99) nn = pick_size(r);                              /* anywhere */
    else nn = 0;                                                     /* realloc(p, 0) */
    if (nn > MAX_BLOCK) nn = MAX_BLOCK;
    if (nn > b->n && !budget_take(nn - b->n)) return;
    long reserved = nn > b->n ? (long)(nn - b->n) : 0;
    unsigned how = H_REALLOC;
    void *q;
    errno = 0;
    if (nn == 0) {
        q = realloc(b->p, 0);
        if (q == NULL) { /* glibc and hakmem: freed */
            atomic_fetch_add_explicit(&L->reallocs, 1, memory_order_relaxed);
            budget_adjust(-(long)b->fill - reserved);
            b->p = NULL;
            atomic_fetch_add_explicit(&L->frees, 1, memory_order_relaxed);
            return;
        }
    } else if (nn % 16 == 0 && rnd_below(r, 4) == 0) {
        how = H_REALLOCARRAY;
        q = reallocarray(b->p, nn / 16, 16);
    } else {
        q = realloc(b->p, nn);
    }
    atomic_fetch_add_explicit(&L->reallocs, 1, memory_order_relaxed);
    if (q == NULL) {
        check_failed("lane %u: %s(%p, %zu) from %zu B returned NULL (errno %d)", L->idx,
                     how_name[how], (void *)b->p, nn, b->n, errno);
        budget_adjust(-reserved);
        return;
    }
    if ((uintptr_t)q % 16 != 0)
        check_failed("lane %u: %s to %zu = %p is not 16-byte aligned", L->idx, how_name[how], nn, q);
    struct block old = *b;
    b->p = q;
    size_t keep = old.n < nn ? old.n : nn;
    char what[96];
    snprintf(what, sizeof what, "%s from %zu to %zu B, check of the kept %zu B", how_name[how],
             old.n, nn, keep);
    verify_len(b, keep, old.tag, what, L->idx);
    size_t fill = usable(q, nn, L->idx, how_name[how]);
    budget_adjust((long)fill - (long)old.fill - reserved);
    b->n = nn;
    b->fill = fill;
    b->tag = (uint32_t)(L->idx << 26 | (L->serial++ & 0x3ffffff));
    b->how = (uint8_t)how;
    b->align = 0;
    pat_fill(b->p, fill, b->tag);
}

static void push_msg(unsigned to, struct msg *m) {
    struct lane *T = &lanes[to];
    struct msg *head = atomic_load_explicit(&T->inbox, memory_order_relaxed);
    do m->next = head;
    while (!atomic_compare_exchange_weak_explicit(&T->inbox, &head, m, memory_order_release,
                                                  memory_order_relaxed));
}

/* Hands b to another lane's queue. 0 when the record could not be allocated. */
static int handoff(unsigned from, uint64_t *r, struct block *b) {
    struct msg *m = malloc(sizeof *m);
    if (m == NULL) {
        check_failed("lane %u: malloc(%zu) for a hand-off record returned NULL", from, sizeof *m);
        return 0;
    }
    unsigned to = (unsigned)rnd_below(r, nlanes);
    if (to == from && nlanes > 1) to = (to + 1) % nlanes;
    m->b = *b;
    m->from_lane = from;
    push_msg(to, m);
    b->p = NULL;
    return 1;
}

/* Takes everything queued for lane L: checks each block, adopts some into
 * empty slots, frees the rest. */
static void drain(struct lane *L, int adopt) {
    struct msg *m = atomic_exchange_explicit(&L->inbox, NULL, memory_order_acquire);
    while (m) {
        struct msg *next = m->next;
        struct block b = m->b;
        verify(&b, "receipt of a block from another thread", L->idx);
        unsigned s = (unsigned)rnd_below(&L->rng, SLOTS);
        if (adopt && rnd_below(&L->rng, 4) == 0 && L->slot[s].p == NULL) {
            b.adopted = 1;
            L->slot[s] = b;
        } else {
            free(b.p);
            budget_adjust(-(long)b.fill);
            atomic_fetch_add_explicit(&L->frees, 1, memory_order_relaxed);
        }
        free(m);
        atomic_fetch_add_explicit(&L->xrecv, 1, memory_order_relaxed);
        m = next;
    }
}

static void sweep(struct lane *L, const char *what) {
    for (unsigned s = 0; s < SLOTS; s++)
        if (L->slot[s].p) verify(&L->slot[s], what, L->idx);
    atomic_fetch_add_explicit(&L->sweeps, 1, memory_order_relaxed);
}

/* ---- fork ------------------------------------------------------------------- */

static void *child_thread(void *arg) {
    uint64_t r = (uint64_t)(uintptr_t)arg | 1;
    struct block b = {0};
    for (int i = 0; i < 2000; i++) {
        size_t n = pick_size(&r);
        if (n > ((size_t)1 << 20)) n = (size_t)1 << 20;
        b.p = malloc(n);
        if (!b.p) {
            check_failed("fork child thread: malloc(%zu) returned NULL", n);
            return NULL;
        }
        b.n = n;
        b.fill = malloc_usable_size(b.p);
        b.tag = (uint32_t)(CHILD_LANE << 26 | (unsigned)i);
        pat_fill(b.p, b.fill, b.tag);
        verify(&b, "fork child thread", CHILD_LANE);
        free(b.p);
    }
    return NULL;
}

/* In the child of fork(): only the forking thread exists. */
static int child_main(struct lane *L) {
    in_child = 1;
    sweep(L, "fork child: check of the parent's blocks");
    /* Free about half of the inherited blocks, realloc some. */
    for (unsigned s = 0; s < SLOTS; s++) {
        struct block *b = &L->slot[s];
        if (!b->p) continue;
        uint64_t x = rnd_below(&L->rng, 4);
        if (x < 2) free_block(L, b, "fork child: free of an inherited block");
        else if (x == 2) realloc_block(L, b);
    }
    /* Fresh allocations across the tiers. */
    struct block local[64];
    memset(local, 0, sizeof local);
    for (int i = 0; i < 3000; i++) {
        struct block *b = &local[rnd_below(&L->rng, 64)];
        if (b->p) free_block(L, b, "fork child: free");
        else alloc_block(L, b);
    }
    pthread_t t;
    int rc = pthread_create(&t, NULL, child_thread, (void *)(uintptr_t)rnd(&L->rng));
    if (rc != 0) check_failed("fork child: pthread_create: %s", strerror(rc));
    else pthread_join(t, NULL);
    for (int i = 0; i < 64; i++)
        if (local[i].p) free_block(L, &local[i], "fork child: final free");
    sweep(L, "fork child: final check");
    malloc_trim(0);
    return atomic_load(&failures) ? 2 : 0;
}

static void do_fork(struct lane *L) {
    pid_t pid = fork();
    if (pid < 0) {
        err("soak_mt: lane %u: fork: %s (skipped)\n", L->idx, strerror(errno));
        return;
    }
    if (pid == 0) _exit(child_main(L));
    atomic_fetch_add_explicit(&L->forks, 1, memory_order_relaxed);
    int st = 0;
    uint64_t until = now_ns() + FORK_WAIT_S * NS;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            check_failed("lane %u: waitpid(%d): %s", L->idx, (int)pid, strerror(errno));
            return;
        }
        if (now_ns() > until) {
            check_failed("lane %u: fork child %d still running after %d s (hang after fork?)",
                         L->idx, (int)pid, FORK_WAIT_S);
            kill(pid, SIGABRT);
            waitpid(pid, &st, 0);
            return;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if (WIFSIGNALED(st))
        check_failed("lane %u: fork child %d killed by signal %d", L->idx, (int)pid, WTERMSIG(st));
    else if (WEXITSTATUS(st) != 0)
        check_failed("lane %u: fork child %d exited with status %d", L->idx, (int)pid,
                     WEXITSTATUS(st));
}

/* ---- lanes ------------------------------------------------------------------ */

static void step(struct lane *L) {
    uint64_t *r = &L->rng;
    struct block *b = &L->slot[rnd_below(r, SLOTS)];
    if (b->p == NULL) {
        if (!alloc_block(L, b)) {
            /* Over the budget: free something instead. */
            for (int k = 0; k < 64; k++) {
                struct block *v = &L->slot[rnd_below(r, SLOTS)];
                if (v->p) {
                    free_block(L, v, "free (budget)");
                    break;
                }
            }
        }
    } else {
        uint64_t x = rnd_below(r, 100);
        if (x < 45) free_block(L, b, "free");
        else if (x < 70) realloc_block(L, b);
        else if (x < 84) {
            if (b->fill <= 65536) verify(b, "hand-off", L->idx); /* the receiver checks too */
            if (handoff(L->idx, r, b)) atomic_fetch_add_explicit(&L->xsent, 1, memory_order_relaxed);
        } else if (x < 96) {
            verify(b, "check", L->idx);
        } else {
            size_t u = malloc_usable_size(b->p);
            if (u < b->n)
                check_failed("lane %u: malloc_usable_size(%p) = %zu, was %zu, requested %zu", L->idx,
                             (void *)b->p, u, b->fill, b->n);
            verify(b, "check", L->idx);
        }
    }
    atomic_fetch_add_explicit(&L->ops, 1, memory_order_relaxed);
}

static volatile size_t huge = SIZE_MAX - 4096; /* hidden from the compiler's checks */

static void bad_requests(struct lane *L) {
    errno = 0;
    void *p = malloc(huge);
    if (p || errno != ENOMEM)
        check_failed("lane %u: malloc(SIZE_MAX - 4096) = %p, errno %d (want NULL, ENOMEM)", L->idx,
                     p, errno);
    errno = 0;
    p = calloc(huge / 2, 4);
    if (p || errno != ENOMEM)
        check_failed("lane %u: calloc(SIZE_MAX / 2, 4) = %p, errno %d (want NULL, ENOMEM)", L->idx,
                     p, errno);
    void *q = NULL;
    volatile size_t bad_align = 24;
    int rc = posix_memalign(&q, bad_align, 64);
    if (rc != EINVAL)
        check_failed("lane %u: posix_memalign(24) = %d (want EINVAL)", L->idx, rc);
}

static void *lane_main(void *arg) {
    struct lane *L = arg;
    uint64_t now = now_ns();
    uint64_t life = (1 + rnd_below(&L->rng, 8)) * NS; /* 1 .. 8 s */
    uint64_t end = now + life < t_deadline ? now + life : t_deadline;
    while (now < end) {
        for (int k = 0; k < 256; k++) step(L);
        drain(L, 1);
        now = now_ns();
        if (now >= L->next_sweep) {
            sweep(L, "periodic check");
            L->next_sweep = now + (2 + rnd_below(&L->rng, 4)) * NS;
        }
        if (now >= L->next_trim) {
            malloc_trim(0);
            atomic_fetch_add_explicit(&L->trims, 1, memory_order_relaxed);
            L->next_trim = now + (2 + rnd_below(&L->rng, 8)) * NS;
            bad_requests(L);
        }
        if (now >= L->next_fork && now + 5 * NS < t_deadline) {
            do_fork(L);
            L->next_fork = now + (5 + rnd_below(&L->rng, 15)) * NS;
        }
    }
    /* Exit: at the end free everything; before, free some blocks, hand some
     * to other lanes (freed after this thread is gone) and leave the rest to
     * this lane's next thread. */
    int final = now >= t_deadline;
    for (unsigned s = 0; s < SLOTS; s++) {
        struct block *b = &L->slot[s];
        if (!b->p) continue;
        uint64_t x = rnd_below(&L->rng, 100);
        if (final || x < 35) free_block(L, b, "free at thread exit");
        else if (x < 65 && handoff(L->idx, &L->rng, b))
            atomic_fetch_add_explicit(&L->xsent, 1, memory_order_relaxed);
    }
    drain(L, !final);
    atomic_store(&L->state, LANE_DONE);
    return NULL;
}

/* Short-lived thread: allocates a burst, hands all of it off, exits. */
static void *burst_main(void *arg) {
    /* Lane 62 (never a worker; one burst thread at a time) gives the tags. */
    struct lane *B = &lanes[BURST_LANE];
    B->rng = (uint64_t)(uintptr_t)arg | 1;
    int n = 64 + (int)rnd_below(&B->rng, 448);
    for (int i = 0; i < n; i++) {
        struct block b = {0};
        if (!alloc_block(B, &b) || b.p == NULL) continue;
        if (!handoff(BURST_LANE, &B->rng, &b)) {
            free(b.p);
            budget_adjust(-(long)b.fill);
        }
    }
    atomic_fetch_add(&burst_ops, (unsigned long)n);
    return NULL;
}

static void start_lane(struct lane *L, uint64_t seed) {
    L->incarnation++;
    L->rng = mix64(seed ^ mix64((uint64_t)L->idx << 32 | L->incarnation)) | 1;
    atomic_store(&L->state, LANE_RUNNING);
    int rc = pthread_create(&L->th, NULL, lane_main, L);
    if (rc != 0) {
        check_failed("pthread_create for lane %u: %s", L->idx, strerror(rc));
        atomic_store(&L->state, LANE_IDLE);
        return;
    }
    atomic_fetch_add(&threads_started, 1);
}

/* ---- supervisor ----------------------------------------------------------- */

static long statm_rss_kib(void) {
    char buf[256];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    long size, res;
    if (sscanf(buf, "%ld %ld", &size, &res) != 2) return -1;
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static long status_kib(const char *key) {
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    const char *p = strstr(buf, key);
    if (!p) return -1;
    return strtol(p + strlen(key) + 1, NULL, 10);
}

struct totals {
    unsigned long ops, allocs, frees, reallocs, xsent, xrecv, forks, trims, sweeps;
};
static struct totals sum(void) {
    struct totals t = {0};
    for (unsigned i = 0; i < nlanes; i++) {
        struct lane *L = &lanes[i];
        t.ops += atomic_load_explicit(&L->ops, memory_order_relaxed);
        t.allocs += atomic_load_explicit(&L->allocs, memory_order_relaxed);
        t.frees += atomic_load_explicit(&L->frees, memory_order_relaxed);
        t.reallocs += atomic_load_explicit(&L->reallocs, memory_order_relaxed);
        t.xsent += atomic_load_explicit(&L->xsent, memory_order_relaxed);
        t.xrecv += atomic_load_explicit(&L->xrecv, memory_order_relaxed);
        t.forks += atomic_load_explicit(&L->forks, memory_order_relaxed);
        t.trims += atomic_load_explicit(&L->trims, memory_order_relaxed);
        t.sweeps += atomic_load_explicit(&L->sweeps, memory_order_relaxed);
    }
    return t;
}

int main(int argc, char **argv) {
    double seconds = 300;
    const char *env = getenv("SOAK_SECONDS");
    if (env && *env) seconds = atof(env);
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (argc > 1) nlanes = (unsigned)atoi(argv[1]);
    if (argc > 2) seconds = atof(argv[2]);
    if (argc > 3) seed = strtoull(argv[3], NULL, 0);
    if (argc > 4 || nlanes < 1 || nlanes > 60 || !(seconds > 0)) {
        err("usage: soak_mt [THREADS (1-60, default 4) [SECONDS (default $SOAK_SECONDS or 300) "
            "[SEED]]]\n");
        return 2;
    }
    if ((env = getenv("SOAK_MT_MAX_MB")) && *env) cap_bytes = (size_t)atol(env) << 20;
    double report_s = 10;
    if ((env = getenv("SOAK_MT_REPORT")) && *env) report_s = atof(env);
    if (!(report_s > 0)) report_s = 10;

    run_seed = seed;
    run_seconds = seconds;
    say("soak_mt: %u threads, %.0f s, seed %#llx, live memory <= %zu MiB, pid %d\n", nlanes, seconds,
        (unsigned long long)seed, cap_bytes >> 20, (int)getpid());
    t_start = now_ns();
    t_deadline = t_start + (uint64_t)(seconds * (double)NS);
    lanes[BURST_LANE].idx = BURST_LANE;
    lanes[CHILD_LANE].idx = CHILD_LANE;
    for (unsigned i = 0; i < nlanes; i++) {
        struct lane *L = &lanes[i];
        L->idx = i;
        L->next_fork = t_start + (2 + i * 3) * NS;
        L->next_trim = t_start + (1 + i) * NS;
        L->next_sweep = t_start + 2 * NS;
        start_lane(L, seed);
    }

    uint64_t next_report = t_start + (uint64_t)(report_s * (double)NS);
    uint64_t last_report = t_start, next_burst = t_start + NS / 2;
    unsigned long last_ops = 0, peak_live = 0;
    unsigned long last_lane_ops[MAX_LANES] = {0};
    uint64_t last_change[MAX_LANES];
    for (unsigned i = 0; i < nlanes; i++) last_change[i] = t_start;
    pthread_t burst;
    int burst_running = 0;
    uint64_t brng = mix64(seed ^ 0xb0b0) | 1;

    for (;;) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        uint64_t now = now_ns();
        int running = 0;
        for (unsigned i = 0; i < nlanes; i++) {
            struct lane *L = &lanes[i];
            int st = atomic_load(&L->state);
            if (st == LANE_DONE) {
                pthread_join(L->th, NULL);
                atomic_store(&L->state, LANE_IDLE);
                if (now + NS / 2 < t_deadline) start_lane(L, seed);
                st = atomic_load(&L->state);
            }
            if (st == LANE_RUNNING) {
                running++;
                unsigned long o = atomic_load_explicit(&L->ops, memory_order_relaxed);
                if (o != last_lane_ops[i]) {
                    last_lane_ops[i] = o;
                    last_change[i] = now;
                } else if (now - last_change[i] > STUCK_NS) {
                    err("soak_mt: HANG: lane %u (thread incarnation %u) made no progress for %llu s "
                        "(ops %lu)\n",
                        i, L->incarnation, (unsigned long long)((now - last_change[i]) / NS), o);
                    abort();
                }
            } else {
                last_change[i] = now;
            }
        }
        if (burst_running) {
            pthread_join(burst, NULL);
            burst_running = 0;
        }
        if (now >= next_burst && now + NS < t_deadline) {
            if (pthread_create(&burst, NULL, burst_main, (void *)(uintptr_t)rnd(&brng)) == 0) {
                burst_running = 1;
                atomic_fetch_add(&bursts_started, 1);
            }
            next_burst = now + (NS / 4) + rnd_below(&brng, NS);
        }
        long live = atomic_load(&live_bytes);
        if (live > 0 && (unsigned long)live > peak_live) peak_live = (unsigned long)live;
        if (now >= next_report || (running == 0 && now >= t_deadline)) {
            struct totals t = sum();
            double dt = (double)(now - last_report) / (double)NS;
            say("[%6.0f s] ops %lu (%.0f/s) live %.1f MiB rss %.1f MiB hwm %.1f MiB threads %lu "
                "forks %lu trims %lu xthread %lu fails %lu\n",
                (double)(now - t_start) / (double)NS, t.ops,
                dt > 0 ? (double)(t.ops - last_ops) / dt : 0.0, (double)live / 1048576.0,
                (double)statm_rss_kib() / 1024.0, (double)status_kib("VmHWM:") / 1024.0,
                atomic_load(&threads_started) + atomic_load(&bursts_started), t.forks, t.trims,
                t.xrecv, atomic_load(&failures));
            last_ops = t.ops;
            last_report = now;
            next_report = now + (uint64_t)(report_s * (double)NS);
        }
        if (running == 0 && now >= t_deadline) break;
    }

    /* Everything still queued (handed to lanes that had exited) is checked
     * and freed here; then no block may be left. */
    for (unsigned i = 0; i < nlanes; i++) drain(&lanes[i], 0);
    /* A lane whose last thread exited just before the end left blocks for a
     * successor that was not started: check and free them here. */
    for (unsigned i = 0; i < nlanes; i++)
        for (unsigned s = 0; s < SLOTS; s++)
            if (lanes[i].slot[s].p) free_block(&lanes[i], &lanes[i].slot[s], "free at the end");
    long left = atomic_load(&live_bytes);
    if (left != 0) check_failed("harness accounting: %ld live bytes left at the end", left);
    malloc_trim(0);
    struct totals t = sum();
    double el = (double)(now_ns() - t_start) / (double)NS;
    unsigned long fails = atomic_load(&failures);
    long hwm = status_kib("VmHWM:");
    say("soak_mt: %s seconds=%.0f threads=%u ops=%lu ops_per_s=%.0f allocs=%lu frees=%lu "
        "reallocs=%lu xthread_frees=%lu burst_allocs=%lu threads_started=%lu forks=%lu trims=%lu "
        "sweeps=%lu peak_live_mib=%.1f peak_rss_kib=%ld final_rss_kib=%ld failures=%lu\n",
        fails ? "FAIL" : "PASS", el, nlanes, t.ops, t.ops / el, t.allocs, t.frees, t.reallocs,
        t.xrecv, atomic_load(&burst_ops), atomic_load(&threads_started) + atomic_load(&bursts_started),
        t.forks, t.trims, t.sweeps, (double)peak_live / 1048576.0, hwm, statm_rss_kib(), fails);
    return fails ? 1 : 0;
}
