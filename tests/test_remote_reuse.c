/* Tiny blocks freed by other threads: they come back to their owner in
 * bounded memory (the Larson pattern; malloc_trim between rounds), and a
 * cross-thread double free or a stale pointer into an empty slab is
 * reported, never followed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "death.h"
#include "superslab/ss.h"

#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { SLOTS = 2000, STEPS = 4000, ROUNDS = 300 };

static void *g_chunk[2][SLOTS];
static pthread_barrier_t g_round;

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Each round a thread replaces random blocks of one chunk, then the chunks
 * swap owners: most frees are of blocks the other thread allocated. */
static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    uint64_t seed = 0x9e3779b97f4a7c15ull * (id + 1);
    for (int r = 0; r < ROUNDS; r++) {
        void **chunk = g_chunk[(id + (uintptr_t)r) & 1];
        for (int k = 0; k < STEPS; k++) {
            uint64_t x = rng(&seed);
            size_t slot = x % SLOTS;
            free(chunk[slot]);
            chunk[slot] = malloc(8 + (x >> 32) % 993);
        }
        pthread_barrier_wait(&g_round);
    }
    return NULL;
}

static void test_larson_pattern_runs_in_bounded_memory(void **state) {
    (void)state;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < SLOTS; i++)
            g_chunk[c][i] = malloc(8 + (size_t)i % 993);
    struct ss_stats before;
    ss_get_stats(&before);
    pthread_barrier_init(&g_round, NULL, 2);
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&g_round);
    struct ss_stats after;
    ss_get_stats(&after);
    /* 4000 live blocks of <= 1000 B need a few SuperSlabs; stranded remote
     * frees needed one more every few rounds (tens by round 300). */
    uint64_t mapped =
        (after.stage3_os + after.stage3_cache) - (before.stage3_os + before.stage3_cache);
    if (mapped > 6)
        fail_msg("%llu SuperSlabs taken for 4000 live blocks", (unsigned long long)mapped);
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < SLOTS; i++)
            free(g_chunk[c][i]);
}

/* ---- malloc_trim between rounds --------------------------------------------- */

enum { TRIM_BLOCKS = 65536, TRIM_ROUNDS = 16 };
static void *g_blocks[TRIM_BLOCKS];

/* Frees every block but the first of each slab: the slabs stay in use, with
 * their free blocks on the remote lists. */
static void *free_all_but_one_per_slab(void *arg) {
    (void)arg;
    uintptr_t last_slab = 0;
    for (int i = 0; i < TRIM_BLOCKS; i++) {
        uintptr_t slab = (uintptr_t)g_blocks[i] >> SS_SLOT_SHIFT;
        if (slab != last_slab) {
            last_slab = slab; /* keep this one */
            continue;
        }
        free(g_blocks[i]);
        g_blocks[i] = NULL;
    }
    return NULL;
}

static void test_trim_does_not_strand_drained_slabs(void **state) {
    (void)state;
    static void *survivors[TRIM_BLOCKS];
    int nsurv = 0;
    struct ss_stats before, after;
    ss_get_stats(&before);
    for (int r = 0; r < TRIM_ROUNDS; r++) {
        for (int i = 0; i < TRIM_BLOCKS; i++)
            g_blocks[i] = malloc(64);
        pthread_t t;
        pthread_create(&t, NULL, free_all_but_one_per_slab, NULL);
        pthread_join(t, NULL);
        malloc_trim(0); /* drains this thread's slabs */
        /* One long-lived block per slab keeps every slab in use. */
        for (int i = 0; i < TRIM_BLOCKS; i++)
            if (g_blocks[i]) survivors[nsurv++] = g_blocks[i];
    }
    ss_get_stats(&after);
    for (int i = 0; i < nsurv; i++)
        free(survivors[i]);
    /* The drained slabs hold ~65000 free blocks per round: two SuperSlabs
     * serves every round. Stranded slabs needed a fresh one each round. */
    uint64_t mapped =
        (after.stage3_os + after.stage3_cache) - (before.stage3_os + before.stage3_cache);
    if (mapped > 6)
        fail_msg("%llu SuperSlabs taken over %d rounds", (unsigned long long)mapped, TRIM_ROUNDS);
}

/* ---- bad input from other threads ---------------------------------------------- */

/* Run fn in a child; it must die of SIGABRT with a "hakmem: <want>" line. */
static void expect_abort(void (*fn)(void *), const char *want) {
    struct death d;
    run_child(fn, NULL, &d);
    assert_not_hung(&d);
    if (!WIFSIGNALED(d.status) || WTERMSIG(d.status) != SIGABRT)
        fail_msg("child did not abort (status %d), stderr: %s", d.status, d.err);
    if (strstr(d.err, want) == NULL) fail_msg("expected '%s' in: %s", want, d.err);
}

static void *g_victim;
static void *free_victim_twice(void *arg) {
    (void)arg;
    free(g_victim);
    free(g_victim); /* its slab is another thread's: a remote double free */
    return NULL;
}

static void remote_double_free(void *unused) {
    (void)unused;
    g_victim = malloc(24);
    pthread_t t;
    pthread_create(&t, NULL, free_victim_twice, NULL);
    pthread_join(t, NULL);
    for (int i = 0; i < 5000; i++)
        free(malloc(24)); /* the owner drains */
}

static void test_remote_double_free_reported(void **state) {
    (void)state;
    expect_abort(remote_double_free, "hakmem: free(): double free 0x");
}

static void *alloc_free_exit(void *arg) {
    (void)arg;
    g_victim = malloc(100);
    free(g_victim); /* at exit the slab is empty and goes back EMPTY */
    return NULL;
}

static void stale_usable_size(void *unused) {
    (void)unused;
    pthread_t t;
    pthread_create(&t, NULL, alloc_free_exit, NULL);
    pthread_join(t, NULL);
    (void)malloc_usable_size(g_victim);
}

static void stale_realloc(void *unused) {
    (void)unused;
    pthread_t t;
    pthread_create(&t, NULL, alloc_free_exit, NULL);
    pthread_join(t, NULL);
    memset(realloc(g_victim, 90), 0x41, 90);
}

static void test_stale_pointer_into_empty_slab_rejected(void **state) {
    (void)state;
    expect_abort(stale_usable_size, "hakmem: malloc_usable_size(): invalid pointer 0x");
    expect_abort(stale_realloc, "hakmem: realloc(): invalid pointer 0x");
}

/* A thread whose blocks another thread frees (a producer and a consumer):
 * slabs whose blocks all came back leave the producer's heap when it next
 * needs a slab, so a third thread is served from them, not from new
 * memory. (They stayed with the producer: xmalloc-test with 16 producers
 * held 2.7x mimalloc's memory, each producer keeping the most it ever had
 * out.) */
enum { PC_BLOCKS = 16 * 1024, PC_MORE = 2048, PC_THIRD = 8 * 1024 };
static void *g_pc[PC_BLOCKS];
static void *g_pc_more[PC_MORE];
static _Atomic int g_pc_step;
static uint64_t g_pc_released; /* slabs the producer gave back as it went on */

static void pc_wait(int step) {
    while (atomic_load(&g_pc_step) != step)
        sched_yield();
}

static void *pc_producer(void *arg) {
    (void)arg;
    for (int i = 0; i < PC_BLOCKS; i++)
        g_pc[i] = malloc(64);
    atomic_store(&g_pc_step, 1);
    pc_wait(2);           /* another thread freed them all */
    struct ss_stats a, b; /* (this thread's slot counts, published by the read) */
    ss_get_stats(&a);
    for (int i = 0; i < PC_MORE; i++)
        g_pc_more[i] = malloc(64); /* past its current slab: it needs another */
    ss_get_stats(&b);
    g_pc_released = b.releases - a.releases;
    atomic_store(&g_pc_step, 3);
    pc_wait(4); /* a third thread allocated */
    for (int i = 0; i < PC_MORE; i++)
        free(g_pc_more[i]);
    return NULL;
}

static void *pc_consumer(void *arg) {
    (void)arg;
    for (int i = 0; i < PC_BLOCKS; i++)
        free(g_pc[i]);
    return NULL;
}

static void *pc_third(void *arg) {
    static void *mine[PC_THIRD];
    struct ss_stats a, b;
    ss_get_stats(&a);
    for (int i = 0; i < PC_THIRD; i++)
        mine[i] = malloc(64);
    ss_get_stats(&b);
    *(uint64_t *)arg =
        (b.stage2 - a.stage2) + (b.stage3_cache - a.stage3_cache) + (b.stage3_os - a.stage3_os);
    for (int i = 0; i < PC_THIRD; i++)
        free(mine[i]);
    return NULL;
}

static void test_producer_slabs_freed_elsewhere_go_to_others(void **state) {
    (void)state;
    pthread_t p, c, t;
    uint64_t new_slots = UINT64_MAX;
    atomic_store(&g_pc_step, 0);
    assert_int_equal(pthread_create(&p, NULL, pc_producer, NULL), 0);
    pc_wait(1);
    assert_int_equal(pthread_create(&c, NULL, pc_consumer, NULL), 0);
    pthread_join(c, NULL);
    atomic_store(&g_pc_step, 2);
    pc_wait(3);
    assert_int_equal(pthread_create(&t, NULL, pc_third, &new_slots), 0);
    pthread_join(t, NULL);
    atomic_store(&g_pc_step, 4);
    pthread_join(p, NULL);
    /* Its 16 slabs, all back: at most its 2 spares, and the ones it carves
     * from, stay. */
    assert_true(g_pc_released >= PC_BLOCKS / 1024 - 4);
    assert_int_equal(new_slots, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_larson_pattern_runs_in_bounded_memory),
        cmocka_unit_test(test_trim_does_not_strand_drained_slabs),
        cmocka_unit_test(test_remote_double_free_reported),
        cmocka_unit_test(test_stale_pointer_into_empty_slab_rejected),
        cmocka_unit_test(test_producer_slabs_freed_elsewhere_go_to_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
