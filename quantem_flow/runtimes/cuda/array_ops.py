"""The CUDA runtime's SSB array adapter: CuPy arrays and cuFFT, float64/complex128.

The contract is :class:`~quantem_flow.runtimes.array_ops.ArrayOps`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..array_ops import ArrayOps

__all__ = ["CupyOps"]


class CupyOps(ArrayOps):
    """CuPy arrays and cuFFT on the current CUDA device; float64/complex128."""

    name: ClassVar[str] = "cuda"
    precision: ClassVar[str] = "float64 data, complex128 FFT (cuFFT Z2Z/D2Z) and sums"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        self.real_dtype = cupy.float64
        self.complex_dtype = cupy.complex128

    def asarray(self, a: np.ndarray) -> Any:
        """Upload, then widen on the device (fewer bytes cross the bus)."""
        d = self.cp.asarray(np.ascontiguousarray(a))
        if np.iscomplexobj(a):
            return d.astype(self.cp.complex128, copy=False)
        return d.astype(self.cp.float64, copy=False)

    def rfft2(self, x: Any, shape: tuple[int, int]) -> Any:
        """``cupy.fft.rfft2`` (cuFFT)."""
        return self.cp.fft.rfft2(x, s=shape, axes=(-2, -1))

    def exp_i(self, phase: Any) -> Any:
        """``exp(i phase)`` in complex128."""
        return self.cp.exp(1j * phase.astype(self.cp.float64, copy=False))

    def real(self, z: Any) -> Any:
        """Real part."""
        return self.cp.real(z)

    def abs2(self, z: Any) -> Any:
        """``re^2 + im^2``."""
        re, im = self.cp.real(z), self.cp.imag(z)
        return re * re + im * im

    def where(self, mask: Any, a: Any) -> Any:
        """``cupy.where(mask, a, 0)``."""
        return self.cp.where(mask, a, 0)

    def sum0(self, x: Any) -> Any:
        """Sum over axis 0."""
        return self.cp.sum(x, axis=0)

    def take(self, x: Any, index: np.ndarray, axis: int) -> Any:
        """``cupy.take``."""
        return self.cp.take(x, self.cp.asarray(index), axis=axis)

    def to_host(self, x: Any) -> np.ndarray:
        """``cupy.asnumpy`` (synchronises the stream)."""
        if isinstance(x, (int, float, complex)):
            return np.asarray(x)
        out: np.ndarray = self.cp.asnumpy(x)
        return out

    def describe(self) -> dict[str, Any]:
        """Runtime, device and precision."""
        dev = self.cp.cuda.Device()
        props = self.cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return {
            "runtime": self.name,
            "precision": self.precision,
            "device": f"cuda:{dev.id} ({name})",
            "cupy_version": str(self.cp.__version__),
        }
