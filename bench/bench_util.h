/* Helpers shared by the bench_*.c programs: a seeded PRNG, argument and
 * environment parsing, timing, and the common report lines. Header-only so
 * each bench stays one self-contained program. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* splitmix64: fast, full-period 64-bit generator; plenty for benchmarking. */
static inline uint64_t bench_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Map a 32-bit random value onto [0, n) without division (n <= 2^32). */
static inline uint64_t bench_bounded(uint32_t r, uint64_t n) {
    return ((uint64_t)r * n) >> 32;
}

/* Parse s as an integer in [min, max]; -1 with a message naming `prog` and
 * `what` otherwise. */
static inline int bench_parse_u64(const char *prog, const char *s, const char *what, uint64_t min,
                                  uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    if (s[0] != '-') {
        unsigned long long v = strtoull(s, &end, 0);
        if (!errno && end != s && *end == '\0' && v >= min && v <= max) {
            *out = v;
            return 0;
        }
    }
    fprintf(stderr, "%s: invalid %s '%s' (want %" PRIu64 "..%" PRIu64 ")\n", prog, what, s, min,
            max);
    return -1;
}

/* A positional argument: argv[i + 1] for args[i], kept at its default when
 * absent. */
struct bench_arg {
    const char *name;
    uint64_t min, max;
    uint64_t *val;
};

/* Parse the positional arguments into args[0 .. n-1]; 2 with a usage line or
 * a message naming `prog` when there are too many or one is invalid, else 0. */
static inline int bench_args(const char *prog, int argc, char **argv, const struct bench_arg *args,
                             int n) {
    if (argc > n + 1) {
        fprintf(stderr, "usage: %s", prog);
        for (int i = 0; i < n; i++)
            fprintf(stderr, " [%s", args[i].name);
        for (int i = 0; i < n; i++)
            fputc(']', stderr);
        fputc('\n', stderr);
        return 2;
    }
    for (int i = 0; i + 1 < argc; i++)
        if (bench_parse_u64(prog, argv[i + 1], args[i].name, args[i].min, args[i].max, args[i].val))
            return 2;
    return 0;
}

/* The environment variable `name` parsed as above, or `def` when unset. */
static inline int bench_env_u64(const char *prog, const char *name, uint64_t def, uint64_t min,
                                uint64_t max, uint64_t *out) {
    const char *s = getenv(name);
    if (s == NULL || s[0] == '\0') {
        *out = def;
        return 0;
    }
    return bench_parse_u64(prog, s, name, min, max, out);
}

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Tagged blocks, for the benches whose threads share no state: a block of n
 * bytes whose first and last byte are `tag`, checked before it is freed. A
 * failure ends the process at once (_exit: other threads may be mid-loop),
 * with a line naming `prog`. */
static inline unsigned char *bench_alloc_tagged(const char *prog, uint32_t n, unsigned char tag) {
    unsigned char *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "%s: malloc(%" PRIu32 ") failed\n", prog, n);
        _exit(1);
    }
    p[0] = tag;
    p[n - 1] = tag;
    return p;
}

static inline void bench_check_tagged(const char *prog, const unsigned char *p, uint32_t n,
                                      unsigned char tag) {
    if (p[0] == tag && p[n - 1] == tag) return;
    fprintf(stderr, "%s: block %p (size %" PRIu32 ") corrupted\n", prog, (const void *)p, n);
    _exit(1);
}

/* A block of n bytes that should hold `tag` throughout: a byte per page and
 * the last one are checked; a failure ends the process with a line naming
 * `prog`. */
static inline void bench_check_pages(const char *prog, const unsigned char *p, uint64_t n,
                                     unsigned char tag) {
    for (uint64_t i = 0; i < n; i += 4096)
        if (p[i] != tag) goto bad;
    if (p[n - 1] == tag) return;
bad:
    fprintf(stderr, "%s: block %p (size %" PRIu64 ") corrupted\n", prog, (const void *)p, n);
    exit(1);
}

/* The lines bench/run.sh reads: throughput of `ops` in `elapsed` seconds,
 * peak RSS and the page faults of the whole run; with HAKMEM_BENCH_CHECK=1 also the run's checksum
 * on stderr (it depends only on the parameters, so it shows a run is deterministic). */
static inline void bench_report(uint64_t ops, double elapsed, uint64_t check) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (elapsed <= 0) elapsed = 1e-9;
    printf("Throughput = %.0f ops/s\n", (double)ops / elapsed);
    printf("Peak RSS = %ld KiB\n", ru.ru_maxrss);
    printf("Page faults = %ld\n", ru.ru_minflt + ru.ru_majflt);
    const char *chk = getenv("HAKMEM_BENCH_CHECK");
    if (chk != NULL && chk[0] != '\0' && strcmp(chk, "0") != 0)
        fprintf(stderr, "checksum = %016" PRIx64 "\n", check);
}

#endif
