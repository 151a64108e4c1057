/* Stack walker for the heap profiler.
 *
 * It reads each function's call-frame information (.eh_frame, found through
 * the object's .eh_frame_hdr search table) as libgcc's unwinder does, but
 * keeps the rule it finds for each return address: after the first sample
 * through a call site, walking its frame is a table lookup and two loads,
 * where libgcc searches for the function and runs its CFA program again.
 *
 * Rules it does not read (DWARF expressions, signal frames, a CFA kept in a
 * register other than %rsp or %rbp, other architectures) make unwind_stack
 * fail, and the caller uses glibc's backtrace() for that sample. It reads
 * only the calling thread's stack, between its stack pointer and the top of
 * its stack; where that top is not known, it fails too. */
#ifndef HAK_UNWIND_H
#define HAK_UNWIND_H

#include <stdbool.h>

/* Map the table of rules; false if there is no memory for it. */
bool unwind_start(void);

/* Up to max return addresses, starting with the one into the caller of
 * unwind_stack (as backtrace()); the number written, or -1 if the walk met a
 * frame it cannot read (then pc[] holds nothing of use). It never allocates
 * and takes no lock; a return address seen for the first time costs a search
 * of its object's tables (glibc's _dl_find_object, which is lock-free). */
int unwind_stack(void **pc, int max);

#endif
