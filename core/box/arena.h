/* Arena: the process's one reservation of address space, made on first use
 * (see os_reserve): read-only zero pages costing no memory and no commit
 * charge, 256 GiB when the OS grants it. The lower half is the SuperSlab
 * range (superslab/ss.c places SuperSlabs in it); the upper half holds Pool
 * chunks, L2.5 bundles and the tiers' heap records, in 2 MiB units made
 * writable with mprotect as they are needed. So a program's mappings cost
 * one mmap, not one each, and the upper half (aligned to its size, at most
 * 128 GiB) falls in a single region-map leaf. */
#ifndef HAK_ARENA_H
#define HAK_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The SuperSlab half: false when no reservation could be made. */
bool arena_ss_range(uintptr_t *base, size_t *span);

/* `size` bytes (a page multiple), readable, writable and zero, starting
 * on a 2 MiB boundary. From the upper half while it has
 * room, else a mapping of its own; NULL when the OS refuses both. */
void *arena_alloc(size_t size);
/* Give back what arena_alloc returned (same size). */
void arena_free(void *p, size_t size);

void arena_fork_prepare(void);
void arena_fork_parent(void);
void arena_fork_child(void);

struct arena_stats {
    uint64_t reserved;   /* bytes of the reservation */
    uint64_t units_used; /* 2 MiB units of the upper half in use now */
    uint64_t fallbacks;  /* allocations that had to map their own */
};
void arena_get_stats(struct arena_stats *s);

#endif
