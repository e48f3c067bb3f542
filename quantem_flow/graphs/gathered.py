"""A pass's gathered pixels: written in place in this process, else kept as chunks deliver them.

A pass that gathers pixels (SSB's bright field) gets ``(n_pixels, rows,
cols)`` values from every chunk.  Copying each into one ``(n_pixels, R, C)``
array as it arrived touched a second array as large as all of them: 165 MB
for a 256 x 256 scan's bright field, 0.2-0.27 s of first-touch page faults in
a fresh process on this project's VM, on top of the copy (benchmarks/RESULTS.md,
"SSB in a fresh interpreter").  Now:

- in this process (``client="threads"`` or ``"synchronous"``) the runner
  makes the ``(n_pixels, R, C)`` array first (2 MiB pages) and each streamed
  chunk's stream writes its pixels straight into its rows
  (:func:`gathered_in_place`): no per-chunk array, no copy;
- from workers the values arrive with each chunk, and
  :class:`GatheredPixels` keeps the chunks' blocks and assembles the pixels
  a reader asks for: every value is copied once, when it is read, a block
  of pixels at a time.

Gathers beyond ``gather_memory_mib`` go to a disk-backed array either way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..runtimes.host_arrays import fresh_zeros

__all__ = ["GatheredPixels", "gathered_in_place", "in_place_sink"]

_IN_PLACE: dict[str, np.ndarray] = {}
_IN_PLACE_LOCK = threading.Lock()


@contextlib.contextmanager
def gathered_in_place(sinks: Mapping[str, np.ndarray]) -> Iterator[None]:
    """While the block runs, tasks of these passes in this process gather into these arrays.

    Parameters
    ----------
    sinks
        ``pass name -> (n_pixels, R, C)`` array (the spec's ``pass_name``).
        Registered only around a run in this process; on workers nothing is
        found and the values travel with the chunk.
    """
    with _IN_PLACE_LOCK:
        _IN_PLACE.update(sinks)
    try:
        yield
    finally:
        with _IN_PLACE_LOCK:
            for key in sinks:
                _IN_PLACE.pop(key, None)


def in_place_sink(pass_name: str, rows: tuple[int, int]) -> np.ndarray | None:
    """The ``(n_pixels, n_frames)`` view of scan rows ``rows`` to gather into, or ``None``.

    ``pass_name``: the spec's (:func:`gathered_in_place`).
    """
    with _IN_PLACE_LOCK:
        sink = _IN_PLACE.get(pass_name) if pass_name else None
    if sink is None:
        return None
    into = sink[:, rows[0] : rows[1], :]
    flat = into.reshape(into.shape[0], -1)  # rows x cols of one pixel are contiguous: a view
    return flat if np.shares_memory(flat, sink) else None


class GatheredPixels:
    """``(n_pixels, R, C)`` values held as blocks of whole scan rows.

    Indexing the first axis (an integer, a slice, or an array of indices)
    returns a new ``(k, R, C)`` array; only the pixels asked for are copied.

    Parameters
    ----------
    n_pixels
        Pixels gathered per frame.
    scan_shape
        ``(R, C)`` of the dataset.
    dtype
        The values' dtype.
    """

    def __init__(self, n_pixels: int, scan_shape: tuple[int, int], dtype: Any) -> None:
        self.shape = (int(n_pixels), int(scan_shape[0]), int(scan_shape[1]))
        self.dtype = np.dtype(dtype)
        self.ndim = 3
        self._blocks: list[tuple[int, int, np.ndarray]] = []
        self._rows = np.zeros(self.shape[1], dtype=np.int64)

    def __len__(self) -> int:
        return self.shape[0]

    def add(self, rows: tuple[int, int], values: np.ndarray) -> None:
        """Keep the values of scan rows ``rows`` (``(n_pixels, r1 - r0, C)``, not copied).

        Raises
        ------
        ValueError
            For values of another shape or dtype, or rows already held.
        """
        r0, r1 = int(rows[0]), int(rows[1])
        want = (self.shape[0], r1 - r0, self.shape[2])
        if not 0 <= r0 < r1 <= self.shape[1] or tuple(values.shape) != want:
            raise ValueError(
                f"gathered values of shape {tuple(values.shape)} for scan rows {rows}: expected "
                f"{want} within {self.shape[1]} rows"
            )
        if values.dtype != self.dtype:
            raise ValueError(f"gathered values of dtype {values.dtype}, expected {self.dtype}")
        if self._rows[r0:r1].any():
            raise ValueError(f"scan rows {rows} were gathered twice")
        self._rows[r0:r1] = 1
        self._blocks.append((r0, r1, values))

    @property
    def complete(self) -> bool:
        """Whether every scan row has been added."""
        return bool(self._rows.all())

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple):
            raise TypeError("gathered pixels index their first axis only (pixels)")
        pick = np.arange(self.shape[0])[key]
        scalar = pick.ndim == 0
        pick = np.atleast_1d(pick)
        if not self.complete:
            missing = np.flatnonzero(self._rows == 0)
            raise ValueError(
                f"gathered pixels read before scan rows {missing[:8].tolist()}"
                f"{'...' if missing.size > 8 else ''} arrived"
            )
        out = fresh_zeros((pick.size, *self.shape[1:]), self.dtype)  # huge pages when large
        contiguous = pick.size > 0 and int(pick[-1]) - int(pick[0]) + 1 == pick.size
        sel: Any = slice(int(pick[0]), int(pick[-1]) + 1) if contiguous else pick
        for r0, r1, values in self._blocks:
            out[:, r0:r1, :] = values[sel]
        return out[0] if scalar else out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype, copy=False)
