"""Large host arrays a pass fills once: in memory the kernel may back with 2 MiB pages.

A fresh NumPy array of 165 MB (SSB's gathered bright field of a 256 x 256
scan) is faulted in 4 KiB at a time as it is first written: 40,000 page
faults, 0.2-0.27 s in a fresh process on this project's VM (a guest pays
more per fault than bare metal), 5x what filling it costs.  Asked for
transparent huge pages (``madvise(MADV_HUGEPAGE)``, which Linux honours
with THP set to ``madvise`` or ``always``), the same array faults 2 MiB at
a time: 0.03 s (benchmarks/RESULTS.md, "SSB in a fresh interpreter").
Where the platform has no such advice the array is NumPy's own.  Values
do not depend on it: anonymous memory starts zeroed either way.
"""

from __future__ import annotations

import contextlib
import math
import mmap
from typing import Any

import numpy as np

__all__ = ["HUGE_PAGE_MIN_BYTES", "fresh_zeros"]

#: Arrays from this size on are asked for huge pages (smaller ones: NumPy's allocator).
HUGE_PAGE_MIN_BYTES = 8 << 20


def fresh_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zeroed, writable C-ordered array of ``shape``; large ones in huge-page memory.

    Parameters
    ----------
    shape
        The array's shape.
    dtype
        Its dtype.

    Returns
    -------
    numpy.ndarray
        Backed by an anonymous map advised ``MADV_HUGEPAGE`` from
        :data:`HUGE_PAGE_MIN_BYTES` on (the map is released with the last
        view of it), else ``numpy.zeros``.
    """
    dt = np.dtype(dtype)
    count = math.prod(int(n) for n in shape)
    nbytes = count * dt.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_MIN_BYTES or advice is None:
        return np.zeros(shape, dtype=dt)
    anonymous = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # THP compiled out or disabled: 4 KiB pages, zeroed
        anonymous.madvise(advice)
    return np.frombuffer(anonymous, dtype=dt, count=count).reshape(shape)
