/* Region map: which tier owns the address space around a pointer, in O(1).
 * (Tiny's SuperSlabs are not in it: they have a range of their own, which
 * free tests first; see superslab/ss.h.)
 *
 * The 47-bit user address space is cut into 2 MiB regions. Each region has a
 * 32-bit entry: the owning kind in the low 8 bits and a kind-specific payload
 * in the high 24 (a bundle descriptor for L2.5 regions; for a mapping that spans
 * several regions (a Large block, a Pool chunk), how many regions back its
 * first one is). A two-level
 * radix table with a static root: lookups are two dependent loads, leaves are
 * mapped on first use (until then a slot points at a shared all-zero leaf),
 * and an address hakmem never mapped reads as TIER_NONE (box/tier.h) without any
 * initialisation. */
#ifndef HAK_RMAP_H
#define HAK_RMAP_H

#include "box/tier.h"
#include "sizes.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define RMAP_VA_BITS   47
#define RMAP_LEAF_BITS 16
#define RMAP_ROOT_BITS (RMAP_VA_BITS - HAK_REGION_SHIFT - RMAP_LEAF_BITS)
#define RMAP_ROOT_N    ((size_t)1 << RMAP_ROOT_BITS)
#define RMAP_LEAF_N    ((size_t)1 << RMAP_LEAF_BITS)

extern HAK_HIDDEN _Atomic(uint32_t *) rmap_root[RMAP_ROOT_N];
extern HAK_HIDDEN uint32_t rmap_empty_leaf[RMAP_LEAF_N];

HAK_INLINE uint32_t rmap_entry(uint32_t kind, uint32_t payload) {
    return kind | payload << 8;
}
static inline uint32_t rmap_kind_of(uint32_t e) {
    return e & 0xff;
}
static inline uint32_t rmap_payload(uint32_t e) {
    return e >> 8;
}

/* The entry for the region holding p; 0 (TIER_NONE) for any address hakmem
 * does not own, including NULL and non-canonical or kernel addresses. */
HAK_INLINE uint32_t rmap_get(const void *p) {
    uintptr_t r = (uintptr_t)p >> HAK_REGION_SHIFT;
    uintptr_t hi = r >> RMAP_LEAF_BITS;
    if (hak_unlikely(hi >= RMAP_ROOT_N)) return 0;
    /* Acquire pairs with the leaf's installation: its zeroed entries are
     * visible before the pointer. */
    uint32_t *leaf = atomic_load_explicit(&rmap_root[hi], memory_order_acquire);
    return atomic_load_explicit((_Atomic uint32_t *)&leaf[r & (RMAP_LEAF_N - 1)],
                                memory_order_relaxed);
}

/* Start of the region holding p. */
static inline uintptr_t rmap_region_base(const void *p) {
    return (uintptr_t)p & ~(uintptr_t)(HAK_REGION_SIZE - 1);
}

/* Mark every region of [base, base+size) (base region-aligned) as `kind`, the
 * i-th region with payload i (the distance back to base). false when a leaf
 * cannot be mapped; nothing is then marked. */
bool rmap_mark_span(void *base, size_t size, uint32_t kind);
/* The same, the first region's payload `head` instead of 0. */
bool rmap_mark_span_from(void *base, size_t size, uint32_t kind, uint32_t head);
/* Mark the single region at base with an explicit payload. */
bool rmap_set_region(void *base, uint32_t kind, uint32_t payload);
/* Forget [base, base+size). */
void rmap_clear_span(void *base, size_t size);

#endif
