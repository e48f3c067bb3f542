"""Benchmark: persisted datasets, 1 vs 2 workers, bytes moved, query latency.

Run from the repository root (after ``bench_one_pass.py`` generated the data,
or it generates it)::

    python benchmarks/bench_persist.py --repeat 5

On the 256 x 256 x 128 x 128 u16 dataset (2 GiB; HDF5 bitshuffle+LZ4 copy),
for a local cluster of 1 worker and then of 2 workers (1 thread each), it
measures in one run:

* ``persist()`` time from the HDF5 file;
* BF + ADF + CoM in one pass on the resident chunks (median);
* bytes moved between workers during those resident passes (the workers'
  transfer logs; work stealing on) and the chunk size for scale;
* the latency of one virtual-detector query (an ADF ring whose radius
  changes every query, as when a user drags it) on the resident chunks and
  re-reading the HDF5 file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_one_pass import CENTER, RADIUS, generate, machine, pipeline  # noqa: E402

import quantem_flow as qf  # noqa: E402


def incoming_bytes(client: Any) -> int:
    def total(dask_worker: Any) -> int:
        return int(sum(t.get("total", 0) for t in dask_worker.transfer_incoming_log))

    return int(sum(client.run(total).values()))


def med(fn: Any, repeat: int) -> tuple[float, list[float]]:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), ts


def run_cluster(n_workers: int, h5: Path, scan: int, repeat: int) -> dict[str, Any]:
    from distributed import Client

    from quantem_flow.graphs import start_local_cluster

    cluster = start_local_cluster(n_workers=n_workers, threads_per_worker=1)
    client = Client(cluster, set_as_default=False)
    try:
        ds = qf.open(h5, dataset_path="/data", scan_shape=(scan, scan))
        t = time.perf_counter()
        p = ds.persist(client=client)
        persist_s = time.perf_counter() - t
        before = incoming_bytes(client)
        s_pass, t_pass = med(lambda: qf.compute(*pipeline(p), client=client), repeat)
        moved = incoming_bytes(client) - before
        radii = iter([RADIUS * f for f in (1.5, 2.0, 2.5, 3.0, 3.5)] * (repeat + 2))

        def ring(d: qf.Dataset4D) -> Any:
            return lambda: qf.compute(
                qf.virtual_annular(d, inner=next(radii), outer=float("inf"), center=CENTER),
                client=client,
            )

        s_ring_res, t_ring_res = med(ring(p), repeat)
        s_ring_file, t_ring_file = med(ring(ds), repeat)
        holders = p.resident.holders()
        per_worker: dict[str, int] = {}
        for ws in holders.values():
            for w in ws:
                per_worker[w] = per_worker.get(w, 0) + 1
        n_passes = repeat + 1
        p.release()
        return {
            "workers": n_workers,
            "persist_s": persist_s,
            "pass_resident_s": s_pass,
            "pass_resident_times": t_pass,
            "bytes_moved_during_resident_passes": moved,
            "resident_passes": n_passes,
            "chunk_bytes": ds.nbytes // len(ds.chunks),
            "n_chunks": len(ds.chunks),
            "ring_resident_s": s_ring_res,
            "ring_resident_times": t_ring_res,
            "ring_file_s": s_ring_file,
            "ring_file_times": t_ring_file,
            "chunks_per_worker": per_worker,
            "dataset_bytes": ds.nbytes,
        }
    finally:
        client.close()
        cluster.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=256)
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    _, h5 = generate(args.scan, args.det)
    rows = [run_cluster(n, h5, args.scan, args.repeat) for n in (1, 2)]
    gb = rows[0]["dataset_bytes"] / 1e9
    print(
        f"\n{args.scan}x{args.scan}x{args.det}x{args.det} u16 = {gb:.2f} GB, "
        f"{rows[0]['n_chunks']} chunks of {rows[0]['chunk_bytes'] / 2**20:.0f} MiB; "
        f"median of {args.repeat}"
    )
    print(
        f"{'workers':>7} {'persist s':>9} {'pass s':>7} {'GB/s':>6} {'moved B':>9} "
        f"{'ring res s':>10} {'ring file s':>11} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['workers']:>7} {r['persist_s']:9.2f} {r['pass_resident_s']:7.3f} "
            f"{gb / r['pass_resident_s']:6.2f} {r['bytes_moved_during_resident_passes']:>9} "
            f"{r['ring_resident_s']:10.3f} {r['ring_file_s']:11.3f} "
            f"{r['ring_file_s'] / r['ring_resident_s']:6.1f}"
        )
    speedup = rows[0]["pass_resident_s"] / rows[1]["pass_resident_s"]
    print(f"scaling 1 -> 2 workers (resident pass): {speedup:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine(), "rows": rows, "scaling": speedup}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
