"""Benchmark (issue 24, item 1): a file pass read through a map or with ``pread``, against ceilings.

Uses the ``.npy`` and uncompressed HDF5 files of ``bench_default_vs_process.py``
(256 x 256 x 128 x 128 u16, 2 GiB, page-cached).  In one run, interleaved per
repeat, medians reported:

Ceilings over the same bytes, 2 threads, pieces of ``--piece-mib``:

* ``pread``: ``os.preadv`` into a reused buffer (no touch);
* ``pread + sum``: and one sweep of the buffer (numpy uint64 sum);
* ``map + sum``: a fresh view through one map of the file, one sweep, the
  piece's pages dropped (``madvise(MADV_DONTNEED)``);
* ``pread + digest + sum`` / ``map + digest + sum``: two sweeps, as a pass
  sweeps a piece (XXH3-128 content digest, then a kernel's read).

Passes: BF + ADF + CoM through the embedded default (1 worker x 2 threads)
with ``read_method`` = ``pread``, ``mmap`` and ``auto`` (the worker's probe),
on the ``.npy`` and the HDF5 file; the chunk records' summed read, hash and
kernel thread-seconds; the percentage of the best read-and-touch ceiling.

    python benchmarks/bench_read_method.py --repeats 5 --json benchmarks/results_read_method.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def ceiling(path: Path, kind: str, piece: int, threads: int = 2) -> float:
    """GB/s of one sweep of the file's pieces the way ``kind`` names."""
    import xxhash

    size = os.path.getsize(path)
    off0 = 4096
    n = (size - off0) // piece
    fd = os.open(path, os.O_RDONLY)
    big = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    page = mmap.PAGESIZE

    def work(t: int) -> None:
        buf = np.zeros(piece, dtype=np.uint8)
        for i in range(t, n, threads):
            off = off0 + i * piece
            if kind.startswith("pread"):
                os.preadv(fd, [memoryview(buf.data)], off)
                view = buf
            else:
                view = np.frombuffer(big, dtype=np.uint8, count=piece, offset=off)
            if "digest" in kind:
                xxhash.xxh3_128(memoryview(view.data)).digest()
            if "sum" in kind:
                np.add.reduce(view.view(np.uint64))
            if kind.startswith("map"):
                del view
                a = off // page * page
                big.madvise(mmap.MADV_DONTNEED, a, off + piece - a)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    dt = time.perf_counter() - t0
    big.close()
    os.close(fd)
    return n * piece / dt / 1e9


def one_pass(ds: Any, method: str, k: int) -> dict[str, Any]:
    import quantem_flow as qf
    from quantem_flow.io.read_method import forget_probes

    c = (k / 2, k / 2)
    ops = [
        qf.virtual_bf(ds, radius=k / 6, center=c),
        qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
        qf.center_of_mass(ds, center=c),
    ]
    forget_probes()  # the client's; the worker keeps its probe per file (as in use)
    with qf.config.set(read_method=method):
        t = time.perf_counter()
        res = qf.compute(*ops, progress=False)
        wall = time.perf_counter() - t
    ex = res[0].provenance.execution
    chunks = ex["chunks"]
    reads = {c["streamed"]["read"]["method"] for c in chunks}
    return {
        "s": wall,
        "GBps": ds.nbytes / wall / 1e9,
        "read_s": ex["read_s_total"],
        "hash_s": ex["hash_s_total"],
        "kernel_s": ex["kernel_s_total"],
        "methods": sorted(reads),
        "probe": chunks[0]["streamed"]["read"].get("measured_GBps"),
        "values": [np.asarray(r).copy() for r in res],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench14"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--piece-mib", type=float, default=2.0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    from bench_default_vs_process import warm, write_data

    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    scan, k = (256, 256), 128
    paths = write_data(a.dir, scan, k)
    for p in paths.values():
        warm(p)
    client = qc.embedded_client()
    workers = [(w["name"], w["nthreads"]) for w in client.scheduler_info()["workers"].values()]
    dsets = {
        "npy": qf.open(paths["npy"]),
        "h5": qf.open(paths["h5"], dataset_path="/data", scan_shape=scan),
    }
    piece = int(a.piece_mib * (1 << 20))
    kinds = ["pread", "pread + sum", "map + sum", "pread + digest + sum", "map + digest + sum"]
    methods = ["pread", "mmap", "auto"]
    ceil: dict[str, dict[str, list[float]]] = {f: {kk: [] for kk in kinds} for f in dsets}
    passes: dict[str, dict[str, list[dict[str, Any]]]] = {
        f: {m: [] for m in methods} for f in dsets
    }
    with qf.config.set(stream_piece_mib=a.piece_mib):
        for ds in dsets.values():  # warm-up: kernels, the worker's probes
            for m in methods:
                one_pass(ds, m, k)
        for r in range(a.repeats):
            for name, ds in dsets.items():
                for kind in kinds:
                    ceil[name][kind].append(ceiling(paths[name], kind, piece))
                for m in methods:
                    passes[name][m].append(one_pass(ds, m, k))
            print(f"repeat {r + 1}/{a.repeats} done", flush=True)
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "workers": workers,
        "piece_mib": a.piece_mib,
        "repeats": a.repeats,
        "files": {},
    }
    print(f"\n2 GiB u16, pieces of {a.piece_mib} MiB, medians of {a.repeats}; workers {workers}")
    for name in dsets:
        c = {kk: statistics.median(v) for kk, v in ceil[name].items()}
        best_touch = max(c["pread + sum"], c["map + sum"])
        best_two = max(c["pread + digest + sum"], c["map + digest + sum"])
        print(f"\n{name}: ceilings GB/s " + ", ".join(f"{kk} {v:.1f}" for kk, v in c.items()))
        rows = {}
        ref = passes[name]["pread"][0]["values"]
        for m in methods:
            runs = passes[name][m]
            for run in runs:
                for x, y in zip(run["values"], ref, strict=True):
                    np.testing.assert_array_equal(x, y)
            med = {
                key: statistics.median(run[key] for run in runs)
                for key in ("s", "GBps", "read_s", "hash_s", "kernel_s")
            }
            med["methods"] = sorted({mm for run in runs for mm in run["methods"]})
            med["probe_GBps"] = runs[-1]["probe"]
            med["pct_of_best_read_and_touch"] = 100 * med["GBps"] / best_touch
            med["pct_of_best_two_sweeps"] = 100 * med["GBps"] / best_two
            med["per_run_GBps"] = [round(run["GBps"], 3) for run in runs]
            rows[m] = med
            print(
                f"  read_method={m:5s} {med['GBps']:5.2f} GB/s "
                f"({med['pct_of_best_read_and_touch']:.0f} % "
                f"of best read+sum, {med['pct_of_best_two_sweeps']:.0f} % of best two sweeps) "
                f"read {med['read_s']:.3f} hash {med['hash_s']:.3f} kernel {med['kernel_s']:.3f} "
                f"thread-s; used {med['methods']}; probe {med['probe_GBps']}"
            )
        report["files"][name] = {"ceilings_GBps": c, "passes": rows}
    print("\nvalues identical across read methods: yes")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
