"""HTML representations for Jupyter: a result's thumbnail and summary, a dataset's summary.

A result shows a small grayscale thumbnail (percentile-stretched; a vector
field's magnitude, a complex object's phase, a pattern on a log scale), its
kind, shape, dtype, units, axes and a provenance summary.  A dataset shows
what it reads and how it is chunked and calibrated; it reads no frame to
show itself.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .results import Result

__all__ = ["dataset_html", "result_html", "thumbnail_png"]

#: Longest side of a thumbnail, in screen pixels.
THUMBNAIL_PX = 160

_STYLE = (
    "<style>.qf-repr{font-family:var(--jp-code-font-family,monospace);font-size:12px;"
    "display:flex;gap:12px;align-items:flex-start}.qf-repr table{border-collapse:collapse}"
    ".qf-repr th{text-align:left;padding:1px 8px 1px 0;font-weight:600;vertical-align:top}"
    ".qf-repr td{text-align:left;padding:1px 0}.qf-repr img{image-rendering:pixelated;"
    "border:1px solid #888}</style>"
)


def _display_values(result: Result) -> np.ndarray:
    data = np.asarray(result.data)
    if data.ndim == 3:  # a vector field: the length of each vector
        data = np.hypot(data[0], data[1]) if data.shape[0] == 2 else data[0]
    if np.iscomplexobj(data):
        data = np.angle(data)
    values = np.asarray(data, dtype=np.float64)
    if result.kind == "DiffractionImage":
        values = np.log1p(np.clip(values, 0, None))
    return values


def thumbnail_png(result: Result, *, size_px: int = THUMBNAIL_PX) -> bytes | None:
    """A grayscale PNG of the result, longest side ``size_px``; ``None`` when nothing is finite."""
    from PIL import Image

    values = _display_values(result)
    finite = values[np.isfinite(values)]
    if values.ndim != 2 or finite.size == 0:
        return None
    lo, hi = (float(v) for v in np.percentile(finite, [1, 99]))
    if hi <= lo:
        hi = lo + 1.0
    scaled = np.clip((np.nan_to_num(values, nan=lo) - lo) / (hi - lo), 0, 1)
    image = Image.fromarray((scaled * 255).astype(np.uint8), mode="L")
    rows, cols = values.shape
    factor = size_px / max(rows, cols)
    image = image.resize(
        (max(1, round(cols * factor)), max(1, round(rows * factor))), Image.Resampling.NEAREST
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _rows(pairs: Iterable[tuple[str, Any]]) -> str:
    return "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs
    )


def result_html(result: Result) -> str:
    """The HTML a notebook shows for a result."""
    prov = result.provenance
    axes = ", ".join(f"{a.name} {a.size} × {a.sampling:g} {a.units}" for a in result.axes)
    source = prov.source.get("paths") or prov.source.get("format") or "in memory"
    pairs: list[tuple[str, Any]] = [
        ("result", f"{result.name or '(unnamed)'}: {result.kind}"),
        ("shape", f"{result.shape} {result.data.dtype}"),
        ("units", result.units),
        ("axes", axes),
        ("operator", prov.operator),
        ("native", "yes" if prov.native else f"no ({[t.get('kind') for t in prov.transforms]})"),
        ("source", source),
        ("computed", f"{prov.execution.get('scheduler', prov.execution.get('computed_on', '?'))}"),
    ]
    if prov.notes:
        pairs.append(("notes", f"{len(prov.notes)}: {prov.notes[0][:120]}"))
    png = thumbnail_png(result)
    image = (
        f'<img alt="{html.escape(result.name or result.kind)} thumbnail" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'
        if png is not None
        else "<div>(no finite value to show)</div>"
    )
    return f'{_STYLE}<div class="qf-repr">{image}<table>{_rows(pairs)}</table></div>'


def dataset_html(description: dict[str, Any], *, path: str, format: str) -> str:
    """The HTML a notebook shows for a dataset (from :meth:`Dataset4D.describe`)."""
    cal = description.get("calibration") or {}
    pairs: list[tuple[str, Any]] = [
        ("dataset", "Dataset4D (lazy: nothing read to show this)"),
        ("input", f"{path} ({format})"),
        (
            "shape",
            f"{tuple(description.get('shape', ()))} {description.get('dtype')} "
            "(R_r, R_c, k_r, k_c)",
        ),
        ("chunks", f"{description.get('n_chunks')} × {description.get('chunk_rows')} scan rows"),
        ("representation", description.get("representation")),
        (
            "scan",
            f"{cal.get('scan_sampling')} {cal.get('scan_units')}",
        ),
        (
            "detector",
            f"{cal.get('detector_sampling')} {cal.get('detector_units')}, origin "
            f"{cal.get('detector_origin')}",
        ),
        ("calibration from", description.get("calibration_from", "?")),
    ]
    return f'{_STYLE}<div class="qf-repr"><table>{_rows(pairs)}</table></div>'
