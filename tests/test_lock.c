/* Lock box: the spin lock (hak_spin) excludes, hands over to a waiter that
 * has gone past spinning, and steps aside inside the fork window as the
 * mutex wrappers do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/lock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#define THREADS 4
#define ROUNDS  200000

static hak_spin counted = HAK_SPIN_INIT;
static uint64_t count; /* plain: only the lock keeps increments apart */

static void *bump(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        hak_spin_lock(&counted);
        uint64_t c = count;
        if ((i & 1023) == 0) sched_yield(); /* a holder that loses its CPU */
        count = c + 1;
        hak_spin_unlock(&counted);
    }
    return NULL;
}

static void test_excludes(void **state) {
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, bump, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(count, (uint64_t)THREADS * ROUNDS);
}

static hak_spin slow = HAK_SPIN_INIT;
static _Atomic int waiter_stage; /* 1: about to lock; 2: has it */
static int written;              /* by the holder, under the lock */

static void *wait_for_it(void *arg) {
    (void)arg;
    atomic_store(&waiter_stage, 1);
    hak_spin_lock(&slow);
    int seen = written;
    atomic_store(&waiter_stage, 2);
    hak_spin_unlock(&slow);
    return (void *)(intptr_t)seen;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A holder that keeps the lock 50 ms (a profile dump writing a file): the
 * waiter goes through spinning and yielding to sleeping, gets the lock once
 * it is given back, and not before: it sees what was written under it. */
static void test_waiter_past_spinning_gets_it(void **state) {
    (void)state;
    hak_spin_lock(&slow);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for_it, NULL), 0);
    while (atomic_load(&waiter_stage) != 1)
        sched_yield();
    uint64_t start = now_ns();
    while (now_ns() - start < 50000000u) {
        assert_int_equal(atomic_load(&waiter_stage), 1); /* still waiting */
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    written = 42;
    hak_spin_unlock(&slow);
    void *seen;
    assert_int_equal(pthread_join(t, &seen), 0);
    assert_int_equal(atomic_load(&waiter_stage), 2);
    assert_int_equal((intptr_t)seen, 42);
    /* And it was given back: taking it again does not block. */
    hak_spin_lock(&slow);
    hak_spin_unlock(&slow);
}

/* In the fork window the forking thread holds every lock already (taken by
 * the prepare handler); lock sites then neither take nor give back. */
static void test_fork_window_skips_it(void **state) {
    (void)state;
    static hak_spin held = HAK_SPIN_INIT;
    hak_spin_lock(&held);
    hak_in_fork = true;
    hak_spin_lock(&held); /* would never return outside the window */
    hak_spin_unlock(&held);
    hak_in_fork = false;
    assert_true(atomic_load(&held.held)); /* the prepare handler's hold stands */
    hak_spin_unlock(&held);
    assert_false(atomic_load(&held.held));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_excludes),
        cmocka_unit_test(test_waiter_past_spinning_gets_it),
        cmocka_unit_test(test_fork_window_skips_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
