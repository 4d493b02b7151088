"""CPython memory behaviours for the leak corpus (node-agent/corpus/README.md).

    python3 mem.py MODE key=value...

Sizes take k/m/g (10^3) or Ki/Mi/Gi (2^10) suffixes; times are seconds. Every byte held
is written, so it is resident. Runs until killed.
"""
import collections
import mmap
import os
import random
import sys
import time


def size(v):
    for suf, mul in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30),
                     ("k", 10**3), ("m", 10**6), ("g", 10**9)):
        if v.endswith(suf):
            return int(float(v[: -len(suf)]) * mul)
    return int(float(v))


def touched(n):
    """A bytearray of n bytes with every page written (bytearray(n) may map zero pages)."""
    b = bytearray(n)
    b[::4096] = b"\x01" * len(range(0, n, 4096))
    return b


def args():
    kv = dict(a.split("=", 1) for a in sys.argv[2:])
    return kv


class Jitter:
    """Scratch buffers of a random size up to `top`, replaced every 100 ms (requests)."""

    def __init__(self, top, seed=1):
        self.top, self.rng, self.buf = top, random.Random(seed), None

    def tick(self):
        if self.top:
            self.buf = None
            self.buf = touched(self.rng.randrange(self.top))


def leak(a):
    """A steady leak of small objects (pymalloc) at `rate` bytes/s, optionally in steps
    every `every` seconds, after `delay`, on a `base` heap with `jitter` scratch."""
    rate, base = size(a.get("rate", "1m")), touched(size(a.get("base", "0")))
    every, delay = float(a.get("every", "0.1")), float(a.get("delay", "0"))
    jit = Jitter(size(a.get("jitter", "0")))
    held, t0 = [], time.monotonic()
    obj = 400  # bytes objects <= 512 B come from pymalloc's arenas
    owed, last = 0.0, None
    while True:
        now = time.monotonic()
        if now - t0 >= delay:
            if last is not None and now - last >= every:
                owed += rate * (now - last)
                n = int(owed // (obj + 33))  # 33 B of object header per bytes object
                owed -= n * (obj + 33)
                held.extend(bytes(obj - 1) + b"x" for _ in range(n))
                last = now
            elif last is None:
                last = now
        jit.tick()
        time.sleep(0.1)
    return base


def warmup(a):
    """Grows towards `target` with time constant `secs`/3 (95 % at `secs`), then holds:
    a cache or heap warming up."""
    import math
    target, secs = size(a.get("target", "100m")), float(a.get("secs", "120"))
    chunk = 64 << 10
    held, t0 = [], time.monotonic()
    while True:
        t = time.monotonic() - t0
        want = target if t >= secs else target * (1 - math.exp(-3 * t / secs))
        while len(held) * chunk < want:
            held.append(touched(chunk))
        time.sleep(0.1)


def lru(a):
    """A bounded LRU cache of 2 KiB entries filled at `rate` bytes/s up to `cap`."""
    cap, rate = size(a.get("cap", "100m")), size(a.get("rate", "1m"))
    cache, key, entry = collections.OrderedDict(), 0, 2048
    while True:
        for _ in range(max(1, rate // entry // 10)):
            key += 1
            cache[key] = touched(entry)
            if len(cache) * entry > cap:
                cache.popitem(last=False)
            if key % 7 == 0 and len(cache) > 10:  # a hit moves an old entry to the front
                cache.move_to_end(next(iter(cache)))
        time.sleep(0.1)


def batch(a):
    """Accumulates `rate` bytes/s in 1 MiB buffers for `period` s, then drops them all: a
    batch window (or a collector with a very long cycle)."""
    rate, period = size(a.get("rate", "1m")), float(a.get("period", "90"))
    base = touched(size(a.get("base", "20Mi")))
    held, t0 = [], time.monotonic()
    while True:
        t = time.monotonic() - t0
        if t >= period:
            held, t0 = [], time.monotonic()
            continue
        while len(held) * (1 << 20) < rate * t:
            held.append(touched(1 << 20))
        time.sleep(0.1)
    return base


def mapfile(a):
    """Maps a `size` file and reads it at `rate` bytes/s, again and again: file-backed
    resident memory (page cache), not a leak."""
    n, rate = size(a.get("size", "400Mi")), size(a.get("rate", "4Mi"))
    path = a.get("path", "/tmp/rw-corpus-mapfile-%d" % os.getpid())
    with open(path, "wb") as f:
        for _ in range(n >> 20):
            f.write(b"\x02" * (1 << 20))
    f = open(path, "rb")
    os.unlink(path)
    m = mmap.mmap(f.fileno(), n, prot=mmap.PROT_READ)
    off, s = 0, 0
    while True:
        end = off + rate // 10
        for p in range(off, min(end, n), 4096):
            s += m[p]
        off = 0 if end >= n else end
        time.sleep(0.1)


def child(a):
    """A flat parent whose forked child leaks at `rate` (a worker process)."""
    base = touched(size(a.get("base", "30Mi")))
    pid = os.fork()
    if pid == 0:
        sys.argv = [sys.argv[0], "leak", "rate=" + a.get("rate", "1m")]
        leak(args())
    while True:
        time.sleep(1)
    return base


def flat(a):
    base = touched(size(a.get("size", "50Mi")))
    while True:
        time.sleep(1)
    return base


MODES = {f.__name__: f for f in (leak, warmup, lru, batch, mapfile, child, flat)}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        sys.exit("usage: mem.py %s key=value..." % "|".join(MODES))
    MODES[sys.argv[1]](args())
