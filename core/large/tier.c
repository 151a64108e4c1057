/* Large tier: what looks at all of its caches at once (the BigCache's
 * shards, the spares, every thread's own cache): the ageing pass, trim, the
 * fork hooks and the figures; and the tier's part of the contract
 * (box/tier.h). */
#include "large/internal.h"

#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/tier.h"
#include "sizes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

uint64_t large_age_next(void) {
    atomic_store_explicit(&large_looked_ms, hak_now_ms(), memory_order_relaxed);
    uint64_t next = large_spare_age(hak_now_ms());
    uint64_t tc_next = large_tc_age_all(false, hak_now_ms());
    if (tc_next < next) next = tc_next;
    /* What the shards keep: due when unused for the age (decommit), or
     * twice that (unmap: address space only, the pages went at the first). */
    uint64_t age = hak_cfg.age_ms;
    for (uint32_t s = 0; s < LARGE_SHARDS; s++) {
        struct large_cache *lc = &large_caches[s];
        large_shard_age(lc, hak_now_ms());
        if (!large_shard_any(lc)) continue;
        large_shard_lock(lc);
        for (uint32_t i = 0; i < lc->n; i++) {
            uint64_t due = lc->e[i].freed_ms + (lc->e[i].decommitted ? 2 * age : age);
            if (due < next) next = due;
        }
        large_shard_unlock(lc);
    }
    return next;
}

bool large_trim(void) {
    large_tc_age_all(true, 0); /* every thread's own caches too */
    struct large_hdr *spare[LARGE_SPARES];
    uint32_t nspare = large_spare_drain(spare);
    for (uint32_t i = 0; i < nspare; i++)
        large_release(large_start(spare[i]), spare[i]->map_size);
    uint32_t n = 0;
    for (uint32_t s = 0; s < LARGE_SHARDS; s++) {
        struct large_cache *lc = &large_caches[s];
        struct large_entry all[LARGE_CACHE_N];
        large_shard_lock(lc);
        uint32_t k = lc->n;
        memcpy(all, lc->e, k * sizeof all[0]);
        lc->n = 0;
        lc->bytes = 0;
        large_shard_unlock(lc);
        for (uint32_t i = 0; i < k; i++)
            large_release(all[i].at, all[i].size);
        n += k;
    }
    return n + nspare > 0;
}

void large_fork_prepare(void) {
    hak_spin_lock(&large_tc_drain_lock); /* (no record is stopped while it is held) */
    hak_spin_lock(&large_spares.lock);
    for (uint32_t s = 0; s < LARGE_SHARDS; s++)
        pthread_mutex_lock(&large_caches[s].lock);
}
void large_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    for (uint32_t s = LARGE_SHARDS; s-- > 0;)
        pthread_mutex_unlock(&large_caches[s].lock);
    hak_spin_unlock(&large_spares.lock);
    hak_spin_unlock(&large_tc_drain_lock);
}

void large_fork_child(void) {
    /* The registration for membarrier is the parent's (a kernel may not
     * carry it over): again, or the fence with the exchange, set while this
     * is the only thread. */
    if (atomic_load_explicit(&large_tc_mode, memory_order_relaxed) == LARGE_TC_MEMBARRIER &&
        !os_barrier_register()) {
        atomic_store_explicit(&large_tc_mode, LARGE_TC_FENCE, memory_order_relaxed);
        if (large_my_tc) large_my_tc->mode = LARGE_TC_FENCE;
    }
    /* The records of the parent's other threads have no thread here (one
     * may have been inside its malloc or free, busy): their mappings go to
     * the BigCache and the records are given back. */
    for (uint32_t r = 0; r < LARGE_TC_RECORDS; r++) {
        struct large_tc *t = &large_tcs[r];
        if (t == large_my_tc || !atomic_load_explicit(&t->claimed, memory_order_relaxed)) continue;
        atomic_store_explicit(&t->stop, 0, memory_order_relaxed);
        large_tc_give_back(t);
    }
}

/* A published counter, never below 0 (see large_count). */
static uint64_t large_counted(int c) {
    int64_t v = atomic_load_explicit(&large_count[c], memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}

void large_get_stats(struct large_stats *s) {
    large_publish(); /* (this thread's own changes: all of them) */
    s->allocs = large_counted(LC_ALLOCS);
    s->frees = large_counted(LC_FREES);
    s->cache_hits = large_counted(LC_HITS);
    s->remaps_inplace = large_counted(LC_INPLACE);
    s->remaps_moved = large_counted(LC_MOVED);
    /* (Published allocs and frees: frees of another thread's blocks may be
     * published first.) */
    s->live_blocks = s->allocs > s->frees ? s->allocs - s->frees : 0;
    s->live_bytes = large_counted(LC_LIVE_BYTES);
    hak_spin_lock(&large_spares.lock);
    s->cached_blocks = large_spares.n;
    s->cached_bytes = large_spares.bytes;
    hak_spin_unlock(&large_spares.lock);
    for (uint32_t r = 0; r < LARGE_TC_RECORDS; r++) { /* (racing their threads: a glimpse) */
        for (uint32_t i = 0; i < LARGE_TC_N; i++) {
            struct large_hdr *h = atomic_load_explicit(&large_tcs[r].slot[i], memory_order_relaxed);
            if (h == NULL) continue;
            s->cached_blocks++;
            s->cached_bytes += atomic_load_explicit(&large_tcs[r].size[i], memory_order_relaxed);
        }
    }
    s->cache_decommits = 0;
    for (uint32_t k = 0; k < LARGE_SHARDS; k++) {
        struct large_cache *lc = &large_caches[k];
        large_shard_lock(lc);
        s->cached_blocks += lc->n;
        s->cached_bytes += lc->bytes;
        s->cache_decommits += lc->decommits;
        large_shard_unlock(lc);
    }
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void large_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_IDLE:
        tier_due(done, large_age_next());
        break;
    case COLLECT_TRIM:
        tier_released(done, large_trim());
        break;
    case COLLECT_EXIT:
        large_thread_exit();
        break;
    default:
        break; /* (the tier ages on its own calls) */
    }
}

static void large_tier_stats(struct tier_stats *s) {
    struct large_stats l;
    large_get_stats(&l);
    s->own_blocks += l.live_blocks;
    s->own_bytes += l.live_bytes;
    s->kept_bytes += l.cached_bytes;
    tier_row(s, "large.allocs", l.allocs);
    tier_row(s, "large.frees", l.frees);
    tier_row(s, "large.cache_hits", l.cache_hits);
    tier_row(s, "large.remaps_inplace", l.remaps_inplace);
    tier_row(s, "large.remaps_moved", l.remaps_moved);
    tier_row(s, "large.live_blocks", l.live_blocks);
    tier_row(s, "large.live_bytes", l.live_bytes);
    tier_row(s, "large.cached_blocks", l.cached_blocks);
    tier_row(s, "large.cached_bytes", l.cached_bytes);
    tier_row(s, "large.cache_decommits", l.cache_decommits);
}

const struct tier_ops large_tier = {.name = "large",
                                    .collect = large_collect,
                                    .thread_armed = large_thread_start,
                                    .fork_prepare = large_fork_prepare,
                                    .fork_release = large_fork_release,
                                    .fork_child = large_fork_child,
                                    .stats = large_tier_stats};
