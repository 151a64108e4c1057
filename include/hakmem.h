/* hakmem — public API.
 *
 * Programs that link hakmem (-lhakmem) get the standard allocation functions
 * (malloc, free, ...) replaced process-wide; the hak_-prefixed functions below
 * are the same entry points under names that never collide with libc, for
 * programs that want to call hakmem explicitly. */
#ifndef HAKMEM_H
#define HAKMEM_H

#include <malloc.h> /* struct mallinfo2, struct mallinfo */
#include <stddef.h>
#include <stdio.h> /* FILE */

#define HAKMEM_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

void *hak_malloc(size_t size);
void hak_free(void *ptr);
void *hak_calloc(size_t nmemb, size_t size);
void *hak_realloc(void *ptr, size_t size);
void *hak_reallocarray(void *ptr, size_t nmemb, size_t size);
int hak_posix_memalign(void **out, size_t alignment, size_t size);
void *hak_aligned_alloc(size_t alignment, size_t size);
void *hak_memalign(size_t alignment, size_t size);
void *hak_valloc(size_t size);
void *hak_pvalloc(size_t size);
size_t hak_malloc_usable_size(void *ptr);
void hak_free_sized(void *ptr, size_t size);
void hak_free_aligned_sized(void *ptr, size_t alignment, size_t size);
int hak_malloc_trim(size_t pad);
void hak_malloc_stats(void);
struct mallinfo2 hak_mallinfo2(void);
/* glibc's tuning and introspection calls, for hakmem's heap (docs/CONFIG.md,
 * mallopt): every glibc parameter accepted with glibc's answer. */
int hak_mallopt(int param, int value);
struct mallinfo hak_mallinfo(void); /* mallinfo2's figures, each at most INT_MAX */
int hak_malloc_info(int options, FILE *fp);

/* The stats as one JSON object (docs/CONFIG.md, HAKMEM_STATS=json), at any
 * time, from any thread, with snprintf's contract: returns the length of
 * the whole object (without the terminating NUL) and writes at most len
 * bytes into buf, NUL-terminated when len > 0, so a first call with len 0
 * gives the size a buffer needs. Never allocates. */
int hak_stats_json(char *buf, size_t len);

/* Heap profiler (HAKMEM_PROF=1): write the sampled allocations in use now,
 * as estimates, in the heap-profile format pprof reads (`google-pprof
 * --text PROGRAM FILE`) to `path`, or with path NULL to HAKMEM_PROF_FILE
 * ("%p" in either: the process id). 0, or -1 with errno set (EINVAL: the
 * profiler is off; ENAMETOOLONG: the path, expanded, is 4096 bytes or more;
 * EDEADLK: the profiler's records stayed locked for a second, as when the
 * caller interrupted a sample, in a signal handler). A cancellation point,
 * at its end only: a cancel never cuts a dump short. */
int hak_prof_dump(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* HAKMEM_H */
