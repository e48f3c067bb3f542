"""Benchmark (issue 25): the explorer's page served by Bokeh's server against Panel's.

The same explorer document (``explorer/app.py``, one shared
:class:`~quantem_flow.explorer.session.ExplorerSession` on one persisted
dataset) is served two ways, side by side, in one run: by Bokeh's own server
(what ``qf.explore`` does) and by Panel's (``pn.serve`` of a function building
the same document, Panel's templates and resources around it).  Each is
driven in Debian's Chromium by the drag protocol of ``bench_explore.py``
(drag-to-image latency, medians and p95 over the queries after the warm-up),
the two alternating for ``--rounds`` rounds.

Panel is not a dependency of quantem-flow; run this from an environment that
has it (``pip install panel``):

    python benchmarks/bench_explore_frameworks.py --rows 256 --rounds 3 \\
        --json benchmarks/results_explore_frameworks.json
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_explore import DEFAULT_DATA, make_data, run_case  # noqa: E402

import quantem_flow as qf  # noqa: E402
from quantem_flow.explorer import Explorer, ExplorerSession  # noqa: E402


class _PanelExplorer:
    """The explorer document served by Panel's server (the shape ``run_case`` uses)."""

    def __init__(self, session: ExplorerSession):
        import panel as pn

        from quantem_flow.explorer.app import make_document

        self.session = session

        def app() -> Any:
            doc = pn.state.curdoc
            make_document(doc, session, input_spec=None, export_dir="/tmp/qf-bench-explore")
            return doc

        import asyncio
        import threading

        ready = threading.Event()
        box: dict[str, Any] = {}

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            server = pn.serve(
                {"explore": app},
                port=0,
                address="127.0.0.1",
                show=False,
                start=False,
                websocket_origin=["127.0.0.1", "localhost"],
                check_unused_sessions=2000,
                unused_session_lifetime=5000,
            )
            server._tornado._websocket_origins = {
                f"127.0.0.1:{server.port}",
                f"localhost:{server.port}",
            }
            server.start()
            box.update(server=server, loop=loop)
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        ready.wait(60)
        self._server = box["server"]
        self._loop = box["loop"]
        self.url = f"http://127.0.0.1:{self._server.port}/explore"

    def close(self) -> None:
        def stop() -> None:
            self._server.stop()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=22)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import bokeh
    import panel as pn
    from playwright.sync_api import sync_playwright

    if not a.data.exists():
        make_data(a.data)
    chromium = os.environ.get("QF_CHROMIUM") or shutil.which("chromium")
    assert chromium, "no chromium on PATH (apt-get install chromium)"
    ds = qf.open(a.data)
    if a.rows < ds.scan_shape[0]:
        ds = ds.crop_scan((0, a.rows, 0, ds.scan_shape[1]))
    session = ExplorerSession(ds)
    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "bokeh": bokeh.__version__,
        "panel": pn.__version__,
        "gib": ds.nbytes / 2**30,
        "rounds": [],
    }
    print(f"{ds.nbytes / 2**30:.2f} GiB; bokeh {bokeh.__version__}, panel {pn.__version__}")
    print(f"{'round':>5} {'server':>7} {'p50 ms':>8} {'p95 ms':>8} {'query p50 ms':>13}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for rnd in range(a.rounds):
                order = ["bokeh", "panel"] if rnd % 2 == 0 else ["panel", "bokeh"]
                for name in order:
                    server: Any = (
                        Explorer(session, export_dir="/tmp/qf-bench-explore")
                        if name == "bokeh"
                        else _PanelExplorer(session)
                    )
                    page = browser.new_page(viewport={"width": 1450, "height": 1000})
                    errors: list[str] = []
                    page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                    t0 = time.perf_counter()
                    page.goto(server.url)
                    page.wait_for_selector("#qf-status", timeout=120_000)
                    load_s = time.perf_counter() - t0
                    try:
                        case = run_case(page, server, a.queries, a.warmup)
                    finally:
                        page.close()
                        if name == "bokeh":  # the session is shared: stop only the server
                            server.close(keep_session=True)
                        else:
                            server.close()
                    case.update(server=name, round=rnd, page_load_s=load_s, page_errors=errors)
                    report["rounds"].append(case)
                    print(
                        f"{rnd:>5} {name:>7} {case['p50_s'] * 1e3:>8.1f} "
                        f"{case['p95_s'] * 1e3:>8.1f} {case['compute_p50_s'] * 1e3:>13.1f}",
                        flush=True,
                    )
        finally:
            browser.close()
            session.close()
    for name in ("bokeh", "panel"):
        lat = [x for c in report["rounds"] if c["server"] == name for x in c["latency_s"]]
        load = [c["page_load_s"] for c in report["rounds"] if c["server"] == name]
        report[name] = {
            "p50_s": statistics.median(lat),
            "p95_s": float(np.percentile(lat, 95)),
            "page_load_s": statistics.median(load),
        }
        print(
            f"{name}: all rounds p50 {report[name]['p50_s'] * 1e3:.1f} ms, p95 "
            f"{report[name]['p95_s'] * 1e3:.1f} ms, page load {report[name]['page_load_s']:.2f} s"
        )
    qf.close_embedded_cluster()
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
