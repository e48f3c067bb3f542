"""A persisted query whose detector covers most of the frame reads its complement instead.

An ADF ring from 20 px to the detector edge covers ~90 % of a 128 x 128 frame: its kernel
reads nearly the whole resident chunk at every query, at memory speed.  For integer data
and a 0/1 detector the same values come from fewer bytes::

    sum over the ring = frame total - sum over the pixels outside the ring

The frame totals of a resident chunk are computed once, on the first such query, by the
chunk's own runtime, and kept with the chunk handle; each query then runs the kernel on
the complement (the inner disk: ~10 % of the pixels) and subtracts.  Every value is an
integer below 2**53 in float64 (the kernels' exactness contract), so the result is the
same bit for bit as the direct sum.  Used only when nothing else needs every pixel (no
sum or max pattern, no gather), only for 0/1 rows covering more than half the frame, and
only when the chunk's runtime prices the flipped rows below the rows as asked
(:meth:`~quantem_flow.runtimes.base.Runtime.frame_pass_cost`; a runtime without a price
takes the complement): with moment rows beside an ADF ring the CPU's integer dot kernel
needs more vectors for the complement than for the ring, and ran 1.9x slower through it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import numpy as np

from .. import config
from ..representations import Chunk
from ..runtimes.base import FramePassResult

__all__ = ["MIN_SUPPORT", "Complement", "Declined", "frame_totals", "plan_complement"]

#: A 0/1 row is read through its complement when its support covers more than this share.
MIN_SUPPORT = 0.5
#: Attribute of a resident chunk handle holding its per-frame totals (float64, exact).
_TOTALS_ATTR = "qf_frame_totals"
_lock = threading.Lock()
#: Complement decisions kept (a pass's chunks share one), the newest last.
_DECISIONS_KEPT = 8
_decisions: collections.OrderedDict[
    tuple[Any, ...], tuple[np.ndarray, np.ndarray] | Declined | None
] = collections.OrderedDict()


@dataclasses.dataclass(frozen=True)
class Complement:
    """The weights to run and how to turn their result back into the asked one."""

    weights: np.ndarray
    rows: np.ndarray
    totals: np.ndarray
    totals_s: float

    def restore(self, out: FramePassResult) -> FramePassResult:
        """``per_frame`` of the asked rows: totals minus the complement's sums."""
        per_frame = np.array(out.per_frame, dtype=np.float64, copy=True)
        per_frame[:, self.rows] = self.totals[:, None] - per_frame[:, self.rows]
        return FramePassResult(per_frame, out.pattern_sum, out.pattern_max)

    def record(self) -> dict[str, Any]:
        """What the chunk record says about this query's path."""
        return {
            "path": "complement",
            "rows": [int(i) for i in np.flatnonzero(self.rows)],
            "why": (
                f"0/1 rows covering more than {MIN_SUPPORT:.0%} of the frame on integer data: "
                "frame total minus the pixels outside the detector (exact)"
            ),
            "totals_s": self.totals_s,
        }


@dataclasses.dataclass(frozen=True)
class Declined:
    """Rows qualify for the complement, but the runtime prices it higher: run as asked."""

    asked: float
    complement: float

    def record(self) -> dict[str, Any]:
        """What the chunk record says about this query's path."""
        return {
            "path": "as asked",
            "why": (
                f"the runtime prices the complement of the wide 0/1 rows at {self.complement:.0f} "
                f"per frame against {self.asked:.0f} as asked (its kernel choice's estimate)"
            ),
        }


def frame_totals(runtime: Any, chunk: Chunk) -> tuple[np.ndarray, float]:
    """Per-frame totals of a resident chunk, by its runtime, computed once and kept with it."""
    found = getattr(chunk, _TOTALS_ATTR, None)
    if isinstance(found, np.ndarray):
        return found, 0.0
    t = time.perf_counter()
    (rows, cols) = (
        (chunk.scan_slice[0][1] - chunk.scan_slice[0][0]),
        (chunk.scan_slice[1][1] - chunk.scan_slice[1][0]),
    )
    ones = np.ones((1, _pixels(chunk)), dtype=np.float64)
    out = runtime.run_frame_pass(chunk, ones, want_sum=False, want_max=False)
    totals = np.ascontiguousarray(out.per_frame[:, 0], dtype=np.float64)
    if totals.shape != (rows * cols,):
        raise ValueError(f"frame totals of shape {totals.shape} for {rows} x {cols} frames")
    with _lock:
        setattr(chunk, _TOTALS_ATTR, totals)  # an attribute Chunk does not declare
    return totals, time.perf_counter() - t


def _frame_shape(chunk: Chunk) -> tuple[int, int]:
    payload = chunk.payload
    shape = getattr(payload, "frame_shape", None)
    if shape is None and isinstance(payload, np.ndarray):
        shape = payload.shape[2:]
    if shape is None:
        raise ValueError("the chunk's frame shape is unknown")
    return int(shape[0]), int(shape[1])


def _pixels(chunk: Chunk) -> int:
    kr, kc = _frame_shape(chunk)
    return kr * kc


def plan_complement(
    weights: np.ndarray,
    dtype: np.dtype[Any],
    *,
    want_sum: bool,
    want_max: bool,
    gather: Any,
    runtime: Any,
    chunk: Chunk,
) -> Complement | Declined | None:
    """The complement plan of a query on a resident chunk, or why not, or ``None``.

    ``None``: no row qualifies (narrow, graded, float data, a pattern or a
    gather asked for); :class:`Declined`: rows qualify but the chunk's
    runtime prices their complement higher.
    """
    if want_sum or want_max or gather is not None or np.dtype(dtype).kind not in "ui":
        return None
    if weights.ndim != 2 or weights.shape[0] == 0:
        return None
    try:
        shape = _frame_shape(chunk)
    except ValueError:
        return None
    decided = _decision(weights, np.dtype(dtype), shape, runtime)
    if not isinstance(decided, tuple):
        return decided
    flipped, rows = decided
    totals, seconds = frame_totals(runtime, chunk)
    return Complement(weights=flipped, rows=rows, totals=totals, totals_s=seconds)


def _decision(
    weights: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, int], runtime: Any
) -> tuple[np.ndarray, np.ndarray] | Declined | None:
    """The flipped weights and the rows flipped, or why not: the same for every chunk.

    Kept per weight content (XXH3-128 of the rows, one sweep), dtype, frame shape and
    runtime, so a pass's chunks decide once: a decision prices the weights twice
    through the runtime's kernel choice (1-2 ms of Python per chunk before it was kept).
    """
    import xxhash

    rows_c = np.ascontiguousarray(weights, dtype=np.float64)
    key = (
        xxhash.xxh3_128_digest(rows_c.reshape(-1).view(np.uint8).data),
        rows_c.shape,
        dtype.str,
        shape,
        type(runtime),  # the price is the runtime class's own
        str(getattr(runtime, "name", "")),
        bool(config.get("integer_dot_kernel")),  # the CPU's price depends on it
    )
    with _lock:
        if key in _decisions:
            _decisions.move_to_end(key)
            return _decisions[key]
    decided = _decide(rows_c, dtype, shape, runtime)
    if isinstance(decided, tuple):
        for array in decided:
            array.setflags(write=False)  # shared by every chunk of the pass
    with _lock:
        _decisions[key] = decided
        while len(_decisions) > _DECISIONS_KEPT:
            _decisions.popitem(last=False)
    return decided


def _decide(
    weights: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, int], runtime: Any
) -> tuple[np.ndarray, np.ndarray] | Declined | None:
    binary = np.all((weights == 0.0) | (weights == 1.0), axis=1)
    covered = np.count_nonzero(weights, axis=1) / max(weights.shape[1], 1)
    rows = binary & (covered > MIN_SUPPORT)
    if not rows.any():
        return None
    if shape[0] * shape[1] != weights.shape[1]:
        return None
    flipped = np.array(weights, dtype=np.float64, copy=True)
    flipped[rows] = 1.0 - flipped[rows]
    price = getattr(runtime, "frame_pass_cost", None)
    if price is not None:
        asked = price(weights, dtype=dtype, frame_shape=shape)
        through = price(flipped, dtype=dtype, frame_shape=shape)
        if asked is not None and through is not None and through >= asked:
            return Declined(asked=float(asked), complement=float(through))
    return flipped, rows
