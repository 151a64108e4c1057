/* Memory freed by other threads comes back to its owner: two threads that
 * keep handing their blocks to each other (the Larson pattern) must run in
 * bounded memory. A refill once collected only the first full slab that had
 * remote frees, stranding the rest; memory then grew without bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "superslab/ss.h"

#include <pthread.h>
#include <stdlib.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_larson_pattern_runs_in_bounded_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
