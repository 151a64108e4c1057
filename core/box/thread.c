#include "box/thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

__thread bool hak_in_fork;

static pthread_key_t thread_key;
static _Atomic bool thread_ready; /* the key exists and the callbacks are set */
static void (*thread_on_arm)(void);
static void (*thread_on_exit)(void);

static __thread bool thread_armed;
static __thread bool thread_arming; /* pthread_setspecific may itself allocate */
/* Past the exit hook: glibc may still free (its own thread-exit clean-up runs
 * after key destructors) or allocate in later destructors, and nothing would
 * return what such a thread caches. */
static __thread bool thread_exited;

/* The key's destructor. A thread that allocates afterwards (in another
 * destructor) works uncached: thread_exited keeps it from arming again. */
static void thread_exit(void *unused) {
    (void)unused;
    thread_armed = false;
    thread_exited = true;
    thread_on_exit();
}

bool thread_start(void (*on_arm)(void), void (*on_exit)(void)) {
    thread_on_arm = on_arm;
    thread_on_exit = on_exit;
    if (pthread_key_create(&thread_key, thread_exit) != 0) return false;
    atomic_store_explicit(&thread_ready, true, memory_order_release);
    return true;
}

bool thread_arm(void) {
    if (hak_likely(thread_armed)) return true;
    if (thread_exited || thread_arming) return false;
    if (!atomic_load_explicit(&thread_ready, memory_order_acquire)) return false;
    thread_arming = true;
    thread_armed = pthread_setspecific(thread_key, &thread_armed) == 0; /* any non-NULL value */
    thread_arming = false;
    if (thread_armed) thread_on_arm(); /* the hook publishes what is pending */
    return thread_armed;
}
