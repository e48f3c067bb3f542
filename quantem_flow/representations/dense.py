"""The dense representation: one value per detector pixel."""

from __future__ import annotations

__all__ = ["DENSE_SCHEMA"]

#: ``(rows, cols, k_r, k_c)`` C-contiguous array, native byte order, the
#: dataset's dtype.
DENSE_SCHEMA = "dense-v1"
