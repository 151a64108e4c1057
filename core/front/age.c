/* The ageing look from the allocating side: a thread's misses (and its
 * countdowns, sample.c) bring it to the clock, and the tiers' purge passes
 * run when due. */
#include "front/internal.h"

#include "box/clock.h"
#include "box/config.h"

#include <stdatomic.h>

/* Ageing the caches from the allocating side too (the tiers age what comes
 * back to them as it comes back; a program that stops freeing some sizes
 * must still see their memory go): every HAKMEM_AGE_MS at most,
 * one thread makes the tiers' purge passes. A thread looks at the clock
 * once per FRONT_PURGE_TICK misses. */
#define FRONT_PURGE_TICK 64
static _Atomic uint64_t front_purge_next; /* ms */

static __thread uint64_t front_purge_mine; /* ms: this thread's next look at its own */

HAK_HIDDEN __attribute__((noinline)) void front_purge(void) {
    tc_self.purge_tick = FRONT_PURGE_TICK;
    uint64_t now = hak_now_ms();
    if (now >= front_purge_mine) {
        /* What only this thread may touch: its L2.5 cache (up to eight
         * blocks of each class, megabytes a thread that moved on keeps for
         * good) and heap (empty bundles, free blocks), and its Pool spares. */
        front_purge_mine = now + hak_cfg.age_ms;
        (void)tiers_collect(COLLECT_THREAD);
    }
    uint64_t next = atomic_load_explicit(&front_purge_next, memory_order_relaxed);
    if (now < next) return;
    /* One thread does it; the others go on. */
    if (!atomic_compare_exchange_strong_explicit(&front_purge_next, &next, now + hak_cfg.age_ms,
                                                 memory_order_relaxed, memory_order_relaxed))
        return;
    (void)tiers_collect(COLLECT_AGE); /* each tier's own timer says whether a pass is due */
}
