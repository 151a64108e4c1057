/* What the L2.5 tier's files (core/l25/: bundle.c, shard.c, spare.c,
 * heap.c, age.c, tier.c) share, each thing declared once; they alone include
 * it. How the tier works: l25.h. */
#ifndef HAK_L25_INTERNAL_H
#define HAK_L25_INTERNAL_H

#include "box/arena.h"
#include "l25/l25.h"

#include "sizes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A shard of a class's shared bundles (shard.c). */
struct l25_shard {
    _Alignas(64) pthread_mutex_t lock;
    struct l25_bundle *partial; /* bundles with free blocks and blocks out */
    /* Bundles with every block free: the committed ones first, newest
     * first, then the decommitted ones. */
    struct l25_bundle *empty;
    uint32_t nempty;
    /* Committed empty bundles on `empty` (under the lock; read without it
     * by l25_steal, which locks only a shard that has one). */
    _Atomic uint32_t ncommitted;
    /* The ageing pass has something to look at here: set (under the lock)
     * when blocks come back or are taken, cleared by a pass that left no
     * committed empty bundle and no free block with pages. Read without the
     * lock: a pass locks only the shards that have work (all 305 were locked
     * every pass, from whichever allocating thread made it). */
    _Atomic bool work;
    uint64_t refills, flushes, carved_bytes;
    uint32_t purging; /* bundles with free blocks out for a purge (l25_shard_purge) */
};

/* Shard L25_SHARDS of a class has the uncoloured bundles for aligned requests. */
#define L25_ALIGNED L25_SHARDS

/* The tier's own classes: a heap's partial lists, the spare stacks. */
#define L25_NCLASSES (SMALL_NCLASSES - L25_FIRST)

/* Work the shard's empty list asks for, done once the lock is dropped. */
struct l25_todo {
    struct l25_bundle *b[L25_EMPTY_MAX + 2];
    bool unmap[L25_EMPTY_MAX + 2];
    uint32_t n;
};

/* A thread's bundles of the tier's own classes: everything in it is its
 * thread's alone (a parked heap's: the pass that took it off the list,
 * l25_parked_each), but the remote stack, which other threads push on, on a
 * line of its own. */
struct l25_heap {
    /* Blocks other threads freed, linked through the first word of their
     * colouring gap (the line their state byte is on). */
    _Alignas(64) _Atomic(void *) remote;
    /* ms: when the owner last took its remote stack (on the same line: the
     * owner writes it as it takes the stack). A freer that finds it older
     * than the age gives the block's pages back before it pushes it: an
     * idle or exited owner would hold them for good. */
    _Atomic uint64_t active_ms;
    _Alignas(64) struct l25_bundle *partial[L25_NCLASSES]; /* free blocks and blocks out */
    /* Bundles with every block free, any class: the committed ones first,
     * newest first, then the decommitted ones. */
    struct l25_bundle *empty;
    uint32_t nempty;
    uint64_t purge_ms; /* the next pass over partly used bundles' free blocks */
    /* The owner's counts (a load and a store, no locked instruction), read
     * by l25_get_stats. */
    _Atomic uint64_t refills, flushes;
    _Atomic int64_t carved_bytes;
    struct l25_heap *next_free, *next_all;
    uint64_t park_pass; /* the last pass over parked heaps that had it (l25_parked_each) */
};

/* The smallest of 2, 4, 8 MiB holding 4 blocks one stride apart before its
 * guard page. */
static inline size_t l25_span(uint32_t stride) {
    size_t span = HAK_REGION_SIZE;
    while (span - ARENA_GUARD < 4 * (size_t)stride)
        span *= 2;
    return span;
}

static inline uint32_t l25_words(uint32_t nblocks) {
    return (nblocks + 63) / 64;
}

/* Coloured (see l25.h): the tier's own classes, except for aligned requests. */
static inline uint32_t l25_stride(uint32_t cls, uint32_t shard) {
    return small_class_size[cls] + (cls >= L25_FIRST && shard != L25_ALIGNED ? 64 : 0);
}

/* A partial or empty list of bundles: a shard's (its lock held) or a
 * heap's (its owner's). */
static inline void l25_list_push(struct l25_bundle **head, struct l25_bundle *b) {
    b->prev = NULL;
    b->next = *head;
    if (*head) (*head)->prev = b;
    *head = b;
}

static inline void l25_list_remove(struct l25_bundle **head, struct l25_bundle *b) {
    if (b->prev)
        b->prev->next = b->next;
    else
        *head = b->next;
    if (b->next) b->next->prev = b->prev;
}

/* Work for the ageing pass. Shard lock held. */
static inline void l25_work(struct l25_shard *s) {
    if (!atomic_load_explicit(&s->work, memory_order_relaxed))
        atomic_store_explicit(&s->work, true, memory_order_relaxed);
}

/* The next run of set bits in *bits (taken out of it): consecutive free
 * blocks, whose pages go in one call. 0 when none is left. */
static inline uint64_t l25_next_run(uint64_t *bits) {
    if (*bits == 0) return 0;
    uint32_t i = (uint32_t)__builtin_ctzll(*bits);
    uint32_t n = (uint32_t)__builtin_ctzll(~(*bits >> i));
    uint64_t run = n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1) << i;
    *bits &= ~run;
    return run;
}

/* ---- what one file has that another calls ---------------------------------- */

/* bundle.c */
/* The descriptors' lock, and the counts under it. */
extern HAK_HIDDEN pthread_mutex_t l25_desc_lock;
extern HAK_HIDDEN uint64_t l25_mapped, l25_unmapped, l25_bytes, l25_decommits;
extern HAK_HIDDEN _Atomic uint64_t l25_free_decommitted; /* bytes of free blocks decommitted */

/* Describe in b (descriptor idx) a bundle of class cls for `shard` over
 * [base, base + span), every block free; its bitmaps in its first blocks
 * when it has more than 64. */
void l25_bundle_format(struct l25_bundle *b, uint32_t cls, uint32_t shard, uint8_t *base,
                       size_t span, uint32_t idx);

/* A new, empty bundle of cls for shard `shard`; NULL when the OS or the
 * descriptor table refuses. Called without locks. */
struct l25_bundle *l25_bundle_new(uint32_t cls, uint32_t shard, struct l25_heap *owner);

/* b (empty, on no list) unmapped, its descriptor given back. */
void l25_bundle_unmap(struct l25_bundle *b);

/* Give b's pages (every block free) back to the OS; true when they went
 * (refused for locked memory: mlockall). Its owner's. */
bool l25_bundle_decommit(struct l25_bundle *b);

/* b (decommitted) onto the empty list at *head, behind the committed ones. */
void l25_insert_parked(struct l25_bundle **head, struct l25_bundle *b);

/* Up to `want` free blocks of b into out[]; how many. Its owner's. */
uint32_t l25_take_bits(struct l25_bundle *b, void **out, uint32_t want);

/* The pages wholly inside block p of b (its ends share pages with its
 * neighbours; its gap, with its link and state, is past its end). Its
 * freer's, before it is pushed. */
void l25_block_decommit(struct l25_bundle *b, void *p);

/* Decommit the pages of run `run` of word w of b's blocks (none live or
 * cached, none taken meanwhile): only pages wholly inside the run (and the
 * unused tail after the last block), since its ends share pages with
 * neighbours that may be live. True when pages went (not refused:
 * mlockall). */
bool l25_run_decommit(struct l25_bundle *b, uint32_t w, uint64_t run);

/* The free blocks of b among `eligible` of word w whose pages are to go:
 * of each run of consecutive free blocks, from its first block that may
 * hold pages to its last, and the free block on either side of those (the
 * pages a block shares with a neighbour that was live at the last look are
 * in it now); not the rest of the run, which never had pages since (and
 * which a refill may take while a shard's purge has these out: a run of
 * never used blocks behind one freed block was all of a bundle's free
 * blocks). Each run of the result is one call. */
uint64_t l25_dirty_spans(const struct l25_bundle *b, uint32_t w, uint64_t eligible);

/* Decommit the free blocks of b among `eligible` that may hold pages: its
 * owner's (a heap's bundle). (Tracked bundles have at most 64 blocks: one
 * word.) */
bool l25_decommit_free(struct l25_bundle *b, uint64_t eligible);

/* shard.c */
/* Each class's shards: L25_SHARDS that threads are handed in turn, then
 * the aligned requests' (L25_ALIGNED). */
extern HAK_HIDDEN struct l25_shard l25_shards[SMALL_NCLASSES][L25_SHARDS + 1];

/* Off the shard's empty list. Shard lock held. */
void l25_empty_unlink(struct l25_shard *s, struct l25_bundle *b);

/* Empty bundles stay committed (a working set that empties bundles and
 * fills them again makes no syscall; another class may take them, see
 * l25_steal) until unused for the cache age (HAKMEM_AGE_MS), then
 * are decommitted; past L25_EMPTY_MAX the oldest is unmapped. Takes those
 * bundles off the list into *t. Shard lock held. */
void l25_tidy_empty(struct l25_shard *s, uint64_t now, struct l25_todo *t);

/* Do what l25_tidy_empty asked: unmap, or decommit and park. No lock held. */
void l25_release(struct l25_shard *s, struct l25_todo *t);

/* Blocks `bits` of word w of b free again: the bundle to the empty list
 * when they were its last blocks out (its work in todo, after the lock),
 * else back on the partial list if a refill had taken it off. Lock held. */
void l25_return_locked(struct l25_shard *s, struct l25_bundle *b, uint32_t w, uint64_t bits,
                       struct l25_todo *todo);

/* p (a block of a shared bundle, neither live nor cached) back into its
 * shard. */
void l25_put(void *p);

/* spare.c */
/* ms: when the spares' ageing has something to do first (the earliest
 * spare due to be decommitted or unmapped); UINT64_MAX: nothing. The
 * ageing runs then, not on the tier's pass every age: an exiting thread's
 * bundles, empty at the frees, went a second age later (the background
 * thread's RSS fell 450 ms after a burst, past its 400 ms promise). */
extern HAK_HIDDEN _Atomic uint64_t l25_spares_due;

/* b (empty, on no list) onto the spares, its pages kept while the bound
 * allows; false when the spares are full. */
bool l25_spare_put(struct l25_bundle *b);

/* A spare for class cls: one of cls (its blocks where the program's
 * touched pages are), else one of a class with the same span (a look at
 * each stack's top: no lock); NULL when none. */
struct l25_bundle *l25_spare_get(uint32_t cls);

/* The spares: committed ones unused for the age decommitted, decommitted
 * ones unused for twice the age unmapped; with `all` every one unmapped.
 * True when memory went back. */
bool l25_spares_age(uint64_t now, bool all);

/* The spares' ageing, when due and this thread is the one to do it (the
 * due time is taken; the pass sets it again from what it leaves). */
bool l25_spares_age_due(uint64_t now);

/* heap.c */
extern HAK_HIDDEN pthread_mutex_t l25_heap_lock;  /* the heap lists */
extern HAK_HIDDEN uint32_t l25_parked_out;        /* parked heaps a pass has off the list now */
extern HAK_HIDDEN struct l25_heap *l25_heaps_all; /* every heap, for the stats */

/* The empty bundles of h: past the bound (all of them with `all`) the
 * oldest unmapped; committed ones unused for the age decommitted. */
bool l25_heap_tidy(struct l25_heap *h, uint64_t now, bool all);

/* Take h's remote stack: every block on it back into its bundle, one
 * exchange for all. */
void l25_drain(struct l25_heap *h);

/* Each parked heap (an exited thread's) through fn, without l25_heap_lock:
 * taken off the list as a starting thread takes one, the pass's alone, and
 * put back in front after, numbered with the pass so that the pass does not
 * take it again. A thread starting or exiting takes the lock, and waited
 * behind every parked heap's decommits and unmaps. A heap another pass
 * renumbered meanwhile is looked at again (bounded, but for `wait_all`);
 * with `wait_all` (a trim) the pass also waits for the heaps other passes
 * have off the list, and takes them in turn. */
void l25_parked_each(void (*fn)(struct l25_heap *, void *), void *arg, bool wait_all);

/* age.c */
/* This thread has a shard's free blocks out for a purge (l25_shard_purge):
 * a signal handler's take inside it must not wait for them. */
extern HAK_HIDDEN __thread uint32_t l25_purging_mine;

#endif
