/* Allocator locks. Between our fork prepare handler and our parent/child
 * handler the forking thread already holds every allocator lock; handlers of
 * libraries registered before hakmem run in that window (glibc runs prepare
 * handlers in reverse order of registration) and may allocate, so lock sites
 * must not take the locks again then. */
#ifndef HAK_LOCK_H
#define HAK_LOCK_H

#include "sizes.h"

#include <pthread.h>
#include <stdbool.h>

extern HAK_HIDDEN __thread bool hak_in_fork;

static inline void hak_lock(pthread_mutex_t *m) {
    if (hak_likely(!hak_in_fork)) pthread_mutex_lock(m);
}

static inline void hak_unlock(pthread_mutex_t *m) {
    if (hak_likely(!hak_in_fork)) pthread_mutex_unlock(m);
}

#endif
