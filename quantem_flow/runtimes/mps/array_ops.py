"""The mps runtime's SSB array adapter: MLX arrays and ``mx.fft``, complex64 only.

The contract is :class:`~quantem_flow.runtimes.array_ops.ArrayOps`.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import numpy as np

from ..array_ops import ArrayOps

__all__ = ["MlxOps"]

_MLX_LOCK_FALLBACK = threading.Lock()


class MlxOps(ArrayOps):
    """MLX arrays and ``mx.fft``: complex64 only (MLX has no complex128 FFT)."""

    name: ClassVar[str] = "mps"
    precision: ClassVar[str] = (
        "float32 data, complex64 FFT and within-block sums (MLX has no complex128 FFT; "
        "allowed explicitly by allow_complex64=True); across-block sums in complex128 on "
        "the host"
    )

    def __init__(self) -> None:
        import mlx.core as mx

        self.mx = mx
        self.real_dtype = mx.float32
        self.complex_dtype = mx.complex64

    def asarray(self, a: np.ndarray) -> Any:
        """Host array as MLX float32 (complex64 for complex input)."""
        if np.iscomplexobj(a):
            return self.mx.array(np.asarray(a, dtype=np.complex64))
        return self.mx.array(np.asarray(a, dtype=np.float32))

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """``mx.fft.rfft2`` (complex64)."""
        return self.mx.fft.rfft2(x, s=tuple(shape), axes=(-2, -1))

    def exp_i(self, phase: Any) -> Any:
        """``exp(i phase)`` in complex64."""
        return self.mx.exp(1j * phase)

    def real(self, z: Any) -> Any:
        """Real part."""
        return self.mx.real(z)

    def abs2(self, z: Any) -> Any:
        """``re^2 + im^2``."""
        re, im = self.mx.real(z), self.mx.imag(z)
        return re * re + im * im

    def where(self, mask: Any, a: Any) -> Any:
        """``mx.where(mask, a, 0)``."""
        return self.mx.where(mask, a, self.mx.zeros_like(a))

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        return self.mx.sum(x, axis=0)

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """``mx.take``."""
        return self.mx.take(x, self.mx.array(np.asarray(index, dtype=np.int32)), axis=axis)

    def to_host(self, x: Any) -> np.ndarray:
        """Evaluate and copy into NumPy."""
        if isinstance(x, (int, float, complex)):
            return np.asarray(x)
        self.mx.eval(x)
        return np.array(x)

    def lock(self) -> Any:
        """The process-wide MLX evaluation lock of the ``mps`` runtime."""
        try:
            from . import _LOCK

            return _LOCK
        except ImportError:  # pragma: no cover - the mps module always imports
            return _MLX_LOCK_FALLBACK

    def describe(self) -> dict[str, Any]:
        """Runtime, MLX version, device and precision."""
        mx = self.mx
        return {
            "runtime": self.name,
            "precision": self.precision,
            "mlx_version": str(getattr(mx, "__version__", "unknown")),
            "device": str(mx.default_device()),
        }
