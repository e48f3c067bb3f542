"""Benchmark (issue 24, goal 1): the tasks of a pass sharing their work, against not sharing.

On the embedded default (one worker, every thread of this machine), one process,
the 2 GiB BF + ADF + CoM pass of ``bench_default_vs_process.py``'s files, in
shuffled rounds:

* ``share``: the default (one task per thread; a thread whose chunks are done
  takes another task's queued chunks, then the tail of a running stream;
  graphs/work_sharing.py);
* ``2 per thread``: ``share_work`` off, two tasks per thread (the default before);
* ``1 per thread``: ``share_work`` off, one task per thread (the layout of
  ``share`` without the sharing).

Reports the median pass time of each arm, how many chunks had rows taken by
another thread or were taken from another task's queue, and checks the
values and the content digest are the same in every arm.  With
``--setup``, also what preparing one chunk's pass costs cache-cold (the CPU
runtime's stream for the pass's weight rows), with the weight state kept
(now) and made again each time (as before it was kept).

    python benchmarks/bench_work_sharing.py --dir /tmp/qf-bench14 --rounds 25 --setup \
        --json benchmarks/results_work_sharing.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ARMS: dict[str, dict[str, Any]] = {
    "share": {"share_work": True},
    "2 per thread": {"share_work": False, "pass_tasks_per_thread": 2},
    "1 per thread": {"share_work": False, "pass_tasks_per_thread": 1},
}


def _ops(ds: Any) -> list[Any]:
    import quantem_flow as qf

    k = ds.shape[2]
    c = (k / 2, k / 2)
    return [
        qf.virtual_bf(ds, radius=k / 6, center=c),
        qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
        qf.center_of_mass(ds, center=c),
    ]


def passes(ds: Any, rounds: int) -> dict[str, Any]:
    """Shuffled rounds of one pass per arm on the embedded default."""
    import quantem_flow as qf

    for _ in range(3):
        qf.compute(*_ops(ds), progress=False)
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    shared: dict[str, list[int]] = {a: [] for a in ARMS}
    taken: dict[str, list[int]] = {a: [] for a in ARMS}
    first: dict[str, Any] = {}
    for _ in range(rounds):
        order = list(ARMS)
        random.shuffle(order)
        for arm in order:
            with qf.config.set(**ARMS[arm]):
                t0 = time.perf_counter()
                out = qf.compute(*_ops(ds), progress=False)
                times[arm].append(time.perf_counter() - t0)
            e = out[0].provenance.execution
            shared[arm].append(sum(1 for r in e["chunks"] if r.get("streamed", {}).get("shared")))
            taken[arm].append(sum(1 for r in e["chunks"] if r.get("taken_from_queue")))
            values = [np.asarray(r.data) for r in out]
            if arm not in first:
                first[arm] = (values, e["content_digest"], e["tasks"])
    ref_values, ref_digest, _ = first["2 per thread"]
    same = all(
        digest == ref_digest
        and all(np.array_equal(a, b) for a, b in zip(values, ref_values, strict=True))
        for values, digest, _ in first.values()
    )
    gb = ds.nbytes / 1e9
    return {
        "arms": {
            arm: {
                "median_s": statistics.median(times[arm]),
                "GBps": gb / statistics.median(times[arm]),
                "runs_s": [round(t, 4) for t in times[arm]],
                "chunks_with_rows_taken_median": statistics.median(shared[arm]),
                "chunks_taken_from_queues_median": statistics.median(taken[arm]),
                "tasks": first[arm][2],
            }
            for arm in ARMS
        },
        "same_values_and_digest": same,
    }


def setup_cost(repeats: int = 30) -> dict[str, float]:
    """Cache-cold ms to prepare one chunk's pass: weight state kept, and made each time."""
    from bench_default_vs_process import numpy_masks

    from quantem_flow.runtimes.cpu import prepared

    w = numpy_masks(128, com=True).astype(np.float64)
    junk = np.ones(64 << 20, dtype=np.uint8)  # swept between calls: the caches go cold

    def one() -> float:
        junk.sum()
        t0 = time.perf_counter()
        prepared.PreparedFramePass(
            w,
            dtype=np.dtype(np.uint16),
            n_frames=4096,
            want_sum=False,
            want_max=False,
            frame_shape=(128, 128),
        )
        return time.perf_counter() - t0

    kept, made = [], []
    for _ in range(repeats):
        kept.append(one())
        with prepared._STATES_LOCK:
            prepared._STATES.clear()
        made.append(one())
    return {
        "kept_ms": statistics.median(kept) * 1e3,
        "made_each_time_ms": statistics.median(made) * 1e3,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench14"))
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--setup", action="store_true")
    p.add_argument("--json", type=Path)
    a = p.parse_args()

    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    npy = sorted(a.dir.glob("data_*x*.npy"))[0]
    h5 = sorted(p for p in a.dir.glob("data_*x*.h5") if "bslz4" not in p.name)[0]
    scan = tuple(int(x) for x in npy.stem.split("_")[1].split("x")[:2])
    files = {
        "npy": qf.open(npy),
        "h5": qf.open(h5, dataset_path="/data", scan_shape=scan),
    }
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "rounds": a.rounds,
        "files": {},
    }
    qc.embedded_client()
    for name, ds in files.items():
        report["files"][name] = passes(ds, a.rounds)
        print(
            f"{name}: values and digest the same in every arm: "
            f"{report['files'][name]['same_values_and_digest']}"
        )
        for arm, r in report["files"][name]["arms"].items():
            print(
                f"  {arm:14s} {r['median_s'] * 1e3:7.1f} ms  {r['GBps']:5.2f} GB/s  "
                f"chunks with rows taken {r['chunks_with_rows_taken_median']:g}, "
                f"taken from queues {r['chunks_taken_from_queues_median']:g}; "
                f"{r['tasks']['n_tasks']} tasks"
            )
    qc.close_embedded_cluster()
    if a.setup:
        report["setup"] = setup_cost()
        s = report["setup"]
        print(
            f"one chunk's pass prepared cache-cold: {s['kept_ms']:.3f} ms with the weight "
            f"state kept, {s['made_each_time_ms']:.3f} ms made each time"
        )
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
