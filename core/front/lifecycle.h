/* Lifecycle: start-up, thread exit and fork. */
#ifndef HAK_LIFECYCLE_H
#define HAK_LIFECYCLE_H

/* Read the configuration and install the thread-exit and fork hooks. Safe to
 * call from any thread at any time; allocation works before it finishes (all
 * tier state is statically initialised), so a malloc from inside it is fine. */
void hak_init(void);

/* Make sure this thread's caches are returned when it exits. Slow paths call
 * it; it costs a thread-local test once armed. */
void life_thread_arm(void);

#endif
