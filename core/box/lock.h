/* Allocator locks. Between our fork prepare handler and our parent/child
 * handler the forking thread already holds every allocator lock; handlers of
 * libraries registered before hakmem run in that window (glibc runs prepare
 * handlers in reverse order of registration) and may allocate, so lock sites
 * must not take the locks again then. */
#ifndef HAK_LOCK_H
#define HAK_LOCK_H

#include "box/thread.h"
#include "sizes.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The count build (make count, tests/scale/count.c) counts every lock taken,
 * by call site, and a mutex's word as written by its taker (the mutex's
 * code is glibc's, which that build does not see; a spin lock's exchange
 * it sees). */
#ifdef HAK_COUNT
HAK_HIDDEN void hak_count_lock(const void *word);
#define HAK_COUNT_LOCK(word) hak_count_lock(word)
#else
#define HAK_COUNT_LOCK(word) ((void)0)
#endif

static inline void hak_lock(pthread_mutex_t *m) {
    if (hak_likely(!hak_in_fork)) {
        HAK_COUNT_LOCK(m);
        pthread_mutex_lock(m);
    }
}

static inline void hak_unlock(pthread_mutex_t *m) {
    if (hak_likely(!hak_in_fork)) pthread_mutex_unlock(m);
}

/* A spin lock, for data touched once per heap-profile sample (its records,
 * the Large tier's spares): one atomic exchange to take it and a plain store
 * to give it back, where a mutex costs two atomics and two calls. Holders
 * keep it briefly, except a profile dump (file writes): a waiter spins a
 * little, then yields, then sleeps, so that it does not burn a CPU beside a
 * holder that is blocked or preempted. */
typedef struct {
    _Atomic bool held;
} hak_spin;
#define HAK_SPIN_INIT                                                                              \
    { false }

/* One step of a wait that has gone on for `tries` steps: pause, then
 * yield, then sleep. Yield and sleep are raw system calls: libc's nanosleep is a cancellation
 * point (a cancel would end the thread inside malloc, or inside fork's
 * prepare handler with other locks held), and another preloaded library may
 * wrap either one with code that allocates. errno is the program's. */
static inline void hak_backoff(unsigned tries) {
    if (tries < 64) {
        __builtin_ia32_pause();
    } else if (tries < 4096) { /* (a few ms of yields) */
        syscall(SYS_sched_yield);
    } else {
        struct timespec nap = {0, 50000}; /* 50 us */
        syscall(SYS_nanosleep, &nap, NULL);
    }
}

/* A waiter that found the lock held. */
static __attribute__((cold, noinline)) void hak_spin_wait(hak_spin *l) {
    int saved = errno;
    for (unsigned tries = 0;; tries++) {
        /* Read until free (no writes to the line meanwhile), then try. */
        while (atomic_load_explicit(&l->held, memory_order_relaxed))
            hak_backoff(tries++);
        if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire)) break;
    }
    errno = saved;
}

static inline void hak_spin_lock(hak_spin *l) {
    if (hak_unlikely(hak_in_fork)) return;
    HAK_COUNT_LOCK(NULL);
    if (hak_unlikely(atomic_exchange_explicit(&l->held, true, memory_order_acquire)))
        hak_spin_wait(l);
}

/* Take it if it is free; true when taken (or inside the fork window). */
static inline bool hak_spin_trylock(hak_spin *l) {
    if (hak_unlikely(hak_in_fork)) return true;
    if (atomic_load_explicit(&l->held, memory_order_relaxed) ||
        atomic_exchange_explicit(&l->held, true, memory_order_acquire))
        return false;
    HAK_COUNT_LOCK(NULL);
    return true;
}

static inline void hak_spin_unlock(hak_spin *l) {
    if (hak_likely(!hak_in_fork)) atomic_store_explicit(&l->held, false, memory_order_release);
}

#endif
