"""Benchmark (issue 24, goal 6): a bitshuffle+LZ4 decoder fused with the kernel.

Bitshuffle stores each block of 4096 16-bit pixels as 16 bit planes (plane
``p`` holds bit ``p`` of every pixel, pixel ``e`` at byte ``e // 8``, bit
``e % 8``), and LZ4 compresses the planes.  Today's path decodes a frame
(``bshuf_decompress_lz4``: LZ4, then the bit transpose back to pixels) and then
runs the dot kernel on the pixels.  The fused path stops after LZ4: on a
binary mask the masked sum of a block is ``sum_p 2**p * popcount(plane_p &
mask)``, so the kernel works on the planes themselves, 512 pixels per
``vpopcntq`` of a 512-bit register, planes that are all zero (the high bits of
counted data) skipped, and the bit transpose never done.  Moment rows (CoM)
split into one binary mask per bit of the coordinate: ``sum r I = sum_j 2**j
sum_p 2**p popcount(plane_p & mask & bit_j(r))``; the row bits above the
block's 32 rows are constant per block and fold into the block's total.

Measured per frame set, one thread (CPU time), medians of the rounds, paths
alternating:

* ``lz4``: ``LZ4_decompress_safe`` per block into an 8 KiB scratch (the fused
  path's decoder alone);
* ``decode``: ``bshuf_decompress_lz4`` per frame into a 64-frame piece (today's
  decoder alone);
* ``decode+kernel``: the same, then the CPU runtime's prepared frame pass (the
  dot kernel where its cost rule takes it) on each piece;
* ``fused``: LZ4 per block, then the bit-plane popcounts, one compiled loop.

and the last two on two threads at once (wall time).  The fused sums equal
NumPy's int64 sums on the decoded frames (checked; the script stops if not).

    python benchmarks/bench_bitplane_fused.py --rounds 5 --json benchmarks/results_bitplane_fused.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel_structure import CENTER, DET, frames_for, weight_sets  # noqa: E402

from quantem_flow.runtimes.cpu.dot_ir import host_isa  # noqa: E402
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass  # noqa: E402

BLOCK = 4096  # pixels per bitshuffle block (the HDF5 filter's default for 2-byte pixels)
PLANES = 16
QWORDS = BLOCK // 64  # 64-bit words per plane of a block
PIECE = 64  # frames per decoded piece (the streamed pass's 2 MiB)
N_FRAMES = 4096


@intrinsic
def _popcount(typingctx: Any, x: Any) -> Any:
    sig = types.uint64(types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(fn, args)

    return sig, codegen


def _lz4() -> Any:
    import bitshuffle

    lib = ctypes.CDLL(bitshuffle.ext.__file__)
    lz4 = lib.LZ4_decompress_safe
    lz4.restype = ctypes.c_int
    lz4.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    bshuf = lib.bshuf_decompress_lz4
    bshuf.restype = ctypes.c_int64
    bshuf.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_size_t] * 2
    return lz4, bshuf


LZ4, BSHUF = _lz4()


@numba.njit(nogil=True, cache=False)
def _be32(buf: np.ndarray, pos: int) -> int:  # pragma: no cover - jitted
    return (
        (np.int64(buf[pos]) << 24)
        | (np.int64(buf[pos + 1]) << 16)
        | (np.int64(buf[pos + 2]) << 8)
        | np.int64(buf[pos + 3])
    )


@numba.njit(nogil=True)
def lz4_only(buf, starts, a, b, scratch):  # type: ignore[no-untyped-def]  # pragma: no cover
    """LZ4 of every block of frames ``[a, b)`` into ``scratch`` (the fused decoder alone)."""
    blocks = DET[0] * DET[1] // BLOCK
    sp = scratch.ctypes.data
    base = buf.ctypes.data
    check = 0
    for f in range(a, b):
        pos = starts[f]
        for _ in range(blocks):
            n = _be32(buf, pos)
            check += LZ4(base + pos + 4, sp, n, BLOCK * 2)
            pos += 4 + n
    return check


@numba.njit(nogil=True)
def decode_piece(buf, starts, a, b, piece):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``bshuf_decompress_lz4`` of frames ``[a, b)`` into the rows of ``piece``."""
    base = buf.ctypes.data
    px = DET[0] * DET[1]
    for f in range(a, b):
        BSHUF(base + starts[f], piece[f - a].ctypes.data, px, 2, BLOCK)


@numba.njit(nogil=True)
def fused(buf, starts, a, b, scratch, masks, stream_out, stream_shift, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """LZ4 per block, then every stream's popcounts on the planes (see the module docstring).

    ``masks``: (streams, blocks, QWORDS) uint64; stream ``s`` adds
    ``popcount sums << (p + stream_shift[s, block])`` to ``out[f, stream_out[s]]``
    (a shift of -1 skips the stream in that block).
    """
    blocks = DET[0] * DET[1] // BLOCK
    sp = scratch.ctypes.data
    base = buf.ctypes.data
    planes = scratch.view(np.uint64)
    n_streams = masks.shape[0]
    for f in range(a, b):
        pos = starts[f]
        for k in range(blocks):
            n = _be32(buf, pos)
            LZ4(base + pos + 4, sp, n, BLOCK * 2)
            pos += 4 + n
            for p in range(PLANES):
                row = planes[p * QWORDS : (p + 1) * QWORDS]
                any_set = np.uint64(0)
                for q in range(QWORDS):
                    any_set |= row[q]
                if any_set == 0:
                    continue
                for s in range(n_streams):
                    shift = stream_shift[s, k]
                    if shift < 0:
                        continue
                    m = masks[s, k]
                    acc = np.uint64(0)
                    for q in range(QWORDS):
                        acc += _popcount(row[q] & m[q])
                    out[f - a, stream_out[s]] += np.int64(acc) << (p + shift)


def pack(bits: np.ndarray) -> np.ndarray:
    """A (pixels,) bool mask as (blocks, QWORDS) uint64 in the planes' bit order."""
    return np.packbits(bits.reshape(-1, BLOCK), axis=1, bitorder="little").view(np.uint64)


def streams(rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The popcount streams of binary rows and of integer-coordinate moment rows.

    ``rows``: name -> (pixels,) int64 weights, each either 0/1 or a support
    times a coordinate 0..127.  A coordinate row becomes one stream per bit;
    row bits that are constant over a block (the block's 32 rows share bits
    5 and 6) become a shift of the block's plain count instead.
    """
    masks, outs, shifts, names = [], [], [], list(rows)
    blocks = DET[0] * DET[1] // BLOCK
    for i, w in enumerate(rows.values()):
        support = w != 0
        if np.all((w == 0) | (w == 1)):
            masks.append(pack(support))
            outs.append(i)
            shifts.append(np.zeros(blocks, np.int64))
            continue
        for j in range(7):
            bit = ((w >> j) & 1).astype(bool) & support
            packed = pack(bit)
            per_block = bit.reshape(blocks, BLOCK)
            sup_block = support.reshape(blocks, BLOCK)
            shift = np.full(blocks, j, np.int64)
            for k in range(blocks):
                if not per_block[k].any():
                    shift[k] = -1
            masks.append(packed)
            outs.append(i)
            shifts.append(shift)
            del sup_block
    return (
        np.ascontiguousarray(np.stack(masks)),
        np.array(outs, np.int64),
        np.ascontiguousarray(np.stack(shifts)),
        names,
    )


def compressed_frames(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each frame as bitshuffle+LZ4 (block 4096, no HDF5 header), concatenated; and offsets."""
    import bitshuffle

    parts = [bitshuffle.compress_lz4(f, BLOCK) for f in frames]
    starts = np.cumsum([0] + [p.size for p in parts[:-1]]).astype(np.int64)
    return np.concatenate(parts), starts


def file_frames(path: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` stored chunks of an HDF5 bitshuffle+LZ4 file, headers stripped."""
    import h5py

    parts = []
    with h5py.File(path, "r") as f:
        d = f["data"]
        for i in range(n):
            _, raw = d.id.read_direct_chunk((i, 0, 0))
            parts.append(np.frombuffer(raw, np.uint8)[12:])
    starts = np.cumsum([0] + [p.size for p in parts[:-1]]).astype(np.int64)
    return np.concatenate(parts), starts


def pass_for(w: np.ndarray, n_frames: int) -> PreparedFramePass:
    return PreparedFramePass(
        w, dtype=np.dtype(np.uint16), n_frames=n_frames, want_sum=False, want_max=False,
        frame_shape=DET,
    )


def rows_for(name: str) -> dict[str, np.ndarray]:
    """Integer rows of a weight set: BF, ADF, and for CoM the total and raw r, c moments."""
    w = weight_sets()["BF+ADF+CoM"].astype(np.int64)
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    rows = {"BF": w[0], "ADF": w[1]}
    if name == "BF+ADF+CoM":
        rows |= {"total": np.ones(DET[0] * DET[1], np.int64), "r": rr.ravel(), "c": cc.ravel()}
    return rows


def run_decode_kernel(buf: np.ndarray, starts: np.ndarray, a: int, b: int, fp: PreparedFramePass) -> None:
    piece = np.empty((PIECE, DET[0] * DET[1]), np.uint16)
    for x in range(a, b, PIECE):
        y = min(b, x + PIECE)
        decode_piece(buf, starts, x, y, piece)
        fp.run(piece[: y - x])


def run_fused(buf: np.ndarray, starts: np.ndarray, a: int, b: int, plan: tuple[Any, ...]) -> np.ndarray:
    masks, outs, shifts, names = plan
    out = np.zeros((b - a, len(names)), np.int64)
    scratch = np.empty(BLOCK * 2, np.uint8)
    fused(buf, starts, a, b, scratch, masks, outs, shifts, out)
    return out


def check(buf: np.ndarray, starts: np.ndarray, name: str) -> None:
    n = 256
    piece = np.empty((n, DET[0] * DET[1]), np.uint16)
    decode_piece(buf, starts, 0, n, piece)
    rows = rows_for(name)
    plan = streams(rows)
    got = run_fused(buf, starts, 0, n, plan)
    want = piece.astype(np.int64) @ np.stack(list(rows.values())).T
    if not np.array_equal(got, want):
        raise SystemExit(f"fused sums differ from NumPy's on {name}")
    fp = pass_for(weight_sets()[name], n)
    fp.run(piece)
    ref = piece.astype(np.float64) @ weight_sets()[name].T
    if not np.allclose(fp._out[:n, : ref.shape[1]], ref):
        raise SystemExit(f"the frame pass differs from NumPy's on {name}")
    # the centred moments as the frame pass writes them
    if name == "BF+ADF+CoM":
        cr = got[:, 3].astype(np.float64) - got[:, 2].astype(np.float64) * CENTER[0]
        if not np.allclose(cr, fp._out[:n, 3]):
            raise SystemExit("fused centred row moment differs from the frame pass's")


def one_thread(fn: Any, rounds: int) -> float:
    ts = []
    for _ in range(rounds):
        t = time.thread_time()
        fn()
        ts.append(time.thread_time() - t)
    return statistics.median(ts)


def two_threads(fns: list[Any]) -> float:
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


def planes_in_use(buf: np.ndarray, starts: np.ndarray, n: int) -> float:
    piece = np.empty((n, DET[0] * DET[1]), np.uint16)
    decode_piece(buf, starts, 0, n, piece)
    blocks = piece.reshape(-1, BLOCK)
    top = np.zeros(blocks.shape[0], np.int64)
    for p in range(PLANES):
        top += ((blocks >> p) & 1).any(axis=1)
    return float(top.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--file", type=Path, default=Path("/tmp/qf-bench14/data_256x256x128x128_bslz4.h5"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    isa = host_isa()
    sets: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if a.file.exists():
        sets["bench file"] = file_frames(a.file, N_FRAMES)
    sets["counts x1"] = compressed_frames(frames_for("uint16", N_FRAMES).reshape(N_FRAMES, -1))
    sets["counts x20"] = compressed_frames(
        (frames_for("uint16", N_FRAMES).astype(np.int64) * 20 + frames_for("uint16", N_FRAMES, seed=9))
        .astype(np.uint16)
        .reshape(N_FRAMES, -1)
    )
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "isa": None if isa is None else isa.instruction,
        "python": platform.python_version(),
        "numba": numba.__version__,
        "rounds": a.rounds,
        "frames": N_FRAMES,
        "rows": [],
    }
    frame_bytes = N_FRAMES * DET[0] * DET[1] * 2
    print(f"GB/s of decoded frames, {N_FRAMES} frames, medians of {a.rounds}")
    for data, (buf, starts) in sets.items():
        ratio = buf.size / frame_bytes
        planes = planes_in_use(buf, starts, 512)
        for name in ("BF+ADF", "BF+ADF+CoM"):
            check(buf, starts, name)
            plan = streams(rows_for(name))
            fp = pass_for(weight_sets()[name], N_FRAMES * (a.rounds + 4))
            half = N_FRAMES // 2
            scratch = np.empty(BLOCK * 2, np.uint8)
            piece = np.empty((PIECE, DET[0] * DET[1]), np.uint16)

            def lz4_run() -> None:
                lz4_only(buf, starts, 0, N_FRAMES, scratch)

            def decode_run() -> None:
                for x in range(0, N_FRAMES, PIECE):
                    decode_piece(buf, starts, x, x + PIECE, piece)

            paths = {
                "lz4": lz4_run,
                "decode": decode_run,
                "decode+kernel": lambda: run_decode_kernel(buf, starts, 0, N_FRAMES, fp),
                "fused": lambda: run_fused(buf, starts, 0, N_FRAMES, plan),
            }
            for fn in paths.values():
                fn()
            times: dict[str, list[float]] = {k: [] for k in paths}
            for _ in range(a.rounds):
                for k, fn in paths.items():
                    times[k].append(one_thread(fn, 1))
            rate = {k: frame_bytes / statistics.median(v) / 1e9 for k, v in times.items()}
            fps = [pass_for(weight_sets()[name], half * (a.rounds + 2)) for _ in range(2)]
            x2: dict[str, list[float]] = {"decode+kernel": [], "fused": []}
            for _ in range(a.rounds):
                x2["decode+kernel"].append(
                    two_threads(
                        [
                            lambda: run_decode_kernel(buf, starts, 0, half, fps[0]),
                            lambda: run_decode_kernel(buf, starts, half, N_FRAMES, fps[1]),
                        ]
                    )
                )
                x2["fused"].append(
                    two_threads(
                        [
                            lambda: run_fused(buf, starts, 0, half, plan),
                            lambda: run_fused(buf, starts, half, N_FRAMES, plan),
                        ]
                    )
                )
            rate2 = {k: frame_bytes / statistics.median(v) / 1e9 for k, v in x2.items()}
            row = {
                "data": data,
                "set": name,
                "compressed_fraction": ratio,
                "planes_in_use": planes,
                "streams": int(plan[0].shape[0]),
                **{f"{k}_GBps": v for k, v in rate.items()},
                **{f"x2_{k}_GBps": v for k, v in rate2.items()},
                "kernel": fp.variant.get("kernel", ""),
            }
            report["rows"].append(row)
            print(
                f"{data:11} {name:11} {ratio:5.1%} planes {planes:4.1f} streams {row['streams']:2}"
                f" | lz4 {rate['lz4']:5.2f} decode {rate['decode']:5.2f}"
                f" decode+kernel {rate['decode+kernel']:5.2f} fused {rate['fused']:5.2f}"
                f" ({rate['fused'] / rate['decode+kernel']:4.2f}x)"
                f" | x2 {rate2['decode+kernel']:5.2f} {rate2['fused']:5.2f}"
                f" ({rate2['fused'] / rate2['decode+kernel']:4.2f}x)",
                flush=True,
            )
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
