"""Benchmark: BF + ADF + CoM in one pass, against the machine's own ceilings.

Run from the repository root::

    python benchmarks/bench_one_pass.py            # 256 x 256 x 128 x 128 u16 (2 GiB)
    python benchmarks/bench_one_pass.py --scan 64  # a quick, smaller run

It generates the dataset once (``bench-data/``, git-ignored) as a
page-cached ``.npy`` file and as an HDF5 file with one bitshuffle+LZ4 chunk
per frame (the Dectris layout), then measures, side by side in ONE run:

* ceiling 1, ``numpy_sum``: ``np.sum`` over the same 2 GiB of u16 in memory
  (the issue's memory-bandwidth ceiling), and ``stream_read``: a float64
  view sum over the same bytes (closer to raw read bandwidth);
* ceiling 2, ``hdf5plugin_decode``: one process reading the whole HDF5
  dataset through h5py + hdf5plugin (single-pass decompression speed);
* the engine: BF + ADF + CoM in one pass from (a1) the in-memory array in
  this process (synchronous, one core), (a2) the page-cached ``.npy`` on
  the embedded local cluster, (b) the HDF5 file on the local cluster;
  bytes read per pass are checked against the dataset's bytes.

Every figure is the median of ``--repeat`` timed runs after one warm-up.
The result is printed as a table and written as JSON (``--json``).
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

import quantem_flow as qf  # noqa: E402

DATA_DIR = ROOT / "bench-data"
CENTER = (61.3, 66.8)  # off-centre probe, (row, col) px
RADIUS = 14.0


def generate(scan: int, det: int, seed: int = 7) -> tuple[Path, Path]:
    """Write the benchmark dataset as .npy and bitshuffle+LZ4 HDF5 (once)."""
    import h5py
    import hdf5plugin

    DATA_DIR.mkdir(exist_ok=True)
    stem = DATA_DIR / f"bench_{scan}x{scan}x{det}x{det}_u16"
    npy, h5 = stem.with_suffix(".npy"), stem.with_suffix(".h5")
    if npy.exists() and h5.exists():
        return npy, h5
    rng = np.random.default_rng(seed)
    rr, cc = np.indices((det, det))
    d = np.hypot(rr - CENTER[0] * det / 128, cc - CENTER[1] * det / 128)
    disk = np.clip(RADIUS * det / 128 - d + 0.5, 0, 1)
    lam = 0.05 + 40.0 * disk + 2.0 * np.exp(-d / (det / 6))
    mm = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint16, shape=(scan, scan, det, det))
    with h5py.File(h5, "w") as f:
        dset = f.create_dataset(
            "data",
            shape=(scan * scan, det, det),
            dtype=np.uint16,
            chunks=(1, det, det),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
        for r in range(scan):
            shift = rng.integers(-2, 3, size=2)
            frames = rng.poisson(np.roll(lam, tuple(shift), axis=(0, 1)), size=(scan, det, det))
            mm[r] = frames.astype(np.uint16)
            dset[r * scan : (r + 1) * scan] = mm[r]
    mm.flush()
    del mm
    return npy, h5


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float], Any]:
    fn()  # warm-up: compilation, page cache, worker start
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "quantem_flow": qf.__version__,
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
        with open("/proc/meminfo") as f:
            info["mem_total"] = f.readline().split(":", 1)[1].strip()
    except (OSError, StopIteration):
        pass
    return info


def pipeline(ds: qf.Dataset4D) -> list[qf.LazyResult]:
    return [
        qf.virtual_bf(ds, radius=RADIUS, center=CENTER),
        qf.virtual_adf(ds, inner=2 * RADIUS, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=256)
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    t = time.perf_counter()
    npy, h5 = generate(args.scan, args.det)
    gen_s = time.perf_counter() - t
    nbytes = args.scan * args.scan * args.det * args.det * 2
    gb = nbytes / 1e9
    rows: list[tuple[str, float, float, str]] = []
    out: dict[str, Any] = {
        "machine": machine(),
        "dataset": {
            "shape": [args.scan, args.scan, args.det, args.det],
            "dtype": "uint16",
            "bytes": nbytes,
            "hdf5_bytes": h5.stat().st_size,
        },
        "generate_s": gen_s,
        "repeat": args.repeat,
    }

    # ceilings -----------------------------------------------------------------
    arr = np.load(npy)  # into memory
    s_sum, t_sum, _ = timed(lambda: arr.sum(), args.repeat)
    s_stream, t_stream, _ = timed(lambda: arr.view(np.float64).sum(), args.repeat)

    import h5py
    import hdf5plugin  # noqa: F401

    def decode_all() -> int:
        with h5py.File(h5, "r") as f:
            d = f["data"]
            buf = np.empty((args.scan, args.det, args.det), dtype=np.uint16)
            for r in range(args.scan):
                d.read_direct(buf, np.s_[r * args.scan : (r + 1) * args.scan])
        return int(buf[0, 0, 0])

    s_dec, t_dec, _ = timed(decode_all, args.repeat)

    # the engine ---------------------------------------------------------------
    ds_mem = qf.open(arr)
    s_a1, t_a1, res_a1 = timed(
        lambda: qf.compute(*pipeline(ds_mem), client="synchronous"), args.repeat
    )
    from distributed import Client

    from quantem_flow.graphs import dashboard_url, start_local_cluster

    cluster = start_local_cluster(n_workers=args.workers)
    client = Client(cluster, set_as_default=False)
    print(f"dashboard: {dashboard_url(client)}", file=sys.stderr)
    ds_npy = qf.open(npy)
    s_a2, t_a2, res_a2 = timed(lambda: qf.compute(*pipeline(ds_npy), client=client), args.repeat)
    ds_h5 = qf.open(h5, dataset_path="/data", scan_shape=(args.scan, args.scan))
    s_b, t_b, res_b = timed(lambda: qf.compute(*pipeline(ds_h5), client=client), args.repeat)
    n_workers = len(client.scheduler_info()["workers"])
    client.close()
    cluster.close()

    # parity and bytes read -------------------------------------------------------
    for res in (res_a2, res_b):
        for x, y in zip(res, res_a1, strict=True):
            np.testing.assert_allclose(x.data, y.data, rtol=1e-12, equal_nan=True)
    ex = {k: r[0].provenance.execution for k, r in (("a1", res_a1), ("a2", res_a2), ("b", res_b))}
    assert all(e["bytes_read"] == nbytes and e["read_once"] for e in ex.values()), ex

    def gbps(s: float) -> float:
        return gb / s

    rows = [
        ("ceiling: np.sum over the 2 GiB u16 array (1 core)", s_sum, gbps(s_sum), ""),
        ("ceiling: stream read (float64 view sum, 1 core)", s_stream, gbps(s_stream), ""),
        ("ceiling: h5py+hdf5plugin decode, one process", s_dec, gbps(s_dec), ""),
        (
            "(a1) in-memory array, synchronous (1 core)",
            s_a1,
            gbps(s_a1),
            f"{gbps(s_a1) / gbps(s_sum):.0%} of np.sum",
        ),
        (
            f"(a2) page-cached .npy, local cluster ({n_workers} workers)",
            s_a2,
            gbps(s_a2),
            f"{gbps(s_a2) / gbps(s_sum):.0%} of np.sum, "
            f"{gbps(s_a2) / gbps(s_stream):.0%} of stream",
        ),
        (
            f"(b) HDF5 bitshuffle+LZ4, local cluster ({n_workers} workers)",
            s_b,
            gbps(s_b),
            f"{gbps(s_b) / gbps(s_dec):.0%} of single-pass decode",
        ),
    ]
    print(
        f"\n{args.scan}x{args.scan} scan x {args.det}x{args.det} u16 = {nbytes / 2**30:.2f} GiB; "
        f"HDF5 {h5.stat().st_size / 2**30:.2f} GiB; median of {args.repeat}"
    )
    print(f"{'measurement':62s} {'s':>7s} {'GB/s':>7s}  ratio")
    for name, s, g, ratio in rows:
        print(f"{name:62s} {s:7.3f} {g:7.2f}  {ratio}")
    out["rows"] = [{"name": n, "median_s": s, "GB_per_s": g, "ratio": r} for n, s, g, r in rows]
    out["times"] = {
        "np_sum": t_sum,
        "stream": t_stream,
        "decode": t_dec,
        "a1": t_a1,
        "a2": t_a2,
        "b": t_b,
    }
    out["bytes_read_per_pass"] = {k: e["bytes_read"] for k, e in ex.items()}
    out["n_chunks"] = {k: e["n_chunks"] for k, e in ex.items()}
    out["workers"] = n_workers
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
