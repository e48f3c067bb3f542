"""The quantem-flow dashboard page: a Bokeh document on the scheduler's dashboard port.

:func:`register_page` adds ``/quantem-flow`` to the scheduler's HTTP server
when the placement plugin starts (so the page exists before the first
compute) and links it from the navigation bar of Dask's pages.  The page is
plain HTML holding the charts as a standalone Bokeh document in Dask's theme,
drawn by the BokehJS the scheduler serves for Dask's own pages and refreshed
by polling ``/quantem-flow/item.json`` (``304`` while nothing changed): no
websocket, so it renders in any browser (a plain headless screenshot
included) and a visitor leaving early prints nothing.  The page draws, from
:meth:`PlacementSchedulerPlugin.state`
(:mod:`quantem_flow.graphs.scheduler_plugin`), refreshed twice a second:

* per-worker throughput over time (GB/s of logical chunk data finished per
  second), with the moments workers were lost marked;
* the progress of the recent passes (chunks done of chunks);
* a scan-shaped map of the latest pass: which worker ran or holds each
  chunk (row block), and whether it is done, running or waiting;
* resident bytes per worker by runtime and representation;
* the workers lost (address, name, what happened next, restored or not);
* the placement log (most recent first).

:func:`write_html` writes the same charts, from a state snapshot, as a
self-contained HTML file (``quantem-flow bench`` puts it beside Dask's
performance report).  Bokeh is optional: without it :func:`register_page`
returns ``False`` and the plugin serves a plain HTML table that says so.
"""

from __future__ import annotations

import datetime
import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .live_panel import LIVE_REFRESH_MS

__all__ = [
    "PAGE",
    "ROOT_ID",
    "DocumentItems",
    "EarlyLeaveFilter",
    "FlowDashboard",
    "ItemAnswer",
    "bokeh_available",
    "document_item",
    "register_page",
    "render_page",
    "summary",
    "write_html",
]

#: Route of the page on the scheduler's HTTP server.
PAGE = "/quantem-flow"
#: Milliseconds between refreshes of a live page.
REFRESH_MS = 500
#: Milliseconds between polls for the charts while a live scan fills in (its images
#: come every LIVE_REFRESH_MS by the lighter live.json).
LIVE_CHARTS_REFRESH_MS = 5000
_NO_BOKEH = (
    "Bokeh is not installed, so this is the plain page without charts; install it "
    "(pip install bokeh) for the dashboard"
)
_WAITING_COLOR = "#d9d9d9"


def bokeh_available() -> bool:
    """Whether Bokeh (and Dask's Bokeh dashboard) can be imported."""
    try:
        import bokeh  # noqa: F401
        import distributed.dashboard.core  # noqa: F401
    except ImportError:
        return False
    return True


def _palette(n: int) -> list[str]:
    from bokeh.palettes import Category10_10, Category20_20

    base = list(Category10_10 if n <= 10 else Category20_20)
    return [base[i % len(base)] for i in range(max(n, 1))]


def _short(address: Any) -> str:
    return str(address).split("://", 1)[-1] if address else ""


class FlowDashboard:
    """The charts of the quantem-flow page, updated from plugin states.

    Parameters
    ----------
    live
        A live page on the scheduler (links its ``state.json``); ``False`` for
        a static snapshot (:func:`write_html`).
    width
        Width of the page in pixels (two charts side by side; fixed sizes lay
        out the same in every browser and in the static file).
    """

    def __init__(self, *, width: int = 1360, live: bool = True) -> None:
        from bokeh.layouts import column, row
        from bokeh.models import (
            BasicTickFormatter,
            ColumnDataSource,
            HoverTool,
            NumeralTickFormatter,
            Range1d,
        )
        from bokeh.models.widgets import DataTable, Div, TableColumn
        from bokeh.plotting import figure

        self.colors: dict[str, str] = {}
        half = width // 2 - 10
        self.live = live
        self._half = half
        self._last: dict[str, Any] = {}
        self._width = width
        self._live_panel: Any = None
        self._live_key: tuple[Any, ...] | None = None
        self._live_shown: tuple[Any, ...] | None = None
        self.header = Div(text="", width=width)

        # throughput over time, one line per worker, lost workers marked
        self.throughput_src = ColumnDataSource(
            {"xs": [], "ys": [], "color": [], "worker": [], "total": []}, name="qf-throughput"
        )
        self.losses_src = ColumnDataSource(
            {"x": [], "y": [], "worker": [], "restored": []}, name="qf-losses"
        )
        self.throughput: Any = figure(
            title="Throughput per worker (GB/s of chunk data, 1 s bins)",
            x_axis_type="datetime",
            height=260,
            width=half,
            tools="pan,xwheel_zoom,box_zoom,reset,save",
            name="qf-throughput-figure",
        )
        lines = self.throughput.multi_line(
            "xs",
            "ys",
            color="color",
            line_width=2,
            legend_field="worker",
            source=self.throughput_src,
        )
        self.throughput.add_tools(
            HoverTool(renderers=[lines], tooltips=[("worker", "@worker"), ("bytes", "@total")])
        )
        marks = self.throughput.scatter(
            "x",
            "y",
            marker="x",
            size=14,
            line_width=3,
            color="#d62728",
            source=self.losses_src,
            legend_label="worker lost",
        )
        self.throughput.add_tools(
            HoverTool(renderers=[marks], tooltips=[("lost", "@worker"), ("restored", "@restored")])
        )
        self.throughput.yaxis.axis_label = "GB/s"
        self.throughput.yaxis.formatter = BasicTickFormatter(use_scientific=False)
        self.throughput.legend.location = "top_left"
        self.throughput.legend.label_text_font_size = "8pt"

        # progress of the recent passes
        self.progress_src = ColumnDataSource(
            {"y": [], "frac": [], "one": [], "label": [], "color": []}, name="qf-progress"
        )
        self.progress: Any = figure(
            title="Passes (chunks done)",
            height=260,
            width=half,
            x_range=Range1d(start=0, end=1),
            y_range=Range1d(start=-0.6, end=4.6),
            tools="",
            toolbar_location=None,
            name="qf-progress-figure",
        )
        self.progress.hbar(
            y="y", left=0, right="one", height=0.7, color="#eeeeee", source=self.progress_src
        )
        self.progress.hbar(
            y="y", left=0, right="frac", height=0.7, color="color", source=self.progress_src
        )
        self.progress.text(
            x=0.01,
            y="y",
            text="label",
            text_baseline="middle",
            text_font_size="9pt",
            source=self.progress_src,
        )
        self.progress.yaxis.visible = False
        self.progress.xaxis.formatter = NumeralTickFormatter(format="0%")

        # scan-shaped map of the latest pass
        self.map_src = ColumnDataSource(
            {
                "left": [],
                "right": [],
                "top": [],
                "bottom": [],
                "color": [],
                "alpha": [],
                "chunk": [],
                "rows": [],
                "worker": [],
                "status": [],
            },
            name="qf-scan-map",
        )
        self.scan_map: Any = figure(
            title="Chunks by worker (scan map)",
            height=340,
            width=half,
            x_range=Range1d(start=0, end=1),
            y_range=Range1d(start=1, end=0),
            tools="hover,reset,save",
            tooltips=[
                ("chunk", "@chunk"),
                ("scan rows", "@rows"),
                ("worker", "@worker"),
                ("status", "@status (faint: running, grey: waiting)"),
            ],
            name="qf-scan-map-figure",
        )
        self.scan_map.quad(
            left="left",
            right="right",
            top="top",
            bottom="bottom",
            fill_color="color",
            fill_alpha="alpha",
            line_color="white",
            line_width=0.5,
            source=self.map_src,
        )
        self.scan_map.xaxis.axis_label = "scan column (px)"
        self.scan_map.yaxis.axis_label = "scan row (px)"

        # resident bytes per worker by runtime/representation
        self.resident_src = ColumnDataSource(
            {
                "y": [],
                "left": [],
                "right": [],
                "color": [],
                "category": [],
                "worker": [],
                "mib": [],
            },
            name="qf-resident",
        )
        self.resident: Any = figure(
            title="Resident bytes per worker (runtime/representation)",
            height=340,
            width=half,
            y_range=Range1d(start=-0.6, end=1.6),
            tools="hover,save",
            tooltips=[("worker", "@worker"), ("held", "@category"), ("MiB", "@mib{0.0}")],
            name="qf-resident-figure",
        )
        self.resident.hbar(
            y="y",
            left="left",
            right="right",
            height=0.6,
            color="color",
            legend_field="category",
            source=self.resident_src,
        )
        self.resident.xaxis.axis_label = "MiB"
        self.resident.legend.location = "bottom_right"

        # workers lost, placement log
        self.lost_src = ColumnDataSource(
            {"time": [], "worker": [], "name": [], "restored": [], "what_next": []},
            name="qf-lost",
        )
        self.lost_table = DataTable(
            source=self.lost_src,
            columns=[
                TableColumn(field="time", title="lost at", width=80),
                TableColumn(field="worker", title="worker", width=150),
                TableColumn(field="name", title="name", width=90),
                TableColumn(field="restored", title="restored", width=180),
                TableColumn(field="what_next", title="what happened next", width=500),
            ],
            height=160,
            width=width,
            index_position=None,
            name="qf-lost-table",
        )
        self.log_src = ColumnDataSource(
            {"time": [], "event": [], "key": [], "worker": [], "detail": []}, name="qf-log"
        )
        self.log_table = DataTable(
            source=self.log_src,
            columns=[
                TableColumn(field="time", title="time", width=80),
                TableColumn(field="event", title="event", width=130),
                TableColumn(field="key", title="task", width=260),
                TableColumn(field="worker", title="worker", width=150),
                TableColumn(field="detail", title="detail", width=420),
            ],
            height=220,
            width=width,
            index_position=None,
            name="qf-log-table",
        )
        self.root = column(
            self.header,
            row(self.throughput, self.progress),
            row(column(self.scan_map, width=half), self.resident),
            Div(text="<b>Workers lost</b>"),
            self.lost_table,
            Div(text="<b>Placement log</b> (most recent first)"),
            self.log_table,
            name="qf-dashboard",
        )

    def _set(self, source: Any, data: Mapping[str, list[Any]]) -> None:
        """Replace a source's data only when it changed (a live page gets only changes)."""
        if self._last.get(source.id) != data:
            self._last[source.id] = data
            source.data = dict(data)

    def _update_live(self, live: Mapping[str, Any] | None) -> None:
        key = None if not live else _live_structure(live)
        self._live_shown = None if not live else (live.get("published"), live.get("rows"))
        if key == self._live_key:
            if live and self._live_panel is not None:  # the same panel, newer rows
                from .live_panel import update_live_figures

                update_live_figures(self._live_panel, live)
            return
        self._live_key = key
        children = list(self.root.children)
        if self._live_panel is not None:
            children.remove(self._live_panel)
            self._live_panel = None
        if live:
            from .live_panel import live_figures

            self._live_panel = live_figures(live, width=self._width)
            children.insert(1, self._live_panel)
        self.root.children = children

    # -- colours -------------------------------------------------------------------------
    def _color_of(self, workers: Sequence[str]) -> dict[str, str]:
        for w in workers:
            if w and w not in self.colors:
                self.colors[w] = ""
        palette = _palette(len(self.colors))
        for i, w in enumerate(self.colors):
            self.colors[w] = palette[i]
        return self.colors

    # -- update --------------------------------------------------------------------------
    def update(self, state: Mapping[str, Any]) -> None:
        """Redraw every chart from one plugin state (see ``PlacementSchedulerPlugin.state``).

        A ``"live"`` entry (a live acquisition's latest images, see
        :mod:`~quantem_flow.graphs.live_panel`) adds the live panel under the header.
        """
        import numpy as np

        self._update_live(state.get("live"))

        workers = [str(w["address"]) for w in state.get("workers", [])]
        passes = list(state.get("passes", []))
        departures = list(state.get("departures", []))
        tp = state.get("throughput", {}) or {}
        seen = (
            workers
            + sorted(tp.get("workers", {}))
            + [str(w) for p in passes for w in p.get("worker", []) if w]
            + [str(d["worker"]) for d in departures]
        )
        colors = self._color_of(seen)
        lost = [d for d in departures if d.get("lost")]
        names = {str(w["address"]): str(w.get("name", "")) for w in state.get("workers", [])}

        running = [p for p in passes if p.get("finished") is None and p.get("n_chunks")]
        self.header.text = (
            f"<h2 style='margin:4px 0'>quantem-flow placement</h2>"
            f"<p style='margin:2px 0'>{len(workers)} worker(s); {len(passes)} recent pass(es), "
            f"{len(running)} running; {state.get('decisions', 0)} placement decision(s); "
            f"{len(lost)} worker(s) lost, "
            f"{sum(1 for d in lost if d.get('restored'))} restored. "
            + (
                "State as JSON: <a href='quantem-flow/state.json'>state.json</a></p>"
                if self.live
                else f"Snapshot taken at {_clock(state.get('time'))}.</p>"
            )
        )

        # throughput
        start = tp.get("start")
        bin_s = float(tp.get("bin_s", 1.0))
        xs, ys, cs, ws, tot = [], [], [], [], []
        for w, series in sorted(tp.get("workers", {}).items()):
            if start is None:
                break
            t = (start + bin_s * (np.arange(len(series)) + 0.5)) * 1000.0
            xs.append(t.tolist())
            ys.append([float(v) for v in series])
            cs.append(colors.get(w, "#333333"))
            ws.append(f"{_short(w)} {names.get(w, '')}".strip())
            tot.append(f"{tp.get('total_bytes', {}).get(w, 0) / 1e9:.3f} GB")
        self._set(
            self.throughput_src, {"xs": xs, "ys": ys, "color": cs, "worker": ws, "total": tot}
        )
        self._set(
            self.losses_src,
            {
                "x": [float(d["time"]) * 1000.0 for d in lost],
                "y": [0.0 for _ in lost],
                "worker": [f"{_short(d['worker'])} {d.get('name') or ''}" for d in lost],
                "restored": [
                    f"yes, by {_short(d['restored_by'])}" if d.get("restored") else "no"
                    for d in lost
                ],
            },
        )

        # progress
        recent = passes[-5:]
        self._set(
            self.progress_src,
            {
                "y": [float(len(recent) - 1 - i) for i in range(len(recent))],
                "frac": [p["n_done"] / max(p["n_chunks"], 1) for p in recent],
                "one": [1.0 for _ in recent],
                "label": [
                    f"{_clock(p.get('started'))} {p['kind']} {p['label']}: "
                    f"{p['n_done']}/{p['n_chunks']} chunks"
                    + (" (running)" if p.get("finished") is None else "")
                    for p in recent
                ],
                "color": [
                    "#2ca02c" if p.get("finished") is not None else "#1f77b4" for p in recent
                ],
            },
        )

        # scan map of the latest pass
        latest = passes[-1] if passes else None
        data: dict[str, list[Any]] = {k: [] for k in self.map_src.data}
        if latest is not None:
            R, C = (int(x) for x in latest["scan_shape"])
            self.scan_map.x_range.start, self.scan_map.x_range.end = 0, max(C, 1)
            self.scan_map.y_range.start, self.scan_map.y_range.end = max(R, 1), 0
            self.scan_map.title.text = f"Chunks by worker ({latest['kind']}, {R}x{C} scan)"
            scale = min((self._half - 110) / max(C, 1), 300 / max(R, 1))
            if C * scale < 260:  # room for the title: taller, up to 520 px, same aspect
                scale = min(260 / max(C, 1), 520 / max(R, 1))
            fw, fh = max(int(C * scale), 40), max(int(R * scale), 40)
            if (self.scan_map.frame_width, self.scan_map.frame_height) != (fw, fh):
                self.scan_map.frame_width, self.scan_map.frame_height = fw, fh
            for i, ((r0, r1), w, st) in enumerate(
                zip(latest["chunks"], latest["worker"], latest["status"], strict=False)
            ):
                data["left"].append(0)
                data["right"].append(C)
                data["top"].append(r0)
                data["bottom"].append(r1)
                data["color"].append(colors.get(str(w), _WAITING_COLOR) if w else _WAITING_COLOR)
                data["alpha"].append({"done": 0.9, "running": 0.4}.get(st, 0.6))
                data["chunk"].append(i)
                data["rows"].append(f"{r0}:{r1}")
                data["worker"].append(f"{_short(w)} {names.get(str(w), '')}".strip() or "-")
                data["status"].append(st)
        self._set(self.map_src, data)

        # resident bytes
        rd: dict[str, list[Any]] = {k: [] for k in self.resident_src.data}
        cats = sorted(
            {c for w in state.get("workers", []) for c in w.get("resident_bytes_by_runtime", {})}
        )
        cat_color = dict(zip(cats, reversed(_palette(max(len(cats), 1))), strict=False))
        ticks: dict[int, str] = {}
        for y, w in enumerate(state.get("workers", [])):
            ticks[y] = f"{w.get('name', '')} {_short(w['address'])}"
            left = 0.0
            for c in cats:
                mib = float(w.get("resident_bytes_by_runtime", {}).get(c, 0)) / 2**20
                if mib <= 0:
                    continue
                rd["y"].append(float(y))
                rd["left"].append(left)
                rd["right"].append(left + mib)
                rd["color"].append(cat_color[c])
                rd["category"].append(c)
                rd["worker"].append(ticks[y])
                rd["mib"].append(mib)
                left += mib
        self._set(self.resident_src, rd)
        self.resident.y_range.start, self.resident.y_range.end = -0.6, max(len(ticks), 1) - 0.4
        if self._last.get("ticks") != ticks:  # a new ticker model only when the workers change
            self._last["ticks"] = dict(ticks)
            self.resident.yaxis.ticker = list(ticks)
            self.resident.yaxis.major_label_overrides = {k: v for k, v in ticks.items()}

        # tables
        self._set(
            self.lost_src,
            {
                "time": [_clock(d["time"]) for d in reversed(lost)],
                "worker": [str(d["worker"]) for d in reversed(lost)],
                "name": [str(d.get("name")) for d in reversed(lost)],
                "restored": [_restored_text(d) for d in reversed(lost)],
                "what_next": [str(d.get("what_next", "")) for d in reversed(lost)],
            },
        )
        log = list(reversed(state.get("log", [])[-200:]))
        self._set(
            self.log_src,
            {
                "time": [_clock(e.get("time")) for e in log],
                "event": [str(e.get("event", "")) for e in log],
                "key": [str(e.get("key", "")) for e in log],
                "worker": [str(e.get("worker", "")) for e in log],
                "detail": [
                    "; ".join(
                        f"{k}={v}"
                        for k, v in e.items()
                        if k not in ("time", "event", "key", "worker")
                    )
                    for e in log
                ],
            },
        )


def _live_structure(live: Mapping[str, Any]) -> tuple[Any, ...]:
    """What decides the live panel's layout (its pictures arrive by ``live.json``)."""
    labels = tuple(str(e.get("label", "")) for e in live.get("images", []))
    return (tuple(live.get("scan_shape", [])), labels, live.get("endpoint"))


def _clock(t: Any) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(float(t)).strftime("%H:%M:%S")


def _restored_text(d: Mapping[str, Any]) -> str:
    if d.get("restored"):
        return f"yes, by {d.get('restored_by')} after {float(d.get('restored_after_s') or 0):.1f} s"
    restart = d.get("restart") or {}
    if restart.get("restart") in ("gave-up", "failed"):
        return f"no: {restart.get('detail', '')}"
    if restart.get("restart") == "restarting":
        return "not yet (restarting)"
    return "no"


def document_item(state: Mapping[str, Any]) -> tuple[str, str]:
    """The charts of one state as a standalone Bokeh document (``json_item``), and its tag.

    Returns
    -------
    (str, str)
        The item as JSON text, and a short digest of what it shows: the page
        asks for the item again with ``If-None-Match`` and gets ``304`` while
        nothing changed.
    """
    return DocumentItems().item(state)


class ItemAnswer(NamedTuple):
    """What the page's server answers a poll with (see :meth:`DocumentItems.answer`)."""

    #: JSON text: the whole item (``json_item``), or ``{"patches": [...]}``.
    text: str
    #: Digest of what the charts show: unchanged, the page is answered ``304``.
    tag: str
    #: The document's version the text brings the page to.
    version: int
    #: Whether ``text`` holds patches to the page's document rather than a whole item.
    patches: bool


class DocumentItems:
    """The page's charts for a sequence of states, as the page's server asks for them.

    One :class:`FlowDashboard` lives in one Bokeh document, updated in place; each
    update that changed a model becomes a numbered patch (Bokeh's own ``PATCH-DOC``
    events, as its server sends over a websocket), and a page that holds version ``v``
    is sent the patches after ``v`` rather than a new document: a few kB made in about a
    millisecond where a whole item takes 0.15-0.3 s of Python (which, on the scheduler,
    is time its event loop and its passes wait for). A page too far behind, or new, gets
    the whole item. :meth:`answer` may be called from any one thread at a time (a lock
    keeps it so); :meth:`answer_async` runs it on this object's own thread, off the
    scheduler's event loop.

    Parameters
    ----------
    keep
        How many patches are kept for pages that fell behind.
    keep_bytes
        At most this many bytes of them (a live scan's patches carry its images).
    """

    def __init__(self, *, keep: int = 120, keep_bytes: int = 32 * 2**20) -> None:
        import threading
        from collections import deque

        self._lock = threading.Lock()
        self._dash: FlowDashboard | None = None
        self._doc: Any = None
        self._events: list[Any] = []
        self._version = 0
        self._patches: deque[tuple[int, str]] = deque()
        self._keep, self._keep_bytes, self._kept_bytes = keep, keep_bytes, 0
        self._whole: tuple[int, str] | None = None
        self._executor: Any = None

    def _dashboard(self) -> FlowDashboard:
        if self._dash is None:
            from bokeh.document import Document
            from distributed.dashboard.components.scheduler import BOKEH_THEME

            dash = FlowDashboard()
            doc = Document()
            doc.theme = BOKEH_THEME
            doc.title = ""
            doc.add_root(dash.root)
            doc.on_change(self._events.append)
            self._dash, self._doc = dash, doc
        return self._dash

    def answer(self, state: Mapping[str, Any], *, since: int | None = None) -> ItemAnswer:
        """Bring the charts to ``state``; the patches after version ``since``, or the item.

        Parameters
        ----------
        state
            A plugin state (``PlacementSchedulerPlugin.state``).
        since
            The version the asking page holds (``None``: it holds none).
        """
        import hashlib
        import json

        with self._lock:
            dash = self._dashboard()
            dash.update(state)
            if self._events:
                self._version += 1
                patch = _patch_json(self._doc, self._events)
                self._events.clear()
                self._patches.append((self._version, patch))
                self._kept_bytes += len(patch)
                while len(self._patches) > self._keep or self._kept_bytes > self._keep_bytes:
                    self._kept_bytes -= len(self._patches.popleft()[1])
            stable = json.dumps(dash_snapshot(dash), sort_keys=True, default=str)
            tag = hashlib.sha256(stable.encode()).hexdigest()[:20]
            version = self._version
            oldest = self._patches[0][0] if self._patches else version + 1
            if since is not None and 0 <= since <= version and since >= oldest - 1:
                texts = [text for v, text in self._patches if v > since]
                return ItemAnswer('{"patches":[' + ",".join(texts) + "]}", tag, version, True)
            if self._whole is None or self._whole[0] != version:
                self._whole = (version, _item_json(dash))
                self._events.clear()  # serialising the whole document is no change
            return ItemAnswer(self._whole[1], tag, version, False)

    def item(self, state: Mapping[str, Any]) -> tuple[str, str]:
        """The whole item of one state as JSON text, and its tag (see :func:`document_item`)."""
        text, tag, _, _ = self.answer(state)
        return text, tag

    async def answer_async(
        self, state: Mapping[str, Any], *, since: int | None = None
    ) -> ItemAnswer:
        """:meth:`answer` on this object's one thread: the event loop serves others meanwhile."""
        import asyncio
        import functools
        from concurrent.futures import ThreadPoolExecutor

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="quantem-flow-dashboard")
        call = functools.partial(self.answer, state, since=since)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """End the thread :meth:`answer_async` started (a later call starts another)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _item_json(dash: FlowDashboard) -> str:
    import json

    from bokeh.core.types import ID
    from bokeh.embed import json_item

    # the document already carries Dask's theme: no theme given, none applied again
    item = json_item(dash.root, target=ID(ROOT_ID))
    return json.dumps(item, separators=(",", ":"), default=str)


def _patch_json(doc: Any, events: Sequence[Any]) -> str:
    """Bokeh's ``PATCH-DOC`` content for ``events``, its arrays inline (JSON over HTTP)."""
    import json

    from bokeh.core.serialization import Serializer

    serializer = Serializer(references=doc.models.synced_references, deferred=False)
    encoded = serializer.encode(list(events))
    doc.models.flush_synced(lambda model: not serializer.has_ref(model))
    return json.dumps({"events": encoded}, separators=(",", ":"), default=str)


def dash_snapshot(dash: FlowDashboard) -> dict[str, Any]:
    """What the charts show (every data source's columns and the titles), for change detection."""
    from bokeh.models import ColumnDataSource

    out: dict[str, Any] = {
        "header": dash.header.text,
        "map": dash.scan_map.title.text,
        "live": list(dash._live_key or ()) + list(dash._live_shown or ()),
    }
    for name, value in vars(dash).items():
        if isinstance(value, ColumnDataSource):
            out[name] = {k: list(v) for k, v in value.data.items()}
    return out


#: The element the charts are drawn in.
ROOT_ID = "qf-root"

#: The page: Dask's navigation bar, the summary (no JavaScript needed), the charts
#: embedded as a standalone document (they render without a server round trip, so a
#: plain ``chromium --headless --screenshot`` shows them), refreshed by polling.
_PAGE_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>quantem-flow placement</title>
{resources}
<style>
body {{ margin: 0; font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  background: #fafafa; }}
.navbar {{ display: flex; gap: 4px; align-items: center; background: #eee; padding: 0 8px;
  height: 45px; }}
.navbar a {{ color: #111; text-decoration: none; padding: 12px 12px; font-size: 17px; }}
.navbar a:hover, .navbar a.active {{ background: #ddd; }}
.qf-summary {{ margin: 4px 8px; font-size: 90%; color: #555; }}
#{root} {{ margin: 0 8px; }}
</style></head>
<body>
<div class="navbar">{links}</div>
<p class="qf-summary" id="qf-summary">{summary}</p>
<div id="{root}"></div>
<script>
(function () {{
  let refreshMs = {refresh_ms};
  let tag = {tag};
  let container = document.getElementById("{root}");
  async function show(item) {{
    const fresh = document.createElement("div");
    fresh.id = "{root}-next";
    fresh.style.display = "none";
    container.after(fresh);
    await Bokeh.embed.embed_item(item, fresh.id);
    fresh.style.display = "";
    container.remove();
    fresh.id = "{root}";
    container = fresh;
    const docs = Bokeh.documents;  // the page's one document stays documents[0]
    for (const old of docs.slice(0, -1)) {{ try {{ old.clear(); }} catch (e) {{}} }}
    docs.splice(0, docs.length - 1);
  }}
  // the charts change by Bokeh's own document patches after the version shown; a whole
  // item comes when the page is new, fell too far behind, or a patch did not apply
  let version = {version};
  async function poll() {{
    try {{
      const since = version >= 0 ? "?since=" + version : "";
      const r = await fetch("{item_url}" + since,
        {{ headers: {{ "If-None-Match": tag }}, cache: "no-store" }});
      refreshMs = Number(r.headers.get("X-Refresh-Ms")) || refreshMs;
      const said = r.headers.get("X-Summary");  // the line above the charts, kept current
      if (said !== null) document.getElementById("qf-summary").textContent =
        decodeURIComponent(said);
      if (r.status === 200) {{
        const body = await r.json();
        const next = Number(r.headers.get("X-Version"));
        if (body.patches) {{
          try {{
            const doc = Bokeh.documents[Bokeh.documents.length - 1];
            for (const patch of body.patches) doc.apply_json_patch(patch);
          }} catch (e) {{ version = -1; tag = ""; setTimeout(poll, 0); return; }}
        }} else {{
          await show(body);
        }}
        tag = r.headers.get("ETag") || tag;
        version = Number.isFinite(next) ? next : -1;
      }}
    }} catch (e) {{ /* the scheduler went away: keep the last picture */ }}
    setTimeout(poll, refreshMs);
  }}
  // a live scan's images: only their pixels, drawn into the panel already on the page
  let liveTag = "";
  function applyLive(live) {{
    const doc = Bokeh.documents[Bokeh.documents.length - 1];
    const status = livePanel();
    if (!status) {{ liveTag = ""; return; }}  // the panel comes with the next charts
    live.images.forEach((im, i) => {{
      const src = doc.get_model_by_name("qf-live-src-" + i);
      const mapper = doc.get_model_by_name("qf-live-mapper-" + i);
      const fig = doc.get_model_by_name("qf-live-image-" + i);
      if (!src || !mapper || !fig) return;
      const bytes = atob(im.b64);
      const [rows, cols] = im.shape;
      const span = (im.high - im.low) / 254;
      const image = [];
      for (let r = 0; r < rows; r++) {{
        const line = new Array(cols);
        for (let c = 0; c < cols; c++) {{
          const v = bytes.charCodeAt(r * cols + c);
          line[c] = v === 255 ? NaN : im.low + v * span;
        }}
        image.push(line);
      }}
      mapper.low = im.low;
      mapper.high = im.high;
      src.data = {{ image: [image] }};
      fig.title.text = im.title;
    }});
    status.text = live.status_html;
    status.tags = [live.rows, live.arrived];
  }}
  function livePanel() {{
    const doc = Bokeh.documents[Bokeh.documents.length - 1];
    return doc ? doc.get_model_by_name("qf-live-status") : null;
  }}
  async function pollLive() {{
    let wait = {live_refresh_ms};
    if (!livePanel()) {{ setTimeout(pollLive, refreshMs); return; }}  // no live scan shown
    try {{
      const r = await fetch("{live_url}",
        {{ headers: {{ "If-None-Match": liveTag }}, cache: "no-store" }});
      wait = Number(r.headers.get("X-Refresh-Ms")) || wait;
      if (r.status === 200) {{
        const live = await r.json();
        liveTag = r.headers.get("ETag") || liveTag;
        applyLive(live);
      }}
    }} catch (e) {{ /* the scheduler went away */ }}
    setTimeout(pollLive, wait);
  }}
  Bokeh.embed.embed_item({item}, "{root}").then(() => {{
    setTimeout(poll, refreshMs);
    setTimeout(pollLive, {live_refresh_ms});
  }});
}})();
</script>
</body></html>
"""


def _page_title(page: str) -> str:
    return "Quantem-Flow" if page == PAGE.strip("/") else page.replace("-", " ").title()


def render_page(
    state: Mapping[str, Any],
    *,
    static_root: str,
    pages: Sequence[str],
    refresh_ms: int = REFRESH_MS,
    item: tuple[str, str] | None = None,
    version: int = -1,
) -> str:
    """The HTML of ``/quantem-flow`` for one state.

    Parameters
    ----------
    state
        The placement plugin's state.
    static_root
        URL path under which the scheduler serves Bokeh's JavaScript (``/``:
        ``/static/js/bokeh.min.js``).
    pages
        Dask's pages for the navigation bar (``"status"``, ``"workers"``...).
    refresh_ms
        Milliseconds between polls for a changed picture.
    item
        The state's item and tag, where already made (:class:`DocumentItems`);
        made here otherwise.
    version
        The version of the charts ``item`` shows (the page asks for the patches after
        it); ``-1``: none, the page asks for a whole item when the charts change.

    Returns
    -------
    str
        The page.
    """
    from bokeh.resources import Resources

    item_text, tag = item if item is not None else document_item(state)
    resources = Resources(
        mode="server", root_url=static_root, components=["bokeh", "bokeh-widgets", "bokeh-tables"]
    ).render_js()
    here = PAGE.strip("/")
    links = "".join(
        f'<a href="{html.escape(p)}"' + (' class="active"' if p == here else "") + ">"
        f"{html.escape(_page_title(p))}</a>"
        for p in pages
    )
    return _PAGE_TEMPLATE.format(
        resources=resources,
        links=links,
        summary=html.escape(summary(state)),
        root=ROOT_ID,
        refresh_ms=int(refresh_ms),
        tag=script_literal(tag),
        version=int(version),
        item=item_text.replace("</", "<\\/"),
        item_url=f"{here}/item.json",
        live_url=f"{here}/live.json",
        live_refresh_ms=int(LIVE_REFRESH_MS),
    )


def script_literal(value: Any) -> str:
    """``value`` as a JavaScript literal safe inside a ``<script>`` element."""
    import json

    return json.dumps(value).replace("</", "<\\/")


class EarlyLeaveFilter:
    """Drop Bokeh's traceback for a browser that left before its session began.

    Bokeh's websocket handler asserts that a session exists when a
    connection closes; a visitor leaving in the first moments (a headless
    screenshot, a closed tab) trips it, and tornado prints the traceback into
    the terminal of whoever runs the scheduler.  Dask's own pages use that
    handler (the quantem-flow page has no websocket).  Logged at debug level.
    """

    def filter(self, record: Any) -> bool:
        """Whether to keep ``record``."""
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, AssertionError):
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = tb.tb_frame.f_code.co_filename if tb is not None else ""
            if where.replace("\\", "/").endswith("bokeh/server/connection.py"):
                import logging

                logging.getLogger("quantem_flow.dashboard").debug(
                    "a browser left before its Bokeh session began: %s", record.getMessage()
                )
                return False
        return True


def summary(state: Mapping[str, Any]) -> str:
    """One line of text: workers, resident bytes by runtime/representation, losses.

    It is in the page's HTML itself (readable without JavaScript).
    """
    parts = []
    for w in state.get("workers", []):
        held = ", ".join(
            f"{k} {v / 2**20:.1f} MiB"
            for k, v in sorted(w.get("resident_bytes_by_runtime", {}).items())
        )
        parts.append(f"{w.get('name', '')} {_short(w['address'])}: {held or 'nothing resident'}")
    lost = [d for d in state.get("departures", []) if d.get("lost")]
    text = (
        f"quantem-flow placement: {len(parts)} worker(s) ({'; '.join(parts) or 'none'}); "
        f"{len(lost)} worker(s) lost, {sum(1 for d in lost if d.get('restored'))} restored."
    )
    if state.get("live"):
        from .live_panel import live_summary

        text += " " + live_summary(state["live"])
    return text


def register_page(scheduler: Any, plugin: Any) -> tuple[bool, str]:
    """Serve the charts at ``/quantem-flow`` on the scheduler's HTTP server, once.

    The page is plain HTML holding the charts as a standalone Bokeh document
    (drawn by the BokehJS the scheduler already serves for Dask's pages),
    refreshed by polling ``/quantem-flow/item.json``; it needs no websocket,
    so it renders for any browser, a headless screenshot included, and a
    visitor leaving early leaves nothing in the terminal.  It is linked from
    Dask's navigation bar.

    Parameters
    ----------
    scheduler
        The running ``distributed.Scheduler`` (called from the plugin's ``start``).
    plugin
        The placement plugin (its ``state()`` feeds the page).

    Returns
    -------
    (bool, str)
        Whether the Bokeh page is served, and a note saying why not.
    """
    if getattr(scheduler, "_quantem_flow_page", False):
        return True, "the Bokeh page is served"
    app = getattr(scheduler, "http_application", None)
    server = getattr(scheduler, "http_server", None)
    if app is None or server is None:
        return False, "the scheduler has no HTTP server"
    if not bokeh_available():
        return False, _NO_BOKEH
    import logging
    from urllib.parse import quote

    from tornado.web import RequestHandler

    prefix = "/"  # where Dask's own Bokeh pages (and BokehJS, under static/) are served
    for other in getattr(app, "applications", []):
        p = getattr(other, "prefix", None)
        if isinstance(p, str) and any(c.__name__ == "BokehTornado" for c in type(other).__mro__):
            prefix = p or "/"
            break
    if not prefix.endswith("/"):
        prefix += "/"
    pages: list[str] = [PAGE.strip("/")]
    try:  # Dask's navigation bar: link this page from every Dask page (a shared list)
        from distributed.dashboard.scheduler import template_variables

        shared = template_variables(scheduler).get("pages")
        if isinstance(shared, list):
            if PAGE.strip("/") not in shared:
                shared.append(PAGE.strip("/"))
            pages = shared
    except Exception:  # a Dask without that helper: the page works, unlinked
        pass

    from .live_panel import live_json, live_state

    def page_state() -> dict[str, Any]:
        state = dict(plugin.state())
        live = live_state(scheduler)
        if live is not None:
            state["live"] = live
        return state

    # the charts are kept on their own thread: a whole Bokeh document takes 0.15-0.3 s
    # to make, which the scheduler's event loop would otherwise spend; a page already
    # showing them is sent patches
    items = DocumentItems()
    scheduler._quantem_flow_items = items

    class Page(RequestHandler):
        async def get(self) -> None:
            state = page_state()
            text, tag, version, _ = await items.answer_async(state)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            page = render_page(
                state, static_root=prefix, pages=list(pages), item=(text, tag), version=version
            )
            self.write(page)

    class Item(RequestHandler):
        async def get(self) -> None:
            asked = self.get_query_argument("since", "")
            since = int(asked) if asked.isdigit() else None  # no or bad version: the item
            state = page_state()
            answer = await items.answer_async(state, since=since)
            live = state.get("live")
            # while a scan fills in, its images come by live.json; the rest less often
            refresh = LIVE_CHARTS_REFRESH_MS if live and not live.get("final") else REFRESH_MS
            self.set_header("X-Refresh-Ms", str(refresh))
            self.set_header("Cache-Control", "no-store")
            self.set_header("ETag", answer.tag)
            self.set_header("X-Version", str(answer.version))
            self.set_header("X-Summary", quote(summary(state), safe=" ,;:()/"))
            if self.request.headers.get("If-None-Match") == answer.tag:
                self.set_status(304)
                return
            self.set_header("Content-Type", "application/json")
            self.write(answer.text)

    class Live(RequestHandler):
        def get(self) -> None:
            live = live_state(scheduler)
            self.set_header("Cache-Control", "no-store")
            if live is None:
                self.set_header("X-Refresh-Ms", str(REFRESH_MS * 4))
                self.set_status(204)  # no live scan: the page asks again, slowly
                return
            tag = f"{live.get('published')}-{live.get('rows')}"
            self.set_header("ETag", tag)
            # a scan that ended changes no more: ask again slowly (a new scan shows by then)
            slow = REFRESH_MS * 4 if live.get("final") else LIVE_REFRESH_MS
            self.set_header("X-Refresh-Ms", str(slow))
            if self.request.headers.get("If-None-Match") == tag:
                self.set_status(304)
                return
            self.set_header("Content-Type", "application/json")
            self.write(live_json(live))

    app.add_handlers(
        r".*",
        [(PAGE + r"/?", Page), (PAGE + r"/item\.json", Item), (PAGE + r"/live\.json", Live)],
    )
    tornado_log = logging.getLogger("tornado.application")
    if not any(isinstance(f, EarlyLeaveFilter) for f in tornado_log.filters):
        tornado_log.addFilter(EarlyLeaveFilter())
    scheduler._quantem_flow_page = True
    return True, "the Bokeh page is served"


def write_html(
    state: Mapping[str, Any], path: str | os.PathLike[str], *, title: str = "quantem-flow"
) -> Path:
    """Write the dashboard's charts for one state snapshot as a self-contained HTML file.

    Parameters
    ----------
    state
        A plugin state (``PlacementSchedulerPlugin.state()``).
    path
        File to write.
    title
        Page title.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    RuntimeUnavailableError
        Bokeh is not installed.
    """
    from ..errors import RuntimeUnavailableError

    if not bokeh_available():
        raise RuntimeUnavailableError(f"write_html needs Bokeh: {_NO_BOKEH}")
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    dash = FlowDashboard(live=False)
    dash.update(state)
    out = Path(path)
    out.write_text(file_html(dash.root, resources=INLINE, title=title))
    return out
