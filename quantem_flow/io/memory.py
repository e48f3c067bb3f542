"""In-memory NumPy arrays as a source."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import DtypeError, ShapeError
from .base import ResidentOnlySource, Source, SourceIdentity, header_digest, resolve_scan_shape

__all__ = ["ArraySource"]


class ArraySource(Source):
    """A NumPy array held in this process, 4-D or 3-D plus a scan shape.

    Parameters
    ----------
    array
        ``(R_r, R_c, k_r, k_c)``, or ``(frames, k_r, k_c)`` with ``scan_shape``.
    scan_shape
        ``(rows, cols)`` or ``"square"`` for 3-D input.
    calibration
        A calibration the wrapped object recorded (an xarray's coordinates).
    calibration_from
        Where ``calibration`` came from, for provenance.
    notes
        Choices made while wrapping (a list copied into an array), recorded.

    Notes
    -----
    The array travels with the graph: every chunk task carries its own slice,
    so this source suits small data and tests.  For large data write it to a
    file (``.npy``, HDF5, Zarr) and open that.
    """

    format: ClassVar[str] = "memory"

    def __init__(
        self,
        array: np.ndarray,
        *,
        scan_shape: Sequence[int] | str | None = None,
        calibration: Calibration | None = None,
        calibration_from: str | None = None,
        notes: Sequence[str] = (),
    ):
        a = np.asarray(array)
        self._calibration = calibration
        self._calibration_from = calibration_from
        if a.dtype.kind not in "uif":
            raise DtypeError(
                f"4D-STEM data must be integer or real floating point, got dtype {a.dtype}"
            )
        self._notes: list[str] = list(notes)
        if a.ndim == 3:
            choice = resolve_scan_shape(a.shape[0], scan_shape)
            if choice.note:
                self._notes.append(choice.note)
            a = a.reshape(*choice.shape, *a.shape[1:])
        elif a.ndim != 4:
            raise ShapeError(
                f"an in-memory dataset must be 4-D (R_r, R_c, k_r, k_c) or 3-D (frames, k_r, k_c) "
                f"with scan_shape, got shape {a.shape}"
            )
        elif scan_shape is not None:
            raise ShapeError(
                f"scan_shape={scan_shape!r} was given but the array is already 4-D {a.shape}"
            )
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        self._array = a

    @property
    def array(self) -> np.ndarray:
        """The wrapped array."""
        return self._array

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """Logical shape."""
        s = self._array.shape
        return (s[0], s[1], s[2], s[3])

    @property
    def dtype(self) -> np.dtype[Any]:
        """Dtype of the array."""
        return self._array.dtype

    @property
    def calibration(self) -> Calibration | None:
        """The calibration given with the array (an xarray's coordinates), if any."""
        return self._calibration

    @property
    def metadata(self) -> dict[str, Any]:
        """Where the calibration came from, when one was given."""
        if self._calibration is None:
            return {}
        return {"calibration_from": self._calibration_from or "given with the array"}

    @property
    def identity(self) -> SourceIdentity:
        """In-memory identity: no path, shape and dtype hashed."""
        return SourceIdentity(
            format=self.format,
            paths=(),
            file_sizes=(),
            header_sha256=header_digest(self._array.shape, str(self._array.dtype)),
        )

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while wrapping."""
        return list(self._notes)

    @property
    def streams_blocks(self) -> bool:
        """Blocks of an in-memory array are views or copies of their own bytes."""
        return True

    def for_resident_tasks(self) -> Source:
        """A stand-in without the array: tasks on resident chunks never read it."""
        return ResidentOnlySource(self)

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Return the block: a read-only view when contiguous, else a copy."""
        self.check_block(rows, cols)
        block = self._array[rows[0] : rows[1], cols[0] : cols[1]]
        if block.flags.c_contiguous:
            view = block.view()
            view.flags.writeable = False
            return view
        return np.array(block)
