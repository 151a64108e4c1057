/* Thread box: each thread's exit hook and the forking thread's mark.
 *
 * A thread that caches blocks must hand them back when it exits. Arming a
 * thread registers it with a pthread key whose destructor runs the exit
 * callback; the front installs that callback (and one run when a thread
 * arms) at start-up, so the tiers arm a thread without knowing who
 * cleans up after it. */
#ifndef HAK_THREAD_H
#define HAK_THREAD_H

#include "sizes.h"

#include <stdbool.h>

/* Set by the forking thread between our fork prepare and parent/child
 * handlers, while it holds every allocator lock (box/lock.h). */
extern HAK_HIDDEN __thread bool hak_in_fork;

/* Create the thread key with `on_exit` as what a thread's exit runs and
 * `on_arm` as what arming runs (both on the thread concerned). Once, at
 * start-up; threads arm only after it. False when the key could not be
 * created: no thread ever arms. */
bool thread_start(void (*on_arm)(void), void (*on_exit)(void));

/* Make sure this thread's exit runs the exit callback. Slow paths call it
 * before a thread starts caching; false means the thread must not cache:
 * start-up has not installed the key yet, the key could not be created, or
 * this thread is already past its exit hook. */
bool thread_arm(void);

#endif
