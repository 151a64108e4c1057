/* Tier boundaries and shared geometry: every size has exactly one tier, and
 * every constant that decides which lives here. */
#ifndef HAK_SIZES_H
#define HAK_SIZES_H

#include <stddef.h>
#include <stdint.h>

#define HAK_PAGE_SIZE ((size_t)4096)

/* The region map's granularity; every mapping hakmem makes starts on a region
 * boundary, so a region belongs to at most one mapping. */
#define HAK_REGION_SHIFT 21
#define HAK_REGION_SIZE  ((size_t)1 << HAK_REGION_SHIFT)

/* ---- Tier edges: every size has exactly one tier ------------------------
 *
 * Requests up to HAK_SMALL_MAX are size-classed (sizeclass.h maps a size to
 * one of SMALL_NCLASSES classes); each size-classed tier owns a run of
 * classes, and the bytes they serve end where its last class does:
 *
 *   tier   classes                       bytes              blocks live in
 *   Tiny   0 .. TINY_NCLASSES-1          0 .. TINY_MAX      SuperSlab slabs
 *   Pool   POOL_FIRST .. POOL_END-1      .. POOL_MAX        per-thread arena chunks
 *   L2.5   L25_FIRST .. SMALL_NCLASSES-1 .. HAK_SMALL_MAX   bundles
 *   Large  none                          above              a mapping each
 *
 * L2.5 also keeps bundles of every other class: for aligned requests, a
 * thread that may not cache, and a tier out of memory (front/api.c). */
#define SMALL_NCLASSES 61
#define TINY_NCLASSES  32 /* 16 B .. 8 KiB */
#define POOL_FIRST     TINY_NCLASSES
#define POOL_END       43u /* 10 KiB .. 52 KiB */
#define L25_FIRST      POOL_END
#define TINY_MAX       ((size_t)8192)
#define POOL_MAX       ((size_t)53248)
#define HAK_SMALL_MAX  ((size_t)1 << 20)

/* Every block is at least this aligned (max_align_t). */
#define HAK_MIN_ALIGN ((size_t)16)

/* Largest request that can ever succeed, as glibc: PTRDIFF_MAX. */
#define HAK_MAX_REQUEST ((size_t)PTRDIFF_MAX)

/* Hot-path helpers: inlined whatever the compiler's size heuristics say. */
#define HAK_INLINE static inline __attribute__((always_inline))

/* For extern declarations of globals read on hot paths: -fvisibility=hidden
 * covers definitions only, and without this the compiler reaches an extern
 * variable through the GOT (one more instruction per access). */
#define HAK_HIDDEN __attribute__((visibility("hidden")))

/* A relaxed read, on a hot path, of a word another thread may write at
 * once: a plain read, which the compiler folds into the instruction using
 * it (it keeps an atomic or volatile load a separate instruction: one more
 * per use), and which x86-64 makes atomic for an aligned word anyway; under
 * ThreadSanitizer an atomic load, so that the race is seen as intended.
 * Written with __atomic_store_n; the object itself is a plain type. */
#if defined(__SANITIZE_THREAD__)
#define HAK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HAK_TSAN 1
#endif
#endif
#ifdef HAK_TSAN
#define hak_peek(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#else
#define hak_peek(x) (x)
#endif

#define hak_likely(x)   __builtin_expect(!!(x), 1)
#define hak_unlikely(x) __builtin_expect(!!(x), 0)

static inline size_t hak_align_up(size_t n, size_t a) {
    return (n + a - 1) & ~(a - 1);
}
static inline int hak_is_pow2(size_t a) {
    return a != 0 && (a & (a - 1)) == 0;
}

#endif
