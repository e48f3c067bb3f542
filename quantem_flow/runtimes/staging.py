"""Reusable host staging buffers, one set per thread.

Decoding a chunk into a freshly allocated array costs a page fault per page
the first time the memory is touched.  On virtual machines that hand freed
memory back to the host (free page reporting, ballooning) that cost recurs
for every chunk: measured here, 0.4 s to first-touch 128 MiB, against 0.02 s
when the pages are reused.  Chunk tasks therefore decode into a staging
buffer kept per thread and per (shape, dtype), the host-side analogue of
pinned staging memory on a GPU.  At most :data:`MAX_BUFFERS` buffers are
kept per thread (least recently used dropped first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

__all__ = ["MAX_BUFFERS", "clear_staging_buffers", "staging_buffer"]

MAX_BUFFERS = 2

_local = threading.local()


def _pool() -> OrderedDict[tuple[tuple[int, ...], str], np.ndarray]:
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = OrderedDict()
        _local.pool = pool
    return pool


def staging_buffer(shape: tuple[int, ...], dtype: np.dtype[Any] | str) -> np.ndarray:
    """Return this thread's reusable C-contiguous buffer of ``shape`` and ``dtype``.

    The content is undefined; the buffer is handed out again to the next
    caller in the same thread with the same shape and dtype, so callers must
    be done with it before they return.
    """
    key = (tuple(int(s) for s in shape), np.dtype(dtype).str)
    pool = _pool()
    buf = pool.get(key)
    if buf is None:
        buf = np.empty(key[0], dtype=np.dtype(dtype))
        pool[key] = buf
        while len(pool) > MAX_BUFFERS:
            pool.popitem(last=False)
    else:
        pool.move_to_end(key)
    return buf


def clear_staging_buffers() -> None:
    """Drop this thread's buffers."""
    _pool().clear()
