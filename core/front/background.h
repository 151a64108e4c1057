/* Background ageing (HAKMEM_BACKGROUND=1): one thread that makes the tiers'
 * ageing passes when they are due, so that a program that stops calling the
 * allocator still gives its free memory back after HAKMEM_AGE_MS
 * (docs/DESIGN.md, Ageing). It reaches what no thread owns: the BigCache,
 * empty SuperSlab slots, empty L2.5 bundles and free blocks of partly used
 * ones, the Pool spares of exited threads' heaps. A live thread's own caches
 * (its thread cache, L2.5 blocks, Pool spares and current chunk) only that
 * thread touches: they age on its own calls, as before. */
#ifndef HAK_BACKGROUND_H
#define HAK_BACKGROUND_H

#include "sizes.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* From the library constructor, once the configuration is read: start the
 * thread (pthread_create allocates: never from inside an allocation). */
void bg_start(void);
/* From the library destructor: wake the thread, let it finish its pass and
 * join it (for at most a second: past that, exit goes on and takes it). */
void bg_stop(void);

/* Its part of the tier contract (box/tier.h), last in the lock order: the
 * bell's lock at fork, and in the child, after every lock is released, a
 * new thread in place of the parent's. */
extern HAK_HIDDEN const struct tier_ops bg_tier;

/* For tests: passes made so far, and whether one is being made now. */
extern HAK_HIDDEN _Atomic uint64_t bg_passes;
extern HAK_HIDDEN _Atomic bool bg_busy;

#endif
