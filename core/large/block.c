/* Large tier: a block and its mapping. The kernel mapping made for a
 * block (large_map), its guard page (large_guard, large_drop_guard), its
 * header's colour (large_colour_for, large_place), a mapping opened as a
 * live block (large_open), the lookups from a pointer (large_span_of,
 * large_mapping_at, large_is_live, large_usable_size; large_reject for a
 * pointer that is no live block) and the tier's counters. The header, the
 * region-map marking and the helpers the other files share: internal.h. */
#include "large/internal.h"

#include "box/diag.h"
#include "box/libc.h"
#include "box/os.h"
#include "box/rmap.h"
#include "sizes.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

/* Kernel mappings made so far: each gets the next number. */
_Atomic uint64_t large_maps;

/* Add a guard page at the end of h's mapping, which ends a kernel mapping
 * (a refusal leaves it without one). */
void large_guard(struct large_hdr *h) {
    if (!h->guarded)
        h->guarded = os_guard_add(large_guard_page(large_start(h), h->map_size), LARGE_GUARD);
    if (h->ready > large_room(h)) h->ready = large_room(h);
}

/* The tier's counters (internal.h: large_add). */
_Atomic int64_t large_count[LC_N];
__thread struct large_tls large_tls;

void large_thread_start(void) {
    large_tls.batch = LARGE_BATCH;
}

void large_thread_exit(void) {
    large_tc_release();
    large_tls.batch = 0;
    large_publish();
}

/* A fresh mapping of `size` bytes at `map_align`, registered in the region
 * map, with huge pages when `thp` (the kernel backs each 2 MiB-aligned
 * stretch with one page on its first touch: one fault instead of 512; a
 * refusal is fine): its header, at `colour` (no other page of it touched);
 * NULL with errno ENOMEM when it cannot be had (nothing is left). */
struct large_hdr *large_map(size_t size, size_t map_align, bool thp, uint32_t colour) {
    uint8_t *start = os_map_aligned(size, map_align);
    if (start && !large_mark(start, size, colour)) {
        os_unmap(start, size);
        start = NULL;
    }
    if (start == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    struct large_hdr *h = (struct large_hdr *)(start + colour * LARGE_COLOUR_SIZE);
    h->thp = thp && os_hugepages(start, size); /* what the kernel granted */
    h->map = large_map_id();
    return h;
}

/* Before the mapping of *size bytes at `start` (its header at `colour`)
 * grows, moves or is trimmed: its guard page, if *guarded, is unmapped, not
 * taken away where it is. A page table left in the region past the last
 * whole one would keep the growth there from being a huge page (a fault per
 * page instead of one). false when refused. */
bool large_drop_guard(uint8_t *start, size_t *size, bool *guarded, uint32_t colour) {
    if (!*guarded) return true;
    size_t left = *size - LARGE_GUARD, keep = hak_align_up(left, HAK_REGION_SIZE);
    if (keep < *size) rmap_clear_span(start + keep, *size - keep); /* a region of its own */
    if (!os_unmap(large_guard_page(start, *size), LARGE_GUARD)) {
        large_mark(start, *size, colour);
        return false;
    }
    *size = left;
    *guarded = false;
    return true;
}

/* Each thread's turn of header colours. */
static __thread uint32_t large_colour_turn;

/* The colour for a block of `size` bytes at `off` from its header, in a
 * mapping with `room` (growing: large_alloc_growing's), at most `keep`
 * (the block's colour now, kept when it is not the start and fits); the
 * next in turn that fits otherwise (the start if none). Only a block at the
 * tier's own alignment has one. What fits is the slack: what the block's
 * last page has past its end, or for a growing block its whole room. */
uint32_t large_colour_for(size_t off, size_t size, size_t room, bool growing, uint32_t keep) {
    if (off != LARGE_HDR_SIZE) return 0;
    size_t end = off + (size ? size : 1);
    size_t lines = ((growing ? room : hak_align_up(end, HAK_PAGE_SIZE)) - end) / LARGE_COLOUR_SIZE;
    if (keep != 0 && keep <= lines) return keep;
    if (lines == 0) return 0;
    uint32_t most = lines < LARGE_COLOURS - 1 ? (uint32_t)lines : LARGE_COLOURS - 1;
    uint32_t c = 1 + ++large_colour_turn % most;
    /* A growing block also c % LARGE_PAGE_COLOURS pages in (at most 60 KiB
     * of its room): the pages of blocks grown side by side then differ in
     * the bits above 4 KiB too. */
    size_t pages = growing ? c % LARGE_PAGE_COLOURS : 0;
    if (pages * (HAK_PAGE_SIZE / LARGE_COLOUR_SIZE) + c <= lines)
        c += (uint32_t)(pages * (HAK_PAGE_SIZE / LARGE_COLOUR_SIZE));
    return c;
}

/* Mapping h's header (at its start, at the colour large_map gave it, or
 * where its last block had it) moved to the colour of a block of `size`
 * bytes at `off` from it (large_colour_for), and returned. A header moved
 * leaves zeroes behind, its canary's word too: its line may be inside the
 * new block, which a decommitted mapping hands to calloc as zeroes. */
static struct large_hdr *large_place(struct large_hdr *h, size_t off, size_t size, bool growing) {
    uint32_t now = large_colour_of(h);
    uint32_t c = large_colour_for(off, size, large_room(h), growing, now);
    if (c == now) return h;
    uint8_t *start = large_start(h);
    struct large_hdr *to = (struct large_hdr *)(start + c * LARGE_COLOUR_SIZE);
    *to = *h; /* (a line apart at least: no overlap) */
    memset(h, 0, LARGE_COLOUR_SIZE);
    rmap_set_region(start, TIER_LARGE, large_first_payload(c)); /* (its leaf exists) */
    return to;
}

/* Mapping h (its map_size, thp and guarded set) becomes the live block of
 * `size` bytes at offset `off` from its header (large_place's). `clean`: as
 * large_cache_take's. */
void *large_open(struct large_hdr *h, size_t off, size_t size, bool growing, bool zero,
                 size_t clean) {
    h = large_place(h, off, size, growing);
    h->magic = LARGE_LIVE;
    h->offset = off;
    *large_canary(large_user(h)) = large_canary_value();
    h->req = size;
    h->growing = growing;
    h->sample = LS_NONE;
    h->prof.drawn = size;
    /* A growing block's pages come in by large_populate as it grows, unless
     * a cached mapping had them already (`clean` may count the part a split
     * left in the cache); any other block's as touched. */
    size_t room = large_room(h), lead = large_lead(h);
    size_t first = (lead - off) & ~(HAK_PAGE_SIZE - 1); /* its header's page */
    h->ready = growing && clean < room ? clean : room;
    /* (The pages before its header's are not the block's: none to bring in.) */
    if (h->ready < first) h->ready = first;
    if (zero && clean > lead)
        libc_mem.set(large_user(h), 0, clean - lead < size ? clean - lead : size);
    large_add(LC_ALLOCS, 1);
    large_live_add((int64_t)h->map_size);
    return large_user(h);
}

/* p, whose header is h, is no live block: say what it is and abort. */
__attribute__((noreturn, noinline, cold)) void
large_reject(const void *p, const struct large_hdr *h, const char *fn) {
    if (h->magic == LARGE_LIVE && large_user(h) == p) { /* live, its canary overwritten */
        uint64_t was = large_canary_value() ^ *large_canary(p);
        diag_bug(&(struct diag_bug){.fn = fn,
                                    .kind = DIAG_HEAP_UNDERFLOW,
                                    .p = p,
                                    .tier = TIER_LARGE,
                                    .block = h->req,
                                    .at = -(8 - (ptrdiff_t)__builtin_ctzll(was) / 8)});
    }
    if (h->magic == LARGE_FREE && large_user(h) == p)
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, p, TIER_LARGE, h->req);
    diag_bad_pointer(fn, DIAG_INVALID_POINTER, p, TIER_LARGE, 0);
}

bool large_span_of(const void *p, uint32_t entry, void **start, size_t *size) {
    const struct large_hdr *h = large_mapping_of(p, entry);
    if (!large_hdr_live(h, p)) return false;
    *start = large_start(h);
    *size = h->map_size;
    return true;
}

bool large_mapping_at(const void *start, uint32_t e, size_t *size) {
    uint32_t pl = rmap_payload(e);
    if (rmap_kind_of(e) != TIER_LARGE || ((uintptr_t)start & (HAK_REGION_SIZE - 1)) != 0 ||
        (pl != 0 && !(pl & LARGE_FIRST)))
        return false;
    *size = large_mapping_of(start, e)->map_size;
    return true;
}

bool large_is_live(const void *p, uint32_t entry, size_t *req) {
    const struct large_hdr *h = large_mapping_of(p, entry);
    *req = h->req;
    return large_hdr_live(h, p);
}

size_t large_usable_size(const void *p, uint32_t entry, const char *fn) {
    struct large_hdr *h = large_header(p, entry, fn);
    /* What the program asked for, to whole pages; not the room the mapping
     * may have beyond it (a growing block's region, a cached mapping's
     * slack, huge-page rounding): programs that count their memory by it
     * (redis's used_memory, and its maxmemory evictions) would count that
     * room as used. */
    size_t lead = large_lead(h);
    return hak_align_up(lead + (h->req ? h->req : 1), HAK_PAGE_SIZE) - lead;
}
