/* L2.5 tier: what the front calls on the whole tier: the fork handlers
 * (every lock of the tier), the counters (l25_get_stats) and the tier
 * contract (box/tier.h). */
#include "l25/internal.h"

#include "box/lock.h"
#include "box/tier.h"

#include <pthread.h>

void l25_fork_prepare(void) {
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            pthread_mutex_lock(&l25_shards[cls][sh].lock);
    pthread_mutex_lock(&l25_heap_lock);
    pthread_mutex_lock(&l25_desc_lock);
}

void l25_fork_child(void) {
    /* A purge of the parent's other threads had blocks out, a pass over
     * the parked heaps one of them: they stay out here (a leak, as those
     * threads' heaps are), and no refill or trim waits for them. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            l25_shards[cls][sh].purging = 0;
    l25_parked_out = 0; /* (and the parked heaps their passes had out) */
}

void l25_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    pthread_mutex_unlock(&l25_desc_lock);
    pthread_mutex_unlock(&l25_heap_lock);
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            pthread_mutex_unlock(&l25_shards[cls][sh].lock);
}

void l25_get_stats(struct l25_stats *st) {
    *st = (struct l25_stats){0};
    if (tc_self.l25) l25_drain(tc_self.l25); /* what others freed to this thread, counted back */
    int64_t carved = 0;
    hak_lock(&l25_heap_lock);
    for (struct l25_heap *h = l25_heaps_all; h; h = h->next_all) {
        st->refills += atomic_load_explicit(&h->refills, memory_order_relaxed);
        st->flushes += atomic_load_explicit(&h->flushes, memory_order_relaxed);
        carved += atomic_load_explicit(&h->carved_bytes, memory_order_relaxed);
    }
    hak_unlock(&l25_heap_lock);
    st->carved_bytes = carved > 0 ? (uint64_t)carved : 0;
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++) {
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++) {
            struct l25_shard *s = &l25_shards[cls][sh];
            hak_lock(&s->lock);
            st->refills += s->refills;
            st->flushes += s->flushes;
            st->carved_bytes += s->carved_bytes;
            hak_unlock(&s->lock);
        }
    }
    hak_lock(&l25_desc_lock);
    st->bundles_mapped = l25_mapped;
    st->bundles_unmapped = l25_unmapped;
    st->bytes_mapped = l25_bytes;
    st->decommits = l25_decommits;
    st->free_decommitted = atomic_load_explicit(&l25_free_decommitted, memory_order_relaxed);
    hak_unlock(&l25_desc_lock);
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void l25_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_THREAD:
        l25_thread_age();
        break;
    case COLLECT_AGE:
        tier_released(done, l25_age());
        break;
    case COLLECT_IDLE:
        tier_due(done, l25_age_next());
        break;
    case COLLECT_TRIM: /* this thread's cache first: its blocks may be all a bundle holds */
        l25_thread_flush();
        tier_released(done, l25_trim());
        break;
    case COLLECT_EXIT:
        l25_thread_exit();
        break;
    }
}

static void l25_tier_stats(struct tier_stats *s) {
    struct l25_stats st;
    l25_get_stats(&st);
    s->mapped += st.bytes_mapped;
    s->carved += st.carved_bytes;
    tier_row(s, "l25.bundles_mapped", st.bundles_mapped);
    tier_row(s, "l25.bundles_unmapped", st.bundles_unmapped);
    tier_row(s, "l25.bytes_mapped", st.bytes_mapped);
    tier_row(s, "l25.bytes_out", st.carved_bytes);
    tier_row(s, "l25.refills", st.refills);
    tier_row(s, "l25.flushes", st.flushes);
    tier_row(s, "l25.decommits", st.decommits);
    tier_row(s, "l25.free_decommitted", st.free_decommitted);
}

const struct tier_ops l25_tier = {.name = "l25",
                                  .collect = l25_collect,
                                  .fork_prepare = l25_fork_prepare,
                                  .fork_release = l25_fork_release,
                                  .fork_child = l25_fork_child,
                                  .stats = l25_tier_stats};
