/* bench_random_mixed — random-size churn over a fixed working set.
 *
 * usage: bench_random_mixed [iters [ws [seed]]]      (defaults 1000000 400 42)
 * env:   HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (defaults 16, 1024)
 *
 * A working set of `ws` slots is filled with blocks of random size in
 * [MIN_SIZE, MAX_SIZE]. Each of the `iters` timed steps picks a random slot,
 * frees its block and allocates a new random-size block into it; one op is one
 * free+malloc step. The first and last byte of every block are written with a
 * per-block tag and checked again before the block is freed, so pages are really touched,
 * the compiler cannot drop the work, and gross heap corruption is detected
 * (exit status 1, no Throughput line). Only the loop is timed. With a time
 * budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one step: the loop
 * stops at the first step after the budget is spent.
 *
 * Output (stdout):
 *   random_mixed: iters=... ws=... seed=... min_size=... max_size=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#include <stdbool.h>

/* Allocate n bytes into slot k, tagging its first and last byte; false
 * (with a message) when malloc fails. */
static inline bool fill_slot(unsigned char **slot, uint32_t *len, unsigned char *tags, uint64_t k,
                             uint32_t n, unsigned char tag) {
    unsigned char *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "bench_random_mixed: malloc(%" PRIu32 ") failed\n", n);
        return false;
    }
    p[0] = tag;
    p[n - 1] = tag;
    slot[k] = p;
    len[k] = n;
    tags[k] = tag;
    return true;
}

int main(int argc, char **argv) {
    uint64_t iters = 1000000, ws = 400, seed = 42, min_size, max_size;

    if (argc > 4) {
        fprintf(stderr, "usage: %s [iters [ws [seed]]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 && bench_parse_u64("bench_random_mixed", argv[1], "iters", 1, UINT64_MAX, &iters))
        return 2;
    if (argc > 2 && bench_parse_u64("bench_random_mixed", argv[2], "ws", 1, UINT32_MAX, &ws))
        return 2;
    if (argc > 3 && bench_parse_u64("bench_random_mixed", argv[3], "seed", 0, UINT64_MAX, &seed))
        return 2;
    if (bench_env_u64("bench_random_mixed", "HAKMEM_BENCH_MIN_SIZE", 16, 1, UINT32_MAX, &min_size))
        return 2;
    if (bench_env_u64("bench_random_mixed", "HAKMEM_BENCH_MAX_SIZE", 1024, 1, UINT32_MAX,
                      &max_size))
        return 2;
    if (max_size < min_size) {
        fprintf(stderr, "bench_random_mixed: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    if (bench_budget_init("bench_random_mixed")) return 2;
    const uint64_t span = max_size - min_size + 1; /* <= 2^32 */

    printf("random_mixed: iters=%" PRIu64 " ws=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64
           " max_size=%" PRIu64 "\n",
           iters, ws, seed, min_size, max_size);
    fflush(stdout);

    unsigned char **slot = malloc(ws * sizeof *slot);
    uint32_t *len = malloc(ws * sizeof *len);
    unsigned char *tags = malloc(ws);
    if (slot == NULL || len == NULL || tags == NULL) {
        fprintf(stderr, "bench_random_mixed: out of memory (bookkeeping)\n");
        return 1;
    }

    uint64_t rng_state = seed;
    uint64_t check = 0;
    for (uint64_t i = 0; i < ws; i++) {
        uint64_t r = bench_rng_next(&rng_state);
        uint32_t n = (uint32_t)(min_size + bench_bounded((uint32_t)r, span));
        unsigned char tag = (unsigned char)(r >> 40);
        if (!fill_slot(slot, len, tags, i, n, tag)) return 1;
    }

    double t0 = bench_now();
    bench_budget_start();
    uint64_t done;
    for (done = 0; bench_more(done, iters); done++) {
        uint64_t r = bench_rng_next(&rng_state);
        uint64_t k = bench_bounded((uint32_t)(r >> 32), ws);
        uint32_t n = (uint32_t)(min_size + bench_bounded((uint32_t)r, span));
        unsigned char tag = (unsigned char)(r >> 24);

        unsigned char *old = slot[k];
        uint32_t oldn = len[k];
        if (old[0] != tags[k] || old[oldn - 1] != tags[k]) {
            fprintf(stderr, "bench_random_mixed: block %p (size %" PRIu32 ") corrupted\n",
                    (void *)old, oldn);
            return 1;
        }
        check += old[0] + oldn;
        free(old);

        if (!fill_slot(slot, len, tags, k, n, tag)) return 1;
    }
    double elapsed = bench_now() - t0;

    for (uint64_t i = 0; i < ws; i++) {
        if (slot[i][0] != tags[i] || slot[i][len[i] - 1] != tags[i]) {
            fprintf(stderr, "bench_random_mixed: block %p (size %" PRIu32 ") corrupted\n",
                    (void *)slot[i], len[i]);
            return 1;
        }
        check += slot[i][0] + len[i];
        free(slot[i]);
    }
    free(slot);
    free(len);
    free(tags);

    bench_report(done, elapsed, check, done, iters, "steps");
    return 0;
}
