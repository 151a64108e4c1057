/* bench_burst — a burst of mid-size and big blocks freed, then a burst of
 * other sizes.
 *
 * usage: bench_burst [rounds [mib [seed]]]                  (defaults 6 256 42)
 * env:   HAKMEM_BENCH_MIN_SIZE (default 8192), HAKMEM_BENCH_MAX_SIZE (default
 *        1048576): the size range of the blocks
 *
 * Each round allocates blocks until `mib` MiB are live, writes each whole,
 * then frees them all in random order. Sizes are log-uniform in the range,
 * but the rounds alternate between two disjoint sets of sizes: even rounds
 * take sizes in the lower part of each power of two ([2^k, 1.4 * 2^k)), odd
 * rounds the upper part ([1.4 * 2^k, 2^(k+1))). So every round but the first
 * asks for sizes no block of the previous round had: an allocator that reuses
 * freed memory across sizes peaks near `mib` MiB, one that keeps freed memory
 * for its own size class needs about twice that (a parser's phase of one
 * record shape, then another). Each block's first and last bytes and a byte
 * per page are checked before it is freed.
 *
 * One op is one block allocated, written, checked and freed. With a time
 * budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is a pair of rounds (one
 * of each set of sizes: a round alone is either the first, on fresh memory,
 * or one that follows the other set), so the loop stops at the first even
 * round after the budget is spent, having done two rounds at least.
 *
 * Output (stdout): a parameter line, then bench/run.sh's Throughput, Peak RSS
 * and Page faults lines (peak RSS is the figure of interest). */
#include "bench_util.h"

#include <math.h>

static const char *prog = "bench_burst";

int main(int argc, char **argv) {
    uint64_t rounds = 6, mib = 256, seed = 42, min_size, max_size;
    const struct bench_arg args[] = {{"rounds", 1, UINT64_MAX, &rounds},
                                     {"mib", 1, 1 << 20, &mib},
                                     {"seed", 0, UINT64_MAX, &seed}};
    if (bench_args(prog, argc, argv, args, 3)) return 2;
    if (bench_env_u64(prog, "HAKMEM_BENCH_MIN_SIZE", 8192, 1, (uint64_t)1 << 40, &min_size) ||
        bench_env_u64(prog, "HAKMEM_BENCH_MAX_SIZE", 1 << 20, 2, (uint64_t)1 << 40, &max_size))
        return 2;
    if (max_size <= min_size) {
        fprintf(stderr, "%s: HAKMEM_BENCH_MAX_SIZE <= HAKMEM_BENCH_MIN_SIZE\n", prog);
        return 2;
    }
    if (bench_budget_init(prog)) return 2;
    printf("burst: rounds=%" PRIu64 " mib=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64
           " max_size=%" PRIu64 "\n",
           rounds, mib, seed, min_size, max_size);
    fflush(stdout);

    uint64_t target = mib << 20, cap = target / min_size + 1;
    unsigned char **blk = malloc(cap * sizeof *blk);
    uint64_t *len = malloc(cap * sizeof *len);
    if (blk == NULL || len == NULL) return 1;
    uint64_t rng = seed, ops = 0, check_sum = 0;
    double lmin = log2((double)min_size), lmax = log2((double)max_size);

    double t0 = bench_now();
    bench_budget_start();
    const uint64_t pairs = (rounds + 1) / 2; /* an odd count ends with a lone round */
    uint64_t r;
    /* The budget is asked before each pair: an odd round completes its pair. */
    for (r = 0; r < rounds && (r % 2 == 1 || bench_more(r / 2, pairs)); r++) {
        uint64_t n = 0, bytes = 0;
        unsigned char tag = (unsigned char)(r * 29 + 7);
        while (bytes < target && n < cap) {
            /* log-uniform, then folded into this round's part of its octave */
            double l = lmin + (lmax - lmin) * (double)(bench_rng_next(&rng) >> 11) * 0x1p-53;
            double k = floor(l), f = l - k; /* size = 2^k * 2^f, 2^f in [1, 2) */
            double lo = r % 2 == 0 ? 0 : 0.5, part = lo + f * 0.5; /* 2^0.5 ~ 1.41 */
            uint64_t sz = (uint64_t)exp2(k + part);
            if (sz < min_size) sz = min_size;
            if (sz > max_size) sz = max_size;
            unsigned char *p = malloc(sz);
            if (p == NULL) {
                fprintf(stderr, "%s: malloc(%" PRIu64 ") failed\n", prog, sz);
                return 1;
            }
            memset(p, tag, sz);
            blk[n] = p;
            len[n++] = sz;
            bytes += sz;
        }
        /* Free in random order (Fisher-Yates on the fly). */
        for (uint64_t i = n; i > 0; i--) {
            uint64_t j = bench_rng_next(&rng) % i;
            unsigned char *p = blk[j];
            uint64_t sz = len[j];
            blk[j] = blk[i - 1];
            len[j] = len[i - 1];
            bench_check_pages(prog, p, sz, tag);
            check_sum += sz;
            free(p);
        }
        ops += n;
    }
    double elapsed = bench_now() - t0;

    bench_report(ops, elapsed, check_sum, (r + 1) / 2, pairs, "pairs of rounds");
    return 0;
}
