"""Raw binary files: frames of a given shape and dtype, optional headers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import DtypeError, FormatError, ParameterError, ShapeError
from .base import (
    FrameSource,
    SourceIdentity,
    as_dtype,
    check_exists,
    header_digest,
    path_size,
)
from .fileio import PositionalFile

__all__ = ["RawSource"]


class RawSource(FrameSource):
    """A raw binary file of equally sized frame records.

    Each record is ``frame_header_bytes`` of header, one frame of
    ``frame_shape`` values of ``dtype`` (byte order included, e.g. ``">u2"``),
    then ``frame_footer_bytes``.  The file may start with ``offset`` bytes.

    Parameters
    ----------
    path
        The file.
    dtype
        Value type as stored (``"<u2"``, ``">u2"``, ``"float32"``...).
    frame_shape
        ``(k_r, k_c)`` of one frame.  Alternatively give ``shape`` as the full
        4-D ``(R_r, R_c, k_r, k_c)``.
    scan_shape
        ``(rows, cols)``, ``"square"`` or ``None`` (JSON sidecar).
    shape
        Full 4-D shape, instead of ``frame_shape`` and ``scan_shape``.
    offset
        Bytes before the first record.
    frame_header_bytes, frame_footer_bytes
        Bytes before and after each frame's values.
    frame_offset
        Leading frames to skip.
    """

    format: ClassVar[str] = "raw"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: str | np.dtype[Any],
        frame_shape: Sequence[int] | None = None,
        scan_shape: Sequence[int] | str | None = None,
        shape: Sequence[int] | None = None,
        offset: int = 0,
        frame_header_bytes: int = 0,
        frame_footer_bytes: int = 0,
        frame_offset: int = 0,
    ):
        self._path = check_exists(path)
        self._handle_file: PositionalFile | None = None
        self._file_dtype = as_dtype(dtype, what="raw dtype=")
        if self._file_dtype.kind not in "uif":
            raise DtypeError(f"raw dtype must be integer or real, got {self._file_dtype}")
        if shape is not None:
            if frame_shape is not None or scan_shape is not None:
                raise ParameterError(
                    "give either shape=(R_r, R_c, k_r, k_c) or frame_shape/scan_shape"
                )
            if len(shape) != 4:
                raise ShapeError(f"shape must be (R_r, R_c, k_r, k_c), got {shape!r}")
            scan_shape = (int(shape[0]), int(shape[1]))
            frame_shape = (int(shape[2]), int(shape[3]))
        if frame_shape is None or len(frame_shape) != 2:
            raise ShapeError(f"frame_shape must be (k_r, k_c), got {frame_shape!r}")
        if min(int(v) for v in frame_shape) < 1:
            raise ShapeError(
                f"frame_shape must be two positive sizes (k_r, k_c), got {tuple(frame_shape)!r}; "
                "give the detector's size in pixels"
            )
        if min(offset, frame_header_bytes, frame_footer_bytes) < 0:
            raise ParameterError("offset and frame header/footer bytes must be >= 0")
        self._offset = int(offset)
        self._head = int(frame_header_bytes)
        self._foot = int(frame_footer_bytes)
        fs = (int(frame_shape[0]), int(frame_shape[1]))
        frame_bytes = fs[0] * fs[1] * self._file_dtype.itemsize
        self._record = self._head + frame_bytes + self._foot
        size = self._path.stat().st_size
        body = size - self._offset
        if body < self._record or body % self._record:
            raise FormatError(
                f"{str(self._path)!r} holds {size} bytes; with offset {self._offset} and records "
                f"of {self._record} bytes ({self._head} header + {fs} x {self._file_dtype} + "
                f"{self._foot} footer) that is {body / self._record:.4g} frames, not a whole "
                "number; check dtype, frame_shape, offset and header sizes"
            )
        self._set_frames(
            n_frames=body // self._record,
            frame_shape=fs,
            dtype=self._file_dtype,
            scan_shape=scan_shape,
            path=self._path,
            frame_offset=frame_offset,
        )

    def _file(self) -> PositionalFile:
        if self._handle_file is None:
            self._handle_file = PositionalFile(self._path)
        return self._handle_file

    @property
    def path(self) -> Path:
        """The file."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """Path, size and a digest of the layout and the first header bytes."""
        with open(self._path, "rb") as f:
            first = f.read(min(self._offset + self._head, 4096))
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(
                first,
                str(self._file_dtype),
                self._frame_shape,
                self._offset,
                self._head,
                self._foot,
                self._n_frames,
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Layout of the records."""
        return {
            "stored_dtype": self._file_dtype.str,
            "offset": self._offset,
            "frame_header_bytes": self._head,
            "frame_footer_bytes": self._foot,
            **self.scan_metadata(),
        }

    @property
    def streams_blocks(self) -> bool:
        """Frames are fixed-size records: any range reads for the cost of its bytes."""
        return True

    def frame_bytes(self, start: int, stop: int) -> tuple[Path, int] | None:
        """Records without headers or footers, in native byte order, are one run of bytes."""
        if self._head or self._foot:
            return None
        if not self._file_dtype.isnative and self._file_dtype.itemsize > 1:
            return None
        return self._path, self._offset + start * self._record

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` with ``pread`` (into ``out``), in native byte order.

        The file is never memory-mapped: mapped pages would stay resident in
        the worker and count against its memory limit.
        """
        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        shape = (stop - start, *self._frame_shape)
        target = out
        if target is None or not (
            target.shape == shape and target.dtype == self._dtype and target.flags.c_contiguous
        ):
            target = np.empty(shape, dtype=self._dtype)
        f = self._file()
        offset = self._offset + start * self._record
        what = f"frames {start}..{stop - 1}"
        if self._head == 0 and self._foot == 0:
            f.readinto(offset, target, what=what)
        else:
            f.read_records(offset, target, record=self._record, head=self._head, what=what)
        if not self._file_dtype.isnative and self._file_dtype.itemsize > 1:
            target.byteswap(inplace=True)
        if out is not None and target is not out:
            np.copyto(out, target, casting="same_kind")
            return out
        return target

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
