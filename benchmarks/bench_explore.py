"""Benchmark (issue 25): the explorer's latency from the drag event to the image drawn.

Measured in the browser: Debian's Chromium, driven by Playwright for Python, on
the explorer of ``qf.explore`` (the dataset persisted on the embedded default,
or on the worker layout given).  An ADF ring (inner radius 20-26 px, outer to
the detector's corners) is placed around the pattern's centre; then, per
query, the mouse drags the ring's inner handle by one pointer move of +6
or -5.5 px in turn (15-17 screen px, past the drag tool's 10 px threshold;
the inner radius goes 20, 26, 20.5, 26.5, 21, ...; a pointer-down the drag
tool did not take is tried again and counted as a retry) and the page records, with
``performance.now()``:

* ``t0``: the pointer move the drag tool turned into a new detector;
* ``t1``: the second animation frame after the image's data changed: Bokeh
  draws the new image on its canvas in the first one (``painted``, reported
  too), so by the second it has been on screen for a frame (the latency
  quoted is this conservative one).

The mouse button stays down until the image has come: Bokeh's drag tool
itself tells the server only at the drag's end, and the explorer copies each
redraw of a handle to the server during the drag (``app.py``), so this is
the image following the drag, not the drag's end.

``t1 - t0`` is the latency; the explorer's own compute time for the query
(``ExplorerSession.latest.seconds``, the persisted query through
``qf.compute``) is reported beside it.  The first ``--warmup`` queries of each
case are dropped (kernels load, the radial index builds).  Cases: scan rows
of the dataset (64, 128, 256 of a 256 x 256 x 128 x 128 uint16 ``.npy`` =
0.5, 1, 2 GiB) times worker layouts (``workers x threads``).

    python benchmarks/bench_explore.py --json benchmarks/results_explore.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import quantem_flow as qf  # noqa: E402
from quantem_flow.explorer import Detector, explore  # noqa: E402

DEFAULT_DATA = Path("/tmp/qf-bench14/data_256x256x128x128.npy")

_JS_INSTALL = """() => {
  window.qfT = {moves: [], painted: [], draws: []};
  document.addEventListener('pointermove', () => qfT.moves.push(performance.now()), true);
  const src = Bokeh.documents[0].get_model_by_name('image_source');
  src.properties.data.change.connect(() => {
    requestAnimationFrame(() => {
      qfT.painted.push(performance.now());
      requestAnimationFrame(() => qfT.draws.push(performance.now()));
    });
  });
}"""
_JS_XY = """([plot, x, y]) => {
  const model = Bokeh.documents[0].get_model_by_name(plot);
  const view = Bokeh.index.find_one(model);
  const r = view.canvas_view.el.getBoundingClientRect();
  return [r.left + view.frame.x_scale.compute(x), r.top + view.frame.y_scale.compute(y)];
}"""


def make_data(path: Path) -> None:
    """A 256 x 256 scan of 128 x 128 uint16 Poisson patterns with a probe disk (2 GiB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rr, cc = np.mgrid[:128, :128]
    lam = np.where(np.hypot(rr - 64, cc - 64) < 20, 40.0, 0.5)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(256, 256, 128, 128))
    rng = np.random.default_rng(1)
    for r in range(256):
        out[r] = rng.poisson(lam, size=(256, 128, 128)).astype(np.uint16)
    out.flush()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def run_case(page: Any, ex: Any, queries: int, warmup: int) -> dict[str, Any]:
    session = ex.session
    kr, kc = session.dataset.detector_shape
    centre = ((kr - 1) / 2, (kc - 1) / 2)
    session.set_detector(
        Detector("annulus", center=centre, inner=20.0, outer=float("inf"), name="adf")
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        latest = session.latest
        if latest is not None and latest.detector == session.detector:
            break
        time.sleep(0.05)
    time.sleep(0.5)
    page.evaluate(_JS_INSTALL)
    lat: list[float] = []
    painted: list[float] = []
    compute: list[float] = []
    retries = 0
    for i in range(queries):
        det = session.detector
        # one pointer move of 5.5-6 px (15-17 screen px: past the drag tool's 10 px threshold)
        step = 6.0 if i % 2 == 0 else -5.5
        for attempt in range(3):  # a pointer-down the drag tool did not take is tried again
            start = page.evaluate(_JS_XY, ["navigator", det.center[1] + det.inner, det.center[0]])
            end = page.evaluate(
                _JS_XY, ["navigator", det.center[1] + det.inner + step, det.center[0]]
            )
            n_draws = page.evaluate("() => qfT.draws.length")
            page.mouse.move(*start)
            page.mouse.down()
            n_moves = page.evaluate("() => qfT.moves.length")
            page.mouse.move(*end)  # the button stays down: the image must follow the drag
            deadline = time.monotonic() + (60 if attempt == 2 else 3)
            done = False
            while time.monotonic() < deadline:
                latest = session.latest
                if (
                    latest is not None
                    and latest.detector.inner != det.inner
                    and latest.detector == session.detector
                    and page.evaluate("() => qfT.draws.length") > n_draws
                ):
                    done = True
                    break
                time.sleep(0.002)
            if done:
                break
            page.mouse.up()
            retries += 1
            time.sleep(0.3)
        else:
            latest = session.latest
            raise RuntimeError(
                f"query {i}: no new image in three tries: the session's detector "
                f"{session.detector}, its latest image's {latest and latest.detector}, the page "
                f"{page.evaluate('() => [qfT.moves.length, qfT.draws.length]')} moves/draws, "
                f"status {page.locator('#qf-status').get_attribute('data-detector')}"
            )
        time.sleep(0.05)
        t0 = page.evaluate(f"() => qfT.moves[{n_moves}]")
        t1 = page.evaluate(f"() => qfT.draws.find(t => t > {t0})")
        tp = page.evaluate(f"() => qfT.painted.find(t => t > {t0})")
        if i >= warmup:
            lat.append((t1 - t0) / 1e3)
            painted.append((tp - t0) / 1e3)
            compute.append(session.latest.seconds)
        page.mouse.up()  # the drag's end: the same detector again, no new query
        time.sleep(0.1)
    return {
        "latency_s": lat,
        "compute_s": compute,
        "p50_s": statistics.median(lat),
        "p95_s": percentile(lat, 95),
        "painted_s": painted,
        "retries": retries,
        "painted_p50_s": statistics.median(painted),
        "compute_p50_s": statistics.median(compute),
        "path": session.latest.result.provenance.execution.get("query_route", {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--rows", default="64,128,256", help="scan rows of each case")
    ap.add_argument("--layouts", default="1x2,2x1", help="workers x threads of the cluster")
    ap.add_argument("--queries", type=int, default=22)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--screenshot", type=Path, default=None)
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    if not a.data.exists():
        print(f"writing {a.data} (2 GiB)...", flush=True)
        make_data(a.data)
    chromium = os.environ.get("QF_CHROMIUM") or shutil.which("chromium")
    assert chromium, "no chromium on PATH (apt-get install chromium)"
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "data": str(a.data),
        "queries": a.queries,
        "warmup": a.warmup,
        "cases": [],
    }
    print(f"{'layout':>7} {'GiB':>5} {'p50 ms':>8} {'p95 ms':>8} {'compute p50 ms':>15}  route")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for layout in a.layouts.split(","):
            workers, threads = (int(v) for v in layout.split("x"))
            qf.close_embedded_cluster()
            with qf.config.set(local_workers=workers, local_threads=threads):
                for rows in (int(r) for r in a.rows.split(",")):
                    ds = qf.open(a.data)
                    if rows < ds.scan_shape[0]:
                        ds = ds.crop_scan((0, rows, 0, ds.scan_shape[1]))
                    t0 = time.perf_counter()
                    ex = explore(ds, export_dir="/tmp/qf-bench-explore")
                    start_s = time.perf_counter() - t0
                    page = browser.new_page(viewport={"width": 1450, "height": 1000})
                    errors: list[str] = []
                    page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                    page.goto(ex.url)
                    page.wait_for_selector("#qf-status", timeout=120_000)
                    try:
                        case = run_case(page, ex, a.queries, a.warmup)
                        if a.screenshot is not None and rows == max(
                            int(r) for r in a.rows.split(",")
                        ):
                            page.screenshot(path=str(a.screenshot))
                    finally:
                        page.close()
                        ex.close()
                    case.update(
                        layout=layout,
                        rows=rows,
                        gib=ds.nbytes / 2**30,
                        start_s=start_s,
                        page_errors=errors,
                    )
                    report["cases"].append(case)
                    route = case["path"].get("path") if isinstance(case["path"], dict) else None
                    print(
                        f"{layout:>7} {case['gib']:>5.2f} {case['p50_s'] * 1e3:>8.1f} "
                        f"{case['p95_s'] * 1e3:>8.1f} {case['compute_p50_s'] * 1e3:>15.1f}  "
                        f"{route}",
                        flush=True,
                    )
        browser.close()
    qf.close_embedded_cluster()
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
