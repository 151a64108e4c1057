/* Stack walker for the heap profiler.
 *
 * It reads each function's call-frame information (.eh_frame, found through
 * the object's .eh_frame_hdr search table) as libgcc's unwinder does, but
 * keeps the rule it finds for each return address: after the first sample
 * through a call site, walking its frame is a table lookup and two loads,
 * where libgcc searches for the function and runs its CFA program again;
 * and a walk that starts where the thread's last one did and finds the same
 * words on the stack where that one read them (return addresses, saved
 * %rbp it used) is that walk again, a compare per frame.
 *
 * Rules it does not read (DWARF expressions, signal frames, a CFA kept in a
 * register other than %rsp or %rbp, other architectures), code outside any
 * loaded object, and stacks other than the thread's own (a coroutine's, a
 * signal stack) make unwind_stack fail, and the caller uses glibc's
 * backtrace() for that sample. It reads only the calling thread's stack,
 * between its stack pointer and the top of its stack. Rules for code in
 * objects loaded since it started are kept per generation of loaded objects:
 * after a library is unloaded, none kept before is used again. */
#ifndef HAK_UNWIND_H
#define HAK_UNWIND_H

#include <stdbool.h>

/* Map the table of rules; false if there is no memory for it. Notes the
 * objects loaded at start-up, which stay loaded (their frames need no
 * generation). */
bool unwind_start(void);

/* Up to max return addresses, starting with the one into the caller of
 * unwind_stack (as backtrace()); the number written, or -1 if the walk met a
 * frame it cannot read (then pc[] holds nothing of use). A walk through code
 * loaded since unwind_start asks the loader for its count of unloaded objects
 * (dl_iterate_phdr, a lock held for a moment); a thread's first walk asks glibc for its stack's
 * bounds (pthread_getattr_np, which may allocate: call it where an allocation does not recurse); a
 * return address seen for the first time costs a search of its object's tables (_dl_find_object,
 * lock-free). Nothing else allocates or locks. */
int unwind_stack(void **pc, int max);

#endif
