/* OS boundary: the only module that calls mmap, munmap, madvise, mremap,
 * mprotect and mlock/munlock.
 * Every call is counted by kind so stats and tests can see the syscall traffic. */
#ifndef HAK_OS_H
#define HAK_OS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum os_call { OS_MMAP, OS_MUNMAP, OS_MADVISE, OS_MREMAP, OS_MPROTECT, OS_MLOCK, OS_NCALLS };

/* Anonymous read-write mapping of `size` bytes (a page multiple) whose start
 * is aligned to `align` (a power of two >= page). NULL when the OS refuses. */
void *os_map_aligned(size_t size, size_t align);
void os_unmap(void *p, size_t size);
/* Give the pages back; they read as zero when touched again. false (and
 * the pages kept, contents and all) when the OS refuses: locked pages
 * (mlockall). errno is left alone. */
bool os_decommit(void *p, size_t size);
/* Ask for transparent huge pages on [p, p+size); false when the kernel
 * refuses (THP off or unsupported), which changes nothing else. */
bool os_hugepages(void *p, size_t size);
/* Grow or shrink a mapping where it stands; false when the range beyond it
 * is taken (the mapping is then untouched). */
bool os_resize(void *p, size_t old_size, size_t new_size);
/* Move a mapping's pages onto dst (a mapping of new_size from os_map_aligned,
 * which it replaces), resizing it; no byte is copied. false when refused. */
bool os_move(void *p, size_t old_size, size_t new_size, void *dst);

/* Reserve address space: the largest power-of-two size from *size down to
 * min (both powers of two >= page) that the OS grants, aligned to `align` or
 * to its own size when that is smaller,
 * read-only and reading as zeros, costing no memory and no commit charge;
 * *size says what was granted. Under an address-space limit (RLIMIT_AS) no
 * more than an eighth of it is asked for, unless that is below min. NULL
 * when not even min is granted. */
void *os_reserve(size_t *size, size_t min, size_t align);
/* Make [p, p+size) inside a reservation readable and writable, zero-filled
 * (locked, if the program asked for all its memory locked). false, and
 * nothing changed, when the OS refuses. */
bool os_commit(void *p, size_t size);
/* Give [p, p+size) inside a reservation back to the OS: its pages go, the
 * addresses stay reserved, read-only and reading as zeros. */
void os_uncommit(void *p, size_t size);

uint64_t os_calls(enum os_call kind);

/* Fork child: what the parent learnt of mlockall does not hold there. */
void os_fork_child(void);

#endif
