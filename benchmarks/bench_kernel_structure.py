"""Benchmark: the CPU frame pass's cost against its weight rows (issue 14).

Run from the repository root::

    python benchmarks/bench_kernel_structure.py                 # 1024 frames of 128 x 128
    python benchmarks/bench_kernel_structure.py --rounds 31 --json out.json

On a warm in-memory block of 128 x 128 frames (uint16 and float32) it
measures, side by side in ONE run, the fused kernel (every weight row
multiplied into every pixel; ``structured=False``) and the structured kernel
(:mod:`quantem_flow.runtimes.cpu.structure`, the default) on

* ``BF``: one disk (r = 20 px),
* ``BF+ADF``: plus an annulus from 30 px to the detector's edge,
* ``BF+ADF+CoM``: plus the three maps of ``center_of_mass`` over the whole
  detector (its mask and ``mask * (row - c_r)``, ``mask * (col - c_c)``,
  with the off-grid centre a fitted probe gives),

plus, on BF+ADF+CoM, the structured kernel without segments (``structured
runs``: moments per cell run, the kernel before segments;
``structure.USE_SEGMENTS = False``), and, as the ceiling, one read of
every pixel: the structured kernel with a single whole-detector mask (an
integer add per pixel, the least any pass touching every pixel does), plus
``numpy.sum`` over the block.

The machine is shared and noisy: every round runs every variant once in a
shuffled order; times are the calling thread's CPU time (the kernels run on
it, single-threaded), which other processes inflate far less than wall time
(they still share caches and memory bandwidth); the table gives the median
and the best of the rounds, and the ratios are of medians (and of bests).
A second part breaks the time down: the fused kernel per pair of weight
rows and its pattern loops, the structured kernel's cell pass (with and
without moments), its combination step, and the plan's analysis (once per
weight stack, cached).  A third part runs BF + ADF + CoM through
``qf.compute`` and reports the chunks' ``kernel_s`` from provenance (wall).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantem_flow.runtimes.cpu import structure  # noqa: E402
from quantem_flow.runtimes.cpu.kernels import _fused, frame_pass_variant  # noqa: E402

DET = (128, 128)
CENTER = (63.7, 64.2)  # a fitted probe centre: off the half-pixel grid


def weight_sets() -> dict[str, np.ndarray]:
    """The weight stacks, built as the operators build them."""
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    d = np.hypot(rr - CENTER[0], cc - CENTER[1])
    bf = (d < 20).astype(np.float64).ravel()
    adf = (d >= 30).astype(np.float64).ravel()
    mask = np.ones(DET, dtype=np.float64)
    r = (np.arange(DET[0], dtype=np.float64) - CENTER[0])[:, None] * np.ones(DET[1])
    c = np.ones(DET[0])[:, None] * (np.arange(DET[1], dtype=np.float64) - CENTER[1])
    com = np.stack([mask.ravel(), (mask * r).ravel(), (mask * c).ravel()])
    return {
        "BF": bf[None],
        "BF+ADF": np.stack([bf, adf]),
        "BF+ADF+CoM": np.concatenate([np.stack([bf, adf]), com]),
    }


def frames_for(dtype: str, n: int, seed: int = 3) -> np.ndarray:
    """Poisson counts of a probe disk plus a weak dark field (as the synthetic data)."""
    rng = np.random.default_rng(seed)
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    d = np.hypot(rr - CENTER[0], cc - CENTER[1])
    lam = np.where(d < 20, 40.0, 0.5).ravel()
    return rng.poisson(lam, size=(n, lam.size)).astype(dtype)


def _runner(
    fr: np.ndarray, w: np.ndarray, flag: bool | None, segments: bool = True
) -> Callable[[], Any]:
    def run() -> Any:
        structure.USE_SEGMENTS = segments
        try:
            return frame_pass_variant(
                fr, w, want_sum=False, want_max=False, frame_shape=DET, structured=flag
            )
        finally:
            structure.USE_SEGMENTS = True

    return run


def _summer(fr: np.ndarray) -> Callable[[], Any]:
    return lambda: fr.sum(dtype=np.int64 if fr.dtype.kind in "ui" else np.float64)


def timed(fn: Callable[[], Any]) -> float:
    """CPU seconds of this thread running ``fn`` (the kernels are single-threaded)."""
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def interleaved(
    variants: dict[str, Callable[[], Any]], rounds: int, seed: int = 0
) -> dict[str, list[float]]:
    """Seconds of each variant over ``rounds`` rounds, the order shuffled per round."""
    for fn in variants.values():  # compile and warm
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            times[k].append(timed(variants[k]))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=1024, help="frames in the block")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    n = args.frames
    sets = weight_sets()
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average_start": os.getloadavg(),
        },
        "frames": n,
        "detector": DET,
        "center": CENTER,
        "rounds": args.rounds,
    }
    rows: list[dict[str, Any]] = []
    for dtype in ("uint16", "float32"):
        fr = frames_for(dtype, n)
        nbytes = fr.nbytes
        variants: dict[str, Callable[[], Any]] = {}
        kinds: dict[str, Any] = {}
        for name, w in sets.items():
            for label, flag in (("fused", False), ("structured", None)):
                variants[f"{name} {label}"] = _runner(fr, w, flag)
                kinds[f"{name} {label}"] = variants[f"{name} {label}"]()[3]
        # the structured kernel before segments (moments per cell run)
        variants["BF+ADF+CoM structured runs"] = _runner(fr, sets["BF+ADF+CoM"], None, False)
        kinds["BF+ADF+CoM structured runs"] = variants["BF+ADF+CoM structured runs"]()[3]
        variants["ceiling: every pixel read once"] = _runner(fr, np.ones((1, fr.shape[1])), None)
        variants["numpy.sum over the block"] = _summer(fr)
        # same values (structured vs fused): exact for the masks on uint16
        for name, w in sets.items():
            a = frame_pass_variant(fr, w, want_sum=False, want_max=False, frame_shape=DET)[0]
            b = frame_pass_variant(
                fr, w, want_sum=False, want_max=False, frame_shape=DET, structured=False
            )[0]
            scale = np.abs(fr.astype(np.float64)) @ np.abs(w).T
            assert np.all(np.abs(a - b) <= 1e-13 * scale), name
            if dtype == "uint16":
                masks = [j for j in range(w.shape[0]) if np.isin(w[j], (0.0, 1.0)).all()]
                assert np.array_equal(a[:, masks], b[:, masks]), name
        times = interleaved(variants, args.rounds)
        for k, ts in times.items():
            med, best = statistics.median(ts), min(ts)
            rows.append(
                {
                    "dtype": dtype,
                    "variant": k,
                    "median_s": med,
                    "best_s": best,
                    "median_GBps": nbytes / med / 1e9,
                    "best_GBps": nbytes / best / 1e9,
                    "kernel": kinds.get(k, {}).get("summary", ""),
                    "moments": kinds.get(k, {}).get("moments", ""),
                }
            )
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        for what, t in (("median", med), ("best", best)):
            report.setdefault("ratios", {})[f"{dtype} {what}"] = {
                "structured BF+ADF+CoM / structured BF": t["BF+ADF+CoM structured"]
                / t["BF structured"],
                "structured runs BF+ADF+CoM / structured BF": t["BF+ADF+CoM structured runs"]
                / t["BF structured"],
                "structured runs BF+ADF+CoM / structured BF+ADF+CoM": t[
                    "BF+ADF+CoM structured runs"
                ]
                / t["BF+ADF+CoM structured"],
                "structured BF+ADF+CoM / fused BF": t["BF+ADF+CoM structured"] / t["BF fused"],
                "fused BF+ADF+CoM / fused BF": t["BF+ADF+CoM fused"] / t["BF fused"],
                "structured BF+ADF+CoM / ceiling": t["BF+ADF+CoM structured"]
                / t["ceiling: every pixel read once"],
                "fused BF+ADF+CoM / structured BF+ADF+CoM": t["BF+ADF+CoM fused"]
                / t["BF+ADF+CoM structured"],
            }
        report.setdefault("profile", {})[dtype] = profile(fr, sets["BF+ADF+CoM"], args.rounds)
    report["rows"] = rows
    report["pipeline"] = pipeline(max(3, args.rounds // 3))
    report["machine"]["load_average_end"] = os.getloadavg()
    print(f"{n} frames of {DET[0]} x {DET[1]}, {args.rounds} interleaved rounds")
    print(f"{'dtype':8} {'variant':34} {'median GB/s':>11} {'best GB/s':>10}  kernel")
    for r in rows:
        print(
            f"{r['dtype']:8} {r['variant']:34} {r['median_GBps']:11.2f} {r['best_GBps']:10.2f}"
            f"  {r['kernel']}"
        )
    print(
        json.dumps({k: report[k] for k in ("ratios", "profile", "pipeline")}, indent=1, default=str)
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def profile(fr: np.ndarray, w: np.ndarray, rounds: int) -> dict[str, float]:
    """Where the time goes (median microseconds per frame), stage by stage."""
    n, k = fr.shape
    plan = structure.analyse_weights(w, frame_shape=DET)
    mode = structure.integer_mode(fr.dtype)
    acc = np.zeros((n, 3, plan.n_cells), dtype=np.int64 if mode else np.float64)
    args = (plan.run_start, plan.run_length, plan.run_cell, plan.run_row, plan.run_col)
    if mode == 2:  # 8/16-bit integers: int32 runs

        def cells(*a: Any) -> Any:
            if a[-1]:
                return structure._cells_small_moments(*a[:-1])
            return structure._cells_small_sums(a[0], a[1], a[2], a[3], a[-2])

    else:
        cells = structure._cells_int if mode else structure._cells_real
    out = np.empty((n, w.shape[0] + 1))
    wp = np.concatenate([w, np.zeros((1, k))])
    integer = mode > 0
    one = np.zeros(1, dtype=np.int64 if integer else np.float64)
    one_max = np.zeros(1, dtype=fr.dtype)
    acc_sum = np.zeros(k, dtype=np.int64 if integer else np.float64)
    acc_max = np.zeros(k, dtype=fr.dtype)
    stages: dict[str, Callable[[], Any]] = {
        "fused: one pair of weight rows": lambda: _fused(
            fr, wp[:2], out, one, one_max, False, False
        ),
        "fused: three pairs (5 rows + 1 zero row)": lambda: _fused(
            fr, wp, out, one, one_max, False, False
        ),
        "fused: sum pattern loop": lambda: _fused(fr, wp[:0], out, acc_sum, one_max, True, False),
        "fused: max pattern loop": lambda: _fused(fr, wp[:0], out, one, acc_max, False, True),
        "structured: cell pass without moments": lambda: cells(fr, *args, acc, False),
        "structured: cell pass with moments": lambda: cells(fr, *args, acc, True),
        "structured: segment pass with moments (8/16-bit only)": (
            (lambda: structure._cells_small_segments(fr, *plan.seg_arrays, acc))
            if mode == 2
            else (lambda: None)
        ),
        "structured: combination of 5 rows": lambda: structure._combine(
            acc,
            plan.srow_kind,
            plan.srow_offset,
            plan.srow_ptr,
            plan.srow_cells,
            plan.srow_out,
            out,
        ),
        "structured: analysis of the weight stack (uncached, once per pass)": lambda: (
            structure._build(np.ascontiguousarray(w), DET, False)
        ),
    }
    times = interleaved(stages, max(5, rounds // 2))
    res = {}
    for key, ts in times.items():
        per = 1.0 if "analysis" in key else n
        res[key] = statistics.median(ts) / per * 1e6
    return res


def pipeline(rounds: int) -> dict[str, Any]:
    """BF + ADF + CoM through ``qf.compute`` (synchronous): the chunks' provenance timings."""
    import quantem_flow as qf
    from quantem_flow.synthetic import synthetic_dataset

    data, _ = synthetic_dataset(
        scan_shape=(32, 64), detector_shape=DET, probe_radius_px=20.0, seed=5
    )
    ds = qf.open(data, chunk_rows=8)

    def run() -> dict[str, Any]:
        bf, _, _ = qf.compute(
            qf.virtual_bf(ds, radius=20, center=CENTER),
            qf.virtual_adf(ds, inner=30, center=CENTER),
            qf.center_of_mass(ds, center=CENTER),
            client="synchronous",
        )
        ex = bf.provenance.execution
        return {
            "kernel_s_total": ex["kernel_s_total"],
            "n_chunks": ex["n_chunks"],
            "variant": ex["chunks"][0].get("frame_pass_variant", {}).get("summary"),
        }

    saved = structure.MAX_CELLS
    got: dict[str, list[dict[str, Any]]] = {"fused": [], "structured": []}
    try:
        for _ in range(rounds + 1):  # the first round warms both
            for label in ("fused", "structured"):
                structure._CACHE.clear()
                structure.MAX_CELLS = -1 if label == "fused" else saved
                got[label].append(run())
    finally:
        structure.MAX_CELLS = saved
        structure._CACHE.clear()
    out: dict[str, Any] = {"dataset": f"{data.shape} {data.dtype}", "bytes": data.nbytes}
    for label, runs in got.items():
        ks = [r["kernel_s_total"] for r in runs[1:]]
        out[label] = {
            "kernel_s_total_median": statistics.median(ks),
            "kernel_s_total_best": min(ks),
            "GBps_median": data.nbytes / statistics.median(ks) / 1e9,
            "n_chunks": runs[-1]["n_chunks"],
            "variant": runs[-1]["variant"],
        }
    return out


if __name__ == "__main__":
    main()
