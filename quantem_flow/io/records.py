"""Reading equally spaced frame records of a binary file into caller buffers.

Shared by the readers of instrument formats whose frames are records of a
fixed size (a per-frame header, the pixels, sometimes a footer) at a fixed
stride after a file header: NanoMEGAS blockfiles, TIA ``.ser`` series, MRC
stacks and TVIPS recordings.  The file is read with ``pread``
(:class:`~quantem_flow.io.fileio.PositionalFile`), never memory-mapped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .fileio import SCRATCH_BYTES, PositionalFile

__all__ = ["read_records_into"]


def read_records_into(
    fh: PositionalFile,
    *,
    offset: int,
    record: int,
    head: int,
    n: int,
    file_dtype: np.dtype[Any],
    frame_shape: tuple[int, int],
    out: np.ndarray | None = None,
    flip_rows: bool = False,
    what: str = "",
) -> np.ndarray:
    """Read ``n`` frames from records starting at byte ``offset``.

    Parameters
    ----------
    fh
        The open file.
    offset
        Byte offset of the first record.
    record
        Bytes from one record's start to the next one's.
    head
        Bytes of each record before the frame's pixels.
    n
        Frames to read.
    file_dtype
        Pixel type as stored (byte order included).
    frame_shape
        ``(k_r, k_c)`` as stored (columns fastest).
    out
        A C-contiguous ``(n, k_r, k_c)`` array of the native dtype to fill.
    flip_rows
        Reverse the row order of every frame (files that store the bottom
        row first).
    what
        Words for error messages (``"frames 3..9"``).

    Returns
    -------
    numpy.ndarray
        ``(n, k_r, k_c)`` in native byte order (``out`` when given).
    """
    native = file_dtype.newbyteorder("=")
    shape = (n, *frame_shape)
    target = out
    if target is None or not (
        target.shape == shape and target.dtype == native and target.flags.c_contiguous
    ):
        target = np.empty(shape, dtype=native)
    if n:
        frame_bytes = frame_shape[0] * frame_shape[1] * file_dtype.itemsize
        if flip_rows:
            _read_flipped(fh, offset, target, record=record, head=head, what=what)
        elif head == 0 and record == frame_bytes:
            fh.readinto(offset, target, what=what)
        else:
            fh.read_records(offset, target, record=record, head=head, what=what)
        if not file_dtype.isnative and file_dtype.itemsize > 1:
            target.byteswap(inplace=True)
    if out is not None and target is not out:
        np.copyto(out, target, casting="same_kind")
        return out
    return target


def _read_flipped(
    fh: PositionalFile, offset: int, out: np.ndarray, *, record: int, head: int, what: str
) -> None:
    """Fill ``out`` (``(n, rows, cols)``) from records, reversing each frame's rows.

    Records are read a few MiB at a time into a scratch buffer and copied
    once, rows reversed, into ``out``.
    """
    n, rows = int(out.shape[0]), int(out.shape[1])
    frame = int(out[0].nbytes)
    row_bytes = frame // rows
    dest = out.reshape(n, -1).view(np.uint8).reshape(n, rows, row_bytes)
    per = max(1, SCRATCH_BYTES // record)
    scratch = np.empty(min(n, per) * record, dtype=np.uint8)
    for i in range(0, n, per):
        k = min(per, n - i)
        part = scratch[: k * record]
        fh.readinto(offset + i * record, part, what=what)
        frames = part.reshape(k, record)[:, head : head + frame].reshape(k, rows, row_bytes)
        dest[i : i + k] = frames[:, ::-1, :]
