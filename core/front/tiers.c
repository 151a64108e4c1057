#include "front/tiers.h"

#include "box/arena.h"
#include "box/os.h"
#include "prof/prof.h"
#include "box/usage.h"
#include "check/check.h"
#include "front/background.h"
#include "l25/l25.h"
#include "large/large.h"
#include "pool.h"
#include "superslab/ss.h"
#include "tcache.h"
#include "tiny.h"

#include <stdint.h>

/* Lock order: prof (a record's mapping is made under its lock), checked
 * mode, SuperSlabs, Pool, L2.5, Large, the arena (the tiers take it inside
 * their own locks), the background thread's bell (a tier may ring it
 * holding its lock). The others have no lock: usage first (its exit
 * publishes what the exits before it counted), the thread cache before
 * Tiny (its lists close after every tier flushed them), the OS boundary's
 * counters last in the stats report. */
static const struct tier_ops *const tiers[] = {
    &usage_tier, &prof_tier, &chk_tier,   &tc_tier,    &tiny_tier, &ss_tier,
    &pool_tier,  &l25_tier,  &large_tier, &arena_tier, &os_tier,   &bg_tier,
};
#define TIERS_N (sizeof tiers / sizeof tiers[0])

struct tier_done tiers_collect(enum tier_collect kind) {
    struct tier_done d = {.released = false, .next_ms = UINT64_MAX};
    for (uint32_t i = 0; i < TIERS_N; i++) {
        const struct tier_ops *t = tiers[kind == COLLECT_EXIT ? TIERS_N - 1 - i : i];
        if (t->collect) t->collect(kind, &d);
    }
    return d;
}

void tiers_thread_armed(void) {
    for (uint32_t i = 0; i < TIERS_N; i++)
        if (tiers[i]->thread_armed) tiers[i]->thread_armed();
}

void tiers_thread_exit(void) {
    (void)tiers_collect(COLLECT_EXIT);
}

void tiers_fork_prepare(void) {
    for (uint32_t i = 0; i < TIERS_N; i++)
        if (tiers[i]->fork_prepare) tiers[i]->fork_prepare();
}

void tiers_fork_release(bool child) {
    for (uint32_t i = TIERS_N; i-- > 0;)
        if (tiers[i]->fork_release) tiers[i]->fork_release(child);
}

void tiers_fork_child(void) {
    for (uint32_t i = 0; i < TIERS_N; i++)
        if (tiers[i]->fork_child) tiers[i]->fork_child();
}

void tiers_each_stats(void (*fn)(const char *name, const struct tier_stats *s, void *arg),
                      void *arg) {
    for (uint32_t i = 0; i < TIERS_N; i++) {
        if (tiers[i]->stats == NULL) continue;
        struct tier_stats s = {0};
        tiers[i]->stats(&s);
        fn(tiers[i]->name, &s, arg);
    }
}

void tiers_stats(struct tier_stats *s) {
    for (uint32_t i = 0; i < TIERS_N; i++)
        if (tiers[i]->stats) tiers[i]->stats(s);
}
