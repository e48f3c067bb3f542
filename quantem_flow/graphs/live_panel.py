"""The dashboard page's live panel: the partial images of a scan as it fills in.

A live acquisition's results (``streams/live_results.py``) publish their
latest images on the scheduler with ``Client.set_metadata`` under
:data:`LIVE_METADATA_KEY`; the page's handlers read them with
``Scheduler.get_metadata`` and this module draws them: one image per result,
over the whole scan, rows not yet received left blank (never zero), with the
rows covered and how long after the last of them arrived the results were
ready.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "LIVE_METADATA_KEY",
    "LIVE_REFRESH_MS",
    "live_figures",
    "live_json",
    "live_state",
    "live_summary",
]

#: Where a live acquisition publishes its latest images on the scheduler.
LIVE_METADATA_KEY = ("quantem_flow", "live")

#: Images drawn side by side (the first results that are scan images).
MAX_IMAGES = 4

#: Milliseconds between the page's polls while a live scan is filling in.
LIVE_REFRESH_MS = 200


def live_state(scheduler: Any) -> dict[str, Any] | None:
    """The latest live payload published on ``scheduler``, or ``None``."""
    try:
        payload = scheduler.get_metadata(keys=list(LIVE_METADATA_KEY), default=None)
    except Exception:  # a scheduler without metadata (an old distributed): no live panel
        return None
    return dict(payload) if isinstance(payload, Mapping) else None


def _clock(t: Any) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(float(t)).strftime("%H:%M:%S.%f")[:-3]


def live_summary(live: Mapping[str, Any]) -> str:
    """One line: the stream, the rows covered, and how fresh the results are."""
    R = int(live.get("scan_shape", [0, 0])[0])
    rows = int(live.get("rows", 0))
    arrived, ready = live.get("arrived"), live.get("ready")
    lag = (
        f"; results ready {1000 * (float(ready) - float(arrived)):.0f} ms after the last of "
        f"those rows arrived ({_clock(arrived)})"
        if arrived is not None and ready is not None
        else ""
    )
    state = "final" if live.get("final") else "scan running"
    where = live.get("endpoint", "?")
    return f"Live acquisition from {where}: {rows} of {R} scan rows ({state}){lag}."


def _title(entry: Mapping[str, Any], live: Mapping[str, Any]) -> str:
    R = int(live.get("scan_shape", [0, 0])[0])
    title = f"{entry.get('label', '')}: rows {live.get('rows', 0)} of {R}"
    step = int(entry.get("step", 1))
    if step > 1:
        title += f" (every {step}th position shown)"
    return title


def _status_tags(live: Mapping[str, Any]) -> list[Any]:
    """The status line's tags: rows received and when the last arrived (the page reads them)."""
    return [int(live.get("rows", 0)), float(live.get("arrived") or 0.0)]


def _status_html(live: Mapping[str, Any]) -> str:
    images = list(live.get("images", []))
    more = (
        f" Images of the first {MAX_IMAGES} of {len(images)} results."
        if len(images) > MAX_IMAGES
        else ""
    )
    return f"<b>{html.escape(live_summary(live))}</b>{html.escape(more)}"


_json_cache: dict[Any, str] = {}


def live_json(live: Mapping[str, Any]) -> str:
    """The live images for the page's fast poll (``/quantem-flow/live.json``).

    Each image goes as 8-bit display values over the whole scan (``255``:
    not received yet) with the colour range they span: what the page draws,
    about 1/4 of float32's bytes.  The results themselves stay exact; only
    this picture of them is quantised.
    """
    import base64
    import json

    key = (live.get("published"), live.get("rows"))
    cached = _json_cache.get(key)
    if cached is not None:
        return cached
    images = []
    for entry in list(live.get("images", []))[:MAX_IMAGES]:
        picture, low, high = _scan_picture(entry, live)
        scaled = np.rint((np.nan_to_num(picture, nan=low) - low) / (high - low) * 254.0)
        full = np.where(np.isfinite(picture), scaled, 255).astype(np.uint8)
        images.append(
            {
                "title": _title(entry, live),
                "shape": list(full.shape),
                "low": low,
                "high": high,
                "b64": base64.b64encode(full.tobytes()).decode("ascii"),
            }
        )
    text = json.dumps(
        {
            "rows": int(live.get("rows", 0)),
            "arrived": float(live.get("arrived") or 0.0),
            "final": bool(live.get("final")),
            "status_html": _status_html(live),
            "images": images,
        }
    )
    _json_cache.clear()  # one entry: the latest
    _json_cache[key] = text
    return text


def _scan_picture(
    entry: Mapping[str, Any], live: Mapping[str, Any]
) -> tuple[np.ndarray, float, float]:
    """One published image over the whole scan (rows not yet received NaN), and its range."""
    R, C = (int(v) for v in live.get("scan_shape", [1, 1]))
    shape = tuple(int(v) for v in entry["shape"])
    shown = np.frombuffer(bytes(entry["pixels"]), dtype=np.float32).reshape(shape)
    step = int(entry.get("step", 1))
    full = np.full((-(-R // step), -(-C // step)), np.nan, dtype=np.float32)
    full[: shown.shape[0], : shown.shape[1]] = shown[: full.shape[0], : full.shape[1]]
    finite = shown[np.isfinite(shown)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    return full, low, high if high > low else low + 1.0


def live_figures(live: Mapping[str, Any], *, width: int) -> Any:
    """The live panel: a status line and one image per published result (a Bokeh layout)."""
    from bokeh.layouts import column, row
    from bokeh.models import (  # type: ignore[attr-defined]
        ColorBar,
        ColumnDataSource,
        LinearColorMapper,
        Range1d,
    )
    from bokeh.models.widgets import Div
    from bokeh.palettes import Greys256, Viridis256
    from bokeh.plotting import figure

    R, C = (int(v) for v in live.get("scan_shape", [1, 1]))
    images = list(live.get("images", []))
    status = Div(
        text=_status_html(live),
        width=width,
        name="qf-live-status",
        tags=_status_tags(live),
    )
    n = max(1, min(len(images), MAX_IMAGES))
    side = max(140, min(360, width // n - 100))
    figs = []
    for i, entry in enumerate(images[:MAX_IMAGES]):
        full, low, high = _scan_picture(entry, live)
        mapper = LinearColorMapper(
            palette=Greys256 if i == 0 else Viridis256,
            low=low,
            high=high,
            nan_color=(0, 0, 0, 0),
            name=f"qf-live-mapper-{i}",
        )
        title = _title(entry, live)
        fig: Any = figure(
            title=title,
            width=side + 70,
            height=int(side * R / max(C, 1)) + 40,
            x_range=Range1d(start=0, end=C),
            y_range=Range1d(start=R, end=0),
            tools="hover,save,reset",
            tooltips=[("row, col", "$y{0}, $x{0}"), ("value", "@image")],
            name=f"qf-live-image-{i}",
        )
        # image row 0 at y = 0, the top of the flipped axis: rows not yet received below
        source = ColumnDataSource({"image": [full]}, name=f"qf-live-src-{i}")
        fig.image(image="image", source=source, x=0, y=0, dw=C, dh=R, color_mapper=mapper)
        fig.add_layout(ColorBar(color_mapper=mapper, width=8), "right")
        fig.xaxis.axis_label = "scan column (px)"
        fig.yaxis.axis_label = "scan row (px)"
        figs.append(fig)
    return column(status, row(*figs), name="qf-live")


def update_live_figures(panel: Any, live: Mapping[str, Any]) -> None:
    """Draw newer images of the same scan into a panel made by :func:`live_figures`.

    What the page's ``applyLive`` does with ``live.json``, on the server's copy of the
    charts, so that the item it serves next shows the latest rows too.
    """
    status = panel.select_one({"name": "qf-live-status"})
    if status is not None:
        status.text = _status_html(live)
        status.tags = _status_tags(live)
    for i, entry in enumerate(list(live.get("images", []))[:MAX_IMAGES]):
        source = panel.select_one({"name": f"qf-live-src-{i}"})
        mapper = panel.select_one({"name": f"qf-live-mapper-{i}"})
        fig = panel.select_one({"name": f"qf-live-image-{i}"})
        if source is None or mapper is None or fig is None:
            continue
        full, low, high = _scan_picture(entry, live)
        mapper.update(low=low, high=high)
        source.data = {"image": [full]}
        fig.title.text = _title(entry, live)
