#include "front/lifecycle.h"

#include "box/config.h"
#include "box/diag.h"
#include "box/lock.h"
#include "prof/prof.h"
#include "box/thread.h"
#include "check/check.h"
#include "front/report.h"
#include "front/background.h"
#include "front/tiers.h"
#include "tcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

enum { LIFE_NEW, LIFE_STARTING, LIFE_READY };
static _Atomic int life_state = LIFE_NEW;
_Atomic bool life_started;

/* Fork: take every allocator lock so the child never inherits one held by a
 * thread that does not exist there. Handlers registered before ours run
 * between our prepare and our parent/child handler and may allocate: the
 * forking thread marks itself so its lock sites skip the locks it holds. */
static void life_fork_prepare(void) {
    tiers_fork_prepare();
    hak_in_fork = true;
}

static void life_fork_parent(void) {
    hak_in_fork = false;
    tiers_fork_release(false);
}

static void life_fork_child(void) {
    hak_in_fork = false;
    tiers_fork_release(true);
    tiers_fork_child();
}

static void life_begin(void) {
    int s = LIFE_NEW;
    if (atomic_load_explicit(&life_state, memory_order_acquire) != LIFE_NEW) return;
    if (!atomic_compare_exchange_strong(&life_state, &s, LIFE_STARTING)) return;
    config_load();
    if (hak_cfg.check) {
        chk_start();
        tc_off = true; /* checked mode serves every allocation */
    }
    pthread_atfork(life_fork_prepare, life_fork_parent, life_fork_child);
    thread_start(tiers_thread_armed, tiers_thread_exit); /* threads may arm from here on */
    atomic_store_explicit(&life_state, LIFE_READY, memory_order_release);
    atomic_store_explicit(&life_started, true, memory_order_relaxed);
}

void hak_init(void) {
    /* Called from a .preinit_array function (sanitizer runtimes allocate
     * there), before libc has set up the environment: the settings are not
     * readable yet. Start in life_start; until then allocation works,
     * without thread caches. */
    if (environ != NULL) life_begin();
}

bool life_thread_start(void) {
    life_ensure(); /* the first slow path of the process reads the settings */
    return tc_thread_start();
}

__attribute__((constructor)) static void life_start(void) {
    life_begin(); /* (libc is set up by now, even if a constructor cleared environ) */
    /* Here, not in hak_init: arming loads the unwinder, which allocates. */
    if (hak_cfg.backtrace) diag_arm_backtrace();
    if (hak_cfg.prof && hak_cfg.check) {
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: HAKMEM_PROF is ignored in checked mode (HAKMEM_CHECK=1)\n");
        diag_flush(&b, 2);
    }
    if (hak_cfg.prof && !hak_cfg.check)
        prof_start(hak_cfg.prof_sample, hak_cfg.prof_file);
    else
        prof_decline();
    /* Here too, not in hak_init: pthread_create allocates. */
    if (hak_cfg.background) bg_start();
}

__attribute__((destructor)) static void life_end(void) {
    bg_stop();  /* first: nothing ages once the program is ending */
    chk_exit(); /* what waits in quarantine was not written since its free */
    prof_exit();
    if (hak_cfg.stats) report_exit();
}
