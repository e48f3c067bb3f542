"""The explorer's page: a Bokeh document over one :class:`~.session.ExplorerSession`.

Three plots and a row of controls:

- **navigator**: the mean (or max, or the chosen position's) diffraction
  pattern on a log scale, in mrad from the beam centre when the detector is
  calibrated, else in px; the current detector drawn on it with handles to
  drag (its centre, its radii, a rectangle's corners) and a polygon tool;
- **image**: the scan image of the current view (the detector's virtual
  image, the CoM magnitude or the iDPC phase), calibrated axes, a colour bar
  and its units; a tap chooses the scan position (marked);
- **pattern**: the chosen position's pattern with the detector drawn on it.

Every page subscribes to the session: a change from any page (or from
Python) is pushed to every page on its own event loop.  Each element a test
or a user may need to find has a Bokeh ``name``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import html
import json
import math
from typing import Any

import numpy as np

from .detectors import KINDS, Detector
from .export import InputSpec, export_files, pipeline_mapping, python_snippet
from .session import VIEWS, ExplorerSession, ImageUpdate

__all__ = ["make_document"]


class _Axes:
    """Detector pixels <-> display coordinates (mrad or 1/Å from the origin, or px)."""

    def __init__(self, session: ExplorerSession):
        kr, kc = session.dataset.detector_shape
        row, col = session.pattern_axes
        # the same axes as the mean pattern's figure: angles from the beam centre
        # (given, or found from the data), pixel indices when uncalibrated
        self.calibrated = row.units != "px"
        self.origin = (float(row.origin), float(col.origin))
        self.scale = (float(row.sampling), float(col.sampling))
        self.units = str(row.units)
        found = str(session.pattern_origin.get("from", ""))
        self.measured_from = (
            ""
            if not self.calibrated
            else "the detector corner"
            if found.startswith("the detector corner")
            else "the beam centre"
        )
        self.shape = (kr, kc)

    def y(self, row: float) -> float:
        return (row - self.origin[0]) * self.scale[0]

    def x(self, col: float) -> float:
        return (col - self.origin[1]) * self.scale[1]

    def row(self, y: float) -> float:
        return y / self.scale[0] + self.origin[0]

    def col(self, x: float) -> float:
        return x / self.scale[1] + self.origin[1]

    def label(self, axis: str) -> str:
        where = f" from {self.measured_from}" if self.measured_from else ""
        return f"k_{axis} ({self.units}{where})"


def _log_image(pattern: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(np.asarray(pattern, dtype=np.float64), 0.0))


def make_document(
    doc: Any,
    session: ExplorerSession,
    *,
    input_spec: InputSpec | None,
    export_dir: str,
) -> None:
    """Fill a Bokeh ``doc`` with the explorer of ``session``."""
    import bokeh.plotting
    from bokeh.events import Tap
    from bokeh.layouts import column, row
    from bokeh.models import (  # type: ignore[attr-defined]
        ColorBar,
        ColumnDataSource,
        CustomJS,
        LinearColorMapper,
        PointDrawTool,
        PolyDrawTool,
        Range1d,
    )
    from bokeh.models.widgets import Button, Div, PreText, Select

    figure: Any = bokeh.plotting.figure  # its glyph methods are typed narrower than they take

    ds = session.dataset
    axes = _Axes(session)
    kr, kc = ds.detector_shape
    R, C = session.scan_shape  # a live scan's whole shape (its rows fill in)
    cal = ds.calibration
    scan_units = str(cal.scan_units)
    sy, sx = (float(cal.scan_sampling[0]), float(cal.scan_sampling[1]))

    # -- navigator ----------------------------------------------------------------------------
    x0, x1 = sorted((axes.x(-0.5), axes.x(kc - 0.5)))
    y_top, y_bottom = axes.y(-0.5), axes.y(kr - 0.5)
    nav = figure(
        name="navigator",
        title="Diffraction pattern (log scale)",
        width=440,
        height=440,
        x_range=Range1d(start=x0, end=x1),
        # row 0 at the top: the range runs from the last row (bottom) to row 0 (top)
        y_range=Range1d(start=y_bottom, end=y_top),
        tools="pan,wheel_zoom,reset,save",
        x_axis_label=axes.label("c"),
        y_axis_label=axes.label("r"),
        match_aspect=True,
    )
    nav_mapper = LinearColorMapper(palette="Greys256")
    nav_source = ColumnDataSource(
        {"image": [_log_image(session.mean_pattern)]}, name="navigator_source"
    )
    nav.image(
        image="image",
        source=nav_source,
        x=axes.x(-0.5),
        y=axes.y(-0.5),
        dw=axes.x(kc - 0.5) - axes.x(-0.5),
        dh=axes.y(kr - 0.5) - axes.y(-0.5),
        color_mapper=nav_mapper,
    )

    outline = ColumnDataSource(
        {"xs": [[]], "ys": [[]]}, name="detector_outline"
    )  # the detector's outline(s), as closed lines
    nav.multi_line("xs", "ys", source=outline, line_color="#ff7f0e", line_width=2)
    centre_source = ColumnDataSource({"x": [], "y": []}, name="centre_handle")
    handle_source = ColumnDataSource({"x": [], "y": []}, name="radius_handles")
    centre_r = nav.scatter(
        "x", "y", source=centre_source, size=12, marker="circle_cross",
        fill_color="#ff7f0e", fill_alpha=0.5, line_color="white",
    )  # fmt: skip
    handle_r = nav.scatter(
        "x", "y", source=handle_source, size=10, marker="square",
        fill_color="#1f77b4", line_color="white",
    )  # fmt: skip
    nav.add_tools(PointDrawTool(renderers=[centre_r, handle_r], add=False, drag=True))
    # Bokeh's drag tool tells the server where a point went only when the drag ends; the
    # image should follow while the user drags, so every redraw of a handle *by the drag*
    # is copied to a source the server listens to.  Not copied: a redraw of a source with
    # no point selected (the tool redraws every source it edits, the dragged one holds
    # the selected point) and one that follows a set of the data (the server's update,
    # or the drag's end, which reaches the server as it is: Bokeh announces the set just
    # before the redraw, and the page remembers it per source)
    live_source = ColumnDataSource({"x": [], "y": [], "which": []}, name="live_drag")
    for source, which in ((centre_source, "centre"), (handle_source, "handles")):
        source.js_on_change(
            "data",
            CustomJS(code="(window.qfDataSet = window.qfDataSet || {})[cb_obj.id] = true;"),
        )
        source.js_on_change(
            "change",
            CustomJS(
                args={"live": live_source, "which": which},
                code="""
                const set = window.qfDataSet || {};
                if (set[cb_obj.id]) { set[cb_obj.id] = false; return; }
                if (cb_obj.selected.indices.length == 0) { return; }  // not the dragged one
                const x = Array.from(cb_obj.data.x), y = Array.from(cb_obj.data.y);
                live.data = {x: x, y: y, which: x.map(() => which)};
                """,
            ),
        )

    poly_source = ColumnDataSource({"xs": [], "ys": []}, name="polygon_source")
    poly_r = nav.patches(
        "xs", "ys", source=poly_source, fill_alpha=0.2, fill_color="#2ca02c",
        line_color="#2ca02c", line_width=2,
    )  # fmt: skip
    nav.add_tools(PolyDrawTool(renderers=[poly_r], num_objects=1))
    nav.toolbar.active_drag = nav.select_one({"type": PointDrawTool})

    # -- scan image ---------------------------------------------------------------------------
    img = figure(
        name="scan_image",
        title="Virtual image",
        width=480,
        height=440,
        x_range=Range1d(start=-0.5 * sx, end=(C - 0.5) * sx),
        y_range=Range1d(start=(R - 0.5) * sy, end=-0.5 * sy),
        tools="pan,wheel_zoom,reset,save",
        x_axis_label=f"R_c ({scan_units})",
        y_axis_label=f"R_r ({scan_units})",
        match_aspect=True,
    )
    img_mapper = LinearColorMapper(palette="Viridis256")
    img_source = ColumnDataSource({"image": [np.zeros((R, C))]}, name="image_source")
    img.image(
        image="image", source=img_source, x=-0.5 * sx, y=-0.5 * sy, dw=C * sx, dh=R * sy,
        color_mapper=img_mapper,
    )  # fmt: skip
    colorbar = ColorBar(color_mapper=img_mapper, title="counts", name="image_colorbar")
    img.add_layout(colorbar, "right")
    box_source = ColumnDataSource({"x": [], "y": [], "w": [], "h": []}, name="region_box")
    img.rect("x", "y", "w", "h", source=box_source, fill_alpha=0, line_color="red", line_width=1.5)
    pos_source = ColumnDataSource({"x": [], "y": []}, name="position_marker")
    img.scatter("x", "y", source=pos_source, marker="x", size=14, line_color="red", line_width=2)

    # -- the chosen position's pattern --------------------------------------------------------
    pat = figure(
        name="position_pattern",
        title="Pattern at the chosen position (log scale)",
        width=440,
        height=440,
        x_range=nav.x_range,
        y_range=nav.y_range,
        tools="pan,wheel_zoom,reset,save",
        x_axis_label=axes.label("c"),
        y_axis_label=axes.label("r"),
    )
    pat_source = ColumnDataSource({"image": [np.zeros((kr, kc))]}, name="pattern_source")
    pat_mapper = LinearColorMapper(palette="Greys256")
    pat.image(
        image="image", source=pat_source, x=axes.x(-0.5), y=axes.y(-0.5),
        dw=axes.x(kc - 0.5) - axes.x(-0.5), dh=axes.y(kr - 0.5) - axes.y(-0.5),
        color_mapper=pat_mapper,
    )  # fmt: skip
    pat.multi_line("xs", "ys", source=outline, line_color="#ff7f0e", line_width=2)

    # -- controls -----------------------------------------------------------------------------
    options: Any = [*KINDS]
    kind_select = Select(title="Detector", value=session.detector.kind, options=options,
                         name="kind_select")  # fmt: skip
    options = [*VIEWS]
    view_select = Select(title="Image", value=session.view, options=options,
                         name="view_select")  # fmt: skip
    options = ["mean", "max"]
    nav_select = Select(title="Navigator", value="mean", options=options,
                        name="navigator_select")  # fmt: skip
    options = ["1 position", "3 x 3 sum", "5 x 5 sum", "9 x 9 sum"]
    region_select = Select(title="Pattern of", value=options[0], options=options,
                           name="region_select")  # fmt: skip
    keep_button = Button(label="Keep detector", name="keep_button")
    export_button = Button(label="Export", button_type="primary", name="export_button")
    status = Div(text="", name="status", width=900)
    kept_div = Div(text="", name="kept", width=900)
    export_text = PreText(text="", name="export_text", width=900)

    def describe_text() -> str:
        held = session.dataset
        rows = held.scan_shape[0]
        live = (
            f"; <b>live</b> from {html.escape(str(session.live.endpoint))}: {rows} of {R} scan "
            "rows received, the images fill in"
            if session.live is not None
            else ""
        )
        return (
            f"<b>quantem-flow explore</b>: {R} x {C} scan of {kr} x {kc} px {ds.dtype} patterns, "
            f"persisted on the cluster ({held.nbytes / 2**30:.2f} GiB, {len(held.chunks)} "
            f"chunks); detector in {axes.units}"
            + ("" if axes.calibrated else " (uncalibrated)")
            + live
        )

    describe = Div(name="dataset", width=900, text=describe_text())

    # -- session -> page ----------------------------------------------------------------------
    def outline_of(det: Detector) -> tuple[list[list[float]], list[list[float]]]:
        t = np.linspace(0, 2 * math.pi, 97)
        xs: list[list[float]] = []
        ys: list[list[float]] = []
        if det.kind in ("disk", "annulus"):
            radii = [det.outer] + ([det.inner] if det.kind == "annulus" and det.inner > 0 else [])
            for r in radii:
                if not math.isfinite(r):
                    continue
                xs.append([axes.x(det.center[1] + r * math.cos(a)) for a in t])
                ys.append([axes.y(det.center[0] + r * math.sin(a)) for a in t])
        elif det.kind == "rectangle":
            r0, r1, c0, c1 = det.region
            rows = [r0 - 0.5, r0 - 0.5, r1 - 0.5, r1 - 0.5, r0 - 0.5]
            cols = [c0 - 0.5, c1 - 0.5, c1 - 0.5, c0 - 0.5, c0 - 0.5]
            xs.append([axes.x(c) for c in cols])
            ys.append([axes.y(r) for r in rows])
        else:
            v = [*det.vertices, det.vertices[0]]
            xs.append([axes.x(c) for _, c in v])
            ys.append([axes.y(r) for r, _ in v])
        return xs, ys

    def handles_of(det: Detector) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        if det.kind in ("disk", "annulus"):
            centre = {"x": [axes.x(det.center[1])], "y": [axes.y(det.center[0])]}
            # a radius to infinity (a ring to the edge) has its handle at the farthest corner
            reach = math.hypot(max(det.center[0], kr - 1 - det.center[0]),
                               max(det.center[1], kc - 1 - det.center[1]))  # fmt: skip
            radii = [min(det.outer, reach)] + ([det.inner] if det.kind == "annulus" else [])
            hs = {
                "x": [axes.x(det.center[1] + r) for r in radii],
                "y": [axes.y(det.center[0])] * len(radii),
            }
            return centre, hs
        if det.kind == "rectangle":
            r0, r1, c0, c1 = det.region
            return {"x": [], "y": []}, {
                "x": [axes.x(c0 - 0.5), axes.x(c1 - 0.5)],
                "y": [axes.y(r0 - 0.5), axes.y(r1 - 0.5)],
            }
        return {"x": [], "y": []}, {"x": [], "y": []}

    state: dict[str, Any] = {"detector": None, "handles": None}
    # handle positions this page was sent: at a drag's end the tool sends every source it
    # edits, one it did not drag as the page holds it, which may be a position the server
    # has moved on from; that is not a user's move
    sent: collections.deque[tuple[tuple[float, ...], tuple[float, ...]]] = collections.deque(
        maxlen=256
    )

    def points(data: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
        return tuple(float(v) for v in data["x"]), tuple(float(v) for v in data["y"])

    def show_detector() -> None:
        det = session.detector
        state["detector"] = det
        xs, ys = outline_of(det)
        outline.data = {"xs": xs, "ys": ys}
        centre, hs = handles_of(det)
        sent.append(points(centre))
        sent.append(points(hs))
        state["handles"] = points(hs)
        if dict(centre_source.data) != centre:
            centre_source.data = centre
        if dict(handle_source.data) != hs:
            handle_source.data = hs
        if det.kind != "polygon" and len(poly_source.data["xs"]):
            poly_source.data = {"xs": [], "ys": []}
        if kind_select.value != det.kind:
            kind_select.value = det.kind

    def show_image(update: ImageUpdate) -> None:
        img_source.data = {"image": [update.image]}
        finite = update.image[np.isfinite(update.image)]
        if finite.size:
            lo, hi = np.percentile(finite, [0.5, 99.5])
            img_mapper.update(low=float(lo), high=float(hi) if hi > lo else float(lo) + 1.0)
        colorbar.title = update.units
        what = update.detector.describe() if update.view == "virtual image" else update.view
        img.title.text = (
            f"Virtual image ({update.detector.kind})"
            if update.view == "virtual image"
            else update.view
        )
        geometry = html.escape(json.dumps(update.detector.to_dict()), quote=True)
        status.text = (
            f"<span id='qf-status' data-exact='{int(update.exact)}' data-view='{update.view}' "
            f"data-detector='{geometry}'>"
            f"{'exact' if update.exact else 'coarse'} image of {what} "
            f"({update.seconds * 1e3:.0f} ms, units {update.units})</span>"
        )
        if update.notes:
            status.text += (
                "<br><span style='color:#b35900'>allowed and recorded in the provenance: "
                + html.escape(update.notes[0].split(":", 1)[-1].strip())
                + "</span>"
            )

    def show_position() -> None:
        r, c = session.position
        size = int(region_select.value.split()[0])
        r0, r1, c0, c1 = session.region_of(r, c, size)
        pos_source.data = {"x": [c * sx], "y": [r * sy]}
        box_source.data = {
            "x": [((c0 + c1) / 2 - 0.5) * sx] if size > 1 else [],
            "y": [((r0 + r1) / 2 - 0.5) * sy] if size > 1 else [],
            "w": [(c1 - c0) * sx] if size > 1 else [],
            "h": [(r1 - r0) * sy] if size > 1 else [],
        }
        pat_source.data = {"image": [_log_image(session.pattern(r, c, size=size))]}
        if size == 1:
            pat.title.text = f"Pattern at scan position ({r}, {c}) (log scale)"
        else:
            pat.title.text = f"Sum of rows {r0}:{r1}, cols {c0}:{c1} (log scale)"

    def show_kept() -> None:
        kept_div.text = "Kept: " + (
            "; ".join(f"<b>{d.name}</b> {d.describe()}" for d in session.kept) or "none"
        )

    def on_session(what: str) -> None:  # any thread: hop onto this page's loop
        def apply() -> None:
            if what == "detector":
                show_detector()
            elif what == "image" and session.latest is not None:
                show_image(session.latest)
            elif what == "position":
                show_position()
            elif what == "kept":
                show_kept()
            elif what == "rows":
                describe.text = describe_text()
            elif what == "view":
                view_select.value = session.view
            elif what == "error" and session.error:
                status.text = f"<span id='qf-status' style='color:#c00'>{session.error}</span>"

        with contextlib.suppress(Exception):  # the page is closing
            doc.add_next_tick_callback(apply)

    unsubscribe = session.subscribe(on_session)
    doc.on_session_destroyed(lambda _ctx: unsubscribe())

    # -- page -> session ---------------------------------------------------------------------
    def centre_moved(_attr: str, _old: Any, new: Any, live: bool = False) -> None:
        det = state["detector"]
        if det is None or det.kind not in ("disk", "annulus") or not len(new["x"]):
            return
        if not live and points(new) in sent:  # a drag's end may resend what it was sent
            return
        centre = (axes.row(float(new["y"][0])), axes.col(float(new["x"][0])))
        if centre != det.center:
            session.set_detector(
                Detector(det.kind, center=centre, inner=det.inner, outer=det.outer, name=det.name)
            )

    def handles_moved(_attr: str, _old: Any, new: Any, live: bool = False) -> None:
        det = state["detector"]
        if det is None or not len(new["x"]):
            return
        now = points(new)
        if not live and now in sent:  # a drag's end may resend what it was sent
            return
        before = state["handles"]
        state["handles"] = now
        pts = [
            (axes.row(float(y)), axes.col(float(x)))
            for x, y in zip(new["x"], new["y"], strict=True)
        ]
        if det.kind in ("disk", "annulus"):
            current = [det.outer] + ([det.inner] if det.kind == "annulus" else [])
            radii = [
                # only a handle the user moved changes its radius
                r0
                if before is not None
                and i < len(before[0])
                and (before[0][i], before[1][i]) == (now[0][i], now[1][i])
                else math.hypot(p[0] - det.center[0], p[1] - det.center[1])
                for i, (p, r0) in enumerate(zip(pts, current, strict=False))
            ]
            outer = radii[0]
            inner = radii[1] if det.kind == "annulus" and len(radii) > 1 else 0.0
            if det.kind == "annulus" and inner >= outer:
                inner, outer = outer, inner
            if outer <= inner or outer <= 0:
                return
            new_det = Detector(det.kind, center=det.center, inner=inner, outer=outer, name=det.name)
        elif det.kind == "rectangle" and len(pts) >= 2:
            (ra, ca), (rb, cb) = pts[0], pts[1]
            # pixels whose centres lie inside the box
            r0, r1 = math.ceil(min(ra, rb)), math.floor(max(ra, rb)) + 1
            c0, c1 = math.ceil(min(ca, cb)), math.floor(max(ca, cb)) + 1
            if r1 <= r0 or c1 <= c0:
                return
            new_det = Detector("rectangle", region=(r0, r1, c0, c1), name=det.name)
        else:
            return
        if new_det != det:
            session.set_detector(new_det)

    def polygon_drawn(_attr: str, _old: Any, new: Any) -> None:
        if not len(new["xs"]) or len(new["xs"][-1]) < 3:
            return
        xs, ys = new["xs"][-1], new["ys"][-1]
        verts = tuple((axes.row(float(y)), axes.col(float(x))) for x, y in zip(xs, ys, strict=True))
        session.set_detector(Detector("polygon", vertices=verts, name=session.detector.name))

    def kind_chosen(_attr: str, _old: Any, new: str) -> None:
        det = session.detector
        if new == det.kind:
            return
        centre = det.center if det.kind in ("disk", "annulus") else session.probe_center
        radius = session.probe_radius
        if new == "disk":
            session.set_detector(Detector("disk", center=centre, outer=max(radius, 1.0), name="bf"))
        elif new == "annulus":
            session.set_detector(
                Detector(
                    "annulus", center=centre, inner=1.5 * radius, outer=3.0 * radius, name="adf"
                )
            )
        elif new == "rectangle":
            r, c = round(centre[0]), round(centre[1])
            h = max(int(radius), 1)
            session.set_detector(
                Detector("rectangle", region=(r - h, r + h, c - h, c + h), name="rect")
            )
        else:  # a square polygon to start from; redraw it with the polygon tool
            rr, cc, hh = centre[0], centre[1], max(radius, 1.0)
            session.set_detector(
                Detector(
                    "polygon",
                    vertices=((rr - hh, cc), (rr, cc + hh), (rr + hh, cc), (rr, cc - hh)),
                    name="mask",
                )
            )

    def navigator_chosen(_attr: str, _old: Any, new: str) -> None:
        pattern = session.mean_pattern if new == "mean" else session.max_pattern
        nav_source.data = {"image": [_log_image(pattern)]}
        nav.title.text = f"{new.capitalize()} diffraction pattern (log scale)"

    def tapped(event: Any) -> None:
        r = round(event.y / sy)
        c = round(event.x / sx)
        if 0 <= r < R and 0 <= c < C:
            session.set_position(r, c)

    def keep_clicked() -> None:
        session.keep()

    def export_clicked() -> None:
        current = session.detector
        kept = list(session.kept)
        if any(dataclasses.replace(k, name=current.name) == current for k in kept):
            detectors = kept  # the current one was kept already
        else:
            names = {k.name for k in kept}
            name = current.name
            while name in names:
                name += "_"
            detectors = [*kept, dataclasses.replace(current, name=name)]
        written = export_files(ds, detectors, input_spec, export_dir, client=session.client)
        text = [f"Written to {export_dir}: {', '.join(sorted(p.name for p in written.values()))}"]
        if input_spec is not None:
            import yaml

            text += ["", "# pipeline.yaml", yaml.safe_dump(
                pipeline_mapping(ds, detectors, input_spec), sort_keys=False)]  # fmt: skip
        text += ["# explore.py", python_snippet(ds, detectors, input_spec)]
        export_text.text = "\n".join(text)

    def live_moved(_attr: str, _old: Any, new: Any) -> None:
        if not len(new["which"]):
            return
        data = {"x": list(new["x"]), "y": list(new["y"])}
        if new["which"][0] == "centre":
            centre_moved("data", None, data, live=True)
        else:
            handles_moved("data", None, data, live=True)

    centre_source.on_change("data", centre_moved)
    handle_source.on_change("data", handles_moved)
    live_source.on_change("data", live_moved)
    poly_source.on_change("data", polygon_drawn)
    kind_select.on_change("value", kind_chosen)
    view_select.on_change("value", lambda _a, _o, new: session.set_view(new))
    nav_select.on_change("value", navigator_chosen)
    region_select.on_change("value", lambda _a, _o, _n: show_position())
    keep_button.on_click(keep_clicked)
    export_button.on_click(export_clicked)
    img.on_event(Tap, tapped)

    show_detector()
    show_position()
    show_kept()
    if session.latest is not None:
        show_image(session.latest)
    doc.title = "quantem-flow explore"
    doc.add_root(
        column(
            describe,
            row(kind_select, view_select, nav_select, region_select, keep_button, export_button),
            status,
            row(nav, img, pat),
            kept_div,
            export_text,
            name="explorer",
        )
    )
