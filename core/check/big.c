/* Checked tier: big blocks (CHK_SLOT_MAX and over), a mapping each, the
 * block's end against a guard page; and their quarantine, which also gives
 * back address space when the OS refuses a mapping (chk_map). */
#include "check/internal.h"

#include "box/libc.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/usage.h"

#include <errno.h>
#include <string.h>

/* Canary bytes after a big block checked at free. Past them the block's
 * slack (room realloc left to grow in place) and then the guard page. */
#define CHK_BIG_TAIL ((size_t)64)
/* Below a big block, a gap up to this is all canary; a longer one (a big
 * alignment) gets a page of it, and inaccessible pages under that. */
#define CHK_BIG_GAP ((size_t)64 << 10)

/* ---- big blocks: a mapping each ------------------------------------------------ */

void chk_big_tail(const struct chk_big *b) {
    uintptr_t t = b->u + b->n, end = b->end - t > CHK_BIG_TAIL ? t + CHK_BIG_TAIL : b->end;
    chk_paint(t, end, chk_canary((uintptr_t)b));
}

static uint8_t *chk_big_reuse(size_t map, size_t data_len);
static uintptr_t chk_big_bad(const struct chk_big *b, enum diag_kind *kind);

/* The live big blocks, for the walk at exit (chk_q_lock). */
static struct chk_big *chk_big_live;

static void chk_big_link(struct chk_big *b) {
    b->prev = NULL;
    b->next = chk_big_live;
    if (b->next != NULL) b->next->prev = b;
    chk_big_live = b;
}

static void chk_big_unlink(struct chk_big *b) {
    if (b->prev != NULL)
        b->prev->next = b->next;
    else
        chk_big_live = b->next;
    if (b->next != NULL) b->next->prev = b->prev;
}

void chk_walk_big(const char *fn) {
    hak_lock(&chk_q_lock);
    for (const struct chk_big *b = chk_big_live; b != NULL; b = b->next) {
        enum diag_kind kind;
        uintptr_t bad = chk_big_bad(b, &kind);
        if (bad == 0) continue;
        uintptr_t u = b->u;
        size_t n = b->n;
        hak_unlock(&chk_q_lock); /* (the report allocates, and aborts) */
        chk_report(fn, kind, u, n, (ptrdiff_t)(bad - u));
    }
    hak_unlock(&chk_q_lock);
}

/* A block of n bytes with room for cap >= n in place, zeroed. */
void *chk_big_alloc(size_t n, size_t align, unsigned fam, size_t cap) {
    if (cap > HAK_MAX_REQUEST - align - 4 * HAK_REGION_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t data_len = hak_align_up(cap + align + CHK_HDR, HAK_PAGE_SIZE);
    size_t map = hak_align_up(3 * HAK_PAGE_SIZE + data_len, HAK_REGION_SIZE);
    uint8_t *base = chk_big_reuse(map, data_len);
    bool fresh = base == NULL;
    if (fresh) {
        if ((base = chk_map(map)) == NULL) {
            errno = ENOMEM;
            return NULL;
        }
        for (size_t i = 0; i < map / HAK_REGION_SIZE; i++)
            if (!rmap_set_region(base + i * HAK_REGION_SIZE, TIER_CHECK,
                                 chk_payload((uint32_t)i, CHK_BIG))) {
                rmap_clear_span(base, map);
                os_unmap(base, map);
                errno = ENOMEM;
                return NULL;
            }
    }
    struct chk_big *b = (struct chk_big *)base;
    b->data = (uintptr_t)base + 2 * HAK_PAGE_SIZE;
    b->end = b->data + data_len;
    if (fresh) {
        (void)os_guard(base + HAK_PAGE_SIZE, HAK_PAGE_SIZE);
        (void)os_guard((void *)b->end, (uintptr_t)base + map - b->end);
    }
    b->u = (b->end - cap) & ~(uintptr_t)(align - 1);
    b->n = n;
    b->map = map;
    b->fam = fam;
    b->kept = false;
    b->check = chk_key((uintptr_t)base) ^ b->u;
    /* A reused mapping holds its last block's bytes: cleared, so no owner
     * reads another's (fresh pages are zero). The block and its tail's pages
     * by memset; the room to grow past them (realloc's: as much again)
     * given back, to read as zeros without being made resident. */
    if (!fresh) {
        uintptr_t z = hak_align_up(b->u + n + CHK_BIG_TAIL, HAK_PAGE_SIZE);
        if (z > b->end) z = b->end;
        libc_mem.set((void *)b->u, 0, z - b->u);
        if (z < b->end && !os_decommit((void *)z, b->end - z))
            libc_mem.set((void *)z, 0, b->end - z); /* (locked memory) */
    }
    /* Canary down to the guard page; but below a big alignment's gap (up to
     * the alignment: gigabytes for posix_memalign(2^33)) a page of it, and
     * the rest inaccessible: painting it all made every page resident. */
    b->lo = b->data;
    if (b->u - b->data > CHK_BIG_GAP) {
        b->lo = (b->u - HAK_PAGE_SIZE) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
        (void)os_guard((void *)b->data, b->lo - b->data); /* (refused: merely not guarded) */
    }
    chk_paint(b->lo, b->u, chk_canary((uintptr_t)base));
    chk_big_tail(b);
    atomic_store_explicit(&b->state, CHK_LIVE, memory_order_release);
    hak_lock(&chk_q_lock);
    chk_big_link(b);
    hak_unlock(&chk_q_lock);
    usage_add((int64_t)n);
    return (void *)b->u;
}

/* The first byte of b's canaries (below the block down to lo, and its
 * tail) that is not canary, and *kind what it is; 0 when all are. */
static uintptr_t chk_big_bad(const struct chk_big *b, enum diag_kind *kind) {
    uint64_t w = chk_canary((uintptr_t)b);
    uintptr_t bad, t = b->u + b->n, end = b->end - t > CHK_BIG_TAIL ? t + CHK_BIG_TAIL : b->end;
    *kind = DIAG_HEAP_UNDERFLOW;
    if ((bad = chk_unpainted(b->lo, b->u, w)) != b->u) return bad;
    *kind = DIAG_HEAP_OVERFLOW;
    bad = chk_unpainted(t, end, w);
    return bad != end ? bad : 0;
}

void chk_big_canaries(const struct chk_big *b, const char *fn) {
    enum diag_kind kind;
    uintptr_t bad = chk_big_bad(b, &kind);
    if (bad != 0) chk_report(fn, kind, b->u, b->n, (ptrdiff_t)(bad - b->u));
}

/* ---- big blocks' quarantine -------------------------------------------------- */

/* Freed big blocks wait in a FIFO, inaccessible: a pointer to one faults
 * for as long. Up to CHK_Q_BIG_KEEP bytes of them keep their pages
 * (mprotect); a new block of the same mapping size takes the oldest of
 * those with CHK_Q_BIG_WAIT or more freed after it (chk_big_reuse), for two
 * mprotect calls where a fresh mapping costs a page fault per page
 * (bench_scenarios mir, 256 KiB buffers: 7.5 times faster). The others'
 * pages are given back (os_uncommit); mappings are unmapped as they leave
 * the FIFO. */
#define CHK_Q_BIG      64
#define CHK_Q_BIG_WAIT 16
#define CHK_Q_BIG_SPAN ((size_t)1 << 30)  /* their address space, at most */
#define CHK_Q_BIG_KEEP ((size_t)32 << 20) /* their pages kept, at most */
HAK_HIDDEN pthread_mutex_t chk_q_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t chk_q_big[CHK_Q_BIG];
static size_t chk_q_big_head, chk_q_big_n, chk_q_big_span, chk_q_big_kept;

static void chk_unmap_big(struct chk_big *g) {
    size_t map = g->map;
    rmap_clear_span(g, map);
    os_unmap(g, map);
}

/* Take the oldest big block out of quarantine (lock held). */
static struct chk_big *chk_q_big_pop(void) {
    struct chk_big *g = (struct chk_big *)chk_q_big[chk_q_big_head];
    chk_q_big_head = (chk_q_big_head + 1) % CHK_Q_BIG;
    chk_q_big_n--;
    chk_q_big_span -= g->map;
    if (g->kept) chk_q_big_kept -= g->end - g->data;
    return g;
}

void chk_quarantine_big(struct chk_big *b) {
    size_t len = b->end - b->data;
    hak_lock(&chk_q_lock);
    chk_big_unlink(b);
    b->kept = chk_q_big_kept + len <= CHK_Q_BIG_KEEP;
    if (b->kept) chk_q_big_kept += len;
    hak_unlock(&chk_q_lock);
    if (b->kept && !os_guard((void *)b->data, len)) {
        hak_lock(&chk_q_lock);
        chk_q_big_kept -= len;
        hak_unlock(&chk_q_lock);
        b->kept = false;
    }
    /* Its pages go; what is left reads as zeros and faults when written.
     * That is what the block and its canaries covered: os_uncommit may have
     * to clear what it is given (when the OS refuses to drop pages), and
     * the rest of the range is the inaccessible gap below a big
     * alignment's block (the clearing faulted there: the fuzzer) and pages
     * this block never touched (up to the alignment: gigabytes made
     * resident). Those only lose their pages, if they have any. */
    if (!b->kept) {
        uintptr_t t = hak_align_up(b->u + b->n + CHK_BIG_TAIL, HAK_PAGE_SIZE);
        if (t > b->end) t = b->end;
        os_uncommit((void *)b->lo, t - b->lo);
        if (t < b->end) (void)os_decommit((void *)t, b->end - t);
    }
    struct chk_big *out[CHK_Q_BIG];
    size_t nout = 0;
    hak_lock(&chk_q_lock);
    while (chk_q_big_n > 0 &&
           (chk_q_big_n == CHK_Q_BIG || chk_q_big_span + b->map > CHK_Q_BIG_SPAN))
        out[nout++] = chk_q_big_pop();
    chk_q_big[(chk_q_big_head + chk_q_big_n++) % CHK_Q_BIG] = (uintptr_t)b;
    chk_q_big_span += b->map;
    hak_unlock(&chk_q_lock);
    for (size_t i = 0; i < nout; i++)
        chk_unmap_big(out[i]);
}

/* The oldest block in quarantine that kept its pages, is of `map` bytes
 * and has CHK_Q_BIG_WAIT others after it: its mapping, with data_len bytes
 * after its guard page readable and writable (the rest inaccessible, and
 * what it had there given back). NULL when there is none. */
static uint8_t *chk_big_reuse(size_t map, size_t data_len) {
    hak_lock(&chk_q_lock);
    struct chk_big *g = NULL;
    for (size_t i = 0; g == NULL && i + CHK_Q_BIG_WAIT < chk_q_big_n; i++) {
        size_t at = (chk_q_big_head + i) % CHK_Q_BIG;
        const struct chk_big *old = (const struct chk_big *)chk_q_big[at];
        if (!old->kept || old->map != map) continue;
        /* Out of the FIFO: the ones before it move up one place. */
        for (; at != chk_q_big_head; at = (at + CHK_Q_BIG - 1) % CHK_Q_BIG)
            chk_q_big[at] = chk_q_big[(at + CHK_Q_BIG - 1) % CHK_Q_BIG];
        chk_q_big[chk_q_big_head] = (uintptr_t)old;
        g = chk_q_big_pop();
    }
    hak_unlock(&chk_q_lock);
    if (g == NULL) return NULL;
    size_t had = g->end - g->data;
    if (!os_commit((void *)g->data, data_len)) {
        chk_unmap_big(g);
        return NULL;
    }
    if (had > data_len) (void)os_decommit((void *)(g->data + data_len), had - data_len);
    return (uint8_t *)g;
}

/* A mapping for the tier; when the OS refuses (an address-space limit), once
 * more after the big blocks in quarantine gave back their address space. */
uint8_t *chk_map(size_t size) {
    uint8_t *p = os_map_aligned(size, HAK_REGION_SIZE);
    if (p != NULL) return p;
    struct chk_big *out[CHK_Q_BIG];
    size_t nout = 0;
    hak_lock(&chk_q_lock);
    while (chk_q_big_n > 0)
        out[nout++] = chk_q_big_pop();
    hak_unlock(&chk_q_lock);
    for (size_t i = 0; i < nout; i++)
        chk_unmap_big(out[i]);
    return nout ? os_map_aligned(size, HAK_REGION_SIZE) : NULL;
}
