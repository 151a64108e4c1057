/* Tiny tier through malloc/free: the thread cache's pre-warm, remote frees
 * under concurrency (no block lost, none handed out twice), the remote list
 * itself, adoption of an exited thread's slabs, SuperSlabs going back to the
 * OS, and the bad pointers Tiny must reject.
 *
 * Blocks are tracked by address in a "live map": one byte per 16-byte
 * granule of every 2 MiB region seen, set when malloc hands the block out
 * and cleared before it is freed; setting a set byte means the allocator
 * handed out a block that was still live. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/config.h"
#include "box/os.h"
#include "box/rmap.h"
#include "sizeclass.h"
#include "superslab/ss.h"
#include "tcache.h"
#include "tiny.h"

#include "maps.h"
#include "timing.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Test memory that is not hakmem's: anonymous mappings, zeroed. */
static void *test_map(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* ---- live map ------------------------------------------------------------------ */

#define LM_SLOTS    4096u /* 2 MiB regions tracked (8 GiB) */
#define LM_GRANULES (HAK_REGION_SIZE / 16)
#define LM_LIVE     1u
#define LM_MARK     2u /* test-defined: e.g. "was one of the first batch" */

static _Atomic uintptr_t lm_key[LM_SLOTS];
static _Atomic(_Atomic uint8_t *) lm_map[LM_SLOTS];
static _Atomic uint64_t lm_errors;

static _Atomic uint8_t *lm_granule(const void *p) {
    uintptr_t r = ((uintptr_t)p >> HAK_REGION_SHIFT) + 1; /* never 0 */
    uint32_t h = (uint32_t)((r * 0x9e3779b97f4a7c15ull) >> 52) & (LM_SLOTS - 1);
    for (uint32_t probes = 0; probes < LM_SLOTS; probes++, h = (h + 1) & (LM_SLOTS - 1)) {
        uintptr_t k = atomic_load(&lm_key[h]);
        if (k == 0) {
            if (atomic_compare_exchange_strong(&lm_key[h], &k, r)) {
                _Atomic uint8_t *m = mmap(NULL, LM_GRANULES, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (m == MAP_FAILED) abort();
                atomic_store(&lm_map[h], m);
                k = r;
            }
        }
        if (k != r) continue;
        _Atomic uint8_t *m;
        while ((m = atomic_load(&lm_map[h])) == NULL)
            sched_yield();
        return &m[((uintptr_t)p & (HAK_REGION_SIZE - 1)) >> 4];
    }
    abort(); /* table full */
}

/* p was just handed out; returns the granule's old flags. */
static uint8_t lm_alloc(const void *p, uint8_t extra) {
    if (p == NULL || ((uintptr_t)p & 15)) {
        atomic_fetch_add(&lm_errors, 1);
        return 0;
    }
    uint8_t old = atomic_fetch_or(lm_granule(p), (uint8_t)(LM_LIVE | extra));
    if (old & LM_LIVE) atomic_fetch_add(&lm_errors, 1); /* handed out twice */
    return old;
}

/* p is about to be freed. */
static void lm_free(const void *p) {
    uint8_t old = atomic_fetch_and(lm_granule(p), (uint8_t)~LM_LIVE);
    if (!(old & LM_LIVE)) atomic_fetch_add(&lm_errors, 1); /* freed twice, or never live */
}

/* Live blocks in the map, and forget every mark. */
static uint64_t lm_reset(void) {
    uint64_t live = 0;
    for (uint32_t h = 0; h < LM_SLOTS; h++) {
        _Atomic uint8_t *m = atomic_load(&lm_map[h]);
        if (m == NULL) continue;
        uint64_t *w = (uint64_t *)m;
        for (size_t i = 0; i < LM_GRANULES / 8; i++) {
            if (w[i] == 0) continue;
            for (int b = 0; b < 8; b++)
                live += (w[i] >> (8 * b)) & LM_LIVE;
            w[i] = 0;
        }
    }
    atomic_store(&lm_errors, 0);
    return live;
}

/* ---- stats -------------------------------------------------------------------- */

struct totals {
    uint64_t allocs, frees, refills, flushes, remote, adopted;
};

static struct totals tiny_totals(void) {
    struct tiny_class_stats st[TINY_NCLASSES];
    tiny_get_stats(st);
    struct totals t = {0};
    for (int c = 0; c < TINY_NCLASSES; c++) {
        t.allocs += st[c].allocs;
        t.frees += st[c].frees;
        t.refills += st[c].refills;
        t.flushes += st[c].flushes;
        t.remote += st[c].remote_frees;
        t.adopted += st[c].adopted;
    }
    return t;
}

static struct tiny_class_stats class_stats(uint32_t cls) {
    struct tiny_class_stats st[TINY_NCLASSES];
    tiny_get_stats(st);
    return st[cls];
}

static int setup(void **state) {
    (void)state;
    hak_cfg.stats = true;
    hak_cfg.ss_cache = 8;
    lm_reset();
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    hak_cfg.stats = false; /* no summary at exit */
    return 0;
}

/* ---- pre-warm --------------------------------------------------------------------- */

struct prewarm {
    uint32_t before[TINY_NCLASSES], first[TINY_NCLASSES], second[TINY_NCLASSES];
    uint32_t refill[TINY_NCLASSES];
    uint32_t want_first[TINY_NCLASSES], want_refill[TINY_NCLASSES];
};

/* Blocks a refill of `want` carves from s's never-used tail: no further than
 * the blocks starting in the page the tail starts in, at least 4. */
static uint32_t carve_expect(const struct ss_slab *s, uint32_t want) {
    uint32_t at = (uint32_t)s->carved * s->size;
    uint32_t page = (uint32_t)((((at / 4096) + 1) * 4096 - at + s->size - 1) / s->size);
    if (page < TINY_CARVE_MIN) page = TINY_CARVE_MIN;
    uint32_t room = (uint32_t)(s->capacity - s->carved);
    uint32_t n = want < page ? want : page;
    return n < room ? n : room;
}

static void *prewarm_thread(void *arg) {
    struct prewarm *r = arg;
    static void *keep[TINY_NCLASSES][256];
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) {
        size_t size = small_class_size[c];
        uint32_t cap = small_class_cap[c];
        r->before[c] = tc_count(c);
        void *p = malloc(size);
        r->first[c] = tc_count(c);
        /* A fresh slab (setup leaves no orphan): the whole cache's worth,
         * as far as its first page goes. */
        struct ss_slab fresh = *ss_slab_of(p);
        fresh.carved = 0;
        r->want_first[c] = carve_expect(&fresh, cap);
        void *q = malloc(size);
        r->second[c] = tc_count(c);
        /* Empty the cache; the next malloc is a later refill: half a cache,
         * carved (every block of the slab is out) as far as its page goes. */
        uint32_t n = tc_count(c);
        for (uint32_t i = 0; i < n; i++)
            keep[c][i] = malloc(size);
        r->want_refill[c] = carve_expect(ss_slab_of(n ? keep[c][n - 1] : q), cap / 2);
        void *x = malloc(size);
        r->refill[c] = tc_count(c);
        free(x);
        for (uint32_t i = 0; i < n; i++)
            free(keep[c][i]);
        free(q);
        free(p);
    }
    return NULL;
}

static void test_first_malloc_prewarms_cache(void **state) {
    (void)state;
    struct prewarm r;
    memset(&r, 0xff, sizeof r);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, prewarm_thread, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) {
        uint32_t cap = small_class_cap[c], first = r.want_first[c];
        /* At least a page of blocks (and 4), up to the whole cache. */
        assert_true(first == cap ||
                    (first >= TINY_CARVE_MIN && (size_t)first * small_class_size[c] >= 4096));
        if (r.before[c] != 0 || r.first[c] != first - 1 || r.second[c] != first - 2 ||
            r.refill[c] != r.want_refill[c] - 1 || r.want_refill[c] == 0)
            fail_msg("class %u (cap %u): cache held %u before, %u after the first malloc "
                     "(want %u), %u after the second, %u after a later refill (want %u)",
                     c, cap, r.before[c], r.first[c], first - 1, r.second[c], r.refill[c],
                     r.want_refill[c] - 1);
    }
}

/* ---- remote frees under concurrency ------------------------------------------------ */

#define RC_N     200000
#define RC_K     4
#define RC_CHURN 50000  /* blocks the owner holds at most while churning */
#define RC_EXTRA 200000 /* owner operations after the freers are done */
#define RC_MAGIC 0x5a17c0de5a17c0deull

static void **rc_blocks;
static _Atomic int rc_ready, rc_freers_done;
static _Atomic uint64_t rc_bad_pattern, rc_freed;

struct rc_owner {
    uint64_t churn_allocs, churn_frees, reused, failed;
};

static void rc_stamp(void *p, uint64_t id) {
    ((uint64_t *)p)[0] = (uintptr_t)p ^ RC_MAGIC;
    ((uint64_t *)p)[1] = id;
}

static void rc_check(void *p, uint64_t id) {
    if (((uint64_t *)p)[0] != ((uintptr_t)p ^ RC_MAGIC) || ((uint64_t *)p)[1] != id)
        atomic_fetch_add(&rc_bad_pattern, 1);
}

static void *rc_owner_thread(void *arg) {
    struct rc_owner *o = arg;
    uint64_t seed = 0x1234567887654321ull;
    for (uint64_t i = 0; i < RC_N; i++) {
        size_t size = 16 + rng(&seed) % 1009; /* 16 .. 1024 */
        void *p = malloc(size);
        if (p == NULL) {
            o->failed++;
            continue;
        }
        lm_alloc(p, LM_MARK);
        rc_stamp(p, i);
        rc_blocks[i] = p;
    }
    atomic_store(&rc_ready, 1);
    /* Keep allocating and freeing in the same classes while the others
     * free the first batch: refills drain remote lists under pushes. */
    void **mine = test_map(RC_CHURN * sizeof(void *));
    uint32_t n = 0;
    uint64_t after = 0;
    while (after < RC_EXTRA) {
        if (atomic_load(&rc_freers_done) == RC_K) after++;
        uint64_t x = rng(&seed);
        if (n < RC_CHURN && (x & 3) != 0) {
            size_t size = 16 + (x >> 8) % 1009;
            void *p = malloc(size);
            if (p == NULL) {
                o->failed++;
                continue;
            }
            if (lm_alloc(p, 0) & LM_MARK) o->reused++; /* a block another thread freed */
            rc_stamp(p, ~(uint64_t)n);
            mine[n++] = p;
            o->churn_allocs++;
        } else if (n > 0) {
            uint32_t k = (uint32_t)((x >> 8) % n);
            void *p = mine[k];
            rc_check(p, ~(uint64_t)k);
            lm_free(p);
            free(p);
            mine[k] = mine[--n];
            if (k < n) rc_stamp(mine[k], ~(uint64_t)k);
            o->churn_frees++;
        }
    }
    while (n > 0) {
        void *p = mine[--n];
        rc_check(p, ~(uint64_t)n);
        lm_free(p);
        free(p);
        o->churn_frees++;
    }
    munmap(mine, RC_CHURN * sizeof(void *));
    return NULL;
}

static void *rc_freer_thread(void *arg) {
    uintptr_t k = (uintptr_t)arg;
    while (!atomic_load(&rc_ready))
        sched_yield();
    uint64_t n = 0;
    for (uint64_t i = k; i < RC_N; i += RC_K) {
        void *p = rc_blocks[i];
        rc_check(p, i);
        lm_free(p);
        free(p);
        n++;
    }
    atomic_fetch_add(&rc_freed, n);
    atomic_fetch_add(&rc_freers_done, 1);
    return NULL;
}

static void test_remote_frees_under_concurrency(void **state) {
    (void)state;
    rc_blocks = test_map(RC_N * sizeof(void *));
    atomic_store(&rc_ready, 0);
    atomic_store(&rc_freers_done, 0);
    atomic_store(&rc_bad_pattern, 0);
    atomic_store(&rc_freed, 0);
    struct totals before = tiny_totals();
    struct rc_owner o = {0};
    pthread_t owner, freer[RC_K];
    assert_int_equal(pthread_create(&owner, NULL, rc_owner_thread, &o), 0);
    for (uintptr_t k = 0; k < RC_K; k++)
        assert_int_equal(pthread_create(&freer[k], NULL, rc_freer_thread, (void *)k), 0);
    for (int k = 0; k < RC_K; k++)
        assert_int_equal(pthread_join(freer[k], NULL), 0);
    assert_int_equal(pthread_join(owner, NULL), 0);
    struct totals after = tiny_totals();
    /* Every block came back to its slab: the freers' exits gave back what
     * their caches held, the owner's exit its drained slabs, and a trim the
     * slabs the owner left before the freers gave their blocks back (a
     * block lost on the way would leave one an orphan). */
    malloc_trim(0);
    uint32_t orphans = 0;
    assert_true(maps_snapshot()); /* (nothing below maps or unmaps) */
    for (uint32_t i = 0; i < RC_N; i++) {
        void *p = rc_blocks[i];
        if (!maps_snapshot_writable(p)) continue; /* given back since */
        struct ss_slab *s = ss_slab_of(p);
        if (s->state == SS_ACTIVE && atomic_load(&s->owner) == SS_NO_OWNER) orphans++;
    }
    munmap(rc_blocks, RC_N * sizeof(void *));
    if (orphans) fail_msg("%u blocks sit in slabs left behind as orphans", orphans);

    assert_int_equal(o.failed, 0);
    assert_int_equal(atomic_load(&rc_freed), RC_N);
    assert_int_equal(atomic_load(&rc_bad_pattern), 0);
    assert_int_equal(atomic_load(&lm_errors), 0); /* no block out twice, none freed twice */
    assert_int_equal(lm_reset(), 0);              /* every block freed */
    assert_int_equal(o.churn_allocs, o.churn_frees);
    /* Every free of the first batch was a remote free, and only those. */
    assert_int_equal(after.remote - before.remote, RC_N);
    assert_true(after.allocs - before.allocs >= RC_N + o.churn_allocs);
    /* The owner's refills took back blocks the others had freed. */
    if (o.reused == 0) fail_msg("the owner never reused a remotely freed block");
    print_message("remote: %llu churn allocs, %llu of them remotely freed blocks\n",
                  (unsigned long long)o.churn_allocs, (unsigned long long)o.reused);
}

/* ---- the remote list itself ------------------------------------------------------------ */

#define RL_CLS 6u /* 112 B */

struct rl_push {
    void **blocks;
    uint32_t n;
};

static void *rl_push_thread(void *arg) {
    struct rl_push *a = arg;
    for (uint32_t i = 0; i < a->n; i++)
        tiny_free(a->blocks[i], "free");
    return NULL;
}

/* One thread frees blocks of the main thread's slab: its cache gives them
 * back at its exit, onto that slab's remote list, where they sit until the
 * owner takes them. */
static void test_remote_list_holds_pushed_blocks(void **state) {
    (void)state;
    size_t size = small_class_size[RL_CLS];
    enum { N = 300 };
    void *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(size);
        lm_alloc(b[i], 0);
    }
    struct ss_slab *s = ss_slab_of(b[N - 1]);
    assert_ptr_equal(atomic_load(&s->owner), tc_self.heap);
    void *mine[N];
    uint32_t n = 0;
    for (int i = 0; i < N; i++)
        if (ss_slab_of(b[i]) == s) mine[n++] = b[i];
    assert_true(n >= 10);
    void *head = atomic_load(&s->remote);
    uint32_t old = 0;
    for (void *r = head; r; r = *(void **)r)
        old++;
    uint16_t used = s->used;
    for (uint32_t i = 0; i < n; i++)
        lm_free(mine[i]);
    uint64_t remote_before = class_stats(RL_CLS).remote_frees;
    struct rl_push a = {mine, n};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, rl_push_thread, &a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(class_stats(RL_CLS).remote_frees - remote_before, n);
    /* The list: our blocks, each once (in runs: a full cache gives back
     * half its blocks, newest first), then what was there. */
    bool seen[N] = {false};
    void *r = atomic_load(&s->remote);
    for (uint32_t k = 0; k < n; k++, r = *(void **)r) {
        uint32_t i = 0;
        while (i < n && mine[i] != r)
            i++;
        assert_true(i < n && !seen[i]);
        seen[i] = true;
    }
    assert_ptr_equal(r, head);
    assert_int_equal(s->used, used); /* the owner has not looked yet */
    assert_int_equal(s->state, SS_ACTIVE);

    /* The owner gets every one of them back, each once. */
    for (uint32_t i = 0; i < n; i++)
        lm_alloc(mine[i], LM_MARK); /* the marks say "pushed": expect them back */
    for (uint32_t i = 0; i < n; i++)
        lm_free(mine[i]);
    uint32_t back = 0;
    void **again = test_map(8192 * sizeof(void *));
    uint32_t m = 0;
    while (back < n && m < 8192) {
        void *p = malloc(size);
        if (lm_alloc(p, 0) & LM_MARK) back++;
        again[m++] = p;
    }
    assert_int_equal(back, n);
    assert_true(m <= 4096);
    for (uint32_t i = 0; i < m; i++) {
        lm_free(again[i]);
        free(again[i]);
    }
    for (int i = 0; i < N; i++) {
        if (ss_slab_of(b[i]) == s) continue;
        lm_free(b[i]);
        free(b[i]);
    }
    munmap(again, 8192 * sizeof(void *));
    assert_int_equal(atomic_load(&lm_errors), 0);
    assert_int_equal(lm_reset(), 0);
}

#define RP_CLS     3u /* 64 B */
#define RP_N       16384
#define RP_PUSHERS 4
#define RP_AHEAD   2048

static _Atomic int rp_go;
static _Atomic uint32_t rp_pushed;

static void *rp_push_thread(void *arg) {
    struct rl_push *a = arg;
    while (!atomic_load(&rp_go))
        sched_yield();
    for (uint32_t i = 0; i < a->n; i++) {
        tiny_free(a->blocks[i], "free");
        atomic_fetch_add_explicit(&rp_pushed, 1, memory_order_relaxed);
    }
    return NULL;
}

/* Several threads push blocks of the main thread's slabs with tiny_free
 * while the main thread allocates from that class: every block comes back
 * to the main thread exactly once. */
static void test_remote_pushes_while_owner_allocates(void **state) {
    (void)state;
    size_t size = small_class_size[RP_CLS];
    void **b = test_map(RP_N * sizeof(void *));
    for (uint32_t i = 0; i < RP_N; i++) {
        b[i] = malloc(size);
        lm_alloc(b[i], 0);
        assert_ptr_equal(atomic_load(&ss_slab_of(b[i])->owner), tc_self.heap);
    }
    for (uint32_t i = 0; i < RP_N; i++) {
        lm_free(b[i]);
        lm_alloc(b[i], LM_MARK); /* mark "pushed" */
        lm_free(b[i]);
    }
    uint64_t remote_before = class_stats(RP_CLS).remote_frees;
    struct rl_push a[RP_PUSHERS];
    pthread_t t[RP_PUSHERS];
    atomic_store(&rp_go, 0);
    atomic_store(&rp_pushed, 0);
    for (uint32_t k = 0; k < RP_PUSHERS; k++) {
        a[k] = (struct rl_push){b + k * (RP_N / RP_PUSHERS), RP_N / RP_PUSHERS};
        assert_int_equal(pthread_create(&t[k], NULL, rp_push_thread, &a[k]), 0);
    }
    /* Allocate (and keep) blocks of the class while they push, until every
     * pushed block has come back; a lost block would make us carve fresh
     * slabs for ever, a duplicated one trips the live map. We stay at most
     * RP_AHEAD allocations ahead of the pushes, so that most of what we get
     * has to come from the remote lists while they are being pushed to. */
    const uint32_t limit = 8 * RP_N;
    void **got = test_map(limit * sizeof(void *));
    uint32_t m = 0, back = 0, joined = 0;
    atomic_store(&rp_go, 1);
    while (back < RP_N && m < limit) {
        if (m >= atomic_load_explicit(&rp_pushed, memory_order_relaxed) + RP_AHEAD &&
            atomic_load_explicit(&rp_pushed, memory_order_relaxed) < RP_N) {
            sched_yield();
            continue;
        }
        void *p = malloc(size);
        if (lm_alloc(p, 0) & LM_MARK) back++;
        got[m++] = p;
        if (!joined && m == RP_N / 2) {
            for (uint32_t k = 0; k < RP_PUSHERS; k++)
                assert_int_equal(pthread_join(t[k], NULL), 0);
            joined = 1;
        }
    }
    if (!joined)
        for (uint32_t k = 0; k < RP_PUSHERS; k++)
            assert_int_equal(pthread_join(t[k], NULL), 0);
    uint64_t remote = class_stats(RP_CLS).remote_frees - remote_before;
    for (uint32_t i = 0; i < m; i++) {
        lm_free(got[i]);
        free(got[i]);
    }
    munmap(got, limit * sizeof(void *));
    munmap(b, RP_N * sizeof(void *));
    assert_int_equal(remote, RP_N);
    assert_int_equal(atomic_load(&lm_errors), 0);
    if (back != RP_N)
        fail_msg("%u of %u pushed blocks came back after %u allocations", back, RP_N, m);
    /* Every block came back before many fresh ones were carved. */
    if (m > RP_N + RP_AHEAD + 4096) fail_msg("%u allocations to get %u blocks back", m, RP_N);
    assert_int_equal(lm_reset(), 0);
}

/* ---- adoption ------------------------------------------------------------------------- */

#define AD_N    1000
#define AD_SIZE 48
static void *ad_blocks[AD_N];

static void *ad_alloc_and_exit(void *arg) {
    (void)arg;
    for (int i = 0; i < AD_N; i++) {
        ad_blocks[i] = malloc(AD_SIZE);
        memset(ad_blocks[i], 0x3c, AD_SIZE);
    }
    return NULL; /* exits with every block out */
}

struct ad_result {
    void *got[AD_N];
    bool owns_orphan; /* the orphan slab's owner is now this thread's heap */
};

static void *ad_adopter(void *arg) {
    struct ad_result *r = arg;
    for (int i = 0; i < AD_N; i++)
        r->got[i] = malloc(AD_SIZE);
    r->owns_orphan = atomic_load(&ss_slab_of(ad_blocks[0])->owner) == tc_self.heap;
    for (int i = 0; i < AD_N; i++)
        free(r->got[i]);
    return NULL;
}

/* ---- other threads' blocks in the cache ------------------------------------------------ */

#define FB_N 64 /* fewer than the class's cache holds */

struct fb_run {
    void **blocks;
    uint32_t cls;
    uint32_t got_back;      /* of the blocks it freed, how many its mallocs got */
    uint64_t remote_before; /* remote frees counted before its exit */
};

static void *fb_free_then_malloc(void *arg) {
    struct fb_run *r = arg;
    uint64_t before = class_stats(r->cls).remote_frees;
    for (int i = 0; i < FB_N; i++)
        free(r->blocks[i]);
    void *got[FB_N];
    for (int i = 0; i < FB_N; i++) {
        got[i] = malloc(small_class_size[r->cls]);
        for (int j = 0; j < FB_N; j++)
            if (got[i] == r->blocks[j]) r->got_back++;
    }
    r->remote_before = class_stats(r->cls).remote_frees - before;
    for (int i = 0; i < FB_N; i++)
        free(got[i]);
    return NULL;
}

#define FC_N 300 /* more than the 64 B list holds (128) */

struct fc_run {
    void **blocks;
    uint32_t cls;
    uint32_t cap_after_others, count_after_others, cap_after_own;
};

static void *fc_thread(void *arg) {
    struct fc_run *r = arg;
    for (int i = 0; i < FC_N; i++) /* the main thread's blocks */
        free(r->blocks[i]);
    r->cap_after_others = tc_self.cap[r->cls];
    r->count_after_others = tc_count(r->cls);
    void *mine[FC_N];
    for (int i = 0; i < FC_N; i++)
        mine[i] = malloc(64);
    for (int i = 0; i < FC_N; i++) /* its own, and the few others' it reused */
        free(mine[i]);
    r->cap_after_own = tc_self.cap[r->cls];
    return NULL;
}

/* A list whose flush passed other threads' blocks on holds a quarter of its
 * capacity (they are out of their owners' reach while it holds them), and
 * its full capacity again once it flushes only its own. */
static void test_list_of_others_blocks_holds_less(void **state) {
    (void)state;
    struct fc_run r = {.cls = small_class_of(64)};
    void **b = test_map(FC_N * sizeof(void *));
    for (int i = 0; i < FC_N; i++)
        b[i] = malloc(64);
    r.blocks = b;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fc_thread, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    uint32_t first = small_class_cap[r.cls];
    assert_int_equal(r.cap_after_others, first / 4);
    assert_true(r.count_after_others <= first / 4);
    assert_int_equal(r.cap_after_own, first);
    munmap(b, FC_N * sizeof(void *));
}

/* A thread freeing another thread's blocks keeps them in its cache, with no
 * atomic, and its own mallocs get them; its exit gives them back to their
 * owner's slab. */
static void test_foreign_blocks_serve_the_freer(void **state) {
    (void)state;
    struct fb_run r = {.cls = small_class_of(64)};
    void *b[FB_N];
    for (int i = 0; i < FB_N; i++)
        b[i] = malloc(64);
    r.blocks = b;
    struct ss_slab *s = ss_slab_of(b[0]);
    uint64_t before = class_stats(r.cls).remote_frees;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fb_free_then_malloc, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(r.got_back, FB_N);
    assert_int_equal(r.remote_before, 0);
    assert_int_equal(class_stats(r.cls).remote_frees - before, FB_N);
    /* The owner takes them back: its next refills find them on its slabs. */
    uint32_t on_remote = 0;
    for (void *p = atomic_load(&s->remote); p; p = *(void **)p)
        on_remote++;
    assert_true(on_remote > 0);
    malloc_trim(0);
}

#define OF_CLS 17u /* 768 B: used by nothing else here */
#define OF_N   200 /* blocks in 3 slabs and more */
static void *of_blocks[OF_N];

static void *of_alloc_all(void *arg) {
    (void)arg;
    for (int i = 0; i < OF_N; i++)
        of_blocks[i] = malloc(small_class_size[OF_CLS]);
    return NULL;
}

static void *of_free_all(void *arg) {
    (void)arg;
    for (int i = 0; i < OF_N; i++)
        free(of_blocks[i]);
    return NULL;
}

/* An owner exits with its blocks out; another thread frees them all, and
 * its cache gives them back (its exit) onto the orphans' remote lists.
 * Nothing needs the class after: the next look at the ages gives the
 * orphans, whose blocks are all back, back to the SuperSlabs. */
static void test_orphans_whose_blocks_came_back_go_at_the_ages(void **state) {
    (void)state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, of_alloc_all, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (int i = 0; i < OF_N; i++)
        assert_ptr_equal(atomic_load(&ss_slab_of(of_blocks[i])->owner), SS_NO_OWNER);
    assert_int_equal(pthread_create(&t, NULL, of_free_all, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    tiny_age();
    for (int i = 0; i < OF_N; i++) {
        struct ss_slab *s = ss_slab_of(of_blocks[i]);
        assert_false(s->state == SS_ACTIVE && atomic_load(&s->owner) == SS_NO_OWNER);
    }
}

#ifdef HAK_FAULT_INJECT
/* An orphan fed while its owner's exit still holds it off the orphan stack,
 * and a sweep in between (which clears the flag and finds nothing): the
 * exit raises the flag again once it puts the orphan there. */
static void *fp_p;
static _Atomic int fp_phase;

/* Wait for fp_phase to reach `phase`, up to a hang limit (scaled:
 * tests/timing.h); false past it. */
static bool fp_wait(int phase) {
    int64_t t0 = hak_test_now_ms(), limit = hak_test_limit_ms(30000);
    while (atomic_load(&fp_phase) != phase) {
        if (hak_test_now_ms() - t0 > limit) return false;
        sched_yield();
    }
    return true;
}

static void fp_hook(void) {
    atomic_store(&fp_phase, 1); /* let go (no owner), not yet published */
    fp_wait(2);                 /* (past the limit the test has failed already) */
}

static void *fp_owner(void *arg) {
    (void)arg;
    fp_p = malloc(small_class_size[18]); /* 896 B: used by nothing else here */
    tiny_exit_publish_hook = fp_hook;
    return NULL;
}

static void test_orphan_fed_before_its_exit_publishes_it(void **state) {
    (void)state;
    pthread_t t;
    atomic_store(&fp_phase, 0);
    assert_int_equal(pthread_create(&t, NULL, fp_owner, NULL), 0);
    if (!fp_wait(1)) fail_msg("the exiting owner never reached its hook");
    tiny_exit_publish_hook = NULL;
    struct ss_slab *s = ss_slab_of(fp_p);
    assert_ptr_equal(atomic_load(&s->owner), SS_NO_OWNER);
    free(fp_p);     /* into this thread's cache */
    malloc_trim(0); /* gives it back onto the orphan (fed), then sweeps */
    atomic_store(&fp_phase, 2);
    assert_int_equal(pthread_join(t, NULL), 0);
    tiny_age();
    assert_false(s->state == SS_ACTIVE && atomic_load(&s->owner) == SS_NO_OWNER);
}
#endif

static void *ad_free_half(void *arg) {
    (void)arg;
    for (int i = 0; i < AD_N; i += 2)
        free(ad_blocks[i]);
    return NULL;
}

static void test_exited_threads_slabs_are_adopted(void **state) {
    (void)state;
    uint32_t cls = small_class_of(AD_SIZE);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ad_alloc_and_exit, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    /* Its slabs are orphans now: ACTIVE, no owner. */
    for (int i = 0; i < AD_N; i++) {
        struct ss_slab *s = ss_slab_of(ad_blocks[i]);
        assert_int_equal(s->state, SS_ACTIVE);
        assert_ptr_equal(atomic_load(&s->owner), SS_NO_OWNER);
        assert_int_equal(s->cls, cls);
    }
    /* Free half, in a thread whose exit gives back its cache: remote frees
     * into orphans. */
    struct tiny_class_stats st0 = class_stats(cls);
    for (int i = 0; i < AD_N; i += 2)
        assert_int_equal(((uint8_t *)ad_blocks[i])[AD_SIZE - 1], 0x3c);
    assert_int_equal(pthread_create(&t, NULL, ad_free_half, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    struct tiny_class_stats st1 = class_stats(cls);
    assert_int_equal(st1.remote_frees - st0.remote_frees, AD_N / 2);
    /* A new thread needing the class adopts instead of taking a new slab. */
    static struct ad_result r;
    assert_int_equal(pthread_create(&t, NULL, ad_adopter, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    struct tiny_class_stats st2 = class_stats(cls);
    assert_true(st2.adopted - st1.adopted >= 1);
    assert_true(r.owns_orphan);
    uint32_t reused = 0;
    for (int i = 0; i < AD_N; i++)
        for (int j = 0; j < AD_N; j += 2)
            if (r.got[i] == ad_blocks[j]) reused++;
    print_message("adoption: %u of %u freed blocks handed out again\n", reused, AD_N / 2);
    if (reused == 0) fail_msg("the adopting thread got none of the freed blocks back");
    /* The rest, freed into whatever owns the slab now, then trimmed. */
    for (int i = 1; i < AD_N; i += 2)
        free(ad_blocks[i]);
    malloc_trim(0);
}

/* ---- SuperSlabs go back to the OS ------------------------------------------------------ */

#define RET_BLOCK 64
#define RET_BYTES (64 * MiB)
#define RET_N     (RET_BYTES / RET_BLOCK)

static void **ret_blocks;

static long rss_kib(void) {
    int fd = open("/proc/self/statm", O_RDONLY);
    assert_true(fd >= 0);
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    assert_true(n > 0);
    buf[n] = 0;
    long size, resident;
    assert_int_equal(sscanf(buf, "%ld %ld", &size, &resident), 2);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static long ret_peak_kib;

static void *ret_thread(void *arg) {
    (void)arg;
    for (size_t i = 0; i < RET_N; i++) {
        ret_blocks[i] = malloc(RET_BLOCK);
        memset(ret_blocks[i], 0x11, RET_BLOCK);
    }
    ret_peak_kib = rss_kib();
    for (size_t i = 0; i < RET_N; i++)
        free(ret_blocks[i]);
    return NULL; /* exit gives the empty slabs back */
}

static void test_superslabs_return_to_os(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* RSS includes TSan's shadow of every page touched */
#endif
    ret_blocks = test_map(RET_N * sizeof(void *));
    memset(ret_blocks, 0, RET_N * sizeof(void *)); /* fault the array in now */
    malloc_trim(0);
    long rss0 = rss_kib();
    struct ss_stats a, b, c;
    ss_get_stats(&a);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ret_thread, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    ss_get_stats(&b);
    long rss1 = rss_kib();
    malloc_trim(0);
    ss_get_stats(&c);
    long rss2 = rss_kib();
    munmap(ret_blocks, RET_N * sizeof(void *));
    print_message("rss: %ld KiB before, %ld at peak, %ld after exit, %ld after trim; "
                  "%llu SuperSlabs retired, %llu unmapped, %llu cached\n",
                  rss0, ret_peak_kib, rss1, rss2, (unsigned long long)(b.retired - a.retired),
                  (unsigned long long)(c.unmapped - a.unmapped), (unsigned long long)b.cached);
    assert_true(ret_peak_kib - rss0 >= (long)(RET_BYTES / 1024) * 9 / 10);
    /* 64 MiB of 64 B blocks take 33 SuperSlabs; the thread's exit gave
     * every one of them back: cached up to the bound, the rest unmapped. */
    uint64_t want = RET_BYTES / (SS_SIZE - SS_SLOT_SIZE) - 2; /* 2 may be partly others' */
    assert_true(b.retired - a.retired >= want);
    assert_true(b.unmapped - a.unmapped >= want - hak_cfg.ss_cache);
    assert_true(b.cached >= a.cached && b.cached <= hak_cfg.ss_cache);
    /* malloc_trim unmaps the cached ones. */
    assert_int_equal(c.cached, 0);
    assert_int_equal(c.unmapped - b.unmapped, b.cached);
    assert_true(c.live <= a.live);
    assert_true(rss1 - rss0 < 4 * 1024);
    assert_true(rss2 - rss0 < 2 * 1024);
}

/* ---- bad pointers (death tests) ---------------------------------------------------------- */

#include "death.h"

/* ---- a remote free racing the owner's exit ------------------------------------------- */

/* The freer pushes the last block out of a slab; the owner, exiting, drains
 * it, gives the slab back, and its SuperSlab (the only slab in it, with no
 * SuperSlab cache) is unmapped. Nothing of the slab descriptor may be read
 * by the freer after its push. To make the interleaving certain, the owner's
 * heap page is write-protected: the freer's first write after the push (the
 * owner's "remote frees pending" bit) faults, and its SIGSEGV handler holds
 * it there until the SuperSlab is gone. Runs in a child process. */
#define RX_CLS 18u /* 896 B: no other test here leaves blocks of it out */

static void *volatile rx_block;
static _Atomic int rx_start, rx_go, rx_stalled;
static uint8_t *volatile rx_heap_page;
static __thread bool rx_is_freer;

static void rx_segv(int sig, siginfo_t *si, void *ctx) {
    (void)sig, (void)ctx;
    uint8_t *a = si->si_addr, *pg = rx_heap_page;
    if (pg && a >= pg && a < pg + 2 * HAK_PAGE_SIZE) {
        if (rx_is_freer) {
            atomic_store(&rx_stalled, 1);
            /* Until the owner's exit has unmapped the SuperSlab (a
             * millisecond at most here, in every build), within a hang
             * limit (scaled: tests/timing.h; it was 2000 naps, however long
             * they took): a freer that went on before the unmapping would
             * not have had the race meant. */
            int64_t t0 = hak_test_now_ms(), limit = hak_test_limit_ms(2000);
            while (maps_writable(rx_block) && hak_test_now_ms() - t0 < limit) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        }
        mprotect(pg, 2 * HAK_PAGE_SIZE, PROT_READ | PROT_WRITE);
        return;
    }
    signal(SIGSEGV, SIG_DFL); /* a real fault: die of it */
}

static void *rx_owner(void *arg) {
    (void)arg;
    while (!atomic_load(&rx_start))
        ;
    rx_block = malloc(small_class_size[RX_CLS]);
    struct ss_slab *s = ss_slab_of(rx_block);
    uintptr_t h = (uintptr_t)atomic_load(&s->owner);
    rx_heap_page = (uint8_t *)(h & ~(uintptr_t)(HAK_PAGE_SIZE - 1));
    if (mprotect(rx_heap_page, 2 * HAK_PAGE_SIZE, PROT_READ) != 0) _exit(5);
    atomic_store(&rx_go, 1);
    while (atomic_load(&s->remote) == NULL)
        ;        /* the freer has pushed */
    return NULL; /* exit: drain, release, retire, unmap */
}

static void *rx_freer(void *arg) {
    (void)arg;
    rx_is_freer = true;
    while (!atomic_load(&rx_go))
        ;
    free(rx_block);
    return NULL;
}

static void rx_child(void *arg) {
    (void)arg;
    hak_cfg.ss_cache = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = rx_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    pthread_t o, f;
    if (pthread_create(&o, NULL, rx_owner, NULL) || pthread_create(&f, NULL, rx_freer, NULL))
        _exit(6);
    /* Fill every mapped SuperSlab (keeping the slabs), so that the owner's
     * slab gets a SuperSlab of its own. */
    for (int i = 0; i < 100000; i++) {
        struct ss_stats a, b;
        ss_get_stats(&a);
        struct ss_slab *s = ss_acquire(RX_CLS, small_class_size[RX_CLS]);
        ss_get_stats(&b);
        if (s == NULL) _exit(6);
        if (b.stage3_os != a.stage3_os || b.stage3_cache != a.stage3_cache) {
            ss_release(s, true); /* retired and unmapped at once */
            break;
        }
    }
    atomic_store(&rx_start, 1);
    pthread_join(o, NULL);
    pthread_join(f, NULL);
    if (maps_writable(rx_block)) _exit(3); /* the SuperSlab was not unmapped */
    _exit(atomic_load(&rx_stalled) ? 0 : 4);
}

static void test_remote_free_racing_owner_exit(void **state) {
    (void)state;
    struct death d;
    run_child(rx_child, NULL, &d);
    assert_not_hung(&d);
    if (WIFSIGNALED(d.status))
        fail_msg("the freer died of signal %d: it touched the slab after its push, once the "
                 "owner's exit had unmapped the SuperSlab; stderr: %s",
                 WTERMSIG(d.status), d.err);
    switch (WEXITSTATUS(d.status)) {
    case 0:
        break;
    case 3:
        skip(); /* the owner's exit did not unmap its SuperSlab: nothing to race */
        break;
    case 4:
        print_message("the freer wrote nothing of the owner's heap after its push\n");
        break;
    default:
        fail_msg("child exited %d; stderr: %s", WEXITSTATUS(d.status), d.err);
    }
}

static void test_free_interior_tiny_pointer(void **state) {
    (void)state;
    const size_t sizes[] = {16, 48, 100, 500, 1000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = malloc(sizes[i]);
        assert_true(ss_contains(p));
        expect_free_abort(do_free, p + 8, "invalid pointer");
        if (sizes[i] > 16) expect_free_abort(do_free, p + 16, "invalid pointer");
        expect_free_abort(do_free, p + 1, "invalid pointer");
        free(p);
    }
}

static void test_free_never_carved_block(void **state) {
    (void)state;
    /* 640 B and up: the first refill of a fresh slab carves half of it
     * (a cache holds about 32 KiB); the tail stays uncarved. */
    /* Earlier tests may have left the current slabs of these classes fully
     * carved: allocate on until a block comes from one that is not. */
    static void *held[8192];
    size_t nheld = 0;
    uint8_t *p = NULL;
    struct ss_slab *s = NULL;
    for (size_t n = 600; n <= 1024 && p == NULL; n += 128) {
        while (nheld < sizeof held / sizeof held[0]) {
            uint8_t *q = held[nheld++] = malloc(n);
            assert_non_null(q);
            s = ss_slab_of(q);
            if (s->carved < s->capacity) {
                p = q;
                break;
            }
        }
    }
    assert_non_null(p);
    assert_true(s->carved < s->capacity);
    uint8_t *base = ss_slab_base(s);
    uint8_t *next = base + (size_t)s->carved * s->size; /* block-aligned, not carved */
    expect_free_abort(do_free, next, "invalid pointer");
    uint8_t *last = base + (size_t)(s->capacity - 1) * s->size;
    expect_free_abort(do_free, last, "invalid pointer");
    /* Past the last whole block (65280 .. 65535): never a block. */
    expect_free_abort(do_free, base + (size_t)s->capacity * s->size, "invalid pointer");
    while (nheld > 0)
        free(held[--nheld]); /* p among them */
}

static void test_free_in_superslab_header(void **state) {
    (void)state;
    uint8_t *p = malloc(200);
    uint8_t *ss = (uint8_t *)ss_of(p);
    assert_true(ss_contains(ss));
    expect_free_abort(do_free, ss, "invalid pointer");
    expect_free_abort(do_free, ss + 64, "invalid pointer");
    expect_free_abort(do_free, ss + 4096, "invalid pointer");
    expect_free_abort(do_free, ss + SS_SLOT_SIZE - 16, "invalid pointer");
    free(p);
}

static void test_free_in_unused_slot(void **state) {
    (void)state;
    /* Take slabs directly until some SuperSlab shows an UNUSED slot (at
     * the latest, a new SuperSlab has 30 of them). */
    enum { MAX = 4096 };
    struct ss_slab **held = test_map(MAX * sizeof *held);
    uint32_t n = 0, slot = 0;
    struct superslab *ss = NULL;
    while (slot == 0 && n < MAX) {
        held[n] = ss_acquire(13, small_class_size[13]);
        assert_non_null(held[n]);
        ss = ss_of(held[n++]);
        for (uint32_t k = SS_NSLOTS - 1; k >= SS_FIRST_SLOT && slot == 0; k--)
            if (ss->slab[k].state == SS_UNUSED) slot = k;
    }
    assert_true(slot != 0);
    uint8_t *base = (uint8_t *)ss + (size_t)slot * SS_SLOT_SIZE;
    assert_true(ss_contains(base));
    expect_free_abort(do_free, base, "invalid pointer");
    expect_free_abort(do_free, base + 384, "invalid pointer");
    while (n > 0)
        ss_release(held[--n], true);
    munmap(held, MAX * sizeof *held);
}

/* A SuperSlab given back to the OS keeps its place in the range, read-only
 * and zero: a free of a stale pointer into it is refused, not a crash. */
static void test_free_in_given_back_superslab(void **state) {
    (void)state;
    enum { MAX = 4096 };
    struct ss_slab **held = test_map(MAX * sizeof *held);
    uint32_t n = 0;
    struct superslab *ss = NULL;
    /* Take slabs until one comes from a SuperSlab nobody else uses, then
     * every other slot of it. */
    while (n < MAX) {
        held[n] = ss_acquire(13, small_class_size[13]);
        assert_non_null(held[n]);
        ss = ss_of(held[n++]);
        if (ss->nactive == 1 && ss->unused_mask == (~0u << (SS_FIRST_SLOT + 1))) break;
    }
    assert_true(n < MAX);
    uint32_t first = n - 1;
    while (ss->unused_mask) {
        held[n] = ss_acquire(13, small_class_size[13]);
        assert_ptr_equal(ss_of(held[n++]), ss);
    }
    uint8_t *block = ss_slab_base(held[first]);
    uint64_t cache = hak_cfg.ss_cache;
    hak_cfg.ss_cache = 0;
    for (uint32_t i = first; i < n; i++)
        ss_release(held[i], true);
    hak_cfg.ss_cache = cache;
    assert_false(maps_writable(ss));
    assert_true(ss_contains(block));
    expect_free_abort(do_free, block, "invalid pointer");
    expect_free_abort(do_free, (uint8_t *)ss + SS_SIZE - 1024, "invalid pointer");
    for (uint32_t i = 0; i < first; i++)
        ss_release(held[i], true);
    munmap(held, MAX * sizeof *held);
}

static void test_immediate_double_free(void **state) {
    (void)state;
    const size_t sizes[] = {1, 32, 64, 200, 1024};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = malloc(sizes[i]);
        expect_free_abort(do_double_free, p, "double free");
        free(p);
    }
}

/* The first free finds the cache full (slow path: half goes back to the
 * slabs); the second must still be caught. The child names the pointer on
 * a line of its own first. */
static void double_free_with_full_cache(void *arg) {
    uint32_t cls = (uint32_t)(uintptr_t)arg;
    size_t size = small_class_size[cls];
    void *b[256];
    uint32_t cap = small_class_cap[cls];
    for (uint32_t i = 0; i <= cap; i++)
        b[i] = malloc(size);
    for (uint32_t i = 0; i < cap && tc_count(cls) < cap; i++)
        free(b[i]);
    if (tc_count(cls) != cap) _exit(7);
    char line[64];
    int n = snprintf(line, sizeof line, "want %p\n", b[cap]);
    if (write(2, line, (size_t)n) != n) _exit(8);
    void *volatile v = b[cap];
    free(v); /* slow path */
    free(v);
}

static void test_double_free_after_flush(void **state) {
    (void)state;
    const uint32_t classes[] = {0, 9, 15, 19};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        struct death d;
        run_child(double_free_with_full_cache, (void *)(uintptr_t)classes[i], &d);
        if (!WIFSIGNALED(d.status) || WTERMSIG(d.status) != SIGABRT)
            fail_msg("child did not abort (status 0x%x); stderr: %s", d.status, d.err);
        void *p = NULL;
        char want[128];
        if (sscanf(d.err, "want %p\n", &p) != 1) fail_msg("no pointer from the child: %s", d.err);
        int n = snprintf(want, sizeof want,
                         "want %p\nhakmem: free(): double free %p (block of %u bytes, tiny tier)\n",
                         p, p, small_class_size[classes[i]]);
        if ((size_t)n != d.len || strcmp(d.err, want) != 0)
            fail_msg("expected \"%s\"; stderr was:\n%s", want, d.err);
    }
}

/* A flush gives the cache's blocks back to their slabs a run of one slab
 * at a time: with the blocks of three slabs freed interleaved (runs of
 * one), in order (long runs) and in reverse, every slab's count of blocks
 * out is what the cache still holds of it, and every block comes back once. */
static void test_flush_gives_runs_back_to_their_slabs(void **state) {
    (void)state;
    const uint32_t cls = 22; /* 1792 B: 36 a slab, used by nothing else here */
    enum { N = 108 };
    size_t size = small_class_size[cls];
    for (int order = 0; order < 3; order++) {
        void *p[N];
        for (int i = 0; i < N; i++) {
            p[i] = malloc(size);
            lm_alloc(p[i], 0);
        }
        /* Three slabs' blocks: interleave them by slab position. */
        struct ss_slab *slab[N];
        for (int i = 0; i < N; i++)
            slab[i] = ss_slab_of(p[i]);
        for (int k = 0; k < N; k++) {
            int i = order == 0 ? (k % 3) * (N / 3) + k / 3 : order == 1 ? k : N - 1 - k;
            lm_free(p[i]);
            free(p[i]);
        }
        uint32_t out = 0;
        for (int i = 0; i < N; i++) {
            bool first = true;
            for (int j = 0; j < i; j++)
                first &= slab[j] != slab[i];
            if (first) out += slab[i]->used;
        }
        assert_int_equal(out, tc_count(cls));
        assert_int_equal(atomic_load(&lm_errors), 0);
    }
    assert_int_equal(lm_reset(), 0);
}

/* A class whose batches are bigger than its list grows its list (no block
 * goes back to the slabs and out again after the first rounds); a list
 * not grown again for an age goes back to its first capacity, on the
 * thread's own later calls. */
static void test_list_grows_for_batches_then_shrinks(void **state) {
    (void)state;
    const uint32_t cls = 6; /* 112 B */
    enum { N = 200, ROUNDS = 24 };
    size_t size = small_class_size[cls];
    uint64_t age = hak_cfg.age_ms;
    /* While it grows: ages of a second, so that a busy machine's pause
     * between two rounds is no age (a look already due may still shrink the
     * list once: a round with no flush and no refill is looked for). */
    hak_cfg.age_ms = 1000;
    void *p[N];
    bool still = false;
    for (int round = 0; round < ROUNDS && !still; round++) {
        struct tiny_class_stats a[TINY_NCLASSES], b[TINY_NCLASSES];
        tiny_get_stats(a);
        for (int i = 0; i < N; i++)
            p[i] = malloc(size);
        for (int i = 0; i < N; i++)
            free(p[i]);
        tiny_get_stats(b);
        still = round >= 8 && b[cls].flushes == a[cls].flushes &&
                b[cls].refills == a[cls].refills && tc_self.cap[cls] >= N;
    }
    assert_true(still);
    /* Then other work for a while, at ages of 20 ms (the next look is a
     * second away at most): the list shrinks. (A hang limit, scaled.) */
    hak_cfg.age_ms = 20;
    int64_t limit = hak_test_limit_ms(4000);
    for (int64_t t0 = hak_test_now_ms();
         tc_self.cap[cls] != small_class_cap[cls] && hak_test_now_ms() - t0 < limit;) {
        struct timespec ms5 = {0, 5 * 1000 * 1000};
        nanosleep(&ms5, NULL);
        for (int i = 0; i < 5000; i++)
            free(malloc(40));
    }
    assert_int_equal(tc_self.cap[cls], small_class_cap[cls]);
    assert_int_equal(tc_count(cls), 0);
    hak_cfg.age_ms = age;
}

/* A thread building and tearing down a structure of many classes (a
 * parse tree, mimalloc-bench's alloc-test) has its lists grow to hold it:
 * after the first rounds, no block goes back to the slabs and out again.
 * With all lists' growth bounded by 4096 blocks, 12 classes of 500 did
 * not fit: each round flushed and refilled, a walk of the blocks each
 * time (build_2t at 0.7x mimalloc's speed). */
static void test_lists_grow_for_a_structure_of_many_classes(void **state) {
    (void)state;
    enum { CLASSES = 12, N = 500, ROUNDS = 24 };
    static void *p[CLASSES * N];
    /* No look at the ages during the test but one already due, which may
     * shrink an idle list once (it grows back within three rounds): a
     * round with no flush and no refill is looked for, whatever the
     * machine's speed. */
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600 * 1000;
    bool still = false;
    for (int round = 0; round < ROUNDS && !still; round++) {
        struct tiny_class_stats a[TINY_NCLASSES], b[TINY_NCLASSES];
        tiny_get_stats(a);
        for (int i = 0; i < CLASSES * N; i++)
            p[i] = malloc(small_class_size[i % CLASSES]);
        for (int i = 0; i < CLASSES * N; i++) /* (in the order built) */
            free(p[i]);
        tiny_get_stats(b);
        still = round >= 8;
        for (uint32_t cls = 0; cls < CLASSES; cls++)
            still &= b[cls].flushes == a[cls].flushes && b[cls].refills == a[cls].refills &&
                     tc_self.cap[cls] >= N;
    }
    hak_cfg.age_ms = age;
    assert_true(still);
}

#ifndef HAK_TEST_TSAN /* its runtime reads the clock before it can run instrumented code */
/* Interposed (the library's clock reads bind to this definition): with
 * clock_free set, the first read frees it, as a signal handler's free
 * would interrupt whatever read the clock. */
static void *volatile clock_free;
int clock_gettime(clockid_t clk, struct timespec *ts) {
    void *p = clock_free;
    if (p != NULL) {
        clock_free = NULL;
        free(p);
    }
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

/* A flush's slabs going back reach a purge pass, which reads the clock: a
 * free of the class in between (a handler's) must find the list whole. */
static void test_free_inside_a_flush(void **state) {
    (void)state;
    const uint32_t cls = 27; /* 4096 B: 16 a slab, a few slabs a flush */
    enum { N = 256 };
    size_t size = small_class_size[cls];
    void *q = malloc(size), *p[N];
    struct ss_slab *slab[N + 1];
    lm_alloc(q, 0);
    for (int i = 0; i < N; i++)
        lm_alloc(p[i] = malloc(size), 0);
    for (int i = 0; i < N; i++)
        slab[i] = ss_slab_of(p[i]);
    slab[N] = ss_slab_of(q);
    lm_free(q);
    clock_free = q;
    for (int i = 0; i < N; i++) {
        lm_free(p[i]);
        free(p[i]);
    }
    assert_null(clock_free); /* it came */
    /* No block went back to its slab twice (its count of blocks out would
     * wrap). */
    for (int i = 0; i <= N; i++)
        assert_true(slab[i]->used <= slab[i]->capacity);
    for (int i = 0; i < N; i++) /* every block handed out once */
        lm_alloc(p[i] = malloc(size), 0);
    for (int i = 0; i < N; i++) {
        lm_free(p[i]);
        free(p[i]);
    }
    assert_int_equal(atomic_load(&lm_errors), 0);
    assert_int_equal(lm_reset(), 0);
}
#endif

static void *free_one_and_exit(void *arg) {
    free(arg);
    return NULL;
}

static void *alloc_one(void *arg) {
    (void)arg;
    return malloc(small_class_size[14]); /* 448 B: used by nothing else here */
}

/* A block freed twice after its slab went back (EMPTY or retired): every
 * later free of it is refused as an invalid pointer, not pushed anywhere. */
static void test_double_free_after_slab_released(void **state) {
    (void)state;
    pthread_t t;
    void *p;
    assert_int_equal(pthread_create(&t, NULL, alloc_one, NULL), 0);
    assert_int_equal(pthread_join(t, &p), 0);
    /* The allocating thread is gone: p's slab is an orphan. Freeing p
     * empties it, and trim gives it back. */
    assert_ptr_equal(atomic_load(&ss_slab_of(p)->owner), SS_NO_OWNER);
    assert_int_equal(pthread_create(&t, NULL, free_one_and_exit, p), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    malloc_trim(0);
    assert_true(!maps_writable(p) || ss_slab_of(p)->state != SS_ACTIVE);
    expect_free_abort(do_free, p, "invalid pointer");
}

static void *alloc_free_exit(void *arg) {
    void *p = malloc(small_class_size[16]); /* 640 B: used by nothing else here */
    free(p);
    *(void **)arg = p;
    return NULL;
}

/* A block of a slab its thread's exit gave back (EMPTY), its free mark
 * written over after its free (a use after free), then freed again: free
 * takes other threads' blocks on the mark alone, so the slab itself must
 * refuse it (it went into the cache, and out of it while its slab's free
 * list also held it: handed out twice). */
static void test_double_free_of_emptied_block_with_mark_overwritten(void **state) {
    (void)state;
    pthread_t t;
    void *p = NULL;
    assert_int_equal(pthread_create(&t, NULL, alloc_free_exit, &p), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(ss_slab_of(p)->state, SS_EMPTY);
    /* Not written over, it is a double free. */
    expect_free_abort(do_free, p, "double free");
    ((void **)p)[1] = NULL; /* the mark (the link before it left whole) */
    expect_free_abort(do_free, p, "invalid pointer");
}

/* ---- a full SuperSlab range ------------------------------------------------------------ */

/* When the SuperSlab range cannot grow (the OS refuses more address space
 * there: a limit, or something mapped in the way), Tiny requests go to the
 * L2.5 tier and keep succeeding. Refusals come from fault injection at the
 * two calls that grow the range, in a child. */
static void small_range_child(void *arg) {
    (void)arg;
    os_fault_only(1u << OS_SITE_RESERVE_AT | 1u << OS_SITE_RESERVE_PROT);
    os_fault_arm(0, UINT64_MAX);
    /* Enough 256 B blocks to fill what the range has now, and more. */
    size_t n = ss_bounds.span / 256 + 20000;
    uint8_t **b =
        mmap(NULL, n * sizeof *b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) _exit(10);
    size_t outside = 0;
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(256);
        if (b[i] == NULL) _exit(11);
        memset(b[i], (int)(i & 0xff), 256);
        if (!ss_contains(b[i])) outside++;
    }
    if (outside == 0) _exit(12); /* the range never filled up */
    if (outside == n) _exit(13); /* no range at all */
    /* Keep the first two blocks served past the range (one bundle), so
     * the first one's bundle is not given back when it is freed. */
    uint8_t *kept[2] = {NULL, NULL};
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < 256; k += 64)
            if (b[i][k] != (uint8_t)(i & 0xff)) _exit(14);
        if (malloc_usable_size(b[i]) < 256) _exit(15);
        if (kept[1] == NULL && !ss_contains(b[i]))
            kept[kept[0] != NULL] = b[i];
        else
            free(b[i]);
    }
    /* A double free of a block served past the range is caught too. */
    free(kept[0]);
    free(kept[0]);
    _exit(16);
}

static void test_tiny_beyond_a_full_range(void **state) {
    (void)state;
    struct death d;
    run_child(small_range_child, NULL, &d);
    assert_not_hung(&d);
    if (!WIFSIGNALED(d.status) || WTERMSIG(d.status) != SIGABRT ||
        strstr(d.err, "hakmem: free(): double free 0x") == NULL)
        fail_msg("child status 0x%x (exit codes: see small_range_child), wanted the final "
                 "double free reported; stderr: %s",
                 d.status, d.err);
}

/* Blocks of a page or more carved from a fresh slot: their pages come in
 * with one populate call, not a page fault each (MADV_POPULATE_WRITE, Linux
 * 5.14; ~12 us a fault in a virtual machine). Runs first: the class has no
 * slab yet. */
static void test_big_blocks_carved_with_one_populate(void **state) {
    (void)state;
    uint8_t *m =
        mmap(NULL, HAK_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    bool populates = os_populate(m, HAK_PAGE_SIZE);
    munmap(m, HAK_PAGE_SIZE);
    if (!populates) skip();
    uint64_t advised = os_calls(OS_MADVISE);
    uint8_t *p = malloc(7000); /* carves four 7 KiB blocks: seven pages */
    assert_non_null(p);
    assert_true(os_calls(OS_MADVISE) > advised);
    assert_true(maps_resident(p + 6999));
    memset(p, 0x5c, 7000);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* First: no orphan slab exists yet, so every refill is a fresh slab. */
        cmocka_unit_test_setup(test_big_blocks_carved_with_one_populate, setup),
        cmocka_unit_test_setup(test_first_malloc_prewarms_cache, setup),
        cmocka_unit_test_setup(test_exited_threads_slabs_are_adopted, setup),
        cmocka_unit_test_setup(test_foreign_blocks_serve_the_freer, setup),
        cmocka_unit_test_setup(test_list_of_others_blocks_holds_less, setup),
        cmocka_unit_test_setup(test_orphans_whose_blocks_came_back_go_at_the_ages, setup),
#ifdef HAK_FAULT_INJECT
        cmocka_unit_test_setup(test_orphan_fed_before_its_exit_publishes_it, setup),
#endif
        cmocka_unit_test_setup(test_remote_list_holds_pushed_blocks, setup),
        cmocka_unit_test_setup(test_remote_pushes_while_owner_allocates, setup),
        cmocka_unit_test_setup(test_remote_frees_under_concurrency, setup),
        cmocka_unit_test_setup(test_remote_free_racing_owner_exit, setup),
        cmocka_unit_test_setup(test_superslabs_return_to_os, setup),
        cmocka_unit_test_setup(test_free_interior_tiny_pointer, setup),
        cmocka_unit_test_setup(test_free_never_carved_block, setup),
        cmocka_unit_test_setup(test_free_in_superslab_header, setup),
        cmocka_unit_test_setup(test_free_in_unused_slot, setup),
        cmocka_unit_test_setup(test_free_in_given_back_superslab, setup),
        cmocka_unit_test_setup(test_immediate_double_free, setup),
        cmocka_unit_test_setup(test_double_free_of_emptied_block_with_mark_overwritten, setup),
        cmocka_unit_test_setup(test_double_free_after_flush, setup),
        cmocka_unit_test_setup(test_flush_gives_runs_back_to_their_slabs, setup),
        cmocka_unit_test_setup(test_list_grows_for_batches_then_shrinks, setup),
        cmocka_unit_test_setup(test_lists_grow_for_a_structure_of_many_classes, setup),
#ifndef HAK_TEST_TSAN
        cmocka_unit_test_setup(test_free_inside_a_flush, setup),
#endif
        cmocka_unit_test_setup(test_double_free_after_slab_released, setup),
        cmocka_unit_test(test_tiny_beyond_a_full_range),
    };
    return cmocka_run_group_tests(tests, NULL, group_teardown);
}
