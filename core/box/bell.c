#include "box/bell.h"

#include "box/lock.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

_Atomic bool bell_armed;

static pthread_mutex_t bell_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bell_cond = PTHREAD_COND_INITIALIZER; /* bell_init: monotonic */
static bool bell_stopped;                                   /* under bell_lock */

void bell_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&bell_cond, &a);
    pthread_condattr_destroy(&a);
}

void bell_ring_slow(void) {
    /* (hak_lock: a ring from a handler that runs inside fork, whose thread
     * holds the lock, signals without it.) */
    hak_lock(&bell_lock);
    if (atomic_load_explicit(&bell_armed, memory_order_relaxed)) {
        atomic_store_explicit(&bell_armed, false, memory_order_relaxed);
        pthread_cond_signal(&bell_cond);
    }
    hak_unlock(&bell_lock);
}

void bell_arm(void) {
    /* Ordered before the look at the tiers by their locks (bell_ring). */
    atomic_store_explicit(&bell_armed, true, memory_order_relaxed);
}

void bell_disarm(void) {
    atomic_store_explicit(&bell_armed, false, memory_order_relaxed);
}

bool bell_sleep(uint64_t until_ms, bool armed) {
    /* hak_now_ms reads CLOCK_MONOTONIC_COARSE: the same clock, coarser. */
    struct timespec ts = {.tv_sec = (time_t)(until_ms / 1000),
                          .tv_nsec = (long)(until_ms % 1000) * 1000000};
    hak_lock(&bell_lock);
    while (!bell_stopped && (!armed || atomic_load_explicit(&bell_armed, memory_order_relaxed)))
        if (pthread_cond_timedwait(&bell_cond, &bell_lock, &ts) == ETIMEDOUT) break;
    atomic_store_explicit(&bell_armed, false, memory_order_relaxed);
    bool go = !bell_stopped;
    hak_unlock(&bell_lock);
    return go;
}

void bell_stop(void) {
    hak_lock(&bell_lock);
    bell_stopped = true;
    atomic_store_explicit(&bell_armed, false, memory_order_relaxed);
    pthread_cond_broadcast(&bell_cond);
    hak_unlock(&bell_lock);
}

void bell_fork_prepare(void) {
    pthread_mutex_lock(&bell_lock);
}

void bell_fork_release(bool child) {
    if (child) {
        /* The parent's thread, gone here, may have been among the waiters;
         * nothing sleeps on the bell until the child's thread starts. */
        bell_init();
        atomic_store_explicit(&bell_armed, false, memory_order_relaxed);
    }
    pthread_mutex_unlock(&bell_lock);
}

bool bell_live(void) {
    hak_lock(&bell_lock);
    bool live = !bell_stopped;
    hak_unlock(&bell_lock);
    return live;
}
