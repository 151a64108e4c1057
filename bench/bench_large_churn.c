/* bench_large_churn — a set of big buffers, a random one replaced at a time.
 *
 * usage: bench_large_churn [iters [live [seed]]]          (defaults 400 20 42)
 * env:   HAKMEM_BENCH_MIN_SIZE (default 1048576 = 1 MiB)
 *        HAKMEM_BENCH_MAX_SIZE (default 33554432 = 32 MiB)
 *        HAKMEM_BENCH_INIT=zero|write (default zero): each new buffer is
 *          calloc'ed (a zeroed image or frame, C++'s `new char[n]()`) or
 *          malloc'ed; either way the program then writes it whole
 *
 * `live` slots start filled; each of the `iters` steps frees the buffer of a
 * random slot and puts a new one of a random size (uniform in [MIN, MAX]) in
 * its place. Before a buffer is freed, its first and last bytes and one byte
 * per page are checked against the tag it was given (so the contents survive
 * whatever the allocator does with the other slots); in zero mode the new
 * buffer's last byte and a byte per page must read as zero.
 * The page faults this takes (getrusage) are the cost an allocator saves by
 * reusing freed memory that still has its pages.
 *
 * One op is one replacement (free + allocation + initialisation). Only the
 * replacements are timed, as the other benches time only their main loop:
 * filling the slots (fresh memory, the same work for every allocator) and
 * freeing them at the end are not, so the rate is that of the reuse the
 * bench is about, whatever the number of replacements. The page faults are
 * the whole run's. With a time budget (HAKMEM_BENCH_BUDGET, bench_util.h) the
 * unit is one replacement: the loop stops at the first replacement after the
 * budget is spent.
 *
 * Output (stdout): a parameter line, then bench/run.sh's Throughput, Peak RSS
 * and Page faults lines. */
#include "bench_util.h"

static const char *prog = "bench_large_churn";

static unsigned char *make(uint64_t n, bool zero, unsigned char tag) {
    unsigned char *p = zero ? calloc(1, n) : malloc(n);
    if (p == NULL) {
        fprintf(stderr, "%s: allocation of %" PRIu64 " bytes failed\n", prog, n);
        exit(1);
    }
    if (zero) bench_check_pages(prog, p, n, 0);
    memset(p, tag, n); /* the program puts its data in */
    return p;
}

int main(int argc, char **argv) {
    uint64_t iters = 400, live = 20, seed = 42, min_size, max_size;
    const struct bench_arg args[] = {
        {"iters", 1, UINT64_MAX, &iters}, {"live", 1, 4096, &live}, {"seed", 0, UINT64_MAX, &seed}};
    if (bench_args(prog, argc, argv, args, 3)) return 2;
    if (bench_env_u64(prog, "HAKMEM_BENCH_MIN_SIZE", (uint64_t)1 << 20, 1, (uint64_t)1 << 40,
                      &min_size) ||
        bench_env_u64(prog, "HAKMEM_BENCH_MAX_SIZE", (uint64_t)32 << 20, 1, (uint64_t)1 << 40,
                      &max_size))
        return 2;
    if (max_size < min_size) {
        fprintf(stderr, "%s: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n", prog);
        return 2;
    }
    if (bench_budget_init(prog)) return 2;
    const char *init = getenv("HAKMEM_BENCH_INIT");
    if (init == NULL || init[0] == '\0') init = "zero";
    bool zero = strcmp(init, "zero") == 0;
    if (!zero && strcmp(init, "write") != 0) {
        fprintf(stderr, "%s: HAKMEM_BENCH_INIT must be zero or write (got '%s')\n", prog, init);
        return 2;
    }
    printf("large_churn: iters=%" PRIu64 " live=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64
           " max_size=%" PRIu64 " init=%s\n",
           iters, live, seed, min_size, max_size, init);
    fflush(stdout);

    unsigned char **buf = calloc(live, sizeof *buf);
    uint64_t *len = calloc(live, sizeof *len);
    unsigned char *tag = calloc(live, 1);
    if (buf == NULL || len == NULL || tag == NULL) return 1;
    uint64_t rng = seed, check_sum = 0, span = max_size - min_size + 1;

    for (uint64_t s = 0; s < live; s++) {
        len[s] = min_size + bench_rng_next(&rng) % span;
        tag[s] = (unsigned char)(s * 37 + 1);
        buf[s] = make(len[s], zero, tag[s]);
    }
    double t0 = bench_now();
    bench_budget_start();
    uint64_t done;
    for (done = 0; bench_more(done, iters); done++) {
        uint64_t r = bench_rng_next(&rng);
        uint64_t s = r % live;
        bench_check_pages(prog, buf[s], len[s], tag[s]);
        free(buf[s]);
        len[s] = min_size + (r >> 20) % span;
        tag[s] = (unsigned char)(tag[s] == 255 ? 1 : tag[s] + 1); /* never 0: zero must differ */
        buf[s] = make(len[s], zero, tag[s]);
        check_sum += len[s] ^ tag[s];
    }
    double elapsed = bench_now() - t0;
    for (uint64_t s = 0; s < live; s++) {
        bench_check_pages(prog, buf[s], len[s], tag[s]);
        free(buf[s]);
    }

    bench_report(done, elapsed, check_sum, done, iters, "replacements");
    return 0;
}
