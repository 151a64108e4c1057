/* Size classes for 0 .. HAK_SMALL_MAX: 16-byte steps to 128 B, then four
 * classes per power of two, so a block wastes at most 25% above 64 B, plus a
 * 52 KiB class where the Pool tier ends. Which tier owns which classes:
 * sizes.h. */
#ifndef HAK_SIZECLASS_H
#define HAK_SIZECLASS_H

#include "sizes.h"

#include <stdbool.h>

extern HAK_HIDDEN const uint32_t small_class_size[SMALL_NCLASSES];
extern HAK_HIDDEN const uint16_t small_class_cap[SMALL_NCLASSES];
extern HAK_HIDDEN const uint64_t small_class_magic[SMALL_NCLASSES];
#define SMALL_LUT_N 1025 /* the lookup table: sizes 0 .. 1 KiB */
extern HAK_HIDDEN const uint8_t small_class_lut[SMALL_LUT_N];

/* Class for a request of n bytes, n <= HAK_SMALL_MAX. */
HAK_INLINE uint32_t small_class_of(size_t n) {
    if (hak_likely(n <= 1024)) return small_class_lut[n];
    /* 2^lg < n <= 2^(lg+1); the two bits below the top pick one of four;
     * past 52 KiB one more for the 52 KiB class. */
    size_t m = n - 1;
    unsigned lg = 63u - (unsigned)__builtin_clzl(m);
    return 8 + (lg - 7) * 4 + (uint32_t)((m >> (lg - 2)) & 3) + (n > 53248);
}

/* realloc keeps a block of class cls for n bytes where it is: not growing
 * out of it, nor shrinking by four classes or more (about half: a copy is
 * cheaper than the slack). */
HAK_INLINE bool small_class_keeps(uint32_t cls, size_t n) {
    return n <= small_class_size[cls] && small_class_of(n) + 4 > cls;
}

/* offset / size for offset < 2^21, exactly. */
HAK_INLINE size_t small_class_div(uint32_t cls, size_t offset) {
    return (size_t)(((uint64_t)offset * small_class_magic[cls]) >> 42); /* < 2^60 */
}

#endif
