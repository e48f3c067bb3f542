"""External workers (qf-worker/1): bridge put throughput, small-message latency, fused pass.

Side by side in ONE run, on the same data, through the same payload contract
(``put`` -> ``run_frame_pass`` -> ``release``): the in-process CPU runtime and
every external runtime that runs here (the NumPy reference worker, the WebGPU
worker on Node + Dawn/GLES, the WebGPU worker in headless Chromium/SwiftShader,
the Vulkan worker on lavapipe).  On this machine every external device is a CPU
emulation: the figures are correctness and protocol-cost figures, not GPU speed.

Measured per runtime (medians of ``--repeat`` after one warm-up):

- put: one dense chunk put and released (bytes / seconds = GB/s through the
  bridge, including the worker's copy into its device buffers);
- ping: round trip of the smallest message (``ping``);
- pass: the fused frame pass (BF + ADF + CoM: 5 integer weight rows, sum and
  max patterns) on the resident chunk; per_frame and pattern_sum are checked
  bit-exact against the CPU runtime (integer data, integer weights).

Usage::

    python benchmarks/bench_external.py [--scan 32] [--detector 128] [--repeat 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from quantem_flow.representations import Chunk
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.external import spec as external_spec


def weights_for(k: int) -> np.ndarray:
    """BF disk, ADF annulus, CoM (mask, mask*row, mask*col): 5 integer rows."""
    r, c = np.mgrid[0:k, 0:k]
    rr, cc = r - k // 2, c - k // 2
    radius = np.hypot(rr, cc)
    bf = (radius < k / 8).astype(np.float64)
    adf = ((radius >= k / 4) & (radius < k / 2)).astype(np.float64)
    mask = (radius < k / 4).astype(np.float64)
    rows = [bf, adf, mask, mask * rr, mask * cc]
    return np.stack([w.ravel() for w in rows])


def median_time(fn: Any, repeat: int) -> float:
    fn()  # warm-up (pipeline compilation on first dispatch)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(
    name: str, block: np.ndarray, weights: np.ndarray, repeat: int, ref: Any
) -> dict[str, Any]:
    runtime = get_runtime(name)
    host = Chunk("dense", "host", ((0, block.shape[0]), (0, block.shape[1])), block, "dense-v1")
    out: dict[str, Any] = {"runtime": name}
    t0 = time.perf_counter()
    if hasattr(runtime, "start"):
        runtime.start()
    out["start_s"] = time.perf_counter() - t0

    def put_release() -> None:
        runtime.release(runtime.put(host))

    put_s = median_time(put_release, repeat)
    out["put_s"] = put_s
    out["put_GBps"] = block.nbytes / put_s / 1e9
    session = getattr(runtime, "session", None)
    if session is not None:
        pings = [session.ping() for _ in range(max(50, 20 * repeat))]
        out["ping_ms"] = 1e3 * statistics.median(pings)
    handle = runtime.put(host)
    try:
        result: dict[str, Any] = {}

        def run() -> None:
            result["r"] = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=True)

        out["pass_s"] = median_time(run, repeat)
        out["pass_GBps"] = block.nbytes / out["pass_s"] / 1e9
        got = result["r"]
        if ref is not None:
            out["per_frame_exact"] = bool(np.array_equal(got.per_frame, ref.per_frame))
            out["pattern_sum_exact"] = bool(np.array_equal(got.pattern_sum, ref.pattern_sum))
            out["pattern_max_exact"] = bool(np.array_equal(got.pattern_max, ref.pattern_max))
        detail = runtime.describe()
        device = detail.get("device", name)
        out["device"] = str(device.get("name", device) if isinstance(device, dict) else device)
        out["accumulation"] = getattr(runtime, "last_accumulation", None) or "float64/int64"
        return out | {"result": got}
    finally:
        runtime.release(handle)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scan", type=int, default=32, help="scan rows = cols")
    ap.add_argument("--detector", type=int, default=128, help="detector rows = cols")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--runtimes", default="cpu,external-reference,webgpu,webgpu-browser,vulkan,swift"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    names = [n for n in args.runtimes.split(",") if n]
    external_spec.register_requested([n for n in names if n != "cpu"])
    rng = np.random.default_rng(0)
    s, k = args.scan, args.detector
    block = rng.poisson(3.0, size=(s, s, k, k)).astype(np.uint16)
    block[..., k // 2 - 4 : k // 2 + 4, k // 2 - 4 : k // 2 + 4] += 900
    weights = weights_for(k)
    print(
        f"data {block.shape} uint16 = {block.nbytes / 2**20:.1f} MiB, {weights.shape[0]} weight "
        f"rows, median of {args.repeat}; {platform.processor() or platform.machine()}, "
        f"Python {sys.version.split()[0]}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    ref = None
    for name in names:
        try:
            row = bench(name, block, weights, args.repeat, ref)
        except Exception as exc:  # report and go on: one runtime missing is not the run
            print(f"{name}: not measured ({type(exc).__name__}: {exc})", flush=True)
            rows.append({"runtime": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        result = row.pop("result")
        if name == "cpu":
            ref = result
        rows.append(row)
        print(json.dumps(row), flush=True)
    cpu = next((r for r in rows if r["runtime"] == "cpu" and "pass_s" in r), None)
    print("\n| runtime | device | put GB/s | ping ms | pass ms | pass vs cpu | exact |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['runtime']} | not measured: {r['error'][:80]} | | | | | |")
            continue
        ratio = r["pass_s"] / cpu["pass_s"] if cpu else float("nan")
        exact = (
            "reference"
            if r["runtime"] == "cpu"
            else str(
                r.get("per_frame_exact")
                and r.get("pattern_sum_exact")
                and r.get("pattern_max_exact")
            )
        )
        ping = f"{r['ping_ms']:.3f}" if "ping_ms" in r else "-"
        put = "- (host: no copy)" if r["runtime"] == "cpu" else f"{r['put_GBps']:.2f}"
        print(
            f"| {r['runtime']} | {r['device'][:40]} | {put} | {ping} | "
            f"{1e3 * r['pass_s']:.1f} | {ratio:.1f}x | {exact} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"shape": list(block.shape), "repeat": args.repeat, "rows": rows}, fh, indent=1
            )
    for name in names:
        if name != "cpu":
            try:
                close = getattr(get_runtime(name), "close", None)
                if close is not None:
                    close()
            except Exception:
                pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
