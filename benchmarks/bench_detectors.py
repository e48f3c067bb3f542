"""Benchmark (issue 24, item 4): per-thread kernel GB/s against the number of detectors.

On a warm in-memory block of 128 x 128 u16 frames (1024 by default, 32 MiB) with a probe
disk around an off-grid centre (63.7, 64.2), for 1, 3, 5, 10 and 20 detectors (a BF disk,
then annuli of random radii around the same centre, as a user placing rings does), side
by side in one run, every round in a shuffled order, medians of the rounds:

* ``default kernel``: the CPU runtime's frame pass as it runs in a pass
  (:func:`~quantem_flow.runtimes.cpu.kernels.frame_pass_variant`: the structured kernel,
  the detectors' supports as cells, every pixel read once whatever the count);
* ``fused kernel``: every weight row multiplied into every pixel (``structured=False``);
* ``NumPy float32 matmul``: ``frames.astype(float32) @ masks.T`` on one thread
  (the usual NumPy baseline; not exact for sums past 2**24);
* ``radial index``: the persisted path (``graphs/radial_query.py``): the prefix sums of
  the same block's pixels sorted by distance, built once (its build time is reported
  apart), then each query.

Times are the calling thread's CPU time (single-threaded kernels); GB/s are the block's
bytes over it.  Values are checked equal between the default kernel, the fused kernel and
the radial index.

    python benchmarks/bench_detectors.py --rounds 11 --json benchmarks/results_detectors.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel_structure import CENTER, DET, frames_for, interleaved  # noqa: E402

from quantem_flow.operators.geometry import annulus  # noqa: E402
from quantem_flow.runtimes.cpu.kernels import frame_pass_variant  # noqa: E402

COUNTS = (1, 3, 5, 10, 20)


def detectors(count: int, seed: int = 5) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """A BF disk, then annuli of random radii (0.5-px steps, within 36 px) around the centre."""
    rng = np.random.default_rng(seed)
    radii = [(0.0, 20.0)]
    while len(radii) < count:
        inner = float(rng.integers(20, 66)) / 2  # 10 .. 32.5 px
        outer = min(36.0, inner + float(rng.integers(2, 30)) / 2)
        radii.append((inner, outer))
    rows = [annulus(DET, CENTER, a, b, (1.0, 1.0)).astype(np.float64).ravel() for a, b in radii]
    return np.stack(rows), radii


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    from quantem_flow.graphs.radial_query import RadialPlan, plan_radial
    from quantem_flow.representations.chunk import chunk_of
    from quantem_flow.runtimes import get_runtime

    fr = frames_for("uint16", a.frames)
    nbytes = fr.nbytes
    runtime = get_runtime("cpu")
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "block": f"{a.frames} x {DET[0]} x {DET[1]} uint16 ({nbytes / 2**20:.0f} MiB)",
        "rounds": a.rounds,
        "rows": {},
    }
    print(f"{report['block']}, {a.rounds} interleaved rounds; GB/s per thread (median)")
    print(f"{'detectors':>9} {'default':>9} {'fused':>9} {'numpy f32':>10} {'radial':>10}  kernel")
    for count in COUNTS:
        w, radii = detectors(count)
        w32 = w.astype(np.float32)
        hint = (*CENTER, 1.0, 1.0)
        plan = plan_radial(
            w,
            (hint,) * count,
            fr.dtype,
            DET,
            want_sum=False,
            want_max=False,
            gather=None,
        )
        assert isinstance(plan, RadialPlan), "every detector is a distance range"
        # the persisted path on the same block (a fresh chunk: the index builds on first use)
        chunk = chunk_of("dense", fr.reshape(1, a.frames, *DET))
        answered = plan.run(runtime, chunk, a.frames, fr.itemsize)
        assert answered is not None, "a dense chunk has room for its index"
        built, record = answered
        build_s = float(record["index_built_s"])
        variants = {
            "default": lambda w=w: frame_pass_variant(
                fr, w, want_sum=False, want_max=False, frame_shape=DET
            ),
            "fused": lambda w=w: frame_pass_variant(
                fr, w, want_sum=False, want_max=False, frame_shape=DET, structured=False
            ),
            "numpy": lambda w32=w32: fr.astype(np.float32) @ w32.T,
            "radial": lambda plan=plan, chunk=chunk: plan.run(runtime, chunk, a.frames, 2),
        }
        ref = variants["default"]()
        np.testing.assert_array_equal(ref[0], variants["fused"]()[0])
        np.testing.assert_array_equal(ref[0], built.per_frame)
        times = interleaved(variants, a.rounds)
        med = {k: statistics.median(v) for k, v in times.items()}
        gbps = {k: nbytes / v / 1e9 for k, v in med.items()}
        summary = str(ref[3].get("summary", ""))
        report["rows"][str(count)] = {
            "radii": radii,
            "seconds": med,
            "GBps": gbps,
            "radial_index_build_s": build_s,
            "default_kernel": summary,
        }
        print(
            f"{count:>9} {gbps['default']:>9.2f} {gbps['fused']:>9.2f} {gbps['numpy']:>10.2f} "
            f"{gbps['radial']:>10.1f}  {summary[:70]}"
        )
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
