/* A remote-free list: the blocks other threads free to a slab or a heap
 * they do not own, pushed with one compare-and-swap and taken whole with
 * one exchange, by the owner (and by L2.5's trim, which gives the blocks'
 * pages back and pushes the list again). The one list for every tier that has one: Tiny
 * keeps one per slab, Pool and L2.5 one per thread heap. Blocks are linked
 * wherever the tier keeps a block's link (word 0, or past the block), so a
 * push names the link to set. */
#ifndef HAK_REMOTE_H
#define HAK_REMOTE_H

#include <stdatomic.h>
#include <stddef.h>

/* Push the chain from `first` to the block whose link is `last_link` (the
 * chain already linked between them) onto *list. Returns the head it
 * replaced: NULL when the list was empty, i.e. these are the first blocks
 * since the owner last took it. Sequentially consistent: Tiny's handshake
 * with an exiting owner orders this push against its exit count
 * (tiny.c, tiny_remote_push); on x86-64 a locked compare-and-swap is a
 * full barrier anyway, so the others pay nothing for it. */
static inline void *remote_push(_Atomic(void *) *list, void *first, void **last_link) {
    void *old = atomic_load_explicit(list, memory_order_relaxed);
    do {
        *last_link = old;
    } while (!atomic_compare_exchange_weak_explicit(list, &old, first, memory_order_seq_cst,
                                                    memory_order_relaxed));
    return old;
}

/* Every block on *list (a chain, newest first), or NULL. A plain load
 * first: most looks find the list empty, and the exchange is a locked
 * instruction on a line the freers write. */
static inline void *remote_take(_Atomic(void *) *list) {
    if (atomic_load_explicit(list, memory_order_relaxed) == NULL) return NULL;
    return atomic_exchange_explicit(list, NULL, memory_order_acquire);
}

#endif
