/* libFuzzer target: the whole allocation API against a shadow model.
 *
 * The input is a program of operations on 64 slots (tests/fuzz/fuzz_model.h
 * decodes it; every byte string is a valid program): malloc, calloc, realloc
 * (grow, shrink, to 0, from NULL), reallocarray (overflowing too), the
 * aligned allocators with valid and invalid alignments, the free calls,
 * malloc_usable_size, malloc_trim, mallinfo2, a worker thread that frees,
 * reallocates and allocates slots and exits, and windows of failing OS calls.
 * Every result is checked (see fuzz_model.h); at the end of the input every
 * block is checked fully and freed, faults are disarmed and the worker exits,
 * so inputs are independent of each other as far as the model goes.
 *
 * Environment: FUZZ_API_NO_FAULTS=1 leaves fault injection out;
 * FUZZ_API_STATS=1 prints counters at exit. */
#include "fuzz_model.h"

static bool api_faults = true;
static bool api_stats;
static uint64_t api_runs, api_ops, api_inj_fail, api_maybe_ok, api_skips;

static void api_print_stats(void) {
    fprintf(stderr, "fuzz_api: resident now %ld MiB\n", fz_rss_mb());
    fprintf(stderr,
            "fuzz_api: %llu inputs, %llu ops, %llu calls failed by injected OS failures, %llu "
            "huge requests served, %llu skipped (budget), worker starts %u\n",
            (unsigned long long)api_runs, (unsigned long long)api_ops,
            (unsigned long long)api_inj_fail, (unsigned long long)api_maybe_ok,
            (unsigned long long)api_skips, fz_w.starts);
    fprintf(stderr, "fuzz_api: calls with a failed munmap %llu, leaked mappings unmapped by the harness %llu (%llu MiB)\n",
            (unsigned long long)fz_unmap_failed_seen, (unsigned long long)fz_reclaimed,
            (unsigned long long)(fz_reclaimed_bytes >> 20));
    fprintf(stderr, "fuzz_api: injected OS failures by site:");
    for (int i = 0; i < OS_NSITES; i++)
        if (os_fault_site_failed((enum os_site)i))
            fprintf(stderr, " %s %llu/%llu;", os_fault_site_name((enum os_site)i),
                    (unsigned long long)os_fault_site_failed((enum os_site)i),
                    (unsigned long long)os_fault_site_calls((enum os_site)i));
    fprintf(stderr, "\n");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    fz_checked_mode(*argv);
    const char *e = getenv("FUZZ_API_NO_FAULTS");
    api_faults = !(e && *e == '1');
    e = getenv("FUZZ_API_STATS");
    api_stats = e && *e == '1';
    if (api_stats) atexit(api_print_stats);
    fz_warm_up();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct fz m; /* big: keep it off the stack */
    struct fz_in in = {.d = data, .n = size, .i = 0};
    fz_init(&m, FZ_MAX_SLOTS, 256 * FZ_MiB, 1 << 20, api_faults);
    fz_run(&m, &in);
    fz_finish(&m);
    api_runs++;
    api_ops += m.n_ops;
    api_inj_fail += m.n_inj_fail;
    api_maybe_ok += m.n_maybe_ok;
    api_skips += m.n_skip;
    return 0;
}
