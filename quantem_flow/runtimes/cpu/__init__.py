"""The CPU runtime: NumPy arrays, Numba-compiled fused kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..base import FramePassKernel, FramePassResult, Runtime
from .kernels import frame_pass_numba

__all__ = ["CpuRuntime"]


class CpuRuntime(Runtime):
    """Host memory, NumPy layout, Numba kernels."""

    name: ClassVar[str] = "cpu"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The CPU runtime is always available."""
        return True, "always available"

    def frame_pass(
        self, frames: np.ndarray, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        """Run the fused Numba pass on host frames."""
        per_frame, s, m = frame_pass_numba(frames, weights, want_sum=want_sum, want_max=want_max)
        return FramePassResult(per_frame=per_frame, pattern_sum=s, pattern_max=m)

    def frame_pass_kernels(self) -> Mapping[str, FramePassKernel]:
        """Dense (the fused kernel), paired (O(events)), packed and encoded (decoded in groups)."""
        from .encoded_kernels import frame_pass_encoded
        from .packed_kernels import frame_pass_packed
        from .paired_kernels import frame_pass_paired

        return {
            "dense": self._dense_frame_pass,
            "paired": frame_pass_paired,
            "packed": frame_pass_packed,
            "encoded": frame_pass_encoded,
        }

    def describe(self) -> dict[str, Any]:
        """Kernel, precision and versions, for provenance."""
        import numba

        return {
            "runtime": self.name,
            "device": "host CPU",
            "kernel": "Numba fused frame pass (4 frames x 2 weight rows)",
            "per_frame_accumulation": "float64",
            "sum_accumulation": "int64 for integer data, float64 otherwise",
            "fastmath": "reassociation and contraction only (IEEE NaN/inf kept)",
            "numba": numba.__version__,
        }
