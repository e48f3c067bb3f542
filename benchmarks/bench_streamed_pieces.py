"""Benchmark (issue 14): the piece size of a streamed chunk pass, against the read ceiling.

Run from the repository root::

    python benchmarks/bench_streamed_pieces.py [PATH.npy] [--repeats 5]

Over a page-cached C-ordered ``.npy`` of 128 x 128 uint16 frames (default:
``bench-data/ssb_256x256x128x128_u16.npy``, 2 GiB, made by
``benchmarks/bench_ssb.py``), on 1 and 2 threads, each thread taking half
the frames:

* ``ceiling``: ``os.preadv`` into one reused 16 MiB buffer, nothing else;
* ``pieces of N frames``: what a streamed chunk pass does per piece
  (docs/streamed-pass.md): ``preadv`` of N frames into one reused buffer,
  the XXH3-128 digest update, then the CPU runtime's prepared frame pass
  (BF + ADF + CoM: structured kernel) on the piece while it is in cache.
  N = 4096 frames (128 MiB) is the whole-chunk pass before streaming.

Variants run interleaved, in a shuffled order per repeat; medians of wall
time, GB/s of frame bytes (1e9).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel_structure import weight_sets  # noqa: E402

from quantem_flow.runtimes.cpu.prepared import PreparedFramePass  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=str(ROOT / "bench-data/ssb_256x256x128x128_u16.npy"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pieces", default="16,64,256,1024,4096")
    a = ap.parse_args()
    import xxhash

    arr = np.load(a.path, mmap_mode="r")
    offset = int(arr.offset)
    n_frames = int(np.prod(arr.shape[:-2]))
    det = tuple(int(x) for x in arr.shape[-2:])
    assert det == (128, 128) and arr.dtype == np.uint16, "expects 128 x 128 uint16 frames"
    del arr
    frame_bytes = det[0] * det[1] * 2
    weights = weight_sets()["BF+ADF+CoM"]
    fd = os.open(a.path, os.O_RDONLY)

    def ceiling(f0: int, f1: int) -> None:
        buf = bytearray(16 << 20)
        view = memoryview(buf)
        pos, end = offset + f0 * frame_bytes, offset + f1 * frame_bytes
        while pos < end:
            pos += os.preadv(fd, [view[: min(len(buf), end - pos)]], pos)

    def pieces(f0: int, f1: int, n: int) -> None:
        buf = np.empty((n, det[0] * det[1]), np.uint16)
        view = memoryview(buf).cast("B")
        prepared = PreparedFramePass(
            weights,
            dtype=np.dtype(np.uint16),
            n_frames=f1 - f0,
            want_sum=False,
            want_max=False,
            frame_shape=det,
        )
        h = xxhash.xxh3_128()
        for s in range(f0, f1, n):
            os.preadv(fd, [view], offset + s * frame_bytes)
            h.update(view)
            prepared.run(buf)

    def run(threads: int, fn: object, *args: int) -> float:
        per = n_frames // threads
        ts = [
            threading.Thread(target=fn, args=(i * per, (i + 1) * per, *args))  # type: ignore[arg-type]
            for i in range(threads)
        ]
        t = time.perf_counter()
        for x in ts:
            x.start()
        for x in ts:
            x.join()
        return time.perf_counter() - t

    sizes = [int(x) for x in a.pieces.split(",")]
    variants = [(f"ceiling x{t}", t, ceiling, ()) for t in (1, 2)] + [
        (f"pieces of {n} frames x{t}", t, pieces, (n,)) for n in sizes for t in (1, 2)
    ]
    run(2, pieces, 64)  # compile, warm the page cache
    times: dict[str, list[float]] = {v[0]: [] for v in variants}
    rng = random.Random(0)
    for _ in range(a.repeats):
        rng.shuffle(variants)
        for name, t, fn, args in variants:
            times[name].append(run(t, fn, *args))
    gb = n_frames * frame_bytes / 1e9
    print(f"{a.path}: {n_frames} frames of {det} uint16 = {gb:.2f} GB; medians of {a.repeats}")
    for name in sorted(times, key=lambda k: (k.split(" x")[1], k)):
        print(f"  {name:<28} {gb / statistics.median(times[name]):6.2f} GB/s")


if __name__ == "__main__":
    main()
