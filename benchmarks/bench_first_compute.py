"""Benchmark (issue 24 item 7): import and the first compute on an empty Numba cache.

Run from the repository root, with copies of earlier code as baselines::

    git archive <commit> | tar -x -C /tmp/before
    python benchmarks/bench_first_compute.py --code before=/tmp/before --repeat 3

Each measurement is a fresh interpreter whose ``PYTHONPATH`` is the code under
test and whose ``NUMBA_CACHE_DIR`` is a new empty folder (a fresh install):
``import quantem_flow``, then BF + ADF + CoM (centre (31.4, 32.7), fractional)
through the embedded default (``client=None``: the local cluster starts
inside the compute; ``--client threads``: this process on a thread per
CPU) on a 32 x 32 x 64 x 64 uint16 array in memory, then the
same compute again in the same interpreter (``second``), then a fresh
interpreter on the now filled cache (``cached``).  The checkouts alternate;
medians of ``--repeat``.  The variant of the first chunk and the compile
seconds come from the result's provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fresh_checkout import compile_bytecode

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, os, time
t0 = time.perf_counter()
import quantem_flow as qf
t_import = time.perf_counter() - t0
import numpy as np
rng = np.random.default_rng(0)
data = rng.poisson(3, size=(32, 32, 64, 64)).astype(np.uint16)
c = (31.4, 32.7)
def run():
    ds = qf.open(data)
    t = time.perf_counter()
    with qf.config.set(progress=False):
        out = qf.compute(qf.virtual_bf(ds, radius=10, center=c),
                         qf.virtual_adf(ds, inner=20, center=c),
                         qf.center_of_mass(ds, center=c),
                         client=os.environ.get("QF_BENCH_CLIENT") or None)
    ex = out[0].provenance.execution
    return time.perf_counter() - t, ex, out
first_s, ex, out = run()
second_s, ex2, out2 = run()
print(json.dumps({
    "import_s": t_import, "first_s": first_s, "second_s": second_s,
    "first_total_s": t_import + first_s,
    "compile_s": ex["compile_s_total"],
    "variant": sorted({r["frame_pass_variant"]["variant"] for r in ex["chunks"]}),
    "second_variant": sorted({r["frame_pass_variant"]["variant"] for r in ex2["chunks"]}),
    "same": all(a.data.tobytes() == b.data.tobytes() for a, b in zip(out, out2)),
}))
"""


def _once(code: Path, cache: Path, client: str = "") -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "NUMBA_CACHE_DIR": str(cache),
        "QF_BENCH_CLIENT": client,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{code} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--code",
        action="append",
        default=[],
        help="label=path of a baseline; label=path@threads computes with client='threads'",
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    codes = {"after": ROOT}
    clients = {"after": ""}
    for item in args.code:
        label, _, where = item.partition("=")
        path, _, clients[label] = where.partition("@")
        codes[label] = Path(path).resolve()
    print(
        f"# {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()}"
    )
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in codes}
    for code in set(codes.values()):
        compile_bytecode(code)  # as an installed copy has it (not timed)
    for _ in range(args.repeat):
        for label, code in codes.items():
            with tempfile.TemporaryDirectory(prefix="qf-numba-") as cache:
                row = _once(code, Path(cache), clients[label])
                row["cached"] = _once(code, Path(cache), clients[label])
            runs[label].append(row)
    keys = ["import_s", "first_s", "first_total_s", "compile_s", "second_s"]
    print(f"{'':8s}" + "".join(f"{k:>15s}" for k in keys) + f"{'cached first_s':>16s}  variant")
    for label, rs in runs.items():
        med = {k: statistics.median(float(r[k]) for r in rs) for k in keys}
        cached = statistics.median(float(r["cached"]["first_s"]) for r in rs)
        print(
            f"{label:8s}"
            + "".join(f"{med[k]:15.2f}" for k in keys)
            + f"{cached:16.2f}  {rs[-1]['variant']} then {rs[-1]['second_variant']}, "
            + f"same values: {all(r['same'] for r in rs)}"
        )
    print(f"# load average at end {os.getloadavg()}")
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
