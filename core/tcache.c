#include "tcache.h"

#include "check.h"
#include "front/lifecycle.h"

__thread struct hak_tcache hak_tc;

bool tc_thread_start(void) {
    /* (Arming reads the settings: in checked mode the caches stay closed, so
     * every malloc misses into the checked tier.) */
    if (!life_thread_arm() || chk_on) return false;
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        hak_tc.cnt[cls].room = (int16_t)(hak_tc.cap[cls] = small_class_cap[cls]);
    hak_tc.open = true;
    return true;
}

void tc_thread_close(void) {
    /* The lists are empty by now: every tier flushed them. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        hak_tc.cnt[cls].room = (int16_t)(hak_tc.cap[cls] = 0);
    hak_tc.open = false;
}
