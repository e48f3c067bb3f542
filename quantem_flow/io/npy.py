"""NumPy ``.npy`` files, memory-mapped."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import DtypeError, FormatError, ScanShapeError, ShapeError
from .base import FrameSource, SourceIdentity, check_exists, header_digest

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
        self._handle_mm: np.ndarray | None = None
        try:
            probe = np.load(self._path, mmap_mode="r")
        except (ValueError, OSError) as exc:
            raise FormatError(f"{str(self._path)!r} is not a valid .npy file: {exc}") from exc
        if not isinstance(probe, np.memmap):
            raise FormatError(f"{str(self._path)!r} does not hold a single array")
        shape, dtype = probe.shape, probe.dtype
        fortran = bool(probe.flags.f_contiguous and not probe.flags.c_contiguous)
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

    def _mm(self) -> np.ndarray:
        # never reshape: a Fortran-ordered file would be copied whole into memory
        if self._handle_mm is None:
            self._handle_mm = np.load(self._path, mmap_mode="r")
        return self._handle_mm

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
            file_sizes=(self._path.stat().st_size,),
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

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Copy frames out of the memory map (byte-swapped to native order)."""
        mm = self._mm()
        if mm.ndim == 3:
            if out is not None:
                np.copyto(out, mm[start:stop], casting="same_kind")
                return out
            return np.array(mm[start:stop], dtype=self._dtype, order="C")
        C = self._stored_shape[1]
        r0, r1 = start // C, -(-stop // C)
        block = np.array(mm[r0:r1], dtype=self._dtype, order="C").reshape(-1, *self._frame_shape)
        frames = block[start - r0 * C : stop - r0 * C]
        if out is not None:
            out[...] = frames
            return out
        return frames

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Read a scan block; 4-D files are sliced directly.

        Whole C-ordered rows in native byte order come back as a read-only
        view of the memory map (zero copy: kernels read the page cache
        directly); anything else is copied.
        """
        self.check_block(rows, cols)
        mm = self._mm()
        if mm.ndim == 3:
            C = self._scan.shape[1]
            if cols == (0, C) and mm.flags.c_contiguous and mm.dtype.isnative:
                off = self._scan.frame_offset
                view = mm[off + rows[0] * C : off + rows[1] * C]
                return view.reshape(rows[1] - rows[0], C, *self._frame_shape)
            return super().read(rows, cols, buffer=buffer)
        block = mm[slice(*rows), slice(*cols)]
        if block.flags.c_contiguous and block.dtype.isnative:
            return np.asarray(block)
        if buffer is not None and buffer.shape == block.shape and buffer.dtype == self._dtype:
            np.copyto(buffer, block, casting="same_kind")
            return buffer
        return np.array(block, dtype=self._dtype, order="C")

    def close(self) -> None:
        """Drop the memory map."""
        self._handle_mm = None
