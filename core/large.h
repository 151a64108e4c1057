/* Large tier, above HAK_SMALL_MAX: one mapping per block, a 64-byte header at
 * the mapping's start, the block after it (or at the requested alignment).
 * Freed mappings wait in a BigCache (by size class, bounded in entries per
 * class and in bytes, decommitted and then unmapped when they stay unused),
 * so a free/malloc cycle of one size makes no syscall; realloc moves pages
 * with mremap, never bytes. HAKMEM_HUGEPAGES=1 asks for transparent huge
 * pages on mappings of 2 MiB and more. */
#ifndef HAK_LARGE_H
#define HAK_LARGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A block of at least `size` bytes aligned to `align` (a power of two);
 * zeroed when `zero`. NULL with errno ENOMEM on failure. Any size works, but
 * the front sends only what the smaller tiers cannot serve. */
void *large_alloc(size_t size, size_t align, bool zero);
/* large_alloc for a block that realloc grows out of a smaller tier: it may
 * take over any bigger cached mapping, cut down (the rest of a buffer freed
 * earlier, which its growth is likely to need again). */
void *large_alloc_growing(size_t size);
/* p's region entry said RMAP_LARGE; `fn` names the API call for errors. */
void large_free(void *p, uint32_t entry, const char *fn);
size_t large_usable_size(const void *p, uint32_t entry, const char *fn);
/* Resize in place or by moving pages; NULL (errno ENOMEM, p untouched) when
 * neither works. */
void *large_realloc(void *p, uint32_t entry, size_t n);

/* Unmap every cached mapping; true when something was released. */
bool large_trim(void);

/* fork: take every lock of the tier before, release them after (parent and
 * child alike: in the child the forking thread, their owner, is the only one). */
void large_fork_prepare(void);
void large_fork_release(void);

struct large_stats {
    uint64_t allocs, frees, cache_hits, remaps_inplace, remaps_moved;
    uint64_t live_blocks, live_bytes, cached_blocks, cached_bytes;
    uint64_t cache_decommits; /* cached mappings whose pages were given back */
};
void large_get_stats(struct large_stats *s);

#endif
