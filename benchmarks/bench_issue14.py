"""Benchmark (issue 14): SSB end to end and a persisted ring query, before and after, one run.

Run from the repository root, with a copy of the code before the change (a
``git archive`` of that commit, say) as the baseline::

    git archive <before> | tar -x -C /tmp/before && ln -s "$PWD/bench-data" /tmp/before/
    python benchmarks/bench_issue14.py --baseline /tmp/before --repeat 3

Both parts use the 256 x 256 scan x 128 x 128 detector uint16 dataset of
``bench_ssb.py`` (2 GiB ``.npy`` in ``bench-data/``, generated once).  Each
measurement runs in a fresh interpreter whose ``PYTHONPATH`` is the code
under test (so the embedded cluster's worker programs run it too), the
baseline and this checkout interleaved, ``--repeat`` times each:

The interpreters run in the code's folder (the worker programs, started
with ``python -m``, import from there).

* ``ssb``: ``qf.compute(ssb(...), client="synchronous")`` (``--ssb-client
  threads``: this process on a thread per CPU) from the file: the
  first compute of the process (``cold``: includes Numba's start-up and the
  first imports), then the same compute again (``warm``).  The stage
  timings come from the result's provenance; the two objects are compared.
* ``ring``: the embedded cluster (``client=None``; ``--workers`` worker
  programs x ``--threads`` threads, default 1 x 2, the embedded default on
  a 2-core machine), ``persist()`` the file, then ADF rings whose inner radius
  changes every query (20 to 26 px around the detector centre); the first
  two queries are left out of the median.  Results are compared with a
  ring computed from the file.
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


def _ssb_child(root: Path, out: Path) -> dict[str, Any]:
    client = os.environ.get("QF_BENCH_SSB_CLIENT", "synchronous")
    import numpy as np

    t0 = time.perf_counter()
    import quantem_flow as qf
    from quantem_flow.operators.ssb import ssb

    import_s = time.perf_counter() - t0
    sys.path.insert(0, str(root / "benchmarks"))
    import bench_ssb as b

    npy, truth = b.generate(256, 128)  # (writes the data once; not timed)
    t1 = time.perf_counter()
    ds = qf.open(npy, calibration=b.calibration(128))
    rows: dict[str, Any] = {
        "code": str(qf.__file__),
        "client": client,
        "import_s": import_s,
        "open_s": time.perf_counter() - t1,
    }
    for label in ("cold", "warm"):
        lazy = ssb(ds, voltage_kV=b.KV, semiangle_mrad=b.ALPHA_MRAD, defocus_A=b.C10, backend="cpu")
        t = time.perf_counter()
        with qf.config.set(progress=False):
            (res,) = qf.compute(lazy, client=client)
        total = time.perf_counter() - t
        tm = res.provenance.timings
        rows[label] = {
            "total_s": total,
            **{k: float(tm[k]) for k in ("plan_s", "pass_s", "ssb_stage_s") if k in tm},
            **{k: float(tm[k]) for k in ("ssb_fft_accumulate_s", "ssb_read_s") if k in tm},
        }
    rows["fresh_total_s"] = rows["import_s"] + rows["open_s"] + rows["cold"]["total_s"]
    rows["correlation"] = b.correlation(res.phase, np.load(truth))
    rows["loss"] = float(res.provenance.parameters["double_overlap_loss"])
    np.save(out, res.data)
    return rows


def _code_of_workers() -> str:
    import quantem_flow

    return str(quantem_flow.__file__)


def _ring_child(root: Path, out: Path, queries: int) -> dict[str, Any]:
    import numpy as np

    import quantem_flow as qf

    npy = root / "bench-data" / "ssb_256x256x128x128_u16.npy"
    ds = qf.open(npy)
    rows: dict[str, Any] = {
        "code": str(qf.__file__),
        "workers": int(qf.config.get("local_workers")),
        "threads": int(qf.config.get("local_threads")),
    }
    from quantem_flow.graphs.cluster import embedded_client

    rows["worker_code"] = sorted(set(embedded_client().run(_code_of_workers).values()))
    with qf.config.set(progress=False):
        t = time.perf_counter()
        p = ds.persist()
        rows["persist_s"] = time.perf_counter() - t
        times, passes, kernels = [], [], []
        res: Any = None
        for i in range(queries):
            inner = 20.0 + i % 7
            lazy = qf.virtual_annular(p, inner=inner, outer=float("inf"), center=(64.0, 64.0))
            t = time.perf_counter()
            (res,) = qf.compute(lazy)
            times.append(time.perf_counter() - t)
            passes.append(float(res.provenance.timings["pass_s"]))
            kernels.append(float(res.provenance.execution["kernel_s_total"]))
        (ref,) = qf.compute(
            qf.virtual_annular(ds, inner=inner, outer=float("inf"), center=(64.0, 64.0))
        )
        rows["identical_to_file_pass"] = bool(np.array_equal(ref.data, res.data))
        rows["times"] = times
        rows["query_s"] = statistics.median(times[2:])
        rows["p95_s"] = float(np.percentile(times[2:], 95))
        rows["pass_s"] = statistics.median(passes[2:])
        rows["kernel_s_total"] = statistics.median(kernels[2:])
        rows["paths"] = sorted(
            {str(r.get("query", {}).get("path", "-")) for r in res.provenance.execution["chunks"]}
        )
        route = res.provenance.execution.get("query_route") or {}
        rows["route"] = str(route.get("path", "-"))
        np.save(out, res.data)
    return rows


def _run(
    code: Path,
    part: str,
    out: Path,
    queries: int,
    workers: int,
    threads: int,
    ssb_client: str = "synchronous",
) -> dict[str, Any]:
    env = {
        **os.environ,
        "QF_BENCH_SSB_CLIENT": ssb_client,
        "PYTHONPATH": str(code),
        "QUANTEM_FLOW_LOCAL_WORKERS": str(workers),
        "QUANTEM_FLOW_LOCAL_THREADS": str(threads),
    }
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        part,
        "--code",
        str(code),
        "--out",
        str(out),
        "--queries",
        str(queries),
    ]
    # run in the code's own folder: ``python -m`` worker programs put the working folder first
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=code, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{part} on {code} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=False, help="checkout of the code before")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queries", type=int, default=12)
    ap.add_argument("--workers", type=int, default=1, help="embedded worker programs")
    ap.add_argument("--threads", type=int, default=2, help="threads per embedded worker")
    ap.add_argument("--parts", default="ssb,ring")
    ap.add_argument(
        "--ssb-client",
        default="synchronous",
        help="client of this checkout's SSB computes: synchronous (one thread) or threads",
    )
    ap.add_argument(
        "--baseline-ssb-client",
        default="synchronous",
        help="client of the baseline's SSB computes (--baseline . --ssb-client threads compares "
        "the two clients on this checkout)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = _ssb_child if args.child == "ssb" else None
        if fn is not None:
            row = fn(args.code, args.out)
        else:
            row = _ring_child(args.code, args.out, args.queries)
        print(json.dumps(row))
        return 0
    import numpy as np

    codes = {"after": ROOT}
    clients = {"after": args.ssb_client, "before": args.baseline_ssb_client}
    if args.baseline is not None:
        codes["before"] = args.baseline.resolve()
    tmp = ROOT / "bench-data" / "issue14"
    tmp.mkdir(parents=True, exist_ok=True)
    print(
        f"# {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()}"
    )
    report: dict[str, Any] = {"load_start": os.getloadavg(), "parts": {}}
    for part in args.parts.split(","):
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in codes}
        if part == "ssb":  # compile Numba caches once per checkout (not timed)
            for label, code in codes.items():
                compile_bytecode(code)  # as an installed copy has it
                _run(
                    code,
                    part,
                    tmp / f"{part}_{label}_warmup.npy",
                    args.queries,
                    args.workers,
                    args.threads,
                    clients[label],
                )
        for _ in range(args.repeat):
            for label, code in codes.items():
                out = tmp / f"{part}_{label}.npy"
                runs[label].append(
                    _run(code, part, out, args.queries, args.workers, args.threads, clients[label])
                )
        diff = None
        if len(codes) == 2:
            a, b = (np.load(tmp / f"{part}_{k}.npy") for k in ("after", "before"))
            diff = float(np.max(np.abs(a - b)))
        report["parts"][part] = {"runs": runs, "max_abs_diff_after_before": diff}
        print(f"\n## {part} (median of {args.repeat}; max |after - before| = {diff})")
        if part == "ssb":
            for mode in ("cold", "warm"):
                keys = [k for k in runs["after"][0][mode] if k in runs[list(codes)[-1]][0][mode]]
                print(f"{mode:5s} {'':8s}" + "".join(f"{k:>22s}" for k in keys))
                med = {
                    label: {k: statistics.median(r[mode][k] for r in rs) for k in keys}
                    for label, rs in runs.items()
                }
                for label in codes:
                    print(f"{'':5s} {label:8s}" + "".join(f"{med[label][k]:22.3f}" for k in keys))
                if len(codes) == 2:
                    ratio = med["before"]["total_s"] / med["after"]["total_s"]
                    print(f"{'':5s} before/after total: {ratio:.2f}x")
            print("import + open + cold compute (a fresh interpreter's first result):")
            for label, rs in runs.items():
                parts = {
                    k: statistics.median(float(r.get(k, float("nan"))) for r in rs)
                    for k in ("import_s", "open_s", "fresh_total_s")
                }
                print(
                    f"{'':5s} {label:8s} import {parts['import_s']:.3f}  open {parts['open_s']:.3f}"
                    f"  total {parts['fresh_total_s']:.3f}"
                )
            for label, rs in runs.items():
                print(
                    f"{label} ({rs[-1].get('client', 'synchronous')}): correlation "
                    f"{rs[-1]['correlation']:.4f}, loss {rs[-1]['loss']:.4f}"
                )
        else:
            keys = ["query_s", "p95_s", "pass_s", "kernel_s_total", "persist_s"]
            print(f"{'':8s}" + "".join(f"{k:>16s}" for k in keys) + "  paths, route, identical")
            for label, rs in runs.items():
                med = {k: statistics.median(r[k] for r in rs) for k in keys}
                print(
                    f"{label:8s}"
                    + "".join(f"{med[k]:16.3f}" for k in keys)
                    + f"  {rs[-1]['paths']}, {rs[-1]['route']}, "
                    + f"{all(r['identical_to_file_pass'] for r in rs)}"
                )
            if len(codes) == 2:
                q = {k: statistics.median(r["query_s"] for r in rs) for k, rs in runs.items()}
                print(f"before/after query: {q['before'] / q['after']:.2f}x")
    report["load_end"] = os.getloadavg()
    print(f"# load average at end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
