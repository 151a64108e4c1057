#include "box/usage.h"
#include "box/tier.h"

#include <stdatomic.h>

__thread struct usage_tls usage_tls;

/* Signed: a thread's published frees of blocks another thread allocated
 * may come before that thread's publishing of the allocations. */
static _Atomic int64_t usage_bytes, usage_bytes_peak;

void usage_publish(void) {
    int64_t d = usage_tls.pending, high = usage_tls.high;
    usage_tls.pending = usage_tls.high = 0;
    if (d == 0 && high <= 0) return;
    int64_t was = atomic_fetch_add_explicit(&usage_bytes, d, memory_order_relaxed);
    if (high <= 0) return; /* (never above what was published) */
    int64_t top = was + high, peak = atomic_load_explicit(&usage_bytes_peak, memory_order_relaxed);
    while (top > peak &&
           !atomic_compare_exchange_weak_explicit(&usage_bytes_peak, &peak, top,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void usage_thread_start(void) {
    usage_tls.span = 2 * (uint64_t)USAGE_SLACK + 1;
}

void usage_thread_exit(void) {
    usage_tls.span = 0;
    usage_publish();
}

uint64_t usage_current(void) {
    usage_publish();
    int64_t v = atomic_load_explicit(&usage_bytes, memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}

uint64_t usage_peak(void) {
    usage_publish();
    int64_t v = atomic_load_explicit(&usage_bytes_peak, memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}

static void usage_collect(enum tier_collect kind, struct tier_done *done) {
    (void)done;
    if (kind == COLLECT_EXIT) usage_thread_exit(); /* last: after the flushes, which count */
}

const struct tier_ops usage_tier = {
    .name = "usage", .collect = usage_collect, .thread_armed = usage_thread_start};
