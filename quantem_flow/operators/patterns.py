"""Mean, maximum and sum diffraction patterns."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..calibration import Axis
from ..dataset import Dataset4D
from ..errors import ParameterError, QuantemFlowError
from ..results import DiffractionImage
from .base import ChunkOperator, ChunkPlan, LazyResult, PassOutputs, PlanContext, make_provenance
from .virtual import value_units

__all__ = ["DiffractionPattern", "max_diffraction", "mean_diffraction", "sum_diffraction"]


class DiffractionPattern(ChunkOperator):
    """A reduction over all scan positions: ``"mean"``, ``"max"`` or ``"sum"``."""

    name: ClassVar[str] = "diffraction_pattern"

    def __init__(self, *, reduction: str):
        if reduction not in ("mean", "max", "sum"):
            raise ParameterError(f"reduction must be mean, max or sum, got {reduction!r}")
        self.reduction = reduction

    def parameters(self) -> dict[str, Any]:
        """Parameters as given."""
        return {"reduction": self.reduction}

    def plan(self, ctx: PlanContext) -> ChunkPlan:
        """Ask the pass for the sum or max pattern."""
        ds = ctx.dataset
        red = self.reduction
        integer = ds.dtype.kind in "ui"
        axes, origin_record = pattern_axes(ds, ctx)

        def finalize(out: PassOutputs) -> DiffractionImage:
            if red == "max":
                assert out.pattern_max is not None
                data = out.pattern_max.reshape(ds.detector_shape)
                acc = str(ds.dtype)
            else:
                assert out.pattern_sum is not None
                data = out.pattern_sum.reshape(ds.detector_shape)
                acc = str(out.pattern_sum.dtype)
                if red == "mean":
                    data = data.astype(np.float64) / out.n_frames
            return DiffractionImage(
                data=data,
                units=value_units(ds) + (" per frame" if red == "mean" else ""),
                axes=axes,
                provenance=make_provenance(
                    ds,
                    operator=f"{red}_diffraction",
                    parameters={**self.parameters(), "axes_origin": origin_record},
                    outputs=out,
                    accumulation_dtype=acc if red != "max" or not integer else None,
                ),
            )

        return ChunkPlan(
            weights={},
            want_sum=red != "max",
            want_max=red == "max",
            parameters=self.parameters(),
            finalize=finalize,
        )


def pattern_axes(ds: Dataset4D, ctx: PlanContext) -> tuple[tuple[Axis, Axis], dict[str, Any]]:
    """The detector axes of a pattern result, measured from the beam centre where known.

    Angles and spatial frequencies are measured from the beam centre: the
    calibration's ``detector_origin`` when given, else, on a calibrated
    detector, the probe centre found from the data (the estimate that
    ``center="auto"`` uses, so a virtual detector drawn on the pattern sits
    where it was computed).  An uncalibrated detector keeps pixel indices
    (what ``center=(row, col)`` takes).

    Returns
    -------
    tuple
        ``(row axis, column axis)`` and the provenance record ``axes_origin``:
        ``{"px": [row, col] or None, "from": ...}``.
    """
    cal = ds.calibration
    shape = ds.detector_shape
    if cal.detector_origin is not None:
        record: dict[str, Any] = {
            "px": list(cal.detector_origin),
            "from": "calibration.detector_origin (the beam centre)",
        }
        return cal.detector_axes(shape), record
    if not cal.detector_is_calibrated:
        return cal.detector_axes(shape), {
            "px": None,
            "from": "none: an uncalibrated detector's axes are pixel indices from the corner",
        }
    try:
        probe = ctx.probe()
    except QuantemFlowError as exc:
        return cal.detector_axes(shape), {
            "px": [0.0, 0.0],
            "from": f"the detector corner: no beam centre is known and none was found ({exc}); "
            "give Calibration(detector_origin=(row, col))",
        }
    centre = (float(probe.center[0]), float(probe.center[1]))
    axes = cal.replace(detector_origin=centre).detector_axes(shape)
    return axes, {
        "px": list(centre),
        "from": "the beam centre found from the data (the probe estimate center='auto' uses)",
        "probe": probe.to_dict(),
    }


def _pattern(ds: Dataset4D, reduction: str, name: str | None) -> LazyResult:
    if not isinstance(ds, Dataset4D):
        raise ParameterError(f"expected a Dataset4D, got {type(ds).__name__}")
    return LazyResult(
        DiffractionPattern(reduction=reduction), dataset=ds, name=name or f"{reduction}_pattern"
    )


def mean_diffraction(ds: Dataset4D, *, name: str | None = None) -> LazyResult:
    """Mean diffraction pattern over every scan position (float64, counts per frame).

    Parameters
    ----------
    ds
        The dataset.
    name
        Label of the result (default ``"mean_pattern"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.DiffractionImage`.
    """
    return _pattern(ds, "mean", name)


def max_diffraction(ds: Dataset4D, *, name: str | None = None) -> LazyResult:
    """Maximum diffraction pattern over every scan position (the data's dtype).

    Parameters
    ----------
    ds
        The dataset.
    name
        Label of the result (default ``"max_pattern"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.DiffractionImage`.
    """
    return _pattern(ds, "max", name)


def sum_diffraction(ds: Dataset4D, *, name: str | None = None) -> LazyResult:
    """Sum diffraction pattern (int64 for integer data, exact; float64 otherwise).

    Parameters
    ----------
    ds
        The dataset.
    name
        Label of the result (default ``"sum_pattern"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.DiffractionImage`.
    """
    return _pattern(ds, "sum", name)
