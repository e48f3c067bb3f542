"""Detector transforms: crops and binning of frames, applied lazily to chunks.

They sit in the representation layer because representations apply them
natively (``paired`` remaps its pixel indices, ``encoded`` records them to
apply after decoding) and must agree exactly with the dense arithmetic here;
:mod:`quantem_flow.dataset` records them as lazy views and re-exports them.

Binning keeps partial edge bins (ceiling division) and widens the dtype first
(:func:`binned_dtype`), so sums of integer counts are exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["DetectorOp", "bin_frames", "binned_dtype"]


def binned_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """Return the widened dtype binned sums are stored in.

    Unsigned and signed integers widen to 32 bits (64 bits from 32-bit
    input); floats widen to float64.  Widening is lossless and recorded.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "u":
        return np.dtype(np.uint32 if dtype.itemsize < 4 else np.uint64)
    if dtype.kind == "i":
        return np.dtype(np.int32 if dtype.itemsize < 4 else np.int64)
    return np.dtype(np.float64)


def bin_frames(block: np.ndarray, factor: tuple[int, int]) -> np.ndarray:
    """Sum ``factor`` detector pixels into one, keeping partial edge bins.

    Parameters
    ----------
    block
        ``(..., k_r, k_c)`` frames.
    factor
        ``(f_r, f_c)`` pixels per bin along detector rows and columns.

    Returns
    -------
    numpy.ndarray
        ``(..., ceil(k_r / f_r), ceil(k_c / f_c))`` in :func:`binned_dtype`;
        the last bin along an axis sums the remaining ``k % f`` pixels.
    """
    fr, fc = factor
    acc = binned_dtype(block.dtype)
    out = block.astype(acc, copy=False) if fr == 1 and fc == 1 else block
    if fr > 1:
        out = np.add.reduceat(out, np.arange(0, block.shape[-2], fr), axis=-2, dtype=acc)
    if fc > 1:
        out = np.add.reduceat(out, np.arange(0, block.shape[-1], fc), axis=-1, dtype=acc)
    return np.ascontiguousarray(out, dtype=acc)


@dataclasses.dataclass(frozen=True)
class DetectorOp:
    """One lazy detector transform: ``("crop", (r0, r1, c0, c1))`` or ``("bin", (fr, fc))``."""

    kind: str
    params: tuple[int, ...]

    def apply(self, block: np.ndarray) -> np.ndarray:
        """Apply to ``(..., k_r, k_c)`` frames."""
        if self.kind == "crop":
            r0, r1, c0, c1 = self.params
            return block[..., r0:r1, c0:c1]
        return bin_frames(block, (self.params[0], self.params[1]))

    def to_dict(self) -> dict[str, Any]:
        """Return the transform for provenance."""
        if self.kind == "crop":
            return {"transform": "detector_region", "region": list(self.params)}
        return {
            "transform": "bin_detector",
            "factor": list(self.params),
            "partial_edge_bins": "kept (ceiling division)",
        }
