/* Fault injection at the OS boundary (HAK_FAULT_INJECT, core/box/os.h): a
 * mixed workload touching every tier runs again and again while the N-th OS
 * call fails (one sweep), and every call from the N-th on fails (another),
 * for every N the workload reaches. Each API call must either succeed or
 * fail cleanly (NULL or ENOMEM with errno ENOMEM, a failed realloc leaving
 * its block as it was); no live block may change; no lock may stay taken;
 * and once the faults stop, everything works as before. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/mman.h>

#include "box/arena.h"
#include "box/config.h"
#include "box/os.h"
#include "hakmem.h"
#include "maps.h"
#include "superslab/ss.h"
#include "timing.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- blocks with a pattern --------------------------------------------------------- */

struct blk {
    uint8_t *p;
    size_t n;
    uint8_t seed;
};

static uint8_t pat(uint8_t seed, size_t i) {
    return (uint8_t)(seed + i * 31 + (i >> 9));
}

static void fill(struct blk *b) {
    for (size_t i = 0; i < b->n; i += (i < 4096 ? 1 : 61))
        b->p[i] = pat(b->seed, i);
    if (b->n) b->p[b->n - 1] = pat(b->seed, b->n - 1);
}

/* The block still holds its pattern (the first `n` bytes of it). */
static void check(const struct blk *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i += (i < 4096 ? 1 : 61))
        if (b->p[i] != pat(b->seed, i))
            fail_msg("%s: block %p of %zu B changed at byte %zu", what, (void *)b->p, b->n, i);
}

/* A failure must be NULL with errno ENOMEM. */
static bool got(void *p, const char *call, size_t n) {
    if (p != NULL) return true;
    if (errno != ENOMEM) fail_msg("%s(%zu) = NULL with errno %d, not ENOMEM", call, n, errno);
    return false;
}

/* ---- a worker that frees blocks of other threads ---------------------------------- */

struct handoff {
    pthread_mutex_t m;
    pthread_cond_t c;
    struct blk b[16];
    int n;
    bool quit;
};

static void *worker(void *arg) {
    struct handoff *h = arg;
    pthread_mutex_lock(&h->m);
    for (;;) {
        while (h->n == 0 && !h->quit)
            pthread_cond_wait(&h->c, &h->m);
        if (h->n == 0) break;
        struct blk b = h->b[--h->n];
        pthread_mutex_unlock(&h->m);
        check(&b, b.n, "handed to another thread");
        free(b.p); /* a remote free */
        pthread_mutex_lock(&h->m);
        pthread_cond_broadcast(&h->c);
    }
    pthread_mutex_unlock(&h->m);
    return NULL;
}

/* Hand b to a new thread, which frees it and exits (thread exit paths too). */
static void free_elsewhere(struct blk b) {
    struct handoff h = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};
    pthread_t t;
    if (pthread_create(&t, NULL, worker, &h) != 0) { /* no thread: free it here */
        free(b.p);
        return;
    }
    pthread_mutex_lock(&h.m);
    h.b[h.n++] = b;
    h.quit = true;
    pthread_cond_broadcast(&h.c);
    pthread_mutex_unlock(&h.m);
    pthread_join(t, NULL);
}

/* ---- the workload ------------------------------------------------------------------ */

/* Every tier, its edges, calloc, realloc across tiers, aligned requests,
 * frees here and in another thread, and malloc_trim (which gives memory
 * back: decommit, uncommit, unmap). Returns how many requests failed. */
static int workload(uint8_t seed) {
    static const size_t sizes[] = {16,      100,     1024,    1025,  5000,   8192,
                                   8193,    30000,   53248,   53249, 200000, 1 * MiB,
                                   MiB + 1, 3 * MiB, 9 * MiB, 48,    700,    60000};
    enum { N = sizeof sizes / sizeof sizes[0] };
    struct blk b[N + 8];
    int nb = 0, failures = 0;
    for (int i = 0; i < N; i++) {
        errno = 0;
        void *p = malloc(sizes[i]);
        if (!got(p, "malloc", sizes[i])) {
            failures++;
            continue;
        }
        b[nb] = (struct blk){p, sizes[i], (uint8_t)(seed + i)};
        fill(&b[nb++]);
    }
    /* calloc: zero, in a small tier and in Large. */
    static const size_t csizes[] = {300, 20000, 300000, 2 * MiB};
    for (size_t i = 0; i < sizeof csizes / sizeof csizes[0]; i++) {
        errno = 0;
        uint8_t *p = calloc(1, csizes[i]);
        if (!got(p, "calloc", csizes[i])) {
            failures++;
            continue;
        }
        for (size_t k = 0; k < csizes[i]; k += 509)
            if (p[k] != 0) fail_msg("calloc(%zu): byte %zu is %d", csizes[i], k, p[k]);
        free(p);
    }
    /* Aligned requests in every tier. */
    static const size_t aligns[] = {64, 4096, 64 * KiB, 2 * MiB};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        void *p = NULL;
        int rc = posix_memalign(&p, aligns[i], 3000 * (i + 1));
        if (rc != 0) {
            if (rc != ENOMEM) fail_msg("posix_memalign(%zu) = %d", aligns[i], rc);
            failures++;
            continue;
        }
        if ((uintptr_t)p % aligns[i]) fail_msg("posix_memalign(%zu) = %p", aligns[i], p);
        memset(p, 0x5a, 3000 * (i + 1));
        free(p);
    }
    /* A buffer grown through every tier and shrunk again. (From an empty
     * Large cache: under this test's address-space limit its growth then
     * goes through the size classes in every run alike, rather than
     * sometimes through a cached mapping, whose pages it may populate.) */
    malloc_trim(0);
    static const size_t steps[] = {24, 3000, 12000, 90000, 900000, 2 * MiB, 6 * MiB, 50000, 40};
    struct blk g = {NULL, 0, (uint8_t)(seed ^ 0x55)};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        errno = 0;
        uint8_t *q = realloc(g.p, steps[i]);
        if (!got(q, "realloc", steps[i])) {
            failures++;
            if (g.p) check(&g, g.n, "realloc failed"); /* the old block is intact */
            continue;
        }
        size_t keep = g.n < steps[i] ? g.n : steps[i];
        g.p = q;
        check(&g, keep, "realloc kept");
        g.n = steps[i];
        fill(&g);
    }
    free(g.p);
    /* Free in another thread, then here; trim in between. */
    for (int i = 0; i < nb; i++)
        check(&b[i], b[i].n, "live");
    for (int i = 0; i < nb; i += 3)
        free_elsewhere(b[i]);
    malloc_trim(0);
    for (int i = 0; i < nb; i++) {
        if (i % 3 == 0) continue;
        check(&b[i], b[i].n, "live across trim");
        free(b[i].p);
    }
    malloc_trim(0);
    return failures;
}

/* ---- the sweeps -------------------------------------------------------------------- */

static int sweep_step;

/* Hang limits (scaled: tests/timing.h). A faulted run and the run after it
 * take up to 0.1 s in the debug build (0.15 s under UBSan, 0.46 s under
 * TSan); the fork and thread after the sweeps, and each fresh process
 * (0.25 s at most), no longer. A hang is a lock left taken, or a retry
 * that never ends. */
#define RUN_LIMIT_BASE_MS   20000
#define FRESH_LIMIT_BASE_MS 30000

/* The workload with `count` failures from the call after `skip`; then,
 * faults off, it must run without a single failure. */
static int run_faulted(uint64_t skip, uint64_t count) {
    malloc_trim(0); /* start from nothing cached: the workload maps again */
    char what[128];
    snprintf(what, sizeof what,
             "a workload run, OS calls after the first %llu failing (%s; a lock left taken?)",
             (unsigned long long)skip, count == 1 ? "one" : "all");
    hak_test_alarm(RUN_LIMIT_BASE_MS, what);
    os_fault_arm(skip, count);
    int failed = workload((uint8_t)(skip * 7 + count));
    os_fault_disarm();
    if (workload((uint8_t)skip) != 0)
        fail_msg("fault window %llu+%llu: the workload still fails after the faults stopped",
                 (unsigned long long)skip, (unsigned long long)count);
    alarm(0);
    sweep_step++;
    return failed;
}

/* OS calls of one workload run. */
static uint64_t calls_per_run(void) {
    malloc_trim(0);
    os_fault_arm(UINT64_MAX, 0); /* count, fail nothing */
    workload(1);
    uint64_t n = os_fault_seen();
    os_fault_disarm();
    return n;
}

static uint64_t injected(void) {
    uint64_t n = 0;
    for (int s = 0; s < OS_NSITES; s++)
        n += os_fault_site_failed((enum os_site)s);
    return n;
}

/* Run the workload with the failures starting at each call it makes; how
 * many runs saw a request fail. */
static int sweep(uint64_t count) {
    uint64_t total = calls_per_run(), before = injected();
    assert_true(total > 20);
    int failing_runs = 0;
    /* A few past the count: the workload's calls vary with what is cached. */
    for (uint64_t n = 0; n < total + 8; n++)
        failing_runs += run_faulted(n, count) > 0;
    print_message("%llu OS calls per run; %llu failed on purpose; %d of %llu runs had requests "
                  "fail\n",
                  (unsigned long long)total, (unsigned long long)(injected() - before),
                  failing_runs, (unsigned long long)total + 8);
    assert_true(injected() - before >= total / 2);
    return failing_runs;
}

/* One call fails: the N-th. The allocator may absorb it (retry after
 * trimming its caches, a smaller chunk, a mapping of the block's own). */
static void test_each_call_failing_once(void **state) {
    (void)state;
    sweep(1);
}

/* Every call fails from the N-th on (out of memory for good), until it
 * stops: requests must fail, cleanly. */
static void test_every_call_failing_from_each_point(void **state) {
    (void)state;
    assert_true(sweep(UINT64_MAX) > 0);
}

/* Memory given back reads as zero even when the OS refuses both ways of
 * dropping its pages (a fresh mapping over it, then madvise): the arena
 * hands the place out again as zeroed memory, and the tiers rely on it
 * (chunk headers, bitmaps). */
static void test_uncommit_refused_still_zero(void **state) {
    (void)state;
    size_t size = 4 * MiB;
    uint8_t *r = os_reserve(&size, size, 2 * MiB);
    assert_non_null(r);
    assert_true(os_commit(r, 2 * MiB));
    memset(r, 0xa5, 2 * MiB);
    os_fault_only(1u << OS_SITE_UNCOMMIT_MAP | 1u << OS_SITE_UNCOMMIT_DROP);
    os_fault_arm(0, UINT64_MAX);
    os_uncommit(r, 2 * MiB);
    os_fault_disarm();
    os_fault_only(~0u);
    assert_int_equal(os_fault_site_failed(OS_SITE_UNCOMMIT_DROP) > 0, 1);
    assert_true(os_commit(r, 2 * MiB));
    for (size_t k = 0; k < 2 * MiB; k += 4096)
        if (r[k] != 0) fail_msg("byte %zu of a given-back place reads %#x", k, r[k]);
    os_unmap(r, size);
}

/* The clearing touches only the pages that held something: a range of
 * address space with a few pages in use (checked mode gives back up to an
 * alignment's worth) must not become resident (the checked fuzzer ran out
 * of memory so). */
static void test_uncommit_refused_clears_only_used_pages(void **state) {
    (void)state;
    size_t size = 64 * MiB;
    uint8_t *r = os_reserve(&size, size, 2 * MiB);
    assert_non_null(r);
    assert_true(os_commit(r, 64 * MiB));
    r[0] = 1;
    r[40 * MiB] = 2;
    os_fault_only(1u << OS_SITE_UNCOMMIT_MAP | 1u << OS_SITE_UNCOMMIT_DROP);
    os_fault_arm(0, UINT64_MAX);
    os_uncommit(r, 64 * MiB);
    os_fault_disarm();
    os_fault_only(~0u);
    static unsigned char in[64 * MiB / 4096];
    assert_int_equal(mincore(r, 64 * MiB, in), 0);
    size_t resident = 0;
    for (size_t k = 0; k < sizeof in; k++)
        resident += in[k] & 1;
    if (resident > 16) fail_msg("%zu pages resident after giving back 2 in use", resident);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[40 * MiB], 0);
    os_unmap(r, size);
}

/* Growing the SuperSlab range when making the new part readable is refused:
 * the step is given back and a smaller one taken. */
static void test_range_growth_refused(void **state) {
    (void)state;
    free(malloc(16));
    uintptr_t base;
    size_t span = 0, before = 0;
    arena_ss_grow(&base, &before); /* grows once: the reference size */
    os_fault_only(1u << OS_SITE_RESERVE_PROT);
    os_fault_arm(0, 1);
    span = before;
    bool grew = arena_ss_grow(&base, &span);
    os_fault_disarm();
    os_fault_only(~0u);
    assert_true(grew);
    assert_true(span > before);
    assert_int_equal(*(volatile uint8_t *)(base + span - 1), 0); /* readable */
    assert_int_equal(os_fault_site_failed(OS_SITE_RESERVE_PROT) > 0, 1);
}

/* Under an address-space limit, trimming gives the arena's unused
 * reservation back. When the OS refuses (munmap), the arena must keep
 * counting it as reserved: it used to forget it, and every later attempt to
 * grow there found it taken (a failed mmap and four /proc reads per chunk,
 * and every chunk a mapping of its own). */
static void test_trim_unmap_refused(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* no address-space limit under TSan: trimming keeps reservations */
#endif
    enum { UNITS = 40 };
    void *u[UNITS];
    for (int i = 0; i < UNITS; i++)
        assert_non_null(u[i] = arena_alloc(2 * MiB));
    for (int i = 0; i < UNITS; i++)
        arena_free(u[i], 2 * MiB);
    os_fault_only(1u << OS_SITE_MUNMAP);
    os_fault_arm(0, UINT64_MAX);
    malloc_trim(0);
    os_fault_disarm();
    os_fault_only(~0u);
    struct arena_stats s0, s1;
    arena_get_stats(&s0);
    for (int i = 0; i < UNITS; i++)
        assert_non_null(u[i] = arena_alloc(2 * MiB));
    arena_get_stats(&s1);
    for (int i = 0; i < UNITS; i++)
        arena_free(u[i], 2 * MiB);
    assert_int_equal(s1.fallbacks, s0.fallbacks); /* all from the window */
}

/* A Large block that cannot grow by moving its pages (mremap refused, in
 * place and elsewhere) is copied into a new block, as any block: realloc
 * used to fail. */
static void test_realloc_remap_refused(void **state) {
    (void)state;
    struct blk b = {malloc(2 * MiB), 2 * MiB, 77};
    assert_non_null(b.p);
    fill(&b);
    os_fault_only(1u << OS_SITE_RESIZE | 1u << OS_SITE_MOVE);
    os_fault_arm(0, UINT64_MAX);
    uint8_t *q = realloc(b.p, 8 * MiB);
    os_fault_disarm();
    os_fault_only(~0u);
    assert_non_null(q);
    b.p = q;
    check(&b, b.n, "realloc copied");
    assert_true(os_fault_site_failed(OS_SITE_MOVE) > 0);
    free(q);
}

/* A block realloc grew takes free_sized with the size realloc was given,
 * whichever tier served it. Found by fuzz_api: growing 200 KiB to 300 KiB,
 * the growing Large block and the L2.5 block for half as much again were
 * refused, the last resort was a Large block of the 450 KiB class's size,
 * and free_sized(q, 300 KiB) aborted with a size mismatch. Here the first
 * k OS calls of the realloc fail, for every k up to where nothing fails. */
static void test_free_sized_after_refused_growth(void **state) {
    (void)state;
    const size_t from = 200 * KiB, to = 300 * KiB;
    for (uint64_t k = 1; k < 64; k++) {
        struct blk b = {malloc(from), from, (uint8_t)k};
        assert_non_null(b.p);
        fill(&b);
        malloc_trim(0); /* no cached bundle or mapping: each tier asks the OS */
        os_fault_arm(0, k);
        uint8_t *q = realloc(b.p, to);
        os_fault_disarm();
        if (q == NULL) {
            check(&b, from, "realloc refused");
            hak_free_sized(b.p, from);
            continue;
        }
        b.p = q;
        check(&b, from, "realloc");
        hak_free_sized(q, to);
    }
}

/* free() leaves errno alone, even when giving memory back is refused (found
 * by fuzz_api: the fifth of five 3 MiB blocks freed pushed the oldest out of
 * the BigCache, its munmap failed and free returned with errno ENOMEM;
 * tests/fuzz/regress/fuzz_api/free-errno-munmap-fails). */
static void test_free_keeps_errno_when_unmap_refused(void **state) {
    (void)state;
    void *p[5];
    for (int i = 0; i < 5; i++)
        assert_non_null(p[i] = malloc(3 * MiB));
    os_fault_only(1u << OS_SITE_MUNMAP | 1u << OS_SITE_DECOMMIT | 1u << OS_SITE_UNCOMMIT_MAP);
    os_fault_arm(0, UINT64_MAX);
    for (int i = 0; i < 5; i++) {
        errno = 1234;
        free(p[i]);
        if (errno != 1234) fail_msg("free #%d changed errno to %d", i, errno);
    }
    errno = 1234;
    malloc_trim(0);
    os_fault_disarm();
    os_fault_only(~0u);
    assert_true(os_fault_site_failed(OS_SITE_MUNMAP) > 0);
}

/* Site counts of this process, plus those a child sent (fault_child_sites). */
static uint64_t site_calls[OS_NSITES], site_failed[OS_NSITES];

static void add_sites(void) {
    for (int s = 0; s < OS_NSITES; s++) {
        site_calls[s] += os_fault_site_calls((enum os_site)s);
        site_failed[s] += os_fault_site_failed((enum os_site)s);
    }
}

/* Under mlockall(MCL_CURRENT | MCL_FUTURE), as some daemons run, the OS
 * boundary locks and unlocks too: both sweeps in a child that locks all its
 * memory; it sends its site counts back. Skipped where mlockall is not
 * allowed (or is a no-op: sanitizers). */
static void test_sweeps_under_mlockall(void **state) {
    (void)state;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE)) _exit(77);
        sweep(1);
        sweep(UINT64_MAX);
        uint64_t c[2][OS_NSITES];
        for (int s = 0; s < OS_NSITES; s++) {
            c[0][s] = os_fault_site_calls((enum os_site)s);
            c[1][s] = os_fault_site_failed((enum os_site)s);
        }
        _exit(write(fd[1], c, sizeof c) == (ssize_t)sizeof c ? 0 : 3);
    }
    close(fd[1]);
    uint64_t c[2][OS_NSITES];
    ssize_t n = read(fd[0], c, sizeof c);
    close(fd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) skip();
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(n, (ssize_t)sizeof c);
    for (int s = 0; s < OS_NSITES; s++) {
        site_calls[s] += c[0][s];
        site_failed[s] += c[1][s];
    }
}

/* After the sweeps: fork (whose handlers take every allocator lock)
 * completes, a new thread allocates, and every site reached was made to
 * fail (each site's failure path has run). */
static void test_locks_free_and_sites_covered(void **state) {
    (void)state;
    hak_test_alarm(RUN_LIMIT_BASE_MS,
                   "fork and a new thread after the sweeps (a lock left taken?)");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(workload(3) == 0 ? 0 : 1);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    struct blk b = {malloc(100000), 100000, 9};
    assert_non_null(b.p);
    fill(&b);
    free_elsewhere(b);
    alarm(0);
    add_sites();
    int covered = 0, reached = 0;
    for (int s = 0; s < OS_NSITES; s++) {
        uint64_t calls = site_calls[s], failed = site_failed[s];
        print_message("  %-28s %8llu calls %6llu failed\n", os_fault_site_name((enum os_site)s),
                      (unsigned long long)calls, (unsigned long long)failed);
        reached += calls > 0;
        covered += failed > 0;
    }
    print_message("sites failed on purpose: %d of %d reached (%d in all)\n", covered, reached,
                  OS_NSITES);
    /* Every site the workload reaches had its failure path run. (Under
     * TSan, whose mmap drops hints, the arena reserves its whole window at
     * once: the calls that would grow it are made before any fault.) */
#ifndef HAK_TEST_TSAN
    assert_int_equal(covered, reached);
#endif
}

/* ---- fresh processes (this binary re-executed) ---------------------------------------- */

/* Under an address-space limit whose 1/32 is no power of two of 2 MiB
 * (200 MB: 6 MiB), a refused growth step is halved: steps must stay whole
 * SuperSlabs (a 3 MiB step left the range never full again, every Tiny
 * refill a refused mprotect, its blocks served one by one elsewhere; with
 * the window reserved whole, SuperSlabs outside the range: free aborted). */
static int child_odd_step(void) {
    struct rlimit rl = {200ul << 20, 200ul << 20};
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 2;
    void *p = malloc(64); /* the window is placed */
    os_fault_only(1u << OS_SITE_RESERVE_AT);
    os_fault_arm(0, 1); /* the next growth in place is refused once */
    size_t out = 0;
    for (int i = 0; i < 8 * 31744; i++) {
        void *q = malloc(64);
        if (q == NULL) return 3;
        out += !ss_contains(q);
    }
    os_fault_disarm();
    free(p);
    if (ss_bounds.span % (2u << 20)) return 4;
    return out == 0 ? 0 : 5;
}

/* A commit the OS refuses (RLIMIT_DATA, strict overcommit) under an
 * address-space limit: malloc must come back with NULL. Its retry after a
 * trim used to go on for ever: each try reserved address space, the commit
 * failed, the trim gave the reservation back (progress!), and again. */
static int child_data_limit(void) {
    struct rlimit as = {4ul << 30, 4ul << 30}, data = {64ul << 20, 64ul << 20};
    if (setrlimit(RLIMIT_AS, &as) != 0 || setrlimit(RLIMIT_DATA, &data) != 0) return 2;
    /* (A retry for ever is caught by main's alarm.) */
    static const size_t sizes[] = {64, 4000, 20000, 100000};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = 0;
        void *first = NULL, *q;
        errno = 0;
        while ((q = malloc(sizes[k])) != NULL) {
            *(void **)q = first; /* a chain, freed below */
            first = q;
            n++;
        }
        if (errno != ENOMEM || n == 0) return 3;
        while (first) {
            q = *(void **)first;
            free(first);
            first = q;
        }
    }
    return 0;
}

/* A program probing with impossible sizes (malloc(SIZE_MAX)) must not pay
 * a trim per probe: each used to drop the thread's current Pool chunk, and a
 * new 8 MiB chunk came for every 20 KB block kept (8 GiB of address space
 * for 20 MB). */
static int child_huge_probe(void) {
    static void *keep[1000];
    for (int i = 0; i < 1000; i++) {
        keep[i] = malloc(20000);
        if (keep[i] == NULL) return 2;
        memset(keep[i], 1, 20000);
        errno = 0;
        if (malloc(SIZE_MAX) != NULL || errno != ENOMEM) return 3;
    }
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long vsz = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmSize:", 7) == 0) vsz = atol(line + 7);
    if (f) fclose(f);
    return vsz >= 0 && vsz < (1l << 20) ? 0 : 4; /* KiB: under 1 GiB */
}

static const struct {
    const char *name;
    int (*fn)(void);
} children[] = {{"odd-step", child_odd_step},
                {"data-limit", child_data_limit},
                {"huge-probe", child_huge_probe}};

static void run_fresh(const char *name) {
#ifdef HAK_TEST_TSAN
    skip(); /* TSan cannot run under an address-space limit */
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[] = {"test_fault", (char *)name, NULL};
        execv("/proc/self/exe", argv);
        _exit(21);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: child status 0x%x (exit codes: see child_*)", name, st);
}

static void test_odd_growth_steps_stay_whole(void **state) {
    (void)state;
    run_fresh("odd-step");
}
static void test_commit_refused_under_limit_ends(void **state) {
    (void)state;
    run_fresh("data-limit");
}
static void test_impossible_sizes_trim_nothing(void **state) {
    (void)state;
    run_fresh("huge-probe");
}

int main(int argc, char **argv) {
    for (size_t i = 0; argc == 2 && i < sizeof children / sizeof children[0]; i++)
        if (strcmp(argv[1], children[i].name) == 0) {
            hak_test_alarm(FRESH_LIMIT_BASE_MS, children[i].name); /* (dies of SIGALRM) */
            return children[i].fn();
        }
#ifndef HAK_TEST_TSAN
    /* Under an address-space limit (a roomy one) trimming also gives back
     * reserved space, so each run grows the arena again: those calls can
     * fail too. (TSan cannot run under one.) */
    struct rlimit rl = {(rlim_t)64 << 30, (rlim_t)64 << 30};
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 2;
#endif
    hak_cfg.hugepages = HAK_HUGE_LARGE; /* Large mappings ask for huge pages: one more call */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_uncommit_refused_still_zero, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_uncommit_refused_clears_only_used_pages, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_each_call_failing_once, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_every_call_failing_from_each_point, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_range_growth_refused, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_trim_unmap_refused, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_realloc_remap_refused, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_free_sized_after_refused_growth, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_free_keeps_errno_when_unmap_refused, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_sweeps_under_mlockall, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_odd_growth_steps_stay_whole, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_commit_refused_under_limit_ends, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_impossible_sizes_trim_nothing, hak_test_alarm_off),
        cmocka_unit_test_teardown(test_locks_free_and_sites_covered, hak_test_alarm_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
