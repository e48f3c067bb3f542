"""The embedded default cluster vs one process vs LiberTEM, with the read ceiling (issue 14).

Writes one dataset (default 256 x 256 scan of 128 x 128 uint16 frames,
2 GiB) three ways under ``--dir``: a ``.npy`` file, an uncompressed HDF5
dataset of frames (contiguous) and an HDF5 dataset chunked one frame per
chunk with bitshuffle + LZ4 (the Dectris layout).  Frames are drawn from a
pool of distinct Poisson frames of a bright disk, so every frame
compresses like a real one.

Then, interleaved per repeat (every row and mode once per repeat, medians
reported), with the page cache warm:

* ``ceiling``: streaming reads of the same bytes (``os.preadv`` into a
  reused buffer) on 1 and 2 threads; with the ``persisted`` row, also the
  RAM ceiling: one sum over the same array in memory on 2 threads;
* ``h5py decode``: single-threaded ``h5py`` read of the bitshuffle file
  (the HDF5 filter decoding one chunk at a time);
* per row (BF+ADF and BF+ADF+CoM on npy; BF+ADF on HDF5 and on
  bitshuffle+LZ4; BF+ADF+CoM on persisted chunks) and per mode
  (``default``: ``qf.compute`` on the embedded local cluster;
  ``process``: ``client="synchronous"``; ``threads``: ``client="threads"``
  (this process, a thread per CPU); ``libertem``: LiberTEM's best of
  its inline and default Dask executors, when importable; ``numpy`` with
  ``--numpy``: blocks of 4096 frames, from a memory map, h5py or the in-RAM
  array, cast to float32 times the mask rows on the BLAS threads).

GB/s are dataset bytes (decoded, 2^30 bytes = 1.07 GB) over wall seconds.
Per-chunk provenance (read_s, kernel_s, compile_s, hash_s summed over
chunks) is printed for the quantem-flow modes.

    python benchmarks/bench_default_vs_process.py --dir /tmp/qf-bench14 --repeats 3 \
        --json benchmarks/results_default_vs_process.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

POOL = 1024


#: Mean counts per pixel inside the probe disk and outside it (``--counts DISK,DARK``): the
#: default compresses to 18 % with bitshuffle + LZ4; 20,0.02 to 9 %.
COUNTS = (40.0, 0.5)


def _frames(n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:k, :k]
    lam = np.where((yy - k / 2) ** 2 + (xx - k / 2) ** 2 < (k / 6) ** 2, *COUNTS)
    return rng.poisson(lam, size=(n, k, k)).astype(np.uint16)


def write_data(directory: Path, scan: tuple[int, int], k: int) -> dict[str, Path]:
    """Write the npy, HDF5 and bitshuffle+LZ4 files once (kept between runs)."""
    import h5py
    import hdf5plugin

    directory.mkdir(parents=True, exist_ok=True)
    tag = f"{scan[0]}x{scan[1]}x{k}x{k}" + (
        "" if COUNTS == (40.0, 0.5) else f"_counts{COUNTS[0]:g}_{COUNTS[1]:g}"
    )
    paths = {
        "npy": directory / f"data_{tag}.npy",
        "h5": directory / f"data_{tag}.h5",
        "bslz4": directory / f"data_{tag}_bslz4.h5",
    }
    n = scan[0] * scan[1]
    pool = _frames(POOL, k)
    step = 4096

    def block(a: int) -> np.ndarray:
        idx = (np.arange(a, min(n, a + step)) * 7919) % POOL
        return pool[idx]

    if not paths["npy"].exists():
        mm = np.lib.format.open_memmap(
            paths["npy"], mode="w+", dtype=np.uint16, shape=(*scan, k, k)
        )
        flat = mm.reshape(n, k, k)
        for a in range(0, n, step):
            flat[a : a + step] = block(a)
        mm.flush()
        del mm, flat
    for name, opts in (
        ("h5", {}),
        ("bslz4", {"chunks": (1, k, k), **hdf5plugin.Bitshuffle(cname="lz4")}),
    ):
        if paths[name].exists():
            continue
        with h5py.File(paths[name], "w") as f:
            d = f.create_dataset("data", shape=(n, k, k), dtype=np.uint16, **opts)
            for a in range(0, n, step):
                d[a : a + step] = block(a)
    return paths


def warm(path: Path) -> None:
    """Read a file once so that it is in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def split_timed(run: Any, total: int, threads: int) -> float:
    """Seconds for ``threads`` threads to run ``run(a, b)`` over equal parts of ``[0, total)``."""
    bounds = np.linspace(0, total, threads + 1).astype(np.int64)
    ts = [
        threading.Thread(target=run, args=(int(bounds[i]), int(bounds[i + 1])))
        for i in range(threads)
    ]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return time.perf_counter() - t


def ceiling(path: Path, threads: int, nbytes: int) -> float:
    """Seconds to stream the first ``nbytes`` of ``path`` on ``threads`` threads."""
    piece = 16 << 20
    fd = os.open(path, os.O_RDONLY)
    try:

        def run(a: int, b: int) -> None:
            buf = bytearray(piece)
            view = memoryview(buf)
            pos = a
            while pos < b:
                got = os.preadv(fd, [view[: min(piece, b - pos)]], pos)
                if got <= 0:
                    break
                pos += got

        return split_timed(run, nbytes, threads)
    finally:
        os.close(fd)


def ram_ceiling(block: np.ndarray, threads: int) -> float:
    """Seconds to sum an in-RAM array once on ``threads`` threads (the persisted pass's limit)."""
    flat = block.reshape(-1).view(np.uint64)
    return split_timed(lambda a, b: np.add.reduce(flat[a:b]), flat.size, threads)


def h5py_decode(path: Path) -> float:
    """Seconds to read the whole bitshuffle dataset with h5py on one thread."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers the filter)

    with h5py.File(path, "r") as f:
        d = f["data"]
        out = np.empty((4096, *d.shape[1:]), dtype=d.dtype)
        t = time.perf_counter()
        for a in range(0, d.shape[0], 4096):
            b = min(d.shape[0], a + 4096)
            d.read_direct(out[: b - a], source_sel=np.s_[a:b])
        return time.perf_counter() - t


def _ops(ds: Any, com: bool, k: int) -> list[Any]:
    import quantem_flow as qf

    c = (k / 2, k / 2)
    ops = [
        qf.virtual_bf(ds, radius=k / 6, center=c),
        qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
    ]
    if com:
        ops.append(qf.center_of_mass(ds, center=c))
    return ops


def numpy_masks(k: int, com: bool) -> np.ndarray:
    """The same detectors as ``_ops`` as float32 rows (BF, ADF, and CoM's three maps)."""
    yy, xx = np.mgrid[:k, :k]
    r2 = (yy - k / 2) ** 2 + (xx - k / 2) ** 2
    rows = [r2 < (k / 6) ** 2, (r2 >= (k / 4) ** 2) & (r2 < (k / 2) ** 2)]
    if com:
        rows += [np.ones((k, k)), yy - k / 2, xx - k / 2]
    return np.stack([np.asarray(r, dtype=np.float32).ravel() for r in rows])


def run_numpy(source: Any, masks: np.ndarray, block: int = 4096) -> float:
    """Seconds of the plain NumPy way: blocks of frames cast to float32 times the mask rows.

    ``source``: an array (a ``.npy`` memory map, an in-RAM array) or an ``h5py`` dataset
    of frames; the matrix product runs on the BLAS threads (2 here).
    """
    n = int(np.prod(source.shape[:-2]))
    k = int(np.prod(source.shape[-2:]))
    flat = source.reshape(n, k) if isinstance(source, np.ndarray) else None
    out = np.empty((n, masks.shape[0]), dtype=np.float32)
    t = time.perf_counter()
    for a in range(0, n, block):
        b = min(n, a + block)
        frames = flat[a:b] if flat is not None else source[a:b].reshape(b - a, k)
        np.matmul(frames.astype(np.float32), masks.T, out=out[a:b])
    return time.perf_counter() - t


def run_qf(ds: Any, com: bool, k: int, client: Any) -> tuple[float, dict[str, float]]:
    """Seconds of one ``qf.compute`` and the summed per-chunk timings."""
    import quantem_flow as qf

    ops = _ops(ds, com, k)
    t = time.perf_counter()
    results = qf.compute(*ops, client=client, progress=False)
    wall = time.perf_counter() - t
    ex = results[0].provenance.to_dict().get("execution", {}) if results else {}
    if not ex:
        ex = _find_execution(results[0])
    keys = ("read_s_total", "kernel_s_total", "compile_s_total", "hash_s_total")
    timing = {k_: float(ex.get(k_, float("nan"))) for k_ in keys}
    chunks = ex.get("chunks", [])
    per_worker: dict[str, float] = {}
    for r in chunks:
        w = str(r.get("worker", r.get("pid", "?")))
        per_worker[w] = per_worker.get(w, 0.0) + r["read_s"] + r["kernel_s"] + r.get("hash_s", 0)
    timing["busy_by_worker"] = sorted(per_worker.values())  # type: ignore[assignment]
    timing["route"] = (ex.get("query_route") or {}).get("path")  # type: ignore[assignment]
    return wall, timing


def _find_execution(result: Any) -> dict[str, Any]:
    prov = result.provenance
    for name in ("execution",):
        v = getattr(prov, name, None)
        if isinstance(v, dict):
            return v
    d = prov.to_dict() if hasattr(prov, "to_dict") else {}
    stack = [d]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if "read_s_total" in x:
                return x
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return {}


def libertem_runner(paths: dict[str, Path], scan: tuple[int, int], k: int) -> Any:
    """Return ``run(fmt, com) -> seconds`` over LiberTEM's executors, or None if missing."""
    try:
        import libertem.api as lt
        from libertem.udf.com import CoMUDF
        from libertem.udf.masks import ApplyMasksUDF
    except ImportError:
        return None
    ctxs = {"inline": lt.Context.make_with("inline"), "dask": lt.Context()}
    yy, xx = np.mgrid[:k, :k]
    r2 = (yy - k / 2) ** 2 + (xx - k / 2) ** 2

    def masks() -> list[Any]:
        return [
            lambda: (r2 < (k / 6) ** 2).astype(np.float32),
            lambda: ((r2 >= (k / 4) ** 2) & (r2 < (k / 2) ** 2)).astype(np.float32),
        ]

    datasets: dict[tuple[str, str], Any] = {}

    def run(fmt: str, com: bool) -> dict[str, float]:
        out = {}
        for name, ctx in ctxs.items():
            key = (name, fmt)
            if key not in datasets:
                if fmt == "npy":
                    datasets[key] = ctx.load("npy", path=str(paths["npy"]))
                else:
                    datasets[key] = ctx.load(
                        "hdf5", path=str(paths[fmt]), ds_path="/data", sig_dims=2
                    )
                    datasets[key].set_num_cores(os.cpu_count() or 1)
            ds = datasets[key]
            if fmt != "npy" and tuple(ds.shape.nav) != scan:
                # the HDF5 file stores frames: give LiberTEM the scan shape
                datasets[key] = ds = ctx.load(
                    "hdf5", path=str(paths[fmt]), ds_path="/data", sig_dims=2, nav_shape=scan
                )
            udfs: list[Any] = [ApplyMasksUDF(mask_factories=masks())]
            if com:
                udfs.append(CoMUDF.with_params(cy=k / 2, cx=k / 2))
            t = time.perf_counter()
            ctx.run_udf(dataset=ds, udf=udfs)
            out[name] = time.perf_counter() - t
        return out

    def close() -> None:
        for ctx in ctxs.values():
            ctx.close()

    run.close = close  # type: ignore[attr-defined]
    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print a table and return the medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench14"))
    p.add_argument("--scan", type=int, nargs=2, default=(256, 256))
    p.add_argument("--det", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-libertem", action="store_true")
    p.add_argument(
        "--numpy",
        action="store_true",
        help="also the plain NumPy way per row: blocks of 4096 frames cast to float32 times "
        "the mask rows (BLAS threads)",
    )
    p.add_argument("--rows", default="raw,raw_com,h5,bslz4,persisted")
    p.add_argument(
        "--counts",
        default="40,0.5",
        help="mean counts in the probe disk and outside it, DISK,DARK (20,0.02: data that "
        "compresses to 9 %% with bitshuffle + LZ4; the default to 18 %%)",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--label", default="")
    p.add_argument(
        "--clusters",
        default="",
        help="extra local clusters to compare, WORKERSxTHREADS, comma separated (e.g. 1x2,2x1)",
    )
    p.add_argument(
        "--baseline-config",
        default="",
        help="a column 'baseline': a local cluster shaped as the embedded default whose "
        "workers run with these qf.config settings, NAME=VALUE comma separated (e.g. "
        "integer_dot_kernel=0: the cell kernels, side by side with the default)",
    )
    p.add_argument(
        "--baseline-client-config",
        default="",
        help="qf.config settings of this process around the 'baseline' column's passes, "
        "NAME=VALUE comma separated (e.g. direct_passes=0: every file pass through the "
        "scheduler); --baseline-config may be empty (that cluster then runs as the default)",
    )
    p.add_argument(
        "--whole-chunks",
        action="store_true",
        help="also run default and process with stream_piece_mib=0 (whole-chunk reads, the "
        "chunk pass before streaming): columns default_whole, process_whole",
    )
    a = p.parse_args(argv)
    global COUNTS
    disk, dark = (float(v) for v in a.counts.split(","))
    COUNTS = (disk, dark)

    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    scan, k = (int(a.scan[0]), int(a.scan[1])), int(a.det)
    t = time.perf_counter()
    paths = write_data(a.dir, scan, k)
    print(f"data ready in {time.perf_counter() - t:.1f} s: {[str(v) for v in paths.values()]}")
    nbytes = scan[0] * scan[1] * k * k * 2
    for path in paths.values():
        warm(path)

    t = time.perf_counter()
    client = qc.embedded_client()
    start_s = time.perf_counter() - t
    info = client.scheduler_info()
    workers = [(w["name"], w["nthreads"]) for w in info["workers"].values()]
    print(f"embedded default started in {start_s:.2f} s: workers {workers}")

    dsets = {
        "npy": qf.open(paths["npy"]),
        "h5": qf.open(paths["h5"], dataset_path="/data", scan_shape=scan),
        "bslz4": qf.open(paths["bslz4"], dataset_path="/data", scan_shape=scan),
    }
    rows = {
        "raw": ("npy", False),
        "raw_com": ("npy", True),
        "h5": ("h5", False),
        "bslz4": ("bslz4", False),
        "bslz4_com": ("bslz4", True),
        "persisted": ("persisted", True),
    }
    wanted = [r for r in a.rows.split(",") if r]
    from distributed import Client

    # threads: this process on a thread per CPU (no cluster)
    clients: dict[str, Any] = {"default": client, "process": "synchronous", "threads": "threads"}
    if a.whole_chunks:
        clients["default_whole"] = client
        clients["process_whole"] = "synchronous"
    extra = []
    for spec in [c for c in a.clusters.split(",") if c]:
        nw, nt = (int(x) for x in spec.split("x"))
        cluster = qc.start_local_cluster(n_workers=nw, threads_per_worker=nt)
        clients[f"c{spec}"] = Client(cluster, set_as_default=False)
        extra.append(cluster)
    client_side = {
        n: qf.config._coerce(n, v)
        for n, v in (item.split("=", 1) for item in a.baseline_client_config.split(",") if item)
    }
    if a.baseline_config or client_side:
        settings = dict(item.split("=", 1) for item in a.baseline_config.split(",") if item)
        cluster = qc.start_local_cluster(
            n_workers=int(qf.config.get("local_workers")),
            threads_per_worker=int(qf.config.get("local_threads")),
            config={n: qf.config._coerce(n, v) for n, v in settings.items()},
        )
        clients["baseline"] = Client(cluster, set_as_default=False)
        extra.append(cluster)
    persisted = {}
    if "persisted" in wanted:
        for mode, cl in clients.items():
            if not mode.endswith("_whole"):
                persisted[mode] = dsets["npy"].persist(client=cl)
    lt_run = None if a.no_libertem else libertem_runner(paths, scan, k)
    if lt_run is None and not a.no_libertem:
        print("LiberTEM not importable: its column is left empty")

    # warm-up (compilation, worker imports), not timed
    for cl in clients.values():
        run_qf(dsets["npy"], True, k, cl)
        run_qf(dsets["bslz4"], False, k, cl)

    samples: dict[str, list[float]] = {}
    timings: dict[str, dict[str, Any]] = {}

    def add(key: str, seconds: float) -> None:
        samples.setdefault(key, []).append(seconds)

    in_ram = (
        np.load(paths["npy"]) if "persisted" in wanted else None
    )  # as persisted chunks (and NumPy's persisted row)

    def numpy_row(fmt: str, com: bool) -> float:
        import h5py

        masks = numpy_masks(k, com)
        if fmt == "persisted":
            assert in_ram is not None
            return run_numpy(in_ram, masks)
        if fmt == "npy":
            return run_numpy(np.load(paths["npy"], mmap_mode="r"), masks)
        with h5py.File(paths[fmt], "r") as f:
            return run_numpy(f["data"], masks)

    rng = random.Random(14)
    for rep in range(a.repeats):
        add("ceiling_1", ceiling(paths["npy"], 1, nbytes))
        add("ceiling_2", ceiling(paths["npy"], 2, nbytes))
        if in_ram is not None:
            add("ram_ceiling_2", ram_ceiling(in_ram, 2))
        add("h5py_decode", h5py_decode(paths["bslz4"]))
        for row in wanted:
            fmt, com = rows[row]
            # every mode and LiberTEM once, in an order shuffled per row and repeat: a run
            # right after LiberTEM's pass (its own cluster) measured slower here
            order: list[str] = (
                list(clients)
                + (["libertem"] if lt_run is not None and row != "persisted" else [])
                + (["numpy"] if a.numpy else [])
            )
            rng.shuffle(order)
            for mode in order:
                if mode == "numpy":
                    add(f"{row}/numpy", numpy_row(fmt, com))
                    continue
                if mode == "libertem":
                    for name, secs in lt_run(fmt, com).items():
                        add(f"{row}/libertem_{name}", secs)
                    continue
                cl = clients[mode]
                ds = persisted[mode.removesuffix("_whole")] if row == "persisted" else dsets[fmt]
                whole = mode.endswith("_whole")
                settings = dict(client_side) if mode == "baseline" else {}
                if whole:
                    settings["stream_piece_mib"] = 0
                with qf.config.set(**settings) if settings else contextlib.nullcontext():
                    wall, timing = run_qf(ds, com, k, cl)
                add(f"{row}/{mode}", wall)
                timings[f"{row}/{mode}"] = timing
        print(f"repeat {rep + 1}/{a.repeats} done")

    gb = nbytes / 1e9
    med = {key: statistics.median(v) for key, v in samples.items()}
    rate = {key: gb / s for key, s in med.items()}
    print(f"\ndataset {scan} x ({k}, {k}) uint16 = {gb:.2f} GB; medians of {a.repeats}")
    print(
        f"ceiling 1 thread {rate['ceiling_1']:.2f} GB/s, 2 threads {rate['ceiling_2']:.2f} GB/s; "
        f"h5py single-thread bitshuffle decode {rate['h5py_decode']:.2f} GB/s"
        + (
            f"; RAM ceiling (sum of the in-RAM array, 2 threads) {rate['ram_ceiling_2']:.2f} GB/s"
            if "ram_ceiling_2" in rate
            else ""
        )
    )
    cols = "".join(f"{m:>9}" for m in clients)
    print(f"{'row':<10}{cols} {'libertem':>9} {'numpy':>9}  default chunk timings")
    for row in wanted:
        lt = [rate[k_] for k_ in rate if k_.startswith(f"{row}/libertem")]
        tm = timings.get(f"{row}/default", {})
        vals = "".join(f"{rate[f'{row}/{m}']:9.2f}" for m in clients)
        npy_rate = rate.get(f"{row}/numpy", float("nan"))
        print(
            f"{row:<10}{vals} {(max(lt) if lt else float('nan')):9.2f} {npy_rate:9.2f}  "
            + " ".join(
                f"{k_.replace('_total', '')}={v:.2f}"
                for k_, v in tm.items()
                if isinstance(v, float)
            )
            + f" busy/worker={[round(x, 2) for x in tm.get('busy_by_worker', [])]}"
        )
    out = {
        "label": a.label,
        "scan": scan,
        "det": k,
        "repeats": a.repeats,
        "start_s": start_s,
        "workers": workers,
        "seconds_median": med,
        "gb_per_s": rate,
        "samples": samples,
        "timings_last": timings,
        "cpu_count": os.cpu_count(),
    }
    if lt_run is not None:
        lt_run.close()
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    for mode, cl in clients.items():
        if mode not in ("default", "process", "threads", "default_whole", "process_whole"):
            cl.close()
    for cluster in extra:
        cluster.close()
    qc.close_embedded_cluster()
    return out


if __name__ == "__main__":
    main()
