"""The dense representation: one value per detector pixel."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import Representation, dense_frames, gather_columns

__all__ = ["DENSE_SCHEMA", "Dense"]

#: ``(rows, cols, k_r, k_c)`` C-contiguous array, native byte order, the
#: dataset's dtype.
DENSE_SCHEMA = "dense-v1"


class Dense(Representation):
    """The identity representation."""

    name: ClassVar[str] = "dense"
    schema: ClassVar[str] = DENSE_SCHEMA
    native_detector_ops: ClassVar[bool] = True

    def from_dense(self, block: np.ndarray, **options: Any) -> np.ndarray:
        """Return the block itself."""
        return block

    def to_dense(self, payload: Any) -> np.ndarray:
        """Return the payload itself."""
        return np.asarray(payload)

    def apply_detector_ops(self, payload: Any, ops: tuple[Any, ...]) -> Any:
        """Apply crops and binning directly."""
        for op in ops:
            payload = op.apply(payload)
        return payload

    def gather(self, payload: Any, indices: np.ndarray) -> np.ndarray:
        """Index the frames directly (runs of consecutive pixels copied as slices)."""
        arr = np.asarray(payload)
        n, k = dense_frames(arr)
        return gather_columns(arr.reshape(n, k), np.asarray(indices, dtype=np.int64))
