"""Compiled checks and decoding of stored bitshuffle + LZ4 frames (:mod:`.stored`).

Apart from :mod:`.stored` so that importing the frames' container does not
import Numba (``import quantem_flow`` stays light).
"""

from __future__ import annotations

import numba
import numpy as np

from .encoded import _bitshuffle_stream_end

__all__ = ["checked_block", "decode_span"]


@numba.njit(cache=True, nogil=True, inline="always")
def checked_block(buf, a, n, n_elem, itemsize):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Block size (elements) of the chunk at ``buf[a:a + n]`` if it checks out, else -1.

    The checks of ``bitshuffle_chunk_problem``: the header's decoded size and
    block size, and every LZ4 block length inside the chunk (what the
    decoder trusts).
    """
    if n < 12:
        return -1
    nbytes = np.int64(0)
    for t in range(8):
        nbytes = (nbytes << 8) | np.int64(buf[a + t])
    block_bytes = np.int64(0)
    for t in range(8, 12):
        block_bytes = (block_bytes << 8) | np.int64(buf[a + t])
    if nbytes != n_elem * itemsize or block_bytes == 0 or block_bytes % (itemsize * 8):
        return -1
    block = block_bytes // itemsize
    if _bitshuffle_stream_end(buf[a : a + n], 12, n_elem, block, itemsize) != n:
        return -1
    return block


@numba.njit(cache=True, nogil=True)
def decode_span(into, buf, rel, sizes, n_elem, frames):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Check, then decode, each one-frame chunk of ``buf`` into its row of ``frames``; bad or -1.

    ``into`` is :func:`decode_lz4_into` (passed as an argument so the
    compiled function is cached on disk); ``frames`` holds one row of
    ``n_elem`` values per chunk, as bytes.  A chunk is decoded only after its
    header and block lengths checked out; the first chunk that does not, or
    that the codec does not consume exactly, is returned (the caller names it).
    """
    itemsize = frames.shape[1] // n_elem
    for c in range(rel.shape[0]):
        a = rel[c]
        n = sizes[c]
        block = checked_block(buf, a, n, n_elem, itemsize)
        if block < 0:
            return c
        used = into(buf[a + 12 :].ctypes.data, frames[c].ctypes.data, n_elem, itemsize, block)
        if used != n - 12:
            return c
    return -1
