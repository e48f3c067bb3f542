"""The interactive explorer (issue 25): detectors, export, the session, and the page in Chromium.

The browser tests drive the real command (``python -m quantem_flow explore``)
in Debian's Chromium through Playwright for Python: drag a detector's handles
with the mouse, tap a scan position, export, and compare what the page shows
with ``qf.compute`` of the same detector (bit for bit).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError
from quantem_flow.explorer import (
    Detector,
    ExplorerSession,
    export_files,
    input_spec_of,
    polygon_mask,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    arr, _ = qf.synthetic_dataset(
        scan_shape=(24, 20), detector_shape=(40, 44), probe_radius_px=7.0, seed=3
    )
    path = tmp_path_factory.mktemp("explore") / "scan.npy"
    np.save(path, arr)
    return path


def reference(path: Path, det: Detector) -> np.ndarray:
    """The detector's image by NumPy alone: the mask times every frame, summed in int64."""
    data = np.load(path)
    mask = det.mask(data.shape[2:])
    return np.einsum("abij,ij->ab", data.astype(np.int64), mask.astype(np.int64))


# -- detectors and export ---------------------------------------------------------------------
def test_detectors_refuse_bad_geometry_with_the_values() -> None:
    with pytest.raises(ParameterError, match=r"inner=5\.0 outer=3\.0"):
        Detector("annulus", center=(1, 1), inner=5.0, outer=3.0)
    with pytest.raises(ParameterError, match=r"\(4, 2, 0, 3\)"):
        Detector("rectangle", region=(4, 2, 0, 3))
    with pytest.raises(ParameterError, match="one of"):
        Detector("hexagon")
    with pytest.raises(ParameterError, match="three vertices, got 2"):
        Detector("polygon", vertices=((0, 0), (1, 1)))


def test_a_square_polygon_holds_the_pixels_a_rectangle_does() -> None:
    rect = Detector("rectangle", region=(3, 9, 5, 12))
    # the square's corners half a pixel outside the pixel centres 3..8 and 5..11
    square = polygon_mask([(2.5, 4.5), (2.5, 11.5), (8.5, 11.5), (8.5, 4.5)], (16, 16))
    np.testing.assert_array_equal(square, rect.mask((16, 16)))
    assert square.sum() == 6 * 7


def test_every_kind_computes_what_numpy_sums(data_file: Path) -> None:
    ds = qf.open(data_file)
    dets = [
        Detector("disk", center=(19.6, 22.3), outer=7.2, name="d"),
        Detector("annulus", center=(19.6, 22.3), inner=9.0, outer=18.5, name="a"),
        Detector("rectangle", region=(5, 30, 10, 25), name="r"),
        Detector("polygon", vertices=((4.0, 4.0), (4.0, 30.0), (35.0, 17.0)), name="p"),
    ]
    images = qf.compute(*(d.lazy(ds) for d in dets), client="synchronous")
    for det, img in zip(dets, images, strict=True):
        np.testing.assert_array_equal(img.data, reference(data_file, det))
        assert img.units == "counts"


def test_export_reruns_to_the_same_images(data_file: Path, tmp_path: Path) -> None:
    ds = qf.open(data_file).crop_detector((2, 38, 1, 43)).bin_detector(2)
    dets = [
        Detector("annulus", center=(8.7, 10.1), inner=4.5, outer=9.25, name="adf"),
        Detector("rectangle", region=(2, 9, 3, 12), name="box"),
        Detector("polygon", vertices=((1.0, 1.0), (1.0, 15.0), (16.0, 8.0)), name="tri"),
    ]
    spec = input_spec_of(ds)
    assert spec is not None and spec.format == "npy"
    written = export_files(ds, dets, spec, tmp_path, client="synchronous")
    assert {"pipeline", "python", "detectors", "box_mask.npy", "tri_mask.npy"} <= set(written)
    from PIL import Image

    for name in ("adf.png", "box.png", "tri.png", "mean_pattern.png"):
        with Image.open(written[name]) as png:  # one PNG per image, scan- or detector-shaped
            assert png.size == ((20, 24) if name != "mean_pattern.png" else (21, 18))
            assert str(png.info.get("Software", "")).startswith("quantem-flow")
    expected = qf.compute(*(d.lazy(ds) for d in dets), client="synchronous")
    results = qf.run_pipeline(written["pipeline"], client="synchronous")
    for det, img in zip(dets, expected, strict=True):
        np.testing.assert_array_equal(results[det.name].data, img.data)
    # the snippet, run as a script in the export folder, prints the same images
    snippet = written["python"].read_text()
    assert "qf.virtual_annular(ds, inner=4.5, outer=9.25" in snippet
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = snippet.replace(
        "images = qf.compute(", "images = qf.compute(client='synchronous', *("
    ).replace("tri)\n", "tri))\nnp.save('out.npy', np.stack([i.data for i in images]))\n")
    (tmp_path / "run.py").write_text(script)
    subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, check=True, timeout=300)
    np.testing.assert_array_equal(
        np.load(tmp_path / "out.npy"), np.stack([e.data for e in expected])
    )
    # exporting again replaces the files it wrote
    again = export_files(ds, dets[:1], spec, tmp_path, client="synchronous")
    assert list(qf.run_pipeline(again["pipeline"], client="synchronous")) == ["adf"]


@pytest.mark.cluster
def test_the_session_on_a_cluster_computes_the_latest_detector(
    data_file: Path, cluster_client: Any
) -> None:
    session = ExplorerSession(qf.open(data_file, chunk_rows=4), client=cluster_client)
    try:
        assert session.dataset.is_persisted
        seen: list[str] = []
        session.subscribe(seen.append)
        for outer in (5.0, 6.5, 8.0):  # a drag: only the last one must be shown
            session.set_detector(Detector("disk", center=(19.5, 22.0), outer=outer, name="bf"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            latest = session.latest
            if latest is not None and latest.detector.outer == 8.0:
                break
            time.sleep(0.05)
        latest = session.latest
        assert latest is not None and latest.detector.outer == 8.0 and latest.exact
        np.testing.assert_array_equal(latest.image, reference(data_file, latest.detector))
        assert "detector" in seen and "image" in seen
        route = latest.result.provenance.execution["query_route"]
        assert route is not None and route["path"] == "direct"
        session.set_view("iDPC phase")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and session.latest.view != "iDPC phase":
            time.sleep(0.05)
        assert session.latest.view == "iDPC phase" and session.latest.image.shape == (24, 20)
        with pytest.raises(ParameterError, match="outside the scan"):
            session.set_position(24, 0)
    finally:
        session.close()


# -- the page in a real browser -----------------------------------------------------------------
def _chromium() -> str:
    chromium = os.environ.get("QF_CHROMIUM") or shutil.which("chromium")
    assert chromium, "no chromium on PATH; install it (apt-get install chromium)"
    return chromium


class _Cli:
    """``python -m quantem_flow explore`` in a subprocess; its URL and its output."""

    def __init__(self, path: Path, export_dir: Path):
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "quantem_flow", "explore", str(path),
                "--scheduler", "synchronous", "--export-dir", str(export_dir),
                "--timeout", "900",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        self.lines: list[str] = []
        deadline = time.monotonic() + 180
        self.url = ""
        assert self.proc.stdout is not None
        while time.monotonic() < deadline and not self.url:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "quantem-flow explore: http" in line:
                self.url = line.split("explore: ", 1)[1].strip()
        assert self.url, f"no URL printed: {self.lines}"

    def stop(self) -> tuple[int, str, str]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, "".join(self.lines) + out, err


_JS_XY = """([plot, x, y]) => {
  const model = Bokeh.documents[0].get_model_by_name(plot);
  const view = Bokeh.index.find_one(model);
  const r = view.canvas_view.el.getBoundingClientRect();
  return [r.left + view.frame.x_scale.compute(x), r.top + view.frame.y_scale.compute(y)];
}"""
_JS_IMAGE = """(name) => {
  const src = Bokeh.documents[0].get_model_by_name(name);
  const img = src.data.image[0];
  return {shape: Array.from(img.shape), values: Array.from(img)};
}"""
_JS_TEXT = "(name) => Bokeh.documents[0].get_model_by_name(name).text"


def _status(page: Any) -> dict[str, Any]:
    el = page.locator("#qf-status")
    return {
        "view": el.get_attribute("data-view"),
        "exact": el.get_attribute("data-exact"),
        "detector": json.loads(el.get_attribute("data-detector") or "null"),
    }


def _wait_status(page: Any, check: Any, what: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = _status(page)
            if check(last):
                return last
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the page never showed {what}; last status {last}")


def _shown_image(page: Any, name: str = "image_source") -> np.ndarray:
    got = page.evaluate(_JS_IMAGE, name)
    return np.asarray(got["values"], dtype=np.float64).reshape(got["shape"])


def _drag(page: Any, start: tuple[float, float], end: tuple[float, float]) -> None:
    page.mouse.move(*start)
    page.mouse.down()
    for t in np.linspace(0, 1, 8)[1:]:
        page.mouse.move(start[0] + t * (end[0] - start[0]), start[1] + t * (end[1] - start[1]))
        time.sleep(0.03)
    page.mouse.up()


def _detector(geometry: dict[str, Any]) -> Detector:
    g = dict(geometry)
    for key in ("center", "region"):
        if key in g:
            g[key] = tuple(g[key])
    if "vertices" in g:
        g["vertices"] = tuple(tuple(v) for v in g["vertices"])
    return Detector(**g)


@pytest.mark.slow
def test_drag_tap_and_export_in_chromium(data_file: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    cli = _Cli(data_file, tmp_path / "export")
    ds = qf.open(data_file)
    errors: list[str] = []
    try:
        # no token, a wrong token: refused
        base = cli.url.split("?")[0]
        for url in (base, base + "?token=wrong"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=30)
            assert refused.value.code == 403
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1450, "height": 1050})
            other = browser.new_page(viewport={"width": 1450, "height": 1050})
            for p in (page, other):
                p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                p.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(cli.url)
            other.goto(cli.url)
            first = _wait_status(page, lambda s: s["detector"] is not None, "a first image")
            det0 = _detector(first["detector"])
            assert det0.kind == "disk"
            np.testing.assert_array_equal(_shown_image(page), reference(data_file, det0))

            # drag the radius handle 3 px outwards: the image follows, exactly
            r, c = det0.center
            start = page.evaluate(_JS_XY, ["navigator", c + det0.outer, r])
            end = page.evaluate(_JS_XY, ["navigator", c + det0.outer + 3.0, r])
            _drag(page, start, end)
            after = _wait_status(
                page,
                lambda s: s["detector"]["outer"] > det0.outer + 2.0,
                "the larger disk",
            )
            time.sleep(0.5)  # the last move's image
            after = _status(page)
            det1 = _detector(after["detector"])
            shown = _shown_image(page)
            (computed,) = qf.compute(det1.lazy(ds), client="synchronous")
            np.testing.assert_array_equal(shown, computed.data)
            np.testing.assert_array_equal(shown, reference(data_file, det1))
            # the other page shows the same detector (one explorer, one state)
            _wait_status(other, lambda s: s["detector"] == after["detector"], "the same detector")

            # drag the centre 2 px down and left
            start = page.evaluate(_JS_XY, ["navigator", det1.center[1], det1.center[0]])
            end = page.evaluate(_JS_XY, ["navigator", det1.center[1] - 2, det1.center[0] + 2])
            _drag(page, start, end)
            moved = _wait_status(
                page, lambda s: s["detector"]["center"][0] > det1.center[0] + 1, "the moved disk"
            )
            time.sleep(0.5)
            det2 = _detector(_status(page)["detector"])
            assert det2.outer == pytest.approx(det1.outer) and moved
            np.testing.assert_array_equal(_shown_image(page), reference(data_file, det2))

            # an annulus, chosen from the menu
            page.locator("select").first.select_option("annulus")
            ann = _wait_status(page, lambda s: s["detector"]["kind"] == "annulus", "an annulus")
            np.testing.assert_array_equal(
                _shown_image(page), reference(data_file, _detector(ann["detector"]))
            )
            page.get_by_role("button", name="Keep detector").click()

            # tap scan position (row 5, col 13): its pattern is shown
            xy = page.evaluate(_JS_XY, ["scan_image", 13.0, 5.0])
            page.mouse.click(*xy)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                title = page.evaluate(
                    "() => Bokeh.documents[0].get_model_by_name('position_pattern').title.text"
                )
                if "(5, 13)" in title:
                    break
                time.sleep(0.1)
            assert "(5, 13)" in title
            np.testing.assert_allclose(
                _shown_image(page, "pattern_source"), np.log1p(np.load(data_file)[5, 13]), rtol=1e-6
            )
            # the sum over the 3 x 3 positions around it (int64, exact before the log)
            page.locator("select").nth(3).select_option("3 x 3 sum")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "rows 4:7" not in title:
                title = page.evaluate(
                    "() => Bokeh.documents[0].get_model_by_name('position_pattern').title.text"
                )
                time.sleep(0.1)
            assert "rows 4:7, cols 12:15" in title
            summed = np.load(data_file)[4:7, 12:15].sum(axis=(0, 1), dtype=np.int64)
            np.testing.assert_allclose(
                _shown_image(page, "pattern_source"), np.log1p(summed), rtol=1e-12
            )

            # export, and run the pipeline it wrote
            page.get_by_role("button", name="Export").click()
            deadline = time.monotonic() + 60
            text = ""
            while time.monotonic() < deadline and "pipeline.yaml" not in text:
                text = page.evaluate(_JS_TEXT, "export_text")
                time.sleep(0.1)
            assert "pipeline.yaml" in text and "virtual_annular" in text
            shown = _shown_image(page)
            results = qf.run_pipeline(tmp_path / "export" / "pipeline.yaml", client="synchronous")
            assert list(results) == ["annulus1"]
            np.testing.assert_array_equal(results["annulus1"].data, shown)

            page.screenshot(path=str(tmp_path / "explore.png"))
            assert (tmp_path / "explore.png").stat().st_size > 20_000
            page.close()
            other.close()
            time.sleep(3)  # the server notices the closed pages
            browser.close()
    finally:
        code, out, err = cli.stop()
    assert errors == []
    assert "Traceback" not in err, err
    assert code == 0, (out, err)
    assert "explorer stopped" in out


def test_a_calibrated_navigator_is_in_mrad_and_its_handles_move_detectors_in_px(
    data_file: Path, tmp_path: Path
) -> None:
    from bokeh.document import Document

    from quantem_flow.explorer.app import make_document

    ds = qf.open(data_file).with_calibration(
        detector_sampling=(0.5, 0.5),
        detector_units="mrad",
        detector_origin=(19.5, 22.0),
        scan_sampling=(0.2, 0.2),
        scan_units="nm",
    )
    session = ExplorerSession(ds, client="synchronous")
    try:
        doc = Document()
        make_document(doc, session, input_spec=input_spec_of(ds), export_dir=str(tmp_path))
        nav = doc.get_model_by_name("navigator")
        assert nav.xaxis[0].axis_label == "k_c (mrad from the beam centre)"
        img = doc.get_model_by_name("scan_image")
        assert img.xaxis[0].axis_label == "R_c (nm)"
        det = session.detector
        centre = doc.get_model_by_name("centre_handle").data
        assert centre["x"][0] == pytest.approx((det.center[1] - 22.0) * 0.5)
        assert centre["y"][0] == pytest.approx((det.center[0] - 19.5) * 0.5)
        # the radius handle dragged 1 mrad further out: the disk grows by 2 px
        handles = doc.get_model_by_name("radius_handles")
        x = list(handles.data["x"])
        x[0] += 1.0
        handles.data = {"x": x, "y": list(handles.data["y"])}
        assert session.detector.outer == pytest.approx(det.outer + 2.0)
        assert session.detector.center == det.center
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if session.latest is not None and session.latest.detector == session.detector:
                break
            time.sleep(0.05)
        np.testing.assert_array_equal(session.latest.image, reference(data_file, session.detector))
        # a rectangle from two corners in mrad: the pixels whose centres lie inside
        session.set_detector(Detector("rectangle", region=(10, 20, 12, 30), name="rect"))
        doc2 = Document()
        make_document(doc2, session, input_spec=None, export_dir=str(tmp_path))
        corners = doc2.get_model_by_name("radius_handles")
        corners.data = {
            "x": [(11.6 - 22.0) * 0.5, (30.2 - 22.0) * 0.5],
            "y": [(9.5 - 19.5) * 0.5, (20.4 - 19.5) * 0.5],
        }
        assert session.detector.region == (10, 21, 12, 31)
    finally:
        session.close()


def test_qf_explore_serves_on_loopback_with_a_token_and_closes(data_file: Path) -> None:
    ex = qf.explore(qf.open(data_file), client="synchronous")
    try:
        assert ex.url.startswith("http://127.0.0.1:") and "token=" in ex.url
        assert f'src="{ex.url}"' in ex._repr_html_()  # a notebook shows the page inline
        with urllib.request.urlopen(ex.url, timeout=30) as page:
            assert page.status == 200 and b"bokeh" in page.read().lower()
        assert ex.session.dataset.is_persisted
    finally:
        ex.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(ex.url, timeout=5)
    with pytest.raises(ParameterError, match="Dataset4D"):
        qf.explore(np.zeros((2, 2, 4, 4)))  # type: ignore[arg-type]


def _wait_latest(session: ExplorerSession, view: str, det: Detector) -> Any:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        latest = session.latest
        if latest is not None and latest.view == view and latest.detector == det:
            return latest
        time.sleep(0.05)
    raise AssertionError(f"no {view} image of {det}; error: {session.error}")


def test_views_and_a_detector_mostly_off_the_detector(data_file: Path) -> None:
    import warnings

    ds = qf.open(data_file)
    session = ExplorerSession(ds, client="synchronous")
    try:
        # a disk mostly off the 40 x 44 detector: computed, the warning kept as a note
        edge = Detector("disk", center=(0.0, 0.0), outer=12.0, name="bf")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            session.set_detector(edge)
            latest = _wait_latest(session, "virtual image", edge)
        assert latest.notes and "off the" in latest.notes[0]
        assert not [w for w in caught if "off the" in str(w.message)]
        np.testing.assert_array_equal(latest.image, reference(data_file, edge))
        # CoM magnitude and iDPC around the current detector's centre
        det = Detector("disk", center=(19.5, 21.5), outer=7.0, name="bf")
        session.set_detector(det)
        session.set_view("CoM magnitude")
        com_view = _wait_latest(session, "CoM magnitude", det)
        (com,) = qf.compute(qf.center_of_mass(ds, center=det.center), client="synchronous")
        np.testing.assert_array_equal(com_view.image, np.hypot(com.data[0], com.data[1]))
        assert com_view.units == "px"
        session.set_view("iDPC phase")
        phase_view = _wait_latest(session, "iDPC phase", det)
        (phase,) = qf.compute(
            qf.idpc(qf.center_of_mass(ds, center=det.center)), client="synchronous"
        )
        np.testing.assert_allclose(phase_view.image, phase.data, rtol=0, atol=1e-12)
        with pytest.raises(ParameterError, match="view must be one of"):
            session.set_view("ptychography")
    finally:
        session.close()
