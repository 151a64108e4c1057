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
    uintptr_t slot; /* a slab block's slot (else 0), and its word0 as read */
    uint64_t word;
};

/* A range inside one of the blocks this thread's last ranges were inside
 * (a memcpy into a block, then a memset of it) is checked by its slot's
 * word0 alone: the same word0 is a block of the same bounds, live (a
 * freed, reused or resized block's is not the same: its generation moved
 * on). A thread with no cache yet (chk_me) looks every range up. */
static inline bool chk_seen_inside(uintptr_t a, uintptr_t z) {
    const struct chk_thread *t = chk_me;
    if (t == NULL) return false;
    for (unsigned i = 0; i < CHK_SEEN; i++) {
        const struct chk_seen *s = &t->seen[i];
        if (a - s->u < s->n && z - s->u < s->n &&
            atomic_load_explicit(chk_word0(s->slot), memory_order_relaxed) == s->word)
            return true;
    }
    return false;
}

static inline void chk_seen_add(const struct chk_cell *c) {
    struct chk_thread *t = chk_me;
    if (t == NULL) return;
    t->seen[t->seen_next] = (struct chk_seen){c->slot, c->u, c->n, c->word};
    t->seen_next = (t->seen_next + 1) % CHK_SEEN;
}

/* The block whose slot (or big mapping, or malloc(0) reservation) holds x;
 * false when none does (a slot never handed out, guard pages, a descriptor,
 * an overwritten header). */
static bool chk_cell_at(uintptr_t x, uint32_t e, struct chk_cell *c) {
    if (chk_sub(e) == CHK_ZERO) { /* every byte of it is past a block of 0 bytes */
        *c = (struct chk_cell){.u = x, .n = 0, .live = true, .slot = 0};
        return true;
    }
    if (chk_sub(e) == CHK_BIG) {
        const struct chk_big *g = chk_big_at(x, e);
        if (g == NULL) return false;
        *c = (struct chk_cell){.u = g->u,
                               .n = g->n,
                               .live = atomic_load_explicit(&g->state, memory_order_acquire) ==
                                       CHK_LIVE};
        return true;
    }
    const struct chk_region *r = chk_region_of(x);
    uintptr_t slot = chk_slot_at(x, r);
    struct chk_slot s;
    if (slot == 0) return false;
    uint64_t w = atomic_load_explicit(chk_word0(slot), memory_order_acquire);
    if (!chk_decode(w, chk_key(slot), r->size, &s)) return false;
    *c = (struct chk_cell){
        .u = slot + s.uoff, .n = s.n, .live = s.state == CHK_LIVE, .slot = slot, .word = w};
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

/* [a, z] looked up (chk_range). */
static __attribute__((noinline)) void chk_range_lookup(const char *fn, uintptr_t a, uintptr_t z,
                                                       bool write) {
    struct chk_cell c;
    uint32_t e = rmap_get((void *)a);
    enum diag_kind freed = write ? DIAG_WRITE_AFTER_FREE : DIAG_USE_AFTER_FREE;
    if (rmap_kind_of(e) == TIER_CHECK && chk_cell_at(a, e, &c)) {
        ptrdiff_t at = (ptrdiff_t)(a - c.u);
        if (!c.live) chk_range_report(fn, freed, &c, at, write);
        if (a < c.u) chk_range_report(fn, DIAG_HEAP_UNDERFLOW, &c, at, write);
        if (a - c.u >= c.n) chk_range_report(fn, DIAG_HEAP_OVERFLOW, &c, at, write);
        if (z - c.u >= c.n) chk_range_report(fn, DIAG_HEAP_OVERFLOW, &c, (ptrdiff_t)c.n, write);
        if (c.slot != 0) chk_seen_add(&c);
        return;
    }
    e = rmap_get((void *)z);
    if (rmap_kind_of(e) != TIER_CHECK || !chk_cell_at(z, e, &c)) return;
    /* It ends in a block's slot and starts outside it: below the block. */
    if (!c.live) chk_range_report(fn, freed, &c, (ptrdiff_t)(z - c.u), write);
    chk_range_report(fn, DIAG_HEAP_UNDERFLOW, &c, -(ptrdiff_t)(c.u - a), write);
}

/* (The lookup out of line: a range inside a block seen last costs no
 * stack frame.) */
void chk_range(const char *fn, const void *p, size_t n, bool write) {
    uintptr_t a = (uintptr_t)p, z = a + (n - 1);
    if (z < a) z = UINTPTR_MAX; /* (wraps: the operation faults; its end is the top) */
    if (chk_seen_inside(a, z)) return;
    chk_range_lookup(fn, a, z, write);
}
