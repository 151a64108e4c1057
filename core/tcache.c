#include "tcache.h"

#include "front/lifecycle.h"

__thread struct hak_tcache hak_tc;

bool tc_thread_start(void) {
    if (!life_thread_arm()) return false;
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        hak_tc.room[cls] = small_class_cap[cls];
    hak_tc.open = true;
    return true;
}

void tc_thread_close(void) {
    /* The lists are empty by now: every tier flushed them. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        hak_tc.room[cls] = 0;
    hak_tc.open = false;
}
