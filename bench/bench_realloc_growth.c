/* bench_realloc_growth — one buffer grown by realloc x1.5 from tiny to huge.
 *
 * usage: bench_realloc_growth [iters [seed]]          (defaults 20 42)
 * env:   HAKMEM_BENCH_MIN_SIZE (default 16, >= 2): the first malloc
 *        HAKMEM_BENCH_MAX_SIZE (default 67108864 = 64 MiB): the final size
 *
 * Each of the `iters` iterations mallocs MIN_SIZE bytes and grows that one
 * buffer by realloc to n + n/2 bytes (at least n + 1), capped at MAX_SIZE,
 * until it is MAX_SIZE bytes, then frees it: from 16 B to 64 MiB that is 38
 * reallocs, crossing every tier of the allocator (small classes, mid sizes,
 * large mappings: in-place growth, copies, mremap). The first byte of the
 * buffer and the last byte of each part (the new bytes a realloc adds) are
 * written with tags; after each realloc the bench checks that the first byte
 * and the old last byte survived, and before the free that every tagged byte
 * is still there. So contents must be kept whether the block grows in place,
 * is copied or is remapped; a mismatch (heap corruption) ends the run with
 * status 1 and no Throughput line. One page per realloc is written, so growth
 * by remapping costs no touch of the rest of the new part.
 *
 * One op is one realloc; a run does iters * (reallocs per iteration) ops
 * (the malloc and free of each iteration are timed too, but not counted).
 * With a time budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one
 * whole iteration, since the cost of a realloc depends on its size: the loop
 * stops at the first iteration after the budget is spent.
 *
 * Output (stdout):
 *   realloc_growth: iters=... seed=... min_size=... max_size=... reallocs_per_iter=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#define MAX_STEPS 128 /* reallocs per iteration at most (1.5^128 > 2^64) */

static uint64_t next_size(uint64_t n, uint64_t max) {
    uint64_t m = n + (n / 2 > 0 ? n / 2 : 1);
    return m < max ? m : max;
}

static void corrupted(const unsigned char *p, uint64_t n) {
    fprintf(stderr, "bench_realloc_growth: block %p (size %" PRIu64 ") corrupted\n",
            (const void *)p, n);
    exit(1);
}

int main(int argc, char **argv) {
    uint64_t iters = 20, seed = 42, min_size, max_size;

    if (argc > 3) {
        fprintf(stderr, "usage: %s [iters [seed]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 &&
        bench_parse_u64("bench_realloc_growth", argv[1], "iters", 1, UINT64_MAX, &iters))
        return 2;
    if (argc > 2 && bench_parse_u64("bench_realloc_growth", argv[2], "seed", 0, UINT64_MAX, &seed))
        return 2;
    if (bench_env_u64("bench_realloc_growth", "HAKMEM_BENCH_MIN_SIZE", 16, 1, (uint64_t)1 << 40,
                      &min_size))
        return 2;
    if (bench_env_u64("bench_realloc_growth", "HAKMEM_BENCH_MAX_SIZE", (uint64_t)64 << 20, 1,
                      (uint64_t)1 << 40, &max_size))
        return 2;
    if (min_size < 2) {
        fprintf(stderr, "bench_realloc_growth: HAKMEM_BENCH_MIN_SIZE must be >= 2\n");
        return 2;
    }
    if (max_size <= min_size) {
        fprintf(stderr, "bench_realloc_growth: HAKMEM_BENCH_MAX_SIZE <= HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    if (bench_budget_init("bench_realloc_growth")) return 2;

    /* The size sequence, the same every iteration. */
    uint64_t sizes[MAX_STEPS + 1];
    unsigned steps = 0;
    sizes[0] = min_size;
    while (sizes[steps] < max_size) {
        sizes[steps + 1] = next_size(sizes[steps], max_size);
        steps++;
    }
    if (iters > UINT64_MAX / steps) {
        fprintf(stderr, "bench_realloc_growth: iters * reallocs overflows\n");
        return 2;
    }

    printf("realloc_growth: iters=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64
           " max_size=%" PRIu64 " reallocs_per_iter=%u\n",
           iters, seed, min_size, max_size, steps);
    fflush(stdout);

    uint64_t rng = seed, check = 0;
    double t0 = bench_now();
    bench_budget_start();
    uint64_t done;
    for (done = 0; bench_more(done, iters); done++) {
        /* p[0] = tag, and the last byte of part k (offset sizes[k] - 1) =
         * tag + k + 1: distinct offsets, since the sizes strictly increase
         * and sizes[0] >= 2. */
        unsigned char tag = (unsigned char)(bench_rng_next(&rng) >> 32);
        unsigned char *p = malloc(sizes[0]);
        if (p == NULL) {
            fprintf(stderr, "bench_realloc_growth: malloc(%" PRIu64 ") failed\n", sizes[0]);
            return 1;
        }
        p[0] = tag;
        p[sizes[0] - 1] = (unsigned char)(tag + 1);
        for (unsigned s = 1; s <= steps; s++) {
            uint64_t old = sizes[s - 1], n = sizes[s];
            unsigned char *q = realloc(p, n);
            if (q == NULL) {
                fprintf(stderr, "bench_realloc_growth: realloc(%" PRIu64 ") failed\n", n);
                return 1;
            }
            p = q;
            /* The first byte and the old end must have come along. */
            if (p[0] != tag || p[old - 1] != (unsigned char)(tag + s)) corrupted(p, n);
            p[n - 1] = (unsigned char)(tag + s + 1);
        }
        /* Every byte written is still there. */
        if (p[0] != tag) corrupted(p, max_size);
        for (unsigned k = 0; k <= steps; k++)
            if (p[sizes[k] - 1] != (unsigned char)(tag + k + 1)) corrupted(p, max_size);
        check += tag + max_size;
        free(p);
    }
    double elapsed = bench_now() - t0;

    bench_report(done * steps, elapsed, check, done, iters, "iterations");
    return 0;
}
