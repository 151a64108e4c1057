#!/usr/bin/env python3
"""Content checks for tests/soak/redis.sh, over one plain RESP connection.

    redis_verify.py PORT write|check|churn|bench [KEYS]

write  sets KEYS (default 1200) keys soak:v:<i> to deterministic values of
       assorted sizes (16 B .. 1 MiB, every tier edge among them), read back.
check  reads every soak:v:<i> back and compares it byte for byte with what the
       last write/churn left (deleted keys must be gone).
churn  rewrites them: a third SET to a new size, a third grown with APPEND in
       pieces, a sixth changed in the middle with SETRANGE, a sixth deleted;
       then check.
bench  reads every key the benchmark wrote (key:*): each must be a string
       whose length is one of the value sizes the benchmark used, holding what
       redis-benchmark writes with -r (the first bytes of its fixed
       pseudo-random sequence, the same in every run).

Prints one line "verify: <mode> ok keys=N bytes=B" or "verify: <mode> FAIL
..." (exit 1). Values come from a 2 MiB random buffer at an offset derived from
(key, generation), so a value shifted, truncated, swapped with another key's
or partly stale differs. The expected state lives in $VERIFY_STATE (default
/tmp/hakmem-soak-verify-PORT.state) between calls.
"""
import os
import random
import socket
import sys

SEED = 20240501
BUF = random.Random(SEED).randbytes(2 << 20)
MIB = 1 << 20
EDGES = [16, 17, 44, 45, 1023, 1024, 1025, 4096, 8191, 8192, 8193, 16384, 53247, 53248,
         53249, 65536, 262144, 524288, MIB - 1, MIB]
BENCH_SIZES = {16, 64, 256, 1024, 4096, 16384, 65536, 262144, MIB}


class Redis:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.f = self.s.makefile("rb", buffering=1 << 20)

    @staticmethod
    def enc(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, int):
                a = str(a).encode()
            elif isinstance(a, str):
                a = a.encode()
            out.append(b"$%d\r\n" % len(a))
            out.append(a)
            out.append(b"\r\n")
        return b"".join(out)

    def reply(self):
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise IOError("connection closed (server died?)")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise IOError("server error: " + rest.decode(errors="replace"))
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            if len(data) != n + 2:
                raise IOError("short bulk reply")
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise IOError("bad reply line %r" % line[:80])

    def pipeline(self, cmds, batch_bytes=4 << 20):
        """Send commands in batches of about batch_bytes; the replies in order."""
        out, buf, pending = [], [], 0
        size = 0
        for c in cmds:
            b = self.enc(*c)
            buf.append(b)
            size += len(b)
            pending += 1
            if size >= batch_bytes or pending >= 1000:
                self.s.sendall(b"".join(buf))
                out.extend(self.reply() for _ in range(pending))
                buf, pending, size = [], 0, 0
        if pending:
            self.s.sendall(b"".join(buf))
            out.extend(self.reply() for _ in range(pending))
        return out


def sizes(n):
    r = random.Random(SEED + 1)
    out = []
    for i in range(n):
        if i < len(EDGES):
            out.append(EDGES[i])
        elif i % 50 == 0:
            out.append(r.randint(MIB // 2, MIB))  # a few big ones
        else:  # log-uniform 16 B .. 256 KiB
            out.append(int(16 * (2 ** (r.random() * 14))))
    return out


def value(i, gen, n):
    off = (i * 7919 + gen * 104729) % MIB
    return BUF[off:off + n]


def bench_value(n):
    """redis-benchmark's value with -r: genBenchmarkRandomData() from state 1234."""
    out = bytearray(n)
    s = 1234
    for i in range(n):
        s = (s * 1103515245 + 12345) & 0xFFFFFFFF
        out[i] = 48 + ((s >> 16) & 63)
    return bytes(out)


def key(i):
    return "soak:v:%d" % i


def state_file(port):
    return os.environ.get("VERIFY_STATE") or "/tmp/hakmem-soak-verify-%d.state" % port


def save_state(port, st):
    with open(state_file(port), "w") as f:
        for i, (gen, n, extra) in sorted(st.items()):
            f.write("%d %d %d %s\n" % (i, gen, n, extra))


def load_state(port):
    st = {}
    with open(state_file(port)) as f:
        for line in f:
            i, gen, n, extra = line.split()
            st[int(i)] = (int(gen), int(n), extra)
    return st


def expected(i, gen, n, extra):
    """The value key i must hold. extra: '-' (plain), 'd' (deleted),
    'r:<off>:<len>' (SETRANGE of generation gen+1 at off over a plain value)."""
    if extra == "d":
        return None
    v = value(i, gen, n)
    if extra.startswith("r:"):
        _, off, ln = extra.split(":")
        off, ln = int(off), int(ln)
        patch = value(i, gen + 1, ln)
        if off > len(v):
            v = v + b"\0" * (off - len(v))
        v = v[:off] + patch + v[off + ln:]
    return v


def check(r, st):
    keys = sorted(st)
    got = r.pipeline([("GET", key(i)) for i in keys])
    total = 0
    for i, g in zip(keys, got):
        want = expected(i, *st[i])
        if want is None:
            if g is not None:
                return "%s was deleted but reads back %d bytes" % (key(i), len(g))
            continue
        if g is None:
            return "%s (%d bytes) is missing" % (key(i), len(want))
        if g != want:
            pos = next((k for k in range(min(len(g), len(want))) if g[k] != want[k]),
                       min(len(g), len(want)))
            return "%s: %d bytes read, %d expected, first difference at byte %d" % (
                key(i), len(g), len(want), pos)
        total += len(g)
    return total


def main():
    port, mode = int(sys.argv[1]), sys.argv[2]
    nkeys = int(sys.argv[3]) if len(sys.argv) > 3 else 1200
    r = Redis(port)
    if mode == "write":
        st = {i: (1, n, "-") for i, n in enumerate(sizes(nkeys))}
        res = r.pipeline([("SET", key(i), value(i, 1, n)) for i, (_, n, _) in st.items()])
        if any(x != "OK" for x in res):
            return fail(mode, "SET did not answer OK")
        save_state(port, st)
        res = check(r, st)
    elif mode == "check":
        st = load_state(port)
        res = check(r, st)
    elif mode == "churn":
        st = load_state(port)
        rnd = random.Random(SEED + 2 + sum(g for g, _, _ in st.values()))
        fresh = sizes(nkeys)
        cmds = []
        for i in sorted(st):
            gen, n, extra = st[i]
            if extra == "d":  # deleted last time: back with a fresh value
                nn = fresh[i]
                cmds.append(("SET", key(i), value(i, gen + 2, nn)))
                st[i] = (gen + 2, nn, "-")
                continue
            x = rnd.random()
            ng = gen + 2
            if x < 1 / 3:  # new size
                nn = int(16 * (2 ** (rnd.random() * 16)))
                nn = min(nn, MIB)
                cmds.append(("SET", key(i), value(i, ng, nn)))
                st[i] = (ng, nn, "-")
            elif x < 2 / 3:  # grown in pieces: realloc of the string each time
                nn = min(MIB, max(16, n * 2 + rnd.randint(0, 4096)))
                v = value(i, ng, nn)
                step = max(1, nn // rnd.randint(2, 12))
                cmds.append(("SET", key(i), v[:step]))
                for o in range(step, nn, step):
                    cmds.append(("APPEND", key(i), v[o:o + step]))
                st[i] = (ng, nn, "-")
            elif x < 5 / 6 and extra == "-":  # SETRANGE over the current value
                cur = expected(i, gen, n, extra)
                off = rnd.randint(0, len(cur) + 64)
                ln = rnd.randint(1, max(1, min(len(cur) // 2 + 1, 65536)))
                # keep generation gen for the base, gen+1 for the patch
                cmds.append(("SETRANGE", key(i), off, value(i, gen + 1, ln)))
                st[i] = (gen, n, "r:%d:%d" % (off, ln))
            else:
                cmds.append(("DEL", key(i)))
                st[i] = (gen, n, "d")
        res = r.pipeline(cmds)
        bad = [x for x in res if isinstance(x, str) and x != "OK"]
        if bad:
            return fail(mode, "unexpected reply %r" % bad[0])
        save_state(port, st)
        res = check(r, st)
    elif mode == "bench":
        names, cursor = [], "0"
        while True:
            cursor, batch = r.pipeline([("SCAN", cursor, "MATCH", "key:*", "COUNT", 1000)])[0]
            names.extend(batch)
            cursor = cursor.decode()
            if cursor == "0":
                break
        names = sorted(set(names))
        bench_data = bench_value(MIB)
        types = r.pipeline([("TYPE", k) for k in names])
        strs = [k for k, t in zip(names, types) if t == "string"]
        got = r.pipeline([("GET", k) for k in strs])
        total = 0
        for k, g in zip(strs, got):
            if g is None:
                return fail(mode, "%s vanished" % k.decode())
            if len(g) not in BENCH_SIZES or g != bench_data[:len(g)]:
                return fail(mode, "%s: %d bytes, not a value redis-benchmark wrote" % (
                    k.decode(), len(g)))
            total += len(g)
        print("verify: bench ok keys=%d bytes=%d" % (len(strs), total))
        return 0
    else:
        print("usage: redis_verify.py PORT write|check|churn|bench [KEYS]", file=sys.stderr)
        return 2
    if isinstance(res, str):
        return fail(mode, res)
    live = sum(1 for v in st.values() if v[2] != "d")
    print("verify: %s ok keys=%d bytes=%d" % (mode, live, res))
    return 0


def fail(mode, why):
    print("verify: %s FAIL %s" % (mode, why))
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, IOError, ValueError) as e:
        print("verify: %s FAIL %s" % (sys.argv[2] if len(sys.argv) > 2 else "?", e))
        sys.exit(1)
