/* The ageing thread's bell (HAKMEM_BACKGROUND=1, core/front/background.c).
 * The thread sleeps here: until its next pass is due, or, with nothing
 * cached anywhere, until a tier caches memory that will age. The tiers ring
 * after they did (bell_ring: a load and a branch; a wake-up, once, when the
 * thread sleeps armed). A box below the tiers, so that they can ring it;
 * only the front sleeps on it. */
#ifndef HAK_BELL_H
#define HAK_BELL_H

#include "sizes.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* The thread sleeps until rung. */
extern HAK_HIDDEN _Atomic bool bell_armed;

void bell_ring_slow(void);

/* Memory that will age was cached, under its tier's lock (held or released
 * since): wake the thread if it sleeps with nothing cached. Why no rings are
 * lost: the thread arms, then looks at every tier under its lock; a tier
 * that cached before that look is seen, one that cached after it reads the
 * bell armed (its lock ordered the two). */
HAK_INLINE void bell_ring(void) {
    if (hak_unlikely(atomic_load_explicit(&bell_armed, memory_order_relaxed))) bell_ring_slow();
}

/* Before the thread starts (and in a fork child): the condition variable,
 * on the monotonic clock. */
void bell_init(void);
/* The thread: arm before a last look at the tiers, which found nothing
 * cached; disarm when that look found something after all. */
void bell_arm(void);
void bell_disarm(void);
/* Sleep until `until_ms` (hak_now_ms's clock), and when armed until rung
 * (which disarms) too; false when bell_stop was called. */
bool bell_sleep(uint64_t until_ms, bool armed);
/* Wake the thread for good: its bell_sleep returns false from now on. */
void bell_stop(void);

/* fork: the bell's lock is taken before (after every allocator lock: a tier
 * may ring holding its own) and released after, in the child with the bell
 * disarmed and its condition variable afresh (the parent's thread may have
 * been waiting on it). Released with the allocator locks, before the
 * child's other steps, which may ring it (a Large cache of a thread the
 * child does not have, given to the BigCache). */
void bell_fork_prepare(void);
void bell_fork_release(bool child);
/* false once bell_stop was called (exit had begun). */
bool bell_live(void);

#endif
