"""Benchmark (issues 14, 24): where a pass's wall time goes on the embedded default (task stream).

Run from the repository root (the npy of ``bench_default_vs_process.py``)::

    python benchmarks/bench_pass_timeline.py /tmp/qf-bench14/data_256x256x128x128.npy --passes 3

Per pass of BF + ADF + CoM (after three warm-up passes): the time from
``qf.compute`` to the first chunk task's start (the head), the span of the
chunk tasks and their busy time divided by the worker threads, and the time
from the last chunk task's end to the results (the tail), with each chunk
task's start and stop.

Code against code (the head and tail depend little on how fast the machine
reads at the moment, the pass's span does)::

    python benchmarks/bench_pass_timeline.py /tmp/qf-bench14/data_256x256x128x128.npy \\
        --code now=. --code before=/tmp/base --rounds 6 --passes 10

runs each ``LABEL=TREE`` in a fresh interpreter with ``PYTHONPATH=TREE``,
rounds alternating the codes, and prints the medians over every pass of the
head, the tail, their sum and the pass (milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def timeline(path: str, passes: int, *, show: bool) -> list[dict[str, Any]]:
    """Run ``passes`` timed passes on the embedded default; one record per pass."""
    from distributed import get_task_stream

    import quantem_flow as qf
    from quantem_flow.graphs import cluster as qc

    ds = qf.open(path)
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
    out = []
    for _ in range(passes):
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
        # each task thread's last end: how far apart the threads finish
        ends: dict[Any, float] = {}
        for x in ts.data:
            if "qf-pass" in str(x["key"]):
                for s in x["startstops"]:
                    if s["action"] == "compute":
                        who = (x.get("worker"), x.get("thread"))
                        ends[who] = max(ends.get(who, 0.0), s["stop"])
        out.append(
            {
                "pass_ms": (t1 - t0) * 1e3,
                "head_ms": (first - t0) * 1e3,
                "tasks_ms": (last - first) * 1e3,
                "tail_ms": (t1 - last) * 1e3,
                "busy_per_thread_ms": busy / threads * 1e3,
                "idle_in_span_ms": (threads * (last - first) - busy) * 1e3,
                "finish_gap_ms": (max(ends.values()) - min(ends.values())) * 1e3
                if len(ends) == threads
                else (last - first) * 1e3,
                "tasks": len(spans),
            }
        )
        if show:
            print(
                f"pass {t1 - t0:.3f} s ({gb / (t1 - t0):.2f} GB/s): compute -> first task "
                f"{first - t0:.3f} s, tasks {last - first:.3f} s (busy / {threads} threads "
                f"{busy / threads:.3f} s), last task -> results {t1 - last:.3f} s, "
                f"{len(spans)} tasks"
            )
            print("   ", [(round(s - first, 3), round(e - first, 3)) for s, e in sorted(spans)])
    qc.close_embedded_cluster()
    return out


def run_code(tree: str, path: str, passes: int) -> list[dict[str, Any]]:
    """One interpreter on ``tree``'s code: its passes' records."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(tree).resolve())
    script = (
        "import json, sys; sys.path.insert(1, sys.argv[1]); import quantem_flow as qf; "
        "print('FROM ' + qf.__file__, flush=True); "
        "from bench_pass_timeline import timeline; "
        "print('RESULT ' + json.dumps(timeline(sys.argv[2], int(sys.argv[3]), show=False)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(HERE), path, str(passes)],
        env=env,
        cwd=env["PYTHONPATH"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("FROM ") and not line[5:].startswith(env["PYTHONPATH"]):
            raise RuntimeError(f"{tree} imported quantem_flow from {line[5:]}")
        if line.startswith("RESULT "):
            result: list[dict[str, Any]] = json.loads(line[7:])
            return result
    raise RuntimeError(f"{tree} gave no result:\n{done.stdout}\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--code", action="append", default=[], help="LABEL=TREE (code against code)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if not a.code:
        timeline(a.path, a.passes, show=True)
        return
    codes = [tuple(item.split("=", 1)) for item in a.code]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in codes}
    for r in range(a.rounds):
        for label, tree in codes if r % 2 == 0 else list(reversed(codes)):
            runs[label].extend(run_code(tree, a.path, a.passes))
            print(f"round {r + 1} {label}: {len(runs[label])} passes", flush=True)
    summary = {}
    for label, passes in runs.items():
        summary[label] = {
            key: round(statistics.median(p[key] for p in passes), 2)
            for key in (
                "head_ms",
                "tail_ms",
                "pass_ms",
                "tasks_ms",
                "idle_in_span_ms",
                "finish_gap_ms",
            )
        }
        summary[label]["head_plus_tail_ms"] = round(
            statistics.median(p["head_ms"] + p["tail_ms"] for p in passes), 2
        )
        summary[label]["passes"] = len(passes)
    print("\nmedians over every pass (ms)")
    for label, values in summary.items():
        print(f"{label:>10s}: " + ", ".join(f"{k} {v}" for k, v in values.items()))
    if a.json:
        a.json.write_text(json.dumps({"codes": codes, "runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
