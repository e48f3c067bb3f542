"""The CPU frame pass in NumPy, bit for bit the compiled one, while that one compiles.

A fresh install has an empty Numba cache: the first pass of a dtype compiles
its kernels, 2-3 s on this project's VM for BF + ADF + CoM, before any
frame is read.  Where every value the compiled kernels produce is an exact
integer (or half-integer) in float64, any order of summation gives the same
bits, so NumPy's float64 matrix products give the same result.  That holds
for integer data (at most 32 bits) when

- mask rows (0/1): the sum over the support, an integer;
- moment rows (``support * (g - c)``): the compiled path sums the integer
  moment ``M`` about the detector's middle pixel and the support's sum ``S``
  exactly and finishes ``fl(M - fl(offset * S))`` in NumPy
  (:func:`~quantem_flow.runtimes.cpu.structure.finish_moment_rows`); here the
  same ``M`` and ``S`` come from products with integer vectors and go through
  the same function;
- other rows have weights that are multiples of ``2**-j`` (``j <= 8``:
  integers, half-integers: the moments about a half-pixel centre);

and every sum stays below ``2**53`` (the structured plan's own bound; for
other rows ``max|value| * sum |w| * 2**j``).  Patterns are NumPy's int64 sums and
maxima, exact.  Anything else (real data, fractional general weights, 64-bit
integers) returns ``None`` from :func:`exact_pass` and waits for the compiled
kernel, as before.

:mod:`~quantem_flow.runtimes.cpu.warmup` decides when: the first pass of a
kernel specialisation this process has not loaded runs here while a thread
compiles (or loads from the disk cache) the compiled one; later passes use
it.  The variant record says which ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .scratch import EXACT_BLOCK_BYTES
from .structure import EXACT_INTEGER, WeightPlan, finish_moment_rows, structured_vectors

__all__ = ["ExactPass", "exact_pass"]


@dataclasses.dataclass(frozen=True)
class ExactPass:
    """Integer vectors whose float64 products with the frames give every output column.

    Attributes
    ----------
    vectors
        ``(k, v)`` float64, integer-valued.
    columns
        Output column of each vector (moment rows' sums go after the rows, as
        in the compiled path).
    plan
        The structured plan whose moment rows are finished afterwards, or ``None``.
    width
        Output columns written.
    """

    vectors: np.ndarray
    columns: np.ndarray
    plan: WeightPlan | None
    width: int

    def run(self, frames: np.ndarray, out: np.ndarray) -> None:
        """Write ``out[:, :width]`` for ``(n, k)`` integer frames, block by block."""
        n, k = frames.shape
        step = max(1, EXACT_BLOCK_BYTES // max(8 * k, 1))  # runtimes/cpu/scratch.py
        for f0 in range(0, n, step):
            block = frames[f0 : f0 + step].astype(np.float64)
            out[f0 : f0 + step, self.columns] = block @ self.vectors
        if self.plan is not None:
            finish_moment_rows(out[:, : self.width], self.plan)


def _dyadic_scale(w: np.ndarray) -> int | None:
    """The least ``2**j`` (``j <= 8``) making every weight an integer, or ``None``.

    Products of integers with such weights are multiples of ``2**-j``; their
    sums are exact in float64 while below ``2**53 / 2**j``, in any order.
    """
    if not np.all(np.isfinite(w)):
        return None
    for j in range(9):
        scaled = w * 2.0**j
        if np.array_equal(scaled, np.round(scaled)):
            return int(2**j)
    return None


def exact_pass(
    weights: np.ndarray,
    *,
    dtype: np.dtype[Any],
    plan: WeightPlan | None,
) -> ExactPass | None:
    """The exact NumPy form of a frame pass, or ``None`` where it would not be bit for bit.

    Parameters
    ----------
    weights
        ``(m, k)`` float64 weight rows.
    dtype
        The frames' dtype.
    plan
        The structured plan the compiled path runs (its variant ``structured``), or
        ``None`` for the fused kernel on every row.  The moment rows'
        coordinates come from the frame shape the plan was analysed with.
    """
    dt = np.dtype(dtype)
    if dt.kind not in "ui" or dt.itemsize > 4:
        return None
    info = np.iinfo(dt)
    vmax = max(abs(int(info.min)), int(info.max))
    m, k = weights.shape
    vectors: list[np.ndarray] = []
    columns: list[int] = []
    general = np.arange(m) if plan is None else plan.general
    for j in general.tolist():
        w = weights[j]
        scale = _dyadic_scale(w)
        if scale is None or vmax * float(np.abs(w).sum()) * scale >= EXACT_INTEGER:
            return None
        vectors.append(np.asarray(w, dtype=np.float64))
        columns.append(int(j))
    if plan is not None:
        if plan.n_rows != m or not plan.applicable(dt)[0]:
            return None
        for vec, column in structured_vectors(plan):
            vectors.append(vec.astype(np.float64))
            columns.append(column)
    width = m if plan is None else max(m, plan.n_out)
    stacked = np.stack(vectors, axis=1) if vectors else np.zeros((k, 0), dtype=np.float64)
    return ExactPass(
        vectors=np.ascontiguousarray(stacked),
        columns=np.asarray(columns, dtype=np.int64),
        plan=plan,
        width=width,
    )
