/* Region map: leaves are created on demand and never freed (one 256 KiB leaf,
 * mostly untouched, covers 128 GiB of address space); the first is static. */
#include "box/rmap.h"

#include "box/os.h"

/* Every root slot starts at this all-zero leaf (never written), so a lookup
 * needs no NULL test: an address in an unused 128 GiB reads TIER_NONE. */
uint32_t rmap_empty_leaf[RMAP_LEAF_N];
_Atomic(uint32_t *) rmap_root[RMAP_ROOT_N] = {[0 ... RMAP_ROOT_N - 1] = rmap_empty_leaf};

#define RMAP_LEAF_BYTES (RMAP_LEAF_N * sizeof(uint32_t))

static uint32_t rmap_first_leaf[RMAP_LEAF_N];
static atomic_bool rmap_first_taken;

static uint32_t *rmap_leaf(uintptr_t region, bool create) {
    _Atomic(uint32_t *) *slot = &rmap_root[region >> RMAP_LEAF_BITS];
    uint32_t *leaf = atomic_load_explicit(slot, memory_order_acquire);
    if (leaf != rmap_empty_leaf) return leaf;
    if (!create) return NULL;
    /* The first leaf is static (BSS: no mapping, pages touched lazily): the
     * arena's upper half, which holds every Pool chunk and L2.5 bundle, fits
     * in one leaf, so most programs never map one. */
    bool first = !atomic_exchange_explicit(&rmap_first_taken, true, memory_order_relaxed);
    uint32_t *fresh = first ? rmap_first_leaf : os_map_aligned(RMAP_LEAF_BYTES, HAK_PAGE_SIZE);
    if (fresh == NULL) return NULL;
    if (atomic_compare_exchange_strong_explicit(slot, &leaf, fresh, memory_order_acq_rel,
                                                memory_order_acquire))
        return fresh;
    /* Another thread installed one first. */
    if (first)
        atomic_store_explicit(&rmap_first_taken, false, memory_order_relaxed);
    else
        os_unmap(fresh, RMAP_LEAF_BYTES);
    return leaf;
}

static void rmap_store(uint32_t *leaf, uintptr_t region, uint32_t e) {
    /* A block's entry is written before the block is handed out; whoever
     * receives the block later also sees the entry. */
    atomic_store_explicit((_Atomic uint32_t *)&leaf[region & (RMAP_LEAF_N - 1)], e,
                          memory_order_release);
}

bool rmap_mark_span(void *base, size_t size, uint32_t kind) {
    return rmap_mark_span_from(base, size, kind, 0);
}

bool rmap_mark_span_from(void *base, size_t size, uint32_t kind, uint32_t head) {
    uintptr_t first = (uintptr_t)base >> HAK_REGION_SHIFT;
    uintptr_t n = (size + HAK_REGION_SIZE - 1) >> HAK_REGION_SHIFT;
    if (first + n > ((uintptr_t)1 << (RMAP_VA_BITS - HAK_REGION_SHIFT))) return false;
    if (n > ((uintptr_t)1 << 24)) return false; /* the payload holds 24 bits */
    /* Create every leaf first so a failure leaves nothing half-marked. */
    for (uintptr_t r = first; r < first + n; r += RMAP_LEAF_N - (r & (RMAP_LEAF_N - 1)))
        if (rmap_leaf(r, true) == NULL) return false;
    if (rmap_leaf(first + n - 1, true) == NULL) return false;
    for (uintptr_t i = 0; i < n; i++)
        rmap_store(rmap_leaf(first + i, false), first + i,
                   rmap_entry(kind, i ? (uint32_t)i : head));
    return true;
}

bool rmap_set_region(void *base, uint32_t kind, uint32_t payload) {
    uintptr_t r = (uintptr_t)base >> HAK_REGION_SHIFT;
    if (r >= ((uintptr_t)1 << (RMAP_VA_BITS - HAK_REGION_SHIFT))) return false;
    uint32_t *leaf = rmap_leaf(r, true);
    if (leaf == NULL) return false;
    rmap_store(leaf, r, rmap_entry(kind, payload));
    return true;
}

void rmap_clear_span(void *base, size_t size) {
    uintptr_t first = (uintptr_t)base >> HAK_REGION_SHIFT;
    uintptr_t n = (size + HAK_REGION_SIZE - 1) >> HAK_REGION_SHIFT;
    for (uintptr_t i = 0; i < n; i++) {
        uint32_t *leaf = rmap_leaf(first + i, false);
        if (leaf) rmap_store(leaf, first + i, 0);
    }
}
