"""Allocate until MemoryError, free, allocate again; exit 0.

Run under a limit on the address space (`ulimit -v`) by tests/oom/run.sh.
    py_fill.py bytes     1 MiB bytearrays (each one malloc of 1 MiB + 1)
    py_fill.py objects   small str objects (with PYTHONMALLOC=malloc: one
                         malloc each, and the list's array grown by realloc)
Prints `unit U`, `round1 N`, `round2 N` (N in units U), then `done`.
For diagnosis, OOM_MAPS_DIR=DIR copies /proc/self/maps to DIR/python-MODE.N.maps
at each MemoryError (a few objects freed first, for the copy's own memory).
"""
import os
import sys

rounds = 0


def dump_maps(mode):
    global rounds
    rounds += 1
    d = os.environ.get("OOM_MAPS_DIR")
    if not d:
        return
    src = os.open("/proc/self/maps", os.O_RDONLY)
    dst = os.open("%s/python-%s.%d.maps" % (d, mode, rounds), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    while True:
        b = os.read(src, 65536)
        if not b:
            break
        os.write(dst, b)
    os.close(src)
    os.close(dst)


def fill_bytes():
    held = []
    try:
        while True:
            b = bytearray(1 << 20)
            b[0] = b[-1] = 1  # written: the memory is really there
            held.append(b)
    except MemoryError:
        pass
    n = len(held)
    k = 0
    while k < 4 and held:  # room for the check's own objects
        held.pop()
        k += 1
    dump_maps("bytes")
    ok = all(b[0] == 1 and b[-1] == 1 for b in held)
    held.clear()
    return n, ok


def fill_objects():
    held = []
    try:
        while True:
            held.append(str(len(held)) * 3)
    except MemoryError:
        pass
    n = len(held)
    k = 0
    while k < 200 and held:  # room for the check's own objects (small ints: no allocation)
        held.pop()
        k += 1
    dump_maps("objects")
    ok = all(held[i] == str(i) * 3 for i in range(0, len(held), 997))
    held.clear()
    return n, ok


def main():
    mode = sys.argv[1]
    fill = {"bytes": fill_bytes, "objects": fill_objects}[mode]
    print("unit", "MiB" if mode == "bytes" else "objects", flush=True)
    n1, ok1 = fill()
    print("round1", n1, flush=True)
    n2, ok2 = fill()
    print("round2", n2, flush=True)
    if not (ok1 and ok2):
        print("contents lost", flush=True)
        return 1
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
