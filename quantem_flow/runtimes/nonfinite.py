"""Per-frame dot products that a non-finite pixel outside a weight row's support cannot touch.

The contract (every runtime, docs/runtimes.md): ``per_frame[i, j]`` is the
sum of ``frames[i, p] * weights[j, p]`` over the pixels where
``weights[j, p] != 0``.  A pixel with weight exactly 0 is outside the row's
support and does not enter the sum, even when it is NaN or infinite (IEEE
would give ``0 * NaN = 0 * inf = NaN``).  A row whose support holds a NaN, or
infinities of both signs, is NaN; one holding infinities of one sign (after
the weight's sign) is that infinity.  Integer data are never non-finite.

Matrix-product kernels (BLAS, cuBLAS, MLX) compute ``frames @ weights.T`` at
full speed and then call :func:`repair_per_frame`: it looks at the small
``(n, m)`` output, and only where an element is non-finite it recomputes
that frame with :func:`supported_dot` (non-finite pixels zeroed, their
``w * x`` added back only where ``w != 0``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["repair_per_frame", "supported_dot"]

#: Frames recomputed per batch by :func:`repair_per_frame`.
REPAIR_BATCH = 256


def supported_dot(frames: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``frames @ weights.T`` in float64, each term with a zero weight skipped.

    Parameters
    ----------
    frames
        ``(n, k)`` integer or real frames.
    weights
        ``(m, k)`` weight rows.

    Returns
    -------
    numpy.ndarray
        ``(n, m)`` float64.
    """
    f = np.asarray(frames, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    finite = np.isfinite(f)
    if finite.all():
        return f @ w.T
    out: np.ndarray = np.where(finite, f, 0.0) @ w.T
    ii, pp = np.nonzero(~finite)
    wt = w[:, pp].T  # (bad pixels, m)
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.where(wt != 0.0, f[ii, pp][:, None] * wt, 0.0)
        np.add.at(out, ii, terms)
    return out


def repair_per_frame(
    per_frame: np.ndarray,
    weights: np.ndarray,
    frames_of: Callable[[np.ndarray], np.ndarray],
    *,
    batch: int = REPAIR_BATCH,
) -> np.ndarray:
    """Recompute the non-finite elements of ``per_frame`` skipping zero weights, in place.

    Parameters
    ----------
    per_frame
        ``(n, m)`` float64 host array from a matrix product (modified in place).
    weights
        ``(m, k)`` weight rows.
    frames_of
        ``frames_of(rows)`` returns the ``(len(rows), k)`` frames ``rows`` on
        the host; called only for frames with a non-finite output.
    batch
        Frames fetched per call.

    Returns
    -------
    numpy.ndarray
        ``per_frame`` itself.
    """
    bad = ~np.isfinite(per_frame)
    if not bad.any():
        return per_frame
    rows = np.flatnonzero(bad.any(axis=1))
    for s in range(0, rows.size, batch):
        r = rows[s : s + batch]
        redo = supported_dot(frames_of(r), weights)
        sel = bad[r]
        per_frame[r] = np.where(sel, redo, per_frame[r])
    return per_frame
