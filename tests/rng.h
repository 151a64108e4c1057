/* The tests' pseudo-random numbers: xorshift64, deterministic per seed
 * (a seed of 0 stays 0). */
#ifndef HAK_TESTS_RNG_H
#define HAK_TESTS_RNG_H

#include <stdint.h>

static inline uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

#endif
