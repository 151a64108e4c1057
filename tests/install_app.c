/* The program tests/check_install.sh and tests/check_deb.sh build against an
 * installed hakmem: it prints "112 1" when hakmem is its allocator. */
#include <hakmem.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    char *p = malloc(100), *q = hak_malloc(3 << 20);
    /* hakmem's usable size for a 100-byte request is its 112-byte class */
    printf("%zu %d\n", malloc_usable_size(p), q != NULL);
    hak_free(q);
    free(p);
    return 0;
}
