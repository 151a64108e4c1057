/* bench_append — many buffers grown side by side by small appends.
 *
 * usage: bench_append [rounds [buffers [seed]]]            (defaults 4 64 42)
 * env:   HAKMEM_BENCH_MAX_SIZE (default 65536): the size each buffer grows to
 *        HAKMEM_BENCH_STEP (default 16): bytes per append
 *
 * Each round grows `buffers` buffers from empty to MAX_SIZE: one append of
 * STEP bytes (realloc to the new length, then the new bytes written) to each
 * buffer in turn (a random one of every 8 appends goes to a random buffer
 * instead, so they do not keep in lockstep), as string builders, vectors and
 * document writers of a program working side by side do. At the end of a
 * round every buffer is checked (a byte per page and the last one) and freed,
 * and the next round grows them again. The buffers' blocks cross every size
 * class and tier edge on the way, so an allocator that ties freed memory to
 * one size class needs much more than the live set.
 *
 * One op is one append (a realloc and the write of STEP bytes). With a time
 * budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one round, since an
 * append costs more as its buffer grows (an allocator that copies copies
 * more): the loop stops at the first round after the budget is spent.
 *
 * Output (stdout): a parameter line, then bench/run.sh's Throughput, Peak RSS
 * and Page faults lines. */
#include "bench_util.h"

static const char *prog = "bench_append";

static unsigned char tag_at(uint64_t buffer, uint64_t offset) {
    return (unsigned char)(buffer * 131 + (offset >> 12) + 1);
}

static void check(const unsigned char *p, uint64_t n, uint64_t b) {
    for (uint64_t i = 0; i < n; i += 4096)
        if (p[i] != tag_at(b, i)) goto bad;
    if (p[n - 1] == tag_at(b, n - 1)) return;
bad:
    fprintf(stderr, "%s: buffer %" PRIu64 " (%p, size %" PRIu64 ") corrupted\n", prog, b,
            (const void *)p, n);
    exit(1);
}

int main(int argc, char **argv) {
    uint64_t rounds = 4, nbuf = 64, seed = 42, max_size, step;
    const struct bench_arg args[] = {{"rounds", 1, UINT64_MAX, &rounds},
                                     {"buffers", 1, 1 << 20, &nbuf},
                                     {"seed", 0, UINT64_MAX, &seed}};
    if (bench_args(prog, argc, argv, args, 3)) return 2;
    if (bench_env_u64(prog, "HAKMEM_BENCH_MAX_SIZE", 65536, 1, (uint64_t)1 << 40, &max_size) ||
        bench_env_u64(prog, "HAKMEM_BENCH_STEP", 16, 1, (uint64_t)1 << 30, &step))
        return 2;
    if (bench_budget_init(prog)) return 2;
    printf("append: rounds=%" PRIu64 " buffers=%" PRIu64 " seed=%" PRIu64 " max_size=%" PRIu64
           " step=%" PRIu64 "\n",
           rounds, nbuf, seed, max_size, step);
    fflush(stdout);

    unsigned char **buf = calloc(nbuf, sizeof *buf);
    uint64_t *len = calloc(nbuf, sizeof *len);
    if (buf == NULL || len == NULL) return 1;
    uint64_t rng = seed, ops = 0, check_sum = 0;

    double t0 = bench_now();
    bench_budget_start();
    uint64_t r;
    for (r = 0; bench_more(r, rounds); r++) {
        uint64_t full = 0, b = 0;
        while (full < nbuf) {
            uint64_t x = bench_rng_next(&rng);
            uint64_t i = (x & 7) == 0 ? (x >> 8) % nbuf : b++ % nbuf;
            if (len[i] == max_size) continue;
            uint64_t n = len[i] + step < max_size ? len[i] + step : max_size;
            unsigned char *p = realloc(buf[i], n);
            if (p == NULL) {
                fprintf(stderr, "%s: realloc(%" PRIu64 ") failed\n", prog, n);
                return 1;
            }
            /* The new bytes: page by page, each page's own tag. */
            for (uint64_t o = len[i]; o < n;) {
                uint64_t end = (o | 4095) + 1 < n ? (o | 4095) + 1 : n;
                memset(p + o, tag_at(i, o), end - o);
                o = end;
            }
            buf[i] = p;
            len[i] = n;
            if (n == max_size) full++;
            ops++;
        }
        for (uint64_t i = 0; i < nbuf; i++) {
            check(buf[i], len[i], i);
            check_sum += len[i] + buf[i][len[i] - 1];
            free(buf[i]);
            buf[i] = NULL;
            len[i] = 0;
        }
    }
    double elapsed = bench_now() - t0;

    bench_report(ops, elapsed, check_sum, r, rounds, "rounds");
    return 0;
}
