"""Benchmark (issue 24, goal 8): SSB 256 x 256 x 128 x 128 against ptychography40, one run.

Run from the repository root with an interpreter that has ptychography40 and
LiberTEM installed (a separate environment: they pin other versions of Dask)::

    python3 -m venv /tmp/ltvenv && /tmp/ltvenv/bin/pip install -e . libertem ptychography40
    python benchmarks/bench_ssb_peer.py --peer-python /tmp/ltvenv/bin/python --repeat 3

The data is ``bench_ssb.py``'s 2 GiB ``.npy`` (300 kV, 20 mrad, C10 = 50 Å,
generated once into ``bench-data/``).  Each measurement is a fresh
interpreter:

* ``quantem-flow``: ``qf.compute(ssb(...), client=...)`` (``--clients``,
  default ``threads,synchronous``); ``cold`` is the process's first compute,
  ``warm`` the same compute again (``bench_issue14.py``'s child).
* ``ptychography40``: its ``SSB_UDF`` (trotter masks as a sparse stack, float32
  by default, its default ``method="subpix"``) through a LiberTEM
  ``Context`` on ``--peer-workers`` local CPU workers, with the same
  wavelength, scan step, semiconvergence, disk radius (16.3 px) and optical
  axis (64, 64); ``total`` includes the context's start, ``run`` is
  ``run_udf`` alone.  It corrects no aberration, so its phase is not the
  truth's with this data's 50 Å defocus: its correlation is printed, not
  compared.

quantem-flow and ptychography40 runs alternate, ``--repeat`` times each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fresh_checkout import compile_bytecode

ROOT = Path(__file__).resolve().parents[1]

_PEER = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import libertem.api as lt
from ptychography40.reconstruction.common import wavelength
from ptychography40.reconstruction.ssb import SSB_UDF
sys.path.insert(0, sys.argv[1])
import bench_ssb as b
npy, truth = b.generate(256, 128)
g = b.geometry(128)
workers = int(sys.argv[2])
ctx = lt.Context.make_with("dask", cpus=workers) if workers > 1 else lt.Context.make_with("inline")
t1 = time.perf_counter()
ds = ctx.load("npy", path=str(npy))
udf = SSB_UDF(lamb=wavelength(b.KV), dpix=g["dx"] * 1e-10, semiconv=b.ALPHA_MRAD * 1e-3,
              semiconv_pix=b.ALPHA_PX, cy=64.0, cx=64.0)
t2 = time.perf_counter()
res = ctx.run_udf(dataset=ds, udf=udf)
t3 = time.perf_counter()
phase = np.asarray(res["phase"].data)
print(json.dumps({"import_s": t1 - t0, "run_s": t3 - t2, "total_s": t3 - t0,
                  "correlation": b.correlation(phase, np.load(truth))}))
ctx.close()
"""


def _qf(client: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QF_BENCH_SSB_CLIENT": client}
    out = ROOT / "bench-data" / "issue14" / f"peer_qf_{client}.npy"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_issue14.py"),
        "--child",
        "ssb",
        "--code",
        str(ROOT),
        "--out",
        str(out),
    ]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"quantem-flow SSB failed:\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t
    return row


def _peer(python: str, workers: int) -> dict[str, Any]:
    t = time.perf_counter()
    done = subprocess.run(
        [python, "-c", _PEER, str(ROOT / "benchmarks"), str(workers)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ptychography40 failed:\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - t
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", required=True, help="interpreter with ptychography40")
    ap.add_argument("--peer-workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--clients", default="threads,synchronous")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    clients = args.clients.split(",")
    compile_bytecode(ROOT)  # as an installed copy has it (not timed)
    print(
        f"# {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()}"
    )
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    runs["ptychography40"] = []
    for i in range(args.repeat):
        for c in clients:
            runs[c].append(_qf(c))
        runs["ptychography40"].append(_peer(args.peer_python, args.peer_workers))
        print(f"repeat {i + 1}/{args.repeat} done", flush=True)
    print(f"\n## SSB 256 x 256 x 128 x 128 u16 (medians of {args.repeat}), seconds")
    for c in clients:
        rs = runs[c]
        cold = statistics.median(r["cold"]["total_s"] for r in rs)
        warm = statistics.median(r["warm"]["total_s"] for r in rs)
        per = ", ".join(f"{r['cold']['total_s']:.3f}" for r in rs)
        print(
            f"quantem-flow ({c}): cold {cold:.3f} ({per}), warm {warm:.3f}, "
            f"correlation {rs[-1]['correlation']:.4f}"
        )
    ps = runs["ptychography40"]
    run_s = statistics.median(r["run_s"] for r in ps)
    total_s = statistics.median(r["total_s"] for r in ps)
    print(
        f"ptychography40 ({args.peer_workers} workers): run_udf {run_s:.1f}, with imports and "
        f"context {total_s:.1f}, correlation {ps[-1]['correlation']:.4f} (no defocus correction)"
    )
    for c in clients:
        cold = statistics.median(r["cold"]["total_s"] for r in runs[c])
        print(f"ptychography40 run_udf / quantem-flow ({c}) cold: {run_s / cold:.0f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": runs, "load_end": os.getloadavg()}, indent=1), encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
