"""Benchmark: what an open dashboard page costs the passes it watches, code against code.

Run from the repository root::

    git archive <before> | tar -x -C /tmp/before_dash
    python benchmarks/bench_dashboard_cost.py --code now=. --code before=/tmp/before_dash \\
        --rounds 3 --json benchmarks/results_dashboard_cost_<date>.json

Each ``--code LABEL=TREE`` runs in a fresh interpreter with ``PYTHONPATH=TREE`` on the
embedded default (one local cluster, as ``qf.compute`` makes it).  Per round and code,
after warm-up passes, BF + ADF + CoM passes run back to back over

* ``tiny``: a 4 x 4 scan of 128 x 128 uint16 frames (the fixed cost of a pass), and
* ``mid``: a 64 x 64 scan in 16 chunks of 8 MiB (128 MiB, page-cached),

first with nobody watching, then while a viewer in another process asks for
``/quantem-flow/item.json`` as the page does (``If-None-Match`` with the last tag,
``?since=`` the version it holds where the server names one in ``X-Version``, then
waits the ``X-Refresh-Ms`` the answer names).  The viewer reports how long
each answer took and how many were new pictures (``200``) or unchanged (``304``).
Per phase the median, 95th percentile and slowest pass; rounds alternate the codes;
medians over rounds of each round's figures, in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_fixed_cost import write_data  # noqa: E402
from fresh_checkout import compile_bytecode, run_in_tree  # noqa: E402

VIEWER = r"""
import json, sys, time, urllib.error, urllib.request
from pathlib import Path
url, stop = sys.argv[1], Path(sys.argv[2])
tag, version, took, codes, sizes = "", None, [], [], []
while not stop.exists():
    since = "" if version is None else f"?since={version}"
    request = urllib.request.Request(url + since, headers={"If-None-Match": tag})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            sizes.append(len(r.read()))
            tag, code, wait = r.headers["ETag"], r.status, r.headers["X-Refresh-Ms"]
            version = r.headers.get("X-Version")  # a page that takes patches says so
    except urllib.error.HTTPError as e:
        code, wait = e.code, e.headers.get("X-Refresh-Ms")
    took.append(time.perf_counter() - t)
    codes.append(code)
    time.sleep(int(wait or 500) / 1000)
print(json.dumps({"took_ms": [1e3 * v for v in took], "codes": codes, "sizes": sizes}))
"""

CHILD = r"""
import json, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import quantem_flow as qf
from quantem_flow.graphs.cluster import embedded_client, flow_dashboard_url
print("FROM " + qf.__file__, flush=True)

folder, viewer_code = Path(sys.argv[1]), sys.argv[2]
k = 128
tiny = qf.open(str(folder / "tiny_4x4x128x128.npy"))
mid = qf.open(str(folder / "mid_64x64x128x128.npy"), chunk_mib=8)
c = (k / 2, k / 2)

def ops(ds):
    return [qf.virtual_bf(ds, radius=k / 6, center=c),
            qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
            qf.center_of_mass(ds, center=c)]

def timed(ds, n, name):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        qf.compute(*ops(ds), progress=False)
        out.append(1e3 * (time.perf_counter() - t))
    out.sort()
    res[name + "_ms"] = statistics.median(out)
    res[name + "_p95_ms"] = out[int(0.95 * (n - 1))]
    res[name + "_max_ms"] = out[-1]

for _ in range(5):
    qf.compute(*ops(tiny), progress=False)
    qf.compute(*ops(mid), progress=False)
url = flow_dashboard_url(embedded_client()) + "/item.json"
res = {}
timed(tiny, 150, "tiny")
timed(mid, 40, "mid")
with tempfile.TemporaryDirectory() as tmp:
    stop = Path(tmp) / "stop"
    viewer = subprocess.Popen([sys.executable, "-c", viewer_code, url, str(stop)],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    timed(tiny, 150, "tiny_watched")
    timed(mid, 40, "mid_watched")
    stop.touch()
    seen = json.loads(viewer.communicate(timeout=120)[0])
took, codes = seen["took_ms"], seen["codes"]
new = [t for t, code in zip(took, codes) if code == 200]
same = [t for t, code in zip(took, codes) if code == 304]
res["viewer_asks"] = len(codes)
res["viewer_new"] = len(new)
res["viewer_new_ms"] = statistics.median(new) if new else None
res["viewer_same_ms"] = statistics.median(same) if same else None
res["viewer_new_bytes"] = statistics.median(seen["sizes"]) if seen["sizes"] else None
print("RESULT " + json.dumps(res))
"""


def run_one(tree: str, folder: Path) -> dict[str, float]:
    return run_in_tree(tree, CHILD, [str(folder), VIEWER], label=tree)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", action="append", required=True, help="LABEL=TREE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/qf-bench-fixed"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    write_data(args.dir)
    codes = dict(spec.split("=", 1) for spec in args.code)
    for tree in codes.values():
        compile_bytecode(Path(tree))
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in codes}
    for r in range(args.rounds):
        for label, tree in codes.items():
            res = run_one(tree, args.dir)
            runs[label].append(res)
            print(f"round {r + 1} {label}: {json.dumps(res)}", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for label, results in runs.items():
        keys = [k for k in results[0] if all(res.get(k) is not None for res in results)]
        summary[label] = {k: statistics.median(float(res[k]) for res in results) for k in keys}
        print(label, json.dumps({k: round(v, 2) for k, v in summary[label].items()}))
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "medians": summary}, indent=1))


if __name__ == "__main__":
    main()
