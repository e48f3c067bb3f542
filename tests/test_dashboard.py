"""The /quantem-flow dashboard page (issue 12, item 6).

It exists from the moment a local cluster starts (not only after the first
compute), is linked from Dask's navigation bar, is a Bokeh document whose
charts carry the run's data (loaded in headless Chromium with no JavaScript
error, screenshot taken), and without Bokeh it is a plain page that says so.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.dataset import Dataset4D
from tests.conftest import probe_data
from tests.slow_source import SlowArraySource
from tests.test_explore import _chromium

ROOT = Path(__file__).resolve().parents[1]
CENTER = (8.6, 14.2)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as resp:
        return int(resp.status), str(resp.read().decode())


@pytest.mark.cluster
def test_the_page_is_served_before_the_first_compute_and_linked_from_dask() -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import flow_dashboard_url, start_local_cluster

    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        url = flow_dashboard_url(client)
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert url.endswith("/quantem-flow")
        status, page = _get(url)  # nothing computed yet
        assert status == 200
        assert "quantem-flow placement: 1 worker(s)" in page  # the summary, without JavaScript
        assert "bokeh" in page.lower()
        state = json.loads(_get(url + "/state.json")[1])
        assert state["page"] == "bokeh" and len(state["workers"]) == 1
        _, dask_status = _get(url.rsplit("/", 1)[0] + "/status")
        assert 'href="quantem-flow"' in dask_status  # in Dask's navigation bar
    finally:
        client.close()
        cluster.close()


@pytest.mark.cluster
def test_without_bokeh_the_page_is_a_plain_table_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from distributed import Client

    from quantem_flow.graphs import dashboard
    from quantem_flow.graphs.cluster import flow_dashboard_url, start_local_cluster

    monkeypatch.setattr(dashboard, "bokeh_available", lambda: False)
    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        url = flow_dashboard_url(client)
        assert url is not None
        status, page = _get(url)
        assert status == 200
        assert "quantem-flow placement" in page and "Bokeh is not installed" in page
        assert json.loads(_get(url + "/state.json")[1])["page"] == "html"
    finally:
        client.close()
        cluster.close()


def _queries(ds: Dataset4D) -> list[Any]:
    return [qf.virtual_bf(ds, radius=4.5, center=CENTER), qf.center_of_mass(ds, center=CENTER)]


#: Reads the length of a column of a named model of the page's Bokeh document (-1: absent).
_COLUMN_JS = """([name, col]) => {
  const d = window.Bokeh && window.Bokeh.documents && window.Bokeh.documents[0];
  const m = d && d.get_model_by_name(name);
  if (!m) return -1;
  const v = m.data instanceof Map ? m.data.get(col) : m.data[col];
  return v ? v.length : -1;
}"""


def _browser(url: str, shot: Path) -> dict[str, Any]:
    """Load the page in Debian's Chromium through Playwright for Python; screenshot it.

    Returns what the page showed: status, errors (console, page, failed requests,
    HTTP >= 400), title, navigation links and the lengths of the charts' columns.
    """
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    errors: list[str] = []
    aborted_polls: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on(
                "console",
                lambda m: errors.append("console: " + m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

            def failed(r: Any) -> None:
                # Chromium aborts a poll of the charts now and then (net::ERR_ABORTED, seen in
                # 1 of 3 runs of the lost-worker test, before the live panel too); the next
                # poll a moment later brings the picture, so a reader sees nothing of it
                polled = r.url.split("?")[0].endswith(("/item.json", "/live.json"))
                if "ERR_ABORTED" in str(r.failure) and polled:
                    aborted_polls.append(r.url)
                    return
                errors.append(f"request failed: {r.url} ({r.failure})")

            page.on("requestfailed", failed)
            page.on(
                "response",
                lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
            )
            resp = page.goto(url, wait_until="load", timeout=30000)
            assert resp is not None
            try:
                page.wait_for_function(
                    f"() => ({_COLUMN_JS})(['qf-scan-map', 'chunk']) > 0", timeout=30000
                )
            except PlaywrightError as exc:
                errors.append(f"the scan map never had data: {str(exc).splitlines()[0]}")
            page.wait_for_timeout(2000)  # a few refreshes; let the canvases paint

            def column(name: str, col: str) -> int:
                return int(page.evaluate(_COLUMN_JS, [name, col]))

            info = {
                "status": resp.status,
                "errors": list(errors),  # not the requests a closing browser aborts
                "aborted_polls": list(aborted_polls),
                "title": page.title(),
                "throughput": column("qf-throughput", "xs"),
                "map": column("qf-scan-map", "chunk"),
                "resident": column("qf-resident", "y"),
                "progress": column("qf-progress", "y"),
                "log": column("qf-log", "event"),
                "lost": column("qf-lost", "worker"),
                "navbar": page.eval_on_selector_all(
                    ".navbar a", "els => els.map(a => a.getAttribute('href'))"
                ),
            }
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    return info


@pytest.mark.cluster
@pytest.mark.slow
def test_the_page_in_headless_chromium_after_a_pass_that_lost_a_worker(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    from distributed import Client
    from PIL import Image

    from quantem_flow.graphs.cluster import flow_dashboard_url, start_local_cluster

    cluster = start_local_cluster(n_workers=2, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=60)
        data = probe_data(rng, scan=(24, 16))
        ds = Dataset4D(SlowArraySource(data, delay_s=0.25), chunk_rows=2)
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        out: dict[str, Any] = {}

        def run() -> None:
            out["results"] = qf.compute(*_queries(ds), client=client)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(1.0)
        os.kill(pids[victim], signal.SIGKILL)  # a lost worker for the table and the chart
        t.join(timeout=120)
        assert "results" in out
        deadline = time.monotonic() + 60
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        resident = qf.open(data, chunk_rows=3).persist(client=client)  # on both workers
        qf.compute(*_queries(resident), client=client)  # the latest pass: on resident chunks

        url = flow_dashboard_url(client)
        assert url is not None
        shot = Path(os.environ.get("QF_DASHBOARD_SHOT") or tmp_path / "dashboard.png")
        seen = _browser(url, shot)
        assert seen["status"] == 200
        assert seen["errors"] == [], seen["errors"]
        assert seen["title"] == "quantem-flow placement"
        assert "quantem-flow" in seen["navbar"]
        assert seen["throughput"] >= 2  # a line per worker that finished chunks
        assert seen["map"] == len(resident.chunks)  # one rectangle per chunk of the latest pass
        assert seen["resident"] >= 2  # both workers hold resident chunks
        assert seen["progress"] >= 3  # the pass that lost a worker, persist, the resident pass
        assert seen["log"] >= len(resident.chunks)  # one placement per resident chunk at least
        assert seen["lost"] == 1
        with Image.open(shot) as im:
            assert im.size[0] == 1400 and im.size[1] >= 900
            colours = len(np.unique(np.asarray(im.convert("RGB")).reshape(-1, 3), axis=0))
        assert colours > 50, "the screenshot is (nearly) blank"
        resident.release()
    finally:
        client.close()
        cluster.close()


def test_the_charts_draw_a_state_and_send_nothing_when_it_does_not_change() -> None:
    from bokeh.document import Document

    from quantem_flow.graphs.dashboard import FlowDashboard

    now = time.time()
    w = "tcp://127.0.0.1:1"
    state = {
        "workers": [{"address": w, "name": "a", "resident_bytes_by_runtime": {"cpu/dense": 2**20}}],
        "passes": [
            {
                "name": "qf-pass-x",
                "kind": "pass",
                "label": "4x6 scan",
                "scan_shape": [4, 6],
                "chunks": [[0, 3], [3, 4]],
                "worker": [w, None],
                "status": ["done", "waiting"],
                "n_chunks": 2,
                "n_done": 1,
                "finished": None,
            }
        ],
        "departures": [{"worker": "tcp://127.0.0.1:2", "name": "b", "lost": True, "time": now - 1}],
        "throughput": {"bin_s": 1.0, "start": now - 3, "workers": {w: [0.0, 2.0, 1.0]}},
        "log": [{"event": "placed", "key": "k", "worker": w, "time": now}],
        "decisions": 1,
    }
    dash = FlowDashboard()
    doc = Document()
    doc.add_root(dash.root)
    events: list[Any] = []
    doc.on_change(events.append)
    dash.update(state)
    assert events
    m = dash.map_src.data
    assert (m["top"], m["bottom"], m["right"]) == ([0, 3], [3, 4], [6, 6])  # rows, whole width
    assert m["status"] == ["done", "waiting"] and m["color"][1] == "#d9d9d9"
    assert m["color"][0] == dash.throughput_src.data["color"][0]  # one colour per worker
    assert dash.throughput_src.data["ys"] == [[0.0, 2.0, 1.0]]
    assert dash.resident_src.data["mib"] == [1.0]
    assert dash.lost_src.data["restored"] == ["no"]
    assert dash.progress_src.data["frac"] == [0.5]
    n = len(events)
    dash.update(state)  # a live page is sent changes only
    assert len(events) == n


def test_a_page_showing_the_charts_is_sent_bokeh_patches_that_bring_it_to_the_new_state() -> None:
    import asyncio

    from bokeh.document import Document

    from quantem_flow.graphs import dashboard
    from quantem_flow.graphs.dashboard import DocumentItems, FlowDashboard

    w = "tcp://127.0.0.1:1"

    def state_at(level: float, rows: int) -> dict[str, Any]:
        return {
            "workers": [{"address": w, "name": "a"}],
            "throughput": {"bin_s": 1.0, "start": 100.0, "workers": {w: [0.0, level]}},
            "passes": [
                {
                    "name": "qf-pass-x",
                    "kind": "pass",
                    "label": f"{rows}x6 scan",
                    "scan_shape": [rows, 6],
                    "chunks": [[0, rows]],
                    "worker": [w],
                    "status": ["done"],
                    "n_chunks": 1,
                    "n_done": 1,
                    "finished": 1.0,
                }
            ],
        }

    made: list[int] = []
    real = dashboard._item_json

    def counting(dash: Any) -> str:
        made.append(1)
        return real(dash)

    items = DocumentItems(keep=2)
    dashboard._item_json = counting  # type: ignore[assignment]
    try:
        first = items.answer(state_at(2.0, 4))
        assert not first.patches and len(made) == 1
        page = Document.from_json(json.loads(first.text)["doc"])  # what the page holds
        same = items.answer(state_at(2.0, 4), since=first.version)
        assert same.tag == first.tag and json.loads(same.text) == {"patches": []}
        moved = items.answer(state_at(3.0, 5), since=first.version)
        assert moved.patches and moved.version > first.version and moved.tag != first.tag
        assert len(made) == 1  # patches, not a new item
        for patch in json.loads(moved.text)["patches"]:
            page.apply_json_patch(patch)
        fresh = FlowDashboard()
        fresh.update(state_at(3.0, 5))
        sources = {"qf-throughput": fresh.throughput_src, "qf-scan-map": fresh.map_src}
        sources["qf-progress"] = fresh.progress_src
        for name, source in sources.items():  # what a dashboard made for that state shows
            got = page.get_model_by_name(name).data
            assert {k: list(v) for k, v in got.items()} == {
                k: list(v) for k, v in source.data.items()
            }, name
        assert page.get_model_by_name("qf-throughput").data["ys"] == [[0.0, 3.0]]
        assert page.get_model_by_name("qf-scan-map").data["bottom"] == [5]
        title = page.get_model_by_name("qf-scan-map-figure").title.text
        assert title == fresh.scan_map.title.text and "5x6 scan" in title
        # a page further behind than the patches kept gets the whole item again
        latest = moved
        for level in (4.0, 5.0, 6.0):  # another page, keeping up
            latest = items.answer(state_at(level, 5), since=latest.version)
            assert latest.patches
        behind = items.answer(state_at(6.0, 5), since=moved.version)
        assert not behind.patches and len(made) == 2
        # and so does one behind patches larger than the bytes kept (a live scan's images)
        tight = DocumentItems(keep_bytes=100)
        start = tight.answer(state_at(2.0, 4))
        assert not tight.answer(state_at(3.0, 5), since=start.version).patches
        # on the scheduler the answer is made on this object's thread, not the event loop's
        threads: list[str] = []
        plain = items.answer

        def noting(state: Any, *, since: int | None = None) -> Any:
            threads.append(threading.current_thread().name)
            return plain(state, since=since)

        items.answer = noting  # type: ignore[method-assign]
        asyncio.run(items.answer_async(state_at(7.0, 5), since=behind.version))
        assert threads and threads[0].startswith("quantem-flow-dashboard")
    finally:
        dashboard._item_json = real  # type: ignore[assignment]
        items.close()


@pytest.mark.cluster
def test_an_open_page_follows_a_new_pass_by_patches_in_the_same_document(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    from distributed import Client
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from quantem_flow.graphs.cluster import flow_dashboard_url, start_local_cluster

    chromium = _chromium()
    shot = tmp_path / "patched.png"
    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        qf.compute(*_queries(qf.open(probe_data(rng, scan=(12, 10)), chunk_rows=2)), client=client)
        url = flow_dashboard_url(client)
        assert url is not None
        answers: list[tuple[str, int, str]] = []
        errors: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

                def answered(r: Any) -> None:
                    if "/item.json" in r.url and r.status == 200:
                        answers.append((r.url, r.status, r.text()[:12]))

                page.on("response", answered)
                page.goto(url, wait_until="load", timeout=30000)
                page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0")
                page.evaluate("() => { window.qfShown = Bokeh.documents.at(-1); }")
                # the line above the charts is plain HTML: the polls keep it current too
                page.evaluate("() => { document.getElementById('qf-summary').textContent = 'x'; }")
                page.wait_for_function(
                    "() => document.getElementById('qf-summary').textContent"
                    ".startsWith('quantem-flow placement: 1 worker(s)')",
                    timeout=30000,
                )
                data = probe_data(rng, scan=(7, 10))
                qf.compute(*_queries(qf.open(data, chunk_rows=2)), client=client)
                page.wait_for_function(
                    "() => Bokeh.documents.at(-1).get_model_by_name('qf-scan-map-figure')"
                    ".title.text.includes('7x10 scan')",
                    timeout=30000,
                )
                same = page.evaluate("() => Bokeh.documents.at(-1) === window.qfShown")
                documents = page.evaluate("() => Bokeh.documents.length")
                rows = page.evaluate(
                    "() => { const d = Bokeh.documents.at(-1).get_model_by_name('qf-scan-map')"
                    ".data; return Math.max(...(d instanceof Map ? d.get('bottom') : d.bottom)); }"
                )
                page.wait_for_timeout(500)  # the canvases paint
                page.screenshot(path=str(shot))
            finally:
                browser.close()
        assert errors == [], errors
        assert same and documents == 1  # patched in place: no new document was embedded
        assert rows == 7  # the new pass's scan map, its last chunk ending at row 7
        with Image.open(shot) as im:  # drawn: the scan map's worker colour fills its frame
            pixels = np.asarray(im.convert("RGB"))
        colours = len(np.unique(pixels[120:].reshape(-1, 3), axis=0))
        assert colours > 50, f"only {colours} colours below the summary after the patches"
        patched = [a for a in answers if "since=" in a[0] and a[2].startswith('{"patches"')]
        assert patched, answers
    finally:
        client.close()
        cluster.close()


def _chromium_screenshot(
    url: str, shot: Path, *, attempts: int = 3, attempt_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """A plain ``chromium --headless --screenshot``: no Playwright, no waiting for anything.

    What a person types: no ``--virtual-time-budget``. With one, Debian's Chromium 156 hung
    after a pass had filled the page (6 of 16 launches at 500-15000 ms, 0 of 15 without; the
    page kept polling while the capture never came), whichever the profile. A launch that
    has not ended in ``attempt_s`` is still killed with its children and launched again with
    a fresh profile, at most ``attempts`` times; if every one hangs, the error carries each
    one's last words.
    """
    chromium = _chromium()
    hung: list[str] = []
    for attempt in range(attempts):
        profile = shot.parent / f"{shot.stem}-profile-{attempt}"
        command = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            f"--user-data-dir={profile}",
            f"--screenshot={shot}",
            "--window-size=1400,1000",
            url,
        ]
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its renderer and GPU processes go with it when killed
        )
        try:
            out, err = proc.communicate(timeout=attempt_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            hung.append(f"attempt {attempt + 1}: {err[-600:]}")
            continue
        return subprocess.CompletedProcess(command, proc.returncode, out, err)
    raise AssertionError(
        f"chromium --screenshot of {url} hung {attempts} times ({attempt_s} s each); "
        "its stderr:\n" + "\n".join(hung)
    )


@pytest.mark.cluster
def test_a_plain_headless_screenshot_shows_the_charts_and_a_short_visit_logs_nothing(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    from distributed import Client
    from PIL import Image

    from quantem_flow.graphs.cluster import dashboard_url, flow_dashboard_url, start_local_cluster

    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        data = probe_data(rng, scan=(12, 10))
        qf.compute(*_queries(qf.open(data, chunk_rows=2)), client=client)
        url = flow_dashboard_url(client)
        assert url is not None
        # the charts come with the page: asked again unchanged, the picture is not resent
        codes = []
        for _ in range(5):  # the throughput window moves each second: retry on a change
            with urllib.request.urlopen(url + "/item.json", timeout=20) as resp:
                tag = resp.headers["ETag"]
                assert json.loads(resp.read())["target_id"] == "qf-root"
            request = urllib.request.Request(url + "/item.json", headers={"If-None-Match": tag})
            try:
                with urllib.request.urlopen(request, timeout=20) as again:
                    codes.append(again.status)
                    assert again.headers["ETag"] != tag  # resent only because it changed
            except urllib.error.HTTPError as unchanged:
                codes.append(unchanged.code)
                break
        assert codes[-1] == 304, codes
        # distributed logs tornado to stderr without propagating: listen on that logger
        seen_records: list[logging.LogRecord] = []
        listener = logging.Handler(level=logging.ERROR)
        listener.emit = seen_records.append  # type: ignore[method-assign]
        tornado_log = logging.getLogger("tornado.application")
        tornado_log.addHandler(listener)
        shot = tmp_path / "plain.png"
        proc = _chromium_screenshot(url, shot)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with Image.open(shot) as im:
            pixels = np.asarray(im.convert("RGB"))
        below_summary = pixels[120:]  # the charts, not only the navigation bar and summary
        colours = len(np.unique(below_summary.reshape(-1, 3), axis=0))
        assert colours > 50, f"only {colours} colours below the summary: the charts did not draw"
        # a visitor leaving at once, on Dask's pages as on this one
        status = dashboard_url(client)
        assert status is not None
        for page in (status, url):
            early = _chromium_screenshot(page, tmp_path / "early.png")
            assert early.returncode == 0
        time.sleep(1.0)  # the server notices the closed connections
        tornado_log.removeHandler(listener)
        uncaught = [r.getMessage() for r in seen_records]
        assert uncaught == [], uncaught
    finally:
        client.close()
        cluster.close()


def test_the_early_leave_filter_drops_only_bokehs_missing_session_assertion() -> None:
    import sys

    from quantem_flow.graphs.dashboard import EarlyLeaveFilter

    def record_of(filename: str) -> logging.LogRecord:
        code = compile("def session():\n    assert None is not None\n", filename, "exec")
        space: dict[str, Any] = {}
        exec(code, space)
        try:
            space["session"]()
        except AssertionError:
            info = sys.exc_info()
        return logging.LogRecord(
            "tornado.application",
            logging.ERROR,
            __file__,
            1,
            "Uncaught exception GET /status/ws",
            None,
            info,
        )

    keep = EarlyLeaveFilter()
    assert keep.filter(record_of("/x/site-packages/bokeh/server/connection.py")) is False
    assert keep.filter(record_of("/x/site-packages/mine/connection.py")) is True
    plain = logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "boom", None, None)
    assert keep.filter(plain) is True
