/* Large tier: the heap profiler's blocks. A block it samples
 * (large_alloc_sampled), among them the small classes' blocks it moves
 * here, whose mappings are bounded (LARGE_SAMPLED_MAX; the spares their
 * freed mappings wait in are spare.c's), and the rare parts of a block's
 * sample, or its chance of one, following it through realloc (large_follow,
 * in internal.h). */
#include "large/internal.h"

#include "prof/prof.h"
#include "sizes.h"

#include <stdatomic.h>

/* The mappings of sampled small blocks, live or spare, at most
 * LARGE_SAMPLED_MAX. Each is a mapping of its own, and the kernel limits how
 * many a process has (vm.max_map_count, 65530 by default): past it every
 * mmap fails, the program's own too. With a small HAKMEM_PROF_SAMPLE a
 * program keeping many small blocks would reach it (python3 did, sampling
 * every KiB). A quarter of the default (half where the guard page is a
 * kernel mapping of its own: mprotect, before Linux 6.13); at the default
 * rate, 8 GiB of small blocks in use. Counted as a mapping comes in for a
 * sample and as it leaves for the BigCache or the kernel: a spare taken or
 * put back changes nothing (no atomic per sample). */
#define LARGE_SAMPLED_MAX 16384
_Atomic uint32_t large_sampled_small;

/* h, unsampled, n bytes, is sampled now (with the chance of its drawn
 * bytes), unless the profiler has no memory for its record (the sample
 * lost, and counted). */
static void large_take_sample(struct large_hdr *h, size_t n) {
    struct prof_rec *r = prof_record(large_user(h), n, h->prof.drawn);
    if (r == NULL) return;
    h->sample = LS_LARGE; /* (no mapping made for it: not counted) */
    h->prof.rec = r;
}

void *large_alloc_sampled(size_t size, size_t align, bool zero, size_t n, bool small) {
    size_t off = large_offset(align);
    void *p = NULL;
    if (small && off <= HAK_REGION_SIZE) { /* (a spare is region-aligned) */
        struct large_hdr *h =
            large_spare_take(hak_align_up(off + (size ? size : 1), HAK_PAGE_SIZE));
        if (h != NULL) {
            large_add(LC_HITS, 1);
            p = large_open(h, off, size, false, zero, h->map_size); /* (its pages were used) */
        }
    }
    if (p == NULL) {
        if (small && atomic_fetch_add_explicit(&large_sampled_small, 1, memory_order_relaxed) >=
                         LARGE_SAMPLED_MAX) {
            large_sampled_out(1);
            return NULL;
        }
        p = large_alloc_as(size, align, zero, false);
        if (p == NULL) {
            if (small) large_sampled_out(1);
            return NULL;
        }
    }
    struct large_hdr *h = (struct large_hdr *)((uint8_t *)p - off);
    struct prof_rec *r = prof_record(p, n, size);
    if (small || r != NULL) { /* (a small one's mapping is counted, recorded or not) */
        h->sample = small ? LS_SMALL : LS_LARGE;
        h->prof.rec = r;
    }
    return p;
}

/* large_follow's rare parts (each returns the block). A sampled block's
 * record follows it. */
__attribute__((cold, noinline)) void *large_sample_follows(struct large_hdr *h, void *p, size_t n) {
    prof_resize(h->prof.rec, p, n);
    return p;
}

/* ... The byte countdown passed 0 as h grew by `more` bytes to n. */
__attribute__((cold, noinline)) void *large_countdown_passed(struct large_hdr *h, void *p, size_t n,
                                                             size_t more) {
    if (prof_bytes_passed(more)) large_take_sample(h, n);
    return p;
}
