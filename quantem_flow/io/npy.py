"""NumPy ``.npy`` files, read with ``pread`` (never kept memory-mapped).

A C-ordered file's frames are contiguous bytes after the header, read
straight into the buffer being filled (see :mod:`quantem_flow.io.fileio`).
A Fortran-ordered file spreads each frame over the whole file; it is read
through a memory map opened for that one read and closed right after, so
no mapped page outlives the read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import DtypeError, FormatError, ScanShapeError, ShapeError
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile

__all__ = ["NpySource"]


class NpySource(FrameSource):
    """A ``.npy`` file holding ``(R_r, R_c, k_r, k_c)`` or ``(frames, k_r, k_c)``.

    Parameters
    ----------
    path
        The ``.npy`` file.
    scan_shape
        Needed for 3-D files: ``(rows, cols)``, ``"square"``, or ``None`` to
        use a JSON sidecar.
    frame_offset
        Leading frames to skip (3-D files only).
    """

    format: ClassVar[str] = "npy"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ):
        self._path = check_exists(path)
        self._handle_file: PositionalFile | None = None
        try:
            probe = np.load(self._path, mmap_mode="r")
        except (ValueError, OSError) as exc:
            raise FormatError(f"{str(self._path)!r} is not a valid .npy file: {exc}") from exc
        if not isinstance(probe, np.memmap):
            raise FormatError(f"{str(self._path)!r} does not hold a single array")
        shape, dtype = probe.shape, probe.dtype
        fortran = bool(probe.flags.f_contiguous and not probe.flags.c_contiguous)
        self._data_offset = int(probe.offset)
        self._fortran = fortran
        with open(self._path, "rb") as f:
            self._header = (f.read(int(probe.offset)), shape, fortran, str(dtype))
        del probe
        if np.dtype(dtype).kind not in "uif":
            raise DtypeError(f"{str(self._path)!r} holds dtype {dtype}; expected integer or real")
        if len(shape) == 4:
            if scan_shape is not None and (
                isinstance(scan_shape, str) or tuple(scan_shape) != tuple(shape[:2])
            ):
                raise ScanShapeError(
                    f"{str(self._path)!r} is 4-D {shape} but scan_shape={scan_shape!r} was given"
                )
            n = shape[0] * shape[1]
            self._set_frames(
                n_frames=n,
                frame_shape=shape[2:],
                dtype=dtype,
                scan_shape=shape[:2],
                path=None,
                scan_shape_from="the file (a 4-D array)",
            )
        elif len(shape) == 3:
            self._set_frames(
                n_frames=shape[0],
                frame_shape=shape[1:],
                dtype=dtype,
                scan_shape=scan_shape,
                path=self._path,
                frame_offset=frame_offset,
            )
        else:
            raise ShapeError(
                f"{str(self._path)!r} has shape {shape}; expected (R_r, R_c, k_r, k_c) or "
                "(frames, k_r, k_c)"
            )
        self._file_dtype = np.dtype(dtype)
        self._stored_shape = tuple(int(s) for s in shape)

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
        """Path, size and a digest of the .npy header."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(*self._header),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Stored shape and dtype."""
        return {
            "stored_shape": list(self._stored_shape),
            "stored_dtype": str(self._file_dtype),
            **self.scan_metadata(),
        }

    @property
    def streams_blocks(self) -> bool:
        """C-ordered files read any frames with one ``pread`` (Fortran-ordered ones do not)."""
        return not self._fortran

    def frame_bytes(self, start: int, stop: int) -> tuple[Path, int] | None:
        """C-ordered files in native byte order hold any frames as one run of bytes."""
        if self._fortran or (not self._file_dtype.isnative and self._file_dtype.itemsize > 1):
            return None
        frame = math.prod(self._frame_shape) * self._file_dtype.itemsize
        return self._path, self._data_offset + start * frame

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` (flat scan order) in native byte order.

        C-ordered files are read with ``pread`` into ``out`` (or a new
        array); nothing stays mapped.
        """
        n_frames = math.prod(self._stored_shape[:-2])
        if not 0 <= start <= stop <= n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {n_frames} frames of {str(self._path)!r}"
            )
        if self._fortran:
            return self._read_fortran(start, stop, out)
        shape = (stop - start, *self._frame_shape)
        target = out
        if target is None or not (
            target.shape == shape and target.dtype == self._dtype and target.flags.c_contiguous
        ):
            target = np.empty(shape, dtype=self._dtype)
        frame_bytes = math.prod(self._frame_shape) * self._file_dtype.itemsize
        self._file().readinto(
            self._data_offset + start * frame_bytes,
            target,
            what=f"frames {start}..{stop - 1}",
        )
        if not self._file_dtype.isnative and self._file_dtype.itemsize > 1:
            target.byteswap(inplace=True)
        if out is not None and target is not out:
            np.copyto(out, target, casting="same_kind")
            return out
        return target

    def _read_fortran(self, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        # never reshape the map: a Fortran-ordered file would be copied whole into memory
        mm = np.load(self._path, mmap_mode="r")
        try:
            if mm.ndim == 3:
                frames = np.array(mm[start:stop], dtype=self._dtype, order="C")
            else:
                C = self._stored_shape[1]
                r0, r1 = start // C, -(-stop // C)
                block = np.array(mm[r0:r1], dtype=self._dtype, order="C")
                frames = block.reshape(-1, *self._frame_shape)[start - r0 * C : stop - r0 * C]
        finally:
            del mm  # unmap now: the pages leave this process's resident set
        if out is not None:
            np.copyto(out, frames, casting="same_kind")
            return out
        return frames

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
