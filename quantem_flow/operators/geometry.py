"""Detector geometry: distances, annuli and where the centre comes from."""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..calibration import Calibration, normalize_units
from ..errors import (
    ImplausibleParameterError,
    ImplausibleParameterWarning,
    ParameterError,
    ShapeError,
)
from .base import PlanContext

__all__ = [
    "MIN_ON_DETECTOR",
    "DetectorReach",
    "allow_implausible_note",
    "annulus",
    "check_region_on_detector",
    "detector_distance",
    "detector_reach",
    "on_detector_fraction",
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
        ``(k_r, k_c)`` float64 distances in the units of ``scale``, read-only:
        the same geometry is asked by every operator of every pass (a pass of
        BF, ADF and CoM asked it four times), so the last few are kept.
    """
    return _distance(
        (int(shape[0]), int(shape[1])),
        (float(center[0]), float(center[1])),
        (float(scale[0]), float(scale[1])),
    )


@functools.lru_cache(maxsize=16)
def _distance(
    shape: tuple[int, int], center: tuple[float, float], scale: tuple[float, float]
) -> np.ndarray:
    r = (np.arange(shape[0], dtype=np.float64) - center[0]) * scale[0]
    c = (np.arange(shape[1], dtype=np.float64) - center[1]) * scale[1]
    d = np.asarray(np.hypot(r[:, None], c[None, :]))
    d.setflags(write=False)
    return d


def annulus(
    shape: tuple[int, int],
    center: tuple[float, float],
    inner: float,
    outer: float,
    scale: tuple[float, float],
) -> np.ndarray:
    """Return the boolean annulus ``inner <= d < outer`` (a disk when inner is 0).

    The half-open rule means adjacent annuli never share a pixel.  LiberTEM
    counts the other side of each boundary (``inner < d <= outer``); the two
    differ only on pixels exactly at a radius, as at integer centres
    (docs/conventions.md: 12 pixels for a 10 px disk at (64, 64)).
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


# -- plausibility: how much of a requested region lies on the detector ----------------------

#: Least share of a requested detector region that must lie on the detector
#: (see :func:`on_detector_fraction`); below it the geometry is refused unless
#: ``allow_implausible=True``.
MIN_ON_DETECTOR = 0.5

_N_RADII = 512
_N_ANGLES = 2048


@dataclasses.dataclass(frozen=True)
class DetectorReach:
    """How far a detector reaches from a centre, in the units of a request.

    Attributes
    ----------
    farthest
        Distance from the centre to the farthest pixel centre (a corner).
    nearest_edge
        Radius of the largest circle around the centre whose pixels all lie
        on the detector: the distance to the outermost pixel centre on the
        nearest side (0 when the centre lies outside the detector).
    units
        Units of both distances (``px``, ``mrad`` or ``1/Å``).
    center_px
        The centre ``(row, col)`` in pixels.
    """

    farthest: float
    nearest_edge: float
    units: str
    center_px: tuple[float, float]

    def describe(self) -> str:
        """Return one sentence for error messages."""
        return (
            f"this detector reaches {self.farthest:.3g} {self.units} from the centre "
            f"({self.center_px[0]:.4g}, {self.center_px[1]:.4g}) px at its farthest pixel "
            f"(corner) and {self.nearest_edge:.3g} {self.units} at its nearest edge"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "farthest": self.farthest,
            "nearest_edge": self.nearest_edge,
            "units": self.units,
            "center_px": list(self.center_px),
            "definition": "distances from the centre to the farthest pixel centre and to the "
            "outermost pixel centre on the nearest side",
        }


def detector_reach(
    shape: tuple[int, int], center: tuple[float, float], scale: tuple[float, float], units: str
) -> DetectorReach:
    """Return how far the detector reaches from ``center`` (see :class:`DetectorReach`).

    Parameters
    ----------
    shape
        Detector ``(k_r, k_c)``.
    center
        ``(row, col)`` in pixels.
    scale
        Size of one pixel ``(row, col)`` in ``units``.
    units
        The units of ``scale``, recorded.

    Returns
    -------
    DetectorReach
        The farthest pixel and the nearest edge, in ``units``.
    """
    far_r = max(abs(center[0]), abs(shape[0] - 1 - center[0])) * scale[0]
    far_c = max(abs(center[1]), abs(shape[1] - 1 - center[1])) * scale[1]
    near = min(
        center[0] * scale[0],
        (shape[0] - 1 - center[0]) * scale[0],
        center[1] * scale[1],
        (shape[1] - 1 - center[1]) * scale[1],
    )
    return DetectorReach(
        farthest=float(math.hypot(far_r, far_c)),
        nearest_edge=float(max(near, 0.0)),
        units=units,
        center_px=(float(center[0]), float(center[1])),
    )


def on_detector_fraction(
    shape: tuple[int, int],
    center: tuple[float, float],
    scale: tuple[float, float],
    inner: float,
    outer: float,
) -> float:
    """Return the share of the region ``inner <= d < outer`` that lies on the detector.

    The detector is the rectangle its pixels cover (pixel ``i`` spans
    ``[i - 0.5, i + 0.5)``).  For a finite ``outer`` the share is of the
    annulus's (or disk's) AREA; for ``outer = inf`` ("every pixel beyond
    inner", to the detector's edge) it is the share of the CIRCUMFERENCE of
    the circle ``d = inner`` (1 when ``inner`` is 0: the whole detector).
    Computed on a polar grid (512 radii, 2048 angles), so it does not depend
    on the pixel discretisation and reads no data.

    Parameters
    ----------
    shape
        Detector ``(k_r, k_c)``.
    center
        ``(row, col)`` in pixels.
    scale
        Size of one pixel ``(row, col)`` in the units of the radii.
    inner, outer
        Radii, ``0 <= inner < outer`` (``outer`` may be ``math.inf``).

    Returns
    -------
    float
        A share in ``[0, 1]``.

    A region whose outer circle lies inside the detector is 1 at once (every
    grid point is on it); others are computed once per distinct geometry
    (cached: the grid costs ~12 ms, paid before a pass starts).
    """
    args = (
        (int(shape[0]), int(shape[1])),
        (float(center[0]), float(center[1])),
        (float(scale[0]), float(scale[1])),
        float(inner),
        float(outer),
    )
    (k_r, k_c), (c_r, c_c), (s_r, s_c), inner, outer = args
    reach = inner if math.isinf(outer) else outer
    if (
        reach <= (c_r + 0.5) * s_r
        and reach < (k_r - 0.5 - c_r) * s_r
        and reach <= (c_c + 0.5) * s_c
        and reach < (k_c - 0.5 - c_c) * s_c
    ):
        return 1.0
    return _polar_fraction(*args)


@functools.lru_cache(maxsize=256)
def _polar_fraction(
    shape: tuple[int, int],
    center: tuple[float, float],
    scale: tuple[float, float],
    inner: float,
    outer: float,
) -> float:
    lo_r = (-0.5 - center[0]) * scale[0]
    hi_r = (shape[0] - 0.5 - center[0]) * scale[0]
    lo_c = (-0.5 - center[1]) * scale[1]
    hi_c = (shape[1] - 0.5 - center[1]) * scale[1]
    theta = (np.arange(_N_ANGLES, dtype=np.float64) + 0.5) * (2 * math.pi / _N_ANGLES)
    sin, cos = np.sin(theta), np.cos(theta)

    def on(radii: np.ndarray) -> np.ndarray:
        y = radii[:, None] * sin[None, :]
        x = radii[:, None] * cos[None, :]
        return np.asarray(((y >= lo_r) & (y < hi_r) & (x >= lo_c) & (x < hi_c)).mean(axis=1))

    if math.isinf(outer):
        if inner <= 0:
            return 1.0
        return float(on(np.array([float(inner)]))[0])
    edges = np.linspace(float(inner), float(outer), _N_RADII + 1)
    mid = (edges[:-1] + edges[1:]) / 2
    return float((on(mid) * mid).sum() / mid.sum())


def _fmt(value: float) -> str:
    return "math.inf" if math.isinf(value) else f"{value:.4g}"


def check_region_on_detector(
    shape: tuple[int, int],
    center: tuple[float, float],
    scale: tuple[float, float],
    units: str,
    *,
    inner: float,
    outer: float,
    operator: str,
    inner_name: str | None,
    outer_name: str,
    allow_implausible: bool,
    measured: str = "",
    alternatives: Sequence[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """Refuse a detector region that lies mostly off the detector.

    The rule: at least :data:`MIN_ON_DETECTOR` (half) of the requested
    region must lie on the detector, as measured by
    :func:`on_detector_fraction` (area for a finite ``outer``; for
    ``outer = inf`` the circle ``d = inner``).  Nothing is read: the detector
    shape, the centre and the calibration are known at plan time.

    Parameters
    ----------
    shape, center, scale
        Detector ``(k_r, k_c)``, centre ``(row, col)`` px, pixel size in ``units``.
    units
        Units of the radii (``px``, ``mrad``, ``1/Å``).
    inner, outer
        The region ``inner <= d < outer``.
    operator
        The operator's name, for the message.
    inner_name, outer_name
        The parameter names of the radii (``inner_name=None`` for a disk).
    allow_implausible
        Compute it anyway: return a note and warn instead of raising.
    measured
        A sentence about a measured value (the probe radius), or ``""``.
    alternatives
        More fixes to offer (``"radius='auto'"``...).

    Returns
    -------
    tuple
        ``(record, notes)``: the record goes into the provenance's parameters
        (``plausibility``), the notes (a non-empty list only when an
        implausible region was allowed) into its notes.

    Raises
    ------
    ImplausibleParameterError
        When the region is mostly off the detector and ``allow_implausible``
        is False.
    """
    reach = detector_reach(shape, center, scale, units)
    fraction = on_detector_fraction(shape, center, scale, inner, outer)
    plausible = fraction >= MIN_ON_DETECTOR
    record: dict[str, Any] = {
        "on_detector_fraction": fraction,
        "minimum": MIN_ON_DETECTOR,
        "rule": "share of the region's area on the detector (for outer = inf: of the circle "
        "d = inner) must be >= minimum",
        "reach": reach.to_dict(),
        "plausible": plausible,
    }
    if plausible:
        return record, []
    edge = reach.nearest_edge
    if inner_name is None:
        what = f"disk {outer_name}={_fmt(outer)} {units}"
    else:
        what = f"annulus {inner_name}={_fmt(inner)} <= d < {outer_name}={_fmt(outer)} {units}"
    inner_off = (
        inner_name is not None
        and inner > 0
        and on_detector_fraction(shape, center, scale, inner, math.inf) < MIN_ON_DETECTOR
    )
    if inner_off:
        assert inner_name is not None
        fix = f"{inner_name} < {edge:.3g} {units} (the nearest edge)"
        at_fault: tuple[str, ...] = (inner_name,)
        if not math.isinf(outer):
            fix += f" with {outer_name}=math.inf (every pixel beyond {inner_name})"
            at_fault = (inner_name, outer_name)
        fixes = [fix]
    else:
        fixes = [f"{outer_name} <= {edge:.3g} {units} (the nearest edge)"]
        if inner_name is not None:
            fixes.append(f"{outer_name}=math.inf (every pixel beyond {inner_name})")
        at_fault = (outer_name,)
    fixes.extend(alternatives)
    reach_text = reach.describe()
    core = (
        f"{operator}: the {what} around ({center[0]:.4g}, {center[1]:.4g}) px lies mostly "
        f"off the {shape[0]} x {shape[1]} px detector: {fraction:.1%} of it is on the detector, "
        f"at least {MIN_ON_DETECTOR:.0%} is required. {reach_text[0].upper()}{reach_text[1:]}."
        f"{' ' + measured if measured else ''}"
    )
    if not allow_implausible:
        raise ImplausibleParameterError(
            f"{core} Give {' or '.join(fixes)}; or pass allow_implausible=True to compute it "
            "anyway (recorded in the provenance, with a warning)",
            parameters=at_fault,
        )
    return record, [allow_implausible_note(core)]


def allow_implausible_note(message: str) -> str:
    """Warn that an implausible parameter was allowed and return the provenance note."""
    note = f"implausible parameters allowed (allow_implausible=True): {message}"
    warnings.warn(note, ImplausibleParameterWarning, stacklevel=4)
    return note
