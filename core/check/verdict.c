/* Checked tier (check.h: the layout and what each check finds): the tier's
 * interface, and what every block goes through whatever its kind (finding
 * it, the verdict on a pointer, its checks and its release); the values
 * from the secret, which chk_start sets, and the reports. Slots, big blocks
 * and malloc(0) are slots.c's, big.c's and zero.c's. */
#include "check/internal.h"

#include "box/libc.h"
#include "box/lock.h"
#include "box/secret.h"
#include "box/tier.h"
#include "box/usage.h"

#include <errno.h>
#include <string.h>

HAK_HIDDEN bool chk_on;

/* ---- values from the secret ---------------------------------------------- */

/* From the secret at chk_start: see internal.h. */
HAK_HIDDEN uint64_t chk_skey, chk_scanary, chk_slink, chk_hmul;

/* ---- reports ---------------------------------------------------------------- */

_Noreturn void chk_report(const char *fn, enum diag_kind kind, uintptr_t p, size_t n,
                          ptrdiff_t at) {
    diag_bug(&(struct diag_bug){
        .fn = fn, .kind = kind, .p = (void *)p, .tier = TIER_CHECK, .block = n, .at = at});
}

static const char *const api_family_names[] = {"malloc", "operator new", "operator new[]"};

/* The family a freeing call frees. */
static unsigned api_family_of(const char *fn) {
    if (fn[0] != 'o' || strncmp(fn, "operator delete", 15) != 0) return API_MALLOC;
    return fn[15] == '[' ? API_NEW_ARRAY : API_NEW;
}

static void chk_check_family(const char *fn, uintptr_t p, size_t n, unsigned fam) {
    if (hak_likely(api_family_of(fn) == fam)) return;
    diag_bug(&(struct diag_bug){.fn = fn,
                                .kind = DIAG_MISMATCHED_FREE,
                                .p = (void *)p,
                                .tier = TIER_CHECK,
                                .block = n,
                                .by = api_family_names[fam]});
}

/* ---- one block, whatever its kind --------------------------------------------- */

struct chk_block {
    uint32_t sub;   /* CHK_SLAB, CHK_BIG, CHK_ZERO */
    uintptr_t slot; /* a slab block's slot; a big block's mapping */
    size_t size;    /* a slab block's slot size */
    uint64_t key;   /* a slab block's: chk_key(slot), and its word0 as read */
    uint64_t word;
    struct chk_slot s;
};

/* What a pointer (entry e) is to the tier. */
enum chk_verdict {
    CHK_NOT_A_BLOCK,
    CHK_IS_LIVE,
    CHK_IS_FREED,
    CHK_IS_OVERWRITTEN, /* a block starts there, its header overwritten */
};

/* Look at a, filling *b as far as it goes; never reports. */
static enum chk_verdict chk_find(uintptr_t a, uint32_t e, struct chk_block *b) {
    b->sub = chk_sub(e);
    b->s = (struct chk_slot){.n = 0, .fam = API_MALLOC, .state = CHK_LIVE};
    if (b->sub == CHK_ZERO) {
        ptrdiff_t i = chk_zero_find(a);
        return i >= 0 ? CHK_IS_LIVE : i == -2 ? CHK_IS_FREED : CHK_NOT_A_BLOCK;
    }
    if (b->sub == CHK_BIG) {
        const struct chk_big *g = chk_big_at(a, e);
        if (g == NULL || g->u != a) return CHK_NOT_A_BLOCK;
        b->slot = (uintptr_t)g;
        b->s.n = g->n;
        b->s.fam = g->fam;
        return atomic_load_explicit(&g->state, memory_order_acquire) == CHK_LIVE ? CHK_IS_LIVE
                                                                                 : CHK_IS_FREED;
    }
    const struct chk_region *r = chk_region_of(a);
    b->slot = chk_slot_of(a, r);
    b->size = r->size;
    if (b->slot == 0) return CHK_NOT_A_BLOCK;
    b->key = chk_key(b->slot);
    b->word = atomic_load_explicit(chk_word0(b->slot), memory_order_acquire);
    if (chk_decode(b->word, b->key, b->size, &b->s)) {
        if (b->slot + b->s.uoff != a) return CHK_NOT_A_BLOCK;
        return b->s.state == CHK_LIVE ? CHK_IS_LIVE : CHK_IS_FREED;
    }
    /* A slot cut for a thread and not handed out yet: word0 zero. */
    if (b->word == 0) return CHK_NOT_A_BLOCK;
    /* An underflow reaching at least word0, below the canary. */
    return a == b->slot + CHK_HDR ? CHK_IS_OVERWRITTEN : CHK_NOT_A_BLOCK;
}

/* p (entry e) as a live block: anything else is reported. */
static void chk_live(uintptr_t a, uint32_t e, const char *fn, struct chk_block *b) {
    switch (chk_find(a, e, b)) {
    case CHK_IS_LIVE:
        return;
    case CHK_IS_FREED:
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, b->s.n);
    case CHK_IS_OVERWRITTEN:
        chk_report(fn, DIAG_HEAP_UNDERFLOW, a, 0, -(ptrdiff_t)CHK_HDR);
    case CHK_NOT_A_BLOCK:
        break;
    }
    diag_bad_pointer(fn, DIAG_INVALID_POINTER, (void *)a, TIER_CHECK, 0);
}

/* Every check of a live block before it is freed or resized. */
static void chk_inspect(uintptr_t a, const struct chk_block *b, const char *fn) {
    if (b->sub == CHK_SLAB) chk_slab_canaries(b->slot, b->size, &b->s, fn);
    if (b->sub == CHK_BIG) chk_big_canaries((const struct chk_big *)b->slot, fn);
    if (b->sub != CHK_ZERO) chk_check_family(fn, a, b->s.n, b->s.fam);
}

static void chk_release_block_as(uintptr_t a, const struct chk_block *b, const char *fn) {
    if (b->sub == CHK_ZERO) {
        chk_zero_free(a, fn);
        return;
    }
    if (b->sub == CHK_BIG) {
        struct chk_big *g = (struct chk_big *)b->slot;
        uint32_t live = CHK_LIVE;
        if (!atomic_compare_exchange_strong(&g->state, &live, CHK_FREED))
            diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, g->n);
        usage_add(-(int64_t)g->n);
        chk_quarantine_big(g);
        return;
    }
    /* (From the header chk_find read: another thread's free of it between
     * then and now makes the exchange fail.) */
    uint64_t live = b->word;
    uint64_t wiping = chk_header(b->key, b->s.n, b->s.fam, CHK_WIPING, b->s.uoff, b->s.gen + 1);
    if (!atomic_compare_exchange_strong(chk_word0(b->slot), &live, wiping))
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, b->s.n);
    atomic_thread_fence(memory_order_release); /* WIPING is seen before any zero */
    usage_add(-(int64_t)b->s.n);
    /* Zeroed: no later owner, nor a dangling pointer, reads the program's
     * bytes; the slot's next malloc verifies the zeros (write after free)
     * and so hands out a zeroed block. (libc's memset: the exported one
     * checks, and this slot is no live block now.) */
    libc_mem.set((void *)(b->slot + CHK_HDR), 0, b->size - CHK_HDR);
    atomic_store_explicit(chk_word0(b->slot),
                          chk_header(b->key, b->s.n, b->s.fam, CHK_FREED, b->s.uoff, b->s.gen + 2),
                          memory_order_release);
    bool lent;
    struct chk_thread *t = chk_thread_get(&lent);
    if (hak_unlikely(t == NULL)) { /* no memory for a cache: straight back to its class */
        chk_class_push(chk_region_of(b->slot)->cls, b->slot, b->slot);
        return;
    }
    chk_quarantine(t, b->slot, b->size, fn);
    if (lent) chk_thread_give(t);
}

/* free() must not change errno: the OS calls a release makes (mprotect,
 * madvise, a thread's cache mapped) set it when refused. */
static void chk_release_block(uintptr_t a, const struct chk_block *b, const char *fn) {
    int saved = errno;
    chk_release_block_as(a, b, fn);
    errno = saved;
}

/* ---- the tier's interface -------------------------------------------------------- */

void *chk_alloc(size_t n, size_t align, enum api_family f) {
    if (align < HAK_MIN_ALIGN) align = HAK_MIN_ALIGN;
    /* (new's zero-size blocks need their family: a slot.) */
    if (n == 0 && align == HAK_MIN_ALIGN && f == API_MALLOC) {
        void *z = chk_zero_alloc();
        if (z != NULL) return z;
    }
    if (n > HAK_MAX_REQUEST || align > ((size_t)1 << 40)) {
        errno = ENOMEM;
        return NULL;
    }
    if (n + align - HAK_MIN_ALIGN + CHK_HDR + 1 <= CHK_SLOT_MAX) return chk_slab_alloc(n, align, f);
    return chk_big_alloc(n, align, f, n);
}

void chk_free(void *p, uint32_t e, const char *fn) {
    struct chk_block b;
    chk_live((uintptr_t)p, e, fn, &b);
    chk_inspect((uintptr_t)p, &b, fn);
    chk_release_block((uintptr_t)p, &b, fn);
}

void *chk_realloc(void *p, uint32_t e, size_t n) {
    uintptr_t a = (uintptr_t)p;
    struct chk_block b;
    chk_live(a, e, "realloc", &b);
    chk_inspect(a, &b, "realloc");
    if (n > HAK_MAX_REQUEST) { /* (also: the in-place tests below would wrap) */
        errno = ENOMEM;
        return NULL;
    }
    if (b.sub == CHK_SLAB && n + b.s.uoff < b.size &&
        small_class_of(n + b.s.uoff + 1) + 4 > chk_region_of(a)->cls) {
        /* In place: the tail canary moves to the new end (growing, what
         * lies past it is canary already). */
        if (n < b.s.n) chk_paint(a + n, a + b.s.n, chk_canary(b.slot));
        atomic_store_explicit(chk_word0(b.slot),
                              chk_header(b.key, n, b.s.fam, CHK_LIVE, b.s.uoff, b.s.gen + 1),
                              memory_order_release);
        atomic_thread_fence(memory_order_release); /* before the program writes its new bytes */
        usage_add((int64_t)n - (int64_t)b.s.n);
        return p;
    }
    if (b.sub == CHK_BIG) {
        struct chk_big *g = (struct chk_big *)b.slot;
        size_t room = g->end - a;
        if (n <= room && n > room / 4 && n + CHK_HDR + 1 > CHK_SLOT_MAX) {
            usage_add((int64_t)n - (int64_t)g->n);
            hak_lock(&chk_q_lock); /* (the walk at exit reads n and the tail) */
            g->n = n;
            chk_big_tail(g);
            hak_unlock(&chk_q_lock);
            return p;
        }
    }
    /* Moved. A big block that grows gets as much room again (address space:
     * the pages past its tail canary are not touched), so growing step by
     * step copies at most every other step, by 1.5 or by 2 (was a quarter
     * more: every step copied, bench_realloc_growth 16 B - 1 MiB). */
    void *q = NULL;
    if (n + CHK_HDR + 1 <= CHK_SLOT_MAX) {
        q = chk_alloc(n, 0, API_MALLOC);
    } else {
        int saved = errno;
        if (n > b.s.n && n <= HAK_MAX_REQUEST / 2)
            q = chk_big_alloc(n, HAK_MIN_ALIGN, API_MALLOC, 2 * n);
        if (q == NULL) { /* shrinking, or no address space for the room */
            errno = saved;
            q = chk_big_alloc(n, HAK_MIN_ALIGN, API_MALLOC, n);
        }
    }
    if (q == NULL) return NULL;
    libc_mem.cpy(q, p, b.s.n < n ? b.s.n : n);
    chk_release_block(a, &b, "realloc");
    return q;
}

/* Every block the tier hands out is zeroed already (fresh pages, a slot's
 * verified zeros, a reused big mapping cleared by chk_big_alloc). */
void *chk_calloc(size_t n) {
    return chk_alloc(n, 0, API_MALLOC);
}

size_t chk_usable_size(const void *p, uint32_t e, const char *fn) {
    struct chk_block b;
    chk_live((uintptr_t)p, e, fn, &b);
    return b.s.n;
}

bool chk_is_live(const void *p, uint32_t e, size_t *size) {
    struct chk_block b;
    bool live = chk_find((uintptr_t)p, e, &b) == CHK_IS_LIVE;
    *size = live ? b.s.n : 0;
    return live;
}

void chk_start(void) {
    uint64_t s = hak_secret();
    chk_skey = chk_mix(s + 1);
    chk_scanary = chk_mix(s + 2);
    chk_slink = chk_mix(s + 3);
    chk_hmul = chk_mix(s + 4) | 1;
    chk_zero_start();
    chk_on = true;
}

void chk_fork_prepare(void) {
    hak_lock(&chk_t_lock);
    hak_lock(&chk_q_lock);
    hak_lock(&chk_zero_lock);
    for (uint32_t c = 0; c < SMALL_NCLASSES; c++)
        hak_lock(&chk_classes[c].lock);
}

void chk_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    for (uint32_t c = 0; c < SMALL_NCLASSES; c++)
        hak_unlock(&chk_classes[c].lock);
    hak_unlock(&chk_zero_lock);
    hak_unlock(&chk_q_lock);
    hak_unlock(&chk_t_lock);
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void chk_collect(enum tier_collect kind, struct tier_done *done) {
    (void)done;
    if (kind == COLLECT_EXIT) chk_thread_exit();
    if (kind == COLLECT_TRIM && chk_on) chk_walk("malloc_trim");
}

const struct tier_ops chk_tier = {.name = "check",
                                  .collect = chk_collect,
                                  .fork_prepare = chk_fork_prepare,
                                  .fork_release = chk_fork_release};
