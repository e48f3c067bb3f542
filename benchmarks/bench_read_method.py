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

The pass's own work with no engine around it, 2 threads (the bound of goal 1):

* ``pread + digest + kernel`` / ``map + digest + kernel``: each piece read,
  digested and run through the CPU runtime's prepared BF + ADF + CoM pass
  (the kernel variant a pass of these detectors runs), as a streamed chunk
  does, without Dask, records or Python per chunk;
* ``pread + kernel`` / ``map + kernel``: the same without the digest;
* ``pread + kernel carrying the digest`` / ``map + ...``: the kernel hashes
  each group of four frames right after its sweep of them (what a pass does
  with ``digest_in_kernel``, the default; docs/digest-in-kernel.md);
* ``... (map pieces)``: the map's kinds in pieces of ``--map-piece-mib`` (the
  ``map_piece_mib`` setting: what a pass maps at a time where the kernel carries
  the digest), so the best ceiling is the best over both piece sizes.

Passes: BF + ADF + CoM through the embedded default (1 worker x 2 threads)
with ``read_method`` = ``pread``, ``mmap`` and ``auto`` (the worker's probe),
``auto`` and ``mmap`` with ``digest_in_kernel`` off (each piece hashed in a
sweep of its own, as before), ``auto`` with ``direct_passes`` off (``auto, graph``:
the pass through the scheduler instead of one message to the worker), and with
``client="threads"`` (``auto``), on
the ``.npy`` and the HDF5 file (values and content digests checked equal);
the chunk records' summed read, hash and kernel thread-seconds; the
percentage of the best read-and-touch ceiling.  And what a pass costs
whatever its size (a pass over 4 x 4 frames, each client; and one Dask task
that does nothing, submitted and its result fetched: what any pass through
the cluster pays): the bare loop's time plus that cost is the most a pass
through that client could reach.

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


def ceiling(path: Path, kind: str, piece: int, threads: int = 2, k: int = 128) -> float:
    """GB/s of one sweep of the file's pieces the way ``kind`` names."""
    import xxhash
    from bench_default_vs_process import numpy_masks

    from quantem_flow.runtimes.cpu.prepared import PreparedFramePass
    from quantem_flow.runtimes.cpu.row_hash import RowHasher

    size = os.path.getsize(path)
    off0 = 4096
    n = (size - off0) // piece
    fd = os.open(path, os.O_RDONLY)
    big = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    page = mmap.PAGESIZE
    frame = k * k * 2
    # BF, ADF and CoM's three rows as one_pass asks for them (the NumPy baseline's masks)
    weights = numpy_masks(k, com=True).astype(np.float64)

    def work(t: int) -> None:
        buf = np.zeros(piece, dtype=np.uint8)
        mine = range(t, n, threads)
        prepared = (
            PreparedFramePass(
                weights,
                dtype=np.dtype(np.uint16),
                n_frames=len(mine) * (piece // frame),
                want_sum=False,
                want_max=False,
                frame_shape=(k, k),
                background_jit=False,
            )
            if "kernel" in kind
            else None
        )
        for i in mine:
            off = off0 + i * piece
            if kind.startswith("pread"):
                os.preadv(fd, [memoryview(buf.data)], off)
                view = buf
            else:
                view = np.frombuffer(big, dtype=np.uint8, count=piece, offset=off)
            carrying = "carrying the digest" in kind
            if "digest" in kind and not carrying:
                xxhash.xxh3_128(memoryview(view.data)).digest()
            if "sum" in kind:
                np.add.reduce(view.view(np.uint64))
            if prepared is not None:
                frames = view[: piece // frame * frame].view(np.uint16).reshape(-1, k * k)
                hasher = (
                    RowHasher(row_frames=frames.shape[0], frame_nbytes=frame) if carrying else None
                )
                prepared.run(frames, hasher=hasher)
                if hasher is not None:
                    assert len(hasher.digests()) == 1
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


def _ops(ds: Any, k: int) -> list[Any]:
    import quantem_flow as qf

    c = (k / 2, k / 2)
    return [
        qf.virtual_bf(ds, radius=k / 6, center=c),
        qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
        qf.center_of_mass(ds, center=c),
    ]


def one_pass(ds: Any, method: str, k: int) -> dict[str, Any]:
    """One BF + ADF + CoM pass; ``method`` a ``read_method``, or ``threads`` (auto, in-process).

    ``<method>, own digest``: with ``digest_in_kernel`` off; ``<method>, graph``: with
    ``direct_passes`` off (the pass through the scheduler, as before the fifteenth stop).
    """
    import quantem_flow as qf

    ops = _ops(ds, k)
    client = "threads" if method == "threads" else None
    read, *modifiers = method.split(", ")
    # every process keeps its probe per file, as in use (the worker's, and this one's for
    # "threads"): the warm-up passes measured them
    with qf.config.set(
        read_method="auto" if method == "threads" else read,
        digest_in_kernel="own digest" not in modifiers,
        direct_passes="graph" not in modifiers,
    ):
        t = time.perf_counter()
        res = qf.compute(*ops, progress=False, client=client)
        wall = time.perf_counter() - t
    ex = res[0].provenance.execution
    chunks = ex["chunks"]
    reads = {c["streamed"]["read"]["method"] for c in chunks}
    return {
        "digest": res[0].provenance.source["content_digest"]["digest"],
        "digest_how": sorted({c["streamed"]["digest"].split(" (")[0] for c in chunks}),
        "s": wall,
        "GBps": ds.nbytes / wall / 1e9,
        "read_s": ex["read_s_total"],
        "hash_s": ex["hash_s_total"],
        "kernel_s": ex["kernel_s_total"],
        "methods": sorted(reads),
        "route": (ex.get("query_route") or {}).get("path"),
        "probe": chunks[0]["streamed"]["read"].get("measured_GBps"),
        "piece_bytes": sorted(
            {int(c["streamed"]["piece_frames"]) * ds.shape[2] * ds.shape[3] * 2 for c in chunks}
        ),
        "values": [np.asarray(r).copy() for r in res],
    }


def _tiny_npy(directory: Path, k: int) -> Path:
    """A 4 x 4 scan of k x k uint16 frames: a pass whose work is nothing, its cost all fixed."""
    path = directory / f"tiny_4x4x{k}x{k}.npy"
    if not path.exists():
        rng = np.random.default_rng(0)
        np.save(path, rng.integers(0, 100, (4, 4, k, k), dtype=np.uint16))
    return path


def fixed_cost(tiny: Any, k: int, client: str, n: int = 9) -> float:
    """Median seconds of ``n`` BF + ADF + CoM passes over ``tiny`` through ``client``."""
    import quantem_flow as qf

    times = []
    for _ in range(n):
        t = time.perf_counter()
        qf.compute(*_ops(tiny, k), progress=False, client=None if client == "default" else client)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _nothing() -> None:
    return None


def dask_round_trip(client: Any, n: int = 9) -> float:
    """Median seconds of ``client.submit`` of a task that does nothing, and its result."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        client.submit(_nothing, pure=False).result()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def resident_fraction(path: Path) -> float:
    """The fraction of ``path``'s pages in the page cache now (``mincore`` on a map of it).

    Some VMs here keep ~4.5 GB of page cache whatever memory is free: the files of a
    run that reads both 2 GiB files then come partly from disk, which this shows.
    """
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    vec = np.zeros(-(-size // mmap.PAGESIZE), dtype=np.uint8)
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return float("nan")
    try:
        if libc.mincore(addr, size, vec.ctypes.data) != 0:
            return float("nan")
    finally:
        libc.munmap(addr, size)
    return float((vec & 1).astype(bool).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench14"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--piece-mib", type=float, default=2.0)
    ap.add_argument("--map-piece-mib", type=float, default=None, help="default: the setting")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--files",
        default="npy,h5",
        help="which files, comma-separated: on a machine whose page cache holds less than "
        "both (2 x 2 GiB), measure one per run",
    )
    a = ap.parse_args()
    from bench_default_vs_process import warm, write_data

    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    scan, k = (256, 256), 128
    paths = write_data(a.dir, scan, k)
    for name in a.files.split(","):
        warm(paths[name])
    client = qc.embedded_client()
    workers = [(w["name"], w["nthreads"]) for w in client.scheduler_info()["workers"].values()]
    opened = {
        "npy": lambda: qf.open(paths["npy"]),
        "h5": lambda: qf.open(paths["h5"], dataset_path="/data", scan_shape=scan),
    }
    dsets = {name: opened[name]() for name in a.files.split(",")}
    resident: dict[str, list[float]] = {name: [] for name in dsets}
    piece = int(a.piece_mib * (1 << 20))
    map_mib = float(qf.config.get("map_piece_mib")) if a.map_piece_mib is None else a.map_piece_mib
    map_piece = int(map_mib * (1 << 20))
    kinds = [
        "pread",
        "pread + sum",
        "map + sum",
        "pread + digest + sum",
        "map + digest + sum",
        "pread + digest + kernel",
        "map + digest + kernel",
        "pread + kernel",
        "map + kernel",
        "pread + kernel carrying the digest",
        "map + kernel carrying the digest",
        "map + sum (map pieces)",
        "map + kernel carrying the digest (map pieces)",
    ]
    methods = [
        "pread",
        "mmap",
        "auto",
        "auto, graph",
        "mmap, own digest",
        "auto, own digest",
        "threads",
    ]
    ceil: dict[str, dict[str, list[float]]] = {f: {kk: [] for kk in kinds} for f in dsets}
    passes: dict[str, dict[str, list[dict[str, Any]]]] = {
        f: {m: [] for m in methods} for f in dsets
    }
    tiny = qf.open(_tiny_npy(a.dir, k))
    fixed: dict[str, list[float]] = {"default": [], "threads": []}
    floor: list[float] = []  # one task through Dask, nothing done: its own cost of a pass
    client_obj = client
    with qf.config.set(stream_piece_mib=a.piece_mib, map_piece_mib=map_mib):
        for client in fixed:
            fixed_cost(tiny, k, client)
        for ds in dsets.values():  # warm-up: kernels, the worker's probes
            for m in methods:
                one_pass(ds, m, k)
        for r in range(a.repeats):
            for name, ds in dsets.items():
                resident[name].append(resident_fraction(paths[name]))
                for kind in kinds:
                    size = map_piece if kind.endswith("(map pieces)") else piece
                    ceil[name][kind].append(ceiling(paths[name], kind, size))
                for m in methods:
                    passes[name][m].append(one_pass(ds, m, k))
            for client in fixed:
                fixed[client].append(fixed_cost(tiny, k, client))
            floor.append(dask_round_trip(client_obj))
            print(f"repeat {r + 1}/{a.repeats} done", flush=True)
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "workers": workers,
        "piece_mib": a.piece_mib,
        "map_piece_mib": map_mib,
        "repeats": a.repeats,
        "files": {},
    }
    fixed_s = {cl: statistics.median(v) for cl, v in fixed.items()}
    fixed_s["Dask's round trip"] = statistics.median(floor)
    report["fixed_cost_s"] = fixed_s
    print(
        f"\n2 GiB u16, pieces of {a.piece_mib} MiB (mapped, swept once: {map_mib} MiB), "
        f"medians of {a.repeats}; workers {workers}"
    )
    print(
        "cost of a pass on 4 x 4 frames (what a pass costs whatever its size): "
        + ", ".join(f"{cl} {1e3 * v:.1f} ms" for cl, v in fixed_s.items())
    )
    for name in dsets:
        c = {kk: statistics.median(v) for kk, v in ceil[name].items()}
        best_touch = max(c["pread + sum"], c["map + sum"], c["map + sum (map pieces)"])
        best_two = max(c["pread + digest + sum"], c["map + digest + sum"])
        bare_sweep = max(c["pread + digest + kernel"], c["map + digest + kernel"])
        bare = max(
            c["pread + kernel carrying the digest"],
            c["map + kernel carrying the digest"],
            c["map + kernel carrying the digest (map pieces)"],
        )
        bare_no_digest = max(c["pread + kernel"], c["map + kernel"])
        print(f"\n{name}: ceilings GB/s " + ", ".join(f"{kk} {v:.1f}" for kk, v in c.items()))
        print(
            f"  in the page cache at each repeat's start: {min(resident[name]):.0%} at least, "
            f"median {statistics.median(resident[name]):.0%}"
        )
        nbytes = dsets[name].nbytes
        # the most a pass through each client could reach: its own work at the bare loop's
        # rate plus what a pass costs whatever its size
        best_through = {cl: nbytes / (nbytes / (bare * 1e9) + v) / 1e9 for cl, v in fixed_s.items()}
        print(
            f"  the pass's own work with no engine: {bare:.2f} GB/s = "
            f"{100 * bare / best_touch:.0f} % of the best read+sum ceiling "
            f"({100 * bare_no_digest / best_touch:.0f} % without the digest, "
            f"{100 * bare_sweep / best_touch:.0f} % with the digest in a sweep of its own); "
            "with each "
            "client's fixed cost at most "
            + ", ".join(
                f"{cl} {v:.2f} GB/s ({100 * v / best_touch:.0f} %)"
                for cl, v in best_through.items()
            )
        )
        rows = {}
        ref = passes[name]["pread"][0]["values"]
        for m in methods:
            runs = passes[name][m]
            for run in runs:
                for x, y in zip(run["values"], ref, strict=True):
                    np.testing.assert_array_equal(x, y)
                assert run["digest"] == passes[name]["pread"][0]["digest"], (m, run["digest"])
            med = {
                key: statistics.median(run[key] for run in runs)
                for key in ("s", "GBps", "read_s", "hash_s", "kernel_s")
            }
            med["methods"] = sorted({mm for run in runs for mm in run["methods"]})
            med["probe_GBps"] = runs[-1]["probe"]
            med["piece_bytes"] = sorted({b for run in runs for b in run["piece_bytes"]})
            med["digest_how"] = sorted({h for run in runs for h in run["digest_how"]})
            med["pct_of_best_read_and_touch"] = 100 * med["GBps"] / best_touch
            med["pct_of_best_two_sweeps"] = 100 * med["GBps"] / best_two
            med["per_run_GBps"] = [round(run["GBps"], 3) for run in runs]
            med["per_run_methods"] = [run["methods"] for run in runs]
            med["routes"] = sorted({str(run["route"]) for run in runs})
            rows[m] = med
            print(
                f"  read_method={m:17s} {med['GBps']:5.2f} GB/s "
                f"({med['pct_of_best_read_and_touch']:.0f} % "
                f"of best read+sum, {med['pct_of_best_two_sweeps']:.0f} % of best two sweeps) "
                f"read {med['read_s']:.3f} hash {med['hash_s']:.3f} kernel {med['kernel_s']:.3f} "
                f"thread-s; used {med['methods']} pieces {med['piece_bytes']}; "
                f"probe {med['probe_GBps']}; digest {med['digest_how']}; route {med['routes']}"
            )
        report["files"][name] = {
            "ceilings_GBps": c,
            "passes": rows,
            "bare_pass_pct_of_best_read_and_touch": 100 * bare / best_touch,
            "bare_pass_digest_own_sweep_pct": 100 * bare_sweep / best_touch,
            "bare_pass_without_digest_pct": 100 * bare_no_digest / best_touch,
            "at_most_GBps": best_through,
            "resident_fraction_per_repeat": resident[name],
        }
    print("\nvalues and content digests identical across read methods: yes")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
