"""Persisted disk and annulus queries answered from a radial index kept with each resident chunk.

A user dragging a ring on the diffraction pattern changes its radii, not its centre.  Every
disk and annulus map is ``inner <= distance < outer`` around the centre
(:func:`~quantem_flow.operators.geometry.annulus`): with the detector's pixels sorted by
their distance from the centre, each such map is one contiguous range of that order, and
its per-frame sum is a difference of two *prefix sums* over the sorted pixels.  So the
first such query on a resident chunk builds, for that centre (and pixel scale), a radial
index:

- ``pixels``: the chunk's values of the sorted pixels nearest the centre
  (``(frames, P)``, the data's dtype; gathered once by the chunk's own runtime, so any
  representation works);
- ``checkpoints``: per frame, the int64 sum of the first ``j * GROUP`` sorted pixels.

A prefix of ``p`` pixels is then ``checkpoints[p // GROUP]`` plus fewer than ``GROUP``
adjacent values of each frame's row of ``pixels``: a query reads one or two cache lines
per frame instead of every pixel of the disk (whose rows are scattered through the
frame, each pulling whole cache lines).  A map reaching the detector's edge is the frame
total (kept with the chunk by :mod:`.complement_query`) minus a prefix.  Later queries
around the same centre reuse the index; one needing a larger radius builds it again,
larger (:data:`GROWTH`).

Exactness: integer data only; every sum is an int64 sum of the integer values, converted
to float64 once (exact below ``2**53``, the kernels' contract), so the values equal the
kernels' bit for bit.  The operators' geometry is only a hint: each weight row is checked
against the index before use (0/1 valued, its support exactly one contiguous range of the
distance order, not splitting pixels of equal distance); a row that fails runs through the
kernels as before.  Bounded memory: the index covers at most :data:`MAX_SHARE` of the
pixels (disks of radius up to ~36 px on 128 x 128) and holds at most
:data:`MAX_BYTES_SHARE` of the chunk's own bytes (so packed or paired chunks, far smaller
than dense, mostly keep to their kernels), one centre per chunk; larger maps run as
before.  The index is not part of the chunk's size as Dask measured it when the chunk was
stored; it is recorded per chunk (``index_bytes``) and freed with the chunk.  8-, 16- and
32-bit integers only (int64 sums of 64-bit values could wrap).  Recorded in each chunk's
record (``query: {path: radial, ...}``); ``qf.config.set(radial_queries=False)`` turns it
off.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

from ..representations import Chunk
from ..runtimes.base import FramePassResult
from .complement_query import frame_totals

__all__ = [
    "GROUP",
    "MAX_BYTES_SHARE",
    "MAX_SHARE",
    "RadialIndex",
    "RadialPlan",
    "index_nbytes",
    "plan_radial",
]

#: Sorted pixels per checkpoint: a prefix reads at most this many rows of ``pixels``.
GROUP = 32
#: The index covers at most this share of the detector's pixels.
MAX_SHARE = 0.25
#: An index holds at most this share of its chunk's own bytes (a compact representation,
#: packed or paired counts, keeps its size: its queries run through the kernels).
MAX_BYTES_SHARE = 0.3
#: Built indices cover this much more than the query that built them (a drag grows).
GROWTH = 2.0
_INDEX_ATTR = "qf_radial_index"
_lock = threading.Lock()
_orders: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


def _order(key: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Flat pixel indices sorted by distance from the centre (stable), and those distances."""
    with _lock:
        found = _orders.get(key)
    if found is not None:
        return found
    from ..operators.geometry import detector_distance

    cr, cc, sr, sc, kr, kc = key
    d = detector_distance((int(kr), int(kc)), (cr, cc), (sr, sc)).reshape(-1)
    order = np.argsort(d, kind="stable")
    made = (order, d[order])
    with _lock:
        if len(_orders) >= 8:  # a few centres: each entry is 16 bytes per detector pixel
            _orders.clear()
        _orders[key] = made
    return made


@dataclasses.dataclass
class RadialIndex:
    """Prefix sums of one resident chunk's frames over pixels sorted by distance."""

    key: tuple[Any, ...]
    pixels: np.ndarray  # (frames, P) in the data's dtype, the sorted pixels' values
    checkpoints: np.ndarray  # (P // GROUP + 1, frames) int64
    build_s: float

    @property
    def n_pixels(self) -> int:
        """Sorted pixels covered."""
        return int(self.pixels.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return int(self.pixels.nbytes + self.checkpoints.nbytes)

    def prefix(self, p: int) -> np.ndarray:
        """Per-frame int64 sum of the first ``p`` sorted pixels (``p <= n_pixels``).

        A checkpoint row (contiguous) plus fewer than :data:`GROUP` adjacent values of
        each frame (one or two cache lines per frame).
        """
        q, r = divmod(p, GROUP)
        base: np.ndarray = self.checkpoints[q]
        if r == 0:
            return base
        rest: np.ndarray = self.pixels[:, q * GROUP : q * GROUP + r].sum(axis=1, dtype=np.int64)
        total: np.ndarray = base + rest
        return total


def index_nbytes(n_frames: int, n_pixels: int, itemsize: int) -> int:
    """Bytes of an index of ``n_pixels`` sorted pixels over ``n_frames`` frames."""
    return int(n_frames) * (int(n_pixels) * int(itemsize) + (int(n_pixels) // GROUP + 1) * 8)


def _build(runtime: Any, chunk: Chunk, key: tuple[Any, ...], n_pixels: int) -> RadialIndex:
    t = time.perf_counter()
    order, _ = _order(key)
    pixels = np.ascontiguousarray(runtime.run_gather(chunk, np.ascontiguousarray(order[:n_pixels])))
    n_frames = pixels.shape[0]
    full = n_pixels // GROUP
    checkpoints = np.zeros((full + 1, n_frames), dtype=np.int64)
    if full:
        blocks = (
            pixels[:, : full * GROUP].reshape(n_frames, full, GROUP).sum(axis=2, dtype=np.int64)
        )
        np.cumsum(blocks.T, axis=0, out=checkpoints[1:])
    return RadialIndex(key, pixels, checkpoints, time.perf_counter() - t)


@dataclasses.dataclass(frozen=True)
class RadialPlan:
    """The rows of a query as ranges of the distance order, and how to answer them."""

    ranges: tuple[tuple[int, int], ...]
    key: tuple[Any, ...]
    need: int
    to_edge: bool

    def run(
        self, runtime: Any, chunk: Chunk, n_frames: int, itemsize: int
    ) -> tuple[FramePassResult, dict[str, Any]] | None:
        """Per-frame values of every row and the chunk record's ``query`` entry.

        ``None`` when the index this query needs would hold more than
        :data:`MAX_BYTES_SHARE` of the chunk's own bytes (a compact representation: the
        query runs through the kernels).
        """
        index = getattr(chunk, _INDEX_ATTR, None)
        built = 0.0
        if not (
            isinstance(index, RadialIndex) and index.key == self.key and index.n_pixels >= self.need
        ):
            k = int(self.key[4]) * int(self.key[5])
            budget = MAX_BYTES_SHARE * float(chunk.nbytes)
            grown = min(int(k * MAX_SHARE), max(self.need, int(np.ceil(self.need * GROWTH))))
            size = next(
                (
                    p
                    for p in (max(grown, self.need), self.need)
                    if index_nbytes(n_frames, p, itemsize) <= budget
                ),
                None,
            )
            if size is None:
                return None
            index = _build(runtime, chunk, self.key, size)
            with _lock:
                setattr(chunk, _INDEX_ATTR, index)  # one centre per chunk: the newest
            built = index.build_s
        totals_s = 0.0
        totals = None
        if self.to_edge:
            totals, totals_s = frame_totals(runtime, chunk)
        n = index.pixels.shape[0]
        out = np.empty((n, len(self.ranges)), dtype=np.float64)
        k = int(self.key[4]) * int(self.key[5])
        for j, (a, b) in enumerate(self.ranges):
            low = index.prefix(a)
            if b == k:
                assert totals is not None
                out[:, j] = totals - low  # totals: exact float64 of the int64 frame sums
            else:
                out[:, j] = (index.prefix(b) - low).astype(np.float64)
        record = {
            "path": "radial",
            "why": (
                "disk and annulus rows around one centre on integer data: prefix sums over "
                "pixels sorted by distance (exact), from an index kept with the chunk"
            ),
            "ranges": [[int(a), int(b)] for a, b in self.ranges],
            "index_pixels": index.n_pixels,
            "index_bytes": index.nbytes,
            "index_built_s": built,
            "totals_s": totals_s,
        }
        return FramePassResult(out, None, None), record


def _range(row: np.ndarray, order: np.ndarray, dist: np.ndarray) -> tuple[int, int] | None:
    """``(a, b)`` when ``row`` is 1 exactly on sorted pixels ``[a, b)`` (ties not split)."""
    ordered = row[order]
    if not np.all((ordered == 0.0) | (ordered == 1.0)):
        return None
    nz = np.flatnonzero(ordered)
    if nz.size == 0:
        return None
    a, b = int(nz[0]), int(nz[-1]) + 1
    if nz.size != b - a:
        return None
    k = ordered.size
    if (a > 0 and not dist[a - 1] < dist[a]) or (b < k and not dist[b - 1] < dist[b]):
        return None  # pixels of one distance on both sides: not an inner <= d < outer map
    return a, b


def plan_radial(
    weights: np.ndarray,
    hints: tuple[tuple[float, float, float, float] | None, ...],
    dtype: np.dtype[Any],
    frame_shape: tuple[int, int],
    *,
    want_sum: bool,
    want_max: bool,
    gather: Any,
) -> RadialPlan | None:
    """The radial plan of a query on a resident chunk, or ``None`` to run it as asked.

    Every row must carry the same geometry hint and pass the checks of the module
    docstring, and the index it needs must stay within :data:`MAX_SHARE` of the pixels.
    """
    if want_sum or want_max or gather is not None or np.dtype(dtype).kind not in "ui":
        return None
    if np.dtype(dtype).itemsize > 4:  # int64 sums of 64-bit values could wrap
        return None
    if weights.ndim != 2 or weights.shape[0] == 0 or len(hints) != weights.shape[0]:
        return None
    first = hints[0]
    if first is None or any(h != first for h in hints):
        return None
    kr, kc = (int(v) for v in frame_shape)
    k = kr * kc
    if weights.shape[1] != k:
        return None
    key = (*first, kr, kc)
    order, dist = _order(key)
    ranges: list[tuple[int, int]] = []
    for row in weights:
        found = _range(row, order, dist)
        if found is None:
            return None
        ranges.append(found)
    need = max(a if b == k else b for a, b in ranges)
    if need > int(k * MAX_SHARE):
        return None
    return RadialPlan(
        ranges=tuple(ranges), key=key, need=need, to_edge=any(b == k for _, b in ranges)
    )
