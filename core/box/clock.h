/* The clock the caches age by: milliseconds, coarse (the vDSO's
 * CLOCK_MONOTONIC_COARSE: no system call, a few nanoseconds). */
#ifndef HAK_CLOCK_H
#define HAK_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t hak_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
