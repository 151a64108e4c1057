/* L2.5 tier: bundles. The descriptor table (descriptors taken and given
 * back), a bundle's format (its stride, state bytes and bitmaps), its
 * mapping and unmapping, taking blocks off its bitmap, and giving pages back
 * to the OS: an empty bundle's, a freed block's, the runs of free blocks of
 * a partly used one. */
#include "l25/internal.h"

#include "box/arena.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/os.h"

#include <assert.h>
#include <string.h>

HAK_HIDDEN struct l25_bundle *l25_desc[L25_MAX_BUNDLES / L25_DESC_CHUNK];

#define L25_LIMIT_DIV 256

/* Descriptors: a high-water mark and a list of the ones given back. */
pthread_mutex_t l25_desc_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t l25_desc_top;
static struct l25_bundle *l25_desc_free;
uint64_t l25_mapped, l25_unmapped, l25_bytes, l25_decommits; /* under l25_desc_lock */
_Atomic uint64_t l25_free_decommitted;                       /* bytes of free blocks decommitted */

/* Make every usable block of b free (a new bundle, or one decommitted, whose
 * bitmaps in its first blocks read as zero again). */
static void l25_bundle_reset(struct l25_bundle *b) {
    uint32_t words = l25_words(b->nblocks);
    memset(b->avail, 0, words * sizeof(uint64_t));
    for (uint32_t i = b->first; i < b->nblocks; i++)
        b->avail[i >> 6] |= (uint64_t)1 << (i & 63);
    if (b->dirty) memset(b->dirty, 0, words * sizeof(uint64_t));
    b->stale1 = 0;
    b->navail = b->nblocks - b->first;
    b->hint = b->first >> 6;
}

/* Descriptor i has its chunk, taken from the arena when it is the first of
 * one; false when the arena refuses. l25_desc_lock held. */
static bool l25_desc_chunk(uint32_t i) {
    struct l25_bundle **c = &l25_desc[i >> L25_DESC_SHIFT];
    if (*c == NULL) *c = arena_meta(L25_DESC_CHUNK * sizeof **c); /* zeroed */
    return *c != NULL;
}

/* b's descriptor back, and its bundle of `span` bytes uncounted: unmapped,
 * or (`unmapped` false) never mapped after all. */
static void l25_desc_put(struct l25_bundle *b, size_t span, bool unmapped) {
    hak_lock(&l25_desc_lock);
    if (unmapped)
        l25_unmapped++;
    else
        l25_mapped--;
    l25_bytes -= span;
    b->base = NULL;
    b->next = l25_desc_free;
    l25_desc_free = b;
    hak_unlock(&l25_desc_lock);
}

void l25_bundle_format(struct l25_bundle *b, uint32_t cls, uint32_t shard, uint8_t *base,
                       size_t span, uint32_t idx) {
    const uint32_t size = small_class_size[cls], stride = l25_stride(cls, shard);
    memset(&b->owner, 0, sizeof *b - offsetof(struct l25_bundle, owner));
    b->idx = idx;
    b->base = base;
    b->span = span;
    b->cls = cls;
    b->size = size;
    b->stride = stride;
    /* floor(2^64 / stride) + 1, or exactly 2^64 / stride for a power of two
     * (exact then too). */
    b->magic = UINT64_MAX / stride + 1;
    b->nblocks = (uint32_t)((span - ARENA_GUARD) / stride); /* (the guard page: arena.h) */
    b->shard = shard;
    b->owner = L25_SHARED;
    if (stride != size) { /* coloured: the state bytes in the gaps */
        /* (l25_alloc_fast writes a cached block's there, past the block: a
         * coloured bundle keeps no bitmap in its first blocks.) */
        assert(b->nblocks <= 64);
        b->mark = base + size + L25_MARK_OFF;
        b->mark_stride = stride;
    } else {
        b->mark = b->mark1;
        b->mark_stride = 1;
    }
    if (b->nblocks <= 64) {
        b->avail = &b->avail1;
        b->dirty = &b->dirty1;
    } else {
        /* The bitmap and the state bytes in the first blocks, which are
         * then never handed out (zeroed: the pages may hold another class's
         * blocks). */
        size_t words = l25_words(b->nblocks) * sizeof(uint64_t), bytes = words + b->nblocks;
        b->avail = (uint64_t *)base;
        b->mark = base + words;
        b->first = (uint32_t)((bytes + size - 1) / size);
        memset(base, 0, bytes);
    }
    l25_bundle_reset(b);
}

struct l25_bundle *l25_bundle_new(uint32_t cls, uint32_t shard, struct l25_heap *owner) {
    const size_t span = l25_span(l25_stride(cls, shard));
    /* Under an address-space limit each class's partly used bundle is space
     * other blocks cannot have: bundles no bigger than 1/256 of the limit
     * (read each time: a program may set it while running). Bigger blocks
     * then get mappings of their own (the front's last resort). */
    if (span > os_as_limit() / L25_LIMIT_DIV) return NULL;
    struct l25_bundle *b;
    uint32_t idx = 0;
    hak_lock(&l25_desc_lock);
    if ((b = l25_desc_free) != NULL) {
        l25_desc_free = b->next;
        idx = b->idx;
    } else if (l25_desc_top < L25_MAX_BUNDLES && l25_desc_chunk(l25_desc_top)) {
        idx = l25_desc_top++;
        b = &l25_desc[idx >> L25_DESC_SHIFT][idx & (L25_DESC_CHUNK - 1)];
        b->idx = idx; /* kept for good: the descriptor may go back unused */
    }
    if (b) { /* counted now, under the one lock (taken back if the mapping fails) */
        l25_mapped++;
        l25_bytes += span;
    }
    hak_unlock(&l25_desc_lock);
    if (b == NULL) return NULL;

    uint8_t *base = arena_alloc(span);
    if (base == NULL) {
        l25_desc_put(b, span, false);
        return NULL;
    }
    l25_bundle_format(b, cls, shard, base, span, idx);
    b->owner = owner;
    /* Published in the region map only once the descriptor is complete. */
    for (size_t r = 0; r < span; r += HAK_REGION_SIZE) {
        if (!rmap_set_region(base + r, TIER_L25, idx)) {
            rmap_clear_span(base, span);
            arena_free(base, span);
            l25_desc_put(b, span, false);
            return NULL;
        }
    }
    return b;
}

void l25_bundle_unmap(struct l25_bundle *b) {
    size_t span = b->span;
    rmap_clear_span(b->base, span);
    arena_free(b->base, span);
    l25_desc_put(b, span, true);
}

static void l25_count_decommit(void) {
    hak_lock(&l25_desc_lock);
    l25_decommits++;
    hak_unlock(&l25_desc_lock);
}

bool l25_bundle_decommit(struct l25_bundle *b) {
    if (!os_decommit(b->base, b->span)) return false;
    if (b->first) l25_bundle_reset(b); /* its bitmaps went with the pages */
    if (b->dirty) memset(b->dirty, 0, l25_words(b->nblocks) * sizeof(uint64_t));
    l25_count_decommit();
    return true;
}

void l25_insert_parked(struct l25_bundle **head, struct l25_bundle *b) {
    struct l25_bundle *after = NULL;
    for (struct l25_bundle *e = *head; e && e->committed; e = e->next)
        after = e;
    if (after) {
        b->prev = after;
        b->next = after->next;
        if (b->next) b->next->prev = b;
        after->next = b;
    } else {
        l25_list_push(head, b);
    }
}

uint32_t l25_take_bits(struct l25_bundle *b, void **out, uint32_t want) {
    uint32_t got = 0, words = l25_words(b->nblocks);
    for (uint32_t w = b->hint; w < words && got < want; w++) {
        uint64_t bits = b->avail[w];
        while (bits && got < want) {
            uint32_t i = (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            out[got++] = b->base + (size_t)(w * 64 + i) * b->stride;
        }
        /* Taken: the bits below what is left in the word (all, when the loop
         * ended on want with bits left, are the ones just taken). */
        uint64_t taken = b->avail[w] & ~bits;
        b->avail[w] = bits;
        if (b->dirty) {
            b->dirty[w] |= taken;
            b->stale1 &= ~taken; /* in use again: no longer free since a pass */
        }
        if (bits == 0) b->hint = w + 1;
    }
    b->navail -= got;
    return got;
}

void l25_block_decommit(struct l25_bundle *b, void *p) {
    if (hak_huge_heaps()) return; /* whole bundles only */
    uintptr_t lo = hak_align_up((uintptr_t)p, HAK_PAGE_SIZE);
    uintptr_t hi = ((uintptr_t)p + b->size) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
    if (hi > lo && os_decommit((void *)lo, hi - lo))
        atomic_fetch_add_explicit(&l25_free_decommitted, hi - lo, memory_order_relaxed);
}

bool l25_run_decommit(struct l25_bundle *b, uint32_t w, uint64_t run) {
    /* Huge pages: whole bundles only. The passes run as ever and clear the
     * run's dirty bits, so nothing stays due. */
    if (hak_huge_heaps()) return false;
    size_t first = (size_t)w * 64 + (size_t)__builtin_ctzll(run),
           last = first + (size_t)__builtin_popcountll(run);
    uintptr_t lo = hak_align_up((uintptr_t)b->base + first * b->stride, HAK_PAGE_SIZE);
    uintptr_t hi = last == b->nblocks
                       ? (uintptr_t)b->base + b->span - ARENA_GUARD
                       : ((uintptr_t)b->base + last * b->stride) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
    if (hi <= lo || !os_decommit((void *)lo, hi - lo)) return false;
    atomic_fetch_add_explicit(&l25_free_decommitted, hi - lo, memory_order_relaxed);
    return true;
}

uint64_t l25_dirty_spans(const struct l25_bundle *b, uint32_t w, uint64_t eligible) {
    uint64_t bits = b->avail[w] & eligible, spans = 0;
    for (uint64_t run; (run = l25_next_run(&bits)) != 0;) {
        uint64_t d = run & b->dirty[w];
        if (d == 0) continue;
        uint32_t lo = (uint32_t)__builtin_ctzll(d), hi = 63u - (uint32_t)__builtin_clzll(d);
        if (lo > 0 && (run >> (lo - 1) & 1)) lo--;
        if (hi < 63 && (run >> (hi + 1) & 1)) hi++;
        spans |= (hi - lo == 63 ? ~(uint64_t)0 : (((uint64_t)1 << (hi - lo + 1)) - 1) << lo);
    }
    return spans;
}

bool l25_decommit_free(struct l25_bundle *b, uint64_t eligible) {
    if (b->dirty == NULL) return false;
    bool any = false;
    for (uint32_t w = 0; w < l25_words(b->nblocks); w++) {
        uint64_t runs = l25_dirty_spans(b, w, eligible);
        b->dirty[w] &= ~runs;
        for (uint64_t run; (run = l25_next_run(&runs)) != 0;)
            any |= l25_run_decommit(b, w, run);
    }
    return any;
}
