"""Benchmark (issue 14): where a pass's wall time goes on the embedded default (task stream).

Run from the repository root (the npy of ``bench_default_vs_process.py``)::

    python benchmarks/bench_pass_timeline.py /tmp/qf-bench14/data_256x256x128x128.npy --passes 3

Per pass of BF + ADF + CoM (after three warm-up passes): the time from
``qf.compute`` to the first chunk task's start, the span of the chunk tasks
and their busy time divided by the worker threads, and the time from the
last chunk task's end to the results, with each chunk task's start and stop.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--passes", type=int, default=3)
    a = ap.parse_args()
    from distributed import get_task_stream

    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    ds = qf.open(a.path)
    k = ds.shape[2]
    c = (k / 2, k / 2)

    def ops() -> list[object]:
        return [
            qf.virtual_bf(ds, radius=k / 6, center=c),
            qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
            qf.center_of_mass(ds, center=c),
        ]

    client = qc.embedded_client()
    threads = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())
    for _ in range(3):
        qf.compute(*ops(), progress=False)
    gb = ds.nbytes / 1e9
    for _ in range(a.passes):
        with get_task_stream(client) as ts:
            t0 = time.time()
            qf.compute(*ops(), progress=False)
            t1 = time.time()
        spans = [
            (s["start"], s["stop"])
            for x in ts.data
            if "qf-pass" in str(x["key"])
            for s in x["startstops"]
            if s["action"] == "compute"
        ]
        first, last = min(s for s, _ in spans), max(e for _, e in spans)
        busy = sum(e - s for s, e in spans)
        print(
            f"pass {t1 - t0:.3f} s ({gb / (t1 - t0):.2f} GB/s): compute -> first task "
            f"{first - t0:.3f} s, tasks {last - first:.3f} s (busy / {threads} threads "
            f"{busy / threads:.3f} s), last task -> results {t1 - last:.3f} s, {len(spans)} tasks"
        )
        print("   ", [(round(s - first, 3), round(e - first, 3)) for s, e in sorted(spans)])
    qc.close_embedded_cluster()


if __name__ == "__main__":
    main()
