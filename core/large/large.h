/* Large tier, above HAK_SMALL_MAX: one mapping per block, a 64-byte header in
 * the mapping's first region (at its start, or at a colour: large/block.c), the
 * block after it (or at the requested alignment).
 * Freed mappings wait in a BigCache (bounded in entries and bytes,
 * decommitted and then unmapped when they stay unused) that serves any
 * size: a bigger mapping is split at a region boundary (no syscall), a
 * smaller one grown with mremap, so freed pages are reused without faults;
 * realloc moves pages with mremap, never bytes. Mappings of 2 MiB and more
 * (but growing blocks) get transparent huge pages unless HAKMEM_HUGEPAGES=0. */
#ifndef HAK_LARGE_H
#define HAK_LARGE_H

#include "sizes.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A block of at least `size` bytes aligned to `align` (a power of two);
 * zeroed when `zero`. NULL with errno ENOMEM on failure. Any size works, but
 * the front sends only what the smaller tiers cannot serve. */
void *large_alloc(size_t size, size_t align, bool zero);
/* large_alloc for a block the heap profiler samples: recorded with it as n
 * bytes asked, sampled with the chance of `size` (prof_record); its free
 * and its reallocs tell the profiler. `small`: a small class's block the
 * profiler moves here (size: the class's, align: its blocks'), which
 * realloc keeps only where its class would, and whose mapping, freed, waits
 * apart from the BigCache for the next such block (a spare, until unused
 * for the age; large_trim unmaps them). NULL (errno untouched) for one of
 * those when too many are live: each is a mapping, and the kernel limits
 * their number. */
void *large_alloc_sampled(size_t size, size_t align, bool zero, size_t n, bool small);
/* For a block that realloc grows out of a smaller tier, likely to grow on
 * (a buffer, a string, a vector): a mapping with room to grow in place to
 * the end of its 2 MiB region, in small pages (only what is used becomes
 * resident). NULL, errno untouched, when too many such blocks are live or,
 * under an address-space limit, no cached mapping can serve it: the caller
 * then grows it as any other. */
void *large_alloc_growing(size_t size);
/* p's region entry said TIER_LARGE; `fn` names the API call for errors. */
void large_free(void *p, uint32_t entry, const char *fn);
size_t large_usable_size(const void *p, uint32_t entry, const char *fn);
/* True when p (region entry TIER_LARGE) is a live block; *req is then the
 * size last asked for it. */
bool large_is_live(const void *p, uint32_t entry, size_t *req);
/* Resize in place or by moving pages; NULL, errno and p untouched, when
 * neither works or n is a small tier's size that does not fit in place: the
 * caller then copies the block (into its class, or a new block). */
void *large_realloc(void *p, uint32_t entry, size_t n);

/* For the fuzz harness, which unmaps what a munmap it failed on purpose left
 * behind: the start and size of the mapping of live block p (region entry
 * TIER_LARGE), false when p is none; and whether a mapping of the tier
 * (a live block's or a cached one) starts at `start` (region entry `e`
 * there), its size then in *size (0 when its pages were decommitted). */
bool large_span_of(const void *p, uint32_t entry, void **start, size_t *size);
bool large_mapping_at(const void *start, uint32_t e, size_t *size);

/* Unmap every cached mapping; true when something was released. */
bool large_trim(void);
/* The background thread (front/background.c): decommit or unmap the cached
 * mappings whose age came (a look now, where the tier's own calls look
 * every quarter age at most); when the next one's comes, UINT64_MAX when
 * none is cached. */
uint64_t large_age_next(void);

/* fork: take every lock of the tier before, release them after (parent and
 * child alike: in the child the forking thread, their owner, is the only one). */
void large_fork_prepare(void);
void large_fork_release(bool child);
/* The child, after large_fork_release: the other threads' caches emptied. */
void large_fork_child(void);

/* This thread's exit hook is armed: its changes to the counters may wait
 * (up to LARGE_BATCH of them). */
void large_thread_start(void);
/* Its exit hook runs: publish them, and from now on at once. */
void large_thread_exit(void);

/* The counters: this thread's changes all, another thread's but its latest
 * few (large/internal.h, large_count). */
struct large_stats {
    uint64_t allocs, frees, cache_hits, remaps_inplace, remaps_moved;
    uint64_t live_blocks, live_bytes, cached_blocks, cached_bytes;
    uint64_t cache_decommits; /* cached mappings whose pages were given back */
};
void large_get_stats(struct large_stats *s);

/* The tier contract (box/tier.h): large_age_next, large_trim, the thread's
 * counters, the locks at fork, the counters. */
extern HAK_HIDDEN const struct tier_ops large_tier;

#endif
