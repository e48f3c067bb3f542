"""The virtual detectors a user places in the explorer, and what each computes.

Every detector's geometry is kept in detector pixels of the dataset as loaded
(after its transforms), ``(row, col)``, regions half-open, so that what the
explorer computes, the exported YAML pipeline and the exported Python snippet
are the same call with the same numbers: the images equal bit for bit.
Calibrated display units (mrad from the beam centre) are a view of these
pixels only (:mod:`.app`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dataset import Dataset4D
from ..errors import ParameterError
from ..operators import LazyResult, virtual_annular, virtual_mask

__all__ = ["KINDS", "Detector", "polygon_mask"]

#: The detector shapes the explorer places.
KINDS = ("disk", "annulus", "rectangle", "polygon")


def polygon_mask(
    vertices: Sequence[tuple[float, float]], detector_shape: tuple[int, int]
) -> np.ndarray:
    """Boolean mask of the detector pixels whose centres lie inside a polygon.

    Parameters
    ----------
    vertices
        ``(row, col)`` vertices in detector pixels (pixel ``(r, c)`` has its
        centre at ``(r, c)``), at least three.
    detector_shape
        ``(k_r, k_c)``.

    Returns
    -------
    numpy.ndarray
        ``bool`` of ``detector_shape``.
    """
    from matplotlib.path import Path as PolygonPath

    v = np.asarray(vertices, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != 2 or v.shape[0] < 3:
        raise ParameterError(
            f"a polygon needs at least three (row, col) vertices, got an array of shape {v.shape}"
        )
    rr, cc = np.mgrid[: detector_shape[0], : detector_shape[1]]
    points = np.column_stack([rr.ravel(), cc.ravel()]).astype(np.float64)
    inside = PolygonPath(v).contains_points(points)
    return np.asarray(inside.reshape(detector_shape), dtype=bool)


@dataclasses.dataclass(frozen=True)
class Detector:
    """One virtual detector, in detector pixels ``(row, col)``.

    Attributes
    ----------
    kind
        ``"disk"``, ``"annulus"``, ``"rectangle"`` or ``"polygon"``.
    center
        ``(row, col)`` px: the centre of a disk or annulus.
    inner, outer
        Radii in px: a disk is ``d < outer``; an annulus ``inner <= d < outer``.
    region
        ``(row_start, row_stop, col_start, col_stop)`` px, half-open: a rectangle.
    vertices
        ``((row, col), ...)`` px: a polygon (pixels whose centres lie inside).
    name
        Label of the image and of its pipeline output.
    """

    kind: str
    center: tuple[float, float] = (0.0, 0.0)
    inner: float = 0.0
    outer: float = 1.0
    region: tuple[int, int, int, int] = (0, 1, 0, 1)
    vertices: tuple[tuple[float, float], ...] = ()
    name: str = "detector"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ParameterError(f"detector kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind in ("disk", "annulus"):
            if not (math.isfinite(self.center[0]) and math.isfinite(self.center[1])):
                raise ParameterError(f"a detector centre must be finite, got {self.center}")
            if not (0 <= self.inner < self.outer):
                raise ParameterError(
                    f"radii must satisfy 0 <= inner < outer, got inner={self.inner} "
                    f"outer={self.outer} (px)"
                )
        if self.kind == "rectangle":
            r0, r1, c0, c1 = self.region
            if not (r0 < r1 and c0 < c1):
                raise ParameterError(
                    f"a rectangle is (row_start, row_stop, col_start, col_stop) with start < "
                    f"stop, got {self.region}"
                )
        if self.kind == "polygon" and len(self.vertices) < 3:
            raise ParameterError(
                f"a polygon needs at least three vertices, got {len(self.vertices)}"
            )

    def mask(self, detector_shape: tuple[int, int]) -> np.ndarray:
        """The detector as a boolean mask (rectangles and polygons; clipped to the detector)."""
        if self.kind == "rectangle":
            m = np.zeros(detector_shape, dtype=bool)
            r0, r1, c0, c1 = self.region
            m[max(r0, 0) : max(r1, 0), max(c0, 0) : max(c1, 0)] = True
            return m
        if self.kind == "polygon":
            return polygon_mask(self.vertices, detector_shape)
        rr, cc = np.mgrid[: detector_shape[0], : detector_shape[1]]
        d = np.hypot(rr - self.center[0], cc - self.center[1])
        inner = self.inner if self.kind == "annulus" else 0.0
        return np.asarray((d >= inner) & (d < self.outer), dtype=bool)

    def lazy(self, ds: Dataset4D) -> LazyResult:
        """The lazy virtual image of this detector on ``ds`` (what the explorer computes)."""
        if self.kind in ("disk", "annulus"):
            inner = self.inner if self.kind == "annulus" else 0.0
            return virtual_annular(
                ds,
                inner=inner,
                outer=self.outer,
                units="px",
                center=self.center,
                allow_implausible=True,  # the user placed it; recorded in the provenance
                name=self.name,
            )
        return virtual_mask(ds, self.mask(ds.detector_shape), name=self.name)

    def describe(self) -> str:
        """One line for people, in px."""
        if self.kind == "disk":
            return f"disk r < {self.outer:.2f} px at ({self.center[0]:.2f}, {self.center[1]:.2f})"
        if self.kind == "annulus":
            return (
                f"annulus {self.inner:.2f} <= r < {self.outer:.2f} px at "
                f"({self.center[0]:.2f}, {self.center[1]:.2f})"
            )
        if self.kind == "rectangle":
            r0, r1, c0, c1 = self.region
            return f"rectangle rows {r0}:{r1}, cols {c0}:{c1}"
        return f"polygon of {len(self.vertices)} vertices"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready geometry (px)."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind in ("disk", "annulus"):
            out.update(center=list(self.center), outer=self.outer)
            if self.kind == "annulus":
                out["inner"] = self.inner
        elif self.kind == "rectangle":
            out["region"] = list(self.region)
        else:
            out["vertices"] = [list(v) for v in self.vertices]
        return out
