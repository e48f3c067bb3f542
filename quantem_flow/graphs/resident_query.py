"""Light kernels for queries on resident chunks: only the pixels a weight map changes.

A virtual detector dragged over a persisted dataset (an ADF ring whose
inner radius changes every query) has weights that are one constant over
most of the detector: ``w = c + d`` with ``d`` zero outside a small box.
Each frame's dot product is then ``c * T + sum(d * I)`` over the box, with
``T`` the frame's total, computed once per resident chunk and kept with it
on its worker.  The CPU runtime's box kernel
(:func:`~quantem_flow.runtimes.cpu.box.box_dot`) reads the box of each
frame in place.  A query touches the box only (about a tenth of a 128 x 128
frame for a ring of inner radius 20 px) instead of every pixel.

Exactness: the path is taken only for integer data with integer weights
whose sums stay below ``2**53`` (checked from the dtype's range and the
weights), where both ways give the exact integer of every dot product, so
the result is bit-identical to the full kernel.  Anything else (float
data, fractional weights, pattern sums or maxima, gathered pixels, other
representations, runtimes other than ``cpu``) runs the full kernel
(:func:`~quantem_flow.graphs.tasks.run_resident_kernels`).  The chunk
record says which path ran (``query``).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import weakref
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..representations import Chunk
from ..runtimes import get_runtime
from .digest import chunk_digest
from .tasks import (
    ChunkPartial,
    PassSpec,
    _where,
    combine_partials,
    resident_digest,
    run_resident_kernels,
)

__all__ = [
    "SupportPlan",
    "frame_totals",
    "run_resident_group",
    "run_resident_query",
    "support_plan",
]

#: The box must be at most this fraction of the detector for the light path.
MAX_BOX_FRACTION = 0.5
#: Data types whose values are integers the float64 sums hold exactly.
_EXACT_KINDS = "ui"
_LIMIT = 2.0**53

_TOTALS: dict[int, tuple[weakref.ref[Chunk], np.ndarray]] = {}
_TOTALS_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class SupportPlan:
    """How a pass's weight rows split into a constant and a box.

    Attributes
    ----------
    constants
        ``(n_weights,)`` the constant ``c`` of each row (its most common value).
    box
        ``(row_start, row_stop, col_start, col_stop)`` on the detector, half-open:
        the bounding box of every pixel where a row differs from its constant.
    delta
        ``(n_weights, box_rows * box_cols)`` float64 ``w - c`` inside the box.
    fraction
        Box pixels over detector pixels.
    """

    constants: np.ndarray
    box: tuple[int, int, int, int]
    delta: np.ndarray
    fraction: float

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for the chunk record."""
        return {
            "path": "support box",
            "rule": "per frame: c * frame total (computed once per resident chunk) + "
            "sum((w - c) * I) over the box where a weight row differs from its constant c",
            "box": list(self.box),
            "box_fraction": self.fraction,
            "constants": [float(c) for c in self.constants],
            "exact": "integer data and integer weights, sums < 2**53: both ways give the exact "
            "integer dot products (bit-identical to the full kernel)",
        }


def support_plan(spec: PassSpec, chunk: Chunk) -> SupportPlan | None:
    """Return the light plan for ``spec`` on ``chunk``, or ``None`` when the full kernel runs.

    Parameters
    ----------
    spec
        The pass (weights, reductions, gather, runtime).
    chunk
        The resident chunk.

    Returns
    -------
    SupportPlan or None
        ``None`` unless: a dense host chunk of integer data; only weight rows
        (no pattern sum or maximum, no gathered pixels); integer weights with
        exact float64 sums; and a box of at most :data:`MAX_BOX_FRACTION`.
    """
    if spec.want_sum or spec.want_max or spec.gather is not None:
        return None
    if chunk.representation != "dense" or chunk.residency != "host" or chunk.runtime != "cpu":
        return None
    payload = chunk.payload
    if not isinstance(payload, np.ndarray) or payload.ndim != 4 or not payload.flags.c_contiguous:
        return None
    dtype = payload.dtype
    if dtype.kind not in _EXACT_KINDS:
        return None
    w = np.asarray(spec.weights, dtype=np.float64)
    m, k = w.shape
    kr, kc = int(payload.shape[2]), int(payload.shape[3])
    if m == 0 or k != kr * kc or not np.all(np.isfinite(w)) or not np.array_equal(w, np.rint(w)):
        return None
    constants = np.empty(m, dtype=np.float64)
    for i in range(m):
        values, counts = np.unique(w[i], return_counts=True)
        constants[i] = values[int(np.argmax(counts))]
    delta = w - constants[:, None]
    # exact: |c| * T + sum |d| * I <= (|c| + max |d|) * max |I| * pixels < 2**53
    info = np.iinfo(dtype)
    peak = float(max(abs(int(info.min)), abs(int(info.max))))
    bound = (np.abs(constants) + np.abs(delta).max(axis=1)) * peak * float(k)
    if not np.all(bound < _LIMIT):
        return None
    changed = np.any(delta != 0, axis=0).reshape(kr, kc)
    rows = np.flatnonzero(changed.any(axis=1))
    cols = np.flatnonzero(changed.any(axis=0))
    if rows.size == 0:  # every row constant: a one-pixel box of zeros keeps one code path
        box = (0, 1, 0, 1)
    else:
        box = (int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1)
    area = (box[1] - box[0]) * (box[3] - box[2])
    fraction = area / float(k)
    if fraction > MAX_BOX_FRACTION:
        return None
    inside = delta.reshape(m, kr, kc)[:, box[0] : box[1], box[2] : box[3]].reshape(m, area)
    return SupportPlan(
        constants=constants,
        box=box,
        delta=np.ascontiguousarray(inside),
        fraction=fraction,
    )


def _forget(key: int) -> None:
    with _TOTALS_LOCK:
        _TOTALS.pop(key, None)


def frame_totals(chunk: Chunk) -> tuple[np.ndarray, bool]:
    """Per-frame totals of a resident dense chunk (float64), and whether they were cached.

    Computed once with the chunk's runtime (a frame pass with one weight row
    of ones: exact integers for integer data) and kept while the chunk lives.
    """
    key = id(chunk)
    with _TOTALS_LOCK:
        found = _TOTALS.get(key)
    if found is not None and found[0]() is chunk:
        return found[1], True
    runtime = get_runtime(chunk.runtime)
    n_pixels = int(chunk.payload.shape[2]) * int(chunk.payload.shape[3])
    out = runtime.run_frame_pass(
        chunk, np.ones((1, n_pixels), dtype=np.float64), want_sum=False, want_max=False
    )
    totals = np.ascontiguousarray(out.per_frame[:, 0], dtype=np.float64)
    with _TOTALS_LOCK:
        _TOTALS[key] = (weakref.ref(chunk), totals)
    weakref.finalize(chunk, _forget, key)
    return totals, False


def run_resident_query(spec: PassSpec, chunk: Chunk, index: int) -> ChunkPartial:
    """Run a pass's kernels on a resident chunk, on the support box when exact (module doc).

    Returns the same :class:`~quantem_flow.graphs.tasks.ChunkPartial` as
    :func:`~quantem_flow.graphs.tasks.run_resident_kernels` (bit-identical
    values); its record has ``query`` saying which path ran.
    """
    plan = support_plan(spec, chunk)
    if plan is None:
        part = run_resident_kernels(spec, chunk, index)
        for record in part.records:
            record["query"] = {"path": "full kernel"}
        return part
    from ..runtimes.cpu.box import box_dot

    t0 = time.perf_counter()
    units, _ = resident_digest(chunk)
    totals, cached = frame_totals(chunk)
    t1 = time.perf_counter()
    runtime = get_runtime(chunk.runtime)
    r0, r1, c0, c1 = plan.box
    delta = plan.delta.reshape(-1, r1 - r0, c1 - c0)
    with runtime.compile_timer() as compiled:
        per_frame = box_dot(chunk.payload, delta, box=plan.box)
    per_frame += totals[:, None] * plan.constants[None, :]
    t2 = time.perf_counter()
    (s0, s1), (q0, q1) = chunk.scan_slice
    record = {
        "chunk": index,
        "rows": [s0, s1],
        "runtime": runtime.name,
        "runtime_detail": runtime.describe(),
        **_where(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "resident": True,
        "residency": chunk.residency,
        "bytes_read": 0,
        "read_s": 0.0,
        "hash_s": 0.0,
        "compile_s": compiled.seconds,
        "compilations": compiled.compilations,
        "kernel_s": max(t2 - t1 - compiled.seconds, 0.0),
        "content_digest": None if units is None else chunk_digest(units, spec.dataset),
        "digest_units": units,
        "representation": spec.dataset.representation,
        "payload_bytes": chunk.nbytes,
        "query": {
            **plan.describe(),
            "frame_totals": "cached with the resident chunk"
            if cached
            else "computed now (first query on this chunk), kept with it",
            "frame_totals_s": t1 - t0,
        },
    }
    return ChunkPartial(
        blocks=[((s0, s1), per_frame.reshape(s1 - s0, q1 - q0, -1))],
        pattern_sum=None,
        pattern_max=None,
        records=[record],
    )


def run_resident_group(spec: PassSpec, indices: tuple[int, ...], *chunks: Chunk) -> ChunkPartial:
    """Run :func:`run_resident_query` on several resident chunks of one worker, combined.

    One task per worker instead of one per chunk; the records (one per
    chunk) and blocks are those of the separate tasks.
    """
    if len(indices) != len(chunks):
        raise ParameterError(
            f"run_resident_group needs one chunk index per chunk, got {len(indices)} indices "
            f"for {len(chunks)} chunks; pass the indices of the chunks given"
        )
    return combine_partials(
        *(run_resident_query(spec, chunk, i) for i, chunk in zip(indices, chunks, strict=True))
    )
