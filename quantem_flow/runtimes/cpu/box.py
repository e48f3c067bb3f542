"""Dot products of every frame with weights that are non-zero only inside a detector box.

Reads the box of each frame in place (no copy of the chunk), so the cost
is the box's pixels, not the frame's: the light kernel of queries on
resident chunks (:mod:`quantem_flow.graphs.resident_query`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ... import config
from ...errors import ParameterError

__all__ = ["box_dot"]

_KERNEL: Any = None
_LOCK = threading.Lock()


def _box_loop(
    frames: Any, r0: int, c0: int, delta: Any, out: Any
) -> None:  # pragma: no cover - compiled by Numba (the Python body is the reference)
    rows, cols = frames.shape[0], frames.shape[1]
    m, br, bc = delta.shape
    for a in range(rows):
        for b in range(cols):
            f = a * cols + b
            for t in range(m):
                acc = 0.0
                for i in range(br):
                    for j in range(bc):
                        acc += delta[t, i, j] * frames[a, b, r0 + i, c0 + j]
                out[f, t] = acc


def _kernel() -> Any:
    global _KERNEL
    with _LOCK:
        if _KERNEL is None:
            import numba

            # reassociation lets the sums vectorise; callers that need exact values use it
            # where every partial sum is an integer below 2**53 (any order is then exact)
            _KERNEL = numba.njit(
                cache=bool(config.get("numba_cache")), nogil=True, fastmath={"reassoc"}
            )(_box_loop)
        return _KERNEL


def box_dot(frames: np.ndarray, delta: np.ndarray, *, box: tuple[int, int, int, int]) -> np.ndarray:
    """Return ``(n_frames, n_rows)`` float64: each frame's box times each weight row's box.

    Parameters
    ----------
    frames
        ``(rows, cols, k_r, k_c)`` dense frames (any real dtype), C-contiguous.
    delta
        ``(n_rows, box_rows, box_cols)`` float64 weights inside the box.
    box
        ``(row_start, row_stop, col_start, col_stop)`` on the detector, half-open.

    Returns
    -------
    numpy.ndarray
        The dot products, summed in float64 in an order the compiler may
        change (vectorised): exact integers for integer frames and weights
        while the sums stay below ``2**53``, as any order then is.
    """
    r0, r1, c0, c1 = (int(v) for v in box)
    w = np.ascontiguousarray(delta, dtype=np.float64)
    if w.ndim != 3 or w.shape[1:] != (r1 - r0, c1 - c0):
        raise ParameterError(
            f"box weights must be (n_rows, {r1 - r0}, {c1 - c0}) for the box {list(box)}, got "
            f"shape {w.shape}; cut them with the same box"
        )
    data = np.ascontiguousarray(frames)
    out = np.empty((data.shape[0] * data.shape[1], w.shape[0]), dtype=np.float64)
    _kernel()(data, r0, c0, w, out)
    return out
