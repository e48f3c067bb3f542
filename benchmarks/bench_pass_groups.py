"""Benchmark (issue 24, goals 1 and 3): a pass's chunks in groups of tasks, against one per chunk.

Uses the 2 GiB ``.npy`` and uncompressed HDF5 files of
``bench_default_vs_process.py`` (256 x 256 x 128 x 128 u16, page-cached;
128 MiB chunks: 16 chunks).  BF + ADF + CoM, interleaved per round (every
mode once per round, in a shuffled order), medians and ranges reported:

* ``default``: the embedded default (1 worker x 2 threads here) with
  ``pass_tasks_per_thread`` = 1, 2 (the default), 4, and one task per chunk
  (``pass_tasks_per_thread`` = 10**6, the code before the groups);
* ``threads``: ``client="threads"`` with groups (the default) and one task
  per chunk.

Also per file, in the same run: the read-and-touch ceiling of goal 1 (2 threads,
``preadv`` + sum and map + sum of 8 MiB pieces; ``bench_read_method.ceiling``).

    python benchmarks/bench_pass_groups.py --dir /tmp/qf-bench14 --rounds 5 \\
        --json benchmarks/results_pass_groups.json
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: ``(name, client, pass_tasks_per_thread)``; 10**6 tasks per thread is one task per chunk.
MODES = (
    ("default, 1 per thread", None, 1),
    ("default, 2 per thread", None, 2),
    ("default, 4 per thread", None, 4),
    ("default, one per chunk", None, 10**6),
    ("threads, 2 per thread", "threads", 2),
    ("threads, one per chunk", "threads", 10**6),
)


def one_pass(ds: Any, client: Any, per_thread: int, k: int) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one pass and how its chunks went to tasks."""
    from bench_read_method import _ops

    import quantem_flow as qf

    with qf.config.set(pass_tasks_per_thread=per_thread):
        t = time.perf_counter()
        results = qf.compute(*_ops(ds, k), client=client, progress=False)
        wall = time.perf_counter() - t
    return wall, dict(results[0].provenance.execution["tasks"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench14"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from bench_default_vs_process import write_data
    from bench_read_method import ceiling

    import quantem_flow as qf

    scan, k = (256, 256), 128
    paths = write_data(args.dir, scan, k)
    datasets = {
        "npy": qf.open(paths["npy"]),
        "h5": qf.open(paths["h5"], dataset_path="/data", scan_shape=scan),
    }
    nbytes = {name: ds.nbytes for name, ds in datasets.items()}
    for ds in datasets.values():  # warm: page cache, compiled kernels, the cluster
        for _, client, per_thread in MODES:
            one_pass(ds, client, per_thread, k)
    walls: dict[str, dict[str, list[float]]] = {f: {m[0]: [] for m in MODES} for f in datasets}
    tasks: dict[str, dict[str, Any]] = {f: {} for f in datasets}
    ceilings: dict[str, dict[str, list[float]]] = {
        f: {"pread + sum": [], "map + sum": []} for f in datasets
    }
    rng = random.Random(0)
    for r in range(args.rounds):
        for name, ds in datasets.items():
            path = paths[name]
            ceilings[name]["pread + sum"].append(ceiling(path, "pread + sum", 8 * 2**20))
            ceilings[name]["map + sum"].append(ceiling(path, "map + sum", 8 * 2**20))
            order = list(MODES)
            rng.shuffle(order)
            for mode, client, per_thread in order:
                wall, how = one_pass(ds, client, per_thread, k)
                walls[name][mode].append(wall)
                tasks[name][mode] = how
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
        },
        "rounds": args.rounds,
        "files": {},
    }
    for name in datasets:
        best = max(statistics.median(v) for v in ceilings[name].values())
        rows = {}
        for mode, _, _ in MODES:
            gbs = [nbytes[name] / w / 1e9 for w in walls[name][mode]]
            med = statistics.median(gbs)
            rows[mode] = {
                "gb_s": med,
                "range": [min(gbs), max(gbs)],
                "of_ceiling": med / best,
                "tasks": tasks[name][mode],
            }
        report["files"][name] = {
            "ceilings_gb_s": {k_: statistics.median(v) for k_, v in ceilings[name].items()},
            "modes": rows,
        }
        print(
            f"\n{name}: ceilings "
            + ", ".join(f"{k_} {statistics.median(v):.2f}" for k_, v in ceilings[name].items())
        )
        print("| mode | tasks | GB/s (range) | of best ceiling |\n|---|---:|---:|---:|")
        for mode, row in rows.items():
            lo, hi = row["range"]
            print(
                f"| {mode} | {row['tasks']['n_tasks']} | {row['gb_s']:.2f} ({lo:.2f}-{hi:.2f}) "
                f"| {100 * row['of_ceiling']:.0f} % |"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
