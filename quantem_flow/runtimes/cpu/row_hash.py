"""Per-scan-row XXH3-128 digests carried from one call to the next (:mod:`.xxh3_ir`).

:class:`RowHasher` owns the state block a compiled kernel advances: the
integer dot kernel hashes each group of frames right after its own sweep of
them (:meth:`~quantem_flow.runtimes.cpu.dot_pass.DotPass.run`), and
:meth:`RowHasher.update` hashes frames on its own (a piece the dot kernel
does not run).  Either way the digests are ``xxhash.xxh3_128`` of each scan
row's bytes, in the hex form :mod:`quantem_flow.graphs.digest` records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .xxh3_ir import BLOCK_BYTES, HASH_BLOCK, INIT_ACC, compile_row_hasher

__all__ = ["RowHasher", "why_not_row_hasher"]


def why_not_row_hasher(frame_nbytes: int) -> str | None:
    """Why frames of ``frame_nbytes`` bytes cannot be hashed a frame at a time, or ``None``."""
    if frame_nbytes < BLOCK_BYTES or frame_nbytes % BLOCK_BYTES:
        return (
            f"a frame of {frame_nbytes} bytes is not a whole number of XXH3's "
            f"{BLOCK_BYTES}-byte blocks"
        )
    return None


def _slot(name: str) -> int:
    return HASH_BLOCK.index(name)


_FRAME_BYTES, _ROW_FRAMES, _COL, _OUT, _DONE, _BACK, _FUNCTION, _CAPACITY = (
    _slot(name)
    for name in ("frame_bytes", "row_frames", "col", "out", "done", "back", "function", "capacity")
)


class RowHasher:
    """XXH3-128 of each scan row of frames fed in scan order, from column 0 of a row.

    Parameters
    ----------
    row_frames
        Frames per scan row (the dataset's scan columns).
    frame_nbytes
        Bytes per frame, a multiple of 1024 (:func:`why_not_row_hasher`).

    Raises
    ------
    ValueError
        When the frames are not whole XXH3 blocks, or ``row_frames < 1``.
    """

    def __init__(self, *, row_frames: int, frame_nbytes: int) -> None:
        why = why_not_row_hasher(int(frame_nbytes))
        if why is not None:
            raise ValueError(why)
        if int(row_frames) < 1:
            raise ValueError(f"a scan row holds at least one frame, got row_frames={row_frames}")
        self.row_frames = int(row_frames)
        self.frame_nbytes = int(frame_nbytes)
        self._code = compile_row_hasher()
        self.block = np.zeros(len(HASH_BLOCK), dtype=np.int64)
        self.block[:8] = np.array(INIT_ACC, dtype=np.uint64).view(np.int64)
        self.block[_FRAME_BYTES] = self.frame_nbytes
        self.block[_ROW_FRAMES] = self.row_frames
        self.block[_FUNCTION] = self._code.address
        self._address = int(self.block.ctypes.data)
        self._out = np.zeros((0, 2), dtype=np.uint64)
        self._reserve(0)

    @property
    def compile_s(self) -> float:
        """Seconds this process spent compiling the hasher (once per process)."""
        return self._code.compile_s

    @property
    def rows_done(self) -> int:
        """Scan rows whose digest is finished."""
        return int(self.block[_DONE])

    @property
    def column(self) -> int:
        """The column of the next frame to be hashed (0: at a row's start)."""
        return int(self.block[_COL])

    def _reserve(self, n_frames: int) -> None:
        """Room in the output for every row the next ``n_frames`` frames can finish."""
        need = self.rows_done + (self.column + int(n_frames)) // self.row_frames
        if need > self._out.shape[0]:
            grown = np.zeros((max(need, 2 * self._out.shape[0], 8), 2), dtype=np.uint64)
            grown[: self.rows_done] = self._out[: self.rows_done]
            self._out = grown
            self.block[_OUT] = self._out.ctypes.data
            self.block[_CAPACITY] = self._out.shape[0]

    def kernel_block(self, frames: np.ndarray, *, back: int) -> int:
        """The state block's address for a kernel about to hash ``frames``.

        ``back``: bytes from each frame's start to the address the kernel
        passes for it (the first pixel it reads).
        """
        self._check(frames)
        self._reserve(frames.shape[0])
        self.block[_BACK] = back
        return self._address

    def _check(self, frames: np.ndarray) -> None:
        if frames.ndim != 2 or frames.shape[1] * frames.itemsize != self.frame_nbytes:
            raise ValueError(
                f"frames of {frames.dtype} {frames.shape} are not rows of {self.frame_nbytes} "
                "bytes each, as this hasher was made for"
            )
        if frames.strides[1] != frames.itemsize:
            raise ValueError(f"frames must have contiguous pixels, got strides {frames.strides}")

    def update(self, frames: np.ndarray) -> None:
        """Hash the next ``(n, pixels)`` frames on their own (one sweep of them)."""
        n = int(frames.shape[0])
        if n == 0:
            return
        address = self.kernel_block(frames, back=0)
        self._code.run(frames.ctypes.data, n, frames.strides[0], address)

    def digests(self) -> list[str]:
        """The finished rows' digests, hex (``xxhash.xxh3_128_hexdigest`` of each row's bytes)."""
        done = self._out[: self.rows_done]
        return [f"{int(high):016x}{int(low):016x}" for low, high in done]

    def __getstate__(self) -> Any:
        raise TypeError("a RowHasher holds a compiled function's state and is not pickled")
