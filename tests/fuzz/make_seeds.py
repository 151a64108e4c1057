#!/usr/bin/env python3
"""Generate the seed corpora and the dictionary of the hakmem fuzz targets.

    tests/fuzz/make_seeds.py            # rewrites tests/fuzz/corpus/* and tests/fuzz/dict

The encoder mirrors the decoder in tests/fuzz/fuzz_model.h (fz_step, fz_size,
fz_align, fz_calloc_args); keep the two in step. Seeds are small programs that
together reach every operation, every tier and tier edge (+-1), the size
classes, impossible sizes, valid and invalid alignments, the worker thread and
fault windows. fuzz_badptr seeds are a 6-byte header (case, fn, target,
offset, flags) and a short program. Output is deterministic.
"""
import os
import random
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- operations (enum fz_op) -------------------------------------------------
(OP_MALLOC, OP_CALLOC, OP_REALLOC, OP_REALLOC0, OP_REALLOCARRAY, OP_ALIGNED_ALLOC,
 OP_POSIX_MEMALIGN, OP_MEMALIGN, OP_VALLOC, OP_PVALLOC, OP_FREE, OP_FREE_SIZED,
 OP_FREE_ALIGNED_SIZED, OP_USABLE, OP_TRIM, OP_W_FREE, OP_W_REALLOC, OP_W_ALLOC, OP_W_EXIT,
 OP_FAULT_ARM, OP_FAULT_DISARM, OP_MALLINFO, OP_CHECK_ALL, OP_MALLOC_SMALL) = range(24)

KiB = 1024
MiB = 1024 * KiB

SMALL_CLASSES = [
    16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896,
    1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288,
    14336, 16384, 20480, 24576, 28672, 32768, 40960, 49152, 53248, 57344, 65536, 81920, 98304,
    114688, 131072, 163840, 196608, 229376, 262144, 327680, 393216, 458752, 524288, 655360,
    786432, 917504, 1048576,
]
# fz_huge[] in fuzz_model.h, by index
HUGE_SIZE_MAX, HUGE_PTRDIFF_MAX_PLUS1, HUGE_PTRDIFF_MAX, HUGE_1_47, HUGE_1_40 = 0, 3, 5, 13, 15
# fz_align's table of odd alignments, by index
ODD_ALIGN_ZERO, ODD_ALIGN_3, ODD_ALIGN_24, ODD_ALIGN_SIZE_MAX, ODD_ALIGN_HALF_PLUS1 = 0, 3, 10, 14, 16


def u16(v):
    return struct.pack("<H", v & 0xFFFF)


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def size(n):
    """Exact size n (<= 64 MiB): mode 0 below 256, else mode 4 (log + offset)."""
    if n < 256:
        return bytes([0, n])
    lg = n.bit_length() - 1
    assert lg < 26, n
    return bytes([4, lg]) + u32(n - (1 << lg))


def size_class(idx, delta=0):
    """Size class idx +- delta (mode 2)."""
    return bytes([2, idx, delta + 3])


def size_huge(idx):
    return bytes([8, idx])


def align_pow2(k):
    return bytes([2, k])


def align_odd(idx):
    return bytes([4, idx])


def align_raw(v):
    return bytes([5, 0]) + u16(v)


def op(code, slot, *args):
    return bytes([code, slot]) + b"".join(args)


def malloc(slot, n):
    return op(OP_MALLOC, slot, size(n))


def calloc(slot, nmemb, sz_bytes):
    """calloc mode 3: (a, b) both explicit sizes."""
    return op(OP_CALLOC, slot, bytes([3]), nmemb, sz_bytes)


def calloc1(slot, n):
    return op(OP_CALLOC, slot, bytes([0]), size(n))


def realloc(slot, n):
    return op(OP_REALLOC, slot, size(n))


def realloc0(slot):
    return op(OP_REALLOC0, slot)


def reallocarray(slot, a_bytes, b_bytes):
    return op(OP_REALLOCARRAY, slot, bytes([3]), a_bytes, b_bytes)


def aligned(code, slot, al, n_bytes):
    return op(code, slot, al, n_bytes)


def free(slot, how=0):
    return op((OP_FREE, OP_FREE_SIZED, OP_FREE_ALIGNED_SIZED)[how], slot)


def usable(slot):
    return op(OP_USABLE, slot)


def trim():
    return op(OP_TRIM, 0)


def w_free(slot, how=0):
    return op(OP_W_FREE, slot, bytes([how]))


def w_realloc(slot, n):
    return op(OP_W_REALLOC, slot, size(n))


def w_malloc(slot, n):
    return op(OP_W_ALLOC, slot, bytes([0]), size(n))


def w_calloc(slot, n):
    return op(OP_W_ALLOC, slot, bytes([1, 0]), size(n))


def w_memalign(slot, k, n):
    return op(OP_W_ALLOC, slot, bytes([2]), align_pow2(k), size(n))


def w_exit():
    return op(OP_W_EXIT, 0)


COUNTS = [1, 1, 1, 2, 2, 3, 4, 6, 8, 16, 64, "all"]


def fault_arm(skip, count_idx):
    return op(OP_FAULT_ARM, 0, bytes([skip, count_idx]))


def fault_disarm():
    return op(OP_FAULT_DISARM, 0)


def mallinfo():
    return op(OP_MALLINFO, 0)


def check_all():
    return op(OP_CHECK_ALL, 0)


EDGES = [0, 1, 15, 16, 17, 1023, 1024, 1025, 8191, 8192, 8193, 53247, 53248, 53249,
         MiB - 1, MiB, MiB + 1, 2 * MiB - 64, 2 * MiB, 2 * MiB + 1]

# ---- fuzz_api seeds -------------------------------------------------------------


def api_seeds():
    s = {}
    # every tier edge +-1, one slot each, then realloc across the edges
    prog = b"".join(malloc(i, n) for i, n in enumerate(EDGES))
    prog += b"".join(usable(i) for i in range(len(EDGES)))
    prog += b"".join(realloc(i, EDGES[(i + 3) % len(EDGES)]) for i in range(len(EDGES)))
    prog += b"".join(free(i, i % 3) for i in range(len(EDGES)))
    s["tier_edges"] = prog
    # every size class -1, exact, +1
    for part, lo, hi in (("tiny", 0, 20), ("tiny8k", 20, 32), ("pool", 32, 43), ("l25", 43, 61)):
        prog = b""
        slot = 0
        for c in range(lo, hi):
            for d in (-1, 0, 1):
                prog += op(OP_MALLOC, slot % 64, size_class(c, d))
                slot += 1
        prog += check_all() + trim()
        s["classes_" + part] = prog
    # Large: BigCache class edges, reuse after free, mremap growth and shrink
    prog = b""
    for i, n in enumerate([MiB + 1, 2 * MiB - 64, 2 * MiB - 63, 5 * MiB // 4 - 64, 3 * MiB, 7 * MiB + 4096]):
        prog += malloc(i, n)
    prog += free(1) + malloc(10, 2 * MiB - 100) + free(2) + calloc1(11, 2 * MiB - 64)
    prog += realloc(0, 9 * MiB) + realloc(3, 2 * MiB) + realloc(4, MiB + 7) + realloc(5, 40 * MiB)
    prog += realloc(5, 3 * MiB) + realloc(10, 100) + trim()
    s["large"] = prog
    # realloc: growth from 16 B to 48 MiB by 1.5x, then shrink by halves, to 0, from NULL
    prog = realloc(0, 0)
    n = 16
    while n < 48 * MiB:
        prog += realloc(0, n)
        n = n * 3 // 2 + 1
    while n > 8:
        n //= 2
        prog += realloc(0, n)
    prog += realloc0(0) + realloc(1, 5000) + realloc0(1) + realloc(2, 0)
    s["realloc_growth"] = prog
    prog = b""
    for i, n in enumerate([100, 5000, 20000, 200000, 3 * MiB]):
        prog += malloc(i, n) + realloc(i, n * 4) + realloc(i, n // 8) + realloc(i, n) + usable(i)
    s["realloc_tiers"] = prog
    # calloc: every tier, reused memory (malloc, free, calloc of the same size), overflow
    prog = b""
    for i, n in enumerate([1, 100, 1024, 4000, 8192, 20000, 53248, 100000, MiB, 3 * MiB]):
        prog += malloc(i, n) + free(i) + calloc1(i, n)
    prog += calloc(20, size_huge(HUGE_SIZE_MAX), size(2)) + calloc(21, size(1 << 25), size(1 << 25))
    prog += calloc(22, size(0), size_huge(HUGE_SIZE_MAX)) + calloc(23, size(3), size(5))
    prog += op(OP_CALLOC, 24, bytes([2, 7]), size(70000))
    s["calloc"] = prog
    # reallocarray: growth, overflow (block kept), 0 (frees)
    prog = malloc(0, 100) + reallocarray(0, size(10), size(100)) + reallocarray(0, size(1 << 20), size(1 << 20))
    prog += reallocarray(0, size_huge(HUGE_SIZE_MAX), size(16)) + reallocarray(0, size(3), size(20000))
    prog += reallocarray(0, size(0), size(5)) + reallocarray(1, size(4), size(4))
    s["reallocarray"] = prog
    # aligned allocators: valid and invalid alignments, every tier
    for name, code in (("aligned_alloc", OP_ALIGNED_ALLOC), ("posix_memalign", OP_POSIX_MEMALIGN),
                       ("memalign", OP_MEMALIGN)):
        prog = b""
        slot = 0
        for k in (0, 3, 4, 5, 6, 7, 9, 12, 13, 16, 20, 21, 22):
            for n in (1, 100, 3000, 9000, 60000, 700000, 2 * MiB):
                prog += aligned(code, slot % 64, align_pow2(k), size(n))
                slot += 1
        for idx in (ODD_ALIGN_ZERO, ODD_ALIGN_3, ODD_ALIGN_24, ODD_ALIGN_SIZE_MAX, ODD_ALIGN_HALF_PLUS1):
            prog += aligned(code, slot % 64, align_odd(idx), size(100))
            slot += 1
        prog += aligned(code, 1, align_raw(100), size(5000)) + aligned(code, 2, align_pow2(63), size(1))
        prog += aligned(code, 3, align_pow2(30), size(10)) + aligned(code, 4, align_pow2(6), size_huge(HUGE_PTRDIFF_MAX))
        prog += free(5, 2) + free(6, 2)
        s[name] = prog
    prog = b""
    for i, n in enumerate([0, 1, 4095, 4096, 4097, 60000, MiB, 3 * MiB]):
        prog += op(OP_VALLOC, i, size(n)) + op(OP_PVALLOC, i + 10, size(n))
    prog += op(OP_PVALLOC, 30, size_huge(HUGE_PTRDIFF_MAX)) + op(OP_VALLOC, 31, size_huge(HUGE_SIZE_MAX))
    s["valloc_pvalloc"] = prog
    # impossible and huge sizes
    prog = b"".join(op(OP_MALLOC, i, size_huge(i)) for i in range(20))
    prog += op(OP_REALLOC, 0, size_huge(HUGE_PTRDIFF_MAX_PLUS1)) + malloc(1, 100)
    prog += op(OP_REALLOC, 1, size_huge(HUGE_SIZE_MAX)) + op(OP_REALLOC, 1, size_huge(HUGE_1_40))
    prog += op(OP_REALLOC, 1, size_huge(HUGE_1_47))
    s["huge"] = prog
    # free variants, free(NULL), usable(NULL), mallinfo, trim
    prog = free(0) + free(1, 1) + free(2, 2) + usable(3) + mallinfo()
    prog += malloc(0, 64) + calloc1(1, 64) + aligned(OP_ALIGNED_ALLOC, 2, align_pow2(6), size(64))
    prog += free(0, 1) + free(1, 1) + free(2, 2) + trim() + mallinfo()
    s["free_variants"] = prog
    # worker: allocates, main frees; main allocates, worker frees/reallocs; exit and restart
    prog = b""
    for i, n in enumerate([32, 1000, 5000, 20000, 100000, 3 * MiB]):
        prog += w_malloc(i, n)
    prog += w_calloc(6, 700) + w_memalign(7, 12, 9000)
    prog += w_exit()
    prog += b"".join(free(i) for i in range(8))
    for i, n in enumerate([32, 1000, 5000, 20000, 100000, 3 * MiB]):
        prog += malloc(10 + i, n)
    prog += b"".join(w_free(10 + i, i % 3) for i in range(3))
    prog += b"".join(w_realloc(13 + i, 7777 * (i + 1)) for i in range(3))
    prog += w_exit() + trim()
    s["worker"] = prog
    # remote frees into an exited thread's slabs, orphan adoption
    prog = b"".join(w_malloc(i, 48) for i in range(40)) + w_exit()
    prog += b"".join(free(i) for i in range(0, 40, 2)) + b"".join(malloc(40 + i, 48) for i in range(10))
    prog += trim() + b"".join(free(i) for i in range(1, 40, 2))
    s["orphans"] = prog
    # faults: a window over each tier's first mapping, realloc under faults, trim under faults
    for skip in (0, 1, 2, 3, 5, 8):
        prog = trim() + fault_arm(skip, 3)
        for i, n in enumerate([16, 2000, 20000, 200000, 3 * MiB]):
            prog += malloc(i, n)
        prog += fault_disarm()
        s["faults_alloc_%d" % skip] = prog
    prog = malloc(0, 100) + malloc(1, 200000) + malloc(2, 3 * MiB) + fault_arm(0, 11)
    prog += realloc(0, 60000) + realloc(1, 2 * MiB) + realloc(2, 20 * MiB) + calloc1(3, 5 * MiB)
    prog += fault_disarm() + realloc(2, 30 * MiB)
    s["faults_realloc"] = prog
    prog = b"".join(malloc(i, 70000 * (i + 1)) for i in range(8)) + b"".join(free(i) for i in range(8))
    prog += fault_arm(0, 8) + trim() + fault_disarm() + b"".join(malloc(i, 70000 * (i + 1)) for i in range(8))
    s["faults_trim"] = prog
    prog = fault_arm(1, 5) + w_malloc(0, 20000) + w_malloc(1, 300000) + w_exit() + free(0) + free(1)
    s["faults_worker"] = prog
    # more than L25_EMPTY_MAX (4) empty bundles in one shard: the oldest are unmapped
    prog = b"".join(malloc(i, 250000) for i in range(48)) + b"".join(free(i) for i in range(48))
    prog += b"".join(malloc(i, 250000) for i in range(8))
    s["l25_empty_bundles"] = prog
    # random mixes (deterministic)
    rnd = random.Random(1234)
    for k in range(6):
        prog = b""
        for _ in range(60):
            c = rnd.randrange(24)
            slot = rnd.randrange(16)
            n = rnd.choice([rnd.randrange(1025), rnd.randrange(8193), rnd.randrange(60000),
                            rnd.randrange(MiB), rnd.randrange(8 * MiB)])
            if c in (OP_MALLOC, OP_REALLOC, OP_VALLOC, OP_PVALLOC, OP_W_REALLOC):
                prog += op(c, slot, size(n))
            elif c in (OP_CALLOC, OP_REALLOCARRAY):
                prog += op(c, slot, bytes([0]), size(n))
            elif c in (OP_ALIGNED_ALLOC, OP_POSIX_MEMALIGN, OP_MEMALIGN):
                prog += op(c, slot, align_pow2(rnd.randrange(4, 22)), size(n))
            elif c == OP_W_ALLOC:
                prog += op(c, slot, bytes([0]), size(n))
            elif c == OP_W_FREE:
                prog += op(c, slot, bytes([rnd.randrange(3)]))
            elif c == OP_FAULT_ARM:
                prog += op(c, slot, bytes([rnd.randrange(16), rnd.randrange(9)]))
            elif c == OP_MALLOC_SMALL:
                prog += op(c, slot, u16(rnd.randrange(1025)))
            else:
                prog += op(c, slot)
        s["mix_%d" % k] = prog
    return s


# ---- fuzz_badptr seeds -----------------------------------------------------------
C_INTERIOR, C_FOREIGN, C_FREED, C_DOUBLE, C_XTHREAD, C_NEAR = range(6)
B_FREE, B_FREE_SIZED, B_FREE_ALIGNED_SIZED, B_REALLOC, B_USABLE = range(5)


def hdr(case, fn, target=0, off=0, flags=0):
    return bytes([case, fn, target]) + u16(off) + bytes([flags])


def badptr_seeds():
    s = {}
    tiers = malloc(0, 64) + malloc(1, 3000) + malloc(2, 20000) + malloc(3, 200000) + malloc(4, 3 * MiB)
    for fn in range(5):
        s["interior_fn%d" % fn] = hdr(C_INTERIOR, fn, fn, 0x1234, 2 if fn % 2 else 0) + tiers
    for sub in range(8):
        flags = sub << 1 | (sub & 1)
        if sub == 7:
            flags |= 0x80
        s["foreign_%d" % sub] = hdr(C_FOREIGN, sub % 5, 0, 40, flags) + tiers
    freed = tiers + free(2) + free(3) + free(4) + w_malloc(5, 30000) + w_free(5)
    for t in range(4):
        s["freed_%d" % t] = hdr(C_FREED, t, t, 0, t & 1) + freed
    s["freed_trim"] = hdr(C_FREED, 0, 1, 0, 0) + freed + trim()
    for t in range(5):
        s["double_%d" % t] = hdr(C_DOUBLE, t % 3, t, 0, t & 1) + tiers
    s["double_worker_tiny"] = hdr(C_DOUBLE, B_FREE, 0, 0, 1) + malloc(0, 32)
    s["double_remote_tiny"] = hdr(C_DOUBLE, B_FREE, 0, 0, 0) + w_malloc(0, 32)
    for t in range(4):
        s["xthread_%d" % t] = hdr(C_XTHREAD, t, t, 0, t & 1) + tiers
    for t in range(5):
        s["near_%d" % t] = hdr(C_NEAR, t % 5, t, (-(t + 1)) & 0xFFFF if t % 2 else t + 1, 2 if t > 2 else 0) + tiers
    s["faults_then_freed"] = hdr(C_FREED, 0, 0, 0, 0) + fault_arm(0, 4) + tiers + free(3) + fault_disarm()
    return s


def write(dirname, seeds):
    if os.path.isdir(dirname):
        shutil.rmtree(dirname)
    os.makedirs(dirname)
    total = 0
    for name, data in sorted(seeds.items()):
        with open(os.path.join(dirname, name), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def dict_entries():
    """libFuzzer dictionary: whole operations on exact sizes at the edges."""
    out = []
    for n in sorted(set(EDGES + [MiB + 4096, 2 * MiB + 4096, 4 * MiB - 64])):
        out.append(("malloc_%d" % n, malloc(0, n)[1:]))  # slot byte + size: splices after an op byte
        out.append(("size_%d" % n, size(n)))
    for i in (0, 3, 5, 13):
        out.append(("huge_%d" % i, size_huge(i)))
    for k in (4, 6, 12, 21, 30, 63):
        out.append(("align_2^%d" % k, align_pow2(k)))
    out.append(("fault_arm", fault_arm(0, 3)))
    out.append(("fault_disarm", fault_disarm()))
    out.append(("worker_exit", w_exit()))
    out.append(("trim", trim()))
    return out


def main():
    api = write(os.path.join(HERE, "corpus", "fuzz_api"), api_seeds())
    bad = write(os.path.join(HERE, "corpus", "fuzz_badptr"), badptr_seeds())
    with open(os.path.join(HERE, "dict"), "w") as f:
        f.write("# libFuzzer dictionary for tests/fuzz (generated by make_seeds.py)\n")
        for name, data in dict_entries():
            f.write('%s="%s"\n' % (name, "".join("\\x%02x" % b for b in data)))
    print("fuzz_api: %d seeds, %d bytes; fuzz_badptr: %d seeds, %d bytes"
          % (len(api_seeds()), api, len(badptr_seeds()), bad))


if __name__ == "__main__":
    sys.exit(main())
