/* The C library's memory and string copies, exported under their own names
 * so that checked mode (HAKMEM_CHECK=1) sees every range a program copies
 * into or out of the heap: a range that crosses a block's end or start is
 * reported before a byte is written (check/range.c). By default each is a
 * test of one flag and a jump to the C library's own (box/libc.h).
 *
 * Only what a program calls through the dynamic linker passes here: the C
 * library's calls of its own, and copies the compiler expands inline (a
 * constant size), do not. */
#undef _FORTIFY_SOURCE /* the definitions below are glibc's fortified names */
#include "box/libc.h"
#include "check/check.h"

#include <string.h>

#ifndef HAK_NO_OVERRIDE /* the sanitizer builds keep their runtime's */

#define MEMOPS_API __attribute__((visibility("default")))

/* Each call's checked form is a function of its own, out of line: the
 * exported one is then a test and two jumps (the checks inline made the
 * compiler save registers on every call, 13 instructions where 3 do). */
#define HAK_COLD __attribute__((noinline, cold))

/* The checks of one call: the ranges written and read. */
static void memops_check(const char *fn, const void *dst, size_t n, const void *src, size_t m) {
    if (m != 0) chk_range(fn, src, m, false);
    if (n != 0) chk_range(fn, dst, n, true);
}

/* The lengths a string copy reads and writes: strlen(src) + 1. */
static size_t memops_str(const char *src) {
    return strlen(src) + 1;
}

static HAK_COLD void *memcpy_checked(void *d, const void *s, size_t n) {
    memops_check("memcpy", d, n, s, n);
    return libc_mem.cpy(d, s, n);
}

MEMOPS_API void *memcpy(void *restrict d, const void *restrict s, size_t n) {
    if (hak_unlikely(chk_on)) return memcpy_checked(d, s, n);
    return libc_mem.cpy(d, s, n);
}

static HAK_COLD void *mempcpy_checked(void *d, const void *s, size_t n) {
    memops_check("mempcpy", d, n, s, n);
    return libc_mem.pcpy(d, s, n);
}

MEMOPS_API void *mempcpy(void *restrict d, const void *restrict s, size_t n) {
    if (hak_unlikely(chk_on)) return mempcpy_checked(d, s, n);
    return libc_mem.pcpy(d, s, n);
}

static HAK_COLD void *memmove_checked(void *d, const void *s, size_t n) {
    memops_check("memmove", d, n, s, n);
    return libc_mem.move(d, s, n);
}

MEMOPS_API void *memmove(void *d, const void *s, size_t n) {
    if (hak_unlikely(chk_on)) return memmove_checked(d, s, n);
    return libc_mem.move(d, s, n);
}

static HAK_COLD void *memset_checked(void *d, int c, size_t n) {
    memops_check("memset", d, n, NULL, 0);
    return libc_mem.set(d, c, n);
}

MEMOPS_API void *memset(void *d, int c, size_t n) {
    if (hak_unlikely(chk_on)) return memset_checked(d, c, n);
    return libc_mem.set(d, c, n);
}

static HAK_COLD char *strcpy_checked(char *d, const char *s) {
    size_t n = memops_str(s);
    memops_check("strcpy", d, n, s, n);
    return libc_mem.str_cpy(d, s);
}

MEMOPS_API char *strcpy(char *restrict d, const char *restrict s) {
    if (hak_unlikely(chk_on)) return strcpy_checked(d, s);
    return libc_mem.str_cpy(d, s);
}

static HAK_COLD char *stpcpy_checked(char *d, const char *s) {
    size_t n = memops_str(s);
    memops_check("stpcpy", d, n, s, n);
    return libc_mem.stp_cpy(d, s);
}

MEMOPS_API char *stpcpy(char *restrict d, const char *restrict s) {
    if (hak_unlikely(chk_on)) return stpcpy_checked(d, s);
    return libc_mem.stp_cpy(d, s);
}

static HAK_COLD char *strcat_checked(char *d, const char *s) {
    size_t n = memops_str(s);
    memops_check("strcat", d + strlen(d), n, s, n);
    return libc_mem.str_cat(d, s);
}

MEMOPS_API char *strcat(char *restrict d, const char *restrict s) {
    if (hak_unlikely(chk_on)) return strcat_checked(d, s);
    return libc_mem.str_cat(d, s);
}

static HAK_COLD char *strncpy_checked(char *d, const char *s, size_t n) {
    memops_check("strncpy", d, n, s, strnlen(s, n));
    return libc_mem.str_ncpy(d, s, n);
}

MEMOPS_API char *strncpy(char *restrict d, const char *restrict s, size_t n) {
    if (hak_unlikely(chk_on)) return strncpy_checked(d, s, n);
    return libc_mem.str_ncpy(d, s, n);
}

/* glibc's fortified forms, which programs built with _FORTIFY_SOURCE call
 * where the compiler knows the destination's size (`room`): the same
 * checks, then glibc's own, which compares n with room. */
static HAK_COLD void *memcpy_chk_checked(void *d, const void *s, size_t n, size_t room) {
    memops_check("memcpy", d, n, s, n);
    return libc_mem.cpy_chk(d, s, n, room);
}

MEMOPS_API void *__memcpy_chk(void *d, const void *s, size_t n, size_t room) {
    if (hak_unlikely(chk_on)) return memcpy_chk_checked(d, s, n, room);
    return libc_mem.cpy_chk(d, s, n, room);
}

static HAK_COLD void *mempcpy_chk_checked(void *d, const void *s, size_t n, size_t room) {
    memops_check("mempcpy", d, n, s, n);
    return libc_mem.pcpy_chk(d, s, n, room);
}

MEMOPS_API void *__mempcpy_chk(void *d, const void *s, size_t n, size_t room) {
    if (hak_unlikely(chk_on)) return mempcpy_chk_checked(d, s, n, room);
    return libc_mem.pcpy_chk(d, s, n, room);
}

static HAK_COLD void *memmove_chk_checked(void *d, const void *s, size_t n, size_t room) {
    memops_check("memmove", d, n, s, n);
    return libc_mem.move_chk(d, s, n, room);
}

MEMOPS_API void *__memmove_chk(void *d, const void *s, size_t n, size_t room) {
    if (hak_unlikely(chk_on)) return memmove_chk_checked(d, s, n, room);
    return libc_mem.move_chk(d, s, n, room);
}

static HAK_COLD void *memset_chk_checked(void *d, int c, size_t n, size_t room) {
    memops_check("memset", d, n, NULL, 0);
    return libc_mem.set_chk(d, c, n, room);
}

MEMOPS_API void *__memset_chk(void *d, int c, size_t n, size_t room) {
    if (hak_unlikely(chk_on)) return memset_chk_checked(d, c, n, room);
    return libc_mem.set_chk(d, c, n, room);
}

static HAK_COLD char *strcpy_chk_checked(char *d, const char *s, size_t room) {
    size_t n = memops_str(s);
    memops_check("strcpy", d, n, s, n);
    return libc_mem.str_cpy_chk(d, s, room);
}

MEMOPS_API char *__strcpy_chk(char *d, const char *s, size_t room) {
    if (hak_unlikely(chk_on)) return strcpy_chk_checked(d, s, room);
    return libc_mem.str_cpy_chk(d, s, room);
}

static HAK_COLD char *stpcpy_chk_checked(char *d, const char *s, size_t room) {
    size_t n = memops_str(s);
    memops_check("stpcpy", d, n, s, n);
    return libc_mem.stp_cpy_chk(d, s, room);
}

MEMOPS_API char *__stpcpy_chk(char *d, const char *s, size_t room) {
    if (hak_unlikely(chk_on)) return stpcpy_chk_checked(d, s, room);
    return libc_mem.stp_cpy_chk(d, s, room);
}

static HAK_COLD char *strcat_chk_checked(char *d, const char *s, size_t room) {
    size_t n = memops_str(s);
    memops_check("strcat", d + strlen(d), n, s, n);
    return libc_mem.str_cat_chk(d, s, room);
}

MEMOPS_API char *__strcat_chk(char *d, const char *s, size_t room) {
    if (hak_unlikely(chk_on)) return strcat_chk_checked(d, s, room);
    return libc_mem.str_cat_chk(d, s, room);
}

static HAK_COLD char *strncpy_chk_checked(char *d, const char *s, size_t n, size_t room) {
    memops_check("strncpy", d, n, s, strnlen(s, n));
    return libc_mem.str_ncpy_chk(d, s, n, room);
}

MEMOPS_API char *__strncpy_chk(char *d, const char *s, size_t n, size_t room) {
    if (hak_unlikely(chk_on)) return strncpy_chk_checked(d, s, n, room);
    return libc_mem.str_ncpy_chk(d, s, n, room);
}

#endif
