/* The out-of-memory policy: trim every cache and try once more, and a
 * small block's last resort, a mapping of its own. */
#include "front/internal.h"

#include "box/os.h"

#include <errno.h>

/* Out of memory: a request the OS refused may succeed once every cache has
 * given its memory back (a program that freed much of one size and now
 * wants another, under an address-space limit or a full commit charge).
 * After a NULL with errno ENOMEM, when an OS call of this thread was refused
 * since the last look (not for an impossible size, which no trim helps),
 * trim; true when that gave memory back: the caller tries once more, and
 * only once (a retry that fails again does not trim again: it could go on
 * giving back and taking the same reservation). errno is left as it was. */
HAK_HIDDEN __thread bool front_retrying;

HAK_HIDDEN __attribute__((cold, noinline)) bool front_retry(void) {
    if (errno != ENOMEM || front_retrying || os_take_refusals() == 0) return false;
    bool any = front_trim() != 0;
    errno = ENOMEM;
    front_retrying = any;
    return any;
}

/* A small block (class cls) its tier could not serve: after every cache gave
 * its memory back (when the OS refused something: an address-space limit
 * nearly reached), the tier again; the last resort is a mapping of the
 * block's own, which may still fit where the tiers' chunks, bundles and
 * SuperSlabs (megabytes) do not. (Not the other way round: the last resort
 * would cut cached Large mappings into a region per small block.) */
HAK_HIDDEN __attribute__((cold, noinline)) void *front_small_failed(uint32_t cls) {
    size_t n = small_class_size[cls];
    if (front_retry()) {
        void *p = front_malloc(n); /* failing, the last resort: this without the retry */
        front_retrying = false;
        return p;
    }
    return large_alloc(n, HAK_MIN_ALIGN, false);
}

HAK_HIDDEN __attribute__((noinline)) void *front_large_miss(size_t n) {
    void *p;
    FRONT_TRY(p, p == NULL, front_large(n, HAK_MIN_ALIGN, false));
    return p;
}
