/* Lifecycle: start-up, thread exit and fork. */
#ifndef HAK_LIFECYCLE_H
#define HAK_LIFECYCLE_H

#include "sizes.h"

#include <stdatomic.h>
#include <stdbool.h>

/* Read the configuration and install the thread-exit and fork hooks. Safe to
 * call from any thread at any time; allocation works before it finishes (all
 * tier state is statically initialised), so a malloc from inside it is fine. */
void hak_init(void);

/* Start-up has finished (set once, by hak_init's last step). */
extern HAK_HIDDEN _Atomic bool life_started;

/* hak_init unless start-up has finished: a load, for the slow paths a
 * program's first calls may take. */
static inline void life_ensure(void) {
    if (hak_unlikely(!atomic_load_explicit(&life_started, memory_order_relaxed))) hak_init();
}

/* A thread's first slow path: start-up if it has not run yet, then open
 * this thread's caches (tc_thread_start). False: the thread works
 * uncached. */
bool life_thread_start(void);

#endif
