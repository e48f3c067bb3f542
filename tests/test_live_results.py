"""Live results: new rows computed once and joined, the rest recomputed; the page shows them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zmq")
pytest.importorskip("cbor2")
pytest.importorskip("lz4")

import quantem_flow as qf
from quantem_flow.calibration import Axis
from quantem_flow.errors import ParameterError
from quantem_flow.provenance import Provenance
from quantem_flow.results import ScanImage
from quantem_flow.streams.dectris_sim import DectrisSimulator
from quantem_flow.streams.live_results import is_incremental, join_scan_rows
from tests.conftest import probe_data

SCAN = (12, 10)
CENTER = (8.6, 14.2)


def _pipeline(ds: qf.Dataset4D) -> list[object]:
    return [
        qf.virtual_bf(ds, radius=4.5, center=CENTER),  # fixed plan: joined blocks
        qf.virtual_adf(ds, inner=6, outer=11, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
        qf.virtual_bf(ds, radius=4.5),  # centre found from the data: recomputed
        qf.mean_diffraction(ds),  # a sum over the scan: recomputed
    ]


def test_which_outputs_are_computed_over_new_rows_only(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=SCAN))
    flags = [is_incremental(lazy, ds) for lazy in _pipeline(ds)]
    assert flags == [True, True, True, False, False]
    cropped = qf.virtual_bf(ds.crop_scan(rows=(0, 6)), radius=4.5, center=CENTER)
    assert not is_incremental(cropped, ds)  # a scan crop inside build: not row-aligned
    dpc = qf.dpc(qf.center_of_mass(ds, center=CENTER))
    assert not is_incremental(dpc, ds)


def test_watch_joins_new_rows_and_ends_equal_to_the_offline_pass(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, rate_hz=120.0) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path, chunk_rows=3)
        live = acq.watch(_pipeline, every_s=0.1, client="synchronous", publish=False)
        sim.start()
        early = live.wait_rows(1, timeout_s=20)
        early_rows = early[0].shape[0]
        final = live.wait(timeout_s=60)
    assert live.final and live.rows == SCAN[0]
    assert 0 < early_rows < SCAN[0]  # a partial result while the scan ran
    assert any(f"partial, scan rows [0, {early_rows})" in n for n in early[0].provenance.notes)
    offline = qf.compute(*_pipeline(qf.open(data, chunk_rows=3)), client="synchronous")
    for got, want in zip(final, offline, strict=True):
        assert type(got) is type(want) and got.axes == want.axes and got.units == want.units
        np.testing.assert_array_equal(got.data, want.data)  # bit for bit
    bf = final[0]
    blocks = bf.provenance.execution["live_blocks"]
    assert len(blocks) >= 2 and blocks[0]["rows"][0] == 0 and blocks[-1]["rows"][1] == SCAN[0]
    assert all(a["rows"][1] == b["rows"][0] for a, b in itertools.pairwise(blocks))
    assert any(n.startswith("live: joined from") for n in bf.provenance.notes)
    assert bf.provenance.dataset["shape"][:2] == list(SCAN)  # the whole scan, not a block
    assert bf.provenance.transforms == [] and bf.provenance.flags["native"]  # no block crop
    # each update's incremental outputs cost only its new rows
    assert sum(u["new_rows"] for u in live.updates) == SCAN[0]
    assert all(u["incremental"] == [True, True, True, False, False] for u in live.updates)
    assert all(u["ready"] >= u["arrived"] for u in live.updates if u["arrived"] is not None)
    np.testing.assert_array_equal(early[0].data, offline[0].data[:early_rows])


def test_join_refuses_blocks_that_do_not_follow_each_other() -> None:
    def block(a: int, b: int) -> tuple[tuple[int, int], ScanImage, list[str]]:
        r = ScanImage(
            data=np.zeros((b - a, 3)),
            units="counts",
            axes=(Axis("scan_row", b - a), Axis("scan_col", 3)),
            provenance=Provenance(operator="virtual_bf"),
        )
        return (a, b), r, []

    ds = qf.open(np.zeros((4, 3, 2, 2), dtype=np.uint16))
    with pytest.raises(ParameterError, match=r"follow each other from 0.*\(0, 2\), \(3, 4\)"):
        join_scan_rows([block(0, 2), block(3, 4)], whole=ds)
    with pytest.raises(ParameterError, match="at least one block"):
        join_scan_rows([], whole=ds)
    joined = join_scan_rows([block(0, 2), block(2, 4)], whole=ds)
    assert joined.shape == (4, 3) and joined.axes[0].size == 4


def test_follow_computes_each_new_row_once(rng: np.random.Generator, tmp_path: Path) -> None:
    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, rate_hz=100.0) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path)
        sim.start()
        updates = list(
            acq.follow(
                lambda ds: qf.virtual_bf(ds, radius=4.5, center=CENTER),
                every_s=0.2,
                client="synchronous",
            )
        )
    (bf,) = updates[-1][1]
    spans = [b["rows"] for b in bf.provenance.execution["live_blocks"]]
    assert 2 <= len(spans) <= len(updates)
    covered = [r for a, b in spans for r in range(a, b)]
    assert covered == list(range(SCAN[0]))  # every row computed exactly once


@pytest.mark.cluster
def test_the_dashboard_page_shows_the_scan_filling_in(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import base64
    import json
    import urllib.request

    from distributed import Client
    from PIL import Image

    from quantem_flow.graphs.cluster import flow_dashboard_url, start_local_cluster
    from quantem_flow.graphs.live_panel import LIVE_METADATA_KEY, LIVE_REFRESH_MS

    def page_text(url: str) -> str:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return str(resp.read().decode())

    scan = (24, 20)
    data = probe_data(rng, scan=scan)
    frames = data.reshape(-1, *data.shape[2:])
    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        url = flow_dashboard_url(client)
        assert url is not None
        assert "Live acquisition" not in page_text(url)  # no live panel before a live scan
        with urllib.request.urlopen(url + "/live.json", timeout=20) as resp:
            assert resp.status == 204  # nothing live yet
        with DectrisSimulator(frames, rate_hz=150.0) as sim:
            acq = qf.live(sim.endpoint, scan_shape=scan, directory=tmp_path)
            live = acq.watch(_pipeline, every_s=0.2, client=client)
            sim.start()
            early = live.wait_rows(1, timeout_s=30)
            mid = page_text(url)
            rows = early[0].shape[0]
            final = live.wait(timeout_s=60)
        assert rows < scan[0]
        # the page tells the scan is running, the rows so far and how fresh they are
        assert f"from {sim.endpoint}: " in mid and "(scan running)" in mid
        assert "results ready" in mid and "ms after the last of those rows arrived" in mid
        done = page_text(url)
        assert f"{scan[0]} of {scan[0]} scan rows (final)" in done
        item = page_text(url + "/item.json")
        for i in range(4):
            assert f"qf-live-image-{i}" in item  # bf, adf, |com|, bf auto (the pattern is no image)
        assert "qf-live-image-4" not in item
        assert "|com| (px)" in item  # a vector field drawn as its magnitude
        # the page's fast path: live.json carries only the pictures, drawn into the panel
        with urllib.request.urlopen(url + "/live.json", timeout=20) as resp:
            fast = json.loads(resp.read())
            assert int(resp.headers["X-Refresh-Ms"]) > LIVE_REFRESH_MS  # ended: asked slowly
        assert fast["rows"] == scan[0] and fast["final"] and len(fast["images"]) == 4
        assert fast["images"][0]["shape"] == list(scan)
        pixels8 = np.frombuffer(base64.b64decode(fast["images"][0]["b64"]), dtype=np.uint8)
        assert pixels8.size == scan[0] * scan[1] and pixels8.max() == 254 and pixels8.min() == 0
        # the page in Chromium (Playwright): the final images drawn, then a new scan's first
        # rows reach the open page without a new document. (A plain `chromium --screenshot`
        # with a virtual time budget hung now and then on the page's polls; the plain
        # screenshot of the page is tested in test_dashboard.py.)
        from playwright.sync_api import sync_playwright

        from tests.test_explore import _chromium

        shot = tmp_path / "live.png"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_function(
                "() => window.Bokeh && Bokeh.documents.length > 0 && "
                "Bokeh.documents[0].get_model_by_name('qf-live-status')"
            )
            page.wait_for_timeout(1000)  # the canvases paint
            page.screenshot(path=str(shot))
            with Image.open(shot) as im:
                pixels = np.asarray(im.convert("L"), dtype=np.float64)
            # the bright-field image drawn inside its frame (left of its colour bar): many greys
            frame = pixels[215:445, 70:215]
            levels = len(np.unique(frame))
            assert levels > 20 and frame.std() > 10, f"{levels} grey levels where the bf image is"
            payload = live.page_payload(early, {"rows": rows, "arrived": 1.0, "ready": 2.0})
            client.set_metadata(list(LIVE_METADATA_KEY), payload)
            page.wait_for_function(
                f"() => Bokeh.documents.at(-1).get_model_by_name('qf-live-status').tags[0] "
                f"=== {rows}",
                timeout=10_000,
            )
            shown = page.evaluate(
                """() => {
                  const im = Bokeh.documents.at(-1).get_model_by_name('qf-live-src-0')
                    .data.image[0];
                  const clean = (a) => Array.from(a).map(v => Number.isNaN(v) ? null : v);
                  return Array.isArray(im) ? {nested: im.map(clean)} : {flat: clean(im)};
                }"""
            )
            browser.close()
        # as the light poll draws it (rows of numbers), or as a rebuilt document carries it
        # (one typed array of the whole scan) when the charts' own poll came first
        if "nested" in shown:
            drawn = shown["nested"]
        else:
            flat = shown["flat"]
            drawn = [flat[r * scan[1] : (r + 1) * scan[1]] for r in range(scan[0])]
        assert len(drawn) == scan[0] and all(v is None for v in drawn[rows])
        got = np.array(drawn[:rows], dtype=float)
        want = early[0].data.astype(float)
        span = (want.max() - want.min()) / 254
        assert np.abs(got - want).max() <= span / 2 + 1e-6 * abs(want).max()  # 8-bit display
        np.testing.assert_array_equal(
            final[0].data, qf.compute(_pipeline(qf.open(data))[0], client=client)[0].data
        )
    finally:
        client.close()
        cluster.close()


def test_the_live_panel_draws_only_the_rows_received() -> None:
    from quantem_flow.graphs.dashboard import FlowDashboard
    from quantem_flow.graphs.live_panel import live_figures, live_summary

    image = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)
    live = {
        "endpoint": "tcp://127.0.0.1:9999",
        "scan_shape": [6, 8],
        "rows": 3,
        "final": False,
        "arrived": 100.0,
        "ready": 100.025,
        "images": [{"label": "bf (counts)", "shape": [3, 8], "pixels": image.tobytes(), "step": 1}],
    }
    assert "3 of 6 scan rows (scan running); results ready 25 ms after" in live_summary(live)
    panel = live_figures(live, width=800)
    fig = panel.children[1].children[0]
    drawn = fig.renderers[0].data_source.data["image"][0]
    assert drawn.shape == (6, 8)
    np.testing.assert_array_equal(drawn[:3], image)
    assert np.isnan(drawn[3:]).all()  # rows not received are blank, never zero
    assert fig.title.text == "bf (counts): rows 3 of 6"
    dash = FlowDashboard()
    dash.update({"live": live})
    assert dash.root.children[1] is dash._live_panel
    dash.update({})
    assert dash._live_panel is None and len(dash.root.children) == 7


def test_the_pages_item_shows_the_latest_rows_of_the_same_scan() -> None:
    import json

    from bokeh.document import Document

    from quantem_flow.graphs.dashboard import DocumentItems, document_item

    def live_at(rows: int) -> dict[str, Any]:
        image = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8) + rows
        return {
            "endpoint": "tcp://127.0.0.1:9999",
            "scan_shape": [6, 8],
            "rows": rows,
            "published": float(rows),
            "final": rows == 6,
            "arrived": 100.0 + rows,
            "ready": 100.5 + rows,
            "images": [{"label": "bf (counts)", "shape": [rows, 8], "pixels": image.tobytes()}],
        }

    items = DocumentItems()  # one dashboard, updated in place as the page's server keeps it
    _, first_tag = items.item({"live": live_at(2)})
    later, later_tag = items.item({"live": live_at(5)})
    assert later_tag != first_tag  # newer rows of the same scan are a change the page asks for
    assert "rows 5 of 6" in later and "rows 2 of 6" not in later
    fresh, fresh_tag = document_item({"live": live_at(5)})
    assert later_tag == fresh_tag  # what a dashboard made for that state alone shows

    def image_of(text: str) -> Any:  # as the page's BokehJS reads the item
        doc = Document.from_json(json.loads(text)["doc"])
        return doc.get_model_by_name("qf-live-src-0").data["image"][0]

    np.testing.assert_array_equal(image_of(later), image_of(fresh))
    assert np.isfinite(image_of(later)[:5]).all() and np.isnan(image_of(later)[5:]).all()


def test_the_explorer_follows_a_live_scan(rng: np.random.Generator, tmp_path: Path) -> None:
    import time
    import urllib.request

    from quantem_flow.explorer.detectors import Detector

    scan = (12, 10)
    data = probe_data(rng, scan=scan)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, rate_hz=40.0) as sim:  # 3 s of scan
        acq = qf.live(
            sim.endpoint, scan_shape=scan, directory=tmp_path, keep_hdf5=tmp_path / "s_master.h5"
        )
        sim.start()
        acq.wait_rows(2, timeout_s=30)
        ex = qf.explore(acq, client="synchronous", export_dir=tmp_path / "export")
        try:
            session = ex.session
            session._follow_s = 0.2
            assert session.scan_shape == scan and session.dataset.scan_shape[0] < scan[0]
            with urllib.request.urlopen(ex.url, timeout=30) as page:
                assert page.status == 200
            det = Detector("disk", center=CENTER, outer=4.5, name="bf")
            session.set_detector(det)
            deadline = time.monotonic() + 60
            early = None
            while time.monotonic() < deadline:
                latest = session.latest
                if latest is not None and latest.detector == det:
                    early = early or latest
                    if not np.isnan(latest.image).any():
                        break
                time.sleep(0.05)
            assert early is not None and early.image.shape == scan  # the whole scan's frame
            blank = np.isnan(early.image).all(axis=1)
            assert blank.any() and not blank[0]  # rows to come are blank, never zero
            final = session.latest
            assert final is not None and not np.isnan(final.image).any()  # filled in
            (offline,) = qf.compute(
                qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
            )
            np.testing.assert_array_equal(final.image, offline.data)
            spec = ex._input_spec  # the exported pipeline reads the kept master file
            assert (
                spec is not None and spec.format == "dectris" and spec.path.endswith("s_master.h5")
            )
            assert session.pattern(scan[0] - 1, 0).shape == data.shape[2:]
        finally:
            ex.close()
