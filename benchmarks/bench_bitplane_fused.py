"""Benchmark (issue 24, goal 6): bit-plane sums on stored bitshuffle+LZ4 frames, per thread.

Bitshuffle stores each block of 4096 16-bit pixels as 16 bit planes and LZ4
compresses the planes.  Decode-then-kernel (``bshuf_decompress_lz4``: LZ4,
then the bit transpose back to pixels; then the dot or cell kernels) against
the CPU runtime's bit-plane kernel (``runtimes/cpu/bitplane.py``: LZ4 per
block into an L1 scratch, then masked sums as popcounts on the planes, the
transpose never done).  Both through the same entry point a streamed pass
uses, ``PreparedFramePass.run_stored``, with the setting ``bitplane_kernel``
on and off; values are checked equal.

Per frame set, one thread (CPU time) and two threads at once (wall time),
medians of the rounds, the paths alternating:

* ``lz4``: ``LZ4_decompress_safe`` of every block into an 8 KiB scratch
  (what the bit-plane kernel's decoding costs alone);
* ``decode``: ``StoredFrames.decode`` (checks + ``bshuf_decompress_lz4``),
  no kernel;
* ``decode+kernel``: ``run_stored`` with ``bitplane_kernel`` off (decoded 2
  MiB at a time, then the dot or cell kernels);
* ``bitplane``: ``run_stored`` with it on.

Frame sets: the first 4096 frames of ``bench_default_vs_process.py``'s
bitshuffle file (read as stored from the HDF5 file), and Poisson counts
(probe disk 40 counts, dark 0.5: mean 4.6 planes in use) scaled by 20 plus
counts (9 planes), compressed here with the bitshuffle library.

    OMP_NUM_THREADS=1 python benchmarks/bench_bitplane_fused.py --rounds 5 \\
        --json benchmarks/results_bitplane_fused.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel_structure import DET, frames_for, weight_sets  # noqa: E402

from quantem_flow import config  # noqa: E402
from quantem_flow.representations.stored import StoredFrames, lz4_block_decoder  # noqa: E402
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass  # noqa: E402

N_FRAMES = 4096
BLOCK = 4096

LZ4 = lz4_block_decoder()


@numba.njit(nogil=True)
def lz4_only(data, starts, sizes, scratch):  # type: ignore[no-untyped-def]  # pragma: no cover
    """LZ4 of every block of every frame into ``scratch`` (no checks, no counts)."""
    base = data.ctypes.data
    sp = scratch.ctypes.data
    total = 0
    for f in range(starts.shape[0]):
        pos = starts[f] + 12
        end = starts[f] + sizes[f]
        while pos + 4 <= end:
            n = (
                (np.int64(data[pos]) << 24)
                | (np.int64(data[pos + 1]) << 16)
                | (np.int64(data[pos + 2]) << 8)
                | np.int64(data[pos + 3])
            )
            total += LZ4(base + pos + 4, sp, np.int32(n), np.int32(scratch.shape[0]))
            pos += 4 + n
    return total


def compressed(frames: np.ndarray) -> StoredFrames:
    """Frames as the HDF5 bitshuffle filter stores them, back to back."""
    import bitshuffle

    parts, starts, pos = [], [], 0
    for f in frames:
        body = bitshuffle.compress_lz4(np.ascontiguousarray(f), BLOCK).tobytes()
        raw = np.frombuffer(struct.pack(">QI", f.nbytes, BLOCK * f.itemsize) + body, np.uint8)
        parts.append(raw)
        starts.append(pos)
        pos += raw.size
    n = len(parts)
    return StoredFrames(
        data=np.concatenate(parts),
        starts=np.array(starts, dtype=np.int64),
        sizes=np.array([p.size for p in parts], dtype=np.int64),
        unfiltered=np.zeros(n, dtype=bool),
        dtype=frames.dtype,
        frame_shape=DET,
        fill=0,
        where="generated frames",
        numbers=np.arange(n, dtype=np.int64),
    )


def from_file(path: Path) -> StoredFrames:
    from quantem_flow.io.hdf5 import Hdf5Source

    source = Hdf5Source(path, dataset_path="/data", scan_shape=(256, 256))
    return source.stored_frames(0, N_FRAMES)


def run_pass(w: np.ndarray, stored: StoredFrames, bitplane: bool) -> PreparedFramePass:
    with config.set(bitplane_kernel=bitplane):
        p = PreparedFramePass(
            w,
            dtype=stored.dtype,
            n_frames=stored.n_frames,
            want_sum=False,
            want_max=False,
            frame_shape=DET,
        )
        p.run_stored(stored)
    return p


def one_thread(fn: Callable[[], Any]) -> float:
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def two_threads(fns: list[Callable[[], Any]]) -> float:
    bar = threading.Barrier(2)
    spans = [0.0, 0.0]

    def work(i: int) -> None:
        bar.wait()
        t = time.perf_counter()
        fns[i]()
        spans[i] = time.perf_counter() - t

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return max(spans)


def planes_in_use(frames: np.ndarray) -> float:
    blocks = frames.reshape(-1, BLOCK)
    top = np.zeros(blocks.shape[0], np.int64)
    for p in range(frames.dtype.itemsize * 8):
        top += ((blocks >> p) & 1).any(axis=1)
    return float(top.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--file", type=Path, default=Path("/tmp/qf-bench14/data_256x256x128x128_bslz4.h5")
    )
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    sets: dict[str, StoredFrames] = {}
    if a.file.exists():
        sets["bench file"] = from_file(a.file)
    counts = frames_for("uint16", N_FRAMES)
    sets["counts"] = compressed(counts)
    sets["counts x20"] = compressed(
        (counts.astype(np.int64) * 20 + frames_for("uint16", N_FRAMES, seed=9)).astype(np.uint16)
    )
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "numba": numba.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "rounds": a.rounds,
        "frames": N_FRAMES,
        "rows": [],
    }
    frame_bytes = N_FRAMES * DET[0] * DET[1] * 2
    print(f"GB/s of decoded frames, {N_FRAMES} frames of {DET} u16, medians of {a.rounds}")
    for data, stored in sets.items():
        decoded = stored.decode()
        ratio = stored.stored_bytes / frame_bytes
        planes = planes_in_use(decoded[:512])
        halves = [stored.frames(0, N_FRAMES // 2), stored.frames(N_FRAMES // 2, N_FRAMES)]
        for name in ("BF", "BF+ADF", "BF+ADF+CoM"):
            w = weight_sets()[name]
            on, off = run_pass(w, stored, True), run_pass(w, stored, False)
            if not np.array_equal(on.result()[0], off.result()[0]):
                raise SystemExit(f"bit-plane and decoded passes differ on {data} {name}")
            scratch = np.empty(BLOCK * 2, np.uint8)
            paths: dict[str, Callable[[], Any]] = {
                "lz4": lambda s=stored, b=scratch: lz4_only(s.data, s.starts, s.sizes, b),
                "decode": lambda s=stored, d=decoded: s.decode(d),
                "decode+kernel": lambda w=w, s=stored: run_pass(w, s, False),
                "bitplane": lambda w=w, s=stored: run_pass(w, s, True),
            }
            times: dict[str, list[float]] = {k: [] for k in paths}
            x2: dict[str, list[float]] = {"decode+kernel": [], "bitplane": []}
            for _ in range(a.rounds):
                for k, fn in paths.items():
                    times[k].append(one_thread(fn))
                for k, flag in (("decode+kernel", False), ("bitplane", True)):
                    x2[k].append(
                        two_threads([lambda h=h, f=flag, w=w: run_pass(w, h, f) for h in halves])
                    )
            rate = {k: frame_bytes / statistics.median(v) / 1e9 for k, v in times.items()}
            rate2 = {k: frame_bytes / statistics.median(v) / 1e9 for k, v in x2.items()}
            row = {
                "data": data,
                "set": name,
                "compressed_fraction": ratio,
                "planes_in_use": planes,
                **{f"{k}_GBps": v for k, v in rate.items()},
                **{f"x2_{k}_GBps": v for k, v in rate2.items()},
                "kernel_on": on.variant.get("kernel", ""),
                "kernel_off": off.variant.get("kernel", ""),
            }
            report["rows"].append(row)
            print(
                f"{data:10} {name:10} {ratio:5.1%} planes {planes:4.1f}"
                f" | lz4 {rate['lz4']:5.2f} decode {rate['decode']:5.2f}"
                f" decode+kernel {rate['decode+kernel']:5.2f} bitplane {rate['bitplane']:5.2f}"
                f" ({rate['bitplane'] / rate['decode+kernel']:4.2f}x)"
                f" | x2 {rate2['decode+kernel']:5.2f} {rate2['bitplane']:5.2f}"
                f" ({rate2['bitplane'] / rate2['decode+kernel']:4.2f}x)",
                flush=True,
            )
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
