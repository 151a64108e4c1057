/* The table of every module with cold work of its own (box/tier.h), and the
 * loops over it: the one place that names them all. Its order is the lock
 * order (fork takes the locks in it); the modules without locks sit where
 * the other walks need them. */
#ifndef HAK_TIERS_H
#define HAK_TIERS_H

#include "box/tier.h"

/* Every module's collect of `kind`: in table order, COLLECT_EXIT in reverse
 * (the layers above give back to the layers below before these close).
 * What they did, gathered. */
struct tier_done tiers_collect(enum tier_collect kind);

/* A thread armed its exit hook (box/thread.h). */
void tiers_thread_armed(void);
/* Its exit hook runs: tiers_collect(COLLECT_EXIT). */
void tiers_thread_exit(void);

/* fork: every lock, in table order; released in reverse (parent and child
 * alike); then, in the child, what other threads had in hand. */
void tiers_fork_prepare(void);
void tiers_fork_release(bool child);
void tiers_fork_child(void);

/* Every module's figures added to *s (rows and classes when s has room for
 * them: the stats report; mallinfo2 asks for the sums only). */
void tiers_stats(struct tier_stats *s);
/* fn(name, its figures, arg) for each tier in turn (no rows, no Tiny table). */
void tiers_each_stats(void (*fn)(const char *name, const struct tier_stats *s, void *arg),
                      void *arg);

#endif
