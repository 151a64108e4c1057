/* The C library's memory and string copies: what hakmem's exported memcpy,
 * memset, strcpy and the rest (front/memops.c) forward to once they have
 * checked a range, and what hakmem's own code calls on heap memory that is
 * no live block (a slot being zeroed), where the exported ones would
 * object. Found at start-up (libc_resolve); until then byte loops stand in,
 * for whatever copies before the library's constructor runs. */
#ifndef HAK_LIBC_H
#define HAK_LIBC_H

#include "sizes.h"

#include <stddef.h>

struct libc_mem {
    void *(*cpy)(void *, const void *, size_t);
    void *(*pcpy)(void *, const void *, size_t);
    void *(*move)(void *, const void *, size_t);
    void *(*set)(void *, int, size_t);
    char *(*str_cpy)(char *, const char *);
    char *(*stp_cpy)(char *, const char *);
    char *(*str_cat)(char *, const char *);
    char *(*str_ncpy)(char *, const char *, size_t);
    /* glibc's fortified forms (_FORTIFY_SOURCE): the last argument is the
     * destination's size as the compiler knows it. */
    void *(*cpy_chk)(void *, const void *, size_t, size_t);
    void *(*pcpy_chk)(void *, const void *, size_t, size_t);
    void *(*move_chk)(void *, const void *, size_t, size_t);
    void *(*set_chk)(void *, int, size_t, size_t);
    char *(*str_cpy_chk)(char *, const char *, size_t);
    char *(*stp_cpy_chk)(char *, const char *, size_t);
    char *(*str_cat_chk)(char *, const char *, size_t);
    char *(*str_ncpy_chk)(char *, const char *, size_t, size_t);
};
extern HAK_HIDDEN struct libc_mem libc_mem;

/* The C library's mallopt, for its answer to a parameter (front/glibc.c:
 * glibc's answers differ between its versions); NULL in a static program. */
extern HAK_HIDDEN int (*libc_mallopt)(int param, int value);

/* Look the C library's up (the definitions after hakmem's), these and
 * libc_mallopt: run as a constructor of its own, where dlsym is safe. */
void libc_resolve(void);

#endif
