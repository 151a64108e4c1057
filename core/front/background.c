/* The background ageing thread (front/background.h). It sleeps on the bell
 * (core/box/bell.h): until the next tier timer is due, or, with nothing
 * cached that ages, until a tier rings. */
#include "front/background.h"

#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/diag.h"
#include "front/tiers.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>

_Atomic uint64_t bg_passes;
_Atomic bool bg_busy;

static pthread_t bg_thread;
static _Atomic bool bg_running; /* bg_thread was started and not joined */
static uint64_t bg_jiffy_ms;    /* how far hak_now_ms's coarse clock may lag */

#define BG_NONE     UINT64_MAX
#define BG_IDLE_MS  10000       /* asleep with nothing cached: a look this often anyway */
#define BG_STACK    (256 << 10) /* the passes need a few KiB */
#define BG_JOIN_SEC 1

/* Every tier ages what is due now. When the next thing is due; BG_NONE when
 * nothing that ages is cached. */
static uint64_t bg_pass(void) {
    atomic_store_explicit(&bg_busy, true, memory_order_relaxed);
    uint64_t next = tiers_collect(COLLECT_IDLE).next_ms;
    atomic_fetch_add_explicit(&bg_passes, 1, memory_order_relaxed);
    atomic_store_explicit(&bg_busy, false, memory_order_relaxed);
    return next;
}

static void *bg_main(void *unused) {
    (void)unused;
    prctl(PR_SET_NAME, "hakmem-bg", 0, 0, 0); /* (pthread_setname_np, without libc's checks) */
    for (;;) {
        uint64_t next = bg_pass();
        if (next == BG_NONE) {
            /* Nothing to wait for: sleep until a tier caches something. A
             * tier that cached since the pass above is seen by this one
             * or finds the bell armed. */
            bell_arm();
            next = bg_pass();
            if (next == BG_NONE) {
                if (!bell_sleep(hak_now_ms() + BG_IDLE_MS, true)) break;
                continue;
            }
            bell_disarm();
        }
        /* At most eight passes per age: due times a few milliseconds apart
         * share one. At least one per age (`next` may be two ages away: a
         * decommitted Large mapping's unmapping), so that what is cached
         * meanwhile, with the bell not armed, waits no longer for a look.
         * Past the due time by a tick of the coarse clock the tiers read. */
        uint64_t now = hak_now_ms(), age = hak_cfg.age_ms, gap = age / 8;
        if (gap == 0) gap = 1;
        uint64_t until = next > now + gap ? next : now + gap;
        if (until > now + age) until = now + age;
        if (!bell_sleep(until + bg_jiffy_ms, false)) break;
    }
    return NULL;
}

/* Start the thread, with every signal blocked (a program's handlers run on
 * its own threads); false when it could not be. */
static bool bg_create(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return false;
    pthread_attr_setstacksize(&attr, BG_STACK);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&bg_thread, &attr, bg_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    atomic_store_explicit(&bg_running, rc == 0, memory_order_relaxed);
    return rc == 0;
}

void bg_start(void) {
    if (atomic_load_explicit(&bg_running, memory_order_relaxed)) return;
    struct timespec res;
    bg_jiffy_ms = 1;
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0)
        bg_jiffy_ms = (uint64_t)res.tv_sec * 1000 + (uint64_t)res.tv_nsec / 1000000 + 1;
    bell_init();
    if (!bg_create()) {
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: HAKMEM_BACKGROUND=1: the thread could not be started; "
                     "free memory ages on the program's own calls\n");
        diag_flush(&b, 2);
    }
}

void bg_stop(void) {
    if (!atomic_load_explicit(&bg_running, memory_order_relaxed)) return;
    bell_stop(); /* it ends its pass (each tier's lock is taken for a moment) and returns */
    /* Bounded: a program that calls exit() from a signal handler that
     * interrupted an allocation holds the lock the pass may wait for. The
     * thread touches nothing exit frees (the tiers' state is static and
     * stays); the end of the process ends it. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += BG_JOIN_SEC;
    if (pthread_timedjoin_np(bg_thread, NULL, &ts) == 0)
        atomic_store_explicit(&bg_running, false, memory_order_relaxed);
}

static void bg_fork_child(void) {
    /* The parent's thread does not exist here: a new one, unless exit had
     * begun. Here rather than on the child's next allocation: glibc has
     * reset its loader and thread-stack locks before the child handlers
     * run, hakmem has released its own, and the allocation inside
     * pthread_create comes back to hakmem with no lock held; a malloc, by
     * contrast, may be called from inside libc holding locks of its own. */
    bool go = bell_live();
    if (atomic_load_explicit(&bg_running, memory_order_relaxed) && !(go && bg_create()))
        atomic_store_explicit(&bg_running, false, memory_order_relaxed);
}

const struct tier_ops bg_tier = {.name = "background",
                                 .fork_prepare = bell_fork_prepare,
                                 .fork_release = bell_fork_release,
                                 .fork_child = bg_fork_child};
