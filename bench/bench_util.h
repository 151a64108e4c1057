/* Helpers shared by the bench_*.c programs: a seeded PRNG, argument and
 * environment parsing, timing, the time budget, and the common report lines.
 * Header-only so each bench stays one self-contained program. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
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

/* The time budget of a run: HAKMEM_BENCH_BUDGET seconds (a decimal; unset,
 * empty or 0: none). bench/run.sh gives every run the same budget, so that a
 * baseline that is hundreds of times slower than the others on one workload
 * (mimalloc copying a buffer grown to 64 MiB) costs seconds, not minutes.
 * Each bench counts its work in units whose rate stands for the whole run's
 * (a realloc_growth iteration, a large_churn replacement, a larson round,
 * ...), calls bench_budget_start() where its timed phase starts and
 * bench_more() before each unit, so it stops at the first unit boundary after
 * the budget is spent, then reports its rate over the units done and a
 * Bounded line (bench_report).
 *
 * A one-shot ITIMER_REAL sets a flag from its SIGALRM handler, so the loops
 * read a variable instead of the clock (a clock read per op would cost more
 * than some ops) and no thread is added (glibc's malloc changes its fast
 * paths once a process has a second thread). SA_RESTART: the one signal
 * makes no system call of the bench or of the allocator fail with EINTR. */
static atomic_bool bench_budget_flag; /* lock-free: safe to store in a handler */
static double bench_budget_s;         /* 0: no budget */
static char bench_budget_text[32];    /* as given, for the Bounded line */

static void bench_budget_alarm(int sig) {
    (void)sig;
    atomic_store_explicit(&bench_budget_flag, true, memory_order_relaxed);
}

/* Read HAKMEM_BENCH_BUDGET; 2 with a message naming `prog` when it is not a
 * number of seconds in [0, 1e6], else 0. Call it with the other arguments,
 * before any work. */
static inline int bench_budget_init(const char *prog) {
    const char *s = getenv("HAKMEM_BENCH_BUDGET");
    if (s == NULL || s[0] == '\0') return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v) || v < 0 || v > 1e6 ||
        strlen(s) >= sizeof bench_budget_text) {
        fprintf(stderr, "%s: invalid HAKMEM_BENCH_BUDGET '%s' (want seconds, 0..1e6)\n", prog, s);
        return 2;
    }
    bench_budget_s = v;
    strcpy(bench_budget_text, s);
    return 0;
}

/* Start the budget's clock (with the timed phase). */
static inline void bench_budget_start(void) {
    if (bench_budget_s <= 0) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = bench_budget_alarm;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    time_t whole = (time_t)bench_budget_s;
    struct itimerval it = {
        .it_value = {.tv_sec = whole,
                     .tv_usec = (suseconds_t)((bench_budget_s - (double)whole) * 1e6)}};
    if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0) it.it_value.tv_usec = 1;
    if (sigaction(SIGALRM, &sa, NULL) != 0 || setitimer(ITIMER_REAL, &it, NULL) != 0) {
        perror("bench: budget timer");
        exit(1);
    }
}

/* Whether to do unit `done` (counting from 0) of `planned`: not when all are
 * done, nor once the budget is spent, except the first (a rate needs one). */
static inline bool bench_more(uint64_t done, uint64_t planned) {
    return done < planned &&
           (done == 0 || !atomic_load_explicit(&bench_budget_flag, memory_order_relaxed));
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
 * peak RSS and the page faults of the whole run; when the budget stopped the
 * run before its `planned` units (`done` of them done, `unit` their name, a
 * plural), a Bounded line; with HAKMEM_BENCH_CHECK=1 also the run's checksum
 * on stderr (it depends only on the parameters and the units done, so it
 * shows a run is deterministic). */
static inline void bench_report(uint64_t ops, double elapsed, uint64_t check, uint64_t done,
                                uint64_t planned, const char *unit) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (elapsed <= 0) elapsed = 1e-9;
    printf("Throughput = %.0f ops/s\n", (double)ops / elapsed);
    printf("Peak RSS = %ld KiB\n", ru.ru_maxrss);
    printf("Page faults = %ld\n", ru.ru_minflt + ru.ru_majflt);
    if (done < planned)
        printf("Bounded = %" PRIu64 "/%" PRIu64 " %s (HAKMEM_BENCH_BUDGET=%s s)\n", done, planned,
               unit, bench_budget_text);
    const char *chk = getenv("HAKMEM_BENCH_CHECK");
    if (chk != NULL && chk[0] != '\0' && strcmp(chk, "0") != 0)
        fprintf(stderr, "checksum = %016" PRIx64 "\n", check);
}

/* The count build (make count, tests/scale/count.c) counts atomics, locks
 * and cache lines shared between threads, by call site of the allocator.
 * Preloaded, its entry points are found here: a bench that calls
 * bench_count_begin where its timed phase starts and bench_count_end(ops)
 * where it ends prints the counts per op ("count ..." lines); under any other
 * allocator both do nothing. */
static inline void bench_count_begin(void) {
    void (*begin)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "hak_count_begin");
    if (begin) begin();
}

static inline void bench_count_end(uint64_t ops) {
    void (*end)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "hak_count_end");
    void (*print)(FILE *, double) =
        (void (*)(FILE *, double))dlsym(RTLD_DEFAULT, "hak_count_print");
    if (end == NULL || print == NULL) return;
    end();
    print(stdout, ops ? (double)ops : 1.0);
}

#endif
