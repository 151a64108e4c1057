/* Checked tier: malloc(0), a unique address each in a reservation nothing
 * can be read or written at, a bit per address saying whether it is live. */
#include "check/internal.h"

#include "box/lock.h"
#include "box/os.h"

/* ---- malloc(0): unique addresses nothing can be read or written at --------- */

#define CHK_ZERO_SPAN ((size_t)64 << 20) /* 4M zero-size blocks live at once */
static uintptr_t chk_zero_base;
static size_t chk_zero_n;               /* addresses in the span */
static _Atomic uint64_t *chk_zero_live; /* a bit per address: handed out */
static _Atomic size_t chk_zero_high;    /* addresses ever handed out, from the front */
static size_t chk_zero_next;            /* where the search for a free one starts */
static _Atomic size_t chk_zero_count;   /* live ones: when all are, no search */
HAK_HIDDEN pthread_mutex_t chk_zero_lock = PTHREAD_MUTEX_INITIALIZER;

void chk_zero_start(void) {
    size_t span = CHK_ZERO_SPAN;
    void *base = os_reserve(&span, HAK_REGION_SIZE, HAK_REGION_SIZE);
    if (base == NULL) return;
    size_t n = span / 16;
    void *bits = os_map_aligned(hak_align_up(n / 8, HAK_PAGE_SIZE), HAK_PAGE_SIZE);
    bool ok = bits != NULL;
    for (size_t i = 0; ok && i < span / HAK_REGION_SIZE; i++)
        ok = rmap_set_region((uint8_t *)base + i * HAK_REGION_SIZE, TIER_CHECK,
                             chk_payload((uint32_t)i, CHK_ZERO));
    if (!ok) {
        rmap_clear_span(base, span);
        os_unmap(base, span);
        if (bits) os_unmap(bits, hak_align_up(n / 8, HAK_PAGE_SIZE));
        return;
    }
    chk_zero_live = bits;
    chk_zero_n = n;
    chk_zero_base = (uintptr_t)base;
}

void *chk_zero_alloc(void) {
    if (chk_zero_base == 0 ||
        atomic_load_explicit(&chk_zero_count, memory_order_relaxed) >= chk_zero_n)
        return NULL;
    size_t words = chk_zero_n / 64;
    void *p = NULL;
    hak_lock(&chk_zero_lock);
    for (size_t k = 0, w = chk_zero_next / 64; k <= words; k++, w = (w + 1) % words) {
        uint64_t v = atomic_load_explicit(&chk_zero_live[w], memory_order_relaxed);
        if (v == ~0ull) continue;
        size_t i = w * 64 + (size_t)__builtin_ctzll(~v);
        atomic_fetch_or_explicit(&chk_zero_live[w], 1ull << (i % 64), memory_order_relaxed);
        atomic_fetch_add_explicit(&chk_zero_count, 1, memory_order_relaxed);
        chk_zero_next = (i + 1) % chk_zero_n;
        if (i + 1 > atomic_load_explicit(&chk_zero_high, memory_order_relaxed))
            atomic_store_explicit(&chk_zero_high, i + 1, memory_order_relaxed);
        p = (void *)(chk_zero_base + i * 16);
        break;
    }
    hak_unlock(&chk_zero_lock);
    return p;
}

/* Is zero-size block a live? Its index, or -1 (never handed out: not a
 * block), or -2 (freed). */
ptrdiff_t chk_zero_find(uintptr_t a) {
    size_t i = (a - chk_zero_base) / 16;
    if (chk_zero_base == 0 || a < chk_zero_base || (a & 15) || i >= chk_zero_n) return -1;
    if (atomic_load_explicit(&chk_zero_live[i / 64], memory_order_relaxed) >> (i % 64) & 1)
        return (ptrdiff_t)i;
    return i < atomic_load_explicit(&chk_zero_high, memory_order_relaxed) ? -2 : -1;
}

void chk_zero_free(uintptr_t a, const char *fn) {
    ptrdiff_t i = chk_zero_find(a);
    if (i < 0)
        diag_bad_pointer(fn, i == -2 ? DIAG_DOUBLE_FREE : DIAG_INVALID_POINTER, (void *)a,
                         TIER_CHECK, 0);
    size_t k = (size_t)i;
    uint64_t bit = 1ull << (k % 64);
    /* (Two threads freeing it at once: one finds the bit gone.) */
    if (!(atomic_fetch_and_explicit(&chk_zero_live[k / 64], ~bit, memory_order_relaxed) & bit))
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, 0);
    atomic_fetch_sub_explicit(&chk_zero_count, 1, memory_order_relaxed);
}
