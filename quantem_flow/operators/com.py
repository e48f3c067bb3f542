"""Centre of mass of every diffraction pattern."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..dataset import Dataset4D
from ..errors import ParameterError
from ..provenance import array_identity
from ..results import VectorField
from .base import (
    ChunkOperator,
    ChunkPlan,
    LazyResult,
    PassOutputs,
    PlanContext,
    make_provenance,
    weight_key,
)
from .geometry import annulus, check_region_on_detector, pixel_scale, resolve_center
from .probe import ProbeEstimate

__all__ = ["CenterOfMass", "center_of_mass"]


class CenterOfMass(ChunkOperator):
    """Intensity-weighted mean detector position of each frame, from the centre.

    ``com_r = sum(I * (k_r - c_r)) / sum(I)`` over the pixels in the mask
    (and likewise for columns), then scaled to ``units``.  A frame whose
    masked sum is zero has no centre of mass: its vector is NaN and the
    count of such frames is recorded.

    Parameters
    ----------
    center
        Origin of the vectors: ``"auto"``, ``"probe"``, ``"calibration"`` or
        ``(row, col)`` pixels.
    mask_radius
        Only pixels with ``distance < mask_radius`` (in ``mask_units``) count;
        ``None`` uses the whole detector.
    mask_units
        Units of ``mask_radius``.
    units
        Units of the result: ``"auto"`` (the detector calibration's units),
        ``"px"``, ``"mrad"`` or ``"1/Å"``.
    probe
        A precomputed probe estimate.
    allow_implausible
        Compute with a mask disk lying mostly off the detector anyway (less
        than half of its area on the detector is refused; see
        :func:`~quantem_flow.operators.geometry.check_region_on_detector`);
        recorded in the provenance and warned about.
    """

    name: ClassVar[str] = "center_of_mass"
    scan_local: ClassVar[bool] = True

    def __init__(
        self,
        *,
        center: str | Sequence[float] = "auto",
        mask_radius: float | None = None,
        mask_units: str = "px",
        units: str = "auto",
        probe: ProbeEstimate | None = None,
        allow_implausible: bool = False,
    ):
        if mask_radius is not None and not float(mask_radius) > 0:
            raise ParameterError(f"mask_radius must be > 0 or None, got {mask_radius!r}")
        self.center = center
        self.mask_radius = mask_radius
        self.mask_units = mask_units
        self.units = units
        self.probe = probe
        if not isinstance(allow_implausible, (bool, np.bool_)):
            raise ParameterError(
                f"allow_implausible must be True or False, got {allow_implausible!r}"
            )
        self.allow_implausible = bool(allow_implausible)

    def parameters(self) -> dict[str, Any]:
        """Parameters as given."""
        center = self.center if isinstance(self.center, str) else [float(v) for v in self.center]
        return {
            "center": center,
            "mask_radius": self.mask_radius,
            "mask_units": self.mask_units,
            "units": self.units,
            "allow_implausible": self.allow_implausible,
        }

    def validate(self, ds: Dataset4D) -> None:
        """Check the requested units against the calibration."""
        cal = ds.calibration
        pixel_scale(cal.detector_units if self.units == "auto" else self.units, cal)
        if self.mask_radius is not None:
            pixel_scale(self.mask_units, cal)

    def plan(self, ctx: PlanContext) -> ChunkPlan:
        """Three weight maps: the mask, and the mask times row and column offsets."""
        ds = ctx.dataset
        cal = ds.calibration
        units = cal.detector_units if self.units == "auto" else self.units
        scale, units = pixel_scale(units, cal)
        center, record = resolve_center(self.center, ctx, self.probe)
        shape = ds.detector_shape
        plausibility: dict[str, Any] = {"plausible": True, "rule": "whole detector"}
        allowed_notes: list[str] = []
        if self.mask_radius is None:
            mask = np.ones(shape, dtype=np.float64)
        else:
            mscale, munits = pixel_scale(self.mask_units, cal)
            mask = annulus(shape, center, 0.0, float(self.mask_radius), mscale).astype(np.float64)
            if not mask.any():
                raise ParameterError(
                    f"mask_radius={self.mask_radius} {self.mask_units} selects no pixel"
                )
            plausibility, allowed_notes = check_region_on_detector(
                shape,
                center,
                mscale,
                munits,
                inner=0.0,
                outer=float(self.mask_radius),
                operator="center_of_mass",
                inner_name=None,
                outer_name="mask_radius",
                allow_implausible=self.allow_implausible,
                alternatives=["mask_radius=None (the whole detector)"],
            )
        rr = (np.arange(shape[0], dtype=np.float64) - center[0])[:, None] * np.ones(shape[1])
        cc = np.ones(shape[0])[:, None] * (np.arange(shape[1], dtype=np.float64) - center[1])
        w_sum, w_r, w_c = mask, mask * rr, mask * cc
        keys = [weight_key(w) for w in (w_sum, w_r, w_c)]
        params = {
            **self.parameters(),
            **record,
            "center_px": list(center),
            "units": units,
            "pixel_scale": list(scale),
            "mask": "whole detector"
            if self.mask_radius is None
            else array_identity(mask.astype(bool)),
            "definition": "sum(I * (k - center)) / sum(I) over the mask, times the pixel size",
            "plausibility": plausibility,
        }

        def finalize(out: PassOutputs) -> VectorField:
            total = out.per_frame[keys[0]]
            empty = total == 0
            with np.errstate(invalid="ignore", divide="ignore"):
                com = np.stack(
                    [
                        out.per_frame[keys[1]] / total * scale[0],
                        out.per_frame[keys[2]] / total * scale[1],
                    ]
                )
            com[:, empty] = math.nan
            notes = list(allowed_notes)
            if empty.any():
                notes.append(
                    f"{int(empty.sum())} frame(s) had zero counts in the mask; their centre of "
                    "mass is NaN"
                )
            scan_axes = ds.calibration.scan_axes(ds.scan_shape)
            from ..calibration import Axis

            return VectorField(
                data=com,
                units=units,
                axes=(Axis("component", 2, 1.0, "row,col", 0.0), *scan_axes),
                provenance=make_provenance(
                    ds,
                    operator="center_of_mass",
                    parameters={**params, "n_empty_frames": int(empty.sum())},
                    outputs=out,
                    accumulation_dtype="float64",
                    notes=notes,
                ),
            )

        return ChunkPlan(
            weights=dict(zip(keys, (w_sum, w_r, w_c), strict=True)),
            want_sum=False,
            want_max=False,
            parameters=params,
            finalize=finalize,
        )


def center_of_mass(
    ds: Dataset4D,
    *,
    center: str | Sequence[float] = "auto",
    mask_radius: float | None = None,
    mask_units: str = "px",
    units: str = "auto",
    probe: ProbeEstimate | None = None,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    """Centre of mass of every diffraction pattern, as a vector field.

    Parameters
    ----------
    ds
        The dataset.
    center
        Origin: ``"auto"`` (calibration origin, else the probe found from the
        mean pattern), ``"probe"``, ``"calibration"`` or ``(row, col)`` px.
    mask_radius
        Radius of the disk of pixels that count (``None``: every pixel).
    mask_units
        Units of ``mask_radius``.
    units
        Units of the vectors: ``"auto"`` (the detector's), ``"px"``,
        ``"mrad"`` or ``"1/Å"``.
    probe
        A precomputed :class:`ProbeEstimate`.
    allow_implausible
        Compute with a mask disk lying mostly off the detector anyway
        (otherwise :class:`~quantem_flow.errors.ImplausibleParameterError`);
        recorded in the provenance and warned about.
    name
        Label of the result (default ``"com"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.VectorField` with components
        ``(row, col)``.
    """
    if not isinstance(ds, Dataset4D):
        raise ParameterError(f"expected a Dataset4D, got {type(ds).__name__}")
    op = CenterOfMass(
        center=center,
        mask_radius=mask_radius,
        mask_units=mask_units,
        units=units,
        probe=probe,
        allow_implausible=allow_implausible,
    )
    return LazyResult(op, dataset=ds, name=name or "com")
