/* Arena: the process's window of address space, 256 GiB placed at a hint
 * address on first use (see os_reserve_at) and reserved as it is needed:
 * the lower half is the SuperSlab range (superslab/ss.c places SuperSlabs in
 * it), readable zeros; the upper half holds Pool chunks, L2.5 bundles and
 * the tiers' heap records, in 2 MiB units made writable with mprotect as they
 * are needed. Each half grows in place by doubling (so reserved but unused
 * space stays below what is used, which keeps an address-space limit, and
 * mlockall(MCL_CURRENT) populating readable pages, in proportion), in
 * smaller steps when the OS refuses more. The upper half (aligned to its
 * size, at most 128 GiB) falls in a single region-map leaf. When no hint
 * address is honoured (a sanitizer's shadow memory, valgrind) the whole
 * window is reserved at once, inaccessible, wherever the OS puts it. */
#ifndef HAK_ARENA_H
#define HAK_ARENA_H

#include "sizes.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Grow the SuperSlab half: *span (its size now; 0 before the first call)
 * becomes the new size, *base its start. false when it cannot grow (full,
 * refused, or the OS refused more address space). */
bool arena_ss_grow(uintptr_t *base, size_t *span);

/* Give back the SuperSlab half's reservation from `top` (a 2 MiB multiple,
 * nothing in use at or above it) up; true when something was given back.
 * The caller has made sure no pointer into that part is read any more. */
bool arena_ss_shrink(size_t top);
/* Under an address-space limit (which counts reserved space), give back the
 * upper half's reservation above its last unit in use; true when something
 * went. Also lets a refused window placement be tried again. */
bool arena_trim(void);

/* Every run arena_alloc returns ends in a guard page, which its user
 * leaves alone: a run of writes off one run's end, or into its start from
 * below, faults there instead of reaching the next run (a block's
 * neighbours, the tiers' records). Best effort, and never where it would
 * cost memory or the map count: none in huge pages (HAKMEM_HUGEPAGES=2); on
 * a kernel without guard markers (before Linux 6.13), where a guard splits
 * the mapping, only the first ARENA_SPLIT_GUARDS runs get one. */
#define ARENA_GUARD HAK_PAGE_SIZE

/* `size` bytes (a page multiple, more than ARENA_GUARD), the last page a
 * guard (ARENA_GUARD), the rest readable, writable and zero, starting on a
 * 2 MiB boundary, in huge pages with HAKMEM_HUGEPAGES=2. From the upper half
 * while it has room, else a mapping of its own; NULL when the OS refuses
 * both. */
void *arena_alloc(size_t size);
/* Records a tier keeps for the life of the process (small pages always) (heap records,
 * descriptor chunks): `size` bytes (at most 2 MiB less ARENA_GUARD), zeroed, 64-byte aligned,
 * carved from units they share, so a few small records cost one unit of
 * address space, not one each. Never given back. NULL when out of memory. */
void *arena_meta(size_t size);
/* Give back what arena_alloc returned (same size). */
void arena_free(void *p, size_t size);

/* fork: take every lock of the tier before, release them after (parent and
 * child alike: in the child the forking thread, their owner, is the only one). */
void arena_fork_prepare(void);
void arena_fork_release(bool child);

struct arena_stats {
    uint64_t reserved;   /* bytes of address space reserved */
    uint64_t units_used; /* 2 MiB units of the upper half in use now */
    uint64_t fallbacks;  /* allocations that had to map their own */
};
void arena_get_stats(struct arena_stats *s);

/* Its part of the tier contract (box/tier.h): arena_trim at malloc_trim,
 * its lock at fork (taken inside the tiers' own), its counters. */
extern HAK_HIDDEN const struct tier_ops arena_tier;

#endif
