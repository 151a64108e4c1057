/* Checked tier (HAKMEM_CHECK=1): while on, it serves every allocation, so
 * that heap bugs are found where they happen, at a price in speed. The other
 * tiers keep their fast paths untouched: with their thread caches empty,
 * every malloc takes the miss path, which comes here; free finds the block's
 * region marked TIER_CHECK.
 *
 * A block below CHK_SLOT_MAX has a slot of its own in a 2 MiB region of one
 * slot size, ending in a guard page:
 *
 *   [word0: size, family, state, block offset, generation, their hash; xor a key][word1: canary]
 *   [canary gap (aligned blocks)][block][canary to the slot's end]
 *
 * Canary bytes come from a per-process secret and have the high bit set, so
 * no ASCII text and no string terminator matches them. free checks both
 * canaries (underflow, overflow), the state (double free) and the family
 * (free of new's block), zeroes the slot and puts it in a quarantine;
 * malloc verifies the zeros before handing the slot out again (write after
 * free), and so do exit and malloc_trim for every freed slot, and the
 * canaries of every live block (an overflow of a block never freed).
 * Every block handed out is zeroed. The slab regions' slots lie in halves
 * between guard pages less than 1 MiB apart, so a run of writes that long
 * from any block faults.
 * Bigger blocks get a mapping each, the block's end against a guard page;
 * freed, their pages are dropped and made read-only. malloc(0) gives a
 * unique address in an inaccessible reservation. */
#ifndef HAK_CHECK_H
#define HAK_CHECK_H

#include "box/diag.h"
#include "sizes.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Set once at start-up (HAKMEM_CHECK=1); blocks allocated before stay in
 * their tiers and are freed there. */
extern HAK_HIDDEN bool chk_on;

/* Turn the tier on: after the settings are read, before any thread caches. */
void chk_start(void);

/* A block of n bytes aligned to `align` (a power of two; 0 or up to 16: 16).
 * NULL with errno ENOMEM when no memory. */
void *chk_alloc(size_t n, size_t align, enum api_family f);
/* calloc of n bytes (the product checked by the caller). */
void *chk_calloc(size_t n);
/* Free p, whose region entry is e (TIER_CHECK); `fn` names the call, and
 * says which family it frees ("operator delete", "operator delete[]", any
 * other: malloc's). Anything wrong with p is reported and aborts. */
void chk_free(void *p, uint32_t e, const char *fn);
/* realloc of p (entry e) to n > 0 bytes; NULL (p untouched) when no memory. */
void *chk_realloc(void *p, uint32_t e, size_t n);
/* The size p was allocated for; reports, as free would, a p that is not a
 * live block. */
size_t chk_usable_size(const void *p, uint32_t e, const char *fn);
/* A memory operation `fn` (memcpy, strcpy, ...) about to write (or read,
 * !write) the n > 0 bytes at p: a range that crosses the start or end of a
 * live block of the tier, or touches a freed one, is reported, and aborts.
 * Memory that is not the tier's passes. */
void chk_range(const char *fn, const void *p, size_t n, bool write);
/* Whether p is a live block, and its size. */
bool chk_is_live(const void *p, uint32_t e, size_t *size);

/* A thread's exit: its cache (quarantine, free slots) goes to the next new
 * thread. */
void chk_thread_exit(void);
/* Every block the tier holds, looked at (exit, malloc_trim; `fn` names
 * it in a report): a freed slot must still be zero, a live block's
 * canaries intact. What another thread is changing meanwhile is left
 * alone. */
void chk_walk(const char *fn);
/* At exit: chk_walk, when the tier is on. */
void chk_exit(void);
void chk_fork_prepare(void);
void chk_fork_release(bool child);

/* The tier contract (box/tier.h): chk_thread_exit, the locks at fork. */
extern HAK_HIDDEN const struct tier_ops chk_tier;

#endif
