/* The C library's memory and string copies (libc.h). */
#include "box/libc.h"

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* glibc's report of a fortified call's overflow ("*** buffer overflow
 * detected ***"), then abort. */
extern void __chk_fail(void) __attribute__((noreturn));

/* ---- stand-ins until libc_resolve, and for good in a static program ------------
 * (which has no dlsym to find the C library's with). The string
 * instructions copy and fill at nearly the C library's speed on CPUs with
 * fast strings (a static program copying 1 MiB blocks ran 12 times slower
 * on byte loops); overlapping moves go a byte at a time. The empty asm in
 * each loop keeps the compiler from turning it back into a call of the very
 * function it stands in for. */

static void *lc_cpy(void *d, const void *s, size_t n) {
#if defined(__x86_64__)
    void *o = d;
    __asm__ volatile("rep movsb" : "+D"(o), "+S"(s), "+c"(n) : : "memory");
#else
    unsigned char *o = d;
    const unsigned char *i = s;
    for (size_t k = 0; k < n; k++) {
        o[k] = i[k];
        __asm__ volatile("" ::: "memory");
    }
#endif
    return d;
}

static void *lc_pcpy(void *d, const void *s, size_t n) {
    return (char *)lc_cpy(d, s, n) + n;
}

static void *lc_move(void *d, const void *s, size_t n) {
    unsigned char *o = d;
    const unsigned char *i = s;
    if ((uintptr_t)o - (uintptr_t)i >= n && (uintptr_t)i - (uintptr_t)o >= n)
        return lc_cpy(d, s, n); /* no overlap */
    if (o < i) {
        for (size_t k = 0; k < n; k++) { /* the destination below: from the start */
            o[k] = i[k];
            __asm__ volatile("" ::: "memory");
        }
        return d;
    }
    for (size_t k = n; k-- > 0;) { /* the destination above: from the end */
        o[k] = i[k];
        __asm__ volatile("" ::: "memory");
    }
    return d;
}

static void *lc_set(void *d, int c, size_t n) {
#if defined(__x86_64__)
    void *o = d;
    __asm__ volatile("rep stosb" : "+D"(o), "+c"(n) : "a"(c) : "memory");
#else
    unsigned char *o = d;
    for (size_t k = 0; k < n; k++) {
        o[k] = (unsigned char)c;
        __asm__ volatile("" ::: "memory");
    }
#endif
    return d;
}

static char *lc_str_cpy(char *d, const char *s) {
    return lc_cpy(d, s, strlen(s) + 1);
}

static char *lc_stp_cpy(char *d, const char *s) {
    size_t n = strlen(s);
    lc_cpy(d, s, n + 1);
    return d + n;
}

static char *lc_str_cat(char *d, const char *s) {
    lc_str_cpy(d + strlen(d), s);
    return d;
}

static char *lc_str_ncpy(char *d, const char *s, size_t n) {
    size_t k = strnlen(s, n);
    lc_cpy(d, s, k);
    lc_set(d + k, 0, n - k);
    return d;
}

static void lc_fits(size_t n, size_t room) {
    if (n > room) __chk_fail();
}

static void *lc_cpy_chk(void *d, const void *s, size_t n, size_t room) {
    lc_fits(n, room);
    return lc_cpy(d, s, n);
}

static void *lc_pcpy_chk(void *d, const void *s, size_t n, size_t room) {
    lc_fits(n, room);
    return lc_pcpy(d, s, n);
}

static void *lc_move_chk(void *d, const void *s, size_t n, size_t room) {
    lc_fits(n, room);
    return lc_move(d, s, n);
}

static void *lc_set_chk(void *d, int c, size_t n, size_t room) {
    lc_fits(n, room);
    return lc_set(d, c, n);
}

static char *lc_str_cpy_chk(char *d, const char *s, size_t room) {
    lc_fits(strlen(s) + 1, room);
    return lc_str_cpy(d, s);
}

static char *lc_stp_cpy_chk(char *d, const char *s, size_t room) {
    lc_fits(strlen(s) + 1, room);
    return lc_stp_cpy(d, s);
}

static char *lc_str_cat_chk(char *d, const char *s, size_t room) {
    lc_fits(strlen(d) + strlen(s) + 1, room);
    return lc_str_cat(d, s);
}

static char *lc_str_ncpy_chk(char *d, const char *s, size_t n, size_t room) {
    lc_fits(n, room);
    return lc_str_ncpy(d, s, n);
}

HAK_HIDDEN struct libc_mem libc_mem = {
    .cpy = lc_cpy,
    .pcpy = lc_pcpy,
    .move = lc_move,
    .set = lc_set,
    .str_cpy = lc_str_cpy,
    .stp_cpy = lc_stp_cpy,
    .str_cat = lc_str_cat,
    .str_ncpy = lc_str_ncpy,
    .cpy_chk = lc_cpy_chk,
    .pcpy_chk = lc_pcpy_chk,
    .move_chk = lc_move_chk,
    .set_chk = lc_set_chk,
    .str_cpy_chk = lc_str_cpy_chk,
    .stp_cpy_chk = lc_stp_cpy_chk,
    .str_cat_chk = lc_str_cat_chk,
    .str_ncpy_chk = lc_str_ncpy_chk,
};

int (*libc_mallopt)(int param, int value);

/* One function: the C library's `name` where there is one (a static
 * program has no dlsym to find it with: the stand-in stays). */
#define LC_RESOLVE(field, name)                                                                    \
    do {                                                                                           \
        void *f = dlsym(RTLD_NEXT, name);                                                          \
        if (f != NULL) __atomic_store_n((void **)&libc_mem.field, f, __ATOMIC_RELAXED);            \
    } while (0)

/* Its own constructor: a program linked with libhakmem.a that copies but
 * never allocates links this file without the rest of the library. */
__attribute__((constructor)) void libc_resolve(void) {
    LC_RESOLVE(cpy, "memcpy");
    LC_RESOLVE(pcpy, "mempcpy");
    LC_RESOLVE(move, "memmove");
    LC_RESOLVE(set, "memset");
    LC_RESOLVE(str_cpy, "strcpy");
    LC_RESOLVE(stp_cpy, "stpcpy");
    LC_RESOLVE(str_cat, "strcat");
    LC_RESOLVE(str_ncpy, "strncpy");
    LC_RESOLVE(cpy_chk, "__memcpy_chk");
    LC_RESOLVE(pcpy_chk, "__mempcpy_chk");
    LC_RESOLVE(move_chk, "__memmove_chk");
    LC_RESOLVE(set_chk, "__memset_chk");
    LC_RESOLVE(str_cpy_chk, "__strcpy_chk");
    LC_RESOLVE(stp_cpy_chk, "__stpcpy_chk");
    LC_RESOLVE(str_cat_chk, "__strcat_chk");
    LC_RESOLVE(str_ncpy_chk, "__strncpy_chk");
    __atomic_store_n(&libc_mallopt, (int (*)(int, int))dlsym(RTLD_NEXT, "mallopt"),
                     __ATOMIC_RELAXED);
}
