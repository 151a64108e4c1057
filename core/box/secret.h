/* A per-process secret: values a program's bug cannot guess or reproduce
 * (canaries). From the kernel's random bytes for this process (AT_RANDOM,
 * no system call), taken on first use; never zero. */
#ifndef HAK_SECRET_H
#define HAK_SECRET_H

#include "sizes.h"

#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>

static inline uint64_t hak_secret(void) {
    static uint64_t secret; /* (racy but idempotent: every thread computes the same) */
    if (hak_unlikely(secret == 0)) {
        uint64_t s = 0x9e3779b97f4a7c15ull;
        const void *r = (const void *)getauxval(AT_RANDOM);
        if (r != NULL) memcpy(&s, r, sizeof s);
        secret = s | 1;
    }
    return secret;
}

#endif
