/* Small tier: per-class shared state behind one mutex per class; threads
 * touch it only to refill or flush their caches, a batch at a time. */
#include "small.h"

#include "box/lock.h"
#include "box/os.h"

#include <errno.h>
#include <pthread.h>

struct small_class {
    pthread_mutex_t lock;
    void *free;          /* blocks flushed by threads, linked through word 0 */
    uint8_t *bump, *end; /* never-used tail of the class's newest region */
    uint64_t regions, carved_bytes, refills, flushes;
};

static struct small_class small_classes[SMALL_NCLASSES] = {
    [0 ... SMALL_NCLASSES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER},
};

/* Link n blocks of `size` starting at p into a list; returns its last block. */
static void *small_link(uint8_t *p, uint32_t n, uint32_t size) {
    for (uint32_t i = 1; i < n; i++, p += size)
        *(void **)p = p + size;
    *(void **)p = NULL;
    return p;
}

/* Give the class a fresh region to carve from. Called with the lock held. */
static bool small_new_region(struct small_class *c, uint32_t cls) {
    uint8_t *r = os_map_aligned(HAK_REGION_SIZE, HAK_REGION_SIZE);
    if (r == NULL) return false;
    if (!rmap_set_region(r, RMAP_SMALL, cls)) {
        os_unmap(r, HAK_REGION_SIZE);
        return false;
    }
    c->bump = r;
    c->end = r + HAK_REGION_SIZE;
    c->regions++;
    return true;
}

/* Up to `want` blocks of cls from the shared list, else freshly carved, as
 * a chain first..*last; how many (0: out of memory). */
static uint32_t small_take_shared(uint32_t cls, uint32_t want, void **first, void **last) {
    struct small_class *c = &small_classes[cls];
    const uint32_t size = small_class_size[cls];
    uint32_t got;
    hak_lock(&c->lock);
    c->refills++;
    if (c->free) {
        /* Reuse flushed blocks before carving new ones. */
        void *b = *first = c->free;
        for (got = 1; got < want && *(void **)b; got++)
            b = *(void **)b;
        c->free = *(void **)b;
        hak_unlock(&c->lock);
        *last = b;
        return got;
    }
    if ((size_t)(c->end - c->bump) < size && !small_new_region(c, cls)) {
        hak_unlock(&c->lock);
        return 0;
    }
    size_t room = (size_t)(c->end - c->bump) / size;
    got = room < want ? (uint32_t)room : want;
    *first = c->bump;
    c->bump += (size_t)got * size;
    c->carved_bytes += (size_t)got * size;
    hak_unlock(&c->lock);
    *last = small_link(*first, got, size); /* private now: link outside the lock */
    return got;
}

/* Put the chain first..last on the shared list of cls. */
static void small_put_shared(uint32_t cls, void *first, void *last) {
    struct small_class *c = &small_classes[cls];
    hak_lock(&c->lock);
    *(void **)last = c->free;
    c->free = first;
    c->flushes++;
    hak_unlock(&c->lock);
}

void *small_alloc_uncached(uint32_t cls) {
    void *first, *last;
    if (small_take_shared(cls, 1, &first, &last) == 0) {
        errno = ENOMEM;
        return NULL;
    }
    return first;
}

void *small_alloc_slow(uint32_t cls) {
    if (!hak_tc.open && !tc_thread_start()) return small_alloc_uncached(cls);
    void *first, *last;
    uint32_t got = small_take_shared(cls, tc_batch(cls), &first, &last);
    if (got == 0) {
        errno = ENOMEM;
        return NULL;
    }
    /* Hand out the first block; the rest become this thread's cache. */
    if (got > 1) tc_push_chain(cls, *(void **)first, last, got - 1);
    return first;
}

/* Move the first n blocks of this thread's list for cls to the shared list. */
static void small_give_back(uint32_t cls, uint32_t n) {
    void *last;
    void *first = tc_take(cls, n, &last);
    small_put_shared(cls, first, last);
}

/* One block straight onto the shared list: a Tiny-class block of this tier,
 * or a free by a thread that may not cache. The list's head is the one
 * double free this can catch. */
static void small_put_one(uint32_t cls, void *p, const char *fn) {
    struct small_class *c = &small_classes[cls];
    hak_lock(&c->lock);
    if (hak_unlikely(c->free == p)) {
        hak_unlock(&c->lock);
        diag_bad_pointer(fn, "double free", p);
    }
    *(void **)p = c->free;
    c->free = p;
    hak_unlock(&c->lock);
}

void small_free_slow(void *p, uint32_t cls, const char *fn) {
    if (cls < SMALL_FIRST) {
        small_put_one(cls, p, fn);
        return;
    }
    tc_refund(cls);
    if (!hak_tc.open && !tc_thread_start()) {
        small_put_one(cls, p, fn);
        return;
    }
    if (!tc_push(cls, p)) { /* full: give half back */
        tc_refund(cls);
        small_give_back(cls, tc_batch(cls));
        tc_push(cls, p);
    }
}

void small_thread_flush(void) {
    for (uint32_t cls = SMALL_FIRST; cls < SMALL_NCLASSES; cls++)
        if (tc_count(cls)) small_give_back(cls, tc_count(cls));
}

void small_fork_prepare(void) {
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        pthread_mutex_lock(&small_classes[cls].lock);
}

void small_fork_parent(void) {
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        pthread_mutex_unlock(&small_classes[cls].lock);
}

void small_fork_child(void) {
    /* The child has one thread; the locks it inherited are held by it. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        pthread_mutex_init(&small_classes[cls].lock, NULL);
}

void small_get_stats(struct small_stats *s) {
    *s = (struct small_stats){0};
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++) {
        struct small_class *c = &small_classes[cls];
        hak_lock(&c->lock);
        s->regions += c->regions;
        s->carved_bytes += c->carved_bytes;
        s->refills += c->refills;
        s->flushes += c->flushes;
        hak_unlock(&c->lock);
    }
}
