"""Finding the bright-field probe disk in a diffraction pattern."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..dataset import Dataset4D
from ..errors import ParameterError
from ..results import DiffractionImage

__all__ = [
    "ProbeEstimate",
    "box_mean_3x3",
    "estimate_probe",
    "find_probe",
    "region_at",
    "sample_positions",
    "sampled_mean",
]


@dataclasses.dataclass(frozen=True)
class ProbeEstimate:
    """The bright-field disk: centre and radius in detector pixels.

    Attributes
    ----------
    center
        ``(row, col)`` intensity-weighted centroid of the disk, in pixels.
    radius
        ``sqrt(area / pi)`` of the disk, in pixels.
    threshold
        Fraction between background and peak used to segment the disk.
    method
        How the disk was segmented.
    pattern_from
        Which frames the pattern was the mean of.
    area_px
        Pixels in the disk.
    """

    center: tuple[float, float]
    radius: float
    threshold: float
    method: str
    pattern_from: str
    area_px: int

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["center"] = list(self.center)
        return d


#: Run-filling sweeps :func:`region_at` makes before it leaves the region to SciPy's labelling.
REGION_SWEEPS = 32


def box_mean_3x3(m: np.ndarray) -> np.ndarray:
    """The 3 x 3 box mean of a 2-D float array, edges replicated.

    ``scipy.ndimage.uniform_filter(m, size=3, mode="nearest")`` to rounding
    (it keeps a running sum; this sums each row's three values, then each
    column's), without importing ``scipy.ndimage`` (0.15 s in a fresh
    interpreter, most of SSB's plan: docs/ssb-first-run.md).
    """
    p = np.pad(np.asarray(m, dtype=np.float64), 1, mode="edge")
    rows = (p[:, :-2] + p[:, 1:-1] + p[:, 2:]) / 3.0
    return (rows[:-2] + rows[1:-1] + rows[2:]) / 3.0


def _fill_runs(region: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every run of ``mask`` along axis 1 that holds a pixel of ``region``, whole."""
    n_r, n_c = mask.shape
    # a False column between rows keeps runs from joining across them
    flat = np.zeros((n_r, n_c + 1), dtype=bool)
    flat[:, :n_c] = mask
    line = flat.ravel()
    starts = line.copy()
    starts[1:] &= ~line[:-1]
    run = np.cumsum(starts) * line  # 0 outside mask, else the run's number
    hit = np.zeros(int(starts.sum()) + 1, dtype=bool)
    seeded = np.zeros((n_r, n_c + 1), dtype=bool)
    seeded[:, :n_c] = region
    hit[run[seeded.ravel()]] = True
    hit[0] = False
    filled: np.ndarray = hit[run].reshape(n_r, n_c + 1)[:, :n_c]
    return filled


def region_at(mask: np.ndarray, seed: tuple[int, int]) -> np.ndarray | None:
    """The 4-connected region of ``mask`` holding ``seed``, or ``None`` when too winding.

    Filling whole runs along rows, then columns, in turn until nothing is
    added: a disk (any convex region) is complete after two or three sweeps.
    The region is that of ``scipy.ndimage.label(mask)`` (its default cross
    structure) at ``seed``; a region that needs more than
    :data:`REGION_SWEEPS` sweeps (a spiral) gives ``None``, and the caller
    labels with SciPy.
    """
    mask = np.asarray(mask, dtype=bool)
    if not mask[seed]:
        raise ValueError(f"the seed {seed} is not in the mask")
    region = np.zeros_like(mask)
    region[seed] = True
    count = 1
    for sweep in range(REGION_SWEEPS):
        region = _fill_runs(region, mask) if sweep % 2 == 0 else _fill_runs(region.T, mask.T).T
        grown = int(region.sum())
        if grown == count and sweep > 0:
            return region
        count = grown
    return None


def estimate_probe(
    pattern: np.ndarray, *, threshold: float = 0.5, pattern_from: str = "given pattern"
) -> ProbeEstimate:
    """Segment the bright-field disk of a (mean) diffraction pattern.

    The pattern is smoothed with a 3 x 3 box (so a hot pixel cannot be the
    peak), pixels above ``background + threshold * (peak - background)`` are
    labelled, and the connected region holding the smoothed peak is the
    disk.  Background is the median of the pattern.

    Parameters
    ----------
    pattern
        ``(k_r, k_c)`` mean or sum pattern.
    threshold
        Fraction in (0, 1).
    pattern_from
        Description of the pattern, recorded.

    Returns
    -------
    ProbeEstimate
        Centre and radius in pixels.
    """
    if not 0 < threshold < 1:
        raise ParameterError(f"threshold must be in (0, 1), got {threshold}")
    m = np.asarray(pattern, dtype=np.float64)
    if m.ndim != 2:
        raise ParameterError(f"a diffraction pattern must be 2-D, got shape {m.shape}")
    finite = np.isfinite(m)
    if not finite.any():
        raise ParameterError(
            f"no bright-field disk found: the pattern holds no finite value (all {m.size} pixels "
            "are NaN or infinite). Check the data (a detector readout failure, a float file "
            "with NaN frames), or pass center=(row, col) and radii explicitly"
        )
    if not finite.all():
        m = np.where(finite, m, 0.0)
    smooth = box_mean_3x3(m)
    bg = float(np.median(m))
    peak = float(smooth.max())
    if not peak > bg:
        raise ParameterError(
            "no bright-field disk found: the pattern is flat (peak <= median). Pass center=(row, "
            "col) and radii explicitly, or check the data"
        )
    above = m > bg + threshold * (peak - bg)
    seed = np.unravel_index(int(np.argmax(smooth)), m.shape)
    disk = region_at(above, (int(seed[0]), int(seed[1]))) if above[seed] else None
    if disk is None:
        # the smoothed peak fell between bright pixels (take the largest region), or the
        # region is too winding for run filling: SciPy labels every region
        from scipy import ndimage

        labels, _ = ndimage.label(above)
        lab = labels[seed]
        if lab == 0:
            counts = np.bincount(labels.ravel())
            counts[0] = 0
            lab = int(np.argmax(counts))
        disk = labels == lab
    area = int(disk.sum())
    if area < 3:
        raise ParameterError(
            f"the bright-field disk found has only {area} pixel(s); the pattern has no clear "
            "probe. Pass center=(row, col) and radii explicitly"
        )
    w = (m - bg) * disk
    rr, cc = np.indices(m.shape, dtype=np.float64)
    total = float(w.sum())
    center = (float((w * rr).sum() / total), float((w * cc).sum() / total))
    return ProbeEstimate(
        center=center,
        radius=math.sqrt(area / math.pi),
        threshold=threshold,
        method="median background, 3x3-smoothed peak, threshold, connected region at the peak",
        pattern_from=pattern_from,
        area_px=area,
    )


def sample_positions(scan_shape: tuple[int, int], n: int) -> list[tuple[int, int]]:
    """Return up to ``n`` scan positions spread evenly (row-major) over the scan."""
    total = scan_shape[0] * scan_shape[1]
    idx = np.unique(np.linspace(0, total - 1, num=min(n, total)).round().astype(np.int64))
    return [(int(i) // scan_shape[1], int(i) % scan_shape[1]) for i in idx]


def sampled_mean(ds: Dataset4D, positions: list[tuple[int, int]]) -> np.ndarray:
    """Return the float64 mean of the frames at ``positions`` (runs where it is called)."""
    acc = np.zeros(ds.detector_shape, dtype=np.float64)
    for r, c in positions:
        acc += ds.frame(r, c)
    return acc / max(len(positions), 1)


def find_probe(
    data: Dataset4D | DiffractionImage | np.ndarray,
    *,
    threshold: float = 0.5,
    sample_frames: int | None = None,
) -> ProbeEstimate:
    """Find the probe disk now (eager).

    Parameters
    ----------
    data
        A mean/sum pattern (array or :class:`DiffractionImage`), or a dataset,
        whose frames are sampled (``sample_frames`` of them, evenly over the
        scan; default ``config.get("probe_sample_frames")``) and averaged.
    threshold
        Segmentation threshold, see :func:`estimate_probe`.
    sample_frames
        Frames to read from a dataset.

    Returns
    -------
    ProbeEstimate
        Centre and radius in pixels of ``data``'s detector.
    """
    from .. import config

    if isinstance(data, Dataset4D):
        n = int(sample_frames or config.get("probe_sample_frames"))
        pos = sample_positions(data.scan_shape, n)
        return estimate_probe(
            sampled_mean(data, pos),
            threshold=threshold,
            pattern_from=f"mean of {len(pos)} frames sampled evenly over the scan",
        )
    if isinstance(data, DiffractionImage):
        return estimate_probe(
            data.data, threshold=threshold, pattern_from=f"{data.provenance.operator} result"
        )
    return estimate_probe(np.asarray(data), threshold=threshold)
