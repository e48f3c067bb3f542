"""``quantem-flow bench``: a performance report of this machine and cluster.

Runs, side by side in one session on a synthetic dataset written to disk:

1. one fused pass (BF + ADF + CoM) that reads and decodes the file;
2. ``persist()`` of the same dataset (each chunk loaded once, kept resident);
3. the same pass on the resident chunks (kernel time only);
4. "dragging an ADF ring": single-detector queries with changing radii,
   on the resident chunks and, for comparison, re-reading the file;

and records the bytes moved between workers during the resident queries
(from each worker's transfer log), the placement of every chunk, the
dashboard URLs, a Dask performance report with its JavaScript inlined
(so it opens offline) and, beside it, quantem-flow's own charts (the
``/quantem-flow`` dashboard page at the end of the run: per-worker
throughput, passes, the scan map of chunk placement, resident bytes, lost
workers, placement log).  Everything goes to ``output_dir`` (the command
line's default is ``./quantem-flow-bench``): ``report.md``, ``report.json``,
``dask-performance-report.html`` and ``quantem-flow-dashboard.html``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import operators as ops
from .dataset import Dataset4D
from .dataset import open as open_dataset
from .graphs.cluster import dashboard_url, flow_dashboard_url
from .graphs.execute import compute
from .synthetic import write_synthetic

__all__ = ["run_bench"]


def _median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float]]:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def _incoming_bytes(client: Any) -> int:
    def total(dask_worker: Any) -> int:
        return int(sum(t.get("total", 0) for t in dask_worker.transfer_incoming_log))

    return int(sum(client.run(total).values()))


def _queries(ds: Dataset4D, center: tuple[float, float], radius: float) -> list[Any]:
    return [
        ops.virtual_bf(ds, radius=radius, center=center),
        ops.virtual_adf(ds, inner=1.5 * radius, center=center),
        ops.center_of_mass(ds, center=center),
    ]


def run_bench(
    output_dir: str | os.PathLike[str],
    *,
    scan_shape: tuple[int, int] = (128, 128),
    detector_shape: tuple[int, int] = (128, 128),
    repeat: int = 3,
    client: Any = None,
    chunk_mib: float | None = None,
) -> Path:
    """Measure the engine on this machine and write a performance report.

    Parameters
    ----------
    output_dir
        Folder for the dataset and the report (created).
    scan_shape, detector_shape
        Size of the synthetic uint16 dataset.
    repeat
        Timed repeats per measurement (after one warm-up); medians reported.
    client
        ``None`` for the embedded local cluster, or a ``distributed.Client``.
    chunk_mib
        Chunk size (default: the configured one).

    Returns
    -------
    Path
        The ``report.md`` written.
    """
    from distributed import performance_report

    from .graphs.runner import Runner

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_path = (
        out / f"bench_{scan_shape[0]}x{scan_shape[1]}x{detector_shape[0]}x{detector_shape[1]}.h5"
    )
    if not data_path.exists():
        write_synthetic(
            data_path,
            format="hdf5",
            scan_shape=scan_shape,
            detector_shape=detector_shape,
            probe_radius_px=detector_shape[0] / 10,
        )
    runner = Runner(client)
    assert runner.client is not None
    c = runner.client
    ds = open_dataset(data_path, chunk_mib=chunk_mib)
    from .operators.probe import find_probe

    probe = find_probe(ds, sample_frames=64)
    center, radius = probe.center, probe.radius
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "workers": {
                a: {
                    "nthreads": w["nthreads"],
                    "memory_limit": w["memory_limit"],
                    "resources": w.get("resources", {}),
                }
                for a, w in c.scheduler_info()["workers"].items()
            },
            "scheduler": runner.description,
            "dashboard": dashboard_url(c),
            "quantem_flow_dashboard": flow_dashboard_url(c),
        },
        "dataset": {
            "path": str(data_path),
            "shape": list(ds.shape),
            "dtype": str(ds.dtype),
            "logical_bytes": ds.nbytes,
            "file_bytes": data_path.stat().st_size,
            "n_chunks": len(ds.chunks),
        },
        "repeat": repeat,
    }
    html = out / "dask-performance-report.html"
    with c.as_current(), performance_report(filename=str(html), mode="inline"):
        s_file, t_file = _median_time(
            lambda: compute(*_queries(ds, center, radius), client=c), repeat
        )
        t0 = time.perf_counter()
        persisted = ds.persist(client=c)
        persist_s = time.perf_counter() - t0
        before = _incoming_bytes(c)
        s_res, t_res = _median_time(
            lambda: compute(*_queries(persisted, center, radius), client=c), repeat
        )
        moved = _incoming_bytes(c) - before
        radii = [radius * f for f in (1.2, 1.5, 2.0, 2.5, 3.0)]

        def ring(d: Dataset4D) -> Callable[[], Any]:
            it = iter(radii * (repeat + 2))
            return lambda: compute(
                ops.virtual_annular(d, inner=next(it), outer=float("inf"), center=center),
                client=c,
            )

        s_ring_res, t_ring_res = _median_time(ring(persisted), repeat)
        s_ring_file, t_ring_file = _median_time(ring(ds), repeat)
        holders = persisted.resident.holders()
        charts = _write_charts(c, out / "quantem-flow-dashboard.html")
        persisted.release()
    gb = ds.read_nbytes / 1e9
    report["results"] = {
        "pass_from_file_s": s_file,
        "pass_from_file_GBps": gb / s_file,
        "persist_s": persist_s,
        "pass_resident_s": s_res,
        "pass_resident_GBps": gb / s_res,
        "adf_ring_query_resident_s": s_ring_res,
        "adf_ring_query_file_s": s_ring_file,
        "bytes_moved_between_workers_during_resident_queries": moved,
        "times": {
            "pass_from_file": t_file,
            "pass_resident": t_res,
            "ring_resident": t_ring_res,
            "ring_file": t_ring_file,
        },
        "chunk_placement": holders,
    }
    report["outputs"] = {
        "folder": str(out),
        "report": str(out / "report.md"),
        "json": str(out / "report.json"),
        "dask_performance_report": str(html),
        "quantem_flow_charts": charts,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    r = report["results"]
    lines = [
        "# quantem-flow performance report",
        "",
        f"- scheduler: {report['machine']['scheduler']}, {len(report['machine']['workers'])} "
        f"worker(s); dashboard {report['machine']['dashboard']}",
        f"- machine: {report['machine']['platform']}, {report['machine']['cpu_count']} CPUs",
        f"- dataset: {tuple(ds.shape)} {ds.dtype}, {ds.nbytes / 2**30:.2f} GiB logical, "
        f"{data_path.stat().st_size / 2**30:.2f} GiB on disk (HDF5 bitshuffle+LZ4), "
        f"{len(ds.chunks)} chunks",
        f"- medians of {repeat} runs after one warm-up",
        "",
        "| measurement | s | GB/s |",
        "|---|---:|---:|",
        f"| BF+ADF+CoM, one pass reading the file | {r['pass_from_file_s']:.3f} | "
        f"{r['pass_from_file_GBps']:.2f} |",
        f"| persist (load every chunk once) | {r['persist_s']:.3f} | |",
        f"| BF+ADF+CoM on resident chunks | {r['pass_resident_s']:.3f} | "
        f"{r['pass_resident_GBps']:.2f} |",
        f"| one ADF ring, resident | {r['adf_ring_query_resident_s']:.3f} | |",
        f"| one ADF ring, re-reading the file | {r['adf_ring_query_file_s']:.3f} | |",
        "",
        f"Bytes moved between workers during the resident queries: "
        f"{r['bytes_moved_between_workers_during_resident_queries']}.",
        "",
        f"Dask performance report: {html.name} (self-contained).",
        "quantem-flow charts (throughput per worker, passes, scan map of chunk placement, "
        "resident bytes, lost workers, placement log): "
        + (Path(charts).name if charts.endswith(".html") else charts),
        f"Everything is in {out}.",
    ]
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def _write_charts(client: Any, path: Path) -> str:
    """Write the quantem-flow dashboard's charts as they are now; return the path or why not."""
    from .graphs.dashboard import bokeh_available, write_html
    from .graphs.scheduler_plugin import dashboard_state

    if not bokeh_available():
        return "not written: Bokeh is not installed (pip install bokeh)"
    state = client.run_on_scheduler(dashboard_state)
    if state is None:
        return "not written: the scheduler has no quantem-flow placement plugin"
    write_html(state, path, title="quantem-flow bench: dashboard")
    return str(path)
