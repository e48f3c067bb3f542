"""Check (issue 24, item 4): do the CPU runtime's inner loops vectorise?

Compiles the structured group loops a BF, BF+ADF and BF+ADF+CoM pass on 128 x 128 u16
frames run (a fresh Numba cache directory, so the machine code is generated in this
process), then reads their machine code with Numba's ``inspect_asm`` and counts, per
instruction of interest, how many act on 512-bit (``zmm``), 256-bit (``ymm``) and 128-bit
(``xmm``) registers or on none (scalar).  The instructions: the widening load of u16
pixels to int32 lanes (``vpmovzxwd``), the int32 adds of the run sums and moments
(``vpaddd``), the int32 multiply of the moments (``vpmulld``), and the 64-bit adds of
the per-cell widening (``vpaddq``).

    NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/inspect_kernels.py --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernel_structure import DET, frames_for, weight_sets  # noqa: E402

from quantem_flow.runtimes.cpu import structure  # noqa: E402
from quantem_flow.runtimes.cpu.kernels import frame_pass_variant  # noqa: E402

OPS = ("vpmovzxwd", "vpaddd", "vpmulld", "vpaddq")


def widths(asm: str, op: str) -> dict[str, int]:
    """How many ``op`` instructions act on each register width in ``asm``."""
    counts: collections.Counter[str] = collections.Counter()
    for m in re.finditer(r"^\s+(" + op + r")\s+([^\n]*)", asm, re.M):
        args = m.group(2)
        reg = next((r for r in ("zmm", "ymm", "xmm") if r in args), "scalar")
        counts[reg] += 1
    return dict(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    frames = frames_for("uint16", 64)
    summaries = {}
    for name, w in weight_sets().items():
        res = frame_pass_variant(frames, w, want_sum=False, want_max=False, frame_shape=DET)
        summaries[name] = str(res[3].get("summary", ""))
    cpu_flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
        cpu_flags = " ".join(sorted({f for f in flags.split() if f.startswith("avx")}))
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "avx_flags": cpu_flags,
        "passes": summaries,
        "loops": {},
    }
    print(f"CPU flags: {cpu_flags}")
    for (mode, moments, fused), fn in structure._SEGMENTS.items():
        for sig, asm in fn.inspect_asm().items():
            key = f"mode={mode} moments={moments} fused={fused} frames={sig[0]}"
            counts = {op: widths(asm, op) for op in OPS}
            report["loops"][key] = counts
            print(key)
            for op, c in counts.items():
                print(f"    {op:<10} {c}")
    if not report["loops"]:
        raise SystemExit("no loop compiled in this process: run with an empty NUMBA_CACHE_DIR")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
