/* Out of memory, for real: allocate in one size range (a tier of hakmem's,
 * though this program knows nothing of hakmem) until malloc returns NULL,
 * then calloc, realloc and posix_memalign at exhaustion, free everything and
 * allocate again. Run under LD_PRELOAD with a limit on the address space set
 * by the caller (`ulimit -v`); this program sets no limit itself, and refuses
 * to run without one (it would take the machine's memory).
 *
 *   oom_tiers TIER...
 *
 * TIER (sizes, bytes): tiny 16-1024, tiny8k 1025-8192 (both the Tiny tier), pool 8193-53248,
 * l25 53249-1 MiB, large 1 MiB+1 - 8 MiB, mixed any of these ranges at
 * random, then a size in it.
 *
 * Each TIER runs in turn in this one process:
 *   round1    malloc of random sizes in the range, a pattern written into
 *             every block, until a request of the range's smallest size
 *             fails (after the first NULL the sizes drawn shrink: the space
 *             left is filled, not just probed). Every NULL must come with
 *             errno == ENOMEM.
 *   calloc    calloc at exhaustion: an overflowing count and a request
 *             bigger than the limit fail with ENOMEM; then calloc of the
 *             range's sizes until NULL, every block zero.
 *   realloc   a request bigger than the limit fails (ENOMEM) and leaves the
 *             block intact; then the newest block grows by doubling until
 *             realloc fails, its old bytes checked at each step and intact
 *             after the failure; a shrink either succeeds or leaves the block
 *             intact.
 *   memalign  posix_memalign at alignments 64 B .. 2 MiB until each returns
 *             ENOMEM (never EINVAL), every pointer aligned.
 *   (every block checked, all freed)
 *   round2    as round1: memory given back must be reusable, at least 80%
 *             of round1 (the bar the requirement sets against glibc: how
 *             an exhausted limit splits between blocks and an allocator's
 *             fixed costs depends on the order sizes came in).
 * With more than one TIER, the first runs once more after the last
 * (`again`): at least 80% of its round1, so memory given back by every other
 * range is reusable by the first one.
 *
 * Output: `TIER.PHASE BYTES` lines (bytes requested and obtained; for
 * realloc the size the grown block reached; `TIER.blocks` a count), and
 * `error: ...` lines for failed checks (the first 50) and `failed_checks N`.
 * Exit 0 only if every check passed. Output goes through write(2) from
 * stack buffers: nothing here allocates but the calls under test. Blocks
 * are chained through their own first 16 bytes (next pointer, size, seed),
 * so no bookkeeping array takes memory either.
 *
 * For diagnosis, OOM_MAPS_DIR=DIR copies /proc/self/maps to
 * DIR/TIER.{round1,freed,again}.maps (at exhaustion, after everything was
 * freed, at exhaustion after the other ranges) and prints malloc_stats()
 * on stderr at the same points. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

struct blk {
    struct blk *next;
    uint32_t size; /* bytes requested, < 4 GiB */
    uint32_t seed;
};

struct tier {
    const char *name;
    size_t min, max; /* sizes drawn, inclusive */
};

static const struct tier tiers[] = {
    {"tiny", 16, 1024},
    {"tiny8k", 1025, 8 * KiB},
    {"pool", 8 * KiB + 1, 52 * KiB},
    {"l25", 52 * KiB + 1, 1 * MiB},
    {"large", 1 * MiB + 1, 8 * MiB},
    {"mixed", 16, 8 * MiB}, /* a range above, drawn at random, then a size in it */
};
#define NTIERS (sizeof tiers / sizeof tiers[0])

static int errors;
static size_t limit; /* RLIMIT_AS */

static void out(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    for (int off = 0; off < n;) {
        ssize_t w = write(1, buf + off, (size_t)(n - off));
        if (w <= 0) return;
        off += (int)w;
    }
}

#define error(...)                                                                                 \
    do {                                                                                           \
        errors++;                                                                                  \
        if (errors <= 50) out("error: " __VA_ARGS__);                                              \
    } while (0)

/* OOM_MAPS_DIR (see the top): open, read and write only, nothing
 * allocates. */
static void dump_maps(const char *tier, const char *when) {
    const char *dir = getenv("OOM_MAPS_DIR");
    if (dir == NULL || *dir == '\0') return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s.maps", dir, tier, when);
    int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    int o = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    char buf[65536];
    ssize_t n;
    while (in >= 0 && o >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(o, buf, (size_t)n) != n) break;
    if (in >= 0) close(in);
    if (o >= 0) close(o);
    /* and the allocator's own account on stderr (glibc, hakmem) */
    char mark[256];
    int m = snprintf(mark, sizeof mark, "== malloc_stats %s.%s\n", tier, when);
    if (m > 0 && write(2, mark, (size_t)m) < 0) return;
    malloc_stats();
}

/* xorshift64*: the same sequence of sizes under every allocator. */
static uint64_t rng_state;
static uint64_t rng(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static size_t rng_in(size_t lo, size_t hi) {
    return lo + (size_t)(rng() % (hi - lo + 1));
}

/* The pattern word at 8-byte aligned offset i; a byte at offset i is byte
 * i % 8 of the word at i & ~7 (little-endian, as memcpy of the word). */
static inline uint64_t pat(uint32_t seed, size_t i) {
    uint64_t x = ((uint64_t)seed << 32 | (uint32_t)i) * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}
static inline uint8_t pat_byte(uint32_t seed, size_t i) {
    return (uint8_t)(pat(seed, i & ~(size_t)7) >> 8 * (i & 7));
}

/* Pattern over bytes [from, size) of a block; the header is written apart. */
static void fill(struct blk *b, size_t from) {
    uint8_t *p = (uint8_t *)b;
    size_t size = b->size, i = from < sizeof *b ? sizeof *b : from;
    for (; i < size && (i & 7); i++)
        p[i] = pat_byte(b->seed, i);
    for (; i + 8 <= size; i += 8) {
        uint64_t v = pat(b->seed, i);
        memcpy(p + i, &v, 8);
    }
    for (; i < size; i++)
        p[i] = pat_byte(b->seed, i);
}

/* Bytes [16, upto) hold the pattern of seed. */
static bool check(const struct blk *b, uint32_t seed, size_t upto) {
    const uint8_t *p = (const uint8_t *)b;
    size_t i = sizeof *b;
    for (; i < upto && (i & 7); i++)
        if (p[i] != pat_byte(seed, i)) return false;
    for (; i + 8 <= upto; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        if (v != pat(seed, i)) return false;
    }
    for (; i < upto; i++)
        if (p[i] != pat_byte(seed, i)) return false;
    return true;
}

struct chain {
    struct blk *head;
    size_t n, bytes;
};

static uint32_t next_seed;

static void push(struct chain *c, void *p, size_t size) {
    struct blk *b = p;
    b->size = (uint32_t)size;
    b->seed = ++next_seed;
    fill(b, 0);
    b->next = c->head;
    c->head = b;
    c->n++;
    c->bytes += size;
}

static void verify_all(const char *tier, const char *when, const struct chain *c) {
    size_t n = 0, bytes = 0, bad = 0;
    for (const struct blk *b = c->head; b; b = b->next) {
        if (!check(b, b->seed, b->size) && bad++ == 0)
            error("%s: %s: block %p of %u bytes corrupted\n", tier, when, (void *)b, b->size);
        n++;
        bytes += b->size;
    }
    if (n != c->n || bytes != c->bytes)
        error("%s: %s: chain has %zu blocks / %zu bytes, expected %zu / %zu\n", tier, when, n,
              bytes, c->n, c->bytes);
    if (bad > 1) error("%s: %s: %zu blocks corrupted in all\n", tier, when, bad);
}

static void free_all(struct chain *c) {
    struct blk *b = c->head;
    while (b) {
        struct blk *next = b->next;
        free(b);
        b = next;
    }
    c->head = NULL;
    c->n = c->bytes = 0;
}

static size_t draw(const struct tier *t, size_t cap) {
    size_t lo = t->min, hi = t->max;
    if (t == &tiers[NTIERS - 1]) { /* mixed: a range first */
        const struct tier *r = &tiers[rng() % (NTIERS - 1)];
        lo = r->min;
        hi = r->max;
    }
    if (hi > cap) hi = cap;
    if (lo > hi) lo = t->min;
    if (lo > hi) hi = lo;
    return rng_in(lo, hi);
}

/* Allocate until a request of the smallest size fails; after each NULL the
 * sizes drawn are capped at half the size that failed. */
static void fill_until_null(const struct tier *t, const char *phase, struct chain *c,
                            bool use_calloc) {
    size_t cap = t->max;
    for (;;) {
        size_t size = draw(t, cap);
        errno = 0;
        void *p = use_calloc ? calloc(1, size) : malloc(size);
        if (p == NULL) {
            int e = errno;
            if (e != ENOMEM)
                error("%s: %s: %s(%zu) returned NULL with errno %d (%s), not ENOMEM\n", t->name,
                      phase, use_calloc ? "calloc" : "malloc", size, e, strerror(e));
            if (size <= t->min) break;
            cap = size / 2 > t->min ? size / 2 : t->min;
            continue;
        }
        if ((uintptr_t)p % 16 != 0) error("%s: %s: %p not 16-byte aligned\n", t->name, phase, p);
        if (use_calloc) {
            const uint8_t *q = p;
            for (size_t i = 0; i < size; i++)
                if (q[i] != 0) {
                    error("%s: %s: calloc(1, %zu) byte %zu is %u, not 0\n", t->name, phase, size, i,
                          q[i]);
                    break;
                }
        }
        push(c, p, size);
    }
}

/* Requests that cannot fit fail cleanly. */
static void expect_enomem(const char *tier, const char *what, void *p, int e) {
    if (p != NULL) {
        error("%s: %s succeeded at exhaustion\n", tier, what);
        free(p);
    } else if (e != ENOMEM) {
        error("%s: %s: errno %d (%s), not ENOMEM\n", tier, what, e, strerror(e));
    }
}

static size_t phase_calloc(const struct tier *t, struct chain *c) {
    volatile size_t huge = SIZE_MAX / 2; /* hidden from the compiler's size checks */
    errno = 0;
    void *p = calloc(huge, 4);
    expect_enomem(t->name, "calloc(SIZE_MAX/2, 4)", p, errno);
    errno = 0;
    p = calloc(limit / 16, 16); /* the whole address-space limit */
    expect_enomem(t->name, "calloc(limit/16, 16)", p, errno);
    size_t before = c->bytes;
    fill_until_null(t, "calloc", c, true);
    return c->bytes - before;
}

/* Returns the largest size the grown block reached. */
static size_t phase_realloc(const struct tier *t, struct chain *c) {
    if (c->head == NULL) {
        error("%s: realloc: no block to work on\n", t->name);
        return 0;
    }
    struct blk *b = c->head;
    uint32_t seed = b->seed;
    size_t size = b->size;

    /* Bigger than the whole limit: NULL, ENOMEM, block untouched. */
    errno = 0;
    void *p = realloc(b, limit);
    int e = errno;
    if (p != NULL) {
        error("%s: realloc(%zu) to the whole limit succeeded\n", t->name, size);
        c->head = b = p; /* keep the chain valid whatever happened */
        b->size = (uint32_t)size;
    } else {
        if (e != ENOMEM) error("%s: realloc to the limit: errno %d, not ENOMEM\n", t->name, e);
        if (b->size != size || b->seed != seed || !check(b, seed, size))
            error("%s: failed realloc changed the block\n", t->name);
    }

    /* Grow the newest block by doubling until realloc fails. */
    size_t reached = size;
    for (;;) {
        size_t want = size * 2;
        if (want >= ((size_t)1 << 32) || want >= limit) break;
        errno = 0;
        p = realloc(b, want);
        e = errno;
        if (p == NULL) {
            if (e != ENOMEM)
                error("%s: realloc(%zu -> %zu): errno %d (%s), not ENOMEM\n", t->name, size, want,
                      e, strerror(e));
            if (b->size != size || b->seed != seed || !check(b, seed, size))
                error("%s: realloc(%zu -> %zu) failed and changed the block\n", t->name, size,
                      want);
            break;
        }
        b = p;
        if (b->size != size || b->seed != seed || !check(b, seed, size))
            error("%s: realloc(%zu -> %zu) lost the block's bytes\n", t->name, size, want);
        c->head = b;
        c->bytes += want - size;
        b->size = (uint32_t)want;
        fill(b, size);
        size = reached = want;
    }

    /* Shrink to a quarter: may move (and so fail at exhaustion), never lose data. */
    size_t small = size / 4 > sizeof *b ? size / 4 : sizeof *b;
    errno = 0;
    p = realloc(b, small);
    e = errno;
    if (p == NULL) {
        if (e != ENOMEM) error("%s: realloc shrink: errno %d, not ENOMEM\n", t->name, e);
        if (!check(b, b->seed, size))
            error("%s: failed realloc shrink changed the block\n", t->name);
    } else {
        b = p;
        if (!check(b, b->seed, small))
            error("%s: realloc shrink lost the block's bytes\n", t->name);
        c->head = b;
        c->bytes -= size - small;
        b->size = (uint32_t)small;
    }
    return reached;
}

static size_t phase_memalign(const struct tier *t, struct chain *c) {
    static const size_t aligns[] = {64, 4 * KiB, 64 * KiB, 2 * MiB};
    size_t before = c->bytes;
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        size_t cap = t->max;
        for (int i = 0; i < 1000000; i++) {
            size_t size = draw(t, cap);
            void *p = (void *)&before; /* must stay as it is on failure */
            void *const sentinel = p;
            int r = posix_memalign(&p, aligns[a], size);
            if (r != 0) {
                if (r != ENOMEM)
                    error("%s: posix_memalign(%zu, %zu) returned %d, not ENOMEM\n", t->name,
                          aligns[a], size, r);
                if (p != sentinel)
                    error("%s: failed posix_memalign changed its pointer\n", t->name);
                if (size <= t->min) break;
                cap = size / 2 > t->min ? size / 2 : t->min;
                continue;
            }
            if ((uintptr_t)p % aligns[a] != 0)
                error("%s: posix_memalign(%zu, %zu) = %p, misaligned\n", t->name, aligns[a], size,
                      p);
            push(c, p, size);
        }
    }
    return c->bytes - before;
}

/* One round: fill, check, return the bytes obtained; the chain stays. */
static size_t round_fill(const struct tier *t, const char *phase, struct chain *c) {
    fill_until_null(t, phase, c, false);
    verify_all(t->name, phase, c);
    if (c->n == 0) error("%s: %s: not a single block\n", t->name, phase);
    return c->bytes;
}

static size_t run_tier(const struct tier *t) {
    struct chain c = {0};
    rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)(t - tiers) * 0x100000001B3ull;

    size_t r1 = round_fill(t, "round1", &c);
    dump_maps(t->name, "round1");
    out("%s.round1 %zu\n", t->name, r1);
    out("%s.blocks %zu\n", t->name, c.n);
    out("%s.calloc %zu\n", t->name, phase_calloc(t, &c));
    out("%s.realloc %zu\n", t->name, phase_realloc(t, &c));
    out("%s.memalign %zu\n", t->name, phase_memalign(t, &c));
    verify_all(t->name, "after calloc/realloc/memalign", &c);
    free_all(&c);
    dump_maps(t->name, "freed");

    size_t r2 = round_fill(t, "round2", &c);
    out("%s.round2 %zu\n", t->name, r2);
    if (r2 < r1 / 10 * 8)
        error("%s: round2 got %zu bytes, less than 80%% of round1's %zu\n", t->name, r2, r1);
    free_all(&c);
    return r1;
}

int main(int argc, char **argv) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
        out("oom_tiers: no address-space limit: run under `ulimit -v KiB`\n");
        return 2;
    }
    limit = rl.rlim_cur;
    if (argc < 2) {
        out("usage: oom_tiers TIER...   (tiny tiny8k pool l25 large mixed)\n");
        return 2;
    }
    const struct tier *first = NULL;
    size_t first_r1 = 0;
    for (int i = 1; i < argc; i++) {
        const struct tier *t = NULL;
        for (size_t k = 0; k < NTIERS; k++)
            if (strcmp(argv[i], tiers[k].name) == 0) t = &tiers[k];
        if (t == NULL) {
            out("oom_tiers: unknown tier %s\n", argv[i]);
            return 2;
        }
        size_t r1 = run_tier(t);
        if (first == NULL) {
            first = t;
            first_r1 = r1;
        }
    }
    if (argc > 2) { /* the first range again, after all the others gave back */
        struct chain c = {0};
        size_t r = round_fill(first, "again", &c);
        dump_maps(first->name, "again");
        out("%s.again %zu\n", first->name, r);
        if (r < first_r1 / 10 * 8)
            error("%s: after the other ranges were freed got %zu bytes, less than 80%% of its "
                  "first %zu\n",
                  first->name, r, first_r1);
        free_all(&c);
    }
    out("failed_checks %d\n", errors);
    return errors ? 1 : 0;
}
