"""Benchmark (issue 24, goal 5): the fixed cost of a pass, code against code, client against client.

Run from the repository root::

    python benchmarks/bench_fixed_cost.py --code now=.@default --code before=/tmp/base@default \\
        --code threads=.@threads --rounds 5

Each ``--code LABEL=TREE@CLIENT`` runs in a fresh interpreter with
``PYTHONPATH=TREE`` (bytecode compiled first, as an installed copy has it;
``fresh_checkout.py``) and ``client`` one of ``default`` (the embedded
local cluster), ``graph`` (the embedded cluster with every file pass through
its scheduler: ``direct_passes`` off), ``threads`` or ``synchronous``.  Per round and code, after
five warm-up passes:

* ``tiny``: BF + ADF + CoM over a 4 x 4 scan of 128 x 128 uint16 frames
  (nothing to compute: what a pass costs the engine), 30 passes back to
  back (an explorer's stream of queries) and 15 with 20 ms between them
  (a pass on its own);
* ``16 chunks``: the same detectors over a 64 x 64 scan in 16 chunks of
  8 MiB (128 MiB page-cached), 15 passes back to back, and the same pass
  with ``client="threads"`` in the same interpreter (the work alone);
* on the embedded default, Dask's own floor in the same cluster: one task
  that does nothing, submitted and its result fetched, back to back and
  with 20 ms between.

Rounds alternate the codes; medians over rounds of each round's median are
printed in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fresh_checkout import compile_bytecode, run_in_tree  # noqa: E402

CHILD = r"""
import json, statistics, sys, time
import numpy as np
from pathlib import Path
import quantem_flow as qf
print("FROM " + qf.__file__, flush=True)

client_name, folder = sys.argv[1], Path(sys.argv[2])
client = None if client_name in ("default", "graph") else client_name
graph_only = qf.config.set(direct_passes=False) if client_name == "graph" else None
if graph_only is not None:  # the embedded default, every file pass through the scheduler
    graph_only.__enter__()  # (kept referenced: the setting lasts while the object lives)
k = 128
tiny_path = folder / "tiny_4x4x128x128.npy"
mid_path = folder / "mid_64x64x128x128.npy"
tiny = qf.open(str(tiny_path))
mid = qf.open(str(mid_path), chunk_mib=8)
c = (k / 2, k / 2)

def ops(ds):
    return [qf.virtual_bf(ds, radius=k / 6, center=c),
            qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
            qf.center_of_mass(ds, center=c)]

def timed(ds, n, gap_s, who):
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter()
        qf.compute(*ops(ds), progress=False, client=who)
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3

for _ in range(5):
    qf.compute(*ops(tiny), progress=False, client=client)
    qf.compute(*ops(mid), progress=False, client=client)
    qf.compute(*ops(mid), progress=False, client="threads")
res = {
    "tiny_back_to_back_ms": timed(tiny, 30, 0.0, client),
    "tiny_apart_ms": timed(tiny, 15, 0.02, client),
    "mid_back_to_back_ms": timed(mid, 15, 0.0, client),
    "mid_threads_ms": timed(mid, 15, 0.0, "threads"),
}
if client is None:
    from quantem_flow.graphs.cluster import embedded_client
    route = qf.compute(*ops(tiny), progress=False)[0].provenance.execution["query_route"]
    res["route"] = route["path"] if route else None
    cl = embedded_client()
    def nothing():
        return None
    for gap, name in ((0.0, "dask_task_back_to_back_ms"), (0.02, "dask_task_apart_ms")):
        ts = []
        for _ in range(30):
            if gap:
                time.sleep(gap)
            t = time.perf_counter()
            cl.submit(nothing, pure=False).result()
            ts.append(time.perf_counter() - t)
        res[name] = statistics.median(ts) * 1e3
print("RESULT " + json.dumps(res))
"""


def write_data(folder: Path) -> None:
    """The tiny and mid ``.npy`` files of these benchmarks in ``folder``, where missing."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, scan in (("tiny_4x4x128x128.npy", (4, 4)), ("mid_64x64x128x128.npy", (64, 64))):
        path = folder / name
        if not path.exists():
            np.save(path, rng.integers(0, 100, (*scan, 128, 128), dtype=np.uint16))


def run_one(tree: str, client: str, folder: Path) -> dict[str, float]:
    return run_in_tree(tree, CHILD, [client, str(folder)], label=f"{tree}@{client}", timeout_s=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", action="append", required=True, help="LABEL=TREE@CLIENT")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench-fixed"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    codes = []
    for item in a.code:
        label, rest = item.split("=", 1)
        tree, client = rest.rsplit("@", 1)
        codes.append((label, tree, client))
    write_data(a.dir)
    for tree in {t for _, t, _ in codes}:
        compile_bytecode(Path(tree))
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in codes}
    for r in range(a.rounds):
        order = codes if r % 2 == 0 else list(reversed(codes))
        for label, tree, client in order:
            rows[label].append(run_one(tree, client, a.dir))
            print(f"round {r + 1} {label}: {rows[label][-1]}", flush=True)
    summary = {
        label: {
            key: round(statistics.median(x[key] for x in runs), 2)
            for key in runs[0]
            if isinstance(runs[0][key], float)
        }
        for label, runs in rows.items()
    }
    print("\nmedian over rounds (ms)")
    for label, values in summary.items():
        print(f"{label:>12s}: " + ", ".join(f"{k} {v}" for k, v in values.items()))
    if a.json:
        a.json.write_text(
            json.dumps({"codes": codes, "rounds": rows, "summary": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
