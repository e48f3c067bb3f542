"""What a frame pass of the CPU runtime costs per frame, estimated before it runs.

A caller that can ask for the same values with two stacks of weight rows (a
persisted query through the complement of a wide detector,
:mod:`quantem_flow.graphs.complement_query`) runs the cheaper one.  The
estimate is the one the runtime chooses its kernel by, in the cell kernels'
pixel-steps (:mod:`.structure`): the fused kernel costs the detector's pixels
per pair of rows; the cell kernels their touched pixels and runs; the integer
dot kernel (:mod:`.dot_pass`) its multiply-adds over :data:`~.dot_pass.DOT_PER_CELL_STEP`,
the ratio it is chosen by.  Measured against it (benchmarks/RESULTS.md,
"Complement queries priced by the kernel"): BF + ADF + CoM on 128 x 128 u16
frames is 5 dot vectors as asked and 7 through the complement of the ADF
ring, which ran 1.9x slower on resident chunks.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["frame_pass_cost"]

_cache: dict[tuple[int, str], tuple[Any, float]] = {}
_lock = threading.Lock()


def frame_pass_cost(
    weights: np.ndarray, *, dtype: np.dtype[Any], frame_shape: tuple[int, int] | None
) -> float:
    """Estimated work per frame, in pixel-steps, of the kernel this runtime would run.

    Parameters
    ----------
    weights
        ``(n_rows, k_r * k_c)`` weight rows.
    dtype
        The frames' dtype.
    frame_shape
        ``(k_r, k_c)`` (moment rows need it), or ``None``.

    Returns
    -------
    float
        Comparable between weight stacks over the same frames; not a time.
    """
    from .dot_pass import DOT_PER_CELL_STEP, dot_work
    from .structure import analyse_weights

    w = np.ascontiguousarray(weights, dtype=np.float64)
    m, k = w.shape
    if m == 0:
        return 0.0
    dt = np.dtype(dtype)
    plan = analyse_weights(w, frame_shape=frame_shape)
    key = (id(plan), dt.str)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is plan:  # plans are shared by content: ids can be reused
            return hit[1]
    if not plan.structured:
        cost = float(k * ((m + 1) // 2))
    else:
        general = k * ((int(plan.general.size) + 1) // 2)
        work = dot_work(plan, dt)
        cells = work / DOT_PER_CELL_STEP if work is not None else plan.cell_cost()
        cost = cells + general
    with _lock:
        _cache[key] = (plan, float(cost))
        while len(_cache) > 64:
            _cache.pop(next(iter(_cache)))
    return float(cost)
