"""Figures of results, built on matplotlib (imported only when a figure is made).

Every figure keeps the engine's conventions: the scan row axis (and the
detector row axis) points down, as in an image; axes are labelled in the
result's calibrated units (``px`` when uncalibrated, never mrad); a colorbar
names the values and their unit; the title names the operator and its key
parameters, read from the result's provenance.

* :func:`plot_result` (``result.plot()``) draws one result: a
  ``ScanImage`` / ``PhaseImage`` in grey, a ``VectorField`` through the
  colour wheel of :func:`~quantem_flow.operators.display.to_rgb_vector` with
  a colour-wheel legend (and optional arrows), a ``DiffractionImage`` on a
  log scale with the geometry of virtual detectors drawn on it, a
  ``ComplexObject`` as amplitude and phase side by side.
* :func:`plot` (``qf.plot(*results)``) draws a panel of several results; a
  diffraction pattern in the panel shows the detectors of the other results
  computed on the same dataset.
* :func:`write_figures` writes one PNG per result and an overview panel.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import Axis
from .errors import ParameterError
from .results import (
    ComplexObject,
    DiffractionImage,
    PhaseImage,
    Result,
    VectorField,
    register_plotter,
)

__all__ = [
    "detector_geometry",
    "figure_paths",
    "figure_title",
    "plot",
    "plot_result",
    "write_figures",
]

#: Operators whose parameters describe an annular (or disk) detector.
_DETECTOR_OPERATORS = ("virtual_bf", "virtual_abf", "virtual_adf", "virtual_annular")
_OVERLAY_COLORS = ("#00e5ff", "#ffd400", "#ff4fd8", "#7cff4f", "#ff7f0e", "#ffffff")
#: Files a figure may be written as.
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def _num(value: Any, digits: int = 3) -> str:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(x):
        return "edge" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def _ring_text(inner: Any, outer: Any, units: str) -> str:
    if not inner:
        return f"r < {_num(outer)} {units}"
    if math.isinf(float(outer)):
        return f"r ≥ {_num(inner)} {units} (to the detector edge)"
    return f"{_num(inner)}-{_num(outer)} {units}"


def _unit_text(units: str) -> str:
    return "dimensionless" if units in ("1", "") else units


def figure_title(result: Result) -> str:
    """Return a one- or two-line title: the name, the operator and its key parameters.

    Parameters
    ----------
    result
        Any typed result.

    Returns
    -------
    str
        For example ``"adf: virtual_adf 10-25 mrad, centre (29.0, 39.0) px"``;
        a result that is not native (cropped, binned) says so.
    """
    prov = result.provenance
    op = prov.operator or type(result).kind
    p = prov.parameters
    bits: list[str] = []
    if op in _DETECTOR_OPERATORS and "inner" in p:
        units = p.get("radii_units", "px")
        inner, outer = p.get("inner"), p.get("outer")
        bits.append(_ring_text(inner, outer, units))
    elif op == "center_of_mass":
        bits.append(f"in {p.get('units', result.units)}")
        if p.get("mask_radius") is not None:
            bits.append(f"mask r < {_num(p['mask_radius'])} {p.get('mask_units', 'px')}")
    elif op in ("idpc", "dpc"):
        rot = p.get("rotation", {})
        if isinstance(rot, Mapping) and "rotation_deg_found" in rot:
            bits.append(f"rotation {_num(rot['rotation_deg_found'])} deg")
            if rot.get("transpose_found"):
                bits.append("transposed")
        if p.get("highpass"):
            bits.append(f"high-pass {_num(p['highpass'])}")
    elif op == "ssb":
        bits.append(f"{_num(p.get('voltage_kV'))} kV")
        bits.append(f"semiangle {_num(p.get('semiangle_mrad'))} mrad")
        ab = p.get("aberrations_used", {})
        if isinstance(ab, Mapping) and "C10_A" in ab:
            bits.append(f"C10 {_num(ab['C10_A'])} Å")
    center = p.get("center_px")
    if op in (*_DETECTOR_OPERATORS, "center_of_mass") and isinstance(center, Sequence):
        bits.append(f"centre ({_num(center[0])}, {_num(center[1])}) px")
    flags = prov.flags or {}
    if not flags.get("native", True):
        done = [k for k in ("cropped", "binned", "thresholded") if flags.get(k)]
        bits.append("not native: " + (", ".join(done) or "transformed"))
    head = f"{result.name}: {op}" if result.name and result.name != op else op
    return head if not bits else f"{head}\n{', '.join(bits)}"


def _axis_label(axis: Axis, *, measured_from: str = "") -> str:
    names = {
        "scan_row": "scan row",
        "scan_col": "scan column",
        "k_row": "k row",
        "k_col": "k column",
    }
    where = f" from {measured_from}" if measured_from else ""
    return f"{names.get(axis.name, axis.name)} ({axis.units}{where})"


def pattern_origin_text(result: Result) -> str:
    """What a pattern's detector axes are measured from: ``"the beam centre"``, or ``""``.

    Read from the result's ``axes_origin`` record
    (:func:`quantem_flow.operators.patterns.pattern_axes`); ``"the detector
    corner"`` when no beam centre was known, ``""`` for pixel indices.
    """
    record = result.provenance.parameters.get("axes_origin")
    if not isinstance(record, dict) or record.get("px") is None:
        return ""
    source = str(record.get("from", ""))
    return "the detector corner" if source.startswith("the detector corner") else "the beam centre"


def _extent(row: Axis, col: Axis) -> tuple[float, float, float, float]:
    """``imshow`` extent with row 0 at the top, pixel centres at the coordinates."""
    c0 = (-0.5 - col.origin) * col.sampling
    c1 = (col.size - 0.5 - col.origin) * col.sampling
    r0 = (-0.5 - row.origin) * row.sampling
    r1 = (row.size - 0.5 - row.origin) * row.sampling
    return (c0, c1, r1, r0)


def _image_axes(result: Result) -> tuple[Axis, Axis]:
    axes = result.axes[-2:]
    return axes[0], axes[1]


def _new_axes(n: int, ax: Any, *, width: float = 4.6) -> tuple[Any, list[Any]]:
    if ax is None:
        import matplotlib.pyplot as plt

        fig, grid = plt.subplots(
            1, n, figsize=(width * n, 4.0), layout="constrained", squeeze=False
        )
        return fig, list(grid[0])
    given = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
    if len(given) != n:
        raise ParameterError(
            f"this result draws {n} panel(s); pass ax= as {n} matplotlib Axes, got {len(given)}"
        )
    return given[0].figure, given


def _limits(values: np.ndarray, low: float, high: float) -> tuple[float, float] | None:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    lo, hi = (float(v) for v in np.percentile(finite, [low, high]))
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0) * 1e-6
    return lo, hi


def _scalebar(ax: Any, axis: Axis) -> None:
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    span = axis.size * axis.sampling
    target = span / 5
    exp = 10 ** math.floor(math.log10(target))
    length = max(m * exp for m in (1, 2, 5) if m * exp <= target)
    bar = AnchoredSizeBar(
        ax.transData,
        length,
        f"{_num(length)} {axis.units}",
        "lower right",
        pad=0.4,
        color="white",
        frameon=False,
        size_vertical=span / 100,
        label_top=True,
    )
    ax.add_artist(bar)


def _draw_image(
    ax: Any,
    values: np.ndarray,
    row: Axis,
    col: Axis,
    *,
    cmap: str,
    label: str,
    low_percentile: float,
    high_percentile: float,
    log: bool = False,
    scalebar: bool = False,
    measured_from: str = "",
) -> Any:
    from matplotlib.colors import LogNorm, Normalize

    data = np.asarray(values, dtype=np.float64)
    norm: Any
    if log:
        positive = data[np.isfinite(data) & (data > 0)]
        if positive.size:
            lo = float(np.percentile(positive, low_percentile))
            hi = float(positive.max())
            norm = LogNorm(vmin=lo, vmax=max(hi, lo * (1 + 1e-6)), clip=True)
            label = f"{label}, log scale"
        else:
            norm = Normalize()
    else:
        lim = _limits(data, low_percentile, high_percentile)
        norm = Normalize() if lim is None else Normalize(vmin=lim[0], vmax=lim[1], clip=True)
    im = ax.imshow(
        data,
        cmap=cmap,
        norm=norm,
        origin="upper",
        extent=_extent(row, col),
        interpolation="nearest",
    )
    ax.set_xlabel(_axis_label(col, measured_from=measured_from))
    ax.set_ylabel(_axis_label(row, measured_from=measured_from))
    if scalebar:
        _scalebar(ax, col)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("")
        ax.set_ylabel("")
    ax.figure.colorbar(im, ax=ax, label=label, shrink=0.9)
    return im


def _colour_wheel(ax: Any, magnitude: float, units: str, *, note: str = "") -> Any:
    """Add the legend of a vector field beside ``ax``: a brightness bar and a colour wheel.

    The bar (a layout-managed colorbar) gives the magnitude that brightness
    encodes; the wheel above it gives the direction that hue encodes, drawn
    with the row axis down as in the image.
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    from .operators.display import to_rgb_vector

    bar = ax.figure.colorbar(
        ScalarMappable(norm=Normalize(0.0, magnitude or 1.0), cmap="gray"),
        ax=ax,
        shrink=0.5,
        anchor=(0.0, 0.0),
        label=f"|v| ({units}), brightness" + (f"\n{note}" if note else ""),
    )
    n = 101
    r = np.linspace(-1.0, 1.0, n)
    rows, cols = np.meshgrid(r, r, indexing="ij")
    rgb = to_rgb_vector(np.stack([rows, cols]), high_percentile=100.0)
    radius = np.hypot(rows, cols)
    # full saturation everywhere, brightness growing with the radius as in the image
    peak = np.maximum(rgb.max(axis=-1, keepdims=True), 1e-12)
    rgb = rgb / peak * np.clip(radius, 0, 1)[..., None]
    rgba = np.concatenate([rgb, (radius <= 1.0)[..., None].astype(np.float64)], axis=-1)
    wheel = bar.ax.inset_axes((-1.5, 1.12, 5.0, 0.85), transform=bar.ax.transAxes)
    wheel.imshow(rgba, origin="upper", extent=(-1, 1, 1, -1), interpolation="bilinear")
    wheel.set_xlim(-1.25, 1.9)
    wheel.set_ylim(1.5, -1.25)
    wheel.set_aspect("equal")
    wheel.set_axis_off()
    wheel.set_label("colour wheel")
    wheel.text(1.08, 0.0, "+col", fontsize=7, va="center", ha="left")
    wheel.text(0.0, 1.08, "+row", fontsize=7, ha="center", va="top")
    wheel.set_title("direction", fontsize=7, pad=2)
    return wheel


def _plot_vector(
    field: VectorField,
    ax: Any,
    *,
    arrows: bool,
    arrow_step: int | None,
    subtract_mean: bool,
    high_percentile: float,
    scalebar: bool,
) -> Any:
    from .operators.display import _vector_rgb

    row, col = _image_axes(field)
    rgb, record = _vector_rgb(field, float(high_percentile), bool(subtract_mean))
    ax.imshow(rgb, origin="upper", extent=_extent(row, col), interpolation="nearest")
    ax.set_xlabel(_axis_label(col))
    ax.set_ylabel(_axis_label(row))
    if scalebar:
        _scalebar(ax, col)
        ax.set_xticks([])
        ax.set_yticks([])
    note = ""
    if subtract_mean:
        mean = record.get("subtracted_mean", [0.0, 0.0])
        note = f"mean ({_num(mean[0])}, {_num(mean[1])}) {field.units} subtracted"
    _colour_wheel(ax, float(record["magnitude_at_full_value"]), field.units, note=note)
    if arrows:
        R, C = field.data.shape[1:]
        step = arrow_step or max(1, round(max(R, C) / 16))
        rr = np.arange(step // 2, R, step)
        cc = np.arange(step // 2, C, step)
        v = np.asarray(field.data, dtype=np.float64)
        if subtract_mean:
            v = v - np.nanmean(v, axis=(1, 2))[:, None, None]
        vr = v[0][np.ix_(rr, cc)]
        vc = v[1][np.ix_(rr, cc)]
        y = (rr - row.origin) * row.sampling
        x = (cc - col.origin) * col.sampling
        X, Y = np.meshgrid(x, y)
        # the y axis points down: +row vectors (vr > 0) point down on screen
        full = float(record["magnitude_at_full_value"]) or 1.0
        span = step * min(abs(row.sampling), abs(col.sampling))
        ax.quiver(
            X,
            Y,
            vc,
            vr,
            color="white",
            angles="xy",
            scale_units="xy",
            scale=full / span,
            pivot="middle",
            width=0.004,
        )
    return ax


def detector_geometry(result: Result) -> dict[str, Any] | None:
    """Return the annular geometry of a virtual-detector result, or ``None``.

    Parameters
    ----------
    result
        A result of ``virtual_bf``, ``virtual_abf``, ``virtual_adf`` or
        ``virtual_annular``.

    Returns
    -------
    dict or None
        ``center_px`` (row, col), ``inner``, ``outer`` and ``units`` of the
        radii, and ``detector_shape`` of the dataset it ran on; ``None`` for
        results that are not annular detectors.
    """
    p = result.provenance.parameters
    if result.provenance.operator not in _DETECTOR_OPERATORS:
        return None
    if "center_px" not in p or "outer" not in p:
        return None
    shape = result.provenance.dataset.get("shape")
    return {
        "name": result.name or result.provenance.operator,
        "center_px": [float(v) for v in p["center_px"]],
        "inner": float(p.get("inner") or 0.0),
        "outer": float(p["outer"]),
        "units": str(p.get("radii_units", "px")),
        "detector_shape": None if shape is None else [int(s) for s in shape[-2:]],
    }


def _draw_detectors(ax: Any, pattern: DiffractionImage, detectors: Iterable[Result]) -> list[str]:
    """Draw each detector's rings on a pattern's axes; return notes on those not drawn."""
    from matplotlib.patches import Ellipse

    row, col = _image_axes(pattern)
    notes: list[str] = []
    handles = []
    for i, det in enumerate(detectors):
        geo = detector_geometry(det)
        if geo is None:
            notes.append(f"{det.name or det.kind}: not a virtual detector")
            continue
        if geo["detector_shape"] is not None and tuple(geo["detector_shape"]) != pattern.shape:
            notes.append(f"{geo['name']}: computed on a detector of another shape")
            continue
        units = geo["units"]
        inner, outer = geo["inner"], geo["outer"]
        if units == "px":
            scale_r, scale_c = row.sampling, col.sampling
            if row.units != "px" and math.isclose(row.sampling, col.sampling, rel_tol=1e-9):
                # the legend speaks the axes' unit: radii given in px are shown in it too
                units = row.units
                inner, outer = inner * row.sampling, outer * row.sampling
                scale_r = scale_c = 1.0
        elif units == row.units == col.units:
            scale_r = scale_c = 1.0
        else:
            notes.append(f"{geo['name']}: radii in {units}, pattern in {row.units}")
            continue
        cy = (geo["center_px"][0] - row.origin) * row.sampling
        cx = (geo["center_px"][1] - col.origin) * col.sampling
        color = _OVERLAY_COLORS[i % len(_OVERLAY_COLORS)]
        label = f"{geo['name']}: {_ring_text(inner, outer, units)}"
        first = True
        for radius in (inner, outer):
            if radius <= 0 or not math.isfinite(radius):
                continue
            patch = Ellipse(
                (cx, cy),
                2 * radius * scale_c,
                2 * radius * scale_r,
                fill=False,
                edgecolor=color,
                linewidth=1.4,
                label=label if first else None,
            )
            ax.add_patch(patch)
            if first:
                handles.append(patch)
            first = False
        ax.plot([cx], [cy], marker="+", color=color, markersize=8)
    if handles:
        ax.legend(handles=handles, loc="upper left", fontsize=7, framealpha=0.6)
    return notes


def plot_result(
    result: Result,
    *,
    ax: Any = None,
    detectors: Iterable[Result] = (),
    arrows: bool = False,
    arrow_step: int | None = None,
    subtract_mean: bool = False,
    scalebar: bool = False,
    cmap: str | None = None,
    log: bool | None = None,
    low_percentile: float = 0.5,
    high_percentile: float = 99.5,
    title: str | None = None,
) -> Any:
    """Draw one result with calibrated axes, a colorbar with units and a title.

    Parameters
    ----------
    result
        A :class:`~quantem_flow.results.Result`.
    ax
        A matplotlib ``Axes`` to draw in (two, as a sequence, for a
        ``ComplexObject``); default: a new figure.
    detectors
        For a ``DiffractionImage``: virtual-detector results whose rings are
        drawn on the pattern (radii in px or in the pattern's units).
    arrows
        For a ``VectorField``: draw arrows over the colour image.
    arrow_step
        Scan positions between arrows (default: about 16 arrows across).
    subtract_mean
        For a ``VectorField``: remove the mean vector before colouring.
    scalebar
        Draw a scale bar instead of ticks on scan images.
    cmap
        Colormap (default grey for scan images, ``inferno`` for patterns).
    log
        Log colour scale; default true for diffraction patterns only.
    low_percentile, high_percentile
        Contrast limits (display only; the data are unchanged).
    title
        Replaces :func:`figure_title`.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn in.
    """
    if not isinstance(result, Result):
        raise ParameterError(
            f"plot_result draws quantem_flow results, got {type(result).__name__}; "
            "wrap arrays with matplotlib directly"
        )
    heading = figure_title(result) if title is None else title
    if isinstance(result, ComplexObject):
        fig, (a_amp, a_phase) = _new_axes(2, ax)
        row, col = _image_axes(result)
        _draw_image(
            a_amp,
            result.amplitude,
            row,
            col,
            cmap=cmap or "gray",
            label=f"amplitude ({_unit_text(result.units)})",
            low_percentile=low_percentile,
            high_percentile=high_percentile,
            scalebar=scalebar,
        )
        _draw_image(
            a_phase,
            result.phase,
            row,
            col,
            cmap=cmap or "gray",
            label="phase (rad)",
            low_percentile=low_percentile,
            high_percentile=high_percentile,
            scalebar=scalebar,
        )
        a_amp.set_title("amplitude", fontsize=9)
        a_phase.set_title("phase", fontsize=9)
        if ax is None:
            fig.suptitle(heading, fontsize=10)
        else:
            a_amp.set_title(f"{heading}\namplitude", fontsize=9)
        return fig
    fig, (target,) = _new_axes(1, ax, width=5.6 if isinstance(result, VectorField) else 4.8)
    if isinstance(result, VectorField):
        _plot_vector(
            result,
            target,
            arrows=arrows,
            arrow_step=arrow_step,
            subtract_mean=subtract_mean,
            high_percentile=high_percentile,
            scalebar=scalebar,
        )
    else:
        row, col = _image_axes(result)
        is_pattern = isinstance(result, DiffractionImage)
        label = result.name or ("value" if not is_pattern else "intensity")
        if isinstance(result, PhaseImage):
            label = "phase"
        _draw_image(
            target,
            result.data,
            row,
            col,
            cmap=cmap or ("inferno" if is_pattern else "gray"),
            label=f"{label} ({_unit_text(result.units)})",
            low_percentile=low_percentile,
            high_percentile=high_percentile,
            log=is_pattern if log is None else bool(log),
            scalebar=scalebar and not is_pattern,
            measured_from=pattern_origin_text(result) if is_pattern else "",
        )
        if is_pattern:
            assert isinstance(result, DiffractionImage)
            notes = _draw_detectors(target, result, detectors)
            if notes:
                target.text(
                    0.01,
                    0.01,
                    "not drawn: " + "; ".join(notes),
                    transform=target.transAxes,
                    fontsize=6,
                    color="white",
                    va="bottom",
                )
    target.set_title(heading, fontsize=9)
    return fig


def _panels(result: Result) -> int:
    return 2 if isinstance(result, ComplexObject) else 1


def plot(
    *results: Result,
    ncols: int | None = None,
    arrows: bool = False,
    scalebar: bool = False,
    panel_size: float = 4.4,
) -> Any:
    """Draw several results in one figure, one panel each (two for a complex object).

    A diffraction pattern in the panel shows the rings of every virtual
    detector among ``results`` that ran on a detector of its shape.

    Parameters
    ----------
    *results
        Typed results (``ScanImage``, ``VectorField``, ``PhaseImage``,
        ``DiffractionImage``, ``ComplexObject``).
    ncols
        Panels per row (default: up to 3).
    arrows
        Draw arrows on vector fields.
    scalebar
        Scale bars instead of ticks on scan images.
    panel_size
        Height of a panel in inches (width is 1.15 times that).

    Returns
    -------
    matplotlib.figure.Figure
        The panel figure.
    """
    import matplotlib.pyplot as plt

    if not results:
        raise ParameterError("plot needs at least one result, e.g. qf.plot(bf, adf, com)")
    for r in results:
        if not isinstance(r, Result):
            raise ParameterError(f"plot draws quantem_flow results, got {type(r).__name__}")
    n = sum(_panels(r) for r in results)
    cols = ncols or min(3, n)
    if cols < 1:
        raise ParameterError(f"ncols must be >= 1, got {ncols!r}")
    cols = max(cols, max(_panels(r) for r in results))
    # place results in rows so that a complex object's two panels stay on one row
    rows_of: list[list[Result]] = [[]]
    used = 0
    for r in results:
        k = _panels(r)
        if used + k > cols:
            rows_of.append([])
            used = 0
        rows_of[-1].append(r)
        used += k
    fig = plt.figure(
        figsize=(panel_size * 1.3 * cols, panel_size * len(rows_of)), layout="constrained"
    )
    grid = fig.add_gridspec(len(rows_of), cols)
    detectors = [r for r in results if detector_geometry(r) is not None]
    for i, row_results in enumerate(rows_of):
        j = 0
        for r in row_results:
            k = _panels(r)
            axes = [fig.add_subplot(grid[i, j + m]) for m in range(k)]
            plot_result(
                r,
                ax=axes if k > 1 else axes[0],
                detectors=detectors if isinstance(r, DiffractionImage) else (),
                arrows=arrows,
                scalebar=scalebar,
            )
            j += k
    return fig


def write_figures(
    results: Mapping[str, Result],
    folder: str | os.PathLike[str],
    *,
    overview: str | None = "overview.png",
    overwrite: bool = False,
    dpi: int = 150,
) -> dict[str, Path]:
    """Write one figure per result (``<name>.png``) and an overview panel.

    Parameters
    ----------
    results
        ``{name: result}``, e.g. what :func:`~quantem_flow.pipeline.run_pipeline`
        returns.
    folder
        Where the PNG files go (created).
    overview
        File name of the panel of every result (``None``: none).
    overwrite
        Replace existing files; otherwise an existing file raises before any
        figure is written.
    dpi
        Resolution of the PNG files.

    Returns
    -------
    dict of str to pathlib.Path
        ``{name: path}`` (the overview under the key ``"overview"``).
    """
    import matplotlib.pyplot as plt

    out = Path(folder).expanduser().absolute()
    paths = figure_paths(results, out, overview=overview)
    if not overwrite:
        existing = [str(p) for p in paths.values() if p.exists()]
        if existing:
            raise FileExistsError(
                f"figure file(s) already exist: {existing[:4]}; pass overwrite=True "
                "(--overwrite) or choose another folder"
            )
    out.mkdir(parents=True, exist_ok=True)
    detectors = [r for r in results.values() if detector_geometry(r) is not None]
    for name, result in results.items():
        fig = plot_result(
            result,
            detectors=detectors if isinstance(result, DiffractionImage) else (),
            title=None if result.name == name else f"{name} / {figure_title(result)}",
        )
        try:
            fig.savefig(paths[name], dpi=dpi, metadata=_png_metadata())
        finally:
            plt.close(fig)
    if overview is not None and results:
        fig = plot(*results.values())
        try:
            fig.savefig(paths["overview"], dpi=dpi, metadata=_png_metadata())
        finally:
            plt.close(fig)
    return paths


def figure_paths(
    results: Mapping[str, Any] | Iterable[str],
    folder: str | os.PathLike[str],
    *,
    overview: str | None = "overview.png",
) -> dict[str, Path]:
    """Return the files :func:`write_figures` would write (to check them early).

    Parameters
    ----------
    results
        Output names (or a mapping whose keys are the names).
    folder
        The figures' folder.
    overview
        File name of the overview panel, or ``None``.

    Returns
    -------
    dict of str to pathlib.Path
        ``{name: path}``, the overview under ``"overview"``.
    """
    out = Path(folder).expanduser().absolute()
    names = list(results)
    paths = {name: out / f"{name}.png" for name in names}
    if overview is not None:
        if Path(overview).suffix.lower() not in FIGURE_SUFFIXES:
            raise ParameterError(f"overview must end in one of {FIGURE_SUFFIXES}, got {overview!r}")
        if "overview" in paths:
            raise ParameterError(
                "an output named 'overview' clashes with the overview figure; rename the output"
            )
        paths["overview"] = out / overview
    return paths


def _png_metadata() -> dict[str, str]:
    """PNG text chunks that mark a figure as quantem-flow's (so --overwrite may replace it)."""
    from .io.results_store import _package_version

    return {"Software": f"quantem-flow {_package_version()}"}


register_plotter(plot_result)
