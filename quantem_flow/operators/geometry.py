"""Detector geometry: distances, annuli and where the centre comes from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..calibration import Calibration, normalize_units
from ..errors import ParameterError, ShapeError
from .base import PlanContext

__all__ = [
    "annulus",
    "detector_distance",
    "pixel_scale",
    "resolve_center",
    "resolve_mask",
    "resolve_probe",
]


def detector_distance(
    shape: tuple[int, int], center: tuple[float, float], scale: tuple[float, float]
) -> np.ndarray:
    """Return the distance of every pixel centre from ``center``.

    Parameters
    ----------
    shape
        Detector ``(k_r, k_c)``.
    center
        ``(row, col)`` in pixels.
    scale
        Size of one pixel ``(row, col)`` in the distance's units.

    Returns
    -------
    numpy.ndarray
        ``(k_r, k_c)`` float64 distances in the units of ``scale``.
    """
    r = (np.arange(shape[0], dtype=np.float64) - center[0]) * scale[0]
    c = (np.arange(shape[1], dtype=np.float64) - center[1]) * scale[1]
    return np.asarray(np.hypot(r[:, None], c[None, :]))


def annulus(
    shape: tuple[int, int],
    center: tuple[float, float],
    inner: float,
    outer: float,
    scale: tuple[float, float],
) -> np.ndarray:
    """Return the boolean annulus ``inner <= d < outer`` (a disk when inner is 0).

    The half-open rule means adjacent annuli never share a pixel.
    """
    if not (0 <= inner < outer):
        raise ParameterError(
            f"detector radii must satisfy 0 <= inner < outer, got inner={inner}, outer={outer}"
        )
    d = detector_distance(shape, center, scale)
    return np.asarray((d >= inner) & (d < outer))


def resolve_probe(ctx: PlanContext, probe: Any) -> Any:
    """Return ``probe`` when given, else the context's estimate for the dataset."""
    return probe if probe is not None else ctx.probe()


def resolve_center(
    center: str | Sequence[float], ctx: PlanContext, probe: Any = None
) -> tuple[tuple[float, float], dict[str, Any]]:
    """Resolve a detector centre parameter to pixels and say where it came from.

    Parameters
    ----------
    center
        ``"auto"`` (the calibration's ``detector_origin`` when set, else the
        probe found from the mean pattern), ``"probe"`` (always find it),
        ``"calibration"`` (require the calibration's origin) or explicit
        ``(row, col)`` pixels.
    ctx
        The planning context.
    probe
        A :class:`~quantem_flow.operators.probe.ProbeEstimate` to use instead
        of finding one.

    Returns
    -------
    tuple
        ``((row, col), record)`` where ``record`` is for provenance.
    """
    cal: Calibration = ctx.dataset.calibration
    if isinstance(center, str):
        if center == "auto":
            if cal.detector_origin is not None:
                return cal.detector_origin, {"center_from": "calibration.detector_origin"}
            center = "probe"
        if center == "probe":
            est = resolve_probe(ctx, probe)
            return est.center, {"center_from": "probe estimate", "probe": est.to_dict()}
        if center == "calibration":
            return cal.require_origin(), {"center_from": "calibration.detector_origin"}
        raise ParameterError(
            f"center must be 'auto', 'probe', 'calibration' or (row, col) pixels, got {center!r}"
        )
    try:
        r, c = (float(v) for v in center)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"center must be (row, col) pixels, got {center!r}") from exc
    if not (math.isfinite(r) and math.isfinite(c)):
        raise ParameterError(f"center must be finite, got {center!r}")
    return (r, c), {"center_from": "given"}


def resolve_mask(mask: Any, shape: tuple[int, int]) -> np.ndarray:
    """Validate a user detector mask or weight map and return it as float64."""
    m = np.asarray(mask)
    if m.shape != tuple(shape):
        raise ShapeError(
            f"mask shape {m.shape} does not match the detector shape {tuple(shape)} (k_r, k_c) "
            "of the dataset as loaded (after any crop or binning)"
        )
    if m.dtype.kind not in "biuf":
        raise ParameterError(f"mask must be boolean or real, got dtype {m.dtype}")
    w = m.astype(np.float64)
    if not np.all(np.isfinite(w)):
        raise ParameterError("mask holds NaN or infinite values")
    if not np.any(w):
        raise ParameterError("mask selects no detector pixel (all zero)")
    return w


def pixel_scale(units: str, cal: Calibration) -> tuple[tuple[float, float], str]:
    """Return the detector pixel size in ``units`` (raising if uncalibrated) and the unit."""
    u = normalize_units(units, kind="detector")
    return cal.detector_scale(u), u
