"""The Swift worker's CPU backend against the Numba CPU kernels, on the same data.

Side by side in one run: the in-process ``cpu`` runtime (Numba) and the ``swift`` runtime
(``qf-swift-worker``'s CPU backend, through the bridge: its pass time includes one request
and reply over pipes, ~0.15 ms), every case on the same chunk and weights, checked equal.

Cases (one resident chunk of ``--scan`` x ``--scan`` frames of ``--detector``**2 pixels):

- ``u16 BF+ADF+CoM``: uint16 counts, 5 integer rows (BF disk, ADF annulus, CoM mask and
  its two moments), sum and max patterns: the everyday pass (exact on both);
- ``u16 real rows``: the same data, 5 rows of random real weights (float64 on both);
- ``f32 BF+ADF+CoM``: float32 data, the 5 integer rows (float64 on both);
- ``u8`` / ``u32``: the everyday pass on other dtypes;
- ``packed u16`` / ``paired u16``: the everyday pass on the counted representations
  (sparse counts: 10 % of pixels hit).

Usage::

    python benchmarks/bench_swift_cpu.py [--scan 64] [--detector 128] [--repeat 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_external import weights_for

from quantem_flow.representations import Chunk, chunk_of, get_representation
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.external.spec import register_requested


def _time(fn: Any, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _chunk(rep: str, block: np.ndarray) -> Chunk:
    if rep == "dense":
        return chunk_of("dense", block)
    return chunk_of(rep, get_representation(rep).from_dense(block))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=64)
    ap.add_argument("--detector", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    register_requested(["swift"])
    cpu, swift = get_runtime("cpu"), get_runtime("swift")
    hello = swift.start()
    rng = np.random.default_rng(0)
    s, k = args.scan, args.detector
    counts = rng.poisson(3.0, size=(s, s, k, k)).astype(np.uint16)
    counts[..., k // 2 - 4 : k // 2 + 4, k // 2 - 4 : k // 2 + 4] += 900
    sparse = np.where(rng.random((s, s, k, k)) < 0.1, rng.integers(1, 40, (s, s, k, k)), 0)
    ints = weights_for(k)
    real = rng.standard_normal(ints.shape)
    cases = [
        ("u16 BF+ADF+CoM", "dense", counts, ints),
        ("u16 real rows", "dense", counts, real),
        ("f32 BF+ADF+CoM", "dense", counts.astype(np.float32), ints),
        ("u8 BF+ADF+CoM", "dense", np.minimum(counts, 255).astype(np.uint8), ints),
        ("u32 BF+ADF+CoM", "dense", counts.astype(np.uint32), ints),
        ("packed u16 (10 % hit)", "packed", sparse.astype(np.uint16), ints),
        ("paired u16 (10 % hit)", "paired", sparse.astype(np.uint16), ints),
    ]
    print(
        f"{s}x{s} scan x {k}x{k} detector, medians of {args.repeat}; swift: "
        f"{hello.implementation} on {hello.device['name']}; {platform.machine()}, "
        f"Python {sys.version.split()[0]}",
        flush=True,
    )
    rows = []
    for label, rep, block, w in cases:
        host = _chunk(rep, block)
        times = {}
        results = {}
        for name, rt in (("cpu", cpu), ("swift", swift)):
            h = rt.put(host)
            try:

                def run(
                    rt: Any = rt, h: Any = h, name: str = name, w: Any = w, out: Any = results
                ) -> None:
                    out[name] = rt.run_frame_pass(h, w, want_sum=True, want_max=True)

                times[name] = _time(run, args.repeat)
            finally:
                rt.release(h)
        a, b = results["cpu"], results["swift"]
        exact = bool(
            np.array_equal(a.per_frame, b.per_frame)
            and np.array_equal(a.pattern_sum, b.pattern_sum)
            and np.array_equal(a.pattern_max, b.pattern_max)
        )
        rel = float(np.max(np.abs(a.per_frame - b.per_frame) / (np.abs(a.per_frame) + 1e-300)))
        nbytes = block.nbytes
        row = {
            "case": label,
            "MiB": nbytes / 2**20,
            "numba_ms": 1e3 * times["cpu"],
            "swift_ms": 1e3 * times["swift"],
            "numba_GBps": nbytes / times["cpu"] / 1e9,
            "swift_GBps": nbytes / times["swift"] / 1e9,
            "swift_over_numba": times["cpu"] / times["swift"],
            "bit_exact": exact,
            "max_rel_diff": rel,
            "accumulation": getattr(swift, "last_accumulation", None),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| case | MiB | Numba ms | Swift ms | Numba GB/s | Swift GB/s | Swift / Numba | equal |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        eq = "bit-exact" if r["bit_exact"] else f"rel {r['max_rel_diff']:.1e}"
        print(
            f"| {r['case']} | {r['MiB']:.0f} | {r['numba_ms']:.1f} | {r['swift_ms']:.1f} | "
            f"{r['numba_GBps']:.2f} | {r['swift_GBps']:.2f} | {r['swift_over_numba']:.2f}x | {eq} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"hello": hello.to_dict(), "rows": rows}, indent=1))
    swift.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
