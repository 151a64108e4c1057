/* A per-process secret: values a program's bug cannot guess or reproduce
 * (canaries). From the kernel's random bytes for this process (AT_RANDOM,
 * no system call), taken on first use; never zero. */
#ifndef HAK_SECRET_H
#define HAK_SECRET_H

#include "sizes.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>

static inline uint64_t hak_secret(void) {
    /* Threads may race to set it: all compute the same value. (Relaxed
     * atomics: plain moves on x86-64, and no data race for TSan.) */
    static _Atomic uint64_t secret;
    uint64_t s = atomic_load_explicit(&secret, memory_order_relaxed);
    if (hak_unlikely(s == 0)) {
        s = 0x9e3779b97f4a7c15ull;
        const void *r = (const void *)getauxval(AT_RANDOM);
        if (r != NULL) memcpy(&s, r, sizeof s);
        s |= 1;
        atomic_store_explicit(&secret, s, memory_order_relaxed);
    }
    return s;
}

#endif
