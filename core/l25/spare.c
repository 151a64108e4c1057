/* L2.5 tier: the spares, empty bundles no heap keeps (a lock-free stack a
 * class): putting one there, taking one (of the class, else of another
 * class with the same span) and their ageing. */
#include "l25/internal.h"

#include "box/bell.h"
#include "box/config.h"
#include "box/lfstack.h"

#define L25_SPARE_MAX 256 /* empty bundles no heap keeps */

/* Empty bundles no heap keeps (past a heap's bound, or an exiting
 * thread's), by class, at most L25_SPARE_MAX of them: any heap short of a
 * bundle takes one of its class, else one of another class with the same
 * span, recut (a thread that freed a burst, or exited, hands its pages to
 * one that allocates the next). One compare-and-swap a bundle, no lock;
 * aged by the tier's pass (l25_age), emptied by malloc_trim. */
static struct lf_stack l25_spare[L25_NCLASSES];
static _Atomic uint32_t l25_nspare;
#define L25_SPARE_LINK offsetof(struct l25_bundle, spare_next)

/* Bytes of the spares that keep their pages (see l25_spare_put). */
static _Atomic size_t l25_spare_hot;

_Atomic uint64_t l25_spares_due = UINT64_MAX;

/* The spares' ageing is due at `due` at the latest. */
static void l25_spares_due_by(uint64_t due) {
    uint64_t cur = atomic_load_explicit(&l25_spares_due, memory_order_relaxed);
    while (due < cur && !atomic_compare_exchange_weak_explicit(
                            &l25_spares_due, &cur, due, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* When spare b is next due to age: decommitted at the age, unmapped at
 * twice it. */
static uint64_t l25_spare_due(const struct l25_bundle *b) {
    return b->empty_ms + (b->committed ? 1 : 2) * hak_cfg.age_ms;
}

/* The spares keep their pages up to twice the BigCache's bound
 * (HAKMEM_BIGCACHE_MB: what the program lets the allocator keep for reuse;
 * 256 MiB by default), the rest decommitted as they come. A burst's and an
 * exiting thread's bundles are taken back by the next threads, and their
 * pages faulted back in cost more than the program's own work (mimalloc's
 * test-stress, 16 threads re-created 25 times: keeping only the first 16
 * of an exiting thread's and 48 of a live heap's made 350 000 more page
 * faults, 1.9x mimalloc 3.4's time; 128 MiB, 1.3x). But only the tier's
 * pass ages them (l25_spares_age, on a slow path of any thread, or the
 * background thread): a program whose calls then all hit the thread caches
 * keeps them, so they are bounded in bytes too (16 threads that freed 64
 * MiB each and exited: 1.2 GiB kept for good without one). */
static inline size_t l25_spare_hot_max(void) {
    return 2 * hak_cfg.bigcache_bytes;
}

bool l25_spare_put(struct l25_bundle *b) {
    if (atomic_load_explicit(&l25_nspare, memory_order_relaxed) >= L25_SPARE_MAX) return false;
    if (b->committed) {
        size_t hot = atomic_fetch_add_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
        if (hot + b->span > l25_spare_hot_max()) {
            atomic_fetch_sub_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
            if (l25_bundle_decommit(b))
                b->committed = false;
            else /* (refused, mlockall: its pages and their bytes stay, counted) */
                atomic_fetch_add_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
        }
    }
    atomic_fetch_add_explicit(&l25_nspare, 1, memory_order_relaxed);
    uint64_t due = l25_spare_due(b);
    lf_push(&l25_spare[b->cls - L25_FIRST], b, L25_SPARE_LINK);
    l25_spares_due_by(due);
    bell_ring(); /* (the background thread's next look may be later) */
    return true;
}

/* b, just taken off the spares (to be used, decommitted or unmapped), no
 * longer counted there. */
static void l25_spare_gone(const struct l25_bundle *b) {
    if (b->committed) atomic_fetch_sub_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
}

static struct l25_bundle *l25_spare_pop(struct lf_stack *s) {
    if (lf_addr(atomic_load_explicit(&s->top, memory_order_relaxed)) == NULL) return NULL;
    struct l25_bundle *b = lf_pop(s, L25_SPARE_LINK);
    if (b) {
        atomic_fetch_sub_explicit(&l25_nspare, 1, memory_order_relaxed);
        l25_spare_gone(b);
    }
    return b;
}

struct l25_bundle *l25_spare_get(uint32_t cls) {
    struct l25_bundle *b = l25_spare_pop(&l25_spare[cls - L25_FIRST]);
    if (b || atomic_load_explicit(&l25_nspare, memory_order_relaxed) == 0) return b;
    size_t span = l25_span(l25_stride(cls, 0));
    for (uint32_t c = L25_FIRST; c < SMALL_NCLASSES && b == NULL; c++)
        if (c != cls && l25_span(l25_stride(c, 0)) == span)
            b = l25_spare_pop(&l25_spare[c - L25_FIRST]);
    return b;
}

bool l25_spares_age(uint64_t now, bool all) {
    bool released = false;
    uint64_t age = hak_cfg.age_ms, due = UINT64_MAX;
    for (size_t k = 0; k < sizeof l25_spare / sizeof l25_spare[0]; k++) {
        struct l25_bundle *b = lf_take_all(&l25_spare[k]), *first = NULL, *last = NULL;
        uint32_t gone = 0;
        while (b) {
            struct l25_bundle *next = atomic_load_explicit(&b->spare_next, memory_order_relaxed);
            uint64_t idle = now > b->empty_ms ? now - b->empty_ms : 0;
            if (all || (!b->committed && idle >= 2 * age)) {
                l25_spare_gone(b);
                l25_bundle_unmap(b);
                released = true;
                gone++;
            } else {
                if (b->committed && idle >= age) {
                    if (l25_bundle_decommit(b)) {
                        l25_spare_gone(b);
                        b->committed = false;
                        released = true;
                    } else {
                        b->empty_ms = now; /* (refused: an age later again) */
                    }
                }
                if (l25_spare_due(b) < due) due = l25_spare_due(b);
                atomic_store_explicit(&b->spare_next, first, memory_order_relaxed);
                first = b;
                if (last == NULL) last = b;
            }
            b = next;
        }
        if (gone) atomic_fetch_sub_explicit(&l25_nspare, gone, memory_order_relaxed);
        if (first) lf_push_chain(&l25_spare[k], first, last, L25_SPARE_LINK);
    }
    l25_spares_due_by(due);
    return released;
}

bool l25_spares_age_due(uint64_t now) {
    uint64_t due = atomic_load_explicit(&l25_spares_due, memory_order_relaxed);
    if (now < due ||
        !atomic_compare_exchange_strong_explicit(&l25_spares_due, &due, UINT64_MAX,
                                                 memory_order_relaxed, memory_order_relaxed))
        return false;
    return l25_spares_age(now, false);
}
