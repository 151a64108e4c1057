/* Force-included (-include) into the tests of the ThreadSanitizer build,
 * whose library exports only the hak_ names: TSan's own malloc serves its
 * runtime and cmocka, and the tests' allocation calls go to hakmem under
 * these names. Declarations in <stdlib.h> and <malloc.h> are renamed too,
 * so they declare the hak_ functions with glibc's prototypes. */
#ifndef HAK_TEST_NAMES_H
#define HAK_TEST_NAMES_H

/* For the few tests TSan cannot host: RSS measurements (its shadow memory
 * grows with the program's) and address-space limits (it reserves terabytes). */
#define HAK_TEST_TSAN 1

#define malloc             hak_malloc
#define free               hak_free
#define calloc             hak_calloc
#define realloc            hak_realloc
#define reallocarray       hak_reallocarray
#define posix_memalign     hak_posix_memalign
#define aligned_alloc      hak_aligned_alloc
#define memalign           hak_memalign
#define valloc             hak_valloc
#define pvalloc            hak_pvalloc
#define malloc_usable_size hak_malloc_usable_size
#define free_sized         hak_free_sized
#define free_aligned_sized hak_free_aligned_sized
#define malloc_trim        hak_malloc_trim
#define malloc_stats       hak_malloc_stats
#define mallinfo2          hak_mallinfo2
#define mallopt            hak_mallopt
#define malloc_info        hak_malloc_info
/* (function-like: `struct mallinfo` keeps its name) */
#define mallinfo(...) hak_mallinfo(__VA_ARGS__)

#endif
