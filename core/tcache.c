#include "tcache.h"

#include "box/thread.h"
#include "box/tier.h"

__thread struct tc_context tc_self;
bool tc_off;

bool tc_thread_start(void) {
    /* (With caches off they stay closed, so every malloc misses. tc_off is
     * read after arming, which acquires what start-up set before it.) */
    if (!thread_arm() || tc_off) return false;
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        tc_self.cnt[cls].room = (int16_t)(tc_self.cap[cls] = small_class_cap[cls]);
    tc_self.open = true;
    return true;
}

void tc_thread_close(void) {
    /* The lists are empty by now: every tier flushed them. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        tc_self.cnt[cls].room = (int16_t)(tc_self.cap[cls] = 0);
    tc_self.open = false;
}

static void tc_collect(enum tier_collect kind, struct tier_done *done) {
    (void)done;
    if (kind == COLLECT_EXIT) tc_thread_close(); /* after the tiers above flushed the lists */
}

const struct tier_ops tc_tier = {.name = "tcache", .collect = tc_collect};
