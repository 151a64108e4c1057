/* L2.5 tier, 52 KiB .. 1 MiB (classes L25_FIRST ..): size-classed blocks
 * carved from bundles, with the thread cache (core/tcache.h, 8 blocks a
 * class) in front.
 *
 * A bundle is a mapping of 2 MiB (4 or 8 MiB for the biggest classes, so
 * it holds at least 4 blocks) of one class, its blocks one stride apart from
 * its start; its descriptor lives outside it, in a table indexed by the
 * region map's payload. The stride is the size plus one cache line: block i
 * starts at page offset 64*i mod 4096, so the same offsets of different
 * blocks do not all fall into the same cache sets (with page-aligned blocks,
 * touching a page each of a few 256 KiB buffers thrashed a 16-way L2). That
 * line (the colouring gap after the block) holds the block's state byte
 * (L25_LIVE or L25_FREE, written plainly by malloc and free: every double
 * free is caught) and, while another thread's free of it waits for its
 * owner, the link of the owner's remote stack. The descriptor's `avail`
 * bitmap says which blocks are back in the bundle; no block there is linked
 * through, so free blocks and empty bundles can be given back to the OS
 * without a trace (a decommitted state byte reads L25_FREE).
 *
 * Bundles of the tier's classes are owned by a thread's heap (l25/heap.c), as
 * Pool chunks are: only the owner touches their bitmaps and lists, with no
 * lock. A block freed by another thread goes onto the owner heap's remote
 * stack (one compare-and-swap), which the owner takes whole (one exchange)
 * before it refills. A heap keeps up to 8 empty bundles of any class (the
 * same class's reused first, else one of the same span recut); past that
 * they go to spare stacks, one a class, any heap takes from before it maps
 * a bundle (its class's first). The
 * owner decommits its empty bundles unused for HAKMEM_AGE_MS, and
 * the free blocks of its partly used ones, on its own slow path
 * (l25_thread_age); a thread's heap outlives it, bundles and all, for the
 * next thread, and the background thread ages the heaps no thread has.
 * malloc_trim unmaps this thread's, the exited threads' and the spare
 * empty bundles and decommits their free blocks.
 *
 * Shared bundles (owner L25_SHARED) are in shards under locks, as before
 * the heaps: each class has L25_SHARDS shards (a lock, the bundles with free
 * blocks, the empty bundles). They serve, one block at a time and
 * uncached, aligned requests (uncoloured bundles of their own: stride =
 * size, blocks aligned to the largest power of two dividing the size, state
 * bytes in the descriptor), blocks of the other tiers' classes when those
 * have no memory (a full SuperSlab range, a refused Pool chunk), and every
 * request of a thread that may not cache (see tc_thread_start): the front
 * decides these (front_class_miss). Bundles with too many blocks for inline
 * bitmaps keep theirs, and their state bytes, in their first blocks. An
 * empty shared bundle stays committed until unused for the age, then is
 * decommitted; past L25_EMPTY_MAX in a shard the oldest is unmapped. */
#ifndef HAK_L25_H
#define HAK_L25_H

#include "box/diag.h"
#include "box/rmap.h"
#include "tcache.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdbool.h>

#define L25_SHARDS      4      /* plus one more, of uncoloured bundles, for aligned requests */
#define L25_EMPTY_MAX   4      /* empty bundles a shard keeps */
#define L25_MAX_BUNDLES 65536u /* descriptors: 128 GiB of bundles at least */
#define L25_DESC_SHIFT  12     /* descriptors come in chunks of 4096 */
#define L25_DESC_CHUNK  (1u << L25_DESC_SHIFT)

struct l25_heap;
/* The owner of the bundles of the shards (never a heap's address). */
#define L25_SHARED ((struct l25_heap *)1)

struct l25_bundle {
    /* The link on a stack of spare bundles (box/lfstack.h): a popper may
     * read it as another thread re-describes the bundle, so a format leaves
     * it alone. */
    _Atomic(void *) spare_next;
    /* Read by any thread freeing a block; set while the bundle is empty. */
    /* What every free reads, on the first line with the link: */
    struct l25_heap *owner;  /* the heap that owns it, or L25_SHARED */
    uint8_t *base;           /* NULL: descriptor unused */
    uint64_t magic;          /* floor(2^64 / stride) + 1: see l25_div */
    uint8_t *mark;           /* block i's state byte at mark + i * mark_stride */
    uint32_t stride;         /* distance between blocks: size, or size + 64 */
    uint32_t first, nblocks; /* blocks first .. nblocks-1 are usable */
    uint32_t cls;
    uint32_t mark_stride; /* stride (in the colouring gap) or 1 (an array) */
    uint32_t size;        /* block size, a copy of small_class_size[cls] */
    uint32_t idx;         /* in the descriptor table: the region map's payload */
    size_t span;          /* bytes mapped */
    uint64_t *avail;      /* a bit per block: back in the bundle (its owner's) */
    uint64_t *dirty;      /* avail blocks that may hold pages; NULL: not tracked */
    /* The owner's alone (a heap's thread, or whoever holds the shard lock),
     * on lines of their own: */
    _Alignas(64) uint32_t navail, hint; /* free blocks; first avail word that may be non-zero */
    uint32_t shard;                     /* (shared bundles) */
    bool listed;                        /* on its shard's or heap's partial list */
    bool committed;                     /* on the empty list: its pages not given back yet */
    uint64_t empty_ms;                  /* when it last became empty */
    struct l25_bundle *next, *prev;     /* partial or empty list; free descriptors */
    /* The bitmaps of a bundle of at most 64 blocks. */
    uint64_t avail1, dirty1;
    uint64_t stale1; /* free at the last ageing pass (tracked bundles only) */
    /* The state bytes of an uncoloured bundle of at most 64 blocks (shared
     * bundles: written by malloc and free, under no lock). */
    _Alignas(64) uint8_t mark1[64];
};

/* A block's state byte: L25_LIVE while the program holds it, L25_FREE (0:
 * what decommitted pages read) otherwise. */
enum { L25_FREE = 0, L25_LIVE = 0xa5 };
/* Where a coloured block's state byte lies past its end: the middle of the
 * 64-byte gap, out of reach of a one-byte overflow or underflow. */
#define L25_MARK_OFF 32

/* The descriptor table, in chunks taken from the arena as bundles need
 * them: a static table would be megabytes of zeros in the library's BSS,
 * which counts against an address-space limit and becomes resident under
 * mlockall(MCL_CURRENT). A chunk is in place before any of its descriptors
 * is published in the region map. */
extern HAK_HIDDEN struct l25_bundle *l25_desc[L25_MAX_BUNDLES / L25_DESC_CHUNK];
_Static_assert(offsetof(struct l25_bundle, mark_stride) < 64, "a free reads one descriptor line");
_Static_assert(sizeof(struct l25_bundle) * L25_DESC_CHUNK <= ((size_t)2 << 20),
               "a chunk of descriptors is one arena_meta record");

/* The bundle of p, whose region entry (kind TIER_L25) is e. */
HAK_INLINE struct l25_bundle *l25_bundle_of(uint32_t e) {
    uint32_t i = rmap_payload(e);
    return &l25_desc[i >> L25_DESC_SHIFT][i & (L25_DESC_CHUNK - 1)];
}

/* The index of the block at offset `off` of b, rounded down: the high half
 * of off * magic is floor(off / stride) for every off < 2^64 / stride. */
HAK_INLINE size_t l25_div(const struct l25_bundle *b, size_t off) {
    return (size_t)(((unsigned __int128)off * b->magic) >> 64);
}

/* p's block index in b, or -1 when p is not the start of a usable block. */
HAK_INLINE int64_t l25_index(const struct l25_bundle *b, const void *p) {
    size_t off = (size_t)((const uint8_t *)p - b->base);
    size_t i = l25_div(b, off);
    if (hak_unlikely(i * b->stride != off || i < b->first || i >= b->nblocks)) return -1;
    return (int64_t)i;
}

/* Refill the (open) thread cache of cls and hand out a block; NULL (errno
 * ENOMEM) when out of memory. */
void *l25_alloc_slow(uint32_t cls);
/* p, a valid block of this thread's heap no longer live, could not go into
 * the thread cache (full: room overdrawn). */
void l25_free_slow(void *p, uint32_t cls);
/* p (a valid block of b, no longer live) is not this thread's: onto its
 * owner heap's remote stack, or back into its shard (a shared bundle). */
void l25_free_other(void *p, struct l25_bundle *b);
/* One block of any class straight from its bundles, bypassing caches; NULL
 * (errno ENOMEM) when out of memory. */
void *l25_alloc_uncached(uint32_t cls);
/* Block i of b's state byte. */
HAK_INLINE uint8_t *l25_mark(const struct l25_bundle *b, size_t i) {
    return b->mark + i * b->mark_stride;
}

/* Mark p, a block of its bundle, held by the program. */
HAK_INLINE void l25_set_live(void *p) {
    struct l25_bundle *b = l25_bundle_of(rmap_get(p));
    *l25_mark(b, l25_div(b, (size_t)((uint8_t *)p - b->base))) = L25_LIVE;
}

/* A block of class cls (>= L25_FIRST) aligned to the largest power of two
 * dividing its size; NULL (errno ENOMEM) when out of memory. Uncached. */
void *l25_alloc_aligned(uint32_t cls);

/* A block of class cls (>= L25_FIRST); NULL (errno ENOMEM) when out of
 * memory. */
HAK_INLINE void *l25_alloc_fast(uint32_t cls) {
    void *p = tc_pop(cls);
    /* A cached block is a heap bundle's, coloured, its state byte in the
     * gap past it (no region map or descriptor to read: l25_set_live). */
    if (hak_likely(p != NULL)) ((uint8_t *)p)[small_class_size[cls] + L25_MARK_OFF] = L25_LIVE;
    return p;
}

/* Free p, whose region entry e says TIER_L25; `fn` names the API call. */
#define L25_BEHIND_MIN ((uint32_t)128 << 10) /* l25_free */

HAK_INLINE void l25_free(void *p, uint32_t e, const char *fn) {
    struct l25_bundle *b = l25_bundle_of(e);
    int64_t i = l25_index(b, p);
    if (hak_unlikely(i < 0))
        return diag_reject(fn, DIAG_INVALID_POINTER, p, TIER_L25, small_class_size[b->cls]);
    uint8_t *m = l25_mark(b, (size_t)i);
    if (hak_unlikely(*m != L25_LIVE))
        return diag_reject(fn, *m == L25_FREE ? DIAG_DOUBLE_FREE : DIAG_INVALID_POINTER, p,
                           TIER_L25, small_class_size[b->cls]);
    *m = L25_FREE;
    /* Only this thread's own blocks enter its cache (of L2.5 classes alone:
     * shared bundles, which have the other tiers' classes, are no heap's). */
    if (hak_unlikely(b->owner != tc_self.l25)) return l25_free_other(p, b);
    /* From 128 KiB (glibc's mmap threshold: what glibc hands straight back
     * is below it) not the next request's of its size: behind the list's
     * first. Below, the freed block first: a loop of one 64 KiB block
     * taking turns with another ran 8% slower with 10% more resident
     * (bench_scenarios json). */
    if (hak_unlikely(!tc_push_behind(b->cls, p, b->size >= L25_BEHIND_MIN)))
        l25_free_slow(p, b->cls);
}

/* True when p (TIER_L25 entry e) is a live block. */
static inline bool l25_is_live(const void *p, uint32_t e) {
    struct l25_bundle *b = l25_bundle_of(e);
    int64_t i = l25_index(b, p);
    return i >= 0 && *l25_mark(b, (size_t)i) == L25_LIVE;
}

/* The class of p (TIER_L25 entry e); aborts naming p unless p is live. */
static inline uint32_t l25_class_of(const void *p, uint32_t e, const char *fn) {
    uint32_t cls = l25_bundle_of(e)->cls;
    if (!l25_is_live(p, e))
        diag_bad_pointer(fn, DIAG_INVALID_POINTER, p, TIER_L25, small_class_size[cls]);
    return cls;
}

/* Return every block this thread caches to its bundle. */
void l25_thread_flush(void);
/* This thread's look at its own (front_purge, every HAKMEM_AGE_MS
 * or so): its cache flushed, its remote frees taken back, its empty bundles
 * unused for the age decommitted, and when a pass is due the free blocks of
 * its partly used bundles. */
void l25_thread_age(void);
/* Thread exit: the cache back to the bundles, the heap (bundles and all) to
 * the next thread. */
void l25_thread_exit(void);
/* malloc_trim: unmap empty bundles, decommit the free blocks of the others;
 * true when memory went back to the OS. */
bool l25_trim(void);
/* When a pass is due (every HAKMEM_AGE_MS; one timer, whoever
 * calls: l25_put makes them too), decommit or unmap empty bundles unused for
 * the cache age, and the free blocks of partly used bundles (but a few at
 * the front of each shard, which its next refills take); true when memory
 * went back. */
bool l25_age(void);
/* The background thread (front/background.c): l25_age, and every empty
 * bundle unused for the age decommitted now, whether or not a pass is due;
 * when something is next due, UINT64_MAX when nothing that ages is left. */
uint64_t l25_age_next(void);

/* fork: take every lock of the tier before, release them after (parent and
 * child alike: in the child the forking thread, their owner, is the only one). */
void l25_fork_prepare(void);
void l25_fork_release(bool child);
/* In a fork child, after l25_fork_release: what other threads had in hand. */
void l25_fork_child(void);

struct l25_stats {
    uint64_t bundles_mapped, bundles_unmapped, bytes_mapped; /* bytes_mapped: now */
    uint64_t carved_bytes; /* bytes of blocks out of their bundles now */
    uint64_t refills, flushes, decommits;
    uint64_t free_decommitted; /* bytes of free blocks of partly used bundles decommitted */
};
void l25_get_stats(struct l25_stats *st);

/* The tier contract (box/tier.h): l25_thread_age, l25_age, l25_age_next,
 * l25_trim, l25_thread_exit, the locks at fork, the counters. */
extern HAK_HIDDEN const struct tier_ops l25_tier;

#endif
