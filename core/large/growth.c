/* Large tier: blocks that change size. large_realloc (within the pages a
 * block has, over the cached rest of its own mapping: cache.c's
 * large_grow_into_cached, by mremap, or by moving its pages to a new
 * mapping; with the heap profiler on, its sample following it) and the
 * growing blocks (large_alloc_growing), whose pages it brings in ahead of
 * their end (large_populate). */
#include "large/internal.h"

#include "box/os.h"
#include "prof/prof.h"
#include "box/rmap.h"
#include "sizeclass.h"
#include "sizes.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>

/* Blocks from large_alloc_growing live now, at most LARGE_GROWING_MAX: each
 * is a mapping of its own (the kernel limits their number), with room to the
 * end of its 2 MiB region. */
#define LARGE_GROWING_MAX 1024
/* The window large_populate brings in ahead of a growing block's end. */
#define LARGE_AHEAD_MIN ((size_t)8 << 10)
#define LARGE_AHEAD_MAX ((size_t)256 << 10)
_Atomic uint32_t large_growing_live;

/* Growing block h, asked for n bytes, now needs `need` from its start (past
 * h->ready, within its room; h->req is still the size before). A buffer growing by small
 * appends (steps of at most 1/32 of it) writes every byte: its pages up to `need` and a
 * window ahead (half its size again, 8 KiB to 256 KiB) come in with one call,
 * where it would take a page fault per page, each a trip into the kernel (in
 * a virtual machine, ~12 us here; a populate call costs ~1 us a page). After
 * a bigger step (a vector doubling; CPython's lists and string writers, which
 * ask for an eighth or a quarter more than they fill; a program asking for
 * much at once and touching little of it) or a jump past the window, the
 * pages fault in as touched, as they would without this. */
static void large_populate(struct large_hdr *h, size_t n, size_t need) {
    size_t step = n > h->req ? n - h->req : 0;
    if (step > n / 32 || need - h->ready > LARGE_AHEAD_MAX) {
        h->ready = need;
        return;
    }
    size_t ahead = n / 2;
    ahead = ahead < LARGE_AHEAD_MIN   ? LARGE_AHEAD_MIN
            : ahead > LARGE_AHEAD_MAX ? LARGE_AHEAD_MAX
                                      : ahead;
    size_t to = hak_align_up(need + ahead, HAK_PAGE_SIZE);
    if (to > large_room(h)) to = large_room(h);
    assert(h->ready % HAK_PAGE_SIZE == 0 && to % HAK_PAGE_SIZE == 0); /* (madvise wants pages) */
    os_populate(large_start(h) + h->ready, to - h->ready);            /* refused: they fault in */
    h->ready = to;
}

void *large_alloc_growing(size_t size) {
    /* (At the bound, every growing realloc asks: a load, not a write.) */
    if (atomic_load_explicit(&large_growing_live, memory_order_relaxed) >= LARGE_GROWING_MAX)
        return NULL;
    if (atomic_fetch_add_explicit(&large_growing_live, 1, memory_order_relaxed) >=
        LARGE_GROWING_MAX) {
        atomic_fetch_sub_explicit(&large_growing_live, 1, memory_order_relaxed);
        return NULL;
    }
    int saved = errno; /* a refusal here is no failure of realloc */
    void *p = large_alloc_as(size, HAK_MIN_ALIGN, false, true);
    if (p == NULL) {
        atomic_fetch_sub_explicit(&large_growing_live, 1, memory_order_relaxed);
        errno = saved;
    } else if (hak_unlikely(prof_on)) { /* a new block to the profiler: all of it drawn */
        struct large_hdr *h = (struct large_hdr *)((uint8_t *)p - large_offset(HAK_MIN_ALIGN));
        h->prof.drawn = 0;
        large_follow(h, p, size);
    }
    return p;
}

/* Move block h's pages into a fresh aligned mapping of `need` bytes, for a
 * request of n: its header there (no guard page yet), or NULL. */
static struct large_hdr *large_move(struct large_hdr *h, size_t need, size_t n) {
    size_t off = h->offset, old = h->map_size;
    uint8_t *start = large_start(h);
    uint32_t colour = large_colour_of(h);
    /* (The move keeps the mapping's own huge-page setting. The new mapping
     * is marked for a header at h's colour: the pages bring it along.) */
    struct large_hdr *dst =
        large_map(need, large_map_align(off > LARGE_HDR_SIZE ? off : 0), false, colour);
    if (dst == NULL) return NULL;
    uint8_t *to = large_start(dst);
    rmap_clear_span(start, old);
    if (!os_move(start, old, need, to)) {
        large_mark(start, old, colour);
        large_release(to, need);
        return NULL;
    }
    large_set_map_size(dst, need, false, false); /* the pages it had came along */
    dst->req = n;
    dst->map = large_map_id(); /* the header came along: a kernel mapping of its own now */
    large_add(LC_MOVED, 1);
    large_live_add((int64_t)need - (int64_t)old);
    return dst;
}

/* large_resize's change of h's mapping to `need` bytes for a request of n,
 * h's guard page taken away: the block's header where it is now (h itself,
 * or a fresh mapping its pages moved to), its mapping's end now the end of
 * a kernel mapping; NULL when it cannot grow (h as it was). */
static struct large_hdr *large_remap(struct large_hdr *h, size_t n, size_t need) {
    size_t old = h->map_size;
    uint8_t *start = large_start(h);
    uint32_t colour = large_colour_of(h);
    /* Region-map entries of a range are always cleared before the range is
     * given up, so another thread mapping it next never has its fresh
     * entries erased. Re-marking after a failure cannot fail: the leaves
     * exist already. */
    if (need < old) {
        size_t keep = hak_align_up(need, HAK_REGION_SIZE);
        if (keep < old) rmap_clear_span(start + keep, old - keep);
        if (!os_resize(start, old, need)) {
            large_mark(start, old, colour);
            h->req = n;
            return h; /* keep the bigger mapping */
        }
    } else if (os_resize(start, old, need)) {
        if (!large_mark(start, need, colour)) {
            os_resize(start, need, old); /* cannot register the growth: undo it */
            return NULL;
        }
    } else {
        return large_move(h, need, n);
    }
    large_set_map_size(h, need, false, false);
    h->req = n;
    large_add(LC_INPLACE, 1);
    large_live_add((int64_t)need - (int64_t)old);
    return h;
}

/* large_realloc of h to n bytes (`pages` from its start), but for growth
 * within the pages it has. */
__attribute__((noinline)) static void *large_resize(struct large_hdr *h, size_t n, size_t pages) {
    size_t room = large_room(h);
    /* Fits: trimmed only when asked for less than before, by half or more
     * (a block growing into its room stays as it is). */
    if (pages <= room && (n >= h->req || pages >= room / 2)) {
        /* (Past the pages it has: a growing block's, since any other's are
         * all its room.) */
        if (pages > h->ready) large_populate(h, n, pages);
        h->req = n;
        return large_user(h);
    }
    /* (h->req changes only with success: it is the usable size the caller
     * copies by when this fails.) */
    if (n <= HAK_SMALL_MAX) return NULL; /* a small block now: copied into its class */
    if (pages > room && !h->guarded && large_grow_into_cached(h, pages)) {
        if (pages > h->ready) large_populate(h, n, pages); /* a growing block grown */
        h->req = n;
        return large_user(h); /* the rest of its own mapping, split off earlier and cached */
    }
    /* The mapping's end moves: its guard page goes first (mremap refuses a
     * range that mprotect split), and comes at the new end. */
    size_t had = h->map_size;
    if (!large_drop_guard(large_start(h), &h->map_size, &h->guarded, large_colour_of(h)))
        return NULL;
    large_live_add((int64_t)h->map_size - (int64_t)had);
    int saved = errno; /* a failed in-place attempt must not show in errno */
    struct large_hdr *to = large_remap(h, n, pages + LARGE_GUARD);
    errno = saved;
    /* Refused, h is left without a guard page: one now would take the last
     * page of its room, which its bytes may fill (the caller copies them
     * to a new block and frees it). */
    if (to == NULL) return NULL;
    large_guard(to);
    if (pages > to->ready) large_populate(to, n, pages); /* a growing block grown */
    return large_user(to);
}

/* large_realloc of block p, header h, to n bytes (`pages` from its start). */
HAK_INLINE void *large_realloc_to(struct large_hdr *h, void *p, size_t n, size_t pages) {
    /* The common case of a growing buffer: it fits in the pages it has; no
     * call, no lock. (p, not large_user: a pointer the caller writes through
     * next had better not wait for a load.) */
    if (hak_likely(pages <= h->ready && n >= h->req)) {
        h->req = n;
        return p;
    }
    return large_resize(h, n, pages);
}

/* large_realloc_to with the heap profiler on: the block's sample, or its
 * chance of one, follows it (large_follow). */
static __attribute__((noinline)) void *large_realloc_profiled_slow(struct large_hdr *h, void *p,
                                                                   size_t n, size_t pages) {
    if (hak_unlikely(h->sample == LS_SMALL) &&
        !small_class_keeps(small_class_of(prof_drawn(h->prof.rec)), n)) {
        /* A small block the profiler moved here, which its class would not
         * keep: a new allocation to the profiler, as a move to another
         * class is. A small one goes where any block of its size would
         * (the caller's move: sampled or not, there), not on as a Large
         * block growing a page at a time; a Large one is drawn anew. (Kept
         * on when its class would keep it: moved, a sample would get a
         * second chance its class's blocks do not.) */
        large_unsample(h);
        large_sampled_out(1);
        h->prof.drawn = 0;
        if (n <= HAK_SMALL_MAX) return NULL;
    }
    size_t off = h->offset;
    void *q = large_realloc_to(h, p, n, pages);
    /* (Its header came along if its pages moved.) */
    return q != NULL ? large_follow((struct large_hdr *)((uint8_t *)q - off), q, n) : NULL;
}

/* The same, its common case inlined: a buffer growing within its pages. */
static __attribute__((noinline)) void *large_realloc_profiled(struct large_hdr *h, void *p,
                                                              size_t n, size_t pages) {
    if (hak_likely(h->sample != LS_SMALL && pages <= h->ready && n >= h->req)) {
        h->req = n;
        return large_follow(h, p, n);
    }
    return large_realloc_profiled_slow(h, p, n, pages);
}

void *large_realloc(void *p, uint32_t entry, size_t n) {
    struct large_hdr *h = large_header(p, entry, "realloc");
    size_t lead = large_lead(h);
    /* (Beyond it, the caller's malloc fails.) */
    if (n > LARGE_MAP_MAX - lead - 2 * HAK_REGION_SIZE) return NULL;
    size_t pages = hak_align_up(lead + n, HAK_PAGE_SIZE);
    if (hak_unlikely(prof_on)) return large_realloc_profiled(h, p, n, pages);
    return large_realloc_to(h, p, n, pages);
}
