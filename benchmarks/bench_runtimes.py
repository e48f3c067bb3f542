"""Benchmark: the fused frame pass on each runtime, side by side in one run.

Run from the repository root::

    python benchmarks/bench_runtimes.py                 # 64 x 64 x 128 x 128 u16 (128 MiB)
    python benchmarks/bench_runtimes.py --repeat 7 --json out.json

One in-memory block of ``scan x scan`` frames of ``det x det`` uint16
(Poisson counts around a probe disk) goes through ``Runtime.frame_pass``
with 5 float64 weight rows (BF, ADF, CoM x, CoM y, a ring), once without and
once with the sum and max patterns.  Rows:

* ``numpy``: the plain NumPy equivalent (cast to float64, ``@``, ``sum``,
  ``max``), the baseline any kernel must beat;
* ``cpu``: the CPU runtime (Numba fused kernel, one thread);
* ``mps (host frames)``: the MLX runtime given host frames, so the copy
  into MLX memory is included, as in a chunk task reading from a source;
* ``mps (resident)``: the MLX runtime given frames already in MLX memory
  (a persisted chunk with residency ``mps``).

Every figure is the median of ``--repeat`` timed runs after one warm-up;
GB/s is the block's logical bytes over that time.  Results of each runtime
are checked against ``cpu`` before timing.  Runtimes not available here
are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantem_flow.errors import RuntimeUnavailableError  # noqa: E402
from quantem_flow.runtimes import MANIFEST, FramePassResult, get_runtime  # noqa: E402


def make_block(scan: int, det: int, seed: int = 11) -> np.ndarray:
    """``(scan * scan, det * det)`` uint16 Poisson frames with an off-centre probe disk."""
    rng = np.random.default_rng(seed)
    rr, cc = np.indices((det, det))
    disk = (rr - det * 0.48) ** 2 + (cc - det * 0.52) ** 2 < (det * 0.11) ** 2
    lam = (2.0 + 400.0 * disk).ravel()
    return rng.poisson(lam, size=(scan * scan, det * det)).astype(np.uint16)


def make_weights(det: int) -> np.ndarray:
    """BF disk, ADF annulus, CoM x and y, a ring: ``(5, det * det)`` float64."""
    rr, cc = np.indices((det, det), dtype=np.float64)
    r = np.hypot(rr - det * 0.48, cc - det * 0.52)
    return (
        np.stack(
            [
                (r < det * 0.11),
                (r >= det * 0.2),
                cc - det * 0.52,
                rr - det * 0.48,
                (r >= det * 0.12) & (r < det * 0.18),
            ]
        )
        .reshape(5, -1)
        .astype(np.float64)
    )


def numpy_pass(
    frames: np.ndarray, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """The plain NumPy equivalent of the fused pass."""
    return FramePassResult(
        per_frame=frames.astype(np.float64) @ weights.T,
        pattern_sum=frames.sum(axis=0, dtype=np.int64) if want_sum else None,
        pattern_max=frames.max(axis=0) if want_max else None,
    )


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``repeat`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check(
    got: FramePassResult, ref: FramePassResult, frames: np.ndarray, w: np.ndarray, label: str
) -> None:
    """per_frame within 1e-12 of |x| @ |w| (the conformance bound); patterns exact."""
    bound = 1e-12 * (frames.astype(np.float64) @ np.abs(w).T)
    worst = float(np.max(np.abs(got.per_frame - ref.per_frame) - bound))
    assert worst <= 0, f"{label}: per_frame beyond 1e-12 of |x| @ |w|"
    for a, b in ((got.pattern_sum, ref.pattern_sum), (got.pattern_max, ref.pattern_max)):
        if b is not None:
            assert a is not None and a.dtype == b.dtype, label
            np.testing.assert_array_equal(a, b, err_msg=label)


def main() -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    frames = make_block(args.scan, args.det)
    weights = make_weights(args.det)
    nbytes = frames.nbytes
    runners: dict[str, Callable[..., FramePassResult]] = {"numpy": numpy_pass}
    unavailable: dict[str, str] = {}
    for name in MANIFEST:
        try:
            rt = get_runtime(name)
        except RuntimeUnavailableError as exc:
            unavailable[name] = str(exc)
            continue
        if name == "mps":
            runners["mps (host frames)"] = rt.frame_pass
            resident = rt.to_device(frames)  # type: ignore[attr-defined]

            def on_resident(
                _f: np.ndarray, w: np.ndarray, rt: Any = rt, dev: Any = resident, **kw: bool
            ) -> Any:
                return rt.frame_pass(dev, w, **kw)

            runners["mps (resident)"] = on_resident
        else:
            runners[name] = rt.frame_pass

    rows: list[dict[str, Any]] = []
    for want in (False, True):
        kw = {"want_sum": want, "want_max": want}
        ref = get_runtime("cpu").frame_pass(frames, weights, **kw)
        for label, fn in runners.items():
            check(fn(frames, weights, **kw), ref, frames, weights, label)
            t = median_time(lambda fn=fn, kw=kw: fn(frames, weights, **kw), args.repeat)
            rows.append(
                {
                    "runtime": label,
                    "sum_max": want,
                    "median_s": t,
                    "GB_per_s": nbytes / t / 1e9,
                }
            )

    shape = (args.scan, args.scan, args.det, args.det)
    print(
        f"frame_pass on {'x'.join(map(str, shape))} uint16 ({nbytes / 2**20:.0f} MiB), "
        f"5 weight rows, median of {args.repeat}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'runtime':<20} {'sum+max':>8} {'median s':>10} {'GB/s':>8}")
    for r in rows:
        print(
            f"{r['runtime']:<20} {'on' if r['sum_max'] else 'off':>8} "
            f"{r['median_s']:>10.4f} {r['GB_per_s']:>8.2f}"
        )
    for name, why in unavailable.items():
        print(f"{name}: not run ({why})")
    if "mps (host frames)" in runners:
        print("mps:", get_runtime("mps").describe()["available"])
    if args.json:
        args.json.write_text(
            json.dumps({"shape": shape, "rows": rows, "unavailable": unavailable}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
