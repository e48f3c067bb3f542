"""Benchmark: resident bytes and BF + ADF + CoM time in every representation.

Run from the repository root::

    python benchmarks/bench_representations.py --repeat 5

Two generated uint16 datasets (default 128 x 128 scan x 128 x 128 detector,
512 MiB dense each): a low-dose counted one (about 1 electron per frame per
100 pixels: 1 % occupancy) and a high-dose one (a bright-field disk of ~40
counts per pixel on a weak background).  For each, the dataset is persisted
in-process (``client="synchronous"``) as dense, encoded (bitshuffle+LZ4),
paired and packed; then BF + ADF + CoM runs on the resident chunks, so the
time is kernel time on one core, side by side in one run.  Results are
checked identical to dense before timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import quantem_flow as qf  # noqa: E402

REPS = ("dense", "encoded", "paired", "packed")


def make(kind: str, scan: int, det: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rr, cc = np.indices((det, det))
    d = np.hypot(rr - 0.47 * det, cc - 0.53 * det)
    if kind == "low":
        lam = np.full((det, det), 0.005) + 0.02 * (d < det / 8)
        lam *= 0.01 / lam.mean()  # 1 electron per 100 pixels on average
    else:
        lam = 0.5 + 40.0 * (d < det / 8) + 5.0 * np.exp(-d / (det / 6))
    out = np.empty((scan, scan, det, det), dtype=np.uint16)
    for r in range(scan):
        out[r] = rng.poisson(lam, size=(scan, det, det))
    return out


def pipeline(ds: qf.Dataset4D, det: int) -> list[Any]:
    c = (0.47 * det, 0.53 * det)
    return [
        qf.virtual_bf(ds, radius=det / 8, center=c),
        qf.virtual_adf(ds, inner=det / 4, center=c),
        qf.center_of_mass(ds, center=c),
    ]


def measure(data: np.ndarray, repeat: int, chunk_mib: float) -> list[dict[str, Any]]:
    det = data.shape[2]
    base = qf.open(data, chunk_mib=chunk_mib)
    reference = qf.compute(*pipeline(base, det), client="synchronous")
    rows = []
    for rep in REPS:
        ds = base if rep == "dense" else base.to_representation(rep, verify="full")
        t = time.perf_counter()
        p = ds.persist(client="synchronous")
        persist_s = time.perf_counter() - t
        out = qf.compute(*pipeline(p, det))
        for x, y in zip(out, reference, strict=True):
            if x.data.dtype.kind in "iu":
                np.testing.assert_array_equal(x.data, y.data)  # integer sums: exact
            else:  # CoM: the same float64 sums in another order
                np.testing.assert_allclose(x.data, y.data, rtol=1e-10, atol=1e-9, equal_nan=True)
        times, kernel = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            res = qf.compute(*pipeline(p, det))
            times.append(time.perf_counter() - t)
            kernel.append(float(res[0].provenance.execution["kernel_s_total"]))
        rows.append(
            {
                "representation": rep,
                "resident_bytes": int(p.resident.resident_bytes),
                "dense_bytes": int(data.nbytes),
                "persist_s": persist_s,
                "pass_s": statistics.median(times),
                "kernel_s": statistics.median(kernel),
                "times": times,
                "kernel_times": kernel,
                "schema": p.storage_schema,
            }
        )
        p.release()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=128)
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chunk-mib", type=float, default=128.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    report: dict[str, Any] = {"shape": [args.scan, args.scan, args.det, args.det]}
    for kind in ("low", "high"):
        data = make(kind, args.scan, args.det, seed=3)
        occupancy = float(np.count_nonzero(data)) / data.size
        rows = measure(data, args.repeat, args.chunk_mib)
        report[kind] = {
            "occupancy": occupancy,
            "counts_per_pixel": float(data.mean()),
            "rows": rows,
        }
        dense = rows[0]
        print(
            f"\n{kind}-dose: {args.scan}x{args.scan}x{args.det}x{args.det} u16, "
            f"occupancy {occupancy:.2%}, mean {data.mean():.3f} counts/pixel; "
            f"median of {args.repeat}"
        )
        print(
            f"{'representation':14s} {'resident MiB':>12s} {'smaller':>8s} "
            f"{'BF+ADF+CoM s':>12s} {'faster':>7s} {'kernels s':>10s} {'faster':>7s}"
        )
        for r in rows:
            print(
                f"{r['representation']:14s} {r['resident_bytes'] / 2**20:12.2f} "
                f"{dense['resident_bytes'] / r['resident_bytes']:7.1f}x "
                f"{r['pass_s']:12.4f} {dense['pass_s'] / r['pass_s']:6.1f}x "
                f"{r['kernel_s']:10.4f} {dense['kernel_s'] / r['kernel_s']:6.1f}x"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
