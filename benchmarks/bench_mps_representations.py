"""Benchmark: resident bytes and BF + ADF + CoM pass time per representation, mps beside cpu.

Run from the repository root::

    python benchmarks/bench_mps_representations.py --repeat 3

Two generated uint16 datasets (default 64 x 64 scan x 128 x 128 detector,
128 MiB dense each, the generator of ``bench_representations.py``): low
dose (1 electron per 100 pixels per frame) and high dose (a bright-field
disk of ~40 counts).  Each is persisted in-process (``client="synchronous"``)
in every representation on the ``cpu`` runtime (Numba) and on the ``mps``
runtime (MLX; payloads resident as MLX arrays), results are checked against
the dense CPU pass (integer images exactly, CoM to 1e-10), then BF + ADF +
CoM runs on the resident chunks ``--repeat`` times.

MLX on a machine without Metal runs on its CPU backend: there the mps
figures measure a correctness path (float64 accumulation, conformance
tested), not an accelerator, and ``backend="auto"`` never picks it.
"""

from __future__ import annotations

import argparse
import json
import platform
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
RUNTIMES = ("cpu", "mps")


def make(kind: str, scan: int, det: int, seed: int) -> np.ndarray:
    """Low- or high-dose uint16 frames (as ``bench_representations.py`` makes them)."""
    rng = np.random.default_rng(seed)
    rr, cc = np.indices((det, det))
    d = np.hypot(rr - 0.47 * det, cc - 0.53 * det)
    if kind == "low":
        lam = np.full((det, det), 0.005) + 0.02 * (d < det / 8)
        lam *= 0.01 / lam.mean()
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
    reference = qf.compute(*pipeline(base, det), client="synchronous", backend="cpu")
    rows = []
    for rep in REPS:
        ds = base if rep == "dense" else base.to_representation(rep, verify="full")
        for runtime in RUNTIMES:
            t = time.perf_counter()
            p = ds.persist(client="synchronous", backend=runtime)
            persist_s = time.perf_counter() - t
            out = qf.compute(*pipeline(p, det))
            for x, y in zip(out, reference, strict=True):
                if x.data.dtype.kind in "iu":
                    np.testing.assert_array_equal(x.data, y.data)
                else:
                    np.testing.assert_allclose(
                        x.data, y.data, rtol=1e-10, atol=1e-9, equal_nan=True
                    )
            ex = out[0].provenance.execution
            assert ex["runtimes"] == [runtime], ex["runtimes"]
            residency = sorted({r["residency"] for r in ex["chunks"]})
            times, kernel = [], []
            for _ in range(repeat):
                t = time.perf_counter()
                res = qf.compute(*pipeline(p, det))
                times.append(time.perf_counter() - t)
                kernel.append(float(res[0].provenance.execution["kernel_s_total"]))
            rows.append(
                {
                    "representation": rep,
                    "runtime": runtime,
                    "residency": residency,
                    "resident_bytes": int(p.resident.resident_bytes),
                    "dense_bytes": int(data.nbytes),
                    "persist_s": persist_s,
                    "pass_s": statistics.median(times),
                    "kernel_s": statistics.median(kernel),
                    "times": times,
                    "kernel_times": kernel,
                }
            )
            p.release()
            mib, pass_s = rows[-1]["resident_bytes"] / 2**20, rows[-1]["pass_s"]
            print(f"  {rep:8s} {runtime:4s} {residency} {mib:9.2f} MiB pass {pass_s:.4f} s")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk-mib", type=float, default=32.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import mlx.core as mx

    from quantem_flow.runtimes import get_runtime

    mps = get_runtime("mps")
    report: dict[str, Any] = {
        "shape": [args.scan, args.scan, args.det, args.det],
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "mlx": str(mx.__version__),
        "mlx_device": str(mx.default_device()),
        "mps_describe": mps.describe(),
    }
    print(f"MLX {mx.__version__} on {mx.default_device()} ({mps.describe()['available']})")
    for kind in ("low", "high"):
        data = make(kind, args.scan, args.det, seed=3)
        occupancy = float(np.count_nonzero(data)) / data.size
        print(f"{kind}-dose, occupancy {occupancy:.2%}", flush=True)
        rows = measure(data, args.repeat, args.chunk_mib)
        report[kind] = {"occupancy": occupancy, "rows": rows}
        print(
            f"\n{kind}-dose: {args.scan}x{args.scan}x{args.det}x{args.det} u16, occupancy "
            f"{occupancy:.2%}; median of {args.repeat}"
        )
        print("| representation | runtime | resident MiB | pass s | kernels s | mps / cpu |")
        print("|---|---|---:|---:|---:|---:|")
        by = {(r["representation"], r["runtime"]): r for r in rows}
        for r in rows:
            cpu = by[(r["representation"], "cpu")]
            print(
                f"| {r['representation']} | {r['runtime']} | "
                f"{r['resident_bytes'] / 2**20:.2f} | {r['pass_s']:.4f} | {r['kernel_s']:.4f} | "
                f"{r['pass_s'] / cpu['pass_s']:.1f}x |"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
