"""Virtual detectors: BF, ABF, ADF, annular and arbitrary masks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..dataset import Dataset4D
from ..errors import ParameterError
from ..provenance import array_identity
from ..results import ScanImage
from .base import (
    ChunkOperator,
    ChunkPlan,
    LazyResult,
    PassOutputs,
    PlanContext,
    make_provenance,
    weight_key,
)
from .geometry import (
    annulus,
    check_region_on_detector,
    detector_reach,
    pixel_scale,
    resolve_center,
    resolve_mask,
    resolve_probe,
)
from .probe import ProbeEstimate

__all__ = [
    "VirtualImage",
    "virtual_abf",
    "virtual_adf",
    "virtual_annular",
    "virtual_bf",
    "virtual_image",
    "virtual_mask",
]

Radius = float | str

#: Automatic radii, as multiples of the probe radius: (inner, outer).
AUTO_RADII: dict[str, tuple[float, float]] = {
    "bf": (0.0, 1.0),
    "abf": (0.5, 1.0),
    "adf": (1.5, math.inf),
}


def value_units(ds: Dataset4D) -> str:
    """Return the unit of summed detector values: counts for integer data."""
    return "counts" if ds.dtype.kind in "ui" else "intensity"


class VirtualImage(ChunkOperator):
    """Sum of each frame over a detector region or weight map.

    Parameters
    ----------
    detector
        ``"bf"``, ``"abf"``, ``"adf"``, ``"annular"`` or ``"mask"``.
    inner, outer
        Radii in ``units`` (``"auto"`` derives them from the probe radius,
        see :data:`AUTO_RADII`); pixels with ``inner <= d < outer`` count
        (LiberTEM counts ``inner < d <= outer``: docs/conventions.md).
    units
        ``"px"``, ``"mrad"`` or ``"1/Å"``; calibrated units need a calibrated
        detector.
    center
        See :func:`~quantem_flow.operators.geometry.resolve_center`.
    mask
        For ``detector="mask"``: a ``(k_r, k_c)`` boolean mask or real
        weight map.
    probe
        A probe estimate to use instead of finding one.
    allow_implausible
        Compute a region that lies mostly off the detector anyway (see
        :func:`~quantem_flow.operators.geometry.check_region_on_detector`:
        at least half of the region must be on the detector); recorded in
        the provenance (parameters and a note) and warned about.

    Notes
    -----
    Plausibility is checked at plan time from the detector shape, the centre
    and the calibration (nothing is read): an annulus or disk with less than
    half of its area on the detector, or, with ``outer = inf``, an inner
    circle mostly off the detector, raises
    :class:`~quantem_flow.errors.ImplausibleParameterError` naming the
    detector's reach and the value to use.  A user mask is on the detector
    by construction and is not checked.
    """

    name: ClassVar[str] = "virtual_image"
    scan_local: ClassVar[bool] = True

    def __init__(
        self,
        *,
        detector: str,
        inner: Radius = 0.0,
        outer: Radius = math.inf,
        units: str = "px",
        center: str | Sequence[float] = "auto",
        mask: np.ndarray | None = None,
        probe: ProbeEstimate | None = None,
        allow_implausible: bool = False,
    ):
        if detector not in ("bf", "abf", "adf", "annular", "mask"):
            raise ParameterError(
                f"detector must be bf, abf, adf, annular or mask, got {detector!r}"
            )
        if detector == "mask" and mask is None:
            raise ParameterError("detector='mask' needs mask=(k_r, k_c) array")
        if detector != "mask" and mask is not None:
            raise ParameterError(f"mask= is only for detector='mask', not {detector!r}")
        for label, value in (("inner", inner), ("outer", outer)):
            if isinstance(value, str):
                if value != "auto" or detector not in AUTO_RADII:
                    raise ParameterError(
                        f"{label}={value!r}: 'auto' radii exist for bf, abf and adf only"
                    )
            elif not (float(value) >= 0):
                raise ParameterError(f"{label} must be >= 0 or 'auto', got {value!r}")
        self.detector = detector
        self.inner = inner
        self.outer = outer
        self.units = units
        self.center = center
        self.mask = mask
        self.probe = probe
        if not isinstance(allow_implausible, (bool, np.bool_)):
            raise ParameterError(
                f"allow_implausible must be True or False, got {allow_implausible!r}"
            )
        self.allow_implausible = bool(allow_implausible)

    def parameters(self) -> dict[str, Any]:
        """Parameters as given."""
        p: dict[str, Any] = {"detector": self.detector, "units": self.units}
        if self.detector == "mask":
            assert self.mask is not None
            p["mask"] = array_identity(np.asarray(self.mask))
        else:
            p.update(inner=self.inner, outer=self.outer, center=_as_json(self.center))
            p["allow_implausible"] = self.allow_implausible
        return p

    def validate(self, ds: Dataset4D) -> None:
        """Check units against the calibration and the mask against the detector."""
        if self.detector == "mask":
            resolve_mask(self.mask, ds.detector_shape)
        else:
            pixel_scale(self.units, ds.calibration)

    def _weights(self, ctx: PlanContext) -> tuple[np.ndarray, dict[str, Any], list[str]]:
        ds = ctx.dataset
        if self.detector == "mask":
            w = resolve_mask(self.mask, ds.detector_shape)
            return w, {"mask": array_identity(np.asarray(self.mask))}, []
        scale, units = pixel_scale(self.units, ds.calibration)
        center, record = resolve_center(self.center, ctx, self.probe)
        radii: list[float] = []
        for i, value in enumerate((self.inner, self.outer)):
            if value == "auto":
                factor = AUTO_RADII[self.detector][i]
                label = ("inner", "outer")[i]
                if math.isinf(factor):  # to the detector edge: no probe needed
                    radii.append(math.inf)
                    record[f"{label}_rule"] = "detector edge (every pixel beyond inner)"
                    continue
                est = resolve_probe(ctx, self.probe)
                record["probe"] = est.to_dict()
                radii.append(factor * est.radius * math.sqrt(scale[0] * scale[1]))
                record[f"{label}_rule"] = f"{factor} x probe radius"
            else:
                radii.append(float(value))
        inner, outer = radii
        w = annulus(ds.detector_shape, center, inner, outer, scale).astype(np.float64)
        if not w.any():
            reach = detector_reach(ds.detector_shape, center, scale, units)
            raise ParameterError(
                f"the {self.detector} detector [{inner:.4g}, {outer:.4g}) {units} around "
                f"{center} selects no pixel of the {ds.detector_shape} detector ({reach.describe()}"
                "); check the radii, units and centre"
            )
        measured, alternatives = "", []
        if "probe" in record:
            probe_px = float(record["probe"]["radius"])
            s = math.sqrt(scale[0] * scale[1])
            measured = f"The measured probe radius is {probe_px:.3g} px"
            measured += f" ({probe_px * s:.3g} {units})." if units != "px" else "."
        if self.detector == "bf":
            alternatives.append("radius='auto' (the probe radius measured from the data)")
        plausibility, notes = check_region_on_detector(
            ds.detector_shape,
            center,
            scale,
            units,
            inner=inner,
            outer=outer,
            operator=f"virtual_{self.detector}",
            inner_name=None if self.detector == "bf" else "inner",
            outer_name="radius" if self.detector == "bf" else "outer",
            allow_implausible=self.allow_implausible,
            measured=measured,
            alternatives=alternatives,
        )
        record.update(
            inner=inner,
            outer=outer,
            radii_units=units,
            center_px=list(center),
            pixel_scale=[float(scale[0]), float(scale[1])],
            rule="inner <= distance < outer",
            mask=array_identity(w.astype(bool)),
            allow_implausible=self.allow_implausible,
            plausibility=plausibility,
        )
        return w, record, notes

    def plan(self, ctx: PlanContext) -> ChunkPlan:
        """Resolve the detector geometry into one weight map."""
        ds = ctx.dataset
        w, record, notes = self._weights(ctx)
        key = weight_key(w)
        binary = bool(np.all((w == 0) | (w == 1)))
        exact = binary and ds.dtype.kind in "ui"
        params = {"detector": self.detector, **record, "n_pixels": int(np.count_nonzero(w))}

        def finalize(out: PassOutputs) -> ScanImage:
            values = out.per_frame[key]
            data = np.rint(values).astype(np.int64) if exact else values
            return ScanImage(
                data=data,
                units=value_units(ds),
                axes=ds.calibration.scan_axes(ds.scan_shape),
                provenance=make_provenance(
                    ds,
                    operator=f"virtual_{self.detector}"
                    if self.detector != "mask"
                    else "virtual_mask",
                    parameters=params,
                    outputs=out,
                    accumulation_dtype="float64 (integer-valued, exact below 2**53)"
                    if exact
                    else "float64",
                    notes=notes,
                ),
            )

        radial: dict[str, tuple[float, float, float, float]] = {}
        if self.detector != "mask":
            (cr, cc), (sr, sc) = record["center_px"], record["pixel_scale"]
            radial[key] = (float(cr), float(cc), float(sr), float(sc))
        return ChunkPlan(
            weights={key: w},
            want_sum=False,
            want_max=False,
            parameters=params,
            finalize=finalize,
            radial=radial,
        )


def _as_json(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    return value


def _lazy(ds: Dataset4D, op: VirtualImage, name: str | None, default: str) -> LazyResult:
    if not isinstance(ds, Dataset4D):
        raise ParameterError(
            f"expected a Dataset4D (from quantem_flow.open), got {type(ds).__name__}"
        )
    return LazyResult(op, dataset=ds, name=name or default)


def virtual_bf(
    ds: Dataset4D,
    *,
    radius: Radius = "auto",
    units: str = "px",
    center: str | Sequence[float] = "auto",
    probe: ProbeEstimate | None = None,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    """Bright-field image: counts within ``radius`` of the centre.

    Parameters
    ----------
    ds
        The dataset.
    radius
        Disk radius in ``units``, or ``"auto"`` (the probe radius, found
        from the mean pattern and recorded).
    units
        ``"px"``, ``"mrad"`` or ``"1/Å"``.
    center
        ``"auto"``, ``"probe"``, ``"calibration"`` or ``(row, col)`` pixels.
    probe
        A precomputed :class:`ProbeEstimate`.
    allow_implausible
        Compute a region lying mostly off the detector anyway (less than
        half of it on the detector is refused with
        :class:`~quantem_flow.errors.ImplausibleParameterError`); recorded in
        the provenance and warned about.
    name
        Label of the result (default ``"bf"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ScanImage`.
    """
    op = VirtualImage(
        detector="bf",
        inner=0.0,
        outer=radius,
        units=units,
        center=center,
        probe=probe,
        allow_implausible=allow_implausible,
    )
    return _lazy(ds, op, name, "bf")


def virtual_abf(
    ds: Dataset4D,
    *,
    inner: Radius = "auto",
    outer: Radius = "auto",
    units: str = "px",
    center: str | Sequence[float] = "auto",
    probe: ProbeEstimate | None = None,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    """Annular bright-field image (auto: half the probe radius to the probe radius).

    Parameters
    ----------
    ds
        The dataset.
    inner
        Inner radius in ``units`` (included), or ``"auto"``: half the probe
        radius (found from the mean pattern and recorded).
    outer
        Outer radius in ``units`` (excluded), or ``"auto"``: the probe radius.
    units
        ``"px"``, ``"mrad"`` or ``"1/Å"`` (calibrated units need a
        calibrated detector; uncalibrated pixels are never mrad).
    center
        ``"auto"``, ``"probe"``, ``"calibration"`` or ``(row, col)`` pixels.
    probe
        A precomputed :class:`ProbeEstimate`.
    allow_implausible
        Compute a region lying mostly off the detector anyway (less than
        half of it on the detector is refused with
        :class:`~quantem_flow.errors.ImplausibleParameterError`); recorded in
        the provenance and warned about.
    name
        Label of the result (default ``"abf"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ScanImage`.
    """
    op = VirtualImage(
        detector="abf",
        inner=inner,
        outer=outer,
        units=units,
        center=center,
        probe=probe,
        allow_implausible=allow_implausible,
    )
    return _lazy(ds, op, name, "abf")


def virtual_adf(
    ds: Dataset4D,
    *,
    inner: Radius = "auto",
    outer: Radius = "auto",
    units: str = "px",
    center: str | Sequence[float] = "auto",
    probe: ProbeEstimate | None = None,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    """Annular dark-field image (auto: 1.5 probe radii to the detector edge).

    Parameters
    ----------
    ds
        The dataset.
    inner
        Inner radius in ``units`` (included), or ``"auto"``: 1.5 probe radii
        (the probe radius found from the mean pattern and recorded).
    outer
        Outer radius in ``units`` (excluded), ``math.inf`` or ``"auto"``:
        every pixel beyond ``inner``.
    units
        ``"px"``, ``"mrad"`` or ``"1/Å"`` (calibrated units need a
        calibrated detector; uncalibrated pixels are never mrad).
    center
        ``"auto"``, ``"probe"``, ``"calibration"`` or ``(row, col)`` pixels.
    probe
        A precomputed :class:`ProbeEstimate`.
    allow_implausible
        Compute a region lying mostly off the detector anyway (less than
        half of it on the detector is refused with
        :class:`~quantem_flow.errors.ImplausibleParameterError`); recorded in
        the provenance and warned about.
    name
        Label of the result (default ``"adf"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ScanImage`.
    """
    op = VirtualImage(
        detector="adf",
        inner=inner,
        outer=outer,
        units=units,
        center=center,
        probe=probe,
        allow_implausible=allow_implausible,
    )
    return _lazy(ds, op, name, "adf")


def virtual_annular(
    ds: Dataset4D,
    *,
    inner: float,
    outer: float,
    units: str = "px",
    center: str | Sequence[float] = "auto",
    probe: ProbeEstimate | None = None,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    """Counts in the annulus ``inner <= d < outer`` around the centre.

    Half-open, so adjacent annuli share no pixel; LiberTEM's ring counts
    ``inner < d <= outer``, which differs on pixels exactly at a radius
    (docs/conventions.md).

    Parameters
    ----------
    ds
        The dataset.
    inner
        Inner radius in ``units`` (included).
    outer
        Outer radius in ``units`` (excluded); ``math.inf`` takes every pixel
        beyond ``inner``.
    units
        ``"px"``, ``"mrad"`` or ``"1/Å"`` (calibrated units need a
        calibrated detector; uncalibrated pixels are never mrad).
    center
        ``"auto"``, ``"probe"``, ``"calibration"`` or ``(row, col)`` pixels.
    probe
        A precomputed :class:`ProbeEstimate`.
    allow_implausible
        Compute a region lying mostly off the detector anyway (less than
        half of it on the detector is refused with
        :class:`~quantem_flow.errors.ImplausibleParameterError`); recorded in
        the provenance and warned about.
    name
        Label of the result (default ``"annular"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ScanImage`.
    """
    op = VirtualImage(
        detector="annular",
        inner=inner,
        outer=outer,
        units=units,
        center=center,
        probe=probe,
        allow_implausible=allow_implausible,
    )
    return _lazy(ds, op, name, "annular")


def virtual_mask(ds: Dataset4D, mask: np.ndarray, *, name: str | None = None) -> LazyResult:
    """Sum of each frame times an arbitrary ``(k_r, k_c)`` mask or weight map.

    Parameters
    ----------
    ds
        The dataset.
    mask
        Boolean mask or real weights, shaped like the detector as loaded.
    name
        Label of the result (default ``"mask"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ScanImage`.
    """
    resolve_mask(mask, ds.detector_shape)  # fail at build time, not on the cluster
    return _lazy(ds, VirtualImage(detector="mask", mask=np.asarray(mask)), name, "mask")


def virtual_image(
    ds: Dataset4D,
    *,
    detector: str,
    inner: Radius = 0.0,
    outer: Radius = math.inf,
    units: str = "px",
    center: str | Sequence[float] = "auto",
    mask: np.ndarray | None = None,
    probe: ProbeEstimate | None = None,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    """Any virtual detector by name (``bf``, ``abf``, ``adf``, ``annular``, ``mask``).

    Parameters are those of :class:`VirtualImage`; ``name`` labels the result
    (default: the detector name).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ScanImage`.
    """
    if mask is not None:
        resolve_mask(mask, ds.detector_shape)
    op = VirtualImage(
        detector=detector,
        inner=inner,
        outer=outer,
        units=units,
        center=center,
        mask=mask,
        probe=probe,
        allow_implausible=allow_implausible,
    )
    return _lazy(ds, op, name, detector)
