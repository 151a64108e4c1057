/* Checked tier: the ranges of the memory operations hakmem exports
 * (front/memops.c). A range is looked up by its first byte and, when that
 * is in no live block, by its last: one that starts in a block must end in
 * it, and one that ends in a block's slot (its header and canary below the
 * block included) must start in the block. Both ends of a copy ahead of a
 * block, or past one, in the middle of nowhere, go unseen: the common
 * overflows run off one block's end or start. */
#include "check/internal.h"

/* What holds byte x, of region entry e: the block of its slot or mapping. */
struct chk_cell {
    uintptr_t u; /* the block */
    size_t n;
    bool live;
};

/* The block whose slot (or big mapping, or malloc(0) reservation) holds x;
 * false when none does (a slot never handed out, guard pages, a descriptor,
 * an overwritten header). */
static bool chk_cell_at(uintptr_t x, uint32_t e, struct chk_cell *c) {
    if (chk_sub(e) == CHK_ZERO) { /* every byte of it is past a block of 0 bytes */
        *c = (struct chk_cell){.u = x, .n = 0, .live = true};
        return true;
    }
    if (chk_sub(e) == CHK_BIG) {
        uintptr_t base = rmap_region_base((void *)x) - (uintptr_t)chk_arg(e) * HAK_REGION_SIZE;
        const struct chk_big *g = (const struct chk_big *)base;
        if (g->check != (chk_key(base) ^ g->u)) return false;
        *c = (struct chk_cell){.u = g->u,
                               .n = g->n,
                               .live = atomic_load_explicit(&g->state, memory_order_acquire) ==
                                       CHK_LIVE};
        return true;
    }
    const struct chk_region *r = chk_region_of(x);
    uintptr_t slot = chk_slot_at(x, r);
    struct chk_slot s;
    if (slot == 0 || !chk_decode(atomic_load_explicit(chk_word0(slot), memory_order_acquire),
                                 chk_key(slot), r->size, &s))
        return false;
    *c = (struct chk_cell){.u = slot + s.uoff, .n = s.n, .live = s.state == CHK_LIVE};
    return true;
}

_Noreturn static void chk_range_report(const char *fn, enum diag_kind kind,
                                       const struct chk_cell *c, ptrdiff_t at, bool write) {
    diag_bug(&(struct diag_bug){.fn = fn,
                                .kind = kind,
                                .p = (void *)c->u,
                                .tier = TIER_CHECK,
                                .block = c->n,
                                .at = at,
                                .read = !write});
}

void chk_range(const char *fn, const void *p, size_t n, bool write) {
    uintptr_t a = (uintptr_t)p, z = a + (n - 1);
    if (z < a) z = UINTPTR_MAX; /* (wraps: the operation faults; its end is the top) */
    struct chk_cell c;
    uint32_t e = rmap_get(p);
    enum diag_kind freed = write ? DIAG_WRITE_AFTER_FREE : DIAG_USE_AFTER_FREE;
    if (rmap_kind_of(e) == TIER_CHECK && chk_cell_at(a, e, &c)) {
        ptrdiff_t at = (ptrdiff_t)(a - c.u);
        if (!c.live) chk_range_report(fn, freed, &c, at, write);
        if (a < c.u) chk_range_report(fn, DIAG_HEAP_UNDERFLOW, &c, at, write);
        if (a - c.u >= c.n) chk_range_report(fn, DIAG_HEAP_OVERFLOW, &c, at, write);
        if (z - c.u >= c.n) chk_range_report(fn, DIAG_HEAP_OVERFLOW, &c, (ptrdiff_t)c.n, write);
        return;
    }
    e = rmap_get((void *)z);
    if (rmap_kind_of(e) != TIER_CHECK || !chk_cell_at(z, e, &c)) return;
    /* It ends in a block's slot and starts outside it: below the block. */
    if (!c.live) chk_range_report(fn, freed, &c, (ptrdiff_t)(z - c.u), write);
    chk_range_report(fn, DIAG_HEAP_UNDERFLOW, &c, -(ptrdiff_t)(c.u - a), write);
}
