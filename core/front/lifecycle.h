/* Lifecycle: start-up, thread exit and fork. */
#ifndef HAK_LIFECYCLE_H
#define HAK_LIFECYCLE_H

#include <stdbool.h>

/* Read the configuration and install the thread-exit and fork hooks. Safe to
 * call from any thread at any time; allocation works before it finishes (all
 * tier state is statically initialised), so a malloc from inside it is fine. */
void hak_init(void);

/* Make sure this thread's caches are returned when it exits. Slow paths call
 * it before a thread starts caching; false means the thread must not cache:
 * start-up is still running in another thread, the thread-exit key could not
 * be created, or this thread is already past its exit hook. */
bool life_thread_arm(void);

#endif
