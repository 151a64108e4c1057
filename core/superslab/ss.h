/* SuperSlab: a 2 MiB region aligned to its size, cut into 32 slots of 64 KiB.
 * Slot 0 holds the header (one 64-byte descriptor per slot); slots 1..31 are
 * slabs of Tiny blocks. The header of any block is found by masking its
 * address, its slab by a shift: no per-block header.
 *
 * Every SuperSlab is cut from one address-space reservation, the SuperSlab
 * range, mapped read-only (zero pages, no memory, no commit charge) except
 * where a SuperSlab is in use or cached. So free knows a SuperSlab pointer
 * with a subtraction and a compare (ss_contains) and may read the header of
 * any such pointer: outside the SuperSlabs, and in one given back to the
 * OS, every descriptor reads as zero, which no block passes (ss_is_block). */
#ifndef HAK_SS_H
#define HAK_SS_H

#include "sizes.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define SS_SIZE       HAK_REGION_SIZE
#define SS_SLOT_SHIFT 16
#define SS_SLOT_SIZE  ((size_t)1 << SS_SLOT_SHIFT)
#define SS_NSLOTS     ((uint32_t)(SS_SIZE / SS_SLOT_SIZE))
#define SS_FIRST_SLOT 1u

enum ss_state { SS_UNUSED, SS_ACTIVE, SS_EMPTY };

struct tiny_heap;
/* Owner of a slab no live thread owns (unused, empty, or orphaned). Never
 * equal to a thread's heap pointer, nor to NULL (a thread without a heap). */
#define SS_NO_OWNER ((struct tiny_heap *)1)

struct ss_slab {
    void *free;                        /* owner-only free list */
    _Atomic(void *) remote;            /* blocks freed by other threads (stack) */
    _Atomic(struct tiny_heap *) owner; /* the heap that may use `free` */
    struct ss_slab *next, *prev;       /* the list the slab is on */
    /* Block test without a division (ss_is_block): offset * div_mul, mod
     * 2^32, is k * div_step for the start of block k and at least div_mul
     * for any other offset; valid_lim = carved * div_step. 0 and 0 in a slot
     * that was never cut, so nothing in it passes. */
    uint32_t div_mul; /* floor(2^32 / size) + 1 */
    /* Written by the owner as it carves, read by any thread freeing a block
     * of the slab: atomic, relaxed (a freer learnt of its block after the
     * carve that raised the limit past it). */
    uint32_t valid_lim; /* (__atomic_store_n, hak_peek) */
    uint16_t size;      /* block size */
    uint16_t capacity;  /* blocks in the slot */
    uint16_t carved;    /* blocks ever carved, from the slot start */
    uint16_t used;      /* blocks out: in caches or with the program */
    uint8_t cls;
    uint8_t state; /* enum ss_state; changed by the thread that takes or gives it back */
    uint8_t where; /* which of its heap's lists it is on (tiny.c) */
    uint8_t epoch; /* EMPTY: the purge epoch it became empty in (ss_purge) */
};
_Static_assert(sizeof(struct ss_slab) <= 64, "slab descriptor must fit a cache line");

struct superslab {
    struct ss_slab slab[SS_NSLOTS]; /* slab[0] describes the header slot: never used */
    struct superslab *next, *prev;  /* partial list or cache */
    uint32_t unused_mask;           /* bit i: slot i UNUSED */
    /* Bit i: slot i is writable. The others are read-only: slots are taken
     * lowest first and made writable as they are (ss_slot_ready), so a run
     * of writes off the last one taken faults. */
    _Atomic uint32_t writable;
    _Atomic uint32_t nactive; /* ACTIVE slots (changed without the lock) */
};
_Static_assert(sizeof(struct superslab) <= SS_SLOT_SIZE, "header must fit slot 0");

/* The range's bounds, read by every free: a cache line of their own, which
 * nothing else writes (a counter written on every carve beside them cost
 * every free on every core a miss after each carve anywhere). */
struct ss_bounds {
    uintptr_t base, span; /* written with __atomic_store_n, read with hak_peek */
} __attribute__((aligned(64)));
extern HAK_HIDDEN struct ss_bounds ss_bounds;

/* True when p lies in the SuperSlab range (see above); false for everything
 * else, NULL included, and before the range exists. Two words written once
 * (base, then span), read relaxed: a thread holding a pointer into the range
 * learnt of it after they were written, and a reader racing that one write
 * may see a mixed pair, which puts no user address (below 2^47) inside. */
HAK_INLINE bool ss_contains(const void *p) {
    return (uintptr_t)p - hak_peek(ss_bounds.base) < hak_peek(ss_bounds.span);
}

HAK_INLINE struct superslab *ss_of(const void *p) {
    return (struct superslab *)((uintptr_t)p & ~(uintptr_t)(SS_SIZE - 1));
}

HAK_INLINE struct ss_slab *ss_slab_of(const void *p) {
    return &ss_of(p)->slab[((uintptr_t)p >> SS_SLOT_SHIFT) & (SS_NSLOTS - 1)];
}

/* Set a slab's link. EMPTY and orphaned slabs wait on lock-free stacks
 * linked through it, whose poppers may read the link of a slab another
 * thread has just popped and is relinking (box/lfstack.h): an atomic store,
 * a plain one on x86. */
static inline void ss_slab_link(struct ss_slab *s, struct ss_slab *next) {
    __atomic_store_n(&s->next, next, __ATOMIC_RELAXED);
}

/* Slabs gathered in order into a chain (linked through next), to go onto a
 * lock-free stack in one push. */
struct ss_chain {
    struct ss_slab *first, *last;
};

static inline void ss_chain_add(struct ss_chain *c, struct ss_slab *s) {
    ss_slab_link(s, NULL);
    if (c->last)
        ss_slab_link(c->last, s);
    else
        c->first = s;
    c->last = s;
}

/* Slab lists (doubly linked through next/prev), used by the heaps. */
static inline void ss_slab_push(struct ss_slab **head, struct ss_slab *s) {
    s->prev = NULL;
    ss_slab_link(s, *head);
    if (*head) (*head)->prev = s;
    *head = s;
}

static inline void ss_slab_unlink(struct ss_slab **head, struct ss_slab *s) {
    if (s->prev)
        ss_slab_link(s->prev, s->next);
    else
        *head = s->next;
    if (s->next) s->next->prev = s->prev;
}

/* First byte of the slot a descriptor describes. */
static inline uint8_t *ss_slab_base(const struct ss_slab *s) {
    struct superslab *ss = ss_of(s);
    return (uint8_t *)ss + ((size_t)(s - ss->slab) << SS_SLOT_SHIFT);
}

/* True when p is the start of a block of s that was ever carved: one
 * multiply and one compare. With d = size, m = div_mul and e = d*m - 2^32
 * (1 <= e <= d), the offset k*d + r of p in its slot gives, mod 2^32,
 * k*e + r*m: k*e < carved*e for a carved block start (r = 0), and at least
 * m > 2^19 > 2^16 >= valid_lim for r > 0, without wrapping ((k+1)*e stays
 * below 2^16 + d < m), since the offset is below 2^16 and d at most 8 KiB. */
HAK_INLINE bool ss_is_block(const struct ss_slab *s, const void *p) {
    uint32_t off = (uint32_t)((uintptr_t)p & (SS_SLOT_SIZE - 1));
    return off * s->div_mul < hak_peek(s->valid_lim);
}

/* True when p starts one of the blocks s has carved, whatever its state
 * (ss_is_block: an EMPTY slab's valid limit is 0). Cold paths only. */
static inline bool ss_was_block(const struct ss_slab *s, const void *p) {
    uint32_t off = (uint32_t)((uintptr_t)p & (SS_SLOT_SIZE - 1));
    return off * s->div_mul < (uint32_t)s->carved * (s->size * s->div_mul);
}

/* Record that the first n blocks of s have been carved. */
static inline void ss_set_carved(struct ss_slab *s, uint32_t n) {
    s->carved = (uint16_t)n;
    /* n * div_step, mod 2^32 */
    __atomic_store_n(&s->valid_lim, n * (s->size * s->div_mul), __ATOMIC_RELAXED);
}

/* An ACTIVE slab for class cls (block size `size`), or NULL when out of
 * memory or out of SuperSlab range. Its owner is left for the caller to set.
 * A slab from stage 1 keeps its carved blocks on its free list. */
struct ss_slab *ss_acquire(uint32_t cls, uint32_t size);
/* Give back a slab with no block out (used == 0). Its SuperSlab, when no
 * slot of it is ACTIVE any more, is retired (its pages given back) at once
 * with `retire` (a thread's exit, a trim), else by the next purge pass or
 * ss_retire_idle: a program that frees a batch of blocks and allocates the
 * like again soon reuses the slots, pages and carved blocks and all. True
 * when it left its SuperSlab so (no ACTIVE slot, not retired). */
bool ss_release(struct ss_slab *s, bool retire);
/* Retire ss if no slot of it is ACTIVE (ss_release left it idle); a
 * SuperSlab retired or given back since is left alone (ss need not be
 * mapped any more). */
void ss_retire_idle(struct superslab *ss);
/* Retire every SuperSlab with no ACTIVE slot. */
void ss_retire_all_idle(void);
/* A slab's owner carved `bytes` more of it into blocks (for mallinfo2);
 * counted per thread, published in batches and by ss_flush_counts (at the
 * thread's exit, and before a read). */
void ss_note_carved(size_t bytes);
void ss_flush_counts(void);
/* Unmap every cached SuperSlab; true when there was one. */
bool ss_trim(void);
/* Give back the pages of slots empty since the previous pass, at most a
 * batch of them, when a pass is due (every HAKMEM_AGE_MS; ss_release
 * makes them too); with `all`, of every empty slot now (malloc_trim). true
 * when some went. An empty slot keeps its pages and its blocks (its class
 * takes it back without carving) until then; after, it is carved again when
 * taken. */
bool ss_purge(bool all);
/* The background thread (front/background.c): a pass when one is due; when
 * the next is, UINT64_MAX when no empty slot holds pages. */
uint64_t ss_age_next(void);

/* fork: take every lock of the tier before, release them after (parent and
 * child alike: in the child the forking thread, their owner, is the only one). */
void ss_fork_prepare(void);
void ss_fork_release(bool child);

struct ss_stats {
    uint64_t stage1;         /* EMPTY slot of the same class */
    uint64_t stage2;         /* UNUSED slot of a mapped SuperSlab */
    uint64_t stage2_reclass; /* EMPTY slot of another class, reset */
    uint64_t stage3_cache;   /* SuperSlab from the empty cache */
    uint64_t stage3_os;      /* new SuperSlab from the OS */
    uint64_t releases;       /* slots given back */
    uint64_t retired;        /* SuperSlabs whose slots all came back */
    uint64_t unmapped;       /* SuperSlabs returned to the OS */
    uint64_t purged;         /* empty slots whose pages were given back */
    uint64_t live, cached;   /* SuperSlabs mapped now; of those, in the cache */
    uint64_t carved_bytes;   /* bytes carved into blocks in ACTIVE/EMPTY slabs */
};
void ss_get_stats(struct ss_stats *st);

/* The tier contract (box/tier.h): ss_purge, ss_age_next, ss_trim, the
 * locks at fork, the counters. */
extern HAK_HIDDEN const struct tier_ops ss_tier;

#endif
