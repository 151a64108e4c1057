/* Lifecycle: start-up, thread exit and fork. */
#ifndef HAK_LIFECYCLE_H
#define HAK_LIFECYCLE_H

#include <stdbool.h>

/* Read the configuration and install the thread-exit and fork hooks. Safe to
 * call from any thread at any time; allocation works before it finishes (all
 * tier state is statically initialised), so a malloc from inside it is fine. */
void hak_init(void);

/* A thread's first slow path: start-up if it has not run yet, then open
 * this thread's caches (tc_thread_start). False: the thread works
 * uncached. */
bool life_thread_start(void);

#endif
