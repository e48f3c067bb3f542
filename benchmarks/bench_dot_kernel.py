"""Benchmark (issue 24): the integer dot kernel against the cell kernels, per thread.

The CPU runtime's frame pass (:class:`~quantem_flow.runtimes.cpu.prepared.PreparedFramePass`,
as a streamed pass runs it: prepared once, fed pieces) with the setting
``integer_dot_kernel`` on (the dot kernel where its cost rule takes it) and off (the cell
kernels), on 128 x 128 frames of Poisson counts around an off-grid probe centre, for the
detector sets of ``bench_detectors.py`` (a BF disk, then annuli) and BF + ADF + CoM:

* ``L2``: a piece of 64 frames (2 MiB for u16, the streamed pass's piece) fed again and
  again: the kernel on data a ``pread`` has just left in cache;
* ``RAM``: 2048 frames (64 MiB for u16) fed once per round: the kernel reading memory
  (a persisted chunk);
* ``x2``: the same on two threads at once, each with its own frames (the two vCPUs of
  this VM), total GB/s.

GB/s are frame bytes over the calling thread's CPU time (1 thread) or over wall time
(2 threads); medians of the rounds, the two settings alternating.  Values are checked
equal between the settings.

    python benchmarks/bench_dot_kernel.py --rounds 7 --json benchmarks/results_dot_kernel.json
"""

from __future__ import annotations

import argparse
import json
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

from bench_detectors import detectors  # noqa: E402
from bench_kernel_structure import DET, frames_for, weight_sets  # noqa: E402

from quantem_flow import config  # noqa: E402
from quantem_flow.runtimes.cpu.dot_ir import host_isa  # noqa: E402
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass  # noqa: E402


def prepared(w: np.ndarray, fr: np.ndarray, on: bool, n_frames: int) -> PreparedFramePass:
    with config.set(integer_dot_kernel=on):
        return PreparedFramePass(
            w,
            dtype=fr.dtype,
            n_frames=n_frames,
            want_sum=False,
            want_max=False,
            frame_shape=DET,
        )


def one_thread(w: np.ndarray, fr: np.ndarray, reps: int, rounds: int) -> dict[str, Any]:
    passes = {on: prepared(w, fr, on, fr.shape[0] * (reps * rounds + 2)) for on in (True, False)}
    for p in passes.values():
        p.run(fr)
    a, b = (passes[on]._out[: fr.shape[0]].copy() for on in (True, False))
    assert np.array_equal(a[:, : w.shape[0]], b[:, : w.shape[0]])
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            t = time.thread_time()
            for _ in range(reps):
                passes[on].run(fr)
            times[on].append((time.thread_time() - t) / reps)
    rate = {on: fr.nbytes / statistics.median(v) / 1e9 for on, v in times.items()}
    return {"dot": rate[True], "cells": rate[False], "kernel": passes[True].variant["kernel"]}


def two_threads(w: np.ndarray, frs: list[np.ndarray], reps: int, rounds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    samples: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            ps = [prepared(w, fr, on, fr.shape[0] * (reps + 1)) for fr in frs]
            for p, fr in zip(ps, frs, strict=True):
                p.run(fr)
            bar = threading.Barrier(2)
            spans = [0.0, 0.0]

            def work(
                i: int,
                ps: list[PreparedFramePass] = ps,
                bar: threading.Barrier = bar,
                spans: list[float] = spans,
            ) -> None:
                bar.wait()
                t = time.perf_counter()
                for _ in range(reps):
                    ps[i].run(frs[i])
                spans[i] = time.perf_counter() - t

            ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            samples[on].append(2 * reps * frs[0].nbytes / max(spans) / 1e9)
    out["dot"] = statistics.median(samples[True])
    out["cells"] = statistics.median(samples[False])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    isa = host_isa()
    sets = {f"{c} detectors": detectors(c)[0] for c in (1, 3, 5, 10, 20)}
    sets["BF+ADF+CoM"] = weight_sets()["BF+ADF+CoM"]
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "isa": None if isa is None else isa.instruction,
        "cpu": None if isa is None else isa.cpu,
        "python": platform.python_version(),
        "rounds": a.rounds,
        "rows": [],
    }
    print(f"ISA {report['isa']} ({report['cpu']}); GB/s, medians of {a.rounds}")
    print(f"{'dtype':6} {'set':14} {'where':6} {'dot':>7} {'cells':>7} {'ratio':>6}  kernel")
    for dtype in ("uint16", "uint8"):
        for name, w in sets.items():
            for where, n, reps in (("L2", 64, 50), ("RAM", 2048, 2)):
                fr = frames_for(dtype, n)
                r = one_thread(w, fr, reps, a.rounds)
                x2 = two_threads(w, [fr, frames_for(dtype, n, seed=7)], reps, max(3, a.rounds // 2))
                row = {
                    "dtype": dtype,
                    "set": name,
                    "where": where,
                    **r,
                    "x2_dot": x2["dot"],
                    "x2_cells": x2["cells"],
                }
                report["rows"].append(row)
                print(
                    f"{dtype:6} {name:14} {where:6} {r['dot']:7.2f} {r['cells']:7.2f} "
                    f"{r['dot'] / r['cells']:6.2f}  x2: {x2['dot']:6.2f} {x2['cells']:6.2f}  "
                    f"{r['kernel'][:70]}",
                    flush=True,
                )
    if a.json is not None:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
